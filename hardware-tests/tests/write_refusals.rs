//! A desired value the device cannot take (-321 for a register without `dataType`, unsigned)
//! is refused by the real `mapper-modbus`, and the refusal lands in the twin of the real
//! `edgecore`: on the property as `writeError` (and `error`, kind `write`), in the HTTP API,
//! `kectl twin get` and MQTT `twin/get`; the register keeps its value, the reported value is
//! not marked stale, and a new desired value that fits clears it.

use sim::modbus_sim::Sim;
use sim::{Node, eventually, free_port, reported};
use std::time::Duration;

const MANIFEST: &str = include_str!("manifests/write_refusals.yaml");

#[test]
fn a_refused_desired_value_shows_in_the_twin_until_a_value_that_fits() {
    let device = Sim::with(|s| {
        s.holding.insert(0, 5);
    });
    let (port, _rt) = device.start("127.0.0.1:0").expect("simulator");
    let node = Node::start(&MANIFEST.replace("PORT", &port.to_string()));
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
    let twin = || node.twin("default/dial-1").unwrap_or_default();
    eventually(30, "level 5 in the twin", || {
        (reported(&twin(), "level").as_deref() == Some("5")).then_some(())
    });

    node.kectl(&["twin", "set", "dial-1", "level", "-321"]);
    let t = eventually(30, "the refusal in the twin", || {
        let t = twin();
        t["properties"]["level"]["writeError"]
            .is_object()
            .then_some(t)
    });
    let p = &t["properties"]["level"];
    eprintln!("{}", serde_json::to_string_pretty(p).unwrap_or_default());
    let message = p["writeError"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("-321"), "the refusal names the value: {p}");
    assert_eq!(p["writeError"]["desired"], "-321", "{p}");
    assert_eq!(p["writeError"]["kind"], "write", "{p}");
    assert_eq!(p["error"]["kind"], "write", "no read failed: {p}");
    assert_eq!(p["error"]["message"], p["writeError"]["message"], "{p}");
    assert_eq!(p["reported"]["value"], "5", "{p}");
    assert!(p["reported"].get("stale").is_none(), "reads go on: {p}");
    assert_eq!(device.holding(0), Some(5), "the register is untouched");

    // kectl shows it by the desired value.
    let table = node.kectl(&["twin", "get", "dial-1"]);
    assert!(
        table.contains(&format!("-321 (refused: {message})")),
        "{table}"
    );

    // MQTT twin/get, as an app asks.
    let results = sim::mqtt_messages(
        node.mqtt,
        "$hw/events/device/default/dial-1/twin/get/result",
    )
    .expect("subscribed");
    let mut opts = rumqttc::MqttOptions::new("refusal-app", "127.0.0.1", node.mqtt);
    opts.set_keep_alive(Duration::from_secs(30));
    let (client, mut conn) = rumqttc::Client::new(opts, 16);
    std::thread::spawn(move || for _ in conn.iter() {});
    client
        .publish(
            "$hw/events/device/default/dial-1/twin/get",
            rumqttc::QoS::AtLeastOnce,
            false,
            br#"{"event_id":"e1","timestamp":0}"#.to_vec(),
        )
        .expect("publish");
    let got = results
        .recv_timeout(Duration::from_secs(10))
        .expect("a twin/get result");
    let v: serde_json::Value = serde_json::from_slice(&got.payload).expect("JSON");
    assert_eq!(v["twin"]["level"]["writeError"]["message"], message, "{v}");

    // A value that fits clears it, and lands.
    node.kectl(&["twin", "set", "dial-1", "level", "42"]);
    eventually(30, "42 on the register", || {
        (device.holding(0) == Some(42)).then_some(())
    });
    let t = eventually(30, "the refusal gone", || {
        let t = twin();
        t["properties"]["level"]["writeError"]
            .is_null()
            .then_some(t)
    });
    assert!(t["properties"]["level"]["error"].is_null(), "{t}");
}

/// The same refusal reaches the cloud: with the device declared through cloudcore's API and the
/// desired value set with kubectl, DeviceStatus shows it in the reported value's metadata
/// (`writeError`) until a value that fits lands.
#[test]
fn a_refused_desired_value_reaches_devicestatus() {
    use sim::stack::Cloud;
    let device = Sim::with(|s| {
        s.holding.insert(0, 5);
    });
    let (port, _rt) = device.start("127.0.0.1:0").expect("simulator");
    let cloud = Cloud::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("dial.yaml");
    std::fs::write(
        &file,
        MANIFEST
            .replace("PORT", &port.to_string())
            .replace("nodeName: test-node", "nodeName: edge-node-1"),
    )
    .expect("manifest");
    cloud.ok(&["apply", "-f", file.to_str().expect("path")]);
    let bins = sim::bin_dir();
    let node = Node::start_named(&bins, "edge-node-1", "", &cloud.edge_config());
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
    let meta = |st: &serde_json::Value| {
        st["status"]["twins"]
            .as_array()
            .and_then(|a| a.iter().find(|t| t["propertyName"] == "level"))
            .map(|t| t["reported"]["metadata"].clone())
            .unwrap_or_default()
    };
    eventually(60, "level 5 in DeviceStatus", || {
        sim::stack::reported(&cloud.status("dial-1"), "level").filter(|v| v == "5")
    });
    cloud.set_desired("dial-1", 0, "-321");
    let m = eventually(60, "the refusal in DeviceStatus", || {
        let m = meta(&cloud.status("dial-1"));
        m["writeError"].is_string().then_some(m)
    });
    assert!(
        m["writeError"]
            .as_str()
            .is_some_and(|e| e.contains("-321 does not fit a uint16")),
        "{m}"
    );
    assert_eq!(device.holding(0), Some(5));
    cloud.set_desired("dial-1", 0, "42");
    eventually(60, "42 on the register", || {
        (device.holding(0) == Some(42)).then_some(())
    });
    eventually(60, "the refusal gone from DeviceStatus", || {
        meta(&cloud.status("dial-1"))["writeError"]
            .is_null()
            .then_some(())
    });
}
