//! The upstream logic, pure: `twin/edge_updated` and `state/update` messages from nodes become
//! JSON merge patches of DeviceStatus objects. Reports are coalesced per device (the newest
//! value of each property wins, never an older one over a newer one: the edge's version of the
//! property, then its timestamp, decide; KubeEdge #5018), at most one patch per device per
//! interval, and each message is acknowledged only once what it carried is stored (or when it
//! carried nothing to store).

use api::message::Message;
use api::paths::Resource;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

pub type Key = (String, String);

/// Why a message was not taken.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// Not a device report this controller handles.
    NotForUs(String),
    /// A node reporting about a device that is not bound to it.
    OtherNode { device: String, node: String },
    /// The content does not parse.
    BadContent(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotForUs(r) => write!(f, "resource {r} is not a device report"),
            Self::OtherNode { device, node } => {
                write!(f, "device {device} is not bound to node {node}")
            }
            Self::BadContent(e) => write!(f, "content does not parse: {e}"),
        }
    }
}

/// A property value and when the edge took it.
#[derive(Debug, Clone, PartialEq)]
pub struct Stamped {
    pub value: String,
    pub timestamp: i64,
    pub kind: String,
    /// The edge's version of the property (`actual_version.edge`), 0 when absent.
    pub version: i64,
    /// Who set a desired value the edge applied (`edge` or `cloud`, its `metadata.source`);
    /// empty when the edge does not say.
    pub source: String,
}

impl Stamped {
    fn newer_than(&self, other: &Stamped) -> bool {
        (self.version, self.timestamp) > (other.version, other.timestamp)
    }
}

/// What one device's next patch carries.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub reported: BTreeMap<String, Stamped>,
    pub observed: BTreeMap<String, Stamped>,
    /// Why a property's read failed and why its desired value was refused (`""`: none), as
    /// the edge last said.
    pub errors: BTreeMap<String, (String, String)>,
    pub state: Option<(String, String)>,
    /// Set with `state` when the cloud, not the edge, decided it: why (`node edge-2 lost its
    /// link to the cloud`) and since when (RFC 3339). A state the edge reports clears it.
    pub lost: Option<(String, String)>,
    /// The alarms the edge told (`api::alarm::Alarm` as JSON), by rule: the newest of each.
    pub alarms: BTreeMap<String, Value>,
    /// The messages this patch answers: `(node, message id)`.
    pub acks: Vec<(String, String)>,
    /// Reports folded into this plan beyond the first.
    pub coalesced: u64,
    /// The node whose device it is (whose reports it carries, or that lost its link).
    pub node: String,
    /// When the first of the reports folded in was queued (its wait counts from then) and
    /// when the newest was: set as it is queued.
    pub queued_at: Option<Instant>,
    pub last_report: Option<Instant>,
}

impl Plan {
    /// Nothing to write (its reports were all older than what is stored).
    pub fn is_empty(&self) -> bool {
        self.reported.is_empty()
            && self.observed.is_empty()
            && self.errors.is_empty()
            && self.state.is_none()
            && self.alarms.is_empty()
    }

