//! cloudhub: one TLS websocket session per edge node, in KubeEdge's wire format (kubeedge/kubeedge
//! `cloud/pkg/cloudhub` and `edge/pkg/edgehub`, beehive's `model.Message`): `wss://HOST:10000/{projectID}/{node}/events` with headers `node_id` and
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

pub(crate) mod certs;
pub(crate) mod joins;
mod metrics;
pub(crate) mod objectsync;
mod queue;
pub(crate) mod tunnel;
pub(crate) mod usage;
mod ws;

use api::bus::Hub;
use api::bus::{AckKey, Outbound};
use api::message::{Message, MessageHeader, MessageRoute};
use api::packed::Packed;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub(crate) use metrics::HubMetrics;
pub(crate) use ws::serve;

/// Settings (from `modules.cloudHub`).
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// The join tokens and node certificates given out (revoked ones are refused).
    pub joins: joins::Book,
    pub node_limit: usize,
    pub max_frame_bytes: usize,
    pub keepalive: Duration,
    pub node_qps: u32,
    pub node_burst: u32,
    pub resend: Duration,
    /// Messages without acknowledgement kept per node while it has no session.
    pub noack_limit: usize,
    /// This replica's name, when there are replicas (its Lease identity).
    pub replica: Option<String>,
    /// Streams open at once through one node's tunnel.
    pub streams_per_node: usize,
    /// A stream idle this long is closed.
    pub stream_idle: Duration,
}

/// The longest resource a node's message may name: `node/{node}/{namespace}/{kind}/{name}`
/// with names of at most 253 characters fits with room to spare.
const MAX_RESOURCE: usize = 1024;
/// The longest id, group, operation, source and destination: UUIDs and short words.
const MAX_FIELD: usize = 128;

/// Whether a node's message has a route and header of reasonable size.
fn fits(msg: &Message) -> bool {
    let r = &msg.route;
    let h = &msg.header;
    r.resource.len() <= MAX_RESOURCE
        && [
            &r.source,
            &r.destination,
            &r.group,
            &r.operation,
            &h.id,
            &h.parent_id,
            &h.resource_version,
            &h.message_type,
        ]
        .iter()
        .all(|f| f.len() <= MAX_FIELD)
}

/// Whether a node's message waits for the node's rate (`nodeQps`) before it is handled: what
/// costs the cloud work (reports, pod status, requests). Keepalives and answers to the cloud's
/// own messages do not: they cost nothing, and an answer held back keeps the node's window of
/// the cloud's messages shut, so that a node reporting at its full rate would never be sent
/// anything.
fn metered(msg: &Message) -> bool {
    !matches!(
        msg.route.operation.as_str(),
        "keepalive" | "response" | "error"
    )
}

/// A session's way out: frames to write, and how to end it.
struct Session {
    id: u64,
    tx: mpsc::Sender<String>,
    end: CancellationToken,
}

/// A message waiting for its acknowledgement, kept small: a node away for long holds one for
/// every object it is to get, and a site has tens of thousands. Its frame is rebuilt from these
/// parts when it is (re)sent.
struct Pending {
    /// `msg_id`, a UUID as [`Message::new`] makes them.
    id: u128,
    timestamp: i64,
    /// When it was last written to the session now, if it was ([`queue`] decides).
    written: Option<queue::Written>,
    /// How many times it was written, all sessions.
    tries: u32,
    /// The content's JSON: the controller's own copy of the object where it gave one (a second
    /// copy per message would double what the cloud keeps of its devices), else compressed here.
    body: Packed,
    /// The object's uid and resourceVersion (the header's, and the ObjectSync's).
    uid: Box<str>,
    rv: Box<str>,
    /// The route's source, group, operation and resource, joined by newlines (none has one).
    route: Box<str>,
}

