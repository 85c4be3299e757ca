//! Figures of the embedded API, measured as users meet it: the real `cloudcore` binary (from the
//! same directory as this program) on a fresh data directory, driven over HTTPS by kube-rs
//! clients in this process.
//!
//! ```sh
//! cargo build --release -p cloud && target/release/cloud-bench [--objects 10000] [--concurrency 32] [--watchers 100] [--etcd http://127.0.0.1:2379,...]
//! ```
//!
//! `--etcd`: the embedded API on that etcd (a fresh key prefix) instead of SQLite.
//!
//! Prints: creates/s and JSON-merge-patches/s of Device objects from concurrent clients; a list
//! of every device (time, bytes); watch fan-out (events/s delivered to the watchers); the
//! server's resident memory idle, and with the devices and as many models stored.

use anyhow::{Context, Result};
use api::v1beta1::{Device, DeviceModel, DeviceModelSpec, DeviceSpec};
use futures_util::StreamExt;
use hardware_tests::bench::{rss_kib, run};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

struct Args {
    objects: usize,
    concurrency: usize,
    watchers: usize,
    etcd: Option<String>,
}

fn args() -> Result<Args> {
    let mut a = Args {
        objects: 10_000,
        concurrency: 32,
        watchers: 100,
        etcd: None,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        if argv[i] == "--etcd" {
            a.etcd = Some(
                argv.get(i + 1)
                    .context("--etcd needs the members' URLs")?
                    .clone(),
            );
            i += 2;
            continue;
        }
        let v = argv
            .get(i + 1)
            .with_context(|| format!("{} needs a value", argv[i]))?
            .parse::<usize>()
            .with_context(|| format!("{} needs a number", argv[i]))?;
        match argv[i].as_str() {
            "--objects" => a.objects = v,
            "--concurrency" => a.concurrency = v.max(1),
            "--watchers" => a.watchers = v,
            other => anyhow::bail!("unknown argument {other}"),
        }
        i += 2;
    }
    Ok(a)
}

fn device(i: usize) -> Device {
    let mut d = Device::new(
        &format!("dev-{i:05}"),
        DeviceSpec {
            node_name: Some(format!("node-{}", i % 10)),
            ..DeviceSpec::default()
        },
    );
    d.spec.device_model_ref = Some(api::v1beta1::DeviceModelRef {
        name: format!("model-{i:05}"),
    });
    d
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = args()?;
    let store = match &a.etcd {
        Some(urls) => format!(
            "    etcd:\n      endpoints: [{urls}]\n      prefix: /bench-{}/\n",
            std::process::id()
        ),
        None => String::new(),
    };
    let server =
        hardware_tests::bench::start_server_on("  deviceController:\n    enable: false\n", &store)?;
    let pid = server.child.id();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = rss_kib(pid);
    let client = cloud::cluster_client(&server.kubeconfig).await?;
    let devices: Api<Device> = Api::namespaced(client.clone(), "default");
    let models: Api<DeviceModel> = Api::namespaced(client.clone(), "default");
    println!(
        "cloudcore embedded API on {}, {} objects, {} concurrent kube-rs clients over HTTPS",
        if a.etcd.is_some() { "etcd" } else { "SQLite" },
        a.objects,
        a.concurrency
    );
    let d2 = devices.clone();
    let creates = run(a.objects, a.concurrency, move |i| {
        let d = d2.clone();
        async move {
            d.create(&PostParams::default(), &device(i)).await?;
            Ok(())
        }
    })
    .await?;
    println!("creates:        {creates:>9.0} Device/s");
    let d2 = devices.clone();
    let patches = run(a.objects, a.concurrency, move |i| {
        let d = d2.clone();
        async move {
            let p = json!({"metadata": {"labels": {"batch": format!("b{}", i % 7)}}, "spec": {"nodeName": format!("node-{}", i % 13)}});
            d.patch(&format!("dev-{i:05}"), &PatchParams::default(), &Patch::Merge(&p))
                .await?;
            Ok(())
        }
    })
    .await?;
    println!("merge patches:  {patches:>9.0} Device/s");
    // A list of every device, as raw bytes (what a client receives).
    let started = Instant::now();
    let req = http::Request::get("/apis/devices.kubeedge.io/v1beta1/devices").body(Vec::new())?;
    let text = client.request_text(req).await?;
    let list_time = started.elapsed();
    println!(
        "list all:       {:>9.1} ms, {:.1} MB ({} devices)",
        list_time.as_secs_f64() * 1000.0,
        text.len() as f64 / 1e6,
        a.objects
    );
    // In pages of 500, as kubectl reads a list (`kubectl get devices -A`).
    let started = Instant::now();
    let (mut pages, mut items) = (0, 0);
    let mut lp = ListParams::default().limit(500);
    loop {
        let page = devices.list_metadata(&lp).await?;
        pages += 1;
        items += page.items.len();
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    println!(
        "list in pages:  {:>9.1} ms ({pages} pages of 500, {items} devices)",
        started.elapsed().as_secs_f64() * 1000.0
    );
    let started = Instant::now();
    let typed = devices.list(&ListParams::default()).await?;
    println!(
        "list all typed: {:>9.1} ms (kube-rs decoding {} Device objects)",
        started.elapsed().as_secs_f64() * 1000.0,
        typed.items.len()
    );
    // Watch fan-out: every watcher sees every patch.
    let rv = typed.metadata.resource_version.clone().unwrap_or_default();
    let changes = 1000.min(a.objects);
    let delivered = Arc::new(AtomicUsize::new(0));
    let mut watchers = Vec::new();
    for _ in 0..a.watchers {
        let mut s = devices.watch(&WatchParams::default(), &rv).await?.boxed();
        let delivered = delivered.clone();
        watchers.push(tokio::spawn(async move {
            let mut n = 0;
            while let Some(e) = s.next().await {
                if let Ok(WatchEvent::Modified(_)) = e {
                    n += 1;
                    delivered.fetch_add(1, Ordering::Relaxed);
                    if n == changes {
                        return;
                    }
                }
            }
        }));
    }
    let started = Instant::now();
    let d2 = devices.clone();
    run(changes, a.concurrency, move |i| {
        let d = d2.clone();
        async move {
            let p = json!({"metadata": {"annotations": {"fan": i.to_string()}}});
            d.patch(
                &format!("dev-{i:05}"),
                &PatchParams::default(),
                &Patch::Merge(&p),
            )
            .await?;
            Ok(())
        }
    })
    .await?;
    for w in watchers {
        let _ = tokio::time::timeout(Duration::from_secs(120), w).await;
    }
    let took = started.elapsed().as_secs_f64();
    let got = delivered.load(Ordering::Relaxed);
    println!(
        "watch fan-out:  {:>9.0} events/s delivered ({} watchers x {} changes = {} of {} events in {:.2} s)",
        got as f64 / took,
        a.watchers,
        changes,
        got,
        a.watchers * changes,
        took
    );
    let m2 = models.clone();
    run(a.objects, a.concurrency, move |i| {
        let m = m2.clone();
        async move {
            let model = DeviceModel::new(
                &format!("model-{i:05}"),
                DeviceModelSpec {
                    protocol: Some("modbus".into()),
                    ..DeviceModelSpec::default()
                },
            );
            m.create(&PostParams::default(), &model).await?;
            Ok(())
        }
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!(
        "resident memory: {:.1} MB idle, {:.1} MB with {} devices and {} models stored",
        idle as f64 / 1024.0,
        rss_kib(pid) as f64 / 1024.0,
        a.objects,
        a.objects
    );
    Ok(())
}