    /// Folds `newer` in: each property keeps its newest value.
    fn merge(&mut self, newer: Plan) {
        for (k, v) in newer.reported {
            match self.reported.get(&k) {
                Some(cur) if !v.newer_than(cur) => {}
                _ => {
                    self.reported.insert(k, v);
                }
            }
        }
        for (k, v) in newer.observed {
            match self.observed.get(&k) {
                Some(cur) if !v.newer_than(cur) => {}
                _ => {
                    self.observed.insert(k, v);
                }
            }
        }
        self.errors.extend(newer.errors);
        self.alarms.extend(newer.alarms);
        if newer.state.is_some() {
            self.state = newer.state;
            self.lost = newer.lost;
        }
        self.acks.extend(newer.acks);
        if self.node.is_empty() {
            self.node = newer.node;
        }
        self.queued_at = match (self.queued_at, newer.queued_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_report = self.last_report.max(newer.last_report);
        self.coalesced += 1 + newer.coalesced;
    }
}

#[derive(Debug, Default)]
struct Slot {
    plan: Plan,
    not_before: Option<Instant>,
    /// When its device was last patched, as `last_patch` said when this was queued (a
    /// pending device is not patched meanwhile): [`Upstream::due`] reads it here rather than
    /// hashing every pending key.
    last_patch: Option<Instant>,
    /// Its entry in its node's queue (an entry whose number is not its slot's is stale).
    seq: u64,
}

/// The upstream state.
#[derive(Debug, Default)]
pub struct Upstream {
    pending: HashMap<Key, Slot>,
    /// Per node with plans pending: its devices in the order their plans were queued (the
    /// oldest first), each with its slot's number.
    queues: HashMap<String, VecDeque<(u64, Key)>>,
    /// The nodes of `queues`, each once, the one served longest ago first: [`Upstream::due`]
    /// takes one plan of each in turn, so its cost is the plans it takes, not those pending.
    ring: VecDeque<String>,
    /// The nodes that reported within [`FRESH`], each once, served in turn before the others
    /// (see [`Upstream::due`]); dropped when found no longer fresh.
    fresh_ring: VecDeque<String>,
    /// When each node of `fresh_ring` last reported.
    heard: HashMap<String, Instant>,
    /// How long the plans taken lately had waited since queued (a moving average): a plan
    /// that waited twice as long is overdue, taken whether fresh or not.
    typical_wait: Duration,
    seq: u64,
    /// The newest version stored of each property: reports older than it are dropped.
    stored: HashMap<Key, HashMap<String, Stamped>>,
    /// When each device was last patched.
    last_patch: HashMap<Key, Instant>,
}

/// How recent a report is to count as fresh: see [`Upstream::due`].
pub const FRESH: Duration = Duration::from_secs(1);

/// Goes round `ring` from its front, taking what `visit` picks of each node, until `limit` are
/// taken or every node in it was visited in a row without one. `visit` gives `None` for a node
/// to leave the ring with nothing taken, or whether it stays (at the back) and what it took.
fn go_round(
    ring: &mut VecDeque<String>,
    taken: &mut Vec<Key>,
    limit: usize,
    mut visit: impl FnMut(&str) -> Option<(bool, Option<Key>)>,
) {
    // Nodes visited in a row without a plan taken: once every node in the ring was, none
    // has one.
    let mut idle = 0;
    while taken.len() < limit && idle < ring.len() {
        let Some(node) = ring.pop_front() else {
            break;
        };
        let Some((stays, picked)) = visit(&node) else {
            continue;
        };
        if stays {
            ring.push_back(node);
        }
        match picked {
            Some(k) => {
                idle = 0;
                taken.push(k);
            }
            None => idle += 1,
        }
    }
}

/// The oldest entry of a node's queue whose slot `take` accepts, out of the queue; entries
/// left by forgotten or requeued devices are dropped on the way.
fn pick(
    q: &mut VecDeque<(u64, Key)>,
    pending: &HashMap<Key, Slot>,
    take: impl Fn(&Slot) -> bool,
) -> Option<Key> {
    let mut i = 0;
    while i < q.len() {
        let (seq, key) = &q[i];
        match pending.get(key) {
            Some(s) if s.seq == *seq => {
                if take(s) {
                    return q.remove(i).map(|(_, k)| k);
                }
                i += 1;
            }
            _ => {
                q.remove(i);
            }
        }
    }
    None
}

fn stamped(twin: &Value, side: &str, version_key: &str) -> Option<Stamped> {
    let v = &twin[side];
    let value = v["value"].as_str()?;
    Some(Stamped {
        value: value.to_string(),
        timestamp: v["metadata"]["timestamp"].as_i64().unwrap_or(0),
        kind: twin["metadata"]["type"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        version: twin[version_key]["edge"].as_i64().unwrap_or(0),
        source: v["metadata"]["source"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    })
}

/// What the controller knows of a device when a report for it arrives.
pub struct DeviceFacts<'a> {
    /// `spec.nodeName`.
    pub node: Option<&'a str>,
    /// The names of `spec.properties`.
    pub properties: Vec<&'a str>,
}

/// What became of an accepted message.
#[derive(Debug, PartialEq)]
pub enum Taken {
    /// Queued for the next patch of its device; acknowledged once stored.
    Queued,
    /// Nothing in it to store (unknown device, properties not in the spec, older values):
    /// acknowledge it now.
    Nothing,
}

impl Upstream {
    pub fn new() -> Self {
        Self::default()
    }

    /// Devices with something waiting.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Takes a message from `node`. `facts` looks the device up.
    pub fn accept<'a>(
        &mut self,
        node: &str,
        msg: &Message,
        facts: impl FnOnce(&str, &str) -> Option<DeviceFacts<'a>>,
    ) -> Result<Taken, Refusal> {
        let (device, is_twin) = match Resource::parse(&msg.route.resource) {
            Ok(Resource::TwinEdgeUpdated { node: n, device }) if n == node => (device, true),
            Ok(Resource::StateUpdate { node: n, device }) if n == node => (device, false),
            Ok(Resource::TwinEdgeUpdated { device, .. } | Resource::StateUpdate { device, .. }) => {
                return Err(Refusal::OtherNode {
                    device: device.to_string(),
                    node: node.to_string(),
                });
            }
            _ => return Err(Refusal::NotForUs(msg.route.resource.clone())),
        };
        // KubeEdge sends the content as a JSON string; an object is read where it is.
        let parsed: Value;
        let content = match &msg.content {
            Value::String(s) => {
                parsed = serde_json::from_str(s).map_err(|e| Refusal::BadContent(e.to_string()))?;
                &parsed
            }
            v => v,
        };
        if !content.is_object() {
            return Err(Refusal::BadContent("not a JSON object".into()));
        }
        let Some(f) = facts(&device.namespace, &device.name) else {
            return Ok(Taken::Nothing);
        };
        if f.node != Some(node) {
            return Err(Refusal::OtherNode {
                device: device.to_string(),
                node: node.to_string(),
            });
        }
        let key = (device.namespace.clone(), device.name.clone());
        let mut plan = Plan::default();
        if let Some(alarms) = content["alarms"].as_object() {
            for (rule, a) in alarms {
                if a.is_object() && rule.len() <= 63 {
                    plan.alarms.insert(rule.clone(), a.clone());
                }
            }
        }
        if is_twin {
            let Some(twins) = content["twin"].as_object() else {
                return Err(Refusal::BadContent("no \"twin\" object".into()));
            };
            let stored = self.stored.get(&key);
            for (name, t) in twins {
                // Properties not in the spec are ignored, as KubeEdge does.
                if !f.properties.contains(&name.as_str()) {
                    continue;
                }
                let older = |s: &Stamped, which: &str| {
                    stored
                        .and_then(|m| m.get(&format!("{which}/{name}")))
                        .is_some_and(|cur| !s.newer_than(cur))
                };
                if let Some(s) = stamped(t, "actual", "actual_version")
                    && !older(&s, "reported")
                {
                    plan.reported.insert(name.clone(), s);
                }
                if let Some(s) = stamped(t, "expected", "expected_version")
                    && !older(&s, "observed")
                {
                    plan.observed.insert(name.clone(), s);
                }
                if let Some(e) = t.get("errors").filter(|e| e.is_object()) {
                    let text = |k: &str| e[k].as_str().unwrap_or_default().to_string();
                    plan.errors
                        .insert(name.clone(), (text("read"), text("write")));
                }
            }
        } else {
            let d = content
                .get("Device")
                .or_else(|| content.get("device"))
                .unwrap_or(content);
            let state = d["state"].as_str().unwrap_or_default().to_string();
            let online = d["lastOnlineTime"].as_str().unwrap_or_default().to_string();
            if !state.is_empty() || !online.is_empty() {
                plan.state = Some((state, online));
            }
        }
        if plan.is_empty() {
            return Ok(Taken::Nothing);
        }
        plan.acks.push((node.to_string(), msg.header.id.clone()));
        plan.node = node.to_string();
        self.queue(key, plan, node);
        Ok(Taken::Queued)
    }

    /// Queues `plan` for device `key` of `node`, folded into what waits for it.
    fn queue(&mut self, key: Key, mut plan: Plan, node: &str) {
        let now = Instant::now();
        plan.queued_at = Some(now);
        plan.last_report = Some(now);
        match self.heard.get_mut(node) {
            Some(t) => *t = now,
            None => {
                self.heard.insert(node.to_string(), now);
                self.fresh_ring.push_back(node.to_string());
            }
        }
        match self.pending.get_mut(&key) {
            Some(slot) => slot.plan.merge(plan),
            None => {
                let last_patch = self.last_patch.get(&key).copied();
                self.insert(key, plan, None, last_patch, node);
            }
        }
    }

    /// A new slot for `key`, at the end of `node`'s queue.
    fn insert(
        &mut self,
        key: Key,
        plan: Plan,
        not_before: Option<Instant>,
        last_patch: Option<Instant>,
        node: &str,
    ) {
        self.seq += 1;
        let seq = self.seq;
        match self.queues.get_mut(node) {
            Some(q) => q.push_back((seq, key.clone())),
            None => {
                self.queues
                    .insert(node.to_string(), VecDeque::from([(seq, key.clone())]));
                self.ring.push_back(node.to_string());
            }
        }
        self.pending.insert(
            key,
            Slot {
                plan,
                not_before,
                last_patch,
                seq,
            },
        );
    }

    /// `node` lost its link to the cloud: each of `devices` (its own) is `unknown` in its
    /// DeviceStatus until the node reports again (what it last said may no longer hold: a
    /// dead gateway's devices must not look alive). Returns how many were queued.
    pub fn node_lost(&mut self, node: &str, since: &str, devices: Vec<Key>) -> usize {
        let n = devices.len();
        for key in devices {
            let plan = Plan {
                state: Some(("unknown".to_string(), String::new())),
                lost: Some((
                    format!("node {node} lost its link to the cloud"),
                    since.to_string(),
                )),
                node: node.to_string(),
                ..Plan::default()
            };
            self.queue(key, plan, node);
        }
        n
    }

    /// The plans due now, at most `limit`: at most one per device per `interval`, and none
    /// waiting out a retry. Those beyond `limit` stay pending for a later call.
    ///
    /// Beyond `limit`, plans are taken fairly between nodes: one of each node before two of
    /// any, the nodes served longest ago first, and of each node the oldest first. A burst
    /// from many nodes does not hold back a node that reports now and then, and under a
    /// sustained load no device waits behind the others for ever. It costs the plans taken
    /// (and the devices of a node passed over as not yet due), not the plans pending: it runs
    /// whenever write slots free, with tens of thousands pending under a load.
    ///
    /// When there are more plans than writes, fresh ones go first: the nodes that reported
    /// within [`FRESH`] are served in turn before the others, each with its oldest plan whose
    /// newest report is that fresh, or one that waited twice as long as the plans taken lately
    /// (overdue). A device is then written about as often as before (its plan's wait counts
    /// from its first report), but with a value just reported rather than one up to a report
    /// interval old; and a device that reports rarely is not held back by those reporting
    /// often, once it is overdue. The other plans are taken with what room is left.
    pub fn due(&mut self, now: Instant, interval: Duration, limit: usize) -> Vec<(Key, Plan)> {
        let mut taken = Vec::new();
        let overdue = self.typical_wait * 2 + FRESH;
        let ready = |s: &Slot| {
            s.not_before.is_none_or(|t| t <= now)
                && s.last_patch
                    .is_none_or(|t| now.duration_since(t) >= interval)
        };
        let fresh = |s: &Slot| {
            ready(s)
                && (s
                    .plan
                    .last_report
                    .is_some_and(|t| now.saturating_duration_since(t) <= FRESH)
                    || s.plan
                        .queued_at
                        .is_some_and(|t| now.saturating_duration_since(t) >= overdue))
        };
        let (queues, pending, heard) = (&mut self.queues, &self.pending, &mut self.heard);
        go_round(&mut self.fresh_ring, &mut taken, limit, |node| {
            let fresh_q = heard
                .get(node)
                .filter(|h| now.saturating_duration_since(**h) <= FRESH)
                .and(queues.get_mut(node))
                .filter(|q| !q.is_empty());
            let Some(q) = fresh_q else {
                heard.remove(node);
                return None;
            };
            // An emptied queue stays until the ring of all nodes passes it (so that the node
            // is never in that ring twice).
            Some((true, pick(q, pending, fresh)))
        });
        go_round(&mut self.ring, &mut taken, limit, |node| {
            let q = queues.get_mut(node)?;
            let picked = pick(q, pending, ready);
            let keep = !q.is_empty();
            if !keep {
                queues.remove(node);
            }
            Some((keep, picked))
        });
        taken
            .into_iter()
            .filter_map(|k| {
                let mut plan = self.pending.remove(&k)?.plan;
                if let Some(t) = plan.queued_at {
                    let wait = now.saturating_duration_since(t);
                    self.typical_wait = (self.typical_wait * 7 + wait) / 8;
                }
                // What was stored since these reports were queued (a patch that was in flight
                // then) may be newer: an older value never goes over a newer one.
                if let Some(floor) = self.stored.get(&k) {
                    let newer = |which: &str, name: &String, s: &Stamped| {
                        floor
                            .get(&format!("{which}/{name}"))
                            .is_none_or(|cur| s.newer_than(cur))
                    };
                    plan.reported.retain(|n, s| newer("reported", n, s));
                    plan.observed.retain(|n, s| newer("observed", n, s));
                }
                self.last_patch.insert(k.clone(), now);
                Some((k, plan))
            })
            .collect()
    }

    /// The patch of `plan` was stored: its versions become the floor for later reports.
    pub fn stored(&mut self, key: &Key, plan: &Plan) {
        let m = self.stored.entry(key.clone()).or_default();
        for (k, v) in &plan.reported {
            m.insert(format!("reported/{k}"), v.clone());
        }
        for (k, v) in &plan.observed {
            m.insert(format!("observed/{k}"), v.clone());
        }
    }

    /// The patch of `plan` failed: it waits until `retry_at`, folded under anything newer that
    /// arrived meanwhile.
    pub fn failed(&mut self, key: Key, plan: Plan, retry_at: Instant) {
        let last_patch = self.last_patch.get(&key).copied();
        let mut p = plan;
        if let Some(newer) = self.pending.remove(&key) {
            p.merge(newer.plan);
        }
        let node = p.node.clone();
        self.insert(key, p, Some(retry_at), last_patch, &node);
    }

    /// Forgets a deleted device.
    pub fn forget(&mut self, key: &Key) {
        self.pending.remove(key);
        self.stored.remove(key);
        self.last_patch.remove(key);
    }
}

/// The merge patch of a DeviceStatus: the whole `twins` array (as KubeEdge patches it) from the
/// current one with `plan` applied, keeping only properties in `properties`; state and
/// lastOnlineTime when reported.
pub fn patch_body(current: &Value, plan: &Plan, properties: &[&str]) -> Value {
    let mut twins: Vec<Value> = current["status"]["twins"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|t| {
            t["propertyName"]
                .as_str()
                .is_some_and(|n| properties.contains(&n))
        })
        .collect();
    let mut set = |name: &str, field: &str, s: &Stamped| {
        let mut v = json!({"value": s.value, "metadata": {"timestamp": s.timestamp.to_string(), "type": s.kind}});
        if !s.source.is_empty() {
            v["metadata"]["source"] = json!(s.source);
        }
        match twins.iter_mut().find(|t| t["propertyName"] == json!(name)) {
            Some(t) => {
                // A new value keeps the errors the edge said stand (it says when they clear).
                for key in ["error", "writeError"] {
                    if let Some(e) = t[field]["metadata"].get(key).cloned() {
                        v["metadata"][key] = e;
                    }
                }
                t[field] = v;
            }
            None => twins.push(json!({"propertyName": name, field: v})),
        }
    };
    for (k, s) in &plan.reported {
        set(k, "reported", s);
    }
    for (k, s) in &plan.observed {
        set(k, "observedDesired", s);
    }
    // Errors ride in the reported value's metadata (a map of strings in KubeEdge's schema):
    // `error` for a failed read, `writeError` for a refused desired value.
    for (k, (read, write)) in &plan.errors {
        let Some(meta) = twins
            .iter_mut()
            .find(|t| t["propertyName"] == json!(k))
            .and_then(|t| t["reported"]["metadata"].as_object_mut())
        else {
            continue;
        };
        for (key, text) in [("error", read), ("writeError", write)] {
            if text.is_empty() {
                meta.remove(key);
            } else {
                meta.insert(key.into(), json!(text));
            }
        }
    }
    let mut status = json!({"twins": twins});
    let mut ext = serde_json::Map::new();
    if !plan.alarms.is_empty() {
        // The alarms that stand, by rule, in the status' `extensions` (free-form in
        // KubeEdge's schema); one that ended leaves.
        let alarms: serde_json::Map<String, Value> = plan
            .alarms
            .iter()
            .map(|(rule, a)| {
                let v = if a["ended"].as_bool() == Some(true) {
                    Value::Null
                } else {
                    a.clone()
                };
                (rule.clone(), v)
            })
            .collect();
        ext.insert(ALARMS.into(), alarms.into());
    }
    if let Some((state, online)) = &plan.state {
        if !state.is_empty() {
            status["state"] = json!(state);
        }
        if !online.is_empty() {
            status["lastOnlineTime"] = json!(online);
        }
        // Decided by the cloud (the node went away): why and since when, in the status'
        // `extensions` (free-form in KubeEdge's schema), and each reported value marked stale
        // since then. The edge's next state report clears both.
        let had = current["status"]["extensions"]
            .as_object()
            .is_some_and(|e| e.contains_key(STATE_REASON));
        match &plan.lost {
            Some((reason, since)) => {
                ext.insert(STATE_REASON.into(), json!(reason));
                ext.insert(STATE_SINCE.into(), json!(since));
                mark_stale(&mut status, Some(since));
            }
            None => {
                if had {
                    ext.insert(STATE_REASON.into(), Value::Null);
                    ext.insert(STATE_SINCE.into(), Value::Null);
                }
                mark_stale(&mut status, None);
            }
        }
    }
    if !ext.is_empty() {
        status["extensions"] = ext.into();
    }
    json!({"status": status})
}

/// `status.extensions` key of the alarms that stand, by rule.
pub const ALARMS: &str = "alarms";

/// One Kubernetes Event the edge's report makes on its Device: an alarm's change, or a desired
/// value set on the gateway.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceEvent {
    pub reason: &'static str,
    /// `Warning` for a raised alarm or a rule that cannot be evaluated, `Normal` otherwise.
    pub warning: bool,
    /// The field it is about (`spec.properties{setpoint}.desired`), if one.
    pub field: Option<String>,
    pub message: String,
    /// When it happened (ms since the epoch).
    pub at: i64,
}

