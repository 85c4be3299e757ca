//! `kectl validate` as a user runs it: the real binary on files.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn kectl(args: &[&Path]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kectl"))
        .arg("validate")
        .args(args)
        .output()
        .expect("kectl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_example_manifest_is_valid() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("examples"))
        .expect("examples/ exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 4,
        "examples for Modbus TCP, Modbus RTU, OPC UA and BLE"
    );
    let refs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let (code, stdout, stderr) = kectl(&refs);
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.is_empty(),
        "no problem and no warning expected:\n{stdout}"
    );
    for protocol in ["modbus", "opcua", "ble"] {
        let any = files.iter().any(|f| {
            std::fs::read_to_string(f).is_ok_and(|t| t.contains(&format!("protocol: {protocol}")))
        });
        assert!(any, "an example for {protocol}");
    }
}

const MODEL: &str = r#"
apiVersion: devices.kubeedge.io/v1beta1
kind: DeviceModel
metadata: {name: m}
spec:
  protocol: modbus
  properties:
  - {name: temp, type: INT, accessMode: ReadWrite, minimum: "0", maximum: "100"}
  - {name: ro, type: FLOAT, accessMode: ReadOnly}
  - {name: on, type: BOOLEAN, accessMode: ReadWrite}
---
"#;

fn device(spec: &str) -> String {
    format!(
        "{MODEL}apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {{name: d}}\nspec:\n{spec}"
    )
}

/// Invalid manifests and the `KIND NAME: PATH` each must be reported at.
fn invalid_cases() -> Vec<(&'static str, String, &'static str)> {
    let model_ref = "  deviceModelRef: {name: m}\n";
    vec![
        (
            "duplicate property",
            device(&format!(
                "{model_ref}  properties:\n  - {{name: temp}}\n  - {{name: temp}}\n"
            )),
            "Device d: spec.properties[1].name: duplicate",
        ),
        (
            "property not in model",
            device(&format!(
                "{model_ref}  properties:\n  - {{name: temp}}\n  - {{name: pressure}}\n"
            )),
            "Device d: spec.properties[1].name: property \"pressure\" is not defined",
        ),
        (
            "missing model ref",
            device("  properties:\n  - {name: temp}\n"),
            "Device d: spec.deviceModelRef: required",
        ),
        (
            "empty model ref",
            device("  deviceModelRef: {name: \"\"}\n"),
            "Device d: spec.deviceModelRef.name: must not be empty",
        ),
        (
            "negative collectCycle",
            device(&format!(
                "{model_ref}  properties:\n  - {{name: temp}}\n  - {{name: on}}\n  - {{name: ro, collectCycle: -1}}\n"
            )),
            "Device d: spec.properties[2].collectCycle: -1 is negative",
        ),
        (
            "negative reportCycle",
            device(&format!(
                "{model_ref}  properties:\n  - {{name: temp, reportCycle: -10}}\n"
            )),
            "Device d: spec.properties[0].reportCycle: -10 is negative",
        ),
        (
            "negative state report cycle",
            device(&format!("{model_ref}  stateReport: {{reportCycle: -5}}\n")),
            "Device d: spec.stateReport.reportCycle: -5 is negative",
        ),
        (
            "desired on ReadOnly",
            device(&format!(
                "{model_ref}  properties:\n  - {{name: ro, desired: {{value: \"1.5\"}}}}\n"
            )),
            "Device d: spec.properties[0].desired: property \"ro\" is ReadOnly",
        ),
        (
            "desired not an INT",
            device(&format!(
                "{model_ref}  properties:\n  - {{name: temp, desired: {{value: \"warm\"}}}}\n"
            )),
            "Device d: spec.properties[0].desired.value: \"warm\" is not an integer",
        ),
        (
            "desired not a BOOLEAN",
            device(&format!(
                "{model_ref}  properties:\n  - {{name: on, desired: {{value: \"yes\"}}}}\n"
            )),
            "Device d: spec.properties[0].desired.value: \"yes\" is not true or false",
        ),
        (
            "desired above maximum",
            device(&format!(
                "{model_ref}  properties:\n  - {{name: temp, desired: {{value: \"101\"}}}}\n"
            )),
            "Device d: spec.properties[0].desired.value: 101 is above",
        ),
        (
            "method names unknown property",
            device(&format!(
                "{model_ref}  properties:\n  - {{name: temp}}\n  methods:\n  - {{name: set, propertyNames: [temp, fan]}}\n"
            )),
            "Device d: spec.methods[0].propertyNames[1]: \"fan\" is not a property",
        ),
        (
            "device name not DNS-1123",
            device(model_ref).replace("metadata: {name: d}", "metadata: {name: Oven_1}"),
            "Device Oven_1: metadata.name: \"Oven_1\" is not a valid DNS-1123",
        ),
        (
            "bad namespace",
            device(model_ref).replace("metadata: {name: d}", "metadata: {name: d, namespace: a.b}"),
            "Device d: metadata.namespace:",
        ),
        (
            "protocol differs from model",
            device(&format!("{model_ref}  protocol: {{protocolName: opcua}}\n")),
            "Device d: spec.protocol.protocolName: \"opcua\" differs",
        ),
        (
            "unknown field",
            device(&format!(
                "{model_ref}  properties:\n  - {{name: temp, collectcycle: 5}}\n"
            )),
            "Device d: spec.properties[0].collectcycle: unknown field \"collectcycle\" (did you mean \"collectCycle\"?)",
        ),
        (
            "wrong type",
            device(&format!(
                "{model_ref}  properties:\n  - {{name: temp, reportToCloud: \"yes\"}}\n"
            )),
            "Device d: spec.properties[0].reportToCloud: expected a boolean",
        ),
        (
            "desired without value",
            device(&format!(
                "{model_ref}  properties:\n  - {{name: temp, desired: {{}}}}\n"
            )),
            "Device d: spec.properties[0].desired.value: required field is missing",
        ),
        (
            "qos out of int32",
            device(&format!(
                "{model_ref}  properties:\n  - {{name: temp, pushMethod: {{mqtt: {{qos: 9999999999}}}}}}\n"
            )),
            "Device d: spec.properties[0].pushMethod.mqtt.qos: 9999999999 does not fit in int32",
        ),
        (
            "model min not a number",
            MODEL.replace("minimum: \"0\"", "minimum: \"zero\""),
            "DeviceModel m: spec.properties[0].minimum: \"zero\" is not a number",
        ),
        (
            "model max below min",
            MODEL.replace("maximum: \"100\"", "maximum: \"-1\""),
            "DeviceModel m: spec.properties[0].maximum: maximum -1 is below minimum 0",
        ),
        (
            "model bad type enum",
            MODEL.replace("type: INT", "type: int"),
            "DeviceModel m: spec.properties[0].type: \"int\" is not one of",
        ),
        (
            "model duplicate property",
            MODEL.replace("name: ro", "name: temp"),
            "DeviceModel m: spec.properties[1].name: duplicate property name \"temp\"",
        ),
        (
            "model property name with space",
            MODEL.replace("name: ro", "name: \"r o\""),
            "DeviceModel m: spec.properties[1].name: \"r o\" contains ' '",
        ),
        (
            "unknown kind",
            "apiVersion: devices.kubeedge.io/v1beta1\nkind: Gadget\nmetadata: {name: g}\n".into(),
            "Gadget g: kind: unknown kind \"Gadget\"",
        ),
        (
            "other API group",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n".into(),
            "ConfigMap c: apiVersion: \"v1\" ConfigMap is not a device object",
        ),
        (
            "old version",
            "apiVersion: devices.kubeedge.io/v1alpha2\nkind: Device\nmetadata: {name: o}\n".into(),
            "Device o: apiVersion: \"devices.kubeedge.io/v1alpha2\" is not supported",
        ),
        (
            "missing kind",
            "apiVersion: devices.kubeedge.io/v1beta1\nmetadata: {name: x}\n".into(),
            "document x: kind: required field is missing",
        ),
        (
            "not an object",
            "- just\n- a list\n".into(),
            "document #1: a manifest document must be an object",
        ),
        (
            "broken YAML",
            "kind: [Device\n".into(),
            "document #1: not valid YAML",
        ),
        (
            "defined twice",
            format!(
                "{}\n---\n{}",
                device(model_ref),
                "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: d}\nspec: {deviceModelRef: {name: m}}\n"
            ),
            "Device d: metadata.name: Device default/d is defined twice",
        ),
    ]
}

