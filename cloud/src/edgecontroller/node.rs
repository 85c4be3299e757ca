//! A node's own Node and Lease, asked for through cloudhub as KubeEdge's edge asks for them (its
//! kubelet registers, reads and patches its Node and renews its Lease through metamanager) and
//! answered as KubeEdge's edgecontroller answers:
//!
//! - `{ns}/node/{name}`, `insert`: the node registers; its Node is made if there is none, its
//!   labels and status merged in; answered `{"Object": node, "Err": null}`.
//! - `{ns}/node/{name}`, `query`: answered with the Node itself.
//! - `{ns}/nodepatch/{name}`, `patch`: a strategic merge patch of the Node's status (the content
//!   is its text); answered `{"Object": node, "Err": ...}`.
//! - `kube-node-lease/lease/{name}`, `insert`, `update`, `query`: the node's Lease; answered
//!   `{"Object": lease, "Err": ...}`, a missing Lease with a NotFound `Err` (the kubelet then
//!   makes it).
//!
//! A node reaches its own Node and Lease only (`{name}` must be the node's).
//!
//! And the Node's Ready condition as cloudhub's sessions set it ([`set_ready`]): a node that
//! connects gets its Node made if it has none, and is Ready. With replicas, its Node names the
//! replica holding its session ([`SESSION_ANNOTATION`]), and when a session ends only the replica
//! the Node names (or any, when it names none) marks it not ready, at the version it read: a node
//! that moved to another replica meanwhile stays Ready.

use super::answer;
use api::bus::Hub;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::sync::Arc;

/// A node request this module answers: `(kind, operation)`.
pub(super) fn handles(kind: &str, op: &str) -> bool {
    matches!(
        (kind, op),
        ("node", "insert" | "query")
            | ("nodepatch", "patch")
            | ("lease", "insert" | "update" | "query")
    )
}

