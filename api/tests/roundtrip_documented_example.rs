//! A Device and DeviceModel written as KubeEdge documents them, parsed and serialised again, keep
//! every field; the casing variants KubeEdge's edge accepts are read too.

use api::manifest::{Object, parse_documents};
use api::v1beta1::{Device, DeviceModel};
use serde_json::{Value, json};

/// The v1beta1 example of KubeEdge's device CRD documentation (kubeedge/website, the device CRD page),
/// with every other field of the newest CRDs set as well.
const DOCUMENTED: &str = include_str!("manifests/documented_example.yaml");

fn documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).expect("test YAML parses"))
        .collect()
}

#[test]
fn the_documented_example_keeps_every_field() {
    let raw = documents(DOCUMENTED);
    let model: DeviceModel = serde_json::from_value(raw[0].clone()).expect("model parses");
    let device: Device = serde_json::from_value(raw[1].clone()).expect("device parses");
    assert_eq!(serde_json::to_value(&model).expect("serialises"), raw[0]);
    assert_eq!(serde_json::to_value(&device).expect("serialises"), raw[1]);
    // And through YAML text again.
    let yaml = serde_yaml_ng::to_string(&device).expect("to YAML");
    let again: Device = serde_yaml_ng::from_str(&yaml).expect("from YAML");
    assert_eq!(again, device);
    // Field values are where the documentation says.
    let p = &device.spec.properties[0];
    assert_eq!(p.collect_cycle, Some(2000));
    let db = p
        .push_method
        .as_ref()
        .and_then(|m| m.db_method.as_ref())
        .expect("dbMethod");
    assert_eq!(
        db.tdengine
            .as_ref()
            .and_then(|t| t.client_config.as_ref())
            .and_then(|c| c.db_name.as_deref()),
        Some("test_db")
    );
}

#[test]
fn the_documented_example_is_valid() {
    let docs = parse_documents(DOCUMENTED);
    assert_eq!(docs.len(), 2);
    for d in &docs {
        assert!(d.problems.is_empty(), "{}: {:?}", d.kind, d.problems);
    }
    let (Some(Object::DeviceModel(model)), Some(Object::Device(device))) =
        (&docs[0].object, &docs[1].object)
    else {
        panic!("a model and a device");
    };
    assert_eq!(api::validate::validate_model(model), vec![]);
    assert_eq!(api::validate::validate_device(device, Some(model)), vec![]);
}

#[test]
fn the_e2e_form_with_capitalised_string_keys_stays_free_form() {
    // KubeEdge's e2e test writes visitor keys capitalised and as strings; configData keeps them.
    let text = DOCUMENTED.replace(
        "        register: HoldingRegister\n        offset: 2\n        limit: 1\n        scale: 1\n        isSwap: true\n        isRegisterSwap: true",
        "        Register: CoilRegister\n        Offset: \"2\"\n        Limit: \"1\"\n        Scale: \"1\"\n        IsSwap: \"true\"\n        IsRegisterSwap: \"true\"",
    );
    let raw = documents(&text);
    let device: Device = serde_json::from_value(raw[1].clone()).expect("device parses");
    let data = device.spec.properties[0]
        .visitors
        .as_ref()
        .and_then(|v| v.config_data.as_ref())
        .expect("configData");
    assert_eq!(data.get("Offset"), Some(&json!("2")));
    assert_eq!(serde_json::to_value(&device).expect("serialises"), raw[1]);
}

#[test]
fn casing_variants_are_read_and_written_in_the_crd_spelling() {
    let v = json!({
        "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device", "metadata": {"name": "d"},
        "spec": {"properties": [{"name": "p", "pushMethod": {
            "http": {"hostname": "h", "requestpath": "/x"},
            "dbMethod": {"tdengine": {"tdEngineClientConfig": {"addr": "a", "dbname": "n"}}}
        }}]}
    });
    let device: Device = serde_json::from_value(v).expect("parses");
    let out = serde_json::to_value(&device).expect("serialises");
    let push = &out["spec"]["properties"][0]["pushMethod"];
    assert_eq!(push["http"], json!({"hostName": "h", "requestPath": "/x"}));
    assert_eq!(
        push["dbMethod"],
        json!({"TDEngine": {"TDEngineClientConfig": {"addr": "a", "dbName": "n"}}})
    );
}
