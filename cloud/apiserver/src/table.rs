//! `meta.k8s.io/v1` Table responses, what `kubectl get` asks for: the kind's columns
//! (`additionalPrinterColumns` for custom resources) and one row per object.

use crate::meta::{age_seconds, human_duration};
use crate::resources::{Column, Resource};
use serde_json::{Value, json};

/// What a row carries beside its cells (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Include {
    None,
    Metadata,
    Object,
}

impl Include {
    pub(crate) fn parse(s: Option<&str>) -> Self {
        match s {
            Some("None") => Self::None,
            Some("Object") => Self::Object,
            _ => Self::Metadata,
        }
    }
}

fn columns(res: &Resource, version: &str) -> Vec<Column> {
    let declared = res
        .version(version)
        .map(|v| v.columns.clone())
        .unwrap_or_default();
    let name = Column {
        name: "Name".into(),
        kind: "string".into(),
        format: "name".into(),
        description: "Name must be unique within a namespace.".into(),
        priority: 0,
        json_path: ".metadata.name".into(),
    };
    let age = Column {
        name: "Age".into(),
        kind: "date".into(),
        format: String::new(),
        description: "CreationTimestamp is a timestamp representing the server time when this object was created.".into(),
        priority: 0,
        json_path: ".metadata.creationTimestamp".into(),
    };
    let mut out = vec![name];
    if res.builtin {
        out.extend(declared);
        if res.kind != "CustomResourceDefinition" {
            out.push(age);
        }
    } else if declared.is_empty() {
        out.push(age);
    } else {
        out.extend(declared);
    }
    out
}

/// The value of a simple JSONPath (`.spec.a.b`, `.spec.list[0].x`).
pub(crate) fn lookup<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = v;
    for seg in path.trim_start_matches('.').split('.') {
        if seg.is_empty() {
            continue;
        }
        let (key, idx) = match seg.split_once('[') {
            Some((k, rest)) => (k, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (seg, None),
        };
        if !key.is_empty() {
            cur = cur.get(key)?;
        }
        if let Some(i) = idx {
            cur = cur.get(i)?;
        }
    }
    Some(cur)
}

fn special(obj: &Value, what: &str) -> Value {
    match what {
        "#len(.data)" => json!(obj["data"].as_object().map(|m| m.len()).unwrap_or(0)),
        "#len(.data)+len(.binaryData)" => json!(
            obj["data"].as_object().map(|m| m.len()).unwrap_or(0)
                + obj["binaryData"].as_object().map(|m| m.len()).unwrap_or(0)
        ),
        "#node-ready" => {
            let ready = obj["status"]["conditions"]
                .as_array()
                .and_then(|a| a.iter().find(|c| c["type"] == "Ready"))
                .map(|c| c["status"] == "True");
            let mut s = match ready {
                Some(true) => "Ready".to_string(),
                Some(false) => "NotReady".to_string(),
                None => "Unknown".to_string(),
            };
            if obj["spec"]["unschedulable"] == json!(true) {
                s.push_str(",SchedulingDisabled");
            }
            json!(s)
        }
        "#node-roles" => {
            let roles: Vec<&str> = obj["metadata"]["labels"]
                .as_object()
                .map(|m| {
                    m.keys()
                        .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                        .collect()
                })
                .unwrap_or_default();
            json!(if roles.is_empty() {
                "<none>".to_string()
            } else {
                roles.join(",")
            })
        }
        "#node-ip" => json!(
            obj["status"]["addresses"]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["type"] == "InternalIP"))
                .and_then(|x| x["address"].as_str())
                .unwrap_or("<none>")
        ),
        "#pod-ready" => {
            let statuses = obj["status"]["containerStatuses"].as_array();
            let total = obj["spec"]["containers"].as_array().map_or(0, Vec::len);
            let ready = statuses.map_or(0, |a| {
                a.iter().filter(|c| c["ready"] == json!(true)).count()
            });
            json!(format!("{ready}/{total}"))
        }
        "#pod-status" => json!(pod_status(obj)),
        "#pod-restarts" => {
            let statuses = obj["status"]["containerStatuses"].as_array();
            let n: u64 = statuses.map_or(0, |a| {
                a.iter().filter_map(|c| c["restartCount"].as_u64()).sum()
            });
            json!(n.to_string())
        }
        "#pod-ip" => json!(obj["status"]["podIP"].as_str().unwrap_or("<none>")),
        "#pod-node" => json!(obj["spec"]["nodeName"].as_str().unwrap_or("<none>")),
        "#node-selector" => json!(
            obj["spec"]["template"]["spec"]["nodeSelector"]
                .as_object()
                .filter(|m| !m.is_empty())
                .map(|m| m
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(","))
                .unwrap_or_else(|| "<none>".into())
        ),
        "#involved" => json!(format!(
            "{}/{}",
            obj["involvedObject"]["kind"]
                .as_str()
                .unwrap_or_default()
                .to_lowercase(),
            obj["involvedObject"]["name"].as_str().unwrap_or_default()
        )),
        _ => Value::Null,
    }
}

/// A pod's STATUS as kubectl prints it: Terminating, a container's waiting or terminated
/// reason, else the phase.
fn pod_status(obj: &Value) -> String {
    if obj["metadata"]["deletionTimestamp"].is_string() {
        return "Terminating".into();
    }
    let status = &obj["status"];
    let mut out = status["reason"]
        .as_str()
        .or(status["phase"].as_str())
        .unwrap_or("Pending")
        .to_string();
    for c in status["containerStatuses"].as_array().into_iter().flatten() {
        let st = &c["state"];
        if let Some(r) = st["waiting"]["reason"].as_str().filter(|r| !r.is_empty()) {
            out = r.to_string();
        } else if let Some(r) = st["terminated"]["reason"]
            .as_str()
            .filter(|r| !r.is_empty())
        {
            out = r.to_string();
        } else if st["terminated"].is_object() {
            let code = st["terminated"]["exitCode"].as_i64().unwrap_or(0);
            out = format!("ExitCode:{code}");
        }
    }
    out
}