/// Why a node's request about its Node or Lease is refused.
#[derive(Debug, thiserror::Error)]
enum NodeError {
    #[error("node {node} may only reach its own {kind}, not {name:?}")]
    NotOwn {
        node: String,
        kind: &'static str,
        name: String,
    },
    #[error("content is not a JSON {0}")]
    Content(&'static str),
    #[error("{0}")]
    Api(#[from] kube::Error),
}

impl NodeError {
    /// The `Err` of an `ObjectResp`, as Go's `apierrors.StatusError` encodes itself.
    fn status(&self) -> Value {
        let (code, reason) = match self {
            Self::NotOwn { .. } => (403, "Forbidden"),
            Self::Content(_) => (400, "BadRequest"),
            Self::Api(kube::Error::Api(e)) => (e.code, e.reason.as_str()),
            Self::Api(_) => (500, "InternalError"),
        };
        json!({"ErrStatus": {"metadata": {}, "status": "Failure", "message": self.to_string(),
            "reason": reason, "code": code}})
    }
}

fn content(msg: &api::message::Message, what: &'static str) -> Result<Value, NodeError> {
    let v = match &msg.content {
        Value::String(s) => serde_json::from_str(s).map_err(|_| NodeError::Content(what))?,
        v => v.clone(),
    };
    if v.is_object() {
        Ok(v)
    } else {
        Err(NodeError::Content(what))
    }
}

fn typed<T: serde::Serialize>(obj: &T, kind: &str, api_version: &str) -> Value {
    let mut v = serde_json::to_value(obj).unwrap_or(Value::Null);
    if let Some(m) = v.as_object_mut() {
        m.insert("kind".into(), json!(kind));
        m.insert("apiVersion".into(), json!(api_version));
    }
    v
}

/// Answers `msg`, from `node`, about `{ns}/{kind}/{name}`.
pub(super) async fn handle(
    client: &kube::Client,
    hub: &Arc<dyn Hub>,
    node: &str,
    msg: &api::message::Message,
    (ns, kind, name): (&str, &str, &str),
) {
    let op = msg.route.operation.as_str();
    let own = |kind: &'static str| {
        if name == node && (kind != "Lease" || ns == "kube-node-lease") {
            Ok(())
        } else {
            Err(NodeError::NotOwn {
                node: node.to_string(),
                kind,
                name: format!("{ns}/{name}"),
            })
        }
    };
    let result = match (kind, op) {
        ("node", "query") => {
            let got = async {
                own("Node")?;
                Ok::<_, NodeError>(Api::<Node>::all(client.clone()).get(name).await?)
            }
            .await;
            match got {
                Ok(n) => {
                    let mut a = answer(node, msg, "response", typed(&n, "Node", "v1"));
                    a.message.header.resource_version =
                        n.metadata.resource_version.clone().unwrap_or_default();
                    hub.send(a);
                    return;
                }
                Err(e) => Err(e),
            }
        }
        ("node", _) => async {
            own("Node")?;
            register(client, node, content(msg, "Node")?).await
        }
        .await
        .map(|n| typed(&n, "Node", "v1")),
        ("nodepatch", _) => async {
            own("Node")?;
            let patch = content(msg, "strategic merge patch")?;
            let api = Api::<Node>::all(client.clone());
            Ok(api
                .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
                .await?)
        }
        .await
        .map(|n| typed(&n, "Node", "v1")),
        ("lease", _) => async {
            own("Lease")?;
            let api = Api::<Lease>::namespaced(client.clone(), ns);
            Ok(match op {
                "query" => api.get(name).await?,
                op => {
                    let mut lease: Lease = serde_json::from_value(content(msg, "Lease")?)
                        .map_err(|_| NodeError::Content("Lease"))?;
                    lease.metadata.name = Some(name.to_string());
                    lease.metadata.namespace = Some(ns.to_string());
                    if op == "insert" {
                        api.create(&PostParams::default(), &lease).await?
                    } else {
                        api.replace(name, &PostParams::default(), &lease).await?
                    }
                }
            })
        }
        .await
        .map(|l| typed(&l, "Lease", "coordination.k8s.io/v1")),
        _ => return,
    };
    let body = match result {
        Ok(object) => json!({"Object": object, "Err": null}),
        Err(e) => {
            match &e {
                NodeError::Api(kube::Error::Api(r)) if r.code == 404 => {
                    tracing::debug!(%node, %kind, %name, "edgecontroller: not found")
                }
                _ => {
                    tracing::warn!(%node, %kind, %name, %op, error = %e, "edgecontroller: a node's request refused")
                }
            }
            json!({"Object": null, "Err": e.status()})
        }
    };
    hub.send(answer(node, msg, "response", body));
}

/// The node registers (KubeEdge's kubelet creates its Node): made if absent, else its labels and
/// status merged into the one cloudhub made at the first session.
async fn register(client: &kube::Client, node: &str, mut sent: Value) -> Result<Node, NodeError> {
    let api = Api::<Node>::all(client.clone());
    sent["metadata"]["name"] = json!(node);
    let refused = own_labels(&mut sent["metadata"]["labels"]);
    if !refused.is_empty() {
        tracing::warn!(%node, labels = ?refused, "edgecontroller: a node's registration set labels a node may not set on its Node (NodeRestriction); they were left out");
    }
    let status = sent.get("status").cloned();
    let created = match serde_json::from_value::<Node>(sent.clone()) {
        Ok(n) => api.create(&PostParams::default(), &n).await,
        Err(_) => return Err(NodeError::Content("Node")),
    };
    match created {
        Ok(n) => return Ok(n),
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let labels = json!({"metadata": {"labels": sent["metadata"]["labels"]}});
    api.patch(node, &PatchParams::default(), &Patch::Merge(&labels))
        .await?;
    match status {
        Some(s) if s.is_object() => Ok(api
            .patch_status(
                node,
                &PatchParams::default(),
                &Patch::Strategic(&json!({"status": s})),
            )
            .await?),
        _ => Ok(api.get(node).await?),
    }
}

/// The labels of a registration as they are written: those a node may set on its own Node
/// (NodeRestriction, [`api::validate::node::may_set_label`]) and KubeEdge's role labels, which
/// every edge node carries; the others (`node-restriction.kubernetes.io/...`, other
/// `node-role`s) are taken out and returned. cloudcore writes them with its own credentials,
/// so this is the only place they can be refused.
fn own_labels(labels: &mut Value) -> Vec<String> {
    const KUBEEDGE_ROLES: [&str; 2] = [super::EDGE_LABEL, "node-role.kubernetes.io/agent"];
    let mut refused = Vec::new();
    match labels.as_object_mut() {
        Some(m) => m.retain(|k, _| {
            let keep =
                KUBEEDGE_ROLES.contains(&k.as_str()) || api::validate::node::may_set_label(k);
            if !keep {
                refused.push(k.clone());
            }
            keep
        }),
        None => *labels = json!({}),
    }
    labels[super::EDGE_LABEL] = json!("");
    refused
}

/// The annotation of a `Node` naming the replica that holds its session (replicas only).
pub(crate) const SESSION_ANNOTATION: &str = "cloudcore.kubeedge.io/session";

/// The metadata of the Node made for a node that connects (or that leaves before it had one).
fn new_node(node: &str, ready: bool, replica: Option<&str>) -> Value {
    let mut meta = json!({"name": node, "labels": {"node-role.kubernetes.io/edge": "", "kubernetes.io/hostname": node}});
    if let Some(p) = session_annotation(ready, replica) {
        meta["annotations"] = p;
    }
    json!({"apiVersion": "v1", "kind": "Node", "metadata": meta})
}

/// The annotations naming this replica on the Node of a node that connected to it (replicas
/// only; a session that ends names nobody new).
fn session_annotation(ready: bool, replica: Option<&str>) -> Option<Value> {
    match (ready, replica) {
        (true, Some(r)) => Some(json!({ SESSION_ANNOTATION: r })),
        _ => None,
    }
}

/// The status patch of the Node's Ready condition, as KubeEdge's cloudhub words it.
fn ready_patch(ready: bool, now: &Time) -> Value {
    ready_patch_since(ready, now, now)
}

/// The same, the condition true or unknown since `since` (its last transition).
fn ready_patch_since(ready: bool, now: &Time, since: &Time) -> Value {
    let (status, reason, message) = if ready {
        ("True", "EdgeReady", "edge is connected to cloudhub")
    } else {
        (
            "Unknown",
            "NodeStatusUnknown",
            "edge is not connected to cloudhub",
        )
    };
    json!({"status": {"conditions": [{"type": "Ready", "status": status,
        "reason": reason, "message": message, "lastHeartbeatTime": now, "lastTransitionTime": since}]}})
}

/// The heartbeat of a node whose session holds since `since`: its Ready condition's time, one
/// status patch (the Node made and named on this replica at the session's start); a Node
/// deleted meanwhile is made again.
pub(crate) async fn heartbeat(
    client: &kube::Client,
    node: &str,
    since: &Time,
    replica: Option<&str>,
) {
    let api: Api<Node> = Api::all(client.clone());
    let patch = ready_patch_since(true, &Time(k8s_openapi::jiff::Timestamp::now()), since);
    match api
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => set_ready(client, node, true, replica).await,
        Err(e) => {
            tracing::warn!(%node, error = %e, "cloudhub: cannot write the Node's heartbeat")
        }
    }
}

/// Whether `replica`, whose session with the node ended, may mark `current` not ready: only
/// while the Node names it, or names no replica.
fn may_mark_unready(current: &Node, replica: &str) -> bool {
    current
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SESSION_ANNOTATION))
        .is_none_or(|holder| holder == replica)
}

