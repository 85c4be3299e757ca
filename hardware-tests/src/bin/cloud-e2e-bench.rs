//! End-to-end latency through the whole stack, with the real binaries:
//!
//! ```sh
//! cargo run --release -p hardware-tests --bin cloud-e2e-bench   # [--rounds 50] [--load-nodes 99]
//! ```
//!
//! `cloudcore` (embedded API, device controller, cloudhub), one real node (`edgecore` joined by
//! token, `mapper-modbus` polling an in-process Modbus simulator every 50 ms) and `--load-nodes`
//! simulated nodes (websocket sessions from this process, each reporting its 10 devices of 10
//! properties once a second: 100 nodes report in all). It measures:
//! - a value changed on the simulator's register until `DeviceStatus` shows it (read through the
//!   API every 10 ms), and
//! - a desired value patched on the Device through the API until the simulator's register holds
//!   it (read every 2 ms),
//!
//! each `--rounds` times, and prints p50, p99 and max.

use anyhow::Result;
use futures_util::SinkExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;
use sim::modbus_sim::Sim;
use std::time::{Duration, Instant};

use hardware_tests::bench::{Kill, ar, create, devices_api, start_cloud};

use hardware_tests::bench::{arg, percentiles};

fn main() -> Result<()> {
    // The simulator runs on a runtime of its own, started outside the bench's.
    let sim = Sim::with(|s| {
        s.holding.insert(0, 1);
        s.holding.insert(1, 1);
    });
    let (sim_port, _sim_rt) = sim.start("127.0.0.1:0")?;
    tokio::runtime::Runtime::new()?.block_on(run(sim, sim_port))
}

