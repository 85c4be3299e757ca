//! The store on etcd: the same in-memory view as on SQLite, filled from etcd and kept current by
//! one etcd watch, so that several API servers (cloudcore replicas) serve one set of objects.
//!
//! - An object is the key `{prefix}{resource}/{namespace}/{name}` (namespace empty when
//!   cluster-scoped), its value the object's JSON without `resourceVersion`: the
//!   resourceVersion is etcd's revision of the key's last change (`mod_revision`), as a
//!   kube-apiserver gives it.
//! - A write is a transaction that compares the key's `mod_revision` with the version the
//!   write was decided on (or that the key is absent, for a create): when another server
//!   changed the object first, the write is decided again on the newer object (at most
//!   [`ATTEMPTS`] times, then `409 Conflict`). It answers once this server's view holds it
//!   (read your writes: the server's own code reads the view after it writes), except a
//!   grouped write (below), which answers once etcd committed it: under a fleet's load the
//!   view is behind by up to a second, and every DeviceStatus write paid that. A read of the
//!   latest objects still sees it (it waits for the view to hold etcd's revision,
//!   [`EtcdStore::fresh`]); a watch from its version sends what follows once the view has it.
//! - Watches are served from the view's recent history; one from an older version is served
//!   from etcd's own history (a watch on the resource's keys from that revision), and gets
//!   `410 Gone` once etcd compacted it. Every `compactEvery` the store compacts etcd to the
//!   revision it had reached one period before, as a kube-apiserver does every five minutes.

use super::client::{Etcd, EtcdError, pb, prefix_end};
use super::{
    Done, EtcdOptions, Event, EventType, Feed, Key, MutateFn, Obj, Objects, Outcome, Tables,
};
use crate::status::Status;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};

/// How many times a write is decided again after other servers changed its object first.
const ATTEMPTS: usize = 16;

/// The longest a read or a write waits for this server's view to hold etcd's revision (or
/// the write) before answering from the view as it is.
const CATCH_UP: Duration = Duration::from_secs(10);

/// The longest a read waits to learn etcd's revision before serving the view as it is.
const FRESH_WITHIN: Duration = Duration::from_secs(1);

/// The replay's marker, after a resource's prefix: a "namespace" that starts with a NUL, which
/// no object's can.
const MARKER: &str = "\u{0}replay/";

/// The most events a replay from etcd's history gathers; beyond, the watch gets `410 Gone`.
const REPLAY_MAX: usize = 50_000;

/// Keys read per request while loading.
const PAGE: i64 = 500;

pub(super) struct EtcdStore {
    client: Etcd,
    /// The same members on connections of their own for the view's watch (every change of
    /// the fleet, megabytes a second) and replays, apart from the writes and reads.
    watcher: Etcd,
    prefix: String,
    /// The revision the view holds (every change up to it applied).
    applied: watch::Sender<u64>,
    /// Writes of [`GROUPED`] objects waiting to be committed together.
    group: mpsc::Sender<Grouped>,
    /// Per resource, the newest revision of a write this server answered. A write is answered
    /// once etcd committed it, before the view may hold it; what this server itself reads of
    /// those resources to decide a later request (a namespace, a role, a model) waits for them
    /// ([`EtcdStore::own_writes`]), and nothing else does.
    own: std::sync::Mutex<HashMap<Arc<str>, u64>>,
    /// Fault injection for tests (`APISERVER_FAULT_VIEW_LAG_MS`): each change reaches the
    /// view this much later, as under a fleet's load, so that every read of the view after a
    /// write is tried against a view that is behind.
    lag: Option<Duration>,
}

/// The resources whose changes of many objects are committed in one etcd transaction when
/// they come at once: DeviceStatus, which every device's reports change (thousands a
/// second in a fleet), where etcd's cost per transaction was half of the machine's work.
const GROUPED: &[&str] = &["devicestatuses.devices.kubeedge.io"];

/// At most this many objects, and this many bytes, in one grouped transaction (etcd takes
/// 128 operations and 1.5 MiB by default).
const GROUP_OPS: usize = 64;
const GROUP_BYTES: usize = 512 << 10;

/// Grouped transactions in flight at once: while they are, the writes that come wait and
/// go together in the next.
const GROUPS_IN_FLIGHT: usize = 4;

