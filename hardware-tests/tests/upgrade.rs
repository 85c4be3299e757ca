//! `NodeUpgradeJob` from the real `kubectl` against `cloudcore`: three joined `edgecore`s, each
//! running from a path of its own, upgraded to the release `v2` (the build with bytes appended,
//! so its SHA-256 differs) that cloudcore keeps in `{dataDir}/releases/v2/edgecore`. The canary
//! goes alone first; the third node's link lets its old session on but no new one, so its new
//! edgecore cannot get its session back and rolls back by itself; the job's status says each
//! node's phase, versions, steps and reason, and `kubectl get nodes` the versions. Then
//! `kill -9` of edgecore before and after the rename of its swap: it starts again either way
//! (old, then new), and the job says what happened.
//!
//! `ConfigUpdateJob` the same way: a field that is not one and a value that is not one refused
//! before anything is written; a field set on two nodes, the canary first, the node whose link
//! takes no new session putting its old config back by itself.

use serde_json::Value;
use sim::jobs::{actions, node_status};
use sim::stack::Cloud;
use sim::{Node, Proc, Proxy, bin, eventually};
use std::path::{Path, PathBuf};

fn job(cloud: &Cloud, name: &str) -> Value {
    sim::jobs::get(cloud, "nodeupgradejob", name)
}

fn over(cloud: &Cloud, name: &str, secs: u64) -> Value {
    sim::jobs::over(cloud, "nodeupgradejob", name, secs)
}

/// The release `v2` in cloudcore's data directory: the build with bytes appended.
fn release(cloud: &Cloud, build: &Path) -> PathBuf {
    let dir = cloud.dir.path().join("data/releases/v2");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let file = dir.join("edgecore");
    let mut bytes = std::fs::read(build).expect("the build");
    bytes.extend_from_slice(b"\nrelease v2\n");
    std::fs::write(&file, bytes).expect("release");
    file
}

/// A directory holding a link to the build as `edgecore`, for a node to run from its own path.
fn own_bins(build: &Path) -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("tempdir");
    std::fs::hard_link(build, d.path().join("edgecore"))
        .or_else(|_| std::fs::copy(build, d.path().join("edgecore")).map(|_| ()))
        .expect("edgecore");
    d
}

