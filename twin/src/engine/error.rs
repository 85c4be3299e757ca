//! The errors of twin operations, with the result codes KubeEdge's answers carry.

use crate::model::{TwinValue, Version};
use api::paths::DeviceId;

/// Errors of twin operations. Each names the device or property it is about.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TwinError {
    #[error("device {0} is not known on this node")]
    UnknownDevice(DeviceId),
    #[error("device {device} has no property {property:?}")]
    UnknownProperty { device: DeviceId, property: String },
    #[error("property name {property:?} is invalid: {reason}")]
    InvalidName {
        property: String,
        reason: api::validate::names::NameError,
    },
    #[error("value of property {property:?} is invalid: {reason}")]
    InvalidValue { property: String, reason: String },
    #[error("value of property {property:?} is {size} bytes, more than the limit of {limit}")]
    ValueTooLarge {
        property: String,
        size: usize,
        limit: usize,
    },
    #[error(
        "twin of device {device} would hold {size} bytes of values, more than the limit of {limit}"
    )]
    DocumentTooLarge {
        device: DeviceId,
        size: usize,
        limit: usize,
    },
    #[error("property {property:?} is read-only: its model's accessMode is ReadOnly")]
    ReadOnly { property: String },
    #[error("property {property:?} is not optional, so it cannot be deleted")]
    NotOptional { property: String },
    /// A cloud sync older than the edge's state; the caller should resync from `current`.
    #[error(
        "version of property {property:?} is stale: the edge has {{cloud: {}, edge: {}}}, the request {{cloud: {}, edge: {}}}",
        current.cloud, current.edge, requested.cloud, requested.edge
    )]
    StaleVersion {
        property: String,
        current: Version,
        requested: Version,
        current_value: Option<TwinValue>,
    },
    /// A conditional update whose `if_version` is not the current desired version.
    #[error("desired version of device {device} is {actual}, not {expected}")]
    Conflict {
        device: DeviceId,
        expected: u64,
        actual: u64,
    },
    #[error("state {0:?} is not one of online, offline, ok, unknown, unhealthy")]
    InvalidState(String),
}

impl TwinError {
    /// The HTTP-like code KubeEdge's result topics carry: 404 unknown, 409 conflict, 400 invalid.
    pub fn code(&self) -> u16 {
        match self {
            Self::UnknownDevice(_) | Self::UnknownProperty { .. } => 404,
            Self::StaleVersion { .. } | Self::Conflict { .. } => 409,
            _ => 400,
        }
    }

    /// Whether the error is about one property's name or value (and not the device or a
    /// version), so that the other properties of the same request may still be applied.
    pub fn is_about_a_value(&self) -> bool {
        matches!(
            self,
            Self::UnknownProperty { .. }
                | Self::InvalidName { .. }
                | Self::InvalidValue { .. }
                | Self::ValueTooLarge { .. }
                | Self::DocumentTooLarge { .. }
                | Self::ReadOnly { .. }
                | Self::NotOptional { .. }
        )
    }
}
