//! Conversions between the CRD types and the DMI messages.
//!
//! - `configData` maps become `map<string, Any>` of `google.protobuf` wrappers that KubeEdge's
//!   mapper-framework decodes (its `DecodeAnyValue` knows `StringValue`, `BoolValue`,
//!   `Int32Value`, `Int64Value` and `FloatValue`, and silently drops every other type):
//!   integers as `Int64Value` (exact, where KubeEdge's edgecore turns every number into a 32-bit
//!   float and so changes integers above 2^24), decimals as `FloatValue` when the 32-bit float
//!   reads back as the same decimal (`0.1`, `1.5e-3`), else as `DoubleValue` so that nothing is
//!   rounded (a KubeEdge mapper drops those keys; see `docs/kubeedge-differences.md`), integers
//!   above the signed 64-bit range as `StringValue` (the SDK reads numbers from strings).
//!   Nested objects, arrays and null go as `google.protobuf.Value`. Unpacking accepts every
//!   wrapper type; a `FloatValue` is read as the shortest decimal that gives the same 32-bit
//!   float, so `0.1f32` comes back as `0.1`, not `0.10000000149011612`.
//! - As KubeEdge's edgecore (whose `desired`, `visitors` and `protocol` are Go structs, not
//!   pointers), every property carries `desired` and `visitors` and every device `protocol`,
//!   empty when the manifest has none: mapper-framework dereferences them without a nil check.
//! - Absent optional scalars become proto3 defaults ("" and 0) and come back as absent.
//! - An object without a namespace is in `default`.
//! - The DMI `DeviceModel` has no protocol, visitors or `protocolConfigData`: merge them into the
//!   device first ([`crate::merge::effective_device`]), as edgecore does before sending.

use super::v1beta1 as pb;
use crate::v1beta1::{self as crd, namespace_of};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prost::Message;
use prost_types::Any;
use serde_json::{Map, Number, Value};
use std::collections::{BTreeMap, HashMap};

const TYPE_PREFIX: &str = "type.googleapis.com/google.protobuf.";

/// Errors of converting DMI messages to CRD types.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// A `configData` value packed as a type this side does not know.
    #[error("configData key {key:?}: unsupported Any type {type_url:?}")]
    UnsupportedAny { key: String, type_url: String },
    /// A `configData` value whose bytes do not decode as its declared type.
    #[error("configData key {key:?}: cannot decode {type_url:?}: {source}")]
    Decode {
        key: String,
        type_url: String,
        #[source]
        source: prost::DecodeError,
    },
    /// A string field with a value outside its enum.
    #[error("{field}: {value:?} is not one of {allowed}")]
    InvalidEnum {
        field: &'static str,
        value: String,
        allowed: &'static str,
    },
}

/// Result of conversions.
pub type Result<T, E = ConvertError> = std::result::Result<T, E>;

fn wrap<M: Message>(name: &str, msg: &M) -> Any {
    Any {
        type_url: format!("{TYPE_PREFIX}{name}"),
        value: msg.encode_to_vec(),
    }
}

fn json_to_proto_value(v: &Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.iter().map(json_to_proto_value).collect(),
        }),
        Value::Object(o) => Kind::StructValue(prost_types::Struct {
            fields: o
                .iter()
                .map(|(k, v)| (k.clone(), json_to_proto_value(v)))
                .collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

fn proto_value_to_json(v: &prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::NumberValue(n)) => float_to_json(*n),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::ListValue(l)) => {
            Value::Array(l.values.iter().map(proto_value_to_json).collect())
        }
        Some(Kind::StructValue(s)) => Value::Object(
            s.fields
                .iter()
                .map(|(k, v)| (k.clone(), proto_value_to_json(v)))
                .collect(),
        ),
    }
}

/// A float as JSON: whole numbers within i64 become integers (so `1502.0` reads back as `1502`).
fn float_to_json(f: f64) -> Value {
    if f.fract() == 0.0 && f.abs() < 9.0e15 {
        Value::Number(Number::from(f as i64))
    } else {
        Number::from_f64(f)
            .map(Value::Number)
            .unwrap_or(Value::Null)
    }
}

