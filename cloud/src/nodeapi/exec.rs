//! `kubectl exec` (and `attach`'s protocol) into a pod on an edge node:
//! `GET /api/v1/namespaces/{ns}/pods/{name}/exec?command=...&stdin=&stdout=&stderr=&tty=`
//! upgraded to a websocket with Kubernetes' channel protocol (`v5.channel.k8s.io` or
//! `v4.channel.k8s.io`, as kubectl 1.30 and newer ask), authorized as `create` on `pods/exec`
//! whatever the method (a node's certificate never is). The command is started on the node
//! through its streaming tunnel before the upgrade is answered, so a refusal (no such
//! container, not running, node away) is an API error kubectl shows; then the channel
//! messages are relayed both ways as they are (stdin and a terminal's size up; stdout, stderr
//! and the exit status down). A stream with no traffic either way for `idle` ends.
//!
//! SPDY/3.1 (`v4.channel.k8s.io` over the HTTP upgrade: kubectl before 1.30, or
//! `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false`, and what kube-apiserver speaks to a kubelet) is
//! served too: the client opens one SPDY stream per `streamType` (`error`, `stdin`, `stdout`,
//! `stderr`, `resize`); once those the query asks for are there, each carries its channel's
//! bytes (stdin's end is the channel protocol's close of stdin), and the outcome is written on
//! `error` before every stream ends.

use super::{Refused, Transport, failure, off, scheduled_node};
use crate::cloudhub::CloudHub;
use crate::cloudhub::tunnel::Event;
use api::tunnel::{ExecRequest, Open};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message as WsFrame;

/// How long a node has to start the command.
const WAIT: Duration = Duration::from_secs(15);
/// A stream silent both ways this long ends (the kubelet's streamingConnectionIdleTimeout).
const IDLE: Duration = Duration::from_secs(4 * 3600);
/// The channel protocols served, newest first.
const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];
/// The one served over SPDY (kubectl offers v4 to v1 there; v5 is for websockets only).
const SPDY_PROTOCOL: &str = "v4.channel.k8s.io";
/// How long a SPDY client has to open the streams its query asks for (the kubelet's).
const STREAMS_WAIT: Duration = Duration::from_secs(30);

