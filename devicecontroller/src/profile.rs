//! The per-node device profile ConfigMap: `device-profile-config-{node}`, key
//! `deviceProfile.json`, in the format KubeEdge's cloud wrote up to v1.14 (its
//! `devicecontroller/types/deviceprofile.go`), derived from the v1beta1 objects. Mappers written
//! for KubeEdge up to v1.14 read this file from the ConfigMap mounted into their pod; v1.15+
//! mappers get the objects over DMI instead, so nothing else depends on it.
//!
//! One ConfigMap per node and namespace, in the namespace of its devices (KubeEdge wrote it in
//! the device's namespace, so devices of one node in two namespaces overwrote each other there).

use serde_json::{Map, Value, json};

pub const PREFIX: &str = "device-profile-config-";
pub const KEY: &str = "deviceProfile.json";

/// The most a profile may hold: a ConfigMap's data is kept under 1 MiB by Kubernetes (a node of
/// ~1,700 devices of 10 properties has a larger profile). Past it the ConfigMap holds no
/// profile and says why in [`OMITTED`].
pub const MAX_BYTES: usize = 1024 * 1024;

/// The annotation of a profile ConfigMap whose profile is too large to be written.
pub const OMITTED: &str = "devices.kubeedge.io/profile-omitted";

/// What [`OMITTED`] says of a profile of `bytes` bytes for `devices` devices.
pub fn omitted(devices: usize, bytes: usize, max: usize) -> String {
    format!(
        "the profile of {devices} devices is {bytes} bytes, over the {max} a ConfigMap holds: not written; mappers of KubeEdge v1.15 and later get their devices over DMI"
    )
}

/// The ConfigMap name of a node.
pub fn name(node: &str) -> String {
    format!("{PREFIX}{node}")
}

/// `f` of each item of the array `a` (none when `a` is not an array).
fn each(a: &Value, f: impl Fn(&Value) -> Value) -> Vec<Value> {
    a.as_array()
        .map(|a| a.iter().map(f).collect())
        .unwrap_or_default()
}

fn put(m: &mut Map<String, Value>, k: &str, v: &Value) {
    match v {
        Value::Null => {}
        Value::String(s) if s.is_empty() => {}
        _ => {
            m.insert(k.into(), v.clone());
        }
    }
}

/// A v1beta1 property type (`INT`, `FLOAT`, ...) as v1.14's `dataType` (`int`, `float`, ...).
fn data_type(t: &Value) -> Value {
    match t.as_str() {
        Some(s) => json!(s.to_lowercase()),
        None => Value::Null,
    }
}

/// A bound as v1.14 wrote it: a number when it is one.
fn bound(v: &Value) -> Value {
    match v.as_str().map(str::trim) {
        Some(s) => s
            .parse::<i64>()
            .map(|i| json!(i))
            .or_else(|_| s.parse::<f64>().map(|f| json!(f)))
            .unwrap_or_else(|_| json!(s)),
        None => v.clone(),
    }
}

