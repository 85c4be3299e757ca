//! The twin service: one task owns the [`Engine`] and the [`Store`]. Callers send operations
//! through a [`TwinService`] handle; the task applies every operation waiting in its queue, writes
//! their changes in one transaction (group commit), and only then answers each caller and
//! publishes the changes as [`TwinEvent`]s. So an answer means the update is durable, and under
//! load many updates share one commit.

use crate::engine::{Applied, DeviceDecl, Engine, Limits, Reported, TwinError};
use crate::model::{DeviceRow, DeviceTwin, Millis, Version};
use crate::store::{Store, StoreError};
use api::paths::DeviceId;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{broadcast, mpsc, oneshot};

/// Errors of the service.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Twin(#[from] TwinError),
    #[error("update not stored: {0}")]
    Store(Arc<StoreError>),
    #[error("the twin service has stopped")]
    Stopped,
}

impl ServiceError {
    /// The result code KubeEdge's MQTT results carry.
    pub fn code(&self) -> u16 {
        match self {
            Self::Twin(e) => e.code(),
            _ => 500,
        }
    }
}

pub type Result<T, E = ServiceError> = std::result::Result<T, E>;

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
    State {
        id: DeviceId,
        state: String,
    },
    DeleteProperty {
        id: DeviceId,
        property: String,
    },
}

/// A committed change, published to subscribers (eventbus, mapper notifier, cloud sync).
pub type TwinEvent = Arc<Applied>;

type Reply = oneshot::Sender<Result<Arc<Applied>>>;

enum Command {
    Op(Op, Reply),
    Get(DeviceId, oneshot::Sender<Option<DeviceTwin>>),
    List(oneshot::Sender<Vec<DeviceRow>>),
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
    /// Transactions that failed.
    pub store_errors: AtomicU64,
    /// Devices held.
    pub devices: AtomicU64,
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

    /// Applies an operation; answers once its change is committed.
    pub async fn apply(&self, op: Op) -> Result<Arc<Applied>> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Op(op, tx))
            .await
            .map_err(|_| ServiceError::Stopped)?;
        rx.await.map_err(|_| ServiceError::Stopped)?
    }

    /// The twin of a device.
    pub async fn get(&self, id: &DeviceId) -> Result<Option<DeviceTwin>> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Get(id.clone(), tx))
            .await
            .map_err(|_| ServiceError::Stopped)?;
        rx.await.map_err(|_| ServiceError::Stopped)
    }

    /// Every device, without properties, sorted by id.
    pub async fn list(&self) -> Result<Vec<DeviceRow>> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::List(tx))
            .await
            .map_err(|_| ServiceError::Stopped)?;
        rx.await.map_err(|_| ServiceError::Stopped)
    }

    /// Committed changes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<TwinEvent> {
        self.events.subscribe()
    }

    /// The store, for the outbox and cached objects.
    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }
}

async fn run(
    mut engine: Engine,
    store: Store,
    mut rx: mpsc::Receiver<Command>,
    events: broadcast::Sender<TwinEvent>,
    stats: Arc<Stats>,
) {
    let mut done: Vec<(Result<Arc<Applied>>, Reply)> = Vec::new();
    let mut reads: Vec<Command> = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        let mut n = 0;
        while let Some(cmd) = next.take() {
            n += 1;
            match cmd {
                Command::Op(op, reply) => {
                    let r = apply(&mut engine, op, crate::now_millis()).map(Arc::new);
                    done.push((r.map_err(ServiceError::from), reply));
                }
                // Reads are answered after the commit, so they never see uncommitted state.
                read => reads.push(read),
            }
            if n < MAX_BATCH {
                next = rx.try_recv().ok();
            }
        }
        let changed: Vec<&Applied> = done
            .iter()
            .filter_map(|(r, _)| r.as_ref().ok())
            .filter(|a| !a.is_noop())
            .map(|a| a.as_ref())
            .collect();
        let stored = if changed.is_empty() {
            Ok(())
        } else {
            store.apply(&changed).await
        };
        match stored {
            Ok(()) => {
                if !changed.is_empty() {
                    stats.commits.fetch_add(1, Ordering::Relaxed);
                }
                for (r, reply) in done.drain(..) {
                    match &r {
                        Ok(a) if a.is_noop() => {
                            stats.unchanged.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(a) => {
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
                // The engine is ahead of the database now: answer every caller of the batch
                // with the error and reload the committed state.
                stats.store_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "failed to commit twin updates; reloading twins from the database");
                let e = Arc::new(e);
                for (_, reply) in done.drain(..) {
                    let _ = reply.send(Err(ServiceError::Store(e.clone())));
                }
                match (store.load_twins().await, store.max_outbox_seq().await) {
                    (Ok(twins), Ok(seq)) => engine = Engine::new(twins, engine.limits(), seq),
                    (Err(e), _) | (_, Err(e)) => {
                        tracing::error!(error = %e, "failed to reload twins; stopping the twin service");
                        return;
                    }
                }
            }
        }
        stats.devices.store(engine.len() as u64, Ordering::Relaxed);
        for r in reads.drain(..) {
            answer(&engine, r);
        }
    }
}

fn answer(engine: &Engine, cmd: Command) {
    match cmd {
        Command::Get(id, reply) => {
            let _ = reply.send(engine.get(&id).cloned());
        }
        Command::List(reply) => {
            let mut rows: Vec<DeviceRow> = engine.devices().map(|t| t.row.clone()).collect();
            rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
            let _ = reply.send(rows);
        }
        Command::Op(..) => {}
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
        Op::State { id, state } => engine.set_state(&id, &state, now),
        Op::DeleteProperty { id, property } => engine.delete_property(&id, &property),
    }
}
