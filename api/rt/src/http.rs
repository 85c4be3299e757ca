//! HTTP/1.1 connections served with the limits every HTTP listener of the project keeps: each
//! request's headers must arrive within [`HEADER_TIMEOUT`] (a client that sends them a byte at a
//! time, to hold a connection, is cut off), and a stop ends the connection gracefully (the
//! request in progress is answered first). HTTP/2 (a TLS client that chose `h2`) with its own
//! bounds: streams, header lists and frames, and a ping that finds a silent client.

use std::error::Error;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

/// Runs connection `$conn` until it ends or `$stop`, then shuts it down gracefully (the
/// requests in progress are answered first).
macro_rules! until_stopped {
    ($conn:expr, $stop:expr) => {{
        let conn = $conn;
        tokio::pin!(conn);
        tokio::select! {
            r = conn.as_mut() => r,
            _ = $stop.cancelled() => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        }
    }};
}

/// How long a request's headers may take to arrive.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Concurrent streams one HTTP/2 connection may have open (kube-apiserver allows 250 too): a
/// page's watches and requests share one connection instead of the six a browser opens over
/// HTTP/1.1.
pub const H2_MAX_STREAMS: u32 = 250;

/// The largest header list an HTTP/2 request may carry.
pub const H2_MAX_HEADER_LIST: u32 = 64 * 1024;

/// Serves `service` on one connection until the client closes it or `stop`: HTTP/2 when `h2`
/// (the TLS client chose it; a client silent to pings for 20 s is cut off, a stop sends a GOAWAY
/// that lets the streams open finish), else HTTP/1.1 (upgrades go on over it).
pub async fn serve_connection<IO, S>(
    io: IO,
    service: S,
    stop: CancellationToken,
    h2: bool,
) -> Result<(), hyper::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn Error + Send + Sync>>,
    S::ResBody: Send + 'static,
    <S::ResBody as hyper::body::Body>::Data: Send,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn Error + Send + Sync>>,
{
    let io = hyper_util::rt::TokioIo::new(io);
    let timer = hyper_util::rt::TokioTimer::new();
    if h2 {
        let conn = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .timer(timer)
            .max_concurrent_streams(H2_MAX_STREAMS)
            .max_header_list_size(H2_MAX_HEADER_LIST)
            .keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(20))
            .serve_connection(io, service);
        until_stopped!(conn, stop)
    } else {
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(timer)
            .header_read_timeout(HEADER_TIMEOUT)
            .serve_connection(io, service)
            // A websocket (`kubectl exec`) goes on over the connection once upgraded.
            .with_upgrades();
        until_stopped!(conn, stop)
    }
}
