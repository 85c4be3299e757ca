//! The cloud–edge link at a real site's scale, with the real binaries: `cloudcore` on its
//! embedded API, one real `edgecore` joined by token, the real `kubectl`, and KubeEdge's own
//! mapper client (grpcio, KubeEdge's DMI proto) reporting for the devices.
//!
//! - A gateway carrying 1,000 devices of 4 properties, every one of them reporting: what the
//!   cloud says still lands (the devices applied, a desired value patched, half of them
//!   deleted), reports reach DeviceStatus, history answers, and the outbox drains. (It
//!   livelocked at about 200 devices: the outbox went through the rate limiter in one batch
//!   while the cloud's frames waited, and entries were sent again before they had left.)
//! - A gateway that goes silent without closing its connection (a frozen edgecore, a link that
//!   stops carrying bytes) is NotReady, its devices `unknown` with the reason, within
//!   `keepaliveSeconds` and a margin; thawed or unblocked, Ready and `online` again.
//!
//! The figures (how fast, at what cost) are `link-bench`'s, in docs/benchmarks.md.

use serde_json::Value;
use sim::poll::eventually_or;
use sim::stack::{Cloud, oven_manifest};
use sim::{Node, Proc, Proxy, PyModbus, eventually, free_port, write_holdings};
use std::time::{Duration, Instant};

const NODE: &str = "edge-node-1";

/// The devices the node's twin holds.
fn edge_devices(node: &Node) -> Option<usize> {
    let (status, v) = node.get("/api/v1/devices");
    (status == 200).then(|| v.as_array().map_or(0, Vec::len))
}

/// KubeEdge's mapper client (`sims/kubeedge_mapper.py load`) reporting 4 values of each of
/// `devices` devices, `rate` reports a second in all, for `seconds`.
fn reporting(node: &Node, devices: usize, rate: usize, seconds: u64) -> Proc {
    Proc::spawn(
        &sim::python(),
        &[
            sim::sims_dir()
                .join("kubeedge_mapper.py")
                .to_str()
                .expect("path"),
            "--proto",
            sim::workspace_root()
                .join("api/proto")
                .to_str()
                .expect("path"),
            "load",
            "--socket",
            node.socket.to_str().expect("path"),
            "--devices",
            &devices.to_string(),
            "--properties",
            "4",
            "--inflight",
            "8",
            "--rate",
            &rate.to_string(),
            "--warmup",
            "0",
            "--seconds",
            &seconds.to_string(),
        ],
        node.dir.path(),
        "grpcio-load.log",
    )
}

fn desired(twin: &Value, prop: &str) -> Option<String> {
    twin["properties"][prop]["desired"]["value"]
        .as_str()
        .map(str::to_string)
}

