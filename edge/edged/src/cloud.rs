//! What the cloud sent edged (pods bound to this node, the ConfigMaps and Secrets they name),
//! kept by edgehub in the twin store before it acknowledged them (metamanager's part), and the
//! pod status edged reports back (`{ns}/podpatch/{name}`).

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use tokio::sync::Notify;

/// `(namespace, name)`.
pub type Key = (String, String);

#[derive(Default)]
struct Objects {
    pods: BTreeMap<Key, Pod>,
    config_maps: BTreeMap<Key, Value>,
    secrets: BTreeMap<Key, Value>,
    /// Status to report, by pod: its uid, the status, and a version that grows at each change.
    reports: BTreeMap<Key, (String, Value, u64)>,
    version: u64,
}

/// Shared between edgehub (which fills it) and edged (which runs it). Cheap to clone.
#[derive(Clone, Default)]
pub struct CloudPods {
    inner: Arc<RwLock<Objects>>,
    /// edged syncs at once when what the cloud sent changes.
    pub changed: Arc<Notify>,
    /// edgehub sends status when a report changes.
    pub reported: Arc<Notify>,
}

/// An object from the cloud that edged does not keep.
#[derive(Debug, thiserror::Error)]
pub enum PutError {
    #[error("content is not a Pod: {0}")]
    NotAPod(serde_json::Error),
    #[error("not a pod, configmap or secret: {0}")]
    Kind(String),
}

impl CloudPods {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Objects> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Objects> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores an object the cloud sent (`pod`, `configmap` or `secret`).
    pub fn put(&self, kind: &str, key: Key, obj: Value) -> Result<(), PutError> {
        {
            let mut o = self.write();
            match kind {
                "pod" => {
                    let pod: Pod = serde_json::from_value(obj).map_err(PutError::NotAPod)?;
                    o.pods.insert(key, pod);
                }
                "configmap" => {
                    o.config_maps.insert(key, obj);
                }
                "secret" => {
                    o.secrets.insert(key, obj);
                }
                _ => return Err(PutError::Kind(kind.into())),
            }
        }
        self.changed.notify_one();
        Ok(())
    }

    pub fn remove(&self, kind: &str, key: &Key) {
        {
            let mut o = self.write();
            match kind {
                "pod" => {
                    o.pods.remove(key);
                    o.reports.remove(key);
                }
                "configmap" => {
                    o.config_maps.remove(key);
                }
                _ => {
                    o.secrets.remove(key);
                }
            }
        }
        self.changed.notify_one();
    }

    pub fn pods(&self) -> Vec<Pod> {
        self.read().pods.values().cloned().collect()
    }

    pub fn config_map(&self, ns: &str, name: &str) -> Option<Value> {
        self.read()
            .config_maps
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    pub fn secret(&self, ns: &str, name: &str) -> Option<Value> {
        self.read()
            .secrets
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// A pod's status as edged sees it now; a report only when it changed.
    pub fn report(&self, key: Key, uid: &str, status: Value) {
        let mut o = self.write();
        if !o.pods.contains_key(&key) {
            return;
        }
        if o.reports
            .get(&key)
            .is_some_and(|(u, s, _)| u == uid && *s == status)
        {
            return;
        }
        o.version += 1;
        let v = o.version;
        o.reports.insert(key, (uid.to_string(), status, v));
        drop(o);
        self.reported.notify_one();
    }

    /// Reports newer than `after` (a version edgehub sent up to), oldest first.
    pub fn reports_since(&self, sent: &BTreeMap<Key, u64>) -> Vec<(Key, String, Value, u64)> {
        let mut out: Vec<_> = self
            .read()
            .reports
            .iter()
            .filter(|(k, (_, _, v))| sent.get(*k).is_none_or(|s| s < v))
            .map(|(k, (u, s, v))| (k.clone(), u.clone(), s.clone(), *v))
            .collect();
        out.sort_by_key(|r| r.3);
        out
    }
}

/// A pod's status as a Kubernetes `PodStatus`, from edged's view of it.
pub fn pod_status(view: &super::PodView, host_ip: Option<&str>, host_network: bool) -> Value {
    let time = |nanos: Option<i64>| -> Value {
        nanos
            .and_then(|n| api::rfc3339::of_unix_nanos(i128::from(n)))
            .map_or(Value::Null, Value::String)
    };
    let mut ready = !view.containers.is_empty();
    let statuses: Vec<Value> = view
        .containers
        .iter()
        .map(|c| {
            ready &= c.ready;
            let state = match c.state.as_str() {
                "running" => json!({"running": {"startedAt": time(c.since)}}),
                "terminated" => json!({"terminated": {"exitCode": c.exit_code.unwrap_or(0),
                    "reason": c.reason, "finishedAt": time(c.since)}}),
                _ => json!({"waiting": {"reason": c.reason, "message": c.message}}),
            };
            let mut s = json!({"name": c.name, "image": c.image, "imageID": "",
                "ready": c.ready, "started": c.state == "running",
                "restartCount": c.restart_count, "state": state});
            if !c.container_id.is_empty() {
                s["containerID"] = json!(format!("containerd://{}", c.container_id));
            }
            if let Some(code) = c.last_exit_code {
                s["lastState"] = json!({"terminated": {"exitCode": code,
                    "reason": if code == 0 { "Completed" } else { "Error" }}});
            }
            s
        })
        .collect();
    let cond = |t: &str, ok: bool| json!({"type": t, "status": if ok { "True" } else { "False" }});
    let mut status = json!({
        "phase": view.phase,
        "conditions": [
            cond("PodScheduled", true),
            cond("Initialized", true),
            cond("ContainersReady", ready),
            cond("Ready", ready),
        ],
        "containerStatuses": statuses,
        "qosClass": "BestEffort",
    });
    if !view.reason.is_empty() {
        status["reason"] = json!(view.reason);
        status["message"] = json!(view.message);
    }
    if let Some(ip) = host_ip {
        status["hostIP"] = json!(ip);
    }
    let pod_ip = if host_network {
        host_ip
    } else {
        Some(view.pod_ip.as_str()).filter(|ip| !ip.is_empty())
    };
    if let Some(ip) = pod_ip {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{"ip": ip}]);
    }
    status
}

