//! DMI v1beta1: the gRPC API between edgecore (`DeviceManagerService`) and mappers
//! (`DeviceMapperService`), generated from `api/proto/dmi/v1beta1/api.proto`, and conversions
//! between its messages and the CRD types.

#[cfg(feature = "transport")]
pub mod authority;
mod convert;

pub use convert::*;

/// Generated messages, clients and servers of package `v1beta1`.
#[allow(clippy::all, missing_docs)]
pub mod v1beta1 {
    include!(concat!(env!("OUT_DIR"), "/v1beta1.rs"));
}

/// The encoded `FileDescriptorSet` of the DMI protobuf.
/// Request metadata of `ReportDeviceStatus` (binary, so any text): a JSON object of property
/// names to why they could not be read. Not part of KubeEdge's DMI; its edgecore ignores it.
pub const PROPERTY_ERRORS_HEADER: &str = "x-property-errors-bin";

/// Request metadata of `ReportDeviceStates` (binary): why the device is in the reported state.
pub const STATE_REASON_HEADER: &str = "x-state-reason-bin";

pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/dmi_v1beta1.fds"));

/// A lazy gRPC channel over the Unix socket at `path` (`unix:///path` or a plain path), each
/// call bounded by `timeout`: how edgecore dials mappers and how a mapper dials edgecore. It
/// reconnects by itself after the peer restarts. Must be created inside a tokio runtime.
#[cfg(feature = "transport")]
pub fn uds_channel(path: &str, timeout: std::time::Duration) -> tonic::transport::Channel {
    let path = std::path::PathBuf::from(path.strip_prefix("unix://").unwrap_or(path));
    // The URI is required by tonic but unused: the connector dials the socket.
    tonic::transport::Endpoint::from_static("http://dmi.local")
        .connect_timeout(std::time::Duration::from_secs(2))
        .timeout(timeout)
        .connect_with_connector_lazy(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
}

/// The connections accepted on a DMI Unix socket, for `serve_with_incoming`: each one accepts
/// the `:authority` forms gRPC clients send over Unix sockets (see [`authority`]). At most
/// `max_connections` are open at once (more wait in the listen backlog), and a failed accept
/// (out of file descriptors) is retried after a pause that doubles up to 1 s, instead of at once
/// in a loop.
#[cfg(feature = "transport")]
pub fn uds_incoming(
    listener: tokio::net::UnixListener,
    max_connections: usize,
) -> impl tokio_stream::Stream<Item = std::io::Result<authority::AuthorityFix<tokio::net::UnixStream>>>
{
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(max_connections));
    tokio::spawn(async move {
        let mut pause = std::time::Duration::from_millis(10);
        loop {
            let permit = tokio::select! {
                _ = tx.closed() => return,
                p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            };
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                a = listener.accept() => a,
            };
            match accepted {
                Ok((stream, _)) => {
                    pause = std::time::Duration::from_millis(10);
                    let conn = authority::AuthorityFix::with_permit(stream, permit);
                    if tx.send(Ok(conn)).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?pause, "DMI accept failed (out of file descriptors?)");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(1));
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
