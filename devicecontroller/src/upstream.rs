//! The upstream logic, pure: `twin/edge_updated` and `state/update` messages from nodes become
//! JSON merge patches of DeviceStatus objects. Reports are coalesced per device (the newest
//! value of each property wins, never an older one over a newer one: the edge's version of the
//! property, then its timestamp, decide; KubeEdge #5018), at most one patch per device per
//! interval, and each message is acknowledged only once what it carried is stored (or when it
//! carried nothing to store).

use api::message::Message;
use api::paths::Resource;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
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
    /// The messages this patch answers: `(node, message id)`.
    pub acks: Vec<(String, String)>,
    /// Reports folded into this plan beyond the first.
    pub coalesced: u64,
    /// When its oldest report arrived: plans are taken oldest first, so that under a sustained
    /// load beyond the writes in flight no device waits behind the others for ever.
    pub queued: Option<Instant>,
}

impl Plan {
    /// Nothing to write (its reports were all older than what is stored).
    pub fn is_empty(&self) -> bool {
        self.reported.is_empty()
            && self.observed.is_empty()
            && self.errors.is_empty()
            && self.state.is_none()
    }

    /// Folds `newer` in: each property keeps its newest value.
    fn merge(&mut self, newer: Plan) {
        self.queued = match (self.queued, newer.queued) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
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
        if newer.state.is_some() {
            self.state = newer.state;
            self.lost = newer.lost;
        }
        self.acks.extend(newer.acks);
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
}

/// The node whose reports make up a plan.
fn node_of(s: &Slot) -> &str {
    s.plan.acks.first().map_or("", |a| a.0.as_str())
}

/// The upstream state.
#[derive(Debug, Default)]
pub struct Upstream {
    pending: BTreeMap<Key, Slot>,
    /// The newest version stored of each property: reports older than it are dropped.
    stored: HashMap<Key, HashMap<String, Stamped>>,
    /// When each device was last patched.
    last_patch: HashMap<Key, Instant>,
    /// When each node's plan was last taken (a sequence number): beyond the limit, the nodes
    /// served longest ago go first.
    node_served: HashMap<String, u64>,
    serve_seq: u64,
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
        let content = match &msg.content {
            Value::String(s) => {
                serde_json::from_str(s).map_err(|e| Refusal::BadContent(e.to_string()))?
            }
            v => v.clone(),
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
                .unwrap_or(&content);
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
        plan.queued = Some(Instant::now());
        self.queue(key, plan);
        Ok(Taken::Queued)
    }

