//! The real `edgecore` and `mapper-modbus` against a real Modbus device, TCP or RTU. Ignored
//! unless asked for; the device is described by environment variables whose values are
//! KubeEdge `configData` written as YAML flow mappings (see `hardware-tests/README.md`):
//!
//! ```sh
//! PLC_MODBUS_CONFIG='{ip: 192.168.1.10, port: 502, slaveID: 1}' \
//! PLC_MODBUS_READ='{register: HoldingRegister, offset: 0, limit: 1}' \
//! PLC_MODBUS_WRITE='{register: HoldingRegister, offset: 100}' \
//!   cargo test -p hardware-tests --test real_plc -- --ignored --test-threads 1
//! ```

use sim::{Node, agent, env_var, eventually, free_port, get, reported};

/// `PLC_MODBUS_CONFIG`, required by every test here.
fn config() -> String {
    env_var("PLC_MODBUS_CONFIG").unwrap_or_else(|| {
        panic!(
            "set PLC_MODBUS_CONFIG to the device's protocol configData, e.g. \
             '{{ip: 192.168.1.10, port: 502, slaveID: 1}}' or \
             '{{serialPort: /dev/ttyUSB0, baudRate: 9600, parity: even, slaveID: 1}}'"
        )
    })
}

/// A device `plc` with the property `value` read from `PLC_MODBUS_READ` (holding register 0
/// by default) and, given `write`, the property `target` at that visitor.
fn manifest(write: Option<&str>) -> String {
    let read = env_var("PLC_MODBUS_READ")
        .unwrap_or_else(|| "{register: HoldingRegister, offset: 0, limit: 1}".into());
    let config = config();
    sim::fixture::RealDevice {
        protocol: "modbus",
        model: "real-plc",
        device: "plc",
        config: &config,
        read: &read,
        write,
        cycle_ms: 500,
    }
    .manifest()
}

#[test]
#[ignore = "needs a real Modbus device: set PLC_MODBUS_CONFIG (hardware-tests/README.md)"]
fn a_real_device_is_read_into_the_twin_and_live() {
    let node = Node::start(&manifest(None));
    let http = free_port();
    let _mapper = node.mapper("mapper-modbus", "modbus", http);
    let value = eventually(30, "a value read from the device in the twin", || {
        reported(&node.twin("default/plc")?, "value")
    });
    eprintln!("the device's value: {value}");
    let twin = eventually(10, "the device online", || {
        node.twin("default/plc")
            .filter(|t| t["state"].as_str() == Some("online"))
    });
    assert_eq!(twin["state"], "online");
    // A live read through the mapper's REST API answers from the device.
    let (status, body) = get(
        &agent(),
        &format!("http://127.0.0.1:{http}/api/v1/device/default/plc/value"),
    );
    assert_eq!(status, 200, "live read: {body}");
    assert!(body["data"]["value"].is_string(), "live read: {body}");
}

#[test]
#[ignore = "needs a real Modbus device and a register it may write: set PLC_MODBUS_CONFIG and PLC_MODBUS_WRITE"]
fn a_desired_value_is_written_to_a_real_device_and_the_old_one_restored() {
    let write = env_var("PLC_MODBUS_WRITE").unwrap_or_else(|| {
        panic!(
            "set PLC_MODBUS_WRITE to the configData of a register this test may change and \
             restore, e.g. '{{register: HoldingRegister, offset: 100}}'"
        )
    });
    let node = Node::start(&manifest(Some(&write)));
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
    let original: i64 = eventually(30, "the register's value in the twin", || {
        reported(&node.twin("default/plc")?, "target")
    })
    .parse()
    .expect("an INT register reads as an integer");
    let changed = if original < 32767 {
        original + 1
    } else {
        original - 1
    };
    for value in [changed, original] {
        let value = value.to_string();
        node.kectl(&["twin", "set", "default/plc", "target", &value]);
        eventually(15, &format!("the device reporting {value}"), || {
            let twin = node.twin("default/plc")?;
            (reported(&twin, "target")? == value).then_some(())
        });
    }
}
