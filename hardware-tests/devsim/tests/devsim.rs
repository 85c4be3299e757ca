//! `devsim` against what reads it: raw registers read with tokio-modbus's client and compared
//! with words worked out by hand for every data type and byte order, and the real
//! `mapper-modbus` under the real `edgecore` reading the declared values into the twin; wrong
//! declarations and scenarios named with their field paths; faults seen in the twin.

use devsim::layout::load;
use devsim::run::{Options, start};
use devsim::scenario::Scenario;
use sim::{Node, eventually, free_port};
use tokio_modbus::client::{Reader, tcp};

const MODEL: &str = "apiVersion: devices.kubeedge.io/v1beta1
kind: DeviceModel
metadata: {name: matrix, namespace: default}
spec:
  protocol: modbus
  properties:
    - {name: i16, type: INT}
    - {name: u16, type: INT}
    - {name: i32-abcd, type: INT}
    - {name: i32-cdab, type: INT}
    - {name: i32-badc, type: INT}
    - {name: i32-dcba, type: INT}
    - {name: u32, type: INT}
    - {name: f32-abcd, type: FLOAT}
    - {name: f32-cdab, type: FLOAT}
    - {name: f64-dcba, type: DOUBLE}
    - {name: i64, type: INT}
    - {name: text, type: STRING}
    - {name: scaled, type: FLOAT}
    - {name: flag-bit3, type: BOOLEAN, accessMode: ReadOnly}
    - {name: coil, type: BOOLEAN}
    - {name: input, type: INT, accessMode: ReadOnly}
";

/// One property of the matrix: name, visitor, value, and the words (or bit) it must hold,
/// worked out by hand. The value is the desired value of the writable ones.
const MATRIX: &[(&str, &str, &str, &[u16])] = &[
    (
        "i16",
        "{register: HoldingRegister, offset: 0, dataType: int16}",
        "-2",
        &[0xFFFE],
    ),
    (
        "u16",
        "{register: HoldingRegister, offset: 1, dataType: uint16}",
        "65000",
        &[0xFDE8],
    ),
    // -100000 = 0xFFFE7960
    (
        "i32-abcd",
        "{register: HoldingRegister, offset: 2, dataType: int32}",
        "-100000",
        &[0xFFFE, 0x7960],
    ),
    (
        "i32-cdab",
        "{register: HoldingRegister, offset: 4, dataType: int32, isRegisterSwap: true}",
        "-100000",
        &[0x7960, 0xFFFE],
    ),
    (
        "i32-badc",
        "{register: HoldingRegister, offset: 6, dataType: int32, isSwap: true}",
        "-100000",
        &[0xFEFF, 0x6079],
    ),
    (
        "i32-dcba",
        "{register: HoldingRegister, offset: 8, dataType: int32, isSwap: true, isRegisterSwap: true}",
        "-100000",
        &[0x6079, 0xFEFF],
    ),
    // 3000000000 = 0xB2D05E00
    (
        "u32",
        "{register: HoldingRegister, offset: 10, dataType: uint32}",
        "3000000000",
        &[0xB2D0, 0x5E00],
    ),
    // 12.5f32 = 0x41480000
    (
        "f32-abcd",
        "{register: HoldingRegister, offset: 12, dataType: float32}",
        "12.5",
        &[0x4148, 0x0000],
    ),
    (
        "f32-cdab",
        "{register: HoldingRegister, offset: 14, dataType: float32, byteOrder: CDAB}",
        "12.5",
        &[0x0000, 0x4148],
    ),
    // -2.5f64 = 0xC004000000000000, little-endian
    (
        "f64-dcba",
        "{register: HoldingRegister, offset: 16, dataType: float64, byteOrder: DCBA}",
        "-2.5",
        &[0x0000, 0x0000, 0x0000, 0x04C0],
    ),
    (
        "i64",
        "{register: HoldingRegister, offset: 20, dataType: int64}",
        "-1",
        &[0xFFFF, 0xFFFF, 0xFFFF, 0xFFFF],
    ),
    (
        "text",
        "{register: HoldingRegister, offset: 24, dataType: string, limit: 2}",
        "AB",
        &[0x4142, 0x0000],
    ),
    // KubeEdge's usual form: no dataType, one register, a scale.
    (
        "scaled",
        "{register: HoldingRegister, offset: 26, limit: 1, scale: 0.1}",
        "21.5",
        &[215],
    ),
    (
        "flag-bit3",
        "{register: HoldingRegister, offset: 27, dataType: bool, bit: 3}",
        "true",
        &[0x0008],
    ),
    ("coil", "{register: CoilRegister, offset: 0}", "true", &[1]),
    (
        "input",
        "{register: InputRegister, offset: 0, dataType: uint16}",
        "4242",
        &[4242],
    ),
];

