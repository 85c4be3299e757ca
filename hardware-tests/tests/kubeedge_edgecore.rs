//! KubeEdge's own Go `edgecore` on our `cloudcore`, with our `mapper-modbus` on its DMI socket
//! and a pymodbus device: a mixed fleet, both ways. The binary is given as
//! `KUBEEDGE_EDGECORE=/path/to/edgecore` (built from KubeEdge's source; see
//! `docs/kubeedge-differences.md`); without it the test says so and passes nothing.
//!
//! KubeEdge's edgecore takes our join token and holds its session; a Device applied with
//! `kubectl` reaches its DMI worker and our mapper, the register's values reach `DeviceStatus`, a
//! desired value set with `kubectl` lands on the register; after `kill -9` a restarted
//! edgecore gets the desired value set while it was down; a deleted Device leaves the mapper.
//! Its `edged` (the kubelet, which registers the Node and renews its Lease) needs containerd
//! and root, and runs only with `KUBEEDGE_EDGED=1`.

use sim::stack::{Cloud, oven_manifest, reported};
use sim::{Proc, PyModbus, bin, env_var, eventually, free_port, read_holding, write_holdings};
use std::path::Path;

/// KubeEdge's `edgecore --minconfig`, pointed at `cloud` and at files under `dir`.
fn kubeedge_config(
    edgecore: &Path,
    dir: &Path,
    cloud: &Cloud,
    node: &str,
    mqtt: u16,
    edged: bool,
) -> String {
    let out = std::process::Command::new(edgecore)
        .arg("--minconfig")
        .output()
        .expect("KubeEdge's edgecore --minconfig");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut c: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("KubeEdge's config");
    let d = dir.display();
    let set = |c: &mut serde_yaml_ng::Value, path: &[&str], v: serde_yaml_ng::Value| {
        let mut at = c;
        for k in &path[..path.len() - 1] {
            at = &mut at[*k];
        }
        at[path[path.len() - 1]] = v;
    };
    let s = |v: String| serde_yaml_ng::Value::String(v);
    set(
        &mut c,
        &["database", "dataSource"],
        s(format!("{d}/edgecore.db")),
    );
    let m = "modules";
    set(&mut c, &[m, "deviceTwin", "enable"], true.into());
    set(
        &mut c,
        &[m, "deviceTwin", "dmiSockPath"],
        s(format!("{d}/dmi/")),
    );
    set(&mut c, &[m, "edgeHub", "enable"], true.into());
    set(
        &mut c,
        &[m, "edgeHub", "httpServer"],
        s(format!("https://127.0.0.1:{}", cloud.certs)),
    );
    set(
        &mut c,
        &[m, "edgeHub", "websocket", "server"],
        s(format!("127.0.0.1:{}", cloud.hub)),
    );
    set(&mut c, &[m, "edgeHub", "token"], s(cloud.token()));
    for (k, f) in [
        ("tlsCaFile", "ca/rootCA.crt"),
        ("tlsCertFile", "certs/server.crt"),
        ("tlsPrivateKeyFile", "certs/server.key"),
    ] {
        set(&mut c, &[m, "edgeHub", k], s(format!("{d}/{f}")));
    }
    set(&mut c, &[m, "eventBus", "enable"], true.into());
    set(
        &mut c,
        &[m, "eventBus", "mqttServerExternal"],
        s(format!("tcp://127.0.0.1:{mqtt}")),
    );
    set(&mut c, &[m, "edged", "enable"], edged.into());
    set(&mut c, &[m, "edged", "hostnameOverride"], s(node.into()));
    set(
        &mut c,
        &[m, "edged", "rootDirectory"],
        s(format!("{d}/kubelet")),
    );
    serde_yaml_ng::to_string(&c).expect("yaml")
}

fn start_kubeedge(edgecore: &Path, dir: &Path) -> Proc {
    let config = dir.join("edgecore.yaml");
    Proc::spawn(
        edgecore,
        &["--config", config.to_str().expect("path")],
        dir,
        "kubeedge-edgecore.log",
    )
}

fn setpoint_status(cloud: &Cloud) -> Option<String> {
    reported(&cloud.status("oven-1"), "setpoint")
}

