//! Figures of the OPC UA mapper (printed; see docs/benchmarks.md):
//!
//! - **throughput**: values per second read by mapper-opcua's driver from the python asyncua
//!   server (`sims/opcua_server.py`) and from the in-process async-opcua server, 100 nodes per
//!   cycle, with one Read call per cycle against one Read call per node (`maxNodesPerRead: 1`).
//! - **latency**: time from a value change on the asyncua server to the twin document on
//!   edgecore's MQTT broker, through the release edgecore and mapper-opcua, for a property
//!   polled every 100 ms against one subscribed with a 100 ms sampling interval. The server's
//!   `Clock` variable holds the time it was set (ms since the epoch); both run on this machine.
//!
//! `cargo run --release -p hardware-tests --bin opcua-bench [-- --seconds 3 --samples 100]`

use clap::{Parser, ValueEnum};
use mapper_opcua::config::{Connection, Point};
use mapper_opcua::device::Device;
use mapper_sdk::Driver;
use serde_json::json;
use sim::opcua_sim::{OpcSim, Options};
use sim::{Node, PySim, free_port, percentile};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant, UNIX_EPOCH};

#[derive(Parser)]
#[command(name = "opcua-bench", about = "Figures of the OPC UA mapper")]
struct Args {
    /// Seconds per throughput run.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Value changes measured per mode for the latency figure.
    #[arg(long, default_value_t = 100)]
    samples: usize,
    /// Nodes read per cycle.
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Only these parts (comma-separated); all by default.
    #[arg(long, value_delimiter = ',')]
    only: Vec<Part>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Part {
    Throughput,
    Latency,
}

const INSTALL: &str = "pip install 'asyncua==2.1.*'";

fn main() -> ExitCode {
    let args = Args::parse();
    let want = |p: Part| args.only.is_empty() || args.only.contains(&p);
    let result = (|| -> anyhow::Result<()> {
        if want(Part::Throughput) {
            throughput(args.seconds, args.nodes)?;
        }
        if want(Part::Latency) {
            eprintln!("building the release edgecore and mapper-opcua ...");
            let bins = sim::built_binaries(true)?;
            latency(&bins, args.samples)?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("opcua-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Reads `nodes` tags `Tag0..` in namespace `ns` of `url` for `seconds`: values per second and
/// Read calls per cycle.
fn read_rate(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    url: &str,
    ns: u16,
    nodes: usize,
    per_node: bool,
    seconds: f64,
) -> anyhow::Result<(f64, f64)> {
    let mut conn = json!({"url": url, "timeout": 5000});
    if per_node {
        conn["maxNodesPerRead"] = json!(1);
    }
    let conn = Connection::from_config(&sim::object(conn)).map_err(anyhow::Error::from)?;
    let points = (0..nodes)
        .map(|k| {
            Point::from_config(
                &sim::object(json!({"nodeID": format!("ns={ns};s=Tag{k}")})),
                Duration::from_millis(100),
            )
            .map_err(anyhow::Error::from)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut d = Device::new("default/bench".into(), conn, points, dir.join("pki"));
    rt.block_on(async {
        d.connect().await.map_err(anyhow::Error::from)?;
        let all: Vec<usize> = (0..nodes).collect();
        let start = Instant::now();
        let before = d.requests();
        let mut cycles = 0u64;
        let mut values = 0u64;
        while start.elapsed().as_secs_f64() < seconds {
            let r = d.read(&all).await;
            let ok = r.iter().filter(|(_, v)| v.is_ok()).count();
            if ok != nodes {
                let e = r.iter().find_map(|(_, v)| v.as_ref().err().cloned());
                return Err(anyhow::anyhow!("{ok} of {nodes} read: {e:?}"));
            }
            values += ok as u64;
            cycles += 1;
        }
        let calls = (d.requests() - before) as f64 / cycles.max(1) as f64;
        d.stop().await;
        Ok((values as f64 / start.elapsed().as_secs_f64(), calls))
    })
}

fn throughput(seconds: f64, nodes: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir().map_err(anyhow::Error::from)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)?;
    let port = free_port();
    let _asyncua = PySim::start(
        "opcua_server.py",
        &[&port.to_string(), &nodes.to_string()],
        INSTALL,
    );
    let sim = OpcSim::start(Options {
        port: 0,
        tags: nodes,
        pki: dir.path().join("sim-pki"),
        max_nodes_per_read: 0,
    })?;
    println!(
        "OPC UA reads, {nodes} Double nodes per cycle, one device, back to back ({seconds} s each):"
    );
    println!("{:<28} {:>22} {:>12}", "server", "mode", "values/s");
    let servers = [
        (
            "python asyncua 2.1",
            format!("opc.tcp://127.0.0.1:{port}/"),
            2u16,
        ),
        ("async-opcua (in-process)", sim.url(), sim.ns),
    ];
    for (name, url, ns) in &servers {
        for per_node in [false, true] {
            let (rate, calls) = read_rate(&rt, dir.path(), url, *ns, nodes, per_node, seconds)?;
            let mode = if per_node {
                format!("one Read per node ({calls:.0}/cycle)")
            } else {
                format!("one Read per cycle ({calls:.0}/cycle)")
            };
            println!("{name:<28} {mode:>22} {rate:>12.0}");
        }
    }
    drop(sim.stop());
    Ok(())
}

const LATENCY_MANIFEST: &str = include_str!("manifests/opcua_latency.yaml");

fn latency(bins: &Path, samples: usize) -> anyhow::Result<()> {
    let port = free_port();
    let _asyncua = PySim::start("opcua_server.py", &[&port.to_string()], INSTALL);
    let manifest = LATENCY_MANIFEST.replace("URL", &format!("opc.tcp://127.0.0.1:{port}/"));
    let node = Node::start_with(bins, &manifest);
    let _mapper = node.mapper("mapper-opcua", "opcua", free_port());
    let rx = sim::mqtt_messages(node.mqtt, "$hw/events/device/+/+/twin/update/document")?;
    let mut lat: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let deadline = Instant::now() + Duration::from_secs(60 + samples as u64);
    while lat.iter().any(|l| l.len() < samples) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(anyhow::anyhow!(
                "only {} polled and {} subscribed samples (see the logs)",
                lat[0].len(),
                lat[1].len()
            ));
        }
        let Ok(m) = rx.recv_timeout(left) else {
            continue;
        };
        let Some(set) =
            sim::document_reported(&m.payload, "clock").and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        let now = m
            .wall
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64()
            * 1000.0;
        let which = usize::from(m.topic.contains("/subscribed/"));
        lat[which].push(now - set);
    }
    println!(
        "\nOPC UA change on the asyncua server to the twin document on MQTT (through edgecore):"
    );
    println!(
        "{:<34} {:>8} {:>8} {:>8} {:>8}",
        "mode", "p50 ms", "p90 ms", "p99 ms", "max ms"
    );
    for (i, name) in ["polled every 100 ms", "subscribed, sampling 100 ms"]
        .iter()
        .enumerate()
    {
        let mut v = lat[i].clone();
        v.truncate(samples);
        v.sort_by(f64::total_cmp);
        println!(
            "{name:<34} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
            percentile(&v, 50.0),
            percentile(&v, 90.0),
            percentile(&v, 99.0),
            v.last().copied().unwrap_or(f64::NAN)
        );
    }
    Ok(())
}
