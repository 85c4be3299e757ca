//! The HTTP API's listener: at most a set number of connections at once (one over the limit
//! waits in the kernel's backlog until one closes), failed accepts backed off (see
//! `rt::transport`, which the MQTT and DMI listeners use too).

use rt::transport::{AcceptBackoff, Permitted};
use std::io;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The HTTP API's TCP listener for axum: at most `max` connections at once, accept errors
/// backed off.
pub(crate) struct LimitedTcp {
    listener: tokio::net::TcpListener,
    permits: Arc<Semaphore>,
    backoff: AcceptBackoff,
}

impl LimitedTcp {
    pub(crate) fn new(listener: tokio::net::TcpListener, max: usize) -> Self {
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
