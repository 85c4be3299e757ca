//! Reports through the failover of replicas: three `cloudcore` replicas on a real three-member
//! etcd cluster, simulated edge nodes (TLS websockets with their own certificates, KubeEdge's
//! messages) reporting numbered values of their devices, each node's session on its own
//! replica. `kill -9` of one replica (its nodes go to the next), then every node moving to the
//! next replica, its old session left open and silent for 1.5 s (the replica it leaves then
//! writes the `unknown` state of a node that reports through another): every report a replica acknowledged is in DeviceStatus at the end, and no
//! DeviceStatus ever goes back to an older value (a replica writing on a version another
//! replica wrote since). Skipped, saying so, without the `etcd` binary.

use futures_util::{SinkExt, StreamExt};
use hardware_tests::bench::{NodeSession, connect_node, signed_node_tls};
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use sim::etcd::EtcdCluster;
use sim::stack::Cloud;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message as Frame;

const NODES: usize = 9;
const DEVICES: usize = 4;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the simulated nodes share with the test.
struct Fleet {
    hubs: Vec<String>,
    /// Replicas killed: not tried again.
    dead: Vec<AtomicBool>,
    /// Per node, the replica of its session now (`usize::MAX`: none).
    at: Vec<AtomicUsize>,
    /// Set: every node leaves its session for the next replica, once.
    hop: Vec<AtomicBool>,
    reporting: AtomicBool,
    /// Per device, the highest value a replica acknowledged.
    acked: Mutex<BTreeMap<String, u64>>,
    /// Reports sent, acknowledged.
    sent: AtomicUsize,
    answered: AtomicUsize,
}

fn device_name(node: usize, d: usize) -> String {
    format!("meter-{node}-{d}")
}

/// A node: a session on its replica, its devices' next values every 100 ms, each answer
/// recorded; when the session ends (or the test asks it to move) the next live replica.
async fn node(i: usize, tls: hardware_tests::bench::NodeTls, fleet: Arc<Fleet>) {
    let name = format!("meter-node-{i}");
    let n = fleet.hubs.len();
    let mut at = i % n;
    let mut seq: u64 = 0;
    loop {
        if !fleet.dead[at].load(Ordering::Relaxed)
            && let Ok(mut ws) = connect_node(&name, &fleet.hubs[at], tls.clone()).await
        {
            fleet.at[i].store(at, Ordering::Relaxed);
            let moved = serve(i, &name, &mut ws, &fleet, &mut seq).await;
            fleet.at[i].store(usize::MAX, Ordering::Relaxed);
            if moved {
                // The session it left stays open, silent, for a while: that replica learns
                // that the node is gone only after the node reports through the next one.
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    drop(ws);
                });
            }
        }
        at = (at + 1) % n;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the node left for the next replica (otherwise its session ended).
async fn serve(i: usize, name: &str, ws: &mut NodeSession, fleet: &Fleet, seq: &mut u64) -> bool {
    let mut pending: HashMap<String, (String, u64)> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if fleet.hop[i].swap(false, Ordering::Relaxed) {
                    return true;
                }
                if !fleet.reporting.load(Ordering::Relaxed) {
                    continue;
                }
                *seq += 1;
                for d in 0..DEVICES {
                    let device = device_name(i, d);
                    let v = *seq;
                    let msg = api::message::Message::new(
                        "edgehub",
                        "twin",
                        "update",
                        format!("node/{name}/device/default/{device}/twin/edge_updated"),
                        json!({"event_id": format!("{device}-{v}"), "timestamp": v,
                            "twin": {"count": {"actual": {"value": v.to_string(), "metadata": {"timestamp": v}},
                                "metadata": {"type": "int"}, "actual_version": {"cloud": 0, "edge": v}}}}),
                    );
                    pending.insert(msg.header.id.clone(), (device, v));
                    let text = serde_json::to_string(&msg).unwrap_or_default();
                    if ws.send(Frame::text(text)).await.is_err() {
                        return false;
                    }
                    fleet.sent.fetch_add(1, Ordering::Relaxed);
                }
            }
            f = ws.next() => match f {
                Some(Ok(Frame::Text(t))) => {
                    let Ok(msg) = serde_json::from_str::<api::message::Message>(t.as_str()) else {
                        continue;
                    };
                    if msg.route.operation == "response" {
                        if let Some((device, v)) = pending.remove(&msg.header.parent_id) {
                            fleet.answered.fetch_add(1, Ordering::Relaxed);
                            let mut acked = lock(&fleet.acked);
                            let top = acked.entry(device).or_default();
                            *top = (*top).max(v);
                        }
                    } else if !msg.header.id.is_empty() && msg.route.operation != "error" {
                        // A device or model sent down: acknowledged, as edgehub does.
                        let mut answer = msg.ack();
                        answer.route.source = "edgehub".into();
                        let text = serde_json::to_string(&answer).unwrap_or_default();
                        if ws.send(Frame::text(text)).await.is_err() {
                            return false;
                        }
                    }
                }
                Some(Ok(_)) => {}
                _ => return false,
            },
        }
    }
}

/// The reported value of `count` in a DeviceStatus.
fn count_of(v: &Value) -> Option<u64> {
    v["status"]["twins"]
        .as_array()?
        .iter()
        .find(|t| t["propertyName"] == "count")?["reported"]["value"]
        .as_str()?
        .parse()
        .ok()
}

