//! `kubectl port-forward` to a pod on an edge node:
//! `/api/v1/namespaces/{ns}/pods/{name}/portforward`, authorized as `create` on
//! `pods/portforward` whatever the method (a node's certificate never is), served as the
//! kubelet serves it: a SPDY/3.1 session (`portforward.k8s.io`), either inside a websocket
//! (the protocol `SPDY/3.1+portforward.k8s.io`, kubectl 1.31 and newer) or over the HTTP
//! upgrade to `SPDY/3.1` (older kubectl, or `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`).
//!
//! For each connection it accepts locally, kubectl opens two streams with the same
//! `requestID` and `port`: `error` (which it only reads) and `data`. Once both are there, one
//! stream of the node's tunnel carries the connection to the pod's port, made by the node's
//! runtime in the pod's network; what fails is written on the `error` stream, which kubectl
//! prints. Bounded: streams waiting for their pair, the node's streams (a refusal is said on
//! the `error` stream), a frame's size, header blocks' size, and a session silent both ways
//! for `IDLE` ends.

use super::spdy::{self, Deflater, Frame, Input, Reader};
use super::{Transport, failure, off};
use crate::cloudhub::CloudHub;
use crate::cloudhub::tunnel::{Event, Stream};
use api::tunnel::{MAX_DATA, Open, PortForwardRequest};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The stream protocol (`X-Stream-Protocol-Version`).
const PROTOCOL: &str = "portforward.k8s.io";
/// The same inside a websocket.
const TUNNELED: &str = "SPDY/3.1+portforward.k8s.io";
/// How long a node has to connect to the pod's port.
const WAIT: Duration = Duration::from_secs(15);
/// How long a connection waits for one of the user's streams on the node to end, when all
/// are taken, before it is refused.
const PATIENCE: Duration = Duration::from_secs(300);
/// A session silent both ways this long ends (kubectl pings every 5 s while it runs).
const IDLE: Duration = Duration::from_secs(4 * 3600);
/// Streams waiting for the other of their pair, per session.
const PENDING: usize = 64;

/// The `pods/portforward` subresource, through the hub's tunnels once it runs.
pub(crate) fn subresource(api: super::NodeApi) -> apiserver::Subresource {
    apiserver::Subresource {
        group: String::new(),
        plural: "pods".into(),
        name: "portforward".into(),
        verb: "create",
        methods: &[axum::http::Method::GET, axum::http::Method::POST],
        serve: Arc::new(move |pod, request| {
            let hub = api.hub();
            Box::pin(async move {
                match hub {
                    Some(hub) => serve(hub, pod, request).await,
                    None => off(),
                }
            })
        }),
    }
}

/// The transport a request asks for, if it is one served: SPDY/3.1, over the HTTP upgrade or
/// in a websocket.
fn transport(headers: &HeaderMap) -> Option<Transport> {
    super::transport(headers, &[TUNNELED], PROTOCOL)
}

/// Opens one connection's stream on the node.
type Opener = Arc<
    dyn Fn(u16) -> Pin<Box<dyn Future<Output = Result<Stream, (u16, String)>> + Send>>
        + Send
        + Sync,
>;

