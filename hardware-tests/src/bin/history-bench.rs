//! `history-bench`: what the twins' history costs and how fast it answers, printed (no timed
//! assertions).
//!
//! ```sh
//! cargo run --release -p edge --bin history-bench [-- --seconds 60 --devices 1000]
//! ```
//!
//! 1. Ingest: 1,000 devices x 10 properties, each changing once a second (10,000 reported
//!    changes/s offered by 64 reporters, as mappers would), for `--seconds` of real time, once
//!    without history and once with it: the process's CPU time per change and the twin's own
//!    write rate, side by side.
//! 2. Disk: bytes per point of each tier.
//! 3. Queries: a week of one point a second for 10 properties written straight into a history,
//!    rolled up; then 24 h at 1-minute steps, 7 days at 1-minute and at 1-hour steps, and the
//!    last hour raw, each 200 times: p50 and p99.

use api::v1beta1::PropertyType;
use hardware_tests::bench::device_id as id;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use twin::engine::{DeviceDecl, Limits, Reported};
use twin::history::{History, HistoryConfig, Point};
use twin::service::Op;
use twin::{Store, Synchronous, TwinService};

const PROPS: usize = 10;
const REPORTERS: usize = 64;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn decl(n: usize) -> DeviceDecl {
    hardware_tests::bench::device_decl(n, PROPS, PropertyType::Float, false)
}

/// User plus system CPU time of this process, in seconds.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rfind(')').map_or("", |i| &stat[i + 2..]);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / 100.0
}

struct Ingest {
    changes: u64,
    cpu_us_per_change: f64,
    commits_per_s: f64,
    history_points: u64,
    history_dropped: u64,
}

