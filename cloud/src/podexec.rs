//! `kubectl exec` (and `attach`'s protocol) into a pod on an edge node:
//! `GET /api/v1/namespaces/{ns}/pods/{name}/exec?command=...&stdin=&stdout=&stderr=&tty=`
//! upgraded to a websocket with Kubernetes' channel protocol (`v5.channel.k8s.io` or
//! `v4.channel.k8s.io`, as kubectl 1.30 and newer ask), authorized as `create` on `pods/exec`
//! whatever the method (a node's certificate never is). The command is started on the node
//! through its streaming tunnel before the upgrade is answered, so a refusal (no such
//! container, not running, node away) is an API error kubectl shows; then the channel
//! messages are relayed both ways as they are (stdin and a terminal's size up; stdout, stderr
//! and the exit status down). A stream with no traffic either way for `idle` ends. SPDY (the
//! older kubectl's protocol) is not served: refused with a message that says so.

use crate::cloudhub::CloudHub;
use crate::cloudhub::tunnel::Event;
use crate::history::failure;
use api::tunnel::{ExecRequest, Open};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message as WsFrame;

/// How long a node has to start the command.
const WAIT: Duration = Duration::from_secs(15);
/// A stream silent both ways this long ends (the kubelet's streamingConnectionIdleTimeout).
const IDLE: Duration = Duration::from_secs(4 * 3600);
/// The channel protocols served, newest first.
const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// The `pods/exec` subresource (or with `attach`, `pods/attach`: the container's own process,
/// no command), through the hub's tunnels once it runs.
pub(crate) fn subresource(
    hub: Arc<OnceLock<Arc<CloudHub>>>,
    attach: bool,
) -> apiserver::Subresource {
    apiserver::Subresource {
        group: String::new(),
        plural: "pods".into(),
        name: if attach { "attach" } else { "exec" }.into(),
        verb: "create",
        methods: &[axum::http::Method::GET, axum::http::Method::POST],
        serve: Arc::new(move |pod, request| {
            let hub = hub.get().cloned();
            Box::pin(async move {
                match hub {
                    Some(hub) => serve(hub, pod, request, attach).await,
                    None => failure(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "cloudhub is off (modules.cloudHub.enable): no node can be reached",
                    ),
                }
            })
        }),
    }
}

/// The query's values of `key`, every one (`command` is given once per word).
fn all<'a>(pairs: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    pairs
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// The last value of `key` as a boolean, as Go's `strconv.ParseBool` reads it.
fn flag(pairs: &[(String, String)], key: &str) -> Result<bool, String> {
    crate::podlog::parse_bool(key, all(pairs, key).last().copied())
}

/// The request to the node: the query as sent, checked against the stored pod as
/// kube-apiserver checks `PodExecOptions`.
pub(crate) fn request(pod: &Value, raw_query: &str, attach: bool) -> Result<ExecRequest, String> {
    let pairs: Vec<(String, String)> = form_urlencoded::parse(raw_query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let container =
        crate::podlog::container_of(pod, all(&pairs, "container").last().copied(), false)?;
    let command: Vec<String> = all(&pairs, "command")
        .into_iter()
        .map(str::to_string)
        .collect();
    if command.is_empty() && !attach {
        return Err("you must specify at least one command for the container".into());
    }
    let (stdin, stdout, stderr, tty) = (
        flag(&pairs, "stdin")?,
        flag(&pairs, "stdout")?,
        flag(&pairs, "stderr")?,
        flag(&pairs, "tty")?,
    );
    if !(stdin || stdout || stderr) {
        return Err("you must specify at least one of stdin, stdout, stderr".into());
    }
    Ok(ExecRequest {
        namespace: pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string(),
        pod: name.to_string(),
        uid: pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        container,
        command,
        stdin,
        stdout,
        stderr,
        tty,
    })
}

/// The node a pod is scheduled to, or why there is none (naming the pod).
pub(crate) fn scheduled_node(pod: &Value) -> Result<String, String> {
    pod["spec"]["nodeName"]
        .as_str()
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .ok_or_else(|| {
            let name = pod["metadata"]["name"].as_str().unwrap_or_default();
            format!("pod {name} is not scheduled to a node yet")
        })
}

/// The channel protocol a websocket request offers that is served, and its key.
fn websocket(headers: &HeaderMap) -> Option<(&'static str, String)> {
    let upgrade = headers
        .get("upgrade")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let key = headers
        .get("sec-websocket-key")
        .and_then(|v| v.to_str().ok())?;
    let offered = crate::podportforward::header_words(headers, "sec-websocket-protocol");
    let protocol = PROTOCOLS.into_iter().find(|p| offered.contains(p))?;
    upgrade.then(|| (protocol, key.to_string()))
}

async fn serve(
    hub: Arc<CloudHub>,
    pod: Value,
    request: apiserver::SubresourceRequest,
    attach: bool,
) -> Response {
    let node = match scheduled_node(&pod) {
        Ok(n) => n,
        Err(m) => return failure(StatusCode::BAD_REQUEST, m),
    };
    let Some((protocol, key)) = websocket(&request.headers) else {
        return failure(
            StatusCode::BAD_REQUEST,
            format!(
                "pods/exec is served as a websocket with the protocol {} (kubectl 1.30 or newer); SPDY is not served",
                PROTOCOLS.join(" or ")
            ),
        );
    };
    let exec = match self::request(&pod, &request.raw_query, attach) {
        Ok(r) => r,
        Err(m) => return failure(StatusCode::BAD_REQUEST, m),
    };
    let Some(upgrade) = request.upgrade else {
        return failure(
            StatusCode::BAD_REQUEST,
            "this connection cannot be upgraded to a websocket",
        );
    };
    let open = if attach {
        Open::Attach(exec)
    } else {
        Open::Exec(exec)
    };
    let stream = match crate::cloudhub::tunnel::open_for_api(&hub.tunnels, &node, &open, WAIT).await
    {
        Ok(s) => s,
        Err((code, message)) => {
            let code = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
            return failure(code, message);
        }
    };
    tokio::spawn(async move {
        let upgraded = match upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::info!(%node, error = %e, "kubectl exec: the websocket upgrade failed");
                return;
            }
        };
        let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            hyper_util::rt::TokioIo::new(upgraded),
            tokio_tungstenite::tungstenite::protocol::Role::Server,
            None,
        )
        .await;
        relay(ws, stream).await;
    });
    let mut response = Response::new(axum::body::Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert("upgrade", axum::http::HeaderValue::from_static("websocket"));
    h.insert(
        "connection",
        axum::http::HeaderValue::from_static("Upgrade"),
    );
    if let Ok(v) =
        tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes()).parse()
    {
        h.insert("sec-websocket-accept", v);
    }
    h.insert(
        "sec-websocket-protocol",
        axum::http::HeaderValue::from_static(protocol),
    );
    response.into_response()
}

