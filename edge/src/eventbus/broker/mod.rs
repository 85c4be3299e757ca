//! The embedded MQTT broker: MQTT 3.1.1 over TCP on loopback, enough for the `$hw` API of one
//! gateway and its apps without installing anything.
//!
//! Why not rumqttd: it refuses every subscription whose filter starts with `$` (other than
//! `$share`), so neither edgecore nor a KubeEdge app could subscribe to `$hw/events/...`.
//!
//! What it does: CONNECT with clean sessions, SUBSCRIBE/UNSUBSCRIBE with `+` and `#` (which, as
//! MQTT requires, do not match `$` topics at the first level), PUBLISH at QoS 0 and 1 (QoS 2 is
//! accepted and delivered at most at QoS 1), retained messages, PINGREQ, and the last will of a
//! client that drops; users of a Mosquitto password file and topics of a Mosquitto ACL file
//! (`auth`), applied in [`session`]; a TLS listener beside the plain one, client certificates
//! optionally being users ([`TlsListener`]). No persistent sessions: for those, run a full
//! broker and set `mqtt.mode: external`. Packets are parsed by rumqttc's MQTT codec; a client
//! that sends a malformed packet is disconnected, never the broker.
//!
//! This module is the IO: listeners, the accept loop, and per client a pump that reads
//! packets, asks its [`session::Session`] what to do, and does it, and a writer task. Every
//! decision (login, ACL, subscriptions, acknowledgements, the will) is in `session`.

mod routing;
mod session;
mod tree;
mod wire;

use bytes::BytesMut;
use routing::{Client, Fate, Routing};
use rumqttc::{ConnAck, ConnectReturnCode, Packet, Publish, QoS};
use session::{Disconnect, Out, Session};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use wire::{ack_handle, encode, read_packet, write_out};

/// Errors of starting the embedded broker.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BrokerError {
    #[error("embedded MQTT broker cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("mqtt.tls.{key}: cannot read {}: {source}", path.display())]
    TlsFile {
        key: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("mqtt.tls: {0}")]
    Tls(#[from] pki::tls::TlsError),
    #[error("mqtt.tls.address {address}: {why}")]
    TlsAddress { address: String, why: String },
}

/// Largest MQTT packet accepted and sent (a whole twin document fits).
pub(crate) const MAX_PAYLOAD: usize = 2 * 1024 * 1024;

/// What one client may hold of the broker, with Mosquitto's names and defaults where they fit
/// (`max_queued_messages` 1000, `max_inflight_messages` 20; Mosquitto's `max_queued_bytes` is
/// unlimited by default, ours is 16 MiB so that a stalled client cannot pin unbounded memory).
#[derive(Clone, Debug)]
pub(crate) struct Limits {
    /// Clients served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// Messages queued for one client. Beyond it (or beyond `max_queued_bytes`) a QoS 0
    /// message is dropped for that client, and a client whose QoS 1 queue overflows is
    /// disconnected: it is not keeping up, and dropping QoS 1 silently would break its promise.
    pub max_queued_messages: usize,
    pub max_queued_bytes: usize,
    /// QoS 1 messages sent to one client and not yet acknowledged.
    pub max_inflight_messages: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_queued_messages: 1000,
            max_queued_bytes: 16 << 20,
            max_inflight_messages: 20,
        }
    }
}

/// The queue of edgecore's own in-process client ([`Broker::link`]); its reader keeps a window
/// of its own of what it has taken and not yet handled.
const LINK_QUEUE: usize = 8;

/// Counters of the broker.
#[derive(Debug, Default)]
pub struct BrokerStats {
    pub connections: AtomicU64,
    pub published: AtomicU64,
    /// QoS 0 messages dropped for a client whose queue was full.
    pub dropped: AtomicU64,
    /// Clients disconnected because their QoS 1 queue overflowed.
    pub overflowed: AtomicU64,
    /// Clients disconnected for sending nothing within 1.5 times their keep-alive.
    pub keepalive_expired: AtomicU64,
    /// CONNECTs refused (a wrong password, an anonymous client where none may be).
    pub refused: AtomicU64,
    /// Publishes the ACL does not grant their client (acknowledged and dropped).
    pub denied: AtomicU64,
    /// Subscriptions held now (one per client and filter).
    pub subscriptions: AtomicU64,
}