/// Packs one JSON value into an `Any`.
pub fn json_to_any(v: &Value) -> Any {
    match v {
        Value::String(s) => wrap("StringValue", s),
        Value::Bool(b) => wrap("BoolValue", b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => wrap("Int64Value", &i),
            (None, Some(u)) => wrap("StringValue", &u.to_string()),
            _ => {
                let f = n.as_f64().unwrap_or(0.0);
                match exact_f32(f) {
                    Some(single) => wrap("FloatValue", &single),
                    None => wrap("DoubleValue", &f),
                }
            }
        },
        other => wrap("Value", &json_to_proto_value(other)),
    }
}

/// `f` as a 32-bit float when that float's shortest decimal form is `f` again.
fn exact_f32(f: f64) -> Option<f32> {
    #[allow(clippy::cast_possible_truncation)]
    let single = f as f32;
    (single.is_finite() && single.to_string().parse::<f64>().ok() == Some(f)).then_some(single)
}

/// A 32-bit float as the shortest decimal that reads back as it.
fn f32_to_json(f: f32) -> Value {
    float_to_json(f.to_string().parse::<f64>().unwrap_or(f64::from(f)))
}

/// Unpacks an `Any` made by [`json_to_any`] or by KubeEdge's edgecore. `key` names it in errors.
pub fn any_to_json(key: &str, any: &Any) -> Result<Value> {
    let decode_err = |source| ConvertError::Decode {
        key: key.to_string(),
        type_url: any.type_url.clone(),
        source,
    };
    let bytes = any.value.as_slice();
    let name = any.type_url.rsplit('/').next().unwrap_or_default();
    Ok(match name {
        "google.protobuf.StringValue" => Value::String(String::decode(bytes).map_err(decode_err)?),
        "google.protobuf.BoolValue" => Value::Bool(bool::decode(bytes).map_err(decode_err)?),
        "google.protobuf.Int32Value" => Value::from(i32::decode(bytes).map_err(decode_err)?),
        "google.protobuf.Int64Value" => Value::from(i64::decode(bytes).map_err(decode_err)?),
        "google.protobuf.UInt32Value" => Value::from(u32::decode(bytes).map_err(decode_err)?),
        "google.protobuf.UInt64Value" => Value::from(u64::decode(bytes).map_err(decode_err)?),
        "google.protobuf.FloatValue" => f32_to_json(f32::decode(bytes).map_err(decode_err)?),
        "google.protobuf.DoubleValue" => float_to_json(f64::decode(bytes).map_err(decode_err)?),
        "google.protobuf.BytesValue" => {
            let raw = Vec::<u8>::decode(bytes).map_err(decode_err)?;
            Value::String(String::from_utf8_lossy(&raw).into_owned())
        }
        "google.protobuf.Value" => {
            proto_value_to_json(&prost_types::Value::decode(bytes).map_err(decode_err)?)
        }
        _ => {
            return Err(ConvertError::UnsupportedAny {
                key: key.to_string(),
                type_url: any.type_url.clone(),
            });
        }
    })
}

/// `configData` to its DMI form.
pub fn customized_to_dmi(v: &crd::CustomizedValue) -> pb::CustomizedValue {
    pb::CustomizedValue {
        data: v
            .0
            .iter()
            .map(|(k, v)| (k.clone(), json_to_any(v)))
            .collect(),
    }
}

fn any_map_to_json(data: &HashMap<String, Any>) -> Result<Map<String, Value>> {
    // Sorted, so that the result does not depend on the hash order.
    let sorted: BTreeMap<_, _> = data.iter().collect();
    sorted
        .into_iter()
        .map(|(k, a)| Ok((k.clone(), any_to_json(k, a)?)))
        .collect()
}

/// `configData` from its DMI form.
pub fn customized_from_dmi(v: &pb::CustomizedValue) -> Result<crd::CustomizedValue> {
    any_map_to_json(&v.data).map(crd::CustomizedValue)
}

