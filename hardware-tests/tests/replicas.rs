//! Three `cloudcore` replicas on a real three-member etcd cluster on loopback (Debian's
//! `etcd-server`), an `edgecore` that knows all three, `mapper-modbus` and a simulated oven; the
//! real `kubectl` through each replica.
//!
//! What `kubectl apply` does through one replica is seen through every other; the replica that
//! holds the node's session is killed (`kill -9`): the node goes to another, a desired value set
//! meanwhile lands, values reach DeviceStatus; the leader is killed: another takes the Lease and
//! its controllers (a new device gets its DeviceStatus); an etcd member is stopped: everything
//! goes on. Skipped, saying so, without the `etcd` binary.

use sim::etcd::EtcdCluster;
use sim::stack::{Cloud, oven_manifest, reported};
use sim::{Node, PyModbus, bin, eventually, free_port, read_holding, write_holdings};
use std::path::Path;

/// The replica whose cloudhub holds the node's session, as edgecore's status says.
fn session_holder(node: &Node, replicas: &[Option<Cloud>]) -> Option<usize> {
    let (code, status) = node.get("/api/v1/status");
    if code != 200 || status["cloud"] != "connected" {
        return None;
    }
    let server = status["cloudServer"].as_str()?.to_string();
    replicas.iter().position(|r| {
        r.as_ref()
            .is_some_and(|r| server == format!("wss://127.0.0.1:{}", r.hub))
    })
}

/// The index edgehub picks as a node's own replica among `n` (FNV-1a of its name).
fn home_of(node: &str, n: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % n as u64) as usize
}

/// Replica `i`, which is alive.
fn r(replicas: &[Option<Cloud>], i: usize) -> &Cloud {
    replicas[i].as_ref().expect("a live replica")
}

