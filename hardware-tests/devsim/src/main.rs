//! `devsim MANIFEST... [--scenario FILE] [--speed N] [--bind HOST]`: serves every device of the
//! manifests (Modbus TCP and RTU, serial protocols, OPC UA, BLE) until a signal.
//!
//! `devsim hil FILE [--junit REPORT.xml] [--speed N]`: a hardware-in-the-loop run (see
//! `devsim::hil`); exits 1 when a step fails, 2 when the file cannot be run.
//!
//! `devsim record --listen ADDR --to DEVICE --out FILE.pcap` (or `--serial PORT --pty PATH`):
//! a recording proxy or line tap; `devsim replay FILE.pcap --listen ADDR` (or `--line PATH`):
//! the recording as a device.
//!
//! `devsim discover ADDRESS [-o draft.yaml]`: drafts the manifests of the devices at a Modbus
//! TCP address, on an RTU line, on an OPC UA server or in BLE range, never writing.

use clap::Parser;
use devsim::layout::Visit;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "devsim",
    about = "Simulates the devices of Device/DeviceModel manifests (Modbus TCP and RTU, serial protocols, OPC UA, BLE), each laid out as its mapper reads it",
    after_help = "Also:\n  devsim hil FILE         a hardware-in-the-loop run: the devices, edgecore, the mappers, steps that check the twin\n  devsim record ...       a recording proxy (Modbus TCP) or line tap (RTU) to pcap\n  devsim replay FILE ...  a recording served as the device\n  devsim discover ADDR    draft manifests from devices on the wire (Modbus TCP/RTU, OPC UA, BLE), never writing\nEach takes --help. See docs/hil.md and docs/discover.md."
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
        match (&d.rtu, &d.serial) {
            _ if d.ble.is_some() => println!(
                "{} (BLE {}):",
                d.id,
                d.ble
                    .as_ref()
                    .map(|b| b.address.as_str())
                    .unwrap_or_default()
            ),
            _ if d.opcua.is_some() => println!(
                "{} (OPC UA at {}):",
                d.id,
                d.opcua.as_deref().unwrap_or_default()
            ),
            (Some(r), _) => println!("{} (slave {} on {}):", d.id, r.slave, r.port),
            (None, Some(p)) => println!("{} (own protocol on {}):", d.id, p.serial.path),
            (None, None) => println!("{} (unit {} at {}):", d.id, d.unit, d.address),
        }
        for p in &d.points {
            match &p.point {
                Visit::Modbus(mp) => {
                    let c = &mp.codec;
                    let mut how = format!("{:?}", c.data_type);
                    if c.data_type != mapper_modbus::codec::DataType::Bool {
                        how.push_str(&format!(" byteOrder {:?}", c.order));
                    }
                    if let Some(b) = c.bit {
                        how.push_str(&format!(" bit {b}"));
                    }
                    if c.scale != 1.0 {
                        how.push_str(&format!(" scale {}", c.scale));
                    }
                    if c.offset != 0.0 {
                        how.push_str(&format!(" valueOffset {}", c.offset));
                    }
                    println!(
                        "  {:<16} {:?} {} x{} {how} = {:?}",
                        p.name, mp.read.table, mp.read.address, mp.read.count, p.initial
                    )
                }
                Visit::OpcUa(op, t) => println!(
                    "  {:<16} node {} {:?} = {:?}",
                    p.name,
                    match &op.node.namespace_uri {
                        Some(u) => format!("nsu={u};{}", op.node.id.identifier),
                        None => op.node.id.to_string(),
                    },
                    t,
                    p.initial
                ),
                Visit::Ble(bp) => println!(
                    "  {:<16} characteristic {} {:?} = {:?}",
                    p.name, bp.characteristic, bp.format, p.initial
                ),
                Visit::Serial(sp) => println!(
                    "  {:<16} request {:?} = {:?}",
                    p.name,
                    String::from_utf8_lossy(&sp.request).trim_end(),
                    p.initial
                ),
            }
        }
    }
    if devices.is_empty() {
        anyhow::bail!("no Modbus, serial, OPC UA or BLE device in the manifests");
    }
    scenario.check_against(&devices)?;
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
    let stop = stop_signal();
    let served = devsim::run::start(devices, &scenario, &options).await?;
    for s in &served {
        match (&s.line, &s.device.rtu, &s.device.serial) {
            (Some(pty), Some(rtu), _) => println!(
                "devsim: {} serving Modbus RTU as slave {} on {} (its serialPort {})",
                s.id,
                rtu.slave,
                pty.display(),
                rtu.port
            ),
            (Some(pty), None, Some(port)) => println!(
                "devsim: {} serving its own protocol on {} (its serialPort {})",
                s.id,
                pty.display(),
                port.serial.path
            ),
            _ if s.bus.is_some() => println!(
                "devsim: {} serving BLE behind BlueZ on the D-Bus bus {} (give the mapper DBUS_SYSTEM_BUS_ADDRESS={})",
                s.id,
                s.bus.as_deref().unwrap_or_default(),
                s.bus.as_deref().unwrap_or_default()
            ),
            _ if s.device.opcua.is_some() => println!(
                "devsim: {} serving OPC UA on opc.tcp://{}/",
                s.id, s.address
            ),
            _ => println!(
                "devsim: {} serving Modbus TCP as unit {} on {}",
                s.id, s.device.unit, s.address
            ),
        }
    }
    stop.await;
    Ok(())
}

