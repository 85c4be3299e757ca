//! The twin service: one task owns the [`Engine`] and the [`Store`]. Callers send operations
//! through a [`TwinService`] handle; the task applies every operation waiting in its queue, writes
//! their changes in one transaction (group commit), and only then answers each caller and
//! publishes the changes as [`TwinEvent`]s. So an answer means the update is durable, and under
//! load many updates share one commit.

use crate::engine::{Applied, DeviceDecl, Engine, Limits, Reported, TwinError};
use crate::history::{HistoryError, Query, QueryError, Series};
use crate::model::{DeviceRow, DeviceTwin, Millis, Version};
use crate::store::{Store, StoreError};
use api::paths::DeviceId;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, mpsc, oneshot};

/// Errors of the service.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Twin(#[from] TwinError),
    #[error("update not stored: {0}")]
    Store(Arc<StoreError>),
    #[error("the twin service has stopped")]
    Stopped,
    /// The store refuses writes (a full disk, an I/O error); nothing was changed. Writes are
    /// tried again after `retry_in_ms`.
    #[error(
        "update not stored: the twin store refuses writes ({reason}); retrying in {retry_in_ms} ms"
    )]
    Degraded { reason: String, retry_in_ms: u64 },
}

impl ServiceError {
    /// The result code KubeEdge's MQTT results carry; 507 (insufficient storage) when the
    /// change could not be made durable.
    pub fn code(&self) -> u16 {
        match self {
            Self::Twin(e) => e.code(),
            Self::Store(_) | Self::Degraded { .. } => 507,
            Self::Stopped => 500,
        }
    }
}

pub type Result<T, E = ServiceError> = std::result::Result<T, E>;

/// Why a history question is not answered.
#[derive(Debug, thiserror::Error)]
pub enum HistoryRefused {
    #[error(
        "no history is kept on this gateway (history.enabled is false in edgecore's config, or its file could not be opened: see the log)"
    )]
    Off,
    #[error(transparent)]
    Query(#[from] QueryError),
    #[error("{id} has no property {property:?}; it has {have:?}")]
    NoProperty {
        id: DeviceId,
        property: String,
        have: Vec<String>,
    },
    #[error(transparent)]
    Twin(ServiceError),
    #[error("{0}")]
    Store(String),
}

impl HistoryRefused {
    /// The HTTP status that says it.
    pub fn code(&self) -> u16 {
        match self {
            Self::Off => 503,
            Self::Query(_) => 400,
            Self::NoProperty { .. } => 404,
            Self::Twin(e) => e.code(),
            Self::Store(_) => 500,
        }
    }
}

/// One twin operation (see the methods of [`Engine`]).
#[derive(Clone, Debug)]
pub enum Op {
    Upsert(DeviceDecl),
    Remove(DeviceId),
    CloudDesired {
        id: DeviceId,
        property: String,
        value: String,
        version: Version,
    },
    EdgeDesired {
        id: DeviceId,
        values: Vec<(String, String)>,
        if_version: Option<u64>,
    },
    Report {
        id: DeviceId,
        reports: Vec<Reported>,
    },
    /// The device's state, and why when it was not its mapper that said so (empty: the mapper
    /// reported it).
    State {
        id: DeviceId,
        state: String,
        reason: String,
    },
    DeleteProperty {
        id: DeviceId,
        property: String,
    },
    /// One MQTT `twin/update`: desired (`expected`) and reported (`actual`) values and deletes
    /// of one device, applied all or nothing as one change (one document, one delta).
    TwinUpdate {
        id: DeviceId,
        desired: Vec<(String, String)>,
        reports: Vec<Reported>,
        deletes: Vec<String>,
    },
    /// An alarm of the device to tell the cloud: `value` is `api::alarm::Alarm` as JSON.
    Alarm {
        id: DeviceId,
        rule: String,
        value: String,
    },
    /// `op`, made on behalf of the request `event_id`: its [`Applied::event_id`] says so, and the
    /// requester publishes what it changed (in KubeEdge's order, with that id).
    Tagged {
        event_id: String,
        op: Box<Op>,
    },
}

/// A committed change, published to subscribers (eventbus, mapper notifier, cloud sync).
pub type TwinEvent = Arc<Applied>;

/// The change an operation made and, when asked for, its device's twin right after it.
type Done = (Arc<Applied>, Option<DeviceTwin>);
type Reply = oneshot::Sender<Result<Done>>;