fn state(node: &Node) -> Value {
    std::fs::read(node.dir.path().join("data/upgrade/state.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null)
}

fn kubelet_version(cloud: &Cloud, node: &str) -> String {
    cloud
        .kubectl(&[
            "get",
            "node",
            node,
            "-o",
            "jsonpath={.status.nodeInfo.kubeletVersion}",
        ])
        .1
}

fn apply(cloud: &Cloud, dir: &Path, yaml: &str) {
    let (ok, said) = sim::jobs::apply(cloud, dir, yaml);
    assert!(ok, "kubectl apply: {said}");
}

#[test]
fn a_fleet_is_upgraded_canary_first_and_a_node_that_fails_its_check_rolls_back() {
    let build = bin("edgecore");
    let cloud = Cloud::start();
    let _release = release(&cloud, &build);
    let bins: Vec<tempfile::TempDir> = (0..3).map(|_| own_bins(&build)).collect();
    let link = Proxy::start(cloud.hub);
    let n1 = Node::start_named(bins[0].path(), "edge-node-1", "", &cloud.edge_config());
    let n2 = Node::start_named(bins[1].path(), "edge-node-2", "", &cloud.edge_config());
    let n3 = Node::start_named(
        bins[2].path(),
        "edge-node-3",
        "",
        &cloud.edge_config_via(link.port),
    );
    let before = format!("v{}-edgecore", env!("CARGO_PKG_VERSION"));
    for n in ["edge-node-1", "edge-node-2", "edge-node-3"] {
        eventually(60, &format!("{n} joined"), || {
            (kubelet_version(&cloud, n) == before).then_some(())
        });
    }
    cloud.ok(&[
        "label",
        "node",
        "edge-node-1",
        "edge-node-2",
        "edge-node-3",
        "fleet=plant-a",
    ]);
    // The third node's session goes on, but a new one cannot start.
    link.refuse_new();
    let dir = tempfile::tempdir().expect("tempdir");
    apply(
        &cloud,
        dir.path(),
        "apiVersion: operations.kubeedge.io/v1alpha2\nkind: NodeUpgradeJob\nmetadata: {name: to-v2}\nspec:\n  version: v2\n  labelSelector: {matchLabels: {fleet: plant-a}}\n  concurrency: 2\n  failureTolerate: \"0.5\"\n  timeoutSeconds: 60\n",
    );
    // The canary alone until it succeeded; then the others.
    let mut restored = false;
    let j = eventually(180, "job to-v2 over", || {
        let j = job(&cloud, "to-v2");
        let phase = |n: &str| {
            j["status"]["nodeStatus"]
                .as_array()
                .and_then(|a| a.iter().find(|s| s["nodeName"] == n))
                .and_then(|s| s["phase"].as_str())
                .unwrap_or("Pending")
                .to_string()
        };
        if phase("edge-node-1") != "Successful" {
            for n in ["edge-node-2", "edge-node-3"] {
                assert_eq!(phase(n), "Pending", "{n} started before the canary: {j}");
            }
        }
        // The third node rolled back by itself: its link lets new sessions on again.
        if !restored && state(&n3)["step"] == "RolledBack" {
            link.restore();
            restored = true;
        }
        matches!(j["status"]["phase"].as_str(), Some("Completed" | "Failure")).then_some(j)
    });
    assert_eq!(j["status"]["phase"], "Completed", "{j}");
    assert!(
        j["status"]["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with(
                "2 of 3 nodes succeeded; 1 failed, within failureTolerate 0.5. edge-node-3: "
            ) && r.contains("rolled back to")),
        "the node's own reason in the job's: {j}"
    );
    for n in ["edge-node-1", "edge-node-2"] {
        let s = node_status(&j, n);
        assert_eq!(s["phase"], "Successful", "{j}");
        assert_eq!(s["currentVersion"], "v2", "{j}");
        assert_eq!(
            s["historicVersion"],
            format!("v{}", env!("CARGO_PKG_VERSION")),
            "{j}"
        );
        let steps = actions(s);
        for step in ["Check", "BackUp", "Upgrade"] {
            assert!(
                steps.contains(&(step.to_string(), "True".to_string())),
                "{n}: {step} in {steps:?}"
            );
        }
        eventually(30, &format!("{n} says v2"), || {
            (kubelet_version(&cloud, n) == "v2-edgecore").then_some(())
        });
    }
    let s3 = node_status(&j, "edge-node-3");
    assert_eq!(s3["phase"], "Failure", "{j}");
    let why = s3["reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("had no session with the cloud within 30s")
            && why.contains(&format!("rolled back to v{}", env!("CARGO_PKG_VERSION"))),
        "{j}"
    );
    assert!(
        actions(s3).contains(&("RollBack".to_string(), "True".to_string())),
        "{j}"
    );
    assert_eq!(kubelet_version(&cloud, "edge-node-3"), before);
    // Same processes, new programs (exec): the upgraded ones run the release.
    let release_bytes =
        std::fs::read(cloud.dir.path().join("data/releases/v2/edgecore")).expect("release");
    for (n, b) in [(&n1, &bins[0]), (&n2, &bins[1])] {
        assert!(n.started(), "edgecore runs");
        assert!(std::fs::read(b.path().join("edgecore")).expect("binary") == release_bytes);
    }
    assert!(n3.started());
    assert!(
        std::fs::read(bins[2].path().join("edgecore")).expect("binary")
            == std::fs::read(&build).expect("build"),
        "the third node runs the old build again"
    );
    let table = cloud.ok(&["get", "nodeupgradejobs"]);
    assert!(
        table.contains("VERSION") && table.contains("Completed"),
        "{table}"
    );
    // The fleet page's jobs: the upgrade, its nodes' versions and steps, the rollback's reason.
    sim::browser::fleet_view_shows(
        cloud.api,
        &cloud.admin_token(),
        "jobs",
        &[
            (
                r#"tr[data-job="nodeupgradejob/to-v2"]"#,
                "the upgrade",
                &|t| t.contains("upgrade to v2") && t.contains("2 succeeded, 1 failed"),
            ),
            (
                r#"tr[data-job-node="nodeupgradejob/to-v2/edge-node-1"]"#,
                "the canary",
                &|t| t.contains("runs v2") && t.contains("Check → BackUp → Upgrade"),
            ),
            (
                r#"tr[data-job-node="nodeupgradejob/to-v2/edge-node-3"]"#,
                "the node rolled back",
                &|t| t.contains("RollBack") && t.contains("rolled back to"),
            ),
        ],
        "the fleet's upgrades",
    );

    // A bad release name never reaches a node; a release cloudcore does not have ends the job.
    apply(
        &cloud,
        dir.path(),
        "apiVersion: operations.kubeedge.io/v1alpha2\nkind: NodeUpgradeJob\nmetadata: {name: to-v9}\nspec:\n  version: v9\n  nodeNames: [edge-node-1]\n",
    );
    let j = over(&cloud, "to-v9", 60);
    assert_eq!(j["status"]["phase"], "Failure", "{j}");
    assert!(
        j["status"]["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("no release \"v9\": put its edgecore at ")),
        "{j}"
    );
    let f = dir.path().join("bad.yaml");
    std::fs::write(
        &f,
        "apiVersion: operations.kubeedge.io/v1alpha2\nkind: NodeUpgradeJob\nmetadata: {name: escape}\nspec:\n  version: ../../etc\n  nodeNames: [edge-node-1]\n",
    )
    .expect("write");
    let (ok, said) = cloud.kubectl(&["apply", "-f", f.to_str().expect("path")]);
    assert!(!ok && said.contains("spec.version"), "{said}");
}

