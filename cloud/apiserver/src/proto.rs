//! Kubernetes' protobuf encoding of the built-in kinds that `kubectl create namespace`,
//! `configmap`, `secret`, `role`, `clusterrole`, `rolebinding` and `clusterrolebinding` send
//! (they send protobuf whatever the server prefers): the `k8s\0` envelope (`runtime.Unknown`)
//! and the messages of Namespace, ConfigMap, Secret and RBAC's four kinds, declared here with
//! Kubernetes' field numbers, decoded into the JSON objects the rest of the server works on.
//! Answers are JSON, which these clients accept.

use base64::Engine;
use prost::Message;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

pub(crate) const MEDIA: &str = "application/vnd.kubernetes.protobuf";
const MAGIC: &[u8] = b"k8s\0";

#[derive(Clone, PartialEq, Message)]
struct Unknown {
    #[prost(message, optional, tag = "1")]
    type_meta: Option<TypeMeta>,
    #[prost(bytes = "vec", optional, tag = "2")]
    raw: Option<Vec<u8>>,
    #[prost(string, optional, tag = "3")]
    content_encoding: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct TypeMeta {
    #[prost(string, optional, tag = "1")]
    api_version: Option<String>,
    #[prost(string, optional, tag = "2")]
    kind: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct Time {
    #[prost(int64, optional, tag = "1")]
    seconds: Option<i64>,
}

#[derive(Clone, PartialEq, Message)]
struct OwnerReference {
    #[prost(string, optional, tag = "1")]
    kind: Option<String>,
    #[prost(string, optional, tag = "3")]
    name: Option<String>,
    #[prost(string, optional, tag = "4")]
    uid: Option<String>,
    #[prost(string, optional, tag = "5")]
    api_version: Option<String>,
    #[prost(bool, optional, tag = "6")]
    controller: Option<bool>,
    #[prost(bool, optional, tag = "7")]
    block_owner_deletion: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
struct ObjectMeta {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    generate_name: Option<String>,
    #[prost(string, optional, tag = "3")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "6")]
    resource_version: Option<String>,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    annotations: BTreeMap<String, String>,
    #[prost(message, repeated, tag = "13")]
    owner_references: Vec<OwnerReference>,
    #[prost(string, repeated, tag = "14")]
    finalizers: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
struct NamespaceSpec {
    #[prost(string, repeated, tag = "1")]
    finalizers: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
struct Namespace {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<NamespaceSpec>,
}

#[derive(Clone, PartialEq, Message)]
struct ConfigMap {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(btree_map = "string, string", tag = "2")]
    data: BTreeMap<String, String>,
    #[prost(btree_map = "string, bytes", tag = "3")]
    binary_data: BTreeMap<String, Vec<u8>>,
    #[prost(bool, optional, tag = "4")]
    immutable: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
struct Secret {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(btree_map = "string, bytes", tag = "2")]
    data: BTreeMap<String, Vec<u8>>,
    #[prost(string, optional, tag = "3")]
    r#type: Option<String>,
    #[prost(btree_map = "string, string", tag = "4")]
    string_data: BTreeMap<String, String>,
    #[prost(bool, optional, tag = "5")]
    immutable: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
struct PolicyRule {
    #[prost(string, repeated, tag = "1")]
    verbs: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    api_groups: Vec<String>,
    #[prost(string, repeated, tag = "3")]
    resources: Vec<String>,
    #[prost(string, repeated, tag = "4")]
    resource_names: Vec<String>,
    #[prost(string, repeated, tag = "5")]
    non_resource_urls: Vec<String>,
}

/// Role and ClusterRole (a ClusterRole's `aggregationRule`, field 3, is not taken).
#[derive(Clone, PartialEq, Message)]
struct Role {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, repeated, tag = "2")]
    rules: Vec<PolicyRule>,
}

#[derive(Clone, PartialEq, Message)]
struct Subject {
    #[prost(string, optional, tag = "1")]
    kind: Option<String>,
    #[prost(string, optional, tag = "2")]
    api_group: Option<String>,
    #[prost(string, optional, tag = "3")]
    name: Option<String>,
    #[prost(string, optional, tag = "4")]
    namespace: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct RoleRef {
    #[prost(string, optional, tag = "1")]
    api_group: Option<String>,
    #[prost(string, optional, tag = "2")]
    kind: Option<String>,
    #[prost(string, optional, tag = "3")]
    name: Option<String>,
}

/// RoleBinding and ClusterRoleBinding.
#[derive(Clone, PartialEq, Message)]
struct RoleBinding {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, repeated, tag = "2")]
    subjects: Vec<Subject>,
    #[prost(message, optional, tag = "3")]
    role_ref: Option<RoleRef>,
}

#[derive(Clone, PartialEq, Message)]
struct ResourceAttributes {
    #[prost(string, optional, tag = "1")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "2")]
    verb: Option<String>,
    #[prost(string, optional, tag = "3")]
    group: Option<String>,
    #[prost(string, optional, tag = "4")]
    version: Option<String>,
    #[prost(string, optional, tag = "5")]
    resource: Option<String>,
    #[prost(string, optional, tag = "6")]
    subresource: Option<String>,
    #[prost(string, optional, tag = "7")]
    name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct NonResourceAttributes {
    #[prost(string, optional, tag = "1")]
    path: Option<String>,
    #[prost(string, optional, tag = "2")]
    verb: Option<String>,
}

/// The spec of a SelfSubjectAccessReview (fields 1 and 2), a SubjectAccessReview or a
/// LocalSubjectAccessReview (and 3, 4), and of a SelfSubjectRulesReview (`namespace` is its
/// field 1, read apart).
#[derive(Clone, PartialEq, Message)]
struct AccessReviewSpec {
    #[prost(message, optional, tag = "1")]
    resource_attributes: Option<ResourceAttributes>,
    #[prost(message, optional, tag = "2")]
    non_resource_attributes: Option<NonResourceAttributes>,
    #[prost(string, optional, tag = "3")]
    user: Option<String>,
    #[prost(string, repeated, tag = "4")]
    groups: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
struct RulesReviewSpec {
    #[prost(string, optional, tag = "1")]
    namespace: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct AccessReview {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<AccessReviewSpec>,
}

#[derive(Clone, PartialEq, Message)]
struct RulesReview {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<RulesReviewSpec>,
}

/// `{key: value}` of the fields given (an empty string or list is left out, as Go's
/// `omitempty`).
fn fields(pairs: Vec<(&str, Value)>) -> Value {
    let out: Map<String, Value> = pairs
        .into_iter()
        .filter(|(_, v)| match v {
            Value::Null => false,
            Value::String(s) => !s.is_empty(),
            Value::Array(a) => !a.is_empty(),
            _ => true,
        })
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    Value::Object(out)
}

fn rules_json(rules: Vec<PolicyRule>) -> Value {
    let rules: Vec<Value> = rules
        .into_iter()
        .map(|r| {
            fields(vec![
                ("verbs", json!(r.verbs)),
                ("apiGroups", json!(r.api_groups)),
                ("resources", json!(r.resources)),
                ("resourceNames", json!(r.resource_names)),
                ("nonResourceURLs", json!(r.non_resource_urls)),
            ])
        })
        .collect();
    json!(rules)
}

fn b64(b: &[u8]) -> Value {
    json!(base64::engine::general_purpose::STANDARD.encode(b))
}

fn meta_json(m: Option<ObjectMeta>) -> Value {
    let m = m.unwrap_or_default();
    let mut out = Map::new();
    let mut put = |k: &str, v: Option<String>| {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            out.insert(k.into(), json!(v));
        }
    };
    put("name", m.name);
    put("generateName", m.generate_name);
    put("namespace", m.namespace);
    put("resourceVersion", m.resource_version);
    if !m.labels.is_empty() {
        out.insert("labels".into(), json!(m.labels));
    }
    if !m.annotations.is_empty() {
        out.insert("annotations".into(), json!(m.annotations));
    }
    if !m.finalizers.is_empty() {
        out.insert("finalizers".into(), json!(m.finalizers));
    }
    if !m.owner_references.is_empty() {
        let refs: Vec<Value> = m
            .owner_references
            .into_iter()
            .map(|r| {
                json!({"apiVersion": r.api_version, "kind": r.kind, "name": r.name, "uid": r.uid,
                    "controller": r.controller, "blockOwnerDeletion": r.block_owner_deletion})
            })
            .collect();
        out.insert("ownerReferences".into(), json!(refs));
    }
    Value::Object(out)
}

/// Why a protobuf body was not taken.
#[derive(Debug)]
pub(crate) enum Refused {
    /// Not a valid encoding.
    Garbage(String),
    /// A kind this server takes as JSON only.
    Kind(String),
}

/// Decodes a protobuf request body of a Namespace, ConfigMap, Secret or RBAC kind into its JSON
/// object; the error says what was wrong.
pub(crate) fn decode(raw: &[u8]) -> Result<Value, Refused> {
    let body = raw.strip_prefix(MAGIC).ok_or_else(|| {
        Refused::Garbage("the protobuf body does not start with the k8s\\0 envelope".into())
    })?;
    let env = Unknown::decode(body)
        .map_err(|e| Refused::Garbage(format!("the protobuf envelope does not decode: {e}")))?;
    if env
        .content_encoding
        .as_deref()
        .is_some_and(|e| !e.is_empty())
    {
        return Err(Refused::Garbage(
            "compressed protobuf bodies are not supported".into(),
        ));
    }
    let tm = env.type_meta.unwrap_or_default();
    let api_version = tm.api_version.unwrap_or_default();
    let kind = tm.kind.unwrap_or_default();
    let raw = env.raw.unwrap_or_default();
    let bad = |e: prost::DecodeError| {
        Refused::Garbage(format!("the protobuf {kind} does not decode: {e}"))
    };
    let mut v = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => {
            let n = Namespace::decode(raw.as_slice()).map_err(bad)?;
            let mut v = json!({"metadata": meta_json(n.metadata)});
            if let Some(s) = n.spec.filter(|s| !s.finalizers.is_empty()) {
                v["spec"] = json!({"finalizers": s.finalizers});
            }
            v
        }
        ("v1", "ConfigMap") => {
            let c = ConfigMap::decode(raw.as_slice()).map_err(bad)?;
            let mut v = json!({"metadata": meta_json(c.metadata)});
            if !c.data.is_empty() {
                v["data"] = json!(c.data);
            }
            if !c.binary_data.is_empty() {
                let m: Map<String, Value> = c
                    .binary_data
                    .iter()
                    .map(|(k, b)| (k.clone(), b64(b)))
                    .collect();
                v["binaryData"] = Value::Object(m);
            }
            if let Some(i) = c.immutable {
                v["immutable"] = json!(i);
            }
            v
        }
        ("v1", "Secret") => {
            let s = Secret::decode(raw.as_slice()).map_err(bad)?;
            let mut v = json!({"metadata": meta_json(s.metadata)});
            if !s.data.is_empty() {
                let m: Map<String, Value> =
                    s.data.iter().map(|(k, b)| (k.clone(), b64(b))).collect();
                v["data"] = Value::Object(m);
            }
            if !s.string_data.is_empty() {
                v["stringData"] = json!(s.string_data);
            }
            if let Some(t) = s.r#type.filter(|t| !t.is_empty()) {
                v["type"] = json!(t);
            }
            if let Some(i) = s.immutable {
                v["immutable"] = json!(i);
            }
            v
        }
        ("rbac.authorization.k8s.io/v1", "Role" | "ClusterRole") => {
            let r = Role::decode(raw.as_slice()).map_err(bad)?;
            json!({"metadata": meta_json(r.metadata), "rules": rules_json(r.rules)})
        }
        ("rbac.authorization.k8s.io/v1", "RoleBinding" | "ClusterRoleBinding") => {
            let b = RoleBinding::decode(raw.as_slice()).map_err(bad)?;
            let subjects: Vec<Value> = b
                .subjects
                .into_iter()
                .map(|s| {
                    fields(vec![
                        ("kind", json!(s.kind)),
                        ("apiGroup", json!(s.api_group)),
                        ("name", json!(s.name)),
                        ("namespace", json!(s.namespace)),
                    ])
                })
                .collect();
            let r = b.role_ref.unwrap_or_default();
            let mut v = json!({"metadata": meta_json(b.metadata),
                "roleRef": fields(vec![("apiGroup", json!(r.api_group)), ("kind", json!(r.kind)), ("name", json!(r.name))])});
            if !subjects.is_empty() {
                v["subjects"] = json!(subjects);
            }
            v
        }
        (
            "authorization.k8s.io/v1",
            "SelfSubjectAccessReview" | "SubjectAccessReview" | "LocalSubjectAccessReview",
        ) => {
            let r = AccessReview::decode(raw.as_slice()).map_err(bad)?;
            let s = r.spec.unwrap_or_default();
            let mut spec = fields(vec![("user", json!(s.user)), ("groups", json!(s.groups))]);
            if let Some(a) = s.resource_attributes {
                spec["resourceAttributes"] = fields(vec![
                    ("namespace", json!(a.namespace)),
                    ("verb", json!(a.verb)),
                    ("group", json!(a.group)),
                    ("version", json!(a.version)),
                    ("resource", json!(a.resource)),
                    ("subresource", json!(a.subresource)),
                    ("name", json!(a.name)),
                ]);
            }
            if let Some(a) = s.non_resource_attributes {
                spec["nonResourceAttributes"] =
                    fields(vec![("path", json!(a.path)), ("verb", json!(a.verb))]);
            }
            json!({"metadata": meta_json(r.metadata), "spec": spec})
        }
        ("authorization.k8s.io/v1", "SelfSubjectRulesReview") => {
            let r = RulesReview::decode(raw.as_slice()).map_err(bad)?;
            let s = r.spec.unwrap_or_default();
            json!({"metadata": meta_json(r.metadata), "spec": fields(vec![("namespace", json!(s.namespace))])})
        }
        _ => {
            return Err(Refused::Kind(format!(
                "protobuf is accepted for v1 Namespace, ConfigMap and Secret, RBAC's kinds and access reviews only, not {api_version} {kind}; send JSON"
            )));
        }
    };
    v["apiVersion"] = json!(api_version);
    v["kind"] = json!(kind);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let u = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some("v1".into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
        };
        let mut out = MAGIC.to_vec();
        out.extend(u.encode_to_vec());
        out
    }

    #[test]
    fn configmaps_and_secrets_decode() {
        let cm = ConfigMap {
            metadata: Some(ObjectMeta {
                name: Some("cfg".into()),
                labels: [("a".to_string(), "b".to_string())].into(),
                ..Default::default()
            }),
            data: [("k".to_string(), "v".to_string())].into(),
            binary_data: [("b".to_string(), vec![0, 1])].into(),
            immutable: None,
        };
        let v = decode(&envelope("ConfigMap", cm.encode_to_vec())).expect("decodes");
        assert_eq!(v["metadata"]["name"], "cfg");
        assert_eq!(v["data"]["k"], "v");
        assert_eq!(v["binaryData"]["b"], "AAE=");
        assert_eq!(v["kind"], "ConfigMap");
        let s = Secret {
            metadata: Some(ObjectMeta {
                name: Some("s".into()),
                ..Default::default()
            }),
            data: [("p".to_string(), b"pw".to_vec())].into(),
            r#type: Some("Opaque".into()),
            ..Default::default()
        };
        let v = decode(&envelope("Secret", s.encode_to_vec())).expect("decodes");
        assert_eq!(v["data"]["p"], "cHc=");
    }

    #[test]
    fn garbage_is_refused_with_a_reason() {
        assert!(matches!(decode(b"nope"), Err(Refused::Garbage(m)) if m.contains("envelope")));
        let e = decode(&envelope("Pod", vec![])).expect_err("other kind");
        assert!(
            matches!(&e, Refused::Kind(m) if m.contains("send JSON")),
            "{e:?}"
        );
        let mut truncated = envelope("ConfigMap", vec![0x0a, 0x05, 0x0a]);
        truncated.truncate(truncated.len() - 1);
        assert!(decode(&truncated).is_err());
    }
}
