//! The `CustomResourceDefinition`s of the device types, as KubeEdge installs them: the `v1beta1`
//! schema of each kind, without a status subresource (KubeEdge's controller patches `status`
//! through the main resource, and writes twins to `DeviceStatus`).

use crate::v1beta1::{Device, DeviceModel, DeviceStatus};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

fn without_status_subresource(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        version.subresources = None;
    }
    crd
}

/// The CRDs of `Device`, `DeviceModel` and `DeviceStatus`, in that order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        without_status_subresource(Device::crd()),
        without_status_subresource(DeviceModel::crd()),
        without_status_subresource(DeviceStatus::crd()),
    ]
}

/// The `openAPIV3Schema` of `kind` (`Device`, `DeviceModel` or `DeviceStatus`) as JSON.
pub fn schema_of(kind: &str) -> Option<serde_json::Value> {
    crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .and_then(|c| c.spec.versions.into_iter().next())
        .and_then(|v| v.schema)
        .and_then(|s| s.open_api_v3_schema)
        .and_then(|s| serde_json::to_value(s).ok())
}