#[derive(Clone, Default)]
struct Core {
    state: Arc<Mutex<Routing>>,
    next_id: Arc<AtomicU64>,
    stats: Arc<BrokerStats>,
    /// Fixed at start.
    limits: Arc<Limits>,
    /// Who may connect, publish and receive what.
    auth: Arc<super::auth::Auth>,
}

impl Core {
    fn lock(&self) -> std::sync::MutexGuard<'_, Routing> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Delivers `publish` to its subscribers. Waits only for room in the queue of a client that
    /// takes backpressure (edgecore's own), which slows the publisher's connection down.
    async fn route(&self, publish: &Publish) {
        let waiting = self.route_now(publish);
        for (tx, out, size, queued) in waiting {
            queued.fetch_add(size, Ordering::Relaxed);
            if tx.send(Packet::Publish(out)).await.is_err() {
                queued.fetch_sub(size, Ordering::Relaxed);
            }
        }
    }

    /// Delivers to every subscriber that has room; returns what must wait for room.
    #[allow(clippy::type_complexity)]
    fn route_now(
        &self,
        publish: &Publish,
    ) -> Vec<(mpsc::Sender<Packet>, Publish, usize, Arc<AtomicUsize>)> {
        self.stats.published.fetch_add(1, Ordering::Relaxed);
        let mut waiting = Vec::new();
        let mut state = self.lock();
        state.retain(publish);
        for d in state.deliveries(publish, &self.auth, &self.limits) {
            let Some(client) = state.clients.get(&d.id) else {
                continue;
            };
            let fate = match d.fate {
                Fate::Wait => {
                    waiting.push((
                        client.tx.clone(),
                        d.publish,
                        d.size,
                        client.queued_bytes.clone(),
                    ));
                    continue;
                }
                // Room was there under this lock; a retained message the client's own
                // subscription queued since may have taken it.
                Fate::Send => match client.tx.try_send(Packet::Publish(d.publish)) {
                    Ok(()) => {
                        client.queued_bytes.fetch_add(d.size, Ordering::Relaxed);
                        continue;
                    }
                    Err(e) => match e.into_inner() {
                        Packet::Publish(p) if p.qos == QoS::AtMostOnce => Fate::Drop,
                        _ => Fate::Overflow,
                    },
                },
                other => other,
            };
            if fate == Fate::Drop {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(client = %client.client_id, topic = %publish.topic, "MQTT subscriber too slow; QoS 0 message dropped");
            } else if !client.overflow.is_cancelled() {
                self.stats.overflowed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(client = %client.client_id, topic = %publish.topic, "MQTT subscriber too slow: its QoS 1 queue is full; disconnecting it");
                client.overflow.cancel();
            }
        }
        waiting
    }
}

/// A running embedded broker.
pub(crate) struct Broker {
    pub stats: Arc<BrokerStats>,
    core: Core,
}

impl Broker {
    /// Connects edgecore's own client in-process, subscribed to `filters`: it receives the
    /// publishes that match them without a socket or an MQTT encoding in between, and publishes
    /// straight into the broker's routing. A publisher whose messages match waits for room in
    /// this client's queue instead of anything being dropped.
    pub(crate) fn link(&self, filters: &[String]) -> Link {
        let id = self.core.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(LINK_QUEUE);
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        let mut state = self.core.lock();
        state.admit(
            id,
            Client {
                client_id: format!("edgecore in-process link {id}"),
                user: None,
                tx,
                filters: HashMap::new(),
                queued_bytes: queued_bytes.clone(),
                overflow: CancellationToken::new(),
                taken_over: CancellationToken::new(),
                link: true,
            },
        );
        let filters: Vec<(String, QoS)> = filters
            .iter()
            .map(|f| (f.clone(), QoS::AtLeastOnce))
            .collect();
        state.subscribe(id, &filters);
        drop(state);
        Link {
            id,
            rx,
            queued_bytes,
            publisher: LinkPublisher {
                core: self.core.clone(),
            },
        }
    }
}