async fn run(sim: Sim, sim_port: u16) -> Result<()> {
    let rounds = arg("--rounds", 50)?;
    let load_nodes = arg("--load-nodes", 99)?;
    let bins = sim::built_binaries(!cfg!(debug_assertions))?;
    let dir = tempfile::tempdir()?;
    let (http, mqtt) = (sim::free_port(), sim::free_port());
    let mut kill = Kill(Vec::new());
    let cloud = start_cloud(&bins, dir.path(), &mut kill).await?;
    let client = cloud.client.clone();

    // The load: 10 devices of 10 properties on each simulated node.
    let props: Vec<_> = (0..10)
        .map(|p| json!({"name": format!("p{p}"), "type": "INT", "accessMode": "ReadWrite"}))
        .collect();
    let models = devices_api(&client, "DeviceModel");
    let devices = devices_api(&client, "Device");
    create(
        &models,
        json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
        "metadata": {"name": "load"}, "spec": {"protocol": "modbus", "properties": props}}),
    )
    .await?;
    for n in 0..load_nodes {
        for d in 0..10 {
            let visit: Vec<_> = (0..10).map(|p| json!({"name": format!("p{p}"), "collectCycle": 1000,
                "visitors": {"protocolName": "modbus", "configData": {"register": "HoldingRegister", "offset": p}}})).collect();
            create(&devices, json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
                "metadata": {"name": format!("load-{n:02}-{d}")},
                "spec": {"nodeName": format!("load-{n:02}"), "deviceModelRef": {"name": "load"},
                    "protocol": {"protocolName": "modbus", "configData": {"ip": "127.0.0.1", "port": 1}},
                    "properties": visit}})).await?;
        }
    }
    // The measured device, on the real node.
    create(
        &models,
        json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
        "metadata": {"name": "probe"}, "spec": {"protocol": "modbus", "properties": [
            {"name": "value", "type": "INT", "accessMode": "ReadOnly"},
            {"name": "setpoint", "type": "INT", "accessMode": "ReadWrite"}]}}),
    )
    .await?;
    create(&devices, json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
        "metadata": {"name": "probe"},
        "spec": {"nodeName": "edge-node-1", "deviceModelRef": {"name": "probe"},
            "protocol": {"protocolName": "modbus", "configData": {"ip": "127.0.0.1", "port": sim_port}},
            "properties": [
                {"name": "value", "collectCycle": 50, "reportCycle": 50, "reportToCloud": true,
                 "visitors": {"protocolName": "modbus", "configData": {"register": "HoldingRegister", "offset": 0}}},
                {"name": "setpoint", "collectCycle": 50, "reportCycle": 50, "reportToCloud": true,
                 "desired": {"value": "1"},
                 "visitors": {"protocolName": "modbus", "configData": {"register": "HoldingRegister", "offset": 1}}}]}})).await?;

    std::fs::write(
        dir.path().join("edgecore.yaml"),
        cloud.edge_config(http, mqtt, "", ""),
    )?;
    hardware_tests::bench::start_edge_and_modbus_mapper(&bins, dir.path(), &mut kill).await?;

    // The simulated nodes, reporting.
    let pki = dir.path().join("cloud/pki");
    let (ca_pem, ca_key) = (
        std::fs::read_to_string(pki.join("ca.crt"))?,
        std::fs::read_to_string(pki.join("ca.key"))?,
    );
    for n in 0..load_nodes {
        let name = format!("load-{n:02}");
        let tls = hardware_tests::bench::signed_node_tls(&ca_pem, &ca_key, &name)?;
        let hub = format!("127.0.0.1:{}", cloud.hub);
        tokio::spawn(async move {
            let Ok(mut ws) = hardware_tests::bench::connect_node(&name, &hub, tls).await else {
                return;
            };
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            for version in 1i64.. {
                tick.tick().await;
                for d in 0..10 {
                    let twin: serde_json::Map<String, serde_json::Value> = (0..10).map(|p| (format!("p{p}"), json!({
                        "actual": {"value": version.to_string(), "metadata": {"timestamp": version}},
                        "metadata": {"type": "int"}, "actual_version": {"cloud": 0, "edge": version}}))).collect();
                    let msg = api::message::Message::new(
                        "edgehub",
                        "twin",
                        "update",
                        format!(
                            "node/{name}/device/default/load-{}-{d}/twin/edge_updated",
                            &name[5..]
                        ),
                        json!({"event_id": format!("e{version}"), "timestamp": version, "twin": twin}),
                    );
                    let text = serde_json::to_string(&msg).unwrap_or_default();
                    if ws
                        .send(tokio_tungstenite::tungstenite::Message::text(text))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        });
    }

    let statuses: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &ar("DeviceStatus"));
    use hardware_tests::bench::{reported, until_reported};
    sim::poll::until_async(
        120,
        Duration::from_millis(100),
        "the probe's value in DeviceStatus",
        async || {
            let st = statuses.get_opt("probe").await.ok().flatten()?;
            reported(&st, "value").map(|_| ())
        },
    )
    .await?;
    println!(
        "cloud end to end: 1 real node (edgecore, mapper-modbus polling every 50 ms) and {load_nodes} simulated nodes reporting 10 devices x 10 values each per second"
    );

    let mut up = Vec::new();
    for i in 0..rounds {
        let v = 1000 + i as u16;
        sim.edit(|s| s.holding.insert(0, v));
        let t = Instant::now();
        let ms = until_reported(&statuses, "probe", "value", &v.to_string(), t).await?;
        if ms > 1000.0 && std::env::var("BENCH_VERBOSE").is_ok() {
            for log in ["edgecore.log", "cloudcore.log", "mapper.log"] {
                let text = std::fs::read_to_string(dir.path().join(log)).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(10).collect();
                eprintln!("round {i}: {ms:.0} ms; {log}:\n{}", tail.join("\n"));
            }
        }
        up.push(ms);
    }
    println!("register -> DeviceStatus:      {}", percentiles(up));

    let mut down = Vec::new();
    for i in 0..rounds {
        let v = 500 + i as u16;
        let patch = json!([{"op": "replace", "path": "/spec/properties/1/desired/value", "value": v.to_string()}]);
        let t = Instant::now();
        devices
            .patch(
                "probe",
                &PatchParams::default(),
                &Patch::<()>::Json(serde_json::from_value(patch)?),
            )
            .await?;
        while sim.holding(1) != Some(v) {
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(30),
                "desired {v} never reached the register"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        down.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    println!("desired (API) -> register:     {}", percentiles(down));
    Ok(())
}
