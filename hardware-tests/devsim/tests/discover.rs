//! `devsim discover` as a user runs it, against pymodbus's Modbus TCP server (a simulator the
//! project did not write, `sims/modbus_server.py`, whose layout is known): what it drafts is
//! that layout (the float in each word order, the negative 16-bit value, the text, the hole at
//! 21-29), the draft passes `kectl validate` and `devsim --check`, and applied to edgecore with
//! mapper-modbus every drafted property reads the server's value; the starting HIL file it
//! writes (`--hil`) passes. The scan only reads: the writable registers hold what they held.

use std::process::Command;

fn run(bin: &std::path::Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(bin).args(args).output().expect("runs");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn a_draft_of_a_pymodbus_server_is_its_layout_and_reads_its_values() {
    let port = sim::free_port();
    let _server = sim::PyModbus::start(port);
    let dir = tempfile::tempdir().expect("tempdir");
    let draft = dir.path().join("draft.yaml");
    let devsim = std::path::PathBuf::from(env!("CARGO_BIN_EXE_devsim"));
    let (code, out) = run(
        &devsim,
        &[
            "discover",
            &format!("127.0.0.1:{port}"),
            "--units",
            "1-2",
            "--last-address",
            "60",
            "--name",
            "plc",
            "-o",
            draft.to_str().expect("path"),
            "--hil",
            dir.path().join("plc-hil.yaml").to_str().expect("path"),
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("2 of 2 unit ids answered"), "{out}");
    let text = std::fs::read_to_string(&draft).expect("a draft");
    for want in [
        "- name: hr-0   # read 650",
        "- name: hr-1   # two registers that read as a float32 (ABCD): 123.456",
        "- name: hr-3   # two registers that read as a float32, low word first (CDAB): 123.456",
        "- name: hr-5   # 65534 as unsigned: a small negative number? read -2",
        "- name: hr-10   # 3 registers that read as text: \"PLC-7\"",
        "- name: hr-30   # read 30",
        "- name: coil-0   # read true",
        "- name: coil-1   # read false",
        "# Unit 2 answers exactly as unit 1",
        "configData: {register: HoldingRegister, offset: 3, dataType: float32, byteOrder: CDAB}",
    ] {
        assert!(text.contains(want), "{want}\nnot in:\n{text}");
    }
    // 21-29 refuse every read: nothing drafted there.
    for hole in 21..30 {
        assert!(
            !text.contains(&format!("name: hr-{hole} ")),
            "hr-{hole}:\n{text}"
        );
    }

    let kectl = sim::bin("kectl");
    let (code, out) = run(&kectl, &["validate", draft.to_str().expect("path")]);
    assert_eq!(code, 0, "kectl validate: {out}");
    assert!(out.contains("0 error(s)"), "{out}");
    let (code, out) = run(&devsim, &[draft.to_str().expect("path"), "--check"]);
    assert_eq!(code, 0, "devsim --check: {out}");

    // The starting HIL file: devsim holds the values read, and the twin reports each.
    let (code, out) = run(
        &devsim,
        &[
            "hil",
            dir.path().join("plc-hil.yaml").to_str().expect("path"),
        ],
    );
    assert_eq!(code, 0, "the drafted HIL run: {out}");
    assert!(out.contains("plc hr-1: reported 123.456"), "{out}");

    // Applied: every drafted property reads the server's value.
    let node = sim::Node::start(&text);
    let _mapper = node.mapper("mapper-modbus", "modbus", sim::free_port());
    for (prop, want) in [
        ("hr-0", "650"),
        ("hr-1", "123.456"),
        ("hr-3", "123.456"),
        ("hr-5", "-2"),
        ("hr-10", "PLC-7"),
        ("hr-30", "30"),
        ("hr-39", "39"),
        ("coil-0", "true"),
        ("coil-1", "false"),
    ] {
        sim::poll::eventually_or(60, &format!("{prop} = {want} in the twin"), || {
            let twin = node.twin("default/plc").unwrap_or_default();
            match sim::reported(&twin, prop).as_deref() == Some(want) {
                true => Ok(()),
                false => Err(format!("{:#}", twin["properties"][prop])),
            }
        });
    }
}

/// The seed of a drawn layout: `DISCOVER_SEED` to run one again, else a new one per run
/// (printed, so a failure can be run again).
fn seed(salt: u64) -> u64 {
    let seed = std::env::var("DISCOVER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs())
                .wrapping_add(salt)
        });
    eprintln!("layout seed {seed} (DISCOVER_SEED={seed} draws it again)");
    seed
}

/// What a property of a draft reads: table, address, data type, byte order.
type Visit = (String, u64, String, Option<String>);

/// Each drafted Device's properties by name.
fn drafted(text: &str) -> std::collections::BTreeMap<String, Vec<(String, Visit)>> {
    use serde::Deserialize;
    let mut out = std::collections::BTreeMap::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let v = serde_json::Value::deserialize(doc).expect("the draft is YAML");
        if v["kind"] != "Device" {
            continue;
        }
        let name = v["metadata"]["name"].as_str().expect("a name").to_string();
        let props = v["spec"]["properties"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let visits = props
            .iter()
            .map(|p| {
                let c = &p["visitors"]["configData"];
                let s = |k: &str| c[k].as_str().map(str::to_string);
                (
                    p["name"].as_str().expect("a property name").to_string(),
                    (
                        s("register").expect("register"),
                        c["offset"].as_u64().expect("offset"),
                        s("dataType").expect("dataType"),
                        s("byteOrder"),
                    ),
                )
            })
            .collect();
        out.insert(name, visits);
    }
    out
}

/// Checks that the draft holds exactly the drawn layout, unit `u` as the Device `name(u)`:
/// every item at its address with its type and word order, nothing else. The values to expect
/// in the twin: `(device, property, value drawn)`.
fn drafted_as_drawn(
    text: &str,
    layout: &serde_json::Value,
    name: impl Fn(&str) -> String,
    seed: u64,
) -> Vec<(String, String, serde_json::Value)> {
    let draft = drafted(text);
    let mut want_values = Vec::new();
    let units = layout.as_object().expect("units");
    assert_eq!(
        draft.len(),
        units.len(),
        "seed {seed}: one Device per unit:\n{text}"
    );
    for (unit, items) in units {
        let device = name(unit);
        let got = draft
            .get(&device)
            .unwrap_or_else(|| panic!("seed {seed}: no Device {device}:\n{text}"));
        let mut want: Vec<Visit> = Vec::new();
        for item in items.as_array().expect("items") {
            let (data_type, order) = match item["kind"].as_str().expect("kind") {
                "float32cdab" => ("float32", Some("CDAB".to_string())),
                k => (k, None),
            };
            let data_type = if data_type == "bool" {
                "bool"
            } else {
                data_type
            };
            let visit = (
                item["table"].as_str().expect("table").to_string(),
                item["address"].as_u64().expect("address"),
                data_type.to_string(),
                order,
            );
            if let Some((prop, _)) = got.iter().find(|(_, v)| *v == visit) {
                want_values.push((device.clone(), prop.clone(), item["value"].clone()));
            }
            want.push(visit);
        }
        let got_visits: Vec<Visit> = got.iter().map(|(_, v)| v.clone()).collect();
        let missing: Vec<&Visit> = want.iter().filter(|v| !got_visits.contains(v)).collect();
        let extra: Vec<&Visit> = got_visits.iter().filter(|v| !want.contains(v)).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "seed {seed}: unit {unit}: drawn but not drafted {missing:?}; drafted but not drawn {extra:?}\n{text}"
        );
    }
    want_values
}

