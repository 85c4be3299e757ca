//! Runs the real `edgecore` binary with a config of its own in a temporary directory.
#![allow(dead_code)]

pub mod mapper;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const MANIFEST: &str = include_str!("manifests/oven.yaml");

pub use sim::free_port;

pub struct Edgecore {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub http: String,
    pub mqtt_port: u16,
    pub socket: PathBuf,
    pub manifests: PathBuf,
    pub config: PathBuf,
    agent: ureq::Agent,
}

pub fn bin(name: &str) -> PathBuf {
    let edgecore = PathBuf::from(env!("CARGO_BIN_EXE_edgecore"));
    if name == "edgecore" {
        return edgecore;
    }
    let p = edgecore.with_file_name(name);
    assert!(
        p.exists(),
        "{} is not built: run `cargo build -p kectl` (cargo test --workspace does)",
        p.display()
    );
    p
}

/// A data directory with `manifests/oven.yaml` ([`MANIFEST`]).
pub fn dir_with_manifest() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).expect("mkdir");
    std::fs::write(manifests.join("oven.yaml"), MANIFEST).expect("write manifest");
    dir
}

impl Edgecore {
    /// Starts edgecore with the embedded broker, or with `external` as its MQTT broker port.
    pub fn start(external: Option<u16>) -> Self {
        let dir = dir_with_manifest();
        let mut e = Self::with_dir(dir, external);
        e.wait_ready();
        e
    }

    /// Starts edgecore (embedded broker) with `mqtt_extra` added to its `mqtt:` settings
    /// (`, passwordFile: FILE`) and `http_extra` to its `http:` ones.
    pub fn start_with(mqtt_extra: &str, http_extra: &str) -> Self {
        let dir = dir_with_manifest();
        let mut e = Self::with_dir_and_extra(dir, None, mqtt_extra, http_extra);
        e.wait_ready();
        e
    }

    /// Starts edgecore on the external broker at `port`, with `mqtt_extra` added to its
    /// `mqtt:` settings (`, quickAck: false`).
    pub fn start_external_with(port: u16, mqtt_extra: &str) -> Self {
        let dir = dir_with_manifest();
        let mut e = Self::with_dir_and_extra(dir, Some(port), mqtt_extra, "");
        e.wait_ready();
        e
    }

    pub fn with_dir(dir: tempfile::TempDir, external: Option<u16>) -> Self {
        Self::with_dir_and_extra(dir, external, "", "")
    }

    /// As [`Edgecore::with_dir`] (embedded broker), with `extra` (top-level YAML lines, e.g.
    /// `history: {...}`) added to the config.
    pub fn with_dir_config(dir: tempfile::TempDir, extra: &str) -> Self {
        let e = Self::with_dir_and_extra(dir, None, "", "");
        let mut text = std::fs::read_to_string(&e.config).expect("the config");
        text.push_str(extra);
        text.push('\n');
        std::fs::write(&e.config, text).expect("write config");
        let mut e = e;
        e.restart(false);
        e
    }