enum Command {
    /// With the device whose twin is answered along with the change.
    Op(Op, Option<DeviceId>, Reply),
    /// Operations applied in order in one batch, each answered on its own.
    Ops(Vec<(Op, Reply)>),
    Get(DeviceId, oneshot::Sender<Option<DeviceTwin>>),
    List(oneshot::Sender<Vec<DeviceRow>>),
    All(oneshot::Sender<Vec<DeviceTwin>>),
    Repack(oneshot::Sender<Result<(), String>>),
}

/// Counters of the service, for metrics.
#[derive(Debug, Default)]
pub struct Stats {
    /// Operations that changed something, committed.
    pub applied: AtomicU64,
    /// Operations that changed nothing (and wrote nothing).
    pub unchanged: AtomicU64,
    /// Operations rejected by the twin rules.
    pub rejected: AtomicU64,
    /// Transactions committed.
    pub commits: AtomicU64,
    /// Time spent writing batches to the database, in microseconds.
    pub commit_micros: AtomicU64,
    /// Transactions that failed.
    pub store_errors: AtomicU64,
    /// Devices held.
    pub devices: AtomicU64,
    /// Operations refused without being tried because the store was refusing writes.
    pub writes_refused: AtomicU64,
    /// Why the store refuses writes, while it does.
    pub degraded: std::sync::Mutex<Option<String>>,
}

impl Stats {
    /// Why the store refuses writes, or `None` when it takes them.
    pub fn degraded(&self) -> Option<String> {
        self.degraded.lock().ok().and_then(|d| d.clone())
    }

    fn set_degraded(&self, reason: Option<String>) {
        if let Ok(mut d) = self.degraded.lock() {
            *d = reason;
        }
    }
}

/// After a failed commit, writes are refused at once for this long, doubling up to
/// [`MAX_BACKOFF`] while they keep failing; the first write after it is tried for real.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// When writes may be tried again (shared by the engine task and the writer).
#[derive(Default)]
struct Backoff {
    until: Option<Instant>,
    next: Duration,
    reason: String,
}

/// A handle to the twin service. Cheap to clone.
#[derive(Clone)]
pub struct TwinService {
    tx: mpsc::Sender<Command>,
    events: broadcast::Sender<TwinEvent>,
    store: Store,
    stats: Arc<Stats>,
}

/// Most operations committed in one transaction.
pub const MAX_BATCH: usize = 8192;

impl TwinService {
    /// Loads every twin from `store` and starts the service task.
    pub async fn start(store: Store, limits: Limits) -> Result<Self, StoreError> {
        let twins = store.load_twins().await?;
        let seq = store.max_outbox_seq().await?;
        let engine = Engine::new(twins, limits, seq);
        let (tx, rx) = mpsc::channel(MAX_BATCH);
        let (events, _) = broadcast::channel(16 * 1024);
        let stats = Arc::new(Stats::default());
        stats.devices.store(engine.len() as u64, Ordering::Relaxed);
        tokio::spawn(store.clone().fold_in_background());
        tokio::spawn(run(
            engine,
            store.clone(),
            rx,
            events.clone(),
            stats.clone(),
        ));
        Ok(Self {
            tx,
            events,
            store,
            stats,
        })
    }

