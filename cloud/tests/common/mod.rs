//! Runs the real `cloudcore` binary on a temporary data directory, and the real `kubectl`
//! against it (the harness the embedded API's own tests use, `harness.rs`, is shared).
#![allow(dead_code)]

#[path = "../../apiserver/tests/common/harness.rs"]
mod harness;

pub use harness::*;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// A running cloudcore; kubectl as its admin through `Deref` (`cloud.ok(&["get", ...])`).
pub struct Cloud {
    pub dir: PathBuf,
    pub port: u16,
    /// cloudhub's websocket and certificate ports.
    pub hub_port: u16,
    pub cert_port: u16,
    pub kubeconfig: PathBuf,
    kube: Kubectl,
    extra: String,
    modules: String,
    /// A shell command run before cloudcore (`umask 000`), if any.
    setup: Option<String>,
    starts: usize,
    process: Process,
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
        let dir = tmp.path().to_path_buf();
        let kube = Kubectl::admin_of(&dir);
        let mut c = Self {
            kubeconfig: kube.kubeconfig.clone(),
            kube,
            dir,
            port: free_port(),
            hub_port: free_port(),
            cert_port: free_port(),
            extra: extra.to_string(),
            modules: modules.to_string(),
            setup,
            starts: 0,
            process: Process::default(),
            _tmp: Some(tmp),
        };
        c.spawn();
        c
    }

    /// Starts cloudcore; when a port picked for it was taken meanwhile (by another test's
    /// outgoing connection, say), it starts again on new ports.
    fn spawn(&mut self) {
        for _ in 0..5 {
            if self.spawn_once() {
                return;
            }
            self.port = free_port();
            self.hub_port = free_port();
            self.cert_port = free_port();
        }
        panic!("cloudcore found no free ports in 5 tries: {}", self.log());
    }

    /// Starts cloudcore and waits until it serves the API and cloudhub; false when it stopped
    /// because an address was in use.
    fn spawn_once(&mut self) -> bool {
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
        cmd.arg("--config").arg(&config);
        self.process = Process::start(&mut cmd, &self.dir.join("cloudcore.log"));
        // cloudcore prints where its API is once it serves (CRDs installed), then cloudhub.
        let marker = "cloudcore: cloudhub at";
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = self.log();
            let starts = text.matches(marker).count();
            if starts > self.starts {
                self.starts = starts;
                return true;
            }
            if let Some(c) = self.process.0.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                if text.contains("in use") {
                    return false;
                }
                panic!("cloudcore exited with {status}: {text}");
            }
            assert!(
                Instant::now() < deadline,
                "cloudcore did not come up: {text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("cloudcore.log")).unwrap_or_default()
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

crate::served!(Cloud);
