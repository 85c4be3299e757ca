//! DMI as KubeEdge's own code speaks it: a mapper written to mapper-framework's contract and
//! KubeEdge's edgecore calling a mapper, both on grpcio (`sims/kubeedge_mapper.py`, a gRPC stack
//! the project did not write, compiled from the project's proto), against the real `edgecore`
//! and `mapper-modbus`, with every `:authority` form gRPC clients send over a Unix socket.
//! Needs `python3` with `grpcio` and `grpcio-tools` (`.ci/run` installs them).

use serde_json::{Value, json};
use sim::{Node, eventually, free_port, reported};
use std::io::Write;
use std::process::{Child, ChildStdin, Command};
use std::sync::mpsc;
use std::time::Duration;

const INSTALL: &str = "pip install 'grpcio==1.*' 'grpcio-tools==1.*'";

fn manifests(setpoint: &str, collect: u32) -> String {
    sim::fill(
        include_str!("manifests/kubeedge_dmi.yaml"),
        &[("collect", &collect), ("setpoint", &setpoint)],
    )
}

fn script() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sims/kubeedge_mapper.py")
}

fn proto_root() -> String {
    sim::workspace_root()
        .join("api/proto")
        .display()
        .to_string()
}

/// The grpcio mapper: its printed JSON lines, and its stdin for commands.
struct KubeEdgeMapper {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl KubeEdgeMapper {
    fn start(node: &Node, authority: &str, name: &str) -> (Self, Value) {
        let own = node.dir.path().join(format!("{name}.sock"));
        let (child, stdin, out) = sim::piped(
            Command::new(sim::python())
                .arg(script())
                .args(["--proto", &proto_root(), "--authority", authority, "mapper"])
                .arg("--socket")
                .arg(&node.socket)
                .arg("--own-socket")
                .arg(&own)
                .args(["--name", name]),
        );
        let lines = sim::lines(out, Some);
        let mapper = Self {
            child,
            stdin,
            lines,
        };
        let first = mapper
            .next(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("the grpcio mapper printed nothing ({INSTALL})"));
        assert_eq!(
            first["event"], "registered",
            "MapperRegister with :authority {authority}: {first}"
        );
        assert_eq!(
            mapper
                .lines
                .recv_timeout(Duration::from_secs(5))
                .ok()
                .as_deref(),
            Some("ready")
        );
        (mapper, first)
    }

    fn next(&self, wait: Duration) -> Option<Value> {
        let line = self.lines.recv_timeout(wait).ok()?;
        Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}")))
    }

    fn command(&mut self, cmd: Value) -> Value {
        writeln!(self.stdin, "{cmd}").expect("command sent");
        self.next(Duration::from_secs(10)).expect("a reply")
    }
}

impl Drop for KubeEdgeMapper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn property<'a>(device: &'a Value, name: &str) -> &'a Value {
    device["properties"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no property {name} in {device}"))
}

/// What mapper-framework dereferences is there, and every configData value decodes as its
/// DecodeAnyValue decodes (nothing dropped, integers exact, 0.1 as 0.1).
fn assert_mapper_framework_can_read(device: &Value) {
    assert_eq!(device["name"], "oven-1");
    assert_eq!(device["namespace"], "default");
    assert_eq!(device["model"], "oven-model");
    assert_eq!(device["has_protocol"], true);
    assert_eq!(device["protocol_name"], "modbus");
    assert_eq!(
        device["protocol_config"],
        json!({"ip": "127.0.0.1", "port": 5020, "slaveID": 1, "serialNumber": 16_777_217})
    );
    assert_eq!(device["protocol_dropped"], json!([]));
    for p in device["properties"].as_array().expect("properties") {
        assert_eq!(p["has_desired"], true, "{p}");
        assert_eq!(p["has_visitors"], true, "{p}");
        assert_eq!(p["dropped"], json!([]), "{p}");
    }
    let temp = property(device, "temperature");
    assert_eq!(
        temp["desired"], "",
        "a ReadOnly property has an empty desired"
    );
    assert_eq!(
        temp["visitor_config"],
        json!({"register": "HoldingRegister", "offset": 0, "limit": 1, "scale": 0.1})
    );
}