/// The `pods/exec` subresource (or with `attach`, `pods/attach`: the container's own process,
/// no command), through the hub's tunnels once it runs.
pub(crate) fn subresource(api: super::NodeApi, attach: bool) -> apiserver::Subresource {
    apiserver::Subresource {
        group: String::new(),
        plural: "pods".into(),
        name: if attach { "attach" } else { "exec" }.into(),
        verb: "create",
        methods: &[axum::http::Method::GET, axum::http::Method::POST],
        serve: Arc::new(move |pod, request| {
            let hub = api.hub();
            Box::pin(async move {
                match hub {
                    Some(hub) => serve(hub, pod, request, attach).await,
                    None => off(),
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
fn flag(pairs: &[(String, String)], key: &str) -> Result<bool, Refused> {
    super::logs::parse_bool(key, all(pairs, key).last().copied())
}

/// The request to the node: the query as sent, checked against the stored pod as
/// kube-apiserver checks `PodExecOptions`.
pub(crate) fn request(pod: &Value, raw_query: &str, attach: bool) -> Result<ExecRequest, Refused> {
    let pairs: Vec<(String, String)> = form_urlencoded::parse(raw_query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let container =
        super::logs::container_of(pod, all(&pairs, "container").last().copied(), false)?;
    let command: Vec<String> = all(&pairs, "command")
        .into_iter()
        .map(str::to_string)
        .collect();
    if command.is_empty() && !attach {
        return Err(Refused::NoCommand);
    }
    let (stdin, stdout, stderr, tty) = (
        flag(&pairs, "stdin")?,
        flag(&pairs, "stdout")?,
        flag(&pairs, "stderr")?,
        flag(&pairs, "tty")?,
    );
    if !(stdin || stdout || stderr) {
        return Err(Refused::NoStream);
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

/// The transport a request asks for, if it is one served.
fn transport(headers: &HeaderMap) -> Option<Transport> {
    super::transport(headers, &PROTOCOLS, SPDY_PROTOCOL)
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
    let Some(transport) = transport(&request.headers) else {
        return failure(
            StatusCode::BAD_REQUEST,
            format!(
                "pods/exec is served as a websocket with the protocol {} or as SPDY/3.1 with {SPDY_PROTOCOL}",
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
            "this connection cannot be upgraded (HTTP/1.1 is needed)",
        );
    };
    let asked = Asked::of(&exec);
    let open = if attach {
        Open::Attach(exec)
    } else {
        Open::Exec(exec)
    };
    let stream = match super::open_stream(&hub, &node, &open, &request.user, WAIT).await {
        Ok(s) => s,
        Err(refused) => return *refused,
    };
    let websocket = matches!(transport, Transport::WebSocket(..));
    tokio::spawn(async move {
        let upgraded = match upgrade.await {
            Ok(u) => hyper_util::rt::TokioIo::new(u),
            Err(e) => {
                tracing::info!(%node, error = %e, "kubectl exec: the upgrade failed");
                return;
            }
        };
        if websocket {
            let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                upgraded,
                tokio_tungstenite::tungstenite::protocol::Role::Server,
                None,
            )
            .await;
            relay(ws, stream).await;
        } else {
            super::spdy::carry(upgraded, false, |incoming, out| {
                spdy_session(stream, asked, incoming, out)
            })
            .await;
        }
    });
    let mut response = Response::new(axum::body::Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert(
        "connection",
        axum::http::HeaderValue::from_static("Upgrade"),
    );
    match transport {
        Transport::WebSocket(protocol, key) => {
            h.insert("upgrade", axum::http::HeaderValue::from_static("websocket"));
            if let Ok(v) =
                tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes()).parse()
            {
                h.insert("sec-websocket-accept", v);
            }
            h.insert(
                "sec-websocket-protocol",
                axum::http::HeaderValue::from_static(protocol),
            );
        }
        Transport::Spdy => {
            h.insert("upgrade", axum::http::HeaderValue::from_static("SPDY/3.1"));
            h.insert(
                "x-stream-protocol-version",
                axum::http::HeaderValue::from_static(SPDY_PROTOCOL),
            );
        }
    }
    response.into_response()
}

/// The streams a query asks for (`error` always).
#[derive(Clone, Copy, Debug)]
struct Asked {
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

impl Asked {
    fn of(r: &ExecRequest) -> Self {
        Self {
            stdin: r.stdin,
            stdout: r.stdout,
            // A terminal has no stderr of its own.
            stderr: r.stderr && !r.tty,
            tty: r.tty,
        }
    }
}

/// A SPDY exec's streams, by `streamType`.
#[derive(Default, Debug)]
struct Streams {
    error: Option<u32>,
    stdin: Option<u32>,
    stdout: Option<u32>,
    stderr: Option<u32>,
    resize: Option<u32>,
}

impl Streams {
    /// The slot of a `streamType`.
    fn slot(&mut self, kind: &str) -> Option<&mut Option<u32>> {
        Some(match kind {
            "error" => &mut self.error,
            "stdin" => &mut self.stdin,
            "stdout" => &mut self.stdout,
            "stderr" => &mut self.stderr,
            "resize" => &mut self.resize,
            _ => return None,
        })
    }

    /// Whether every stream `asked` is open (a terminal's size stream too).
    fn complete(&self, asked: Asked) -> bool {
        self.error.is_some()
            && (!asked.stdin || self.stdin.is_some())
            && (!asked.stdout || self.stdout.is_some())
            && (!asked.stderr || self.stderr.is_some())
            && (!asked.tty || self.resize.is_some())
    }

    /// The stream a node's channel message goes to.
    fn down(&self, channel: u8) -> Option<u32> {
        match channel {
            1 => self.stdout,
            2 => self.stderr,
            3 => self.error,
            _ => None,
        }
    }
}

/// A SPDY exec: the client's streams opened and answered; once those `asked` are there, the
/// node's channel messages go to their streams and stdin and the terminal's size to the node,
/// until the command ends, the client goes, or both sides are idle for [`IDLE`].
async fn spdy_session(
    mut stream: crate::cloudhub::tunnel::Stream,
    asked: Asked,
    mut incoming: tokio::sync::mpsc::Receiver<Vec<u8>>,
    out: tokio::sync::mpsc::Sender<Vec<u8>>,
) {
    use super::spdy::{Deflater, Frame, Input, Reader, data, status};
    let (mut reader, mut deflater) = (Reader::default(), Deflater::default());
    let mut streams = Streams::default();
    let (to_node, sending) = sender(&stream);
    let opening = tokio::time::sleep(STREAMS_WAIT);
    tokio::pin!(opening);
    'session: loop {
        let ready = streams.complete(asked);
        let event = tokio::select! {
            e = stream.next(), if ready => e,
            chunk = incoming.recv() => {
                let Some(chunk) = chunk else { break };
                let inputs = match reader.feed(&chunk) {
                    Ok(i) => i,
                    Err(e) => {
                        tracing::info!(node = %stream.node, error = %e, "kubectl exec (SPDY): ended");
                        let _ = out.send(super::spdy::protocol_error(reader.last())).await;
                        break;
                    }
                };
                for input in inputs {
                    let reply = match input {
                        Input::Open { stream: id, .. } => {
                            let kind = input.header("streamtype").unwrap_or_default();
                            match streams.slot(kind) {
                                Some(slot) if slot.is_none() => {
                                    *slot = Some(id);
                                    Frame::SynReply { stream: id, fin: false, block: deflater.block(&[]) }
                                }
                                _ => Frame::RstStream { stream: id, status: status::PROTOCOL_ERROR },
                            }
                        }
                        Input::Refuse { stream: id, status } => Frame::RstStream { stream: id, status },
                        Input::Data { stream: id, fin, data } => {
                            let channel = if Some(id) == streams.stdin {
                                0
                            } else if Some(id) == streams.resize {
                                4
                            } else {
                                continue;
                            };
                            let mut m = vec![channel];
                            m.extend_from_slice(&data);
                            let mut parts = if data.is_empty() { Vec::new() } else { api::tunnel::channel_chunks(&m) };
                            if fin && channel == 0 {
                                // The client closed stdin: the channel protocol's close (v5).
                                parts.push(vec![255, 0]);
                            }
                            for part in parts {
                                if to_node.send(part).await.is_err() {
                                    break 'session;
                                }
                            }
                            continue;
                        }
                        Input::Ping(id) => Frame::Ping(id),
                        Input::Reset { .. } => continue,
                        Input::GoAway => break 'session,
                    };
                    if out.send(reply.encode()).await.is_err() {
                        break 'session;
                    }
                }
                continue;
            }
            _ = &mut opening, if !ready => {
                tracing::info!(node = %stream.node, ?streams, "kubectl exec (SPDY): the streams asked for were not opened within {STREAMS_WAIT:?}; ended");
                break;
            }
            _ = tokio::time::sleep(IDLE) => {
                tracing::info!(node = %stream.node, "kubectl exec (SPDY): idle for {IDLE:?}; ended");
                break;
            }
        };
        match event {
            Event::Data(b) => {
                if let Some((&channel, rest)) = b.split_first()
                    && let Some(id) = streams.down(channel)
                    && out.send(data(id, false, rest.to_vec())).await.is_err()
                {
                    break;
                }
            }
            Event::Ready => {}
            Event::End(o) => {
                if o.code != 200
                    && let Some(id) = streams.error
                {
                    let _ = out.send(data(id, false, failure_status(&o.message))).await;
                }
                break;
            }
        }
    }
    sending.abort();
    // Every stream ends: kubectl reads stdout and stderr to their end, then the outcome.
    for id in [
        streams.stdout,
        streams.stderr,
        streams.error,
        streams.stdin,
        streams.resize,
    ]
    .into_iter()
    .flatten()
    {
        let _ = out.send(data(id, true, Vec::new())).await;
    }
}

/// A queue of channel messages to the node: they wait for its credit in their own task, so
/// that the node's output keeps flowing meanwhile.
fn sender(
    stream: &crate::cloudhub::tunnel::Stream,
) -> (
    tokio::sync::mpsc::Sender<Vec<u8>>,
    tokio::task::JoinHandle<()>,
) {
    let up = stream.sender();
    let (to_node, mut queued) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    let sending = tokio::spawn(async move {
        while let Some(m) = queued.recv().await {
            if !up.send(m).await {
                break;
            }
        }
    });
    (to_node, sending)
}

/// The outcome of a command that did not end well, as the `Status` kubectl prints.
fn failure_status(message: &str) -> Vec<u8> {
    serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message})
    .to_string()
    .into_bytes()
}

/// Channel messages both ways until the command ends, the client goes, or both are idle.
async fn relay<S>(
    ws: tokio_tungstenite::WebSocketStream<S>,
    mut stream: crate::cloudhub::tunnel::Stream,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut from_client) = ws.split();
    let (to_node, sending) = sender(&stream);
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
                    let mut m = vec![3u8];
                    m.extend_from_slice(&failure_status(&o.message));
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
    use crate::nodeapi::logs::tests::pod;

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
            Refused::NoCommand
        );
        // attach runs no command.
        assert!(request(&pod(&["main"]), "stdout=true", true).is_ok());
        assert!(
            request(&pod(&["main"]), "command=ls", false)
                .expect_err("no stream")
                .to_string()
                .contains("stdin, stdout, stderr")
        );
        assert!(
            request(&pod(&["a", "b"]), "command=ls&stdout=1", false)
                .expect_err("which")
                .to_string()
                .contains("choose one of: [a b]")
        );
        assert!(
            request(&pod(&["a"]), "command=ls&stdout=1&container=z", false)
                .expect_err("z")
                .to_string()
                .contains("not valid")
        );
        assert!(
            request(&pod(&["a"]), "command=ls&stdout=maybe", false)
                .expect_err("bool")
                .to_string()
                .contains("stdout")
        );
    }

    #[test]
    fn a_websocket_with_a_channel_protocol_or_spdy_with_v4_is_served_and_nothing_else() {
        let ws = |protocols| {
            super::super::headers(&[
                ("upgrade", "websocket"),
                ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
                ("sec-websocket-protocol", protocols),
            ])
        };
        assert!(matches!(
            transport(&ws("v4.channel.k8s.io, v5.channel.k8s.io")),
            Some(Transport::WebSocket("v5.channel.k8s.io", _))
        ));
        assert_eq!(transport(&ws("base64.channel.k8s.io")), None);
        let spdy = |versions: &[&str]| {
            let mut h = vec![("upgrade", "SPDY/3.1")];
            h.extend(versions.iter().map(|v| ("x-stream-protocol-version", *v)));
            super::super::headers(&h)
        };
        assert_eq!(transport(&spdy(&[])), None, "no protocol offered");
        assert_eq!(
            transport(&spdy(&["v2.channel.k8s.io"])),
            None,
            "only v4 over SPDY"
        );
        assert_eq!(
            transport(&spdy(&["v2.channel.k8s.io", "v4.channel.k8s.io"])),
            Some(Transport::Spdy)
        );
    }
}
