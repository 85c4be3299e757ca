//! `edgecore`: the edge gateway. Its surface is what the binary and the tests start it with:
//! [`app::run`] on a [`config::Config`], and for the benches and DMI tests the DMI server
//! ([`dmi`]), the [`catalog`] of devices it serves and the [`metrics`] it counts. Inside:
//!
//! - `app`: the wiring: starts every module below on one twin service and one catalog.
//! - `alarms`: each device's alarm rules evaluated on the gateway (offline too), kept, told
//!   through the twin's outbox and broadcast, acknowledged from the local API or the cloud.
//! - [`catalog`]: the devices and models edgecore serves, from local manifests and the cloud.
//! - [`config`]: the config file, validated into the settings of each module.
//! - [`dmi`]: the DMI gRPC server mappers report to, and the mapper manager (placement,
//!   liveness, failover) that tells each mapper its devices.
//! - `edgehub`: the cloud link (join by token, KubeEdge's websocket session, upstream
//!   reports, downstream objects, the certificate port's client, the streaming tunnel, the
//!   node's usage, and `edgehub::jobs`: the fleet jobs' part on this node); `eventbus`: KubeEdge's `$hw` MQTT topics on an embedded
//!   broker or an external one; `http`: the local HTTP API; `manifests`: the local manifest
//!   directory, watched; `listeners`: the HTTP listener's bounds; `meta`: KubeEdge's
//!   metamanager: the one place catalog changes are published, and the typed records kept
//!   besides the twins.
//! - [`join`]: `edgecore join` and `reset`; [`debug`]: `edgecore debug collect` and `check`.
//! - [`metrics`]: counters for `/metrics`; `ui`: the gateway's page at `/ui` on the HTTP
//!   listener.
//! - [`upgrade`]: what `main` needs of the fleet jobs' part on this node (`edgehub::jobs`):
//!   [`upgrade::Relaunch`] (the binary and config it started from, `exec`ed again after an
//!   upgrade or a rollback), the version the node runs, and a config update's field setter.
//!
//! The twin itself is the `twin` crate, pods are the `edged` crate, and process plumbing is
//! `rt`'s.
#![warn(unreachable_pub)]

mod alarms;
pub mod app;
pub mod catalog;
pub mod config;
pub mod debug;
pub mod dmi;
mod edgehub;
mod eventbus;
mod http;
pub mod join;
mod listeners;
pub mod manifests;
mod meta;
pub mod metrics;
mod ui;
/// What `main` needs of the fleet jobs' part on this node.
pub mod upgrade {
    pub use crate::edgehub::jobs::{
        ConfigError, Relaunch, Restart, apply_fields, on_start, stop_with_watcher, version,
    };
}
