//! The whole stack with the real binaries: `cloudcore` (embedded API, device controller,
//! cloudhub), an `edgecore` joined to it by token (edgehub), `mapper-modbus` and a pymodbus
//! device; the real `kubectl` makes the changes.
//!
//! `kubectl apply` of a Device in the cloud reaches the node and its register is read; the
//! value shows in `kubectl get devicestatus`; a desired value patched with `kubectl` is written
//! to the register; with the cloud gone, a restarted edgecore runs the device it was sent.

use sim::stack::{Cloud, oven_manifest, reported};
use sim::{Node, Proc, Proxy, PyModbus, bin, eventually, free_port, read_holding, write_holdings};
use std::path::Path;

/// A pymodbus oven (temperature 21.5, set point 40) and its manifest applied in the cloud, its
/// heater-on kept on the gateway (`reportToCloud: false`): its port, the simulator and the
/// manifest's file.
fn oven_applied(cloud: &Cloud) -> (u16, PyModbus, std::path::PathBuf) {
    let sim_port = free_port();
    let sim = PyModbus::start(sim_port);
    write_holdings(sim_port, 0, &[215, 40]);
    let manifest = oven_manifest(sim_port);
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    let local = text.replacen(
        "reportToCloud: true\n      pushMethod:",
        "reportToCloud: false\n      pushMethod:",
        1,
    );
    assert_ne!(local, text, "the example's heater-on changed shape");
    std::fs::write(&manifest, local).expect("write");
    cloud.ok(&["apply", "-f", manifest.to_str().expect("path")]);
    (sim_port, sim, manifest)
}

/// edgecore started again in the node's directory, logging to `log` there.
fn edgecore_again(bins: &Path, node: &Node, log: &str) -> Proc {
    Proc::spawn(
        &bins.join("edgecore"),
        &["--config", "edgecore.yaml"],
        node.dir.path(),
        log,
    )
}

