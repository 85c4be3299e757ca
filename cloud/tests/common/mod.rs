//! Runs the real `cloudcore` binary on a temporary data directory, and the real `kubectl`
//! against it.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// kubectl: `$KUBECTL`, the pinned one in the project's `.venv` (scripts/test installs it), or
/// the first in `PATH`.
pub fn kubectl_bin() -> PathBuf {
    if let Ok(k) = std::env::var("KUBECTL") {
        return PathBuf::from(k);
    }
    let venv = workspace().join(".venv/bin/kubectl");
    if venv.is_file() {
        return venv;
    }
    PathBuf::from("kubectl")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A running cloudcore.
pub struct Cloud {
    pub dir: PathBuf,
    pub port: u16,
    /// cloudhub's websocket and certificate ports.
    pub hub_port: u16,
    pub cert_port: u16,
    pub kubeconfig: PathBuf,
    extra: String,
    modules: String,
    /// A shell command run before cloudcore (`umask 000`), if any.
    setup: Option<String>,
    starts: usize,
    child: Option<Child>,
    _tmp: Option<tempfile::TempDir>,
}

impl Cloud {
    pub fn start() -> Self {
        Self::start_with("")
    }

    /// Starts with `extra` YAML under `modules.apiserver` (indented by the caller by 4).
    /// The API alone: the device controller is off, so the API tests see only their own
    /// writes.
    pub fn start_with(extra: &str) -> Self {
        Self::start_full(extra, "  deviceController:\n    enable: false\n")
    }

    /// Starts with `extra` under `modules.apiserver` and `modules` YAML under `modules`
    /// (indented by 2), e.g. `"  deviceController:\n    enable: false\n"`.
    pub fn start_full(extra: &str, modules: &str) -> Self {
        Self::start_after(extra, modules, None)
    }

    /// Starts cloudcore (with cloudhub) after the shell command `setup` (`umask 000`).
    pub fn start_after_setup(setup: &str) -> Self {
        Self::start_after("", "", Some(setup.to_string()))
    }

    fn start_after(extra: &str, modules: &str, setup: Option<String>) -> Self {
        let tmp = tempfile::tempdir().expect("temp dir");
        let mut c = Self {
            dir: tmp.path().to_path_buf(),
            port: free_port(),
            hub_port: free_port(),
            cert_port: free_port(),
            kubeconfig: tmp.path().join("data/admin.kubeconfig"),
            extra: extra.to_string(),
            modules: modules.to_string(),
            setup,
            starts: 0,
            child: None,
            _tmp: Some(tmp),
        };
        c.spawn();
        c
    }

    fn spawn(&mut self) {
        let config = self.dir.join("cloudcore.yaml");
        std::fs::write(
            &config,
            format!(
                "dataDir: data\nmodules:\n  apiserver:\n    listen: \"127.0.0.1:{}\"\n{}  metrics:\n    listen: \"\"\n{}{}",
                self.port,
                self.extra,
                // cloudhub on this instance's own ports, inside any cloudHub block given.
                {
                    let ports = format!(
                        "    listen: \"127.0.0.1:{}\"\n    certListen: \"127.0.0.1:{}\"\n",
                        self.hub_port, self.cert_port
                    );
                    if self.modules.contains("  cloudHub:\n") {
                        self.modules
                            .replacen("  cloudHub:\n", &format!("  cloudHub:\n{ports}"), 1)
                    } else {
                        format!("{}  cloudHub:\n{ports}", self.modules)
                    }
                },
                ""
            ),
        )
        .expect("config written");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("cloudcore.log"))
            .expect("log file");
        let mut cmd = match &self.setup {
            None => Command::new(env!("CARGO_BIN_EXE_cloudcore")),
            Some(setup) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("{setup} && exec \"$0\" \"$@\""))
                    .arg(env!("CARGO_BIN_EXE_cloudcore"));
                c
            }
        };
        let child = cmd
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("cloudcore starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // cloudcore prints where its API is once it serves (CRDs installed).
            let starts = self.log().matches("cloudcore: API at").count();
            if starts > self.starts {
                self.starts = starts;
                break;
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!("cloudcore exited with {status}: {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "cloudcore did not come up: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("cloudcore.log")).unwrap_or_default()
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, and how long it took to exit.
    pub fn stop(&mut self) -> Duration {
        let started = Instant::now();
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let _ = c.wait();
        }
        started.elapsed()
    }

    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    pub fn restart_after_kill9(&mut self) {
        self.kill9();
        self.spawn();
    }

    pub fn kubectl_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(kubectl_bin());
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.join("kube-cache"))
            .args(args)
            .env("HOME", &self.dir);
        cmd
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_cmd(args).output().expect("kubectl runs")
    }

    /// Runs kubectl and returns its stdout; panics with stderr if it fails.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs kubectl, expecting it to fail, and returns its stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            !out.status.success(),
            "kubectl {args:?} should have failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// Runs kubectl with `input` on stdin.
    pub fn kubectl_stdin(&self, args: &[&str], input: &str) -> Output {
        let mut child = self
            .kubectl_cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("stdin written");
        child.wait_with_output().expect("kubectl ends")
    }

    pub async fn client(&self) -> kube::Client {
        cloud::cluster_client(&self.kubeconfig)
            .await
            .expect("a kube-rs client of the kubeconfig")
    }

    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }
}

impl Drop for Cloud {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub fn examples() -> PathBuf {
    workspace().join("examples")
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A node's report of one property, as KubeEdge's edgecore sends it (`twin/edge_updated`), at
/// edge version `version`.
pub fn twin_report(
    node: &str,
    device: &str,
    prop: &str,
    value: &str,
    version: i64,
) -> api::message::Message {
    api::message::Message::new(
        "edgehub",
        "twin",
        "update",
        format!("node/{node}/device/default/{device}/twin/edge_updated"),
        serde_json::json!({"event_id": format!("e{version}"), "timestamp": 1_700_000_000_000i64 + version,
            "twin": {prop: {"actual": {"value": value, "metadata": {"timestamp": 1_700_000_000_000i64 + version}},
                "metadata": {"type": "int"}, "actual_version": {"cloud": 0, "edge": version}}}}),
    )
}

/// The project's `.venv` Python (made by `scripts/test`), or `python3` from `PATH`.
pub fn python() -> PathBuf {
    let venv = workspace().join(".venv/bin/python3");
    if venv.is_file() {
        venv
    } else {
        "python3".into()
    }
}