/// A release that answers `--version` and exits at start, as one does that refuses the
/// config it finds or misses a library it needs: its own rules never run, so only the old
/// edgecore, which starts it and watches it, can put the gateway back.
#[test]
fn a_release_that_exits_at_start_is_rolled_back_by_the_old_edgecore() {
    broken_release_is_rolled_back(
        "echo 'edgecore: /etc/kubeedge/edgecore.yaml: unknown field `modules`' >&2\nexit 2",
        &[
            "the new edgecore (v9) exited on trial (exit status: 2)",
            "unknown field `modules`",
        ],
    );
}

/// A release that starts and hangs before its session is up (it never reaches its own
/// trial's clock): the old edgecore stops it once its trial's time and the grace are over.
#[test]
fn a_release_that_hangs_at_start_is_rolled_back_by_the_old_edgecore() {
    broken_release_is_rolled_back(
        "exec sleep 3600",
        &["the new edgecore (v9) had not finished its trial after 25 s"],
    );
}

/// The release `v9`, a script that answers `--version` and then runs `then`, tried on a node
/// (a trial of 20 s, a grace of 5 s after it, within the job's 40 s): the old edgecore, the node's process, rolls it
/// back, the job saying why (`says`), and runs again on the old version.
fn broken_release_is_rolled_back(then: &str, says: &[&str]) {
    let build = bin("edgecore");
    let cloud = Cloud::start();
    let dir = cloud.dir.path().join("data/releases/v9");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let broken = dir.join("edgecore");
    std::fs::write(
        &broken,
        format!("#!/bin/sh\n[ \"$1\" = --version ] && {{ echo edgecore v9; exit 0; }}\n{then}\n"),
    )
    .expect("release");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let bins = own_bins(&build);
    let mut node = Node::start_named(bins.path(), "edge-node-1", "", &cloud.edge_config());
    let before = format!("v{}-edgecore", env!("CARGO_PKG_VERSION"));
    eventually(60, "the node joined", || {
        (kubelet_version(&cloud, "edge-node-1") == before).then_some(())
    });
    // Started again with the short grace, as a test of a hang can wait for.
    node.kill_edgecore();
    node.edgecore = Proc::spawn_env(
        &bins.path().join("edgecore"),
        &["--config", "edgecore.yaml"],
        node.dir.path(),
        "edgecore-watched.log",
        &[("EDGECORE_WATCH_GRACE_SECONDS", "5".to_string())],
    );
    eventually(30, "edgecore ready", || node.started().then_some(()));
    let pid = node.edgecore.child.id();
    let work = tempfile::tempdir().expect("tempdir");
    apply(
        &cloud,
        work.path(),
        "apiVersion: operations.kubeedge.io/v1alpha2\nkind: NodeUpgradeJob\nmetadata: {name: broken}\nspec:\n  version: v9\n  nodeNames: [edge-node-1]\n  timeoutSeconds: 40\n",
    );
    let j = over(&cloud, "broken", 150);
    assert_eq!(j["status"]["phase"], "Failure", "{j}");
    let n = node_status(&j, "edge-node-1");
    let version = format!("v{}", env!("CARGO_PKG_VERSION"));
    let reason = n["reason"].as_str().unwrap_or_default();
    assert!(
        says.iter().all(|s| reason.contains(s)) && reason.contains("rolled back to"),
        "the reason says how it ended: {j}"
    );
    assert_eq!(n["currentVersion"], version, "the version it runs: {j}");
    assert!(
        j["status"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&format!(". edge-node-1: {}", says[0]))),
        "the node's reason in the job's, which kubectl get shows: {j}"
    );
    assert!(
        std::fs::read(bins.path().join("edgecore")).expect("binary")
            == std::fs::read(&build).expect("build"),
        "the old binary is back at edgecore's path"
    );
    // The old edgecore runs again in the same process (the service's main process), answers
    // and has its session: the node is Ready on its old version.
    eventually(60, "edgecore answering again", || {
        node.started().then_some(())
    });
    assert_eq!(node.edgecore.child.id(), pid);
    eventually(60, "the node Ready on the old version", || {
        let ready = cloud.kubectl(&[
            "get",
            "node",
            "edge-node-1",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ]);
        (ready.1.trim() == "True" && kubelet_version(&cloud, "edge-node-1") == before).then_some(())
    });
    assert_eq!(state(&node)["step"], "RolledBack");
}

