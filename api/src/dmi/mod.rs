//! DMI v1beta1: the gRPC API between edgecore (`DeviceManagerService`) and mappers
//! (`DeviceMapperService`), generated from `api/proto/dmi/v1beta1/api.proto`, and conversions
//! between its messages and the CRD types.

mod convert;

pub use convert::*;

/// Generated messages, clients and servers of package `v1beta1`.
#[allow(clippy::all, missing_docs)]
pub mod v1beta1 {
    include!(concat!(env!("OUT_DIR"), "/v1beta1.rs"));
}

/// Request metadata of `ReportDeviceStatus` (binary, so any text): a JSON object of property
/// names to why they could not be read. Not part of KubeEdge's DMI; its edgecore ignores it.
pub const PROPERTY_ERRORS_HEADER: &str = "x-property-errors-bin";

/// Request metadata of `ReportDeviceStatus` (binary): a JSON object of property names to the
/// desired value the device refused for good and why, `{"setpoint": {"desired": "-321",
/// "error": "-321 does not fit a uint16"}}`. Not part of KubeEdge's DMI; its edgecore ignores
/// it.
pub const WRITE_ERRORS_HEADER: &str = "x-write-errors-bin";

/// One refused desired value of [`WRITE_ERRORS_HEADER`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WriteRefusal {
    pub desired: String,
    pub error: String,
}

/// Request metadata of `ReportDeviceStates` (binary): why the device is in the reported state.
pub const STATE_REASON_HEADER: &str = "x-state-reason-bin";

/// The encoded `FileDescriptorSet` of the DMI protobuf.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/dmi_v1beta1.fds"));
