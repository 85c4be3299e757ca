//! Figures of `devsim` (printed; see docs/benchmarks.md): how many simulated devices one process
//! serves. N Modbus TCP devices of 10 holding registers each, every register playing a sine,
//! served on their own ports; C clients (tokio-modbus) read all 10 registers of each of their
//! devices in turn for S seconds. Prints the registers served per second, the process's
//! resident memory per device, and the time a tick of all devices takes.
//!
//! `cargo run --release -p hardware-tests --bin devsim-bench [-- --devices 1000 --clients 16 --seconds 5]`

use clap::Parser;
use devsim::run::{Options, start};
use devsim::scenario::Scenario;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_modbus::client::{Reader, tcp};

#[derive(Parser)]
#[command(name = "devsim-bench", about = "Simulated devices per devsim process")]
struct Args {
    #[arg(long, default_value_t = 1000)]
    devices: usize,
    #[arg(long, default_value_t = 16)]
    clients: usize,
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
}

fn rss_kb() -> u64 {
    sim::vm_rss_kb("self")
}

fn manifests(devices: usize) -> (String, Scenario) {
    let props: String = (0..10)
        .map(|p| format!("    - {{name: r{p}, type: INT}}\n"))
        .collect();
    let mut out = format!(
        "apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata: {{name: m, namespace: default}}\nspec:\n  protocol: modbus\n  properties:\n{props}"
    );
    let visitors: String = (0..10)
        .map(|p| format!("    - {{name: r{p}, visitors: {{protocolName: modbus, configData: {{register: HoldingRegister, offset: {p}, dataType: int16}}}}}}\n"))
        .collect();
    let mut scenario = String::from("devices:\n");
    for d in 0..devices {
        out.push_str(&format!(
            "---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {{name: d{d}, namespace: default}}\nspec:\n  deviceModelRef: {{name: m}}\n  protocol: {{protocolName: modbus, configData: {{ip: 127.0.0.1, port: {}}}}}\n  properties:\n{visitors}",
            10000 + d
        ));
        scenario.push_str(&format!("  d{d}:\n    properties:\n"));
        for p in 0..10 {
            scenario.push_str(&format!(
                "      r{p}: {{value: {{sine: {{mean: 100, amplitude: 50, periodSeconds: {}}}}}}}\n",
                10 + p
            ));
        }
    }
    (
        out,
        Scenario::parse(&scenario).expect("the bench's scenario"),
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = Args::parse();
    let (text, scenario) = manifests(args.devices);
    let before = rss_kb();
    let devices = match devsim::layout::load(&text) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("devsim-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let options = Options {
        bind: Some("127.0.0.1".into()),
        port0: true,
        ..Options::default()
    };
    let served = match start(devices, &scenario, &options).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("devsim-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let serving = rss_kb();
    let addresses: Vec<_> = served.iter().map(|s| s.address).collect();
    let reads = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs_f64(args.seconds);
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let mine: Vec<_> = addresses
            .iter()
            .skip(c)
            .step_by(args.clients)
            .copied()
            .collect();
        let reads = reads.clone();
        tasks.push(tokio::spawn(async move {
            let mut ctxs = Vec::new();
            for a in &mine {
                if let Ok(ctx) = tcp::connect(*a).await {
                    ctxs.push(ctx);
                }
            }
            while Instant::now() < end {
                for ctx in &mut ctxs {
                    if let Ok(Ok(regs)) = ctx.read_holding_registers(0, 10).await
                        && regs.len() == 10
                    {
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    let started = Instant::now();
    for t in tasks {
        let _ = t.await;
    }
    let took = started.elapsed().as_secs_f64();
    let after = rss_kb();
    let n = reads.load(Ordering::Relaxed);
    println!(
        "| devices | clients | reads of 10 registers/s | registers/s | VmRSS serving | per device | VmRSS after the reads |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {:.0} | {:.0} | {:.1} MB | {:.1} KB | {:.1} MB |",
        args.devices,
        args.clients,
        n as f64 / took,
        n as f64 * 10.0 / took,
        serving as f64 / 1024.0,
        (serving.saturating_sub(before)) as f64 / args.devices.max(1) as f64,
        after as f64 / 1024.0
    );
    ExitCode::SUCCESS
}
