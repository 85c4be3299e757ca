//! `edgecore-bench`: figures of the twin engine and store, printed (no timed assertions).
//!
//! ```sh
//! cargo run --release -p edge --bin edgecore-bench
//! ```
//!
//! 1. Sustained reported updates per second that change a value, persisted (group commit, many
//!    concurrent reporters as many mappers would be).
//! 2. Cost of an unchanged report, and that it wrote nothing (commit counter and WAL size).
//! 3. Latency from a DMI ReportDeviceStatus (over edgecore's Unix socket, through the real DMI
//!    server) to its answer, which comes after the commit, at an offered 10,000 reports/s.
//! 4. Start-up time with 10,000 twins in the database.

use api::v1beta1::PropertyType;
use hardware_tests::bench::device_id as id;
use std::sync::atomic::Ordering;
use std::time::Instant;
use twin::engine::{DeviceDecl, Limits, Reported};
use twin::service::Op;
use twin::{Store, Synchronous, TwinService};

const PROPS: usize = 10;
/// Concurrent reporters of the throughput phases.
const REPORTERS: u64 = 512;

fn decl(n: usize) -> DeviceDecl {
    hardware_tests::bench::device_decl(n, PROPS, PropertyType::Int, true)
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

    // 2. Unchanged reports: the same values again. The journal is folded first, so any byte
    //    written to either file would come from these reports.
    svc.store().fold().await?;
    let wal_bytes = || {
        ["bench.db-wal", "bench-log.db-wal"]
            .iter()
            .map(|f| std::fs::metadata(dir.join(f)).map(|m| m.len()).unwrap_or(0))
            .sum::<u64>()
    };
    let wal_before = wal_bytes();
    let commits_before = svc.stats().commits.load(Ordering::Relaxed);
    let n = 200_000u64;
    let secs = concurrently(svc.clone(), n, move |svc, i| async move {
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
        report(&svc, dev, reports).await
    })
    .await?;
    let wal_after = wal_bytes();
    println!(
        "unchanged reports (with a get each): {n} in {secs:.2} s = {:.2} µs each; commits {} -> {}, WAL bytes {} -> {}",
        secs * 1e6 / n as f64,
        commits_before,
        svc.stats().commits.load(Ordering::Relaxed),
        wal_before,
        wal_after
    );
    // 3. DMI latency at 10,000 values/s: one value per report, then whole devices (10 values
    //    per report, as a mapper reports a batch read). Each starts with the journal folded.
    for (rate, per_report) in [(10_000, 1), (1_000, PROPS)] {
        svc.store().fold().await?;
        dmi_latency(&svc, &dir, devices, rate, per_report).await?;
    }

    svc.store().close().await;
    drop(svc);

    // 4. Start-up with 10,000 twins.
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

/// Runs `task(svc, i)` for every `i < total` from [`REPORTERS`] concurrent reporters (reporter
/// `r` takes `r`, `r + REPORTERS`, ...), as many mappers would; returns the seconds taken.
/// `reports` of device number `dev`, applied.
async fn report(svc: &TwinService, dev: usize, reports: Vec<Reported>) -> anyhow::Result<()> {
    svc.apply(Op::Report {
        id: id(dev),
        reports,
    })
    .await?;
    Ok(())
}

async fn concurrently<F, Fut>(svc: TwinService, total: u64, task: F) -> anyhow::Result<f64>
where
    F: Fn(TwinService, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for r in 0..REPORTERS {
        let (svc, task) = (svc.clone(), task.clone());
        set.spawn(async move {
            let mut i = r;
            while i < total {
                task(svc.clone(), i).await?;
                i += REPORTERS;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(start.elapsed().as_secs_f64())
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
    let commits_before = svc.stats().commits.load(Ordering::Relaxed);
    let micros_before = svc.stats().commit_micros.load(Ordering::Relaxed);
    let secs = concurrently(svc.clone(), total, move |svc, i| async move {
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
        report(&svc, dev, reports).await
    })
    .await?;
    let commits = svc.stats().commits.load(Ordering::Relaxed) - commits_before;
    let micros = svc.stats().commit_micros.load(Ordering::Relaxed) - micros_before;
    // What the background fold has not done yet is part of the cost: fold the rest and count it.
    let backlog = svc.store().unfolded();
    let fold_start = Instant::now();
    svc.store().fold().await?;
    let fold_secs = fold_start.elapsed().as_secs_f64();
    println!(
        "changing reports of {per_report} propert{}: {total} reports in {secs:.2} s = {:.0} reports/s, {:.0} values/s persisted ({commits} commits, {:.0} reports and {:.1} ms each, {:.0}% of the time in commits)",
        if per_report == 1 { "y" } else { "ies" },
        total as f64 / secs,
        values as f64 / secs,
        total as f64 / commits.max(1) as f64,
        micros as f64 / 1e3 / commits.max(1) as f64,
        micros as f64 / 1e4 / secs,
    );
    println!(
        "  then the journal backlog ({backlog} rows) folded in {fold_secs:.2} s: {:.0} values/s with every value in the tables",
        values as f64 / (secs + fold_secs)
    );
    Ok(())
}

/// Offers `rate` ReportDeviceStatus/s of `per_report` values each for 5 s over the DMI socket
/// and prints the latency percentiles of the answers (each answer comes after its commit).
async fn dmi_latency(
    svc: &TwinService,
    dir: &std::path::Path,
    devices: usize,
    rate: u64,
    per_report: usize,
) -> anyhow::Result<()> {
    use api::dmi::v1beta1 as pb;
    use edge::catalog::{Catalog, SharedCatalog};
    use std::sync::{Arc, RwLock};
    use tokio_util::sync::CancellationToken;

    let seconds = 5u64;
    let cancel = CancellationToken::new();
    let metrics = Arc::new(edge::metrics::Metrics::default());
    let catalog: SharedCatalog = Arc::new(RwLock::new(Catalog::default()));
    let (_changes, changes_rx) = tokio::sync::broadcast::channel(16);
    let mappers = edge::dmi::mappers::start(
        svc.clone(),
        catalog,
        changes_rx,
        metrics.clone(),
        edge::dmi::mappers::Liveness::default(),
        cancel.clone(),
    )
    .await;
    let path = dir.join(format!("dmi-{per_report}.sock"));
    let listener = edge::dmi::bind(&path, None)?;
    let server = edge::dmi::DmiServer {
        twin: svc.clone(),
        mappers,
        metrics,
    };
    let serving = tokio::spawn(edge::dmi::serve(
        listener,
        path.clone(),
        256,
        server,
        cancel.clone(),
    ));
    let channel =
        rt::transport::uds_channel(&path.to_string_lossy(), std::time::Duration::from_secs(30));
    let client = pb::device_manager_service_client::DeviceManagerServiceClient::new(channel);

    let (lat_tx, mut lat_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(1));
    let per_tick = rate / 1000;
    let start = Instant::now();
    let mut sent = 0u64;
    let mut tasks = tokio::task::JoinSet::new();
    while sent < rate * seconds {
        tick.tick().await;
        for _ in 0..per_tick {
            sent += 1;
            let mut c = client.clone();
            let lat_tx = lat_tx.clone();
            let i = sent;
            tasks.spawn(async move {
                let req = pb::ReportDeviceStatusRequest {
                    device_name: format!("dev-{}", i as usize % devices),
                    device_namespace: "default".into(),
                    reported_device: Some(pb::DeviceStatus {
                        twins: (0..per_report)
                            .map(|k| pb::Twin {
                                property_name: format!(
                                    "p{}",
                                    (i as usize / devices * per_report + k) % PROPS
                                ),
                                observed_desired: None,
                                reported: Some(pb::TwinProperty {
                                    value: (3_000_000_000 + i).to_string(),
                                    metadata: Default::default(),
                                }),
                            })
                            .collect(),
                        report_to_cloud: true,
                        report_cycle: 0,
                    }),
                };
                let t = Instant::now();
                let r = c.report_device_status(req).await;
                let _ = lat_tx.send(t.elapsed().as_micros() as u64);
                r.map(|_| ())
            });
        }
        while let Some(r) = tasks.try_join_next() {
            r??;
        }
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let secs = start.elapsed().as_secs_f64();
    drop(lat_tx);
    let mut lat = Vec::with_capacity(sent as usize);
    while let Some(l) = lat_rx.recv().await {
        lat.push(l);
    }
    lat.sort_unstable();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)] as f64 / 1e3;
    println!(
        "DMI ReportDeviceStatus of {per_report} value{} to committed answer at {:.0} reports/s offered ({sent} over the Unix socket): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        if per_report == 1 { "" } else { "s" },
        sent as f64 / secs,
        pct(0.50),
        pct(0.99),
        pct(1.0)
    );
    cancel.cancel();
    let _ = serving.await;
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("edgecore-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