/// A queued object: kind, namespace, name.
type ObjectKey = (&'static str, Box<str>, Box<str>);

#[derive(Default)]
struct NodeState {
    session: Option<Session>,
    /// By object `(kind, namespace, name)`: a newer message about it replaces the older.
    unacked: queue::Queue,
    noack: VecDeque<Packed>,
}

fn text(p: &Packed) -> String {
    String::from_utf8_lossy(&p.bytes()).into_owned()
}

/// A resource as it goes on the wire: `node/{node}/` taken off the front, as KubeEdge's
/// cloudhub does (`TrimMessage`) before writing a frame, since KubeEdge's edge (metamanager, the
/// DMI worker) reads `{namespace}/{kind}/{name}` and `membership`. Inside the cloud, queues and
/// acknowledgements keep the whole resource.
pub(crate) fn trimmed(resource: &str) -> &str {
    match resource.strip_prefix("node/") {
        Some(rest) => match rest.split_once('/') {
            Some((_, tail)) if !tail.is_empty() => tail,
            _ => resource,
        },
        None => resource,
    }
}

/// A message's frame from its parts, exactly as serde writes a [`Message`] (header, route,
/// content), the content spliced in as the JSON text it already is; the resource trimmed.
fn frame(header: &MessageHeader, route: &MessageRoute, content: &[u8]) -> String {
    let h = serde_json::to_string(header).unwrap_or_else(|_| "{}".into());
    let r = match trimmed(&route.resource) {
        t if t.len() == route.resource.len() => serde_json::to_string(route),
        t => serde_json::to_string(&MessageRoute {
            resource: t.to_string(),
            ..route.clone()
        }),
    }
    .unwrap_or_else(|_| "{}".into());
    let c = String::from_utf8_lossy(content);
    format!("{{\"header\":{h},\"route\":{r},\"content\":{c}}}")
}

impl Pending {
    fn new(message: &Message, ack: &AckKey, body: Packed) -> Option<Self> {
        let r = &message.route;
        let parts = [&r.source, &r.group, &r.operation, &r.resource];
        if parts.iter().any(|p| p.contains('\n')) {
            return None;
        }
        Some(Self {
            id: uuid::Uuid::parse_str(&message.header.id).ok()?.as_u128(),
            timestamp: message.header.timestamp,
            written: None,
            tries: 0,
            body,
            uid: ack.uid.as_str().into(),
            rv: message.header.resource_version.as_str().into(),
            route: parts
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join("\n")
                .into(),
        })
    }

    fn is_delete(&self) -> bool {
        self.route.split('\n').nth(2) == Some("delete")
    }

    fn ack(&self, key: &ObjectKey) -> AckKey {
        AckKey {
            kind: key.0,
            namespace: key.1.to_string(),
            name: key.2.to_string(),
            uid: self.uid.to_string(),
            resource_version: self.rv.to_string(),
        }
    }

    fn frame(&self) -> String {
        let header = MessageHeader {
            id: uuid::Uuid::from_u128(self.id).to_string(),
            timestamp: self.timestamp,
            resource_version: self.rv.to_string(),
            ..MessageHeader::default()
        };
        let mut parts = self.route.split('\n').map(str::to_string);
        let mut next = || parts.next().unwrap_or_default();
        let route = MessageRoute {
            source: next(),
            group: next(),
            operation: next(),
            resource: next(),
            ..MessageRoute::default()
        };
        frame(&header, &route, &self.body.bytes())
    }
}

/// Whether resourceVersion `a` is not newer than `b` (numbers compared as numbers, as the
/// API's and etcd's are; otherwise only an equal one).
fn not_newer(a: &str, b: &str) -> bool {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(x), Ok(y)) => x <= y,
        _ => a == b,
    }
}

/// The hub: sessions and queues of every node.
pub(crate) struct CloudHub {
    nodes: Mutex<HashMap<String, NodeState>>,
    upstream: OnceLock<mpsc::Sender<(String, Message)>>,
    /// Where sessions that came and went are told (the device controller: it sends a node
    /// that came here its messages; a node's devices become `unknown` when it goes).
    sessions: OnceLock<Arc<devicecontroller::controller::Sessions>>,
    /// Where pod status goes (the edge controller).
    pods: OnceLock<mpsc::Sender<(String, Message)>>,
    records: OnceLock<objectsync::Writer>,
    /// Questions asked of nodes ([`CloudHub::ask`]) waiting for their answer, by node and the
    /// question's id: a node answers only its own.
    asked: Mutex<HashMap<(String, String), tokio::sync::oneshot::Sender<Message>>>,
    pub settings: Settings,
    pub metrics: HubMetrics,
    next_session: AtomicU64,
    /// The nodes' streaming tunnels (`kubectl logs`).
    pub tunnels: tunnel::Tunnels,
    /// What each node last reported it and its pods use (`kubectl top`).
    pub usage: usage::Usage,
}

