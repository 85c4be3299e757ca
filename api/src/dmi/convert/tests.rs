use super::*;
use serde_json::json;

fn full_device() -> crd::Device {
    serde_json::from_value(json!({
            "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
            "metadata": {"name": "d1", "namespace": "plant"},
            "spec": {
                "deviceModelRef": {"name": "m1"},
                "protocol": {"protocolName": "modbus", "configData": {
                    "ip": "10.0.0.5", "port": 502, "ratio": 0.5, "rtu": false,
                    "nested": {"a": [1, "x", null]}, "big": 9223372036854775807_i64}},
                "properties": [{
                    "name": "temp",
                    "desired": {"value": "30", "metadata": {"type": "int"}},
                    "visitors": {"protocolName": "modbus", "configData": {"register": "HoldingRegister", "offset": 2}},
                    "reportToCloud": true, "collectCycle": 2000, "reportCycle": 4000,
                    "pushMethod": {
                        "http": {"hostName": "h", "port": 80, "requestPath": "/p", "timeout": 5},
                        "mqtt": {"address": "tcp://127.0.0.1:1883", "topic": "t", "qos": 1, "retained": true},
                        "otel": {"endpointURL": "https://localhost:4318/v1/metrics"},
                        "dbMethod": {
                            "influxdb2": {"influxdb2ClientConfig": {"url": "u", "org": "o", "bucket": "b"},
                                          "influxdb2DataConfig": {"measurement": "m", "tag": {"k": "v"}, "fieldKey": "f"}},
                            "redis": {"redisClientConfig": {"addr": "a", "db": 2, "poolsize": 3, "minIdleConns": 4}},
                            "TDEngine": {"TDEngineClientConfig": {"addr": "a", "dbName": "n"}},
                            "mysql": {"mysqlClientConfig": {"addr": "a", "database": "d", "userName": "u"}}
                        },
                        "anomalyDetection": {"threshold": 3}
                    }
                }],
                "methods": [{"name": "set", "description": "sets", "propertyNames": ["temp"]}],
                "stateReport": {"reportToCloud": true, "reportCycle": 10000}
            }
        }))
        .expect("test device parses")
}

#[test]
fn a_device_survives_the_round_trip_through_dmi() {
    let device = full_device();
    let twins = crd::DeviceTwinStatus {
        twins: vec![crd::Twin {
            property_name: "temp".into(),
            reported: Some(crd::TwinProperty {
                value: "29".into(),
                metadata: None,
            }),
            observed_desired: Some(crd::TwinProperty {
                value: "30".into(),
                metadata: None,
            }),
        }],
        ..Default::default()
    };
    let wire = device_to_dmi(&device, Some(&twins)).encode_to_vec();
    let decoded = pb::Device::decode(wire.as_slice()).expect("decodes");
    let (back, back_twins) = device_from_dmi(&decoded).expect("converts back");
    assert_eq!(back.spec, device.spec);
    assert_eq!(back.metadata.name, device.metadata.name);
    assert_eq!(back.metadata.namespace, device.metadata.namespace);
    assert_eq!(back_twins, twins.twins);
}

#[test]
fn scalars_are_packed_as_protobuf_wrappers() {
    let cases = [
        (
            json!("s"),
            "type.googleapis.com/google.protobuf.StringValue",
        ),
        (json!(true), "type.googleapis.com/google.protobuf.BoolValue"),
        (json!(502), "type.googleapis.com/google.protobuf.Int64Value"),
        (
            json!(16_777_217),
            "type.googleapis.com/google.protobuf.Int64Value",
        ),
        (json!(0.5), "type.googleapis.com/google.protobuf.FloatValue"),
        (json!(0.1), "type.googleapis.com/google.protobuf.FloatValue"),
        (
            json!(-1.5e-3),
            "type.googleapis.com/google.protobuf.FloatValue",
        ),
        (
            json!(2.718_281_828_459_1),
            "type.googleapis.com/google.protobuf.DoubleValue",
        ),
        (json!({"a": 1}), "type.googleapis.com/google.protobuf.Value"),
    ];
    for (value, url) in cases {
        let any = json_to_any(&value);
        assert_eq!(any.type_url, url);
        assert_eq!(any_to_json("k", &any).expect("unpacks"), value);
    }
}