#[test]
fn edgecore_killed_in_the_middle_of_its_swap_starts_again_old_or_new() {
    let build = bin("edgecore");
    let cloud = Cloud::start();
    let _release = release(&cloud, &build);
    let bins = own_bins(&build);
    let mut node = Node::start_named(bins.path(), "edge-node-1", "", &cloud.edge_config());
    eventually(60, "the node joined", || {
        cloud
            .kubectl(&["get", "node", "edge-node-1"])
            .0
            .then_some(())
    });
    let dir = tempfile::tempdir().expect("tempdir");
    // Slowed down around the rename, to be killed there.
    let slow = |node: &mut Node, log: &str| {
        node.kill_edgecore();
        node.edgecore = Proc::spawn_env(
            &bins.path().join("edgecore"),
            &["--config", "edgecore.yaml"],
            node.dir.path(),
            log,
            &[("EDGECORE_UPGRADE_STEP_PAUSE_MS", "5000".to_string())],
        );
        eventually(30, "edgecore ready", || node.started().then_some(()));
    };
    let build_bytes = std::fs::read(&build).expect("build");
    let release_bytes =
        std::fs::read(cloud.dir.path().join("data/releases/v2/edgecore")).expect("release");
    let binary = || std::fs::read(bins.path().join("edgecore")).expect("binary");

    // Killed before the rename: the old edgecore starts; the job says so.
    slow(&mut node, "edgecore-slow.log");
    apply(
        &cloud,
        dir.path(),
        "apiVersion: operations.kubeedge.io/v1alpha2\nkind: NodeUpgradeJob\nmetadata: {name: first}\nspec:\n  version: v2\n  nodeNames: [edge-node-1]\n  timeoutSeconds: 60\n",
    );
    eventually(60, "the swap begun", || {
        (state(&node)["step"] == "Swapping").then_some(())
    });
    node.kill_edgecore();
    assert!(binary() == build_bytes, "before the rename: the old binary");
    node.revive();
    let j = over(&cloud, "first", 90);
    assert_eq!(j["status"]["phase"], "Failure", "{j}");
    assert!(
        node_status(&j, "edge-node-1")["reason"]
            .as_str()
            .is_some_and(|r| r.contains("edgecore stopped before its binary was replaced")),
        "{j}"
    );

    // Killed after the rename: the new edgecore starts, proves itself, the job succeeds.
    slow(&mut node, "edgecore-slow2.log");
    apply(
        &cloud,
        dir.path(),
        "apiVersion: operations.kubeedge.io/v1alpha2\nkind: NodeUpgradeJob\nmetadata: {name: second}\nspec:\n  version: v2\n  nodeNames: [edge-node-1]\n  timeoutSeconds: 60\n",
    );
    eventually(60, "the binary renamed", || {
        // In the pause between the rename and the restart (Restarting would be too late:
        // the new edgecore may have started its trial, and a kill then is a second start).
        (state(&node)["step"] == "Swapping" && binary() == release_bytes).then_some(())
    });
    node.kill_edgecore();
    node.revive();
    let j = over(&cloud, "second", 90);
    assert_eq!(j["status"]["phase"], "Completed", "{j}");
    assert_eq!(
        node_status(&j, "edge-node-1")["currentVersion"],
        "v2",
        "{j}"
    );
    assert!(binary() == release_bytes);
}