const READ_ONLY: &[&str] = &["flag-bit3", "input"];

/// A scenario in which the given properties hold their matrix value from the start.
/// Served on loopback, each device on a port of its own the system picks.
fn local() -> Options {
    Options {
        bind: Some("127.0.0.1".into()),
        port0: true,
        ..Options::default()
    }
}

fn constants(names: &[&str]) -> Scenario {
    let mut text = String::from("devices:\n  matrix-1:\n    properties:\n");
    for (name, _, value, _) in MATRIX.iter().filter(|m| names.contains(&m.0)) {
        text.push_str(&format!(
            "      {name}: {{value: {{constant: \"{value}\"}}}}\n"
        ));
    }
    Scenario::parse(&text).expect("scenario")
}

fn matrix_manifest(port: u16) -> String {
    let mut props = String::new();
    for (name, visitor, desired, _) in MATRIX {
        let desired = if READ_ONLY.contains(name) {
            String::new()
        } else {
            format!("      desired: {{value: \"{desired}\"}}\n")
        };
        props.push_str(&format!(
            "    - name: {name}\n      collectCycle: 200\n      reportCycle: 200\n{desired}      visitors: {{protocolName: modbus, configData: {visitor}}}\n"
        ));
    }
    format!(
        "{MODEL}---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {{name: matrix-1, namespace: default}}\nspec:\n  deviceModelRef: {{name: matrix}}\n  protocol:\n    protocolName: modbus\n    configData: {{ip: 127.0.0.1, port: {port}}}\n  properties:\n{props}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_type_and_byte_order_is_laid_out_as_declared() {
    let devices = load(&matrix_manifest(5020)).expect("a valid manifest");
    let options = local();
    // Each property holds its value from the scenario (a constant).
    let names: Vec<&str> = MATRIX.iter().map(|m| m.0).collect();
    let scenario = constants(&names);
    let served = start(devices, &scenario, &options).await.expect("served");
    // The first tick has put the constants in.
    let sim = served[0].sim.clone();
    let coil = || sim.edit(|s| s.coils.get(&0).copied());
    while coil() != Some(true) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let mut ctx = tcp::connect(served[0].address).await.expect("connected");
    for (name, visitor, _, words) in MATRIX {
        let offset: u16 = visitor
            .split("offset: ")
            .nth(1)
            .and_then(|s| s.split([',', '}']).next())
            .and_then(|s| s.trim().parse().ok())
            .expect("offset");
        let got: Vec<u16> = if visitor.contains("CoilRegister") {
            ctx.read_coils(offset, 1)
                .await
                .expect("transport")
                .expect("answer")
                .into_iter()
                .map(u16::from)
                .collect()
        } else if visitor.contains("InputRegister") {
            ctx.read_input_registers(offset, words.len() as u16)
                .await
                .expect("transport")
                .expect("answer")
        } else {
            ctx.read_holding_registers(offset, words.len() as u16)
                .await
                .expect("transport")
                .expect("answer")
        };
        assert_eq!(&got, words, "{name}: {got:04X?} instead of {words:04X?}");
    }
}

/// The real mapper-modbus under the real edgecore writes every declared desired value to the
/// simulated device and reads it back into the twin unchanged.
#[test]
fn mapper_modbus_reads_the_declared_values() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // Served on a port the system picks; edgecore is told that one.
    let options = local();
    let served = rt
        .block_on(start(
            load(&matrix_manifest(5020)).expect("valid"),
            &constants(READ_ONLY),
            &options,
        ))
        .expect("served");
    let node = Node::start(&matrix_manifest(served[0].address.port()));
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
    for (name, _, desired, _) in MATRIX {
        let want = desired.to_string();
        sim::poll::eventually_or(60, &format!("{name} = {want} in the twin"), || {
            let twin = node.twin("default/matrix-1").unwrap_or_default();
            match sim::reported(&twin, name).as_deref() == Some(want.as_str()) {
                true => Ok(()),
                false => Err(format!("{twin:#}")),
            }
        });
    }
}

