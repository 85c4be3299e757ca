//! `devsim MANIFEST... [--scenario FILE] [--speed N] [--bind HOST]`: serves every Modbus TCP
//! device of the manifests until Ctrl-C.
//!
//! `devsim hil FILE [--junit REPORT.xml] [--speed N]`: a hardware-in-the-loop run (see
//! `devsim::hil`); exits 1 when a step fails, 2 when the file cannot be run.
//!
//! `devsim record --listen ADDR --to DEVICE --out FILE.pcap`: a recording proxy;
//! `devsim replay FILE.pcap --listen ADDR [--loop] [--no-timing]`: the recording as a device.

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
    /// Where serial lines (Modbus RTU) are made as pty pairs: point the mapper's serialPort at
    /// DIR/NAME (NAME: the last part of the device's serialPort).
    #[arg(long, default_value = "devsim-pty")]
    pty_dir: std::path::PathBuf,
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
        match &d.rtu {
            Some(r) => println!("{} (slave {} on {}):", d.id, r.slave, r.port),
            None => println!("{} ({}):", d.id, d.address),
        }
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
        anyhow::bail!("no Modbus device in the manifests");
    }
    if args.check {
        return Ok(());
    }
    let options = devsim::run::Options {
        speed: args.speed,
        bind: args.bind.clone(),
        clock_from_first_request: args.clock_from_first_request,
        pty_dir: args.pty_dir.clone(),
        ..Default::default()
    };
    let served = devsim::run::start(devices, &scenario, &options).await?;
    for s in &served {
        match (&s.line, &s.device.rtu) {
            (Some(pty), Some(rtu)) => println!(
                "devsim: {} serving Modbus RTU as slave {} on {} (its serialPort {})",
                s.id,
                rtu.slave,
                pty.display(),
                rtu.port
            ),
            _ => println!("devsim: {} serving Modbus TCP on {}", s.id, s.address),
        }
    }
    tokio::signal::ctrl_c().await?;
    Ok(())
}

#[derive(Parser)]
#[command(
    name = "devsim hil",
    about = "Runs a hardware-in-the-loop file: simulated devices, edgecore, mapper-modbus, steps that check the twin"
)]
struct HilArgs {
    /// The HIL file (YAML: manifests, device scenarios, steps).
    file: std::path::PathBuf,
    /// Write the steps' outcomes as JUnit XML here.
    #[arg(long)]
    junit: Option<std::path::PathBuf>,
    /// Scenario seconds per real second.
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
}

fn hil(args: HilArgs) -> ExitCode {
    let outcomes = match devsim::hil::run(&args.file, args.speed) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("devsim hil: {e}");
            return ExitCode::from(2);
        }
    };
    let failed = outcomes.iter().filter(|o| o.failure.is_some()).count();
    println!(
        "{} of {} steps passed{}",
        outcomes.len() - failed,
        outcomes.len(),
        if failed > 0 {
            "; the run stopped at the failed one"
        } else {
            ""
        }
    );
    if let Some(path) = &args.junit {
        let suite = args.file.display().to_string();
        if let Err(e) = std::fs::write(path, devsim::hil::junit(&suite, &outcomes)) {
            eprintln!("devsim hil: cannot write {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

#[derive(Parser)]
#[command(
    name = "devsim record",
    about = "A Modbus TCP proxy that records both directions to a pcap file (Wireshark reads it)"
)]
struct RecordArgs {
    /// Where the mapper connects instead of the device (host:port).
    #[arg(long)]
    listen: String,
    /// The device (host:port).
    #[arg(long)]
    to: String,
    /// The recording to write (pcap).
    #[arg(long)]
    out: std::path::PathBuf,
}

#[derive(Parser)]
#[command(
    name = "devsim replay",
    about = "Serves a recording as a device: each request answered as recorded, in order"
)]
struct ReplayArgs {
    /// A pcap file of Modbus TCP (from devsim record, Wireshark or tcpdump).
    file: std::path::PathBuf,
    /// host:port to serve on.
    #[arg(long)]
    listen: String,
    /// After the last recorded answer to a request, start over (default: hold the last).
    #[arg(long = "loop")]
    looping: bool,
    /// Answer at once instead of after the recorded delays.
    #[arg(long)]
    no_timing: bool,
}

async fn record(args: RecordArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
    println!(
        "devsim: recording between {} and {} to {} (Ctrl-C ends it)",
        args.listen,
        args.to,
        args.out.display()
    );
    tokio::select! {
        r = devsim::record::proxy(listener, args.to.clone(), &args.out) => r?,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}

async fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    let rec = devsim::record::Recording::read(&args.file)?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
    println!(
        "devsim: replaying {} ({} requests, {} answers) on {}",
        args.file.display(),
        rec.exchanges.len(),
        rec.answers(),
        args.listen
    );
    let options = devsim::record::ReplayOptions {
        looping: args.looping,
        no_timing: args.no_timing,
    };
    tokio::select! {
        r = devsim::record::serve(listener, rec, options) => r?,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}

fn block_on(f: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("devsim: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(f) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("devsim: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    init_logging();
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let sub = argv
        .get(1)
        .and_then(|a| a.to_str())
        .unwrap_or_default()
        .to_string();
    match sub.as_str() {
        "hil" => {
            argv.remove(1);
            return hil(HilArgs::parse_from(argv));
        }
        "record" => {
            argv.remove(1);
            return block_on(record(RecordArgs::parse_from(argv)));
        }
        "replay" => {
            argv.remove(1);
            return block_on(replay(ReplayArgs::parse_from(argv)));
        }
        _ => {}
    }
    block_on(main_inner(Args::parse_from(argv)))
}

fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
}