#[test]
fn a_kubeedge_mapper_registers_with_every_authority_form_reports_and_is_driven() {
    let node = Node::start(&manifests("80", 1000));
    let states = sim::mqtt_messages(
        node.mqtt,
        "$hw/events/device/default/oven-1/state/update/result",
    )
    .expect("subscribed to the state results");
    // grpcio's own form for a Unix socket, grpc-go v1.67's percent-encoded path, older
    // grpc-go's raw path, and the plain form.
    for authority in ["default", "percent", "raw", "localhost"] {
        let (mut mapper, registered) = KubeEdgeMapper::start(&node, authority, "kubeedge-mapper");
        let devices = registered["devices"].as_array().expect("devices");
        assert_eq!(devices.len(), 1, "{registered}");
        assert_mapper_framework_can_read(&devices[0]);
        assert_eq!(property(&devices[0], "setpoint")["desired"], "80");

        let reply = mapper.command(json!({"op": "report", "device": "oven-1",
            "twins": {"temperature": format!("21.{}", authority.len()), "setpoint": "80"},
            "desired": {"setpoint": "80"}}));
        assert_eq!(reply["code"], "OK", "{reply}");
        let want = format!("21.{}", authority.len());
        eventually(10, "the reported temperature in the twin", || {
            let twin = node.twin("default/oven-1")?;
            (reported(&twin, "temperature").as_deref() == Some(want.as_str())).then_some(())
        });
        let reply = mapper.command(json!({"op": "state", "device": "oven-1", "state": "online"}));
        assert_eq!(reply["code"], "OK", "{reply}");
        eventually(10, "the device online", || {
            let twin = node.twin("default/oven-1")?;
            (twin["state"] == "online").then_some(())
        });
        if authority == "localhost" {
            // Each twin stands on its own: a value not of its type fails that twin only, and a
            // twin the model lacks is added (KubeEdge's dealTwinAdd).
            let reply = mapper.command(json!({"op": "report", "device": "oven-1",
                "twins": {"setpoint": "hot", "temperature": "22.25", "humidity": "40"}}));
            assert_eq!(reply["code"], "OK", "{reply}");
            let twin = node.twin("default/oven-1").expect("twin");
            assert_eq!(
                reported(&twin, "temperature").as_deref(),
                Some("22.25"),
                "{twin}"
            );
            assert_eq!(reported(&twin, "setpoint").as_deref(), Some("80"), "{twin}");
            assert_eq!(reported(&twin, "humidity").as_deref(), Some("40"), "{twin}");
        }
        if authority == "default" {
            // As KubeEdge's edgecore, a state reported over DMI is published on MQTT.
            let msg = states
                .recv_timeout(Duration::from_secs(10))
                .expect("state/update/result after ReportDeviceStates");
            let body: Value = serde_json::from_slice(&msg.payload).expect("JSON");
            assert_eq!(body["device"]["name"], "oven-1", "{body}");
            assert_eq!(body["device"]["state"], "online", "{body}");
            assert!(
                body["device"]["lastOnlineTime"]
                    .as_str()
                    .is_some_and(|t| t.ends_with('Z')),
                "{body}"
            );
            assert!(
                body["event_id"].is_string() && body["timestamp"].is_i64(),
                "{body}"
            );
        }
    }

    // edgecore calls the KubeEdge mapper: each manifest edit changing a setting and the desired
    // value together arrives as one UpdateDevice that carries both (the stale desired value
    // came first in 2-4 of 10 edits, then a second call).
    let (mapper, _) = KubeEdgeMapper::start(&node, "percent", "kubeedge-mapper");
    for edit in 0..8u32 {
        let (setpoint, collect) = ((90 + edit).to_string(), 2000 + 100 * edit);
        std::fs::write(
            node.dir.path().join("manifests/devices.yaml"),
            manifests(&setpoint, collect),
        )
        .expect("manifest edited");
        // A bound, not a speed: the edit is seen after two polls, then stored (fsync) before
        // the call; a CI machine busy writing elsewhere took more than 15 s once.
        let update = loop {
            let call = mapper
                .next(Duration::from_secs(60))
                .expect("edgecore calls the mapper after the edit");
            if call["call"] == "UpdateDevice" {
                break call;
            }
        };
        let device = &update["device"];
        assert_mapper_framework_can_read(device);
        assert_eq!(
            property(device, "setpoint")["desired"],
            setpoint.as_str(),
            "edit {edit}: {update}"
        );
        assert_eq!(
            property(device, "temperature")["collect_cycle"],
            collect,
            "edit {edit}"
        );
        if let Some(more) = mapper.next(Duration::from_millis(1200)) {
            panic!("edit {edit}: one edit, one call; then {more}");
        }
    }
}

#[test]
fn kubeedge_edgecore_reaches_our_mapper_with_every_authority_form() {
    let node = Node::start(&manifests("80", 1000));
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
    let socket = node.dir.path().join("modbus.sock");
    eventually(30, "mapper-modbus registered", || {
        let (_, mappers) = node.get("/api/v1/mappers");
        (mappers.to_string().contains("oven-1") && socket.exists()).then_some(())
    });
    for authority in ["default", "percent", "raw"] {
        let out = Command::new(sim::python())
            .arg(script())
            .args([
                "--proto",
                &proto_root(),
                "--authority",
                authority,
                "edgecore",
            ])
            .arg("--socket")
            .arg(&socket)
            .args(["--device", "oven-1"])
            .output()
            .expect("python3 runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let reply: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
            panic!(
                "{e}: {text} {} ({INSTALL})",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert_eq!(reply["code"], "OK", ":authority {authority}: {reply}");
        assert_eq!(reply["device"]["name"], "oven-1");
        assert_mapper_framework_can_read(&reply["device"]);
    }
}
