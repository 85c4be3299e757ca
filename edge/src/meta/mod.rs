//! edgecore's metadata, KubeEdge's metamanager: where a device goes when it arrives, and what
//! is kept of it.
//!
//! - [`sync`]: the one place catalog changes are published: [`sync::CatalogSync::publish`]
//!   rebuilds the catalog from its sources (local manifests, the cloud), applies the changes to
//!   the twin, and broadcasts them to the mapper manager. The manifests watcher and edgehub both
//!   change the sources and publish through it.
//! - [`store`]: what must survive a restart besides the twins (the cloud's devices and models,
//!   pods, ConfigMaps and Secrets for edged, mapper registrations), typed, in the twin
//!   database's key-value table.

pub(crate) mod store;
pub(crate) mod sync;