fn opt(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

fn opt_num<T: Default + PartialEq>(n: T) -> Option<T> {
    (n != T::default()).then_some(n)
}

fn protocol_to_dmi(p: &crd::ProtocolConfig) -> pb::ProtocolConfig {
    pb::ProtocolConfig {
        protocol_name: p.protocol_name.clone().unwrap_or_default(),
        config_data: p.config_data.as_ref().map(customized_to_dmi),
    }
}

fn visitor_to_dmi(p: &crd::VisitorConfig) -> pb::VisitorConfig {
    let p = protocol_to_dmi(p);
    pb::VisitorConfig {
        protocol_name: p.protocol_name,
        config_data: p.config_data,
    }
}

fn protocol_from_dmi(
    name: &str,
    data: Option<&pb::CustomizedValue>,
) -> Result<crd::ProtocolConfig> {
    Ok(crd::ProtocolConfig {
        protocol_name: opt(name),
        config_data: data.map(customized_from_dmi).transpose()?,
    })
}

fn twin_property_to_dmi(t: &crd::TwinProperty) -> pb::TwinProperty {
    pb::TwinProperty {
        value: t.value.clone(),
        metadata: t
            .metadata
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}

fn twin_property_from_dmi(t: &pb::TwinProperty) -> crd::TwinProperty {
    crd::TwinProperty {
        value: t.value.clone(),
        metadata: (!t.metadata.is_empty()).then(|| {
            t.metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        }),
    }
}

fn push_method_to_dmi(p: &crd::PushMethod) -> pb::PushMethod {
    pb::PushMethod {
        http: p.http.as_ref().map(|h| pb::PushMethodHttp {
            hostname: h.host_name.clone().unwrap_or_default(),
            port: h.port.unwrap_or_default(),
            requestpath: h.request_path.clone().unwrap_or_default(),
            timeout: h.timeout.unwrap_or_default(),
        }),
        mqtt: p.mqtt.as_ref().map(|m| pb::PushMethodMqtt {
            address: m.address.clone().unwrap_or_default(),
            topic: m.topic.clone().unwrap_or_default(),
            qos: m.qos.unwrap_or_default(),
            retained: m.retained.unwrap_or_default(),
        }),
        otel: p.otel.as_ref().map(|o| pb::PushMethodOtel {
            endpoint_url: o.endpoint_url.clone().unwrap_or_default(),
        }),
        db_method: p.db_method.as_ref().map(|db| pb::DbMethod {
            influxdb2: db.influxdb2.as_ref().map(|i| pb::DbMethodInfluxdb2 {
                influxdb2_client_config: i.influxdb2_client_config.as_ref().map(|c| {
                    pb::Influxdb2ClientConfig {
                        url: c.url.clone().unwrap_or_default(),
                        org: c.org.clone().unwrap_or_default(),
                        bucket: c.bucket.clone().unwrap_or_default(),
                    }
                }),
                influxdb2_data_config: i.influxdb2_data_config.as_ref().map(|d| {
                    pb::Influxdb2DataConfig {
                        measurement: d.measurement.clone().unwrap_or_default(),
                        tag: d
                            .tag
                            .iter()
                            .flatten()
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect(),
                        field_key: d.field_key.clone().unwrap_or_default(),
                    }
                }),
            }),
            redis: db.redis.as_ref().map(|r| pb::DbMethodRedis {
                redis_client_config: r.redis_client_config.as_ref().map(|c| {
                    pb::RedisClientConfig {
                        addr: c.addr.clone().unwrap_or_default(),
                        db: c.db.unwrap_or_default(),
                        poolsize: c.poolsize.unwrap_or_default(),
                        min_idle_conns: c.min_idle_conns.unwrap_or_default(),
                    }
                }),
            }),
            tdengine: db.tdengine.as_ref().map(|t| pb::DbMethodTdEngine {
                td_engine_client_config: t.client_config.as_ref().map(|c| {
                    pb::TdEngineClientConfig {
                        addr: c.addr.clone().unwrap_or_default(),
                        dbname: c.db_name.clone().unwrap_or_default(),
                    }
                }),
            }),
            mysql: db.mysql.as_ref().map(|m| pb::DbMethodMySql {
                mysql_client_config: m.mysql_client_config.as_ref().map(|c| {
                    pb::MySqlClientConfig {
                        addr: c.addr.clone().unwrap_or_default(),
                        database: c.database.clone().unwrap_or_default(),
                        user_name: c.user_name.clone().unwrap_or_default(),
                    }
                }),
            }),
        }),
        anomaly_detection: p.anomaly_detection.as_ref().map(|a| pb::AnomalyDetection {
            data: customized_to_dmi(a).data,
        }),
    }
}

fn push_method_from_dmi(p: &pb::PushMethod) -> Result<crd::PushMethod> {
    Ok(crd::PushMethod {
        http: p.http.as_ref().map(|h| crd::PushMethodHttp {
            host_name: opt(&h.hostname),
            port: opt_num(h.port),
            request_path: opt(&h.requestpath),
            timeout: opt_num(h.timeout),
        }),
        mqtt: p.mqtt.as_ref().map(|m| crd::PushMethodMqtt {
            address: opt(&m.address),
            topic: opt(&m.topic),
            qos: opt_num(m.qos),
            retained: opt_num(m.retained),
        }),
        otel: p.otel.as_ref().map(|o| crd::PushMethodOtel {
            endpoint_url: opt(&o.endpoint_url),
        }),
        db_method: p.db_method.as_ref().map(|db| crd::DbMethod {
            influxdb2: db.influxdb2.as_ref().map(|i| crd::DbMethodInfluxdb2 {
                influxdb2_client_config: i.influxdb2_client_config.as_ref().map(|c| {
                    crd::Influxdb2ClientConfig {
                        url: opt(&c.url),
                        org: opt(&c.org),
                        bucket: opt(&c.bucket),
                    }
                }),
                influxdb2_data_config: i.influxdb2_data_config.as_ref().map(|d| {
                    crd::Influxdb2DataConfig {
                        measurement: opt(&d.measurement),
                        tag: (!d.tag.is_empty())
                            .then(|| d.tag.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
                        field_key: opt(&d.field_key),
                    }
                }),
            }),
            redis: db.redis.as_ref().map(|r| crd::DbMethodRedis {
                redis_client_config: r.redis_client_config.as_ref().map(|c| {
                    crd::RedisClientConfig {
                        addr: opt(&c.addr),
                        db: opt_num(c.db),
                        poolsize: opt_num(c.poolsize),
                        min_idle_conns: opt_num(c.min_idle_conns),
                    }
                }),
            }),
            tdengine: db.tdengine.as_ref().map(|t| crd::DbMethodTdengine {
                client_config: t.td_engine_client_config.as_ref().map(|c| {
                    crd::TdengineClientConfig {
                        addr: opt(&c.addr),
                        db_name: opt(&c.dbname),
                    }
                }),
            }),
            mysql: db.mysql.as_ref().map(|m| crd::DbMethodMysql {
                mysql_client_config: m.mysql_client_config.as_ref().map(|c| {
                    crd::MysqlClientConfig {
                        addr: opt(&c.addr),
                        database: opt(&c.database),
                        user_name: opt(&c.user_name),
                    }
                }),
            }),
        }),
        anomaly_detection: p
            .anomaly_detection
            .as_ref()
            .map(|a| any_map_to_json(&a.data).map(crd::CustomizedValue))
            .transpose()?,
    })
}

fn meta(name: &str, namespace: &str) -> ObjectMeta {
    ObjectMeta {
        name: opt(name),
        namespace: opt(namespace),
        ..ObjectMeta::default()
    }
}

/// A device (best already merged with its model) and its reported twins, as DMI sends them.
pub fn device_to_dmi(device: &crd::Device, twins: Option<&crd::DeviceTwinStatus>) -> pb::Device {
    let spec = &device.spec;
    let state = device.state_report();
    pb::Device {
        name: device.metadata.name.clone().unwrap_or_default(),
        namespace: namespace_of(&device.metadata),
        spec: Some(pb::DeviceSpec {
            device_model_reference: device.model_name().unwrap_or_default().to_string(),
            protocol: Some(
                spec.protocol
                    .as_ref()
                    .map(protocol_to_dmi)
                    .unwrap_or_default(),
            ),
            properties: spec
                .properties
                .iter()
                .map(|p| pb::DeviceProperty {
                    name: p.name.clone(),
                    desired: Some(
                        p.desired
                            .as_ref()
                            .map(twin_property_to_dmi)
                            .unwrap_or_default(),
                    ),
                    visitors: Some(p.visitors.as_ref().map(visitor_to_dmi).unwrap_or_default()),
                    report_cycle: p.report_cycle.unwrap_or_default(),
                    collect_cycle: p.collect_cycle.unwrap_or_default(),
                    report_to_cloud: p.report_to_cloud.unwrap_or_default(),
                    push_method: p.push_method.as_deref().map(push_method_to_dmi),
                })
                .collect(),
            methods: spec
                .methods
                .iter()
                .map(|m| pb::DeviceMethod {
                    name: m.name.clone(),
                    description: m.description.clone().unwrap_or_default(),
                    property_names: m.property_names.clone(),
                })
                .collect(),
        }),
        status: Some(pb::DeviceStatus {
            twins: twins
                .map(|t| t.twins.iter().map(twin_to_dmi).collect())
                .unwrap_or_default(),
            report_to_cloud: state.report_to_cloud,
            report_cycle: state.report_cycle.unwrap_or_default(),
        }),
    }
}

/// A twin as DMI sends it.
pub fn twin_to_dmi(t: &crd::Twin) -> pb::Twin {
    pb::Twin {
        property_name: t.property_name.clone(),
        observed_desired: t.observed_desired.as_ref().map(twin_property_to_dmi),
        reported: t.reported.as_ref().map(twin_property_to_dmi),
    }
}

/// A twin from its DMI form.
pub fn twin_from_dmi(t: &pb::Twin) -> crd::Twin {
    crd::Twin {
        property_name: t.property_name.clone(),
        observed_desired: t.observed_desired.as_ref().map(twin_property_from_dmi),
        reported: t.reported.as_ref().map(twin_property_from_dmi),
    }
}

/// A DMI device as a CRD `Device` (the status' report settings become `spec.stateReport`) and
/// its twins.
pub fn device_from_dmi(d: &pb::Device) -> Result<(crd::Device, Vec<crd::Twin>)> {
    let spec = d.spec.clone().unwrap_or_default();
    let status = d.status.clone().unwrap_or_default();
    let properties = spec
        .properties
        .iter()
        .map(|p| {
            Ok(crd::DeviceProperty {
                name: p.name.clone(),
                desired: p
                    .desired
                    .as_ref()
                    .filter(|d| !d.value.is_empty() || !d.metadata.is_empty())
                    .map(twin_property_from_dmi),
                visitors: p
                    .visitors
                    .as_ref()
                    .filter(|v| !v.protocol_name.is_empty() || v.config_data.is_some())
                    .map(|v| protocol_from_dmi(&v.protocol_name, v.config_data.as_ref()))
                    .transpose()?,
                report_to_cloud: opt_num(p.report_to_cloud),
                collect_cycle: opt_num(p.collect_cycle),
                report_cycle: opt_num(p.report_cycle),
                push_method: p
                    .push_method
                    .as_ref()
                    .map(|m| push_method_from_dmi(m).map(Box::new))
                    .transpose()?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let device_spec = crd::DeviceSpec {
        device_model_ref: opt(&spec.device_model_reference)
            .map(|name| crd::DeviceModelRef { name }),
        node_name: None,
        properties,
        protocol: spec
            .protocol
            .as_ref()
            .filter(|p| !p.protocol_name.is_empty() || p.config_data.is_some())
            .map(|p| protocol_from_dmi(&p.protocol_name, p.config_data.as_ref()))
            .transpose()?,
        methods: spec
            .methods
            .iter()
            .map(|m| crd::DeviceMethod {
                name: m.name.clone(),
                description: opt(&m.description),
                property_names: m.property_names.clone(),
            })
            .collect(),
        state_report: (status.report_to_cloud || status.report_cycle != 0).then(|| {
            crd::StateReportConfig {
                report_to_cloud: opt_num(status.report_to_cloud),
                report_cycle: opt_num(status.report_cycle),
            }
        }),
    };
    let mut device = crd::Device::new(&d.name, device_spec);
    device.metadata = meta(&d.name, &d.namespace);
    Ok((device, status.twins.iter().map(twin_from_dmi).collect()))
}

/// A model as DMI sends it: properties only (see the module notes).
pub fn model_to_dmi(m: &crd::DeviceModel) -> pb::DeviceModel {
    pb::DeviceModel {
        name: m.metadata.name.clone().unwrap_or_default(),
        namespace: namespace_of(&m.metadata),
        spec: Some(pb::DeviceModelSpec {
            properties: m
                .spec
                .properties
                .iter()
                .map(|p| pb::ModelProperty {
                    name: p.name.clone(),
                    description: p.description.clone().unwrap_or_default(),
                    r#type: p.type_.map(|t| t.as_str().to_string()).unwrap_or_default(),
                    access_mode: p
                        .access_mode
                        .map(|a| a.as_str().to_string())
                        .unwrap_or_default(),
                    minimum: p.minimum.clone().unwrap_or_default(),
                    maximum: p.maximum.clone().unwrap_or_default(),
                    unit: p.unit.clone().unwrap_or_default(),
                })
                .collect(),
            commands: Vec::new(),
        }),
    }
}

fn parse_type(s: &str) -> Result<Option<crd::PropertyType>> {
    use crd::PropertyType as T;
    if s.is_empty() {
        return Ok(None);
    }
    let t = match s.to_ascii_uppercase().as_str() {
        "INT" => T::Int,
        "FLOAT" => T::Float,
        "DOUBLE" => T::Double,
        "STRING" => T::String,
        "BOOLEAN" => T::Boolean,
        "BYTES" => T::Bytes,
        "STREAM" => T::Stream,
        _ => {
            return Err(ConvertError::InvalidEnum {
                field: "type",
                value: s.into(),
                allowed: "INT, FLOAT, DOUBLE, STRING, BOOLEAN, BYTES, STREAM",
            });
        }
    };
    Ok(Some(t))
}

fn parse_access_mode(s: &str) -> Result<Option<crd::AccessMode>> {
    match s.to_ascii_lowercase().as_str() {
        "" => Ok(None),
        "readwrite" => Ok(Some(crd::AccessMode::ReadWrite)),
        "readonly" => Ok(Some(crd::AccessMode::ReadOnly)),
        _ => Err(ConvertError::InvalidEnum {
            field: "accessMode",
            value: s.into(),
            allowed: "ReadWrite, ReadOnly",
        }),
    }
}

/// A DMI model as a CRD `DeviceModel` (without protocol defaults, which DMI does not carry).
pub fn model_from_dmi(m: &pb::DeviceModel) -> Result<crd::DeviceModel> {
    let spec = m.spec.clone().unwrap_or_default();
    let properties = spec
        .properties
        .iter()
        .map(|p| {
            Ok(crd::ModelProperty {
                name: p.name.clone(),
                description: opt(&p.description),
                type_: parse_type(&p.r#type)?,
                access_mode: parse_access_mode(&p.access_mode)?,
                minimum: opt(&p.minimum),
                maximum: opt(&p.maximum),
                unit: opt(&p.unit),
                visitors: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut model = crd::DeviceModel::new(
        &m.name,
        crd::DeviceModelSpec {
            properties,
            protocol: None,
            protocol_config_data: None,
        },
    );
    model.metadata = meta(&m.name, &m.namespace);
    Ok(model)
}

#[cfg(test)]
mod tests;
