//! Figures of the device controller, against the real `cloudcore` (release build, beside this
//! program) over HTTPS:
//!
//! ```sh
//! cargo build --release -p cloud && target/release/devicecontroller-bench [--devices 10000] [--nodes 100] [--values-per-sec 20000] [--seconds 10]
//! ```
//!
//! 1. Start-up: `--devices` devices (10 properties each) on `--nodes` nodes are stored, then
//!    cloudcore is restarted with its device controller on; the time until every node's
//!    messages and profile ConfigMap are out, until every DeviceStatus exists, and cloudcore's
//!    resident memory then.
//! 2. Reports: a controller in this process (cloudcore's own off again) takes reports of whole
//!    devices (10 values each) from `--nodes` simulated nodes at `--values-per-sec`; the values/s
//!    stored, the patches/s they took, and the latency from a report to its answer (sent once
//!    its patch is stored): p50, p99, max.

use anyhow::{Context, Result};
use api::bus::MemoryHub;
use api::message::Message;
use devicecontroller::controller;
use hardware_tests::bench::{ar, metric, rss_kib, run, scrape, start_server};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const PROPS: usize = 10;

use hardware_tests::bench::arg;

#[tokio::main]
async fn main() -> Result<()> {
    let devices = arg("--devices", 10_000)?;
    let nodes = arg("--nodes", 100)?.max(1);
    let rate = arg("--values-per-sec", 20_000)?;
    let seconds = arg("--seconds", 10)?;
    let off = "  deviceController:\n    enable: false\n";
    let mut server = start_server(off)?;
    let client = cloud::cluster_client(&server.kubeconfig).await?;
    let models: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &ar("DeviceModel"));
    let props: Vec<serde_json::Value> = (0..PROPS)
        .map(|p| json!({"name": format!("p{p}"), "type": "INT", "accessMode": "ReadWrite"}))
        .collect();
    for m in 0..10 {
        let obj: DynamicObject =
            serde_json::from_value(json!({"apiVersion": "devices.kubeedge.io/v1beta1",
            "kind": "DeviceModel", "metadata": {"name": format!("model-{m}")},
            "spec": {"protocol": "modbus", "properties": props}}))?;
        models.create(&PostParams::default(), &obj).await?;
    }
    let dapi: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar("Device"));
    let d2 = dapi.clone();
    run(devices, 32, move |i| {
        let d = d2.clone();
        async move {
            let visit: Vec<serde_json::Value> = (0..PROPS)
                .map(|p| json!({"name": format!("p{p}"), "collectCycle": 1000,
                    "visitors": {"protocolName": "modbus", "configData": {"register": "HoldingRegister", "offset": p}}}))
                .collect();
            let obj: DynamicObject = serde_json::from_value(json!({"apiVersion": "devices.kubeedge.io/v1beta1",
                "kind": "Device", "metadata": {"name": format!("dev-{i:05}")},
                "spec": {"deviceModelRef": {"name": format!("model-{}", i % 10)}, "nodeName": format!("node-{:03}", i % nodes),
                    "protocol": {"protocolName": "modbus", "configData": {"ip": "10.0.0.1", "port": 502}},
                    "properties": visit}}))?;
            d.create(&PostParams::default(), &obj).await?;
            Ok(())
        }
    })
    .await?;
    println!("device controller, {devices} devices of {PROPS} properties on {nodes} nodes");
    tokio::time::sleep(Duration::from_secs(6)).await;
    println!(
        "resident memory of cloudcore with the objects stored, controller off: {:.1} MB",
        rss_kib(server.child.id()) as f64 / 1024.0
    );

    // 1. Start-up with the controller on.
    let started = Instant::now();
    // BENCH_MODULES: YAML under `modules` for this start (e.g. to turn profiles off).
    server.restart(&std::env::var("BENCH_MODULES").unwrap_or_default())?;
    let statuses: Api<DynamicObject> = Api::namespaced_with(
        cloud::cluster_client(&server.kubeconfig).await?,
        "default",
        &ar("DeviceStatus"),
    );
    let mut out_at = None;
    let all_at;
    loop {
        let m = scrape(&server.metrics).await.unwrap_or_default();
        if out_at.is_none()
            && metric(&m, "devicecontroller_devices ") as usize == devices
            && (metric(&m, "devicecontroller_profiles_written_total ") as usize >= nodes
                || std::env::var("BENCH_MODULES").is_ok_and(|m| m.contains("profiles: false")))
        {
            out_at = Some((
                started.elapsed(),
                metric(&m, "devicecontroller_reconcile_seconds "),
                // Waiting for their nodes: in cloudhub until acknowledged (none of these
                // nodes connects), or without cloudhub in memory.
                metric(&m, "cloudhub_pending_acks ")
                    + metric(&m, "cloudcore_node_messages_pending "),
            ));
        }
        if out_at.is_some() {
            let n = statuses
                .list_metadata(&ListParams::default())
                .await?
                .items
                .len();
            if n >= devices {
                all_at = started.elapsed();
                break;
            }
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(300),
            "start-up did not finish"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (out, reconcile, pending) = out_at.context("no start-up figure")?;
    println!(
        "start-up:  messages and {nodes} profile ConfigMaps out {:.2} s after the restart (list to messages {:.2} s; {pending} messages queued); every DeviceStatus made after {:.2} s",
        out.as_secs_f64(),
        reconcile,
        all_at.as_secs_f64()
    );
    let peak = rss_kib(server.child.id());
    // cloudcore hands freed memory back every 5 s.
    tokio::time::sleep(Duration::from_secs(6)).await;
    if std::env::var("BENCH_SMAPS").is_ok() {
        let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", server.child.id()))
            .unwrap_or_default();
        let mut cur = String::new();
        let mut maps: Vec<(u64, String)> = Vec::new();
        for l in smaps.lines() {
            if l.contains('-') && !l.starts_with(|c: char| c.is_ascii_uppercase()) {
                cur = l.to_string();
            } else if let Some(r) = l.strip_prefix("Rss:") {
                let kb: u64 = r.trim().trim_end_matches(" kB").trim().parse().unwrap_or(0);
                maps.push((kb, cur.clone()));
            }
        }
        maps.sort();
        for (kb, m) in maps.iter().rev().take(8) {
            eprintln!("{kb:>8} kB {m}");
        }
    }
    println!(
        "resident memory of cloudcore: {:.1} MB right after, {:.1} MB 6 s later",
        peak as f64 / 1024.0,
        rss_kib(server.child.id()) as f64 / 1024.0
    );

    // 2. Reports through a controller in this process.
    server.restart(off)?;
    let client = cloud::cluster_client(&server.kubeconfig).await?;
    let hub = Arc::new(MemoryHub::new(1_000_000));
    let stop = CancellationToken::new();
    let ctl = controller::start(
        client,
        hub.clone(),
        controller::Config::default(),
        stop.clone(),
    );
    while metric(&ctl.metrics.render(), "devicecontroller_devices ") as usize != devices {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    hub.take();
    let reports_per_sec = (rate / PROPS).max(1);
    let sent: Arc<std::sync::Mutex<HashMap<String, Instant>>> = Arc::default();
    let t0 = Instant::now();
    let patches0 = metric(
        &ctl.metrics.render(),
        "devicecontroller_status_patches_total ",
    );
    let mut senders = Vec::new();
    for n in 0..nodes {
        let tx = ctl.upstream.clone();
        let sent = sent.clone();
        let per_node = reports_per_sec / nodes + usize::from(n < reports_per_sec % nodes);
        senders.push(tokio::spawn(async move {
            if per_node == 0 {
                return;
            }
            let node = format!("node-{n:03}");
            let mine: Vec<usize> = (0..devices).filter(|i| i % nodes == n).collect();
            let every = Duration::from_secs_f64(1.0 / per_node as f64);
            let mut tick = tokio::time::interval(every);
            let mut k = 0u64;
            while t0.elapsed() < Duration::from_secs(seconds as u64) {
                tick.tick().await;
                k += 1;
                let dev = mine[(k as usize) % mine.len()];
                let ts = api::message::now_millis();
                let twin: serde_json::Map<String, serde_json::Value> = (0..PROPS)
                    .map(|p| (format!("p{p}"), json!({"actual": {"value": (k + p as u64).to_string(), "metadata": {"timestamp": ts}},
                        "metadata": {"type": "int"}, "actual_version": {"cloud": 0, "edge": k}})))
                    .collect();
                let msg = Message::new("edgehub", "twin", "update",
                    format!("node/{node}/device/default/dev-{dev:05}/twin/edge_updated"),
                    json!({"event_id": k.to_string(), "timestamp": ts, "twin": twin}));
                sent.lock().unwrap_or_else(|e| e.into_inner()).insert(msg.header.id.clone(), Instant::now());
                if tx.send((node.clone(), msg)).await.is_err() {
                    return;
                }
            }
        }));
    }
    let mut lat = Vec::new();
    let mut answered = 0usize;
    let deadline = Duration::from_secs(seconds as u64 + 10);
    loop {
        for (_, msgs) in hub.take() {
            for o in msgs {
                if o.message.route.operation != "response" {
                    continue;
                }
                if let Some(at) = sent
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&o.message.header.parent_id)
                {
                    lat.push(at.elapsed());
                    answered += 1;
                }
            }
        }
        let left = sent.lock().unwrap_or_else(|e| e.into_inner()).len();
        if (t0.elapsed() > Duration::from_secs(seconds as u64) && left == 0)
            || t0.elapsed() > deadline
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = t0.elapsed().as_secs_f64().min(seconds as f64 + 10.0);
    let patches = metric(
        &ctl.metrics.render(),
        "devicecontroller_status_patches_total ",
    ) - patches0;
    lat.sort();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map(|d| d.as_secs_f64() * 1000.0)
            .unwrap_or(0.0)
    };
    println!(
        "reports:   {:.0} values/s stored of {rate} offered ({answered} reports of {PROPS} values in {:.1} s), {:.0} patches/s; report to answer p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        (answered * PROPS) as f64 / took,
        took,
        patches / took,
        pct(0.5),
        pct(0.99),
        lat.last().map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0)
    );
    stop.cancel();
    for s in senders {
        s.abort();
    }
    Ok(())
}
