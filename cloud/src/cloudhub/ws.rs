//! The websocket server of cloudhub and the `Node` objects of connected nodes.

use super::CloudHub;
use api::message::Message;
use futures_util::{SinkExt, StreamExt};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Message as Frame, http};
use tokio_util::sync::CancellationToken;

/// Accepts sessions until `stop`.
pub(crate) async fn serve(
    hub: Arc<CloudHub>,
    listener: TcpListener,
    tls: TlsAcceptor,
    client: kube::Client,
    stop: CancellationToken,
) {
    let nodes = NodeStatus::start(client, hub.settings.replica.clone(), stop.clone());
    let revocations = hub.settings.joins.changes();
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => match a {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: wait, then go on accepting.
                    tracing::warn!(error = %e, "cloudhub: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let (hub, tls, nodes, stop) = (hub.clone(), tls.clone(), nodes.clone(), stop.clone());
        let revocations = revocations.clone();
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(Duration::from_secs(10), tls.accept(tcp)).await
            {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::info!(%peer, error = %e, "cloudhub: TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::info!(%peer, "cloudhub: TLS handshake timed out");
                    return;
                }
            };
            let cert = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.to_vec())
                .unwrap_or_default();
            let cn = pki::common_name(&cert).unwrap_or_default();
            let serial = pki::serial_and_expiry(&cert).map(|(s, _)| s);
            if let Some(s) = &serial
                && hub.settings.joins.is_revoked(s).unwrap_or(true)
            {
                hub.metrics
                    .sessions_refused
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(%peer, %cn, serial = %s, "cloudhub: a revoked certificate; refused");
                return;
            }
            session(hub, stream, (cn, serial), peer, nodes, stop, revocations).await;
        });
    }
}

/// What a connection is for: the node's session, or its streaming tunnel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    Events,
    Stream,
}

/// The node a handshake names: path `/{projectID}/{node}/events` (its session) or
/// `/{projectID}/{node}/stream` (its streaming tunnel), header `node_id` equal to it, and the
/// client certificate's `CN=system:node:{node}`.
fn check_handshake(req: &Request, cn: &str) -> Result<(String, Purpose), HandshakeError> {
    let parts: Vec<&str> = req.uri().path().trim_matches('/').split('/').collect();
    let (node, purpose) = match parts.as_slice() {
        [_project, node, "events"] if !node.is_empty() => (node.to_string(), Purpose::Events),
        [_project, node, "stream"] if !node.is_empty() => (node.to_string(), Purpose::Stream),
        _ => return Err(HandshakeError::Path(req.uri().path().into())),
    };
    let header = req
        .headers()
        .get("node_id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if header != node {
        return Err(HandshakeError::NodeHeader {
            header: header.into(),
            node,
        });
    }
    if cn != format!("system:node:{node}") {
        return Err(HandshakeError::Certificate {
            cn: cn.into(),
            node,
        });
    }
    Ok((node, purpose))
}

/// A websocket handshake that is refused (403, with this text).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum HandshakeError {
    #[error("path {0} is not /{{projectID}}/{{nodeName}}/events (or /stream)")]
    Path(String),
    #[error("header node_id {header:?} does not match the path's node {node:?}")]
    NodeHeader { header: String, node: String },
    #[error("the client certificate is {cn:?}, not system:node:{node}")]
    Certificate { cn: String, node: String },
}

