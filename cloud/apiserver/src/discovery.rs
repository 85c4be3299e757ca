//! Discovery (legacy and aggregated, as kubectl 1.3x asks for it) and OpenAPI v3 documents
//! (for `kubectl explain`, and to tell kubectl that the server validates fields itself).

use crate::resources::{Registry, Resource};
use serde_json::{Map, Value, json};

pub(crate) const AGGREGATED_V2: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
pub(crate) const AGGREGATED_V2BETA1: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

/// The aggregated discovery version an `Accept` header asks for first, if any.
pub(crate) fn aggregated(accept: &str) -> Option<&'static str> {
    for part in accept.split(',') {
        let p: String = part.chars().filter(|c| !c.is_whitespace()).collect();
        if p.contains("as=APIGroupDiscoveryList") {
            if p.contains("v=v2beta1") {
                return Some(AGGREGATED_V2BETA1);
            }
            if p.contains("v=v2") {
                return Some(AGGREGATED_V2);
            }
        }
    }
    None
}

pub(crate) fn api_versions(server: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server}]})
}

fn group_entry(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

pub(crate) fn api_group_list(reg: &Registry) -> Value {
    let groups: Vec<Value> = reg
        .groups()
        .into_iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_entry(&g, &vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub(crate) fn api_group(reg: &Registry, group: &str) -> Option<Value> {
    reg.groups()
        .into_iter()
        .find(|(g, _)| g == group && !g.is_empty())
        .map(|(g, vs)| {
            let mut e = group_entry(&g, &vs);
            e["kind"] = json!("APIGroup");
            e["apiVersion"] = json!("v1");
            e
        })
}

pub(crate) fn resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut out = Vec::new();
    for r in reg.in_version(group, version) {
        let mut e = json!({"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": r.verbs()});
        if !r.short_names.is_empty() {
            e["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            e["categories"] = json!(r.categories);
        }
        out.push(e);
        if r.version(version).is_some_and(|v| v.status) {
            out.push(
                json!({"name": format!("{}/status", r.plural), "singularName": "",
                "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}),
            );
        }
    }
    if out.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out}),
    )
}

fn discovery_resource(r: &Resource, version: &str) -> Value {
    let kind = json!({"group": r.group, "version": version, "kind": r.kind});
    let mut e = json!({"resource": r.plural, "responseKind": kind,
        "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": r.singular, "verbs": r.verbs()});
    if !r.short_names.is_empty() {
        e["shortNames"] = json!(r.short_names);
    }
    if !r.categories.is_empty() {
        e["categories"] = json!(r.categories);
    }
    if r.version(version).is_some_and(|v| v.status) {
        e["subresources"] = json!([{"subresource": "status", "responseKind": kind,
            "verbs": ["get", "patch", "update"]}]);
    }
    e
}

/// `APIGroupDiscoveryList` of the core group (`legacy`) or of every named group.
pub(crate) fn aggregated_list(reg: &Registry, legacy: bool, media: &str) -> Value {
    let version = if media == AGGREGATED_V2BETA1 {
        "apidiscovery.k8s.io/v2beta1"
    } else {
        "apidiscovery.k8s.io/v2"
    };
    let mut items = Vec::new();
    for (g, vs) in reg.groups() {
        if g.is_empty() != legacy {
            continue;
        }
        let versions: Vec<Value> = vs
            .iter()
            .map(|v| {
                let resources: Vec<Value> = reg
                    .in_version(&g, v)
                    .map(|r| discovery_resource(r, v))
                    .collect();
                json!({"version": v, "resources": resources, "freshness": "Current"})
            })
            .collect();
        items.push(
            json!({"metadata": {"name": g, "creationTimestamp": null}, "versions": versions}),
        );
    }
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": version, "metadata": {}, "items": items})
}

/// `io.kubeedge.devices.v1beta1.Device`, the schema name Kubernetes gives a kind.
pub(crate) fn schema_name(r: &Resource, version: &str) -> String {
    if r.builtin {
        let pkg = match r.group.as_str() {
            "" => "core",
            "coordination.k8s.io" => "coordination",
            "apiextensions.k8s.io" => {
                return format!(
                    "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.{version}.{}",
                    r.kind
                );
            }
            g => g.split('.').next().unwrap_or(g),
        };
        return format!("io.k8s.api.{pkg}.{version}.{}", r.kind);
    }
    let mut parts: Vec<&str> = r.group.split('.').collect();
    parts.reverse();
    format!("{}.{version}.{}", parts.join("."), r.kind)
}

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

fn object_meta_schema() -> Value {
    let s = |d: &str| json!({"type": "string", "description": d});
    json!({"type": "object", "description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create.",
    "properties": {
        "name": s("Name must be unique within a namespace."),
        "generateName": s("GenerateName is an optional prefix, used by the server, to generate a unique name ONLY IF the Name field has not been provided."),
        "namespace": s("Namespace defines the space within which each name must be unique."),
        "uid": s("UID is the unique in time and space value for this object."),
        "resourceVersion": s("An opaque value that represents the internal version of this object."),
        "generation": {"type": "integer", "format": "int64", "description": "A sequence number representing a specific generation of the desired state."},
        "creationTimestamp": {"type": "string", "format": "date-time", "description": "CreationTimestamp is a timestamp representing the server time when this object was created."},
        "deletionTimestamp": {"type": "string", "format": "date-time", "description": "DeletionTimestamp is RFC 3339 date and time at which this resource will be deleted."},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Map of string keys and values that can be used to organize and categorize objects."},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Annotations is an unstructured key value map stored with a resource."},
        "finalizers": {"type": "array", "items": {"type": "string"}, "description": "Must be empty before the object is deleted from the registry."},
        "ownerReferences": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}, "description": "List of objects depended by this object."},
        "managedFields": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}, "description": "ManagedFields maps workflow-id and version to the set of fields that are managed by that workflow."}
    }})
}

