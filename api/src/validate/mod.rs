//! Validation of `Device` and `DeviceModel` objects: every problem at once, each with the path of
//! the field it is about (`spec.properties[2].collectCycle`).
//!
//! [`schema::check`] covers what the API server's schema would refuse (types, enums, unknown
//! fields); [`validate_device`] and [`validate_model`] what KubeEdge leaves to run time and users
//! find out on the device: duplicate or unknown properties, bad desired values, bad ranges.

pub mod configdata;
pub mod names;
pub mod node;
pub mod schema;
pub mod set;

use crate::v1beta1::{AccessMode, Device, DeviceModel, DeviceProperty, PropertyType};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::HashMap;
use std::fmt;

/// How bad a problem is: an error makes the object invalid; a warning does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Warning,
    Error,
}

/// One problem of an object: the field path and what is wrong there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub severity: Severity,
    /// Field path, as `spec.properties[2].collectCycle`; empty for the object as a whole.
    pub path: String,
    pub message: String,
}

impl Problem {
    /// Whether the problem is a desired value's (`spec.properties[i].desired...`): one the
    /// twin refuses on that property alone, without skipping the device.
    pub fn is_about_desired(&self) -> bool {
        self.desired_index().is_some()
    }

    /// The property index of a problem at `spec.properties[i].desired...`.
    pub fn desired_index(&self) -> Option<usize> {
        let rest = self.path.strip_prefix("spec.properties[")?;
        let (i, tail) = rest.split_once(']')?;
        tail.starts_with(".desired").then(|| i.parse().ok())?
    }

    /// An error at `path`.
    pub fn error(path: impl Into<String>, message: impl fmt::Display) -> Self {
        Self {
            severity: Severity::Error,
            path: path.into(),
            message: message.to_string(),
        }
    }

    /// A warning at `path`.
    pub fn warning(path: impl Into<String>, message: impl fmt::Display) -> Self {
        Self {
            severity: Severity::Warning,
            path: path.into(),
            message: message.to_string(),
        }
    }

    /// Whether this problem makes the object invalid.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.severity {
            Severity::Warning => "warning: ",
            Severity::Error => "",
        };
        if self.path.is_empty() {
            write!(f, "{tag}{}", self.message)
        } else {
            write!(f, "{}: {tag}{}", self.path, self.message)
        }
    }
}

fn check_metadata(meta: &ObjectMeta, out: &mut Vec<Problem>) {
    match meta.name.as_deref() {
        None => out.push(Problem::error("metadata.name", "required field is missing")),
        Some(name) => {
            if let Err(e) = names::check_dns1123_subdomain(name) {
                out.push(Problem::error("metadata.name", e));
            }
        }
    }
    if let Some(ns) = meta.namespace.as_deref()
        && let Err(e) = names::check_dns1123_label(ns)
    {
        out.push(Problem::error("metadata.namespace", e));
    }
}

/// Checks names of a list of named items: non-empty, valid twin keys, unique.
fn check_names<'a>(
    names: impl Iterator<Item = &'a str>,
    list_path: &str,
    what: &str,
    twin_keys: bool,
    out: &mut Vec<Problem>,
) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, name) in names.enumerate() {
        let path = format!("{list_path}[{i}].name");
        if name.is_empty() {
            out.push(Problem::error(
                path,
                format!("{what} name must not be empty"),
            ));
            continue;
        }
        if twin_keys && let Err(e) = names::check_twin_key(name) {
            out.push(Problem::error(&path, e));
        }
        if let Some(first) = seen.get(name) {
            out.push(Problem::error(
                path,
                format!("duplicate {what} name {name:?} (first at {list_path}[{first}])"),
            ));
        } else {
            seen.insert(name, i);
        }
    }
}

/// `path` is only built for a problem (a start checks every property of every device).
fn check_cycle(value: Option<i64>, path: impl FnOnce() -> String, out: &mut Vec<Problem>) {
    if let Some(v) = value
        && v < 0
    {
        out.push(Problem::error(
            path(),
            format!("{v} is negative; cycles are milliseconds, 0 or more"),
        ));
    }
}

/// Compares two numbers given as text: exactly as integers when both are (64-bit values
/// included), else as floating point. `None` when either is not a number.
pub fn compare_numbers(a: &str, b: &str) -> Option<std::cmp::Ordering> {
    let (a, b) = (a.trim(), b.trim());
    if let (Ok(x), Ok(y)) = (a.parse::<i128>(), b.parse::<i128>()) {
        return Some(x.cmp(&y));
    }
    let (x, y) = (a.parse::<f64>().ok()?, b.parse::<f64>().ok()?);
    x.partial_cmp(&y)
}

