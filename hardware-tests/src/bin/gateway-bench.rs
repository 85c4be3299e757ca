//! `gateway-bench`: what a gateway spends to run its devices. The release `edgecore` joined to a
//! release `cloudcore` (the cloud link up, every property reported to the cloud), the release
//! `mapper-modbus` polling `--devices` Modbus devices of `--properties` holding registers each
//! every second, history on (edgecore's default), and the devices simulated in this process: 20
//! units behind each Modbus TCP address (a gateway to RTU units), `--change` of the values
//! changing each second (a step of one, spread over the devices, ten times a second).
//!
//! Once every twin holds a value for every property, it measures `--seconds` of that steady
//! state: CPU seconds per minute and memory of each process, and what edgecore did (values
//! changed, reports that changed nothing, commits, history points). Then the changes stop and it
//! checks that every twin and every `DeviceStatus` holds each register's last value on the
//! right property, and exits non-zero when one does not.
//!
//! ```sh
//! cargo run --release -p hardware-tests --bin gateway-bench [-- --devices 1000 --seconds 60] [--bins DIR]
//! ```

use anyhow::Result;
use clap::Parser;
use hardware_tests::bench::{Kill, ar, cpu_seconds, create, devices_api, scrape};
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::{Value, json};
use sim::modbus_sim::{Sim, Units, serve_units};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "gateway-bench",
    about = "what a gateway spends to run its devices"
)]
struct Args {
    #[arg(long, default_value_t = 1000)]
    devices: usize,
    /// Holding registers (INT properties) per device, read every second.
    #[arg(long, default_value_t = 10)]
    properties: usize,
    /// Seconds measured, after every twin has its values and 10 s more.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// The share of the values that change each second.
    #[arg(long, default_value_t = 0.1)]
    change: f64,
    /// Devices (unit ids 1..) behind one Modbus TCP address.
    #[arg(long, default_value_t = 20)]
    per_address: usize,
    /// The directory of another build's binaries (default: this workspace's release build).
    #[arg(long)]
    bins: Option<std::path::PathBuf>,
    /// Print the processes' ids and wait this many seconds before measuring (to attach
    /// `perf record`).
    #[arg(long, default_value_t = 0)]
    pause: u64,
}

/// The simulated devices: one [`Sim`] per device, device `d` at `ports[d / per_address]`, unit
/// `d % per_address + 1`.
struct Devices {
    sims: Vec<Sim>,
    ports: Vec<u16>,
    per_address: usize,
    props: usize,
}

impl Devices {
    fn start(
        n: usize,
        props: usize,
        per_address: usize,
    ) -> Result<(Self, tokio::runtime::Runtime)> {
        anyhow::ensure!(
            (1..=247).contains(&per_address),
            "--per-address {per_address}: a Modbus address holds units 1 to 247"
        );
        let sims: Vec<Sim> = (0..n)
            .map(|d| {
                Sim::with(|s| {
                    for p in 0..props {
                        s.holding.insert(p as u16, ((d * 7 + p * 13) % 1000) as u16);
                    }
                })
            })
            .collect();
        // The devices answer from a runtime of their own (one thread), apart from the bench's.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let mut ports = Vec::new();
        for group in sims.chunks(per_address) {
            let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
            ports.push(listener.local_addr()?.port());
            let units: BTreeMap<u8, Sim> = group
                .iter()
                .enumerate()
                .map(|(i, s)| ((i + 1) as u8, s.clone()))
                .collect();
            rt.spawn(serve_units(listener, Units::ById(units)));
        }
        Ok((
            Self {
                sims,
                ports,
                per_address,
                props,
            },
            rt,
        ))
    }

    fn register(&self, device: usize, prop: usize) -> Option<u16> {
        self.sims.get(device)?.holding(prop as u16)
    }
}

