//! The cloud–edge link at a site's scale, with the real release binaries: `cloudcore` (embedded
//! API, device controller, cloudhub) and real gateways (`edgecore` joined by token, its link
//! through a TCP proxy that can cut it), each carrying `--devices` devices of 4 properties, every
//! one of them reporting through KubeEdge's own mapper client (grpcio, `sims/kubeedge_mapper.py
//! load`, KubeEdge's DMI proto) once each `--report-seconds`.
//!
//! ```sh
//! cargo build --release -p edge -p cloud -p hardware-tests
//! cargo run --release -p hardware-tests --bin link-bench -- --devices 20,200,1000,5000
//! cargo run --release -p hardware-tests --bin link-bench -- --devices 1000 --gateways 10 --report-seconds 10
//! cargo run --release -p hardware-tests --bin link-bench -- --devices 1000 --cut-seconds 600
//! ```
//!
//! For each size, measured on gateway 0 (the devices created with kube-rs, 32 requests at once):
//! - apply: from the first create until every device is in the gateway's twin;
//! - report -> DeviceStatus: a value reported for a probe device (beside the load) until the
//!   API's DeviceStatus shows it, `--rounds` times;
//! - patch -> edge: a desired value patched on the probe until the gateway's twin holds it,
//!   while everything reports and again once the reports stopped and the outbox drained;
//! - delete: half the devices deleted until the gateway holds the other half;
//! - the outbox (depth, its oldest change's age), in-flight and resent reports, sampled every
//!   second; cloudcore's and edgecore's CPU and resident memory;
//! - with `--cut-seconds`: the link cut that long while the devices report, then the time from
//!   its return until no change older than the return waits in the outbox.

use anyhow::{Context, Result};
use hardware_tests::bench::{Kill, ar, arg, percentiles, spawn, start_cloud};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

fn obj(v: Value) -> Result<DynamicObject> {
    Ok(serde_json::from_value(v)?)
}

/// A comma-separated list of numbers after `name`.
fn list(name: &str, default: &str) -> Result<Vec<usize>> {
    let argv: Vec<String> = std::env::args().collect();
    let text = match argv.iter().position(|a| a == name) {
        Some(i) => argv.get(i + 1).cloned().unwrap_or_default(),
        None => default.to_string(),
    };
    text.split(',')
        .map(|n| n.trim().parse().with_context(|| format!("{name}: {n:?}")))
        .collect()
}

/// CPU seconds process `pid` used so far (user and system).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, r)| r.split_whitespace().collect());
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (tick(11) + tick(12)) / 100.0
}

/// A gateway: its edgecore, its HTTP API, its DMI socket and its link's proxy.
struct Gateway {
    pid: u32,
    http: String,
    socket: std::path::PathBuf,
    proxy: sim::Proxy,
    dir: std::path::PathBuf,
}

impl Gateway {
    fn get(&self, path: &str) -> Value {
        sim::get(&sim::agent(), &format!("{}{path}", self.http)).1
    }

    fn devices(&self) -> usize {
        self.get("/api/v1/devices").as_array().map_or(0, Vec::len)
    }

    async fn until_devices(&self, n: usize, limit: Duration) -> Result<Duration> {
        let t = Instant::now();
        while self.devices() != n {
            anyhow::ensure!(
                t.elapsed() < limit,
                "the gateway holds {} devices, not {n}",
                self.devices()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(t.elapsed())
    }
}

fn model() -> Value {
    let props: Vec<Value> = (0..4)
        .map(|p| json!({"name": format!("p{p}"), "type": "INT", "accessMode": "ReadWrite"}))
        .collect();
    json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
        "metadata": {"name": "m"}, "spec": {"protocol": "bench", "properties": props}})
}

fn device(name: &str, node: &str) -> Value {
    let props: Vec<Value> = (0..4)
        .map(|p| json!({"name": format!("p{p}"), "reportToCloud": true}))
        .collect();
    json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "deviceModelRef": {"name": "m"},
            "protocol": {"protocolName": "bench"}, "properties": props}})
}