/// Channel messages both ways until the command ends, the client goes, or both are idle.
async fn relay<S>(
    ws: tokio_tungstenite::WebSocketStream<S>,
    mut stream: crate::cloudhub::tunnel::Stream,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut from_client) = ws.split();
    let up = stream.sender();
    // Data to the node waits for its credit in its own task: the node's output keeps flowing
    // meanwhile.
    let (to_node, mut queued) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    let sending = tokio::spawn(async move {
        while let Some(m) = queued.recv().await {
            if !up.send(m).await {
                break;
            }
        }
    });
    loop {
        let event = tokio::select! {
            e = stream.next() => Some(e),
            m = from_client.next() => {
                match m {
                    Some(Ok(WsFrame::Binary(b))) => {
                        for part in api::tunnel::channel_chunks(&b) {
                            if to_node.send(part).await.is_err() {
                                break;
                            }
                        }
                        continue;
                    }
                    Some(Ok(WsFrame::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => continue,
                }
            }
            _ = tokio::time::sleep(IDLE) => {
                tracing::info!(node = %stream.node, "kubectl exec: idle for {IDLE:?}; ended");
                None
            }
        };
        match event {
            Some(Event::Data(b)) => {
                if sink.send(WsFrame::binary(b)).await.is_err() {
                    break;
                }
            }
            Some(Event::Ready) => {}
            Some(Event::End(o)) => {
                if o.code != 200 {
                    // The outcome on the error channel, as a Status kubectl prints.
                    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1",
                        "metadata": {}, "status": "Failure", "message": o.message});
                    let mut m = vec![3u8];
                    m.extend_from_slice(status.to_string().as_bytes());
                    let _ = sink.send(WsFrame::binary(m)).await;
                }
                break;
            }
            None => break,
        }
    }
    sending.abort();
    // A normal closure (1000): kubectl takes any other, even none, as a broken stream.
    let normal = tokio_tungstenite::tungstenite::protocol::CloseFrame {
        code: tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode::Normal,
        reason: "".into(),
    };
    let _ = sink.send(WsFrame::Close(Some(normal))).await;
    let _ = sink.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::podlog::tests::pod;

    #[test]
    fn the_query_as_sent_gives_the_command_word_by_word() {
        let r = request(
            &pod(&["main"]),
            "command=sh&command=-c&command=echo%20hi%3B%20exit%203&stdout=true&stderr=true&tty=false",
            false,
        )
        .expect("ok");
        assert_eq!(r.command, ["sh", "-c", "echo hi; exit 3"]);
        assert_eq!(r.container, "main");
        assert!(r.stdout && r.stderr && !r.stdin && !r.tty);
        assert_eq!(
            request(&pod(&["main"]), "stdout=true", false).expect_err("no command"),
            "you must specify at least one command for the container"
        );
        // attach runs no command.
        assert!(request(&pod(&["main"]), "stdout=true", true).is_ok());
        assert!(
            request(&pod(&["main"]), "command=ls", false)
                .expect_err("no stream")
                .contains("stdin, stdout, stderr")
        );
        assert!(
            request(&pod(&["a", "b"]), "command=ls&stdout=1", false)
                .expect_err("which")
                .contains("choose one of: [a b]")
        );
        assert!(
            request(&pod(&["a"]), "command=ls&stdout=1&container=z", false)
                .expect_err("z")
                .contains("not valid")
        );
        assert!(
            request(&pod(&["a"]), "command=ls&stdout=maybe", false)
                .expect_err("bool")
                .contains("stdout")
        );
    }

    #[test]
    fn a_websocket_with_a_channel_protocol_is_served_and_nothing_else() {
        let mut h = HeaderMap::new();
        h.insert("upgrade", "websocket".parse().expect("v"));
        h.insert(
            "sec-websocket-key",
            "dGhlIHNhbXBsZSBub25jZQ==".parse().expect("v"),
        );
        h.insert(
            "sec-websocket-protocol",
            "v4.channel.k8s.io, v5.channel.k8s.io".parse().expect("v"),
        );
        assert_eq!(websocket(&h).map(|w| w.0), Some("v5.channel.k8s.io"));
        h.insert(
            "sec-websocket-protocol",
            "base64.channel.k8s.io".parse().expect("v"),
        );
        assert_eq!(websocket(&h), None);
        let mut spdy = HeaderMap::new();
        spdy.insert("upgrade", "SPDY/3.1".parse().expect("v"));
        assert_eq!(websocket(&spdy), None);
    }
}
