//! KubeEdge's `$hw` MQTT payloads (kubeedge/kubeedge `edge/pkg/devicetwin/dttype/types.go` and `dtcommon`), parsed and built without IO.
//! Field names and shapes are KubeEdge's, so apps written for KubeEdge read them unchanged.

use api::v1beta1::PropertyType;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use twin::engine::{Applied, TwinError};
use twin::model::rfc3339;
use twin::{DeviceRow, DeviceTwin, Millis, PropertyTwin, TwinValue, Version};

/// A payload that cannot be used, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct BadPayload(pub String);

/// The optional `event_id` of a request, echoed in its result.
pub(crate) fn event_id(payload: &[u8]) -> String {
    serde_json::from_slice::<Value>(payload)
        .ok()
        .and_then(|v| {
            v.get("event_id")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_default()
}

#[derive(Deserialize)]
struct ValueField {
    value: Option<String>,
}

#[derive(Deserialize)]
struct TypeField {
    #[serde(rename = "type")]
    type_: Option<String>,
}

#[derive(Deserialize)]
struct MsgTwinIn {
    expected: Option<ValueField>,
    actual: Option<ValueField>,
    metadata: Option<TypeField>,
}

/// One property of a `twin/update` request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TwinUpdate {
    /// Sets the desired (`expected`) and/or reported (`actual`) value.
    Set {
        name: String,
        expected: Option<String>,
        actual: Option<String>,
        value_type: Option<PropertyType>,
    },
    /// `"name": null`: delete an optional property.
    Delete { name: String },
}

/// KubeEdge's `metadata.type` spelling of a property type.
pub(crate) fn type_name(t: PropertyType) -> &'static str {
    match t {
        PropertyType::Int => "int",
        PropertyType::Float => "float",
        PropertyType::Double => "double",
        PropertyType::String => "string",
        PropertyType::Boolean => "boolean",
        PropertyType::Bytes => "bytes",
        PropertyType::Stream => "stream",
    }
}

/// Parses `$hw/events/device/{ns}/{name}/twin/update`.
pub(crate) fn parse_twin_update(payload: &[u8]) -> Result<Vec<TwinUpdate>, BadPayload> {
    let v: Value = serde_json::from_slice(payload)
        .map_err(|e| BadPayload(format!("payload is not JSON: {e}")))?;
    let twin = v
        .get("twin")
        .ok_or_else(|| BadPayload("payload has no \"twin\" object".into()))?
        .as_object()
        .ok_or_else(|| BadPayload("\"twin\" is not an object".into()))?;
    let mut out = Vec::with_capacity(twin.len());
    for (name, t) in twin {
        if t.is_null() {
            out.push(TwinUpdate::Delete { name: name.clone() });
            continue;
        }
        let t: MsgTwinIn = serde_json::from_value(t.clone())
            .map_err(|e| BadPayload(format!("twin.{name}: {e}")))?;
        let value_type = match t.metadata.and_then(|m| m.type_) {
            None => None,
            Some(s) => Some(PropertyType::from_twin_type(&s).ok_or_else(|| {
                BadPayload(format!(
                    "twin.{name}.metadata.type: {s:?} is not a known type"
                ))
            })?),
        };
        let expected = t.expected.and_then(|e| e.value);
        let actual = t.actual.and_then(|a| a.value);
        if expected.is_none() && actual.is_none() {
            return Err(BadPayload(format!(
                "twin.{name}: neither expected.value nor actual.value is given"
            )));
        }
        out.push(TwinUpdate::Set {
            name: name.clone(),
            expected,
            actual,
            value_type,
        });
    }
    if out.is_empty() {
        return Err(BadPayload("\"twin\" is empty".into()));
    }
    Ok(out)
}

/// Parses `…/state/update`: the new state.
pub(crate) fn parse_state_update(payload: &[u8]) -> Result<String, BadPayload> {
    let v: Value = serde_json::from_slice(payload)
        .map_err(|e| BadPayload(format!("payload is not JSON: {e}")))?;
    v.get("state")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| BadPayload("payload has no string \"state\"".into()))
}

/// Checks a request that must be a JSON object (`twin/get`, `membership/get`).
pub(crate) fn parse_request(payload: &[u8]) -> Result<(), BadPayload> {
    if payload.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    match serde_json::from_slice::<Value>(payload) {
        Ok(Value::Object(_)) => Ok(()),
        Ok(_) => Err(BadPayload("payload is not a JSON object".into())),
        Err(e) => Err(BadPayload(format!("payload is not JSON: {e}"))),
    }
}

fn value_json(v: &TwinValue) -> Value {
    json!({"value": v.value, "metadata": {"timestamp": v.timestamp}})
}

fn version_json(v: Version) -> Value {
    json!({"cloud": v.cloud, "edge": v.edge})
}