/// One node's session. `(cn, serial)`: its certificate's common name and serial number; the
/// session ends as soon as that certificate is revoked (`revocations` counts the changes).
async fn session(
    hub: Arc<CloudHub>,
    stream: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    (cn, serial): (String, Option<String>),
    peer: std::net::SocketAddr,
    nodes: Arc<NodeStatus>,
    stop: CancellationToken,
    revocations: tokio::sync::watch::Receiver<u64>,
) {
    let named: Arc<Mutex<Option<(String, Purpose)>>> = Arc::default();
    let slot = named.clone();
    // tungstenite's callback type: its error is a whole HTTP response.
    #[allow(clippy::result_large_err)]
    let callback = move |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
        match check_handshake(req, &cn) {
            Ok(node) => {
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(node);
                Ok(resp)
            }
            Err(why) => {
                tracing::warn!(%peer, reason = %why, "cloudhub: connection refused");
                let mut r = ErrorResponse::new(Some(why.to_string()));
                *r.status_mut() = http::StatusCode::FORBIDDEN;
                Err(r)
            }
        }
    };
    // tungstenite reads into a 128 KiB buffer per connection by default and buffers as much
    // for writes: most of an idle session's memory. Messages are small; the buffers grow for a
    // large one and shrink back.
    let config = WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0)
        .max_message_size(Some(hub.settings.max_frame_bytes))
        .max_frame_size(Some(hub.settings.max_frame_bytes));
    let ws = match tokio::time::timeout(
        Duration::from_secs(10),
        tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(config)),
    )
    .await
    {
        Ok(Ok(ws)) => ws,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "cloudhub: websocket handshake failed");
            return;
        }
        Err(_) => return,
    };
    let Some((node, purpose)) = named.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return;
    };
    if purpose == Purpose::Stream {
        return tunnel(hub, ws, node, serial, stop, revocations).await;
    }
    let (mut sink, mut frames) = ws.split();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(256);
    let end = CancellationToken::new();
    let Some(id) = hub.attach(&node, tx, end.clone()) else {
        tracing::warn!(%node, limit = hub.settings.node_limit, "cloudhub: node limit reached; session refused");
        let _ = sink
            .send(Frame::Close(Some(
                tokio_tungstenite::tungstenite::protocol::CloseFrame {
                    code: tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode::Again,
                    reason: "node limit reached".into(),
                },
            )))
            .await;
        return;
    };
    tracing::info!(%node, %peer, "cloudhub: node connected");
    nodes.set(&node, NodeChange::Connected);
    let connected_at = k8s_openapi::jiff::Timestamp::now();
    let writer_end = end.clone();
    // A node that stops reading: its socket fills, a write waits; after `keepalive` the session
    // ends (its unacknowledged messages stay queued for its next session), instead of holding
    // the connection and the frames queued for it for good.
    let stalled = CancellationToken::new();
    let writer_stalled = stalled.clone();
    let write_limit = hub.settings.keepalive;
    let writer = tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = writer_end.cancelled() => break,
                t = rx.recv() => match t {
                    Some(t) => match tokio::time::timeout(write_limit, sink.send(Frame::text(t))).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => break,
                        Err(_) => {
                            writer_stalled.cancel();
                            return;
                        }
                    },
                    None => break,
                },
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), sink.close()).await;
    });
    // What costs the cloud work (reports, pod status) is handled by a task of its own, at the
    // node's rate: the socket is read on meanwhile, so that the node's answers to the cloud's
    // messages (which open its window) never wait behind its reports. A node that sends more
    // than `WORK_QUEUE` unanswered reports (edgecore sends at most its window) is read no
    // faster than they are handled.
    let (work_tx, mut work_rx) = tokio::sync::mpsc::channel::<Message>(WORK_QUEUE);
    let worker = {
        let (hub, node) = (hub.clone(), node.clone());
        tokio::spawn(async move {
            let mut bucket =
                rt::ratelimit::Bucket::new(hub.settings.node_qps, hub.settings.node_burst);
            while let Some(msg) = work_rx.recv().await {
                bucket.take().await;
                hub.received(&node, msg).await;
            }
        })
    };
    // The Node's heartbeat (its Ready condition's time) while frames come; silence for
    // `keepalive` (no frame of any kind from the node) ends the session.
    let mut heartbeat = tokio::time::interval(Duration::from_secs(30));
    heartbeat.tick().await;
    let mut silence = Silence::new(hub.settings.keepalive, tokio::time::Instant::now());
    let book = hub.settings.joins.clone();
    let revoked = book.until_revoked(serial.as_deref(), revocations);
    tokio::pin!(revoked);
    let mut bad_frames = rt::ratelimit::Quiet::new(std::time::Duration::from_secs(10));
    let why = loop {
        let next = tokio::select! {
            _ = stop.cancelled() => break "cloudcore stops".to_string(),
            _ = &mut revoked => {
                hub.metrics.sessions_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                break "its certificate was revoked (cloudcore node revoke)".to_string();
            }
            _ = end.cancelled() => break "replaced by a newer connection".to_string(),
            _ = stalled.cancelled() => {
                hub.metrics.stalled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                break format!("stopped reading: a frame waited {:?} to be written", hub.settings.keepalive);
            }
            _ = heartbeat.tick() => {
                nodes.set(&node, NodeChange::Beat(connected_at));
                continue;
            }
            _ = tokio::time::sleep_until(silence.deadline()) => {
                hub.metrics.silent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                break format!("silent for {:?} (no frame from the node)", hub.settings.keepalive);
            }
            f = frames.next() => f,
        };
        let frame = match next {
            None => break "closed by the node".to_string(),
            Some(Err(e)) => break format!("read failed: {e}"),
            Some(Ok(f)) => f,
        };
        silence.heard(tokio::time::Instant::now());
        let data = match frame {
            Frame::Text(t) => t.as_bytes().to_vec(),
            Frame::Binary(b) => b.to_vec(),
            Frame::Close(_) => break "closed by the node".to_string(),
            _ => continue,
        };
        hub.metrics
            .frames_in
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let msg: Message = match serde_json::from_slice(&data) {
            Ok(m) => m,
            Err(e) => {
                hub.metrics
                    .bad_frames
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Some(skipped) = bad_frames.note() {
                    tracing::warn!(%node, error = %e, bytes = data.len(), skipped, "cloudhub: a frame is not a message; skipped (one line per 10 s: cloudhub_bad_frames counts them all)");
                }
                continue;
            }
        };
        // What costs the cloud work waits for the node's rate; answers and keepalives do not
        // (an answer frees the node's window, and holding it back would stall both ways).
        if super::metered(&msg) {
            if work_tx.send(msg).await.is_err() {
                break "its work queue closed".to_string();
            }
        } else {
            hub.received(&node, msg).await;
        }
    };
    end.cancel();
    // Reports not handled yet are not answered: the node sends them again.
    worker.abort();
    let _ = writer.await;
    if hub.detach(&node, id) {
        tracing::info!(%node, reason = %why, "cloudhub: node disconnected");
        nodes.set(&node, NodeChange::Lost);
        hub.node_lost(&node);
    } else {
        tracing::info!(%node, reason = %why, "cloudhub: an older session ended");
    }
}

