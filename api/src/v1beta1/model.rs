//! `DeviceModel`: the blueprint of a kind of device.

use super::{CustomizedValue, VisitorConfig};
use crate::validate::names::Excerpt;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;

/// `spec` of a `DeviceModel`.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "devices.kubeedge.io",
    version = "v1beta1",
    kind = "DeviceModel",
    plural = "devicemodels",
    singular = "devicemodel",
    namespaced,
    derive = "PartialEq",
    printcolumn = r#"{"name":"Protocol","type":"string","jsonPath":".spec.protocol"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DeviceModelSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub properties: Vec<ModelProperty>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Model-level default of every device's `spec.protocol.configData` (KubeEdge v1.22).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_config_data: Option<CustomizedValue>,
}

/// One property of a model.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = super::no_property_defaults)]
pub struct ModelProperty {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "property_type_schema")]
    pub type_: Option<PropertyType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "access_mode_schema")]
    pub access_mode: Option<AccessMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// Model-level default visitor of this property (KubeEdge v1.22).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visitors: Option<VisitorConfig>,
}

// Optional enums as KubeEdge declares them: no `null` among the values.
fn property_type_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "enum": ["INT", "FLOAT", "DOUBLE", "STRING", "BOOLEAN", "BYTES", "STREAM"]
    })
}

fn access_mode_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "string", "enum": ["ReadWrite", "ReadOnly"] })
}

/// The value type of a property.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum PropertyType {
    Int,
    Float,
    Double,
    String,
    Boolean,
    Bytes,
    Stream,
}

impl PropertyType {
    /// The spelling used in manifests (`INT`, `FLOAT`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Int => "INT",
            Self::Float => "FLOAT",
            Self::Double => "DOUBLE",
            Self::String => "STRING",
            Self::Boolean => "BOOLEAN",
            Self::Bytes => "BYTES",
            Self::Stream => "STREAM",
        }
    }

    /// A type from the lower-case spelling of twins' `metadata.type` (KubeEdge's `$hw` and DMI
    /// messages; `""` is a string, `integer` and `bool` are accepted).
    pub fn from_twin_type(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "int" | "integer" => Self::Int,
            "float" => Self::Float,
            "double" => Self::Double,
            "boolean" | "bool" => Self::Boolean,
            "string" | "" => Self::String,
            "bytes" => Self::Bytes,
            "stream" => Self::Stream,
            _ => return None,
        })
    }

    /// Whether values of this type are numbers (and so `minimum`/`maximum` apply).
    pub fn is_numeric(self) -> bool {
        matches!(self, Self::Int | Self::Float | Self::Double)
    }

    /// Checks that `value` is a valid text form of this type, as twins carry values as text.
    pub fn check_value(self, value: &str) -> Result<(), ValueError> {
        let ok = match self {
            // The signed and the unsigned 64-bit range: a `uint64` register is an INT too.
            Self::Int => value.trim().parse::<i64>().is_ok() || value.trim().parse::<u64>().is_ok(),
            Self::Float | Self::Double => value
                .trim()
                .parse::<f64>()
                .map(f64::is_finite)
                .unwrap_or(false),
            Self::Boolean => matches!(value.trim(), "true" | "false"),
            Self::String | Self::Bytes | Self::Stream => true,
        };
        if ok {
            Ok(())
        } else {
            let expected = match self {
                Self::Int => "an integer",
                Self::Float | Self::Double => "a finite number",
                _ => "true or false",
            };
            Err(ValueError {
                value: Excerpt::of(value),
                expected,
                ty: self,
            })
        }
    }
}

/// A value that is not a text form of its property's type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value} is not {expected} ({ty})")]
pub struct ValueError {
    pub value: Excerpt,
    pub expected: &'static str,
    pub ty: PropertyType,
}

impl fmt::Display for PropertyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a property can be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum AccessMode {
    ReadWrite,
    ReadOnly,
}

impl AccessMode {
    /// The spelling used in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadWrite => "ReadWrite",
            Self::ReadOnly => "ReadOnly",
        }
    }
}

impl DeviceModel {
    /// The model property named `name`.
    pub fn property(&self, name: &str) -> Option<&ModelProperty> {
        self.spec.properties.iter().find(|p| p.name == name)
    }
}
