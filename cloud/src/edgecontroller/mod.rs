//! The edge controller for pods: every pod bound to an edge node (`spec.nodeName`, a Node
//! labelled `node-role.kubernetes.io/edge`), and the ConfigMaps and Secrets its volumes and
//! environment name, go to that node as KubeEdge's edgecontroller sends them (resource
//! `node/{node}/{ns}/{pod|configmap|secret}/{name}`, group `resource`, op
//! `insert`/`update`/`delete`, the object as content, its resourceVersion in the header), kept
//! by cloudhub until the node acknowledges them. A change of a pod's status alone sends
//! nothing. Deletions made while cloudcore was down reach the node from its ObjectSync
//! records.
//!
//! Upstream, a node's pod status (`{ns}/podpatch/{name}`, op `patch`, a strategic merge patch of
//! the pod's status, as KubeEdge's edged sends it; or the older `{ns}/podstatus/{name}`, op
//! `update`) is written to the pod's `status` subresource, only for pods bound to that node. A
//! node reporting a pod that no longer exists (or exists under another uid) is told to delete
//! it.
//!
//! A node's own Node and Lease, as KubeEdge's edge registers and renews them: [`node`].

pub(crate) mod node;

pub(crate) use node::{heartbeat, set_ready};

use crate::daemonset::watch;
use api::bus::Hub;
use api::bus::{AckKey, Outbound};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::reflector::Store;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

pub(crate) const EDGE_LABEL: &str = "node-role.kubernetes.io/edge";

/// What a node holds of one object: (kind, namespace, name).
type ObjKey = (&'static str, String, String);

/// An object as it was sent: uid, resourceVersion and a hash of what the node uses of it.
#[derive(Clone, Debug, PartialEq)]
struct Sent {
    uid: String,
    rv: String,
    hash: u64,
}

fn hash(v: &Value) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.to_string().hash(&mut h);
    h.finish()
}

/// What of a pod matters to the node: all but its status and the server's bookkeeping.
fn pod_hash(p: &Value) -> u64 {
    let m = &p["metadata"];
    hash(&json!([
        m["labels"],
        m["annotations"],
        m["deletionTimestamp"],
        p["spec"]
    ]))
}

/// The ConfigMaps and Secrets a pod names (volumes, env, envFrom; projected sources too).
pub(crate) fn references(pod: &Value) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut cms, mut secrets) = (BTreeSet::new(), BTreeSet::new());
    let spec = &pod["spec"];
    let mut add = |v: &Value, secret: bool| {
        let name = v["name"].as_str().or(v["secretName"].as_str());
        if let Some(n) = name {
            if secret {
                secrets.insert(n.to_string());
            } else {
                cms.insert(n.to_string());
            }
        }
    };
    for v in spec["volumes"].as_array().into_iter().flatten() {
        add(&v["configMap"], false);
        add(&v["secret"], true);
        for s in v["projected"]["sources"].as_array().into_iter().flatten() {
            add(&s["configMap"], false);
            add(&s["secret"], true);
        }
    }
    for list in ["containers", "initContainers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            for e in c["env"].as_array().into_iter().flatten() {
                add(&e["valueFrom"]["configMapKeyRef"], false);
                add(&e["valueFrom"]["secretKeyRef"], true);
            }
            for e in c["envFrom"].as_array().into_iter().flatten() {
                add(&e["configMapRef"], false);
                add(&e["secretRef"], true);
            }
        }
    }
    (cms, secrets)
}

