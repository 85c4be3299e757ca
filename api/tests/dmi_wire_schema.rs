//! The DMI protobuf has KubeEdge's package, services and field numbers (kubeedge/kubeedge `staging/src/github.com/kubeedge/api/apis/dmi/v1beta1/api.proto`),
//! so that a KubeEdge mapper and our edgecore understand each other on the wire.

use prost::Message;
use prost_types::FileDescriptorSet;
use std::collections::BTreeMap;

/// `message: [(field, number)]`, as KubeEdge's DMI v1beta1 defines them.
const KUBEEDGE_FIELDS: &[(&str, &[(&str, i32)])] = &[
    ("MapperRegisterRequest", &[("withData", 1), ("mapper", 2)]),
    (
        "MapperRegisterResponse",
        &[("modelList", 1), ("deviceList", 2)],
    ),
    (
        "MapperInfo",
        &[
            ("name", 1),
            ("version", 2),
            ("api_version", 3),
            ("protocol", 4),
            ("address", 5),
            ("state", 6),
        ],
    ),
    ("DeviceModel", &[("name", 1), ("spec", 2), ("namespace", 3)]),
    ("DeviceModelSpec", &[("properties", 1), ("commands", 2)]),
    (
        "ModelProperty",
        &[
            ("name", 1),
            ("description", 2),
            ("type", 3),
            ("accessMode", 4),
            ("minimum", 5),
            ("maximum", 6),
            ("unit", 7),
        ],
    ),
    (
        "DeviceCommand",
        &[
            ("name", 1),
            ("url", 2),
            ("method", 3),
            ("status_code", 4),
            ("parameters", 5),
            ("response", 6),
        ],
    ),
    (
        "Device",
        &[("name", 1), ("spec", 2), ("status", 3), ("namespace", 4)],
    ),
    (
        "DeviceSpec",
        &[
            ("deviceModelReference", 1),
            ("protocol", 2),
            ("properties", 3),
            ("methods", 4),
        ],
    ),
    (
        "DeviceMethod",
        &[("name", 1), ("description", 2), ("propertyNames", 3)],
    ),
    (
        "DeviceProperty",
        &[
            ("name", 1),
            ("desired", 2),
            ("visitors", 3),
            ("reportCycle", 4),
            ("collectCycle", 5),
            ("reportToCloud", 6),
            ("pushMethod", 7),
        ],
    ),
    ("ProtocolConfig", &[("protocolName", 1), ("configData", 2)]),
    ("VisitorConfig", &[("protocolName", 1), ("configData", 2)]),
    ("CustomizedValue", &[("data", 1)]),
    (
        "PushMethod",
        &[
            ("http", 1),
            ("mqtt", 2),
            ("dbMethod", 3),
            ("otel", 4),
            ("anomalyDetection", 5),
        ],
    ),
    (
        "PushMethodHTTP",
        &[
            ("hostname", 1),
            ("port", 2),
            ("requestpath", 3),
            ("timeout", 4),
        ],
    ),
    (
        "PushMethodMQTT",
        &[("address", 1), ("topic", 2), ("qos", 3), ("retained", 4)],
    ),
    ("PushMethodOTEL", &[("endpointURL", 1)]),
    (
        "DBMethod",
        &[
            ("influxdb2", 1),
            ("redis", 2),
            ("tdengine", 3),
            ("mysql", 4),
        ],
    ),
    (
        "DBMethodInfluxdb2",
        &[("influxdb2ClientConfig", 1), ("influxdb2DataConfig", 2)],
    ),
    (
        "Influxdb2ClientConfig",
        &[("url", 1), ("org", 2), ("bucket", 3)],
    ),
    (
        "Influxdb2DataConfig",
        &[("measurement", 1), ("tag", 2), ("fieldKey", 3)],
    ),
    ("DBMethodRedis", &[("redisClientConfig", 1)]),
    (
        "RedisClientConfig",
        &[("addr", 1), ("db", 2), ("poolsize", 3), ("minIdleConns", 4)],
    ),
    ("DBMethodTDEngine", &[("tdEngineClientConfig", 1)]),
    ("TDEngineClientConfig", &[("addr", 1), ("dbname", 2)]),
    ("DBMethodMySQL", &[("mysqlClientConfig", 1)]),
    (
        "MySQLClientConfig",
        &[("addr", 1), ("database", 2), ("userName", 3)],
    ),
    ("AnomalyDetection", &[("data", 1)]),
    (
        "ReportDeviceStatusRequest",
        &[
            ("deviceName", 1),
            ("reportedDevice", 2),
            ("deviceNamespace", 3),
        ],
    ),
    (
        "ReportDeviceStatesRequest",
        &[("deviceName", 1), ("deviceNamespace", 2), ("state", 3)],
    ),
    (
        "DeviceStatus",
        &[("twins", 1), ("reportToCloud", 2), ("reportCycle", 3)],
    ),
    (
        "Twin",
        &[("propertyName", 1), ("observedDesired", 2), ("reported", 3)],
    ),
    ("TwinProperty", &[("value", 1), ("metadata", 2)]),
    ("RegisterDeviceRequest", &[("device", 1)]),
    ("UpdateDeviceRequest", &[("device", 1)]),
    ("GetDeviceResponse", &[("device", 1)]),
    (
        "RegisterDeviceResponse",
        &[("deviceName", 1), ("deviceNamespace", 2)],
    ),
    ("CreateDeviceModelRequest", &[("model", 1)]),
    ("UpdateDeviceModelRequest", &[("model", 1)]),
    (
        "CreateDeviceModelResponse",
        &[("deviceModelName", 1), ("deviceModelNamespace", 2)],
    ),
    (
        "RemoveDeviceRequest",
        &[("deviceName", 1), ("deviceNamespace", 2)],
    ),
    (
        "GetDeviceRequest",
        &[("deviceName", 1), ("deviceNamespace", 2)],
    ),
    (
        "RemoveDeviceModelRequest",
        &[("modelName", 1), ("modelNamespace", 2)],
    ),
    ("ReportDeviceStatusResponse", &[]),
    ("ReportDeviceStatesResponse", &[]),
    ("RemoveDeviceResponse", &[]),
    ("UpdateDeviceResponse", &[]),
    ("RemoveDeviceModelResponse", &[]),
    ("UpdateDeviceModelResponse", &[]),
];