#[test]
fn kubectl_apply_reaches_the_register_and_values_reach_devicestatus() {
    let cloud = Cloud::start();
    let (sim_port, _sim, _) = oven_applied(&cloud);

    let edgecore = bin("edgecore");
    let bins = edgecore.parent().map(Path::to_path_buf).expect("bin dir");
    let node = Node::start_named(&bins, "edge-node-1", "", &cloud.edge_config());
    // The cloud's device reaches the node's twin.
    eventually(30, "oven-1 on the edge", || node.twin("default/oven-1"));
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
    // The register's value reaches DeviceStatus.
    eventually(60, "temperature 21.5 in DeviceStatus", || {
        reported(&cloud.status("oven-1"), "temperature").filter(|v| v.starts_with("21.5"))
    });
    // The device's state reaches DeviceStatus too.
    let online = eventually(60, "state online in DeviceStatus", || {
        let st = cloud.status("oven-1");
        (st["status"]["state"] == "online").then_some(st)
    });
    assert!(
        online["status"]["lastOnlineTime"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{online}"
    );
    // The twin's type is the model's, as KubeEdge reports it.
    let st = cloud.status("oven-1");
    let temp = st["status"]["twins"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["propertyName"] == "temperature"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(temp["reported"]["metadata"]["type"], "float", "{temp}");
    write_holdings(sim_port, 0, &[333]);
    eventually(60, "temperature 33.3 in DeviceStatus", || {
        reported(&cloud.status("oven-1"), "temperature").filter(|v| v.starts_with("33.3"))
    });
    // heater-on was read on the gateway all along, and never reached the cloud.
    let edge_twin = node.twin("default/oven-1").expect("twin");
    assert!(
        sim::reported(&edge_twin, "heater-on").is_some(),
        "heater-on not read at the edge: {edge_twin}"
    );
    let st = cloud.status("oven-1");
    assert_eq!(reported(&st, "heater-on"), None, "{st}");
    // The node shows Ready.
    let nodes = cloud.ok(&["get", "nodes"]);
    assert!(
        nodes.contains("edge-node-1") && nodes.contains("Ready"),
        "{nodes}"
    );

    // A desired value set with kubectl lands on the register.
    cloud.set_desired("oven-1", 1, "95");
    eventually(60, "setpoint 95 on the register", || {
        (read_holding(sim_port, 1) == 95).then_some(())
    });

    // The cloud goes away; edgecore restarted without it runs the device it was sent.
    drop(cloud);
    let mut node = node;
    node.edgecore.signal("-TERM");
    let _ = node.edgecore.child.wait();
    node.edgecore = edgecore_again(&bins, &node, "edgecore-offline.log");
    eventually(30, "edgecore back", || node.started().then_some(()));
    assert!(
        node.twin("default/oven-1").is_some(),
        "the cloud's device is gone offline"
    );
    write_holdings(sim_port, 0, &[444]);
    eventually(60, "temperature 44.4 read offline", || {
        node.twin("default/oven-1")
            .and_then(|t| sim::reported(&t, "temperature"))
            .filter(|v| v.starts_with("44.4"))
    });
}

/// The link cut for a while, then flapping: what changed on both sides meanwhile converges
/// once it is back. Values read while it was down reach DeviceStatus (the newest), a device
/// added in the cloud reaches the node, a desired value set in the cloud lands on the register.
#[test]
fn after_a_cut_and_flapping_link_both_sides_converge() {
    let cloud = Cloud::start();
    let (sim_port, _sim, manifest) = oven_applied(&cloud);
    let proxy = Proxy::start(cloud.hub);
    let edgecore = bin("edgecore");
    let bins = edgecore.parent().map(Path::to_path_buf).expect("bin dir");
    let node = Node::start_named(&bins, "edge-node-1", "", &cloud.edge_config_via(proxy.port));
    eventually(30, "oven-1 on the edge", || node.twin("default/oven-1"));
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
    eventually(60, "temperature 21.5 in DeviceStatus", || {
        reported(&cloud.status("oven-1"), "temperature").filter(|v| v.starts_with("21.5"))
    });

    proxy.cut();
    eventually(30, "the node NotReady", || {
        cloud
            .ok(&["get", "nodes"])
            .contains("NotReady")
            .then_some(())
    });
    // Meanwhile: the device reads new values, the cloud gets a new device and a desired value.
    write_holdings(sim_port, 0, &[333]);
    eventually(30, "33.3 read at the edge", || {
        node.twin("default/oven-1")
            .and_then(|t| sim::reported(&t, "temperature"))
            .filter(|v| v.starts_with("33.3"))
    });
    // oven-2 is a PLC that does not answer (no simulator on its port): it must not write the
    // registers oven-1's checks read.
    let second = std::fs::read_to_string(&manifest)
        .expect("manifest")
        .replace("name: oven-1", "name: oven-2")
        .replace(
            &format!("port: {sim_port}"),
            &format!("port: {}", free_port()),
        );
    let second_file = std::env::temp_dir().join(format!("oven-2-{sim_port}.yaml"));
    std::fs::write(&second_file, second).expect("write");
    cloud.ok(&["apply", "-f", second_file.to_str().expect("path")]);
    cloud.set_desired("oven-1", 1, "70");
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert!(node.twin("default/oven-2").is_none(), "the link is cut");

    // Flapping: a few seconds up and down, then up for good.
    for _ in 0..4 {
        proxy.restore();
        std::thread::sleep(std::time::Duration::from_millis(700));
        proxy.cut();
        std::thread::sleep(std::time::Duration::from_millis(700));
    }
    proxy.restore();
    eventually(60, "33.3 in DeviceStatus", || {
        reported(&cloud.status("oven-1"), "temperature").filter(|v| v.starts_with("33.3"))
    });
    eventually(60, "oven-2 on the edge", || node.twin("default/oven-2"));
    eventually(60, "setpoint 70 on the register", || {
        (read_holding(sim_port, 1) == 70).then_some(())
    });
    eventually(30, "the node Ready", || {
        let nodes = cloud.ok(&["get", "nodes", "--no-headers"]);
        (nodes.contains(" Ready") && !nodes.contains("NotReady")).then_some(())
    });
}

/// `kill -9` of cloudcore and of edgecore, in turns, while the device's value changes: every
/// newest value still reaches DeviceStatus, and the node's ObjectSync records are exactly its
/// objects (none stuck, none lost).
#[test]
fn kill_9_of_either_side_loses_nothing_acknowledged() {
    let mut cloud = Cloud::start();
    let sim_port = free_port();
    let _sim = PyModbus::start(sim_port);
    write_holdings(sim_port, 0, &[100, 40]);
    let manifest = oven_manifest(sim_port);
    cloud.ok(&["apply", "-f", manifest.to_str().expect("path")]);
    let edgecore = bin("edgecore");
    let bins = edgecore.parent().map(Path::to_path_buf).expect("bin dir");
    let mut node = Node::start_named(&bins, "edge-node-1", "", &cloud.edge_config());
    eventually(30, "oven-1 on the edge", || node.twin("default/oven-1"));
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
    for (round, raw) in [(0, 111u16), (1, 122), (2, 133), (3, 144)] {
        write_holdings(sim_port, 0, &[raw]);
        if round % 2 == 0 {
            // edgecore dies at once; its outbox and what the cloud sent are on disk.
            let _ = node.edgecore.child.kill();
            let _ = node.edgecore.child.wait();
            node.edgecore = edgecore_again(&bins, &node, &format!("edgecore-{round}.log"));
        } else {
            cloud.proc = None;
            cloud.spawn();
        }
        let want = format!("{}.{}", raw / 10, raw % 10);
        eventually(
            60,
            &format!("{want} in DeviceStatus after round {round}"),
            || reported(&cloud.status("oven-1"), "temperature").filter(|v| v.starts_with(&want)),
        );
    }
    let syncs = cloud.ok(&["get", "objectsyncs", "-o", "name"]);
    assert_eq!(
        syncs
            .matches("objectsync.reliablesyncs.kubeedge.io/edge-node-1.")
            .count(),
        2,
        "the device and its model: {syncs}"
    );
}

/// The node renews its certificate with itself, without the token (here at once: it is due
/// when fewer than `renewBeforeDays` days are left); a node whose kept certificate is from
/// another CA than its token names joins again (the cloud was rebuilt).
#[test]
fn the_node_certificate_is_renewed_with_itself_and_a_new_cloud_is_joined_by_token() {
    let cloud = Cloud::start();
    let edgecore = bin("edgecore");
    let bins = edgecore.parent().map(Path::to_path_buf).expect("bin dir");
    let config = format!("{}  renewBeforeDays: 400\n", cloud.edge_config());
    let mut node = Node::start_named(&bins, "edge-node-1", "", &config);
    let cloud_log =
        || std::fs::read_to_string(cloud.dir.path().join("cloudcore.log")).unwrap_or_default();
    eventually(
        30,
        "a certificate by token, then one by certificate",
        || {
            let log = cloud_log();
            (log.contains("authorized_by=\"token\"")
                && log.contains("authorized_by=\"certificate\""))
            .then_some(())
        },
    );
    let cert = node.dir.path().join("data/certs/edge.crt");
    let renewed = std::fs::read_to_string(&cert).expect("edge.crt");
    eventually(30, "renewed, then connected", || {
        let log = node.edgecore.log_text();
        let at = log.find("node certificate renewed")?;
        log[at..].contains("edgehub: connected").then_some(())
    });

    // No token at all now: the next renewal (due again at once) needs only the certificate.
    let yaml = node.dir.path().join("edgecore.yaml");
    let text = std::fs::read_to_string(&yaml).expect("config");
    let token = cloud.token();
    std::fs::write(&yaml, text.replace(&token, "")).expect("config");
    node.edgecore.signal("-TERM");
    let _ = node.edgecore.child.wait();
    node.edgecore = edgecore_again(&bins, &node, "edgecore-2.log");
    eventually(30, "renewed without a token", || {
        let log = node.edgecore.log_text();
        (log.contains("node certificate renewed") && log.contains("edgehub: connected"))
            .then_some(())
    });
    assert_ne!(
        std::fs::read_to_string(&cert).expect("edge.crt"),
        renewed,
        "the certificate was not replaced"
    );

    // A rebuilt cloud (another CA) and its token: the node joins it.
    let other = Cloud::start();
    node.edgecore.signal("-TERM");
    let _ = node.edgecore.child.wait();
    std::fs::write(
        &yaml,
        format!(
            "{}{}",
            text.split("cloud:").next().unwrap_or_default(),
            other.edge_config()
        ),
    )
    .expect("config");
    node.edgecore = edgecore_again(&bins, &node, "edgecore-3.log");
    eventually(30, "joined the rebuilt cloud", || {
        let log = node.edgecore.log_text();
        (log.contains("another CA") && log.contains("edgehub: connected")).then_some(())
    });
    eventually(30, "Ready in the rebuilt cloud", || {
        let nodes = other.ok(&["get", "nodes"]);
        (nodes.contains("edge-node-1") && nodes.contains("Ready")).then_some(())
    });
}
