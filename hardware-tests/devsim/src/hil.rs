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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HilFile {
    pub manifests: Vec<PathBuf>,
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub devices: BTreeMap<String, DeviceScenario>,
    pub steps: Vec<StepSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StepSpec {
    pub name: Option<String>,
    pub expect: Option<Expect>,
    pub set: Option<Set>,
    /// Seconds.
    pub wait: Option<f64>,
    pub restart_mapper: Option<bool>,
    /// A fault of a device from now on (for its `seconds`, or for good).
    pub fault: Option<FaultStep>,
}

/// A fault injected by a step: a scenario fault without its time (it starts now).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FaultStep {
    pub device: String,
    pub kind: crate::scenario::FaultKind,
    pub seconds: Option<f64>,
    pub code: Option<u8>,
    pub delay_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Expect {
    /// `namespace/name`, or a name in `default`.
    pub device: String,
    pub property: Option<String>,
    /// The twin's reported value (numbers within `tolerance`).
    pub reported: Option<Value>,
    /// The value in the simulated device's registers (a desired value landed).
    pub on_device: Option<Value>,
    pub tolerance: Option<f64>,
    /// The device's state: `online`, `offline`, `unhealthy`, `unknown`.
    pub state: Option<String>,
    /// Text the state's reason contains.
    pub reason: Option<String>,
    /// Seconds to wait for it (default 30).
    pub within: Option<f64>,
    /// Text the property's error contains (why its last read failed, or why a desired value
    /// was refused).
    pub error: Option<String>,
    /// Text the property's refused write (`writeError`) contains.
    pub refused: Option<String>,
    /// Seconds it must go on holding once it holds ("stays 80 for 10 s").
    pub stays: Option<f64>,
    /// Seconds from the step's start before which it must not hold (a lower time bound).
    pub not_before: Option<f64>,
    /// A write request like this reached the device (Modbus) since the last `set` step began
    /// (or the run began): what the mapper put on the wire.
    pub written: Option<Wire>,
    /// Seconds from the last `set` step's start (or the run's) in which no write request may
    /// reach the device (Modbus): "a set of this value never reaches the PLC". The step ends
    /// when they are up.
    pub no_write: Option<f64>,
}

/// A write request on the wire, as a step expects it: each field given must match.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Wire {
    /// The function code: 5 (one coil), 6 (one register), 15 (coils), 16 (registers).
    pub function: Option<u8>,
    /// The first address written.
    pub address: Option<u16>,
    /// The words written, in order (a coil: true/false or 1/0).
    pub values: Option<Vec<Value>>,
}

impl Wire {
    /// The words of `values`, or the first that is none (its index).
    fn words(&self) -> Result<Option<Vec<u16>>, usize> {
        let Some(values) = &self.values else {
            return Ok(None);
        };
        values
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::Bool(b) => Ok(u16::from(*b)),
                Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()).ok_or(i),
                _ => Err(i),
            })
            .collect::<Result<Vec<u16>, usize>>()
            .map(Some)
    }

    fn matches(&self, w: &sim::modbus_sim::WireWrite) -> bool {
        self.function.is_none_or(|f| f == w.function)
            && self.address.is_none_or(|a| a == w.address)
            && self.words().ok().flatten().is_none_or(|v| v == w.values)
    }
}

