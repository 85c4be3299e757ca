//! `edgecore`: the edge gateway. It keeps every device's twin in SQLite ([`twin`]), loads and
//! watches local manifests ([`manifests`]), serves KubeEdge's `$hw` MQTT topics ([`eventbus`])
//! and the DMI gRPC API to mappers ([`dmi`]), and a local HTTP API ([`http`]).

pub mod app;
pub mod catalog;
pub mod config;
pub mod dmi;
pub mod edgehub;
pub mod eventbus;
pub mod http;
pub mod listeners;
pub mod manifests;
pub mod metrics;
