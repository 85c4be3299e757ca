//! The node's `status.nodeInfo`, sent to the cloud at each session's start as KubeEdge's edged
//! patches it (`{ns}/nodepatch/{name}`, a strategic merge patch of the Node's status): what the
//! fleet page's Version column and `kubectl get nodes -o wide` show. With it, the node's address
//! (the one it reaches the cloud from, as `InternalIP`) and its kubelet port (10350, as
//! KubeEdge's edge gives it): where a real cluster's API server sends `kubectl logs` and
//! `exec`, which a DNAT on the API server's host turns to cloudcore's cloudStream.

use serde_json::{Value, json};

fn read(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `PRETTY_NAME` of `/etc/os-release` (`Debian GNU/Linux 12 (bookworm)`).
fn os_image(os_release: &str) -> String {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_default()
}

/// Kubernetes' name of this machine's architecture.
fn architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        other => other,
    }
}

/// This node's system info, as a Node's `status.nodeInfo`. `runtime`: the container runtime
/// edged uses (`containerd`), when it runs pods.
pub(super) fn node_info(runtime: Option<&str>, version: &str) -> Value {
    json!({
        "machineID": read("/etc/machine-id"),
        "systemUUID": read("/sys/class/dmi/id/product_uuid"),
        "bootID": read("/proc/sys/kernel/random/boot_id"),
        "kernelVersion": read("/proc/sys/kernel/osrelease"),
        "osImage": os_image(&read("/etc/os-release")),
        "containerRuntimeVersion": runtime.unwrap_or(""),
        // A version in KubeEdge's shape (Kubernetes' semantic version, the edge's after it).
        "kubeletVersion": format!("{version}-edgecore"),
        "kubeProxyVersion": "",
        "operatingSystem": std::env::consts::OS,
        "architecture": architecture(),
    })
}

/// The node's capacity (what `kubectl top node` gives its percentages of): its CPUs and its
/// memory (`MemTotal`); all of it is allocatable (edgecore reserves nothing).
fn capacity(cpus: usize, meminfo: &str) -> Value {
    let kib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0);
    json!({"cpu": cpus.to_string(), "memory": format!("{kib}Ki"), "pods": "110"})
}

/// The message that registers node `node` with `labels` (KubeEdge's kubelet's `insert` of its
/// Node): the cloud makes the Node or merges the labels into it.
pub(super) fn register(
    node: &str,
    labels: &std::collections::BTreeMap<String, String>,
) -> api::message::Message {
    let body = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "labels": labels}});
    api::message::Message::new(
        "edged",
        "meta",
        "insert",
        format!("default/node/{node}"),
        Value::String(body.to_string()),
    )
}

/// The kubelet port a Node gives (KubeEdge's edge's `ServerPort`).
const KUBELET_PORT: u16 = 10350;

/// The message that patches node `node`'s status with its info and, when known, its address.
pub(super) fn patch(
    node: &str,
    runtime: Option<&str>,
    version: &str,
    ip: Option<std::net::IpAddr>,
) -> api::message::Message {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let capacity = capacity(cpus, &read("/proc/meminfo"));
    let mut patch = json!({"status": {"nodeInfo": node_info(runtime, version), "capacity": capacity,
        "allocatable": capacity,
        "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}}}});
    if let Some(ip) = ip {
        patch["status"]["addresses"] = json!([{"type": "InternalIP", "address": ip.to_string()}]);
    }
    api::message::Message::new(
        "edged",
        "meta",
        "patch",
        format!("default/nodepatch/{node}"),
        Value::String(patch.to_string()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_os_image_is_the_pretty_name() {
        assert_eq!(
            os_image("NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n"),
            "Debian GNU/Linux 12 (bookworm)"
        );
        assert_eq!(os_image(""), "");
        let m = patch("edge-1", None, "v2", Some([192, 0, 2, 7].into()));
        assert_eq!(m.route.resource, "default/nodepatch/edge-1");
        let v: Value = serde_json::from_str(m.content.as_str().expect("text")).expect("JSON");
        assert_eq!(v["status"]["nodeInfo"]["kubeletVersion"], "v2-edgecore");
        assert_eq!(v["status"]["nodeInfo"]["operatingSystem"], "linux");
        assert_eq!(
            v["status"]["addresses"],
            json!([{"type": "InternalIP", "address": "192.0.2.7"}])
        );
        assert_eq!(
            v["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"],
            10350
        );
        assert_eq!(
            capacity(4, "MemTotal:       16384 kB\nMemFree: 1 kB\n"),
            json!({"cpu": "4", "memory": "16384Ki", "pods": "110"})
        );
    }
}