/// The object as sent: with its kind, without managedFields.
fn outward(obj: &Value, kind: &str) -> Value {
    let mut o = obj.clone();
    o["apiVersion"] = json!("v1");
    o["kind"] = json!(kind);
    if let Some(m) = o["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    o
}

/// The objects each edge node must hold.
pub(crate) fn desired(
    is_edge: impl Fn(&str) -> bool,
    pods: &[Value],
    config_maps: &impl Objects,
    secrets: &impl Objects,
) -> BTreeMap<String, BTreeMap<ObjKey, Value>> {
    let mut out: BTreeMap<String, BTreeMap<ObjKey, Value>> = BTreeMap::new();
    for p in pods {
        let Some(node) = p["spec"]["nodeName"].as_str() else {
            continue;
        };
        if !is_edge(node) {
            continue;
        }
        let ns = p["metadata"]["namespace"].as_str().unwrap_or("default");
        let Some(name) = p["metadata"]["name"].as_str() else {
            continue;
        };
        let held = out.entry(node.to_string()).or_default();
        held.insert(("pod", ns.into(), name.into()), outward(p, "Pod"));
        let (cms, secs) = references(p);
        for c in cms {
            if let Some(o) = config_maps.object(ns, &c) {
                held.insert(("configmap", ns.into(), c), outward(&o, "ConfigMap"));
            }
        }
        for s in secs {
            if let Some(o) = secrets.object(ns, &s) {
                held.insert(("secret", ns.into(), s), outward(&o, "Secret"));
            }
        }
    }
    out
}

fn sent_of(kind: &str, obj: &Value) -> Sent {
    Sent {
        uid: obj["metadata"]["uid"].as_str().unwrap_or_default().into(),
        rv: obj["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .into(),
        hash: if kind == "pod" {
            pod_hash(obj)
        } else {
            hash(&json!([obj["data"], obj["binaryData"], obj["stringData"]]))
        },
    }
}

fn message(node: &str, (kind, ns, name): &ObjKey, op: &str, content: Value, s: &Sent) -> Outbound {
    let resource = format!("node/{node}/{ns}/{kind}/{name}");
    let message = api::message::Message::new("edgecontroller", "resource", op, resource, content)
        .with_resource_version(s.rv.clone());
    Outbound {
        node: node.to_string(),
        message,
        ack: Some(AckKey {
            kind,
            namespace: ns.clone(),
            name: name.clone(),
            uid: s.uid.clone(),
            resource_version: s.rv.clone(),
        }),
        body: None,
    }
}

/// The messages that bring every node from `sent` to `want`; `sent` becomes `want`.
fn diff(
    want: &BTreeMap<String, BTreeMap<ObjKey, Value>>,
    sent: &mut BTreeMap<String, BTreeMap<ObjKey, Sent>>,
) -> Vec<Outbound> {
    let mut out = Vec::new();
    let nodes: BTreeSet<String> = want.keys().chain(sent.keys()).cloned().collect();
    let empty = BTreeMap::new();
    for node in nodes {
        let w = want.get(&node).unwrap_or(&empty);
        let s = sent.entry(node.clone()).or_default();
        for (k, obj) in w {
            let now = sent_of(k.0, obj);
            match s.get(k) {
                Some(old) if old.uid == now.uid && old.hash == now.hash => {
                    // Same content: nothing to send (a status change, a relabel of nothing).
                    s.insert(k.clone(), now);
                }
                Some(old) if old.uid != now.uid => {
                    // Replaced under the same name: the old one goes first.
                    let gone = json!({"metadata": {"namespace": k.1, "name": k.2, "uid": old.uid,
                        "resourceVersion": old.rv}});
                    let mut del = message(&node, k, "delete", gone, old);
                    // The same object key: the hub would let the insert replace the delete.
                    del.ack = None;
                    out.push(del);
                    out.push(message(&node, k, "insert", obj.clone(), &now));
                    s.insert(k.clone(), now);
                }
                Some(_) => {
                    out.push(message(&node, k, "update", obj.clone(), &now));
                    s.insert(k.clone(), now);
                }
                None => {
                    out.push(message(&node, k, "insert", obj.clone(), &now));
                    s.insert(k.clone(), now);
                }
            }
        }
        let gone: Vec<ObjKey> = s.keys().filter(|k| !w.contains_key(*k)).cloned().collect();
        for k in gone {
            if let Some(old) = s.remove(&k) {
                let api_kind = match k.0 {
                    "pod" => "Pod",
                    "configmap" => "ConfigMap",
                    _ => "Secret",
                };
                let content = json!({"apiVersion": "v1", "kind": api_kind,
                    "metadata": {"namespace": k.1, "name": k.2, "uid": old.uid, "resourceVersion": old.rv}});
                out.push(message(&node, &k, "delete", content, &old));
            }
        }
        if s.is_empty() {
            sent.remove(&node);
        }
    }
    out
}

/// Where [`desired`] finds the ConfigMaps and Secrets pods name, by namespace and name: only
/// those are serialized (a cluster holds many a pod never names, such as the device profiles
/// of every node, rewritten as devices change).
pub(crate) trait Objects {
    fn object(&self, namespace: &str, name: &str) -> Option<Value>;
}

impl Objects for BTreeMap<(String, String), Value> {
    fn object(&self, namespace: &str, name: &str) -> Option<Value> {
        self.get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }
}

impl<K> Objects for Store<K>
where
    K: kube::Resource<DynamicType = ()> + serde::Serialize + Clone + 'static,
{
    fn object(&self, namespace: &str, name: &str) -> Option<Value> {
        let key = kube::runtime::reflector::ObjectRef::new(name).within(namespace);
        self.get(&key)
            .and_then(|o| serde_json::to_value(o.as_ref()).ok())
    }
}

fn values<K>(store: &Store<K>) -> Vec<Value>
where
    K: kube::Resource<DynamicType = ()> + serde::Serialize + Clone + 'static,
{
    store
        .state()
        .iter()
        .filter_map(|o| serde_json::to_value(o.as_ref()).ok())
        .collect()
}

#[cfg(test)]
fn by_key(objs: Vec<Value>) -> BTreeMap<(String, String), Value> {
    objs.into_iter()
        .filter_map(|o| {
            let m = &o["metadata"];
            let k = (
                m["namespace"].as_str()?.to_string(),
                m["name"].as_str()?.to_string(),
            );
            Some((k, o))
        })
        .collect()
}

/// What nodes acknowledged before this start (ObjectSync records of pods, ConfigMaps and
/// Secrets); an error reading them is logged and leaves none (deletions made while cloudcore
/// was down then wait for the node's next report of the pod).
async fn delivered(client: &kube::Client) -> BTreeMap<String, BTreeMap<ObjKey, Sent>> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "reliablesyncs.kubeedge.io",
        "v1alpha1",
        "ObjectSync",
    ));
    let api = Api::<DynamicObject>::all_with(client.clone(), &ar);
    let mut out: BTreeMap<String, BTreeMap<ObjKey, Sent>> = BTreeMap::new();
    match api.list(&Default::default()).await {
        Ok(list) => {
            for o in list.items {
                let v = serde_json::to_value(&o).unwrap_or(Value::Null);
                let kind = match v["spec"]["objectKind"].as_str() {
                    Some("Pod") => "pod",
                    Some("ConfigMap") => "configmap",
                    Some("Secret") => "secret",
                    _ => continue,
                };
                let (Some(name), Some(ns), Some(obj)) = (
                    v["metadata"]["name"].as_str(),
                    v["metadata"]["namespace"].as_str(),
                    v["spec"]["objectName"].as_str(),
                ) else {
                    continue;
                };
                let Some((node, uid)) = name.rsplit_once('.') else {
                    continue;
                };
                out.entry(node.to_string()).or_default().insert(
                    (kind, ns.to_string(), obj.to_string()),
                    Sent {
                        uid: uid.to_string(),
                        rv: v["status"]["objectResourceVersion"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        // Unknown content: an update goes unless the version is the same.
                        hash: 0,
                    },
                );
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "edgecontroller: cannot list ObjectSync records; pods deleted while cloudcore was down are removed from nodes when they report them")
        }
    }
    out
}

