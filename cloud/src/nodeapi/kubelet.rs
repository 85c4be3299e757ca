//! cloudstream: the kubelet's streaming endpoints of edge nodes, for a real cluster's API
//! server. kube-apiserver serves `kubectl logs/exec/attach/port-forward` of a pod by calling
//! the pod's node at its kubelet port (`status.daemonEndpoints.kubeletEndpoint`, 10350 for
//! edge nodes, as KubeEdge's); a DNAT on the API server's hosts sends those connections here
//! (docs/real-cluster.md). Served, as the kubelet serves them:
//!
//! - `GET /containerLogs/{namespace}/{pod}/{container}?follow=&tailLines=&...`
//! - `GET|POST /exec/{namespace}/{pod}[/{uid}]/{container}?command=&input=&output=&error=&tty=`
//! - `GET|POST /attach/{namespace}/{pod}[/{uid}]/{container}?input=&output=&error=&tty=`
//! - `GET|POST /portForward/{namespace}/{pod}[/{uid}]`
//!
//! Each through the same code as the embedded API's `pods/log`, `pods/exec`, `pods/attach`
//! and `pods/portforward` (the node's streaming tunnel). Who may: a client certificate signed
//! by `clientCaFile` (refused in the TLS handshake otherwise), and then, as the kubelet's
//! webhook authorization asks, a SubjectAccessReview of the cluster for its user and groups:
//! `{verb by method} nodes/proxy` of the pod's node (kube-apiserver's kubelet client has it;
//! a node or a user does not).

use super::{Refused, failure};
use apiserver::{ServeSubresource, SubresourceRequest, User};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Pod;
use std::collections::HashMap;
use std::sync::Arc;

/// The kubelet endpoint a request names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Log,
    Exec,
    Attach,
    PortForward,
}

/// A request's path, read once: what it asks of which pod.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub kind: Kind,
    pub namespace: String,
    pub pod: String,
    pub uid: Option<String>,
    pub container: Option<String>,
}

/// A path segment that can be an object's name: not empty, no `.`/`..`, nothing encoded.
fn name(s: &str) -> Option<String> {
    let ok = !s.is_empty()
        && s != "."
        && s != ".."
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    ok.then(|| s.to_string())
}

/// The endpoint and pod a path names, or why it names none.
pub(crate) fn target(path: &str) -> Result<Target, Refused> {
    let parts: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
    let (kind, rest) = match parts.split_first() {
        Some((&"containerLogs", rest)) => (Kind::Log, rest),
        Some((&"exec", rest)) => (Kind::Exec, rest),
        Some((&"attach", rest)) => (Kind::Attach, rest),
        Some((&"portForward", rest)) => (Kind::PortForward, rest),
        _ => return Err(Refused::NotAnEndpoint(path.to_string())),
    };
    let (uid, container, ns_pod) = match (kind, rest) {
        (Kind::Log, [ns, pod, c]) => (None, Some(*c), [*ns, *pod]),
        (Kind::Exec | Kind::Attach, [ns, pod, c]) => (None, Some(*c), [*ns, *pod]),
        (Kind::Exec | Kind::Attach, [ns, pod, uid, c]) => (Some(*uid), Some(*c), [*ns, *pod]),
        (Kind::PortForward, [ns, pod]) => (None, None, [*ns, *pod]),
        (Kind::PortForward, [ns, pod, uid]) => (Some(*uid), None, [*ns, *pod]),
        _ => return Err(Refused::NotAPath(path.to_string())),
    };
    let bad = |what: &'static str, v: &str| Refused::NotAName {
        path: path.to_string(),
        value: v.to_string(),
        what,
    };
    Ok(Target {
        kind,
        namespace: name(ns_pod[0]).ok_or_else(|| bad("namespace", ns_pod[0]))?,
        pod: name(ns_pod[1]).ok_or_else(|| bad("pod name", ns_pod[1]))?,
        uid: uid
            .map(|u| name(u).ok_or_else(|| bad("uid", u)))
            .transpose()?,
        container: container
            .map(|c| name(c).ok_or_else(|| bad("container name", c)))
            .transpose()?,
    })
}