fn cell(obj: &Value, c: &Column) -> Value {
    if c.json_path.starts_with('#') {
        return special(obj, &c.json_path);
    }
    let v = lookup(obj, &c.json_path).cloned().unwrap_or(Value::Null);
    if c.kind == "date" {
        return match v.as_str().and_then(age_seconds) {
            Some(s) => json!(human_duration(s)),
            None => Value::Null,
        };
    }
    match (&v, c.kind.as_str()) {
        (Value::Null, _) => Value::Null,
        (Value::String(_), _) | (Value::Number(_), "integer" | "number") => v,
        (Value::Bool(_), "boolean") => v,
        (Value::Array(_) | Value::Object(_), _) => json!(v.to_string()),
        _ => json!(match &v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }),
    }
}

/// One row: its cells, then what it includes of `obj` (taken, not copied).
fn row(mut obj: Value, cols: &[Column], include: Include, api_version: &str) -> Value {
    let cells: Vec<Value> = cols.iter().map(|c| cell(&obj, c)).collect();
    let object = match include {
        Include::None => Value::Null,
        Include::Metadata => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"].take(),
        }),
        Include::Object => {
            obj["apiVersion"] = json!(api_version);
            obj
        }
    };
    let mut r = json!({"cells": cells});
    if !object.is_null() {
        r["object"] = object;
    }
    r
}

/// A Table of `objects` as JSON text. Each row is built from one object and written before
/// the next is decoded: a table of a fleet's 100,000 Devices holds one object's tree at a time,
/// not all of them (which took seconds of fresh memory to build and free).
pub(crate) fn table(
    res: &Resource,
    version: &str,
    objects: impl ExactSizeIterator<Item = Value>,
    include: Include,
    rv: u64,
    cont: Option<&str>,
) -> Vec<u8> {
    let cols = columns(res, version);
    let defs: Vec<Value> = cols
        .iter()
        .map(|c| {
            json!({"name": c.name, "type": c.kind, "format": c.format,
            "description": c.description, "priority": c.priority})
        })
        .collect();
    let api_version = res.api_version(version);
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    let mut out = Vec::with_capacity(256 + objects.len() * 512);
    out.extend_from_slice(b"{\"kind\":\"Table\",\"apiVersion\":\"meta.k8s.io/v1\",\"metadata\":");
    out.extend_from_slice(meta.to_string().as_bytes());
    out.extend_from_slice(b",\"columnDefinitions\":");
    out.extend_from_slice(Value::Array(defs).to_string().as_bytes());
    out.extend_from_slice(b",\"rows\":[");
    for (i, o) in objects.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let r = row(o, &cols, include, &api_version);
        // Writing a `Value` into a `Vec` cannot fail.
        let _ = serde_json::to_writer(&mut out, &r);
    }
    out.extend_from_slice(b"]}");
    out
}

/// Whether an `Accept` header asks for a Table.
pub(crate) fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configmaps() -> Resource {
        crate::resources::builtins()
            .into_iter()
            .find(|r| r.kind == "ConfigMap")
            .expect("a built-in kind")
    }

    fn cm(name: &str, keys: usize) -> Value {
        let data: serde_json::Map<String, Value> =
            (0..keys).map(|k| (format!("k{k}"), json!("v"))).collect();
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "plant", "labels": {"line": name}},
            "data": data})
    }

    #[test]
    fn each_row_is_its_own_objects_cells_and_metadata() {
        let objects = vec![cm("a", 0), cm("b", 2), cm("c", 5)];
        let text = table(
            &configmaps(),
            "v1",
            objects.into_iter(),
            Include::Metadata,
            7,
            Some("next"),
        );
        let t: Value = serde_json::from_slice(&text).expect("a table is JSON");
        assert_eq!(t["kind"], "Table");
        assert_eq!(
            t["metadata"],
            json!({"resourceVersion": "7", "continue": "next"})
        );
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(names, ["Name", "Data", "Age"]);
        let rows = t["rows"].as_array().expect("rows");
        assert_eq!(rows.len(), 3);
        for (r, (name, keys)) in rows.iter().zip([("a", 0), ("b", 2), ("c", 5)]) {
            assert_eq!(r["cells"][0], name);
            assert_eq!(r["cells"][1], keys);
            assert_eq!(r["object"]["kind"], "PartialObjectMetadata");
            assert_eq!(r["object"]["metadata"]["labels"]["line"], name);
            assert!(r["object"].get("data").is_none(), "metadata only");
        }
    }

    #[test]
    fn a_row_includes_the_whole_object_or_nothing_as_asked() {
        let whole = table(
            &configmaps(),
            "v1",
            std::iter::once(cm("a", 1)),
            Include::Object,
            1,
            None,
        );
        let t: Value = serde_json::from_slice(&whole).expect("JSON");
        assert_eq!(t["rows"][0]["object"]["data"]["k0"], "v");
        assert!(t["metadata"].get("continue").is_none());
        let none = table(
            &configmaps(),
            "v1",
            std::iter::empty(),
            Include::None,
            1,
            None,
        );
        let t: Value = serde_json::from_slice(&none).expect("JSON");
        assert_eq!(t["rows"], json!([]));
        let bare = table(
            &configmaps(),
            "v1",
            std::iter::once(cm("a", 1)),
            Include::None,
            1,
            None,
        );
        let t: Value = serde_json::from_slice(&bare).expect("JSON");
        assert!(t["rows"][0].get("object").is_none());
    }
}
