//! The real `edgecore` and `mapper-ble` against a real BLE peripheral through the machine's own
//! BlueZ (a Bluetooth adapter and `bluetoothd` on the system bus). Ignored unless asked for; the
//! device and its characteristics are KubeEdge `configData` written as YAML flow mappings (see
//! `hardware-tests/README.md`):
//!
//! ```sh
//! BLE_DEVICE_CONFIG='{macAddress: "C4:7C:8D:6A:12:34"}' \
//! BLE_READ='{characteristicUUID: 2A19, dataType: uint8}' \
//! BLE_WRITE='{characteristicUUID: "0000ff01-0000-1000-8000-00805f9b34fb", dataType: uint8}' BLE_WRITE_VALUE=1 \
//!   cargo test -p mapper-ble --test real_radio -- --ignored
//! ```
//!
//! `BLE_READ` defaults to the Battery Level characteristic (`2A19`), which most peripherals have.

use sim::{Node, agent, env_var, eventually, free_port, get, reported};

fn manifest() -> String {
    let config = env_var("BLE_DEVICE_CONFIG").unwrap_or_else(|| {
        panic!(
            "set BLE_DEVICE_CONFIG to the device's protocol configData, e.g. \
             '{{macAddress: \"C4:7C:8D:6A:12:34\"}}' or '{{localName: \"env-1\"}}'"
        )
    });
    let read =
        env_var("BLE_READ").unwrap_or_else(|| "{characteristicUUID: 2A19, dataType: uint8}".into());
    let write = env_var("BLE_WRITE");
    sim::fixture::RealDevice {
        protocol: "ble",
        model: "real-ble",
        device: "peripheral",
        config: &config,
        read: &read,
        write: write.as_deref(),
        cycle_ms: 2000,
    }
    .manifest()
}

#[test]
#[ignore = "needs a Bluetooth adapter and a peripheral: set BLE_DEVICE_CONFIG (see the file's comment)"]
fn real_peripheral_reaches_the_twin_and_takes_a_write() {
    let node = Node::start(&manifest());
    let http = free_port();
    let _mapper = node.mapper("mapper-ble", "ble", http);
    let value = eventually(60, "the peripheral's value in the twin", || {
        let t = node.twin("default/peripheral")?;
        reported(&t, "value").filter(|_| t["state"] == "online")
    });
    println!("read {value}");
    let (status, live) = get(
        &agent(),
        &format!("http://127.0.0.1:{http}/api/v1/device/default/peripheral/value"),
    );
    assert_eq!(status, 200, "live read: {live}");
    if let (Some(_), Some(want)) = (env_var("BLE_WRITE"), env_var("BLE_WRITE_VALUE")) {
        node.kectl(&["twin", "set", "default/peripheral", "target", &want]);
        eventually(30, "the written value read back", || {
            (reported(&node.twin("default/peripheral")?, "target")? == want).then_some(())
        });
    }
}
