//! The streaming tunnel ([`api::tunnel`]): opened by this node beside each session, to the same
//! replica with the same certificate (`{server}/{projectID}/{node}/stream`), so that the cloud
//! can read its pods' logs though the node never listens. The cloud opens streams; each runs
//! as its own task, sends no more than the cloud credited back (a slow `kubectl` slows its own
//! stream, nothing else) and no faster than `streams.bytesPerSecond` for all of them together
//! (the session's twin reports keep the link). A stream ends when its log does, when the cloud
//! closes it, or with the tunnel.

use crate::config::Streams;
use anyhow::{Context, Result};
use api::tunnel::{
    ExecRequest, Frame, Kind, LogRequest, MAX_DATA, Open, Outcome, PortForwardRequest, WINDOW,
};
use futures_util::{SinkExt, StreamExt};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};
use tokio_tungstenite::tungstenite::Message as WsFrame;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::sync::CancellationToken;

/// What the streams read: edged's log directory and pods, when edged runs.
#[derive(Clone)]
pub(crate) struct Services {
    pub node: String,
    pub log_root: Option<PathBuf>,
    pub pods: Option<edged::Pods>,
    /// The container runtime, for `kubectl exec`.
    pub runtime: Option<Arc<edged::Runtime>>,
    pub limits: Streams,
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// Where the tunnel goes, as the session went there.
pub(crate) struct Target {
    pub server: String,
    pub project_id: String,
    pub tls: Arc<tokio_rustls::rustls::ClientConfig>,
}

/// Keeps the tunnel open until `cancel` (the session's end), opening it again after a drop.
pub(crate) async fn run(services: Arc<Services>, target: Target, cancel: CancellationToken) {
    let mut backoff = rt::Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        let r = tokio::select! {
            _ = cancel.cancelled() => return,
            r = once(&services, &target, &cancel) => r,
        };
        match r {
            Ok(why) => {
                tracing::info!(reason = %why, "edgehub: the streaming tunnel closed; opened again");
                backoff.reset();
            }
            Err(e) => tracing::warn!(
                error = format!("{e:#}"),
                "edgehub: cannot open the streaming tunnel (kubectl logs of this node's pods fail until it opens); retrying"
            ),
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}

/// The streams open on one tunnel: each one's end, credit, and where the cloud's data for it
/// goes (a command's stdin).
type OpenStreams = Arc<Mutex<HashMap<u32, OpenStream>>>;

struct OpenStream {
    stop: CancellationToken,
    credit: Arc<Semaphore>,
    inbound: mpsc::Sender<Vec<u8>>,
}

/// Data frames from the cloud that may wait for their stream: the cloud within its credit
/// sends fewer.
const INBOUND: usize = 1024;

async fn once(
    services: &Arc<Services>,
    target: &Target,
    cancel: &CancellationToken,
) -> Result<String> {
    let (authority, host) = super::certserver::host_port(&target.server)?;
    let tcp = tokio::net::TcpStream::connect(&authority)
        .await
        .with_context(|| format!("cannot connect to {}", target.server))?;
    let _ = tcp.set_nodelay(true);
    let tls = tokio_rustls::TlsConnector::from(target.tls.clone())
        .connect(super::certserver::server_name(&host)?, tcp)
        .await
        .context("TLS with cloudhub failed")?;
    let url = format!(
        "{}/{}/{}/stream",
        target.server.trim_end_matches('/'),
        target.project_id,
        services.node
    );
    let mut req = url.as_str().into_client_request()?;
    req.headers_mut()
        .insert("node_id", services.node.parse().context("node name")?);
    let (ws, _) = tokio_tungstenite::client_async(req, tls)
        .await
        .context("websocket handshake of the streaming tunnel failed")?;
    tracing::info!(server = %target.server, "edgehub: streaming tunnel open");
    services.metrics.tunnel_open.store(1, Ordering::Relaxed);
    let _closed = Closed(services.metrics.clone());
    let (mut sink, mut frames) = ws.split();
    let (tx, mut rx) = mpsc::channel::<Frame>(64);
    let streams: OpenStreams = Arc::default();
    let rate = Arc::new(tokio::sync::Mutex::new(rt::ratelimit::Bucket::new(
        services.limits.bytes_per_second.max(MAX_DATA as u32),
        services.limits.bytes_per_second.max(MAX_DATA as u32),
    )));
    let ended = CancellationToken::new();
    let _end_streams = ended.clone().drop_guard();
    let mut ping = tokio::time::interval(Duration::from_secs(15));
    let why = loop {
        tokio::select! {
            _ = cancel.cancelled() => break "the session ended".to_string(),
            _ = ping.tick() => {
                if sink.send(WsFrame::Ping(Vec::new().into())).await.is_err() {
                    break "the cloud stopped reading".into();
                }
            }
            out = rx.recv() => {
                let Some(f) = out else { continue };
                if sink.send(WsFrame::binary(f.encode())).await.is_err() {
                    break "the cloud stopped reading".into();
                }
            }
            f = frames.next() => {
                let bytes = match f {
                    None => break "closed by the cloud".into(),
                    Some(Err(e)) => break format!("read failed: {e}"),
                    Some(Ok(WsFrame::Binary(b))) => b,
                    Some(Ok(WsFrame::Close(_))) => break "closed by the cloud".into(),
                    Some(Ok(_)) => continue,
                };
                let frame = match Frame::decode(&bytes) {
                    Ok(f) => f,
                    Err(e) => {
                        tracing::warn!(error = %e, "edgehub: a tunnel frame from the cloud; skipped");
                        continue;
                    }
                };
                handle(services, frame, &streams, &tx, &rate, &ended);
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), sink.close()).await;
    Ok(why)
}

/// Marks the tunnel closed in the metrics when its connection ends, however it ends.
struct Closed(Arc<crate::metrics::Metrics>);

impl Drop for Closed {
    fn drop(&mut self) {
        self.0.tunnel_open.store(0, Ordering::Relaxed);
    }
}

/// One frame from the cloud.
fn handle(
    services: &Arc<Services>,
    frame: Frame,
    streams: &OpenStreams,
    tx: &mpsc::Sender<Frame>,
    rate: &Arc<tokio::sync::Mutex<rt::ratelimit::Bucket>>,
    ended: &CancellationToken,
) {
    let id = frame.stream;
    match frame.kind {
        Kind::Open => {
            let refuse = |code: u16, message: String| {
                let _ = tx.try_send(Frame::close(id, Some(&Outcome { code, message })));
            };
            let open: Open = match serde_json::from_slice(&frame.payload) {
                Ok(o) => o,
                Err(e) => {
                    return refuse(
                        400,
                        format!("node {}: not a stream this node knows: {e}", services.node),
                    );
                }
            };
            let stop = ended.child_token();
            let credit = Arc::new(Semaphore::new(WINDOW as usize));
            let (inbound_tx, inbound) = mpsc::channel(INBOUND);
            {
                let mut open_now = streams.lock().unwrap_or_else(|e| e.into_inner());
                if open_now.contains_key(&id) {
                    return refuse(400, format!("stream {id} is open already"));
                }
                if open_now.len() >= services.limits.max_streams {
                    services
                        .metrics
                        .streams_refused
                        .fetch_add(1, Ordering::Relaxed);
                    return refuse(
                        429,
                        format!(
                            "node {} has {} streams open (edgecore's cloud.streams.maxStreams); try again when one ends",
                            services.node, services.limits.max_streams
                        ),
                    );
                }
                open_now.insert(
                    id,
                    OpenStream {
                        stop: stop.clone(),
                        credit: credit.clone(),
                        inbound: inbound_tx,
                    },
                );
            }
            services
                .metrics
                .streams_opened
                .fetch_add(1, Ordering::Relaxed);
            services
                .metrics
                .streams_open
                .fetch_add(1, Ordering::Relaxed);
            let out = Out {
                id,
                metrics: services.metrics.clone(),
                tx: tx.clone(),
                credit,
                rate: rate.clone(),
                stop: stop.clone(),
            };
            let (services, streams) = (services.clone(), streams.clone());
            tokio::spawn(async move {
                let outcome = match open {
                    Open::Log(req) => log(&services, req, &out).await,
                    Open::Exec(req) => exec(&services, req, false, &out, inbound).await,
                    Open::Attach(req) => exec(&services, req, true, &out, inbound).await,
                    Open::PortForward(req) => port_forward(&services, req, &out, inbound).await,
                };
                streams
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
                services
                    .metrics
                    .streams_open
                    .fetch_sub(1, Ordering::Relaxed);
                if !out.stop.is_cancelled() {
                    let _ = out.tx.send(Frame::close(id, Some(&outcome))).await;
                }
            });
        }
        Kind::Credit => {
            if let Some(OpenStream { credit, .. }) =
                streams.lock().unwrap_or_else(|e| e.into_inner()).get(&id)
            {
                // Never more than a few windows: a cloud that credits too much cannot overflow.
                let n = api::tunnel::creditable(frame.credited(), credit.available_permits());
                credit.add_permits(n);
            }
        }
        Kind::Close => {
            if let Some(s) = streams
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id)
            {
                s.stop.cancel();
            }
        }
        Kind::Data => {
            let mut open_now = streams.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = open_now.get(&id)
                && s.inbound.try_send(frame.payload).is_err()
            {
                // Beyond the credit the cloud was given (or its stream takes none): closed.
                tracing::warn!(
                    stream = id,
                    "edgehub: the cloud sent a stream more than it may; closed"
                );
                if let Some(s) = open_now.remove(&id) {
                    s.stop.cancel();
                }
                let _ = tx.try_send(Frame::close(
                    id,
                    Some(&Outcome {
                        code: 400,
                        message: "the cloud sent beyond its credit".into(),
                    }),
                ));
            }
        }
        Kind::Ready => {}
    }
}

/// A stream's way up: its frames, within its credit and the tunnel's rate.
struct Out {
    id: u32,
    metrics: Arc<crate::metrics::Metrics>,
    tx: mpsc::Sender<Frame>,
    credit: Arc<Semaphore>,
    rate: Arc<tokio::sync::Mutex<rt::ratelimit::Bucket>>,
    stop: CancellationToken,
}

impl Out {
    /// Sends `bytes` as data frames; false once the stream is closed.
    async fn data(&self, bytes: &[u8]) -> bool {
        for chunk in bytes.chunks(MAX_DATA) {
            let n = chunk.len() as u32;
            let granted = tokio::select! {
                _ = self.stop.cancelled() => return false,
                p = self.credit.acquire_many(n) => p,
            };
            match granted {
                Ok(p) => p.forget(),
                Err(_) => return false,
            }
            let wait = self.rate.lock().await.reserve_n(n);
            tokio::select! {
                _ = self.stop.cancelled() => return false,
                _ = tokio::time::sleep(wait) => {}
            }
            self.metrics
                .stream_bytes
                .fetch_add(u64::from(n), Ordering::Relaxed);
            let frame = Frame::new(self.id, Kind::Data, chunk.to_vec());
            tokio::select! {
                _ = self.stop.cancelled() => return false,
                r = self.tx.send(frame) => if r.is_err() { return false },
            }
        }
        true
    }

    async fn ready(&self) -> bool {
        self.tx
            .send(Frame::new(self.id, Kind::Ready, Vec::new()))
            .await
            .is_ok()
    }
}

fn done() -> Outcome {
    Outcome {
        code: 200,
        message: String::new(),
    }
}

/// A container's log, as the cloud asked it.
async fn log(services: &Services, req: LogRequest, out: &Out) -> Outcome {
    let node = &services.node;
    let Some(root) = services.log_root.clone() else {
        return Outcome {
            code: 404,
            message: format!("node {node} runs no pods (edged is not enabled in its config)"),
        };
    };
    let options = edged::logs::Options {
        container: req.container.clone(),
        previous: req.previous,
        tail: req
            .tail_lines
            .map(|t| usize::try_from(t).unwrap_or(usize::MAX)),
        since_nanos: req.since_nanos,
        timestamps: req.timestamps,
    };
    let (ns, pod, uid) = (req.namespace.clone(), req.pod.clone(), req.uid.clone());
    // The log is read on a blocking thread and comes here in pieces (two waiting at most), so
    // a large log is never whole in memory.
    enum Read {
        Text(Vec<u8>),
        Done(Result<edged::logs::Follower, (u16, String)>),
    }
    let (tx, mut pieces) = mpsc::channel::<Read>(2);
    tokio::task::spawn_blocking(move || {
        let piece_tx = tx.clone();
        let r = edged::logs::open_with(&root, &ns, &pod, Some(uid.as_str()), &options, &mut |t| {
            piece_tx.blocking_send(Read::Text(t)).is_ok()
        });
        let _ = tx.blocking_send(Read::Done(r));
    });
    // `limitBytes`: what is left of it.
    let mut left = req.limit_bytes.unwrap_or(u64::MAX);
    let mut ready = false;
    let mut follower = loop {
        let next = tokio::select! {
            _ = out.stop.cancelled() => return done(),
            n = pieces.recv() => n,
        };
        match next {
            Some(Read::Done(Ok(f))) => break f,
            Some(Read::Done(Err((code, message)))) => {
                return Outcome {
                    code,
                    message: format!("node {node}: {message}"),
                };
            }
            None => {
                return Outcome {
                    code: 500,
                    message: format!("node {node}: reading the log failed"),
                };
            }
            Some(Read::Text(t)) => {
                if !ready {
                    ready = true;
                    if !out.ready().await {
                        return done();
                    }
                }
                if !out.data(within(&t, &mut left)).await || left == 0 {
                    return done();
                }
            }
        }
    };
    if !ready && !out.ready().await {
        return done();
    }
    if !req.follow {
        return done();
    }
    let container = req.container.clone();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    // Once the container is no longer running, what it wrote is read out and the stream ends.
    let mut last_look = false;
    loop {
        tokio::select! {
            _ = out.stop.cancelled() => return done(),
            _ = tick.tick() => {}
        }
        if !last_look
            && let Some(pods) = &services.pods
            && !running(pods, &req.namespace, &req.pod, container.as_deref())
        {
            last_look = true;
        }
        match follower.poll() {
            edged::logs::Followed::Text(t) => {
                if !out.data(within(&t, &mut left)).await || left == 0 {
                    return done();
                }
            }
            edged::logs::Followed::Nothing if last_look => return done(),
            edged::logs::Followed::Nothing => {}
            edged::logs::Followed::Ended => return done(),
        }
    }
}

/// A command in a container (or, `attach`, the container's own process), through the
/// runtime's streaming server: its channel-protocol messages relayed both ways as they are
/// (`v5.channel.k8s.io` when the runtime knows it, else `v4`), stdin credited back to the cloud
/// as it is written.
async fn exec(
    services: &Services,
    req: ExecRequest,
    attach: bool,
    out: &Out,
    mut inbound: mpsc::Receiver<Vec<u8>>,
) -> Outcome {
    let fail = |code: u16, message: String| services.fail(code, message);
    let (runtime, pod) = match services.pod(&req.namespace, &req.pod) {
        Ok(p) => p,
        Err(o) => return o,
    };
    let Some(c) = pod.containers.iter().find(|c| c.name == req.container) else {
        return fail(
            404,
            format!(
                "pod {}/{} has no container {}",
                req.namespace, req.pod, req.container
            ),
        );
    };
    if c.state != "running" || c.container_id.is_empty() {
        let why = [c.state.as_str(), c.reason.as_str()]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(": ");
        return fail(
            400,
            format!(
                "container {} of pod {}/{} is not running ({why})",
                req.container, req.namespace, req.pod
            ),
        );
    }
    let streams = (req.tty, req.stdin, req.stdout, req.stderr);
    let url = if attach {
        runtime.attach(&c.container_id, streams).await
    } else {
        runtime.exec(&c.container_id, &req.command, streams).await
    };
    let url = match url {
        Ok(u) => u,
        Err(e) => return fail(500, e.to_string()),
    };
    // v5 can say that the client closed stdin; a runtime that knows only v4 picks v4.
    let (ws, v5) = match runtime_socket(&url, "v5.channel.k8s.io, v4.channel.k8s.io").await {
        Ok((ws, chosen)) => (ws, chosen.as_deref() == Some("v5.channel.k8s.io")),
        Err((code, message)) => return fail(code, message),
    };
    if !out.ready().await {
        return done();
    }
    let (mut sink, mut from_runtime) = ws.split();
    loop {
        tokio::select! {
            _ = out.stop.cancelled() => {
                let _ = sink.close().await;
                return done();
            }
            m = from_runtime.next() => match m {
                Some(Ok(WsFrame::Binary(b))) => {
                    for part in api::tunnel::channel_chunks(&b) {
                        if !out.data(&part).await {
                            let _ = sink.close().await;
                            return done();
                        }
                    }
                }
                Some(Ok(WsFrame::Close(_))) | None => return done(),
                Some(Ok(_)) => {}
                Some(Err(e)) => return fail(502, format!("the runtime's stream broke: {e}")),
            },
            d = inbound.recv() => {
                let Some(d) = d else { return done() };
                let n = u32::try_from(d.len()).unwrap_or(WINDOW);
                // 255: the client closed stdin (v5.channel.k8s.io); passed on when the
                // runtime speaks v5 too (v4 cannot say it: a command reading to the end of its
                // input keeps waiting).
                if (v5 || d.first() != Some(&255)) && sink.send(WsFrame::binary(d)).await.is_err() {
                    return fail(502, "the runtime's stream closed".into());
                }
                if n > 0 && out.tx.send(Frame::credit(out.id, n)).await.is_err() {
                    return done();
                }
            }
        }
    }
}

type RuntimeSocket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// A websocket to the runtime's streaming server at `url` (plain HTTP on this host:
/// containerd's `stream_server_address`) offering `protocols`, and the protocol it chose; or
/// why not, as a status and a message.
async fn runtime_socket(
    url: &str,
    protocols: &'static str,
) -> Result<(RuntimeSocket, Option<String>), (u16, String)> {
    let ws_url = url
        .replacen("http://", "ws://", 1)
        .replacen("https://", "wss://", 1);
    let mut request = ws_url
        .as_str()
        .into_client_request()
        .map_err(|e| (500, format!("the runtime's streaming URL {url:?}: {e}")))?;
    request.headers_mut().insert(
        "sec-websocket-protocol",
        tokio_tungstenite::tungstenite::http::HeaderValue::from_static(protocols),
    );
    let authority = request
        .uri()
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let connect = async {
        let tcp = tokio::net::TcpStream::connect(&authority)
            .await
            .map_err(|e| format!("{authority}: {e}"))?;
        tokio_tungstenite::client_async(request, tcp)
            .await
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok((ws, resp))) => {
            let chosen = resp
                .headers()
                .get("sec-websocket-protocol")
                .and_then(|p| p.to_str().ok())
                .map(str::to_string);
            Ok((ws, chosen))
        }
        Ok(Err(e)) => Err((500, format!("the runtime's streaming server: {e}"))),
        Err(_) => Err((
            504,
            "the runtime's streaming server did not answer within 10 s".into(),
        )),
    }
}

/// A connection to a port in the pod's network, made by the runtime (CRI `PortForward`, its
/// streaming server's websocket with the channel protocol: channel 0 the connection's bytes,
/// channel 1 the runtime's error, each starting with the port, two bytes little-endian).
async fn port_forward(
    services: &Services,
    req: PortForwardRequest,
    out: &Out,
    mut inbound: mpsc::Receiver<Vec<u8>>,
) -> Outcome {
    let fail = |code: u16, message: String| services.fail(code, message);
    let (runtime, pod) = match services.pod(&req.namespace, &req.pod) {
        Ok(p) => p,
        Err(o) => return o,
    };
    let url = match runtime.port_forward(&pod.sandbox_id, req.port).await {
        Ok(u) => u,
        Err(e) => return fail(500, e.to_string()),
    };
    let (ws, _) = match runtime_socket(&url, "v4.channel.k8s.io").await {
        Ok(w) => w,
        Err((code, message)) => return fail(code, message),
    };
    if !out.ready().await {
        return done();
    }
    let (mut sink, mut from_runtime) = ws.split();
    // Each channel's first message is its port.
    let mut port_said = [false; 2];
    let mut error = Vec::new();
    loop {
        tokio::select! {
            _ = out.stop.cancelled() => {
                let _ = sink.close().await;
                return done();
            }
            m = from_runtime.next() => match m {
                Some(Ok(WsFrame::Binary(b))) => {
                    let Some((&channel, mut rest)) = b.split_first() else { continue };
                    let Some(said) = port_said.get_mut(usize::from(channel)) else { continue };
                    if !*said {
                        *said = true;
                        rest = rest.get(2..).unwrap_or_default();
                    }
                    if channel == 1 {
                        // Bounded: a message, not a stream.
                        let room = 4096usize.saturating_sub(error.len());
                        error.extend_from_slice(&rest[..rest.len().min(room)]);
                    } else if !rest.is_empty() && !out.data(rest).await {
                        let _ = sink.close().await;
                        return done();
                    }
                }
                Some(Ok(WsFrame::Close(_))) | None => break,
                Some(Ok(_)) => {}
                Some(Err(e)) => return fail(502, format!("the runtime's stream broke: {e}")),
            },
            d = inbound.recv() => {
                let Some(d) = d else { return done() };
                let n = u32::try_from(d.len()).unwrap_or(WINDOW);
                let mut m = Vec::with_capacity(d.len() + 1);
                m.push(0u8);
                m.extend_from_slice(&d);
                if sink.send(WsFrame::binary(m)).await.is_err() {
                    return fail(502, "the runtime's stream closed".into());
                }
                if n > 0 && out.tx.send(Frame::credit(out.id, n)).await.is_err() {
                    return done();
                }
            }
        }
    }
    if error.is_empty() {
        done()
    } else {
        fail(500, String::from_utf8_lossy(&error).trim().to_string())
    }
}

impl Services {
    /// An outcome naming this node.
    fn fail(&self, code: u16, message: String) -> Outcome {
        Outcome {
            code,
            message: format!("node {}: {message}", self.node),
        }
    }