/// edgecore's own client of the embedded broker, in the same process ([`Broker::link`]).
pub(crate) struct Link {
    id: u64,
    rx: mpsc::Receiver<Packet>,
    queued_bytes: Arc<AtomicUsize>,
    publisher: LinkPublisher,
}

impl Link {
    /// The next publish that matched the link's filters; `None` once the broker is gone.
    pub(crate) async fn recv(&mut self) -> Option<Publish> {
        loop {
            match self.rx.recv().await? {
                Packet::Publish(p) => {
                    self.queued_bytes
                        .fetch_sub(p.payload.len() + p.topic.len(), Ordering::Relaxed);
                    return Some(p);
                }
                _ => continue,
            }
        }
    }

    /// Publishes through the broker, as the link's client.
    pub(crate) fn publisher(&self) -> LinkPublisher {
        self.publisher.clone()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.publisher.core.lock().remove_client(self.id);
    }
}

/// Publishes into the embedded broker from the same process.
#[derive(Clone)]
pub(crate) struct LinkPublisher {
    core: Core,
}

impl LinkPublisher {
    /// Whether any client subscribes to `topic` now: a message nobody would receive need not be
    /// built.
    pub(crate) fn wanted(&self, topic: &str) -> bool {
        let state = self.core.lock();
        let mut wanted = false;
        state.subscriptions.matches(topic, &mut |id, _| {
            wanted = wanted || state.clients.get(&id).is_some_and(|c| !c.link);
        });
        wanted
    }

    /// Routes a QoS 1 publish to its subscribers (never retained). Must not be called for a
    /// topic that the link itself subscribes to while the link is not being read.
    pub(crate) async fn publish(&self, topic: String, payload: Vec<u8>) {
        let p = Publish::new(topic, QoS::AtLeastOnce, payload);
        self.core.route(&p).await;
    }
}

/// The embedded broker's TLS listener.
pub(crate) struct TlsListener {
    pub addr: SocketAddr,
    pub config: Arc<tokio_rustls::rustls::ServerConfig>,
    /// A client certificate's common name is the client's user name.
    pub use_identity_as_username: bool,
}

impl TlsListener {
    /// The listener `mqtt.tls` describes: its files read, its address resolved.
    pub(crate) async fn load(t: &crate::config::MqttTls) -> Result<Self, BrokerError> {
        use pki::tls::ClientCerts;
        let read = |key: &'static str, path: &std::path::Path| {
            std::fs::read_to_string(path).map_err(|source| BrokerError::TlsFile {
                key,
                path: path.to_path_buf(),
                source,
            })
        };
        let cert = read("certFile", &t.cert_file)?;
        let key = read("keyFile", &t.key_file)?;
        let ca = match &t.ca_file {
            Some(p) => Some(read("caFile", p)?),
            None => None,
        };
        let mode = if t.require_certificate {
            ClientCerts::Required
        } else {
            ClientCerts::Optional
        };
        let config = pki::tls::server_config(&cert, &key, ca.as_deref().map(|c| (c, mode)), &[])?;
        let address = |why: String| BrokerError::TlsAddress {
            address: t.address.clone(),
            why,
        };
        let (host, port) =
            rt::address::split_host_port(&t.address, None).map_err(|e| address(e.to_string()))?;
        let addr = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| address(e.to_string()))?
            .next()
            .ok_or_else(|| address("does not resolve".into()))?;
        Ok(Self {
            addr,
            config,
            use_identity_as_username: t.use_identity_as_username,
        })
    }
}