impl DeviceEvent {
    fn new(reason: &'static str, warning: bool, message: String, at: i64) -> Self {
        Self {
            reason,
            warning,
            field: None,
            message,
            at,
        }
    }
}

/// The reason of the Event that says who set a desired value (the API's own audit's).
pub const DESIRED_VALUE_SET: &str = "DesiredValueSet";

/// The Events `plan` makes against `current` (the DeviceStatus as stored): each desired value
/// set on the gateway (its local API, kectl, MQTT: the audit the API keeps of its own writes),
/// and each change of an alarm: raised, cleared, acknowledged (several when the edge's reports
/// were folded, each said once), a rule that cannot be evaluated.
pub fn device_events(current: &Value, plan: &Plan, node: &str) -> Vec<DeviceEvent> {
    use api::alarm::Change;
    let mut out = Vec::new();
    for (property, s) in &plan.observed {
        if s.source != "edge" {
            continue;
        }
        let was = current["status"]["twins"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["propertyName"] == property.as_str()))
            .map(|t| &t["observedDesired"]);
        if was.is_some_and(|w| w["value"] == s.value.as_str() && w["metadata"]["source"] == "edge")
        {
            continue;
        }
        let before = match was.and_then(|w| w["value"].as_str()) {
            Some(w) if w != s.value => format!(" (was {w})"),
            _ => String::new(),
        };
        let mut e = DeviceEvent::new(
            DESIRED_VALUE_SET,
            false,
            format!(
                "{property} set to {}{before} on the gateway {node}",
                s.value
            ),
            s.timestamp,
        );
        e.field = Some(format!("spec.properties{{{property}}}.desired"));
        out.push(e);
    }
    for (rule, a) in &plan.alarms {
        let was = &current["status"]["extensions"][ALARMS][rule];
        let int = |v: &Value, k: &str| v[k].as_i64();
        let what = |a: &Value| {
            format!(
                "{rule} ({}): {}",
                a["severity"].as_str().unwrap_or("major"),
                a["message"].as_str().unwrap_or_default()
            )
        };
        let since = int(a, "since").unwrap_or(0);
        if a["ended"].as_bool() == Some(true) && a["active"].as_bool() == Some(true) {
            // Its rule was removed while it stood.
            if !was.is_null() {
                out.push(DeviceEvent::new(
                    Change::Removed.reason(),
                    false,
                    format!("{rule}: its rule was removed"),
                    since,
                ));
            }
            continue;
        }
        let new_occurrence = int(was, "since") != Some(since);
        if let Some(why) = a["error"].as_str() {
            if was["error"].as_str() != Some(why) {
                out.push(DeviceEvent::new(
                    Change::Unevaluable.reason(),
                    true,
                    format!("{rule}: cannot be evaluated: {why}"),
                    since,
                ));
            }
            continue;
        }
        let raised = a["active"].as_bool() == Some(true) || a.get("clearedAt").is_some();
        if raised && (new_occurrence || was["active"].as_bool().is_none()) {
            out.push(DeviceEvent::new(
                Change::Raised.reason(),
                true,
                what(a),
                since,
            ));
        }
        // Acknowledged, cleared: each said once (again for a new occurrence).
        let acked = format!(
            "{rule} acknowledged by {}",
            a["ackedBy"].as_str().unwrap_or("someone")
        );
        for (field, change, message) in [
            ("ackedAt", Change::Acknowledged, acked),
            ("clearedAt", Change::Cleared, format!("{rule} cleared")),
        ] {
            if let Some(at) = int(a, field)
                && (new_occurrence || int(was, field).is_none())
            {
                out.push(DeviceEvent::new(change.reason(), false, message, at));
            }
        }
    }
    out.sort_by_key(|e| e.at);
    out
}