#[test]
fn a_config_update_is_checked_applied_and_rolled_back_by_a_node_that_does_not_come_back() {
    let cloud = Cloud::start();
    let bins = bin("edgecore")
        .parent()
        .map(Path::to_path_buf)
        .expect("bin dir");
    let link = Proxy::start(cloud.hub);
    let n1 = Node::start_named(&bins, "edge-node-1", "", &cloud.edge_config());
    let n2 = Node::start_named(&bins, "edge-node-2", "", &cloud.edge_config_via(link.port));
    for n in ["edge-node-1", "edge-node-2"] {
        eventually(60, &format!("{n} Ready"), || {
            let s = cloud.ok(&["get", "node", n, "--no-headers"]);
            (s.contains("Ready") && !s.contains("NotReady")).then_some(())
        });
    }
    let config =
        |n: &Node| std::fs::read_to_string(n.dir.path().join("edgecore.yaml")).expect("config");
    let (first1, first2) = (config(&n1), config(&n2));
    let dir = tempfile::tempdir().expect("tempdir");

    // Checked on the node as edgecore reads its config: nothing written when it is wrong.
    for (name, fields, said) in [
        ("typo", "{cloud.metricSeconds: \"30\"}", "metricSeconds"),
        (
            "bad-value",
            "{cloud.metricsSeconds: soon}",
            "metricsSeconds",
        ),
    ] {
        apply(
            &cloud,
            dir.path(),
            &format!(
                "apiVersion: operations.kubeedge.io/v1alpha2\nkind: ConfigUpdateJob\nmetadata: {{name: {name}}}\nspec:\n  nodeNames: [edge-node-1]\n  updateFields: {fields}\n  timeoutSeconds: 60\n"
            ),
        );
        let j = sim::jobs::over(&cloud, "configupdatejob", name, 60);
        assert_eq!(j["status"]["phase"], "Failure", "{j}");
        let s = node_status(&j, "edge-node-1");
        assert_eq!(s["phase"], "Failure", "{j}");
        let reason = s["reason"].as_str().unwrap_or_default();
        assert!(reason.contains(said), "{name}: {reason}");
        assert_eq!(
            actions(s),
            [("Check".to_string(), "False".to_string())],
            "{j}"
        );
        assert_eq!(config(&n1), first1, "{name}: the config is untouched");
    }
    // The schema refuses a job without fields.
    let f = dir.path().join("empty.yaml");
    std::fs::write(&f, "apiVersion: operations.kubeedge.io/v1alpha2\nkind: ConfigUpdateJob\nmetadata: {name: empty}\nspec:\n  nodeNames: [edge-node-1]\n").expect("write");
    let (ok, said) = cloud.kubectl(&["apply", "-f", f.to_str().expect("path")]);
    assert!(!ok && said.contains("updateFields"), "{said}");

    // Both nodes, the canary first; the second's link lets no new session on.
    link.refuse_new();
    apply(
        &cloud,
        dir.path(),
        "apiVersion: operations.kubeedge.io/v1alpha2\nkind: ConfigUpdateJob\nmetadata: {name: metrics-7}\nspec:\n  nodeNames: [edge-node-1, edge-node-2]\n  updateFields: {cloud.metricsSeconds: \"7\"}\n  concurrency: 2\n  failureTolerate: \"0.5\"\n  timeoutSeconds: 60\n",
    );
    // Once the second node put its old config back by itself, its link lets it on again, so
    // it can say so.
    let mut restored = false;
    let j = eventually(180, "configupdatejob metrics-7 over", || {
        if !restored && state(&n2)["step"] == "RolledBack" {
            assert_eq!(config(&n2), first2, "the old config is back, as it was");
            link.restore();
            restored = true;
        }
        let j = sim::jobs::get(&cloud, "configupdatejob", "metrics-7");
        matches!(j["status"]["phase"].as_str(), Some("Completed" | "Failure")).then_some(j)
    });
    let s1 = node_status(&j, "edge-node-1");
    assert_eq!(s1["phase"], "Successful", "{j}");
    let steps1: Vec<String> = actions(s1)
        .into_iter()
        .map(|(a, st)| format!("{a}={st}"))
        .collect();
    assert_eq!(steps1, ["Check=True", "BackUp=True", "Update=True"], "{j}");
    let new1: serde_yaml_ng::Value = serde_yaml_ng::from_str(&config(&n1)).expect("yaml");
    assert_eq!(
        new1["cloud"]["metricsSeconds"],
        serde_yaml_ng::Value::from(7),
        "{}",
        config(&n1)
    );
    let s2 = node_status(&j, "edge-node-2");
    assert_eq!(s2["phase"], "Failure", "{j}");
    let reason = s2["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("had no session") && reason.contains("rolled back"),
        "{reason}"
    );
    let steps2: Vec<String> = actions(s2)
        .into_iter()
        .map(|(a, st)| format!("{a}={st}"))
        .collect();
    assert_eq!(
        steps2,
        ["Check=True", "BackUp=True", "RollBack=True"],
        "{j}"
    );
    assert_eq!(config(&n2), first2, "the old config is back, as it was");
    // The job as a whole: one node failed, within what it tolerates.
    assert_eq!(j["status"]["phase"], "Completed", "{j}");
    // The fleet page's jobs: the update, the field, each node's steps.
    sim::browser::fleet_view_shows(
        cloud.api,
        &cloud.admin_token(),
        "jobs",
        &[
            (
                r#"tr[data-job="configupdatejob/metrics-7"]"#,
                "the config update",
                &|t| {
                    t.contains("config update: cloud.metricsSeconds")
                        && t.contains("1 succeeded, 1 failed")
                },
            ),
            (
                r#"tr[data-job-node="configupdatejob/metrics-7/edge-node-2"]"#,
                "the node rolled back",
                &|t| t.contains("Check → BackUp → RollBack") && t.contains("rolled back"),
            ),
        ],
        "the fleet's config updates",
    );
    // The node runs on its old config again, back with the cloud.
    eventually(60, "edge-node-2 Ready again", || {
        let s = cloud.ok(&["get", "node", "edge-node-2", "--no-headers"]);
        (s.contains("Ready") && !s.contains("NotReady")).then_some(())
    });
    drop((n1, n2));
}
