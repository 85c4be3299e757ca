//! `modbus-bench`: the figures of the Modbus mapper, printed (docs/benchmarks.md).
//!
//! ```text
//! cargo run --release -p hardware-tests --bin modbus-bench
//! cargo run --release -p hardware-tests --bin modbus-bench -- --only throughput --seconds 5
//! ```
//!
//! 1. `throughput`: Modbus TCP transactions per second of one connection against the project's
//!    simulator (tokio-modbus's server, on a thread of its own) on loopback: the mapper's client
//!    (`mapper_modbus` through the SDK's driver interface, as the mapper runs it), beside
//!    libmodbus (a C loop built here against Debian's `libmodbus-dev`), Debian's `mbpoll` and
//!    pymodbus's synchronous client, one after the other in the same run. Reads of 1 register,
//!    then of 125 (the mapper reads 125 one-register properties, merged into one request).
//! 2. `planner`: requests per cycle for 100 properties scattered over 1,000 registers, from
//!    the planner and counted on the wire, against one request per property.
//! 3. `latency`: a desired value set at edgecore (HTTP `PUT .../desired`) to the register
//!    written in the simulator, and to the new value reported (the `twin/update/document`
//!    message on edgecore's MQTT broker), with the release `edgecore` and `mapper-modbus`.
//! 4. `memory`: resident memory of `mapper-modbus` polling 100 devices of 5 properties each
//!    every second.
//!
//! A peer that is not installed is skipped with the command that installs it.

