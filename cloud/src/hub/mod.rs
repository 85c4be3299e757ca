//! cloudhub: one TLS websocket session per edge node, in KubeEdge's wire format (section 6 of
//! kubeedge-compat.md): `wss://HOST:10000/{projectID}/{node}/events` with headers `node_id` and
//! `project_id`, a client certificate `CN=system:node:{node}` signed by the cloud CA, and each
//! frame one message as JSON.
//!
//! Downstream, a message that needs an acknowledgement stays queued for its node until the
//! node's `response` (`parent_msg_id`) arrives: sent again every `resendSeconds`, replaced by a
//! newer message about the same object, kept while the node is away and sent when it is back.
//! Messages that need none (membership, answers to reports) wait for a session in a bounded
//! queue per node that counts what it drops. Upstream, a node may only send about itself
//! (`node/{node}/...`); its messages go to the device controller at most `nodeQps` per second
//! (the rest wait: the node's socket is read no faster).

pub mod certs;
pub mod objectsync;
mod ws;

use api::message::Message;
use api::packed::Packed;
use devicecontroller::controller::Hub;
use devicecontroller::downstream::Outbound;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use ws::serve;

/// Settings (from `modules.cloudHub`).
#[derive(Clone, Debug)]
pub struct Settings {
    pub node_limit: usize,
    pub max_frame_bytes: usize,
    pub keepalive: Duration,
    pub node_qps: u32,
    pub node_burst: u32,
    pub resend: Duration,
    /// Messages without acknowledgement kept per node while it has no session.
    pub noack_limit: usize,
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct HubMetrics {
    pub sessions: AtomicU64,
    pub sessions_replaced: AtomicU64,
    pub sessions_refused: AtomicU64,
    pub frames_in: AtomicU64,
    pub frames_out: AtomicU64,
    pub resent: AtomicU64,
    pub acked: AtomicU64,
    pub dropped: AtomicU64,
    pub refused_messages: AtomicU64,
    pub bad_frames: AtomicU64,
}

impl HubMetrics {
    pub fn render(&self, pending: usize, records: (u64, u64)) -> String {
        let g = |v: &AtomicU64| v.load(Ordering::Relaxed);
        let mut out = String::new();
        for (name, kind, v) in [
            ("cloudhub_sessions", "gauge", g(&self.sessions)),
            (
                "cloudhub_sessions_replaced_total",
                "counter",
                g(&self.sessions_replaced),
            ),
            (
                "cloudhub_sessions_refused_total",
                "counter",
                g(&self.sessions_refused),
            ),
            ("cloudhub_frames_in_total", "counter", g(&self.frames_in)),
            ("cloudhub_frames_out_total", "counter", g(&self.frames_out)),
            ("cloudhub_resent_total", "counter", g(&self.resent)),
            ("cloudhub_acked_total", "counter", g(&self.acked)),
            ("cloudhub_dropped_total", "counter", g(&self.dropped)),
            (
                "cloudhub_refused_messages_total",
                "counter",
                g(&self.refused_messages),
            ),
            ("cloudhub_bad_frames_total", "counter", g(&self.bad_frames)),
            ("cloudhub_pending_acks", "gauge", pending as u64),
            ("cloudhub_objectsync_written_total", "counter", records.0),
            ("cloudhub_objectsync_failed_total", "counter", records.1),
        ] {
            out.push_str(&format!("# TYPE {name} {kind}\n{name} {v}\n"));
        }
        out
    }
}

/// A session's way out: frames to write, and how to end it.
struct Session {
    id: u64,
    tx: mpsc::Sender<String>,
    end: CancellationToken,
}

/// A message waiting for its acknowledgement.
struct Pending {
    id: String,
    /// What the acknowledgement records (an ObjectSync), and whether the message is a delete.
    ack: devicecontroller::downstream::AckKey,
    delete: bool,
    /// The message's JSON, compressed while it waits (a node away for long holds every object
    /// it is to get).
    text: Packed,
    /// When it was last written to a session.
    sent: Option<Instant>,
}

#[derive(Default)]
struct NodeState {
    session: Option<Session>,
    /// By object `(kind, namespace, name)`: a newer message about it replaces the older.
    unacked: BTreeMap<(&'static str, String, String), Pending>,
    noack: VecDeque<Packed>,
}

fn text(p: &Packed) -> String {
    String::from_utf8_lossy(&p.bytes()).into_owned()
}

/// The hub: sessions and queues of every node.
pub struct CloudHub {
    nodes: Mutex<HashMap<String, NodeState>>,
    upstream: OnceLock<mpsc::Sender<(String, Message)>>,
    records: OnceLock<objectsync::Writer>,
    pub settings: Settings,
    pub metrics: HubMetrics,
    next_session: AtomicU64,
}

impl CloudHub {
    pub fn new(settings: Settings) -> Arc<Self> {
        Arc::new(Self {
            nodes: Mutex::new(HashMap::new()),
            upstream: OnceLock::new(),
            records: OnceLock::new(),
            settings,
            metrics: HubMetrics::default(),
            next_session: AtomicU64::new(1),
        })
    }

    /// Where acknowledgements are recorded (ObjectSync).
    pub fn set_records(&self, w: objectsync::Writer) {
        let _ = self.records.set(w);
    }

    /// ObjectSync records written and failed.
    pub fn records(&self) -> (u64, u64) {
        self.records.get().map_or((0, 0), |w| {
            (
                w.written.load(Ordering::Relaxed),
                w.failed.load(Ordering::Relaxed),
            )
        })
    }