#[test]
fn a_gateway_with_1000_reporting_devices_applies_what_the_cloud_says() {
    const N: usize = 1000;
    let cloud = Cloud::start();
    let bins = sim::bin_dir();
    let node = Node::start_named(&bins, NODE, "", &cloud.edge_config());
    eventually(30, "the node Ready", || {
        cloud
            .ok(&["get", "nodes", "--no-headers"])
            .contains(" Ready")
            .then_some(())
    });
    let file = cloud.dir.path().join("fleet.yaml");
    std::fs::write(&file, sim::bench_manifests_on(N, 4, Some(NODE))).expect("manifest");
    let started = Instant::now();
    cloud.ok(&["create", "-f", file.to_str().expect("path")]);
    eventually_or(180, "every device on the edge", || {
        match edge_devices(&node) {
            Some(n) if n == N => Ok(()),
            seen => Err(format!("{seen:?} of {N}")),
        }
    });
    eprintln!(
        "applied: {N} devices on the edge {:?} after kubectl create began",
        started.elapsed()
    );

    // Every device reports, all the time: each once every 4 s (the test's machine is 2 busy
    // cores; link-bench runs every device once a second).
    let _load = reporting(&node, N, N / 4, 900);
    for d in [0, N / 2, N - 1] {
        let name = format!("dev-{d}");
        eventually_or(120, &format!("{name}'s reports in DeviceStatus"), || {
            let st = cloud.status(&name);
            sim::stack::reported(&st, "p3")
                .map(|_| ())
                .ok_or_else(|| st["status"].to_string())
        });
    }
    // The outbox keeps moving: it never holds more than the devices' properties, and what it
    // holds is recent.
    let (_, status) = node.get("/api/v1/status");
    eprintln!("while reporting: {status}");

    // A desired value patched with kubectl reaches the edge's twin while everything reports.
    for (round, d) in [7usize, 512, 999].into_iter().enumerate() {
        let name = format!("dev-{d}");
        let value = (40 + round).to_string();
        let t = Instant::now();
        cloud.set_desired(&name, 1, &value);
        eventually_or(60, &format!("{name}'s desired p1 on the edge"), || {
            let twin = node.twin(&format!("default/{name}")).unwrap_or_default();
            match desired(&twin, "p1") {
                Some(v) if v == value => Ok(()),
                v => Err(format!("{v:?}")),
            }
        });
        eprintln!("patch -> edge: {name} {:?}", t.elapsed());
    }

    // History through the cloud, from the gateway that keeps it.
    let history = cloud.ok(&[
        "get",
        "--raw",
        "/apis/devices.kubeedge.io/v1beta1/namespaces/default/devices/dev-3/history?property=p0",
    ]);
    let h: Value = serde_json::from_str(&history).expect("history is JSON");
    assert!(h.is_object(), "{history}");

    // Half of the devices deleted with kubectl: gone from the edge. kubectl sends at most 5
    // requests a second once past its burst (its own client-side throttling), so ten of them
    // delete 50 each.
    let t = Instant::now();
    std::thread::scope(|s| {
        for k in 0..10 {
            let cloud = &cloud;
            s.spawn(move || {
                let names: Vec<String> = (N / 2 + k * N / 20..N / 2 + (k + 1) * N / 20)
                    .map(|d| format!("dev-{d}"))
                    .collect();
                let mut args = vec!["delete", "devices", "--wait=false"];
                args.extend(names.iter().map(String::as_str));
                cloud.ok(&args);
            });
        }
    });
    eprintln!(
        "kubectl delete of {} devices returned after {:?}",
        N / 2,
        t.elapsed()
    );
    eventually_or(
        120,
        "half the devices gone from the edge",
        || match edge_devices(&node) {
            Some(n) if n == N / 2 => Ok(()),
            seen => Err(format!("{seen:?}, want {}", N / 2)),
        },
    );
    eprintln!(
        "delete: {} devices gone from the edge in {:?}",
        N / 2,
        t.elapsed()
    );

    // The reports stop: the outbox drains to nothing, and the last values are in the cloud.
    drop(_load);
    eventually_or(120, "the outbox drained", || {
        let (_, st) = node.get("/api/v1/status");
        (st["outbox"] == 0)
            .then_some(())
            .ok_or_else(|| st.to_string())
    });
    let (_, metrics) = node.get("/metrics");
    eprintln!(
        "{}",
        metrics
            .as_str()
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("edgecore_cloud"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The oven (pymodbus, mapper-modbus) on a node whose link runs through `proxy`; the node drops
/// a session silent for 8 s.
fn silent_site(cloud: &Cloud, proxy: &Proxy) -> (Node, PyModbus, Proc) {
    let sim_port = free_port();
    let sim = PyModbus::start(sim_port);
    write_holdings(sim_port, 0, &[215, 40]);
    let manifest = oven_manifest(sim_port);
    cloud.ok(&["apply", "-f", manifest.to_str().expect("path")]);
    let bins = sim::bin_dir();
    let config = cloud.edge_config_via(proxy.port) + "  keepaliveSeconds: 8\n";
    let node = Node::start_named(&bins, NODE, "", &config);
    eventually(30, "oven-1 on the edge", || node.twin("default/oven-1"));
    let mapper = node.mapper("mapper-modbus", "modbus", free_port());
    online(cloud, 60);
    (node, sim, mapper)
}

/// Waits up to `secs` for the node Ready and oven-1 `online` in DeviceStatus; how long it took.
fn online(cloud: &Cloud, secs: u64) -> Duration {
    let t = Instant::now();
    eventually_or(secs, "the node Ready and oven-1 online", || {
        let ready = ready(cloud);
        let st = cloud.status("oven-1");
        (ready == Some(true) && st["status"]["state"] == "online")
            .then_some(())
            .ok_or_else(|| format!("Ready {ready:?}, {}", st["status"]))
    });
    t.elapsed()
}

/// Waits up to `secs` for the node NotReady and oven-1 `unknown` with the reason; how long.
fn gone(cloud: &Cloud, secs: u64) -> Duration {
    let t = Instant::now();
    eventually_or(secs, "the node NotReady and oven-1 unknown", || {
        let ready = ready(cloud);
        let st = cloud.status("oven-1");
        let reason = st["status"]["extensions"]["stateReason"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        (ready == Some(false)
            && st["status"]["state"] == "unknown"
            && reason.contains("lost its link"))
        .then_some(())
        .ok_or_else(|| format!("Ready {ready:?}, {}", st["status"]))
    });
    t.elapsed()
}

/// The node's Ready condition.
fn ready(cloud: &Cloud) -> Option<bool> {
    let node: Value = serde_json::from_str(&cloud.ok(&["get", "node", NODE, "-o", "json"])).ok()?;
    let ready = node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?["status"]
        .as_str()?
        .to_string();
    Some(ready == "True")
}

#[test]
fn a_frozen_edgecore_and_a_blackholed_link_are_seen_as_gone_then_back() {
    // cloudhub's default keepaliveSeconds, 30: a shorter one hid the fault (its 30 s heartbeat
    // rebuilt the silence timer, so that 30 s of silence never came).
    let cloud = Cloud::start();
    let proxy = Proxy::start(cloud.hub);
    let (node, _sim, _mapper) = silent_site(&cloud, &proxy);
    // keepaliveSeconds and a margin of 10 s.
    let limit = 30 + 10;

    // edgecore frozen: its socket stays open, nothing comes from it.
    node.edgecore.signal("-STOP");
    let took = gone(&cloud, limit);
    eprintln!("frozen edgecore: NotReady and unknown after {took:?}");
    node.edgecore.signal("-CONT");
    let took = online(&cloud, 30);
    eprintln!("thawed: Ready and online after {took:?}");

    // The link stops carrying bytes, without closing.
    proxy.blackhole();
    let took = gone(&cloud, limit);
    eprintln!("blackholed link: NotReady and unknown after {took:?}");
    // Long enough for the node to give up on its session too (8 s) and try again.
    std::thread::sleep(Duration::from_secs(10));
    proxy.unblock();
    let took = online(&cloud, 30);
    eprintln!("unblocked: Ready and online after {took:?}");
    let log = node.edgecore.log_text();
    assert!(
        log.contains("the cloud was silent") || log.contains("stopped reading"),
        "the node saw the silence too: {}",
        log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
    );
}