/// Makes the node's `Node` object if it has none, and sets its Ready condition; `replica` is
/// this replica's name when there are replicas.
pub(crate) async fn set_ready(
    client: &kube::Client,
    node: &str,
    ready: bool,
    replica: Option<&str>,
) {
    let api: Api<Node> = Api::all(client.clone());
    if let Ok(obj) = serde_json::from_value::<Node>(new_node(node, ready, replica)) {
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                if let Some(a) = session_annotation(ready, replica) {
                    let p = json!({"metadata": {"annotations": a}});
                    if let Err(e) = api
                        .patch(node, &PatchParams::default(), &Patch::Merge(&p))
                        .await
                    {
                        tracing::warn!(%node, error = %e, "cloudhub: cannot name this replica on the Node");
                    }
                }
            }
            Err(e) => {
                tracing::warn!(%node, error = %e, "cloudhub: cannot create the Node object");
                return;
            }
        }
    }
    let mut patch = ready_patch(ready, &Time(k8s_openapi::jiff::Timestamp::now()));
    for _ in 0..3 {
        if let (false, Some(r)) = (ready, replica) {
            // Not ready only while the Node still names this replica, at the version read.
            let current = match api.get_opt(node).await {
                Ok(Some(n)) => n,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(%node, error = %e, "cloudhub: cannot read the Node");
                    return;
                }
            };
            if !may_mark_unready(&current, r) {
                tracing::debug!(%node, "cloudhub: the node's session is on another replica now; its Node stays as it is");
                return;
            }
            patch["metadata"] = json!({"resourceVersion": current.metadata.resource_version});
        }
        match api
            .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => {
                tracing::warn!(%node, error = %e, "cloudhub: cannot set the Node's Ready condition");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_is_encoded_as_gos_status_error() {
        let e = NodeError::NotOwn {
            node: "a".into(),
            kind: "Node",
            name: "default/b".into(),
        };
        let s = e.status();
        assert_eq!(s["ErrStatus"]["code"], 403);
        assert_eq!(s["ErrStatus"]["reason"], "Forbidden");
        assert!(
            s["ErrStatus"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("only reach its own Node")),
            "{s}"
        );
        assert!(handles("lease", "update") && handles("nodepatch", "patch"));
        assert!(!handles("node", "delete") && !handles("pod", "query"));
    }
}