#[test]
fn wrong_declarations_are_named_with_their_field_paths() {
    let manifest = format!(
        "{MODEL}---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {{name: bad, namespace: default}}\nspec:\n  deviceModelRef: {{name: matrix}}\n  protocol: {{protocolName: modbus, configData: {{ip: 127.0.0.1, port: 5020}}}}\n  properties:\n    - {{name: i16, visitors: {{protocolName: modbus, configData: {{register: HoldingRegister, offset: 0, dataType: int32}}}}}}\n    - {{name: u16, visitors: {{protocolName: modbus, configData: {{register: HoldingRegister, offset: 1}}}}}}\n    - {{name: i32-abcd, visitors: {{protocolName: modbus, configData: {{register: HoldingRegister, offset: 4, dataType: int32, limit: 1}}}}}}\n    - {{name: u32, visitors: {{protocolName: modbus, configData: {{register: Holding-ish, offset: 9}}}}}}\n"
    );
    let e = load(&manifest).expect_err("two mistakes").to_string();
    for want in [
        "Device default/bad: spec.properties[2].visitors.configData.limit: 1 registers, but a int32 takes 2",
        "Device default/bad: spec.properties[3].visitors.configData.register: \"Holding-ish\" is not one of",
    ] {
        assert!(e.contains(want), "{want}\nnot in:\n{e}");
    }
    let missing = "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: lone}\nspec:\n  deviceModelRef: {name: nowhere}\n  protocol: {protocolName: modbus, configData: {ip: 127.0.0.1}}\n";
    let e = load(missing).expect_err("no model").to_string();
    assert!(
        e.contains("Device default/lone: spec.deviceModelRef.name: model default/nowhere is not in the manifests"),
        "{e}"
    );
}

#[test]
fn scenario_mistakes_are_named_with_their_field_paths() {
    for (text, want) in [
        (
            "devices: {oven-1: {properties: {temperature: {value: {ramp: {from: 1, to: 2}}}}}}",
            "devices.oven-1.properties.temperature.value",
        ),
        (
            "devices: {oven-1: {faults: [{kind: exception, at: 1}]}}",
            "devices.oven-1.faults[0].code: an exception needs its code",
        ),
        (
            "devices: {oven-1: {faults: [{kind: noAnswer, share: 0.5}]}}",
            "devices.oven-1.faults[0].share: only an exception",
        ),
        ("devices: {oven-1: {fault: []}}", "devices.oven-1"),
        (
            "devices: {oven-1: {faults: [{kind: explode, at: 1}]}}",
            "devices.oven-1.faults[0].kind",
        ),
    ] {
        let e = Scenario::parse(text).expect_err(text).to_string();
        assert!(e.contains(want), "{text}: {e}");
    }
}