/// Waits for SIGINT, SIGTERM or SIGHUP: what ends `devsim`, `record` and `replay` as Ctrl-C
/// does, so that what they started (a pty pair's socat, servers, the recording's last frames)
/// is cleaned up on each. The handlers are registered when this is called, not when the
/// future is first polled: call it before saying "serving" or "replaying", so that a signal
/// sent as soon as that line is read is not the default action (death without cleanup).
fn stop_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    );
    async move {
        match handlers {
            (Ok(mut int), Ok(mut term), Ok(mut hup)) => {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                    _ = hup.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

#[derive(Parser)]
#[command(
    name = "devsim hil",
    bin_name = "devsim hil",
    about = "Runs a hardware-in-the-loop file: simulated devices, edgecore, the mappers they need, steps that check the twin and the wire; JUnit XML for CI"
)]
struct HilArgs {
    /// The HIL file (YAML: manifests, device scenarios, steps).
    file: std::path::PathBuf,
    /// Write the steps' outcomes as JUnit XML here (one test case per step; a file that cannot
    /// run is one test case in error); a failed run's logs go beside it, in `NAME-logs/`.
    #[arg(long)]
    junit: Option<std::path::PathBuf>,
    /// Scenario seconds per real second.
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
}

fn hil(args: HilArgs) -> ExitCode {
    let suite = args.file.display().to_string();
    // A failed run's logs go beside the JUnit file: `report.xml` -> `report-logs/`.
    let logs = args.junit.as_ref().map(|j| {
        let stem = j
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "hil".into());
        j.with_file_name(format!("{stem}-logs"))
    });
    let write = |text: String| -> bool {
        let Some(path) = &args.junit else {
            return true;
        };
        match std::fs::write(path, text) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("devsim hil: cannot write {}: {e}", path.display());
                false
            }
        }
    };
    devsim::hil::stop_on_signals();
    // Everything the run started is gone when it returns; a signal then ends the program.
    let by_signal = || devsim::hil::stopped_by().map(|n| ExitCode::from(128 + n as u8));
    let outcomes = match devsim::hil::run(&args.file, args.speed, logs.as_deref()) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("devsim hil: {e}");
            write(devsim::hil::junit_error(&suite, &e.to_string()));
            return by_signal().unwrap_or(ExitCode::from(2));
        }
    };
    let failed = outcomes.iter().filter(|o| o.failure.is_some()).count();
    let skipped = outcomes.iter().filter(|o| o.skipped).count();
    println!(
        "{} of {} steps passed{}",
        outcomes.len() - failed - skipped,
        outcomes.len(),
        if failed > 0 {
            format!("; the run stopped at the failed one ({skipped} not run)")
        } else {
            String::new()
        }
    );
    if !write(devsim::hil::junit(&suite, &outcomes)) {
        return ExitCode::from(2);
    }
    if let Some(code) = by_signal() {
        return code;
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
    bin_name = "devsim record",
    about = "A Modbus TCP proxy, or a tap on a Modbus RTU line, that records both directions to a pcap file (Wireshark reads it)"
)]
struct RecordArgs {
    /// Modbus TCP: where the mapper connects instead of the device (host:port).
    #[arg(long, requires = "to", conflicts_with = "serial")]
    listen: Option<String>,
    /// Modbus TCP: the device (host:port).
    #[arg(long)]
    to: Option<String>,
    /// Modbus RTU: the device's serial line (e.g. /dev/ttyUSB0); the mapper opens --pty instead.
    #[arg(long, requires = "pty")]
    serial: Option<String>,
    /// Modbus RTU: the line's baud rate.
    #[arg(long, default_value_t = 9600)]
    baud: u32,
    /// Modbus RTU: the pty made for the mapper (point its serialPort here).
    #[arg(long)]
    pty: Option<std::path::PathBuf>,
    /// The recording to write (pcap).
    #[arg(long)]
    out: std::path::PathBuf,
}