#[test]
fn integers_above_the_signed_range_go_as_text() {
    let any = json_to_any(&json!(18_446_744_073_709_551_615_u64));
    assert_eq!(any.type_url, format!("{TYPE_PREFIX}StringValue"));
    assert_eq!(
        any_to_json("k", &any).expect("unpacks"),
        json!("18446744073709551615")
    );
}

#[test]
fn a_property_without_desired_or_visitors_still_carries_both() {
    // mapper-framework reads property.Desired.Value and property.Visitors.ConfigData with no
    // nil check; KubeEdge's edgecore always sends them.
    let device: crd::Device = serde_json::from_value(json!({
        "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
        "metadata": {"name": "d2"},
        "spec": {"deviceModelRef": {"name": "m1"},
                 "properties": [{"name": "temp"}]}
    }))
    .expect("test device parses");
    let wire = device_to_dmi(&device, None);
    let spec = wire.spec.as_ref().expect("spec");
    assert!(spec.protocol.is_some(), "protocol is always set");
    let prop = &spec.properties[0];
    assert_eq!(prop.desired.as_ref().map(|d| d.value.as_str()), Some(""));
    assert!(prop.visitors.is_some(), "visitors is always set");
    let (back, _) = device_from_dmi(&wire).expect("converts back");
    assert_eq!(back.spec, device.spec, "empty ones read back as absent");
}

#[test]
fn unpacks_the_wrappers_a_go_edgecore_sends() {
    // KubeEdge decodes YAML numbers as float64 and sends DoubleValue: 1502.0 must read as 1502.
    let d = Any {
        type_url: format!("{TYPE_PREFIX}DoubleValue"),
        value: 1502.0_f64.encode_to_vec(),
    };
    assert_eq!(any_to_json("port", &d).expect("unpacks"), json!(1502));
    let i = Any {
        type_url: format!("{TYPE_PREFIX}Int32Value"),
        value: 7_i32.encode_to_vec(),
    };
    assert_eq!(any_to_json("slaveID", &i).expect("unpacks"), json!(7));
    let f = Any {
        type_url: format!("{TYPE_PREFIX}FloatValue"),
        value: 0.25_f32.encode_to_vec(),
    };
    assert_eq!(any_to_json("scale", &f).expect("unpacks"), json!(0.25));
    // KubeEdge packs every number as a 32-bit float: 0.1 must read as 0.1.
    let tenth = Any {
        type_url: format!("{TYPE_PREFIX}FloatValue"),
        value: 0.1_f32.encode_to_vec(),
    };
    assert_eq!(any_to_json("scale", &tenth).expect("unpacks"), json!(0.1));
}

#[test]
fn unknown_or_corrupt_any_is_an_error_naming_the_key() {
    let unknown = Any {
        type_url: "type.googleapis.com/acme.Thing".into(),
        value: vec![],
    };
    let e = any_to_json("register", &unknown).expect_err("unknown type");
    assert!(e.to_string().contains("\"register\""), "{e}");
    let corrupt = Any {
        type_url: format!("{TYPE_PREFIX}StringValue"),
        value: vec![0x0a, 0x05, b'a'],
    };
    let e = any_to_json("ip", &corrupt).expect_err("truncated bytes");
    assert!(matches!(e, ConvertError::Decode { .. }), "{e}");
}

#[test]
fn a_model_survives_the_round_trip_through_dmi() {
    let model: crd::DeviceModel = serde_json::from_value(json!({
        "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
        "metadata": {"name": "m1", "namespace": "plant"},
        "spec": {"properties": [{"name": "temp", "description": "t", "type": "INT",
            "accessMode": "ReadWrite", "minimum": "1", "maximum": "100", "unit": "C"}]}
    }))
    .expect("model parses");
    let back = model_from_dmi(&model_to_dmi(&model)).expect("converts back");
    assert_eq!(back.spec, model.spec);
    let mut bad = model_to_dmi(&model);
    if let Some(spec) = bad.spec.as_mut() {
        spec.properties[0].r#type = "QUATERNION".into();
    }
    assert!(matches!(
        model_from_dmi(&bad),
        Err(ConvertError::InvalidEnum { field: "type", .. })
    ));
}
