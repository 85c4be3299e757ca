//! The kube-rs cases every API must pass (`common/cases.rs`), against the third-party
//! Kubernetes emulator kmock (PyPI; `scripts/test` installs it in `.venv`), started by
//! `tests/kmock/server.py`. The same cases run against cloudcore in `kube_rs.rs`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

struct Kmock {
    child: Child,
    port: u16,
}

impl Drop for Kmock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn python() -> std::path::PathBuf {
    let venv = common::workspace().join(".venv/bin/python3");
    if venv.is_file() {
        venv
    } else {
        "python3".into()
    }
}

fn kmock() -> Kmock {
    let script = common::workspace().join("cloud/tests/kmock/server.py");
    let mut child = Command::new(python())
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python runs");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("kmock prints its port");
    let port = line
        .trim()
        .strip_prefix("PORT ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| {
            panic!("kmock did not start (is it installed? run scripts/test --setup-only): {line:?}")
        });
    Kmock { child, port }
}

async fn client(k: &Kmock) -> kube::Client {
    let url = format!("http://127.0.0.1:{}", k.port).parse().expect("url");
    kube::Client::try_from(kube::Config::new(url)).expect("client")
}

#[tokio::test]
async fn crud_against_kmock() {
    let k = kmock();
    common::cases::crud(client(&k).await).await;
}

#[tokio::test]
async fn reflector_against_kmock() {
    let k = kmock();
    common::cases::reflector_follows(client(&k).await).await;
}
