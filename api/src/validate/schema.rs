//! A structural check of a JSON object against a CRD's `openAPIV3Schema`, with the semantics of the
//! Kubernetes API server under strict field validation (`kubectl apply --validate=strict`): wrong
//! types, values outside an `enum`, missing required fields and unknown fields are reported, each
//! with its path. It checks the subset of OpenAPI v3 that structural CRD schemas use.

use super::{Problem, Severity};
use serde_json::{Map, Value};

/// Spellings the typed layer accepts besides the CRD's own (Go's case-blind JSON decoding lets
/// KubeEdge's edge read them); Kubernetes itself would drop them.
const ACCEPTED_ALIASES: &[(&str, &str)] = &[
    ("hostname", "hostName"),
    ("requestpath", "requestPath"),
    ("tdengine", "TDEngine"),
    ("tdEngine", "TDEngine"),
    ("tdEngineClientConfig", "TDEngineClientConfig"),
    ("tdengineClientConfig", "TDEngineClientConfig"),
    ("dbname", "dbName"),
    ("endpointUrl", "endpointURL"),
    ("endpointurl", "endpointURL"),
];

/// Checks `value` against `schema`, appending every problem found under `path` to `out`.
pub fn check(value: &Value, schema: &Value, path: &str, out: &mut Vec<Problem>) {
    check_at(value, schema, &mut path.to_string(), out);
}

/// [`check`] with the path in one buffer, each level's segment pushed and taken off again: a
/// path is copied only into a problem (a start checks every field of every document).
fn check_at(value: &Value, schema: &Value, path: &mut String, out: &mut Vec<Problem>) {
    let Some(schema) = schema.as_object() else {
        return;
    };
    if value.is_null() {
        if schema.get("nullable") != Some(&Value::Bool(true)) {
            out.push(Problem::error(path.as_str(), "null is not allowed here"));
        }
        return;
    }
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => check_object(value, schema, path, preserve, out),
        Some("array") => {
            let Some(items) = value.as_array() else {
                out.push(type_error(path, "an array", value));
                return;
            };
            if let Some(item_schema) = schema.get("items") {
                let len = path.len();
                for (i, item) in items.iter().enumerate() {
                    use std::fmt::Write;
                    let _ = write!(path, "[{i}]");
                    check_at(item, item_schema, path, out);
                    path.truncate(len);
                }
            }
        }
        Some("string") if !value.is_string() => out.push(type_error(path, "a string", value)),
        Some("boolean") if !value.is_boolean() => {
            out.push(type_error(path, "a boolean (true or false)", value))
        }
        Some("integer") => check_integer(value, schema, path, out),
        Some("number") if !value.is_number() => out.push(type_error(path, "a number", value)),
        _ => {}
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        out.push(Problem::error(
            path.as_str(),
            format!("{value} is not one of {}", list.join(", ")),
        ));
    }
}

/// Removes from `value` what [`check`] would report (unknown fields, values of the wrong type or
/// outside an enum), so that the rest can still be read and checked for its other problems.
/// Returns false when `value` itself must go.
pub fn prune(value: &mut Value, schema: &Value) -> bool {
    let Some(schema) = schema.as_object() else {
        return true;
    };
    if value.is_null() {
        return schema.get("nullable") == Some(&Value::Bool(true));
    }
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    let fits = match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let Some(object) = value.as_object_mut() else {
                return false;
            };
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            object.retain(|key, child| {
                if let Some(child_schema) = properties.and_then(|p| p.get(key)) {
                    prune(child, child_schema)
                } else if let Some(a) = additional.filter(|a| a.is_object()) {
                    prune(child, a)
                } else {
                    preserve || additional == Some(&Value::Bool(true))
                }
            });
            true
        }
        Some("array") => {
            let Some(items) = value.as_array_mut() else {
                return false;
            };
            if let Some(item_schema) = schema.get("items") {
                items.retain_mut(|item| prune(item, item_schema));
            }
            true
        }
        Some("string") => value.is_string(),
        Some("boolean") => value.is_boolean(),
        Some("integer") => value.as_i64().is_some(),
        Some("number") => value.is_number(),
        _ => true,
    };
    fits && schema
        .get("enum")
        .and_then(Value::as_array)
        .is_none_or(|allowed| allowed.contains(value))
}

fn check_integer(value: &Value, schema: &Map<String, Value>, path: &str, out: &mut Vec<Problem>) {
    let Some(n) = value.as_i64() else {
        let what = if value.as_u64().is_some() {
            "an integer within int64".to_string()
        } else {
            "an integer".to_string()
        };
        out.push(type_error(path, &what, value));
        return;
    };
    if schema.get("format").and_then(Value::as_str) == Some("int32") && i32::try_from(n).is_err() {
        out.push(Problem::error(path, format!("{n} does not fit in int32")));
    }
}

