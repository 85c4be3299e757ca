//! Publishing catalog changes: rebuild, apply to the twin, broadcast.

use crate::catalog::{Change, SharedCatalog, Sources};
use tokio::sync::broadcast;
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
        let mut pending = Vec::new();
        // A model's change (a range, a unit, a type) reaches the twins of the devices that use
        // it at once, not at their next change: each is declared again with the new model.
        let changed_models: Vec<(String, String)> = (changes.iter())
            .filter_map(|c| match c {
                Change::ModelUpdated(m) => Some((
                    api::v1beta1::namespace_of(&m.metadata).to_string(),
                    m.metadata.name.clone().unwrap_or_default(),
                )),
                _ => None,
            })
            .collect();
        let mut redeclared = Vec::new();
        if !changed_models.is_empty() {
            let updated: std::collections::HashSet<_> = (changes.iter())
                .filter_map(|c| match c {
                    Change::DeviceAdded(d) | Change::DeviceUpdated(d) => {
                        d.device().map(|d| crate::catalog::object_id(&d.metadata))
                    }
                    _ => None,
                })
                .collect();
            let c = crate::catalog::read(&self.catalog);
            for (id, stored) in &c.devices {
                if updated.contains(id) {
                    continue;
                }
                let Some(d) = stored.device() else { continue };
                let uses = d.model_name().is_some_and(|m| {
                    changed_models.contains(&(id.namespace.clone(), m.to_string()))
                });
                if uses {
                    redeclared.push(Op::Upsert(DeviceDecl::from_device(&d, c.model_of(&d))));
                }
            }
        }
        // Sent in chunks, each applied as one batch: the engine applies one while the next is
        // read, and a start's thousand devices are not committed one by one.
        const CHUNK: usize = 128;
        let mut ops = redeclared;
        for change in changes {
            match change {
                Change::DeviceAdded(d) | Change::DeviceUpdated(d) => {
                    let Some(d) = d.device() else { continue };
                    let decl = {
                        let c = crate::catalog::read(&self.catalog);
                        DeviceDecl::from_device(&d, c.model_of(&d))
                    };
                    ops.push(Op::Upsert(decl));
                }
                Change::DeviceRemoved(id) => ops.push(Op::Remove(id.clone())),
                _ => continue,
            }
            if ops.len() >= CHUNK {
                pending.push(self.twin.submit_all(std::mem::take(&mut ops)).await);
            }
        }
        if !ops.is_empty() {
            pending.push(self.twin.submit_all(ops).await);
        }
        for submitted in pending {
            for e in submitted
                .results()
                .await
                .into_iter()
                .filter_map(Result::err)
            {
                tracing::warn!(error = %e, "failed to apply a catalog change to the twin")
            }
        }
    }
}
