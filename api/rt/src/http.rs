//! HTTP/1.1 connections served with the limits every HTTP listener of the project keeps: each
//! request's headers must arrive within [`HEADER_TIMEOUT`] (a client that sends them a byte at a
//! time, to hold a connection, is cut off), and a stop ends the connection gracefully (the
//! request in progress is answered first). HTTP/2 (a TLS client that chose `h2`) with its own
//! bounds: streams, header lists and frames, and a ping that finds a silent client.

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

/// Concurrent streams one HTTP/2 connection may have open (kube-apiserver allows 250 too): a
/// page's watches and requests share one connection instead of the six a browser opens over
/// HTTP/1.1.
pub const H2_MAX_STREAMS: u32 = 250;

/// The largest header list an HTTP/2 request may carry.
pub const H2_MAX_HEADER_LIST: u32 = 64 * 1024;

/// Serves `service` on one HTTP/2 connection until the client closes it or `stop` (then a
/// GOAWAY lets the streams open finish). A client silent to pings for 20 s is cut off.
pub async fn serve_h2_connection<IO, S>(
    io: IO,
    service: S,
    stop: CancellationToken,
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
    let conn = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .max_header_list_size(H2_MAX_HEADER_LIST)
        .keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(20))
        .serve_connection(hyper_util::rt::TokioIo::new(io), service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => r,
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    }
}
