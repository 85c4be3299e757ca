//! HTTP/1.1 connections served with the limits every HTTP listener of the project keeps: each
//! request's headers must arrive within [`HEADER_TIMEOUT`] (a client that sends them a byte at a
//! time, to hold a connection, is cut off), and a stop ends the connection gracefully (the
//! request in progress is answered first).

use std::error::Error;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

/// How long a request's headers may take to arrive.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `service` on one connection until the client closes it or `stop`.
pub async fn serve_connection<IO, S>(
    io: IO,
    service: S,
    stop: CancellationToken,
) -> Result<(), hyper::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::Error: Into<Box<dyn Error + Send + Sync>>,
    S::ResBody: 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn Error + Send + Sync>>,
{
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        // A websocket (`kubectl exec`) goes on over the connection once upgraded.
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => r,
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    }
}
