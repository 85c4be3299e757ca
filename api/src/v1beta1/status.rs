//! `DeviceStatus` (KubeEdge v1.23): the reported side of a device, one object per `Device` with the
//! same name and namespace.

use super::{CustomizedValue, TwinProperty};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `spec` of a `DeviceStatus`: empty, since the owner reference ties it to its device.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "devices.kubeedge.io",
    version = "v1beta1",
    kind = "DeviceStatus",
    plural = "devicestatuses",
    singular = "devicestatus",
    namespaced,
    status = "DeviceTwinStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Last-Online","type":"string","jsonPath":".status.lastOnlineTime","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct DeviceStatusSpec {}

/// `status` of a `DeviceStatus`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceTwinStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub twins: Vec<Twin>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_online_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<CustomizedValue>,
}

/// The reported value of one property, and the desired value the mapper last saw.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = super::no_property_defaults)]
pub struct Twin {
    #[serde(default)]
    pub property_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_desired: Option<TwinProperty>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported: Option<TwinProperty>,
}