/// The last address a scan must reach to see the whole drawn `layout` (`sims/modbus_random.py`
/// draws up to seven values from an address below 20 with holes between, so a layout can reach
/// past 150): the highest word or bit drawn, and a few beyond it, where the scan must find none.
fn scan_to(layout: &serde_json::Value) -> String {
    let last = layout
        .as_object()
        .expect("units")
        .values()
        .flat_map(|items| items.as_array().expect("items").iter())
        .map(|i| i["address"].as_u64().expect("address") + i["count"].as_u64().expect("count") - 1)
        .max()
        .unwrap_or(0);
    (last + 8).to_string()
}

/// Whether the twin's reported `got` is the drawn `want`.
fn same_value(got: &str, want: &serde_json::Value) -> bool {
    match want {
        serde_json::Value::Number(n) if n.is_f64() => got
            .parse::<f64>()
            .is_ok_and(|g| (g - n.as_f64().unwrap_or(f64::NAN)).abs() < 0.01),
        // Text as the mapper reports it: trailing spaces trimmed.
        serde_json::Value::String(s) => got == s.trim_end_matches(' '),
        other => {
            let shown = other.to_string();
            got == shown
        }
    }
}

/// Applies the draft to an edgecore with mapper-modbus: every property reads the drawn value.
fn every_property_reads_its_value(text: &str, values: &[(String, String, serde_json::Value)]) {
    let node = sim::Node::start(text);
    let _mapper = node.mapper("mapper-modbus", "modbus", sim::free_port());
    sim::poll::eventually_or(90, "every drafted property reads the drawn value", || {
        for (device, prop, want) in values {
            let twin = node.twin(&format!("default/{device}")).unwrap_or_default();
            let got = sim::reported(&twin, prop).unwrap_or_default();
            if !same_value(&got, want) {
                return Err(format!(
                    "{device} {prop}: {got:?}, drawn {want} ({:#})",
                    twin["properties"][prop]
                ));
            }
        }
        Ok(())
    });
}

