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
    // Before anything could replace it (an upgrade renames a new binary over it).
    edge::upgrade::remember_exe();
    rt::sys::single_arena();
    let args = Args::parse();
    rt::bootstrap::init_tracing("info,rumqttd=warn");
    if let Some(f) = &args.config {
        edge::upgrade::remember_config(f);
    }
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
    let data_dir = config.data_dir.clone();
    let code = rt::bootstrap::run(
        "edgecore",
        rt::bootstrap::Threads::PerCore,
        |cancel| async move {
            let ran = edge::app::run(config, cancel).await;
            // On trial after an upgrade or a config update, a failure puts the old one back.
            if let Err(e) = &ran
                && edge::upgrade::roll_back_after_failure(&data_dir, &format!("{e:#}"))
            {
                eprintln!("edgecore: rolled back after: {e:#}");
            }
            ran
        },
    );
    // Upgraded or rolled back: the binary at edgecore's path starts in this process's place.
    if let Some(e) = edge::upgrade::restart_if_asked() {
        eprintln!("edgecore: cannot start again after an upgrade: {e}");
        return ExitCode::from(1);
    }
    code
}