    /// The runtime and the pod `ns/name` as edged runs it here (its sandbox made), or why not.
    fn pod(&self, ns: &str, name: &str) -> Result<(&edged::Runtime, edged::PodView), Outcome> {
        let (Some(runtime), Some(pods)) = (&self.runtime, &self.pods) else {
            return Err(self.fail(
                404,
                "it runs no pods (edged is not enabled in its config)".into(),
            ));
        };
        pods.list()
            .pods
            .into_iter()
            .find(|p| p.namespace == ns && p.name == name && !p.sandbox_id.is_empty())
            .map(|p| (runtime.as_ref(), p))
            .ok_or_else(|| self.fail(404, format!("pod {ns}/{name} does not run here")))
    }
}

/// The part of `text` within `left` bytes, taken from it.
fn within<'a>(text: &'a [u8], left: &mut u64) -> &'a [u8] {
    let take = usize::try_from(*left).unwrap_or(usize::MAX).min(text.len());
    *left -= take as u64;
    &text[..take]
}

/// Whether the pod's container (its only one when not named) runs now, as edged last saw it.
fn running(pods: &edged::Pods, ns: &str, pod: &str, container: Option<&str>) -> bool {
    let list = pods.list();
    let Some(p) = list
        .pods
        .iter()
        .find(|p| p.namespace == ns && p.name == pod)
    else {
        return false;
    };
    p.containers
        .iter()
        .filter(|c| container.is_none_or(|n| c.name == n))
        .any(|c| c.state == "running")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `limitBytes` across the log's pieces: each piece is cut where the limit ends, and
    /// nothing after it is taken.
    #[test]
    fn a_log_is_cut_at_its_limit_across_pieces() {
        let mut left = 10u64;
        assert_eq!(within(b"abcdef", &mut left), b"abcdef");
        assert_eq!(within(b"ghijkl", &mut left), b"ghij");
        assert_eq!(left, 0);
        assert_eq!(within(b"mno", &mut left), b"");
        let mut all = u64::MAX;
        assert_eq!(within(b"xyz", &mut all), b"xyz");
    }
}