/// The scenario's values reach the twin through the real mapper; an exception fault and a
/// device that stops answering show as the device's state and reason.
#[test]
fn scenario_values_and_faults_show_in_the_twin() {
    let manifest = |port: u16| {
        std::fs::read_to_string(sim::workspace_root().join("examples/modbus-tcp.yaml"))
            .expect("example")
            .replace("port: 5020", &format!("port: {port}"))
            .replace("nodeName: edge-node-1", "nodeName: test-node")
    };
    let scenario = Scenario::parse(
        "devices:\n  oven-1:\n    properties:\n      temperature: {value: {steps: [{at: 0, value: 42.5}, {at: 4, value: 43.5}]}}\n    faults:\n      - {kind: exception, code: 4, at: 8, seconds: 10}\n      - {kind: noAnswer, at: 18}\n",
    )
    .expect("scenario");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // The clock starts with the mapper's first read: the scenario plays the same however
    // long edgecore and the mapper take to start.
    let options = Options {
        clock_from_first_request: true,
        ..local()
    };
    let served = rt
        .block_on(start(
            load(&manifest(5020)).expect("valid"),
            &scenario,
            &options,
        ))
        .expect("served");
    let node = Node::start(&manifest(served[0].address.port()));
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
    let twin = || node.twin("default/oven-1").unwrap_or_default();
    eventually(60, "43.5 (the second step) in the twin", || {
        (sim::reported(&twin(), "temperature").as_deref() == Some("43.5")).then_some(())
    });
    let failing = eventually(60, "the exception in the twin", || {
        let t = twin();
        (t["state"] == "unhealthy").then_some(t)
    });
    eprintln!(
        "during the exception: state {} reason {}",
        failing["state"], failing["stateReason"]
    );
    assert!(
        failing["stateReason"]
            .as_str()
            .is_some_and(|r| r.contains("exception Server device failure")),
        "exception 4 by name: {failing}"
    );
    let silent = eventually(90, "the device offline when it stops answering", || {
        let t = twin();
        (t["state"] == "offline").then_some(t)
    });
    assert!(
        silent["stateReason"]
            .as_str()
            .is_some_and(|r| r.contains("did not answer")),
        "{silent}"
    );
    eprintln!(
        "when silent: state {} reason {}",
        silent["state"], silent["stateReason"]
    );
}

fn gateway_device(name: &str, unit: u8, port: u16) -> String {
    format!(
        "---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  deviceModelRef: {{name: matrix}}\n  protocol: {{protocolName: modbus, configData: {{ip: 127.0.0.1, port: {port}, slaveID: {unit}}}}}\n  properties:\n    - {{name: u16, visitors: {{protocolName: modbus, configData: {{register: HoldingRegister, offset: 0}}}}}}\n"
    )
}

/// Several devices behind one Modbus TCP address (a gateway), each by its unit id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_behind_one_gateway_answer_by_unit_id() {
    use tokio_modbus::Slave;
    let manifest = format!(
        "{MODEL}{}{}",
        gateway_device("left", 3, 5020),
        gateway_device("right", 4, 5020)
    );
    let scenario = Scenario::parse(
        "devices:\n  left: {properties: {u16: {value: {constant: 111}}}}\n  right: {properties: {u16: {value: {constant: 222}}}}\n",
    )
    .expect("scenario");
    let options = local();
    let served = start(load(&manifest).expect("valid"), &scenario, &options)
        .await
        .expect("served");
    assert_eq!(served[0].address, served[1].address, "one address");
    for (unit, want) in [(3u8, 111u16), (4, 222)] {
        let mut ctx = tcp::connect_slave(served[0].address, Slave(unit))
            .await
            .expect("connect");
        let got = eventually(10, "the scenario's value", || {
            let rt = tokio::runtime::Handle::current();
            let r = tokio::task::block_in_place(|| rt.block_on(ctx.read_holding_registers(0, 1)));
            match r {
                Ok(Ok(w)) if w == [want] => Some(w),
                _ => None,
            }
        });
        assert_eq!(got, [want], "unit {unit}");
    }
    // A unit id nobody has: exception 11 (gateway target device failed to respond).
    let mut ctx = tcp::connect_slave(served[0].address, Slave(9))
        .await
        .expect("connect");
    let r = ctx.read_holding_registers(0, 1).await.expect("an answer");
    assert_eq!(r, Err(tokio_modbus::ExceptionCode::GatewayTargetDevice));
}

