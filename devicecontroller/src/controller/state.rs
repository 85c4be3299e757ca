//! The controller's state and its one task: watch events in, messages to the hub, DeviceStatus
//! creates and patches and profile ConfigMaps out (at most `max_in_flight` writes at once),
//! what each write came back with folded in. The decisions are the pure `Downstream` and
//! `Upstream`; this module keeps their inputs current and carries their outputs out.

use crate::downstream::Downstream;
use crate::profile;
use crate::upstream::{self, DeviceFacts, Plan, Taken, Upstream};
use api::bus::Outbound;
use api::message::Message;
use api::packed::Packed;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::objectsync::{Delivered, list_delivered, watch_records};
use super::{Config, Key, Metrics, NodeMeta, PROFILE_LABEL, gvk};
use api::bus::Hub;

/// The kinds whose watches feed the downstream logic.
#[derive(Clone, Copy, Debug)]
enum Watched {
    Device = 0,
    Model = 1,
}

impl Watched {
    fn name(self) -> &'static str {
        match self {
            Self::Device => "Device",
            Self::Model => "DeviceModel",
        }
    }
}

/// What an API write spawned by the controller came back with.
enum WriteDone {
    /// A create: the object made; `Err(true)` when it existed already.
    StatusCreated(Key, Result<Value, bool>),
    /// A DeviceStatus read before its first patch here: `Ok(None)` when there is none.
    StatusRead(Key, Result<Option<Value>, kube::Error>),
    /// The DeviceStatus objects that exist (the leader's list).
    ExistingStatuses(HashSet<Key>),
    Patched(Key, Box<Plan>, Result<Answered, kube::Error>),
    Profile((String, String), Option<String>),
    /// Profile ConfigMaps found at start-up: `(namespace, node)`.
    ExistingProfiles(Vec<(String, String)>),
}

pub(super) struct Reconciler {
    client: kube::Client,
    hub: Arc<dyn Hub>,
    config: Config,
    metrics: Arc<Metrics>,
    down: Downstream,
    up: Upstream,
    /// The DeviceStatus of each device this controller writes, as its last write or read here
    /// left it (the version is the next patch's precondition). Not watched: a DeviceStatus
    /// changes with every report of the fleet, and this controller writes only its own nodes'.
    statuses: HashMap<Key, StatusEntry>,
    /// Devices whose DeviceStatus is being read, made or patched: one at a time each.
    status_inflight: HashSet<Key>,
    /// Devices whose DeviceStatus could not be read: not asked again before then.
    read_after: HashMap<Key, Instant>,
    /// Per [`Watched`] kind: its first full list is in.
    listed: [bool; 2],
    /// The ObjectSync records' first list is in.
    records_listed: bool,
    /// Per [`Watched`] kind, during a (re)list: the keys it has brought so far.
    relist: [Option<HashSet<Key>>; 2],
    /// What nodes acknowledged before this start (their ObjectSync records), used once by the
    /// first reconcile.
    delivered: Vec<Delivered>,
    /// Node objects in the API, once listed (`None` before).
    registered: Option<HashSet<String>>,
    /// During a (re)list of Nodes: the names it has brought so far.
    nodes_relist: Option<HashSet<String>>,
    dirty_nodes: BTreeSet<String>,
    /// `(namespace, node)` -> the hash of the profile JSON last written.
    profiles: HashMap<(String, String), u64>,
    profile_inflight: HashSet<(String, String)>,
    last_profiles: Instant,
    /// When each node's profile was last made: a node of thousands of devices that keeps
    /// changing (being given them) gets its profile at most every [`profile_every`].
    profile_made: HashMap<String, Instant>,
    attempts: HashMap<Key, u32>,
    /// DeviceStatus creates and patches spawned and not done: at most `max_in_flight`. What
    /// waits beyond that is a key in `create_queue` or a plan in `up`, not a task with its body.
    writes_active: usize,
    /// Devices whose DeviceStatus is to be created, in order; `create_queued` holds the same keys.
    create_queue: VecDeque<Key>,
    create_queued: HashSet<Key>,
    /// Profile ConfigMap writes spawned and not done. Profiles are large (a node's devices, all
    /// their visitors): at most [`PROFILE_WRITES`] at once, and a profile's text is made only
    /// when its write starts, so that texts of every node do not pile up.
    profile_active: usize,
    done_tx: mpsc::Sender<WriteDone>,
    done_rx: Option<mpsc::Receiver<WriteDone>>,
    started: Instant,
    /// The node gauges (nodes with devices, devices on unregistered nodes) need counting again:
    /// done at most every [`GAUGES_EVERY`], not per event (they walk every node).
    gauges_stale: bool,
    gauges_at: Instant,
}

