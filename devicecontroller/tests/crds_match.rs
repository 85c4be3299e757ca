//! The committed CRD YAMLs are what the code generates, and our schemas agree with KubeEdge's own
//! CRDs (`../shared/reference/kubeedge-crds/`): field by field, and on sample objects.

use api::validate::schema;
use serde_json::{Map, Value, json};
use std::path::{Path, PathBuf};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn committed_crds_are_current() {
    for (file, yaml) in devicecontroller::crd_files().expect("CRDs render") {
        let path = crate_dir().join("crds").join(&file);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == yaml,
            "{} is stale: run `cargo run -p devicecontroller --bin crdgen` and commit",
            path.display()
        );
    }
}

/// KubeEdge's CRD YAMLs, beside the project in `../shared/reference/kubeedge-crds/`.
fn kubeedge_crd_dir() -> PathBuf {
    let dir = crate_dir().join("../../shared/reference/kubeedge-crds");
    assert!(
        dir.is_dir(),
        "KubeEdge's CRDs are expected at {} (the shared folder beside the project)",
        dir.display()
    );
    dir
}

fn v1beta1_schema(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("KubeEdge CRD readable");
    let crd: Value = serde_yaml_ng::from_str(&text).expect("KubeEdge CRD parses");
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .expect("versions");
    let v = versions
        .iter()
        .find(|v| v["name"] == "v1beta1")
        .expect("a v1beta1 version");
    v.pointer("/schema/openAPIV3Schema")
        .cloned()
        .expect("schema")
}

fn ours(kind: &str) -> Value {
    api::crd::schema_of(kind).expect("our schema")
}

