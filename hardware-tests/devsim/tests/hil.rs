//! `devsim hil` as a user runs it: the binary on the oven's HIL file from `examples/hil` passes
//! and writes JUnit XML that parses; the same run with a wrong expectation fails, naming what the
//! twin showed; a file with a mistake is refused naming its field path.

use std::path::Path;
use std::process::Command;

fn devsim(args: &[&str]) -> (i32, String) {
    // The run starts edgecore and mapper-modbus from beside devsim: built if missing.
    sim::bin("edgecore");
    sim::bin("mapper-modbus");
    sim::bin("mapper-serial");
    sim::bin("mapper-opcua");
    sim::bin("mapper-ble");
    let out = Command::new(env!("CARGO_BIN_EXE_devsim"))
        .args(args)
        .current_dir(sim::workspace_root())
        .output()
        .expect("devsim runs");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `(tests, failures, first failure message)` of a JUnit file, read by Python's own XML parser.
fn junit(path: &Path) -> (u32, u32, String) {
    let out = Command::new(sim::python())
        .args([
            "-c",
            "import sys, xml.etree.ElementTree as E\nr = E.parse(sys.argv[1]).getroot()\nf = r.find('.//failure')\nprint(r.get('tests'), r.get('failures'), '' if f is None else f.get('message'))",
        ])
        .arg(path)
        .output()
        .expect("python runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut it = text.trim().splitn(3, ' ');
    let n = |s: Option<&str>| s.and_then(|s| s.parse().ok()).unwrap_or(u32::MAX);
    (
        n(it.next()),
        n(it.next()),
        it.next().unwrap_or_default().to_string(),
    )
}

#[test]
fn the_ovens_hil_run_passes_and_a_wrong_expectation_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = dir.path().join("hil.xml");
    let (code, out) = devsim(&[
        "hil",
        "examples/hil/oven.yaml",
        "--junit",
        report.to_str().expect("path"),
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("9 of 9 steps passed"), "{out}");
    assert_eq!(junit(&report), (9, 0, String::new()));

    let manifest = sim::workspace_root().join("examples/modbus-tcp.yaml");
    let wrong = dir.path().join("wrong.yaml");
    std::fs::write(
        &wrong,
        format!(
            "manifests: [{}]\ndevices: {{oven-1: {{properties: {{temperature: {{value: {{constant: 21.5}}}}}}}}}}\nsteps:\n  - expect: {{device: oven-1, property: temperature, reported: 21.5, within: 60}}\n  - expect: {{device: oven-1, property: temperature, reported: 55, tolerance: 0.5, within: 2}}\n  - expect: {{device: oven-1, state: online}}\n",
            manifest.display()
        ),
    )
    .expect("write");
    let (code, out) = devsim(&[
        "hil",
        wrong.to_str().expect("path"),
        "--junit",
        report.to_str().expect("path"),
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("1 of 2 steps passed"), "{out}");
    let (tests, failures, message) = junit(&report);
    assert_eq!((tests, failures), (2, 1), "{message}");
    assert!(
        message.contains("temperature reported 55 ± 0.5, the twin shows 21.5"),
        "{message}"
    );

    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "manifests: [x.yaml]\nsteps:\n  - {wait: 1, set: {device: a, property: b, desired: 1}}\n",
    )
    .expect("write");
    let (code, out) = devsim(&["hil", bad.to_str().expect("path")]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("steps[0]: give one of expect, set, wait, restartMapper, fault"),
        "{out}"
    );
}

/// Two Modbus RTU meters on one line (`examples/modbus-rtu.yaml`), the line a pty pair made by
/// devsim: mapper-modbus reads each slave's value, in its word order.
#[test]
fn the_rtu_meters_hil_run_passes() {
    if Command::new("socat").arg("-V").output().is_err() {
        sim::skip("socat (Debian's socat package) is not there to make the serial line");
        return;
    }
    let (code, out) = devsim(&["hil", "examples/hil/meters-rtu.yaml"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("12 of 12 steps passed"), "{out}");
}

/// The serial devices of `examples/serial.yaml` (an ASCII probe and a binary flow meter, for
/// mapper-serial) served from the manifest on pty pairs: every value read from its part of the
/// reply, writes landing, truncated answers turning the meter offline with its reason and
/// duplicated lines read right.
#[test]
fn the_serial_devices_hil_run_passes() {
    if Command::new("socat").arg("-V").output().is_err() {
        sim::skip("socat (Debian's socat package) is not there to make serial lines");
        return;
    }
    let (code, out) = devsim(&["hil", "examples/hil/serial.yaml"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("16 of 16 steps passed"), "{out}");
}

/// Truncated, duplicated, garbled and late answers, dropped connections and a reboot over
/// Modbus TCP: what the twin shows (and the mapper writing the set point again after the
/// reboot lost it).
#[test]
fn every_fault_kind_shows_in_the_twin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("faults.yaml");
    let example = sim::workspace_root().join("examples/modbus-tcp.yaml");
    std::fs::write(
        &file,
        format!(
            "manifests: [{example:?}]\ndevices:\n  oven-1:\n    properties:\n      temperature: {{value: {{constant: 42.5}}}}\nsteps:\n  - expect: {{device: oven-1, property: temperature, reported: 42.5, within: 30}}\n  - fault: {{device: oven-1, kind: truncate, seconds: 10}}\n  - expect: {{device: oven-1, state: offline, within: 30}}\n  - expect: {{device: oven-1, state: online, within: 60}}\n  - fault: {{device: oven-1, kind: duplicate, seconds: 10}}\n  - wait: 3\n  - expect: {{device: oven-1, property: temperature, reported: 42.5, within: 5}}\n  - expect: {{device: oven-1, state: online, within: 60}}\n  - fault: {{device: oven-1, kind: garbage, seconds: 10}}\n  - expect: {{device: oven-1, state: offline, within: 30}}\n  - expect: {{device: oven-1, state: online, within: 60}}\n  - fault: {{device: oven-1, kind: late, delayMs: 4000, seconds: 12}}\n  - expect: {{device: oven-1, state: offline, reason: did not answer, within: 30}}\n  - expect: {{device: oven-1, state: online, within: 60}}\n  - fault: {{device: oven-1, kind: disconnect}}\n  - wait: 2\n  - expect: {{device: oven-1, state: online, within: 30}}\n  - expect: {{device: oven-1, property: temperature, reported: 42.5, within: 10}}\n  - fault: {{device: oven-1, kind: reboot, seconds: 8}}\n  - expect: {{device: oven-1, state: offline, within: 30}}\n  - expect: {{device: oven-1, state: online, within: 60}}\n  - expect: {{device: oven-1, property: setpoint, onDevice: 80, within: 30}}\n",
            example = example.display().to_string()
        ),
    )
    .expect("write");
    let (code, out) = devsim(&["hil", &file.display().to_string()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("22 of 22 steps passed"), "{out}");
}

/// The packaging line of `examples/opcua.yaml` served as an OPC UA server from the manifest
/// (`ns=2` and `nsu=` node ids): values read and subscribed, a desired speed written to its
/// node, the server gone and back.
#[test]
fn the_opcua_line_hil_run_passes() {
    let (code, out) = devsim(&["hil", "examples/hil/opcua.yaml"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("11 of 11 steps passed"), "{out}");
}

/// The environment sensor of `examples/ble.yaml` as a peripheral behind a scripted BlueZ:
/// every characteristic's layout read as declared, the LED written, out of range and back.
#[test]
fn the_ble_sensor_hil_run_passes() {
    if let Err(e) =
        sim::bluez::BlueZ::try_start(&serde_json::json!({"adapter": "hci0", "devices": []}))
    {
        sim::skip(&format!("no scripted BlueZ here: {e}"));
        return;
    }
    let (code, out) = devsim(&["hil", "examples/hil/ble.yaml"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("10 of 10 steps passed"), "{out}");
}
