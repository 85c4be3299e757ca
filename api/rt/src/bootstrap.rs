//! What every binary does before and around its work: logs to stderr filtered by `RUST_LOG`,
//! the open-files limit raised, a tokio runtime, and a cancellation on SIGINT or SIGTERM.

use std::future::Future;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

/// Logs to stderr, filtered by `RUST_LOG` or else `default_filter`; colours only on a terminal
/// (not in log files and journals).
pub fn init_tracing(default_filter: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Raises the soft limit of open files to the hard limit, as servers commonly do (every
/// session, connection and database holds descriptors; the soft limit is often 1024). Returns
/// the limit now in force (0 when it cannot be read).
pub fn raise_nofile_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => {
            tracing::debug!(limit = n, "open files limit");
            n
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open files limit");
            0
        }
    }
}

/// Resolves on SIGINT or SIGTERM. The handlers are registered when this is called (inside a
/// runtime), not when the future is first polled: a signal that arrives between the call and
/// the first poll (a supervisor that stops the program as soon as it says it is ready) ends it
/// cleanly instead of by the signal's default action.
pub fn shutdown_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            }
            _ => std::future::pending().await,
        }
    }
}

/// The runtime a binary runs on: one thread (a mapper: every device waits on IO) or one per
/// core (edgecore, cloudcore).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    One,
    PerCore,
}

/// Runs `work` on a new runtime with a token cancelled on SIGINT or SIGTERM, and turns its
/// result into the exit status: 0, or 1 with `{name}: {error}` on stderr.
pub fn run<F, Fut, E>(name: &str, threads: Threads, work: F) -> ExitCode
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let built = match threads {
        Threads::One => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Threads::PerCore => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    };
    let runtime = match built {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{name}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        let signalled = shutdown_signal();
        tokio::spawn(async move {
            signalled.await;
            stop.cancel();
        });
        work(cancel).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            ExitCode::FAILURE
        }
    }
}
