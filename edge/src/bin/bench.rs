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
        id: DeviceId::new("default", format!("dev-{n}")),
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

fn report(prop: usize, v: u64) -> Vec<Reported> {
    vec![Reported {
        property: format!("p{prop}"),
        value: Some(v.to_string()),
        ..Reported::default()
    }]
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

    // 1. Changing reports from 512 concurrent reporters.
    let total: u64 = 400_000;
    let reporters = 512u64;
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for r in 0..reporters {
        let svc = svc.clone();
        set.spawn(async move {
            let mut i = r;
            while i < total {
                let dev = (i as usize) % devices;
                let prop = (i as usize / devices) % PROPS;
                svc.apply(Op::Report {
                    id: decl(dev).id,
                    reports: report(prop, i + 1),
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
    let commits = svc.stats().commits.load(Ordering::Relaxed);
    println!(
        "changing reports: {total} in {secs:.2} s = {:.0}/s persisted ({commits} commits)",
        total as f64 / secs
    );

    // 2. Unchanged reports: the same values again.
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
                    .get(&decl(dev).id)
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
                    id: decl(dev).id,
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

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("edgecore-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