/// KubeEdge's `MsgTwin` of a property. `expected` is the desired value; for a property with
/// none, it is the desired value the mapper last observed (`observedDesired`), which KubeEdge's
/// edgecore stores as `expected` (see docs/kubeedge-differences.md).
pub(crate) fn msg_twin(p: &PropertyTwin, versions: bool) -> Value {
    let mut m = Map::new();
    if let Some(d) = p.desired.as_ref().or(p.observed_desired.as_ref()) {
        m.insert("expected".into(), value_json(d));
    }
    if let Some(r) = &p.reported {
        m.insert("actual".into(), value_json(r));
    }
    m.insert("optional".into(), Value::Bool(p.optional));
    m.insert("metadata".into(), json!({"type": type_name(p.value_type)}));
    if versions {
        m.insert("expected_version".into(), version_json(p.desired_version));
        m.insert("actual_version".into(), version_json(p.reported_version));
    }
    Value::Object(m)
}

fn envelope(event_id: &str, now: Millis) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("event_id".into(), Value::String(event_id.into()));
    m.insert("timestamp".into(), Value::from(now));
    m
}

fn bytes(v: Map<String, Value>) -> Vec<u8> {
    serde_json::to_vec(&Value::Object(v)).unwrap_or_default()
}

/// The 404 result of a request about a device the node does not have.
pub(crate) fn unknown_device(
    event_id: &str,
    now: Millis,
    device: &api::paths::DeviceId,
) -> Vec<u8> {
    twin_error_result(event_id, now, &TwinError::UnknownDevice(device.clone()))
}

/// An error result: `{"event_id","timestamp","code","reason"}`.
pub(crate) fn error_result(event_id: &str, now: Millis, code: u16, reason: &str) -> Vec<u8> {
    let mut m = envelope(event_id, now);
    m.insert("code".into(), Value::from(code));
    m.insert("reason".into(), Value::String(reason.into()));
    bytes(m)
}

/// The error result of a twin error.
pub(crate) fn twin_error_result(event_id: &str, now: Millis, e: &TwinError) -> Vec<u8> {
    error_result(event_id, now, e.code(), &e.to_string())
}

/// `twin/update/result`: the properties the request named, as they are now, with versions.
pub(crate) fn update_result(
    event_id: &str,
    now: Millis,
    twin: &DeviceTwin,
    names: &[String],
) -> Vec<u8> {
    let mut t = Map::new();
    for n in names {
        let v = twin
            .properties
            .get(n)
            .map(|p| msg_twin(p, true))
            .unwrap_or(Value::Null);
        t.insert(n.clone(), v);
    }
    let mut m = envelope(event_id, now);
    m.insert("twin".into(), Value::Object(t));
    bytes(m)
}

/// `twin/get/result`: the whole twin, versions stripped. A property whose last read failed has
/// `"error": {"message", "timestamp", "kind": "read"}`, one whose desired value was refused
/// `"writeError"` (and `"error"` with `"kind": "write"` when its read did not fail), see
/// [`twin::PropertyTwin::error_fields`]; its `actual` value, and every one while the device is
/// `unknown` or `offline`, also says `"stale": true` and its age in ms (`"age"`) in its metadata:
/// it is the last value read, not a live one. KubeEdge's apps ignore these keys.
pub(crate) fn get_result(event_id: &str, now: Millis, twin: &DeviceTwin) -> Vec<u8> {
    let stale = twin.values_stale();
    let t: Map<String, Value> = twin
        .properties
        .iter()
        .map(|(k, p)| {
            let mut v = msg_twin(p, false);
            if let Value::Object(m) = &mut v {
                for (k, e) in p.error_fields() {
                    m.insert(k.into(), e);
                }
            }
            if let Some(age) = p.stale_age(stale, now)
                && let Some(Value::Object(meta)) =
                    v.get_mut("actual").and_then(|a| a.get_mut("metadata"))
            {
                meta.insert("stale".into(), Value::Bool(true));
                meta.insert("age".into(), Value::from(age));
            }
            (k.clone(), v)
        })
        .collect();
    let mut m = envelope(event_id, now);
    m.insert("twin".into(), Value::Object(t));
    bytes(m)
}

/// `twin/update/document`: last and current state of every changed property.
pub(crate) fn document(event_id: &str, now: Millis, applied: &Applied) -> Vec<u8> {
    let t: Map<String, Value> = applied
        .changes
        .iter()
        .map(|c| {
            let side =
                |p: &Option<PropertyTwin>| p.as_ref().map_or(Value::Null, |p| msg_twin(p, true));
            (
                c.name.clone(),
                json!({"last": side(&c.last), "current": side(&c.current)}),
            )
        })
        .collect();
    let mut m = envelope(event_id, now);
    m.insert("twin".into(), Value::Object(t));
    bytes(m)
}

