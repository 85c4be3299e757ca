//! Figures of cloudcore replicas on etcd, with the real release binaries and a real
//! three-member etcd cluster on loopback (Debian's `etcd-server`):
//!
//! ```sh
//! cargo build --release -p cloud -p hardware-tests && target/release/replicas-bench   # --objects 5000 --sessions 3000
//! # the fleet: 10,000 nodes of 10 devices each reporting every 10 s, the API skipped
//! target/release/replicas-bench --sessions 10000 --devices 10 --skip-api
//! ```
//!
//! 1. The embedded API on SQLite and on etcd, same run: `cloud-bench` (creates/s, patches/s,
//!    list, watch fan-out, memory) once on each store.
//! 2. Three `cloudcore` replicas on the etcd cluster hold `--sessions` simulated edge nodes
//!    (TLS websockets from this process, each with its own certificate signed by the fleet's CA;
//!    node `i` prefers replica `i % 3` and goes to the next one after 200-1000 ms when its
//!    session ends, as edgehub does): the time to connect them all, and each replica's resident
//!    memory idle and with its share (per session).
//! 3. With `--devices N` (per node), the fleet's devices are Device objects and every node
//!    reports each of its devices every `--interval` seconds (10), in KubeEdge's format (a twin
//!    update per device, `--properties` values each, the value being the time it was sent): from
//!    a watch of DeviceStatus on another replica, the time from a report until DeviceStatus
//!    shows it (p50, p99); meanwhile kubectl (the user's client) lists every device, gets one,
//!    and watches a DeviceModel that this program patches every second (patch -> kubectl's
//!    line). Then `kill -9` of etcd's leader: the same figures in the minute after it.
//! 4. `kill -9` of one replica: for each of its nodes, the time from the kill until it has a
//!    session on another replica again (p50, p99, max).
//!
//! In the measured window, per replica: its sessions, the reports its device controller took
//! and their share of all, the watch events it received (of Nodes, of ObjectSync records), its
//! DeviceStatus patches and its CPU time; then the CPU time of the replicas, of etcd's members
//! and of this process (the simulated fleet's TLS), per report sent. `--replicas N` (1 to 3)
//! runs that many replicas; `CLOUDCORE=path` runs another build's cloudcore (before and after
//! a change, with the same bench).
//!
//! `--leader-writes` alone: one replica on the etcd cluster, a ConfigMap patched through it one
//! write after another; `kill -9` of etcd's leader after 3 s: how long the other members took
//! to elect a leader (etcd's own view, polled every 50 ms) and the longest write that was under
//! way or began after the kill (a write waits for the election, not for a timeout).

