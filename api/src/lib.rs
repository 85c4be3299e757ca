//! Types of the device layer, shared by every other crate; no IO.
//!
//! - [`v1beta1`]: the `devices.kubeedge.io/v1beta1` custom resources.
pub mod bus;
pub mod crd;
pub mod dmi;
pub mod manifest;
pub mod merge;
pub mod message;
pub mod packed;
pub mod paths;
pub mod v1beta1;
pub mod validate;
