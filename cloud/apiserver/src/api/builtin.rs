//! Kind-specific defaults and checks of the built-in kinds.

use super::*;
use crate::meta;
use crate::status::{Cause, Status};
use base64::Engine;
use serde_json::{Value, json};

/// Kind-specific defaults and checks of the built-in kinds.
pub(super) fn builtin_rules(
    c: &WriteCtx,
    old: Option<&Value>,
    new: &mut Value,
) -> Result<(), Status> {
    let invalid = |causes: Vec<Cause>| Status::invalid(&c.res.kind, &c.res.group, &c.name, causes);
    match (c.res.group.as_str(), c.res.kind.as_str()) {
        ("", "Namespace") => {
            for field in ["spec", "status"] {
                if let Some(v) = new.get(field).filter(|v| !v.is_object() && !v.is_null()) {
                    return Err(invalid(vec![Cause::type_invalid(
                        field,
                        v,
                        "must be an object",
                    )]));
                }
            }
            if old.is_none() {
                new["spec"]["finalizers"] = json!(["kubernetes"]);
                new["status"] = json!({"phase": "Active"});
            }
        }
        ("", "ConfigMap") => {
            let mut causes = Vec::new();
            for field in ["data", "binaryData"] {
                if let Some(d) = new.get(field).filter(|d| !d.is_null()) {
                    match d.as_object() {
                        Some(m) => {
                            for (k, v) in m {
                                let key_ok = !k.is_empty()
                                    && k.len() <= 253
                                    && k.chars()
                                        .all(|ch| ch.is_ascii_alphanumeric() || "-._".contains(ch));
                                if !key_ok {
                                    causes.push(Cause::invalid(field, &json!(k),
                                        "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"));
                                }
                                let ok = match (field, v.as_str()) {
                                    ("data", Some(_)) => true,
                                    ("binaryData", Some(s)) => {
                                        base64::engine::general_purpose::STANDARD.decode(s).is_ok()
                                    }
                                    _ => false,
                                };
                                if !ok {
                                    causes.push(Cause::type_invalid(
                                        format!("{field}.{k}"),
                                        v,
                                        if field == "data" {
                                            "must be a string"
                                        } else {
                                            "must be base64-encoded"
                                        },
                                    ));
                                }
                            }
                        }
                        None => {
                            causes.push(Cause::type_invalid(field, d, "must be a map of strings"))
                        }
                    }
                }
            }
            if !causes.is_empty() {
                return Err(invalid(causes));
            }
        }
        ("", "Secret") => {
            for field in ["data", "stringData"] {
                if let Some(v) = new.get(field).filter(|v| !v.is_object() && !v.is_null()) {
                    return Err(invalid(vec![Cause::type_invalid(
                        field,
                        v,
                        "must be a map of strings",
                    )]));
                }
            }
            if let Some(sd) = new.as_object_mut().and_then(|m| m.remove("stringData"))
                && let Some(m) = sd.as_object()
            {
                for (k, v) in m {
                    let s = v.as_str().unwrap_or_default();
                    new["data"][k] = json!(base64::engine::general_purpose::STANDARD.encode(s));
                }
            }
            if !new["type"].is_string() {
                new["type"] = json!("Opaque");
            }
            let mut causes = Vec::new();
            if let Some(m) = new["data"].as_object() {
                for (k, v) in m {
                    if !v.as_str().is_some_and(|s| {
                        base64::engine::general_purpose::STANDARD.decode(s).is_ok()
                    }) {
                        causes.push(Cause::type_invalid(
                            format!("data[{k}]"),
                            v,
                            "must be base64-encoded",
                        ));
                    }
                }
            }
            if let Some(old) = old
                && old["type"] != new["type"]
            {
                causes.push(Cause::invalid("type", &new["type"], "field is immutable"));
            }
            if !causes.is_empty() {
                return Err(invalid(causes));
            }
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            if c.sub == "status" {
                return Ok(());
            }
            let res = crate::resources::from_crd(new).map_err(invalid)?;
            if let Some(old) = old
                && (old["spec"]["group"] != new["spec"]["group"]
                    || old["spec"]["names"]["plural"] != new["spec"]["names"]["plural"])
            {
                return Err(invalid(vec![Cause::invalid(
                    "spec.group",
                    &new["spec"]["group"],
                    "field is immutable",
                )]));
            }
            if old.is_none() {
                let f = new["metadata"]["finalizers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let cleanup = json!("customresourcecleanup.apiextensions.k8s.io");
                if !f.contains(&cleanup) {
                    let mut f = f;
                    f.push(cleanup);
                    new["metadata"]["finalizers"] = Value::Array(f);
                }
            }
            let now = meta::now_rfc3339();
            let storage: Vec<Value> = new["spec"]["versions"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter(|v| v["storage"] == json!(true))
                        .map(|v| v["name"].clone())
                        .collect()
                })
                .unwrap_or_default();
            let mut stored = old
                .and_then(|o| o["status"]["storedVersions"].as_array().cloned())
                .unwrap_or_default();
            for s in storage {
                if !stored.contains(&s) {
                    stored.push(s);
                }
            }
            let since = old
                .and_then(|o| {
                    o["status"]["conditions"][0]["lastTransitionTime"]
                        .as_str()
                        .map(str::to_string)
                })
                .unwrap_or(now);
            let mut names = new["spec"]["names"].clone();
            names["singular"] = json!(res.singular);
            names["listKind"] = json!(res.list_kind);
            new["status"] = json!({
                "acceptedNames": names,
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": since},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": since}
                ],
                "storedVersions": stored,
            });
        }
        _ => {}
    }
    Ok(())
}