use anyhow::{Context, Result};
use futures_util::{SinkExt, StreamExt};
use hardware_tests::bench::{
    NodeSession, ar, arg, metric, raise_nofile, rss_kib, scrape, signed_node_tls, start_server_on,
};
use kube::api::{
    Api, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where a simulated node is: the replica of its session, or [`DOWN`].
const DOWN: usize = usize::MAX;

/// What the nodes report: `devices` each, of `properties` values, every `interval`.
struct Load {
    devices: usize,
    properties: usize,
    interval: Duration,
    /// Reported values are the milliseconds since this when they were sent.
    epoch: Instant,
    /// Twin updates sent.
    sent: AtomicU64,
}

impl Load {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

struct Fleet {
    hubs: Vec<String>,
    /// Per node: its replica now.
    at: Vec<AtomicUsize>,
    /// Set at the kill: nodes that come back after it record how long they took.
    killed_at: Mutex<Option<Instant>>,
    back: Mutex<Vec<Duration>>,
    load: Load,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One simulated edge node: its own replica first, the next when a session ends or cannot be
/// made (after 200-1000 ms), a keepalive every 15 s, its devices' reports if it has any.
async fn node(i: usize, name: String, tls: hardware_tests::bench::NodeTls, fleet: Arc<Fleet>) {
    let n = fleet.hubs.len();
    let mut at = i % n;
    let mut seed = i as u64 * 7919 + 17;
    loop {
        if let Ok(mut ws) =
            hardware_tests::bench::connect_node(&name, &fleet.hubs[at], tls.clone()).await
        {
            let was_down = fleet.at[i].swap(at, Ordering::Relaxed) == DOWN;
            if was_down && let Some(t) = *lock(&fleet.killed_at) {
                lock(&fleet.back).push(t.elapsed());
            }
            if fleet.load.devices == 0 {
                hardware_tests::bench::hold_session(&mut ws).await;
            } else {
                report(i, &name, &mut ws, &fleet).await;
            }
            fleet.at[i].store(DOWN, Ordering::Relaxed);
        }
        at = (at + 1) % n;
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        tokio::time::sleep(Duration::from_millis(200 + (seed >> 33) % 800)).await;
    }
}

/// Holds a session as edgehub does, and reports each of the node's devices every interval (its
/// turn spread over the interval by its index), until the session ends.
async fn report(i: usize, name: &str, ws: &mut NodeSession, fleet: &Fleet) {
    use tokio_tungstenite::tungstenite::Message as Frame;
    let load = &fleet.load;
    let interval = load.interval.as_millis() as u64;
    let phase = interval * i as u64 / fleet.at.len() as u64;
    let now = load.now_ms();
    let first = now - now % interval + phase;
    let first = if first <= now {
        first + interval
    } else {
        first
    };
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::from_std(load.epoch + Duration::from_millis(first)),
        load.interval,
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut beat = tokio::time::interval(Duration::from_secs(15));
    loop {
        tokio::select! {
            _ = beat.tick() => {
                let ping = api::message::Message::new("websocket", "resource", "keepalive", "node", json!("ping"));
                if ws.send(Frame::text(serde_json::to_string(&ping).unwrap_or_default())).await.is_err() {
                    return;
                }
            }
            _ = tick.tick() => {
                let ms = load.now_ms();
                for d in 0..load.devices {
                    let twin: serde_json::Map<String, serde_json::Value> = (0..load.properties)
                        .map(|p| (format!("p{p}"), json!({
                            "actual": {"value": ms.to_string(), "metadata": {"timestamp": ms}},
                            "metadata": {"type": "int"},
                            "actual_version": {"cloud": 0, "edge": ms}})))
                        .collect();
                    let msg = api::message::Message::new(
                        "edgehub",
                        "twin",
                        "update",
                        format!("node/{name}/device/default/{name}-{d}/twin/edge_updated"),
                        json!({"event_id": format!("{name}-{d}-{ms}"), "timestamp": ms, "twin": twin}),
                    );
                    if ws.send(Frame::text(serde_json::to_string(&msg).unwrap_or_default())).await.is_err() {
                        return;
                    }
                    load.sent.fetch_add(1, Ordering::Relaxed);
                }
            }
            f = ws.next() => match f {
                Some(Ok(Frame::Text(t))) => {
                    // Acknowledged once stored, as edgecore's edgehub does (otherwise cloudhub
                    // sends every device again and again).
                    if let Some(ack) = acknowledgement(t.as_str())
                        && ws.send(Frame::text(ack)).await.is_err()
                    {
                        return;
                    }
                }
                Some(Ok(_)) => {}
                _ => return,
            },
        }
    }
}

/// The answer edgehub gives to a device or model the cloud sends: `response`, its id as parent.
fn acknowledgement(text: &str) -> Option<String> {
    let msg: api::message::Message = serde_json::from_str(text).ok()?;
    if msg.header.id.is_empty() || matches!(msg.route.operation.as_str(), "response" | "error") {
        return None;
    }
    let mut answer = msg.ack();
    answer.route.source = "edgehub".into();
    serde_json::to_string(&answer).ok()
}

/// What was seen, in milliseconds since the load's epoch: DeviceStatus showing a new reported
/// value (when, and how long after it was sent), kubectl's answers.
#[derive(Default)]
struct Seen {
    statuses: Mutex<Vec<(u64, u64)>>,
    /// (sent, kubectl printed it) of the watched DeviceModel's patches.
    patches: Mutex<Vec<u64>>,
    lines: Mutex<Vec<u64>>,
    /// (when it ended, ms, whether it succeeded, ms its HTTP requests took) of `kubectl get
    /// devices -A` and of `kubectl get device NAME`.
    lists: Mutex<Vec<(u64, f64, bool, f64)>>,
    gets: Mutex<Vec<(u64, f64, bool, f64)>>,
}

/// Watches every DeviceStatus (through `client`) and records each new reported value.
async fn watch_statuses(client: kube::Client, epoch: Instant, seen: Arc<Seen>) {
    let api: Api<DynamicObject> = Api::all_with(client, &ar("DeviceStatus"));
    let mut last: HashMap<String, u64> = HashMap::new();
    let mut rv = String::new();
    loop {
        if rv.is_empty() {
            match api.list(&ListParams::default().limit(1)).await {
                Ok(l) => rv = l.metadata.resource_version.unwrap_or_default(),
                Err(_) => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            }
        }
        let Ok(s) = api.watch(&WatchParams::default().timeout(290), &rv).await else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let mut s = s.boxed();
        while let Some(e) = s.next().await {
            match e {
                Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) => {
                    if let Some(v) = &o.metadata.resource_version {
                        rv.clone_from(v);
                    }
                    let value = o.data["status"]["twins"].as_array().and_then(|t| {
                        t.iter()
                            .find_map(|t| t["reported"]["value"].as_str()?.parse::<u64>().ok())
                    });
                    if let (Some(v), Some(name)) = (value, o.metadata.name)
                        && last.insert(name, v) != Some(v)
                    {
                        let now = epoch.elapsed().as_millis() as u64;
                        lock(&seen.statuses).push((now, now.saturating_sub(v)));
                    }
                }
                Ok(WatchEvent::Bookmark(b)) => rv = b.metadata.resource_version,
                Ok(WatchEvent::Error(_)) => {
                    rv.clear();
                    break;
                }
                Err(_) => break,
                _ => {}
            }
        }
    }
}

/// Runs kubectl with `args` against `kubeconfig`: its time (ms), output, success, and the time
/// its HTTP requests took from sent to the answer's headers (ms, as kubectl's `-v=6` logs each).
async fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> (f64, String, bool, f64) {
    let t = Instant::now();
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("-v=6")
        .args(args)
        .output()
        .await;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    match out {
        Ok(o) => (
            ms,
            String::from_utf8_lossy(&o.stdout).into_owned(),
            o.status.success(),
            requests_ms(&String::from_utf8_lossy(&o.stderr)),
        ),
        Err(_) => (ms, String::new(), false, 0.0),
    }
}

/// The sum of `milliseconds=N` over the responses kubectl's `-v=6` log shows.
fn requests_ms(log: &str) -> f64 {
    log.lines()
        .filter(|l| l.contains("\"Response\""))
        .filter_map(|l| l.split("milliseconds=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .sum()
}

/// kubectl, as a user beside the fleet: a list of every device every 15 s, a get of one every
/// 2 s; and a patch of the watched DeviceModel every second (through `client`), until `stop`.
async fn kubectl_rounds(
    kubeconfig: std::path::PathBuf,
    client: kube::Client,
    one: String,
    epoch: Instant,
    seen: Arc<Seen>,
    stop: tokio_util::sync::CancellationToken,
) {
    let ms = move || epoch.elapsed().as_millis() as u64;
    let lists = {
        let (k, seen, stop) = (kubeconfig.clone(), seen.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                // The user's command: a table, in kubectl's pages of 500.
                let (t, out, ok, req) = kubectl(&k, &["get", "devices", "-A"]).await;
                lock(&seen.lists).push((ms(), t, ok && !out.is_empty(), req));
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(15)) => {}
                    _ = stop.cancelled() => {}
                }
            }
        })
    };
    let gets = {
        let (k, seen, stop) = (kubeconfig.clone(), seen.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let (t, _, ok, req) = kubectl(&k, &["get", "device", &one, "-o", "name"]).await;
                lock(&seen.gets).push((ms(), t, ok, req));
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                    _ = stop.cancelled() => {}
                }
            }
        })
    };
    let models: Api<DynamicObject> = Api::namespaced_with(client, "default", &ar("DeviceModel"));
    for round in 0u64.. {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.cancelled() => break,
        }
        let at = ms();
        let p = json!({"metadata": {"labels": {"round": round.to_string()}}});
        if models
            .patch("watch-probe", &PatchParams::default(), &Patch::Merge(&p))
            .await
            .is_ok()
        {
            lock(&seen.patches).push(at);
        }
    }
    let _ = lists.await;
    let _ = gets.await;
}

