//! The `CustomResourceDefinition`s of the device types, as KubeEdge installs them: the `v1beta1`
//! schema of each kind, without a status subresource (KubeEdge's controller patches `status`
//! through the main resource, and writes twins to `DeviceStatus`).

use crate::v1beta1::{Device, DeviceModel, DeviceStatus};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// Makes a derived CRD match KubeEdge's: no status subresource; a root schema that declares
/// `apiVersion`, `kind` and `metadata` and does not require `spec`.
fn kubeedge_compatible(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
    let typed = |t: &str| JSONSchemaProps {
        type_: Some(t.to_string()),
        ..JSONSchemaProps::default()
    };
    for version in &mut crd.spec.versions {
        version.subresources = None;
        let Some(root) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        else {
            continue;
        };
        root.title = None;
        if let Some(required) = root.required.as_mut() {
            required.retain(|r| r != "spec");
            if required.is_empty() {
                root.required = None;
            }
        }
        let props = root.properties.get_or_insert_with(Default::default);
        props.insert("apiVersion".into(), typed("string"));
        props.insert("kind".into(), typed("string"));
        props.insert("metadata".into(), typed("object"));
    }
    crd
}

/// The CRDs of `Device`, `DeviceModel` and `DeviceStatus`, in that order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        kubeedge_compatible(Device::crd()),
        kubeedge_compatible(DeviceModel::crd()),
        kubeedge_compatible(DeviceStatus::crd()),
    ]
}

/// The `openAPIV3Schema` of `kind` (`Device`, `DeviceModel` or `DeviceStatus`) as JSON.
pub fn schema_of(kind: &str) -> Option<serde_json::Value> {
    let [schema] = schemas_of([kind]);
    schema
}

/// The `openAPIV3Schema` of each of `kinds`, from one generation of the CRDs (each generation
/// derives every schema: a few milliseconds).
pub fn schemas_of<const N: usize>(kinds: [&str; N]) -> [Option<serde_json::Value>; N] {
    let all = crds();
    kinds.map(|kind| {
        all.iter()
            .find(|c| c.spec.names.kind == kind)
            .and_then(|c| c.spec.versions.first())
            .and_then(|v| v.schema.as_ref())
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| serde_json::to_value(s).ok())
    })
}
