//! Figures of cloudcore replicas on etcd, with the real release binaries and a real
//! three-member etcd cluster on loopback (Debian's `etcd-server`):
//!
//! ```sh
//! cargo build --release -p cloud -p hardware-tests && target/release/replicas-bench   # --objects 5000 --sessions 3000
//! ```
//!
//! 1. The embedded API on SQLite and on etcd, same run: `cloud-bench` (creates/s, patches/s,
//!    list, watch fan-out, memory) once on each store.
//! 2. Three `cloudcore` replicas on the etcd cluster hold `--sessions` simulated edge nodes
//!    (TLS websockets from this process, each with its own certificate signed by the fleet's CA;
//!    node `i` prefers replica `i % 3` and goes to the next one after 200-1000 ms when its
//!    session ends, as edgehub does): the time to connect them all, and each replica's resident
//!    memory idle and with its share (per session).
//! 3. `kill -9` of one replica: for each of its nodes, the time from the kill until it has a
//!    session on another replica again (p50, p99, max).

use anyhow::{Context, Result};
use hardware_tests::bench::{
    arg, metric, raise_nofile, rss_kib, scrape, signed_node_tls, start_server_on,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where a simulated node is: the replica of its session, or [`DOWN`].
const DOWN: usize = usize::MAX;

struct Fleet {
    hubs: Vec<String>,
    /// Per node: its replica now.
    at: Vec<AtomicUsize>,
    /// Set at the kill: nodes that come back after it record how long they took.
    killed_at: Mutex<Option<Instant>>,
    back: Mutex<Vec<Duration>>,
}

/// One simulated edge node: its own replica first, the next when a session ends or cannot be
/// made (after 200-1000 ms), a keepalive every 15 s.
async fn node(i: usize, name: String, tls: hardware_tests::bench::NodeTls, fleet: Arc<Fleet>) {
    let n = fleet.hubs.len();
    let mut at = i % n;
    let mut seed = i as u64 * 7919 + 17;
    loop {
        if let Ok(mut ws) =
            hardware_tests::bench::connect_node(&name, &fleet.hubs[at], tls.clone()).await
        {
            let was_down = fleet.at[i].swap(at, Ordering::Relaxed) == DOWN;
            if was_down && let Some(t) = *fleet.killed_at.lock().unwrap_or_else(|e| e.into_inner())
            {
                fleet
                    .back
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(t.elapsed());
            }
            hardware_tests::bench::hold_session(&mut ws).await;
            fleet.at[i].store(DOWN, Ordering::Relaxed);
        }
        at = (at + 1) % n;
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        tokio::time::sleep(Duration::from_millis(200 + (seed >> 33) % 800)).await;
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> Result<()> {
    let objects = arg("--objects", 5_000)?;
    let sessions = arg("--sessions", 3_000)?;
    let limit = raise_nofile();
    anyhow::ensure!(
        sim::etcd::available(),
        "no etcd binary: apt-get install etcd-server"
    );
    let etcd = sim::etcd::EtcdCluster::start(3)?;
    let urls = etcd.endpoints().join(",");
    println!("etcd: three members on loopback ({urls})");

    // 1. The API on each store, same run.
    let bench = std::env::current_exe()?
        .parent()
        .context("no directory")?
        .join("cloud-bench");
    for store in [None, Some(urls.as_str())] {
        let mut cmd = std::process::Command::new(&bench);
        cmd.args(["--objects", &objects.to_string(), "--watchers", "50"]);
        if let Some(u) = store {
            cmd.args(["--etcd", u]);
        }
        let out = cmd
            .output()
            .with_context(|| format!("cannot run {}", bench.display()))?;
        anyhow::ensure!(
            out.status.success(),
            "cloud-bench failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }

    // 2. Three replicas on etcd, with their share of the sessions.
    let store = format!("    etcd:\n      endpoints: [{urls}]\n      prefix: /bench-fleet/\n");
    let modules = "  cloudHub:\n    nodeLimit: 20000\n  deviceController:\n    enable: true\n";
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(start_server_on(modules, &store)?);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle: Vec<u64> = replicas.iter().map(|r| rss_kib(r.child.id())).collect();
    let pki = replicas[0].data_dir().join("pki");
    let ca_pem = std::fs::read_to_string(pki.join("ca.crt"))?;
    let ca_key = std::fs::read_to_string(pki.join("ca.key"))?;
    let fleet = Arc::new(Fleet {
        hubs: replicas.iter().map(|r| r.hub.clone()).collect(),
        at: (0..sessions).map(|_| AtomicUsize::new(DOWN)).collect(),
        killed_at: Mutex::new(None),
        back: Mutex::new(Vec::new()),
    });
    println!(
        "replicas: 3 cloudcore on etcd, {sessions} simulated edge nodes (open files limit {limit})"
    );
    let t0 = Instant::now();
    for i in 0..sessions {
        let name = format!("bench-{i:05}");
        let tls = signed_node_tls(&ca_pem, &ca_key, &name)?;
        tokio::spawn(node(i, name, tls, fleet.clone()));
        if i % 200 == 199 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let up = |fleet: &Fleet| {
        fleet
            .at
            .iter()
            .filter(|a| a.load(Ordering::Relaxed) != DOWN)
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    while up(&fleet) < sessions {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {sessions} up",
            up(&fleet)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "connect:  {sessions} sessions up in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut added = 0u64;
    for (i, r) in replicas.iter().enumerate() {
        let m = scrape(&r.metrics).await.unwrap_or_default();
        let busy = rss_kib(r.child.id());
        added += busy.saturating_sub(idle[i]);
        println!(
            "replica {i}: {:>5.0} sessions, {:.1} MB idle, {:.1} MB with them",
            metric(&m, "cloudhub_sessions "),
            idle[i] as f64 / 1024.0,
            busy as f64 / 1024.0
        );
    }
    println!(
        "memory:   {:.1} KB per session (the three replicas' growth over {sessions} sessions)",
        added as f64 / sessions as f64
    );

    // 3. kill -9 of replica 0: its nodes go to the others.
    let on_zero = fleet
        .at
        .iter()
        .filter(|a| a.load(Ordering::Relaxed) == 0)
        .count();
    *fleet.killed_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    let t0 = Instant::now();
    let _ = replicas[0].child.kill();
    let _ = replicas[0].child.wait();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let back = fleet.back.lock().unwrap_or_else(|e| e.into_inner()).len();
        if back >= on_zero && up(&fleet) == sessions {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {back} of {on_zero} nodes served again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut back = fleet.back.lock().unwrap_or_else(|e| e.into_inner()).clone();
    back.sort();
    println!(
        "failover: kill -9 of replica 0 ({on_zero} sessions); all served again by the others in {:.1} s: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        t0.elapsed().as_secs_f64(),
        percentile(&back, 0.5),
        percentile(&back, 0.99),
        percentile(&back, 1.0)
    );
    drop(etcd);
    Ok(())
}