#[test]
fn every_acknowledged_report_lands_through_a_replica_killed_and_every_node_moving() {
    if !sim::etcd::available() {
        sim::skip("no etcd binary (scripts/test installs Debian's etcd-server)");
        return;
    }
    let etcd = EtcdCluster::start(3).expect("a three-member etcd cluster");
    let endpoints = etcd.endpoints();
    let mut replicas: Vec<Cloud> = (0..3)
        .map(|i| Cloud::start_replica(&endpoints, &format!("replica-{i}")))
        .collect();
    // The fleet's devices, applied with kubectl as a user does.
    let mut yaml = String::from(
        "apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata:\n  name: meter\n  namespace: default\nspec:\n  protocol: modbus\n  properties:\n  - name: count\n    type: INT\n    accessMode: ReadOnly\n",
    );
    for i in 0..NODES {
        for d in 0..DEVICES {
            yaml.push_str(&format!(
                "---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata:\n  name: {}\n  namespace: default\nspec:\n  nodeName: meter-node-{i}\n  deviceModelRef:\n    name: meter\n  protocol:\n    protocolName: modbus\n    configData:\n      ip: 127.0.0.1\n      port: 1\n  properties:\n  - name: count\n    reportToCloud: true\n    visitors:\n      protocolName: modbus\n      configData:\n        register: HoldingRegister\n        offset: 0\n",
                device_name(i, d)
            ));
        }
    }
    replicas[1].apply(&yaml);
    let pki = replicas[0].dir.path().join("data/pki");
    let ca_pem = std::fs::read_to_string(pki.join("ca.crt")).expect("the fleet's CA");
    let ca_key = std::fs::read_to_string(pki.join("ca.key")).expect("the fleet's CA key");
    let fleet = Arc::new(Fleet {
        hubs: replicas
            .iter()
            .map(|r| format!("127.0.0.1:{}", r.hub))
            .collect(),
        dead: (0..3).map(|_| AtomicBool::new(false)).collect(),
        at: (0..NODES).map(|_| AtomicUsize::new(usize::MAX)).collect(),
        hop: (0..NODES).map(|_| AtomicBool::new(false)).collect(),
        reporting: AtomicBool::new(false),
        acked: Mutex::new(BTreeMap::new()),
        sent: AtomicUsize::new(0),
        answered: AtomicUsize::new(0),
    });
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    // Every DeviceStatus change, as replica 2 (never killed) serves them: a value older than
    // one seen before is a write made on a stale version.
    let regressions = Arc::new(Mutex::new(Vec::<String>::new()));
    let latest = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    let client = rt
        .block_on(cloud::cluster_client(&replicas[2].kubeconfig()))
        .expect("a client of replica 2");
    {
        let (regressions, latest) = (regressions.clone(), latest.clone());
        let api =
            Api::<DynamicObject>::all_with(client, &hardware_tests::bench::ar("DeviceStatus"));
        rt.spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .applied_objects()
                .boxed();
            while let Some(ev) = events.next().await {
                let Ok(o) = ev else { continue };
                let Ok(v) = serde_json::to_value(&o) else {
                    continue;
                };
                let (Some(name), Some(count)) = (v["metadata"]["name"].as_str(), count_of(&v))
                else {
                    continue;
                };
                let mut latest = lock(&latest);
                let before = latest.insert(name.to_string(), count).unwrap_or(0);
                if count < before {
                    lock(&regressions).push(format!("{name}: {before} then {count}"));
                    latest.insert(name.to_string(), before);
                }
            }
        });
    }
    for i in 0..NODES {
        let tls = signed_node_tls(&ca_pem, &ca_key, &format!("meter-node-{i}"))
            .expect("a node certificate");
        rt.spawn(node(i, tls, fleet.clone()));
    }
    let up = |fleet: &Fleet| {
        fleet
            .at
            .iter()
            .filter(|a| a.load(Ordering::Relaxed) != usize::MAX)
            .count()
    };
    sim::eventually(60, "every node's session", || {
        (up(&fleet) == NODES).then_some(())
    });
    fleet.reporting.store(true, Ordering::Relaxed);
    sim::eventually(60, "every device reported through its replica", || {
        (lock(&fleet.acked).len() == NODES * DEVICES).then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));

    // kill -9 of replica 0: its nodes go to replica 1.
    fleet.dead[0].store(true, Ordering::Relaxed);
    replicas[0].kill9();
    std::thread::sleep(Duration::from_secs(3));
    sim::eventually(60, "every node's session again", || {
        (up(&fleet) == NODES).then_some(())
    });
    // Every node leaves its replica for the next while that one runs on.
    for h in &fleet.hop {
        h.store(true, Ordering::Relaxed);
    }
    std::thread::sleep(Duration::from_secs(3));
    sim::eventually(60, "every node's session after the move", || {
        (up(&fleet) == NODES).then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    fleet.reporting.store(false, Ordering::Relaxed);

    let acked = lock(&fleet.acked).clone();
    eprintln!(
        "{} reports sent, {} acknowledged; the last acknowledged per device: {:?}",
        fleet.sent.load(Ordering::Relaxed),
        fleet.answered.load(Ordering::Relaxed),
        acked.values().collect::<Vec<_>>()
    );
    sim::eventually(60, "every acknowledged value in DeviceStatus", || {
        let latest = lock(&latest);
        acked
            .iter()
            .all(|(d, v)| latest.get(d).is_some_and(|l| l >= v))
            .then_some(())
    });
    // As kubectl reads it too, from a replica that lived through it all.
    let out = replicas[1].ok(&["get", "devicestatus", "-o", "json"]);
    let list: Value = serde_json::from_str(&out).expect("a list");
    for item in list["items"].as_array().expect("items") {
        let name = item["metadata"]["name"].as_str().unwrap_or_default();
        if let Some(want) = acked.get(name) {
            let have = count_of(item).unwrap_or(0);
            assert!(have >= *want, "{name}: acknowledged {want}, stored {have}");
        }
    }
    let regressions = lock(&regressions).clone();
    assert!(
        regressions.is_empty(),
        "DeviceStatus went back to older values: {regressions:?}"
    );
    drop(etcd);
}
