//! The device twin of an edge gateway.
//!
//! - [`model`]: the twin document of a device: per property the desired and the reported value,
//!   each with a `{cloud, edge}` version and a timestamp, and per-section monotonic versions.
//! - [`engine`]: the pure state logic (no IO): membership, desired updates from the cloud and the
//!   edge, reports from mappers, conditional updates, delta. Every operation returns the rows it
//!   changed, so a caller persists exactly that and nothing when nothing changed.
//! - [`store`]: the SQLite store (WAL, migrations, batched multi-row writes in one transaction)
//!   with the durable, coalesced outbox of changes that must reach the cloud.
//! - [`service`]: an actor that owns an engine and a store and commits operations in groups, so a
//!   caller's update is answered only once it is durable.
//! - [`history`]: every reported value and device state over time, in its own file, in raw,
//!   minute and hour tiers, fed by the journal's fold and bounded by age, size and free space;
//!   its query grammar (`history::Query`), and [`TwinService::history`], the one answer of the
//!   gateway's HTTP API and the cloud's `devices/history`.
//!
//! Size caps (see [`Limits`]): a value may be up to 64 KiB and a device's whole twin document up
//! to 1 MiB by default. There is no character-set restriction on values (KubeEdge allows 512
//! characters of `[a-zA-Z0-9-_.,:/@#]` only).

pub mod engine;
pub mod history;
mod journal;
pub mod model;
pub mod service;
pub mod store;

pub use engine::{Applied, DeviceDecl, Engine, Limits, PropertyDecl, Reported, TwinError};
pub use model::{
    DeviceRow, DeviceTwin, Millis, OutboxEntry, PropertyTwin, Section, TwinValue, Version,
};
pub use service::{TwinEvent, TwinService};
pub use store::{Store, StoreError, Synchronous};

/// Milliseconds since the Unix epoch, now.
pub fn now_millis() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}