/// Why a numeric `value` is outside `minimum`/`maximum`, in the words the API, the edge and
/// the pages all use: `130 is above the model maximum 120`.
pub fn out_of_range(value: &str, minimum: Option<&str>, maximum: Option<&str>) -> Option<String> {
    use std::cmp::Ordering::{Greater, Less};
    if let Some(min) = minimum
        && compare_numbers(value, min) == Some(Less)
    {
        return Some(format!("{} is below the model minimum {min}", value.trim()));
    }
    if let Some(max) = maximum
        && compare_numbers(value, max) == Some(Greater)
    {
        return Some(format!("{} is above the model maximum {max}", value.trim()));
    }
    None
}

fn parse_bound(value: &str) -> Option<f64> {
    value.trim().parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Checks a `DeviceModel`.
pub fn validate_model(model: &DeviceModel) -> Vec<Problem> {
    let mut out = Vec::new();
    check_metadata(&model.metadata, &mut out);
    let props = &model.spec.properties;
    check_names(
        props.iter().map(|p| p.name.as_str()),
        "spec.properties",
        "property",
        true,
        &mut out,
    );
    for (i, p) in props.iter().enumerate() {
        let base = format!("spec.properties[{i}]");
        let Some(ty) = p.type_ else {
            out.push(Problem::warning(
                format!("{base}.type"),
                "no type given: values are handled as STRING",
            ));
            continue;
        };
        let mut bounds = [None, None];
        for (slot, (key, value)) in [("minimum", &p.minimum), ("maximum", &p.maximum)]
            .into_iter()
            .enumerate()
        {
            let Some(value) = value.as_deref().filter(|v| !v.trim().is_empty()) else {
                continue;
            };
            if !ty.is_numeric() {
                out.push(Problem::warning(
                    format!("{base}.{key}"),
                    format!("{key} is ignored for type {ty}"),
                ));
                continue;
            }
            match parse_bound(value) {
                Some(v) => bounds[slot] = Some(v),
                None => out.push(Problem::error(
                    format!("{base}.{key}"),
                    format!("{value:?} is not a number, but the property type is {ty}"),
                )),
            }
        }
        if let [Some(min), Some(max)] = bounds
            && min > max
        {
            out.push(Problem::error(
                format!("{base}.maximum"),
                format!("maximum {max} is below minimum {min}"),
            ));
        }
        if let (Some(model_proto), Some(v)) = (model.spec.protocol.as_deref(), &p.visitors)
            && let Some(vp) = v.protocol_name.as_deref().filter(|s| !s.is_empty())
            && vp != model_proto
        {
            out.push(Problem::warning(
                format!("{base}.visitors.protocolName"),
                format!("visitor protocol {vp:?} differs from the model protocol {model_proto:?}"),
            ));
        }
    }
    out
}

/// Checks a `Device`, and against `model` when it is known. A device whose model is not given
/// gets every check that does not need the model.
/// The desired values of `device` that can never land on it (they do not fit `model`'s type,
/// minimum or maximum, or the property is ReadOnly), each with its index in
/// `spec.properties`: only those that changed from `before` (the stored Device, if any), so
/// that a value stored earlier, or made invalid by a model changed since, does not hold back a
/// write of another property. What the API's admission and the cluster's webhook refuse.
pub fn unlandable_desired(
    device: &Device,
    model: &DeviceModel,
    before: Option<&Device>,
) -> Vec<(usize, Problem)> {
    let was = |name: &str| {
        before
            .and_then(|b| b.property(name))
            .map(|p| p.desired.as_ref())
    };
    validate_device(device, Some(model))
        .into_iter()
        .filter(|p| p.severity == Severity::Error)
        .filter_map(|p| Some((p.desired_index()?, p)))
        .filter(|(i, _)| {
            device
                .spec
                .properties
                .get(*i)
                .is_some_and(|prop| was(&prop.name) != Some(prop.desired.as_ref()))
        })
        .collect()
}

pub fn validate_device(device: &Device, model: Option<&DeviceModel>) -> Vec<Problem> {
    let mut out = Vec::new();
    check_metadata(&device.metadata, &mut out);
    let spec = &device.spec;
    match &spec.device_model_ref {
        None => out.push(Problem::error(
            "spec.deviceModelRef",
            "required field is missing: the device must name its DeviceModel",
        )),
        Some(r) if r.name.is_empty() => out.push(Problem::error(
            "spec.deviceModelRef.name",
            "must not be empty: the device must name its DeviceModel",
        )),
        Some(r) => {
            if let Err(e) = names::check_dns1123_subdomain(&r.name) {
                out.push(Problem::error("spec.deviceModelRef.name", e));
            }
        }
    }
    if let Some(node) = spec.node_name.as_deref().filter(|n| !n.is_empty())
        && let Err(e) = names::check_dns1123_subdomain(node)
    {
        out.push(Problem::error("spec.nodeName", e));
    }
    let model_protocol = model
        .and_then(|m| m.spec.protocol.as_deref())
        .filter(|p| !p.is_empty());
    match (device.protocol_name(), model_protocol) {
        (Some(dp), Some(mp)) if dp != mp => out.push(Problem::error(
            "spec.protocol.protocolName",
            format!("{dp:?} differs from the protocol {mp:?} of the model"),
        )),
        (None, None) if model.is_some() => out.push(Problem::warning(
            "spec.protocol.protocolName",
            "no protocol is set on the device or its model: no mapper will serve it",
        )),
        _ => {}
    }
    check_names(
        spec.properties.iter().map(|p| p.name.as_str()),
        "spec.properties",
        "property",
        true,
        &mut out,
    );
    for (i, p) in spec.properties.iter().enumerate() {
        check_property(i, p, model, &mut out);
    }
    check_names(
        spec.methods.iter().map(|m| m.name.as_str()),
        "spec.methods",
        "method",
        false,
        &mut out,
    );
    for (i, m) in spec.methods.iter().enumerate() {
        if m.property_names.is_empty() {
            out.push(Problem::error(
                format!("spec.methods[{i}].propertyNames"),
                "a method must control at least one property",
            ));
        }
        for (j, name) in m.property_names.iter().enumerate() {
            let path = format!("spec.methods[{i}].propertyNames[{j}]");
            if device.property(name).is_none() {
                out.push(Problem::error(
                    path,
                    format!("{name:?} is not a property of this device"),
                ));
            } else if let Some(mp) = model.and_then(|m| m.property(name))
                && mp.access_mode == Some(AccessMode::ReadOnly)
            {
                out.push(Problem::error(
                    path,
                    format!("{name:?} is ReadOnly in the model; a method can only write writable properties"),
                ));
            }
        }
    }
    if let Some(sr) = &spec.state_report {
        check_cycle(
            sr.report_cycle,
            || "spec.stateReport.reportCycle".into(),
            &mut out,
        );
    }
    out
}

/// The device's and its properties' `configData` against the keys its protocol's mapper reads
/// ([`configdata`]), when a mapper of this project serves the protocol. Kept apart from
/// [`validate_device`] (they depend on the protocol): an error among them makes `kectl validate`
/// fail and edgecore skip the device, as its mapper would refuse it.
pub fn validate_config_data(device: &Device, model: Option<&DeviceModel>) -> Vec<Problem> {
    let mut out = Vec::new();
    let model_protocol = model
        .and_then(|m| m.spec.protocol.as_deref())
        .filter(|p| !p.is_empty());
    if let Some(schema) = device
        .protocol_name()
        .or(model_protocol)
        .and_then(configdata::schema)
    {
        // What the mapper gets: the model's visitors and protocol defaults under the device's.
        let effective = model.map(|m| crate::merge::effective_device(device, m));
        check_config_data(
            effective.as_ref().unwrap_or(device),
            model,
            schema,
            &mut out,
        );
    }
    out
}

fn check_config_data(
    device: &Device,
    model: Option<&DeviceModel>,
    schema: &configdata::Schema,
    out: &mut Vec<Problem>,
) {
    // The model's protocolConfigData are defaults the device's own keys override, as edgecore
    // merges them.
    let mut protocol = model
        .and_then(|m| m.spec.protocol_config_data.as_ref())
        .map(|c| c.0.clone())
        .unwrap_or_default();
    if let Some(c) = device
        .spec
        .protocol
        .as_ref()
        .and_then(|p| p.config_data.as_ref())
    {
        protocol.extend(c.0.clone());
    }
    configdata::check(
        &protocol,
        schema.device,
        schema.device_one_of,
        schema.protocol,
        "spec.protocol.configData",
        out,
    );
    for (i, p) in device.spec.properties.iter().enumerate() {
        let Some(v) = p.visitors.as_ref().and_then(|v| v.config_data.as_ref()) else {
            continue;
        };
        configdata::check(
            &v.0,
            schema.visitor,
            &[],
            schema.protocol,
            &format!("spec.properties[{i}].visitors.configData"),
            out,
        );
    }
}

fn check_property(
    i: usize,
    p: &DeviceProperty,
    model: Option<&DeviceModel>,
    out: &mut Vec<Problem>,
) {
    // Paths are built for problems only.
    let at = |field: &str| format!("spec.properties[{i}].{field}");
    check_cycle(p.collect_cycle, || at("collectCycle"), out);
    check_cycle(p.report_cycle, || at("reportCycle"), out);
    let Some(model) = model else {
        return;
    };
    let Some(mp) = model.property(&p.name) else {
        if !p.name.is_empty() {
            out.push(Problem::error(
                at("name"),
                format!(
                    "property {:?} is not defined in model {:?}",
                    p.name,
                    model.metadata.name.as_deref().unwrap_or_default()
                ),
            ));
        }
        return;
    };
    if let (Some(vp), Some(mp_proto)) = (
        p.visitors
            .as_ref()
            .and_then(|v| v.protocol_name.as_deref())
            .filter(|s| !s.is_empty()),
        model.spec.protocol.as_deref().filter(|s| !s.is_empty()),
    ) && vp != mp_proto
    {
        out.push(Problem::warning(
            at("visitors.protocolName"),
            format!("visitor protocol {vp:?} differs from the model protocol {mp_proto:?}"),
        ));
    }
    let Some(desired) = &p.desired else {
        return;
    };
    if mp.access_mode == Some(AccessMode::ReadOnly) {
        out.push(Problem::error(
            at("desired"),
            format!(
                "property {:?} is ReadOnly in the model; it cannot have a desired value",
                p.name
            ),
        ));
        return;
    }
    let ty = mp.type_.unwrap_or(PropertyType::String);
    if let Err(e) = ty.check_value(&desired.value) {
        out.push(Problem::error(at("desired.value"), e));
        return;
    }
    if ty.is_numeric()
        && let Some(why) = out_of_range(
            &desired.value,
            mp.minimum.as_deref().filter(|b| parse_bound(b).is_some()),
            mp.maximum.as_deref().filter(|b| parse_bound(b).is_some()),
        )
    {
        out.push(Problem::error(at("desired.value"), why));
    }
}

#[cfg(test)]
mod unlandable_tests {
    use super::*;

    fn model() -> DeviceModel {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
            "metadata": {"name": "oven", "namespace": "default"},
            "spec": {"protocol": "modbus", "properties": [
                {"name": "temperature", "type": "FLOAT", "accessMode": "ReadOnly"},
                {"name": "setpoint", "type": "INT", "accessMode": "ReadWrite", "minimum": "0", "maximum": "120"},
                {"name": "on", "type": "BOOLEAN", "accessMode": "ReadWrite"}]}}))
        .expect("a model")
    }

    fn device(setpoint: &str, on: &str) -> Device {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
            "metadata": {"name": "oven-1", "namespace": "default"},
            "spec": {"deviceModelRef": {"name": "oven"}, "protocol": {"protocolName": "modbus"},
                "properties": [
                    {"name": "setpoint", "desired": {"value": setpoint}},
                    {"name": "on", "desired": {"value": on}}]}}))
        .expect("a device")
    }

    #[test]
    fn only_changed_desired_values_that_cannot_land_are_named_with_their_index() {
        let m = model();
        let found = |d: &Device, before: Option<&Device>| {
            unlandable_desired(d, &m, before)
                .into_iter()
                .map(|(i, p)| (i, p.path))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            found(&device("130", "maybe"), None),
            [
                (0, "spec.properties[0].desired.value".to_string()),
                (1, "spec.properties[1].desired.value".to_string())
            ]
        );
        // 130 was stored before: only the value that changed is judged.
        let before = device("130", "true");
        assert_eq!(
            found(&device("130", "maybe"), Some(&before)),
            [(1, "spec.properties[1].desired.value".to_string())]
        );
        assert!(found(&device("85", "false"), Some(&before)).is_empty());
        let problems = unlandable_desired(&device("130", "true"), &m, None);
        assert!(
            problems[0]
                .1
                .message
                .contains("above the model maximum 120"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_desired_index_is_read_from_the_path_alone() {
        let at = |path: &str| Problem::error(path, "x").desired_index();
        assert_eq!(at("spec.properties[3].desired.value"), Some(3));
        assert_eq!(at("spec.properties[0].desired"), Some(0));
        assert_eq!(at("spec.properties[1].collectCycle"), None);
        assert_eq!(at("spec.methods[0].propertyNames[0]"), None);
        assert_eq!(at("spec.properties[x].desired"), None);
    }
}