/// `kubectl get devicemodel watch-probe --watch`: the time of each line it prints.
fn kubectl_watch(
    kubeconfig: &std::path::Path,
    epoch: Instant,
    seen: Arc<Seen>,
) -> Result<std::process::Child> {
    use std::io::BufRead;
    let mut child = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["get", "devicemodel", "watch-probe", "--watch", "-o", "name"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("cannot run kubectl")?;
    let out = child.stdout.take().context("no stdout")?;
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            if line.is_err() {
                return;
            }
            lock(&seen.lines).push(epoch.elapsed().as_millis() as u64);
        }
    });
    Ok(child)
}

/// The figures of `seen` between `from` and `to` (ms since the epoch), one line each.
fn window(seen: &Seen, from: u64, to: u64) -> Vec<String> {
    let mut out = Vec::new();
    let st = lock(&seen.statuses);
    let mut lat: Vec<f64> = st
        .iter()
        .filter(|(at, _)| (from..to).contains(at))
        .map(|(_, l)| *l as f64)
        .collect();
    lat.sort_by(f64::total_cmp);
    let mut at: Vec<u64> = st
        .iter()
        .map(|(a, _)| *a)
        .filter(|a| (from..to).contains(a))
        .collect();
    at.sort_unstable();
    let gap = at
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or(0)
        .max(at.first().map_or(to - from, |f| f - from));
    out.push(format!(
        "report -> DeviceStatus: {} values seen ({:.0}/s); p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; longest time without one {gap} ms",
        lat.len(),
        lat.len() as f64 * 1000.0 / (to - from).max(1) as f64,
        sim::percentile(&lat, 50.0),
        sim::percentile(&lat, 99.0),
        lat.last().copied().unwrap_or(f64::NAN),
    ));
    drop(st);
    for (what, calls) in [
        ("kubectl get devices -A (every device)", &seen.lists),
        ("kubectl get device ONE", &seen.gets),
    ] {
        let calls = lock(calls);
        let inside: Vec<_> = calls
            .iter()
            .filter(|(a, ..)| (from..to).contains(a))
            .collect();
        let mut t: Vec<f64> = inside.iter().map(|c| c.1).collect();
        let mut req: Vec<f64> = inside.iter().map(|c| c.3).collect();
        let failed = inside.iter().filter(|c| !c.2).count();
        t.sort_by(f64::total_cmp);
        req.sort_by(f64::total_cmp);
        out.push(format!(
            "{what}: {} calls, {failed} failed; p50 {:.0} ms, max {:.0} ms (its HTTP requests, sent to answered: p50 {:.0} ms, max {:.0} ms)",
            t.len(),
            sim::percentile(&t, 50.0),
            t.last().copied().unwrap_or(f64::NAN),
            sim::percentile(&req, 50.0),
            req.last().copied().unwrap_or(f64::NAN)
        ));
    }
    // The watch's first line is the object as it was; each patch then prints one.
    let patches = lock(&seen.patches);
    let lines = lock(&seen.lines);
    let mut w: Vec<f64> = patches
        .iter()
        .zip(lines.iter().skip(1))
        .filter(|(p, _)| (from..to).contains(*p))
        .map(|(p, l)| l.saturating_sub(*p) as f64)
        .collect();
    let sent = patches.iter().filter(|p| (from..to).contains(*p)).count();
    w.sort_by(f64::total_cmp);
    out.push(format!(
        "kubectl get --watch: {} of {sent} patches printed; patch -> line p50 {:.0} ms, p99 {:.0} ms",
        w.len(),
        sim::percentile(&w, 50.0),
        sim::percentile(&w, 99.0)
    ));
    out
}