/// A node's reports read and waiting to be handled, at most.
const WORK_QUEUE: usize = 1024;

/// When a session is silent: `keepalive` after the last frame the node sent, of any kind (its
/// keepalive message, a websocket ping, a report, an answer). The cloud's own heartbeat of the
/// Node is not a frame from the node and does not count.
#[derive(Debug, Clone, Copy)]
struct Silence {
    keepalive: Duration,
    last: tokio::time::Instant,
}

impl Silence {
    fn new(keepalive: Duration, now: tokio::time::Instant) -> Self {
        Self {
            keepalive,
            last: now,
        }
    }

    fn heard(&mut self, now: tokio::time::Instant) {
        self.last = now;
    }

    fn deadline(&self) -> tokio::time::Instant {
        self.last + self.keepalive
    }
}

/// A node's streaming tunnel: frames from the node to their streams, frames of the streams to
/// the node. It ends as the session does (revoked certificate, silence, a newer tunnel).
async fn tunnel(
    hub: Arc<CloudHub>,
    ws: tokio_tungstenite::WebSocketStream<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>,
    node: String,
    serial: Option<String>,
    stop: CancellationToken,
    revocations: tokio::sync::watch::Receiver<u64>,
) {
    let (mut sink, mut frames) = ws.split();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<api::tunnel::Frame>(256);
    let t = hub.tunnels.attach(&node, tx);
    tracing::info!(%node, "cloudhub: streaming tunnel open");
    let end = t.end.clone();
    let write_limit = hub.settings.keepalive;
    let writer_end = end.clone();
    let writer = tokio::spawn(async move {
        loop {
            let f = tokio::select! {
                _ = writer_end.cancelled() => break,
                f = rx.recv() => f,
            };
            let Some(f) = f else { break };
            match tokio::time::timeout(write_limit, sink.send(Frame::binary(f.encode()))).await {
                Ok(Ok(())) => {}
                _ => break,
            }
        }
        writer_end.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), sink.close()).await;
    });
    let revoked = hub
        .settings
        .joins
        .until_revoked(serial.as_deref(), revocations);
    tokio::pin!(revoked);
    let mut bad_frames = rt::ratelimit::Quiet::new(std::time::Duration::from_secs(10));
    let why = loop {
        let next = tokio::select! {
            _ = stop.cancelled() => break "cloudcore stops".to_string(),
            _ = &mut revoked => break "its certificate was revoked".to_string(),
            _ = end.cancelled() => break "replaced by a newer tunnel, or the node stopped reading".to_string(),
            f = tokio::time::timeout(hub.settings.keepalive, frames.next()) => f,
        };
        let bytes = match next {
            Err(_) => break format!("silent for {:?}", hub.settings.keepalive),
            Ok(None) | Ok(Some(Ok(Frame::Close(_)))) => break "closed by the node".to_string(),
            Ok(Some(Err(e))) => break format!("read failed: {e}"),
            Ok(Some(Ok(Frame::Binary(b)))) => b,
            Ok(Some(Ok(_))) => continue,
        };
        match api::tunnel::Frame::decode(&bytes) {
            Ok(f) => hub.tunnels.deliver(&t, &node, f),
            Err(e) => {
                hub.metrics
                    .bad_frames
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Some(skipped) = bad_frames.note() {
                    tracing::warn!(%node, error = %e, skipped, "cloudhub: a tunnel frame that is not one; skipped (one line per 10 s: cloudhub_bad_frames counts them all)");
                }
            }
        }
    };
    end.cancel();
    let _ = writer.await;
    hub.tunnels.detach(&node, t.id);
    tracing::info!(%node, reason = %why, "cloudhub: streaming tunnel closed");
}