/// The parts of a schema that decide what is accepted: no descriptions; `nullable` dropped,
/// since the API server prunes a null in a non-nullable field instead of refusing it.
fn normalise(schema: &Value) -> Value {
    let Some(obj) = schema.as_object() else {
        return schema.clone();
    };
    let mut out = Map::new();
    for (k, v) in obj {
        match k.as_str() {
            "description" | "nullable" | "title" => {}
            "properties" => {
                let props = v
                    .as_object()
                    .map(|p| p.iter().map(|(k, v)| (k.clone(), normalise(v))).collect());
                out.insert(k.clone(), Value::Object(props.unwrap_or_default()));
            }
            "items" | "additionalProperties" => {
                out.insert(k.clone(), normalise(v));
            }
            "required" => {
                let mut r: Vec<Value> = v.as_array().cloned().unwrap_or_default();
                r.sort_by_key(|x| x.to_string());
                out.insert(k.clone(), Value::Array(r));
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

fn diff(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, va) in x {
                match y.get(k) {
                    Some(vb) => diff(&format!("{path}/{k}"), va, vb, out),
                    None => out.push(format!("{path}/{k}: only in ours")),
                }
            }
            for k in y.keys().filter(|k| !x.contains_key(*k)) {
                out.push(format!("{path}/{k}: only in KubeEdge's"));
            }
        }
        _ if a != b => out.push(format!("{path}: ours {a}, KubeEdge's {b}")),
        _ => {}
    }
}

#[test]
fn our_schemas_equal_kubeedges_field_by_field() {
    let dir = kubeedge_crd_dir();
    let mut differences = Vec::new();
    for (kind, file) in [
        ("Device", "devices_v1beta1_device.yaml"),
        ("DeviceModel", "devices_v1beta1_devicemodel.yaml"),
        ("DeviceStatus", "devices_v1beta1_devicestatus.yaml"),
    ] {
        let theirs = normalise(&v1beta1_schema(&dir.join(file)));
        diff(kind, &normalise(&ours(kind)), &theirs, &mut differences);
    }
    assert!(
        differences.is_empty(),
        "schema differences:\n{}",
        differences.join("\n")
    );
}

fn verdict(schema: &Value, object: &Value) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    schema::check(object, schema, "", &mut problems);
    let errors: Vec<String> = problems
        .iter()
        .filter(|p| p.is_error())
        .map(ToString::to_string)
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

fn samples() -> Vec<(&'static str, &'static str, Value, bool)> {
    let meta = json!({"name": "x", "namespace": "default", "labels": {"a": "b"}});
    let device = |spec: Value| json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device", "metadata": meta, "spec": spec});
    let model = |spec: Value| json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel", "metadata": meta, "spec": spec});
    let status = |status: Value| json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceStatus", "metadata": meta, "spec": {}, "status": status});
    vec![
        (
            "Device",
            "documented example",
            device(json!({
                "deviceModelRef": {"name": "beta1-model"}, "nodeName": "worker-node1",
                "protocol": {"protocolName": "modbus", "configData": {"ip": "172.17.0.3", "port": 1502}},
                "properties": [{"name": "temp", "collectCycle": 2000, "reportCycle": 2000, "reportToCloud": true,
                    "desired": {"value": "30"},
                    "pushMethod": {"mqtt": {"address": "tcp://127.0.0.1:1883", "topic": "temp", "qos": 0, "retained": false},
                        "dbMethod": {"influxdb2": {"influxdb2ClientConfig": {"url": "http://127.0.0.1:8086", "org": "test-org", "bucket": "test-bucket"},
                            "influxdb2DataConfig": {"measurement": "stat", "tag": {"unit": "temperature"}, "fieldKey": "beta1test"}}}},
                    "visitors": {"protocolName": "modbus", "configData": {"register": "HoldingRegister", "offset": 2, "limit": 1, "scale": 1, "isSwap": true, "isRegisterSwap": true}}}]
            })),
            true,
        ),
        (
            "Device",
            "every push method",
            device(json!({"properties": [{"name": "p", "pushMethod": {
            "http": {"hostName": "h", "port": 80, "requestPath": "/x", "timeout": 3},
            "otel": {"endpointURL": "https://localhost:4318/v1/metrics"},
            "anomalyDetection": {"anything": {"goes": [1]}},
            "dbMethod": {"redis": {"redisClientConfig": {"addr": "a", "db": 1, "poolsize": 2, "minIdleConns": 3}},
                "TDEngine": {"TDEngineClientConfig": {"addr": "a", "dbName": "d"}},
                "mysql": {"mysqlClientConfig": {"addr": "a", "database": "d", "userName": "u"}}}}}],
            "methods": [{"name": "m", "description": "d", "propertyNames": ["p"]}],
            "stateReport": {"reportToCloud": true, "reportCycle": 1000}})),
            true,
        ),
        (
            "Device",
            "old status fields",
            json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device", "metadata": meta,
            "spec": {}, "status": {"reportToCloud": true, "reportCycle": 5, "twins": [{"propertyName": "t"}], "state": "online"}}),
            true,
        ),
        (
            "Device",
            "no spec",
            json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device", "metadata": meta}),
            true,
        ),
        (
            "Device",
            "unknown spec field",
            device(json!({"nodename": "n"})),
            false,
        ),
        (
            "Device",
            "string cycle",
            device(json!({"properties": [{"name": "p", "collectCycle": "2000"}]})),
            false,
        ),
        (
            "Device",
            "desired without value",
            device(json!({"properties": [{"name": "p", "desired": {"metadata": {}}}]})),
            false,
        ),
        (
            "Device",
            "lower-case tdengine",
            device(
                json!({"properties": [{"name": "p", "pushMethod": {"dbMethod": {"tdengine": {}}}}]}),
            ),
            true,
        ),
        (
            "Device",
            "metadata map not strings",
            device(
                json!({"properties": [{"name": "p", "desired": {"value": "1", "metadata": {"k": 1}}}]}),
            ),
            false,
        ),
        (
            "Device",
            "properties not a list",
            device(json!({"properties": {"name": "p"}})),
            false,
        ),
        (
            "Device",
            "configData is free-form",
            device(json!({"protocol": {"configData": {"deep": {"x": [null, 1.5, "s"]}}}})),
            true,
        ),
        (
            "DeviceModel",
            "documented model",
            model(
                json!({"protocol": "modbus", "properties": [{"name": "temp", "description": "beta1-model",
            "type": "INT", "accessMode": "ReadWrite", "maximum": "100", "minimum": "1", "unit": "Celsius"}]}),
            ),
            true,
        ),
        (
            "DeviceModel",
            "model defaults",
            model(
                json!({"protocol": "modbus", "protocolConfigData": {"port": 502},
            "properties": [{"name": "t", "visitors": {"protocolName": "modbus", "configData": {"offset": 1}}}]}),
            ),
            true,
        ),
        (
            "DeviceModel",
            "type outside the enum",
            model(json!({"properties": [{"name": "t", "type": "int"}]})),
            false,
        ),
        (
            "DeviceModel",
            "access mode outside the enum",
            model(json!({"properties": [{"name": "t", "accessMode": "WriteOnly"}]})),
            false,
        ),
        (
            "DeviceModel",
            "numeric minimum",
            model(json!({"properties": [{"name": "t", "minimum": 1}]})),
            false,
        ),
        (
            "DeviceStatus",
            "twins",
            status(
                json!({"twins": [{"propertyName": "t", "reported": {"value": "1", "metadata": {"timestamp": "1"}},
            "observedDesired": {"value": "2"}}], "state": "online", "lastOnlineTime": "2026-01-01T00:00:00Z", "extensions": {"x": 1}}),
            ),
            true,
        ),
        (
            "DeviceStatus",
            "reported without value",
            status(json!({"twins": [{"propertyName": "t", "reported": {}}]})),
            false,
        ),
        (
            "DeviceStatus",
            "old desired field",
            status(json!({"twins": [{"propertyName": "t", "desired": {"value": "1"}}]})),
            false,
        ),
    ]
}

#[test]
fn both_schemas_give_the_same_verdict_on_sample_objects() {
    let dir = kubeedge_crd_dir();
    let file = |kind: &str| dir.join(format!("devices_v1beta1_{}.yaml", kind.to_lowercase()));
    let mut disagreements = Vec::new();
    for (kind, what, object, expected) in samples() {
        let ours = verdict(&ours(kind), &object);
        let theirs = verdict(&v1beta1_schema(&file(kind)), &object);
        if ours.is_ok() != expected || theirs.is_ok() != expected {
            disagreements.push(format!(
                "{kind} {what}: expected accepted={expected}, ours {ours:?}, KubeEdge's {theirs:?}"
            ));
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
}
