//! edgecore's footprint and start with `--devices` devices of 10 INT properties (the
//! `mqtt-bench` manifests): a first start on an empty data directory, then `--restarts`
//! restarts on the same data. For each: the time from the process's start to the first answer
//! with a twin (`GET /api/v1/devices/default/dev-{last}`, polled every 5 ms), the `RssAnon` 5 s
//! after it and again after the first trim of freed memory (12 s), the main heap's share (the
//! `[heap]` mapping of `/proc/PID/smaps`), and the threads. Printed as a table (see
//! docs/benchmarks.md).
//!
//! `cargo run --release -p hardware-tests --bin footprint-bench [-- --devices 1000 --restarts 3]`

use clap::Parser;
use sim::Proc;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "footprint-bench", about = "edgecore's footprint and start")]
struct Args {
    #[arg(long, default_value_t = 1000)]
    devices: usize,
    #[arg(long, default_value_t = 3)]
    restarts: usize,
    /// The directory of another build's `edgecore` (default: this workspace's release build).
    #[arg(long)]
    bins: Option<std::path::PathBuf>,
    /// Where to keep the data directory, manifests and config (default: a temporary directory,
    /// removed at the end); `edgecore --config DIR/edgecore.yaml` run in DIR starts it again.
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

/// The anonymous kB of the `[heap]` mapping.
fn heap_kb(pid: u32) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut in_heap = false;
    for line in smaps.lines() {
        if line.contains('-') && line.split_whitespace().count() >= 5 {
            in_heap = line.ends_with("[heap]");
        } else if in_heap && let Some(v) = line.strip_prefix("Anonymous:") {
            return v
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
        }
    }
    0
}

struct Run {
    first_answer_ms: f64,
    rss_5s_mb: f64,
    rss_12s_mb: f64,
    heap_mb: f64,
    threads: u64,
}

fn run_once(bins: &Path, dir: &Path, http: u16, devices: usize) -> anyhow::Result<Run> {
    let agent = sim::agent();
    let url = format!(
        "http://127.0.0.1:{http}/api/v1/devices/default/dev-{}",
        devices - 1
    );
    let started = Instant::now();
    let core = Proc::spawn(
        &bins.join("edgecore"),
        &["--config", "edgecore.yaml"],
        dir,
        "edgecore.log",
    );
    let answered = loop {
        if let Ok(r) = agent.get(&url).call()
            && r.status().as_u16() == 200
        {
            break started.elapsed();
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Err(anyhow::anyhow!(
                "no twin answer within 60 s: {}",
                core.log_text()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let pid = core.child.id();
    std::thread::sleep(Duration::from_secs(5).saturating_sub(started.elapsed() - answered));
    let rss_5s = sim::proc_status(&pid.to_string(), "RssAnon");
    let heap = heap_kb(pid);
    let threads = sim::proc_status(&pid.to_string(), "Threads");
    std::thread::sleep(Duration::from_secs(7));
    let rss_12s = sim::proc_status(&pid.to_string(), "RssAnon");
    core.signal("-TERM");
    let mut core = core;
    let _ = core.child.wait();
    Ok(Run {
        first_answer_ms: answered.as_secs_f64() * 1000.0,
        rss_5s_mb: rss_5s as f64 / 1024.0,
        rss_12s_mb: rss_12s as f64 / 1024.0,
        heap_mb: heap as f64 / 1024.0,
        threads,
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = (|| {
        let bins = sim::bench_binaries(args.bins.as_deref())?;
        let temp = tempfile::tempdir()?;
        let dir = match &args.dir {
            Some(d) => d.as_path(),
            None => temp.path(),
        };
        let http = sim::bench_edgecore_dir(dir, "footprint", args.devices, 10)?;
        // The first start is on an empty data directory, whatever an earlier run of `--dir`
        // left there.
        match std::fs::remove_dir_all(dir.join("data")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(anyhow::anyhow!(
                    "cannot empty {}: {e}",
                    dir.join("data").display()
                ));
            }
            _ => {}
        }
        println!(
            "| start ({} devices x 10 properties) | start → first twin answer, ms | RssAnon 5 s after, MB | RssAnon 12 s after (freed memory trimmed), MB | of it in [heap], MB (5 s) | threads |",
            args.devices
        );
        println!("|---|---|---|---|---|---|");
        for i in 0..=args.restarts {
            let r = run_once(&bins, dir, http, args.devices)?;
            println!(
                "| {} | {:.0} | {:.1} | {:.1} | {:.1} | {} |",
                if i == 0 {
                    "first (empty data directory)".to_string()
                } else {
                    format!("restart {i}")
                },
                r.first_answer_ms,
                r.rss_5s_mb,
                r.rss_12s_mb,
                r.heap_mb,
                r.threads
            );
        }
        Ok::<(), anyhow::Error>(())
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("footprint-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