/// What the processes did: per replica its device controller's counters and CPU time; the
/// etcd members' and this process's CPU time (the simulated fleet's TLS, the watch).
struct Work {
    /// Per replica: sessions, reports taken, watch events (all; of Nodes; of ObjectSync
    /// records), DeviceStatus patches, CPU seconds, the patches' seconds in all and their
    /// count (from the start of each to the API's answer).
    replicas: Vec<[f64; 9]>,
    etcd: f64,
    /// etcd's own figures, summed over its running members: WAL fsyncs (seconds, count),
    /// backend commits (seconds, count), proposals committed (the leader's count is the
    /// cluster's writes).
    etcd_disk: [f64; 5],
    bench: f64,
    /// Seconds of the window (of the counters since a start, before [`Work::since`]).
    wall: f64,
    at: Instant,
}

/// The machine's cores.
fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

impl Work {
    async fn of(replicas: &[hardware_tests::bench::Server], etcd: &sim::etcd::EtcdCluster) -> Self {
        let mut per = Vec::new();
        for r in replicas {
            let m = scrape(&r.metrics).await.unwrap_or_default();
            // A build without a counter says NaN: printed as "-".
            let c = |name: &str| {
                if m.contains(name) {
                    metric(&m, name)
                } else {
                    f64::NAN
                }
            };
            per.push([
                c("cloudhub_sessions "),
                c("devicecontroller_reports_total "),
                c("devicecontroller_watch_events_total "),
                c("devicecontroller_node_events_total "),
                c("devicecontroller_record_events_total "),
                c("devicecontroller_status_patches_total "),
                hardware_tests::bench::cpu_seconds(r.child.id()),
                c("devicecontroller_status_patch_duration_seconds_sum "),
                c("devicecontroller_status_patch_duration_seconds_count "),
            ]);
        }
        let mut etcd_disk = [0.0; 5];
        for addr in etcd.metrics_addrs() {
            let m = scrape(&addr).await.unwrap_or_default();
            for (i, name) in [
                "etcd_disk_wal_fsync_duration_seconds_sum ",
                "etcd_disk_wal_fsync_duration_seconds_count ",
                "etcd_disk_backend_commit_duration_seconds_sum ",
                "etcd_disk_backend_commit_duration_seconds_count ",
            ]
            .into_iter()
            .enumerate()
            {
                etcd_disk[i] += metric(&m, name);
            }
            etcd_disk[4] = etcd_disk[4].max(metric(&m, "etcd_server_proposals_committed_total "));
        }
        Self {
            replicas: per,
            etcd_disk,
            etcd: etcd
                .pids()
                .into_iter()
                .map(hardware_tests::bench::cpu_seconds)
                .sum(),
            bench: hardware_tests::bench::cpu_seconds(std::process::id()),
            wall: 0.0,
            at: Instant::now(),
        }
    }