/// `twin/update/delta`, built over the whole twin as KubeEdge does: `twin` holds every property
/// with a desired value (versions stripped), `delta` those whose desired value differs from the
/// reported one; `None` when none differs.
pub(crate) fn delta(event_id: &str, now: Millis, twin: &DeviceTwin) -> Option<Vec<u8>> {
    let delta = twin::engine::twin_delta(twin);
    if delta.is_empty() {
        return None;
    }
    let twins: Map<String, Value> = twin
        .properties
        .iter()
        .filter(|(_, p)| p.desired.as_ref().is_some_and(|d| !d.value.is_empty()))
        .map(|(k, p)| (k.clone(), msg_twin(p, false)))
        .collect();
    let mut m = envelope(event_id, now);
    m.insert("twin".into(), Value::Object(twins));
    m.insert("delta".into(), json!(delta));
    Some(bytes(m))
}

/// `state/update/result`.
pub(crate) fn state_result(event_id: &str, now: Millis, row: &DeviceRow) -> Vec<u8> {
    let mut m = envelope(event_id, now);
    let mut device =
        json!({"name": row.name, "state": row.state, "lastOnlineTime": rfc3339(row.last_online)});
    if !row.state_reason.is_empty() {
        device["reason"] = Value::String(row.state_reason.clone());
    }
    m.insert("device".into(), device);
    bytes(m)
}

fn membership_device(row: &DeviceRow) -> Value {
    json!({
        "id": format!("{}/{}", row.namespace, row.name),
        "name": row.name,
        "description": row.description,
        "state": row.state,
        "last_online": rfc3339(row.last_online),
        "attributes": {},
    })
}

/// `membership/get/result`.
pub(crate) fn membership_result(event_id: &str, now: Millis, rows: &[DeviceRow]) -> Vec<u8> {
    let mut m = envelope(event_id, now);
    m.insert(
        "devices".into(),
        Value::Array(rows.iter().map(membership_device).collect()),
    );
    bytes(m)
}

/// `membership/updated`.
pub(crate) fn membership_updated(
    event_id: &str,
    now: Millis,
    added: &[DeviceRow],
    removed: &[DeviceRow],
) -> Vec<u8> {
    let mut m = envelope(event_id, now);
    m.insert(
        "added_devices".into(),
        Value::Array(added.iter().map(membership_device).collect()),
    );
    m.insert(
        "removed_devices".into(),
        Value::Array(removed.iter().map(membership_device).collect()),
    );
    bytes(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twin_update_is_parsed_as_kubeedge_sends_it() {
        let p = br#"{"event_id":"e1","timestamp":1,"twin":{"setpoint":{"expected":{"value":"30"},"metadata":{"type":"float"}},"note":{"actual":{"value":"a b"}},"old":null}}"#;
        let u = parse_twin_update(p).expect("valid");
        assert_eq!(u.len(), 3);
        assert!(u.contains(&TwinUpdate::Set {
            name: "setpoint".into(),
            expected: Some("30".into()),
            actual: None,
            value_type: Some(PropertyType::Float)
        }));
        assert!(u.contains(&TwinUpdate::Delete { name: "old".into() }));
        assert_eq!(event_id(p), "e1");
    }

    #[test]
    fn twin_get_marks_values_stale_while_the_device_is_not_live() {
        let id = api::paths::DeviceId::new("default", "d");
        let mut t = DeviceTwin::new(&id);
        let mut p = PropertyTwin::new(PropertyType::Int, false, false);
        p.reported = Some(TwinValue {
            value: "7".into(),
            timestamp: 1_000,
        });
        t.properties.insert("v".into(), p);
        t.row.state = "online".into();
        let live: Value = serde_json::from_slice(&get_result("e", 5_000, &t)).expect("json");
        assert_eq!(
            live["twin"]["v"]["actual"]["metadata"],
            json!({"timestamp": 1_000})
        );
        t.row.state = "unknown".into();
        let stale: Value = serde_json::from_slice(&get_result("e", 5_000, &t)).expect("json");
        assert_eq!(
            stale["twin"]["v"]["actual"],
            json!({"value": "7", "metadata": {"timestamp": 1_000, "stale": true, "age": 4_000}})
        );
    }

    #[test]
    fn garbage_twin_updates_are_errors_that_say_why() {
        for (p, want) in [
            (&b"\xff\x00"[..], "not JSON"),
            (b"[]", "no \"twin\""),
            (br#"{"twin":5}"#, "not an object"),
            (br#"{"twin":{}}"#, "empty"),
            (br#"{"twin":{"a":{"expected":{"value":5}}}}"#, "twin.a"),
            (br#"{"twin":{"a":{}}}"#, "neither"),
            (
                br#"{"twin":{"a":{"actual":{"value":"1"},"metadata":{"type":"quaternion"}}}}"#,
                "quaternion",
            ),
        ] {
            let e = parse_twin_update(p).expect_err("invalid");
            assert!(e.0.contains(want), "{}: {e}", String::from_utf8_lossy(p));
        }
    }
}