/// The profile of the devices of one node in one namespace (each with its model, when it
/// exists), sorted by name so the same devices give the same bytes.
pub fn profile(devices: &[(&Value, Option<&Value>)]) -> Value {
    let mut list: Vec<&(&Value, Option<&Value>)> = devices.iter().collect();
    list.sort_by_key(|(d, _)| {
        d["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    });
    let mut instances = Vec::new();
    let mut protocols = Vec::new();
    let mut models: Vec<Value> = Vec::new();
    for (d, model) in list {
        let name = d["metadata"]["name"].as_str().unwrap_or_default();
        let spec = &d["spec"];
        let model_name = spec["deviceModelRef"]["name"].as_str().unwrap_or_default();
        let proto = spec["protocol"]["protocolName"]
            .as_str()
            .or_else(|| model.and_then(|m| m["spec"]["protocol"].as_str()))
            .unwrap_or_default();
        let protocol_id = format!("{proto}-{name}");
        let visitors: Vec<Value> = each(&spec["properties"], |p| {
            let mut v = Map::new();
            put(&mut v, "name", &p["name"]);
            put(&mut v, "propertyName", &p["name"]);
            put(&mut v, "modelName", &json!(model_name));
            put(&mut v, "protocol", &json!(proto));
            put(&mut v, "reportCycle", &p["reportCycle"]);
            put(&mut v, "collectCycle", &p["collectCycle"]);
            put(&mut v, "visitorConfig", &p["visitors"]["configData"]);
            Value::Object(v)
        });
        let mut inst = Map::new();
        put(&mut inst, "id", &json!(name));
        put(&mut inst, "name", &json!(name));
        put(&mut inst, "protocol", &json!(protocol_id));
        put(&mut inst, "model", &json!(model_name));
        if !visitors.is_empty() {
            inst.insert("propertyVisitors".into(), json!(visitors));
        }
        instances.push(Value::Object(inst));
        protocols.push(json!({"name": protocol_id, "protocol": proto,
            "protocolConfig": spec["protocol"]["configData"], "protocolCommonConfig": Value::Null}));
        if let Some(m) = model
            && !models.iter().any(|x| x["name"] == json!(model_name))
        {
            let props: Vec<Value> = each(&m["spec"]["properties"], |p| {
                let mut v = Map::new();
                put(&mut v, "name", &p["name"]);
                put(&mut v, "dataType", &data_type(&p["type"]));
                put(&mut v, "description", &p["description"]);
                put(&mut v, "accessMode", &p["accessMode"]);
                put(&mut v, "minimum", &bound(&p["minimum"]));
                put(&mut v, "maximum", &bound(&p["maximum"]));
                put(&mut v, "unit", &p["unit"]);
                Value::Object(v)
            });
            let mut mm = Map::new();
            put(&mut mm, "name", &json!(model_name));
            put(
                &mut mm,
                "description",
                &m["metadata"]["annotations"]["description"],
            );
            mm.insert("properties".into(), json!(props));
            models.push(Value::Object(mm));
        }
    }
    json!({"deviceInstances": instances, "deviceModels": models, "protocols": protocols})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_modbus_device_in_the_v1_14_shape() {
        let d = json!({"metadata": {"name": "oven-1", "namespace": "default"},
            "spec": {"deviceModelRef": {"name": "oven"}, "nodeName": "n1",
                "protocol": {"protocolName": "modbus", "configData": {"ip": "10.0.0.5", "port": 502}},
                "properties": [{"name": "temperature", "collectCycle": 1000, "reportCycle": 2000,
                    "visitors": {"protocolName": "modbus", "configData": {"register": "HoldingRegister", "offset": 0}}}]}});
        let m = json!({"metadata": {"name": "oven"}, "spec": {"protocol": "modbus",
            "properties": [{"name": "temperature", "type": "INT", "accessMode": "ReadOnly", "minimum": "0", "maximum": "300", "unit": "C"}]}});
        let p = profile(&[(&d, Some(&m))]);
        assert_eq!(p["deviceInstances"][0]["id"], "oven-1");
        assert_eq!(p["deviceInstances"][0]["protocol"], "modbus-oven-1");
        assert_eq!(p["deviceInstances"][0]["model"], "oven");
        let v = &p["deviceInstances"][0]["propertyVisitors"][0];
        assert_eq!(v["propertyName"], "temperature");
        assert_eq!(v["modelName"], "oven");
        assert_eq!(v["protocol"], "modbus");
        assert_eq!(v["collectCycle"], 1000);
        assert_eq!(v["visitorConfig"]["register"], "HoldingRegister");
        let prop = &p["deviceModels"][0]["properties"][0];
        assert_eq!(
            (prop["dataType"].as_str(), prop["maximum"].as_i64()),
            (Some("int"), Some(300))
        );
        assert_eq!(
            p["protocols"][0],
            json!({"name": "modbus-oven-1", "protocol": "modbus",
            "protocolConfig": {"ip": "10.0.0.5", "port": 502}, "protocolCommonConfig": null})
        );
    }
}