async fn serve(hub: Arc<CloudHub>, pod: Value, request: apiserver::SubresourceRequest) -> Response {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let node = match super::scheduled_node(&pod) {
        Ok(n) => n,
        Err(m) => return failure(StatusCode::BAD_REQUEST, m),
    };
    let Some(transport) = transport(&request.headers) else {
        return failure(
            StatusCode::BAD_REQUEST,
            format!(
                "pods/portforward is served as SPDY/3.1 ({PROTOCOL}), over an HTTP upgrade or in a websocket with the protocol {TUNNELED}"
            ),
        );
    };
    // A node away is said before the upgrade, as an API error kubectl prints.
    if !hub.tunnels.has(&node) {
        return failure(
            StatusCode::SERVICE_UNAVAILABLE,
            crate::cloudhub::tunnel::NotOpened::NoTunnel(node).to_string(),
        );
    }
    let Some(upgrade) = request.upgrade else {
        return failure(
            StatusCode::BAD_REQUEST,
            "this connection cannot be upgraded (HTTP/1.1 is needed)",
        );
    };
    let target = PortForwardRequest {
        namespace: namespace.to_string(),
        pod: name.to_string(),
        uid: pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        port: 0,
    };
    let describe = format!("pod {namespace}/{name} on node {node}");
    let opener: Opener = {
        let (hub, node, user) = (hub.clone(), node.clone(), request.user.clone());
        Arc::new(move |port| {
            let (hub, node, user) = (hub.clone(), node.clone(), user.clone());
            let open = Open::PortForward(PortForwardRequest {
                port,
                ..target.clone()
            });
            Box::pin(async move {
                // A connection beyond the streams a user may hold waits for one to end: one
                // refused would end kubectl's whole forward.
                let patience = PATIENCE;
                crate::cloudhub::tunnel::open_for_api(
                    &hub.tunnels,
                    &node,
                    &open,
                    &user,
                    patience,
                    WAIT,
                )
                .await
            })
        })
    };
    let websocket = matches!(transport, Transport::WebSocket(..));
    tokio::spawn(async move {
        let upgraded = match upgrade.await {
            Ok(u) => hyper_util::rt::TokioIo::new(u),
            Err(e) => {
                tracing::info!(%node, error = %e, "kubectl port-forward: the upgrade failed");
                return;
            }
        };
        spdy::carry(upgraded, websocket, |incoming, out| {
            session(opener, &describe, incoming, out)
        })
        .await;
    });
    let mut response = Response::new(axum::body::Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert("connection", HeaderValue::from_static("Upgrade"));
    match transport {
        Transport::WebSocket(_, key) => {
            h.insert("upgrade", HeaderValue::from_static("websocket"));
            if let Ok(v) =
                tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes()).parse()
            {
                h.insert("sec-websocket-accept", v);
            }
            h.insert("sec-websocket-protocol", HeaderValue::from_static(TUNNELED));
        }
        Transport::Spdy => {
            h.insert("upgrade", HeaderValue::from_static("SPDY/3.1"));
            h.insert(
                "x-stream-protocol-version",
                HeaderValue::from_static(PROTOCOL),
            );
        }
    }
    response.into_response()
}

/// One stream of a pair, seen before the other.
#[derive(Default)]
struct Half {
    error: Option<u32>,
    data: Option<u32>,
    port: String,
}

/// A SPDY session: frames from `incoming` (the client's bytes, in any pieces), frames to
/// `out` (each one whole), until the client goes, breaks the protocol or is silent for
/// [`IDLE`].
async fn session(
    opener: Opener,
    describe: &str,
    mut incoming: mpsc::Receiver<Vec<u8>>,
    out: mpsc::Sender<Vec<u8>>,
) {
    let mut reader = Reader::default();
    let mut deflater = Deflater::default();
    let mut pending: HashMap<String, Half> = HashMap::new();
    // A connection's data stream: what the client sends on it goes to its task.
    let mut to_pairs: HashMap<u32, mpsc::Sender<Vec<u8>>> = HashMap::new();
    let mut tasks: HashMap<u32, tokio::task::AbortHandle> = HashMap::new();
    'session: loop {
        let chunk = tokio::select! {
            c = incoming.recv() => c,
            _ = tokio::time::sleep(IDLE) => {
                tracing::info!(target = describe, "kubectl port-forward: idle for {IDLE:?}; ended");
                None
            }
        };
        let Some(chunk) = chunk else { break };
        let inputs = match reader.feed(&chunk) {
            Ok(i) => i,
            Err(e) => {
                tracing::info!(target = describe, error = %e, "kubectl port-forward: ended");
                let _ = out.send(spdy::protocol_error(reader.last())).await;
                break;
            }
        };
        let reset = |stream: u32, status: u32| Frame::RstStream { stream, status }.encode();
        for input in inputs {
            match input {
                Input::Open { stream, .. } => {
                    let (Some(kind), Some(request)) =
                        (input.header("streamtype"), input.header("requestid"))
                    else {
                        // The kubelet refuses such a stream too.
                        let _ = out.send(reset(stream, spdy::status::PROTOCOL_ERROR)).await;
                        continue;
                    };
                    if !pending.contains_key(request) && pending.len() >= PENDING {
                        let _ = out.send(reset(stream, spdy::status::REFUSED_STREAM)).await;
                        continue;
                    }
                    let half = pending.entry(request.to_string()).or_default();
                    match kind {
                        "error" if half.error.is_none() => half.error = Some(stream),
                        "data" if half.data.is_none() => half.data = Some(stream),
                        _ => {
                            let _ = out.send(reset(stream, spdy::status::PROTOCOL_ERROR)).await;
                            continue;
                        }
                    }
                    if let Some(p) = input.header("port") {
                        half.port = p.to_string();
                    }
                    let reply = Frame::SynReply {
                        stream,
                        fin: false,
                        block: deflater.block(&[]),
                    };
                    if out.send(reply.encode()).await.is_err() {
                        break 'session;
                    }
                    let (Some(error), Some(data)) = (half.error, half.data) else {
                        continue;
                    };
                    let port = half.port.clone();
                    pending.remove(request);
                    let (tx, rx) = mpsc::channel(4);
                    to_pairs.insert(data, tx);
                    let task = tokio::spawn(connection(
                        opener.clone(),
                        describe.to_string(),
                        port,
                        (error, data),
                        rx,
                        out.clone(),
                    ));
                    tasks.retain(|_, t| !t.is_finished());
                    tasks.insert(data, task.abort_handle());
                    tasks.insert(error, task.abort_handle());
                }
                Input::Refuse { stream, status } => {
                    let _ = out.send(reset(stream, status)).await;
                }
                Input::Data { stream, fin, data } => {
                    if let Some(tx) = to_pairs.get(&stream)
                        && !data.is_empty()
                        && tx.send(data).await.is_err()
                    {
                        to_pairs.remove(&stream);
                    }
                    if fin {
                        // The client's half is done; its node side cannot be told (see
                        // `Open::PortForward`), so the connection stays until either end ends.
                        to_pairs.remove(&stream);
                    }
                }
                Input::Reset { stream } => {
                    to_pairs.remove(&stream);
                    if let Some(t) = tasks.remove(&stream) {
                        t.abort();
                    }
                }
                Input::Ping(id) => {
                    if out.send(Frame::Ping(id).encode()).await.is_err() {
                        break 'session;
                    }
                }
                Input::GoAway => break 'session,
            }
        }
    }
    for t in tasks.values() {
        t.abort();
    }
}