/// The replica named in the Lease, as `kubectl` through `via` reads it.
fn leader(via: &Cloud) -> Option<usize> {
    let (ok, out) = via.kubectl(&[
        "get",
        "lease",
        "-n",
        "kubeedge",
        "cloudcore",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    out.trim()
        .strip_prefix("replica-")
        .filter(|_| ok)
        .and_then(|i| i.parse().ok())
}

#[test]
fn three_replicas_on_etcd_serve_one_fleet_through_kills() {
    if !sim::etcd::available() {
        sim::skip("no etcd binary (scripts/test installs Debian's etcd-server)");
        return;
    }
    let mut etcd = EtcdCluster::start(3).expect("a three-member etcd cluster");
    let endpoints = etcd.endpoints();
    // The first replica makes the fleet's CA and tokens; the others take them from etcd.
    let mut replicas: Vec<Option<Cloud>> = (0..3)
        .map(|i| Some(Cloud::start_replica(&endpoints, &format!("replica-{i}"))))
        .collect();

    // One leader among them.
    let first_leader = eventually(30, "a leader", || leader(r(&replicas, 0)));

    // kubectl apply through one replica is seen through the others.
    let sim_port = free_port();
    let _sim = PyModbus::start(sim_port);
    write_holdings(sim_port, 0, &[215, 40]);
    let manifest = oven_manifest(sim_port);
    r(&replicas, 1).ok(&["apply", "-f", manifest.to_str().expect("path")]);
    for i in [0, 2] {
        let got = r(&replicas, i).ok(&["get", "device", "oven-1", "-o", "name"]);
        assert!(got.contains("oven-1"), "replica {i}: {got}");
    }

    // An edge node that knows all three; it joins with a token of replica 0.
    let edgecore = bin("edgecore");
    let bins = edgecore.parent().map(Path::to_path_buf).expect("bin dir");
    // Its own replica (the one its name picks in its list) is not the leader: the two kills
    // below are of different replicas.
    let target = (first_leader + 1) % 3;
    let home = home_of("edge-node-1", 3);
    let order: Vec<&Cloud> = (0..3)
        .map(|k| r(&replicas, (target + 3 - home + k) % 3))
        .collect();
    // Away from its own replica (it may join through another while its token reaches all), the
    // node goes back within 4 s.
    let config = r(&replicas, 0).edge_config_replicas(&order, 4);
    let node = Node::start_named(&bins, "edge-node-1", "", &config);
    eventually(60, "oven-1 on the edge", || node.twin("default/oven-1"));
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
    eventually(60, "temperature 21.5 in DeviceStatus", || {
        reported(&r(&replicas, 2).status("oven-1"), "temperature").filter(|v| v.starts_with("21.5"))
    });
    let holder = eventually(30, "the node on its own replica", || {
        session_holder(&node, &replicas).filter(|h| *h == target)
    });

    eprintln!("leader: replica-{first_leader}; the node's session: replica-{holder}");
    // kill -9 of the replica that holds the session; meanwhile a desired value is set through
    // another, and the register changes.
    let other = (holder + 1) % 3;
    // Writes through that replica while it is killed: every one it acknowledged is kept.
    let kubeconfig = r(&replicas, holder).kubeconfig();
    let writer = std::thread::spawn(move || {
        let mut acked = Vec::new();
        for i in 0..1000 {
            let name = format!("acked-{i}");
            let out = std::process::Command::new(sim::stack::kubectl_bin())
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(["create", "configmap", &name, "-n", "default"])
                .output()
                .expect("kubectl runs");
            if !out.status.success() {
                break;
            }
            acked.push(name);
        }
        acked
    });
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let mut killed = replicas[holder].take().expect("the holder");
    killed.kill9();
    let acked = writer.join().expect("the writer");
    assert!(!acked.is_empty(), "no write acknowledged before the kill");
    let stored = r(&replicas, other).ok(&["get", "configmaps", "-n", "default", "-o", "name"]);
    for name in &acked {
        assert!(
            stored.contains(&format!("configmap/{name}\n")),
            "{name} was acknowledged by the killed replica and is gone: {stored}"
        );
    }
    r(&replicas, other).set_desired("oven-1", 1, "95");
    write_holdings(sim_port, 0, &[333]);
    let moved = eventually(60, "the node connected to another replica", || {
        session_holder(&node, &replicas).filter(|h| *h != holder)
    });
    eprintln!("after kill -9 of replica-{holder}: the node's session on replica-{moved}");
    eventually(60, "setpoint 95 on the register", || {
        (read_holding(sim_port, 1) == 95).then_some(())
    });
    eventually(60, "temperature 33.3 in DeviceStatus", || {
        reported(&r(&replicas, other).status("oven-1"), "temperature")
            .filter(|v| v.starts_with("33.3"))
    });
    // What the killed replica acknowledged is there: the device and its desired value.
    let spec = r(&replicas, moved).ok(&["get", "device", "oven-1", "-o", "json"]);
    assert!(spec.contains("\"95\""), "{spec}");

    // kill -9 of the leader (if the first kill did not take it): another replica takes the
    // Lease over, and with it the controllers that run once: a new device gets its DeviceStatus.
    let live: Vec<usize> = (0..3).filter(|i| replicas[*i].is_some()).collect();
    let survivor = if replicas[first_leader].is_some() {
        if let Some(mut c) = replicas[first_leader].take() {
            c.kill9();
        }
        live.into_iter()
            .find(|i| *i != first_leader)
            .expect("a survivor")
    } else {
        live[0]
    };
    let new_leader = eventually(60, "a new leader", || {
        leader(r(&replicas, survivor)).filter(|l| replicas[*l].is_some())
    });
    assert_ne!(new_leader, first_leader);
    eprintln!("after kill -9 of replica-{first_leader}: leader replica-{new_leader}");
    let second = std::fs::read_to_string(&manifest)
        .expect("manifest")
        .replace("name: oven-1", "name: oven-2");
    let second_file = manifest.with_file_name(format!("oven-2-{sim_port}.yaml"));
    std::fs::write(&second_file, second).expect("write");
    r(&replicas, survivor).ok(&["apply", "-f", second_file.to_str().expect("path")]);
    eventually(60, "oven-2's DeviceStatus made by the new leader", || {
        r(&replicas, survivor)
            .kubectl(&["get", "devicestatus", "oven-2"])
            .0
            .then_some(())
    });
    // The node is served by the survivor now: oven-2 reaches it.
    eventually(60, "oven-2 on the edge", || node.twin("default/oven-2"));

    // One etcd member stopped: writes and values go on.
    etcd.kill(0);
    r(&replicas, survivor).set_desired("oven-1", 1, "77");
    eventually(60, "setpoint 77 on the register", || {
        (read_holding(sim_port, 1) == 77).then_some(())
    });
    write_holdings(sim_port, 0, &[444]);
    eventually(60, "temperature 44.4 in DeviceStatus", || {
        reported(&r(&replicas, survivor).status("oven-1"), "temperature")
            .filter(|v| v.starts_with("44.4"))
    });

    // The node's own replica starts again: the node goes back to it (within its
    // rebalanceSeconds), and is served there.
    killed.spawn();
    replicas[holder] = Some(killed);
    eventually(60, "the node back on its own replica", || {
        session_holder(&node, &replicas).filter(|h| *h == holder)
    });
    // The replica it left marks nothing: the node stays Ready, named on its own replica.
    let ready = |via: &Cloud| {
        via.kubectl(&[
            "get",
            "node",
            "edge-node-1",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status} {.metadata.annotations.cloudcore\\.kubeedge\\.io/session}",
        ])
        .1
    };
    let want = format!("True replica-{holder}");
    eventually(30, "the node Ready on its own replica", || {
        (ready(r(&replicas, holder)).trim() == want).then_some(())
    });
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(ready(r(&replicas, survivor)).trim(), want);
    r(&replicas, holder).set_desired("oven-1", 1, "66");
    eventually(60, "setpoint 66 on the register", || {
        (read_holding(sim_port, 1) == 66).then_some(())
    });
}