    /// Sends the engine the command `make` builds around a reply channel; its answer.
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(make(tx))
            .await
            .map_err(|_| ServiceError::Stopped)?;
        rx.await.map_err(|_| ServiceError::Stopped)
    }

    /// Applies an operation; answers once its change is committed.
    pub async fn apply(&self, op: Op) -> Result<Arc<Applied>> {
        self.send_op(op, None).await.map(|(applied, _)| applied)
    }

    /// Applies an operation and answers, once its change is committed, with the twin of device
    /// `id` as it was right after it: one round trip instead of an `apply` and a `get`, which
    /// waits for the next commit too.
    pub async fn apply_and_get(&self, op: Op, id: &DeviceId) -> Result<Done> {
        self.send_op(op, Some(id.clone())).await
    }

    /// Hands `ops` to the engine, to be applied in order, all in the same batch (a burst, such
    /// as the devices of a start, is not committed one by one while the rest is still on its
    /// way). Returns once they are queued; [`Submitted::results`] answers each once committed.
    pub async fn submit_all(&self, ops: Vec<Op>) -> Submitted {
        let (mut cmds, mut replies) = (Vec::with_capacity(ops.len()), Vec::new());
        for op in ops {
            let (tx, rx) = oneshot::channel();
            cmds.push((op, tx));
            replies.push(rx);
        }
        // Not sent (the engine stopped): every reply's sender is dropped with the command.
        let _ = self.tx.send(Command::Ops(cmds)).await;
        Submitted(replies)
    }

    async fn send_op(&self, op: Op, get: Option<DeviceId>) -> Result<Done> {
        self.ask(|tx| Command::Op(op, get, tx)).await?
    }

    /// The twin of a device.
    pub async fn get(&self, id: &DeviceId) -> Result<Option<DeviceTwin>> {
        self.ask(|tx| Command::Get(id.clone(), tx)).await
    }

    /// Every device, without properties, sorted by id.
    pub async fn list(&self) -> Result<Vec<DeviceRow>> {
        self.ask(Command::List).await
    }

    /// Every twin whole (sorted by namespace and name), as committed.
    pub async fn all(&self) -> Result<Vec<DeviceTwin>> {
        self.ask(Command::All).await
    }

    /// Makes every twin again once a burst of creations is over, so that they pack together
    /// in memory ([`Engine::repack`]); the twins do not change. The error says why not.
    pub async fn repack(&self) -> Result<Result<(), String>> {
        self.ask(Command::Repack).await
    }

    /// Committed changes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<TwinEvent> {
        self.events.subscribe()
    }

    /// The store, for the outbox and cached objects.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// A property's history (or the device's state, [`crate::history::STATE`]) over `q`, as
    /// the gateway's API and the cloud's `devices/history` answer it; the refusal says why,
    /// with its status code.
    pub async fn history(
        &self,
        id: &DeviceId,
        property: &str,
        q: Query,
        now: Millis,
    ) -> Result<Series, HistoryRefused> {
        let Some(h) = self.store.history() else {
            return Err(HistoryRefused::Off);
        };
        let device = self.get(id).await;
        // A device and property the twin has (or had: history outlives a removed device).
        if property != crate::history::STATE
            && let Ok(Some(t)) = &device
            && !t.properties.contains_key(property)
        {
            return Err(HistoryRefused::NoProperty {
                id: id.clone(),
                property: property.to_string(),
                have: t.properties.keys().cloned().collect(),
            });
        }
        let series = h
            .query(&id.to_string(), property, q.from, q.to, q.step, now)
            .await
            .map_err(|e| match e {
                HistoryError::Query(q) => HistoryRefused::Query(q),
                other => HistoryRefused::Store(other.to_string()),
            })?;
        if series.points.is_empty()
            && series.buckets.is_empty()
            && series.before.is_none()
            && !matches!(device, Ok(Some(_)))
        {
            return Err(HistoryRefused::Twin(
                TwinError::UnknownDevice(id.clone()).into(),
            ));
        }
        Ok(series)
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }
}

/// A read answered once the batch before it is committed.
enum Answer {
    Get(Option<DeviceTwin>, oneshot::Sender<Option<DeviceTwin>>),
    List(Vec<DeviceRow>, oneshot::Sender<Vec<DeviceRow>>),
    All(Vec<DeviceTwin>, oneshot::Sender<Vec<DeviceTwin>>),
}

/// Operations applied to the engine, waiting for their commit.
struct Batch {
    /// The engine generation they were applied to (see [`run`]).
    epoch: u64,
    done: Vec<(Result<Done>, Reply)>,
    reads: Vec<Answer>,
}

