//! `cloudcore [--config FILE]`: see `cloud::config` for the file.

use clap::Parser;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "cloudcore",
    about = "The cloud side: an embedded Kubernetes-compatible API (or a real cluster) for KubeEdge's device API"
)]
struct Args {
    /// The YAML config file; with none, every default applies.
    #[arg(long, short, global = true)]
    config: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Prints a token an edge node joins with: `{sha256 of the CA}.{JWT}`, valid for
    /// `modules.cloudHub.tokenTtlHours`.
    Gettoken,
}

/// One malloc arena for every thread, as edgecore does (`edge::memory`): glibc's per-thread
/// arenas do not reuse each other's freed memory, which inflates the resident size of an
/// IO-bound server for nothing.
#[allow(unsafe_code)]
fn single_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a glibc allocator parameter; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Hands memory freed in the middle of the heap back to the system every few seconds (glibc
/// returns only the top of the heap by itself), as edgecore does: a start-up or a burst of
/// writes otherwise leaves the resident size at its peak.
#[allow(unsafe_code)]
fn release_freed_periodically() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    std::thread::spawn(|| {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(5));
            // SAFETY: malloc_trim only walks glibc's own heap; it has no preconditions.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    });
}

fn main() -> ExitCode {
    single_arena();
    release_freed_periodically();
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: not in log files and journals.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = match &args.config {
        Some(f) => cloud::config::Config::load(f),
        None => cloud::config::Config::parse(
            "",
            std::path::Path::new("(defaults)"),
            std::path::Path::new("."),
        ),
    };
    let config = match config {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cloudcore: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(Command::Gettoken) = args.command {
        return match cloud::get_token(&config) {
            Ok(t) => {
                println!("{t}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("cloudcore gettoken: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    // Every edge session holds a socket: the soft limit of open files (often 1024) up to the
    // hard one.
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => tracing::debug!(limit = n, "open files limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open files limit"),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cloudcore: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            stop.cancel();
        });
        cloud::run(config, cancel).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cloudcore: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