/// `status.extensions` keys: why the cloud set the device's state, and since when.
pub const STATE_REASON: &str = "stateReason";
pub const STATE_SINCE: &str = "stateSince";

/// Marks each twin's reported value stale since `since`, or clears the marks.
fn mark_stale(status: &mut Value, since: Option<&String>) {
    let Some(twins) = status["twins"].as_array_mut() else {
        return;
    };
    for t in twins {
        let Some(meta) = t["reported"]["metadata"].as_object_mut() else {
            continue;
        };
        match since {
            Some(s) => {
                meta.insert("stale".into(), json!(s));
            }
            None => {
                meta.remove("stale");
            }
        }
    }
}

/// The answer KubeEdge's cloud sends once a report is stored: resource `node/{node}/twin`,
/// group `twin`, operation `response`, `parent_msg_id` = the report's id, content `"OK"`.
pub fn ack(node: &str, report_id: &str) -> Message {
    let mut m = Message::new(
        api::message::source::DEVICE_CONTROLLER,
        api::message::group::TWIN,
        api::message::operation::RESPONSE,
        format!("node/{node}/twin"),
        Value::String(api::message::ACK_CONTENT.into()),
    );
    m.header.parent_id = report_id.to_string();
    m
}

#[cfg(test)]
mod tests;
