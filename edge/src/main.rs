//! `edgecore --config FILE`: the edge gateway. See `edge::config` for the file.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

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
    rt::sys::single_arena();
    let args = Args::parse();
    rt::bootstrap::init_tracing("info,rumqttd=warn");
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
    rt::bootstrap::run("edgecore", rt::bootstrap::Threads::PerCore, |cancel| {
        edge::app::run(config, cancel)
    })
}
