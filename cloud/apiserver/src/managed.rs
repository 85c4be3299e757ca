//! Field ownership (`metadata.managedFields`) and server-side apply, as far as
//! `kubectl apply --server-side` needs: each manager owns the leaf fields it set; an apply sets
//! its fields, removes those it applied before and no longer applies (unless another manager
//! owns them), and conflicts with another manager's differing value unless forced. Lists are
//! owned whole (atomic), which Kubernetes does for lists without a merge key.

use crate::status::Status;
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;

type Path = Vec<String>;

/// Leaf paths of an object, the way ownership counts them: `apiVersion`, `kind` and
/// `metadata` other than labels, annotations and finalizers are nobody's.
pub(crate) fn leaves(obj: &Value) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    if let Some(m) = obj.as_object() {
        for (k, v) in m {
            match k.as_str() {
                "apiVersion" | "kind" => {}
                "metadata" => {
                    for sub in ["labels", "annotations"] {
                        if let Some(map) = v.get(sub).and_then(Value::as_object) {
                            for key in map.keys() {
                                out.insert(vec![k.clone(), sub.into(), key.clone()]);
                            }
                        }
                    }
                    if v.get("finalizers").is_some_and(Value::is_array) {
                        out.insert(vec![k.clone(), "finalizers".into()]);
                    }
                }
                _ => walk(v, vec![k.clone()], &mut out),
            }
        }
    }
    out
}

fn walk(v: &Value, path: Path, out: &mut BTreeSet<Path>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                let mut p = path.clone();
                p.push(k.clone());
                walk(x, p, out);
            }
        }
        _ => {
            out.insert(path);
        }
    }
}

fn get<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, k| cur.get(k))
}

fn remove(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for k in parents {
        match cur.get_mut(k) {
            Some(x) => cur = x,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.remove(last);
    }
}

/// `fieldsV1` of a set of paths.
pub(crate) fn to_fields(paths: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for p in paths {
        let mut cur = &mut root;
        for (i, k) in p.iter().enumerate() {
            let e = cur
                .entry(format!("f:{k}"))
                .or_insert_with(|| Value::Object(Map::new()));
            if i + 1 < p.len()
                && let Some(m) = e.as_object_mut()
            {
                m.entry(".").or_insert_with(|| json!({}));
            }
            match e.as_object_mut() {
                Some(m) => cur = m,
                None => break,
            }
        }
    }
    Value::Object(root)
}

/// Paths of a `fieldsV1`.
pub(crate) fn from_fields(f: &Value) -> BTreeSet<Path> {
    fn go(v: &Value, path: Path, out: &mut BTreeSet<Path>) {
        let children: Vec<(&String, &Value)> = v
            .as_object()
            .map(|m| m.iter().filter(|(k, _)| k.starts_with("f:")).collect())
            .unwrap_or_default();
        if children.is_empty() {
            if !path.is_empty() {
                out.insert(path);
            }
            return;
        }
        for (k, x) in children {
            let mut p = path.clone();
            p.push(k[2..].to_string());
            go(x, p, out);
        }
    }
    let mut out = BTreeSet::new();
    go(f, Vec::new(), &mut out);
    out
}

#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: String,
    subresource: String,
    fields: BTreeSet<Path>,
}

fn entries(obj: &Value) -> Vec<Entry> {
    obj["metadata"]["managedFields"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| Entry {
                    manager: e["manager"].as_str().unwrap_or_default().into(),
                    operation: e["operation"].as_str().unwrap_or("Update").into(),
                    api_version: e["apiVersion"].as_str().unwrap_or_default().into(),
                    time: e["time"].as_str().unwrap_or_default().into(),
                    subresource: e["subresource"].as_str().unwrap_or_default().into(),
                    fields: from_fields(&e["fieldsV1"]),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn store(obj: &mut Value, list: Vec<Entry>) {
    let arr: Vec<Value> = list
        .into_iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({"manager": e.manager, "operation": e.operation,
                "apiVersion": e.api_version, "time": e.time, "fieldsType": "FieldsV1",
                "fieldsV1": to_fields(&e.fields)});
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if arr.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(arr));
        }
    }
}

fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Records an ordinary write (create, update, patch) by `manager`: it takes the fields it
/// changed from whoever owned them.
pub(crate) fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    api_version: &str,
    subresource: &str,
    now: &str,
) {
    let mut list = old.map(entries).unwrap_or_default();
    let now_leaves = leaves(new);
    let changed: BTreeSet<Path> = now_leaves
        .iter()
        .filter(|p| old.is_none_or(|o| get(o, p) != get(new, p)))
        .cloned()
        .collect();
    for e in list.iter_mut() {
        e.fields
            .retain(|p| now_leaves.contains(p) && !changed.contains(p));
    }
    if !changed.is_empty() {
        match list.iter_mut().find(|e| {
            e.manager == manager && e.operation == "Update" && e.subresource == subresource
        }) {
            Some(e) => {
                e.fields.extend(changed);
                e.time = now.into();
                e.api_version = api_version.into();
            }
            None => list.push(Entry {
                manager: manager.into(),
                operation: "Update".into(),
                api_version: api_version.into(),
                time: now.into(),
                subresource: subresource.into(),
                fields: changed,
            }),
        }
    }
    store(new, list);
}