/// What a connection's client may send before its stream on the node is open (it may wait
/// for a place): kept, so that the session never waits on one connection's channel meanwhile.
const EARLY: usize = 256 * 1024;

/// `opening`, taking what the client sends meanwhile (up to [`EARLY`] bytes; beyond, it is
/// left in `inbound` until the stream is open): the stream or why not, and what was taken.
async fn open_taking<T>(
    opening: impl std::future::Future<Output = T>,
    inbound: &mut mpsc::Receiver<Vec<u8>>,
) -> (T, Vec<Vec<u8>>) {
    tokio::pin!(opening);
    let (mut early, mut taken) = (Vec::new(), 0);
    loop {
        tokio::select! {
            // What is there is taken first: the bound, not a race, decides what is kept.
            biased;
            Some(b) = inbound.recv(), if taken < EARLY => {
                taken += b.len();
                early.push(b);
            }
            done = &mut opening => return (done, early),
        }
    }
}

/// One connection: its stream on the node, the bytes both ways, and what went wrong written on
/// the `error` stream; both streams end with the connection.
async fn connection(
    opener: Opener,
    describe: String,
    port: String,
    (error, data): (u32, u32),
    mut inbound: mpsc::Receiver<Vec<u8>>,
    out: mpsc::Sender<Vec<u8>>,
) {
    let frame = spdy::data;
    let failed = match port.parse::<u16>() {
        Ok(p) if p > 0 => match open_taking(opener(p), &mut inbound).await {
            (Ok(mut stream), early) => {
                let up = stream.sender();
                // The client's bytes wait for the node's credit in their own task, so the
                // pod's bytes keep flowing down meanwhile; first what came while it opened.
                let sending = tokio::spawn(async move {
                    for b in early {
                        for piece in b.chunks(MAX_DATA) {
                            if !up.send(piece.to_vec()).await {
                                return;
                            }
                        }
                    }
                    while let Some(b) = inbound.recv().await {
                        for piece in b.chunks(MAX_DATA) {
                            if !up.send(piece.to_vec()).await {
                                return;
                            }
                        }
                    }
                });
                let outcome = loop {
                    match stream.next().await {
                        Event::Data(b) => {
                            if out.send(frame(data, false, b)).await.is_err() {
                                break None;
                            }
                        }
                        Event::Ready => {}
                        Event::End(o) => break Some(o),
                    }
                };
                sending.abort();
                outcome
                    .filter(|o| o.code != 200)
                    .map(|o| format!("error forwarding port {p} to {describe}: {}", o.message))
            }
            (Err((_, message)), _) => Some(format!(
                "error forwarding port {p} to {describe}: {message}"
            )),
        },
        _ => Some(format!("invalid port {port:?}: a number from 1 to 65535")),
    };
    if let Some(message) = failed {
        let _ = out.send(frame(error, false, message.into_bytes())).await;
    }
    let _ = out.send(frame(error, true, Vec::new())).await;
    let _ = out.send(frame(data, true, Vec::new())).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// While a connection waits for a place on the node, what its client sends is taken (the
    /// session never waits on it), up to [`EARLY`]; the rest stays queued for later.
    #[tokio::test]
    async fn what_comes_while_a_connection_opens_is_kept_up_to_its_bound() {
        let (tx, mut rx) = mpsc::channel(4);
        let (open_tx, open_rx) = tokio::sync::oneshot::channel::<u8>();
        let opening = async move { open_rx.await.unwrap_or(0) };
        let sender = tokio::spawn(async move {
            for _ in 0..5 {
                tx.send(vec![7u8; EARLY / 2]).await.expect("send");
            }
            open_tx.send(1).expect("opened");
            tx
        });
        let (opened, early) = open_taking(opening, &mut rx).await;
        assert_eq!(opened, 1);
        let taken: usize = early.iter().map(Vec::len).sum();
        assert_eq!(taken, EARLY, "taken up to the bound, then left queued");
        let _tx = sender.await.expect("sender");
        let mut left = 0;
        while let Ok(b) = rx.try_recv() {
            left += b.len();
        }
        assert_eq!(
            left,
            3 * EARLY / 2,
            "the rest is still there, in order, for the stream"
        );
    }
    use crate::cloudhub::tunnel::Tunnels;
    use api::tunnel::{Frame as TunnelFrame, Kind, Outcome};

    /// A client's side of a session: frames written whole, frames read as they come.
    struct Client {
        to: mpsc::Sender<Vec<u8>>,
        from: mpsc::Receiver<Vec<u8>>,
        buf: Vec<u8>,
        headers: Deflater,
    }

    impl Client {
        async fn send(&self, f: Frame) {
            self.to.send(f.encode()).await.expect("session reads");
        }

        async fn open(&mut self, stream: u32, kind: &str, port: &str, request: &str) {
            let mut pairs = vec![("streamType", kind), ("port", port)];
            if !request.is_empty() {
                pairs.push(("requestID", request));
            }
            let block = self.headers.block(&pairs);
            self.send(Frame::SynStream {
                stream,
                fin: false,
                block,
            })
            .await;
        }

        /// What a connection's error stream says, once both its streams end (replies skipped).
        async fn said(&mut self, error: u32) -> String {
            let mut said = Vec::new();
            let mut ended = 0;
            while ended < 2 {
                match self.next().await {
                    Frame::SynReply { .. } => {}
                    Frame::Data {
                        stream,
                        fin: false,
                        data,
                    } if stream == error => said.extend(data),
                    Frame::Data { fin: true, .. } => ended += 1,
                    other => panic!("{other:?}"),
                }
            }
            String::from_utf8_lossy(&said).into_owned()
        }

        async fn next(&mut self) -> Frame {
            loop {
                if let Some((f, n)) = Frame::parse(&self.buf).expect("a frame") {
                    self.buf.drain(..n);
                    return f;
                }
                let more = tokio::time::timeout(Duration::from_secs(10), self.from.recv())
                    .await
                    .expect("a frame within 10 s")
                    .expect("session open");
                self.buf.extend(more);
            }
        }
    }

    #[tokio::test]
    async fn each_connection_is_a_stream_on_the_node_and_what_fails_is_said_on_its_error_stream() {
        let tunnels = Arc::new(Tunnels::new(4));
        let (tx, mut to_node) = mpsc::channel(64);
        let tunnel = tunnels.attach("edge-1", tx);
        // The node: port 8080 answers what it is sent in capitals; another port is refused.
        let node = {
            let tunnels = tunnels.clone();
            tokio::spawn(async move {
                while let Some(f) = to_node.recv().await {
                    let reply = |kind, payload| TunnelFrame::new(f.stream, kind, payload);
                    match f.kind {
                        Kind::Open => {
                            let open: Open = serde_json::from_slice(&f.payload).expect("open");
                            let Open::PortForward(req) = open else {
                                panic!("{open:?}")
                            };
                            assert_eq!((req.namespace.as_str(), req.pod.as_str()), ("ns", "web"));
                            let frame = if req.port == 8080 {
                                reply(Kind::Ready, vec![])
                            } else {
                                TunnelFrame::close(
                                    f.stream,
                                    Some(&Outcome {
                                        code: 500,
                                        message: format!(
                                            "dial tcp 127.0.0.1:{}: connection refused",
                                            req.port
                                        ),
                                    }),
                                )
                            };
                            tunnels.deliver(&tunnel, "edge-1", frame);
                        }
                        Kind::Data => {
                            let up = f.payload.to_ascii_uppercase();
                            tunnels.deliver(&tunnel, "edge-1", reply(Kind::Data, up));
                            let end = Outcome {
                                code: 200,
                                message: String::new(),
                            };
                            tunnels.deliver(
                                &tunnel,
                                "edge-1",
                                TunnelFrame::close(f.stream, Some(&end)),
                            );
                        }
                        _ => {}
                    }
                }
            })
        };
        let opener: Opener = {
            let tunnels = tunnels.clone();
            Arc::new(move |port| {
                let tunnels = tunnels.clone();
                let open = Open::PortForward(PortForwardRequest {
                    namespace: "ns".into(),
                    pod: "web".into(),
                    uid: String::new(),
                    port,
                });
                Box::pin(async move {
                    crate::cloudhub::tunnel::open_for_api(
                        &tunnels,
                        "edge-1",
                        &open,
                        "alice",
                        Duration::ZERO,
                        WAIT,
                    )
                    .await
                })
            })
        };
        let (to, incoming) = mpsc::channel(16);
        let (out, from) = mpsc::channel(64);
        let session = tokio::spawn(async move {
            session(opener, "pod ns/web on node edge-1", incoming, out).await
        });
        let mut c = Client {
            to,
            from,
            buf: Vec::new(),
            headers: Deflater::default(),
        };
        // Pings are answered.
        c.send(Frame::Ping(1)).await;
        assert_eq!(c.next().await, Frame::Ping(1));
        // A connection: its two streams replied to, its bytes through the node and back.
        c.open(1, "error", "8080", "0").await;
        c.open(3, "data", "8080", "0").await;
        assert!(matches!(c.next().await, Frame::SynReply { stream: 1, .. }));
        assert!(matches!(c.next().await, Frame::SynReply { stream: 3, .. }));
        c.send(Frame::Data {
            stream: 3,
            fin: false,
            data: b"ping".to_vec(),
        })
        .await;
        let mut got = Vec::new();
        let mut ended = Vec::new();
        while ended.len() < 2 {
            match c.next().await {
                Frame::Data {
                    stream: 3,
                    fin: false,
                    data,
                } => got.extend(data),
                Frame::Data {
                    stream,
                    fin: true,
                    data,
                } if data.is_empty() => ended.push(stream),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(got, b"PING");
        ended.sort_unstable();
        assert_eq!(ended, [1, 3], "both streams end with the connection");
        // A port the pod does not listen on: the node's refusal on the error stream.
        c.open(5, "error", "9", "1").await;
        c.open(7, "data", "9", "1").await;
        let said = c.said(5).await;
        assert!(
            said.starts_with("error forwarding port 9 to pod ns/web on node edge-1")
                && said.contains("connection refused"),
            "{said}"
        );
        // A port that is not one, said without asking the node.
        c.open(9, "error", "http", "2").await;
        c.open(11, "data", "http", "2").await;
        let said = c.said(9).await;
        assert!(said.contains("invalid port \"http\""), "{said}");
        // A stream without a request id, or a stream id used twice: reset.
        c.open(13, "data", "8080", "").await;
        assert_eq!(
            c.next().await,
            Frame::RstStream {
                stream: 13,
                status: spdy::status::PROTOCOL_ERROR
            }
        );
        c.open(1, "error", "8080", "3").await;
        assert_eq!(
            c.next().await,
            Frame::RstStream {
                stream: 1,
                status: spdy::status::STREAM_IN_USE
            }
        );
        // Bytes that are not SPDY/3 end the session, saying why.
        c.to.send(vec![0x80, 2, 0, 1, 0, 0, 0, 0])
            .await
            .expect("send");
        assert!(matches!(
            c.next().await,
            Frame::GoAway {
                status: spdy::status::PROTOCOL_ERROR,
                ..
            }
        ));
        tokio::time::timeout(Duration::from_secs(10), session)
            .await
            .expect("the session ends")
            .expect("no panic");
        node.abort();
    }

    #[test]
    fn spdy_asked_either_way_is_served_and_nothing_else() {
        let ws = |protocol| {
            super::super::headers(&[
                ("upgrade", "websocket"),
                ("sec-websocket-key", "a2V5"),
                ("sec-websocket-protocol", protocol),
            ])
        };
        assert_eq!(
            transport(&ws(TUNNELED)),
            Some(Transport::WebSocket(TUNNELED, "a2V5".into()))
        );
        assert_eq!(transport(&ws("v4.channel.k8s.io")), None);
        let spdy = super::super::headers(&[("upgrade", "SPDY/3.1")]);
        assert_eq!(transport(&spdy), None, "no stream protocol");
        let spdy = super::super::headers(&[
            ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", PROTOCOL),
        ]);
        assert_eq!(transport(&spdy), Some(Transport::Spdy));
        assert_eq!(transport(&HeaderMap::new()), None);
    }
}