    fn with_dir_and_extra(
        dir: tempfile::TempDir,
        external: Option<u16>,
        mqtt_extra: &str,
        http_extra: &str,
    ) -> Self {
        let http_port = free_port();
        let (mode, mqtt_port) = match external {
            Some(p) => ("external", p),
            None => ("embedded", free_port()),
        };
        let config = dir.path().join("edgecore.yaml");
        let text = format!(
            "nodeName: test-node\ndataDir: data\nmanifests: {{dir: manifests, pollIntervalMs: 100}}\nmqtt: {{mode: {mode}, address: \"127.0.0.1:{mqtt_port}\", clientId: edgecore-{http_port}{mqtt_extra}}}\nhttp: {{address: \"127.0.0.1:{http_port}\"{http_extra}}}\ndmi: {{socket: dmi.sock}}\n"
        );
        std::fs::write(&config, text).expect("write config");
        let child = spawn(&config, dir.path());
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        Self {
            child,
            http: format!("http://127.0.0.1:{http_port}"),
            mqtt_port,
            socket: dir.path().join("dmi.sock"),
            manifests: dir.path().join("manifests"),
            config,
            dir,
            agent,
        }
    }

    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("edgecore exited early: {status}; its log:\n{}", self.log());
            }
            if self.started() && self.socket.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("edgecore did not become ready");
    }

    /// Stops edgecore with SIGTERM (kill -9 with `hard`) and starts it again on the same data.
    pub fn restart(&mut self, hard: bool) {
        self.stop(hard);
        self.child = spawn(&self.config, self.dir.path());
        self.wait_ready();
    }

    /// Stops edgecore and starts it again with at most `nofile` open files (soft and hard).
    pub fn restart_with_nofile(&mut self, nofile: u32) {
        self.restart_in_shell(&format!("ulimit -n {nofile}"));
    }

    /// Stops edgecore and starts it again with the file mode creation mask `umask` (octal).
    pub fn restart_with_umask(&mut self, umask: &str) {
        self.restart_in_shell(&format!("umask {umask}"));
    }

    /// Stops edgecore and starts it again after the shell command `setup`.
    fn restart_in_shell(&mut self, setup: &str) {
        self.stop(false);
        self.child = Command::new("sh")
            .arg("-c")
            .arg(format!("{setup} && exec \"$0\" --config \"$1\""))
            .arg(bin("edgecore"))
            .arg(&self.config)
            .current_dir(self.dir.path())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(self.dir.path().join("edgecore.log")).expect("log file"),
            ))
            .spawn()
            .expect("spawn edgecore");
        self.wait_ready();
    }

    /// Starts edgecore again after [`Edgecore::stop`], without waiting for it.
    pub fn start_again(&mut self) {
        self.child = spawn(&self.config, self.dir.path());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("edgecore.log")).unwrap_or_default()
    }

    pub fn stop(&mut self, hard: bool) {
        let sig = if hard { "-KILL" } else { "-TERM" };
        let _ = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }

    /// Every module has started: `/readyz` answers and no longer says `starting` (it may say
    /// `degraded`, which a fault test waits through).
    pub fn started(&self) -> bool {
        sim::edgecore_started(&self.agent, &self.http)
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        answered(self.agent.get(format!("{}{path}", self.http)).call())
    }

    /// The text of `/metrics`.
    pub fn metrics(&self) -> String {
        match self.get("/metrics").1 {
            Value::String(t) => t,
            other => other.to_string(),
        }
    }

    pub fn put(&self, path: &str, body: &str) -> (u16, Value) {
        answered(
            self.agent
                .put(format!("{}{path}", self.http))
                .header("content-type", "application/json")
                .send(body),
        )
    }

    pub fn post(&self, path: &str, body: &str) -> (u16, Value) {
        answered(
            self.agent
                .post(format!("{}{path}", self.http))
                .header("content-type", "application/json")
                .send(body),
        )
    }

    pub fn twin(&self, id: &str) -> Option<Value> {
        let (status, v) = self.get(&format!("/api/v1/devices/{id}"));
        (status == 200).then_some(v)
    }

    /// Waits until edgecore's client is connected to its (external) broker: it subscribes
    /// after connecting.
    pub fn wait_mqtt_connected(&self) {
        self.eventually("edgecore connected to its MQTT broker", |e| {
            let m = e.get("/metrics").1;
            // The sample's own line: its HELP text reads "... edgecore_mqtt_connected 1 while".
            m.as_str()
                .unwrap_or("")
                .lines()
                .any(|l| l == "edgecore_mqtt_connected 1")
                .then_some(())
        });
    }

    /// Polls `f` until it returns `Some`, for up to 10 s.
    pub fn eventually<T>(&self, what: &str, mut f: impl FnMut(&Self) -> Option<T>) -> T {
        sim::poll::eventually(10, what, || f(self))
    }
}

fn spawn(config: &Path, cwd: &Path) -> Child {
    Command::new(bin("edgecore"))
        .args(["--config", &config.display().to_string()])
        .current_dir(cwd)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(cwd.join("edgecore.log")).expect("log file"),
        ))
        .spawn()
        .expect("spawn edgecore")
}

impl Drop for Edgecore {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn reported(twin: &Value, prop: &str) -> Option<String> {
    twin["properties"][prop]["reported"]["value"]
        .as_str()
        .map(str::to_string)
}

pub fn desired(twin: &Value, prop: &str) -> Option<String> {
    twin["properties"][prop]["desired"]["value"]
        .as_str()
        .map(str::to_string)
}

/// A Mosquitto broker on `port`, killed on drop; `None` when mosquitto is not installed.
pub struct Mosquitto(Child, #[allow(dead_code)] tempfile::TempDir);

impl Mosquitto {
    /// Sends `signal` (`STOP`, `CONT`, ...) to the broker with `kill`.
    #[allow(dead_code)]
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([format!("-{signal}"), self.0.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} mosquitto");
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn mosquitto(port: u16) -> Option<Mosquitto> {
    let dir = tempfile::tempdir().ok()?;
    let conf = dir.path().join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!("listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"),
    )
    .ok()?;
    let child = Command::new("mosquitto")
        .args(["-c", &conf.display().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(Mosquitto(child, dir));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// The project's `.venv` Python (made by `scripts/test`), or `python3` from `PATH`.
pub fn python() -> std::path::PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python3");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

/// Runs a Python script of `tests/kubeedge/` with `args`; returns whether it succeeded and what
/// What a finished command printed: its stdout, then its stderr.
pub fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// it printed. A missing paho-mqtt fails with the command that installs it.
pub fn kubeedge_script(script: &str, args: &[&str]) -> (bool, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/kubeedge")
        .join(script);
    let out = Command::new(python())
        .arg(path)
        .args(args)
        .output()
        .expect("python3 runs");
    let text = text(&out);
    assert!(
        !text.contains("No module named 'paho'"),
        "paho-mqtt is missing: run scripts/test --setup-only (it installs hardware-tests/requirements.txt into .venv)"
    );
    (out.status.success(), text)
}

/// The status and body (JSON, else its text) of an answer; `(0, null)` when none came.
fn answered(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> (u16, Value) {
    match r {
        Ok(mut r) => {
            let status = r.status().as_u16();
            let text = r.body_mut().read_to_string().unwrap_or_default();
            (
                status,
                serde_json::from_str(&text).unwrap_or(Value::String(text)),
            )
        }
        Err(_) => (0, Value::Null),
    }
}