/// The message that reports `status` of pod `key`: KubeEdge's edged status patch.
pub fn podpatch(key: &Key, uid: &str, status: &Value) -> api::message::Message {
    let patch = json!({"metadata": {"uid": uid}, "status": status});
    api::message::Message::new(
        "edged",
        "meta",
        "patch",
        format!("{}/podpatch/{}", key.0, key.1),
        Value::String(patch.to_string()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ContainerView, PodView};

    #[test]
    fn reports_only_when_the_status_changes_and_as_a_kubernetes_pod_status() {
        let cloud = CloudPods::default();
        let key = ("default".to_string(), "m".to_string());
        cloud
            .put(
                "pod",
                key.clone(),
                json!({"metadata": {"name": "m", "namespace": "default", "uid": "u1"},
                "spec": {"containers": [{"name": "c", "image": "i"}]}}),
            )
            .expect("a pod");
        let mut view = PodView::new("default", "m", "u1", "cloud");
        let mut c = ContainerView::new("c", "i");
        c.running(1_700_000_000_000_000_000);
        c.container_id = "abc".into();
        view.containers.push(c);
        view.finish("Always");
        let st = pod_status(&view, Some("10.0.0.5"), true);
        assert_eq!(st["phase"], "Running");
        assert_eq!(st["podIP"], "10.0.0.5");
        // On the runtime's network: the sandbox's own address, and none until it is known.
        let mut cni = view.clone();
        let st2 = pod_status(&cni, Some("10.0.0.5"), false);
        assert_eq!(
            (&st2["hostIP"], &st2["podIP"]),
            (&json!("10.0.0.5"), &Value::Null)
        );
        cni.pod_ip = "10.213.7.2".into();
        let st2 = pod_status(&cni, Some("10.0.0.5"), false);
        assert_eq!(st2["podIP"], "10.213.7.2");
        assert_eq!(st2["podIPs"], json!([{"ip": "10.213.7.2"}]));
        assert_eq!(
            st["conditions"][3],
            json!({"type": "Ready", "status": "True"})
        );
        let cs = &st["containerStatuses"][0];
        assert_eq!(cs["containerID"], "containerd://abc");
        assert_eq!(cs["state"]["running"]["startedAt"], "2023-11-14T22:13:20Z");

        cloud.report(key.clone(), "u1", st.clone());
        cloud.report(key.clone(), "u1", st.clone());
        let mut sent = BTreeMap::new();
        let r = cloud.reports_since(&sent);
        assert_eq!(r.len(), 1, "the same status twice is one report");
        sent.insert(key.clone(), r[0].3);
        assert!(cloud.reports_since(&sent).is_empty());
        // A pod the cloud did not send (a static pod) is not reported.
        cloud.report(("default".into(), "static".into()), "u2", st.clone());
        assert!(cloud.reports_since(&sent).is_empty());

        let m = podpatch(&key, "u1", &st);
        assert_eq!(m.route.resource, "default/podpatch/m");
        assert_eq!(
            (m.route.group.as_str(), m.route.operation.as_str()),
            ("meta", "patch")
        );
        let back: Value =
            serde_json::from_str(m.content.as_str().expect("a string")).expect("json");
        assert_eq!(back["metadata"]["uid"], "u1");
    }
}
