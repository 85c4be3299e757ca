//! Patches: JSON merge patch (RFC 7386), JSON patch (RFC 6902), Kubernetes' strategic merge
//! patch for built-in kinds.

use api::validate::names::Excerpt;
use serde_json::{Map, Value};

/// A patch that cannot be applied; the stored object is left as it was.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PatchError {
    #[error("invalid JSON patch: {0}")]
    Invalid(serde_json::Error),
    #[error(transparent)]
    Operation(#[from] json_patch::PatchError),
    #[error("unknown patch type: {0}")]
    UnknownPatchType(Excerpt),
    #[error("unknown strategic merge patch directive {0}")]
    UnknownDirective(Excerpt),
    #[error("map: {element} does not contain declared merge key: {key}")]
    NoMergeKey { element: Excerpt, key: &'static str },
}

/// The patch types a PATCH request may carry, by `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchType {
    pub(crate) fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or_default().trim();
        match base {
            "application/merge-patch+json" => Some(Self::Merge),
            "application/json-patch+json" => Some(Self::Json),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// Applies a JSON patch; the error names the failing operation.
pub(crate) fn json_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let p: json_patch::Patch =
        serde_json::from_value(patch.clone()).map_err(PatchError::Invalid)?;
    Ok(json_patch::patch(target, &p)?)
}

pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// The merge key of a list field under strategic merge patch, for the built-in kinds served.
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "ownerReferences" => Some("uid"),
        "conditions" | "addresses" => Some("type"),
        "taints" => Some("key"),
        "containers"
        | "initContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "containerStatuses"
        | "initContainerStatuses" => Some("name"),
        "podIPs" | "hostIPs" => Some("ip"),
        "volumeMounts" => Some("mountPath"),
        "ports" => Some("containerPort"),
        _ => None,
    }
}

/// Primitive lists merged as sets.
fn set_list(field: &str) -> bool {
    matches!(field, "finalizers")
}

/// Applies a strategic merge patch to `target`.
pub(crate) fn strategic_merge(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => merge_object(t, p),
        _ => {
            *target = strip(patch);
            Ok(())
        }
    }
}

/// A patch value without its `$` directives.
fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
        other => other.clone(),
    }
}

fn merge_object(t: &mut Map<String, Value>, p: &Map<String, Value>) -> Result<(), PatchError> {
    match p.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *t = strip(&Value::Object(p.clone()))
                .as_object()
                .cloned()
                .unwrap_or_default();
            return Ok(());
        }
        Some("delete") => {
            t.clear();
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => return Err(PatchError::UnknownPatchType(Excerpt::of(other))),
    }
    if let Some(keep) = p.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        t.retain(|k, _| keep.contains(&k.as_str()) || p.contains_key(k));
    }
    for (k, pv) in p {
        if k.starts_with("$setElementOrder/") || k == "$patch" || k == "$retainKeys" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let drop: Vec<&Value> = pv
                .as_array()
                .map(|a| a.iter().collect())
                .unwrap_or_default();
            if let Some(list) = t.get_mut(field).and_then(Value::as_array_mut) {
                list.retain(|x| !drop.contains(&x));
            }
            continue;
        }
        if k.starts_with('$') {
            return Err(PatchError::UnknownDirective(Excerpt::of(k)));
        }
        if pv.is_null() {
            t.remove(k);
            continue;
        }
        match (t.get_mut(k), pv) {
            (Some(tv @ Value::Object(_)), Value::Object(pm)) => {
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    t.remove(k);
                } else if let Some(tm) = tv.as_object_mut() {
                    merge_object(tm, pm)?;
                }
            }
            (Some(Value::Array(ta)), Value::Array(pa)) => merge_list(k, ta, pa)?,
            _ => {
                t.insert(k.clone(), strip(pv));
            }
        }
    }
    Ok(())
}

fn merge_list(field: &str, t: &mut Vec<Value>, p: &[Value]) -> Result<(), PatchError> {
    if p.iter()
        .any(|x| x.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *t = p
            .iter()
            .filter(|x| x.get("$patch").is_none())
            .map(strip)
            .collect();
        return Ok(());
    }
    if set_list(field) {
        for x in p {
            if !t.contains(x) {
                t.push(x.clone());
            }
        }
        return Ok(());
    }
    let Some(key) = merge_key(field) else {
        *t = p.iter().map(strip).collect();
        return Ok(());
    };
    for x in p {
        let Some(id) = x.get(key) else {
            return Err(PatchError::NoMergeKey {
                element: Excerpt::of(&x.to_string()),
                key,
            });
        };
        let pos = t.iter().position(|e| e.get(key) == Some(id));
        let delete = x.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                t.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => {
                if let (Some(tm), Some(pm)) = (t[i].as_object_mut(), x.as_object()) {
                    merge_object(tm, pm)?;
                }
            }
            (None, false) => t.push(strip(x)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merge_keys_and_directives() {
        let mut node = json!({"metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "Disk", "status": "True"}]}});
        let p = json!({"metadata": {"labels": {"a": null, "c": "3"}, "finalizers": ["y"]},
            "status": {"$setElementOrder/conditions": [{"type": "Ready"}],
              "conditions": [{"type": "Ready", "status": "True"}, {"type": "Disk", "$patch": "delete"}]}});
        strategic_merge(&mut node, &p).expect("must succeed");
        assert_eq!(node["metadata"]["labels"], json!({"b": "2", "c": "3"}));
        assert_eq!(node["metadata"]["finalizers"], json!(["x", "y"]));
        assert_eq!(
            node["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}])
        );
    }

    #[test]
    fn json_patch_errors_name_the_operation() {
        let mut v = json!({"a": 1});
        let e =
            json_patch(&mut v, &json!([{"op": "remove", "path": "/b"}])).expect_err("must fail");
        let e = e.to_string();
        assert!(e.contains("/b") || e.contains("remove"), "{e}");
        assert_eq!(v, json!({"a": 1}));
    }
}