/// One write waiting for a grouped transaction.
struct Grouped {
    compare: pb::Compare,
    op: pb::RequestOp,
    bytes: usize,
    reply: oneshot::Sender<GroupOutcome>,
}

/// What became of a write in a group.
#[derive(Clone, Copy)]
enum GroupOutcome {
    /// Committed at this revision (every object of the group has it).
    Committed(u64),
    /// Not committed: it is written alone (its precondition or another's in the group was
    /// refused, or etcd could not be reached). `true` when the group's outcome is not known
    /// (it may have been applied).
    Alone(bool),
}

type View = Arc<RwLock<Tables>>;

/// The etcd watch the view follows: as etcd sends it, or (fault injection,
/// `APISERVER_FAULT_VIEW_LAG_MS`) each response held until `lag` after it came, as a view
/// behind under load is.
enum Changes {
    AsSent(Box<tonic::Streaming<pb::WatchResponse>>),
    Late(mpsc::Receiver<(tokio::time::Instant, Answer)>, Duration),
}

type Answer = Result<Option<pb::WatchResponse>, tonic::Status>;

impl Changes {
    fn new(mut stream: tonic::Streaming<pb::WatchResponse>, lag: Option<Duration>) -> Self {
        let Some(lag) = lag else {
            return Self::AsSent(Box::new(stream));
        };
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(async move {
            loop {
                let r = stream.message().await;
                let end = !matches!(r, Ok(Some(_)));
                if tx.send((tokio::time::Instant::now(), r)).await.is_err() || end {
                    return;
                }
            }
        });
        Self::Late(rx, lag)
    }

    async fn message(&mut self) -> Answer {
        match self {
            Self::AsSent(s) => s.message().await,
            Self::Late(rx, lag) => match rx.recv().await {
                Some((at, r)) => {
                    tokio::time::sleep_until(at + *lag).await;
                    r
                }
                None => Ok(None),
            },
        }
    }
}

impl EtcdStore {
    pub(super) async fn open(
        opts: &EtcdOptions,
        history: usize,
        events: Feed,
    ) -> Result<(View, Arc<Self>), super::OpenError> {
        let client = Etcd::new(&opts.endpoints, opts.tls.as_ref())?;
        let watcher = Etcd::new(&opts.endpoints, opts.tls.as_ref())?;
        let mut prefix = opts.prefix.clone();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        let (group, grouped) = mpsc::channel(GROUP_OPS * GROUPS_IN_FLIGHT * 4);
        let store = Arc::new(Self {
            client,
            watcher,
            prefix,
            applied: watch::channel(0).0,
            group,
            own: std::sync::Mutex::new(HashMap::new()),
            lag: std::env::var("APISERVER_FAULT_VIEW_LAG_MS")
                .ok()
                .and_then(|ms| ms.parse().ok())
                .map(Duration::from_millis),
        });
        if let Some(lag) = store.lag {
            tracing::warn!(
                ?lag,
                "store: fault injected: the view follows etcd late (APISERVER_FAULT_VIEW_LAG_MS)"
            );
        }
        tokio::spawn(store.clone().commit_groups(grouped));
        let (objects, rev) = store
            .load()
            .await
            .map_err(|source| super::OpenError::Load {
                endpoints: opts.endpoints.join(", "),
                source,
            })?;
        tracing::info!(
            revision = rev,
            objects = objects.values().map(|m| m.len()).sum::<usize>(),
            prefix = %store.prefix,
            "store: loaded from etcd"
        );
        let tables = Arc::new(RwLock::new(Tables {
            rv: rev,
            objects,
            history: VecDeque::new(),
            compacted: rev,
        }));
        store.applied.send_replace(rev);
        tokio::spawn(
            store
                .clone()
                .follow(tables.clone(), events, history.max(100)),
        );
        tokio::spawn(store.clone().compact(opts.compact_every));
        Ok((tables, store))
    }

    /// The etcd key of a value kept aside: `{prefix without its '/'}.aside/{name}`, outside
    /// the range of objects (`.` sorts before `/`), so no list, watch or get of the API can
    /// reach it, whatever its authorization decides.
    fn aside_key(&self, name: &str) -> Vec<u8> {
        format!("{}.aside/{name}", self.prefix.trim_end_matches('/')).into_bytes()
    }