#[derive(Parser)]
#[command(
    name = "devsim replay",
    bin_name = "devsim replay",
    about = "Serves a recording as a device: each request answered as recorded, in order"
)]
struct ReplayArgs {
    /// A pcap file of Modbus TCP or of an RTU line (from devsim record, Wireshark or tcpdump).
    file: std::path::PathBuf,
    /// host:port to serve on (Modbus TCP).
    #[arg(long, required_unless_present = "line", conflicts_with = "line")]
    listen: Option<String>,
    /// Serve as Modbus RTU on a pty made here (point the mapper's serialPort at it).
    #[arg(long)]
    line: Option<std::path::PathBuf>,
    /// The baud rate of --line.
    #[arg(long, default_value_t = 9600)]
    baud: u32,
    /// After the last recorded answer to a request, start over (default: hold the last).
    #[arg(long = "loop")]
    looping: bool,
    /// Answer at once instead of after the recorded delays.
    #[arg(long)]
    no_timing: bool,
    /// The answer to a request the recording does not have: exception:CODE (default
    /// exception:2, illegal data address), accept (a write answered as done) or silent.
    #[arg(long, default_value = "exception:2")]
    unknown: devsim::record::Unknown,
}

#[derive(Parser)]
#[command(
    name = "devsim discover",
    bin_name = "devsim discover",
    about = "Drafts the DeviceModel and Device manifests of the devices at ADDRESS from what answers (Modbus TCP or RTU, OPC UA, BLE); reads only, never writes"
)]
struct DiscoverArgs {
    /// Where the devices are: host:port for Modbus TCP, the path of a serial port for Modbus
    /// RTU (its settings are found: see --bauds, --parities), opc.tcp://host:port for an OPC
    /// UA server (browsed: see --from, --depth), or ble (every peripheral in range) or
    /// ble:C4:7C:8D:6A:12:34 (one) for BLE through BlueZ (see --adapter, --scan-seconds).
    address: String,
    /// BLE: the adapter to scan with (hci0); the first one by default.
    #[arg(long)]
    adapter: Option<String>,
    /// BLE: how long to scan for peripherals.
    #[arg(long, default_value_t = 5)]
    scan_seconds: u64,
    /// OPC UA: the node to browse from (ns=2;s=Line1); the Objects folder by default.
    #[arg(long)]
    from: Option<String>,
    /// OPC UA: how many levels of folders and objects below it are browsed.
    #[arg(long, default_value_t = 10)]
    depth: usize,
    /// Unit ids to try: 1-10, 1,2,5 or 3.
    #[arg(long, default_value = "1")]
    units: String,
    /// The highest address tried in each table.
    #[arg(long, default_value_t = 999)]
    last_address: u16,
    /// Modbus: at most this many requests to read one unit's tables; where they run out is
    /// said in the draft (on a 9600-baud line, 1,000 requests take about 25 s).
    #[arg(long, default_value_t = 4000)]
    max_requests: usize,
    /// Modbus: ask every address (by default, after 32 addresses in a row that are not there,
    /// one in 16 is probed, and the scan goes back address by address where one answers).
    #[arg(long)]
    exhaustive: bool,
    /// How long an answer may take, in milliseconds, before the unit counts as absent
    /// (default: 1000 over TCP and OPC UA, 100 on a serial line, 10000 for a BLE connection).
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// RTU: the baud rates tried, in this order.
    #[arg(long, default_value = "9600,19200,38400,115200", value_delimiter = ',')]
    bauds: Vec<u32>,
    /// RTU: the parities tried (none, even, odd), each with every baud rate, in this order.
    #[arg(long, default_value = "none,even,odd", value_delimiter = ',')]
    parities: Vec<String>,
    /// RTU: also try two stop bits without parity.
    #[arg(long)]
    two_stop_bits: bool,
    /// RTU: go on through every setting after units answered (slaves set differently on one
    /// line); by default the scan ends at the first setting anything answers at.
    #[arg(long)]
    all_settings: bool,
    /// The drafted Device's name (its model: NAME-model).
    #[arg(long, default_value = "discovered")]
    name: String,
    /// At most this many properties per device.
    #[arg(long, default_value_t = 200)]
    max_properties: usize,
    /// Write the draft here instead of standard output.
    #[arg(long, short)]
    out: Option<std::path::PathBuf>,
    /// Also write a starting HIL file here: the simulated devices hold the values read and a
    /// step per property expects them in the twin (needs --out).
    #[arg(long, requires = "out")]
    hil: Option<std::path::PathBuf>,
}