fn deep_merge(t: &mut Value, p: &Value) {
    match (t.as_object_mut(), p.as_object()) {
        (Some(tm), Some(pm)) => {
            for (k, v) in pm {
                match tm.get_mut(k) {
                    Some(x) if x.is_object() && v.is_object() => deep_merge(x, v),
                    _ => {
                        tm.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        _ => *t = p.clone(),
    }
}

/// Server-side apply of `applied` by `manager` over `current`; the result keeps `current`'s
/// metadata other than labels, annotations and finalizers.
pub(crate) fn apply(
    current: &Value,
    applied: &Value,
    manager: &str,
    force: bool,
    api_version: &str,
    now: &str,
    resource: &str,
) -> Result<Value, Status> {
    let mut list = entries(current);
    let new_set = leaves(applied);
    let mut conflicts = Vec::new();
    for p in &new_set {
        if get(current, p) == get(applied, p) {
            continue;
        }
        for e in list.iter_mut().filter(|e| e.manager != manager) {
            if e.fields.iter().any(|q| overlaps(p, q)) {
                if force {
                    e.fields.retain(|q| !overlaps(p, q));
                } else {
                    conflicts.push((e.manager.clone(), e.api_version.clone(), p.join(".")));
                }
            }
        }
    }
    if !conflicts.is_empty() {
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(m, v, f)| {
                json!({"reason": "FieldManagerConflict",
                "message": format!("conflict with \"{m}\" using {v}"), "field": format!(".{f}")})
            })
            .collect();
        let lines: Vec<String> = conflicts
            .iter()
            .map(|(m, v, f)| format!("- conflict with \"{m}\" using {v}: .{f}"))
            .collect();
        let n = conflicts.len();
        let mut s = Status::new(
            409,
            "Conflict",
            format!(
                "Apply failed with {n} conflict{}: {}",
                if n == 1 { "" } else { "s" },
                lines.join("\n")
            ),
        );
        s.details = Some(json!({"kind": resource, "causes": causes}));
        return Err(s);
    }
    let mut result = current.clone();
    let prev: BTreeSet<Path> = list
        .iter()
        .filter(|e| e.manager == manager && e.operation == "Apply")
        .flat_map(|e| e.fields.iter().cloned())
        .collect();
    for p in prev.difference(&new_set) {
        let owned_by_other = list
            .iter()
            .any(|e| e.manager != manager && e.fields.contains(p));
        if !owned_by_other {
            remove(&mut result, p);
        }
    }
    let mut body = applied.clone();
    if let Some(m) = body.as_object_mut() {
        m.remove("apiVersion");
        m.remove("kind");
        if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.retain(|k, _| matches!(k.as_str(), "labels" | "annotations" | "finalizers"));
        }
    }
    deep_merge(&mut result, &body);
    list.retain(|e| !(e.manager == manager && e.operation == "Apply"));
    list.push(Entry {
        manager: manager.into(),
        operation: "Apply".into(),
        api_version: api_version.into(),
        time: now.into(),
        subresource: String::new(),
        fields: new_set,
    });
    store(&mut result, list);
    Ok(result)
}

/// The first managedFields entry of a newly applied object.
pub(crate) fn applied_new(obj: &mut Value, manager: &str, api_version: &str, now: &str) {
    let set = leaves(obj);
    store(
        obj,
        vec![Entry {
            manager: manager.into(),
            operation: "Apply".into(),
            api_version: api_version.into(),
            time: now.into(),
            subresource: String::new(),
            fields: set,
        }],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_removes_what_it_no_longer_applies_and_conflicts_with_others() {
        let mut obj =
            json!({"metadata": {"name": "d", "labels": {"a": "1"}}, "spec": {"x": 1, "y": 2}});
        applied_new(&mut obj, "kubectl", "g/v1", "t");
        let fields = from_fields(&obj["metadata"]["managedFields"][0]["fieldsV1"]);
        assert!(fields.contains(&vec!["spec".to_string(), "y".to_string()]));
        // Drop y, keep x.
        let next = apply(
            &obj,
            &json!({"metadata": {"name": "d", "labels": {"a": "1"}}, "spec": {"x": 1}}),
            "kubectl",
            false,
            "g/v1",
            "t",
            "devices",
        )
        .expect("must succeed");
        assert_eq!(next["spec"], json!({"x": 1}));
        // Another manager changes x; kubectl's apply of another x conflicts unless forced.
        let mut edited = next.clone();
        edited["spec"]["x"] = json!(5);
        record_update(Some(&next), &mut edited, "editor", "g/v1", "", "t");
        let e = apply(
            &edited,
            &json!({"spec": {"x": 7}}),
            "kubectl",
            false,
            "g/v1",
            "t",
            "devices",
        )
        .expect_err("must fail");
        assert_eq!(e.code, 409);
        assert!(
            e.message.contains("conflict with \"editor\""),
            "{}",
            e.message
        );
        let forced = apply(
            &edited,
            &json!({"spec": {"x": 7}}),
            "kubectl",
            true,
            "g/v1",
            "t",
            "devices",
        )
        .expect("must succeed");
        assert_eq!(forced["spec"]["x"], 7);
    }
}