#[test]
fn kubeedges_edgecore_runs_our_mapper_under_our_cloudcore() {
    let Some(edgecore) = env_var("KUBEEDGE_EDGECORE") else {
        eprintln!(
            "skipped: KUBEEDGE_EDGECORE is not set (KubeEdge's edgecore binary, built from its source)"
        );
        return;
    };
    let edgecore = Path::new(&edgecore).to_path_buf();
    let edged = env_var("KUBEEDGE_EDGED").is_some_and(|v| v == "1");
    let node = "ke-edge-1";
    let cloud = Cloud::start();
    let dir = tempfile::tempdir().expect("tempdir");
    for sub in ["dmi", "ca", "certs", "kubelet"] {
        std::fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
    }
    let mqtt = free_port();
    let _mosquitto = Proc::spawn(
        Path::new("mosquitto"),
        &["-p", &mqtt.to_string()],
        dir.path(),
        "mosquitto.log",
    );
    std::fs::write(
        dir.path().join("edgecore.yaml"),
        kubeedge_config(&edgecore, dir.path(), &cloud, node, mqtt, edged),
    )
    .expect("config");
    let mut ke = start_kubeedge(&edgecore, dir.path());
    eventually(60, "KubeEdge's edgecore joined (its Node Ready)", || {
        let (ok, text) = cloud.kubectl(&["get", "node", node, "--no-headers"]);
        (ok && text.contains(" Ready")).then_some(())
    });

    let sim_port = free_port();
    let _device = PyModbus::start(sim_port);
    write_holdings(sim_port, 0, &[215, 40]);
    let manifest = oven_manifest(sim_port);
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    std::fs::write(
        &manifest,
        text.replace("nodeName: edge-node-1", &format!("nodeName: {node}")),
    )
    .expect("manifest");
    cloud.ok(&["apply", "-f", manifest.to_str().expect("path")]);

    let mapper_config = dir.path().join("mapper-modbus.yaml");
    std::fs::write(
        &mapper_config,
        format!(
            "grpc_server:\n  socket_path: {d}/dmi/modbus.sock\ncommon:\n  name: modbus-mapper\n  version: v1.13.0\n  api_version: v1.0.0\n  protocol: modbus\n  address: 127.0.0.1\n  edgecore_sock: {d}/dmi/dmi.sock\n  http_port: {p}\n",
            d = dir.path().display(),
            p = free_port()
        ),
    )
    .expect("mapper config");
    let mapper = Proc::spawn(
        &bin("mapper-modbus"),
        &["--config-file", mapper_config.to_str().expect("path")],
        dir.path(),
        "mapper-modbus.log",
    );
    // The Device reaches the mapper through KubeEdge's DMI worker; its values reach DeviceStatus.
    eventually(90, "temperature 21.5 in DeviceStatus", || {
        reported(&cloud.status("oven-1"), "temperature").filter(|v| v.starts_with("21.5"))
    });
    write_holdings(sim_port, 0, &[333]);
    eventually(60, "temperature 33.3 in DeviceStatus", || {
        reported(&cloud.status("oven-1"), "temperature").filter(|v| v.starts_with("33.3"))
    });

    // A desired value set with kubectl lands on the register, and comes back as reported.
    let desire = |v: &str| cloud.set_desired("oven-1", 1, v);
    desire("95");
    eventually(60, "setpoint 95 on the register", || {
        (read_holding(sim_port, 1) == 95).then_some(())
    });
    eventually(60, "setpoint 95 in DeviceStatus", || {
        setpoint_status(&cloud).filter(|v| v == "95")
    });

    // kill -9 of KubeEdge's edgecore; a desired value set meanwhile lands after its restart.
    ke.signal("-KILL");
    let _ = ke.child.wait();
    desire("66");
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(
        read_holding(sim_port, 1),
        95,
        "nothing reached the device while down"
    );
    let ke = start_kubeedge(&edgecore, dir.path());
    eventually(120, "setpoint 66 on the register after the restart", || {
        (read_holding(sim_port, 1) == 66).then_some(())
    });

    assert!(
        mapper.log_text().contains("property=setpoint value=66"),
        "{}",
        mapper.log_text()
    );
    // A deleted Device leaves the mapper.
    cloud.ok(&["delete", "device", "oven-1"]);
    eventually(60, "the mapper dropped oven-1", || {
        mapper.log_text().contains("device removed").then_some(())
    });
    let log = ke.log_text();
    for bad in ["panic", "nil pointer", "wrong resources"] {
        assert!(
            !log.contains(bad),
            "KubeEdge's edgecore logged {bad:?}:\n{log}"
        );
    }
    eprintln!("KubeEdge's edgecore ran the device end to end");
}