/// Questions waiting for their answers at once, all nodes together.
const ASKED_LIMIT: usize = 1024;

/// Why a question to a node got no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unanswered {
    #[error(
        "node {0} has no session with this cloudcore (it is away, or connected to another replica)"
    )]
    Away(String),
    #[error("node {0}'s session is too busy to ask it now; try again")]
    Busy(String),
    #[error("node {0} did not answer within {1:?}")]
    Late(String, Duration),
}

impl CloudHub {
    pub(crate) fn new(settings: Settings) -> Arc<Self> {
        let mut tunnels = tunnel::Tunnels::new(settings.streams_per_node);
        tunnels.idle = settings.stream_idle;
        Arc::new(Self {
            nodes: Mutex::new(HashMap::new()),
            upstream: OnceLock::new(),
            sessions: OnceLock::new(),
            pods: OnceLock::new(),
            records: OnceLock::new(),
            asked: Mutex::new(HashMap::new()),
            settings,
            metrics: HubMetrics::default(),
            next_session: AtomicU64::new(1),
            tunnels,
            usage: usage::Usage::default(),
        })
    }

    /// Where acknowledgements are recorded (ObjectSync).
    pub(crate) fn set_records(&self, w: objectsync::Writer) {
        let _ = self.records.set(w);
    }

    /// ObjectSync records written and failed.
    pub(crate) fn records(&self) -> (u64, u64) {
        self.records.get().map_or((0, 0), |w| {
            (
                w.written.load(Ordering::Relaxed),
                w.failed.load(Ordering::Relaxed),
            )
        })
    }

    /// Where sessions that came and went are told.
    /// Those open already are told as come.
    pub(crate) fn set_sessions(&self, s: Arc<devicecontroller::controller::Sessions>) {
        if self.sessions.set(s.clone()).is_err() {
            return;
        }
        for (node, st) in self.lock().iter() {
            if st.session.is_some() {
                s.arrived(node);
            }
        }
    }

    /// `node`'s session ended with no other open: its devices are no longer known to be as
    /// it last said.
    fn node_lost(&self, node: &str) {
        if let Some(s) = self.sessions.get() {
            s.lost(node);
        }
    }

    /// Where upstream messages go (the device controller's input).
    pub(crate) fn set_upstream(&self, tx: mpsc::Sender<(String, Message)>) {
        let _ = self.upstream.set(tx);
    }

    /// Where pod status messages (`podpatch`, `podstatus`) go: the edge controller's input.
    pub(crate) fn set_pod_upstream(&self, tx: mpsc::Sender<(String, Message)>) {
        let _ = self.pods.set(tx);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, NodeState>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Messages waiting for an acknowledgement, all nodes: all of them, and those written and
    /// not answered yet.
    pub(crate) fn pending(&self) -> (usize, usize) {
        let nodes = self.lock();
        let waiting = nodes.values().map(|n| n.unacked.len()).sum();
        let written = nodes.values().map(|n| n.unacked.in_flight()).sum();
        (waiting, written)
    }

    /// Frames waiting to be written to the nodes' sockets, all sessions.
    pub(crate) fn to_write(&self) -> usize {
        self.lock()
            .values()
            .filter_map(|n| n.session.as_ref())
            .map(|s| s.tx.max_capacity() - s.tx.capacity())
            .sum()
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
            if let Some(s) = self.sessions.get() {
                s.arrived(node);
            }
        }
        let now = Instant::now();
        st.unacked.restart(now);
        self.write_waiting(st, now);
        Some(id)
    }

