//! What `kubectl top` reads (`crate::nodeapi`'s metrics API: `metrics.k8s.io/v1beta1`
//! `NodeMetrics` and `PodMetrics`, as metrics-server serves them on a cluster), from what each
//! node reports over its session
//! (`node/{node}/metrics`, every `cloud.metricsSeconds`: its own CPU and memory, and each of its
//! containers'). The latest report of each node is kept in memory, on the replica the node is
//! connected to; one older than three of its windows is not shown (the node is away or stopped
//! reporting).

use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The newest report of each node.
#[derive(Default)]
pub(crate) struct Usage {
    latest: Mutex<HashMap<String, (Instant, Value)>>,
}

/// A CPU quantity as metrics-server writes it: nanocores.
fn cpu(nanocores: &Value) -> String {
    format!("{}n", nanocores.as_u64().unwrap_or(0))
}

/// A memory quantity as metrics-server writes it: KiB.
fn memory(bytes: &Value) -> String {
    format!("{}Ki", bytes.as_u64().unwrap_or(0) / 1024)
}

impl Usage {
    /// A node's report (its content as the edge sent it).
    pub(crate) fn set(&self, node: &str, report: Value) {
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node.to_string(), (Instant::now(), report));
    }

    /// The fresh reports, by node name.
    fn fresh(&self) -> Vec<(String, Value)> {
        let map = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(String, Value)> = map
            .iter()
            .filter(|(_, (at, r))| {
                let window = r["window"].as_u64().unwrap_or(15).max(1);
                at.elapsed() < Duration::from_secs(3 * window)
            })
            .map(|(n, (_, r))| (n.clone(), r.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// `NodeMetrics` of the nodes with a fresh report (or only `name`).
    pub(crate) fn nodes(&self, name: Option<&str>) -> Vec<Value> {
        self.fresh()
            .into_iter()
            .filter(|(n, _)| name.is_none_or(|x| x == n))
            .filter(|(_, r)| r["node"].is_object())
            .map(|(n, r)| {
                json!({"kind": "NodeMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
                    "metadata": {"name": n, "creationTimestamp": r["timestamp"]},
                    "timestamp": r["timestamp"],
                    "window": format!("{}s", r["window"].as_u64().unwrap_or(15)),
                    "usage": {"cpu": cpu(&r["node"]["cpu"]), "memory": memory(&r["node"]["memory"])}})
            })
            .collect()
    }

    /// `PodMetrics` of the pods in `ns` (all namespaces when empty), or only `name`: only
    /// those a node reports for a pod that `node_of` says is bound to it (a node's report of
    /// another node's pod, or of a pod that does not exist, is not shown).
    pub(crate) fn pods(
        &self,
        ns: &str,
        name: Option<&str>,
        node_of: impl Fn(&str, &str) -> Option<String>,
    ) -> Vec<Value> {
        let mut out = Vec::new();
        for (node, r) in self.fresh() {
            for p in r["pods"].as_array().into_iter().flatten() {
                let (pns, pname) = (
                    p["namespace"].as_str().unwrap_or_default(),
                    p["name"].as_str().unwrap_or_default(),
                );
                if (!ns.is_empty() && pns != ns) || name.is_some_and(|x| x != pname) {
                    continue;
                }
                if node_of(pns, pname).as_deref() != Some(node.as_str()) {
                    continue;
                }
                let containers: Vec<Value> = p["containers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        json!({"name": c["name"],
                            "usage": {"cpu": cpu(&c["cpu"]), "memory": memory(&c["memory"])}})
                    })
                    .collect();
                out.push(json!({"kind": "PodMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
                    "metadata": {"name": pname, "namespace": pns, "creationTimestamp": r["timestamp"]},
                    "timestamp": r["timestamp"],
                    "window": format!("{}s", r["window"].as_u64().unwrap_or(15)),
                    "containers": containers}));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_become_node_and_pod_metrics_as_metrics_server_writes_them() {
        let u = Usage::default();
        u.set(
            "edge-1",
            json!({"timestamp": "2026-11-28T00:00:00Z", "window": 15,
                "node": {"cpu": 250_000_000u64, "memory": 2_097_152u64},
                "pods": [{"namespace": "default", "name": "m", "containers": [{"name": "c", "cpu": 1_000_000u64, "memory": 4096u64}]},
                         {"namespace": "other", "name": "x", "containers": []}]}),
        );
        let nodes = u.nodes(None);
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0]["usage"]["cpu"], "250000000n");
        assert_eq!(nodes[0]["usage"]["memory"], "2048Ki");
        assert_eq!(nodes[0]["window"], "15s");
        assert!(u.nodes(Some("edge-2")).is_empty());
        let on_edge_1 = |_: &str, _: &str| Some("edge-1".to_string());
        let pods = u.pods("default", None, on_edge_1);
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0]["containers"][0]["usage"]["memory"], "4Ki");
        assert_eq!(u.pods("", None, on_edge_1).len(), 2, "every namespace");
        assert!(u.pods("default", Some("nope"), on_edge_1).is_empty());
        // A node's figures for another node's pod, or for a pod that does not exist: not shown.
        let m_elsewhere = |_: &str, name: &str| (name == "m").then(|| "edge-2".to_string());
        assert!(u.pods("", None, m_elsewhere).is_empty());
        let only_x = |_: &str, name: &str| (name == "x").then(|| "edge-1".to_string());
        let shown = u.pods("", None, only_x);
        assert_eq!(shown.len(), 1);
        assert_eq!(shown[0]["metadata"]["name"], "x");
    }
}
