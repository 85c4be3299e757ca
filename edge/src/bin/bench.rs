//! `edgecore-bench`: figures of the twin engine and store, printed (no timed assertions).
//!
//! ```sh
//! cargo run --release -p edge --bin edgecore-bench
//! ```
//!
//! 1. Sustained reported updates per second that change a value, persisted (group commit, many
//!    concurrent reporters as many mappers would be).
//! 2. Cost of an unchanged report, and that it wrote nothing (commit counter and WAL size).
//! 3. Start-up time with 10,000 twins in the database.

use api::paths::DeviceId;
use api::v1beta1::PropertyType;
use std::sync::atomic::Ordering;
use std::time::Instant;
use twin::engine::{DeviceDecl, Limits, PropertyDecl, Reported};
use twin::service::Op;
use twin::{Store, Synchronous, TwinService};

const PROPS: usize = 10;

fn decl(n: usize) -> DeviceDecl {
    DeviceDecl {
        id: id(n),
        description: String::new(),
        model: "m".into(),
        protocol: "modbus".into(),
        properties: (0..PROPS)
            .map(|p| PropertyDecl {
                name: format!("p{p}"),
                value_type: PropertyType::Int,
                writable: true,
                desired: None,
            })
            .collect(),
    }
}

fn id(n: usize) -> DeviceId {
    DeviceId::new("default", format!("dev-{n}"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile_dir()?;
    let db = dir.join("bench.db");
    let devices = 10_000;
    let svc = TwinService::start(
        Store::open(&db, Synchronous::Normal).await?,
        Limits::default(),
    )
    .await?;
    for n in 0..devices {
        svc.apply(Op::Upsert(decl(n))).await?;
    }

    // 1. Changing reports from 512 concurrent reporters: one property per report, then a
    //    whole device (10 properties) per report, as a mapper reports a batch read.
    let mut round = 0u64;
    for per_report in [1usize, PROPS] {
        round += 1;
        changing(&svc, devices, per_report, round).await?;
    }

    // 2. Unchanged reports: the same values again.
    let reporters = 512u64;
    let wal = dir.join("bench.db-wal");
    let wal_before = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    let commits_before = svc.stats().commits.load(Ordering::Relaxed);
    let n = 200_000u64;
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for r in 0..reporters {
        let svc = svc.clone();
        set.spawn(async move {
            let mut i = r;
            while i < n {
                let dev = (i as usize) % devices;
                // Re-send the value the first phase left (each property's last value).
                let t = svc
                    .get(&id(dev))
                    .await?
                    .ok_or_else(|| anyhow::anyhow!("no twin"))?;
                let v = t.properties["p0"]
                    .reported
                    .as_ref()
                    .map(|x| x.value.clone())
                    .unwrap_or_default();
                let reports = vec![Reported {
                    property: "p0".into(),
                    value: Some(v),
                    ..Reported::default()
                }];
                svc.apply(Op::Report {
                    id: id(dev),
                    reports,
                })
                .await?;
                i += reporters;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let secs = start.elapsed().as_secs_f64();
    let wal_after = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    println!(
        "unchanged reports (with a get each): {n} in {secs:.2} s = {:.2} µs each; commits {} -> {}, WAL bytes {} -> {}",
        secs * 1e6 / n as f64,
        commits_before,
        svc.stats().commits.load(Ordering::Relaxed),
        wal_before,
        wal_after
    );
    svc.store().close().await;
    drop(svc);

    // 3. Start-up with 10,000 twins.
    let start = Instant::now();
    let svc = TwinService::start(
        Store::open(&db, Synchronous::Normal).await?,
        Limits::default(),
    )
    .await?;
    let loaded = svc.list().await?.len();
    println!(
        "start-up: {loaded} twins of {PROPS} properties loaded in {:.0} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Sends 400,000 changing values in reports of `per_report` properties from 512 concurrent
/// reporters, and prints the rates.
async fn changing(
    svc: &TwinService,
    devices: usize,
    per_report: usize,
    round: u64,
) -> anyhow::Result<()> {
    let values: u64 = 400_000;
    let total = values / per_report as u64;
    let reporters = 512u64;
    let commits_before = svc.stats().commits.load(Ordering::Relaxed);
    let micros_before = svc.stats().commit_micros.load(Ordering::Relaxed);
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for r in 0..reporters {
        let svc = svc.clone();
        set.spawn(async move {
            let mut i = r;
            while i < total {
                let dev = (i as usize) % devices;
                let first = (i as usize / devices * per_report) % PROPS;
                let v = round * 1_000_000_000 + i + 1;
                let reports = (first..first + per_report)
                    .map(|p| Reported {
                        property: format!("p{}", p % PROPS),
                        value: Some(v.to_string()),
                        ..Reported::default()
                    })
                    .collect();
                svc.apply(Op::Report {
                    id: id(dev),
                    reports,
                })
                .await?;
                i += reporters;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let secs = start.elapsed().as_secs_f64();
    let commits = svc.stats().commits.load(Ordering::Relaxed) - commits_before;
    let micros = svc.stats().commit_micros.load(Ordering::Relaxed) - micros_before;
    println!(
        "changing reports of {per_report} propert{}: {total} reports in {secs:.2} s = {:.0} reports/s, {:.0} values/s persisted ({commits} commits, {:.0} reports and {:.1} ms each, {:.0}% of the time in commits)",
        if per_report == 1 { "y" } else { "ies" },
        total as f64 / secs,
        values as f64 / secs,
        total as f64 / commits.max(1) as f64,
        micros as f64 / 1e3 / commits.max(1) as f64,
        micros as f64 / 1e4 / secs,
    );
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("edgecore-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
