//! What the cloud asks of edge nodes on a user's behalf, through cloudhub: a pod's log
//! ([`logs`]), exec and attach ([`exec`]), port-forward ([`portforward`]), SPDY/3.1 for the
//! clients that still speak it ([`spdy`]), a device's history ([`history`]), an alarm
//! acknowledged ([`alarms`]), and `kubectl top`
//! ([`top`]). Each is a subresource of the embedded API; logs, exec, attach and port-forward
//! are served again as the kubelet's endpoints for a real cluster's API server
//! (`modules.cloudStream`, [`kubelet`]). Both are mounted from one table ([`NodeApi`]).
//!
//! The API starts before cloudhub (cloudhub's clients are the API's), so a [`NodeApi`] is made
//! first and given the hub once it runs; until then, or with cloudhub off, every request is
//! answered 503, saying so.

mod alarms;
mod exec;
mod history;
mod kubelet;
mod logs;
mod portforward;
mod spdy;
mod top;

use crate::cloudhub::CloudHub;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::{Arc, OnceLock};

/// The door of every request to nodes: the hub they go through, once it runs.
#[derive(Clone, Default)]
pub(crate) struct NodeApi(Arc<OnceLock<Arc<CloudHub>>>);

impl NodeApi {
    /// cloudhub runs: requests go through it from now on.
    pub(crate) fn attach(&self, hub: Arc<CloudHub>) {
        let _ = self.0.set(hub);
    }

    /// The hub, when it runs (else the answer is [`off`]).
    fn hub(&self) -> Option<Arc<CloudHub>> {
        self.0.get().cloned()
    }

    /// Every subresource, and the kubelet endpoint that serves it again.
    fn table(&self) -> Vec<(Option<kubelet::Kind>, apiserver::Subresource)> {
        use kubelet::Kind;
        vec![
            (None, history::subresource(self.clone())),
            (None, alarms::subresource(self.clone())),
            (Some(Kind::Log), logs::subresource(self.clone())),
            (Some(Kind::Exec), exec::subresource(self.clone(), false)),
            (Some(Kind::Attach), exec::subresource(self.clone(), true)),
            (
                Some(Kind::PortForward),
                portforward::subresource(self.clone()),
            ),
        ]
    }

    /// The embedded API's subresources: `devices/history`, `pods/log`, `pods/exec`,
    /// `pods/attach`, `pods/portforward`.
    pub(crate) fn subresources(&self) -> Vec<apiserver::Subresource> {
        self.table().into_iter().map(|(_, s)| s).collect()
    }

    /// The embedded API's `metrics.k8s.io` resources.
    pub(crate) fn metrics_api(&self) -> Vec<apiserver::External> {
        top::metrics_api(self)
    }

    /// The kubelet's endpoints (`/containerLogs`, `/exec`, `/attach`, `/portForward`) of the
    /// edge nodes, for a real cluster's API server; `client` reads its pods and reviews.
    pub(crate) fn kubelet(&self, client: kube::Client) -> axum::Router {
        let serve = self
            .table()
            .into_iter()
            .filter_map(|(kind, s)| Some((kind?, s.serve)))
            .collect();
        kubelet::router(Arc::new(kubelet::Endpoints { client, serve }))
    }
}

/// A stream to `node` for `open` as `user`, once the node accepted it (within `wait`); or the
/// API's failure that says why not (429 too many, 503 no tunnel, 504 no answer, or the node's
/// own refusal).
async fn open_stream(
    hub: &CloudHub,
    node: &str,
    open: &api::tunnel::Open,
    user: &str,
    wait: std::time::Duration,
) -> Result<crate::cloudhub::tunnel::Stream, Box<Response>> {
    let now = std::time::Duration::ZERO;
    crate::cloudhub::tunnel::open_for_api(&hub.tunnels, node, open, user, now, wait)
        .await
        .map_err(|(code, message)| {
            let code = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
            Box::new(failure(code, message))
        })
}

/// The answer while there is no hub to go through.
fn off() -> Response {
    failure(
        StatusCode::SERVICE_UNAVAILABLE,
        "cloudhub is off (modules.cloudHub.enable): no node can be reached",
    )
}

/// Why a request to a node is refused before the node is asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    #[error("{key}: {value:?} is not true or false")]
    NotBool { key: String, value: String },
    #[error("{key}: {value:?} is not a whole number")]
    NotNumber { key: String, value: String },
    #[error("{key}: must be greater than or equal to {min}, not {n}")]
    Below { key: String, min: i64, n: i64 },
    #[error("container {container} is not valid for pod {pod}")]
    NoSuchContainer { container: String, pod: String },
    #[error("a container name must be specified for pod {pod}, choose one of: [{choices}]")]
    WhichContainer { pod: String, choices: String },
    #[error("you must specify at least one command for the container")]
    NoCommand,
    #[error("you must specify at least one of stdin, stdout, stderr")]
    NoStream,
    #[error("pod {0} is not scheduled to a node yet")]
    NotScheduled(String),
    #[error("{0}: cloudcore serves an edge node's /containerLogs, /exec, /attach and /portForward")]
    NotAnEndpoint(String),
    #[error("{0}: not a path of this endpoint")]
    NotAPath(String),
    #[error("{path}: {value:?} is not a {what}")]
    NotAName {
        path: String,
        value: String,
        what: &'static str,
    },
}

/// A Kubernetes `Status` failure.
pub(crate) fn failure(code: StatusCode, message: impl std::fmt::Display) -> Response {
    let reason = code
        .canonical_reason()
        .unwrap_or("Failure")
        .replace(' ', "");
    (
        code,
        axum::Json(json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message.to_string(), "reason": reason, "code": code.as_u16()})),
    )
        .into_response()
}

/// How a client asked for a stream: a websocket (the protocol chosen, and its key), or the
/// connection upgraded to SPDY/3.1 itself.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    WebSocket(&'static str, String),
    Spdy,
}

/// The transport a request asks for, when it is one served: a websocket offering one of
/// `websocket` (the first of them it offers), or SPDY/3.1 offering `spdy` as its
/// `X-Stream-Protocol-Version`.
pub(crate) fn transport(
    headers: &HeaderMap,
    websocket: &[&'static str],
    spdy: &str,
) -> Option<Transport> {
    let upgrade = header_words(headers, "upgrade");
    if upgrade.iter().any(|u| u.eq_ignore_ascii_case("websocket")) {
        let key = headers.get("sec-websocket-key")?.to_str().ok()?;
        let offered = header_words(headers, "sec-websocket-protocol");
        let protocol = websocket.iter().find(|p| offered.contains(p))?;
        return Some(Transport::WebSocket(protocol, key.to_string()));
    }
    let is_spdy = upgrade.iter().any(|u| u.eq_ignore_ascii_case("SPDY/3.1"));
    let offered = header_words(headers, "x-stream-protocol-version");
    (is_spdy && offered.contains(&spdy)).then_some(Transport::Spdy)
}

/// A header's comma-separated words, over all its lines.
pub(crate) fn header_words<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect()
}

/// The node a pod is scheduled to, or why there is none (naming the pod).
pub(crate) fn scheduled_node(pod: &Value) -> Result<String, Refused> {
    pod["spec"]["nodeName"]
        .as_str()
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .ok_or_else(|| {
            Refused::NotScheduled(pod["metadata"]["name"].as_str().unwrap_or_default().into())
        })
}

/// Request headers of `pairs`, a name given twice holding both values (for the tests of what a
/// stream request asks).
#[cfg(test)]
fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, v.parse().expect("a header value"));
    }
    h
}