    /// The value kept aside under `name`, if any.
    pub(super) async fn aside(&self, name: &str) -> Result<Option<Vec<u8>>, EtcdError> {
        let r = (self.client)
            .range(pb::RangeRequest {
                key: self.aside_key(name),
                ..Default::default()
            })
            .await?;
        Ok(r.kvs.into_iter().next().map(|kv| kv.value))
    }

    /// Keeps `value` aside under `name` unless a value is there already; the value kept
    /// (`value` if this call put it, the earlier one if not) and whether this call put it.
    pub(super) async fn aside_first(
        &self,
        name: &str,
        value: Vec<u8>,
    ) -> Result<(Vec<u8>, bool), EtcdError> {
        let key = self.aside_key(name);
        let r = (self.client)
            .txn(pb::TxnRequest {
                compare: vec![pb::Compare {
                    result: 0,
                    target: 1,
                    key: key.clone(),
                    target_union: Some(pb::compare::TargetUnion::CreateRevision(0)),
                }],
                success: vec![pb::RequestOp {
                    request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                        key: key.clone(),
                        value: value.clone(),
                        ..Default::default()
                    })),
                }],
                failure: vec![pb::RequestOp {
                    request: Some(pb::request_op::Request::RequestRange(pb::RangeRequest {
                        key,
                        ..Default::default()
                    })),
                }],
            })
            .await?;
        if r.succeeded {
            return Ok((value, true));
        }
        let kept = (r.responses.into_iter())
            .find_map(|op| match op.response {
                Some(pb::response_op::Response::ResponseRange(rr)) => rr.kvs.into_iter().next(),
                _ => None,
            })
            .map(|kv| kv.value)
            .unwrap_or_default();
        Ok((kept, false))
    }

    fn key(&self, k: &Key) -> Vec<u8> {
        format!("{}{}/{}/{}", self.prefix, k.res, k.ns, k.name).into_bytes()
    }

    /// The store key of an etcd key under the prefix.
    fn parse_key(&self, raw: &[u8], names: &mut HashMap<String, Arc<str>>) -> Option<Key> {
        let s = std::str::from_utf8(raw).ok()?.strip_prefix(&self.prefix)?;
        let mut parts = s.splitn(3, '/');
        let (res, ns, name) = (parts.next()?, parts.next()?, parts.next()?);
        if ns.starts_with('\u{0}') {
            return None;
        }
        let res = names
            .entry(res.to_string())
            .or_insert_with(|| Arc::from(res))
            .clone();
        Some(Key {
            res,
            ns: ns.to_string(),
            name: name.to_string(),
        })
    }

    /// Every object under the prefix, read page by page at one revision, and that revision.
    async fn load(&self) -> Result<(HashMap<Arc<str>, Objects>, u64), EtcdError> {
        let end = prefix_end(self.prefix.as_bytes());
        let mut from = self.prefix.as_bytes().to_vec();
        let mut revision = 0;
        let mut objects: HashMap<Arc<str>, Objects> = HashMap::new();
        let mut names = HashMap::new();
        loop {
            let r = self
                .client
                .range(pb::RangeRequest {
                    key: from.clone(),
                    range_end: end.clone(),
                    limit: PAGE,
                    revision,
                    ..Default::default()
                })
                .await?;
            if revision == 0 {
                revision = r.header.as_ref().map_or(0, |h| h.revision);
            }
            for kv in &r.kvs {
                let Some(key) = self.parse_key(&kv.key, &mut names) else {
                    continue;
                };
                let obj = object(&kv.value, kv.mod_revision as u64);
                objects
                    .entry(key.res)
                    .or_default()
                    .insert((key.ns, key.name), Arc::new(obj));
            }
            match (r.more, r.kvs.last()) {
                (true, Some(last)) => {
                    from = last.key.clone();
                    from.push(0);
                }
                _ => break,
            }
        }
        Ok((objects, revision.max(0) as u64))
    }

    /// Follows etcd's watch of the prefix into the view, for as long as the process runs: a
    /// broken watch is made again from the next revision (on another member when its own is
    /// gone); when etcd compacted past it, the view is loaded again and the watchers resume.
    async fn follow(self: Arc<Self>, tables: View, events: Feed, keep: usize) {
        let end = prefix_end(self.prefix.as_bytes());
        let mut names = HashMap::new();
        // At most a second between attempts: while etcd elects a leader every member refuses
        // the watch ("no leader"), and a write waits for this view to hold it; a longer wait
        // here would be added to every write after the election.
        let mut backoff =
            rt::backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        loop {
            let from = *self.applied.borrow() + 1;
            let (_requests, stream) = match self
                .watcher
                .watch(pb::WatchCreateRequest {
                    key: self.prefix.as_bytes().to_vec(),
                    range_end: end.clone(),
                    start_revision: from as i64,
                    // The view holds each object's previous state: etcd need not read and
                    // send it with every event (a delete takes its last state from the view).
                    prev_kv: false,
                    ..Default::default()
                })
                .await
            {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, "store: cannot watch etcd; trying again");
                    self.watcher.next_member();
                    tokio::time::sleep(backoff.next_delay()).await;
                    continue;
                }
            };
            let mut stream = Changes::new(stream, self.lag);
            loop {
                let resp = match stream.message().await {
                    Ok(Some(r)) => r,
                    Ok(None) => {
                        tracing::warn!("store: etcd ended the watch; watching again");
                        break;
                    }
                    Err(s) => {
                        tracing::warn!(error = %s.message(), "store: the etcd watch broke; watching again");
                        self.watcher.next_member();
                        break;
                    }
                };
                if resp.compact_revision > 0 {
                    tracing::warn!(
                        compacted = resp.compact_revision,
                        "store: etcd compacted past this server's view; loading it again"
                    );
                    self.reload(&tables, &events).await;
                    break;
                }
                if resp.canceled {
                    tracing::warn!(reason = %resp.cancel_reason, "store: etcd cancelled the watch; watching again");
                    break;
                }
                if resp.events.is_empty() {
                    continue;
                }
                backoff.reset();
                let batch = self.events_of(&resp.events, &tables, &mut names);
                let Some(last) = resp.events.last().and_then(|e| e.kv.as_ref()) else {
                    continue;
                };
                let rv = last.mod_revision as u64;
                {
                    let mut t = tables.write().unwrap_or_else(|e| e.into_inner());
                    let cut = t.compact_point(&batch, keep);
                    t.apply(rv, &batch);
                    if let Some(c) = cut {
                        t.trim(c);
                    }
                }
                self.applied.send_replace(rv);
                events.send(batch);
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }

    /// The view's events of one watch response (`prev`: the view's object before).
    fn events_of(
        &self,
        evs: &[pb::Event],
        tables: &View,
        names: &mut HashMap<String, Arc<str>>,
    ) -> Vec<Event> {
        let t = tables.read().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::with_capacity(evs.len());
        // Objects changed earlier in this response: the previous state of a later event.
        // (`None`: deleted.)
        let mut batch: HashMap<Key, Option<Arc<Obj>>> = HashMap::new();
        for e in evs {
            let Some(kv) = &e.kv else { continue };
            let Some(key) = self.parse_key(&kv.key, names) else {
                continue;
            };
            let rv = kv.mod_revision as u64;
            let prev = match batch.get(&key) {
                Some(earlier) => earlier.clone(),
                None => t.get(&key).cloned(),
            };
            let (kind, obj) = change(e, kv, &key, prev.as_deref());
            let obj = Arc::new(obj);
            let now = (!matches!(kind, EventType::Deleted)).then(|| obj.clone());
            batch.insert(key.clone(), now);
            out.push(Event {
                rv,
                key,
                kind,
                obj,
                prev,
            });
        }
        out
    }

    /// Loads every object again (after etcd compacted past the view): the history starts
    /// over, and the watchers are closed for them to resume (or relist on `410 Gone`).
    async fn reload(&self, tables: &View, events: &Feed) {
        loop {
            match self.load().await {
                Ok((objects, rev)) => {
                    {
                        let mut t = tables.write().unwrap_or_else(|e| e.into_inner());
                        t.objects = objects;
                        t.history.clear();
                        t.rv = rev;
                        t.compacted = rev;
                    }
                    self.applied.send_replace(rev);
                    events.reset();
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "store: cannot load from etcd; trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Compacts etcd every `every` to the revision reached one period before (another
    /// server's compaction to the same point is no error).
    async fn compact(self: Arc<Self>, every: Duration) {
        if every.is_zero() {
            return;
        }
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        let mut previous = *self.applied.borrow();
        loop {
            tick.tick().await;
            let now = *self.applied.borrow();
            if previous > 0 {
                match self.client.compact(previous as i64).await {
                    Ok(()) => tracing::debug!(revision = previous, "store: etcd compacted"),
                    Err(e) if e.status.message().contains("compacted") => {}
                    Err(e) => tracing::warn!(error = %e, "store: cannot compact etcd"),
                }
            }
            previous = now;
        }
    }

    /// Commits the grouped writes: whatever waits when a transaction can start goes in it (up
    /// to [`GROUP_OPS`] and [`GROUP_BYTES`]), each with its own precondition; a write that
    /// comes while fewer than [`GROUPS_IN_FLIGHT`] are under way goes at once (a group of
    /// one), so grouping costs no wait and groups grow with the load. When any precondition is
    /// refused, etcd applies none and each is written alone (deciding again on what etcd holds).
    async fn commit_groups(self: Arc<Self>, mut rx: mpsc::Receiver<Grouped>) {
        let slots = Arc::new(Semaphore::new(GROUPS_IN_FLIGHT));
        let mut next: Option<Grouped> = None;
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let first = match next.take() {
                Some(g) => g,
                None => match rx.recv().await {
                    Some(g) => g,
                    None => return,
                },
            };
            let mut bytes = first.bytes;
            // Two writes of one object never go together: both preconditions would hold and
            // the second would undo the first.
            let mut keys = std::collections::HashSet::from([first.compare.key.clone()]);
            let mut group = vec![first];
            while group.len() < GROUP_OPS {
                match rx.try_recv() {
                    Ok(g) if bytes + g.bytes > GROUP_BYTES || keys.contains(&g.compare.key) => {
                        next = Some(g);
                        break;
                    }
                    Ok(g) => {
                        bytes += g.bytes;
                        keys.insert(g.compare.key.clone());
                        group.push(g);
                    }
                    Err(_) => break,
                }
            }
            let store = self.clone();
            tokio::spawn(async move {
                let writes = group.len();
                let mut compare = Vec::with_capacity(writes);
                let mut success = Vec::with_capacity(writes);
                let mut replies = Vec::with_capacity(writes);
                for g in group {
                    compare.push(g.compare);
                    success.push(g.op);
                    replies.push(g.reply);
                }
                let mut unsure = false;
                let r = store
                    .client
                    .txn_noting(
                        pb::TxnRequest {
                            compare,
                            success,
                            failure: Vec::new(),
                        },
                        &mut unsure,
                    )
                    .await;
                let outcome = match r {
                    Ok(r) if r.succeeded => {
                        GroupOutcome::Committed(r.header.map_or(0, |h| h.revision).max(0) as u64)
                    }
                    Ok(_) => GroupOutcome::Alone(unsure),
                    Err(e) => {
                        tracing::debug!(error = %e, writes, "store: a grouped write failed; each is written alone");
                        GroupOutcome::Alone(unsure)
                    }
                };
                for reply in replies {
                    let _ = reply.send(outcome);
                }
                drop(slot);
            });
        }
    }

    /// Offers a write of `key` to a group: `Some(revision)` when the group committed it.
    /// `None` (after noting in `unsure` whether the group may have been applied): write it
    /// alone.
    async fn grouped(
        &self,
        key: &Key,
        compare: &pb::Compare,
        op: &pb::request_op::Request,
        unsure: &mut bool,
    ) -> Option<u64> {
        let bytes = match op {
            pb::request_op::Request::RequestPut(p) => p.key.len() + p.value.len(),
            _ => return None,
        };
        if !GROUPED.contains(&&*key.res) {
            return None;
        }
        let (reply, answer) = oneshot::channel();
        let g = Grouped {
            compare: compare.clone(),
            op: pb::RequestOp {
                request: Some(op.clone()),
            },
            bytes,
            reply,
        };
        if self.group.send(g).await.is_err() {
            return None;
        }
        match answer.await {
            Ok(GroupOutcome::Committed(rev)) => Some(rev),
            Ok(GroupOutcome::Alone(u)) => {
                *unsure |= u;
                None
            }
            Err(_) => None,
        }
    }

    /// The object etcd holds at `ekey` now, with its revision.
    async fn held(&self, ekey: &[u8]) -> Result<Option<Arc<Obj>>, EtcdError> {
        let r = (self.client)
            .range(pb::RangeRequest {
                key: ekey.to_vec(),
                ..Default::default()
            })
            .await?;
        Ok(r.kvs
            .into_iter()
            .next()
            .map(|kv| Arc::new(object(&kv.value, kv.mod_revision as u64))))
    }

    pub(super) async fn mutate(
        &self,
        tables: &View,
        key: Key,
        dry_run: bool,
        mut f: MutateFn,
    ) -> Result<Done, Status> {
        let ekey = self.key(&key);
        let mut current = tables
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        // The first decision is taken on this server's view, which may lag etcd; a refusal
        // (a stale resourceVersion, not found, already exists) is checked against etcd's own
        // object before it is answered.
        let mut from_view = true;
        for _ in 0..ATTEMPTS {
            let old = current.as_ref().map(|o| o.value());
            let decided = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(old, 0)))
                .unwrap_or_else(|_| {
                    tracing::error!(key = ?key, "a write failed with a panic; it was refused");
                    Err(Status::internal(
                        "the write failed inside the server; nothing was changed",
                    ))
                });
            let out = match decided {
                Ok(out) => out,
                Err(refused) if from_view && refused.code != 500 => {
                    from_view = false;
                    let held = self.held(&ekey).await.map_err(write_error)?;
                    if held.as_ref().map(|o| o.rv) == current.as_ref().map(|o| o.rv) {
                        return Err(refused);
                    }
                    current = held;
                    continue;
                }
                Err(refused) => return Err(refused),
            };
            from_view = false;
            let (op, value, deleted) = match out {
                Outcome::Unchanged(v) => {
                    return Ok(Done {
                        value: v,
                        deleted: false,
                        created: false,
                    });
                }
                Outcome::Put(v) => {
                    let mut stored = v.clone();
                    if let Some(m) = stored.get_mut("metadata").and_then(Value::as_object_mut) {
                        m.remove("resourceVersion");
                    }
                    let body = serde_json::to_vec(&stored)
                        .map_err(|e| Status::internal(format!("cannot encode the object: {e}")))?;
                    let op = pb::request_op::Request::RequestPut(pb::PutRequest {
                        key: ekey.clone(),
                        value: body,
                        ..Default::default()
                    });
                    (op, v, false)
                }
                Outcome::Delete(v) => {
                    let op = pb::request_op::Request::RequestDeleteRange(pb::DeleteRangeRequest {
                        key: ekey.clone(),
                        ..Default::default()
                    });
                    (op, v, true)
                }
            };
            let created = current.is_none() && !deleted;
            // What this write puts, to know it again (None: a delete).
            let put_bytes = match &op {
                pb::request_op::Request::RequestPut(p) => Some(p.value.clone()),
                _ => None,
            };
            if dry_run {
                return Ok(Done {
                    value,
                    deleted,
                    created,
                });
            }
            let compare = match &current {
                Some(c) => pb::Compare {
                    result: 0,
                    target: 2,
                    key: ekey.clone(),
                    target_union: Some(pb::compare::TargetUnion::ModRevision(c.rv as i64)),
                },
                None => pb::Compare {
                    result: 0,
                    target: 1,
                    key: ekey.clone(),
                    target_union: Some(pb::compare::TargetUnion::CreateRevision(0)),
                },
            };
            let mut unsure = false;
            // An existing object of a grouped resource: committed with others that come at
            // once, when none of theirs is refused.
            if current.is_some()
                && let Some(rev) = self.grouped(&key, &compare, &op, &mut unsure).await
            {
                self.answered(&key.res, rev);
                return Ok(written(value, rev, deleted, created));
            }
            let r = self
                .client
                .txn_noting(
                    pb::TxnRequest {
                        compare: vec![compare],
                        success: vec![pb::RequestOp { request: Some(op) }],
                        failure: vec![pb::RequestOp {
                            request: Some(pb::request_op::Request::RequestRange(
                                pb::RangeRequest {
                                    key: ekey.clone(),
                                    ..Default::default()
                                },
                            )),
                        }],
                    },
                    &mut unsure,
                )
                .await
                .map_err(write_error)?;
            let held_kv = || {
                r.responses.iter().find_map(|op| match &op.response {
                    Some(pb::response_op::Response::ResponseRange(rr)) => {
                        Some(rr.kvs.first().cloned())
                    }
                    _ => None,
                })
            };
            // Asked again after an attempt whose outcome was not known (a member that took it
            // lost its leader): if etcd holds what this write made, that attempt made it.
            let made_before = unsure
                && !r.succeeded
                && match (held_kv(), &put_bytes) {
                    (Some(Some(kv)), Some(bytes)) => kv.value == *bytes,
                    (Some(None), None) => true,
                    _ => false,
                };
            if r.succeeded || made_before {
                let rev = match held_kv() {
                    Some(Some(kv)) if made_before => kv.mod_revision,
                    _ => r.header.as_ref().map_or(0, |h| h.revision),
                }
                .max(0) as u64;
                self.answered(&key.res, rev);
                return Ok(written(value, rev, deleted, created));
            }
            // Another server changed it first: decide again on what etcd holds now.
            current = r
                .responses
                .into_iter()
                .find_map(|op| match op.response {
                    Some(pb::response_op::Response::ResponseRange(rr)) => Some(rr.kvs),
                    _ => None,
                })
                .and_then(|kvs| kvs.into_iter().next())
                .map(|kv| Arc::new(object(&kv.value, kv.mod_revision as u64)));
        }
        Err(Status::conflict(
            "",
            &key.res,
            &key.name,
            "other servers kept changing it; please apply your changes to the latest version and try again",
        ))
    }

    /// Waits until the view holds every change etcd had committed when this was called, as a
    /// kube-apiserver's consistent read does: a client that wrote through another server, then
    /// reads through this one, sees its write. One small linearizable range request gives etcd's
    /// revision. Without an answer within [`FRESH_WITHIN`] (no quorum), the view is served as
    /// it is: reads go on from memory.
    pub(super) async fn fresh(&self) {
        let req = pb::RangeRequest {
            key: self.prefix.as_bytes().to_vec(),
            count_only: true,
            ..Default::default()
        };
        let rev = match tokio::time::timeout(FRESH_WITHIN, self.client.range(req)).await {
            Ok(Ok(r)) => r.header.map_or(0, |h| h.revision).max(0) as u64,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "store: etcd's revision unknown; reading from memory");
                return;
            }
            Err(_) => {
                tracing::debug!("store: etcd's revision unknown; reading from memory");
                return;
            }
        };
        let mut rx = self.applied.subscribe();
        if tokio::time::timeout(CATCH_UP, rx.wait_for(|a| *a >= rev))
            .await
            .is_err()
        {
            tracing::warn!(
                revision = rev,
                "store: a read is answered before this server's view holds etcd's revision (the etcd watch is behind)"
            );
        }
    }

    /// Notes that a write of `res` at revision `rev` was answered.
    fn answered(&self, res: &Arc<str>, rev: u64) {
        let mut own = self.own.lock().unwrap_or_else(|e| e.into_inner());
        match own.get_mut(res) {
            Some(r) => *r = (*r).max(rev),
            None => {
                own.insert(res.clone(), rev);
            }
        }
    }

    /// Waits (at most [`CATCH_UP`]) until the view holds every write of `resources` this server
    /// answered: what it reads of them then decides with what its clients were told is done.
    /// At once when the view already holds them (the usual case: these are rarely written).
    pub(super) async fn own_writes(&self, resources: &[&str]) {
        let rev = {
            let own = self.own.lock().unwrap_or_else(|e| e.into_inner());
            resources.iter().filter_map(|r| own.get(*r)).copied().max()
        };
        let Some(rev) = rev else { return };
        if *self.applied.borrow() >= rev {
            return;
        }
        let mut rx = self.applied.subscribe();
        let waited = tokio::time::timeout(CATCH_UP, rx.wait_for(|a| *a >= rev)).await;
        if waited.is_err() {
            tracing::warn!(
                revision = rev,
                ?resources,
                "store: a request is decided before this server's view holds its own writes (the etcd watch is behind)"
            );
        }
    }

    /// The events of `res` after `rv` from etcd's history, up to where etcd is; `Err` with the
    /// revision etcd compacted to when they are gone.
    pub(super) async fn replay(&self, res: &Arc<str>, rv: u64) -> Result<(Vec<Event>, u64), u64> {
        let prefix = format!("{}{}/", self.prefix, res).into_bytes();
        let gone = |c: u64| Err(c.max(rv + 1));
        let Ok((requests, mut stream)) = self
            .watcher
            .watch(pb::WatchCreateRequest {
                key: prefix.clone(),
                range_end: prefix_end(&prefix),
                // From `rv` itself: when it changed several objects (a grouped write) they are
                // all sent again (below), as the view's history does.
                start_revision: rv.max(1) as i64,
                prev_kv: true,
                ..Default::default()
            })
            .await
        else {
            return gone(rv + 1);
        };
        // etcd gives no reliable "caught up" mark on a watch of past revisions, so the replay
        // writes one: a marker key in the resource's range (under a namespace no object can
        // have), whose change comes after every earlier event. The view never loads it.
        let marker = [prefix.as_slice(), MARKER.as_bytes()].concat();
        let put = pb::TxnRequest {
            success: vec![pb::RequestOp {
                request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                    key: marker.clone(),
                    value: Vec::new(),
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
        if self.client.txn(put).await.is_err() {
            return gone(rv + 1);
        }
        let mut names = HashMap::new();
        let mut out: Vec<Event> = Vec::new();
        let deadline = tokio::time::sleep(Duration::from_secs(30));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => return gone(rv + 1),
                msg = stream.message() => {
                    let resp = match msg {
                        Ok(Some(r)) => r,
                        _ => return gone(rv + 1),
                    };
                    if resp.compact_revision > 0 {
                        return gone(resp.compact_revision as u64);
                    }
                    if resp.canceled {
                        return gone(rv + 1);
                    }
                    for e in &resp.events {
                        let Some(kv) = &e.kv else { continue };
                        if kv.key == marker {
                            drop(requests);
                            // One event at `rv`: the client had it.
                            if out.iter().filter(|e| e.rv == rv).count() == 1 {
                                out.retain(|e| e.rv != rv);
                            }
                            return Ok((out, (kv.mod_revision as u64).max(rv)));
                        }
                        let Some(key) = self.parse_key(&kv.key, &mut names) else {
                            continue;
                        };
                        let rv = kv.mod_revision as u64;
                        let prev = e.prev_kv.as_ref().map(|p| Arc::new(object(&p.value, p.mod_revision as u64)));
                        let (kind, obj) = change(e, kv, &key, prev.as_deref());
                        out.push(Event { rv, key, kind, obj: Arc::new(obj), prev });
                        if out.len() > REPLAY_MAX {
                            // A list is cheaper than this many events: the client relists.
                            return gone(rv);
                        }
                    }
                }
            }
        }
    }
}