    /// Where upstream messages go (the device controller's input).
    pub fn set_upstream(&self, tx: mpsc::Sender<(String, Message)>) {
        let _ = self.upstream.set(tx);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, NodeState>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Messages waiting for an acknowledgement, all nodes.
    pub fn pending(&self) -> usize {
        self.lock().values().map(|n| n.unacked.len()).sum()
    }

    /// Sessions now.
    pub fn sessions(&self) -> usize {
        self.lock().values().filter(|n| n.session.is_some()).count()
    }

    /// A new session for `node`: replaces any other, then gets everything queued for it.
    /// `None` when the node limit is reached.
    fn attach(&self, node: &str, tx: mpsc::Sender<String>, end: CancellationToken) -> Option<u64> {
        let mut nodes = self.lock();
        let live = nodes.values().filter(|n| n.session.is_some()).count();
        let st = nodes.entry(node.to_string()).or_default();
        if st.session.is_none() && live >= self.settings.node_limit {
            self.metrics
                .sessions_refused
                .fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        if let Some(old) = st.session.replace(Session { id, tx, end }) {
            tracing::warn!(%node, "a second connection for this node replaces the first");
            old.end.cancel();
            self.metrics
                .sessions_replaced
                .fetch_add(1, Ordering::Relaxed);
        } else {
            self.metrics.sessions.fetch_add(1, Ordering::Relaxed);
        }
        for p in st.unacked.values_mut() {
            p.sent = None;
        }
        let Some(s) = &st.session else {
            return Some(id);
        };
        while let Some(t) = st.noack.pop_front() {
            if s.tx.try_send(text(&t)).is_err() {
                st.noack.push_front(t);
                break;
            }
            self.metrics.frames_out.fetch_add(1, Ordering::Relaxed);
        }
        drop(nodes);
        self.resend_due(Instant::now());
        Some(id)
    }

    /// The session `id` of `node` ended (a newer one may have replaced it already).
    fn detach(&self, node: &str, id: u64) -> bool {
        let mut nodes = self.lock();
        if let Some(st) = nodes.get_mut(node)
            && st.session.as_ref().is_some_and(|s| s.id == id)
        {
            st.session = None;
            self.metrics.sessions.fetch_sub(1, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// A message from `node`'s session. Its answers (`response`) clear what they acknowledge;
    /// the rest goes to the device controller if it is about this node.
    async fn received(&self, node: &str, msg: Message) {
        if msg.route.operation == "keepalive" {
            return;
        }
        if msg.route.operation == "response" && !msg.header.parent_id.is_empty() {
            let mut nodes = self.lock();
            if let Some(st) = nodes.get_mut(node) {
                let key = st
                    .unacked
                    .iter()
                    .find(|(_, p)| p.id == msg.header.parent_id)
                    .map(|(k, _)| k.clone());
                if let Some(p) = key.and_then(|k| st.unacked.remove(&k)) {
                    self.metrics.acked.fetch_add(1, Ordering::Relaxed);
                    if let Some(w) = self.records.get() {
                        w.record(objectsync::Record {
                            node: node.to_string(),
                            ack: p.ack,
                            deleted: p.delete,
                        });
                    }
                }
            }
            return;
        }
        let own = format!("node/{node}/");
        if !msg.route.resource.starts_with(&own) {
            self.metrics
                .refused_messages
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%node, resource = %msg.route.resource, "a node sent about another node; refused");
            let mut answer = Message::new(
                "cloudhub",
                &msg.route.group,
                "error",
                msg.route.resource.clone(),
                serde_json::Value::String(format!(
                    "node {node} may only send about itself ({own}...)"
                )),
            );
            answer.header.parent_id = msg.header.id.clone();
            self.deliver(node, None, answer);
            return;
        }
        if let Some(up) = self.upstream.get() {
            let _ = up.send((node.to_string(), msg)).await;
        }
    }

    fn deliver(
        &self,
        node: &str,
        ack: Option<devicecontroller::downstream::AckKey>,
        message: Message,
    ) {
        let Ok(json) = serde_json::to_string(&message) else {
            return;
        };
        let mut nodes = self.lock();
        let st = nodes.entry(node.to_string()).or_default();
        let sent = match &st.session {
            Some(s) => s.tx.try_send(json.clone()).is_ok(),
            None => false,
        };
        if sent {
            self.metrics.frames_out.fetch_add(1, Ordering::Relaxed);
        }
        match ack {
            Some(k) => {
                let p = Pending {
                    id: message.header.id.clone(),
                    ack: k.clone(),
                    delete: message.route.operation == "delete",
                    text: Packed::new(json.as_bytes()),
                    sent: sent.then(Instant::now),
                };
                st.unacked.insert((k.kind, k.namespace, k.name), p);
            }
            None if sent => {}
            None => {
                st.noack.push_back(Packed::new(json.as_bytes()));
                while st.noack.len() > self.settings.noack_limit {
                    st.noack.pop_front();
                    self.metrics.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Writes again what was not acknowledged within `resend` (or never written).
    fn resend_due(&self, now: Instant) {
        let mut nodes = self.lock();
        for st in nodes.values_mut() {
            let Some(s) = &st.session else { continue };
            for p in st.unacked.values_mut() {
                if p.sent
                    .is_some_and(|t| now.duration_since(t) < self.settings.resend)
                {
                    continue;
                }
                if s.tx.try_send(text(&p.text)).is_err() {
                    break;
                }
                if p.sent.is_some() {
                    self.metrics.resent.fetch_add(1, Ordering::Relaxed);
                }
                self.metrics.frames_out.fetch_add(1, Ordering::Relaxed);
                p.sent = Some(now);
            }
        }
    }

    /// Resends every second until `stop`.
    pub fn spawn_resender(self: &Arc<Self>, stop: CancellationToken) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => me.resend_due(Instant::now()),
                }
            }
        });
    }
}

impl Hub for CloudHub {
    fn send(&self, out: Outbound) {
        self.deliver(&out.node, out.ack, out.message);
    }
}
