//! `ImagePrePullJob` (operations.kubeedge.io/v1alpha2) from the real `kubectl` against
//! `cloudcore`, with three joined `edgecore`s: two run pods on a containerd of their own (both
//! pulling from a real registry, `docker-registry`), the third has no edged. Nodes chosen by
//! label and by name; an image pulled on both nodes is then in each containerd; an image that
//! is not in the registry, a node with no runtime, a node that does not exist and a node away
//! each fail with their reason in `status.nodeStatus`, and the job stops starting nodes past
//! `failureTolerate`; a bad template is refused or ends the job naming the field; a user with
//! only `view` and a node's own certificate cannot make jobs.
//!
//! Runs as root (containerd); `.ci/run` installs containerd, runc, umoci, busybox-static,
//! docker-registry and skopeo.

use serde_json::Value;
use sim::containerd::{Containerd, Registry, binary_image};
use sim::jobs::{apply, node_status};
use sim::stack::Cloud;
use sim::{Node, bin, eventually};
use std::path::Path;

/// The job once it is over (Completed or Failure).
fn over(cloud: &Cloud, name: &str) -> Value {
    sim::jobs::over(cloud, "imageprepulljob", name, 120)
}

#[test]
fn images_are_pulled_ahead_on_the_nodes_chosen_and_every_failure_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = Registry::start(dir.path());
    let edgecore = bin("edgecore");
    let bins = edgecore.parent().map(Path::to_path_buf).expect("bin dir");
    let _ = bin("kectl");
    let archive = binary_image(&bins, "kectl", "1", dir.path());
    let image = registry.push(&archive, "fleet/kectl:1");
    let missing = format!("{}/fleet/nothing:1", registry.address);

    let cloud = Cloud::start();
    let rt1_dir = tempfile::tempdir().expect("tempdir");
    let rt1 = Containerd::start_with(rt1_dir.path(), Some(&registry.address));
    let rt2_dir = tempfile::tempdir().expect("tempdir");
    let rt2 = Containerd::start_with(rt2_dir.path(), Some(&registry.address));
    let edged = |rt: &Containerd| {
        format!(
            "{}edged: {{runtimeEndpoint: \"unix://{}\", syncPeriodMs: 500}}\n",
            cloud.edge_config(),
            rt.socket.display()
        )
    };
    let _n1 = Node::start_named(&bins, "edge-node-1", "", &edged(&rt1));
    let mut n2 = Node::start_named(&bins, "edge-node-2", "", &edged(&rt2));
    let _n3 = Node::start_named(&bins, "edge-node-3", "", &cloud.edge_config());
    for n in ["edge-node-1", "edge-node-2", "edge-node-3"] {
        eventually(60, &format!("{n} joined"), || {
            cloud.kubectl(&["get", "node", n]).0.then_some(())
        });
    }
    cloud.ok(&[
        "label",
        "node",
        "edge-node-1",
        "edge-node-2",
        "site=plant-a",
    ]);

    // By label, two at once: both pull, and the image is in each node's containerd.
    let (ok, said) = apply(
        &cloud,
        dir.path(),
        &format!(
            "apiVersion: operations.kubeedge.io/v1alpha2\nkind: ImagePrePullJob\nmetadata: {{name: by-label}}\nspec:\n  imagePrePullTemplate:\n    images: [\"{image}\"]\n    labelSelector: {{matchLabels: {{site: plant-a}}}}\n    concurrency: 2\n"
        ),
    );
    assert!(ok, "{said}");
    let j = over(&cloud, "by-label");
    assert_eq!(j["status"]["phase"], "Completed", "{j}");
    assert_eq!(j["status"]["reason"], "2 of 2 nodes succeeded", "{j}");
    for (node, rt) in [("edge-node-1", &rt1), ("edge-node-2", &rt2)] {
        let s = node_status(&j, node);
        assert_eq!(s["phase"], "Successful", "{j}");
        assert_eq!(s["imageStatus"][0]["image"], image.as_str(), "{j}");
        assert_eq!(s["imageStatus"][0]["status"], "True", "{j}");
        assert_eq!(s["actionFlow"][0]["action"], "Pull", "{j}");
        let images = rt.ctr(&["images", "ls", "-q"]);
        assert!(images.lines().any(|l| l == image), "{node}: {images}");
    }
    assert!(
        j["status"]["nodeStatus"].as_array().map(Vec::len) == Some(2),
        "only the labelled nodes: {j}"
    );
    let table = cloud.ok(&["get", "imageprepulljobs"]);
    assert!(
        table.contains("PHASE") && table.contains("by-label") && table.contains("Completed"),
        "{table}"
    );

    // By name, failures tolerated: every node's reason, each image's result.
    let (ok, said) = apply(
        &cloud,
        dir.path(),
        &format!(
            "apiVersion: operations.kubeedge.io/v1alpha2\nkind: ImagePrePullJob\nmetadata: {{name: by-name}}\nspec:\n  imagePrePullTemplate:\n    images: [\"{image}\", \"{missing}\"]\n    nodeNames: [edge-node-1, edge-node-3, ghost]\n    failureTolerate: \"1\"\n    retryTimes: 1\n"
        ),
    );
    assert!(ok, "{said}");
    let j = over(&cloud, "by-name");
    assert_eq!(j["status"]["phase"], "Completed", "{j}");
    // The first failed node's own reason in the job's, which `kubectl get` shows.
    assert!(
        j["status"]["reason"].as_str().is_some_and(|r| r.starts_with(
            "0 of 3 nodes succeeded; 3 failed, within failureTolerate 1. edge-node-1: 1 of 2 images not pulled; "
        ) && r.ends_with(" (and 2 more failed: status.nodeStatus)")),
        "{j}"
    );
    let n1 = node_status(&j, "edge-node-1");
    assert_eq!(n1["phase"], "Failure", "{j}");
    assert_eq!(n1["imageStatus"][0]["status"], "True", "{j}");
    assert_eq!(n1["imageStatus"][1]["status"], "False", "{j}");
    assert_eq!(n1["imageStatus"][1]["image"], missing.as_str(), "{j}");
    let why = n1["imageStatus"][1]["reason"].as_str().unwrap_or_default();
    assert!(why.contains("not found") || why.contains("nothing"), "{j}");
    assert!(
        n1["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("1 of 2 images not pulled; ")),
        "{j}"
    );
    let n3 = node_status(&j, "edge-node-3");
    assert_eq!(n3["phase"], "Failure", "{j}");
    assert!(
        n3["reason"]
            .as_str()
            .is_some_and(|r| r.contains("edged is off")),
        "{j}"
    );
    assert_eq!(node_status(&j, "ghost")["reason"], "no node named ghost");

    // No failure tolerated: the node that does not exist fails first, and nothing starts.
    let (ok, said) = apply(
        &cloud,
        dir.path(),
        &format!(
            "apiVersion: operations.kubeedge.io/v1alpha2\nkind: ImagePrePullJob\nmetadata: {{name: strict}}\nspec:\n  imagePrePullTemplate:\n    images: [\"{image}\"]\n    nodeNames: [ghost, edge-node-1, edge-node-2]\n    failureTolerate: \"0\"\n"
        ),
    );
    assert!(ok, "{said}");
    let j = over(&cloud, "strict");
    assert_eq!(j["status"]["phase"], "Failure", "{j}");
    assert_eq!(
        j["status"]["reason"],
        "1 of 3 nodes failed, more than failureTolerate 0; 2 not started. ghost: no node named ghost",
        "{j}"
    );
    assert_eq!(node_status(&j, "edge-node-2")["phase"], "Pending", "{j}");

    // Registry credentials from a Secret that is not there: said before any node is asked.
    let (ok, said) = apply(
        &cloud,
        dir.path(),
        &format!(
            "apiVersion: operations.kubeedge.io/v1alpha2\nkind: ImagePrePullJob\nmetadata: {{name: no-secret}}\nspec:\n  imagePrePullTemplate:\n    images: [\"{image}\"]\n    nodeNames: [edge-node-1]\n    imageSecrets: default/regcred\n"
        ),
    );
    assert!(ok, "{said}");
    let j = over(&cloud, "no-secret");
    assert_eq!(j["status"]["phase"], "Failure", "{j}");
    assert!(
        j["status"]["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with(
                "spec.imagePrePullTemplate.imageSecrets default/regcred: cannot read the Secret"
            )),
        "{j}"
    );

    // checkItems run on the node first; one it does not know fails the node there.
    let (ok, said) = apply(
        &cloud,
        dir.path(),
        &format!(
            "apiVersion: operations.kubeedge.io/v1alpha2\nkind: ImagePrePullJob\nmetadata: {{name: checked}}\nspec:\n  imagePrePullTemplate:\n    images: [\"{image}\"]\n    nodeNames: [edge-node-1]\n    checkItems: [gpu]\n"
        ),
    );
    assert!(ok, "{said}");
    let j = over(&cloud, "checked");
    let s = node_status(&j, "edge-node-1");
    assert_eq!(s["phase"], "Failure", "{j}");
    assert_eq!(
        s["reason"], "checkItems: check item \"gpu\" is not supported (cpu, mem, disk)",
        "{j}"
    );
    assert_eq!(s["actionFlow"][0]["action"], "Check", "{j}");
    assert_eq!(s["actionFlow"][0]["status"], "False", "{j}");
    assert!(s["imageStatus"].is_null(), "nothing pulled: {j}");

    // A node away: it has until timeoutSeconds to come back.
    n2.kill_edgecore();
    // Once the cloud knows its session is gone (a question sent before would wait it out).
    eventually(30, "edge-node-2 NotReady", || {
        cloud
            .ok(&["get", "node", "edge-node-2"])
            .contains("NotReady")
            .then_some(())
    });
    let (ok, said) = apply(
        &cloud,
        dir.path(),
        &format!(
            "apiVersion: operations.kubeedge.io/v1alpha2\nkind: ImagePrePullJob\nmetadata: {{name: away}}\nspec:\n  imagePrePullTemplate:\n    images: [\"{image}\"]\n    nodeNames: [edge-node-2]\n    timeoutSeconds: 4\n"
        ),
    );
    assert!(ok, "{said}");
    let j = over(&cloud, "away");
    assert_eq!(j["status"]["phase"], "Failure", "{j}");
    assert_eq!(
        node_status(&j, "edge-node-2")["reason"],
        "node edge-node-2 had no session with this cloudcore within timeoutSeconds (4s)",
        "{j}"
    );

    // Bad templates: refused by the schema, or the job ends naming the field.
    let (ok, said) = apply(
        &cloud,
        dir.path(),
        "apiVersion: operations.kubeedge.io/v1alpha2\nkind: ImagePrePullJob\nmetadata: {name: bad-ratio}\nspec:\n  imagePrePullTemplate:\n    images: [a]\n    nodeNames: [edge-node-1]\n    failureTolerate: \"lots\"\n",
    );
    assert!(!ok && said.contains("failureTolerate"), "{said}");
    let (ok, said) = apply(
        &cloud,
        dir.path(),
        "apiVersion: operations.kubeedge.io/v1alpha2\nkind: ImagePrePullJob\nmetadata: {name: nowhere}\nspec:\n  imagePrePullTemplate:\n    images: [a]\n",
    );
    assert!(ok, "{said}");
    let j = over(&cloud, "nowhere");
    assert_eq!(j["status"]["phase"], "Failure", "{j}");
    assert!(
        j["status"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("give nodeNames or labelSelector")),
        "{j}"
    );

    // The fleet page's jobs: each job, then each of its nodes with its reason.
    sim::browser::fleet_view_shows(
        cloud.api,
        &cloud.admin_token(),
        "jobs",
        &[
            (
                r#"tr[data-job="imageprepulljob/by-label"]"#,
                "the job",
                &|t| t.contains("Completed") && t.contains("2 succeeded, 0 failed"),
            ),
            (
                r#"tr[data-job-node="imageprepulljob/by-name/edge-node-1"]"#,
                "a node's part",
                &|t| t.contains("Failure") && t.contains("1 of 2 images pulled"),
            ),
            (
                r#"tr[data-job-node="imageprepulljob/by-name/edge-node-3"]"#,
                "a node without edged",
                &|t| t.contains("edged is off"),
            ),
        ],
        "the fleet's jobs",
    );

    // Who may: not a viewer, not a node.
    cloud.ok(&[
        "create",
        "clusterrolebinding",
        "v",
        "--clusterrole=view",
        "--user=viewer",
    ]);
    let (ok, said) = cloud.kubectl(&["delete", "imageprepulljob", "by-label", "--as=viewer"]);
    assert!(!ok && said.contains("forbidden"), "{said}");
    let (ok, said) = cloud.kubectl(&[
        "create",
        "-f",
        dir.path().join("job.yaml").to_str().expect("path"),
        "--as=system:node:edge-node-1",
        "--as-group=system:nodes",
    ]);
    assert!(!ok && said.contains("forbidden"), "{said}");
}