/// `1-10`, `1,2,5`, `3` as unit ids.
fn unit_ids(text: &str) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let num = |s: &str| {
            s.trim()
                .parse::<u8>()
                .map_err(|_| anyhow::anyhow!("--units: {s:?} is not a unit id (0 to 255)"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                anyhow::ensure!(a <= b, "--units: {part:?} runs backwards");
                out.extend(a..=b);
            }
            None => out.push(num(part)?),
        }
    }
    anyhow::ensure!(!out.is_empty(), "--units: no unit id given");
    Ok(out)
}

async fn discover(args: DiscoverArgs) -> anyhow::Result<()> {
    let timeout =
        |default: u64| std::time::Duration::from_millis(args.timeout_ms.unwrap_or(default).max(1));
    let (draft, found) = if args.address.starts_with("opc.tcp://") {
        let o = devsim::discover::opcua::Options {
            url: args.address.clone(),
            from: args.from.clone(),
            depth: args.depth,
            timeout: timeout(1000),
            name: args.name.clone(),
            max_properties: args.max_properties,
        };
        let b = devsim::discover::opcua::browse(&o)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        eprintln!(
            "devsim discover: {} variables found, {} requests (Browse and Read only)",
            b.variables.len(),
            b.requests
        );
        (
            devsim::discover::opcua::draft(&b, &o),
            !b.variables.is_empty(),
        )
    } else if args.address == "ble" || args.address.starts_with("ble:") {
        let o = devsim::discover::ble::Options {
            adapter: args.adapter.clone(),
            address: args
                .address
                .strip_prefix("ble:")
                .filter(|a| !a.is_empty())
                .map(str::to_string),
            scan: std::time::Duration::from_secs(args.scan_seconds),
            timeout: timeout(10_000),
            name: args.name.clone(),
            max_properties: args.max_properties,
        };
        let s = devsim::discover::ble::scan(&o)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        eprintln!(
            "devsim discover: {} peripherals found on {}, {} GATT reads (reads only)",
            s.peripherals.len(),
            s.adapter,
            s.reads
        );
        (
            devsim::discover::ble::draft(&s, &o),
            !s.peripherals.is_empty(),
        )
    } else {
        discover_modbus(&args, timeout).await?
    };
    let text = &draft.manifests;
    match &args.out {
        Some(p) => std::fs::write(p, text)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", p.display()))?,
        None => print!("{text}"),
    }
    if let (Some(hil), Some(out)) = (&args.hil, &args.out) {
        // The HIL file names the draft relative to itself when they share a directory.
        let same_dir = hil.parent() == out.parent();
        let manifests = match (same_dir, out.file_name()) {
            (true, Some(n)) => n.to_string_lossy().into_owned(),
            _ => std::path::absolute(out)
                .unwrap_or_else(|_| out.clone())
                .display()
                .to_string(),
        };
        std::fs::write(hil, draft.hil(&manifests))
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", hil.display()))?;
    }
    anyhow::ensure!(found, "nothing answered at {}", args.address);
    Ok(())
}

async fn discover_modbus(
    args: &DiscoverArgs,
    timeout: impl Fn(u64) -> std::time::Duration,
) -> anyhow::Result<(devsim::discover::Draft, bool)> {
    use devsim::discover::modbus::{Line, Target};
    use mapper_sdk::configdata::Parity;
    let serial = !args.address.contains(':') || args.address.starts_with('/');
    let target = if serial {
        let mut parities = Vec::new();
        for p in &args.parities {
            parities.push(match p.trim().to_ascii_lowercase().as_str() {
                "none" | "n" => Parity::None,
                "even" | "e" => Parity::Even,
                "odd" | "o" => Parity::Odd,
                other => anyhow::bail!("--parities: {other:?} is not none, even or odd"),
            });
        }
        anyhow::ensure!(
            args.bauds.iter().all(|b| *b > 0),
            "--bauds: 0 is no baud rate"
        );
        Target::Rtu {
            path: args.address.clone(),
            lines: Line::common(&args.bauds, &parities, args.two_stop_bits),
            all: args.all_settings,
        }
    } else {
        Target::Tcp(args.address.clone())
    };
    let o = devsim::discover::modbus::Options {
        target,
        units: unit_ids(&args.units)?,
        last_address: args.last_address,
        timeout: timeout(if serial { 100 } else { 1000 }),
        name: args.name.clone(),
        max_properties: args.max_properties,
        max_requests: args.max_requests,
        exhaustive: args.exhaustive,
    };
    let scan = devsim::discover::modbus::scan(&o)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let settings = match scan.units.first().and_then(|u| u.line) {
        Some(line) => format!(" at {line}"),
        None => String::new(),
    };
    eprintln!(
        "devsim discover: {} of {} unit ids answered{settings}, {} requests (reads only)",
        scan.units.len(),
        o.units.len(),
        scan.requests
    );
    Ok((
        devsim::discover::modbus::draft(&scan, &o),
        !scan.units.is_empty(),
    ))
}