/// Binds `addr` (and the TLS listener, if any) and serves MQTT until `cancel`, serving at most
/// `max_connections` clients at once over both (more wait in the listen backlog).
pub(crate) async fn start(
    addr: SocketAddr,
    tls: Option<TlsListener>,
    limits: Limits,
    auth: super::auth::Auth,
    cancel: CancellationToken,
) -> Result<Broker, BrokerError> {
    let max_connections = limits.max_connections;
    let listener = bind(addr).await?;
    let tls = match tls {
        Some(t) => Some((bind(t.addr).await?, t)),
        None => None,
    };
    let stats = Arc::new(BrokerStats::default());
    let core = Core {
        state: Arc::new(Mutex::new(Routing {
            stats: stats.clone(),
            ..Routing::default()
        })),
        stats,
        limits: Arc::new(limits),
        auth: Arc::new(auth),
        next_id: Arc::default(),
    };
    let broker = Broker {
        stats: core.stats.clone(),
        core: core.clone(),
    };
    let permits = Arc::new(tokio::sync::Semaphore::new(max_connections));
    {
        let (core, cancel, permits) = (core.clone(), cancel.clone(), permits.clone());
        tokio::spawn(accept(
            listener,
            permits,
            cancel,
            move |stream, peer, cancel| {
                let core = core.clone();
                async move {
                    let ack = ack_handle(&stream);
                    let (reader, writer) = stream.into_split();
                    if let Err(e) = connection(reader, writer, ack, None, core, cancel).await {
                        tracing::debug!(%peer, error = %e, "MQTT client disconnected");
                    }
                }
            },
        ));
    }
    if let Some((listener, t)) = tls {
        let acceptor = tokio_rustls::TlsAcceptor::from(t.config);
        let identity = t.use_identity_as_username;
        tokio::spawn(accept(
            listener,
            permits,
            cancel,
            move |stream, peer, cancel| {
                let (core, acceptor) = (core.clone(), acceptor.clone());
                async move {
                    let ack = ack_handle(&stream);
                    let handshake = tokio::time::timeout(
                        std::time::Duration::from_secs(10),
                        acceptor.accept(stream),
                    );
                    let stream = match handshake.await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            core.stats.refused.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(%peer, error = %e, "MQTT TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "MQTT TLS handshake not done within 10 s");
                            return;
                        }
                    };
                    let user = identity
                        .then(|| stream.get_ref().1.peer_certificates())
                        .flatten()
                        .and_then(|c| c.first())
                        .and_then(|c| pki::subject(c))
                        .map(|(cn, _)| cn);
                    let (reader, writer) = tokio::io::split(stream);
                    if let Err(e) = connection(reader, writer, ack, user, core, cancel).await {
                        tracing::debug!(%peer, error = %e, "MQTT client disconnected");
                    }
                }
            },
        ));
    }
    Ok(broker)
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, BrokerError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| BrokerError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| BrokerError::Bind { addr, source })?;
    tracing::info!(addr = %local, "embedded MQTT broker listening");
    Ok(listener)
}

/// Accepts clients of `listener` while a permit is free, each served by `serve` in its task.
async fn accept<F, Fut>(
    listener: TcpListener,
    permits: Arc<tokio::sync::Semaphore>,
    cancel: CancellationToken,
    serve: F,
) where
    F: Fn(TcpStream, SocketAddr, CancellationToken) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut backoff = rt::transport::AcceptBackoff::default();
    loop {
        let permit = tokio::select! {
            _ = cancel.cancelled() => return,
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff.succeeded();
                let _ = stream.set_nodelay(true);
                let served = serve(stream, peer, cancel.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    served.await;
                });
            }
            Err(e) => backoff.failed("mqtt", &e).await,
        }
    }
}

