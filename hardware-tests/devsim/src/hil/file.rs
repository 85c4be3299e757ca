//! A HIL file: its steps, faults and expectations, read and checked before anything runs.

use super::*;

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

    pub(super) fn matches(&self, w: &sim::modbus_sim::WireWrite) -> bool {
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

pub(super) fn text(v: &Value) -> String {
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
