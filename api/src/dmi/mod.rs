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

/// The encoded `FileDescriptorSet` of the DMI protobuf.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/dmi_v1beta1.fds"));
