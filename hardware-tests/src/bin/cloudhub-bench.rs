//! Figures of cloudhub, against the real `cloudcore` (release build, beside this program):
//!
//! ```sh
//! cargo build --release -p cloud && target/release/cloudhub-bench [--sessions 10000] [--idle-seconds 20]
//! ```
//!
//! `--sessions` simulated edge nodes, each with its own client certificate
//! (`CN=system:node:bench-{i}`, signed here with the data directory's CA), hold TLS websocket
//! sessions from this process over loopback and send KubeEdge's keepalive every 15 s, as
//! edgehub does. It prints the time to connect them all, `cloudcore`'s resident memory idle and
//! with every session up (and per session: its socket, TLS state, queues, and its `Node` object
//! in the API), then restarts `cloudcore` and times the reconnect storm until every node has its
//! session again.
//!
//! Limits: both processes raise their open-files limit to the hard limit (20,000 here); each
//! session is one socket on each side. Loopback has about 28,000 ephemeral ports
//! (`net.ipv4.ip_local_port_range`), all to one server port, so 10,000 sessions fit.

use anyhow::Result;
use hardware_tests::bench::{metric, rss_kib, scrape, start_server};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio_rustls::rustls;

/// One edge node: connects, sends a keepalive every 15 s, and reconnects (1 s plus jitter)
/// whenever its session ends.
async fn node(name: String, hub: String, tls: Arc<rustls::ClientConfig>, up: Arc<AtomicUsize>) {
    loop {
        if let Ok(mut ws) = hardware_tests::bench::connect_node(&name, &hub, tls.clone()).await {
            up.fetch_add(1, Ordering::Relaxed);
            hardware_tests::bench::hold_session(&mut ws).await;
            up.fetch_sub(1, Ordering::Relaxed);
        }
        let jitter = u64::from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
                % 1000,
        );
        tokio::time::sleep(Duration::from_millis(1000 + jitter)).await;
    }
}

async fn until_up(up: &AtomicUsize, n: usize, limit: Duration) -> Result<Duration> {
    let t0 = Instant::now();
    let what = format!("{n} sessions");
    sim::poll::until_async(
        limit.as_secs(),
        Duration::from_millis(50),
        &what,
        async || (up.load(Ordering::Relaxed) >= n).then_some(()),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}: only {}", up.load(Ordering::Relaxed)))?;
    Ok(t0.elapsed())
}

use hardware_tests::bench::arg;

#[tokio::main]
async fn main() -> Result<()> {
    let n = arg("--sessions", 10_000)?;
    let idle = arg("--idle-seconds", 20)?;
    let limit = hardware_tests::bench::raise_nofile();
    println!(
        "cloudhub: {n} simulated edge nodes over TLS websockets on loopback (open files limit {limit})"
    );
    let modules = "  cloudHub:\n    nodeLimit: 20000\n";
    let mut server = start_server(modules)?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_kib = rss_kib(server.child.id());

    let pki = server.data_dir().join("pki");
    let ca_pem = std::fs::read_to_string(pki.join("ca.crt"))?;
    let ca_key = std::fs::read_to_string(pki.join("ca.key"))?;
    let t0 = Instant::now();
    let mut configs = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("bench-{i:05}");
        let tls = hardware_tests::bench::signed_node_tls(&ca_pem, &ca_key, &name)?;
        configs.push((name, tls));
    }
    println!(
        "certificates: {n} signed in {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    let up = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    for (i, (name, tls)) in configs.into_iter().enumerate() {
        tokio::spawn(node(name, server.hub.clone(), tls, up.clone()));
        // Not all at once: a site's nodes do not start in the same millisecond either.
        if i % 200 == 199 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    until_up(&up, n, Duration::from_secs(300)).await?;
    println!(
        "connect:   {n} sessions up in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(idle as u64)).await;
    let m = scrape(&server.metrics).await?;
    let sessions = metric(&m, "cloudhub_sessions ");
    let busy_kib = rss_kib(server.child.id());
    println!(
        "memory:    cloudcore {:.1} MB idle, {:.1} MB with {} sessions after {idle} s of keepalives: {:.1} KB per session (its Node object included)",
        idle_kib as f64 / 1024.0,
        busy_kib as f64 / 1024.0,
        sessions,
        (busy_kib.saturating_sub(idle_kib)) as f64 / n as f64,
    );

    let t0 = Instant::now();
    server.restart(modules)?;
    let restarted = t0.elapsed();
    // The old sessions end with the old process; wait for the count to drop, then come back.
    let drop_deadline = Instant::now() + Duration::from_secs(30);
    while up.load(Ordering::Relaxed) > n / 2 && Instant::now() < drop_deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until_up(&up, n, Duration::from_secs(300)).await?;
    let m = scrape(&server.metrics).await?;
    println!(
        "reconnect: cloudcore restarted in {:.1} s; all {n} nodes had their session again {:.1} s after the restart began ({} sessions on cloudhub)",
        restarted.as_secs_f64(),
        t0.elapsed().as_secs_f64(),
        metric(&m, "cloudhub_sessions "),
    );
    Ok(())
}