use clap::{Parser, ValueEnum};
use mapper_modbus::mapper::Modbus;
use mapper_modbus::planner::{self, Limits, Read, Refused};
use mapper_sdk::{DeviceConfig, Driver, PropertyConfig, Protocol};
use serde_json::json;
use sim::modbus_sim::Sim;
use sim::{Node, free_port, object, percentile};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "modbus-bench", about = "Figures of the Modbus mapper")]
struct Args {
    /// Seconds per throughput run.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Desired-value round trips for the latency figure.
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// Devices polled for the memory figure, and polled meanwhile for the latency figure.
    #[arg(long, default_value_t = 100)]
    devices: usize,
    /// Only these parts (comma-separated); all by default.
    #[arg(long, value_delimiter = ',')]
    only: Vec<Part>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Part {
    Throughput,
    Planner,
    Latency,
    Memory,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let want = |p: Part| args.only.is_empty() || args.only.contains(&p);
    let result = (|| -> anyhow::Result<()> {
        if want(Part::Throughput) {
            throughput(args.seconds)?;
        }
        if want(Part::Planner) {
            planner_figure()?;
        }
        if want(Part::Latency) || want(Part::Memory) {
            eprintln!("building the release edgecore and mapper-modbus ...");
            let bins = sim::built_binaries(true)?;
            if want(Part::Latency) {
                latency(&bins, args.samples, args.devices)?;
            }
            if want(Part::Memory) {
                memory(&bins, args.devices)?;
            }
        }
        Ok(())
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("modbus-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `n` holding registers from address 0, each holding its address.
fn filled(n: u16) -> Sim {
    Sim::with(|s| s.holding.extend((0..n).map(|a| (a, a))))
}

/// A device of one-register INT properties at `addresses` on 127.0.0.1:`port`.
fn device_config(port: u16, addresses: &[(u16, u16)]) -> DeviceConfig {
    DeviceConfig {
        namespace: "default".into(),
        name: "bench".into(),
        protocol: object(json!({"ip": "127.0.0.1", "port": port, "slaveID": 1})),
        properties: addresses
            .iter()
            .map(|&(a, n)| PropertyConfig {
                name: format!("r{a}"),
                visitor: object(json!({"register": "HoldingRegister", "offset": a, "limit": n})),
                value_type: Some("INT".into()),
                ..Default::default()
            })
            .collect(),
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Throughput

/// Transactions and seconds of one run.
type Run = anyhow::Result<(u64, f64)>;

/// A minimal Modbus TCP server on blocking sockets, a thread per connection: it answers
/// functions 3 and 4 with each register holding its address and anything else with exception 1.
/// It costs the clients as little as a server can, like the C server of libmodbus' raw-loop figures
/// (docs/benchmarks.md), so the figures are the clients'. With `changing`, every register changes
/// at every answer (its address plus the answers given so far): the case where a client cannot
/// keep a value from the last read. Returns its port.
fn floor_server(changing: bool) -> std::io::Result<u16> {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = stream;
                let _ = s.set_nodelay(true);
                let mut head = [0u8; 7];
                let mut pdu = [0u8; 260];
                let mut out = Vec::with_capacity(260);
                let mut answers: u16 = 0;
                while s.read_exact(&mut head).is_ok() {
                    answers = answers.wrapping_add(u16::from(changing));
                    let len = usize::from(u16::from_be_bytes([head[4], head[5]]));
                    if !(2..=254).contains(&len) || s.read_exact(&mut pdu[..len - 1]).is_err() {
                        return;
                    }
                    let function = pdu[0];
                    let address = u16::from_be_bytes([pdu[1], pdu[2]]);
                    let count = u16::from_be_bytes([pdu[3], pdu[4]]);
                    out.clear();
                    out.extend_from_slice(&head[..4]);
                    if (function == 3 || function == 4) && len == 6 && (1..=125).contains(&count) {
                        out.extend_from_slice(&(3 + 2 * count).to_be_bytes());
                        out.extend_from_slice(&[head[6], function, (2 * count) as u8]);
                        for a in address..address.saturating_add(count) {
                            out.extend_from_slice(&a.wrapping_add(answers).to_be_bytes());
                        }
                    } else {
                        out.extend_from_slice(&3u16.to_be_bytes());
                        out.extend_from_slice(&[head[6], function | 0x80, 1]);
                    }
                    if s.write_all(&out).is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(port)
}

fn throughput(seconds: f64) -> anyhow::Result<()> {
    let floor = floor_server(false).map_err(|e| anyhow::anyhow!("server: {e}"))?;
    let changing = floor_server(true).map_err(|e| anyhow::anyhow!("server: {e}"))?;
    let sim = filled(125);
    let (sim_port, _rt) = sim
        .start("127.0.0.1:0")
        .map_err(|e| anyhow::anyhow!("simulator: {e}"))?;
    let work = tempfile::tempdir().map_err(anyhow::Error::from)?;
    for (server, port) in [
        ("a minimal blocking Modbus TCP server (the floor)", floor),
        (
            "the floor server with every register changing at every answer",
            changing,
        ),
        (
            "the project's simulator (tokio-modbus's server, one worker thread)",
            sim_port,
        ),
    ] {
        println!(
            "\n## Modbus TCP client throughput: one connection to {server} on 127.0.0.1, {seconds} s per run\n"
        );
        println!(
            "| client | 1 register: transactions/s | 125 registers: transactions/s | registers/s |"
        );
        println!("|---|---|---|---|");
        type Client<'a> = (&'a str, Box<dyn Fn(u16) -> Option<Run> + 'a>);
        let clients: Vec<Client> = vec![
            (
                "mapper-modbus (this project)",
                Box::new(|n| Some(mapper_client(port, seconds, n))),
            ),
            (
                "libmodbus 3.1 (C loop)",
                Box::new(|n| libmodbus_client(work.path(), port, seconds, n)),
            ),
            (
                "mbpoll 1.4 (libmodbus)",
                Box::new(|n| mbpoll_client(port, seconds, n)),
            ),
            (
                "pymodbus 3 sync client",
                Box::new(|n| pymodbus_client(port, seconds, n)),
            ),
        ];
        for (name, run) in &clients {
            let cell = |r: &Option<Run>| match r {
                Some(Ok((tx, secs))) => format!("{:.0}", *tx as f64 / secs),
                Some(Err(e)) => format!("failed: {e}"),
                None => "not installed".into(),
            };
            let one = run(1);
            let many = run(125);
            let regs = match &many {
                Some(Ok((tx, secs))) => format!("{:.0}", *tx as f64 * 125.0 / secs),
                _ => "-".into(),
            };
            println!("| {name} | {} | {} | {regs} |", cell(&one), cell(&many));
        }
    }
    println!(
        "\nA peer marked not installed: `apt-get install mbpoll libmodbus-dev pkg-config`, `pip install pymodbus`."
    );
    Ok(())
}

/// The mapper's client: `Modbus::driver` and `Driver::read`, on a current-thread runtime as in
/// the mapper. `count` one-register properties at 0.. are read per transaction.
fn mapper_client(port: u16, seconds: f64, count: u16) -> Run {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)?;
    let addresses: Vec<(u16, u16)> = (0..count).map(|a| (a, 1)).collect();
    let cfg = device_config(port, &addresses);
    rt.block_on(async {
        let mut driver = Modbus.driver(&cfg).map_err(anyhow::Error::from)?;
        driver.connect().await.map_err(anyhow::Error::from)?;
        let due: Vec<usize> = (0..usize::from(count)).collect();
        let before = driver.requests();
        let start = Instant::now();
        let deadline = start + Duration::from_secs_f64(seconds);
        while Instant::now() < deadline {
            for (i, r) in driver.read(&due).await {
                r.map_err(|e| anyhow::anyhow!("property {i}: {e}"))?;
            }
        }
        Ok((driver.requests() - before, start.elapsed().as_secs_f64()))
    })
}

/// Runs a peer's loop program with `HOST PORT SECONDS COUNT` and parses the
/// `TRANSACTIONS SECONDS` it prints.
fn run_loop(mut cmd: Command, port: u16, seconds: f64, count: u16) -> Run {
    let out = cmd
        .args([
            "127.0.0.1",
            &port.to_string(),
            &seconds.to_string(),
            &count.to_string(),
        ])
        .output()
        .map_err(anyhow::Error::from)?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        anyhow::bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let mut it = text.split_whitespace();
    match (
        it.next().and_then(|t| t.parse().ok()),
        it.next().and_then(|s| s.parse().ok()),
    ) {
        (Some(t), Some(s)) => Ok((t, s)),
        _ => Err(anyhow::anyhow!("unexpected output {text:?}")),
    }
}

fn sims_dir() -> PathBuf {
    sim::sims_dir()
}

/// `sims/libmodbus_loop.c` built with `cc` against libmodbus; `None` when libmodbus-dev (or
/// pkg-config, or cc) is missing.
fn libmodbus_client(work: &Path, port: u16, seconds: f64, count: u16) -> Option<Run> {
    let exe = work.join("libmodbus_loop");
    if !exe.exists() {
        let flags = Command::new("pkg-config")
            .args(["--cflags", "--libs", "libmodbus"])
            .output()
            .ok()
            .filter(|o| o.status.success())?;
        let flags = String::from_utf8_lossy(&flags.stdout).to_string();
        let built = Command::new("cc")
            .arg("-O2")
            .arg(sims_dir().join("libmodbus_loop.c"))
            .args(flags.split_whitespace())
            .arg("-o")
            .arg(&exe)
            .status()
            .ok()?;
        if !built.success() {
            return Some(Err(anyhow::anyhow!("cc failed on sims/libmodbus_loop.c")));
        }
    }
    Some(run_loop(Command::new(&exe), port, seconds, count))
}

/// pymodbus's synchronous client in `sims/pymodbus_client_loop.py`; `None` without pymodbus.
fn pymodbus_client(port: u16, seconds: f64, count: u16) -> Option<Run> {
    let has = Command::new(sim::python())
        .args(["-c", "import pymodbus"])
        .output()
        .ok()?;
    if !has.status.success() {
        return None;
    }
    let mut cmd = Command::new(sim::python());
    cmd.arg(sims_dir().join("pymodbus_client_loop.py"));
    Some(run_loop(cmd, port, seconds, count))
}

/// `mbpoll` polls a list of slave addresses on one connection, one request each, once with
/// `-1`; the list is `1:250` repeated (both servers answer any slave id). Its rate is taken from
/// two runs, of 250 and of `n` requests, so that its start-up and connection are not counted:
/// (n - 250) / (t_n - t_250).
fn mbpoll_client(port: u16, seconds: f64, count: u16) -> Option<Run> {
    Command::new("mbpoll").arg("-V").output().ok()?;
    let run = |rounds: usize| -> anyhow::Result<f64> {
        let list = vec!["1:250"; rounds].join(",");
        let start = Instant::now();
        let out = Command::new("mbpoll")
            .args(["-m", "tcp", "-p", &port.to_string(), "-0", "-1", "-o", "2"])
            .args([
                "-r",
                "0",
                "-c",
                &count.to_string(),
                "-a",
                &list,
                "127.0.0.1",
            ])
            .output()
            .map_err(anyhow::Error::from)?;
        let elapsed = start.elapsed().as_secs_f64();
        let text = String::from_utf8_lossy(&out.stdout);
        let polled = text.matches("-- Polling slave").count();
        if !out.status.success() || polled != rounds * 250 {
            return Err(anyhow::anyhow!(
                "mbpoll polled {polled} of {}: {}",
                rounds * 250,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(elapsed)
    };
    Some((|| {
        let base = (0..3).map(|_| run(1)).collect::<Result<Vec<_>, _>>()?;
        let base = base.into_iter().fold(f64::MAX, f64::min);
        // A first guess of the rate sizes the real run to about `seconds`.
        let probe = 8;
        let t = run(probe)? - base;
        let rate = ((probe - 1) * 250) as f64 / t.max(1e-3);
        let rounds = (rate * seconds / 250.0).clamp(8.0, 16_000.0) as usize;
        let t = run(rounds)? - base;
        Ok((((rounds - 1) * 250) as u64, t))
    })())
}

// ---------------------------------------------------------------------------------------------
// 2. Planner

/// 100 distinct addresses in 0..1000 from a fixed seed; every third a 32-bit value (2
/// registers) when the next register is free.
fn scattered() -> Vec<(u16, u16)> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut taken = BTreeSet::new();
    while taken.len() < 100 {
        let a = (next() % 999) as u16;
        if !taken.contains(&a)
            && !taken.contains(&(a + 1))
            && a.checked_sub(1).is_none_or(|b| !taken.contains(&b))
        {
            taken.insert(a);
        }
    }
    taken
        .into_iter()
        .enumerate()
        .map(|(i, a)| (a, if i % 3 == 0 { 2 } else { 1 }))
        .collect()
}

fn planner_figure() -> anyhow::Result<()> {
    let props = scattered();
    let reads: Vec<Read> = props
        .iter()
        .map(|&(address, count)| Read {
            table: mapper_modbus::Table::HoldingRegister,
            address,
            count,
        })
        .collect();
    let wanted: u32 = props.iter().map(|&(_, n)| u32::from(n)).sum();
    println!(
        "\n## Requests per cycle: 100 properties ({wanted} registers) scattered over registers 0-999\n"
    );
    println!("| plan | requests per cycle | registers read |");
    println!("|---|---|---|");
    println!(
        "| one request per property (KubeEdge's mapper) | {} | {wanted} |",
        reads.len()
    );
    for gap in [0u16, 5, 10, 20, 50] {
        let limits = Limits {
            max_gap: gap,
            ..Limits::default()
        };
        let plan = planner::plan(&reads, &limits, &Refused::new()).map_err(anyhow::Error::from)?;
        let read: u32 = plan.iter().map(|r| u32::from(r.count)).sum();
        let default = if gap == Limits::default().max_gap {
            " (the default)"
        } else {
            ""
        };
        println!(
            "| planner, `maxGap: {gap}`{default} | {} | {read} |",
            plan.len()
        );
    }
    // On the wire: one cycle of the real driver against the simulator.
    let sim = filled(1000);
    let (port, _rt) = sim
        .start("127.0.0.1:0")
        .map_err(|e| anyhow::anyhow!("simulator: {e}"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)?;
    let cfg = device_config(port, &props);
    let (sent, answered, ok) = rt.block_on(async {
        let mut driver = Modbus.driver(&cfg).map_err(anyhow::Error::from)?;
        driver.connect().await.map_err(anyhow::Error::from)?;
        let due: Vec<usize> = (0..props.len()).collect();
        let served = sim.requests.load(std::sync::atomic::Ordering::Relaxed);
        let before = driver.requests();
        let out = driver.read(&due).await;
        let ok = out.iter().filter(|(_, r)| r.is_ok()).count();
        Ok::<_, anyhow::Error>((
            driver.requests() - before,
            sim.requests.load(std::sync::atomic::Ordering::Relaxed) - served,
            ok,
        ))
    })?;
    println!(
        "\nOn the wire, one cycle of mapper-modbus's driver with the default gap: {sent} requests sent, {answered} answered by the simulator, {ok} of 100 properties read."
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 3. Latency

const LATENCY_MANIFEST: &str = include_str!("manifests/modbus_latency.yaml");

/// Sets per second a value, while `load` other devices of 5 properties are polled every second
/// by the same mapper (on their own simulator).
fn latency(bins: &Path, samples: usize, load: usize) -> anyhow::Result<()> {
    let sim = Sim::with(|s| {
        s.holding.insert(0, 0);
        s.holding.insert(1, 50);
    });
    let (port, _rt) = sim
        .start("127.0.0.1:0")
        .map_err(|e| anyhow::anyhow!("simulator: {e}"))?;
    let busy = filled(16);
    let (busy_port, _busy_rt) = busy
        .start("127.0.0.1:0")
        .map_err(|e| anyhow::anyhow!("simulator: {e}"))?;
    let manifest = format!(
        "{}---\n{}",
        LATENCY_MANIFEST.replace("PORT", &port.to_string()),
        devices_manifest(busy_port, load)
    );
    let node = Node::start_with(bins, &manifest);
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
    let deadline = Instant::now() + Duration::from_secs(30);
    while node
        .twin("default/bench")
        .and_then(|t| sim::reported(&t, "setpoint"))
        .is_none()
    {
        if Instant::now() > deadline {
            return Err(anyhow::anyhow!(
                "the bench device never reported (see the logs above)"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    wait_reporting(&node, load)?;

    // Documents from edgecore's broker, stamped on arrival.
    let rx = sim::mqtt_messages(
        node.mqtt,
        "$hw/events/device/default/bench/twin/update/document",
    )?;

    let agent = sim::agent();
    let url = format!("{}/api/v1/devices/default/bench/desired", node.http);
    let mut written = Vec::with_capacity(samples);
    let mut reported = Vec::with_capacity(samples);
    let mut lost = 0;
    for i in 0..samples {
        let value = 100 + (i % 5000) as u16;
        while rx.try_recv().is_ok() {}
        let t0 = Instant::now();
        let answer = agent
            .put(&url)
            .header("content-type", "application/json")
            .send(json!({"setpoint": value.to_string()}).to_string())
            .map_err(|e| anyhow::anyhow!("PUT desired: {e}"))?;
        if !answer.status().is_success() {
            return Err(anyhow::anyhow!("PUT desired answered {}", answer.status()));
        }
        let limit = t0 + Duration::from_secs(3);
        let mut t_write = None;
        while Instant::now() < limit {
            let (v, w) = sim.edit(|s| (s.holding.get(&1).copied(), s.last_write));
            if v == Some(value) {
                t_write = w.map(|(_, t)| t);
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        let mut t_report = None;
        while let Ok(m) = rx.recv_timeout(limit.saturating_duration_since(Instant::now())) {
            if sim::document_reported(&m.payload, "setpoint").as_deref()
                == Some(value.to_string().as_str())
            {
                t_report = Some(m.at);
                break;
            }
        }
        match (t_write, t_report) {
            (Some(w), Some(r)) => {
                written.push(w.saturating_duration_since(t0).as_secs_f64() * 1e3);
                reported.push(r.saturating_duration_since(t0).as_secs_f64() * 1e3);
            }
            _ => lost += 1,
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    written.sort_by(f64::total_cmp);
    reported.sort_by(f64::total_cmp);
    println!(
        "\n## Desired value to device and back: {samples} sets through edgecore's HTTP API (release edgecore and mapper-modbus; the mapper polls {load} other devices of 5 properties every second meanwhile)\n"
    );
    println!("| from `PUT .../desired` to | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|");
    for (what, v) in [
        ("the register written in the simulator", &written),
        (
            "the new value reported (`twin/update/document` on MQTT)",
            &reported,
        ),
    ] {
        println!(
            "| {what} | {:.2} | {:.2} | {:.2} |",
            percentile(v, 50.0),
            percentile(v, 99.0),
            v.last().copied().unwrap_or(f64::NAN)
        );
    }
    if lost > 0 {
        println!("\n{lost} of {samples} sets did not arrive within 3 s.");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 4. Memory

/// A model of 5 INT properties and `devices` devices of it on 127.0.0.1:`port`, polled every
/// second (registers 0, 2, 4, 6, 8).
fn devices_manifest(port: u16, devices: usize) -> String {
    let mut m = String::from(
        "apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata: {name: m, namespace: default}\nspec:\n  protocol: modbus\n  properties:\n",
    );
    for p in 0..5 {
        m += &format!("    - {{name: p{p}, type: INT, accessMode: ReadWrite}}\n");
    }
    for d in 0..devices {
        m += &format!(
            "---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {{name: dev-{d}, namespace: default}}\nspec:\n  deviceModelRef: {{name: m}}\n  protocol: {{protocolName: modbus, configData: {{ip: 127.0.0.1, port: {port}, slaveID: 1}}}}\n  properties:\n"
        );
        for p in 0..5 {
            m += &format!(
                "    - {{name: p{p}, collectCycle: 1000, reportCycle: 10000, visitors: {{protocolName: modbus, configData: {{register: HoldingRegister, offset: {}, limit: 1}}}}}}\n",
                p * 2
            );
        }
    }
    m
}

/// Waits until the `devices` devices of [`devices_manifest`] have all reported.
fn wait_reporting(node: &Node, devices: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let reporting = (0..devices)
            .filter(|d| {
                node.twin(&format!("default/dev-{d}"))
                    .and_then(|t| sim::reported(&t, "p4"))
                    .is_some()
            })
            .count();
        if reporting == devices {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(anyhow::anyhow!(
                "only {reporting} of {devices} devices reported within 60 s"
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `VmRSS`, `RssAnon` and `VmHWM` of a process, in kB.
fn rss(pid: u32) -> Option<(u64, u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |k: &str| {
        status
            .lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    };
    Some((field("VmRSS:")?, field("RssAnon:")?, field("VmHWM:")?))
}

fn memory(bins: &Path, devices: usize) -> anyhow::Result<()> {
    let sim = filled(16);
    // The simulator turns each value over, so every read reports a change.
    let (port, rt) = sim
        .start("127.0.0.1:0")
        .map_err(|e| anyhow::anyhow!("simulator: {e}"))?;
    let ticking = sim.clone();
    rt.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            ticking.edit(|s| {
                for v in s.holding.values_mut() {
                    *v = v.wrapping_add(1);
                }
            });
        }
    });
    let node = Node::start_with(bins, &devices_manifest(port, devices));
    let http = free_port();
    let mapper = node.mapper("mapper-modbus", "modbus", http);
    wait_reporting(&node, devices)?;
    let agent = sim::agent();
    let reads = || -> Option<f64> {
        let mut r = agent
            .get(&format!("http://127.0.0.1:{http}/metrics"))
            .call()
            .ok()?;
        let text = r.body_mut().read_to_string().ok()?;
        text.lines()
            .filter(|l| l.starts_with("mapper_reads_total"))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .reduce(|a, b| a + b)
    };
    // Past start-up: the steady state of a polling mapper.
    std::thread::sleep(Duration::from_secs(10));
    let r0 = reads();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let rate = match (r0, reads()) {
        (Some(a), Some(b)) => format!("{:.0}", (b - a) / t0.elapsed().as_secs_f64()),
        _ => "?".into(),
    };
    let (vm, anon, hwm) = rss(mapper.child.id())
        .ok_or_else(|| anyhow::anyhow!("cannot read the mapper's /proc status"))?;
    println!(
        "\n## Resident memory of mapper-modbus (release) polling {devices} devices of 5 properties every second, each device on its own TCP connection\n"
    );
    println!("| VmRSS | RssAnon | VmHWM (peak) | property reads/s |");
    println!("|---|---|---|---|");
    println!(
        "| {:.1} MB | {:.1} MB | {:.1} MB | {rate} |",
        vm as f64 / 1024.0,
        anon as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    Ok(())
}
