//! Runs the crate's own `apiserver` binary on a temporary data directory, with the project's
//! CRDs installed (as cloudcore installs them), and the real `kubectl` against it.
#![allow(dead_code)]

pub mod cases;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
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

/// The CRDs cloudcore installs: the device API's (generated from `api`'s types) and
/// KubeEdge's ObjectSync ones (`cloud/crds/`), as one YAML file.
fn write_crds(file: &Path) {
    let mut yaml = String::new();
    for crd in api::crd::crds() {
        yaml.push_str("---\n");
        yaml.push_str(&serde_yaml_ng::to_string(&crd).expect("a CRD as YAML"));
    }
    let dir = workspace().join("cloud/crds");
    for entry in std::fs::read_dir(&dir).expect("cloud/crds") {
        let path = entry.expect("an entry").path();
        yaml.push_str("---\n");
        yaml.push_str(&std::fs::read_to_string(&path).expect("a CRD file"));
        yaml.push('\n');
    }
    std::fs::write(file, yaml).expect("CRDs written");
}

/// A running `apiserver`.
pub struct Server {
    pub dir: PathBuf,
    pub port: u16,
    pub kubeconfig: PathBuf,
    args: Vec<String>,
    starts: usize,
    child: Option<Child>,
    _tmp: tempfile::TempDir,
}

impl Server {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts with extra command-line `args` (`--watch-history 100`).
    pub fn start_with(args: &[&str]) -> Self {
        let tmp = tempfile::tempdir().expect("temp dir");
        write_crds(&tmp.path().join("crds.yaml"));
        let mut c = Self {
            dir: tmp.path().to_path_buf(),
            port: free_port(),
            kubeconfig: tmp.path().join("data/admin.kubeconfig"),
            args: args.iter().map(|a| a.to_string()).collect(),
            starts: 0,
            child: None,
            _tmp: tmp,
        };
        c.spawn();
        c
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("apiserver.log"))
            .expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_apiserver"))
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--install")
            .arg(self.dir.join("crds.yaml"))
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("apiserver starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // It prints where its API is once it serves (CRDs installed).
            let starts = self.log().matches("apiserver: API at").count();
            if starts > self.starts {
                self.starts = starts;
                break;
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!("apiserver exited with {status}: {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "apiserver did not come up: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("apiserver.log")).unwrap_or_default()
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

    /// A kube-rs client of the admin kubeconfig.
    pub async fn client(&self) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("a client config");
        kube::Client::try_from(config).expect("a kube-rs client")
    }

    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }
}

impl Drop for Server {
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

/// The project's `.venv` Python (made by `scripts/test`), or `python3` from `PATH`.
pub fn python() -> PathBuf {
    let venv = workspace().join(".venv/bin/python3");
    if venv.is_file() {
        venv
    } else {
        "python3".into()
    }
}
