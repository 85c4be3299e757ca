//! `devsim MANIFEST... [--scenario FILE] [--speed N] [--bind HOST]`: serves every Modbus TCP
//! device of the manifests until Ctrl-C.

use clap::Parser;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "devsim",
    about = "Simulates the Modbus TCP devices of Device/DeviceModel manifests, as mapper-modbus reads them"
)]
struct Args {
    /// Manifests (YAML, several documents each), as given to kubectl apply or edgecore.
    #[arg(required = true)]
    manifests: Vec<std::path::PathBuf>,
    /// What the devices do over time and their faults (YAML; see docs/hil.md).
    #[arg(long)]
    scenario: Option<std::path::PathBuf>,
    /// Scenario seconds per real second.
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// Serve every device on this host (its port kept) instead of its `ip`, e.g. 127.0.0.1.
    #[arg(long)]
    bind: Option<String>,
    /// Start each device's scenario clock at its first request (default: at the start).
    #[arg(long)]
    clock_from_first_request: bool,
    /// Only check the manifests and the scenario, and print the layout.
    #[arg(long)]
    check: bool,
}

fn read(path: &std::path::Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))
}

async fn main_inner(args: Args) -> anyhow::Result<()> {
    let mut text = String::new();
    for m in &args.manifests {
        text.push_str(&read(m)?);
        text.push_str("\n---\n");
    }
    let devices = devsim::layout::load(&text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let scenario = match &args.scenario {
        Some(p) => devsim::scenario::Scenario::parse(&read(p)?)?,
        None => devsim::scenario::Scenario::default(),
    };
    if !(args.speed > 0.0 && args.speed.is_finite()) {
        anyhow::bail!("--speed must be more than 0");
    }
    for d in &devices {
        println!("{} ({}):", d.id, d.address);
        for p in &d.points {
            let r = &p.point.read;
            println!(
                "  {:<16} {:?} {} x{} {} scale {} = {:?}",
                p.name,
                r.table,
                r.address,
                r.count,
                p.point.codec.data_type,
                p.point.codec.scale,
                p.initial
            );
        }
    }
    if devices.is_empty() {
        anyhow::bail!("no Modbus TCP device in the manifests");
    }
    if args.check {
        return Ok(());
    }
    let options = devsim::run::Options {
        speed: args.speed,
        bind: args.bind.clone(),
        clock_from_first_request: args.clock_from_first_request,
        ..Default::default()
    };
    let served = devsim::run::start(devices, &scenario, &options).await?;
    for s in &served {
        println!("devsim: {} serving Modbus TCP on {}", s.id, s.address);
    }
    tokio::signal::ctrl_c().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match main_inner(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("devsim: {e}");
            ExitCode::FAILURE
        }
    }
}
