//! `devsim hil FILE`: a hardware-in-the-loop run without the hardware. The file names the
//! manifests, what the simulated devices do (a [`Scenario`]), and steps that act on the twin and
//! check it. The run serves the devices, starts `edgecore` on embedded defaults with the
//! manifests (each device pointed at its simulator) and the mappers they need, plays the steps,
//! prints each as it goes and writes JUnit XML for CI.
//!
//! ```yaml
//! manifests: [../examples/modbus-tcp.yaml]   # relative to this file
//! devices: {oven-1: {properties: {temperature: {value: {constant: 21.5}}}}}
//! steps:
//!   - name: the temperature reaches the twin
//!     expect: {device: oven-1, property: temperature, reported: 21.5, tolerance: 0.05, within: 30}
//!   - set: {device: oven-1, property: setpoint, desired: 90}
//!   - expect: {device: oven-1, property: setpoint, onDevice: 90}   # landed on the register
//!   - expect: {device: oven-1, state: online, stays: 10}   # and stays so for 10 s
//!   - expect: {device: oven-1, property: setpoint, reported: 90, notBefore: 1}   # not sooner
//!   - wait: 2
//!   - restartMapper: true
//!   - fault: {device: oven-1, kind: noAnswer, seconds: 10}   # kinds as in a scenario's faults
//!   - expect: {device: oven-1, state: offline, reason: did not answer}
//!   - expect: {device: oven-1, property: temperature, error: did not answer}   # its error
//! ```

use crate::device::qualified as device_id;
use crate::layout::load;
use crate::run::{Options, Served, start, value_of};
use crate::scenario::{DeviceScenario, Scenario};
use api::v1beta1::PropertyType;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod file;
mod judge;
mod junit;

use file::text;
pub use file::*;
use judge::*;
pub use junit::{junit, junit_error};

/// The signal (SIGINT 2, SIGTERM 15, SIGHUP 1) that asked the run to stop, 0 while none has.
static STOP: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The signal that asked the run to stop, if one did.
pub fn stopped_by() -> Option<i32> {
    match STOP.load(std::sync::atomic::Ordering::SeqCst) {
        0 => None,
        n => Some(n),
    }
}

/// From now on, SIGINT, SIGTERM and SIGHUP end the run at once, as a failed step does: the
/// step in progress fails saying so, edgecore and the mappers are stopped and the temp dir
/// removed before the program exits (with 128 + the signal).
pub fn stop_on_signals() {
    let (tx, rx) = std::sync::mpsc::channel();
    sim::on_own_thread(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
        ) else {
            return;
        };
        let _ = tx.send(());
        let n = tokio::select! {
            _ = int.recv() => 2,
            _ = term.recv() => 15,
            _ = hup.recv() => 1,
        };
        STOP.store(n, std::sync::atomic::Ordering::SeqCst);
    });
    // Registered before the run starts anything.
    let _ = rx.recv_timeout(Duration::from_secs(5));
}

/// Sleeps `d`, or less when a signal asks the run to stop.
fn pause(d: Duration) {
    let until = Instant::now() + d;
    while stopped_by().is_none() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// Pauses `d`; why the run must end now, if a signal asked it to.
fn pause_unless_stopped(d: Duration) -> Option<String> {
    pause(d);
    stopped_by().map(|n| format!("interrupted by signal {n}"))
}

/// One step's outcome.
pub struct Outcome {
    pub name: String,
    pub took: Duration,
    /// Why it failed.
    pub failure: Option<String>,
    /// Not run: an earlier step failed.
    pub skipped: bool,
}

/// A binary beside this one (where cargo and the release archive put them), else on PATH.
fn binary(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from(name))
}

fn spawn(bin: &Path, args: &[&str], dir: &Path, log: &str) -> Result<sim::Proc, HilError> {
    sim::Proc::try_spawn(bin, args, dir, log, &[]).map_err(HilError::Setup)
}

/// The manifests with every simulated device pointed at its simulator and at this node.
fn rewrite(text: &str, served: &[Served], node: &str) -> Result<String, HilError> {
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let mut v: Value = serde::Deserialize::deserialize(doc)
            .map_err(|e| HilError::Setup(format!("manifests: {e}")))?;
        if v.is_null() {
            continue;
        }
        if v["kind"] == "Device" {
            let id = format!(
                "{}/{}",
                v["metadata"]["namespace"].as_str().unwrap_or("default"),
                v["metadata"]["name"].as_str().unwrap_or_default()
            );
            if let Some(s) = served.iter().find(|s| s.id == id) {
                let c = &mut v["spec"]["protocol"]["configData"];
                match &s.line {
                    Some(pty) => c["serialPort"] = Value::String(pty.display().to_string()),
                    None if s.device.opcua.is_some() => {
                        c["url"] =
                            Value::String(format!("opc.tcp://127.0.0.1:{}/", s.address.port()));
                    }
                    None => {
                        c["ip"] = Value::String("127.0.0.1".into());
                        c["port"] = Value::from(s.address.port());
                    }
                }
            }
            v["spec"]["nodeName"] = Value::String(node.into());
        }
        docs.push(v.to_string());
    }
    Ok(docs.join("\n---\n"))
}

