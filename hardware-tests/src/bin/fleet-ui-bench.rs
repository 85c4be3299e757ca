//! Figures of the fleet's page (printed; see docs/benchmarks.md), in Debian's chromium through
//! chromedriver against the release `cloudcore` (embedded API, device controller): N devices of
//! 3 properties (their DeviceStatus made by the controller), the page open on the device list
//! as the admin. Every byte the API sends the browser goes through a counting proxy: the bytes
//! per minute with nothing changing, then with R DeviceStatus writes a second (each a new
//! reported value of one device, round robin, as the device controller writes what edges
//! report). Also the time from navigation to the whole list.
//!
//! `cargo run --release -p hardware-tests --bin fleet-ui-bench [-- --devices 1000 --rate 200 --seconds 30]`

use anyhow::{Context, Result};
use hardware_tests::bench::{ar, arg, run, start_server};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use sim::browser::{browser, chromedriver, submit, wait_text};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A TCP proxy to `upstream` counting the bytes it passes back (server to browser).
async fn counting_proxy(upstream: u16, down: Arc<AtomicU64>) -> Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let down = down.clone();
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    return;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let up = tokio::spawn(async move { tokio::io::copy(&mut cr, &mut sw).await });
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let n = match sr.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    down.fetch_add(n as u64, Ordering::Relaxed);
                    if cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                up.abort();
            });
        }
    });
    Ok(port)
}

/// Bytes passed back during `secs`, per minute.
async fn per_minute(down: &AtomicU64, secs: u64) -> u64 {
    let before = down.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(secs)).await;
    (down.load(Ordering::Relaxed) - before) * 60 / secs.max(1)
}

#[tokio::main]
async fn main() -> Result<()> {
    let n = arg("--devices", 1000)?;
    let rate = arg("--rate", 200)? as u64;
    let secs = arg("--seconds", 30)? as u64;
    let driver = chromedriver().context("chromium and chromedriver are needed")?;
    let server = start_server("")?;
    let client = cloud::cluster_client(&server.kubeconfig).await?;
    let token = std::fs::read_to_string(server.data_dir().join("tokens.csv"))?
        .split(',')
        .next()
        .unwrap_or_default()
        .to_string();
    let models: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &ar("DeviceModel"));
    models
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "devices.kubeedge.io/v1beta1",
                "kind": "DeviceModel", "metadata": {"name": "meter"},
                "spec": {"protocol": "modbus", "properties": [
                    {"name": "power", "type": "FLOAT", "unit": "kW", "accessMode": "ReadOnly"},
                    {"name": "energy", "type": "FLOAT", "unit": "kWh", "accessMode": "ReadOnly"},
                    {"name": "limit", "type": "INT", "accessMode": "ReadWrite"}]}}))?,
        )
        .await?;
    let devices: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &ar("Device"));
    run(n, 16, move |i| {
        let d = devices.clone();
        async move {
            let props: Vec<serde_json::Value> = ["power", "energy", "limit"]
                .iter()
                .enumerate()
                .map(|(o, p)| json!({"name": p, "visitors": {"protocolName": "modbus",
                    "configData": {"register": "HoldingRegister", "offset": o}}}))
                .collect();
            let obj: DynamicObject = serde_json::from_value(json!({"apiVersion": "devices.kubeedge.io/v1beta1",
                "kind": "Device", "metadata": {"name": format!("d{i:04}")},
                "spec": {"deviceModelRef": {"name": "meter"}, "nodeName": format!("edge-{}", i % 10),
                    "protocol": {"protocolName": "modbus", "configData": {"ip": "10.0.0.1", "port": 502}},
                    "properties": props}}))?;
            d.create(&PostParams::default(), &obj).await?;
            Ok(())
        }
    })
    .await?;
    let statuses: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &ar("DeviceStatus"));
    let t0 = Instant::now();
    while statuses.list(&ListParams::default()).await?.items.len() < n {
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(120),
            "the device controller did not make every DeviceStatus"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let down = Arc::new(AtomicU64::new(0));
    let proxy = counting_proxy(server.api, down.clone()).await?;
    let c = browser(&driver).await;
    let ui = format!("https://127.0.0.1:{proxy}/ui");
    c.goto(&ui).await?;
    submit(&c, "#token", "#login button", &token).await;
    c.goto(&format!("{ui}#/devices")).await?;
    let whole = format!("of {n} devices ({n} in all)");
    wait_text(&c, "#device-count", 120, "the whole list", |t| {
        t.ends_with(&whole)
    })
    .await;
    let mut loads = Vec::new();
    for _ in 0..3 {
        c.goto("about:blank").await?;
        c.goto(&format!("{ui}#/devices")).await?;
        wait_text(&c, "#device-count", 120, "the whole list", |t| {
            t.ends_with(&whole)
        })
        .await;
        if let Ok(v) = c.execute("return performance.now()", vec![]).await {
            loads.push(v.as_f64().unwrap_or(0.0));
        }
    }
    loads.sort_by(f64::total_cmp);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = per_minute(&down, secs).await;

    // R new reported values a second, one device after the other.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, sent) = (stop.clone(), sent.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let gate = Arc::new(tokio::sync::Semaphore::new(32));
            let mut k: u64 = 0;
            while !stop.load(Ordering::Relaxed) {
                let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
                while k < due {
                    let Ok(permit) = gate.clone().acquire_owned().await else {
                        return;
                    };
                    let (st, sent) = (statuses.clone(), sent.clone());
                    let name = format!("d{:04}", k % n as u64);
                    let value = format!("{}.{}", k / n as u64, k % 10);
                    tokio::spawn(async move {
                        let patch = json!({"status": {"state": "online", "twins": [
                            {"propertyName": "power", "reported": {"value": value,
                                "metadata": {"timestamp": chrono_ms()}}}]}});
                        if st
                            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await
                            .is_ok()
                        {
                            sent.fetch_add(1, Ordering::Relaxed);
                        }
                        drop(permit);
                    });
                    k += 1;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = sent.load(Ordering::Relaxed);
    let busy = per_minute(&down, secs).await;
    let written = (sent.load(Ordering::Relaxed) - before) / secs.max(1);
    stop.store(true, Ordering::Relaxed);
    let _ = writer.await;
    let shown = wait_text(&c, "#device-count", 10, "the list", |_| true).await;
    let _ = c.close().await;

    println!("| figure ({n} devices, the page on the device list) | value |");
    println!("|---|---|");
    println!(
        "| page load to the whole list (median of 3) | {:.0} ms |",
        loads.get(1).copied().unwrap_or_default()
    );
    println!(
        "| bytes per minute, nothing changing | {} KB |",
        idle / 1000
    );
    println!(
        "| bytes per minute, {written} DeviceStatus writes/s (asked {rate}) | {} KB |",
        busy / 1000
    );
    println!("(the page at the end: {shown:?})");
    Ok(())
}

/// Now as milliseconds since the epoch, the twin metadata's timestamp.
fn chrono_ms() -> String {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default()
        .to_string()
}
