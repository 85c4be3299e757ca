//! edgecore's DMI intake measured with a client the project did not write: grpcio
//! (`sims/kubeedge_mapper.py load`, KubeEdge's proto compiled by grpcio-tools) sends
//! `ReportDeviceStatus` of `--properties` INT values to the `--devices` devices of the
//! `mqtt-bench` manifests in turn, with 1, 16 and 64 calls outstanding on one channel, for
//! `--seconds` each, through grpc.aio and through the synchronous stub's futures. Beside each row, the same client's ceiling on this machine: the same calls
//! for devices edgecore does not have, which it refuses (`NOT_FOUND`) without any twin work,
//! so what remains is the client, gRPC and the socket. Printed as a table (see
//! docs/benchmarks.md).
//!
//! `cargo run --release -p hardware-tests --bin dmi-bench [-- --devices 1000 --seconds 5]`

use clap::Parser;
use serde_json::Value;
use sim::Proc;
use std::process::{Command, ExitCode};

#[derive(Parser)]
#[command(
    name = "dmi-bench",
    about = "edgecore's DMI intake from a grpcio client"
)]
struct Args {
    #[arg(long, default_value_t = 1000)]
    devices: usize,
    /// Values in each report.
    #[arg(long, default_value_t = 1)]
    properties: usize,
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Calls outstanding, comma-separated.
    #[arg(long, default_value = "1,16,64")]
    inflight: String,
    /// grpcio's APIs to use, comma-separated: `aio` (grpc.aio coroutines), `sync` (the
    /// synchronous stub's futures, as a threaded mapper calls).
    #[arg(long, default_value = "aio,sync")]
    api: String,
    /// The directory of another build's `edgecore` (default: this workspace's release build).
    #[arg(long)]
    bins: Option<std::path::PathBuf>,
}

/// One run of the grpcio client: its JSON line.
fn load(
    socket: &std::path::Path,
    prefix: &str,
    args: &Args,
    api: &str,
    inflight: &str,
) -> anyhow::Result<Value> {
    let out = Command::new(sim::python())
        .arg(sim::sims_dir().join("kubeedge_mapper.py"))
        .arg("--proto")
        .arg(sim::workspace_root().join("api/proto"))
        .arg("load")
        .arg("--socket")
        .arg(socket)
        .args(["--prefix", prefix, "--inflight", inflight, "--api", api])
        .args(["--devices", &args.devices.to_string()])
        .args(["--properties", &args.properties.to_string()])
        .args(["--seconds", &args.seconds.to_string()])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).map_err(|_| {
        anyhow::anyhow!(
            "the grpcio client gave no result ({}): {}{}",
            sim::SETUP_HINT,
            text,
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = (|| {
        let bins = sim::bench_binaries(args.bins.as_deref())?;
        let dir = tempfile::tempdir()?;
        sim::bench_edgecore_dir(
            dir.path(),
            "dmi-bench",
            args.devices,
            args.properties.max(1),
        )?;
        let core = Proc::spawn(
            &bins.join("edgecore"),
            &["--config", "edgecore.yaml"],
            dir.path(),
            "edgecore.log",
        );
        let socket = dir.path().join("dmi.sock");
        sim::eventually(30, "edgecore's DMI socket", || {
            socket.exists().then_some(())
        });
        println!(
            "| {} devices, {} value(s) per report, {} s | grpcio API | reports/s | p50 / p99 ms | the client's ceiling (refused at once), reports/s | of the ceiling |",
            args.devices, args.properties, args.seconds
        );
        println!("|---|---|---|---|---|---|");
        for (api, inflight) in args
            .api
            .split(',')
            .flat_map(|a| args.inflight.split(',').map(move |i| (a, i)))
        {
            let real = load(&socket, "dev-", &args, api, inflight)?;
            let ceiling = load(&socket, "unknown-", &args, api, inflight)?;
            if real["errors"].as_object().is_some_and(|e| !e.is_empty()) {
                anyhow::bail!("reports refused: {real}\n{}", core.log_text());
            }
            let rate = real["per_second"].as_f64().unwrap_or(0.0);
            let top = ceiling["per_second"].as_f64().unwrap_or(0.0);
            println!(
                "| {inflight} outstanding | {api} | {rate:.0} | {:.2} / {:.2} | {top:.0} | {:.2}x |",
                real["p50_ms"].as_f64().unwrap_or(f64::NAN),
                real["p99_ms"].as_f64().unwrap_or(f64::NAN),
                if top > 0.0 { rate / top } else { f64::NAN }
            );
        }
        core.signal("-TERM");
        Ok::<(), anyhow::Error>(())
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dmi-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
