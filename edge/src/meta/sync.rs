//! Publishing catalog changes: rebuild, apply to the twin, broadcast.

use crate::catalog::{Change, SharedCatalog, Sources};
use tokio::sync::broadcast;
use tokio::task::JoinSet;
use twin::TwinService;
use twin::engine::DeviceDecl;
use twin::service::Op;

/// The catalog, the twin and the channel its changes go out on, together.
#[derive(Clone)]
pub(crate) struct CatalogSync {
    pub(crate) twin: TwinService,
    pub(crate) catalog: SharedCatalog,
    changes: broadcast::Sender<Vec<Change>>,
}

impl CatalogSync {
    pub(crate) fn new(twin: TwinService, catalog: SharedCatalog) -> Self {
        let (changes, _) = broadcast::channel(256);
        Self {
            twin,
            catalog,
            changes,
        }
    }

    /// The changes published from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Vec<Change>> {
        self.changes.subscribe()
    }

    /// Makes the catalog what `sources` make now: its devices' twins are added, updated or
    /// removed, and the changes go to every subscriber. Returns how many there were. The caller holds
    /// the sources' lock throughout, so two publications never cross.
    pub(crate) async fn publish(&self, sources: &Sources) -> usize {
        let changes = sources.rebuild(&self.catalog);
        let n = changes.len();
        if n > 0 {
            self.apply_to_twin(&changes).await;
            // No subscriber yet (at start) is not an error: the mapper manager reads the
            // catalog when it starts.
            let _ = self.changes.send(changes);
        }
        n
    }

    async fn apply_to_twin(&self, changes: &[Change]) {
        let mut pending = JoinSet::new();
        for change in changes {
            let op = match change {
                Change::DeviceAdded(d) | Change::DeviceUpdated(d) => {
                    let decl = {
                        let c = crate::catalog::read(&self.catalog);
                        DeviceDecl::from_device(d, c.model_of(d))
                    };
                    Op::Upsert(decl)
                }
                Change::DeviceRemoved(id) => Op::Remove(id.clone()),
                _ => continue,
            };
            let twin = self.twin.clone();
            pending.spawn(async move { twin.apply(op).await });
        }
        while let Some(r) = pending.join_next().await {
            match r {
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "failed to apply a catalog change to the twin")
                }
                Err(e) => tracing::warn!(error = %e, "a catalog change task failed"),
                Ok(Ok(_)) => {}
            }
        }
    }
}