    /// Queues `plan` for device `key`, folded into what waits for it.
    fn queue(&mut self, key: Key, plan: Plan) {
        match self.pending.get_mut(&key) {
            Some(slot) => slot.plan.merge(plan),
            None => {
                let last_patch = self.last_patch.get(&key).copied();
                self.pending.insert(
                    key,
                    Slot {
                        plan,
                        not_before: None,
                        last_patch,
                    },
                );
            }
        }
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
                queued: Some(Instant::now()),
                ..Plan::default()
            };
            self.queue(key, plan);
        }
        n
    }

    /// The plans due now, at most `limit`: at most one per device per `interval`, and none
    /// waiting out a retry. Those beyond `limit` stay pending for a later call.
    ///
    /// Beyond `limit`, plans are taken fairly between nodes: one of each node before two of
    /// any, the nodes served longest ago first, and of each node the oldest first. A burst from many nodes does not hold back
    /// a node that reports now and then, and under a sustained load no device waits behind the
    /// others for ever. (Plain tuples sorted once: this runs whenever a write slot frees.)
    pub fn due(&mut self, now: Instant, interval: Duration, limit: usize) -> Vec<(Key, Plan)> {
        if limit == 0 || self.pending.is_empty() {
            return Vec::new();
        }
        let served = &self.node_served;
        // A node's devices are often next to each other: its served mark is looked up once per
        // run of them, not once per device.
        let mut memo: (&str, u64) = ("", 0);
        let mut ready: Vec<(u64, Option<Instant>, &Key, &str)> = self
            .pending
            .iter()
            .filter(|(_, s)| {
                s.not_before.is_none_or(|t| t <= now)
                    && s.last_patch
                        .is_none_or(|t| now.duration_since(t) >= interval)
            })
            .map(|(k, s)| {
                let node = node_of(s);
                if memo.0 != node || node.is_empty() {
                    memo = (node, served.get(node).copied().unwrap_or(0));
                }
                (memo.1, s.plan.queued, k, node)
            })
            .collect();
        if ready.len() > limit {
            // Each plan's rank among its node's (oldest 0); then by rank, so that every node
            // gets one before any gets two, the nodes served longest ago first.
            ready.sort_unstable_by(|a, b| (a.3, a.1).cmp(&(b.3, b.1)));
            let mut ranked: Vec<(usize, u64, Option<Instant>, &Key, &str)> =
                Vec::with_capacity(ready.len());
            let mut rank = 0;
            for (i, (served, queued, k, node)) in ready.iter().enumerate() {
                rank = if i > 0 && ready[i - 1].3 == *node {
                    rank + 1
                } else {
                    0
                };
                ranked.push((rank, *served, *queued, *k, *node));
            }
            ranked.select_nth_unstable(limit);
            ranked.truncate(limit);
            ranked.sort_unstable();
            ready = ranked
                .into_iter()
                .map(|(_, served, queued, k, node)| (served, queued, k, node))
                .collect();
        }
        let mut taken = Vec::with_capacity(ready.len());
        let mut last = "";
        for (_, _, k, node) in ready {
            if node != last {
                self.serve_seq += 1;
                last = node;
            }
            taken.push((k.clone(), node.to_string()));
        }
        let seq = self.serve_seq;
        for (_, node) in &taken {
            match self.node_served.get_mut(node.as_str()) {
                Some(v) => *v = seq,
                None => {
                    self.node_served.insert(node.clone(), seq);
                }
            }
        }
        let ready = taken.into_iter().map(|(k, _)| k);
        ready
            .filter_map(|k| {
                let mut plan = self.pending.remove(&k)?.plan;
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
        match self.pending.remove(&key) {
            Some(newer) => {
                let mut p = plan;
                p.merge(newer.plan);
                self.pending.insert(
                    key,
                    Slot {
                        plan: p,
                        not_before: Some(retry_at),
                        last_patch,
                    },
                );
            }
            None => {
                self.pending.insert(
                    key,
                    Slot {
                        plan,
                        not_before: Some(retry_at),
                        last_patch,
                    },
                );
            }
        }
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
                status["extensions"] = json!({STATE_REASON: reason, STATE_SINCE: since});
                mark_stale(&mut status, Some(since));
            }
            None => {
                if had {
                    status["extensions"] = json!({STATE_REASON: null, STATE_SINCE: null});
                }
                mark_stale(&mut status, None);
            }
        }
    }
    json!({"status": status})
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
mod tests {
    use super::*;

    fn twin_msg(
        node: &str,
        device: &str,
        prop: &str,
        value: &str,
        version: i64,
        ts: i64,
    ) -> Message {
        Message::new(
            "twin",
            "twin",
            "update",
            format!("node/{node}/device/default/{device}/twin/edge_updated"),
            json!({"event_id": "e", "timestamp": ts, "twin": {prop: {
                "actual": {"value": value, "metadata": {"timestamp": ts}},
                "metadata": {"type": "int"},
                "actual_version": {"cloud": 0, "edge": version}}}}),
        )
    }