    /// What was done since `before` (sessions as they are now).
    fn since(&self, before: &Work) -> Work {
        Work {
            replicas: self
                .replicas
                .iter()
                .zip(&before.replicas)
                .map(|(a, b)| {
                    let mut d = *a;
                    for i in 1..d.len() {
                        d[i] -= b[i];
                    }
                    d
                })
                .collect(),
            etcd: self.etcd - before.etcd,
            etcd_disk: std::array::from_fn(|i| self.etcd_disk[i] - before.etcd_disk[i]),
            bench: self.bench - before.bench,
            wall: self.at.duration_since(before.at).as_secs_f64(),
            at: self.at,
        }
    }

    fn print(&self, sent: u64) {
        let reports: f64 = self.replicas.iter().map(|r| r[1]).sum();
        let events: f64 = self.replicas.iter().map(|r| r[2]).sum();
        let share = |v: f64, all: f64| {
            if v.is_nan() || all <= 0.0 {
                "-".to_string()
            } else {
                format!("{:.0}%", v * 100.0 / all)
            }
        };
        let num = |v: f64| {
            if v.is_nan() {
                "-".to_string()
            } else {
                format!("{v:.0}")
            }
        };
        for (i, r) in self.replicas.iter().enumerate() {
            println!(
                "  replica {i}: {} sessions; reports taken {} ({} of all); watch events {} ({} of all; Node {}, ObjectSync {}); DeviceStatus patches {} ({} ms each on average, start to answer); CPU {:.1} s",
                num(r[0]),
                num(r[1]),
                share(r[1], reports),
                num(r[2]),
                share(r[2], events),
                num(r[3]),
                num(r[4]),
                num(r[5]),
                num(r[7] * 1000.0 / r[8]),
                r[6]
            );
        }
        let replicas: f64 = self.replicas.iter().map(|r| r[6]).sum();
        let patches: f64 = self.replicas.iter().map(|r| r[5]).sum();
        let all = replicas + self.etcd + self.bench;
        // Reports sent may wait in the sockets' buffers: what was taken is what the CPU did.
        let taken = if reports.is_nan() { patches } else { reports };
        println!(
            "  CPU: replicas {replicas:.1} s, etcd {:.1} s, simulated fleet and watch {:.1} s ({:.0}% of the machine's); per report taken ({taken:.0}): {:.2} ms (all processes), {:.2} ms (replicas and etcd){}",
            self.etcd,
            self.bench,
            all * 100.0 / self.wall / cores(),
            all * 1000.0 / taken.max(1.0),
            (replicas + self.etcd) * 1000.0 / taken.max(1.0),
            if reports.is_nan() {
                " (this build counts no reports: per DeviceStatus patch)"
            } else {
                ""
            }
        );
        let d = &self.etcd_disk;
        println!(
            "  etcd: {:.0} proposals committed ({:.0}/s); WAL fsync {:.1} ms on average ({:.0} of them, all members), backend commit {:.1} ms ({:.0})",
            d[4],
            d[4] / self.wall.max(0.001),
            d[0] * 1000.0 / d[1].max(1.0),
            d[1],
            d[2] * 1000.0 / d[3].max(1.0),
            d[3]
        );
        let _ = sent;
    }
}

