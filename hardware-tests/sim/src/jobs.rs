//! Fleet jobs (`operations.kubeedge.io/v1alpha2`) through the real `kubectl`: applied, read,
//! waited for, and their nodes' parts.

use crate::eventually;
use crate::stack::Cloud;
use serde_json::Value;
use std::path::Path;

/// `kubectl get {kind} {name} -o json`.
pub fn get(cloud: &Cloud, kind: &str, name: &str) -> Value {
    serde_json::from_str(&cloud.ok(&["get", kind, name, "-o", "json"])).expect("json")
}

/// The job once it is over (`Completed` or `Failure`), within `secs`.
pub fn over(cloud: &Cloud, kind: &str, name: &str, secs: u64) -> Value {
    eventually(secs, &format!("{kind} {name} over"), || {
        let j = get(cloud, kind, name);
        matches!(j["status"]["phase"].as_str(), Some("Completed" | "Failure")).then_some(j)
    })
}

/// The job's `nodeStatus` item of `node`.
pub fn node_status<'a>(j: &'a Value, node: &str) -> &'a Value {
    j["status"]["nodeStatus"]
        .as_array()
        .and_then(|a| a.iter().find(|n| n["nodeName"] == node))
        .unwrap_or_else(|| panic!("no nodeStatus of {node}: {j}"))
}

/// A node's `actionFlow` as (action, status) pairs.
pub fn actions(s: &Value) -> Vec<(String, String)> {
    s["actionFlow"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            (
                a["action"].as_str().unwrap_or_default().to_string(),
                a["status"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// `kubectl apply` of `yaml` (written in `dir`): whether it was taken, and what kubectl said.
pub fn apply(cloud: &Cloud, dir: &Path, yaml: &str) -> (bool, String) {
    let f = dir.join("job.yaml");
    std::fs::write(&f, yaml).expect("write");
    cloud.kubectl(&["apply", "-f", f.to_str().expect("path")])
}
