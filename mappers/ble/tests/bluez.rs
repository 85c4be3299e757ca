//! End to end over BLE: the real `edgecore`, `mapper-ble` and `kectl` against BlueZ's D-Bus API
//! as python-dbusmock's `bluez5` template serves it (`sim::bluez`), with peripherals
//! whose characteristics `sims/ble_peripherals.py` changes, fails and takes out of range.
//! Needs `dbus-daemon` and `python3-dbusmock` (`.ci/run` installs them).

use serde_json::json;
use sim::bluez::BlueZ;
use sim::{Node, agent, eventually, free_port, get, property_error, reported};

const ENV: &str = "C4:7C:8D:6A:12:34";
const THERMO: &str = "D0:5F:B8:00:00:02";
const TEMPERATURE: &str = "00002a6e-0000-1000-8000-00805f9b34fb";
const HUMIDITY: &str = "00002a6f-0000-1000-8000-00805f9b34fb";
const STATUS: &str = "0000ff10-0000-1000-8000-00805f9b34fb";
const LOCKED: &str = "0000ff11-0000-1000-8000-00805f9b34fb";
const LED: &str = "0000ff01-0000-1000-8000-00805f9b34fb";

fn peripherals() -> serde_json::Value {
    json!({"adapter": "hci0", "devices": [
        {"address": ENV, "name": "env-1", "services": [
            {"uuid": "0000181a-0000-1000-8000-00805f9b34fb", "characteristics": [
                // sint16 in 0.01 degrees, little-endian: 23.45
                {"uuid": TEMPERATURE, "flags": ["read", "notify"], "value": "2909"},
                // uint16 in 0.01 %: 41.22
                {"uuid": HUMIDITY, "flags": ["read"], "value": "1a10"},
            ]},
            {"uuid": "0000ff00-0000-1000-8000-00805f9b34fb", "characteristics": [
                {"uuid": LED, "flags": ["read", "write"], "value": "00"},
                // battery (uint8) then a big-endian uint16 counter: 87, 258
                {"uuid": STATUS, "flags": ["read", "write"], "value": "570102"},
                // the GAP device name: read only
                {"uuid": "00002a00-0000-1000-8000-00805f9b34fb", "flags": ["read"], "value": "656e762d3100"},
                {"uuid": LOCKED, "flags": ["read"], "error": "NotPermitted"},
            ]},
        ]},
        {"address": THERMO, "name": "thermo-2", "services": [
            {"uuid": "0000181a-0000-1000-8000-00805f9b34fb", "characteristics": [
                {"uuid": TEMPERATURE, "flags": ["read"], "value": "f4ff"},
            ]},
        ]},
    ]})
}

const MANIFESTS: &str = include_str!("manifests/bluez.yaml");

fn value(node: &Node, device: &str, property: &str) -> Option<String> {
    reported(&node.twin(&format!("default/{device}"))?, property)
}

fn state(node: &Node, device: &str) -> Option<String> {
    node.twin(&format!("default/{device}"))?["state"]
        .as_str()
        .map(str::to_string)
}