/// The name of device `d` of gateway `g`.
fn name(g: usize, d: usize) -> String {
    format!("g{g}-dev-{d}")
}

/// One value reported for `device` through edgecore's DMI, as a mapper reports it.
async fn report(socket: &Path, device: &str, prop: &str, value: &str) -> Result<()> {
    use api::dmi::v1beta1 as pb;
    let mut client = mapper_sdk::report::client(socket.to_str().context("socket path")?);
    let meta = std::collections::HashMap::from([("type".to_string(), "int".to_string())]);
    client
        .report_device_status(pb::ReportDeviceStatusRequest {
            device_name: device.into(),
            device_namespace: "default".into(),
            reported_device: Some(pb::DeviceStatus {
                twins: vec![pb::Twin {
                    property_name: prop.into(),
                    observed_desired: Some(pb::TwinProperty::default()),
                    reported: Some(pb::TwinProperty {
                        value: value.into(),
                        metadata: meta,
                    }),
                }],
                report_to_cloud: true,
                report_cycle: 0,
            }),
        })
        .await?;
    Ok(())
}

/// `patch -> edge` for `rounds` rounds: a desired value patched on the probe until gateway 0's
/// twin holds it; milliseconds each.
async fn patch_rounds(
    devices: &Api<DynamicObject>,
    gw: &Gateway,
    rounds: usize,
    base: usize,
) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for r in 0..rounds {
        let value = (base + r).to_string();
        let t = Instant::now();
        let patch =
            json!([{"op": "add", "path": "/spec/properties/1/desired", "value": {"value": value}}]);
        devices
            .patch(
                "probe",
                &PatchParams::default(),
                &Patch::<Value>::Json(serde_json::from_value(patch)?),
            )
            .await?;
        loop {
            let twin = gw.get("/api/v1/devices/default/probe");
            if twin["properties"]["p1"]["desired"]["value"] == value.as_str() {
                break;
            }
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(120),
                "desired {value} never reached the edge"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        out.push(t.elapsed().as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(out)
}

fn main() -> Result<()> {
    tokio::runtime::Runtime::new()?.block_on(run())
}

async fn run() -> Result<()> {
    let sizes = list("--devices", "20,200,1000")?;
    let gateways = arg("--gateways", 1)?.max(1);
    let rounds = arg("--rounds", 20)?;
    let every = arg("--report-seconds", 1)?.max(1);
    let cut = arg("--cut-seconds", 0)?;
    hardware_tests::bench::raise_nofile();
    let bins = sim::built_binaries(!cfg!(debug_assertions))?;
    println!(
        "link-bench: {gateways} gateway(s), each device of 4 properties reporting once every {every} s (KubeEdge's grpcio mapper client)"
    );
    for &n in &sizes {
        one(&bins, n, gateways, rounds, every, cut).await?;
    }
    Ok(())
}

async fn one(
    bins: &Path,
    n: usize,
    gateways: usize,
    rounds: usize,
    every: usize,
    cut: usize,
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut kill = Kill(Vec::new());
    let cloud = start_cloud(bins, dir.path(), &mut kill).await?;
    let cloud_pid = kill.0[0].id();
    let mut gws = Vec::new();
    for g in 0..gateways {
        let gdir = dir.path().join(format!("gw-{g}"));
        std::fs::create_dir_all(&gdir)?;
        let proxy = sim::Proxy::start(cloud.hub);
        let http = sim::free_port();
        std::fs::write(
            gdir.join("edgecore.yaml"),
            format!(
                "nodeName: gw-{g}\ndataDir: data\nmodules: {{manifests: false}}\nmqtt: {{mode: embedded, address: \"127.0.0.1:{}\"}}\nhttp: {{address: \"127.0.0.1:{http}\"}}\ndmi: {{socket: dmi.sock}}\ncloud: {{server: \"wss://127.0.0.1:{}\", certServer: \"https://127.0.0.1:{}\", token: \"{}\"}}\n",
                sim::free_port(),
                proxy.port,
                cloud.certs,
                cloud.token.trim()
            ),
        )?;
        let child = spawn(
            &bins.join("edgecore"),
            &["--config", "edgecore.yaml"],
            &gdir,
            "edgecore.log",
        )?;
        let gw = Gateway {
            pid: child.id(),
            http: format!("http://127.0.0.1:{http}"),
            socket: gdir.join("dmi.sock"),
            proxy,
            dir: gdir,
        };
        kill.0.push(child);
        let t = Instant::now();
        while !sim::edgecore_started(&sim::agent(), &gw.http) {
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(60),
                "edgecore gw-{g} did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        gws.push(gw);
    }
    let client = cloud.client.clone();
    let models: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &ar("DeviceModel"));
    let devices: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &ar("Device"));
    let statuses: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &ar("DeviceStatus"));
    models
        .create(&PostParams::default(), &obj(model())?)
        .await?;

    // Apply: every gateway's devices, 32 creates at once; the probe on gateway 0.
    let t_apply = Instant::now();
    devices
        .create(&PostParams::default(), &obj(device("probe", "gw-0"))?)
        .await?;
    let api = devices.clone();
    hardware_tests::bench::run(n * gateways, 32, move |i| {
        let api = api.clone();
        async move {
            let (g, d) = (i / n, i % n);
            api.create(
                &PostParams::default(),
                &obj(device(&name(g, d), &format!("gw-{g}")))?,
            )
            .await?;
            Ok(())
        }
    })
    .await?;
    let created = t_apply.elapsed();
    gws[0]
        .until_devices(n + 1, Duration::from_secs(600))
        .await?;
    for gw in &gws[1..] {
        gw.until_devices(n, Duration::from_secs(600)).await?;
    }
    let applied = t_apply.elapsed();

    // Every device reports.
    for (g, gw) in gws.iter().enumerate() {
        let rate = (n as f64 / every as f64).to_string();
        let script = sim::sims_dir().join("kubeedge_mapper.py");
        let proto = sim::workspace_root().join("api/proto");
        let socket = gw.socket.to_string_lossy().to_string();
        let prefix = format!("g{g}-dev-");
        kill.0.push(spawn(
            &sim::python(),
            &[
                script.to_str().context("path")?,
                "--proto",
                proto.to_str().context("path")?,
                "load",
                "--socket",
                &socket,
                "--prefix",
                &prefix,
                "--devices",
                &n.to_string(),
                "--properties",
                "4",
                "--inflight",
                "16",
                "--rate",
                &rate,
                "--warmup",
                "0",
                "--seconds",
                "100000",
            ],
            &gw.dir,
            "load.log",
        )?);
    }
    // The outbox and link, sampled every second from here on.
    let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(f64, Value)>::new()));
    let sampler = {
        let samples = samples.clone();
        let http = gws[0].http.clone();
        let t0 = Instant::now();
        tokio::task::spawn_blocking(move || {
            let agent = sim::agent();
            while std::sync::Arc::strong_count(&samples) > 1 {
                let st = sim::get(&agent, &format!("{http}/api/v1/status")).1;
                if let Ok(mut s) = samples.lock() {
                    s.push((t0.elapsed().as_secs_f64(), st));
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    let cpu0 = (
        cpu_seconds(cloud_pid),
        cpu_seconds(gws[0].pid),
        Instant::now(),
    );

    // report -> DeviceStatus, while everything reports.
    let mut up = Vec::new();
    for r in 0..rounds {
        let value = format!("{}", 1_000_000 + r);
        let t = Instant::now();
        report(&gws[0].socket, "probe", "p0", &value).await?;
        up.push(hardware_tests::bench::until_reported(&statuses, "probe", "p0", &value, t).await?);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let busy = patch_rounds(&devices, &gws[0], rounds, 100).await?;
    let cpu1 = (
        cpu_seconds(cloud_pid),
        cpu_seconds(gws[0].pid),
        Instant::now(),
    );
    let secs = (cpu1.2 - cpu0.2).as_secs_f64();
    let rss = (
        sim::vm_rss_kb(&cloud_pid.to_string()),
        sim::vm_rss_kb(&gws[0].pid.to_string()),
    );

    // A cut while the devices report; then until nothing older than its end waits.
    let mut drained = None;
    if cut > 0 {
        for gw in &gws {
            gw.proxy.cut();
        }
        tokio::time::sleep(Duration::from_secs(cut as u64)).await;
        let back = Instant::now();
        for gw in &gws {
            gw.proxy.restore();
        }
        loop {
            let st = gws[0].get("/api/v1/status");
            let oldest = st["outboxOldestSeconds"].as_f64().unwrap_or(f64::MAX);
            if st["cloud"] == "connected" && oldest < back.elapsed().as_secs_f64() {
                break;
            }
            anyhow::ensure!(
                back.elapsed() < Duration::from_secs(900),
                "the outbox did not drain: {st}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        drained = Some(back.elapsed());
    }

    // The reports stop (the load processes go), the outbox drains: patch -> edge, settled.
    for c in kill.0.iter_mut().skip(1 + gateways) {
        let _ = c.kill();
        let _ = c.wait();
    }
    let t = Instant::now();
    while gws[0].get("/api/v1/status")["outbox"] != 0 {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(600),
            "the outbox did not drain"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let settled = patch_rounds(&devices, &gws[0], rounds, 500).await?;

    // Delete half of gateway 0's devices.
    let t_delete = Instant::now();
    let api = devices.clone();
    hardware_tests::bench::run(n / 2, 32, move |d| {
        let api = api.clone();
        async move {
            api.delete(&name(0, d), &Default::default()).await?;
            Ok(())
        }
    })
    .await?;
    gws[0]
        .until_devices(n - n / 2 + 1, Duration::from_secs(600))
        .await?;
    let deleted = t_delete.elapsed();
    let seen = std::mem::take(&mut *samples.lock().map_err(|_| anyhow::anyhow!("lock"))?);
    drop(samples);
    let _ = sampler.await;

    let depth_max = seen
        .iter()
        .filter_map(|(_, s)| s["outbox"].as_u64())
        .max()
        .unwrap_or(0);
    let oldest_max = seen
        .iter()
        .filter_map(|(_, s)| s["outboxOldestSeconds"].as_u64())
        .max()
        .unwrap_or(0);
    let resent = seen
        .last()
        .map_or(0, |(_, s)| s["link"]["resent"].as_u64().unwrap_or(0));
    let inflight_max = seen
        .iter()
        .filter_map(|(_, s)| s["link"]["inFlight"].as_u64())
        .max()
        .unwrap_or(0);
    println!(
        "\n{gateways} x {n} devices ({} reports/s offered in all):",
        n * gateways / every
    );
    println!(
        "  apply:                  created in {:.1} s, all on the gateways {:.1} s after the first create",
        created.as_secs_f64(),
        applied.as_secs_f64()
    );
    println!("  report -> DeviceStatus: {}", percentiles(up));
    println!("  patch -> edge (busy):   {}", percentiles(busy));
    println!("  patch -> edge (settled): {}", percentiles(settled));
    println!(
        "  delete {} devices:       on the gateway {:.1} s after the first delete",
        n / 2,
        deleted.as_secs_f64()
    );
    println!(
        "  outbox:                 at most {depth_max} changes, the oldest at most {oldest_max} s old; at most {inflight_max} reports in flight, {resent} sent again"
    );
    if let Some(d) = drained {
        println!(
            "  after a {cut} s cut:       nothing older than the link's return waits {:.1} s after it",
            d.as_secs_f64()
        );
    }
    println!(
        "  CPU while reporting:    cloudcore {:.0}%, edgecore {:.0}% of a core; RSS cloudcore {:.1} MB, edgecore {:.1} MB",
        (cpu1.0 - cpu0.0) / secs * 100.0,
        (cpu1.1 - cpu0.1) / secs * 100.0,
        rss.0 as f64 / 1024.0,
        rss.1 as f64 / 1024.0
    );
    Ok(())
}
