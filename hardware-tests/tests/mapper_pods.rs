//! Mappers as pods, the whole way: `kubectl apply` of `examples/pods/mapper-modbus-daemonset.yaml`
//! (a DaemonSet and its ConfigMap) on `cloudcore`; the DaemonSet controller makes the edge
//! node's pod; cloudhub takes it and the ConfigMap to `edgecore`; edged pulls the mapper's image
//! from a real registry (`docker-registry`, pushed to with `skopeo`) and runs it on a real
//! containerd; the mapper registers over DMI and reads a pymodbus device; the values reach
//! `DeviceStatus`, and the pod's status reaches `kubectl get pods`.
//!
//! Faults: edgecore kill -9 (the mapper keeps running and is adopted, not restarted), a pod
//! deleted with kubectl (replaced), an image that cannot be pulled and a pod spec edged cannot
//! run (both named in the pod's status, nothing else disturbed).
//!
//! Runs as root (containerd); `.ci/run` installs containerd, runc, umoci, busybox-static,
//! docker-registry and skopeo.

use serde_json::Value;
use sim::containerd::{Containerd, Registry, binary_image};
use sim::stack::{Cloud, oven_manifest, reported};
use sim::{Node, Proc, Proxy, PyModbus, bin, eventually, free_port, write_holdings};
use std::path::Path;