/// Runs `file`; returns each step's outcome (the run stops at the first failed step; the steps
/// after it are skipped). When a step fails, or the run cannot start once the devices are
/// served, the logs of edgecore and the mappers are copied into `logs` (made if missing).
pub fn run(file: &Path, speed: f64, logs: Option<&Path>) -> Result<Vec<Outcome>, HilError> {
    let hil = HilFile::read(file)?;
    let base = file.parent().unwrap_or(Path::new("."));
    let mut manifests = String::new();
    for m in &hil.manifests {
        let p = base.join(m);
        manifests.push_str(
            &std::fs::read_to_string(&p)
                .map_err(|e| HilError::Setup(format!("cannot read {}: {e}", p.display())))?,
        );
        manifests.push_str("\n---\n");
    }
    let devices = load(&manifests).map_err(|e| HilError::Setup(e.to_string()))?;
    hil.check_against(file, &devices)?;
    let rt =
        tokio::runtime::Runtime::new().map_err(|e| HilError::Setup(format!("no runtime: {e}")))?;
    let dir = tempfile::tempdir().map_err(|e| HilError::Setup(format!("no temp dir: {e}")))?;
    let d = dir.path();
    let outcomes = played(&hil, &manifests, devices, speed, &rt, d);
    let failed = match &outcomes {
        Ok(o) => o.iter().any(|o| o.failure.is_some()),
        Err(_) => true,
    };
    if failed && let Some(to) = logs {
        keep_logs(d, to);
    }
    outcomes
}

/// Copies the run's logs (`*.log` of its directory `from`) into `to`, saying where.
fn keep_logs(from: &Path, to: &Path) {
    let copied = std::fs::create_dir_all(to).and_then(|()| {
        let mut n = 0;
        for e in std::fs::read_dir(from)?.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "log") {
                std::fs::copy(&p, to.join(e.file_name()))?;
                n += 1;
            }
        }
        Ok(n)
    });
    match copied {
        Ok(n) => println!("the run's {n} logs are in {}", to.display()),
        Err(e) => eprintln!("devsim hil: cannot keep the logs in {}: {e}", to.display()),
    }
}