#[test]
fn ble_peripherals_through_edgecore() {
    let mut bluez = BlueZ::start(&peripherals());
    let node = Node::start(MANIFESTS);
    let http = free_port();
    let mapper = node.mapper_env("mapper-ble", "ble", http, &bluez.env());

    // Every property decoded from its characteristic: offsets, byte orders, sign, scale.
    let twin = eventually(30, "env-1's values", || {
        let t = node.twin("default/env-1")?;
        for p in [
            "temperature",
            "humidity",
            "battery",
            "counter",
            "label",
            "led",
        ] {
            reported(&t, p)?;
        }
        (t["state"] == "online").then_some(t)
    });
    assert_eq!(reported(&twin, "temperature").as_deref(), Some("23.45"));
    assert_eq!(reported(&twin, "humidity").as_deref(), Some("41.22"));
    assert_eq!(reported(&twin, "battery").as_deref(), Some("87"));
    assert_eq!(reported(&twin, "counter").as_deref(), Some("258"));
    assert_eq!(reported(&twin, "led").as_deref(), Some("false"));
    assert_eq!(reported(&twin, "label").as_deref(), Some("env-1"));
    assert!(bluez.connected(ENV), "the mapper connected through BlueZ");
    // Found by its advertised name.
    eventually(10, "thermo-2 by name", || {
        (value(&node, "thermo-2", "temperature")? == "-0.12").then_some(())
    });

    // A characteristic the device refuses to read fails that property only, with BlueZ's reason.
    let e = eventually(10, "locked's error", || {
        property_error(http, "env-1", "locked")
    });
    assert!(e.contains("Read not permitted"), "{e}");

    // The temperature notifies: a change arrives without polling it. Battery and counter share
    // one characteristic and are read with one request per cycle.
    let polled_before = bluez.reads(ENV, HUMIDITY);
    let status_before = bluez.reads(ENV, STATUS);
    let notified_before = bluez.reads(ENV, TEMPERATURE);
    bluez.set(ENV, TEMPERATURE, "5cf9"); // -17.00
    eventually(5, "the notified temperature", || {
        (value(&node, "env-1", "temperature")? == "-17").then_some(())
    });
    bluez.set(ENV, STATUS, "560103");
    eventually(5, "battery and counter", || {
        let t = node.twin("default/env-1")?;
        (reported(&t, "battery")? == "86" && reported(&t, "counter")? == "259").then_some(())
    });
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let polled = bluez.reads(ENV, HUMIDITY) - polled_before;
    let status = bluez.reads(ENV, STATUS) - status_before;
    assert!(
        polled >= 3,
        "humidity is polled every 200 ms: {polled} reads"
    );
    assert!(
        status <= polled + 1,
        "battery and counter share one read: {status} reads of their characteristic, {polled} of humidity's"
    );
    assert_eq!(
        bluez.reads(ENV, TEMPERATURE),
        notified_before,
        "the notifying temperature is not polled"
    );

    // A desired value is written to the characteristic and read back.
    node.kectl(&["twin", "set", "default/env-1", "led", "true"]);
    eventually(10, "the LED characteristic written", || {
        (bluez.get(ENV, LED) == "01").then_some(())
    });
    eventually(10, "led reported true", || {
        (value(&node, "env-1", "led")? == "true").then_some(())
    });
    // Part of a characteristic is written by read-modify-write: the battery byte stays.
    node.kectl(&["twin", "set", "default/env-1", "counter", "513"]);
    eventually(10, "the counter written into its characteristic", || {
        (bluez.get(ENV, STATUS) == "560201").then_some(())
    });
    eventually(10, "counter reported 513", || {
        (value(&node, "env-1", "counter")? == "513").then_some(())
    });
    // A characteristic that cannot be written is refused with its flags, and kept.
    node.kectl(&["twin", "set", "default/env-1", "label", "hall-b"]);
    eventually(10, "the refusal in the mapper's log", || {
        mapper
            .log_text()
            .contains("is not writable (flags: read)")
            .then_some(())
    });
    assert_eq!(
        bluez.get(ENV, "00002a00-0000-1000-8000-00805f9b34fb"),
        "656e762d3100"
    );
    // A notification too short for its field fails that property, and the device stays online.
    bluez.set(ENV, TEMPERATURE, "07");
    let e = eventually(10, "the short notification's error", || {
        property_error(http, "env-1", "temperature")
    });
    assert!(e.contains("past the end of a 1-byte frame"), "{e}");
    assert_eq!(state(&node, "env-1").as_deref(), Some("online"));

    // A live read through the mapper's REST API.
    let (status_code, live) = get(
        &agent(),
        &format!("http://127.0.0.1:{http}/api/v1/device/default/env-1/humidity"),
    );
    assert_eq!(status_code, 200, "{live}");

    // A device that is not there is offline, and says why.
    eventually(15, "not-here offline", || {
        (state(&node, "not-here")? == "offline").then_some(())
    });
    let (_, dev) = get(
        &agent(),
        &format!("http://127.0.0.1:{http}/api/v1/device/default/not-here"),
    );
    let why = dev["data"]["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        why.contains("AA:BB:CC:00:00:09 was not seen by hci0"),
        "{dev}"
    );

    // The sensor goes out of range: offline at once; back in range: online again, notifying.
    bluez.vanish(ENV);
    eventually(10, "env-1 offline", || {
        (state(&node, "env-1")? == "offline").then_some(())
    });
    assert_eq!(
        value(&node, "thermo-2", "temperature").as_deref(),
        Some("-0.12"),
        "the other device is not disturbed"
    );
    bluez.appear(ENV);
    eventually(20, "env-1 online again", || {
        (state(&node, "env-1")? == "online").then_some(())
    });
    bluez.set(ENV, TEMPERATURE, "2c01"); // 3.00
    eventually(10, "a notification after reconnecting", || {
        (value(&node, "env-1", "temperature")? == "3").then_some(())
    });
}