/// Starts the controller; returns the input for pod status messages from cloudhub.
pub(crate) fn start(
    client: kube::Client,
    hub: Arc<dyn Hub>,
    stop: CancellationToken,
) -> mpsc::Sender<(String, api::message::Message)> {
    let (tx, rx) = mpsc::channel(1024);
    tokio::spawn(upstream(client.clone(), hub.clone(), rx, stop.clone()));
    tokio::spawn(downstream(client, hub, stop));
    tx
}

async fn downstream(client: kube::Client, hub: Arc<dyn Hub>, stop: CancellationToken) {
    let wake = Arc::new(Notify::new());
    let pods = watch(Api::<Pod>::all(client.clone()), wake.clone(), stop.clone());
    let nodes = watch(Api::<Node>::all(client.clone()), wake.clone(), stop.clone());
    let cms = watch(
        Api::<ConfigMap>::all(client.clone()),
        wake.clone(),
        stop.clone(),
    );
    let secrets = watch(
        Api::<Secret>::all(client.clone()),
        wake.clone(),
        stop.clone(),
    );
    for ok in [
        pods.wait_until_ready().await.is_ok(),
        nodes.wait_until_ready().await.is_ok(),
        cms.wait_until_ready().await.is_ok(),
        secrets.wait_until_ready().await.is_ok(),
    ] {
        if !ok {
            return;
        }
    }
    let mut sent = delivered(&client).await;
    // What a record says was acknowledged at the current version is not sent again.
    let mut first = true;
    loop {
        // Looked up per pod: a wake costs the pods, not every node of the fleet.
        let is_edge = |name: &str| {
            nodes
                .get(&kube::runtime::reflector::ObjectRef::new(name))
                .is_some_and(|n| {
                    n.metadata
                        .labels
                        .as_ref()
                        .is_some_and(|l| l.contains_key(EDGE_LABEL))
                })
        };
        let want = desired(is_edge, &values(&pods), &cms, &secrets);
        if first {
            first = false;
            for (node, held) in &mut sent {
                for (k, s) in held.iter_mut() {
                    if let Some(obj) = want.get(node).and_then(|w| w.get(k)) {
                        let now = sent_of(k.0, obj);
                        if now.uid == s.uid && now.rv == s.rv {
                            s.hash = now.hash;
                        }
                    }
                }
            }
        }
        for out in diff(&want, &mut sent) {
            tracing::debug!(node = %out.node, resource = %out.message.route.resource, op = %out.message.route.operation, "edgecontroller: to the node");
            hub.send(out);
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(30)) => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The answer to a status message: KubeEdge's `ObjectResp` (`{"Object": pod, "Err": ...}`).
fn answer(node: &str, msg: &api::message::Message, op: &str, content: Value) -> Outbound {
    let mut m = api::message::Message::new(
        "edgecontroller",
        "resource",
        op,
        msg.route.resource.clone(),
        content,
    );
    m.header.parent_id = msg.header.id.clone();
    Outbound {
        node: node.to_string(),
        message: m,
        ack: None,
        body: None,
    }
}

/// A pod status message that is refused (the node is answered with this text).
#[derive(Debug, thiserror::Error)]
enum StatusError {
    #[error("content is not JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("content has no Status")]
    NoStatus,
    #[error("the patch has no status")]
    NoPatchStatus,
}

/// The status part of a status message: `(uid if given, strategic merge patch of the pod)`.
fn status_patch(msg: &api::message::Message) -> Result<(Option<String>, Value), StatusError> {
    let content = match &msg.content {
        Value::String(s) => serde_json::from_str(s).map_err(StatusError::NotJson)?,
        v => v.clone(),
    };
    if msg.route.resource.contains("/podstatus/") {
        // `PodStatusRequest{UID, Name, Status}`.
        let uid = content["UID"].as_str().map(str::to_string);
        if !content["Status"].is_object() {
            return Err(StatusError::NoStatus);
        }
        return Ok((uid, json!({"status": content["Status"]})));
    }
    if !content["status"].is_object() {
        return Err(StatusError::NoPatchStatus);
    }
    let uid = content["metadata"]["uid"].as_str().map(str::to_string);
    Ok((uid, json!({"status": content["status"]})))
}

async fn upstream(
    client: kube::Client,
    hub: Arc<dyn Hub>,
    mut rx: mpsc::Receiver<(String, api::message::Message)>,
    stop: CancellationToken,
) {
    loop {
        let (node, msg) = tokio::select! {
            _ = stop.cancelled() => return,
            m = rx.recv() => match m { Some(m) => m, None => return },
        };
        // `node/{node}/{ns}/podpatch/{name}`
        let parts: Vec<&str> = msg.route.resource.splitn(5, '/').collect();
        if let [_, _, ns, kind, name] = parts[..]
            && node::handles(kind, &msg.route.operation)
        {
            node::handle(&client, &hub, &node, &msg, (ns, kind, name)).await;
            continue;
        }
        let [_, _, ns, _, name] = parts[..] else {
            hub.send(answer(
                &node,
                &msg,
                "error",
                json!("resource is not node/{node}/{namespace}/podpatch/{name}"),
            ));
            continue;
        };
        let (uid, patch) = match status_patch(&msg) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(%node, resource = %msg.route.resource, error = %e, "edgecontroller: pod status refused");
                hub.send(answer(&node, &msg, "error", json!(e.to_string())));
                continue;
            }
        };
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let current = match api.get_opt(name).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(%node, pod = %name, error = %e, "edgecontroller: cannot read the pod; the node sends its status again");
                hub.send(answer(&node, &msg, "error", json!(e.to_string())));
                continue;
            }
        };
        let bound = current
            .as_ref()
            .and_then(|p| p.spec.as_ref())
            .and_then(|s| s.node_name.as_deref());
        let same_uid = |p: &Pod| uid.is_none() || p.metadata.uid == uid;
        match &current {
            Some(p) if bound == Some(node.as_str()) && same_uid(p) => {}
            Some(_) if bound != Some(node.as_str()) && current.as_ref().is_some_and(same_uid) => {
                tracing::warn!(%node, pod = %name, "edgecontroller: a node reported a pod bound to another node; refused");
                hub.send(answer(
                    &node,
                    &msg,
                    "error",
                    json!(format!("pod {ns}/{name} is not bound to node {node}")),
                ));
                continue;
            }
            _ => {
                // Gone, or another pod under the same name: the node deletes what it runs.
                tracing::info!(%node, pod = %name, "edgecontroller: a node reported a pod that no longer exists; it is told to delete it");
                hub.send(answer(&node, &msg, "response", json!({"Object": null, "Err": {"ErrStatus": {"code": 404, "reason": "NotFound"}}})));
                let content = json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"namespace": ns, "name": name, "uid": uid.clone().unwrap_or_default()}});
                let mut del = api::message::Message::new(
                    "edgecontroller",
                    "resource",
                    "delete",
                    format!("node/{node}/{ns}/pod/{name}"),
                    content,
                );
                del.header.resource_version = "0".into();
                hub.send(Outbound {
                    node: node.clone(),
                    message: del,
                    ack: None,
                    body: None,
                });
                continue;
            }
        }
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            Ok(p) => hub.send(answer(
                &node,
                &msg,
                "response",
                json!({"Object": serde_json::to_value(&p).unwrap_or(Value::Null), "Err": null}),
            )),
            Err(e) => {
                tracing::warn!(%node, pod = %name, error = %e, "edgecontroller: cannot write pod status");
                hub.send(answer(&node, &msg, "error", json!(e.to_string())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: &str, rv: &str, extra: Value) -> Value {
        let mut p = json!({"metadata": {"namespace": "default", "name": name, "uid": format!("u-{name}"),
            "resourceVersion": rv},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i",
                "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s1", "key": "k"}}}]}],
                "volumes": [{"name": "cfg", "configMap": {"name": "cm1"}}]}});
        if let Some(st) = extra.get("status") {
            p["status"] = st.clone();
        }
        p
    }

    #[test]
    fn pods_and_what_they_name_go_to_their_edge_node_only() {
        let edge: BTreeSet<String> = ["e1".to_string()].into();
        let cm = json!({"metadata": {"namespace": "default", "name": "cm1", "uid": "c1", "resourceVersion": "5"}, "data": {"a": "1"}});
        let sec = json!({"metadata": {"namespace": "default", "name": "s1", "uid": "s1", "resourceVersion": "6"}, "data": {"k": "dg=="}});
        let cms = by_key(vec![cm.clone()]);
        let secs = by_key(vec![sec]);
        let pods = vec![
            pod("p1", "e1", "7", json!({})),
            pod("p2", "cloud-node", "8", json!({})),
        ];
        let want = desired(|n| edge.contains(n), &pods, &cms, &secs);
        let held: Vec<String> = want["e1"]
            .keys()
            .map(|k| format!("{}/{}", k.0, k.2))
            .collect();
        assert_eq!(held, ["configmap/cm1", "pod/p1", "secret/s1"]);
        assert!(!want.contains_key("cloud-node"));

        let mut sent = BTreeMap::new();
        let out = diff(&want, &mut sent);
        let ops: Vec<String> = out
            .iter()
            .map(|o| format!("{} {}", o.message.route.operation, o.message.route.resource))
            .collect();
        assert_eq!(
            ops,
            [
                "insert node/e1/default/configmap/cm1",
                "insert node/e1/default/pod/p1",
                "insert node/e1/default/secret/s1"
            ]
        );
        assert_eq!(out[1].message.header.resource_version, "7");
        assert_eq!(out[1].message.content["kind"], "Pod");

        // Only the status changed: nothing is sent.
        let pods = vec![pod(
            "p1",
            "e1",
            "9",
            json!({"status": {"phase": "Running"}}),
        )];
        assert!(
            diff(
                &desired(|n| edge.contains(n), &pods, &cms, &secs),
                &mut sent
            )
            .is_empty()
        );
        // The ConfigMap's data changed: an update; the pod deleted: deletes for all three.
        let mut cm2 = cm.clone();
        cm2["data"]["a"] = json!("2");
        cm2["metadata"]["resourceVersion"] = json!("10");
        let out = diff(
            &desired(|n| edge.contains(n), &pods, &by_key(vec![cm2]), &secs),
            &mut sent,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].message.route.operation, "update");
        let out = diff(&desired(|n| edge.contains(n), &[], &cms, &secs), &mut sent);
        let ops: Vec<&str> = out
            .iter()
            .map(|o| o.message.route.operation.as_str())
            .collect();
        assert_eq!(ops, ["delete", "delete", "delete"]);
        assert_eq!(out[1].message.content["metadata"]["uid"], "u-p1");
        assert!(sent.is_empty());
    }

    #[test]
    fn status_messages_in_both_shapes() {
        let mut m = api::message::Message::new(
            "edged",
            "meta",
            "patch",
            "node/e1/default/podpatch/p1",
            json!("{\"metadata\":{\"uid\":\"u1\"},\"status\":{\"phase\":\"Running\"}}"),
        );
        let (uid, patch) = status_patch(&m).expect("a patch");
        assert_eq!(uid.as_deref(), Some("u1"));
        assert_eq!(patch, json!({"status": {"phase": "Running"}}));
        m.route.resource = "node/e1/default/podstatus/p1".into();
        m.content = json!({"UID": "u2", "Name": "p1", "Status": {"phase": "Failed"}});
        let (uid, patch) = status_patch(&m).expect("a status");
        assert_eq!(uid.as_deref(), Some("u2"));
        assert_eq!(patch["status"]["phase"], "Failed");
        m.content = json!("not json");
        assert!(matches!(status_patch(&m), Err(StatusError::NotJson(_))));
    }
}