/// Serves the devices, starts edgecore and the mappers in `d`, and plays the steps.
fn played(
    hil: &HilFile,
    manifests: &str,
    devices: Vec<crate::device::SimDevice>,
    speed: f64,
    rt: &tokio::runtime::Runtime,
    d: &Path,
) -> Result<Vec<Outcome>, HilError> {
    let options = Options {
        speed,
        bind: Some("127.0.0.1".into()),
        port0: true,
        clock_from_first_request: true,
        pty_dir: d.join("lines"),
        ..Options::default()
    };
    let served = rt
        .block_on(start(devices, &hil.scenario(), &options))
        .map_err(|e| HilError::Setup(e.to_string()))?;
    let pointed = rewrite(manifests, &served, "hil")?;
    std::fs::create_dir_all(d.join("manifests"))
        .and_then(|()| std::fs::write(d.join("manifests/hil.yaml"), pointed))
        .map_err(|e| HilError::Setup(format!("cannot write the manifests: {e}")))?;
    let (http, mqtt) = (sim::free_port(), sim::free_port());
    std::fs::write(
        d.join("edgecore.yaml"),
        format!("nodeName: hil\ndataDir: data\nmanifests: {{dir: manifests, pollIntervalMs: 200}}\nmqtt: {{address: \"127.0.0.1:{mqtt}\"}}\nhttp: {{address: \"127.0.0.1:{http}\"}}\ndmi: {{socket: dmi.sock}}\n"),
    )
    .map_err(|e| HilError::Setup(format!("cannot write edgecore.yaml: {e}")))?;
    let _edgecore = spawn(
        &binary("edgecore"),
        &["--config", "edgecore.yaml"],
        d,
        "edgecore.log",
    )?;
    let server = format!("http://127.0.0.1:{http}");
    let client = kectl::twin::Client::new(&server);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(d.join("dmi.sock").exists() && client.list().is_ok()) {
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(d.join("edgecore.log")).unwrap_or_default();
            return Err(HilError::Setup(format!("edgecore did not start:\n{log}")));
        }
        if let Some(n) = stopped_by() {
            return Err(HilError::Setup(format!("interrupted by signal {n}")));
        }
        pause(Duration::from_millis(100));
    }
    // The mappers the devices need, each with its config.
    let mut kinds = Vec::new();
    if served
        .iter()
        .any(|s| s.device.serial.is_none() && s.device.opcua.is_none() && s.device.ble.is_none())
    {
        kinds.push("modbus");
    }
    if served.iter().any(|s| s.device.serial.is_some()) {
        kinds.push("serial");
    }
    if served.iter().any(|s| s.device.opcua.is_some()) {
        kinds.push("opcua");
    }
    if served.iter().any(|s| s.device.ble.is_some()) {
        kinds.push("ble");
    }
    // The BLE mapper finds BlueZ on devsim's bus.
    let bus: Vec<(&str, String)> = served
        .iter()
        .find_map(|s| s.bus.clone())
        .map(|b| vec![("DBUS_SYSTEM_BUS_ADDRESS", b)])
        .unwrap_or_default();
    for k in &kinds {
        let config = format!(
            "grpc_server:\n  socket_path: {k}.sock\ncommon:\n  name: {k}-mapper\n  version: v1.13.0\n  api_version: v1.0.0\n  protocol: {k}\n  address: 127.0.0.1\n  edgecore_sock: dmi.sock\n  http_port: {}\n  data_dir: {k}-data\n",
            sim::free_port()
        );
        std::fs::write(d.join(format!("mapper-{k}.yaml")), config)
            .map_err(|e| HilError::Setup(format!("cannot write mapper-{k}'s config: {e}")))?;
    }
    let start_mappers = || -> Result<Vec<sim::Proc>, HilError> {
        kinds
            .iter()
            .map(|k| {
                sim::Proc::try_spawn(
                    &binary(&format!("mapper-{k}")),
                    &["--config-file", &format!("mapper-{k}.yaml")],
                    d,
                    &format!("mapper-{k}.log"),
                    &bus,
                )
                .map_err(HilError::Setup)
            })
            .collect()
    };
    let mut mappers = start_mappers()?;
    let mut outcomes = Vec::new();
    // Where `written` looks from: the last `set` step's start (or the run's).
    let mut last_set = Instant::now();
    for (i, step) in hil.steps.iter().enumerate() {
        let name = step.name.clone().unwrap_or_else(|| describe(i, step));
        println!("▶ {name}");
        let started = Instant::now();
        if step.set.is_some() {
            last_set = started;
        }
        let failure = match (&step.expect, &step.set, step.wait, step.restart_mapper) {
            _ if step.fault.is_some() => step.fault.as_ref().and_then(|f| {
                let id = device_id(&f.device);
                match served.iter().find(|s| s.id == id) {
                    Some(s) => {
                        s.live.inject(crate::scenario::Fault {
                            kind: f.kind,
                            at: None,
                            seconds: f.seconds,
                            share: None,
                            code: f.code,
                            delay_ms: f.delay_ms,
                        });
                        None
                    }
                    None => Some(format!("no simulated device {id}")),
                }
            }),
            (Some(e), ..) => match e.no_write {
                Some(secs) => no_write(&served, e, secs, last_set),
                None => expect(&client, &served, e, last_set),
            },
            (_, Some(s), ..) => {
                let id = device_id(&s.device);
                let (ns, n) = id.split_once('/').unwrap_or(("default", &id));
                client
                    .set(ns, n, &[(s.property.clone(), text(&s.desired))], None)
                    .err()
                    .map(|e| format!("{e:#}"))
            }
            (_, _, Some(w), _) => {
                pause(Duration::from_secs_f64(w.max(0.0)));
                None
            }
            (_, _, _, Some(false)) => None,
            _ => {
                mappers.clear();
                match start_mappers() {
                    Ok(m) => {
                        mappers = m;
                        None
                    }
                    Err(e) => Some(e.to_string()),
                }
            }
        };
        let took = started.elapsed();
        let failure = match (failure, stopped_by()) {
            (None, Some(n)) => Some(format!("interrupted by signal {n}")),
            (f, _) => f,
        };
        match &failure {
            None => println!("  ok ({:.1} s)", took.as_secs_f64()),
            Some(f) => println!("  FAILED ({:.1} s): {f}", took.as_secs_f64()),
        }
        let failed = failure.is_some();
        outcomes.push(Outcome {
            name,
            took,
            failure,
            skipped: false,
        });
        if failed {
            break;
        }
    }
    // One outcome per step whatever happened: the rest are skipped.
    for (i, step) in hil.steps.iter().enumerate().skip(outcomes.len()) {
        outcomes.push(Outcome {
            name: step.name.clone().unwrap_or_else(|| describe(i, step)),
            took: Duration::ZERO,
            failure: None,
            skipped: true,
        });
    }
    Ok(outcomes)
}