/// What etcd event `e` (of `kv`, at `key`) is to watchers: its kind, and the object at the
/// event's revision. A delete carries the last state: etcd's `prev_kv`, else `prev` (the view's
/// object before), else only the name.
fn change(e: &pb::Event, kv: &pb::KeyValue, key: &Key, prev: Option<&Obj>) -> (EventType, Obj) {
    let rv = kv.mod_revision as u64;
    if e.r#type == 1 {
        let last = match (&e.prev_kv, prev) {
            (Some(p), _) => object(&p.value, rv),
            (None, Some(p)) => Obj::with_version(p.value(), rv),
            (None, None) => Obj::with_version(
                serde_json::json!({"metadata": {"name": key.name, "namespace": key.ns}}),
                rv,
            ),
        };
        (EventType::Deleted, last)
    } else if kv.version == 1 {
        (EventType::Added, object(&kv.value, rv))
    } else {
        (EventType::Modified, object(&kv.value, rv))
    }
}

/// A stored value as the view's object, at resourceVersion `rv`.
/// The answer to a write etcd committed at revision `rev`: the object with that version.
fn written(mut value: Value, rev: u64, deleted: bool, created: bool) -> Done {
    if let Some(m) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), Value::String(rev.to_string()));
    }
    Done {
        value,
        deleted,
        created,
    }
}

fn object(value: &[u8], rv: u64) -> Obj {
    Obj::from_stored(value, rv)
}

/// A failed write's answer: nothing was changed (or, when the answer was lost, the client
/// reads to find out).
fn write_error(e: EtcdError) -> Status {
    let msg = e.status.message();
    // etcd's own limit (`request is too large`, 1.5 MiB by default) or its gRPC server's
    // (`received message larger than max`, 2 MiB): a refusal, nothing was written.
    if msg.contains("too large")
        || msg.contains("larger than max")
        || e.status.code() == tonic::Code::ResourceExhausted
    {
        return Status::new(
            413,
            "RequestEntityTooLarge",
            format!("the object is larger than etcd accepts ({e})"),
        );
    }
    Status::unavailable(format!(
        "storage error, the write may not have been made: {e}"
    ))
}