/// Changes `share` of the values each second, in ten steps, until `stop`; counts the changes.
async fn change(
    sims: Vec<Sim>,
    props: usize,
    share: f64,
    stop: Arc<AtomicBool>,
    changed: Arc<AtomicU64>,
) {
    let total = sims.len() * props;
    if total == 0 {
        return;
    }
    // Visit the values in a scattered order (a step prime to their number), so that the
    // changes of one tenth of a second are spread over the devices as real ones are.
    let mut step = 7919 % total.max(2);
    while gcd(step.max(1), total) != 1 {
        step += 1;
    }
    let per_tick = share * total as f64 / 10.0;
    let (mut owed, mut at) = (0.0f64, 0usize);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        owed += per_tick;
        while owed >= 1.0 {
            owed -= 1.0;
            at = (at + step.max(1)) % total;
            let (d, p) = (at / props, (at % props) as u16);
            sims[d].edit(|s| {
                let v = s.holding.get(&p).copied().unwrap_or(0);
                s.holding.insert(p, (v + 1) % 30_000);
            });
            changed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let (devices, _sim_rt) = Devices::start(args.devices, args.properties, args.per_address)?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?
        .block_on(run(args, devices))
}

/// One process's CPU and memory.
struct Sample {
    cpu: f64,
    rss_mb: f64,
    anon_mb: f64,
}

fn sample(pid: u32) -> Sample {
    let p = pid.to_string();
    Sample {
        cpu: cpu_seconds(pid),
        rss_mb: sim::proc_status(&p, "VmRSS") as f64 / 1024.0,
        anon_mb: sim::proc_status(&p, "RssAnon") as f64 / 1024.0,
    }
}

async fn run(args: Args, devs: Devices) -> Result<()> {
    let bins = sim::bench_binaries(args.bins.as_deref())?;
    let dir = tempfile::tempdir()?;
    let (http, mqtt) = (sim::free_port(), sim::free_port());
    let mut kill = Kill(Vec::new());
    let cloud = hardware_tests::bench::start_cloud(&bins, dir.path(), &mut kill).await?;
    let props: Vec<Value> = (0..devs.props)
        .map(|p| json!({"name": format!("p{p}"), "type": "INT", "accessMode": "ReadOnly"}))
        .collect();
    create(
        &devices_api(&cloud.client, "DeviceModel"),
        json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
            "metadata": {"name": "gw"}, "spec": {"protocol": "modbus", "properties": props}}),
    )
    .await?;
    let api = devices_api(&cloud.client, "Device");
    let t = Instant::now();
    for d in 0..devs.sims.len() {
        let visit: Vec<Value> = (0..devs.props)
            .map(|p| json!({"name": format!("p{p}"), "collectCycle": 1000, "reportCycle": 1000,
                "reportToCloud": true,
                "visitors": {"protocolName": "modbus", "configData": {"register": "HoldingRegister", "offset": p}}}))
            .collect();
        create(
            &api,
            json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
            "metadata": {"name": format!("gw-{d}")},
            "spec": {"nodeName": "edge-node-1", "deviceModelRef": {"name": "gw"},
                "protocol": {"protocolName": "modbus", "configData": {"ip": "127.0.0.1",
                    "port": devs.ports[d / devs.per_address], "slaveID": d % devs.per_address + 1}},
                "properties": visit}}),
        )
        .await?;
    }
    eprintln!(
        "{} devices created in the cloud in {:.1} s; starting edgecore and mapper-modbus",
        devs.sims.len(),
        t.elapsed().as_secs_f64()
    );
    std::fs::write(
        dir.path().join("edgecore.yaml"),
        cloud.edge_config(http, mqtt, "", ""),
    )?;
    hardware_tests::bench::start_edge_and_modbus_mapper(&bins, dir.path(), &mut kill).await?;
    let pids: Vec<(&str, u32)> = ["cloudcore", "edgecore", "mapper-modbus"]
        .into_iter()
        .zip(kill.0.iter().map(|c| c.id()))
        .collect();

    // Every twin with a value for every property.
    let agent = sim::agent();
    let list = format!("http://127.0.0.1:{http}/api/v1/devices?values=true");
    let t = Instant::now();
    loop {
        let (_, rows) = sim::get(&agent, &list);
        let full = rows.as_array().map_or(0, |r| {
            r.iter()
                .filter(|row| row["values"].as_object().map_or(0, |v| v.len()) == devs.props)
                .count()
        });
        if full == devs.sims.len() {
            break;
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(600),
            "after 600 s only {full} of {} twins have every value; logs in {}",
            devs.sims.len(),
            dir.keep().display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "every twin has its {} values {:.1} s after edgecore's start",
        devs.props,
        t.elapsed().as_secs_f64()
    );

    let stop = Arc::new(AtomicBool::new(false));
    let changed = Arc::new(AtomicU64::new(0));
    let changer = tokio::spawn(change(
        devs.sims.clone(),
        devs.props,
        args.change,
        stop.clone(),
        changed.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(10)).await;
    if args.pause > 0 {
        for (name, pid) in &pids {
            eprintln!("{name}: pid {pid}");
        }
        tokio::time::sleep(Duration::from_secs(args.pause)).await;
    }

    let edge_metrics = format!("127.0.0.1:{http}");
    let mapper_yaml = std::fs::read_to_string(dir.path().join("mapper.yaml"))?;
    let mapper_metrics = format!(
        "127.0.0.1:{}",
        mapper_yaml
            .lines()
            .find_map(|l| l.trim().strip_prefix("http_port:"))
            .map(str::trim)
            .unwrap_or_default()
    );
    let counters = async || -> Result<[f64; 9]> {
        let (edge, mapper) = (scrape(&edge_metrics).await?, scrape(&mapper_metrics).await?);
        let e = |m: &str| counter(&edge, m);
        let m = |n: &str| counter(&mapper, n);
        Ok([
            e("edgecore_twin_updates_total"),
            e("edgecore_twin_unchanged_total"),
            e("edgecore_twin_commits_total"),
            e("edgecore_history_points_total"),
            e("edgecore_history_dropped_total"),
            m("mapper_reads_total"),
            m("mapper_requests_total"),
            m("mapper_reports_total"),
            m("mapper_read_errors_total"),
        ])
    };
    let m0 = counters().await?;
    let c0 = changed.load(Ordering::Relaxed);
    let before: Vec<Sample> = pids.iter().map(|(_, p)| sample(*p)).collect();
    let own0 = cpu_seconds(std::process::id());
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let secs = t0.elapsed().as_secs_f64();
    let after: Vec<Sample> = pids.iter().map(|(_, p)| sample(*p)).collect();
    let own = cpu_seconds(std::process::id()) - own0;
    let m1 = counters().await?;
    let offered = (changed.load(Ordering::Relaxed) - c0) as f64 / secs;

    let (n, p) = (devs.sims.len(), devs.props);
    println!(
        "gateway: {n} devices x {p} properties read every second ({} values/s), {:.0} changing values/s offered, history on, every property reported to the cloud; {secs:.0} s measured",
        n * p,
        offered
    );
    println!("| process | CPU s per minute | of one core | VmRSS MB | RssAnon MB |");
    println!("|---|---|---|---|---|");
    let mut gateway = 0.0;
    for (((name, _), b), a) in pids.iter().zip(&before).zip(&after) {
        let per_min = (a.cpu - b.cpu) * 60.0 / secs;
        if *name != "cloudcore" {
            gateway += per_min;
        }
        println!(
            "| {name} | {per_min:.2} | {:.1}% | {:.1} | {:.1} |",
            per_min / 60.0 * 100.0,
            a.rss_mb,
            a.anon_mb
        );
    }
    println!(
        "| the simulated devices and this bench | {:.2} | {:.1}% | - | - |",
        own * 60.0 / secs,
        own / secs * 100.0
    );
    let rate = |i: usize| (m1[i] - m0[i]) / secs;
    println!(
        "mapper-modbus: {:.0} values read/s in {:.0} Modbus requests/s, {:.0} reports/s to edgecore, {:.0} read errors",
        rate(5),
        rate(6),
        rate(7),
        m1[8] - m0[8]
    );
    println!(
        "edgecore: {:.0} values changed/s, {:.0} unchanged/s, {:.1} commits/s, {:.0} history points/s ({:.0} dropped)",
        rate(0),
        rate(1),
        rate(2),
        rate(3),
        m1[4] - m0[4]
    );
    let share = gateway / 60.0;
    println!(
        "gateway (edgecore + mapper-modbus): {gateway:.2} CPU s per minute, {:.1}% of one core: {:.0} such devices per core",
        share * 100.0,
        if share > 0.0 { n as f64 / share } else { 0.0 }
    );

    // The changes stop: every twin and every DeviceStatus must come to hold each register's
    // last value, on its own property.
    stop.store(true, Ordering::Relaxed);
    let _ = changer.await;
    let expected: Vec<Vec<Option<u16>>> = (0..n)
        .map(|d| (0..p).map(|q| devs.register(d, q)).collect())
        .collect();
    let wrong_twins = settle(60, || async {
        let (_, rows) = sim::get(&agent, &list);
        let mut wrong = Vec::new();
        for row in rows.as_array().into_iter().flatten() {
            let Some(d) = row["name"]
                .as_str()
                .and_then(|s| s.strip_prefix("gw-"))
                .and_then(|s| s.parse::<usize>().ok())
            else {
                continue;
            };
            for (q, want) in expected.get(d).into_iter().flatten().enumerate() {
                let got = row["values"][format!("p{q}")]["value"].as_str();
                if got.map(str::to_string) != want.map(|v| v.to_string()) {
                    wrong.push(format!("gw-{d}/p{q}: {got:?}, register {want:?}"));
                }
            }
        }
        wrong
    })
    .await;
    let statuses: Api<DynamicObject> =
        Api::namespaced_with(cloud.client.clone(), "default", &ar("DeviceStatus"));
    let wrong_status = settle(120, || async {
        let Ok(list) = statuses.list(&ListParams::default()).await else {
            return vec!["the DeviceStatus list failed".to_string()];
        };
        let mut seen = vec![false; n];
        let mut wrong = Vec::new();
        for st in &list.items {
            let Some(d) = st
                .metadata
                .name
                .as_deref()
                .and_then(|s| s.strip_prefix("gw-"))
                .and_then(|s| s.parse::<usize>().ok())
                .filter(|d| *d < n)
            else {
                continue;
            };
            seen[d] = true;
            for (q, want) in expected[d].iter().enumerate() {
                let got = hardware_tests::bench::reported(st, &format!("p{q}"));
                if got != want.map(|v| v.to_string()) {
                    wrong.push(format!("gw-{d}/p{q}: {got:?}, register {want:?}"));
                }
            }
        }
        wrong.extend(
            seen.iter()
                .enumerate()
                .filter(|(_, s)| !**s)
                .map(|(d, _)| format!("gw-{d}: no DeviceStatus")),
        );
        wrong
    })
    .await;
    println!(
        "after the changes stop: {} of {} values wrong on the twins, {} in DeviceStatus",
        wrong_twins.len(),
        n * p,
        wrong_status.len()
    );
    for w in wrong_twins.iter().chain(&wrong_status).take(10) {
        println!("  {w}");
    }
    if !(wrong_twins.is_empty() && wrong_status.is_empty()) {
        let kept = dir.keep();
        anyhow::bail!("values not where they belong; logs in {}", kept.display());
    }
    drop(kill);
    Ok(())
}

/// A counter's value in a Prometheus text (summed over its label sets); 0 when absent.
fn counter(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Runs `check` every second until it finds nothing wrong or `secs` have passed; what it found
/// last.
async fn settle<F, Fut>(secs: u64, check: F) -> Vec<String>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Vec<String>>,
{
    let t = Instant::now();
    loop {
        let wrong = check().await;
        if wrong.is_empty() || t.elapsed() > Duration::from_secs(secs) {
            return wrong;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
