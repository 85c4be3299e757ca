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

fn row(obj: &Value, cols: &[Column], include: Include, api_version: &str) -> Value {
    let cells: Vec<Value> = cols.iter().map(|c| cell(obj, c)).collect();
    let object = match include {
        Include::None => Value::Null,
        Include::Metadata => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"],
        }),
        Include::Object => {
            let mut o = obj.clone();
            o["apiVersion"] = json!(api_version);
            o
        }
    };
    let mut r = json!({"cells": cells});
    if !object.is_null() {
        r["object"] = object;
    }
    r
}

/// A Table of `objects`.
pub(crate) fn table(
    res: &Resource,
    version: &str,
    objects: &[Value],
    include: Include,
    rv: u64,
    cont: Option<&str>,
) -> Value {
    let cols = columns(res, version);
    let defs: Vec<Value> = cols
        .iter()
        .map(|c| {
            json!({"name": c.name, "type": c.kind, "format": c.format,
            "description": c.description, "priority": c.priority})
        })
        .collect();
    let api_version = res.api_version(version);
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| row(o, &cols, include, &api_version))
        .collect();
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
        "columnDefinitions": defs, "rows": rows})
}

/// Whether an `Accept` header asks for a Table.
pub(crate) fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}
