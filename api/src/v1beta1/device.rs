//! `Device`: one physical device, bound to a node and a model.

use super::{CustomizedValue, ProtocolConfig, TwinProperty, VisitorConfig, plain_integer};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `spec` of a `Device`.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "devices.kubeedge.io",
    version = "v1beta1",
    kind = "Device",
    plural = "devices",
    singular = "device",
    namespaced,
    status = "DeviceStatusOld",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.nodeName"}"#,
    printcolumn = r#"{"name":"Model","type":"string","jsonPath":".spec.deviceModelRef.name"}"#,
    printcolumn = r#"{"name":"Protocol","type":"string","jsonPath":".spec.protocol.protocolName"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_model_ref: Option<DeviceModelRef>,
    /// The edge node the device is bound to; nothing reaches any edge while it is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub properties: Vec<DeviceProperty>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<ProtocolConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<DeviceMethod>,
    /// How the device state is reported (KubeEdge v1.23); takes precedence over `status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_report: Option<StateReportConfig>,
}

/// A reference to a `DeviceModel` in the device's namespace (`LocalObjectReference`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct DeviceModelRef {
    #[serde(default)]
    #[schemars(extend("default" = ""))]
    pub name: String,
}

/// One property of a device instance.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = super::no_property_defaults)]
pub struct DeviceProperty {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<TwinProperty>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visitors: Option<VisitorConfig>,
    /// Whether values of this property are reported to edgecore and the cloud.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_to_cloud: Option<bool>,
    /// How often the property is read, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collect_cycle: Option<i64>,
    /// How often the value is pushed to `pushMethod`, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_cycle: Option<i64>,
    // Boxed: it is most of a property's size inline (520 of 696 bytes) and most properties
    // have none; a start that reads 1,000 devices held 5 MB of it. (Not a doc comment: that
    // would become the CRD's description of the field.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push_method: Option<Box<PushMethod>>,
}

/// Where a mapper pushes the values of a property, besides the twin.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PushMethod {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<PushMethodHttp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mqtt: Option<PushMethodMqtt>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otel: Option<PushMethodOtel>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_method: Option<DbMethod>,
    /// Settings of the anomaly-detection service (KubeEdge v1.23), free-form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anomaly_detection: Option<CustomizedValue>,
}

/// HTTP push target. KubeEdge's edge code reads `hostname`/`requestpath` through Go's case-blind
/// JSON decoding, so both spellings are accepted here; the CRD spelling is written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PushMethodHttp {
    #[serde(default, alias = "hostname", skip_serializing_if = "Option::is_none")]
    pub host_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
    #[serde(
        default,
        alias = "requestpath",
        skip_serializing_if = "Option::is_none"
    )]
    pub request_path: Option<String>,
    /// Timeout in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// MQTT push target.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PushMethodMqtt {
    /// Broker address, e.g. `mqtt://127.0.0.1:1883`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retained: Option<bool>,
}

/// OpenTelemetry metrics push target.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PushMethodOtel {
    /// e.g. `https://localhost:4318/v1/metrics`.
    #[serde(
        rename = "endpointURL",
        alias = "endpointUrl",
        alias = "endpointurl",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub endpoint_url: Option<String>,
}

/// Database sinks. The CRD spells the TDengine key `TDEngine`; the DMI protobuf `tdengine`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DbMethod {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub influxdb2: Option<DbMethodInfluxdb2>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<DbMethodRedis>,
    #[serde(
        rename = "TDEngine",
        alias = "tdengine",
        alias = "tdEngine",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub tdengine: Option<DbMethodTdengine>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mysql: Option<DbMethodMysql>,
}

/// InfluxDB 2 sink.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DbMethodInfluxdb2 {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub influxdb2_client_config: Option<Influxdb2ClientConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub influxdb2_data_config: Option<Influxdb2DataConfig>,
}

/// Where the InfluxDB 2 server is. The token comes from the mapper's `TOKEN` environment variable.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Influxdb2ClientConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub org: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
}

/// How a value becomes an InfluxDB point.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Influxdb2DataConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measurement: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_key: Option<String>,
}

/// Redis sink.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DbMethodRedis {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_client_config: Option<RedisClientConfig>,
}

/// Where the Redis server is. The password comes from the mapper's `PASSWORD` variable.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedisClientConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "plain_integer")]
    pub db: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "plain_integer")]
    pub poolsize: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "plain_integer")]
    pub min_idle_conns: Option<i32>,
}

/// TDengine sink.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DbMethodTdengine {
    #[serde(
        rename = "TDEngineClientConfig",
        alias = "tdEngineClientConfig",
        alias = "tdengineClientConfig",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub client_config: Option<TdengineClientConfig>,
}

/// Where the TDengine server is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TdengineClientConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    #[serde(
        rename = "dbName",
        alias = "dbname",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub db_name: Option<String>,
}

/// MySQL sink.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DbMethodMysql {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mysql_client_config: Option<MysqlClientConfig>,
}

/// Where the MySQL server is. The password comes from the mapper's `PASSWORD` variable.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MysqlClientConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_name: Option<String>,
}

/// A method of the device: a named group of writable properties (KubeEdge v1.19).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = super::no_property_defaults)]
pub struct DeviceMethod {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub property_names: Vec<String>,
}

/// How the device state (online, offline, ...) is reported (KubeEdge v1.23).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateReportConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_to_cloud: Option<bool>,
    /// Milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_cycle: Option<i64>,
}

/// `Device.status` since KubeEdge v1.23 (`DeviceStatusOld`): only the state-report settings, kept
/// for the transition; twins live in the `DeviceStatus` object. Fields of the v1.15-v1.22 status
/// (`twins`, `state`, `lastOnlineTime`) are kept as they are in `other`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct DeviceStatusOld {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_to_cloud: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_cycle: Option<i64>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// Where a device's state reporting settings come from, with v1.23's precedence applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateReport {
    pub report_to_cloud: bool,
    /// Milliseconds; `None` means the mapper's default.
    pub report_cycle: Option<i64>,
}

impl Device {
    /// The name of the model the device refers to, if one is given.
    pub fn model_name(&self) -> Option<&str> {
        self.spec
            .device_model_ref
            .as_ref()
            .map(|r| r.name.as_str())
            .filter(|n| !n.is_empty())
    }

    /// The device property named `name`.
    pub fn property(&self, name: &str) -> Option<&DeviceProperty> {
        self.spec.properties.iter().find(|p| p.name == name)
    }

    /// State-report settings: `spec.stateReport` when present, else the deprecated `status` fields.
    pub fn state_report(&self) -> StateReport {
        if let Some(sr) = &self.spec.state_report {
            return StateReport {
                report_to_cloud: sr.report_to_cloud.unwrap_or(false),
                report_cycle: sr.report_cycle,
            };
        }
        match &self.status {
            Some(s) => StateReport {
                report_to_cloud: s.report_to_cloud.unwrap_or(false),
                report_cycle: s.report_cycle,
            },
            None => StateReport::default(),
        }
    }

    /// The protocol name of the device (`spec.protocol.protocolName`), if set.
    pub fn protocol_name(&self) -> Option<&str> {
        self.spec
            .protocol
            .as_ref()
            .and_then(|p| p.protocol_name.as_deref())
            .filter(|n| !n.is_empty())
    }
}
