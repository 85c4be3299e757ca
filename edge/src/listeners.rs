//! Listeners that survive running out of file descriptors: each bounds its connections (a
//! connection over the limit waits in the kernel's backlog until one closes), and an accept
//! error (EMFILE, ENFILE, ENOMEM) backs off instead of spinning. The soft NOFILE limit is
//! raised to the hard one at start.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Raises the soft limit of open files to the hard limit, as servers commonly do.
pub fn raise_nofile_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => tracing::debug!(limit = n, "open files limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open files limit"),
    }
}

/// The wait after a failed accept: doubles from 10 ms up to 1 s while accepts keep failing.
#[derive(Debug)]
pub struct AcceptBackoff(Duration);

impl Default for AcceptBackoff {
    fn default() -> Self {
        Self(Duration::from_millis(10))
    }
}

impl AcceptBackoff {
    /// Waits after `e`, logging it.
    pub async fn failed(&mut self, listener: &str, e: &io::Error) {
        if matches!(
            e.kind(),
            io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
        ) {
            // The peer gave up before we accepted: nothing to wait for.
            return;
        }
        tracing::warn!(listener, error = %e, retry_in = ?self.0, "accept failed (out of file descriptors?)");
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_secs(1));
    }

    pub fn succeeded(&mut self) {
        *self = Self::default();
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

impl<IO: AsyncWrite + Unpin> AsyncWrite for Permitted<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The HTTP API's TCP listener for axum: at most `max` connections at once, accept errors
/// backed off.
pub struct LimitedTcp {
    listener: tokio::net::TcpListener,
    permits: Arc<Semaphore>,
    backoff: AcceptBackoff,
}

impl LimitedTcp {
    pub fn new(listener: tokio::net::TcpListener, max: usize) -> Self {
        Self {
            listener,
            permits: Arc::new(Semaphore::new(max)),
            backoff: AcceptBackoff::default(),
        }
    }
}

impl axum::serve::Listener for LimitedTcp {
    type Io = Permitted<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok(permit) = self.permits.clone().acquire_owned().await else {
                // The semaphore is never closed; wait as if it were full.
                std::future::pending::<()>().await;
                continue;
            };
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    self.backoff.succeeded();
                    return (Permitted::new(stream, permit), addr);
                }
                Err(e) => self.backoff.failed("http", &e).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}