/// The CONNECT a new connection must open with (within 10 s), and the [`Session`] it makes;
/// a refusal is answered (CONNACK with its code) and ends the connection. `Ok(None)`: the
/// client closed before it.
async fn handshake<R, W>(
    reader: &mut R,
    writer: &mut W,
    buf: &mut BytesMut,
    ack: Option<&socket2::Socket>,
    identity: Option<String>,
    core: &Core,
    id: u64,
) -> Result<Option<Session>, Disconnect>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let first = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        read_packet(reader, buf, ack),
    )
    .await;
    let connect = match first {
        Ok(Ok(Some(Packet::Connect(c)))) => c,
        Ok(Ok(Some(other))) => {
            // The packet's kind and its first bytes, not a whole payload in the log.
            let shown: String = format!("{other:?}").chars().take(80).collect();
            return Err(Disconnect::NotConnect(shown));
        }
        Ok(Ok(None)) => return Ok(None),
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err(Disconnect::NoConnect),
    };
    match Session::connect(&connect, identity, &core.auth, id) {
        Ok(s) => Ok(Some(s)),
        Err(code) => {
            core.stats.refused.fetch_add(1, Ordering::Relaxed);
            let mut out = BytesMut::new();
            encode(&Packet::ConnAck(ConnAck::new(code, false)), &mut out);
            let _ = writer.write_all(&out).await;
            Err(Disconnect::Refused(code))
        }
    }
}

/// A connected client's side of the broker: its queues and the signals that close it.
struct Joined {
    id: u64,
    /// Publishes for it (`max_queued_messages`), and their bytes.
    tx: mpsc::Sender<Packet>,
    queued: Arc<AtomicUsize>,
    /// The answers to its own packets (acks, pings), which the writer serves first and never
    /// behind a publish: otherwise a queue full of publishes waiting for the client's acks
    /// would hold back the very acks this reader must send, and both would wait for each other.
    ctl: mpsc::Sender<Packet>,
    /// QoS 1 publishes sent and not acknowledged (`max_inflight_messages`): the writer takes a
    /// permit for each, a PUBACK gives it back.
    inflight: Arc<tokio::sync::Semaphore>,
    window: usize,
    overflow: CancellationToken,
    taken_over: CancellationToken,
}

impl Joined {
    /// `session`'s client admitted to the routing as `id` (taking its client id over from an
    /// older connection), its CONNACK queued, and its writer started on `writer`.
    fn admit<W>(
        core: &Core,
        session: &Session,
        id: u64,
        writer: W,
        cancel: &CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>)
    where
        W: tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (queue, window) = (
            core.limits.max_queued_messages.max(1),
            core.limits.max_inflight_messages.max(1),
        );
        let (tx, rx) = mpsc::channel::<Packet>(queue);
        let (ctl, ctl_rx) = mpsc::channel::<Packet>(64);
        let me = Self {
            id,
            tx,
            queued: Arc::new(AtomicUsize::new(0)),
            ctl,
            inflight: Arc::new(tokio::sync::Semaphore::new(window)),
            window,
            overflow: cancel.child_token(),
            taken_over: cancel.child_token(),
        };
        let older = core.lock().admit(
            id,
            Client {
                client_id: session.client_id.clone(),
                user: session.user.clone(),
                tx: me.tx.clone(),
                filters: HashMap::new(),
                queued_bytes: me.queued.clone(),
                overflow: me.overflow.clone(),
                taken_over: me.taken_over.clone(),
                link: false,
            },
        );
        for c in older {
            c.taken_over.cancel();
        }
        core.stats.connections.fetch_add(1, Ordering::Relaxed);
        let _ = me.ctl.try_send(Packet::ConnAck(ConnAck::new(
            ConnectReturnCode::Success,
            false,
        )));
        let writer = tokio::spawn(write_out(
            writer,
            ctl_rx,
            rx,
            me.inflight.clone(),
            me.queued.clone(),
        ));
        (me, writer)
    }

    /// Carries out what the session decided of one packet; `Some` ends the connection.
    async fn act(
        &self,
        out: Out,
        session: &Session,
        core: &Core,
    ) -> Option<Result<(), Disconnect>> {
        match out {
            Out::Reply(p) => {
                let _ = self.ctl.send(p).await;
            }
            Out::Route(p) => core.route(&p).await,
            Out::Denied(topic) => {
                core.stats.denied.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(client = %session.client_id, %topic, "MQTT publish not granted by the ACL; dropped");
            }
            Out::Subscribe(filters) => {
                let retained = {
                    let mut state = core.lock();
                    state.subscribe(self.id, &filters);
                    session.retained(&filters, &state.retained, &core.auth)
                };
                // The SUBACK (next) goes out through `ctl`, ahead of these.
                for r in retained {
                    let size = r.payload.len() + r.topic.len();
                    self.queued.fetch_add(size, Ordering::Relaxed);
                    if self.tx.send(Packet::Publish(r)).await.is_err() {
                        self.queued.fetch_sub(size, Ordering::Relaxed);
                    }
                }
            }
            Out::Unsubscribe(topics) => core.lock().unsubscribe(self.id, &topics),
            Out::Acked => {
                if self.inflight.available_permits() < self.window {
                    self.inflight.add_permits(1);
                }
            }
            Out::Close(end) => return Some(end),
        }
        None
    }
}

