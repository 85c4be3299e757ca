//! The committed CRD YAMLs are what the code generates, and our schemas agree with KubeEdge's
//! CRDs field by field and on sample objects.
//!
//! What KubeEdge's v1beta1 CRDs say (each field's path, type, format, enum, required list, as in
//! `build/crds/devices/` of kubeedge/kubeedge) is kept in this repository as a list of facts,
//! `tests/fixtures/kubeedge-v1beta1.facts`, one line per fact, and our schemas are checked against
//! it. When KubeEdge's own YAMLs are given (`KUBEEDGE_CRDS=/path/to/kubeedge/build/crds/devices`),
//! the facts are checked against them too and the sample objects are judged by both schemas;
//! `KUBEEDGE_CRDS=... UPDATE_FACTS=1` writes the facts anew from them.

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

/// The kinds, with the file of each in KubeEdge's CRD folder.
const KINDS: [(&str, &str); 3] = [
    ("Device", "devices_v1beta1_device.yaml"),
    ("DeviceModel", "devices_v1beta1_devicemodel.yaml"),
    ("DeviceStatus", "devices_v1beta1_devicestatus.yaml"),
];

/// KubeEdge's CRD YAMLs, when `KUBEEDGE_CRDS` names their folder; `None` (said on stderr)
/// otherwise.
fn kubeedge_crd_dir() -> Option<PathBuf> {
    let Some(dir) = std::env::var_os("KUBEEDGE_CRDS") else {
        eprintln!(
            "KUBEEDGE_CRDS is not set: checked against the committed facts only, not against KubeEdge's own CRD files"
        );
        return None;
    };
    let dir = PathBuf::from(dir);
    assert!(
        dir.is_dir(),
        "KUBEEDGE_CRDS={} is not a directory",
        dir.display()
    );
    Some(dir)
}

fn facts_file() -> PathBuf {
    crate_dir().join("tests/fixtures/kubeedge-v1beta1.facts")
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

/// A schema as a sorted list of facts, one per line: `KIND PATH KEY VALUE`, where PATH is the
/// field's path (`.spec.properties[].name`; `{}` for a map's values) and VALUE is JSON.
fn facts(kind: &str, schema: &Value) -> Vec<String> {
    fn walk(kind: &str, path: &str, schema: &Value, out: &mut Vec<String>) {
        let Some(obj) = schema.as_object() else {
            return;
        };
        for (k, v) in obj {
            match (k.as_str(), v) {
                ("properties", Value::Object(props)) => {
                    for (name, sub) in props {
                        walk(kind, &format!("{path}.{name}"), sub, out);
                    }
                }
                ("items", Value::Object(_)) => walk(kind, &format!("{path}[]"), v, out),
                ("additionalProperties", Value::Object(_)) => {
                    walk(kind, &format!("{path}{{}}"), v, out)
                }
                _ => out.push(format!(
                    "{kind} {} {k} {v}",
                    if path.is_empty() { "." } else { path }
                )),
            }
        }
    }
    let mut out = Vec::new();
    walk(kind, "", &normalise(schema), &mut out);
    out.sort();
    out
}

fn all_facts(schema_of: impl Fn(&str, &str) -> Value) -> Vec<String> {
    let mut all: Vec<String> = KINDS
        .iter()
        .flat_map(|(kind, file)| facts(kind, &schema_of(kind, file)))
        .collect();
    all.sort();
    all
}

fn committed_facts() -> Vec<String> {
    let text = std::fs::read_to_string(facts_file()).expect("the committed facts are readable");
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// The lines only in `a` and only in `b`, named.
fn differences(a_name: &str, a: &[String], b_name: &str, b: &[String]) -> Vec<String> {
    let mut out: Vec<String> = a
        .iter()
        .filter(|l| !b.contains(l))
        .map(|l| format!("only in {a_name}: {l}"))
        .collect();
    out.extend(
        b.iter()
            .filter(|l| !a.contains(l))
            .map(|l| format!("only in {b_name}: {l}")),
    );
    out
}

#[test]
fn our_schemas_equal_kubeedges_field_by_field() {
    let ours = all_facts(|kind, _| ours(kind));
    if let Some(dir) = kubeedge_crd_dir() {
        let theirs = all_facts(|_, file| v1beta1_schema(&dir.join(file)));
        if std::env::var_os("UPDATE_FACTS").is_some() {
            let header = "# KubeEdge's devices.kubeedge.io v1beta1 CRD schemas as facts: KIND PATH KEY VALUE.\n# Written by `KUBEEDGE_CRDS=... UPDATE_FACTS=1 cargo test -p devicecontroller --test crds_match`.\n";
            std::fs::write(facts_file(), format!("{header}{}\n", theirs.join("\n")))
                .expect("facts written");
        }
        let stale = differences(
            "the committed facts",
            &committed_facts(),
            "KubeEdge's CRDs",
            &theirs,
        );
        assert!(
            stale.is_empty(),
            "the committed facts are not KubeEdge's:\n{}",
            stale.join("\n")
        );
    }
    let wrong = differences(
        "our schemas",
        &ours,
        "KubeEdge's (committed facts)",
        &committed_facts(),
    );
    assert!(
        wrong.is_empty(),
        "schema differences:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_facts_name_what_kubeedge_requires_and_enumerates() {
    // The list is not empty or trivially small: these are facts a user's manifest meets.
    let facts = committed_facts();
    for fact in [
        "DeviceModel .spec.properties[].type enum [\"INT\",\"FLOAT\",\"DOUBLE\",\"STRING\",\"BOOLEAN\",\"BYTES\",\"STREAM\"]",
        "Device .spec.properties[].collectCycle type \"integer\"",
        "DeviceStatus .status.twins[].reported required [\"value\"]",
    ] {
        assert!(facts.iter().any(|f| f == fact), "no fact {fact}");
    }
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
    let mut disagreements = Vec::new();
    for (kind, what, object, expected) in samples() {
        let ours = verdict(&ours(kind), &object);
        // Without KubeEdge's files, the expected verdict stands for theirs.
        let theirs = dir.as_ref().map(|dir| {
            let file = dir.join(format!("devices_v1beta1_{}.yaml", kind.to_lowercase()));
            verdict(&v1beta1_schema(&file), &object)
        });
        let theirs_ok = theirs.as_ref().map_or(expected, Result::is_ok);
        if ours.is_ok() != expected || theirs_ok != expected {
            disagreements.push(format!(
                "{kind} {what}: expected accepted={expected}, ours {ours:?}, KubeEdge's {theirs:?}"
            ));
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
}