#[test]
fn each_invalid_manifest_is_rejected_at_its_field_path() {
    let dir = std::env::temp_dir().join(format!("kectl-invalid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut failures = Vec::new();
    for (i, (what, text, expected)) in invalid_cases().into_iter().enumerate() {
        let file = dir.join(format!("case{i}.yaml"));
        std::fs::write(&file, &text).expect("write case");
        let (code, stdout, _) = kectl(&[&file]);
        let want = format!("{}: {expected}", file.display());
        if code != 1 || !stdout.lines().any(|l| l.starts_with(&want)) {
            failures.push(format!(
                "{what}: exit {code}, expected a line starting\n  {want}\ngot:\n{stdout}"
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_model_may_be_in_another_file() {
    let dir = std::env::temp_dir().join(format!("kectl-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let model = dir.join("model.yaml");
    let dev = dir.join("device.yaml");
    std::fs::write(&model, MODEL).expect("write");
    let device_only = "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: d}\nspec:\n  deviceModelRef: {name: m}\n  properties:\n  - {name: pressure}\n";
    std::fs::write(&dev, device_only).expect("write");
    // With the model: the unknown property is found.
    let (code, stdout, _) = kectl(&[&model, &dev]);
    assert_eq!(code, 1);
    assert!(
        stdout.contains("spec.properties[0].name: property \"pressure\" is not defined"),
        "{stdout}"
    );
    // Without it: a warning that the model checks were skipped, and the device passes.
    let (code, stdout, _) = kectl(&[&dev]);
    assert_eq!(code, 0, "{stdout}");
    assert!(
        stdout.contains("warning: model default/m is not among the given files"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unreadable_file_fails_the_run_and_is_named() {
    let missing = Path::new("/nonexistent/kectl-test.yaml");
    let (code, stdout, _) = kectl(&[missing]);
    assert_eq!(code, 1);
    assert!(
        stdout.starts_with("/nonexistent/kectl-test.yaml: cannot read"),
        "{stdout}"
    );
}