    fn facts<'a>(node: &'a str) -> impl FnOnce(&str, &str) -> Option<DeviceFacts<'a>> {
        move |_, name| {
            (name != "unknown").then(|| DeviceFacts {
                node: Some(node),
                properties: vec!["temperature", "setpoint"],
            })
        }
    }

    #[test]
    fn older_reports_that_arrive_while_a_newer_patch_is_in_flight_are_dropped() {
        let mut u = Upstream::new();
        let t0 = Instant::now();
        let msg = |v: &str, ver| twin_msg("n1", "d1", "temperature", v, ver, 100 * ver);
        assert_eq!(
            u.accept("n1", &msg("80", 3), facts("n1")),
            Ok(Taken::Queued)
        );
        let (k, first) = u.due(t0, Duration::ZERO, usize::MAX).remove(0);
        // While the first patch is being written, older reports arrive.
        assert_eq!(
            u.accept("n1", &msg("60", 1), facts("n1")),
            Ok(Taken::Queued)
        );
        assert_eq!(
            u.accept("n1", &msg("70", 2), facts("n1")),
            Ok(Taken::Queued)
        );
        u.stored(&k, &first);
        let (_, next) = u.due(t0, Duration::ZERO, usize::MAX).remove(0);
        assert!(
            next.reported.is_empty(),
            "70 (edge version 2) must not overwrite 80 (version 3): {:?}",
            next.reported
        );
        assert_eq!(next.acks.len(), 2, "both are still answered");
    }

    #[test]
    fn under_a_load_beyond_the_limit_the_oldest_plans_go_first() {
        let mut u = Upstream::new();
        let t0 = Instant::now();
        // "zz" sorts last by name but reports first.
        assert_eq!(
            u.accept(
                "n1",
                &twin_msg("n1", "zz", "temperature", "1", 1, 1),
                facts("n1")
            ),
            Ok(Taken::Queued)
        );
        std::thread::sleep(Duration::from_millis(2));
        for d in ["a1", "a2", "a3"] {
            assert_eq!(
                u.accept(
                    "n1",
                    &twin_msg("n1", d, "temperature", "1", 1, 1),
                    facts("n1")
                ),
                Ok(Taken::Queued)
            );
        }
        let first = u.due(t0, Duration::ZERO, 1);
        assert_eq!(
            first[0].0.1, "zz",
            "the oldest report goes first, whatever its name"
        );
    }

    #[test]
    fn beyond_the_limit_a_quiet_node_is_not_held_back_by_a_busy_one() {
        let mut u = Upstream::new();
        let t0 = Instant::now();
        let busy = |d: &str| twin_msg("busy", d, "temperature", "1", 1, 1);
        for i in 0..50 {
            let d = format!("b{i:02}");
            assert_eq!(
                u.accept("busy", &busy(&d), facts("busy")),
                Ok(Taken::Queued)
            );
        }
        std::thread::sleep(Duration::from_millis(2));
        // The quiet node reports after the busy node's burst.
        assert_eq!(
            u.accept(
                "quiet",
                &twin_msg("quiet", "q1", "temperature", "7", 1, 1),
                facts("quiet")
            ),
            Ok(Taken::Queued)
        );
        let first: Vec<String> = u
            .due(t0, Duration::ZERO, 4)
            .into_iter()
            .map(|(k, _)| k.1)
            .collect();
        assert!(first.contains(&"q1".to_string()), "{first:?}");
        // The busy node's oldest go first among its own.
        assert!(first.contains(&"b00".to_string()), "{first:?}");
        // More of the busy node keep coming, older than the quiet node's next report; the
        // quiet node, served less recently, still goes in the next call.
        assert_eq!(
            u.accept(
                "quiet",
                &twin_msg("quiet", "q2", "temperature", "8", 2, 2),
                facts("quiet")
            ),
            Ok(Taken::Queued)
        );
        let next: Vec<String> = u
            .due(t0, Duration::ZERO, 2)
            .into_iter()
            .map(|(k, _)| k.1)
            .collect();
        assert!(next.contains(&"q2".to_string()), "{next:?}");
        // Nothing is lost: everything left comes in later calls.
        let mut rest = 0;
        while !u.due(t0, Duration::ZERO, 7).is_empty() {
            rest += 1;
            assert!(rest < 100);
        }
        assert_eq!(u.pending(), 0);
    }

    #[test]
    fn due_plans_beyond_the_limit_wait_for_a_later_call() {
        let mut u = Upstream::new();
        let t0 = Instant::now();
        for d in ["d1", "d2", "d3"] {
            let taken = u.accept(
                "n1",
                &twin_msg("n1", d, "temperature", "1", 1, 100),
                facts("n1"),
            );
            assert_eq!(taken, Ok(Taken::Queued));
        }
        assert_eq!(u.due(t0, Duration::ZERO, 2).len(), 2);
        assert_eq!(u.pending(), 1, "the third stays pending");
        let rest = u.due(t0, Duration::ZERO, 2);
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].1.reported["temperature"].value, "1");
        assert!(u.due(t0, Duration::ZERO, 2).is_empty());
    }

    #[test]
    fn out_of_order_and_duplicate_reports_keep_the_newest() {
        let mut u = Upstream::new();
        let t0 = Instant::now();
        for (v, ver, ts) in [
            ("30", 3, 300),
            ("10", 1, 100),
            ("30", 3, 300),
            ("20", 2, 200),
        ] {
            let taken = u.accept(
                "n1",
                &twin_msg("n1", "d1", "temperature", v, ver, ts),
                facts("n1"),
            );
            assert_eq!(taken, Ok(Taken::Queued));
        }
        let due = u.due(t0, Duration::from_millis(100), usize::MAX);
        assert_eq!(due.len(), 1, "one patch for four reports");
        let (key, plan) = &due[0];
        assert_eq!(plan.reported["temperature"].value, "30");
        assert_eq!(plan.acks.len(), 4, "every report is answered once stored");
        assert_eq!(plan.coalesced, 3);
        u.stored(key, plan);
        // An older report after the store changes nothing, and is answered at once.
        let late = u.accept(
            "n1",
            &twin_msg("n1", "d1", "temperature", "25", 2, 250),
            facts("n1"),
        );
        assert_eq!(late, Ok(Taken::Nothing));
        let body = patch_body(&json!({}), plan, &["temperature"]);
        assert_eq!(
            body,
            json!({"status": {"twins": [{"propertyName": "temperature",
                "reported": {"value": "30", "metadata": {"timestamp": "300", "type": "int"}}}]}})
        );
    }

    #[test]
    fn a_burst_for_one_device_is_a_handful_of_patches() {
        let mut u = Upstream::new();
        let start = Instant::now();
        let mut patches = 0;
        for i in 0..10_000i64 {
            let now = start + Duration::from_micros(i as u64 * 50);
            u.accept(
                "n1",
                &twin_msg("n1", "d1", "temperature", &i.to_string(), i + 1, i),
                facts("n1"),
            )
            .expect("taken");
            for (k, p) in u.due(now, Duration::from_millis(100), usize::MAX) {
                patches += 1;
                u.stored(&k, &p);
            }
        }
        // 10,000 reports over 0.5 s: one patch per 100 ms.
        assert!(patches <= 6, "{patches} patches");
    }

    #[test]
    fn reports_about_other_nodes_devices_and_foreign_properties() {
        let mut u = Upstream::new();
        let e = u
            .accept(
                "n2",
                &twin_msg("n2", "d1", "temperature", "1", 1, 1),
                facts("n1"),
            )
            .expect_err("not n2's device");
        assert_eq!(
            e,
            Refusal::OtherNode {
                device: "default/d1".into(),
                node: "n2".into()
            }
        );
        let e = u
            .accept(
                "n2",
                &twin_msg("n1", "d1", "temperature", "1", 1, 1),
                facts("n1"),
            )
            .expect_err("a resource of another node");
        assert!(matches!(e, Refusal::OtherNode { .. }), "{e:?}");
        let foreign = u.accept(
            "n1",
            &twin_msg("n1", "d1", "humidity", "1", 1, 1),
            facts("n1"),
        );
        assert_eq!(
            foreign,
            Ok(Taken::Nothing),
            "a property not in the spec is ignored"
        );
        let unknown = u.accept(
            "n1",
            &twin_msg("n1", "unknown", "temperature", "1", 1, 1),
            facts("n1"),
        );
        assert_eq!(unknown, Ok(Taken::Nothing));
        assert_eq!(u.pending(), 0);
    }

    #[test]
    fn a_failed_patch_waits_and_keeps_newer_values() {
        let mut u = Upstream::new();
        let t0 = Instant::now();
        u.accept(
            "n1",
            &twin_msg("n1", "d1", "temperature", "1", 1, 1),
            facts("n1"),
        )
        .expect("taken");
        let (k, p) = u.due(t0, Duration::ZERO, usize::MAX).remove(0);
        u.accept(
            "n1",
            &twin_msg("n1", "d1", "temperature", "2", 2, 2),
            facts("n1"),
        )
        .expect("taken");
        u.failed(k, p, t0 + Duration::from_secs(1));
        assert!(
            u.due(t0, Duration::ZERO, usize::MAX).is_empty(),
            "waits out its retry"
        );
        let (_, p) = u
            .due(t0 + Duration::from_secs(1), Duration::ZERO, usize::MAX)
            .remove(0);
        assert_eq!(p.reported["temperature"].value, "2");
        assert_eq!(
            p.acks.len(),
            2,
            "both reports still answered only when stored"
        );
    }

    /// A node that lost its link: each of its devices is planned `unknown`, with nothing to
    /// acknowledge; a report queued before keeps its values.
    #[test]
    fn a_lost_node_makes_its_devices_unknown() {
        let mut u = Upstream::new();
        let keys = vec![
            ("default".to_string(), "d1".to_string()),
            ("default".to_string(), "d2".to_string()),
        ];
        let since = "2026-11-27T12:00:00Z";
        assert_eq!(u.node_lost("n1", since, keys.clone()), 2);
        let due = u.due(Instant::now(), Duration::ZERO, usize::MAX);
        assert_eq!(due.len(), 2);
        let current = json!({"status": {"state": "online", "twins": [
            {"propertyName": "temperature", "reported": {"value": "80", "metadata": {"timestamp": "1"}}}]}});
        for (k, plan) in due {
            assert!(keys.contains(&k));
            assert_eq!(plan.state, Some(("unknown".to_string(), String::new())));
            assert!(plan.acks.is_empty() && plan.reported.is_empty());
            // Why and since when; the values kept, marked stale since then.
            let body = patch_body(&current, &plan, &["temperature"]);
            assert_eq!(body["status"]["state"], "unknown");
            assert_eq!(
                body["status"]["extensions"],
                json!({"stateReason": "node n1 lost its link to the cloud", "stateSince": since})
            );
            let t = &body["status"]["twins"][0]["reported"];
            assert_eq!(
                (&t["value"], &t["metadata"]["stale"]),
                (&json!("80"), &json!(since))
            );
        }
        // The node's next state report clears the reason and the marks.
        let lost = json!({"status": {"state": "unknown",
            "extensions": {"stateReason": "node n1 lost its link to the cloud", "stateSince": since, "other": "kept"},
            "twins": [{"propertyName": "temperature", "reported": {"value": "80", "metadata": {"timestamp": "1", "stale": since}}}]}});
        let back = Message::new(
            "twin",
            "twin",
            "update",
            "node/n1/device/default/d1/state/update",
            json!({"event_id": "e", "timestamp": 1, "device": {"state": "online", "lastOnlineTime": "2026-11-27T12:01:00Z"}}),
        );
        assert_eq!(u.accept("n1", &back, facts("n1")), Ok(Taken::Queued));
        let (_, p) = u.due(Instant::now(), Duration::ZERO, usize::MAX).remove(0);
        let body = patch_body(&lost, &p, &["temperature"]);
        assert_eq!(body["status"]["state"], "online");
        assert_eq!(
            body["status"]["extensions"],
            json!({"stateReason": null, "stateSince": null}),
            "a merge patch that removes the two keys and keeps the others"
        );
        assert_eq!(
            body["status"]["twins"][0]["reported"]["metadata"],
            json!({"timestamp": "1"})
        );
    }

    /// A desired value the edge applied says who set it: a value set at the edge over the
    /// spec's is an override the pages show.
    #[test]
    fn the_source_of_an_applied_desired_value_is_kept() {
        let mut u = Upstream::new();
        let m = Message::new(
            "twin",
            "twin",
            "update",
            "node/n1/device/default/d1/twin/edge_updated",
            json!({"event_id": "e", "timestamp": 5, "twin": {"setpoint": {
                "expected": {"value": "75", "metadata": {"timestamp": 5, "source": "edge"}},
                "metadata": {"type": "int"},
                "expected_version": {"cloud": 0, "edge": 1}}}}),
        );
        assert_eq!(u.accept("n1", &m, facts("n1")), Ok(Taken::Queued));
        let (_, p) = u.due(Instant::now(), Duration::ZERO, usize::MAX).remove(0);
        let body = patch_body(&json!({}), &p, &["setpoint"]);
        assert_eq!(
            body["status"]["twins"][0]["observedDesired"],
            json!({"value": "75", "metadata": {"timestamp": "5", "type": "int", "source": "edge"}})
        );
    }

    #[test]
    fn state_reports_and_the_answer() {
        let mut u = Upstream::new();
        let m = Message::new(
            "twin",
            "twin",
            "update",
            "node/n1/device/default/d1/state/update",
            json!({"event_id": "e", "timestamp": 1, "Device": {"state": "online", "lastOnlineTime": "2026-11-24T10:00:00Z"}}),
        );
        assert_eq!(u.accept("n1", &m, facts("n1")), Ok(Taken::Queued));
        let (_, p) = u.due(Instant::now(), Duration::ZERO, usize::MAX).remove(0);
        let body = patch_body(
            &json!({"status": {"twins": [{"propertyName": "gone"}]}}),
            &p,
            &["temperature"],
        );
        assert_eq!(
            body,
            json!({"status": {"twins": [], "state": "online", "lastOnlineTime": "2026-11-24T10:00:00Z"}})
        );
        let a = ack("n1", &m.header.id);
        assert_eq!(
            (
                a.route.resource.as_str(),
                a.route.operation.as_str(),
                a.route.group.as_str()
            ),
            ("node/n1/twin", "response", "twin")
        );
        assert_eq!(a.header.parent_id, m.header.id);
        assert_eq!(a.content, json!("OK"));
    }
}
