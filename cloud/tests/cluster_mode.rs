//! `cloudcore` given a `kubeconfig:` works against that cluster through kube-rs (here another
//! cloudcore's embedded API stands in for a cluster) and leaves its own API off.

mod common;

use common::{Cloud, path_str};
use std::process::{Command, Stdio};

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
    sim::poll::eventually(20, "cloudcore's CRDs on the cluster", || {
        (cluster.kubectl(&["get", "crd", "objectsyncs.reliablesyncs.kubeedge.io"]))
            .status
            .success()
            .then_some(())
    });
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

/// Two replicas against one cluster (`kubeconfig:`): the first one's CA is the fleet's (a
/// Secret in the cluster), the second takes it; one of them holds the leader Lease.
#[test]
fn replicas_against_a_cluster_share_the_ca_and_elect_one_leader() {
    let cluster = Cloud::start();
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().expect("dir")).collect();
    let mut children = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let config = format!(
            "kubeconfig: {}\nmodules:\n  apiserver:\n    enable: false\n  cloudHub:\n    listen: \"127.0.0.1:{}\"\n    certListen: \"127.0.0.1:{}\"\n  leaderElection:\n    identity: replica-{i}\n  metrics:\n    listen: \"\"\n",
            path_str(&cluster.kubeconfig),
            common::free_port(),
            common::free_port(),
        );
        children.push(run_with(dir.path(), &config));
        // The first makes the fleet's CA before the second looks for it.
        let ca = dir.path().join("cloudcore-data/pki/ca.crt");
        sim::poll::eventually(30, &format!("replica {i}'s CA"), || {
            ca.exists().then_some(())
        });
    }
    let holder = sim::poll::eventually_or(30, "a leader", || {
        let out = cluster.kubectl(&[
            "get",
            "lease",
            "-n",
            "kubeedge",
            "cloudcore",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ]);
        let h = String::from_utf8_lossy(&out.stdout).to_string();
        if h.starts_with("replica-") {
            Ok(h)
        } else {
            Err(h)
        }
    });
    assert!(holder == "replica-0" || holder == "replica-1", "{holder}");
    let ca = |d: &tempfile::TempDir| {
        std::fs::read_to_string(d.path().join("cloudcore-data/pki/ca.crt")).expect("ca.crt")
    };
    assert_eq!(ca(&dirs[0]), ca(&dirs[1]), "one CA for the fleet");
    for mut c in children {
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let _ = c.wait();
    }
}
