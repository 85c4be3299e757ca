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

/// `devsim hil` on a file `name.yaml` in `dir` of `manifest` and `steps`: its exit code, its
/// output, and the JUnit report's failure message.
fn hil_run(dir: &Path, manifest: &Path, name: &str, steps: &str) -> (i32, String, String) {
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &file,
        format!("manifests: [{}]\nsteps:\n{steps}", manifest.display()),
    )
    .expect("write");
    let report = dir.join(format!("{name}.xml"));
    let (code, out) = devsim(&[
        "hil",
        file.to_str().expect("path"),
        "--junit",
        report.to_str().expect("path"),
    ]);
    let (_, _, message) = junit(&report);
    (code, out, message)
}

/// `(tests, failures, first failure message)` of a JUnit file, read by Python's own XML parser
/// (an error counts as a failure, its message as the failure's; skipped test cases are counted
/// by [`skipped`]).
fn junit(path: &Path) -> (u32, u32, String) {
    let out = Command::new(sim::python())
        .args([
            "-c",
            "import sys, xml.etree.ElementTree as E\nr = E.parse(sys.argv[1]).getroot()\nf = r.find('.//failure')\nf = r.find('.//error') if f is None else f\nprint(r.get('tests'), int(r.get('failures')) + int(r.get('errors') or 0), '' if f is None else f.get('message'))",
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

/// The skipped test cases of a JUnit file.
fn skipped(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .matches("<skipped")
        .count()
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
    assert!(
        out.contains("1 of 3 steps passed; the run stopped at the failed one (1 not run)"),
        "{out}"
    );
    // One test case per step: the one after the failure is there, skipped.
    let (tests, failures, message) = junit(&report);
    assert_eq!((tests, failures, skipped(&report)), (3, 1, 1), "{message}");
    assert!(
        message.contains("temperature reported 55 ± 0.5, the twin shows 21.5"),
        "{message}"
    );
    // The failed run's logs are kept beside the report.
    let logs = dir.path().join("hil-logs");
    for log in ["edgecore.log", "mapper-modbus.log"] {
        assert!(logs.join(log).exists(), "{log} not kept: {out}");
    }

    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "manifests: [x.yaml]\nsteps:\n  - {wait: 1, set: {device: a, property: b, desired: 1}}\n",
    )
    .expect("write");
    let (code, out) = devsim(&[
        "hil",
        bad.to_str().expect("path"),
        "--junit",
        report.to_str().expect("path"),
    ]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("steps[0]: give one of expect, set, wait, restartMapper, fault"),
        "{out}"
    );
    // A file that cannot run is a JUnit test case in error, for a CI that reads only JUnit.
    let (tests, failures, message) = junit(&report);
    assert_eq!((tests, failures), (1, 1), "{message}");
    assert!(message.contains("steps[0]: give one of"), "{message}");

    // A scenario key or a step that names what the manifests do not have is refused.
    for (steps, want) in [
        (
            "devices: {oven-2: {properties: {temperature: {value: {constant: 1}}}}}\nsteps:\n  - wait: 1\n",
            "devices.oven-2: no simulated Device default/oven-2 in the manifests",
        ),
        (
            "steps:\n  - expect: {device: oven-1, property: temprature, reported: 1}\n",
            "steps[0].expect.property: Device default/oven-1 has no property temprature",
        ),
    ] {
        std::fs::write(
            &bad,
            format!("manifests: [{}]\n{steps}", manifest.display()),
        )
        .expect("write");
        let (code, out) = devsim(&["hil", bad.to_str().expect("path")]);
        assert_eq!(code, 2, "{out}");
        assert!(out.contains(want), "{want}\nnot in: {out}");
    }
}

/// Two Modbus RTU meters on one line (`examples/modbus-rtu.yaml`), the line a pty pair made by
/// devsim: mapper-modbus reads each slave's value, in its word order.
#[test]
fn the_rtu_meters_hil_run_passes() {
    if sim::missing("socat", "socat") {
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
    if sim::missing("socat", "socat") {
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

/// The processes whose parent is `pid`, with their working directories.
fn children(pid: u32) -> Vec<(u32, std::path::PathBuf)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        // The parent is the second field after the command's closing parenthesis.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|s| s.parse::<u32>().ok());
        if ppid == Some(pid) {
            let cwd = std::fs::read_link(format!("/proc/{p}/cwd")).unwrap_or_default();
            out.push((p, cwd));
        }
    }
    out
}

/// SIGINT, SIGTERM and SIGHUP to `devsim hil` in the middle of a run: it exits with 128 + the
/// signal, edgecore and the mappers it started are gone, and so is its temp dir; the JUnit
/// file says the step was interrupted.
#[test]
fn a_signal_ends_the_run_and_leaves_nothing_behind() {
    use std::io::BufRead;
    sim::bin("edgecore");
    sim::bin("mapper-modbus");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("long.yaml");
    std::fs::write(
        &file,
        format!(
            "manifests: [{}]\nsteps:\n  - expect: {{device: oven-1, state: online, within: 60}}\n  - wait: 120\n  - expect: {{device: oven-1, state: online}}\n",
            sim::workspace_root().join("examples/modbus-tcp.yaml").display()
        ),
    )
    .expect("write");
    for (signal, n) in [("INT", 2), ("TERM", 15), ("HUP", 1)] {
        let report = dir.path().join(format!("{signal}.xml"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_devsim"))
            .args(["hil", file.to_str().expect("path"), "--junit"])
            .arg(&report)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("devsim runs");
        let pid = child.id();
        let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        // Until the long wait has started: edgecore and the mapper are up.
        let mut seen = String::new();
        for line in lines.by_ref() {
            let line = line.unwrap_or_default();
            seen.push_str(&line);
            seen.push('\n');
            if line.contains("wait 120") {
                break;
            }
        }
        assert!(
            seen.contains("wait 120"),
            "the run did not get to the wait:\n{seen}"
        );
        let started = children(pid);
        assert!(
            started.len() >= 2,
            "edgecore and mapper-modbus should be running: {started:?}"
        );
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let code = child.wait().expect("exits").code();
        assert_eq!(
            code,
            Some(128 + n),
            "SIG{signal}: {seen}{}",
            rest.join("\n")
        );
        for (p, cwd) in &started {
            assert!(
                !Path::new(&format!("/proc/{p}")).exists(),
                "SIG{signal}: process {p} (in {}) is still there",
                cwd.display()
            );
            assert!(
                !cwd.exists(),
                "SIG{signal}: the run's directory {} is still there",
                cwd.display()
            );
        }
        let (tests, failures, message) = junit(&report);
        assert_eq!((tests, failures), (3, 1), "SIG{signal}: {message}");
        assert!(
            message.contains(&format!("interrupted by signal {n}")),
            "{message}"
        );
    }
}

/// Expectations over time and on errors: `stays` holds while the value does and fails naming
/// when it stopped; `notBefore` fails when it holds too soon; `error` reads the property's error.
#[test]
fn expectations_over_time_and_on_a_propertys_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = sim::workspace_root().join("examples/modbus-tcp.yaml");
    let run = |name: &str, steps: &str| hil_run(dir.path(), &manifest, name, steps);
    let (code, out, _) = run(
        "holds",
        "  - expect: {device: oven-1, state: online, within: 60, stays: 2}\n  - fault: {device: oven-1, kind: exception, code: 2, seconds: 60}\n  - expect: {device: oven-1, property: temperature, error: answered with exception, within: 30}\n",
    );
    assert_eq!(code, 0, "{out}");

    let (code, out, message) = run(
        "too-soon",
        "  - expect: {device: oven-1, state: online, within: 60}\n  - expect: {device: oven-1, state: online, notBefore: 3, within: 10}\n",
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        message.contains("before the 3 s it must not hold sooner"),
        "{message}"
    );

    let (code, out, message) = run(
        "stops",
        "  - expect: {device: oven-1, state: online, within: 60}\n  - fault: {device: oven-1, kind: noAnswer, seconds: 120}\n  - expect: {device: oven-1, state: online, stays: 60}\n",
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        message.contains("it held, then stopped after")
            && message.contains("state online, the twin shows \"offline\""),
        "{message}"
    );
}

/// Expectations on the wire: the write the mapper sent for a desired value (function code,
/// address, words), no write while nothing is set, and each failing naming what the device
/// did get; a value that is no register word is refused naming its field path.
#[test]
fn expectations_on_the_wire() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The oven without its desired setpoint: nothing is written until a step sets a value.
    let example = std::fs::read_to_string(sim::workspace_root().join("examples/modbus-tcp.yaml"))
        .expect("the example");
    let without = "      desired:\n        value: \"80\"\n";
    assert!(
        example.contains(without),
        "the example's desired value moved"
    );
    let manifest = dir.path().join("oven.yaml");
    std::fs::write(&manifest, example.replace(without, "")).expect("write");
    let run = |name: &str, steps: &str| hil_run(dir.path(), &manifest, name, steps);
    let (code, out, _) = run(
        "lands",
        "  - expect: {device: oven-1, state: online, within: 60}\n  - expect: {device: oven-1, noWrite: 3}\n  - set: {device: oven-1, property: setpoint, desired: 95}\n  - expect: {device: oven-1, written: {function: 6, address: 1, values: [95]}, within: 30}\n  - set: {device: oven-1, property: heater-on, desired: true}\n  - expect: {device: oven-1, written: {function: 5, address: 0, values: [true]}, within: 30}\n",
    );
    assert_eq!(code, 0, "{out}");

    let (code, out, message) = run(
        "other-function",
        "  - expect: {device: oven-1, state: online, within: 60}\n  - set: {device: oven-1, property: setpoint, desired: 90}\n  - expect: {device: oven-1, property: setpoint, reported: 90, within: 30}\n  - expect: {device: oven-1, written: {function: 16, address: 1}, within: 2}\n",
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        message.contains(
            "a write of function 16 at 1 on the wire, the device got function 6 at 1 values [90]"
        ),
        "{message}"
    );

    let (code, out, message) = run(
        "a-write",
        "  - expect: {device: oven-1, state: online, within: 60}\n  - set: {device: oven-1, property: setpoint, desired: 70}\n  - expect: {device: oven-1, noWrite: 10}\n",
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        message.contains("no write for 10 s, but ")
            && message.contains("the device got function 6 at 1 values [70]"),
        "{message}"
    );

    let (code, out, _) = run(
        "not-a-word",
        "  - expect: {device: oven-1, written: {values: [70000]}}\n",
    );
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("steps[0].expect.written.values[0]") && out.contains("not a register word"),
        "{out}"
    );
}