/// `kubectl get pods -o json`'s pods whose name starts with `prefix`.
fn pods(cloud: &Cloud, prefix: &str) -> Vec<Value> {
    let list: Value =
        serde_json::from_str(&cloud.ok(&["get", "pods", "-o", "json"])).unwrap_or(Value::Null);
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            p["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .cloned()
        .collect()
}

/// The one running, ready pod of the DaemonSet: its name and container id.
fn running_mapper(cloud: &Cloud) -> Option<(String, String)> {
    let list = pods(cloud, "mapper-modbus-");
    let [p] = &list[..] else { return None };
    let c = &p["status"]["containerStatuses"][0];
    (p["status"]["phase"] == "Running" && c["ready"] == true).then(|| {
        (
            p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            c["containerID"].as_str().unwrap_or_default().to_string(),
        )
    })
}

/// A container's waiting reason in the pod `name`'s status, as kubectl shows it.
fn waiting_reason(cloud: &Cloud, name: &str) -> Option<String> {
    let p: Value =
        serde_json::from_str(&cloud.kubectl(&["get", "pod", name, "-o", "json"]).1).ok()?;
    p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
        .as_str()
        .map(str::to_string)
}

#[test]
fn a_mapper_daemonset_runs_on_the_edge_node_and_its_values_reach_devicestatus() {
    let rt_dir = tempfile::tempdir().expect("tempdir");
    let registry = Registry::start(rt_dir.path());
    let rt = Containerd::start_with(rt_dir.path(), Some(&registry.address));
    // The sandbox ("pause") image.
    rt.import_busybox();
    let edgecore = bin("edgecore");
    let bins = edgecore.parent().map(Path::to_path_buf).expect("bin dir");
    // `cargo test --workspace` may not have built it yet.
    let _ = bin("mapper-modbus");
    let archive = binary_image(&bins, "mapper-modbus", "test", rt_dir.path());
    let image = registry.push(&archive, "kubeedge-rs/mapper-modbus:test");

    let cloud = Cloud::start();
    let sim_port = free_port();
    let _sim = PyModbus::start(sim_port);
    write_holdings(sim_port, 0, &[215, 40]);
    cloud.ok(&[
        "apply",
        "-f",
        oven_manifest(sim_port).to_str().expect("path"),
    ]);

    let edged = format!(
        "edged: {{runtimeEndpoint: \"unix://{}\", syncPeriodMs: 500, initialBackoffMs: 1000, maxBackoffMs: 4000, hostPathPrefixes: [{:?}]}}\n",
        rt.socket.display(),
        // The node's directory (a temporary one) stands for /etc/kubeedge.
        std::env::temp_dir().display().to_string()
    );
    // The link goes through a proxy that can cut it.
    let link = Proxy::start(cloud.hub);
    let node = Node::start_named(
        &bins,
        "edge-node-1",
        "",
        &format!("{}{edged}", cloud.edge_config_via(link.port)),
    );
    // The example, with this test's paths: the node's directory holds edgecore's DMI socket.
    let dir = node.dir.path().display().to_string();
    let http_port = free_port();
    let example = std::fs::read_to_string(
        sim::workspace_root().join("examples/pods/mapper-modbus-daemonset.yaml"),
    )
    .expect("example")
    .replace("/etc/kubeedge/dmi.sock", &format!("{dir}/dmi.sock"))
    .replace("/etc/kubeedge", &dir)
    .replace("http_port: 7777", &format!("http_port: {http_port}"))
    .replace(
        "image: kubeedge-rs/mapper-modbus:0.1.0",
        &format!("image: {image}"),
    );
    let applied = rt_dir.path().join("daemonset.yaml");
    std::fs::write(&applied, example).expect("write");
    cloud.ok(&["apply", "-f", applied.to_str().expect("path")]);

    // The pod runs on the node, pulled from the registry; kubectl shows it Running and ready.
    let (pod, container) = eventually(120, "the mapper pod Running in kubectl", || {
        running_mapper(&cloud)
    });
    let wide = cloud.ok(&["get", "pods", "-o", "wide"]);
    assert!(
        wide.contains(&pod) && wide.contains("1/1") && wide.contains("edge-node-1"),
        "{wide}"
    );
    let ds = cloud.ok(&["get", "daemonset", "mapper-modbus"]);
    assert!(
        ds.lines()
            .nth(1)
            .is_some_and(|l| l
                .split_whitespace()
                .take(4)
                .eq(["mapper-modbus", "1", "1", "1"])),
        "{ds}"
    );
    // The mapper in the container registered over DMI and reads the device.
    eventually(90, "temperature 21.5 in DeviceStatus", || {
        reported(&cloud.status("oven-1"), "temperature").filter(|v| v.starts_with("21.5"))
    });
    // The mapper's REST API from the cloud: `kubectl port-forward` to its port, through the
    // node's tunnel (the gateway listens on nothing the cloud could reach).
    let forward = cloud.port_forward(&format!("pod/{pod}"), http_port, &[], &[]);
    let (status, body) = eventually(30, "the mapper's REST API through port-forward", || {
        forward.get("/api/v1/device/default/oven-1").ok()
    });
    let body = String::from_utf8_lossy(&body);
    assert!(
        status.contains("200") && body.contains("temperature") && body.contains("21.5"),
        "{status} {body}"
    );
    drop(forward);

    // A pod that asks for the gateway's root, in a namespace without Pod Security labels (the
    // cloud stores it, as kube-apiserver would): the node refuses it, and kubectl shows why.
    cloud.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: root}\nspec:\n  nodeName: edge-node-1\n  hostPID: true\n  volumes: [{name: host, hostPath: {path: /}}]\n  containers: [{name: c, image: \"busybox:1\", securityContext: {privileged: true}, volumeMounts: [{name: host, mountPath: /host}]}]\n",
    );
    let why = eventually(60, "the root pod refused by the node", || {
        let out = cloud.ok(&[
            "get",
            "pod",
            "root",
            "-o",
            "jsonpath={.status.phase} {.status.reason}: {.status.message}",
        ]);
        out.starts_with("Failed InvalidPodSpec").then_some(out)
    });
    assert!(
        why.contains("spec.hostPID: true") && why.contains("does not give pods from the cloud"),
        "{why}"
    );
    cloud.ok(&["delete", "pod", "root", "--wait=false"]);

    // edgecore killed: the mapper keeps running, is adopted (not restarted) and values still
    // flow.
    let mut node = node;
    node.edgecore.signal("-KILL");
    let _ = node.edgecore.child.wait();
    write_holdings(sim_port, 0, &[333]);
    node.edgecore = Proc::spawn(
        &bins.join("edgecore"),
        &["--config", "edgecore.yaml"],
        node.dir.path(),
        "edgecore-2.log",
    );
    eventually(90, "temperature 33.3 in DeviceStatus", || {
        reported(&cloud.status("oven-1"), "temperature").filter(|v| v.starts_with("33.3"))
    });
    let after = eventually(60, "the mapper pod Running again", || {
        running_mapper(&cloud)
    });
    assert_eq!(
        after,
        (pod.clone(), container.clone()),
        "the same pod and container, not restarted"
    );
    let restarts =
        pods(&cloud, "mapper-modbus-")[0]["status"]["containerStatuses"][0]["restartCount"].clone();
    assert_eq!(restarts, 0);

    // The link cut; meanwhile the mapper crashes (killed) and is restarted by edged on its own.
    // Once the link is back, kubectl shows the restart and the exit.
    link.cut();
    eventually(30, "the node NotReady while the link is cut", || {
        cloud
            .ok(&["get", "nodes", "edge-node-1", "--no-headers"])
            .contains("NotReady")
            .then_some(())
    });
    let id = container.trim_start_matches("containerd://").to_string();
    rt.ctr(&["tasks", "kill", "-s", "SIGKILL", &id]);
    eventually(
        60,
        "the mapper restarted on the node while the link is cut",
        || {
            let (_, list) = node.get("/api/v1/pods");
            let c = list["pods"]
                .as_array()?
                .iter()
                .find(|p| p["name"] == pod.as_str())?["containers"][0]
                .clone();
            (c["state"] == "running" && c["restartCount"] == 1).then_some(())
        },
    );
    write_holdings(sim_port, 0, &[377]);
    std::thread::sleep(std::time::Duration::from_secs(3));
    link.restore();
    eventually(60, "the node Ready again", || {
        let node = cloud.ok(&["get", "nodes", "edge-node-1", "--no-headers"]);
        (node.contains("Ready") && !node.contains("NotReady")).then_some(())
    });
    let status = eventually(60, "the restart in kubectl", || {
        let p = pods(&cloud, "mapper-modbus-").pop()?;
        let c = p["status"]["containerStatuses"][0].clone();
        (c["restartCount"] == 1 && c["ready"] == true).then_some(c)
    });
    assert_eq!(
        status["lastState"]["terminated"]["exitCode"], 137,
        "{status}"
    );
    eventually(90, "temperature 37.7 read while the link was cut", || {
        reported(&cloud.status("oven-1"), "temperature").filter(|v| v.starts_with("37.7"))
    });
    let (pod, container) = running_mapper(&cloud).expect("the mapper runs");

    // Deleted with kubectl: the DaemonSet makes another, which runs; the old container goes.
    cloud.ok(&["delete", "pod", &pod]);
    let (new_pod, new_container) = eventually(90, "a new mapper pod Running", || {
        running_mapper(&cloud).filter(|(p, _)| *p != pod)
    });
    assert_ne!(new_container, container);
    let id = container.trim_start_matches("containerd://");
    eventually(60, "the old container removed", || {
        (!rt.containers().iter().any(|c| c == id)).then_some(())
    });
    write_holdings(sim_port, 0, &[444]);
    eventually(90, "temperature 44.4 from the new pod", || {
        reported(&cloud.status("oven-1"), "temperature").filter(|v| v.starts_with("44.4"))
    });

    // A pod whose image is not in the registry: the reason shows, and it is retried.
    let absent = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: absent}}\nspec:\n  nodeName: edge-node-1\n  hostNetwork: true\n  containers:\n  - {{name: c, image: \"{}/kubeedge-rs/none:1\"}}\n",
        registry.address
    );
    // And one edged cannot run: an NFS volume. Its status names it.
    let unsupported = "apiVersion: v1\nkind: Pod\nmetadata: {name: nfs}\nspec:\n  nodeName: edge-node-1\n  hostNetwork: true\n  volumes: [{name: v, nfs: {server: x, path: /}}]\n  containers:\n  - {name: c, image: edged-test/busybox:1, imagePullPolicy: Never, volumeMounts: [{name: v, mountPath: /v}]}\n";
    let f = rt_dir.path().join("bad.yaml");
    std::fs::write(&f, format!("{absent}---\n{unsupported}")).expect("write");
    cloud.ok(&["apply", "-f", f.to_str().expect("path")]);
    let reason = eventually(90, "ErrImagePull or ImagePullBackOff", || {
        waiting_reason(&cloud, "absent").filter(|r| r == "ErrImagePull" || r == "ImagePullBackOff")
    });
    let other = if reason == "ErrImagePull" {
        "ImagePullBackOff"
    } else {
        "ErrImagePull"
    };
    eventually(60, "the pull retried", || {
        waiting_reason(&cloud, "absent").filter(|r| r == other)
    });
    let nfs = eventually(60, "the nfs pod's reason", || {
        waiting_reason(&cloud, "nfs").filter(|r| r == "CreateContainerConfigError")
    });
    assert_eq!(nfs, "CreateContainerConfigError");
    let shown = cloud.ok(&["get", "pods"]);
    assert!(shown.contains("CreateContainerConfigError"), "{shown}");
    // Nothing else disturbed: the mapper pod is the same and values still flow.
    assert_eq!(running_mapper(&cloud).map(|r| r.0), Some(new_pod));
    write_holdings(sim_port, 0, &[555]);
    eventually(90, "temperature 55.5", || {
        reported(&cloud.status("oven-1"), "temperature").filter(|v| v.starts_with("55.5"))
    });

    // The DaemonSet deleted: its pod goes, and so does the container on the node.
    cloud.ok(&["delete", "daemonset", "mapper-modbus"]);
    eventually(60, "the mapper's containers gone", || {
        let gone = pods(&cloud, "mapper-modbus-").is_empty();
        let left = rt.ctr(&["containers", "ls"]);
        (gone && !left.contains("mapper-modbus")).then_some(())
    });
}