impl std::fmt::Display for Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(x) = self.function {
            parts.push(format!("function {x}"));
        }
        if let Some(x) = self.address {
            parts.push(format!("at {x}"));
        }
        if let Ok(Some(v)) = self.words() {
            parts.push(format!("values {v:?}"));
        }
        if parts.is_empty() {
            parts.push("any".into());
        }
        write!(f, "{}", parts.join(" "))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Set {
    pub device: String,
    pub property: String,
    pub desired: Value,
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// Why a HIL file cannot be run (as opposed to a step that fails).
#[derive(Debug, thiserror::Error)]
pub enum HilError {
    #[error("{file}{}: {message}", if path.is_empty() { String::new() } else { format!(": {path}") })]
    File {
        file: String,
        path: String,
        message: String,
    },
    #[error("{0}")]
    Setup(String),
}

impl HilFile {
    /// Reads `file`; every mistake names its field path.
    pub fn read(file: &Path) -> Result<Self, HilError> {
        let name = file.display().to_string();
        let bad = |path: String, message: String| HilError::File {
            file: name.clone(),
            path,
            message,
        };
        let text = std::fs::read_to_string(file)
            .map_err(|e| bad(String::new(), format!("cannot read it: {e}")))?;
        let value: Value =
            serde_yaml_ng::from_str(&text).map_err(|e| bad(String::new(), e.to_string()))?;
        let h: HilFile = serde_path_to_error::deserialize(value)
            .map_err(|e| bad(e.path().to_string(), e.inner().to_string()))?;
        h.scenario()
            .check()
            .map_err(|e| bad(e.path.clone(), e.message.clone()))?;
        for (i, s) in h.steps.iter().enumerate() {
            let actions = [
                s.expect.is_some(),
                s.set.is_some(),
                s.wait.is_some(),
                s.restart_mapper.is_some(),
                s.fault.is_some(),
            ];
            if actions.iter().filter(|a| **a).count() != 1 {
                return Err(bad(
                    format!("steps[{i}]"),
                    "give one of expect, set, wait, restartMapper, fault".into(),
                ));
            }
            if let Some(f) = &s.fault {
                use crate::scenario::FaultKind;
                if f.kind == FaultKind::Exception && f.code.is_none_or(|c| c == 0) {
                    return Err(bad(
                        format!("steps[{i}].fault.code"),
                        "an exception needs its code, 1 to 255".into(),
                    ));
                }
                if f.kind == FaultKind::Late && f.delay_ms.is_none() {
                    return Err(bad(
                        format!("steps[{i}].fault.delayMs"),
                        "a late answer needs its delay".into(),
                    ));
                }
            }
            if let Some(e) = &s.expect
                && e.reported.is_none()
                && e.on_device.is_none()
                && e.state.is_none()
                && e.reason.is_none()
                && e.error.is_none()
                && e.refused.is_none()
                && e.written.is_none()
                && e.no_write.is_none()
            {
                return Err(bad(
                    format!("steps[{i}].expect"),
                    "expects nothing: give reported, onDevice, state, reason, error, refused, written or noWrite"
                        .into(),
                ));
            }
            if let Some(e) = &s.expect
                && e.no_write.is_some()
                && (e.reported.is_some()
                    || e.on_device.is_some()
                    || e.state.is_some()
                    || e.reason.is_some()
                    || e.error.is_some()
                    || e.refused.is_some()
                    || e.written.is_some()
                    || e.stays.is_some()
                    || e.not_before.is_some()
                    || e.within.is_some())
            {
                return Err(bad(
                    format!("steps[{i}].expect.noWrite"),
                    "a step of its own: it watches the wire for its seconds (give the other expectations in another step)".into(),
                ));
            }
            if let Some(w) = s.expect.as_ref().and_then(|e| e.written.as_ref())
                && let Err(k) = w.words()
            {
                return Err(bad(
                    format!("steps[{i}].expect.written.values[{k}]"),
                    "not a register word (0 to 65535) or a coil (true, false)".into(),
                ));
            }
            if let Some(e) = &s.expect
                && let (Some(nb), Some(w)) = (e.not_before, e.within)
                && nb >= w
            {
                return Err(bad(
                    format!("steps[{i}].expect.notBefore"),
                    format!("{nb} s is not before `within` ({w} s): it could never pass"),
                ));
            }
            if let Some(e) = &s.expect
                && (e.reported.is_some()
                    || e.on_device.is_some()
                    || e.error.is_some()
                    || e.refused.is_some())
                && e.property.is_none()
            {
                return Err(bad(
                    format!("steps[{i}].expect.property"),
                    "missing: a value belongs to a property".into(),
                ));
            }
        }
        Ok(h)
    }

    /// Every device and property a step or the scenario names is a simulated one of the
    /// manifests (laid out as `devices`).
    pub fn check_against(
        &self,
        file: &Path,
        devices: &[crate::device::SimDevice],
    ) -> Result<(), HilError> {
        let bad = |path: String, message: String| HilError::File {
            file: file.display().to_string(),
            path,
            message,
        };
        self.scenario()
            .check_against(devices)
            .map_err(|e| bad(e.path, e.message))?;
        for (i, s) in self.steps.iter().enumerate() {
            let (what, device, property) = match (&s.expect, &s.set, &s.fault) {
                (Some(e), _, _) => ("expect", &e.device, e.property.as_deref()),
                (_, Some(set), _) => ("set", &set.device, Some(set.property.as_str())),
                (_, _, Some(f)) => ("fault", &f.device, None),
                _ => continue,
            };
            let id = device_id(device);
            let Some(d) = devices.iter().find(|d| d.id == id) else {
                return Err(bad(
                    format!("steps[{i}].{what}.device"),
                    crate::device::no_device(&id, devices),
                ));
            };
            if let Some(p) = property
                && !d.points.iter().any(|pt| pt.name == p)
            {
                return Err(bad(
                    format!("steps[{i}].{what}.property"),
                    crate::device::no_property(d, p),
                ));
            }
            if let Some(e) = &s.expect
                && (e.written.is_some() || e.no_write.is_some())
                && (d.opcua.is_some() || d.ble.is_some() || d.serial.is_some())
            {
                let field = if e.written.is_some() {
                    "written"
                } else {
                    "noWrite"
                };
                return Err(bad(
                    format!("steps[{i}].expect.{field}"),
                    format!(
                        "{id} is not a Modbus device: devsim sees the writes of OPC UA, BLE and serial devices only as changed values (expect onDevice)"
                    ),
                ));
            }
        }
        Ok(())
    }

    pub fn scenario(&self) -> Scenario {
        Scenario {
            seed: self.seed,
            devices: self.devices.clone(),
        }
    }
}

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
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
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

/// Whether `got` (as read) is `want` (as expected) for a property of the model's type `kind`:
/// integers exactly, as 128-bit numbers (every 64-bit value, signed or not; within `tolerance`
/// if one is given), floats within `tolerance`, booleans by their word, strings and bytes as
/// the same text. Without a type, what both read as decides, integers first.
pub fn same(got: &str, want: &Value, tolerance: f64, kind: Option<PropertyType>) -> bool {
    let want = text(want);
    let (g, w) = (got.trim(), want.trim());
    let int = || match (g.parse::<i128>(), w.parse::<i128>()) {
        (Ok(a), Ok(b)) => Some((a.abs_diff(b) as f64) <= tolerance),
        _ => None,
    };
    // A float says nothing about integers beyond 2^53: those are compared as integers or not
    // at all.
    let exact = 9_007_199_254_740_992.0;
    let float = |limit: f64| match (g.parse::<f64>(), w.parse::<f64>()) {
        (Ok(a), Ok(b)) if a.abs() < limit && b.abs() < limit => Some((a - b).abs() <= tolerance),
        _ => None,
    };
    match kind {
        Some(PropertyType::Int) => int().or_else(|| float(exact)).unwrap_or(false),
        Some(PropertyType::Float | PropertyType::Double) => float(f64::INFINITY).unwrap_or(g == w),
        Some(PropertyType::Boolean) => g.eq_ignore_ascii_case(w),
        Some(PropertyType::String | PropertyType::Bytes | PropertyType::Stream) => got == want,
        None => int()
            .or_else(|| float(f64::INFINITY))
            .unwrap_or(got == want),
    }
}

/// What of `e` the twin (and the simulator) does not show now, one text per expectation.
fn wrong_now(
    client: &kectl::twin::Client,
    e: &Expect,
    id: &str,
    point: Option<(&Served, &crate::device::SimPoint)>,
) -> (Vec<String>, bool) {
    let (ns, name) = id.split_once('/').unwrap_or(("default", id));
    let tolerance = e.tolerance.unwrap_or(0.0);
    let prop = e.property.as_deref().unwrap_or_default();
    let kind = point.and_then(|(_, p)| p.kind);
    let twin = client.get(ns, name).ok();
    let mut wrong = Vec::new();
    if let Some(want) = &e.reported {
        let got = twin
            .as_ref()
            .and_then(|t| t["properties"][prop]["reported"]["value"].as_str())
            .map(str::to_string);
        if !got
            .as_deref()
            .is_some_and(|g| same(g, want, tolerance, kind))
        {
            wrong.push(format!(
                "{prop} reported {}{}, the twin shows {}",
                text(want),
                if tolerance > 0.0 {
                    format!(" ± {tolerance}")
                } else {
                    String::new()
                },
                got.unwrap_or_else(|| "nothing".into())
            ));
        }
    }
    if let Some(want) = &e.on_device {
        let got = point.and_then(|(s, p)| s.sim.edit(|st| value_of(st, p)));
        if !got
            .as_deref()
            .is_some_and(|g| same(g, want, tolerance, kind))
        {
            wrong.push(format!(
                "{prop} = {} on the device, it holds {}",
                text(want),
                got.unwrap_or_else(|| "nothing (no such simulated property)".into())
            ));
        }
    }
    for (field, want, what) in [
        ("error", &e.error, "an error"),
        ("writeError", &e.refused, "a refused write"),
    ] {
        let Some(want) = want else { continue };
        let got = twin
            .as_ref()
            .and_then(|t| t["properties"][prop][field]["message"].as_str())
            .map(str::to_string);
        if !got.as_deref().is_some_and(|g| g.contains(want.as_str())) {
            wrong.push(format!(
                "{prop} with {what} saying {want:?}, the twin shows {}",
                got.map_or_else(|| "none".to_string(), |g| format!("{g:?}"))
            ));
        }
    }
    let state = twin
        .as_ref()
        .and_then(|t| t["state"].as_str())
        .unwrap_or_default()
        .to_string();
    let reason = twin
        .as_ref()
        .and_then(|t| t["stateReason"].as_str())
        .unwrap_or_default()
        .to_string();
    if let Some(want) = &e.state
        && &state != want
    {
        wrong.push(format!("state {want}, the twin shows {state:?} ({reason})"));
    }
    if let Some(want) = &e.reason
        && !reason.contains(want.as_str())
    {
        wrong.push(format!("a reason with {want:?}, the twin shows {reason:?}"));
    }
    (wrong, twin.is_some())
}

/// Polls the twin (and the simulator) until `e` holds or its time is up; then, with `notBefore`,
/// it must not have held sooner, and with `stays`, it must go on holding that long. `None` when
/// all of it held.
fn expect(
    client: &kectl::twin::Client,
    served: &[Served],
    e: &Expect,
    since: Instant,
) -> Option<String> {
    let id = device_id(&e.device);
    let within = Duration::from_secs_f64(e.within.unwrap_or(30.0).max(0.0));
    let started = Instant::now();
    let deadline = started + within;
    let prop = e.property.as_deref().unwrap_or_default();
    let point = served
        .iter()
        .find(|s| s.id == id)
        .and_then(|s| Some((s, s.device.points.iter().find(|p| p.name == prop)?)));
    loop {
        let (mut wrong, found) = wrong_now(client, e, &id, point);
        if let Some(w) = &e.written {
            wrong.extend(not_written(served, &id, w, since));
        }
        if wrong.is_empty() {
            let held = started.elapsed();
            if let Some(nb) = e.not_before
                && held < Duration::from_secs_f64(nb)
            {
                return Some(format!(
                    "it held after {:.1} s, before the {nb} s it must not hold sooner",
                    held.as_secs_f64()
                ));
            }
            // Without `stays`, it held: `None`.
            let stays = e.stays?;
            let until = Instant::now() + Duration::from_secs_f64(stays.max(0.0));
            let since = Instant::now();
            while Instant::now() < until {
                if let Some(why) = pause_unless_stopped(Duration::from_millis(100)) {
                    return Some(why);
                }
                let (wrong, _) = wrong_now(client, e, &id, point);
                if !wrong.is_empty() {
                    return Some(format!(
                        "it held, then stopped after {:.1} s of the {stays} s it must stay: {}",
                        since.elapsed().as_secs_f64(),
                        wrong.join("; ")
                    ));
                }
            }
            return None;
        }
        if Instant::now() >= deadline {
            let mut wrong = wrong;
            if !found {
                wrong.push(format!("edgecore has no device {id}"));
            }
            return Some(format!(
                "after {:.0} s: expected {}",
                within.as_secs_f64(),
                wrong.join("; ")
            ));
        }
        if let Some(why) = pause_unless_stopped(Duration::from_millis(100)) {
            return Some(why);
        }
    }
}

/// The write requests that reached the unit of device `id` since `since`.
fn writes_since(served: &[Served], id: &str, since: Instant) -> Vec<sim::modbus_sim::WireWrite> {
    served
        .iter()
        .find(|s| s.id == id)
        .map(|s| {
            s.sim
                .edit(|st| st.wire.iter().filter(|w| w.at >= since).cloned().collect())
        })
        .unwrap_or_default()
}

/// Why no write like `w` is seen since `since`, naming what did reach the device.
fn not_written(served: &[Served], id: &str, w: &Wire, since: Instant) -> Option<String> {
    let got = writes_since(served, id, since);
    if got.iter().any(|g| w.matches(g)) {
        return None;
    }
    let seen: Vec<String> = got.iter().map(ToString::to_string).collect();
    Some(format!(
        "a write of {w} on the wire, the device got {}",
        if seen.is_empty() {
            "no write".to_string()
        } else {
            seen.join(", ")
        }
    ))
}

/// Watches the wire of `e.device` from `since` for `secs`: `None` when no write request
/// reached it.
fn no_write(served: &[Served], e: &Expect, secs: f64, since: Instant) -> Option<String> {
    let id = device_id(&e.device);
    let until = since + Duration::from_secs_f64(secs.max(0.0));
    loop {
        if let Some(first) = writes_since(served, &id, since).first() {
            return Some(format!(
                "no write for {secs} s, but {:.1} s in the device got {first}",
                first.at.duration_since(since).as_secs_f64()
            ));
        }
        if Instant::now() >= until {
            return None;
        }
        if let Some(why) = pause_unless_stopped(Duration::from_millis(100)) {
            return Some(why);
        }
    }
}

/// JUnit XML of a file that cannot be run: one test case, `the HIL file`, in error with `why`
/// (a CI that reads only JUnit sees the failure).
pub fn junit_error(suite: &str, why: &str) -> String {
    let mut report = quick_junit::Report::new("devsim-hil");
    let mut s = quick_junit::TestSuite::new(suite);
    let mut st = quick_junit::TestCaseStatus::non_success(quick_junit::NonSuccessKind::Error);
    st.set_message(why);
    s.add_test_case(quick_junit::TestCase::new("the HIL file", st));
    report.add_test_suite(s);
    report
        .to_string()
        .unwrap_or_else(|e| format!("<!-- cannot write the report: {e} -->"))
}

/// The outcomes as JUnit XML (one test suite, a test case per step).
pub fn junit(suite: &str, outcomes: &[Outcome]) -> String {
    let mut report = quick_junit::Report::new("devsim-hil");
    let mut s = quick_junit::TestSuite::new(suite);
    for o in outcomes {
        let status = match &o.failure {
            None if o.skipped => {
                let mut st = quick_junit::TestCaseStatus::skipped();
                st.set_message("not run: an earlier step failed");
                st
            }
            None => quick_junit::TestCaseStatus::success(),
            Some(f) => {
                let mut st =
                    quick_junit::TestCaseStatus::non_success(quick_junit::NonSuccessKind::Failure);
                st.set_message(f.clone());
                st
            }
        };
        let mut case = quick_junit::TestCase::new(o.name.clone(), status);
        case.set_time(o.took);
        s.add_test_case(case);
    }
    report.add_test_suite(s);
    report
        .to_string()
        .unwrap_or_else(|e| format!("<!-- cannot write the report: {e} -->"))
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
