//! `edgecore --config FILE`: the edge gateway. See `edge::config` for the file.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "edgecore",
    version,
    about = "Edge gateway: device twins, MQTT $hw API, DMI server, local manifests"
)]
struct Args {
    /// YAML config file; without one, every default applies.
    #[arg(long, short)]
    config: Option<PathBuf>,
}

fn main() -> ExitCode {
    edge::memory::single_arena();
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,rumqttd=warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: not in log files and journals.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = match &args.config {
        Some(f) => edge::config::Config::load(f),
        None => edge::config::Config::parse(
            "",
            std::path::Path::new("(defaults)"),
            std::path::Path::new("."),
        ),
    };
    let config = match config {
        Ok(c) => c,
        Err(e) => {
            eprintln!("edgecore: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("edgecore: cannot start the runtime: {e}");
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
        edge::app::run(config, cancel).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("edgecore: {e:#}");
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