fn check_object(
    value: &Value,
    schema: &Map<String, Value>,
    path: &mut String,
    preserve: bool,
    out: &mut Vec<Problem>,
) {
    let Some(object) = value.as_object() else {
        out.push(type_error(path, "an object", value));
        return;
    };
    let properties = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties");
    let len = path.len();
    let top = path.is_empty();
    for (key, child) in object {
        if !top {
            path.push('.');
        }
        path.push_str(key);
        if top && key == "metadata" {
            // The API server checks `metadata` itself (ObjectMeta), whatever the CRD schema says;
            // the typed parse and the name checks cover it here.
            if !child.is_object() {
                out.push(type_error(path, "an object", child));
            }
        } else if let Some(child_schema) = properties.and_then(|p| p.get(key)) {
            check_at(child, child_schema, path, out);
        } else if let Some(additional) = additional.filter(|a| a.is_object()) {
            check_at(child, additional, path, out);
        } else if preserve || additional == Some(&Value::Bool(true)) {
            // Free-form: anything goes.
        } else {
            out.push(unknown_field(key, path, properties));
        }
        path.truncate(len);
    }
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if !object.contains_key(name) {
                out.push(Problem::error(
                    join(path, name),
                    "required field is missing",
                ));
            }
        }
    }
}

fn unknown_field(key: &str, path: &str, known: Option<&Map<String, Value>>) -> Problem {
    if let Some((_, canonical)) = ACCEPTED_ALIASES.iter().find(|(alias, _)| *alias == key)
        && known.is_some_and(|k| k.contains_key(*canonical))
    {
        return Problem {
            severity: Severity::Warning,
            path: path.to_string(),
            message: format!(
                "{key:?} is accepted at the edge as {canonical:?}, but Kubernetes only knows \
                 {canonical:?} and would drop {key:?}"
            ),
        };
    }
    let hint = known
        .and_then(|k| k.keys().find(|name| name.eq_ignore_ascii_case(key)))
        .map(|name| format!(" (did you mean {name:?}?)"))
        .unwrap_or_default();
    Problem::error(path, format!("unknown field {key:?}{hint}"))
}

fn type_error(path: &str, expected: &str, value: &Value) -> Problem {
    let got = match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
    };
    Problem::error(path, format!("expected {expected}, got {got}"))
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn problems(value: Value, schema: Value) -> Vec<String> {
        let mut out = Vec::new();
        check(&value, &schema, "spec", &mut out);
        out.into_iter()
            .map(|p| format!("{}: {}", p.path, p.message))
            .collect()
    }

    #[test]
    fn reports_unknown_fields_with_a_case_hint() {
        let schema = json!({"type": "object", "properties": {"collectCycle": {"type": "integer"}}});
        assert_eq!(
            problems(json!({"collectcycle": 1}), schema),
            vec![
                r#"spec.collectcycle: unknown field "collectcycle" (did you mean "collectCycle"?)"#
            ]
        );
    }

    #[test]
    fn free_form_objects_accept_anything() {
        let schema = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
        assert!(problems(json!({"a": {"b": [1, null]}}), schema).is_empty());
    }

    #[test]
    fn reports_types_enums_required_and_int32_range() {
        let schema = json!({
            "type": "object",
            "required": ["value"],
            "properties": {
                "qos": {"type": "integer", "format": "int32"},
                "mode": {"type": "string", "enum": ["ReadWrite", "ReadOnly"]},
                "list": {"type": "array", "items": {"type": "string"}}
            }
        });
        let got = problems(
            json!({"qos": 5_000_000_000_i64, "mode": "RW", "list": ["a", 2]}),
            schema,
        );
        assert_eq!(
            got,
            vec![
                "spec.list[1]: expected a string, got number 2",
                r#"spec.mode: "RW" is not one of "ReadWrite", "ReadOnly""#,
                "spec.qos: 5000000000 does not fit in int32",
                "spec.value: required field is missing",
            ]
        );
    }

    #[test]
    fn prune_keeps_what_is_valid() {
        let schema = json!({"type": "object", "properties": {
            "a": {"type": "integer"},
            "l": {"type": "array", "items": {"type": "string"}},
            "m": {"type": "string", "enum": ["x"]}
        }});
        let mut v = json!({"a": "1", "l": ["s", 2], "m": "y", "zzz": 1});
        assert!(prune(&mut v, &schema));
        assert_eq!(v, json!({"l": ["s"]}));
        let mut ok = json!({"a": 1, "l": ["s"], "m": "x"});
        let before = ok.clone();
        prune(&mut ok, &schema);
        assert_eq!(ok, before);
    }

    #[test]
    fn an_accepted_alias_is_a_warning_not_an_error() {
        let schema = json!({"type": "object", "properties": {"hostName": {"type": "string"}}});
        let mut out = Vec::new();
        check(&json!({"hostname": "h"}), &schema, "http", &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].severity, Severity::Warning);
    }
}