fn validates(draft: &std::path::Path) {
    let (code, out) = run(
        &sim::bin("kectl"),
        &["validate", draft.to_str().expect("path")],
    );
    assert_eq!(code, 0, "kectl validate: {out}");
    assert!(out.contains("0 error(s)"), "{out}");
    let devsim = std::path::PathBuf::from(env!("CARGO_BIN_EXE_devsim"));
    let (code, out) = run(&devsim, &[draft.to_str().expect("path"), "--check"]);
    assert_eq!(code, 0, "devsim --check: {out}");
}

/// Random layouts (two units each, holes between values, every kind of value discovery
/// guesses): the draft holds exactly what was drawn, it validates, and the scan wrote nothing.
/// `DISCOVER_LAYOUTS` sets how many (3).
#[test]
fn random_layouts_are_drafted_as_drawn_and_never_written() {
    let n: u64 = std::env::var("DISCOVER_LAYOUTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let devsim = std::path::PathBuf::from(env!("CARGO_BIN_EXE_devsim"));
    let dir = tempfile::tempdir().expect("tempdir");
    for k in 0..n {
        let seed = seed(k * 1000);
        let port = sim::free_port();
        let server = sim::PyModbusRandom::tcp(port, "1,2", seed, dir.path());
        let draft = dir.path().join(format!("draft-{seed}.yaml"));
        let hil = dir.path().join(format!("hil-{seed}.yaml"));
        let (code, out) = run(
            &devsim,
            &[
                "discover",
                &format!("127.0.0.1:{port}"),
                "--units",
                "1-3",
                "--timeout-ms",
                "500",
                // Past the layout, as far as a user scans by default: what lies beyond the
                // values costs probes, not a request per address.
                "--last-address",
                "999",
                "--name",
                "plc",
                "-o",
                draft.to_str().expect("path"),
                "--hil",
                hil.to_str().expect("path"),
            ],
        );
        assert_eq!(code, 0, "seed {seed}: {out}");
        assert!(
            out.contains("2 of 3 unit ids answered"),
            "seed {seed}: {out}"
        );
        // What the scan costs follows what answers, not the 4,000 addresses of each unit's
        // tables (refused blocks split in halves down to single addresses cost ~7,900 a unit).
        let requests: usize = out
            .split(" requests")
            .next()
            .and_then(|s| s.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("seed {seed}: no request count in {out}"));
        assert!(
            requests < 2_000,
            "seed {seed}: {requests} requests for two units"
        );
        let text = std::fs::read_to_string(&draft).expect("a draft");
        let values = drafted_as_drawn(&text, &server.layout, |u| format!("plc-u{u}"), seed);
        validates(&draft);
        assert!(
            server.requests().len() > 10,
            "the scan went through pymodbus"
        );
        assert_eq!(server.writes(), [], "seed {seed}: the scan wrote");
        // Every draft's HIL file passes on the gateway it was drafted for: what it expects is
        // what mapper-modbus reports (text with trailing spaces among it).
        let (code, out) = run(&devsim, &["hil", hil.to_str().expect("path")]);
        assert_eq!(code, 0, "seed {seed}: the drafted HIL run: {out}");
        // The last layout applied: every property reads the value drawn.
        if k + 1 == n {
            every_property_reads_its_value(&text, &values);
            assert_eq!(server.writes(), [], "seed {seed}: the mapper wrote");
        }
    }
}

/// Three slaves at ids and settings not told (19200 baud, odd parity): discover tries the usual
/// settings, finds the one they answer at and the three ids, drafts each as drawn with its line
/// settings, never writes; applied, mapper-modbus reads every value over that line.
#[test]
fn an_rtu_line_at_settings_not_known_is_found_and_drafted() {
    let seed = seed(7);
    let dir = tempfile::tempdir().expect("tempdir");
    let link = dir.path().join("ttyLINE");
    let server = sim::PyModbusRandom::line(&link, "5,17,42", (19200, 'O', 1), seed, dir.path());
    let draft = dir.path().join("line.yaml");
    let devsim = std::path::PathBuf::from(env!("CARGO_BIN_EXE_devsim"));
    let (code, out) = run(
        &devsim,
        &[
            "discover",
            link.to_str().expect("path"),
            "--units",
            "1-50",
            "--last-address",
            &scan_to(&server.layout),
            "--name",
            "line",
            "-o",
            draft.to_str().expect("path"),
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("3 of 50 unit ids answered at 19200 8O1"),
        "{out}"
    );
    let text = std::fs::read_to_string(&draft).expect("a draft");
    assert!(
        text.contains("# Nothing answered at: 9600 8N1, 19200 8N1, 38400 8N1, 115200 8N1"),
        "{text}"
    );
    for id in [5, 17, 42] {
        let want = format!("parity: odd, stopBits: 1, slaveID: {id}}}");
        assert!(text.contains(&want), "{want} not in:\n{text}");
    }
    let values = drafted_as_drawn(&text, &server.layout, |u| format!("line-u{u}"), seed);
    validates(&draft);
    assert_eq!(server.writes(), [], "the scan wrote");
    every_property_reads_its_value(&text, &values);
    assert_eq!(server.writes(), [], "the mapper wrote");
}

/// An asyncua server shaped like a plant (`sims/opcua_plant.py`: folders and objects nested four
/// deep, eleven value types, analog items with ranges and units, writable and read-only nodes):
/// the draft has every variable with its type, access, range and unit, validates, its HIL file
/// passes on devsim, and applied to edgecore with mapper-opcua every property reads the server's
/// value. The server logs every write: there is none.
#[test]
fn an_opcua_plant_is_browsed_into_a_draft_that_reads_its_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = sim::free_port();
    let writes = dir.path().join("writes.log");
    let _server = sim::PySim::start(
        "opcua_plant.py",
        &[&port.to_string(), writes.to_str().expect("path")],
        "pip install asyncua",
    );
    let draft = dir.path().join("plant.yaml");
    let hil = dir.path().join("plant-hil.yaml");
    let devsim = std::path::PathBuf::from(env!("CARGO_BIN_EXE_devsim"));
    let (code, out) = run(
        &devsim,
        &[
            "discover",
            &format!("opc.tcp://127.0.0.1:{port}/plant"),
            "--name",
            "plant",
            "-o",
            draft.to_str().expect("path"),
            "--hil",
            hil.to_str().expect("path"),
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("15 variables found"), "{out}");
    let text = std::fs::read_to_string(&draft).expect("a draft");
    for want in [
        "- name: \"Plant.Line1.Oven.Temperature\"   # read 182.5\n      type: DOUBLE\n      accessMode: ReadOnly\n      minimum: \"0\"\n      maximum: \"300\"\n      unit: \"°C\"",
        "- name: \"Plant.Line1.Oven.Setpoint\"   # read 180\n      type: DOUBLE\n      accessMode: ReadWrite\n      minimum: \"50\"\n      maximum: \"250\"",
        "- name: \"Plant.Line1.Press.Force\"   # read 412.25\n      type: FLOAT",
        "- name: \"Plant.Line1.Press.Mode\"   # read -2\n      type: INT\n      accessMode: ReadWrite",
        "- name: \"Plant.Line2.Tank.Energy\"   # read 9223372036854775813\n      type: INT",
        "- name: \"Plant.Line2.Tank.Probes.T2\"   # read 22.75",
        "configData: {nodeID: \"ns=2;s=Press.Strokes\", dataType: UInt32}",
        "configData: {nodeID: \"ns=2;s=Oven.Heating\", dataType: Boolean}",
        "configData: {url: \"opc.tcp://127.0.0.1:",
    ] {
        assert!(text.contains(want), "{want}\nnot in:\n{text}");
    }
    validates(&draft);

    // The drafted HIL file: devsim serves the draft's nodes with the values read.
    let (code, out) = run(&devsim, &["hil", hil.to_str().expect("path")]);
    assert_eq!(code, 0, "the drafted HIL run: {out}");

    let values: Vec<(String, String, serde_json::Value)> = [
        ("Plant.Line1.Oven.Temperature", serde_json::json!(182.5)),
        ("Plant.Line1.Oven.Setpoint", serde_json::json!(180.0)),
        ("Plant.Line1.Oven.Heating", serde_json::json!(true)),
        ("Plant.Line1.Oven.Recipe", serde_json::json!("BREAD-42")),
        // The object's properties (HasProperty), named below it.
        (
            "Plant.Line1.Oven.SerialNumber",
            serde_json::json!("SN-7781"),
        ),
        (
            "Plant.Line1.Oven.Manufacturer",
            serde_json::json!("Heatwell"),
        ),
        ("Plant.Line1.Press.Strokes", serde_json::json!(123456)),
        ("Plant.Line1.Press.Force", serde_json::json!(412.25)),
        ("Plant.Line1.Press.Mode", serde_json::json!(-2)),
        ("Plant.Line2.Tank.Level", serde_json::json!(7.125)),
        ("Plant.Line2.Tank.Valve", serde_json::json!(false)),
        (
            "Plant.Line2.Tank.Serial",
            serde_json::json!(1_099_511_627_779_u64),
        ),
        (
            "Plant.Line2.Tank.Energy",
            serde_json::json!(9_223_372_036_854_775_813_u64),
        ),
        ("Plant.Line2.Tank.Probes.T1", serde_json::json!(21.5)),
        ("Plant.Line2.Tank.Probes.T2", serde_json::json!(22.75)),
    ]
    .into_iter()
    .map(|(p, v)| ("plant".to_string(), p.to_string(), v))
    .collect();
    let node = sim::Node::start(&text);
    let _mapper = node.mapper("mapper-opcua", "opcua", sim::free_port());
    sim::poll::eventually_or(
        90,
        "every drafted property reads the server's value",
        || {
            for (device, prop, want) in &values {
                let twin = node.twin(&format!("default/{device}")).unwrap_or_default();
                let got = sim::reported(&twin, prop).unwrap_or_default();
                if !same_value(&got, want) {
                    return Err(format!("{prop}: {got:?}, the server holds {want}"));
                }
            }
            Ok(())
        },
    );
    assert_eq!(
        std::fs::read_to_string(&writes).unwrap_or_default(),
        "",
        "nothing wrote to the server"
    );
}

/// Two BLE peripherals behind the scripted BlueZ (python-dbusmock's bluez5 template): an
/// environment sensor with the Bluetooth SIG's characteristics (temperature, humidity,
/// pressure, battery, manufacturer name, GATT's own "service changed") and a pump with its own
/// 128-bit characteristics (a float, a signed value it takes writes to, text that notifies,
/// three raw bytes, one it can only be written). The draft has each assigned characteristic
/// with its format, scale and unit and the others guessed from their bytes, validates, its HIL
/// file passes on devsim, and applied to edgecore with mapper-ble every property reads the
/// peripheral's value. No characteristic was written.
#[test]
fn ble_peripherals_are_read_into_a_draft_that_reads_their_values() {
    let custom = |n: u8| format!("12345678-1234-5678-1234-56789abcde{n:02x}");
    let spec = serde_json::json!({"adapter": "hci0", "devices": [
        {"address": "C4:7C:8D:6A:56:78", "name": "Env Hall B", "services": [
            {"uuid": "00001801-0000-1000-8000-00805f9b34fb", "characteristics": [
                {"uuid": "00002a05-0000-1000-8000-00805f9b34fb", "flags": ["indicate"], "value": ""}]},
            {"uuid": "0000181a-0000-1000-8000-00805f9b34fb", "characteristics": [
                {"uuid": "00002a6e-0000-1000-8000-00805f9b34fb", "flags": ["read", "notify"], "value": "2909"},
                {"uuid": "00002a6f-0000-1000-8000-00805f9b34fb", "flags": ["read"], "value": "1a10"},
                {"uuid": "00002a6d-0000-1000-8000-00805f9b34fb", "flags": ["read"], "value": "02760f00"}]},
            {"uuid": "0000180f-0000-1000-8000-00805f9b34fb", "characteristics": [
                {"uuid": "00002a19-0000-1000-8000-00805f9b34fb", "flags": ["read"], "value": "57"}]},
            {"uuid": "0000180a-0000-1000-8000-00805f9b34fb", "characteristics": [
                {"uuid": "00002a29-0000-1000-8000-00805f9b34fb", "flags": ["read"], "value": "41434d45"}]}
        ]},
        {"address": "D0:12:34:56:78:9A", "name": "pump-7", "services": [
            {"uuid": custom(0), "characteristics": [
                {"uuid": custom(1), "flags": ["read"], "value": "00004841"},
                {"uuid": custom(2), "flags": ["read", "write"], "value": "d6ff"},
                {"uuid": custom(3), "flags": ["read", "notify"], "value": "50372d52554e"},
                {"uuid": custom(4), "flags": ["read"], "value": "010203"},
                {"uuid": custom(5), "flags": ["write"], "value": "00"}]}
        ]}
    ]});
    let mut bluez = match sim::bluez::BlueZ::try_start(&spec) {
        Ok(b) => b,
        Err(e) => {
            sim::skip(&format!("no scripted BlueZ here: {e}"));
            return;
        }
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let draft = dir.path().join("ble.yaml");
    let hil = dir.path().join("ble-hil.yaml");
    let out = Command::new(env!("CARGO_BIN_EXE_devsim"))
        .args([
            "discover",
            "ble",
            "--scan-seconds",
            "2",
            "--name",
            "ble",
            "-o",
        ])
        .arg(&draft)
        .arg("--hil")
        .arg(&hil)
        .envs(bluez.env())
        .output()
        .expect("runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert!(said.contains("2 peripherals found on hci0"), "{said}");
    let text = std::fs::read_to_string(&draft).expect("a draft");
    for want in [
        "name: env-hall-b\n",
        "- name: temperature   # the Bluetooth SIG's temperature (2A6E); read 23.45; it notifies (the mapper subscribes)\n      type: FLOAT\n      accessMode: ReadOnly\n      unit: \"°C\"",
        "configData: {characteristicUUID: \"2A6E\", dataType: int16, scale: 0.01}",
        "- name: humidity   # the Bluetooth SIG's humidity (2A6F); read 41.22",
        "- name: pressure   # the Bluetooth SIG's pressure (2A6D); read 101325",
        "- name: battery-level   # the Bluetooth SIG's battery-level (2A19); read 87",
        "- name: manufacturer-name   # the Bluetooth SIG's manufacturer-name (2A29); read ACME",
        "configData: {macAddress: \"C4:7C:8D:6A:56:78\"}",
        "name: pump-7\n",
        "- name: char-12345678-1234-5678-1234-56789abcde01   # four bytes that read as a float32: 12.5",
        "- name: char-12345678-1234-5678-1234-56789abcde02   # two bytes that read as a small negative number; read -42\n      type: INT\n      accessMode: ReadWrite",
        "- name: char-12345678-1234-5678-1234-56789abcde03   # text; read P7-RUN; it notifies",
        "- name: char-12345678-1234-5678-1234-56789abcde04   # 3 bytes, drafted as hex; read 01 02 03",
        "# Characteristic 12345678-1234-5678-1234-56789abcde05 (service 12345678-1234-5678-1234-56789abcde00, flags: write) not drafted: not readable.",
    ] {
        assert!(text.contains(want), "{want}\nnot in:\n{text}");
    }
    assert!(
        !text.contains("2A05"),
        "GATT's own service changed is not drafted:\n{text}"
    );
    validates(&draft);

    let (code, out) = run(
        std::path::Path::new(env!("CARGO_BIN_EXE_devsim")),
        &["hil", hil.to_str().expect("path")],
    );
    assert_eq!(code, 0, "the drafted HIL run: {out}");

    let env_values = [
        ("temperature", serde_json::json!(23.45)),
        ("humidity", serde_json::json!(41.22)),
        ("pressure", serde_json::json!(101325.0)),
        ("battery-level", serde_json::json!(87)),
        ("manufacturer-name", serde_json::json!("ACME")),
    ];
    let pump_values = [
        (
            "char-12345678-1234-5678-1234-56789abcde01",
            serde_json::json!(12.5),
        ),
        (
            "char-12345678-1234-5678-1234-56789abcde02",
            serde_json::json!(-42),
        ),
        (
            "char-12345678-1234-5678-1234-56789abcde03",
            serde_json::json!("P7-RUN"),
        ),
        (
            "char-12345678-1234-5678-1234-56789abcde04",
            serde_json::json!("01 02 03"),
        ),
    ];
    let values: Vec<(String, String, serde_json::Value)> = env_values
        .into_iter()
        .map(|(p, v)| ("env-hall-b".to_string(), p.to_string(), v))
        .chain(
            pump_values
                .into_iter()
                .map(|(p, v)| ("pump-7".to_string(), p.to_string(), v)),
        )
        .collect();
    let node = sim::Node::start(&text);
    let _mapper = node.mapper_env("mapper-ble", "ble", sim::free_port(), &bluez.env());
    sim::poll::eventually_or(
        90,
        "every drafted property reads the peripheral's value",
        || {
            for (device, prop, want) in &values {
                let twin = node.twin(&format!("default/{device}")).unwrap_or_default();
                let got = sim::reported(&twin, prop).unwrap_or_default();
                if !same_value(&got, want) {
                    return Err(format!(
                        "{device} {prop}: {got:?}, the peripheral holds {want}"
                    ));
                }
            }
            Ok(())
        },
    );
    for (address, chars) in [
        (
            "C4:7C:8D:6A:56:78",
            vec![
                "00002a6e-0000-1000-8000-00805f9b34fb".to_string(),
                "00002a19-0000-1000-8000-00805f9b34fb".into(),
            ],
        ),
        ("D0:12:34:56:78:9A", (1..=5).map(custom).collect()),
    ] {
        for c in chars {
            assert_eq!(bluez.writes(address, &c), 0, "{address} {c} was written");
        }
    }
}
