//! `cloudcore` given a `kubeconfig:` works against that cluster through kube-rs (here another
//! cloudcore's embedded API stands in for a cluster) and leaves its own API off.

mod common;

use common::{Cloud, path_str};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn run_with(dir: &std::path::Path, config: &str) -> std::process::Child {
    let file = dir.join("cluster-mode.yaml");
    std::fs::write(&file, config).expect("config");
    Command::new(env!("CARGO_BIN_EXE_cloudcore"))
        .arg("--config")
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cloudcore starts")
}

#[test]
fn installs_its_crds_on_the_cluster_of_its_kubeconfig() {
    let cluster = Cloud::start();
    cluster.ok(&["delete", "crd", "objectsyncs.reliablesyncs.kubeedge.io"]);
    assert!(
        !cluster
            .kubectl(&["get", "crd", "objectsyncs.reliablesyncs.kubeedge.io"])
            .status
            .success()
    );
    let dir = tempfile::tempdir().expect("dir");
    let mut child = run_with(
        dir.path(),
        &format!(
            "kubeconfig: {}\nmodules:\n  apiserver:\n    enable: false\n  deviceController:\n    enable: false\n  cloudHub:\n    enable: false\n  metrics:\n    listen: \"\"\n",
            path_str(&cluster.kubeconfig)
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cluster
        .kubectl(&["get", "crd", "objectsyncs.reliablesyncs.kubeedge.io"])
        .status
        .success()
    {
        assert!(
            Instant::now() < deadline,
            "cloudcore did not install its CRDs on the cluster"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !dir.path().join("cloudcore-data").exists(),
        "no embedded API data made"
    );
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().expect("exits");
    assert!(status.success(), "{status}");
}

#[test]
fn a_bad_kubeconfig_is_named() {
    let dir = tempfile::tempdir().expect("dir");
    let missing = dir.path().join("nope.kubeconfig");
    let child = run_with(dir.path(), &format!("kubeconfig: {}\n", path_str(&missing)));
    let out = child.wait_with_output().expect("exits");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot read kubeconfig {}", missing.display())),
        "{err}"
    );
    let child = run_with(dir.path(), "modules:\n  apiserver:\n    listen: 6443\n");
    let out = child.wait_with_output().expect("exits");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cluster-mode.yaml: key `modules.apiserver.listen`"),
        "{err}"
    );
}