/// How often the gauges that walk every node are counted again, at most.
const GAUGES_EVERY: Duration = Duration::from_millis(500);

fn key_of(v: &Value) -> Option<Key> {
    Some((
        v["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string(),
        v["metadata"]["name"].as_str()?.to_string(),
    ))
}

impl Reconciler {
    pub(super) fn new(
        client: kube::Client,
        hub: Arc<dyn Hub>,
        config: Config,
        metrics: Arc<Metrics>,
    ) -> Self {
        let (done_tx, done_rx) = mpsc::channel(4096);
        Self {
            client,
            hub,
            config,
            metrics,
            down: Downstream::new(),
            up: Upstream::new(),
            statuses: HashMap::new(),
            status_inflight: HashSet::new(),
            read_after: HashMap::new(),
            listed: [false; 2],
            records_listed: false,
            relist: [None, None],
            delivered: Vec::new(),
            registered: None,
            nodes_relist: None,
            dirty_nodes: BTreeSet::new(),
            profiles: HashMap::new(),
            profile_inflight: HashSet::new(),
            last_profiles: Instant::now(),
            profile_made: HashMap::new(),
            attempts: HashMap::new(),
            writes_active: 0,
            create_queue: VecDeque::new(),
            create_queued: HashSet::new(),
            profile_active: 0,
            done_tx,
            done_rx: Some(done_rx),
            started: Instant::now(),
            gauges_stale: false,
            gauges_at: Instant::now(),
        }
    }

    pub(super) async fn run(
        mut self,
        mut up_rx: mpsc::Receiver<(String, Message)>,
        sessions: Arc<super::Sessions>,
        cancel: CancellationToken,
    ) {
        // Replicas: each node's messages go from the replica that holds its session; what the
        // others acknowledged through other replicas is followed (their ObjectSync records).
        // Alone: what nodes acknowledged before this start, read once.
        let mut records = if self.config.shared {
            self.down.share();
            Some(watch_records(&self.client))
        } else {
            self.delivered = list_delivered(&self.client).await;
            self.records_listed = true;
            None
        };
        let all = |kind: &str| Api::<DynamicObject>::all_with(self.client.clone(), &gvk(kind));
        let mut devices = watcher(all("Device"), watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut models = watcher(all("DeviceModel"), watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut nodes = watcher(
            Api::<NodeMeta>::all(self.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .boxed();
        let mut done_rx = self.done_rx.take().unwrap_or_else(|| mpsc::channel(1).1);
        let mut leader = self.config.leader.clone();
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                Some(ev) = devices.next() => self.object_event(Watched::Device, ev),
                Some(ev) = models.next() => self.object_event(Watched::Model, ev),
                Some(ev) = async { match records.as_mut() {
                    Some(r) => r.next().await,
                    None => std::future::pending().await,
                } } => self.record_event(ev),
                Some(ev) = nodes.next() => self.node_event(ev),
                Some((node, msg)) = up_rx.recv() => self.report(&node, msg),
                _ = sessions.notify.notified() => {
                    for (node, here) in sessions.take() {
                        if here {
                            self.arrived(&node);
                        } else {
                            self.lost(&node);
                        }
                    }
                }
                Some(done) = done_rx.recv() => {
                    // The writes that came back free their slots: they are filled at once,
                    // not at the next tick (under a load, slots stood empty between ticks).
                    self.done(done);
                    while let Ok(more) = done_rx.try_recv() {
                        self.done(more);
                    }
                    self.flush();
                }
                Some(Ok(())) = async { match leader.as_mut() {
                    Some(l) => Some(l.changed().await),
                    None => std::future::pending().await,
                } } => self.leadership_changed(),
                _ = tick.tick() => self.flush(),
            }
        }
    }

    fn send(&mut self, out: Vec<Outbound>) {
        for o in out {
            self.dirty_nodes.insert(o.node.clone());
            self.metrics.messages_sent.fetch_add(1, Ordering::Relaxed);
            self.hub.send(o);
        }
        self.metrics
            .devices
            .store(self.down.device_count() as u64, Ordering::Relaxed);
        self.gauges_stale = true;
    }

    /// Counts the gauges that walk every node, if they changed and were not counted within
    /// [`GAUGES_EVERY`].
    fn gauges(&mut self, now: Instant) {
        if !self.gauges_stale || now.duration_since(self.gauges_at) < GAUGES_EVERY {
            return;
        }
        self.gauges_stale = false;
        self.gauges_at = now;
        let nodes = self.down.nodes();
        self.metrics
            .nodes
            .store(nodes.len() as u64, Ordering::Relaxed);
        if let Some(reg) = &self.registered {
            let unregistered: usize = nodes
                .iter()
                .filter(|n| !reg.contains(*n))
                .map(|n| self.down.devices_on(n))
                .sum();
            self.metrics
                .devices_on_unregistered_nodes
                .store(unregistered as u64, Ordering::Relaxed);
        }
    }

    /// A Node watch event. A node whose Node object is deleted starts over: when it is back,
    /// it is sent everything it must hold (a reinstalled gateway has nothing).
    fn node_event(&mut self, ev: Result<watcher::Event<NodeMeta>, watcher::Error>) {
        let Some(ev) = event("Node", ev) else {
            return;
        };
        self.metrics.watch_events.fetch_add(1, Ordering::Relaxed);
        self.metrics.node_events.fetch_add(1, Ordering::Relaxed);
        let name = |o: &NodeMeta| o.metadata.name.clone().unwrap_or_default();
        match ev {
            watcher::Event::Init => self.nodes_relist = Some(HashSet::new()),
            watcher::Event::InitApply(o) => {
                if let Some(seen) = self.nodes_relist.as_mut() {
                    seen.insert(name(&o));
                }
            }
            watcher::Event::Apply(o) => {
                let n = name(&o);
                let back = self
                    .registered
                    .as_mut()
                    .is_some_and(|r| r.insert(n.clone()));
                if back && self.down.is_synced() {
                    let out = self.down.reconcile_node(&n);
                    self.send(out);
                }
            }
            watcher::Event::Delete(o) => self.node_gone(&name(&o)),
            watcher::Event::InitDone => {
                let seen = self.nodes_relist.take().unwrap_or_default();
                let before = self.registered.replace(seen.clone()).unwrap_or_default();
                for n in before.difference(&seen) {
                    self.node_gone(n);
                }
                for n in seen.difference(&before) {
                    if self.down.is_synced() {
                        let out = self.down.reconcile_node(n);
                        self.send(out);
                    }
                }
            }
        }
        self.metrics.nodes_registered.store(
            self.registered.as_ref().map_or(0, HashSet::len) as u64,
            Ordering::Relaxed,
        );
        self.send(Vec::new());
    }

    fn node_gone(&mut self, node: &str) {
        if let Some(r) = self.registered.as_mut() {
            r.remove(node);
        }
        tracing::info!(%node, "Node deleted: it is sent everything again when it is back");
        self.down.forget_node(node);
    }

    /// A Device or DeviceModel watch event. After a (re)list, what the list no longer holds
    /// is deleted.
    fn object_event(
        &mut self,
        kind: Watched,
        ev: Result<watcher::Event<DynamicObject>, watcher::Error>,
    ) {
        let Some(ev) = event(kind.name(), ev) else {
            return;
        };
        self.metrics.watch_events.fetch_add(1, Ordering::Relaxed);
        let i = kind as usize;
        let t0 = Instant::now();
        let live = matches!(ev, watcher::Event::Apply(_) | watcher::Event::Delete(_));
        self.object_event_inner(kind, i, ev);
        if live {
            self.metrics.reconcile.observe(t0.elapsed());
        }
    }

    fn object_event_inner(&mut self, kind: Watched, i: usize, ev: watcher::Event<DynamicObject>) {
        match ev {
            watcher::Event::Init => self.relist[i] = Some(HashSet::new()),
            watcher::Event::InitApply(o) | watcher::Event::Apply(o) => {
                let v = serde_json::to_value(&o).unwrap_or(Value::Null);
                let key = key_of(&v);
                if let (Some(seen), Some(k)) = (self.relist[i].as_mut(), &key) {
                    seen.insert(k.clone());
                }
                let new = key
                    .as_ref()
                    .is_some_and(|k| self.down.properties(&k.0, &k.1).is_none());
                let out = match kind {
                    Watched::Device => self.down.device_applied(&v),
                    Watched::Model => self.down.model_applied(&v),
                };
                self.send(out);
                if let (Watched::Device, Some(k)) = (kind, key) {
                    self.ensure_status(&k, new);
                }
            }
            watcher::Event::Delete(o) => {
                let v = serde_json::to_value(&o).unwrap_or(Value::Null);
                self.deleted(kind, &v);
            }
            watcher::Event::InitDone => {
                if let Some(seen) = self.relist[i].take() {
                    let keys = match kind {
                        Watched::Device => self.down.device_keys(),
                        Watched::Model => self.down.model_keys(),
                    };
                    for (ns, n) in keys.into_iter().filter(|k| !seen.contains(k)) {
                        let last = match kind {
                            Watched::Device => self.down.device(&ns, &n),
                            Watched::Model => self.down.model(&ns, &n),
                        };
                        if let Some(v) = last {
                            self.deleted(kind, &v);
                        }
                    }
                }
                self.listed[i] = true;
                self.maybe_synced();
            }
        }
    }

    fn deleted(&mut self, kind: Watched, v: &Value) {
        let out = match kind {
            Watched::Device => {
                if let Some(k) = key_of(v) {
                    self.up.forget(&k);
                }
                self.down.device_deleted(v)
            }
            Watched::Model => self.down.model_deleted(v),
        };
        self.send(out);
    }

    fn maybe_synced(&mut self) {
        if self.listed.iter().all(|l| *l) && self.records_listed && !self.down.is_synced() {
            for d in std::mem::take(&mut self.delivered) {
                self.down
                    .seed_delivered(&d.node, d.kind, d.key, &d.uid, &d.resource_version);
            }
            for node in self.down.mark_synced() {
                let out = self.down.reconcile_node(&node);
                self.send(out);
            }
            self.metrics
                .reconcile_micros
                .store(self.started.elapsed().as_micros() as u64, Ordering::Relaxed);
            tracing::info!(
                devices = self.down.device_count(),
                nodes = self.down.nodes().len(),
                took = ?self.started.elapsed(),
                "device controller synced"
            );
            self.ensure_all_statuses();
            if self.config.profiles {
                self.find_existing_profiles();
            }
        }
    }

    /// Profile ConfigMaps written before this start (labelled with their node): those of nodes
    /// that no longer have devices there are deleted by the next profile round.
    fn find_existing_profiles(&self) {
        let (client, done) = (self.client.clone(), self.done_tx.clone());
        tokio::spawn(async move {
            let api: Api<ConfigMap> = Api::all(client);
            let lp = kube::api::ListParams::default().labels(PROFILE_LABEL);
            match api.list_metadata(&lp).await {
                Ok(list) => {
                    let found = list
                        .items
                        .into_iter()
                        .filter_map(|m| {
                            let ns = m.metadata.namespace?;
                            let node = m.metadata.labels?.get(PROFILE_LABEL)?.clone();
                            Some((ns, node))
                        })
                        .collect();
                    let _ = done.send(WriteDone::ExistingProfiles(found)).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list the profile ConfigMaps of an earlier run")
                }
            }
        });
    }

    /// A node lost its link (its session here ended): its devices are `unknown` until it
    /// reports again; on replicas, its messages now go from the replica it goes to.
    fn lost(&mut self, node: &str) {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let since = k8s_openapi::jiff::Timestamp::from_second(now)
            .map(|t| t.to_string())
            .unwrap_or_default();
        let n = self.up.node_lost(node, &since, self.down.devices_of(node));
        self.down.disown(node);
        self.owned_gauge();
        tracing::info!(%node, devices = n, "devicecontroller: a node lost its link; its devices are unknown until it reports again");
    }

    /// A node's session came to this replica: it is sent what it did not acknowledge.
    fn arrived(&mut self, node: &str) {
        let out = self.down.own(node);
        self.send(out);
        self.owned_gauge();
    }

    fn owned_gauge(&self) {
        if self.config.shared {
            self.metrics
                .nodes_owned
                .store(self.down.owned_count() as u64, Ordering::Relaxed);
        }
    }

    /// An ObjectSync record (replicas): before the first reconcile, what nodes acknowledged
    /// before this start; after it, what the nodes of other replicas acknowledge there.
    fn record_event(&mut self, ev: Result<watcher::Event<DynamicObject>, watcher::Error>) {
        let Some(ev) = event("ObjectSync", ev) else {
            return;
        };
        self.metrics.watch_events.fetch_add(1, Ordering::Relaxed);
        self.metrics.record_events.fetch_add(1, Ordering::Relaxed);
        let of = |o: &DynamicObject| {
            serde_json::to_value(o)
                .ok()
                .and_then(|v| super::objectsync::delivered_of(&v))
        };
        match ev {
            watcher::Event::Init => {
                if !self.down.is_synced() {
                    self.delivered.clear();
                }
            }
            watcher::Event::InitApply(o) | watcher::Event::Apply(o) => {
                let Some(d) = of(&o) else {
                    return;
                };
                if !self.down.is_synced() {
                    self.delivered.push(d);
                } else if !self.down.owns(&d.node) {
                    self.down
                        .seed_delivered(&d.node, d.kind, d.key, &d.uid, &d.resource_version);
                }
            }
            watcher::Event::Delete(o) => {
                if let Some(d) = of(&o)
                    && self.down.is_synced()
                    && !self.down.owns(&d.node)
                {
                    self.down.undelivered(&d.node, d.kind, &d.key);
                }
            }
            watcher::Event::InitDone => {
                self.records_listed = true;
                self.maybe_synced();
            }
        }
    }

    fn leading(&self) -> bool {
        self.config.leader.as_ref().is_none_or(|l| *l.borrow())
    }

    /// Became leader: every device's DeviceStatus is checked and every node's profile written
    /// (what the previous leader left undone).
    fn leadership_changed(&mut self) {
        if !self.leading() {
            return;
        }
        tracing::info!(
            "device controller: leading; DeviceStatus objects and profiles are written here"
        );
        self.ensure_all_statuses();
        let nodes = self.down.nodes();
        self.dirty_nodes.extend(nodes.iter().map(|n| n.to_string()));
    }
}

/// Profile ConfigMap writes at once.
const PROFILE_WRITES: usize = 2;

/// How often a node's profile is made at most: `interval`, and as much again for each 250 of its
/// devices (making one reads every device of the node, and its ConfigMap grows with them: a
/// gateway being given 5,000 devices had a multi-megabyte profile rewritten five times a
/// second, most of cloudcore's work while it applied them).
fn profile_every(interval: Duration, devices: usize) -> Duration {
    interval.saturating_mul(1 + u32::try_from(devices / 250).unwrap_or(u32::MAX))
}

/// What the controller keeps of a DeviceStatus: its version and its twins, as JSON text (a
/// whole parsed object costs ten times as much, for every device of a site).
#[derive(Debug)]
struct StatusEntry {
    rv: u64,
    /// `{"status": {"twins": [...]}}` (with `extensions` when the cloud set the state, so that
    /// the next report clears it), compressed when large.
    doc: Packed,
}

/// What the controller reads of the DeviceStatus a patch was answered with: its version and
/// the text of its twins (and its extensions). The rest of the object is skipped unread, and
/// the twins are kept as the text they came in: each patch's answer was read into a whole
/// object, copied into a tree, and the twins copied and written out again.
#[derive(Debug, Default, serde::Deserialize)]
pub(super) struct Answered {
    #[serde(default)]
    metadata: AnsweredMeta,
    #[serde(default)]
    status: AnsweredStatus,
}

#[derive(Debug, Default, serde::Deserialize)]
struct AnsweredMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct AnsweredStatus {
    #[serde(default)]
    twins: Option<Box<serde_json::value::RawValue>>,
    #[serde(default)]
    extensions: Option<Value>,
}

impl StatusEntry {
    /// The entry of a patch's answer: what [`StatusEntry::of`] makes of the same object.
    fn answered(a: &Answered) -> Self {
        let twins = a.status.twins.as_ref().map_or("null", |t| t.get());
        let mut doc = String::with_capacity(twins.len() + 64);
        doc.push_str("{\"status\":{");
        if let Some(ext) = &a.status.extensions
            && ext.get(upstream::STATE_REASON).is_some()
        {
            doc.push_str("\"extensions\":");
            doc.push_str(&ext.to_string());
            doc.push(',');
        }
        doc.push_str("\"twins\":");
        doc.push_str(twins);
        doc.push_str("}}");
        Self {
            rv: a
                .metadata
                .resource_version
                .as_deref()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            doc: Packed::new(doc.as_bytes()),
        }
    }

    fn of(v: &Value) -> Self {
        let mut doc = json!({"status": {"twins": v["status"]["twins"]}});
        let ext = &v["status"]["extensions"];
        if ext.get(upstream::STATE_REASON).is_some() {
            doc["status"]["extensions"] = ext.clone();
        }
        Self {
            rv: rv_num(v),
            doc: Packed::new(doc.to_string().as_bytes()),
        }
    }

    fn value(&self) -> Value {
        serde_json::from_slice(&self.doc.bytes()).unwrap_or(Value::Null)
    }
}

/// What the controller keeps of a profile it wrote: a hash of its text.
fn text_hash(t: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    t.hash(&mut h);
    h.finish()
}

fn rv_num(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A watch's event, or `None` when the watch failed (said in the log; kube-rs's watcher
/// retries by itself).
fn event<T>(
    what: &str,
    ev: Result<watcher::Event<T>, watcher::Error>,
) -> Option<watcher::Event<T>> {
    ev.map_err(|e| tracing::warn!(kind = what, error = %e, "watch failed; it retries"))
        .ok()
}

mod status;
#[cfg(test)]
mod tests;
