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
    #[error("The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPS}, got {0}")]
    TooManyOperations(usize),
    /// The object would grow past the limit (copies that double it, say).
    #[error("the patched object would be larger than {0} bytes")]
    TooLarge(usize),
}

/// kube-apiserver's limit on the operations of one JSON patch.
pub(crate) const MAX_JSON_PATCH_OPS: usize = 10_000;

/// Counts the bytes of an encoding without keeping them.
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The size of `v` as compact JSON.
fn encoded_len(v: &Value) -> usize {
    let mut c = Counter(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
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

/// Applies a JSON patch of at most [`MAX_JSON_PATCH_OPS`] operations, one operation at a time,
/// refusing one that would make `target` larger than `max_size` bytes before it is applied (a
/// `copy` costs what it copies: 26 copies that each double an object are refused at the one
/// that passes the limit, not after 64 GiB were allocated). The error names the failing
/// operation; `target` is then partly patched, and the caller drops it.
pub(crate) fn json_patch(
    target: &mut Value,
    patch: &Value,
    max_size: usize,
) -> Result<(), PatchError> {
    use json_patch::PatchOperation;
    let ops = patch.as_array().map_or(0, Vec::len);
    if ops > MAX_JSON_PATCH_OPS {
        return Err(PatchError::TooManyOperations(ops));
    }
    let p: json_patch::Patch =
        serde_json::from_value(patch.clone()).map_err(PatchError::Invalid)?;
    let mut size = encoded_len(target);
    for op in &p.0 {
        let at = |pointer: &str| target.pointer(pointer).map_or(0, encoded_len);
        let (added, removed) = match op {
            PatchOperation::Add(a) => (encoded_len(&a.value), 0),
            PatchOperation::Replace(r) => (encoded_len(&r.value), at(r.path.as_str())),
            PatchOperation::Copy(c) => (at(c.from.as_str()), 0),
            PatchOperation::Remove(r) => (0, at(r.path.as_str())),
            PatchOperation::Move(_) | PatchOperation::Test(_) => (0, 0),
        };
        size = size.saturating_add(added).saturating_sub(removed);
        if size > max_size {
            return Err(PatchError::TooLarge(max_size));
        }
        json_patch::patch(target, std::slice::from_ref(op))?;
    }
    Ok(())
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
        let e = json_patch(&mut v, &json!([{"op": "remove", "path": "/b"}]), 1 << 20)
            .expect_err("must fail");
        let e = e.to_string();
        assert!(e.contains("/b") || e.contains("remove"), "{e}");
        assert_eq!(v, json!({"a": 1}));
    }

    #[test]
    fn a_json_patch_that_doubles_its_object_is_refused_at_the_limit() {
        let mut v = json!({"data": {"a": "x".repeat(1024)}});
        // Each copy doubles the object: 26 of them would make 64 GiB.
        let ops: Vec<Value> = (0..26)
            .map(|i| json!({"op": "copy", "from": "/data", "path": format!("/data/{i}")}))
            .collect();
        let e = json_patch(&mut v, &json!(ops), 1 << 20).expect_err("refused");
        assert!(matches!(e, PatchError::TooLarge(_)), "{e}");
        assert!(
            encoded_len(&v) <= 1 << 20,
            "stopped before it grew past the limit"
        );
        let many: Vec<Value> = (0..10_001)
            .map(|_| json!({"op": "test", "path": "/data", "value": 1}))
            .collect();
        assert!(matches!(
            json_patch(&mut json!({}), &json!(many), 1 << 20),
            Err(PatchError::TooManyOperations(10_001))
        ));
        let mut small = json!({"a": [1]});
        let grow =
            json!([{"op": "copy", "from": "/a", "path": "/b"}, {"op": "remove", "path": "/a"}]);
        json_patch(&mut small, &grow, 1 << 20).expect("within the limit");
        assert_eq!(small, json!({"b": [1]}));
    }
}