fn describe(i: usize, s: &StepSpec) -> String {
    if let Some(e) = &s.expect {
        let mut parts = Vec::new();
        if let Some(v) = &e.reported {
            parts.push(format!("reported {}", text(v)));
        }
        if let Some(v) = &e.on_device {
            parts.push(format!("{} on the device", text(v)));
        }
        if let Some(v) = &e.state {
            parts.push(format!("state {v}"));
        }
        if let Some(v) = &e.reason {
            parts.push(format!("reason with {v:?}"));
        }
        if let Some(w) = &e.written {
            parts.push(format!("written {w}"));
        }
        if let Some(n) = e.no_write {
            parts.push(format!("no write for {n} s"));
        }
        let what = e
            .property
            .as_deref()
            .map(|p| format!(" {p}"))
            .unwrap_or_default();
        return format!("step {}: {}{what}: {}", i + 1, e.device, parts.join(", "));
    }
    if let Some(s) = &s.set {
        return format!(
            "step {}: set {} {} to {}",
            i + 1,
            s.device,
            s.property,
            text(&s.desired)
        );
    }
    if let Some(w) = s.wait {
        return format!("step {}: wait {w} s", i + 1);
    }
    if let Some(f) = &s.fault {
        return format!("step {}: {} {:?}", i + 1, f.device, f.kind);
    }
    format!("step {}: restart the mappers", i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn a_64_bit_integer_is_compared_exactly_whatever_the_type_says() {
        // The false green: as floats, ...457 and ...557 are the same number.
        let got = "18446744073709551557";
        for kind in [Some(PropertyType::Int), None] {
            assert!(!same(got, &json!(18446744073709551457u64), 0.0, kind));
            assert!(!same(got, &json!("18446744073709551457"), 0.0, kind));
            assert!(same(got, &json!(18446744073709551557u64), 0.0, kind));
        }
        assert!(!same("-9223372036854775807", &json!(i64::MIN), 0.0, None));
        assert!(same("-9223372036854775808", &json!(i64::MIN), 0.0, None));
        // Within a tolerance, still as integers.
        assert!(same(got, &json!(18446744073709551457u64), 100.0, None));
        assert!(!same(got, &json!(18446744073709551457u64), 99.0, None));
    }

    #[test]
    fn floats_within_the_tolerance_strings_as_text_booleans_by_their_word() {
        let f = Some(PropertyType::Float);
        assert!(same("21.5", &json!(21.5), 0.0, f));
        assert!(same("21.54", &json!(21.5), 0.05, f));
        assert!(!same("21.56", &json!(21.5), 0.05, f));
        // An INT shown as 12 is 12.0, but not a float beyond 2^53.
        assert!(same("12", &json!(12.0), 0.0, Some(PropertyType::Int)));
        assert!(!same(
            "9007199254740993",
            &json!(9007199254740992.0),
            0.0,
            Some(PropertyType::Int)
        ));
        // A string of digits is text: 007 is not 7.
        assert!(!same("007", &json!(7), 0.0, Some(PropertyType::String)));
        assert!(same("007", &json!("007"), 0.0, Some(PropertyType::String)));
        assert!(same("TRUE", &json!(true), 0.0, Some(PropertyType::Boolean)));
        assert!(!same(
            "false",
            &json!(true),
            0.0,
            Some(PropertyType::Boolean)
        ));
    }

    proptest! {
        /// Any two different 64-bit integers differ, signed or not, with the type or without.
        #[test]
        fn two_different_64_bit_integers_never_compare_equal(a: u64, b: u64, neg: bool) {
            let (ga, wb) = if neg {
                ((a as i64).to_string(), json!(b as i64))
            } else {
                (a.to_string(), json!(b))
            };
            for kind in [Some(PropertyType::Int), None] {
                prop_assert_eq!(same(&ga, &wb, 0.0, kind), ga == text(&wb));
                prop_assert!(same(&ga, &json!(ga.clone()), 0.0, kind));
            }
        }
    }
}