/// The schema published for a kind: the CRD's with `metadata` as ObjectMeta.
fn kind_schema(r: &Resource, version: &str) -> Value {
    let gvk = json!([{"group": r.group, "kind": r.kind, "version": version}]);
    let mut s = r
        .version(version)
        .and_then(|v| v.schema.clone())
        .unwrap_or_else(|| {
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true,
            "description": format!("{} is a built-in kind of the embedded API.", r.kind)})
        });
    if let Some(m) = s.as_object_mut() {
        let props = m
            .entry("properties")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(p) = props.as_object_mut() {
            p.insert("metadata".into(), json!({"allOf": [{"$ref": format!("#/components/schemas/{OBJECT_META}")}],
                "description": "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"}));
            p.entry("apiVersion")
                .or_insert_with(|| json!({"type": "string"}))["description"] = json!(
                "APIVersion defines the versioned schema of this representation of an object."
            );
            p.entry("kind").or_insert_with(|| json!({"type": "string"}))["description"] = json!(
                "Kind is a string value representing the REST resource this object represents."
            );
        }
        m.insert("x-kubernetes-group-version-kind".into(), gvk);
    }
    s
}

fn operation(r: &Resource, version: &str, action: &str, params: &[&str]) -> Value {
    let params: Vec<Value> = params
        .iter()
        .map(|p| json!({"name": p, "in": "query", "schema": {"type": "string", "uniqueItems": true}}))
        .collect();
    json!({"operationId": format!("{action}{}", r.kind), "parameters": params,
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema":
            {"$ref": format!("#/components/schemas/{}", schema_name(r, version))}}}}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": r.group, "version": version, "kind": r.kind}})
}

/// The OpenAPI v3 document of one group version.
pub(crate) fn openapi_v3(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut schemas = Map::new();
    let mut paths = Map::new();
    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let write = ["dryRun", "fieldManager", "fieldValidation", "pretty"];
    let patch = [
        "dryRun",
        "fieldManager",
        "fieldValidation",
        "force",
        "pretty",
    ];
    let mut any = false;
    for r in reg.in_version(group, version) {
        any = true;
        schemas.insert(schema_name(r, version), kind_schema(r, version));
        let base = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{prefix}/{}", r.plural)
        };
        paths.insert(
            base.clone(),
            json!({"get": operation(r, version, "list", &["labelSelector", "fieldSelector", "limit", "continue", "watch", "resourceVersion"]),
                   "post": operation(r, version, "post", &write),
                   "delete": operation(r, version, "deletecollection", &["dryRun", "labelSelector"])}),
        );
        paths.insert(
            format!("{base}/{{name}}"),
            json!({"get": operation(r, version, "get", &[]),
                   "put": operation(r, version, "put", &write),
                   "patch": operation(r, version, "patch", &patch),
                   "delete": operation(r, version, "delete", &["dryRun", "propagationPolicy", "gracePeriodSeconds"])}),
        );
        if r.version(version).is_some_and(|v| v.status) {
            paths.insert(
                format!("{base}/{{name}}/status"),
                json!({"get": operation(r, version, "get", &[]),
                       "put": operation(r, version, "put", &write),
                       "patch": operation(r, version, "patch", &patch)}),
            );
        }
    }
    if !any {
        return None;
    }
    schemas.insert(OBJECT_META.into(), object_meta_schema());
    Some(
        json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": crate::KUBE_VERSION},
        "paths": paths, "components": {"schemas": schemas}}),
    )
}

/// A short hash of a document, for the `?hash=` of its URL.
pub(crate) fn hash(v: &Value) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in v.to_string().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016X}")
}

/// `GET /openapi/v3`: every group version and the URL of its document.
pub(crate) fn openapi_v3_index(reg: &Registry) -> Value {
    let mut paths = Map::new();
    for (g, vs) in reg.groups() {
        for v in vs {
            let key = if g.is_empty() {
                format!("api/{v}")
            } else {
                format!("apis/{g}/{v}")
            };
            let h = openapi_v3(reg, &g, &v)
                .map(|d| hash(&d))
                .unwrap_or_default();
            paths.insert(
                key.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={h}")}),
            );
        }
    }
    json!({"paths": paths})
}