/// A pty pair: the mapper's end at `path`, devsim's `path.device`, opened.
fn pty_for_mapper(
    path: &std::path::Path,
    baud: u32,
) -> anyhow::Result<(sim::PtyPair, tokio_serial::SerialStream)> {
    let device = path.with_extension("device");
    let pair = sim::PtyPair::link(device.clone(), path.to_path_buf())
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let stream =
        tokio_serial::SerialStream::open(&tokio_serial::new(device.to_string_lossy(), baud))
            .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", device.display()))?;
    Ok((pair, stream))
}

async fn record(args: RecordArgs) -> anyhow::Result<()> {
    if let (Some(serial), Some(pty)) = (&args.serial, &args.pty) {
        let device =
            tokio_serial::SerialStream::open(&tokio_serial::new(serial.as_str(), args.baud))
                .map_err(|e| anyhow::anyhow!("cannot open {serial}: {e}"))?;
        let (_pair, mapper) = pty_for_mapper(pty, args.baud)?;
        let stop = stop_signal();
        println!(
            "devsim: tapping {serial} for a mapper on {} to {} (Ctrl-C ends it)",
            pty.display(),
            args.out.display()
        );
        let c = devsim::record::tap(mapper, device, &args.out, stop).await?;
        println!(
            "devsim: {} requests, {} answers, {} with a wrong CRC, {} incomplete",
            c.requests, c.answers, c.bad_crc, c.incomplete
        );
        return Ok(());
    }
    let (Some(listen), Some(to)) = (&args.listen, &args.to) else {
        anyhow::bail!("give --listen and --to (Modbus TCP), or --serial and --pty (Modbus RTU)");
    };
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
    let stop = stop_signal();
    println!(
        "devsim: recording between {listen} and {to} to {} (Ctrl-C ends it)",
        args.out.display()
    );
    tokio::select! {
        r = devsim::record::proxy(listener, to.clone(), &args.out) => r?,
        _ = stop => {}
    }
    Ok(())
}

async fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    let rec = devsim::record::Recording::read(&args.file)?;
    let options = devsim::record::ReplayOptions {
        looping: args.looping,
        no_timing: args.no_timing,
        unknown: args.unknown,
    };
    let what = format!(
        "{} ({} requests, {} answers)",
        args.file.display(),
        rec.exchanges.len(),
        rec.answers()
    );
    if let Some(line) = &args.line {
        let (_pair, stream) = pty_for_mapper(line, args.baud)?;
        let stop = stop_signal();
        println!(
            "devsim: replaying {what} as Modbus RTU on {}",
            line.display()
        );
        tokio::select! {
            r = devsim::record::serve_line(stream, rec, options) => r?,
            _ = stop => {}
        }
        return Ok(());
    }
    let listen = args.listen.unwrap_or_default();
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
    let stop = stop_signal();
    println!("devsim: replaying {what} on {listen}");
    tokio::select! {
        r = devsim::record::serve(listener, rec, options) => r?,
        _ = stop => {}
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
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let sub = argv
        .get(1)
        .and_then(|a| a.to_str())
        .unwrap_or_default()
        .to_string();
    init_logging(if sub == "discover" {
        // async-opcua's client logs its missing certificate (discover opens no secure channel)
        // and its own disconnect; discover says what went wrong itself.
        "warn,opcua_client=off,opcua_core=off,opcua_crypto=off"
    } else {
        "warn"
    });
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
        "discover" => {
            argv.remove(1);
            return block_on(discover(DiscoverArgs::parse_from(argv)));
        }
        _ => {}
    }
    block_on(main_inner(Args::parse_from(argv)))
}

fn init_logging(default: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
        )
        .with_writer(std::io::stderr)
        .init();
}