/// Serves one client: reads its packets, has its [`Session`] decide, and carries that out
/// ([`Joined::act`]); `identity` is the user its TLS certificate names, when certificates are
/// users.
async fn connection<R, W>(
    mut reader: R,
    mut writer: W,
    ack: Option<socket2::Socket>,
    identity: Option<String>,
    core: Core,
    cancel: CancellationToken,
) -> Result<(), Disconnect>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut buf = BytesMut::with_capacity(4096);
    let id = core.next_id.fetch_add(1, Ordering::Relaxed);
    let ack = ack.as_ref();
    let handshake = handshake(&mut reader, &mut writer, &mut buf, ack, identity, &core, id);
    let Some(session) = handshake.await? else {
        return Ok(());
    };
    let (client, mut writer_task) = Joined::admit(&core, &session, id, writer, &cancel);
    let result = 'read: loop {
        let read = async {
            match session.keep_alive {
                Some(k) => tokio::time::timeout(k, read_packet(&mut reader, &mut buf, ack)).await,
                None => Ok(read_packet(&mut reader, &mut buf, ack).await),
            }
        };
        let packet = match tokio::select! {
            _ = cancel.cancelled() => break Err(Disconnect::Shutdown),
            _ = client.overflow.cancelled() => break Err(Disconnect::Overflow),
            _ = client.taken_over.cancelled() => break Err(Disconnect::TakenOver),
            r = read => r,
        } {
            Err(_) => {
                core.stats.keepalive_expired.fetch_add(1, Ordering::Relaxed);
                break Err(Disconnect::KeepAlive);
            }
            Ok(Ok(None)) => break Err(Disconnect::Closed),
            Ok(Err(e)) => break Err(e),
            Ok(Ok(Some(p))) => p,
        };
        for out in session.on_packet(packet, &core.auth) {
            if let Some(end) = client.act(out, &session, &core).await {
                break 'read end;
            }
        }
    };
    core.lock().remove_client(id);
    // The will is published when a client goes away without DISCONNECT (the broker's own
    // shutdown included, as Mosquitto does).
    if let Some(will) = session.will(&result) {
        core.route(&will).await;
    }
    drop(client);
    // What is queued is written if the client reads it; a client that does not read (the
    // reason for most of these exits) must not keep its queue, and this task, alive.
    let wait = std::time::Duration::from_secs(1);
    if tokio::time::timeout(wait, &mut writer_task).await.is_err() {
        writer_task.abort();
    }
    match result {
        Err(Disconnect::Closed | Disconnect::Shutdown) => Ok(()),
        other => other,
    }
}