    /// Asks `node` and waits up to `wait` for its answer (a `response` or `error` whose parent
    /// is the question): what the cloud reads from a gateway on demand, a device's history.
    /// Only an open session is asked; nothing is kept for a node that is away.
    pub(crate) async fn ask(
        &self,
        node: &str,
        question: Message,
        wait: Duration,
    ) -> Result<Message, Unanswered> {
        let key = (node.to_string(), question.header.id.clone());
        let frame = serde_json::to_string(&question).unwrap_or_default();
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let nodes = self.lock();
            let Some(session) = nodes.get(node).and_then(|n| n.session.as_ref()) else {
                return Err(Unanswered::Away(node.into()));
            };
            let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
            if asked.len() >= ASKED_LIMIT {
                return Err(Unanswered::Busy(node.into()));
            }
            asked.insert(key.clone(), tx);
            if session.tx.try_send(frame).is_err() {
                asked.remove(&key);
                return Err(Unanswered::Busy(node.into()));
            }
            self.metrics.frames_out.fetch_add(1, Ordering::Relaxed);
        }
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(answer)) => Ok(answer),
            _ => {
                self.asked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&key);
                Err(Unanswered::Late(node.into(), wait))
            }
        }
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
        if !fits(&msg) {
            // Not answered: an answer would carry the oversized route back into the queue of a
            // node that may never read it.
            self.metrics
                .refused_messages
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%node, resource_bytes = msg.route.resource.len(), "a node sent a message whose route or header is too long; dropped unanswered");
            return;
        }
        if matches!(msg.route.operation.as_str(), "response" | "error")
            && !msg.header.parent_id.is_empty()
        {
            let waiting = self
                .asked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&(node.to_string(), msg.header.parent_id.clone()));
            if let Some(tx) = waiting {
                let _ = tx.send(msg);
                return;
            }
        }
        if msg.route.operation == "response" && !msg.header.parent_id.is_empty() {
            let mut nodes = self.lock();
            if let Some(st) = nodes.get_mut(node)
                && let Ok(parent) = uuid::Uuid::parse_str(&msg.header.parent_id)
            {
                let now = Instant::now();
                if let Some((k, p)) = st.unacked.answered(parent.as_u128(), now) {
                    self.metrics.acked.fetch_add(1, Ordering::Relaxed);
                    if let Some(w) = self.records.get() {
                        w.record(objectsync::Record {
                            node: node.to_string(),
                            ack: p.ack(&k),
                            deleted: p.is_delete(),
                        });
                    }
                    // The window has room again.
                    self.write_waiting(st, now);
                }
            }
            return;
        }
        if msg.route.resource.is_empty() && msg.route.operation.is_empty() {
            // KubeEdge's edgehub sends one empty message as it stops.
            tracing::debug!(%node, "cloudhub: an empty message; ignored");
            return;
        }
        if trimmed(&msg.route.resource) == "membership/detail" {
            // KubeEdge's edge asks for its devices at every connect; KubeEdge's cloud sends
            // nothing back (the membership it keeps comes with each device), nor does this one.
            tracing::debug!(%node, "cloudhub: membership/detail asked; ignored, as KubeEdge's cloud does");
            return;
        }
        if matches!(msg.route.resource.as_str(), "metrics" | "node/metrics")
            || msg.route.resource == format!("node/{node}/metrics")
        {
            // What the node and its pods use: the latest kept for `kubectl top`, no answer.
            if msg.content.is_object() {
                self.usage.set(node, msg.content);
            }
            return;
        }
        let own = format!("node/{node}/");
        let mut msg = msg;
        // KubeEdge's edge sends most resources without the node (`{ns}/podpatch/{name}`);
        // cloudhub puts it in front, as KubeEdge's does.
        if !msg.route.resource.starts_with("node/") {
            msg.route.resource = format!("{own}{}", msg.route.resource);
        }
        if !msg.route.resource.starts_with(&own) {
            self.metrics
                .refused_messages
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%node, resource = %msg.route.resource, "a node sent about another node; refused");
            self.refuse(
                node,
                &msg,
                format!("node {node} may only send about itself ({own}...)"),
            );
            return;
        }
        let rest = &msg.route.resource[own.len()..];
        let kind = rest.split('/').nth(1).unwrap_or_default();
        let to = if rest.starts_with("device/") {
            // `device/{ns}/{name}/twin/edge_updated`, `.../state/update`.
            self.upstream.get()
        } else if matches!(
            kind,
            "podpatch" | "podstatus" | "node" | "nodepatch" | "lease"
        ) {
            self.pods.get()
        } else {
            // What KubeEdge's kubelet may also ask (ServiceAccount tokens, volumes, CSRs,
            // events): answered at once, so that its request fails instead of timing out.
            tracing::debug!(%node, %kind, op = %msg.route.operation, "cloudhub: a request this cloudcore does not serve");
            self.refuse(
                node,
                &msg,
                format!(
                    "cloudcore does not serve {kind:?} requests ({})",
                    msg.route.operation
                ),
            );
            return;
        };
        if let Some(up) = to {
            let _ = up.send((node.to_string(), msg)).await;
        }
    }

    /// Answers `msg` from `node` with an `error` saying `why`.
    fn refuse(&self, node: &str, msg: &Message, why: String) {
        let mut answer = Message::new(
            "cloudhub",
            &msg.route.group,
            "error",
            msg.route.resource.clone(),
            serde_json::Value::String(why),
        );
        answer.header.parent_id = msg.header.id.clone();
        self.deliver(node, None, answer, None);
    }

    fn deliver(&self, node: &str, ack: Option<AckKey>, message: Message, body: Option<Packed>) {
        let Ok(content) = serde_json::to_vec(&message.content) else {
            return;
        };
        let json = frame(&message.header, &message.route, &content);
        let mut nodes = self.lock();
        let st = nodes.entry(node.to_string()).or_default();
        // A message to acknowledge is written when its node's queue says (its window).
        let sent = match (&st.session, &ack) {
            (Some(s), None) => s.tx.try_send(json.clone()).is_ok(),
            _ => false,
        };
        if sent {
            self.metrics.frames_out.fetch_add(1, Ordering::Relaxed);
        }
        match ack {
            Some(k) => {
                let body = body.unwrap_or_else(|| Packed::new(&content));
                match Pending::new(&message, &k, body) {
                    Some(p) => {
                        st.unacked
                            .put((k.kind, k.namespace.into(), k.name.into()), p);
                        self.write_waiting(st, Instant::now());
                    }
                    None => {
                        self.metrics.dropped.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(%node, id = %message.header.id, "a message to acknowledge has no UUID or a newline in its route; dropped");
                    }
                }
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

    /// Writes what `st`'s queue says is due now (its window, its resends), as much as the
    /// session's way out takes.
    fn write_waiting(&self, st: &mut NodeState, now: Instant) {
        let Some(s) = &st.session else { return };
        // First what needs no answer and found the way out full.
        while let Some(t) = st.noack.pop_front() {
            if s.tx.try_send(text(&t)).is_err() {
                st.noack.push_front(t);
                return;
            }
            self.metrics.frames_out.fetch_add(1, Ordering::Relaxed);
        }
        let batch = st.unacked.next(now, self.settings.resend, s.tx.capacity());
        let n = batch.frames.len() as u64;
        for f in batch.frames {
            if s.tx.try_send(f).is_err() {
                // Not expected (the room was asked for under the lock); the queue writes it
                // again once its resend time has passed.
                break;
            }
        }
        self.metrics.frames_out.fetch_add(n, Ordering::Relaxed);
        self.metrics
            .resent
            .fetch_add(batch.resent, Ordering::Relaxed);
    }

    /// Writes, on every session, what is due (resends, and what a full way out held back).
    fn resend_due(&self, now: Instant) {
        let mut nodes = self.lock();
        for st in nodes.values_mut() {
            self.write_waiting(st, now);
        }
    }

    /// An acknowledgement recorded through another replica (an ObjectSync): what this hub
    /// keeps for the same object of `node`, at that version or older, is dropped (and a delete,
    /// once its record is gone). `rv: None`: the record was deleted.
    pub(crate) fn acknowledged_elsewhere(
        &self,
        node: &str,
        kind: &str,
        namespace: &str,
        name: &str,
        uid: &str,
        rv: Option<&str>,
    ) {
        let mut nodes = self.lock();
        let Some(st) = nodes.get_mut(node) else {
            return;
        };
        let dropped = st.unacked.retain(|k, p| {
            if k.0 != kind || &*k.1 != namespace || &*k.2 != name || &*p.uid != uid {
                return true;
            }
            match rv {
                None => !p.is_delete(),
                Some(rv) => p.is_delete() || !not_newer(&p.rv, rv),
            }
        });
        if dropped > 0 {
            self.metrics
                .acked_elsewhere
                .fetch_add(dropped as u64, Ordering::Relaxed);
        }
    }

    /// Resends every second until `stop`.
    pub(crate) fn spawn_resender(self: &Arc<Self>, stop: CancellationToken) {
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
        self.deliver(&out.node, out.ack, out.message, out.body);
    }
}

#[cfg(test)]
mod tests;
