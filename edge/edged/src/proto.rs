//! The part of the Kubernetes Container Runtime Interface (`runtime.v1`) that edged uses, from
//! `proto/cri/v1/api.proto`: clients of `RuntimeService` and `ImageService`, spoken to
//! containerd's (or CRI-O's) socket.

/// Generated messages and clients of package `runtime.v1`.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/runtime.v1.rs"));
}