#[cfg(test)]
mod ready_tests {
    use super::*;

    fn named(replica: Option<&str>) -> Node {
        let mut n: Node =
            serde_json::from_value(new_node("edge-1", true, replica)).expect("a Node");
        n.metadata.resource_version = Some("7".into());
        n
    }

    #[test]
    fn a_node_that_connects_to_a_replica_is_named_on_it_and_alone_names_none() {
        let n = named(Some("cloudcore-a"));
        assert_eq!(
            n.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(SESSION_ANNOTATION)),
            Some(&"cloudcore-a".to_string())
        );
        assert_eq!(
            n.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("node-role.kubernetes.io/edge")),
            Some(&String::new()),
            "labelled an edge node, as KubeEdge's"
        );
        assert_eq!(named(None).metadata.annotations, None);
        assert_eq!(
            session_annotation(false, Some("cloudcore-a")),
            None,
            "leaving names nobody"
        );
    }

    #[test]
    fn only_the_replica_the_node_names_or_any_when_none_marks_it_not_ready() {
        assert!(may_mark_unready(&named(Some("a")), "a"));
        assert!(
            !may_mark_unready(&named(Some("b")), "a"),
            "the node moved to b: a's ended session leaves it Ready"
        );
        assert!(may_mark_unready(&named(None), "a"));
    }

    #[test]
    fn the_ready_condition_is_worded_as_kubeedges() {
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(0).expect("a time"));
        let up = ready_patch(true, &now);
        let c = &up["status"]["conditions"][0];
        assert_eq!(
            (
                c["type"].as_str(),
                c["status"].as_str(),
                c["reason"].as_str()
            ),
            (Some("Ready"), Some("True"), Some("EdgeReady"))
        );
        assert_eq!(c["lastHeartbeatTime"], "1970-01-01T00:00:00Z");
        let down = ready_patch(false, &now);
        let c = &down["status"]["conditions"][0];
        assert_eq!(
            (c["status"].as_str(), c["reason"].as_str()),
            (Some("Unknown"), Some("NodeStatusUnknown"))
        );
    }

    #[test]
    fn a_registration_keeps_the_labels_a_node_may_set_and_kubeedges_roles() {
        let mut labels = json!({"site": "a", "kubernetes.io/arch": "amd64",
            "node-role.kubernetes.io/agent": "", "node-role.kubernetes.io/control-plane": "",
            "node-restriction.kubernetes.io/site": "b"});
        let refused = own_labels(&mut labels);
        assert_eq!(
            refused,
            [
                "node-restriction.kubernetes.io/site",
                "node-role.kubernetes.io/control-plane"
            ]
        );
        assert_eq!(
            labels,
            json!({"site": "a", "kubernetes.io/arch": "amd64", "node-role.kubernetes.io/agent": "",
                "node-role.kubernetes.io/edge": ""})
        );
        let mut none = Value::Null;
        assert!(own_labels(&mut none).is_empty());
        assert_eq!(none, json!({"node-role.kubernetes.io/edge": ""}));
    }
}