/// Several Devices on one unit (views of one PLC) and two properties on one register are what
/// the gateway takes: served as one register map, each view reading what the other drives.
/// Two behaviours on the same registers, and scenario keys in no manifest, are named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_of_one_unit_share_its_registers() {
    let view = |name: &str| {
        format!(
            "---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  deviceModelRef: {{name: matrix}}\n  protocol: {{protocolName: modbus, configData: {{ip: 127.0.0.1, port: 5020, slaveID: 3}}}}\n  properties:\n    - {{name: u16, visitors: {{protocolName: modbus, configData: {{register: HoldingRegister, offset: 0}}}}}}\n    - {{name: i16, visitors: {{protocolName: modbus, configData: {{register: HoldingRegister, offset: 0, dataType: int16}}}}}}\n    - {{name: flag-bit3, visitors: {{protocolName: modbus, configData: {{register: HoldingRegister, offset: 0, bit: 3}}}}}}\n"
        )
    };
    let manifest = format!("{MODEL}{}{}", view("press"), view("press-maintenance"));
    let devices = load(&manifest).expect("views of one unit are valid");
    assert_eq!(devices.len(), 2);
    let scenario =
        Scenario::parse("devices:\n  press: {properties: {u16: {value: {constant: 65534}}}}\n")
            .expect("scenario");
    let options = local();
    let served = start(devices.clone(), &scenario, &options)
        .await
        .expect("served");
    // 65534 = 0xFFFE: as int16 -2, bit 3 set; the same in both views.
    for s in &served {
        for (prop, want) in [("u16", "65534"), ("i16", "-2"), ("flag-bit3", "true")] {
            let p = s
                .device
                .points
                .iter()
                .find(|p| p.name == prop)
                .expect("point");
            let got = eventually(10, "the driven value in every view", || {
                s.sim
                    .edit(|st| devsim::run::value_of(st, p))
                    .filter(|v| v == want)
            });
            assert_eq!(got, want, "{} {prop}", s.id);
        }
    }
    let mut ctx = tcp::connect(served[1].address).await.expect("connect");
    let w = eventually(10, "the register on the wire", || {
        let rt = tokio::runtime::Handle::current();
        match tokio::task::block_in_place(|| rt.block_on(ctx.read_holding_registers(0, 1))) {
            Ok(Ok(w)) if w == [0xFFFE] => Some(w),
            _ => None,
        }
    });
    assert_eq!(w, [0xFFFE]);

    for (text, path, words) in [
        (
            "devices:\n  press: {properties: {u16: {value: {constant: 1}}}}\n  press-maintenance: {properties: {i16: {value: {constant: 2}}}}\n",
            "devices.press-maintenance.properties.i16.value",
            "default/press u16 drives the same registers of unit 3 at 127.0.0.1:5020",
        ),
        (
            "devices:\n  press: {properties: {u16: {value: {constant: 1}}, flag-bit3: {value: {constant: true}}}}\n",
            "devices.press.properties.u16.value",
            "drives the same registers",
        ),
        (
            "devices:\n  presss: {properties: {u16: {value: {constant: 1}}}}\n",
            "devices.presss",
            "no simulated Device default/presss in the manifests (they have: default/press, default/press-maintenance)",
        ),
        (
            "devices:\n  press: {properties: {u61: {value: {constant: 1}}}}\n",
            "devices.press.properties.u61",
            "Device default/press has no property u61 (its properties: u16, i16, flag-bit3)",
        ),
    ] {
        let scenario = Scenario::parse(text).expect("parses");
        let e = scenario
            .check_against(&devices)
            .expect_err("refused")
            .to_string();
        assert!(
            e.contains(path) && e.contains(words),
            "{path} / {words}\nnot in: {e}"
        );
        let e = start(devices.clone(), &scenario, &options)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains(words), "start: {e}");
    }
}

/// A serial declaration that cannot carry its type is named with its field path.
#[test]
fn a_serial_pattern_that_cannot_carry_its_value_is_named() {
    let manifest = "apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata: {name: probe, namespace: default}\nspec:\n  protocol: serial\n  properties:\n    - {name: temperature, type: FLOAT}\n---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: p, namespace: default}\nspec:\n  deviceModelRef: {name: probe}\n  protocol: {protocolName: serial, configData: {serialPort: /dev/ttyS9, baudRate: 9600}}\n  properties:\n    - {name: temperature, visitors: {protocolName: serial, configData: {request: 'T?', pattern: 'T=([a-z]+)'}}}\n";
    let e = load(manifest).expect_err("letters for a float").to_string();
    assert!(
        e.contains("Device default/p: spec.properties[0].visitors.configData.pattern: devsim cannot make a reply that pattern \"T=([a-z]+)\" reads as \"0\""),
        "{e}"
    );
}