/// Writes through a replica while etcd's leader is killed: the election's time, and the
/// longest write under way or begun after the kill.
async fn leader_writes(etcd: &mut sim::etcd::EtcdCluster, urls: &str) -> Result<()> {
    let store = format!("    etcd:\n      endpoints: [{urls}]\n      prefix: /bench-leader/\n");
    let replica = start_server_on("", &store)?;
    let client = cloud::cluster_client(&replica.kubeconfig).await?;
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client, "default");
    maps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "beat"}, "data": {"n": "0"}}))?,
    )
    .await?;
    let start = Instant::now();
    // The writes, one after another, beside the kill: (began, took, ok) of each.
    let writer = tokio::spawn(async move {
        let mut writes: Vec<(Duration, Duration, bool)> = Vec::new();
        let mut n = 0u64;
        while start.elapsed() < Duration::from_secs(15) {
            n += 1;
            let began = start.elapsed();
            let t = Instant::now();
            let patch = json!({"data": {"n": n.to_string()}});
            let ok = maps
                .patch("beat", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .is_ok();
            writes.push((began, t.elapsed(), ok));
        }
        writes
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    let member = etcd.leader()?;
    etcd.kill(member);
    let killed = Instant::now();
    // The election, as etcd's members see it.
    let mut elected = None;
    while killed.elapsed() < Duration::from_secs(10) {
        if let Ok(l) = etcd.leader()
            && l != member
        {
            elected = Some(killed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let writes = writer.await?;
    let kill = killed.duration_since(start);
    let after: Vec<&(Duration, Duration, bool)> =
        writes.iter().filter(|(b, t, _)| *b + *t >= kill).collect();
    let longest = after.iter().map(|w| w.1).max().unwrap_or_default();
    for (b, t, ok) in after.iter().filter(|w| w.1 > Duration::from_millis(500)) {
        println!(
            "  a write that began {:+.0} ms from the kill took {:.0} ms{}",
            (b.as_secs_f64() - kill.as_secs_f64()) * 1000.0,
            t.as_secs_f64() * 1000.0,
            if *ok { "" } else { " and failed" }
        );
    }
    let failed = after.iter().filter(|w| !w.2).count();
    println!(
        "leader:   kill -9 of etcd's leader (member {member}) with writes going on: a new leader in {}; the longest write under way or after it {:.0} ms ({} writes after it, {failed} failed; {} in all)",
        elected.map_or("more than 10 s".to_string(), |e| format!(
            "{:.0} ms",
            e.as_secs_f64() * 1000.0
        )),
        longest.as_secs_f64() * 1000.0,
        after.len(),
        writes.len()
    );
    Ok(())
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
    let devices = arg("--devices", 0)?;
    let properties = arg("--properties", 2)?.max(1);
    let interval = Duration::from_secs(arg("--interval", 10)?.max(1) as u64);
    let measure = arg("--measure", 60)? as u64;
    let skip_api = std::env::args().any(|a| a == "--skip-api");
    let n = arg("--replicas", 3)?.clamp(1, 3);
    let limit = raise_nofile();
    anyhow::ensure!(
        sim::etcd::available(),
        "no etcd binary: apt-get install etcd-server"
    );
    let mut etcd = sim::etcd::EtcdCluster::start(3)?;
    let urls = etcd.endpoints().join(",");
    println!("etcd: three members on loopback ({urls})");
    if std::env::args().any(|a| a == "--leader-writes") {
        return leader_writes(&mut etcd, &urls).await;
    }

    // 1. The API on each store, same run.
    let bench = std::env::current_exe()?
        .parent()
        .context("no directory")?
        .join("cloud-bench");
    for store in [None, Some(urls.as_str())] {
        if skip_api {
            break;
        }
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

    // 2. `n` replicas (three) on etcd, with their share of the sessions.
    let store = format!("    etcd:\n      endpoints: [{urls}]\n      prefix: /bench-fleet/\n");
    // `--max-in-flight N`: the device controllers' writes in flight (their default without).
    let in_flight = match arg("--max-in-flight", 0)? {
        0 => String::new(),
        k => format!("    maxInFlight: {k}\n"),
    };
    let modules = format!(
        "  cloudHub:\n    nodeLimit: 20000\n  deviceController:\n    enable: true\n{in_flight}"
    );
    let mut replicas = Vec::new();
    for _ in 0..n {
        replicas.push(start_server_on(&modules, &store)?);
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
        load: Load {
            devices,
            properties,
            interval,
            epoch: Instant::now(),
            sent: AtomicU64::new(0),
        },
    });
    // The fleet's devices, through replica 1 (replica 0 is killed last).
    let client = cloud::cluster_client(&replicas[1 % n].kubeconfig).await?;
    let mut with_objects = idle.clone();
    if devices > 0 {
        let models: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), "default", &ar("DeviceModel"));
        let props: Vec<_> = (0..properties)
            .map(|p| json!({"name": format!("p{p}"), "type": "INT", "accessMode": "ReadOnly"}))
            .collect();
        for name in ["fleet", "watch-probe"] {
            models
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
                        "metadata": {"name": name}, "spec": {"protocol": "modbus", "properties": props}}))?,
                )
                .await?;
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), "default", &ar("Device"));
        let visit: Vec<_> = (0..properties)
            .map(|p| json!({"name": format!("p{p}"), "reportToCloud": true,
                "visitors": {"protocolName": "modbus", "configData": {"register": "HoldingRegister", "offset": p}}}))
            .collect();
        let total = sessions * devices;
        let t0 = Instant::now();
        let rate = hardware_tests::bench::run(total, 32, move |k| {
            let (api, visit) = (api.clone(), visit.clone());
            async move {
                let node = format!("bench-{:05}", k / devices);
                let d: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
                    "metadata": {"name": format!("{node}-{}", k % devices)},
                    "spec": {"nodeName": node, "deviceModelRef": {"name": "fleet"},
                        "protocol": {"protocolName": "modbus", "configData": {"ip": "127.0.0.1", "port": 1}},
                        "properties": visit}}))?;
                api.create(&PostParams::default(), &d).await?;
                Ok(())
            }
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(5)).await;
        with_objects = replicas.iter().map(|r| rss_kib(r.child.id())).collect();
        let grown: u64 = with_objects
            .iter()
            .zip(&idle)
            .map(|(b, a)| b.saturating_sub(*a))
            .sum();
        println!(
            "devices:  {total} Device objects ({properties} properties each) created through one replica in {:.1} s ({rate:.0}/s); {:.1} KB per device per replica",
            t0.elapsed().as_secs_f64(),
            grown as f64 / n as f64 / total as f64
        );
    }
    println!(
        "replicas: {n} cloudcore on etcd, {sessions} simulated edge nodes (open files limit {limit})"
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
        added += busy.saturating_sub(with_objects[i]);
        println!(
            "replica {i}: {:>5.0} sessions, {:.1} MB idle, {:.1} MB with the objects, {:.1} MB with the sessions",
            metric(&m, "cloudhub_sessions "),
            idle[i] as f64 / 1024.0,
            with_objects[i] as f64 / 1024.0,
            busy as f64 / 1024.0
        );
    }
    println!(
        "memory:   {:.1} KB per session (the replicas' growth over {sessions} sessions)",
        added as f64 / sessions as f64
    );

    // 3. The fleet reporting, with kubectl beside it; then the loss of etcd's leader.
    if devices > 0 {
        let load = &fleet.load;
        let seen = Arc::new(Seen::default());
        tokio::spawn(watch_statuses(client.clone(), load.epoch, seen.clone()));
        let mut watch = kubectl_watch(&replicas[2 % n].kubeconfig, load.epoch, seen.clone())?;
        let stop = tokio_util::sync::CancellationToken::new();
        let rounds = tokio::spawn(kubectl_rounds(
            replicas[2 % n].kubeconfig.clone(),
            client.clone(),
            "bench-00000-0".into(),
            load.epoch,
            seen.clone(),
            stop.clone(),
        ));
        println!(
            "reports:  every node reports each of its {devices} devices every {} s ({:.0} twin updates/s, {properties} values each); kubectl on replica 2, DeviceStatus watched on replica 1",
            interval.as_secs(),
            (sessions * devices) as f64 / interval.as_secs_f64()
        );
        // Two intervals to settle, then the measured window.
        tokio::time::sleep(interval * 2).await;
        let (from, sent0) = (load.now_ms(), load.sent.load(Ordering::Relaxed));
        let work0 = Work::of(&replicas, &etcd).await;
        tokio::time::sleep(Duration::from_secs(measure)).await;
        let to = load.now_ms();
        let sent = load.sent.load(Ordering::Relaxed) - sent0;
        let work = Work::of(&replicas, &etcd).await.since(&work0);
        println!(
            "steady, {measure} s: {sent} twin updates sent ({:.0}/s)",
            sent as f64 * 1000.0 / (to - from) as f64
        );
        work.print(sent);
        for r in &replicas {
            print!(" {:.1} MB", rss_kib(r.child.id()) as f64 / 1024.0);
        }
        println!(" (the replicas, reporting)");
        for line in window(&seen, from, to) {
            println!("  {line}");
        }
        let leader = etcd.leader()?;
        let from = load.now_ms();
        etcd.kill(leader);
        let mut lowest = sessions;
        let until = Instant::now() + Duration::from_secs(measure);
        while Instant::now() < until {
            lowest = lowest.min(up(&fleet));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let to = load.now_ms();
        println!(
            "etcd:     kill -9 of its leader (member {leader}); the {measure} s after it ({lowest} of {sessions} sessions at the lowest):"
        );
        for line in window(&seen, from, to) {
            println!("  {line}");
        }
        etcd.restart(leader)?;
        stop.cancel();
        let _ = rounds.await;
        let _ = watch.kill();
        let _ = watch.wait();
    }

    // 4. kill -9 of replica 0: its nodes go to the others.
    if n < 2 {
        drop(etcd);
        return Ok(());
    }
    let on_zero = fleet
        .at
        .iter()
        .filter(|a| a.load(Ordering::Relaxed) == 0)
        .count();
    *lock(&fleet.killed_at) = Some(Instant::now());
    let t0 = Instant::now();
    let _ = replicas[0].child.kill();
    let _ = replicas[0].child.wait();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let back = lock(&fleet.back).len();
        if back >= on_zero && up(&fleet) == sessions {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {back} of {on_zero} nodes served again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut back = lock(&fleet.back).clone();
    back.sort();
    println!(
        "failover: kill -9 of replica 0 ({on_zero} sessions); all served again by the others in {:.1} s: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        t0.elapsed().as_secs_f64(),
        percentile(&back, 0.5),
        percentile(&back, 0.99),
        percentile(&back, 1.0)
    );
    if devices > 0 {
        // After the failover, the nodes still reporting: kubectl's list of every device, in
        // its pages of 500 (which kubectl asks for at most 5 a second, its client-side limit,
        // whatever the server: 200 pages take 38 s at least) and in one request.
        for (what, args) in [
            ("", &["get", "devices", "-A"][..]),
            (
                " --chunk-size=0",
                &["get", "devices", "-A", "--chunk-size=0"][..],
            ),
        ] {
            let (t, out, ok, req) = kubectl(&replicas[2 % n].kubeconfig, args).await;
            println!(
                "kubectl get devices -A{what} after the run: {} devices in {:.1} s (its HTTP requests {:.1} s){}",
                out.lines().count().saturating_sub(1),
                t / 1000.0,
                req / 1000.0,
                if ok { "" } else { " (failed)" }
            );
        }
    }
    drop(etcd);
    Ok(())
}