/// The engine task. It applies every operation waiting in its queue as one batch and hands the
/// batch to the writer, then goes on with the next batch while the writer commits: the engine
/// and SQLite work in parallel, and the longer a commit takes the larger the next batch grows.
///
/// When a commit fails, the engine is ahead of the database. The writer then fails that batch and
/// every later batch of the same epoch without writing them, and this task reloads the committed
/// state and starts a new epoch.
async fn run(
    mut engine: Engine,
    store: Store,
    mut rx: mpsc::Receiver<Command>,
    events: broadcast::Sender<TwinEvent>,
    stats: Arc<Stats>,
) {
    let (failed_tx, failed_rx) = tokio::sync::watch::channel(0u64);
    let (batches, writer_rx) = mpsc::channel::<Batch>(1);
    let backoff = Arc::new(std::sync::Mutex::new(Backoff::default()));
    let writer = tokio::spawn(write(
        store.clone(),
        writer_rx,
        events,
        stats.clone(),
        failed_tx,
        backoff.clone(),
    ));
    // Epochs start at 1; the watch holds the last failed epoch (0: none).
    let mut epoch = 1u64;
    while let Some(first) = rx.recv().await {
        let mut refuse = None;
        if *failed_rx.borrow() >= epoch {
            // The engine is ahead of the database: go back to what is durable. Loading never
            // writes (a journal that cannot be folded is read over the tables), so this works
            // on a full disk too; if it fails all the same, writes wait and it is tried again.
            match (store.load_twins().await, store.max_outbox_seq().await) {
                (Ok(twins), Ok(seq)) => {
                    engine = Engine::new(twins, engine.limits(), seq);
                    epoch += 1;
                }
                (Err(e), _) | (_, Err(e)) => {
                    tracing::error!(error = %e, "failed to reload twins from the database; refusing writes until it succeeds");
                    let wait = note_failure(&backoff, &stats, &e.to_string());
                    refuse = Some(ServiceError::Degraded {
                        reason: format!("cannot reload the twins: {e}"),
                        retry_in_ms: wait.as_millis() as u64,
                    });
                }
            }
        }
        if refuse.is_none()
            && let Ok(b) = backoff.lock()
            && let Some(until) = b.until
            && let Some(left) = until.checked_duration_since(Instant::now())
        {
            refuse = Some(ServiceError::Degraded {
                reason: b.reason.clone(),
                retry_in_ms: left.as_millis() as u64,
            });
        }
        let mut batch = Batch {
            epoch,
            done: Vec::new(),
            reads: Vec::new(),
        };
        let mut next = Some(first);
        let mut n = 0;
        while let Some(cmd) = next.take() {
            n += 1;
            match cmd {
                Command::Op(op, get, reply) => {
                    take(
                        &mut engine,
                        &mut batch,
                        refuse.as_ref(),
                        &stats,
                        op,
                        get,
                        reply,
                    );
                }
                Command::Ops(ops) => {
                    n += ops.len().saturating_sub(1);
                    for (op, reply) in ops {
                        take(
                            &mut engine,
                            &mut batch,
                            refuse.as_ref(),
                            &stats,
                            op,
                            None,
                            reply,
                        );
                    }
                }
                Command::Get(id, reply) => {
                    batch
                        .reads
                        .push(Answer::Get(engine.get(&id).cloned(), reply));
                }
                Command::List(reply) => {
                    let mut rows: Vec<DeviceRow> =
                        engine.devices().map(|t| t.row.clone()).collect();
                    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
                    batch.reads.push(Answer::List(rows, reply));
                }
                Command::Repack(reply) => {
                    let _ = reply.send(engine.repack());
                }
                Command::All(reply) => {
                    let mut twins: Vec<DeviceTwin> = engine.devices().cloned().collect();
                    twins.sort_by(|a, b| {
                        (&a.row.namespace, &a.row.name).cmp(&(&b.row.namespace, &b.row.name))
                    });
                    batch.reads.push(Answer::All(twins, reply));
                }
            }
            if n < MAX_BATCH {
                next = rx.try_recv().ok();
            }
        }
        stats.devices.store(engine.len() as u64, Ordering::Relaxed);
        if batches.send(batch).await.is_err() {
            return;
        }
    }
    drop(batches);
    let _ = writer.await;
}

/// Operations handed to the engine by [`TwinService::submit_all`].
pub struct Submitted(Vec<oneshot::Receiver<Result<Done>>>);

impl Submitted {
    /// What each operation changed, in order, once committed.
    pub async fn results(self) -> Vec<Result<Arc<Applied>>> {
        let mut out = Vec::with_capacity(self.0.len());
        for rx in self.0 {
            out.push(match rx.await {
                Ok(r) => r.map(|(applied, _)| applied),
                Err(_) => Err(ServiceError::Stopped),
            });
        }
        out
    }
}

/// Applies `op` to the engine into `batch`, or refuses it at once with `refuse`.
fn take(
    engine: &mut Engine,
    batch: &mut Batch,
    refuse: Option<&ServiceError>,
    stats: &Stats,
    op: Op,
    get: Option<DeviceId>,
    reply: Reply,
) {
    if let Some(e) = refuse {
        stats.writes_refused.fetch_add(1, Ordering::Relaxed);
        let _ = reply.send(Err(e.clone()));
    } else {
        let r = apply(engine, op, crate::now_millis())
            .map(|a| (Arc::new(a), get.and_then(|id| engine.get(&id).cloned())));
        batch.done.push((r.map_err(ServiceError::from), reply));
    }
}

