//! Types of the device layer, shared by every other crate; no IO.
//!
//! - [`v1beta1`]: the `devices.kubeedge.io/v1beta1` custom resources (`Device`,
//!   `DeviceModel`, `DeviceStatus`), with KubeEdge's JSON names; [`crd`]: their
//!   `CustomResourceDefinition`s as KubeEdge installs them.
//! - [`manifest`]: multi-document YAML or JSON text into typed objects, each with its problems;
//!   [`validate`]: every problem of a `Device` or `DeviceModel` at once, with its field path;
//!   [`merge`]: the effective device, its model's defaults merged in.
//! - [`dmi`]: the DMI v1beta1 gRPC API between edgecore and mappers, and conversions between
//!   its messages and the CRD types.
//! - [`message`]: KubeEdge's cloud-edge message (beehive's `model.Message`); [`paths`]: the
//!   resource paths of those messages and the `$hw` MQTT topics, built and parsed from one
//!   definition each; [`bus`]: the cloud's message bus between the controllers and cloudhub.
//! - [`packed`]: text kept LZ4-compressed in memory when large.
//! - [`tunnel`]: the frames of the streaming tunnel a node opens beside its session (`kubectl
//!   logs` through the cloud), and what the cloud asks on it.
//! - [`operations`]: what a fleet job (`ImagePrePullJob`, `NodeUpgradeJob`,
//!   `ConfigUpdateJob`) asks of one node, and its answer.
//! - [`rfc3339`]: times as Kubernetes writes them.
//! - [`alarm`]: alarm rules declared beside a device, read once, evaluated as a pure step.
pub mod alarm;
pub mod bus;
pub mod crd;
pub mod dmi;
pub mod manifest;
pub mod merge;
pub mod message;
pub mod operations;
pub mod packed;
pub mod paths;
pub mod rfc3339;
pub mod tunnel;
pub mod v1beta1;
pub mod validate;