/// 1,000 devices x 10 properties changing once a second, for `seconds`.
async fn ingest(
    dir: &std::path::Path,
    devices: usize,
    seconds: u64,
    history: bool,
) -> anyhow::Result<Ingest> {
    let db = dir.join(if history { "with.db" } else { "without.db" });
    let cfg = history.then(HistoryConfig::default);
    let svc = TwinService::start(
        Store::open_with_history(&db, Synchronous::Normal, cfg).await?,
        Limits::default(),
    )
    .await?;
    for n in 0..devices {
        svc.apply(Op::Upsert(decl(n))).await?;
    }
    let series = devices * PROPS;
    let done = Arc::new(AtomicU64::new(0));
    let commits0 = svc.stats().commits.load(Ordering::Relaxed);
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for r in 0..REPORTERS {
        let svc = svc.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            // Each reporter owns the series r, r + REPORTERS, ...; each changes once a second.
            let mine: Vec<usize> = (r..series).step_by(REPORTERS).collect();
            let per_second = mine.len().max(1);
            let gap = Duration::from_secs_f64(1.0 / per_second as f64);
            let mut next = Instant::now();
            let mut k = 0u64;
            while started.elapsed() < Duration::from_secs(seconds) {
                for &s in &mine {
                    let (dev, prop) = (s / PROPS, s % PROPS);
                    let value = format!("{}.{}", (k + s as u64) % 1000, k % 10);
                    let _ = svc
                        .apply(Op::Report {
                            id: id(dev),
                            reports: vec![Reported {
                                property: format!("p{prop}"),
                                value: Some(value),
                                ..Reported::default()
                            }],
                        })
                        .await;
                    done.fetch_add(1, Ordering::Relaxed);
                    next += gap;
                    if let Some(wait) = next.checked_duration_since(Instant::now()) {
                        tokio::time::sleep(wait).await;
                    }
                }
                k += 1;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    // What the history has to write is written by the fold: count its CPU too.
    svc.store().fold().await?;
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let changes = done.load(Ordering::Relaxed);
    let commits = svc.stats().commits.load(Ordering::Relaxed) - commits0;
    let (points, dropped) = svc
        .store()
        .history()
        .map(|h| {
            (
                h.stats.written.load(Ordering::Relaxed),
                h.stats.dropped.load(Ordering::Relaxed),
            )
        })
        .unwrap_or((0, 0));
    svc.store().close().await;
    Ok(Ingest {
        changes,
        cpu_us_per_change: cpu * 1e6 / changes.max(1) as f64,
        commits_per_s: commits as f64 / elapsed,
        history_points: points,
        history_dropped: dropped,
    })
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let seconds = arg("--seconds", 60);
    let devices = arg("--devices", 1000) as usize;
    let dir = std::env::temp_dir().join(format!("history-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    // 1. Ingest, without and with history.
    println!(
        "ingest: {devices} devices x {PROPS} properties changing once a second, {seconds} s each run"
    );
    let without = ingest(&dir, devices, seconds, false).await?;
    let with = ingest(&dir, devices, seconds, true).await?;
    for (name, r) in [("without history", &without), ("with history", &with)] {
        println!(
            "  {name:<16} {} changes ({:.0}/s), {:.1} µs CPU each, {:.1} twin commits/s, history points {} (dropped {})",
            r.changes,
            r.changes as f64 / seconds as f64,
            r.cpu_us_per_change,
            r.commits_per_s,
            r.history_points,
            r.history_dropped
        );
    }
    println!(
        "  history's CPU: {:+.1}% per change",
        (with.cpu_us_per_change / without.cpu_us_per_change - 1.0) * 100.0
    );

    // 2 and 3. A week of 10 properties at one point a second.
    let h = History::open(
        &dir.join("week.db"),
        HistoryConfig {
            max_bytes: 4 << 30,
            min_free_bytes: 0,
            ..HistoryConfig::default()
        },
    )
    .await?;
    let now = twin::now_millis() / 60_000 * 60_000;
    let week = 7 * 86_400_i64;
    let start = now - week * 1000;
    let t0 = Instant::now();
    let mut batch = Vec::with_capacity(50_000);
    let mut written = 0u64;
    // A day at a time, rolled up after each (as the minute task does), so raw past its
    // window is deleted as it would be.
    for day in 0..7 {
        for s in (day * 86_400)..((day + 1) * 86_400) {
            for p in 0..10 {
                let v = 20.0 + ((s as f64) / 600.0 + p as f64).sin() * 5.0;
                batch.push(Point {
                    device: "default/oven".into(),
                    property: format!("p{p}"),
                    t: start + s * 1000,
                    value: format!("{v:.2}"),
                });
            }
            if batch.len() >= 50_000 {
                written += batch.len() as u64;
                h.ingest(&batch, 0).await;
                batch.clear();
            }
        }
        h.maintain(start + (day + 1) * 86_400_000).await?;
    }
    written += batch.len() as u64;
    h.ingest(&batch, 0).await;
    h.maintain(now).await?;
    println!(
        "a week of 10 properties at 1 Hz: {written} points written in {:.1} s ({:.0}/s), {} dropped, {} evicted",
        t0.elapsed().as_secs_f64(),
        written as f64 / t0.elapsed().as_secs_f64(),
        h.stats.dropped.load(Ordering::Relaxed),
        h.stats.evicted.load(Ordering::Relaxed)
    );
    // Bytes per row of each tier, from SQLite's own page accounting.
    for (table, rows, bytes) in h.tiers().await? {
        match bytes {
            Some(b) => println!(
                "  {table:<6} {rows:>9} rows, {b:>11} bytes, {:.1} bytes per row",
                b as f64 / rows.max(1) as f64
            ),
            None => println!("  {table:<6} {rows:>9} rows (no dbstat in this SQLite)"),
        }
    }
    println!("  file in use: {} bytes", h.bytes().await?);
    for (what, from, step) in [
        ("24 h at 1-minute steps", now - 86_400_000, Some(60_000)),
        ("7 days at 1-minute steps", now - week * 1000, Some(60_000)),
        ("7 days at 1-hour steps", now - week * 1000, Some(3_600_000)),
        ("the last hour, raw", now - 3_600_000, None),
    ] {
        let mut ms = Vec::new();
        let mut n = 0;
        for k in 0..200 {
            let t = Instant::now();
            let s = h
                .query(
                    "default/oven",
                    &format!("p{}", k % 10),
                    from,
                    now,
                    step,
                    now,
                )
                .await?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
            n = s.buckets.len().max(s.points.len());
        }
        println!(
            "  query {what:<26} ({n} rows): p50 {:.2} ms, p99 {:.2} ms",
            pct(&mut ms, 0.5),
            pct(&mut ms, 0.99)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