/// The writer task: commits each batch in one transaction, then answers its callers (a
/// successful answer means the change is durable) and publishes its changes.
async fn write(
    store: Store,
    mut batches: mpsc::Receiver<Batch>,
    events: broadcast::Sender<TwinEvent>,
    stats: Arc<Stats>,
    failed: tokio::sync::watch::Sender<u64>,
    backoff: Arc<std::sync::Mutex<Backoff>>,
) {
    while let Some(batch) = batches.recv().await {
        let Batch { epoch, done, reads } = batch;
        let poisoned = *failed.borrow() >= epoch;
        let changed: Vec<&Applied> = done
            .iter()
            .filter_map(|(r, _)| r.as_ref().ok())
            .map(|(a, _)| a.as_ref())
            .filter(|a| !a.is_noop())
            .collect();
        let stored = if poisoned {
            Err(None)
        } else if changed.is_empty() {
            Ok(())
        } else {
            let start = std::time::Instant::now();
            let r = store.apply(&changed).await.map_err(Some);
            stats
                .commit_micros
                .fetch_add(start.elapsed().as_micros() as u64, Ordering::Relaxed);
            r
        };
        match stored {
            Ok(()) => {
                if !changed.is_empty() {
                    stats.commits.fetch_add(1, Ordering::Relaxed);
                    note_success(&backoff, &stats);
                }
                for (r, reply) in done {
                    match &r {
                        Ok((a, _)) if a.is_noop() => {
                            stats.unchanged.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok((a, _)) => {
                            stats.applied.fetch_add(1, Ordering::Relaxed);
                            let _ = events.send(a.clone());
                        }
                        Err(_) => {
                            stats.rejected.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    let _ = reply.send(r);
                }
            }
            Err(e) => {
                let e = match e {
                    Some(e) => {
                        stats.store_errors.fetch_add(1, Ordering::Relaxed);
                        let wait = note_failure(&backoff, &stats, &e.to_string());
                        tracing::error!(error = %e, retry_in = ?wait, "failed to commit twin updates; they are refused, and the twins reloaded from the database");
                        failed.send_replace(epoch);
                        Arc::new(e)
                    }
                    None => Arc::new(StoreError::Abandoned),
                };
                for (_, reply) in done {
                    let _ = reply.send(Err(ServiceError::Store(e.clone())));
                }
            }
        }
        for a in reads {
            match a {
                Answer::Get(t, reply) => {
                    let _ = reply.send(t);
                }
                Answer::List(rows, reply) => {
                    let _ = reply.send(rows);
                }
                Answer::All(twins, reply) => {
                    let _ = reply.send(twins);
                }
            }
        }
    }
}

/// Records a failed write: writes are refused until the backoff ends; returns its length.
fn note_failure(backoff: &std::sync::Mutex<Backoff>, stats: &Stats, reason: &str) -> Duration {
    let Ok(mut b) = backoff.lock() else {
        return FIRST_BACKOFF;
    };
    let wait = if b.next.is_zero() {
        FIRST_BACKOFF
    } else {
        b.next
    };
    b.until = Some(Instant::now() + wait);
    b.next = (wait * 2).min(MAX_BACKOFF);
    b.reason = reason.to_string();
    stats.set_degraded(Some(reason.to_string()));
    wait
}

/// Records a successful commit: the store takes writes again.
fn note_success(backoff: &std::sync::Mutex<Backoff>, stats: &Stats) {
    if let Ok(mut b) = backoff.lock()
        && (b.until.is_some() || !b.next.is_zero())
    {
        tracing::info!("the twin store takes writes again");
        *b = Backoff::default();
        stats.set_degraded(None);
    }
}

/// Applies one operation to the engine.
pub fn apply(engine: &mut Engine, op: Op, now: Millis) -> Result<Applied, TwinError> {
    match op {
        Op::Upsert(decl) => engine.upsert_device(&decl, now),
        Op::Remove(id) => engine.remove_device(&id),
        Op::CloudDesired {
            id,
            property,
            value,
            version,
        } => engine.cloud_desired(&id, &property, &value, version, now),
        Op::EdgeDesired {
            id,
            values,
            if_version,
        } => engine.edge_desired(&id, &values, if_version, now),
        Op::Report { id, reports } => engine.report(&id, &reports, now),
        Op::State { id, state, reason } => engine.set_state(&id, &state, &reason, now),
        Op::DeleteProperty { id, property } => engine.delete_property(&id, &property),
        Op::TwinUpdate {
            id,
            desired,
            reports,
            deletes,
        } => engine.twin_update(&id, &desired, &reports, &deletes, now),
        Op::Alarm { id, rule, value } => Ok(engine.alarm(&id, &rule, value, now)),
        Op::Tagged { event_id, op } => {
            let mut applied = apply(engine, *op, now)?;
            applied.event_id = Some(event_id);
            Ok(applied)
        }
    }
}
