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

use super::answer;
use api::bus::Hub;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
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
    if sent["metadata"]["labels"].is_object() {
        sent["metadata"]["labels"][super::EDGE_LABEL] = json!("");
    } else {
        sent["metadata"]["labels"] = json!({super::EDGE_LABEL: ""});
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