/// A fault a device cannot have (an exception code from an OPC UA server) is refused before
/// anything is served, naming the device and what it can have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_the_protocol_cannot_have_is_named() {
    let manifest = std::fs::read_to_string(sim::workspace_root().join("examples/opcua.yaml"))
        .expect("example");
    let scenario = Scenario::parse(
        "devices:\n  line-1:\n    faults:\n      - {kind: exception, code: 4, at: 1}\n",
    )
    .expect("scenario");
    let options = local();
    let e = start(load(&manifest).expect("valid"), &scenario, &options)
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("default/line-1: a Exception fault is Modbus's; an OPC UA server can be silent (noAnswer), rebooted or disconnected"),
        "{e}"
    );
}

/// A scenario value that does not fit its register is said once, not at every tick (it flooded
/// the log at ten lines a second).
#[test]
fn a_value_that_does_not_fit_is_said_once() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = dir.path().join("scenario.yaml");
    // 99999 degrees in steps of 0.1: 999990 does not fit the oven's 16-bit register.
    std::fs::write(
        &scenario,
        "devices:\n  oven-1:\n    properties:\n      temperature: {value: {constant: 99999}}\n",
    )
    .expect("write");
    let example = std::fs::read_to_string(sim::workspace_root().join("examples/modbus-tcp.yaml"))
        .expect("the example");
    let manifest = dir.path().join("oven.yaml");
    std::fs::write(
        &manifest,
        example.replace("port: 5020", &format!("port: {}", sim::free_port())),
    )
    .expect("write");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_devsim"))
        .arg(&manifest)
        .arg("--scenario")
        .arg(&scenario)
        .args(["--bind", "127.0.0.1"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("devsim runs");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut log = Vec::new();
    // The first time it is said (however slow the start), then two more seconds of ticks (ten
    // a second): twenty chances to say it again.
    let first = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !log
        .iter()
        .any(|l: &String| l.contains("does not fit its register"))
        && std::time::Instant::now() < first
    {
        if let Ok(l) = rx.recv_timeout(std::time::Duration::from_millis(100)) {
            log.push(l);
        }
    }
    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < until {
        if let Ok(l) = rx.recv_timeout(std::time::Duration::from_millis(100)) {
            log.push(l);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let said = log
        .iter()
        .filter(|l| l.contains("does not fit its register"))
        .count();
    assert_eq!(said, 1, "{}", log.join("\n"));
}

/// Two properties on one OPC UA node (one polled, one subscribed), as mapper-opcua takes them:
/// devsim serves the node once and both read its value through edgecore and the mapper.
#[test]
fn two_properties_on_one_opcua_node_are_served() {
    let manifest = |port: u16| {
        std::fs::read_to_string(sim::workspace_root().join("examples/opcua.yaml"))
            .expect("example")
            .replace(
                "    - name: running\n      type: BOOLEAN",
                "    - name: speed-watched\n      type: DOUBLE\n      accessMode: ReadOnly\n      visitors:\n        protocolName: opcua\n        configData: {nodeID: \"ns=2;s=Line1.Speed\", dataType: double, subscribe: true}\n    - name: running\n      type: BOOLEAN",
            )
            .replace(
                "    - name: running\n      collectCycle: 1000",
                "    - name: speed-watched\n    - name: running\n      collectCycle: 1000",
            )
            .replace("opc.tcp://127.0.0.1:4840", &format!("opc.tcp://127.0.0.1:{port}"))
            .replace("nodeName: edge-node-1", "nodeName: test-node")
            // No write: both read what the simulated device holds.
            .replace("      desired:\n        value: \"120.5\"\n", "")
    };
    let scenario = Scenario::parse(
        "devices:\n  line-1:\n    properties:\n      line-speed: {value: {constant: \"42.5\"}}\n",
    )
    .expect("scenario");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let served = rt
        .block_on(start(
            load(&manifest(4840)).expect("valid"),
            &scenario,
            &local(),
        ))
        .expect("served: one node for both properties");
    let node = Node::start(&manifest(served[0].address.port()));
    let _mapper = node.mapper("mapper-opcua", "opcua", free_port());
    sim::poll::eventually_or(60, "both properties read the node's value", || {
        let twin = node.twin("default/line-1").unwrap_or_default();
        let got = |p| sim::reported(&twin, p).unwrap_or_default();
        match (got("line-speed").as_str(), got("speed-watched").as_str()) {
            ("42.5", "42.5") => Ok(()),
            _ => Err(format!("{twin:#}")),
        }
    });
}
