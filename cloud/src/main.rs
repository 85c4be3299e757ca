//! `cloudcore [--config FILE]`: see `cloud::config` for the file.

use clap::Parser;
use std::process::ExitCode;

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

fn main() -> ExitCode {
    // One malloc arena for every thread, and freed memory handed back every few seconds, as
    // edgecore does: an IO-bound server's resident size otherwise stays at its peak.
    rt::sys::single_arena();
    rt::sys::release_freed_every(std::time::Duration::from_secs(5));
    let args = Args::parse();
    rt::bootstrap::init_tracing("info");
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
    // Every edge session holds a socket.
    rt::bootstrap::raise_nofile_limit();
    rt::bootstrap::run("cloudcore", rt::bootstrap::Threads::PerCore, |cancel| {
        cloud::run(config, cancel)
    })
}