/// The kubelet's query in the API's words (`pods/exec` and `pods/attach`: `input`, `output`,
/// `error` are `stdin`, `stdout`, `stderr`), with the path's container; a container in the
/// query is not taken (the path names it).
pub(crate) fn api_query(kind: Kind, raw: &str, container: Option<&str>) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = form_urlencoded::parse(raw.as_bytes())
        .filter(|(k, _)| k != "container")
        .map(|(k, v)| {
            let k = match (kind, k.as_ref()) {
                (Kind::Exec | Kind::Attach, "input") => "stdin".to_string(),
                (Kind::Exec | Kind::Attach, "output") => "stdout".to_string(),
                (Kind::Exec | Kind::Attach, "error") => "stderr".to_string(),
                _ => k.into_owned(),
            };
            (k, v.into_owned())
        })
        .collect();
    if let Some(c) = container {
        pairs.push(("container".into(), c.to_string()));
    }
    pairs
}

/// The verb the kubelet authorizes a method as.
fn verb(method: &Method) -> Option<&'static str> {
    Some(match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => return None,
    })
}

/// What the endpoints need: the cluster (pods, reviews) and the code behind each endpoint.
pub(crate) struct Endpoints {
    pub client: kube::Client,
    pub serve: HashMap<Kind, ServeSubresource>,
}

/// The router of the endpoints (served over TLS with client certificates by
/// [`apiserver::serve`], which puts the certificate's user on each request).
pub(crate) fn router(endpoints: Arc<Endpoints>) -> axum::Router {
    axum::Router::new().fallback(handle).with_state(endpoints)
}

/// Whether the cluster lets `user` do `verb` on `nodes/proxy` of `node`.
async fn allowed(client: &kube::Client, user: &User, verb: &str, node: &str) -> kube::Result<bool> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            groups: Some(user.groups.clone()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_string()),
                resource: Some("nodes".into()),
                subresource: Some("proxy".into()),
                name: Some(node.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = kube::Api::<SubjectAccessReview>::all(client.clone())
        .create(&kube::api::PostParams::default(), &review)
        .await?;
    Ok(answer
        .status
        .is_some_and(|s| s.allowed && s.denied != Some(true)))
}

