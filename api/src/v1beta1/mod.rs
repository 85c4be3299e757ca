//! `devices.kubeedge.io/v1beta1`: `Device`, `DeviceModel` and `DeviceStatus`, with the JSON names of
//! KubeEdge's CRDs (kubeedge/kubeedge `build/crds/devices/devices_v1beta1_*.yaml`).
//!
//! Scalars are `Option`s so that a manifest parsed and written again keeps exactly the fields it had;
//! lists default to empty. Free-form protocol data (`configData`, `protocolConfigData`,
//! `anomalyDetection`) stays free-form JSON ([`CustomizedValue`]).

mod device;
mod model;
mod status;

pub use device::*;
pub use model::*;
pub use status::*;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// The API group of every device type.
pub const GROUP: &str = "devices.kubeedge.io";
/// The served and stored version this crate speaks.
pub const VERSION: &str = "v1beta1";
/// `apiVersion` of every object of this module.
pub const API_VERSION: &str = "devices.kubeedge.io/v1beta1";

/// The namespace of objects that do not name one.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The namespace of an object: `metadata.namespace`, or [`DEFAULT_NAMESPACE`] when absent or empty.
pub fn namespace_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| DEFAULT_NAMESPACE.into())
}

/// A free-form JSON object (`type: object`, `x-kubernetes-preserve-unknown-fields: true`), as
/// KubeEdge's `CustomizedValue`. Keys keep their order of insertion-independent sorting.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CustomizedValue(pub serde_json::Map<String, serde_json::Value>);

impl CustomizedValue {
    /// The value under `key`, if any.
    pub fn get(&self, key: &str) -> Option<&serde_json::Value> {
        self.0.get(key)
    }

    /// Whether the object has no keys.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<serde_json::Map<String, serde_json::Value>> for CustomizedValue {
    fn from(map: serde_json::Map<String, serde_json::Value>) -> Self {
        Self(map)
    }
}

impl JsonSchema for CustomizedValue {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "CustomizedValue".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true
        })
    }
}

/// Drops the `default` schemars derives from `#[serde(default)]` on the properties of a struct:
/// KubeEdge's CRDs declare none there, and the API server would fill them in.
pub(crate) fn no_property_defaults(schema: &mut Schema) {
    if let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        for prop in props.values_mut() {
            if let Some(obj) = prop.as_object_mut() {
                obj.remove("default");
            }
        }
    }
}

/// Schema of an integer field that KubeEdge declares without a `format` (Go `int`).
pub(crate) fn plain_integer(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "integer" })
}

/// `protocolName` plus free-form `configData`: the shape of both `spec.protocol` and
/// `properties[].visitors` (`ProtocolConfig` and `VisitorConfig` in KubeEdge).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProtocolConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_data: Option<CustomizedValue>,
}

/// A property's visitor: how a mapper reaches that property on the device.
pub type VisitorConfig = ProtocolConfig;

/// A desired or reported value with its metadata (`TwinProperty`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TwinProperty {
    pub value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<std::collections::BTreeMap<String, String>>,
}