/// What a node's `Node` object is to say.
#[derive(Clone, Copy, Debug, PartialEq)]
enum NodeChange {
    /// A session began: the Node made if it is not, named on this replica, Ready.
    Connected,
    /// Still connected (since the session began): the Ready condition's time only.
    Beat(k8s_openapi::jiff::Timestamp),
    /// The session ended.
    Lost,
}

/// The `Node` objects' Ready condition, written by a few workers from a map of the newest
/// state per node: a reconnect storm of thousands of nodes is as many entries, not as many
/// concurrent API requests (each with its connection and buffers).
struct NodeStatus {
    pending: Mutex<std::collections::BTreeMap<String, NodeChange>>,
    wake: tokio::sync::Notify,
}

impl NodeStatus {
    const WORKERS: usize = 4;

    fn start(client: kube::Client, replica: Option<String>, stop: CancellationToken) -> Arc<Self> {
        let me = Arc::new(Self {
            pending: Mutex::default(),
            wake: tokio::sync::Notify::new(),
        });
        for _ in 0..Self::WORKERS {
            let (me, client, stop) = (me.clone(), client.clone(), stop.clone());
            let replica = replica.clone();
            tokio::spawn(async move {
                loop {
                    let next = me
                        .pending
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .pop_first();
                    let replica = replica.as_deref();
                    match next {
                        Some((node, NodeChange::Beat(since))) => {
                            let since = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(since);
                            crate::edgecontroller::heartbeat(&client, &node, &since, replica).await
                        }
                        Some((node, change)) => {
                            let ready = change == NodeChange::Connected;
                            crate::edgecontroller::set_ready(&client, &node, ready, replica).await
                        }
                        None => tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = me.wake.notified() => {}
                        },
                    }
                }
            });
        }
        me
    }

    fn set(&self, node: &str, change: NodeChange) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        // A heartbeat does not replace a start not yet written.
        if matches!(change, NodeChange::Beat(_))
            && pending.get(node) == Some(&NodeChange::Connected)
        {
            return;
        }
        pending.insert(node.to_string(), change);
        drop(pending);
        self.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str, node_id: &str) -> Request {
        http::Request::builder()
            .uri(path)
            .header("node_id", node_id)
            .body(())
            .expect("request")
    }

    /// The silence deadline moves only with the node's frames: ticks of the cloud's own
    /// heartbeat between them do not push it (the fault was a 30 s heartbeat that rebuilt a
    /// 30 s read timeout, so that a frozen node never went silent).
    #[tokio::test(start_paused = true)]
    async fn a_node_silent_for_keepalive_is_silent_whatever_ticks_meanwhile() {
        let keepalive = Duration::from_secs(30);
        let t0 = tokio::time::Instant::now();
        let mut s = Silence::new(keepalive, t0);
        let mut heartbeat = tokio::time::interval(Duration::from_secs(10));
        heartbeat.tick().await;
        tokio::time::advance(Duration::from_secs(12)).await;
        s.heard(tokio::time::Instant::now());
        let frozen_at = tokio::time::Instant::now();
        // The node freezes; the cloud's heartbeat goes on ticking.
        let silent = tokio::select! {
            _ = async { loop { heartbeat.tick().await; } } => unreachable!(),
            _ = tokio::time::sleep_until(s.deadline()) => tokio::time::Instant::now(),
        };
        assert_eq!(silent - frozen_at, keepalive);
        assert_eq!(silent - t0, Duration::from_secs(42));
    }

    #[test]
    fn a_heartbeat_waits_behind_a_start_not_yet_written_and_a_loss_replaces_both() {
        let s = NodeStatus {
            pending: Mutex::default(),
            wake: tokio::sync::Notify::new(),
        };
        let t = k8s_openapi::jiff::Timestamp::UNIX_EPOCH;
        let now = |s: &NodeStatus| s.pending.lock().expect("lock").get("n1").copied();
        s.set("n1", NodeChange::Connected);
        s.set("n1", NodeChange::Beat(t));
        assert_eq!(
            now(&s),
            Some(NodeChange::Connected),
            "the Node is made first"
        );
        s.set("n1", NodeChange::Lost);
        assert_eq!(now(&s), Some(NodeChange::Lost));
        s.set("n1", NodeChange::Beat(t));
        assert_eq!(now(&s), Some(NodeChange::Beat(t)), "connected again since");
    }

    #[test]
    fn handshakes_name_their_node_three_ways_or_are_refused() {
        let ok = req("/e632aba927ea4ac2b575ec1603d56f10/edge-1/events", "edge-1");
        assert_eq!(
            check_handshake(&ok, "system:node:edge-1"),
            Ok(("edge-1".into(), Purpose::Events))
        );
        let tunnel = req("/e632aba927ea4ac2b575ec1603d56f10/edge-1/stream", "edge-1");
        assert_eq!(
            check_handshake(&tunnel, "system:node:edge-1"),
            Ok(("edge-1".into(), Purpose::Stream))
        );
        assert!(check_handshake(&tunnel, "system:node:edge-2").is_err());
        let err = check_handshake(&ok, "system:node:edge-2").expect_err("refused");
        assert_eq!(
            err.to_string(),
            "the client certificate is \"system:node:edge-2\", not system:node:edge-1"
        );
        let err = check_handshake(&req("/p/edge-1/events", "edge-2"), "system:node:edge-1")
            .expect_err("refused");
        assert!(err.to_string().contains("node_id"), "{err}");
        let err = check_handshake(&req("/edge-1/events", "edge-1"), "system:node:edge-1")
            .expect_err("refused");
        assert_eq!(
            err.to_string(),
            "path /edge-1/events is not /{projectID}/{nodeName}/events (or /stream)"
        );
    }
}
