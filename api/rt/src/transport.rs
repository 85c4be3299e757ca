//! gRPC over Unix sockets (DMI between edgecore and the mappers, CRI towards the container
//! runtime) and listeners that survive running out of file descriptors: each bounds its
//! connections (a connection over the limit waits in the kernel's backlog until one closes), and
//! a failed accept (EMFILE, ENFILE, ENOMEM) backs off instead of spinning.

use crate::authority::AuthorityFix;
use crate::backoff::Backoff;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A lazy gRPC channel over the Unix socket at `path` (`unix:///path` or a plain path), each
/// call bounded by `timeout`: how edgecore dials mappers and the runtime, and how a mapper dials
/// edgecore. It reconnects by itself after the peer restarts. Must be created inside a tokio
/// runtime.
pub fn uds_channel(path: &str, timeout: Duration) -> tonic::transport::Channel {
    let path = std::path::PathBuf::from(path.strip_prefix("unix://").unwrap_or(path));
    // The URI is required by tonic but unused: the connector dials the socket.
    tonic::transport::Endpoint::from_static("http://dmi.local")
        .connect_timeout(Duration::from_secs(2))
        .timeout(timeout)
        .connect_with_connector_lazy(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
}

/// A connection accepted on a gRPC Unix socket by [`uds_incoming`].
pub type UdsConnection = Permitted<AuthorityFix<tokio::net::UnixStream>>;

/// The connections accepted on a gRPC Unix socket, for `serve_with_incoming`: each one accepts
/// the `:authority` forms gRPC clients send over Unix sockets (see [`crate::authority`]). At
/// most `max_connections` are open at once (more wait in the listen backlog), and failed
/// accepts back off ([`AcceptBackoff`]).
pub fn uds_incoming(
    listener: tokio::net::UnixListener,
    max_connections: usize,
) -> impl tokio_stream::Stream<Item = io::Result<UdsConnection>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let permits = Arc::new(Semaphore::new(max_connections));
    tokio::spawn(async move {
        let mut backoff = AcceptBackoff::default();
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
                    backoff.succeeded();
                    let conn = Permitted::new(AuthorityFix::new(stream), permit);
                    if tx.send(Ok(conn)).await.is_err() {
                        return;
                    }
                }
                Err(e) => backoff.failed("grpc", &e).await,
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// The wait after a failed accept: doubles from 10 ms up to 1 s while accepts keep failing.
#[derive(Debug)]
pub struct AcceptBackoff(Backoff);

impl Default for AcceptBackoff {
    fn default() -> Self {
        Self(Backoff::new(
            Duration::from_millis(10),
            Duration::from_secs(1),
        ))
    }
}

impl AcceptBackoff {
    /// Waits after `e`, logging it with the `listener`'s name.
    pub async fn failed(&mut self, listener: &str, e: &io::Error) {
        if matches!(
            e.kind(),
            io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
        ) {
            // The peer gave up before we accepted: nothing to wait for.
            return;
        }
        tracing::warn!(listener, error = %e, retry_in = ?self.0.peek(), "accept failed (out of file descriptors?)");
        self.0.wait().await;
    }

    pub fn succeeded(&mut self) {
        self.0.reset();
    }
}

/// A connection holding one of its listener's permits until it is dropped.
pub struct Permitted<IO> {
    io: IO,
    _permit: OwnedSemaphorePermit,
}

impl<IO> Permitted<IO> {
    pub fn new(io: IO, permit: OwnedSemaphorePermit) -> Self {
        Self {
            io,
            _permit: permit,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Permitted<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

crate::write_through!(Permitted);

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected
    for Permitted<IO>
{
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}
