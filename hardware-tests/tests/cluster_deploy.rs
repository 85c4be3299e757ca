//! `cloud/deploy/cloudcore.yaml`, the manifests that run cloudcore on an existing cluster:
//! accepted by `kubectl apply --dry-run=server` (every object checked against its schema by
//! the API, nothing stored), applied, and their RBAC shown to be what cloudcore needs: a
//! cloudcore in cluster mode runs as the manifests' ServiceAccount (impersonated through the
//! admin's credentials) against the embedded API standing for the cluster, takes the leader
//! Lease, installs its CRDs, joins an edgecore, makes its Node Ready,
//! sends it a Device and writes its DeviceStatus, and is refused nothing on the way; and the
//! ServiceAccount may not do what cloudcore never does. (The embedded API does not serve
//! ValidatingWebhookConfigurations, so the webhook's registration is off here; its rule is
//! `admission::register`'s get, create, patch.)

use sim::stack::Cloud;
use sim::{Node, Proc, bin, eventually, free_port, workspace_root};
use std::path::Path;
use std::process::Command;

#[test]
fn the_deployment_applies_and_its_rbac_is_what_cloudcore_needs_and_no_more() {
    // The stand-in cluster: an embedded API whose own controllers leave the objects alone.
    let cluster = Cloud::start_with_modules(
        "  deviceController:\n    enable: false\n  edgeController:\n    enable: false\n",
    );
    let manifests = workspace_root().join("cloud/deploy/cloudcore.yaml");
    let text = std::fs::read_to_string(&manifests).expect("manifests");
    let validator = workspace_root().join(".venv/bin/kubernetes-validate");
    if validator.exists() {
        let out = Command::new(&validator)
            .args(["-k", "1.33.0", "--strict", "--quiet"])
            .arg(&manifests)
            .output()
            .expect("kubernetes-validate");
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    } else {
        eprintln!(
            "note: {} is not there (scripts/test installs it): the schema check is skipped",
            validator.display()
        );
    }
    let docs: Vec<&str> = text.split("\n---\n").collect();
    let kind = |d: &str| {
        d.lines()
            .find_map(|l| l.strip_prefix("kind: "))
            .unwrap_or_default()
            .to_string()
    };
    let kinds: Vec<String> = docs.iter().map(|d| kind(d)).collect();
    assert_eq!(
        kinds,
        [
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Role",
            "RoleBinding",
            "Role",
            "RoleBinding",
            "ConfigMap",
            "Deployment",
            "Service"
        ]
    );
    // The image the Deployment names is the one scripts/mapper-image makes of cloudcore, at the
    // workspace's version.
    let images = tempfile::tempdir().expect("dir");
    let made = sim::run(
        Command::new(workspace_root().join("scripts/mapper-image"))
            .arg("cloudcore")
            .env("MAPPER_IMAGE_EXE", bin("cloudcore"))
            .env("MAPPER_IMAGE_OUT", images.path()),
    );
    let archive = made.trim().to_string();
    let version = archive
        .rsplit_once("cloudcore-")
        .and_then(|(_, v)| v.strip_suffix(".tar"))
        .expect("cloudcore-VERSION.tar")
        .to_string();
    assert!(
        text.contains(&format!(
            "image: docker.io/kubeedge-rs/cloudcore:{version}\n"
        )),
        "the Deployment's image is cloudcore:{version}"
    );
    let inspected = Command::new("skopeo")
        .args(["inspect", "--config"])
        .arg(format!("oci-archive:{archive}"))
        .output()
        .expect("skopeo");
    let config: serde_json::Value =
        serde_json::from_slice(&inspected.stdout).expect("the image's config");
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/usr/local/bin/cloudcore"])
    );
    // The kinds the embedded API serves, through its own validation, dry and then for real.
    let served: Vec<&str> = docs
        .iter()
        .copied()
        .filter(|d| {
            matches!(
                kind(d).as_str(),
                "Namespace"
                    | "ClusterRole"
                    | "ClusterRoleBinding"
                    | "Role"
                    | "RoleBinding"
                    | "ConfigMap"
            )
        })
        .collect();
    let served_file = tempfile::NamedTempFile::new().expect("file");
    std::fs::write(served_file.path(), served.join("\n---\n")).expect("write");
    let served_path = served_file.path().to_str().expect("path");
    let (ok, said) = cluster.kubectl(&["apply", "--dry-run=server", "-f", served_path]);
    assert!(ok && said.contains("(server dry run)"), "{said}");
    let (ok, none) = cluster.kubectl(&["get", "clusterrole", "cloudcore"]);
    assert!(!ok, "a dry run stores nothing: {none}");
    cluster.ok(&["apply", "-f", served_path]);
    let config = cluster.ok(&[
        "get",
        "configmap",
        "cloudcore",
        "-n",
        "kubeedge",
        "-o",
        "jsonpath={.data}",
    ]);
    assert!(config.contains("kubeconfig: in-cluster"), "{config}");

    // What the ServiceAccount may not do.
    let sa = "system:serviceaccount:kubeedge:cloudcore";
    for (verb, what, ns) in [
        ("delete", "nodes", ""),
        ("create", "pods", "default"),
        ("delete", "devices.devices.kubeedge.io", "default"),
        ("update", "secrets/other", "kube-system"),
        ("create", "clusterrolebindings", ""),
        // Other components' Leases, webhooks and CRDs.
        ("update", "leases/kube-scheduler", "kube-system"),
        ("update", "leases/kube-controller-manager", "kube-system"),
        ("update", "leases/other", "kubeedge"),
        ("patch", "validatingwebhookconfigurations/other-webhook", ""),
        (
            "patch",
            "customresourcedefinitions/certificates.cert-manager.io",
            "",
        ),
    ] {
        let mut args = vec!["auth", "can-i", verb, what, "--as", sa];
        if !ns.is_empty() {
            args.extend(["-n", ns]);
        }
        let (_, answer) = cluster.kubectl(&args);
        assert!(answer.trim().starts_with("no"), "{verb} {what}: {answer}");
    }

    // cloudcore in cluster mode, as that ServiceAccount.
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = std::fs::read_to_string(cluster.kubeconfig()).expect("kubeconfig");
    assert!(admin.contains("  user:\n"), "{admin}");
    let as_sa = admin.replacen(
        "  user:\n",
        &format!(
            "  user:\n    as: {sa}\n    as-groups: [system:serviceaccounts, system:serviceaccounts:kubeedge]\n"
        ),
        1,
    );
    let kubeconfig = dir.path().join("sa.kubeconfig");
    std::fs::write(&kubeconfig, as_sa).expect("write");
    let (hub, certs) = (free_port(), free_port());
    let config = dir.path().join("cloudcore.yaml");
    std::fs::write(
        &config,
        format!(
            "kubeconfig: {}\ndataDir: data\nmodules:\n  apiserver:\n    enable: false\n  cloudHub:\n    listen: \"127.0.0.1:{hub}\"\n    certListen: \"127.0.0.1:{certs}\"\n    advertiseAddress: [127.0.0.1]\n  admissionWebhook:\n    enable: false\n  metrics:\n    listen: \"\"\n",
            kubeconfig.display()
        ),
    )
    .expect("config");
    let _cloudcore = Proc::spawn(
        &bin("cloudcore"),
        &["--config", config.to_str().expect("path")],
        dir.path(),
        "cloudcore.log",
    );
    let log = dir.path().join("cloudcore.log");
    eventually(60, "the leader Lease", || {
        let (ok, holder) = cluster.kubectl(&[
            "get",
            "lease",
            "cloudcore",
            "-n",
            "kubeedge",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ]);
        (ok && !holder.is_empty()).then_some(())
    });
    let token = Command::new(bin("cloudcore"))
        .args(["gettoken", "--config"])
        .arg(&config)
        .output()
        .expect("gettoken");
    assert!(
        token.status.success(),
        "{}",
        String::from_utf8_lossy(&token.stderr)
    );
    let token = String::from_utf8_lossy(&token.stdout).trim().to_string();
    let bins = bin("edgecore")
        .parent()
        .map(Path::to_path_buf)
        .expect("bin dir");
    let node = Node::start_named(
        &bins,
        "edge-node-1",
        "",
        &format!(
            "cloud:\n  server: wss://127.0.0.1:{hub}\n  certServer: https://127.0.0.1:{certs}\n  token: \"{token}\"\n  heartbeatSeconds: 2\n"
        ),
    );
    eventually(60, "edge-node-1 Ready", || {
        let (ok, s) = cluster.kubectl(&[
            "get",
            "node",
            "edge-node-1",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ]);
        (ok && s == "True").then_some(())
    });
    let oven = workspace_root().join("examples/modbus-tcp.yaml");
    cluster.ok(&["apply", "-f", oven.to_str().expect("path")]);
    eventually(60, "oven-1's DeviceStatus", || {
        cluster
            .kubectl(&["get", "devicestatus", "oven-1"])
            .0
            .then_some(())
    });
    eventually(60, "oven-1 on the gateway", || node.twin("default/oven-1"));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let refused: Vec<&str> = text
        .lines()
        .filter(|l| {
            // 403 as a number of its own, not the digits inside another (`35.583181ms`).
            l.contains("forbidden")
                || l.contains("Forbidden")
                || l.split(|c: char| !c.is_ascii_digit()).any(|n| n == "403")
        })
        .collect();
    assert!(refused.is_empty(), "cloudcore was refused: {refused:#?}");
    drop(node);
}