fn descriptor() -> FileDescriptorSet {
    FileDescriptorSet::decode(api::dmi::FILE_DESCRIPTOR_SET).expect("descriptor decodes")
}

/// The file of package `v1beta1` in `fds`.
fn v1beta1(fds: &FileDescriptorSet) -> &prost_types::FileDescriptorProto {
    fds.file
        .iter()
        .find(|f| f.package() == "v1beta1")
        .expect("package v1beta1")
}

#[test]
fn every_message_has_kubeedges_fields_and_numbers() {
    let fds = descriptor();
    let file = v1beta1(&fds);
    let ours: BTreeMap<&str, Vec<(&str, i32)>> = file
        .message_type
        .iter()
        .map(|m| {
            (
                m.name(),
                m.field.iter().map(|f| (f.name(), f.number())).collect(),
            )
        })
        .collect();
    let mut problems = Vec::new();
    for (message, fields) in KUBEEDGE_FIELDS {
        match ours.get(message) {
            None => problems.push(format!("message {message} is missing")),
            Some(have) if have.as_slice() != *fields => {
                problems.push(format!("{message}: ours {have:?}, KubeEdge's {fields:?}"));
            }
            Some(_) => {}
        }
    }
    for message in ours.keys() {
        if !KUBEEDGE_FIELDS.iter().any(|(m, _)| m == message) {
            problems.push(format!("message {message} is not in KubeEdge's DMI"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn services_have_kubeedges_rpcs() {
    let fds = descriptor();
    let file = v1beta1(&fds);
    let rpcs = |service: &str| -> Vec<String> {
        file.service
            .iter()
            .find(|s| s.name() == service)
            .map(|s| {
                s.method
                    .iter()
                    .map(|m| format!("{}({})->{}", m.name(), m.input_type(), m.output_type()))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        rpcs("DeviceManagerService"),
        [
            "MapperRegister(.v1beta1.MapperRegisterRequest)->.v1beta1.MapperRegisterResponse",
            "ReportDeviceStatus(.v1beta1.ReportDeviceStatusRequest)->.v1beta1.ReportDeviceStatusResponse",
            "ReportDeviceStates(.v1beta1.ReportDeviceStatesRequest)->.v1beta1.ReportDeviceStatesResponse",
        ]
    );
    let mapper: Vec<String> = rpcs("DeviceMapperService")
        .into_iter()
        .map(|r| r.split('(').next().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        mapper,
        [
            "RegisterDevice",
            "RemoveDevice",
            "UpdateDevice",
            "CreateDeviceModel",
            "RemoveDeviceModel",
            "UpdateDeviceModel",
            "GetDevice"
        ]
    );
    // The generated servers answer on KubeEdge's gRPC paths (`/v1beta1.DeviceManagerService/...`).
    use api::dmi::v1beta1::{device_manager_service_server, device_mapper_service_server};
    assert_eq!(
        device_manager_service_server::SERVICE_NAME,
        "v1beta1.DeviceManagerService"
    );
    assert_eq!(
        device_mapper_service_server::SERVICE_NAME,
        "v1beta1.DeviceMapperService"
    );
}

#[test]
fn bytes_on_the_wire_use_kubeedges_tags() {
    use api::dmi::v1beta1::{MapperInfo, MapperRegisterRequest, ReportDeviceStatesRequest};
    let req = MapperRegisterRequest {
        with_data: true,
        mapper: Some(MapperInfo {
            protocol: "modbus".into(),
            ..Default::default()
        }),
    };
    // field 1 varint true; field 2 length-delimited { field 4 "modbus" }
    assert_eq!(
        req.encode_to_vec(),
        [
            0x08, 0x01, 0x12, 0x08, 0x22, 0x06, b'm', b'o', b'd', b'b', b'u', b's'
        ]
    );
    let states = ReportDeviceStatesRequest {
        device_name: "d".into(),
        device_namespace: "n".into(),
        state: "ok".into(),
    };
    assert_eq!(
        states.encode_to_vec(),
        [0x0a, 0x01, b'd', 0x12, 0x01, b'n', 0x1a, 0x02, b'o', b'k']
    );
}
