//! What the tests of a Kubernetes-compatible API share: the embedded API's (this crate's
//! `tests/`) and cloudcore's (`cloud/tests/`, which include this file): the real `kubectl` as a
//! user types it, a server process that is stopped or killed, and small helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// The workspace: the nearest folder above the test's crate with a `Cargo.lock`.
pub fn workspace() -> PathBuf {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    crate_dir
        .ancestors()
        .find(|d| d.join("Cargo.lock").is_file())
        .unwrap_or(&crate_dir)
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

pub use sim::free_port;

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

/// The real kubectl with a kubeconfig, its cache and `HOME` in the test's directory.
pub struct Kubectl {
    pub kubeconfig: PathBuf,
    pub dir: PathBuf,
}

impl Kubectl {
    /// kubectl as the admin of the server whose data directory is `dir/data`.
    pub fn admin_of(dir: &Path) -> Self {
        Kubectl {
            kubeconfig: dir.join("data/admin.kubeconfig"),
            dir: dir.to_path_buf(),
        }
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
        sim::output_with(&mut self.kubectl_cmd(args), input.as_bytes())
    }
}

/// A server a test starts, kills and stops: what the API's harness and cloudcore's share.
pub trait Served {
    fn process(&mut self) -> &mut Process;
    fn process_ref(&self) -> &Process;
    /// Starts the server again on its data directory and ports.
    fn respawn(&mut self);

    /// The server's resident memory, in kB.
    fn rss_kb(&self) -> Option<u64> {
        self.process_ref().rss_kb()
    }

    /// `kill -9`.
    fn kill9(&mut self) {
        self.process().kill9();
    }

    /// SIGTERM, and how long it took to exit.
    fn stop(&mut self) -> Duration {
        self.process().stop()
    }

    fn restart(&mut self) {
        self.stop();
        self.respawn();
    }

    fn restart_after_kill9(&mut self) {
        self.kill9();
        self.respawn();
    }
}

/// `impl Served` for a harness type with a `process` field and a `spawn` method, and kubectl
/// as its admin (its `kube` field) through `Deref`.
#[macro_export]
macro_rules! served {
    ($t:ty) => {
        impl std::ops::Deref for $t {
            type Target = Kubectl;

            fn deref(&self) -> &Kubectl {
                &self.kube
            }
        }

        impl Served for $t {
            fn process(&mut self) -> &mut Process {
                &mut self.process
            }

            fn process_ref(&self) -> &Process {
                &self.process
            }

            fn respawn(&mut self) {
                self.spawn();
            }
        }
    };
}

/// A server process: killed, or stopped with SIGTERM and timed.
#[derive(Default)]
pub struct Process(pub Option<Child>);

impl Process {
    /// `cmd` started with `RUST_LOG=info`, its stderr appended to `log`.
    pub fn start(cmd: &mut Command, log: &Path) -> Self {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let child = cmd
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("{:?} starts: {e}", cmd.get_program()));
        Process(Some(child))
    }

    /// The process's resident memory (VmRSS), in kB.
    pub fn rss_kb(&self) -> Option<u64> {
        let pid = self.0.as_ref()?.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, and how long it took to exit.
    pub fn stop(&mut self) -> Duration {
        let started = Instant::now();
        if let Some(mut c) = self.0.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let _ = c.wait();
        }
        started.elapsed()
    }

    /// Waits until the log file holds one more `marker` than `seen` (the server printed that
    /// it serves); panics with the log when the process exits or 30 s pass.
    pub fn wait_serving(&mut self, name: &str, log: &Path, marker: &str, seen: &mut usize) {
        let text = || std::fs::read_to_string(log).unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let starts = text().matches(marker).count();
            if starts > *seen {
                *seen = starts;
                return;
            }
            if let Some(c) = self.0.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!("{name} exited with {status}: {}", text());
            }
            assert!(
                Instant::now() < deadline,
                "{name} did not come up: {}",
                text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill9();
    }
}