async fn handle(State(endpoints): State<Arc<Endpoints>>, mut request: Request) -> Response {
    let Some(user) = request
        .extensions()
        .get::<apiserver::Identity>()
        .and_then(|i| i.0.clone())
    else {
        return failure(StatusCode::UNAUTHORIZED, "a client certificate is needed");
    };
    // A node's identity opens nothing here, whatever the cluster's authorization says (a
    // fleet CA given as clientCaFile signs node certificates): `nodes/proxy` is the API
    // server's, never a node's.
    if user.in_group("system:nodes") || user.name.starts_with("system:node:") {
        tracing::info!(user = %user.name, path = %request.uri().path(), "cloudstream: a node's certificate refused");
        return failure(
            StatusCode::FORBIDDEN,
            format!(
                "Forbidden (user={}): a node's certificate opens no stream (nodes/proxy is never a node's)",
                user.name
            ),
        );
    }
    let target = match target(request.uri().path()) {
        Ok(t) => t,
        Err(m) => return failure(StatusCode::NOT_FOUND, m),
    };
    let method = request.method().clone();
    let methods: &[Method] = match target.kind {
        Kind::Log => &[Method::GET, Method::HEAD],
        _ => &[Method::GET, Method::POST],
    };
    let Some(verb) = verb(&method).filter(|_| methods.contains(&method)) else {
        return failure(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not served here"),
        );
    };
    let pods = kube::Api::<Pod>::namespaced(endpoints.client.clone(), &target.namespace);
    let pod = match pods.get_opt(&target.pod).await {
        Ok(p) => p,
        Err(e) => {
            return failure(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot read pod {}/{}: {e}", target.namespace, target.pod),
            );
        }
    };
    let node = pod
        .as_ref()
        .and_then(|p| p.spec.as_ref()?.node_name.clone())
        .unwrap_or_default();
    // Asked whatever the pod: who may not learns nothing of which pods there are.
    match allowed(&endpoints.client, &user, verb, &node).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::info!(user = %user.name, %verb, %node, path = %request.uri().path(), "cloudstream: refused by the cluster's authorization");
            return failure(
                StatusCode::FORBIDDEN,
                format!(
                    "Forbidden (user={}, verb={verb}, resource=nodes, subresource=proxy)",
                    user.name
                ),
            );
        }
        Err(e) => {
            return failure(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot ask the cluster whether {} may: {e}", user.name),
            );
        }
    }
    let Some(pod) = pod else {
        return failure(
            StatusCode::NOT_FOUND,
            format!("pod {}/{} not found", target.namespace, target.pod),
        );
    };
    if let Some(uid) = &target.uid
        && pod.metadata.uid.as_deref() != Some(uid.as_str())
    {
        return failure(
            StatusCode::NOT_FOUND,
            format!(
                "pod {}/{} with uid {uid} not found (it was replaced)",
                target.namespace, target.pod
            ),
        );
    }
    let pod = match serde_json::to_value(&pod) {
        Ok(v) => v,
        Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let pairs = api_query(
        target.kind,
        request.uri().query().unwrap_or_default(),
        target.container.as_deref(),
    );
    let raw_query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(&pairs)
        .finish();
    let upgrade = request
        .headers()
        .contains_key(axum::http::header::UPGRADE)
        .then(|| hyper::upgrade::on(&mut request));
    let sub = SubresourceRequest {
        user: user.name.clone(),
        method,
        query: pairs.into_iter().collect(),
        raw_query,
        headers: request.headers().clone(),
        upgrade,
    };
    match endpoints.serve.get(&target.kind) {
        Some(serve) => serve(pod, sub).await,
        None => failure(StatusCode::NOT_FOUND, "not served"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_kubelets_paths_name_their_pod_and_nothing_else_passes() {
        let t = target("/exec/default/web/main").expect("exec");
        assert_eq!(
            t,
            Target {
                kind: Kind::Exec,
                namespace: "default".into(),
                pod: "web".into(),
                uid: None,
                container: Some("main".into()),
            }
        );
        let t = target("/attach/ns/web/0b6c-11/main").expect("with a uid");
        assert_eq!((t.kind, t.uid.as_deref()), (Kind::Attach, Some("0b6c-11")));
        let t = target("/portForward/ns/web").expect("port-forward");
        assert_eq!((t.kind, t.container), (Kind::PortForward, None));
        assert_eq!(
            target("/containerLogs/ns/web/main").expect("logs").kind,
            Kind::Log
        );
        for bad in [
            "/",
            "/pods",
            "/run/ns/web/main",
            "/exec/ns/web",
            "/exec/ns/web/a/b/c",
            "/containerLogs/ns/web",
            "/exec/../web/main",
            "/exec/ns//main",
            "/exec/ns/web%2fx/main",
            "/portForward/ns/web/uid/extra",
            "/stats/summary",
        ] {
            assert!(target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_kubelets_query_is_put_in_the_apis_words() {
        let q = api_query(
            Kind::Exec,
            "command=sh&command=-c&command=echo+hi&input=1&output=1&error=1&tty=0&container=other",
            Some("main"),
        );
        assert_eq!(
            q,
            [
                ("command", "sh"),
                ("command", "-c"),
                ("command", "echo hi"),
                ("stdin", "1"),
                ("stdout", "1"),
                ("stderr", "1"),
                ("tty", "0"),
                ("container", "main"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        // A log's `error` is nothing of the kind; its options are the API's already.
        let q = api_query(Kind::Log, "follow=true&tailLines=3&error=1", Some("main"));
        assert_eq!(q.len(), 4);
        assert_eq!(q[2], ("error".into(), "1".into()));
        assert!(api_query(Kind::PortForward, "", None).is_empty());
    }

    #[test]
    fn methods_are_verbs_as_the_kubelet_authorizes_them() {
        assert_eq!(verb(&Method::GET), Some("get"));
        assert_eq!(verb(&Method::POST), Some("create"));
        assert_eq!(verb(&Method::OPTIONS), None);
    }

    proptest! {
        #[test]
        fn any_path_gives_a_target_of_plain_names_or_an_error(path in "(/[a-zA-Z0-9%./_-]{0,12}){0,6}") {
            if let Ok(t) = target(&path) {
                for part in [Some(&t.namespace), Some(&t.pod), t.uid.as_ref(), t.container.as_ref()].into_iter().flatten() {
                    prop_assert!(!part.is_empty() && part != "." && part != ".." && !part.contains(['/', '%']));
                }
            }
        }
    }
}
