//! The process plumbing every binary of the project shares, so that each is written once:
//!
//! - [`transport`]: gRPC channels and listeners on Unix sockets (DMI, CRI), with the
//!   `:authority` fix of [`authority`]; bounded listeners ([`transport::Permitted`]) whose failed
//!   accepts back off ([`transport::AcceptBackoff`]).
//! - [`bootstrap`]: logging, the open-files limit, the runtime and SIGINT/SIGTERM.
//! - [`address`]: MQTT broker addresses, `host:port` or `tcp://host:port`.
//! - [`http`]: HTTP/1.1 connections with a deadline on request headers.
//! - [`fs`]: private data directories and databases (0700, 0600), whatever the umask.
//! - [`config`]: YAML config files read with the path of a wrong key in the error.
//! - [`backoff`]: the growing pause between retries of every reconnecting loop.
//! - [`metrics`]: `/metrics` in the Prometheus text format, encoded by prometheus-client.
//! - [`secret`]: secrets compared in constant time.
//! - [`ratelimit`]: a token bucket for message rates.
//! - [`sys`]: the allocator's tuning: the only unsafe code of the project.
//! - [`ui`]: what the two web pages (edgecore's and cloudcore's) share: the style sheet, the
//!   common script, the security headers of every file served.
//!
//! `api` stays types only; this crate is the IO under it, as kube-client is to kube-core.

/// `AsyncWrite` for a wrapper whose writes go straight to its `io` field (the wrappers here
/// change how a connection is read, or what it holds, never what is written).
macro_rules! write_through {
    ($wrapper:ident) => {
        impl<IO: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for $wrapper<IO> {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.io.is_write_vectored()
            }
        }
    };
}
// Used by the wrappers of `transport` and `authority` alike.
pub(crate) use write_through;

pub mod address;
pub mod authority;
pub mod backoff;
pub mod bootstrap;
pub mod config;
pub mod fs;
pub mod host;
pub mod http;
pub mod metrics;
pub mod ratelimit;
pub mod secret;
pub mod sys;
pub mod transport;
pub mod ui;

pub use backoff::Backoff;
