//! CRD structural schemas, applied as a kube-apiserver applies them to custom resources: nulls
//! in non-nullable fields dropped, unknown fields pruned (unless
//! `x-kubernetes-preserve-unknown-fields`), defaults filled in, then types, enums, formats,
//! bounds and required fields checked. Written here rather than on a JSON Schema crate because
//! these steps (pruning, defaulting, `x-kubernetes-*`) and the error texts kubectl prints are
//! Kubernetes' own.

use crate::status::Cause;
use serde_json::{Map, Value, json};

const TYPES: &[&str] = &["object", "array", "string", "integer", "number", "boolean"];

/// The deepest schema a CRD may declare, in schema levels (`properties`, `items` and
/// `additionalProperties` each add one). A schema level is two JSON levels, so the decoders'
/// own 128 levels (JSON and YAML) come first; this bound holds whatever the decoder.
pub(crate) const MAX_SCHEMA_DEPTH: usize = 64;
/// The most schema nodes one version's schema may hold. The largest CRDs in common use (the
/// Prometheus operator's) have a few thousand; a 3 MiB body holds at most ~150,000.
pub(crate) const MAX_SCHEMA_NODES: usize = 50_000;
/// How large one `pattern` may compile to: a pattern is compiled once per schema and kept, but
/// a hostile one must not cost seconds or megabytes.
const MAX_PATTERN_BYTES: usize = 1 << 20;
/// How many compiled patterns are kept; the cache starts over when full.
const MAX_PATTERNS: usize = 1024;

/// Measures a schema without recursing: `Err` names the first bound it exceeds.
pub(crate) fn check_size(s: &Value, path: &str) -> Result<(), Cause> {
    let mut stack = vec![(s, 1usize)];
    let mut nodes = 0usize;
    while let Some((n, depth)) = stack.pop() {
        nodes += 1;
        if nodes > MAX_SCHEMA_NODES {
            return Err(Cause::too_many(path, MAX_SCHEMA_NODES, "schema nodes"));
        }
        if depth > MAX_SCHEMA_DEPTH {
            return Err(Cause::too_many(path, MAX_SCHEMA_DEPTH, "levels of nesting"));
        }
        let Some(m) = n.as_object() else { continue };
        if let Some(p) = m.get("properties").and_then(Value::as_object) {
            stack.extend(p.values().map(|v| (v, depth + 1)));
        }
        for k in ["items", "additionalProperties"] {
            if let Some(v) = m.get(k).filter(|v| v.is_object()) {
                stack.push((v, depth + 1));
            }
        }
    }
    Ok(())
}

/// Compiles `p` once and keeps it: a custom resource with 10,000 strings under one pattern must
/// not compile it 10,000 times.
fn pattern(p: &str) -> Result<std::sync::Arc<regex::Regex>, regex::Error> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<regex::Regex>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(re) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(p) {
        return Ok(re.clone());
    }
    let re = Arc::new(
        regex::RegexBuilder::new(p)
            .size_limit(MAX_PATTERN_BYTES)
            .build()?,
    );
    let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
    if c.len() >= MAX_PATTERNS {
        c.clear();
    }
    c.insert(p.to_string(), re.clone());
    Ok(re)
}

/// What applying a schema found.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub causes: Vec<Cause>,
    /// Paths of pruned unknown fields (`spec.foo`).
    pub unknown: Vec<String>,
}

fn flag(s: &Value, k: &str) -> bool {
    s.get(k).and_then(Value::as_bool) == Some(true)
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Checks that a CRD schema is structural: every node has a known type (unless it is
/// int-or-string or preserves unknown fields), `properties` and `additionalProperties` are not
/// both set, the root is an object.
pub(crate) fn check_structural(s: &Value, path: &str, root: bool) -> Vec<Cause> {
    let mut causes = Vec::new();
    let Some(m) = s.as_object() else {
        causes.push(Cause::type_invalid(path, s, "must be an object"));
        return causes;
    };
    let ty = m.get("type").and_then(Value::as_str);
    match ty {
        Some(t) if TYPES.contains(&t) => {
            if root && t != "object" {
                causes.push(Cause::invalid(
                    format!("{path}.type"),
                    &json!(t),
                    "must be object at the root",
                ));
            }
        }
        Some(t) => causes.push(Cause::not_supported(
            format!("{path}.type"),
            &json!(t),
            &TYPES.iter().map(|t| json!(t)).collect::<Vec<_>>(),
        )),
        None => {
            if !flag(s, "x-kubernetes-int-or-string")
                && !flag(s, "x-kubernetes-preserve-unknown-fields")
                && !root
            {
                causes.push(Cause {
                    reason: "FieldValueRequired",
                    field: format!("{path}.type"),
                    message: "Required value: must not be empty for specified object fields".into(),
                });
            }
        }
    }
    if let Some(v) = m.get("type")
        && !v.is_string()
    {
        causes.push(Cause::type_invalid(
            format!("{path}.type"),
            v,
            "must be a string",
        ));
    }
    if m.contains_key("properties")
        && m.get("additionalProperties")
            .is_some_and(|a| a.is_object() || a == &json!(true))
    {
        causes.push(Cause::forbidden(
            format!("{path}.additionalProperties"),
            "additionalProperties and properties are mutual exclusive",
        ));
    }
    if let Some(props) = m.get("properties") {
        match props.as_object() {
            Some(p) => {
                for (k, v) in p {
                    causes.extend(check_structural(
                        v,
                        &format!("{path}.properties[{k}]"),
                        false,
                    ));
                }
            }
            None => causes.push(Cause::type_invalid(
                format!("{path}.properties"),
                props,
                "must be an object",
            )),
        }
    }
    if let Some(items) = m.get("items") {
        causes.extend(check_structural(items, &format!("{path}.items"), false));
    } else if ty == Some("array") {
        causes.push(Cause::required(format!("{path}.items")));
    }
    if let Some(a) = m.get("additionalProperties")
        && a.is_object()
    {
        causes.extend(check_structural(
            a,
            &format!("{path}.additionalProperties"),
            false,
        ));
    }
    if let Some(r) = m.get("required")
        && !r.as_array().is_some_and(|a| a.iter().all(Value::is_string))
    {
        causes.push(Cause::type_invalid(
            format!("{path}.required"),
            r,
            "must be a list of strings",
        ));
    }
    if let Some(e) = m.get("enum")
        && !e.is_array()
    {
        causes.push(Cause::type_invalid(
            format!("{path}.enum"),
            e,
            "must be a list",
        ));
    }
    if let Some(p) = m.get("pattern").and_then(Value::as_str)
        && let Err(e) = pattern(p)
    {
        let why = match e {
            regex::Error::CompiledTooBig(_) => {
                format!("must compile to at most {MAX_PATTERN_BYTES} bytes")
            }
            _ => "must be a valid regular expression".into(),
        };
        causes.push(Cause::invalid(format!("{path}.pattern"), &json!(p), &why));
    }
    causes
}

/// Prunes, defaults and validates `obj` (a whole custom resource) against `schema`.
pub(crate) fn apply(obj: &mut Value, schema: &Value) -> Findings {
    let mut f = Findings::default();
    walk(obj, schema, "", &mut f, true);
    f
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_ok(v: &Value, ty: &str) -> bool {
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        _ => true,
    }
}

fn walk(v: &mut Value, s: &Value, path: &str, f: &mut Findings, root: bool) {
    let ty = s.get("type").and_then(Value::as_str);
    if flag(s, "x-kubernetes-int-or-string") {
        if !(v.is_i64() || v.is_u64() || v.is_string()) {
            f.causes.push(Cause::type_invalid(
                path,
                &json!(type_name(v)),
                &format!(
                    "{path} in body must be of type integer-or-string: {:?}",
                    type_name(v)
                ),
            ));
        }
        return;
    }
    if let Some(t) = ty
        && !type_ok(v, t)
    {
        f.causes.push(Cause::type_invalid(
            path,
            &json!(type_name(v)),
            &format!("{path} in body must be of type {t}: {:?}", type_name(v)),
        ));
        return;
    }
    if let Some(allowed) = s.get("enum").and_then(Value::as_array)
        && !allowed.contains(v)
    {
        f.causes.push(Cause::not_supported(path, v, allowed));
    }
    match v {
        Value::Object(m) => walk_object(m, s, path, f, root),
        Value::Array(a) => {
            if let Some(n) = s.get("maxItems").and_then(Value::as_u64)
                && a.len() as u64 > n
            {
                f.causes.push(Cause {
                    reason: "FieldValueTooMany",
                    field: path.into(),
                    message: format!("Too many: {}: must have at most {n} items", a.len()),
                });
            }
            if let Some(n) = s.get("minItems").and_then(Value::as_u64)
                && (a.len() as u64) < n
            {
                f.causes.push(Cause::invalid(
                    path,
                    &json!(a.len()),
                    &format!("{path} in body should have at least {n} items"),
                ));
            }
            if let Some(items) = s.get("items") {
                for (i, x) in a.iter_mut().enumerate() {
                    if x.is_null() && !flag(items, "nullable") {
                        continue;
                    }
                    walk(x, items, &format!("{path}[{i}]"), f, false);
                }
            }
        }
        Value::String(st) => check_string(st, s, path, f),
        Value::Number(_) => check_number(v, s, path, f),
        _ => {}
    }
}

fn walk_object(m: &mut Map<String, Value>, s: &Value, path: &str, f: &mut Findings, root: bool) {
    let props = s.get("properties").and_then(Value::as_object);
    let extra = s.get("additionalProperties");
    let preserve = flag(s, "x-kubernetes-preserve-unknown-fields");
    let empty = Map::new();
    // Nulls in fields that are not nullable are dropped before defaulting, as Kubernetes does.
    let keys: Vec<String> = m.keys().cloned().collect();
    for k in keys {
        if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        let child = props
            .and_then(|p| p.get(&k))
            .or_else(|| extra.filter(|a| a.is_object()));
        match child {
            Some(cs) => {
                if m.get(&k).is_some_and(Value::is_null) && !flag(cs, "nullable") {
                    m.remove(&k);
                }
            }
            None => {
                if !preserve && extra != Some(&json!(true)) {
                    f.unknown.push(join(path, &k));
                    m.remove(&k);
                }
            }
        }
    }
    for (k, cs) in props.unwrap_or(&empty) {
        if !m.contains_key(k)
            && let Some(d) = cs.get("default")
        {
            m.insert(k.clone(), d.clone());
        }
    }
    if let Some(req) = s.get("required").and_then(Value::as_array) {
        for r in req.iter().filter_map(Value::as_str) {
            if !m.contains_key(r) {
                f.causes.push(Cause::required(join(path, r)));
            }
        }
    }
    if let Some(n) = s.get("maxProperties").and_then(Value::as_u64)
        && m.len() as u64 > n
    {
        f.causes.push(Cause {
            reason: "FieldValueTooMany",
            field: path.into(),
            message: format!("Too many: {}: must have at most {n} items", m.len()),
        });
    }
    for (k, x) in m.iter_mut() {
        if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        let child = props
            .and_then(|p| p.get(k))
            .or_else(|| extra.filter(|a| a.is_object()));
        if let Some(cs) = child {
            if x.is_null() {
                continue;
            }
            walk(x, cs, &join(path, k), f, false);
        }
    }
}

fn check_string(st: &str, s: &Value, path: &str, f: &mut Findings) {
    let n = st.chars().count() as u64;
    if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
        && n > max
    {
        f.causes.push(Cause {
            reason: "FieldValueTooLong",
            field: path.into(),
            message: format!("Too long: may not be more than {max} bytes"),
        });
    }
    if let Some(min) = s.get("minLength").and_then(Value::as_u64)
        && n < min
    {
        f.causes.push(Cause::invalid(
            path,
            &json!(st),
            &format!("{path} in body should be at least {min} chars long"),
        ));
    }
    if let Some(p) = s.get("pattern").and_then(Value::as_str)
        && let Ok(re) = pattern(p)
        && !re.is_match(st)
    {
        f.causes.push(Cause::invalid(
            path,
            &json!(st),
            &format!("{path} in body should match '{p}'"),
        ));
    }
    let bad = match s.get("format").and_then(Value::as_str) {
        Some("date-time") => {
            time::OffsetDateTime::parse(st, &time::format_description::well_known::Rfc3339).is_err()
        }
        Some("date") => {
            let b = st.as_bytes();
            !(b.len() == 10 && b[4] == b'-' && b[7] == b'-')
        }
        Some("uuid") => uuid::Uuid::parse_str(st).is_err(),
        Some("byte") => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD
                .decode(st)
                .is_err()
        }
        _ => false,
    };
    if bad {
        let fmt = s["format"].as_str().unwrap_or_default();
        f.causes.push(Cause::invalid(
            path,
            &json!(st),
            &format!("{path} in body must be of type {fmt}: {st:?}"),
        ));
    }
}

fn check_number(v: &Value, s: &Value, path: &str, f: &mut Findings) {
    let Some(x) = v.as_f64() else { return };
    if let Some(max) = s.get("maximum").and_then(Value::as_f64) {
        let excl = flag(s, "exclusiveMaximum");
        if x > max || (excl && x >= max) {
            f.causes.push(Cause::invalid(
                path,
                v,
                &format!(
                    "{path} in body should be less than {}{max}",
                    if excl { "" } else { "or equal to " }
                ),
            ));
        }
    }
    if let Some(min) = s.get("minimum").and_then(Value::as_f64) {
        let excl = flag(s, "exclusiveMinimum");
        if x < min || (excl && x <= min) {
            f.causes.push(Cause::invalid(
                path,
                v,
                &format!(
                    "{path} in body should be greater than {}{min}",
                    if excl { "" } else { "or equal to " }
                ),
            ));
        }
    }
    if s.get("format").and_then(Value::as_str) == Some("int32")
        && v.as_i64()
            .is_none_or(|i| i < i64::from(i32::MIN) || i > i64::from(i32::MAX))
        && (v.is_i64() || v.is_u64())
    {
        f.causes.push(Cause::invalid(
            path,
            v,
            &format!("{path} in body must be of type int32"),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
        "spec": {"type": "object", "required": ["model"], "properties": {
            "model": {"type": "string"},
            "replicas": {"type": "integer", "format": "int32", "default": 1, "minimum": 0},
            "mode": {"type": "string", "enum": ["a", "b"]},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "port": {"x-kubernetes-int-or-string": true},
            "list": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "string"}}}}
        }}}})
    }

    #[test]
    fn prunes_defaults_and_keeps_preserved() {
        let mut o = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"},
            "spec": {"model": "m", "junk": 1, "free": {"any": {"thing": 1}},
                     "list": [{"n": "x", "gone": true}], "mode": null}});
        let f = apply(&mut o, &schema());
        assert!(f.causes.is_empty(), "{:?}", f.causes);
        assert_eq!(f.unknown, ["spec.junk", "spec.list[0].gone"]);
        assert_eq!(o["spec"]["replicas"], 1);
        assert_eq!(o["spec"]["free"]["any"]["thing"], 1);
        assert!(o["spec"].get("mode").is_none());
        assert_eq!(o["metadata"]["name"], "a");
    }

    #[test]
    fn names_each_wrong_field() {
        let mut o = json!({"spec": {"replicas": "three", "mode": "c", "port": true}});
        let f = apply(&mut o, &schema());
        let lines: Vec<String> = f.causes.iter().map(Cause::line).collect();
        assert!(
            lines.contains(&"spec.model: Required value".to_string()),
            "{lines:?}"
        );
        assert!(lines.iter().any(|l| l.starts_with("spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer")), "{lines:?}");
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("spec.mode: Unsupported value: \"c\"")),
            "{lines:?}"
        );
        assert!(
            lines.iter().any(|l| l.starts_with("spec.port:")),
            "{lines:?}"
        );
    }

    #[test]
    fn structural_check_finds_typeless_nodes() {
        let bad = json!({"type": "object", "properties": {"spec": {"properties": {}}}});
        assert_eq!(check_structural(&bad, "s", true).len(), 1);
        assert!(check_structural(&schema(), "s", true).is_empty());
    }

    fn nested(levels: usize) -> Value {
        let mut s = json!({"type": "string"});
        for _ in 1..levels {
            s = json!({"type": "object", "properties": {"a": s}});
        }
        s
    }

    #[test]
    fn schemas_are_bounded_in_depth_and_size() {
        assert!(check_size(&nested(MAX_SCHEMA_DEPTH), "s").is_ok());
        let deep = check_size(&nested(MAX_SCHEMA_DEPTH + 1), "s").expect_err("too deep");
        assert_eq!(deep.reason, "FieldValueTooMany");
        assert!(deep.message.contains("64 levels"), "{}", deep.message);
        let wide: Map<String, Value> = (0..MAX_SCHEMA_NODES)
            .map(|i| (format!("p{i}"), json!({"type": "string"})))
            .collect();
        let wide = json!({"type": "object", "properties": wide});
        let e = check_size(&wide, "s").expect_err("too many nodes");
        assert!(e.message.contains("schema nodes"), "{}", e.message);
        // Arrays of maps count their levels too.
        let mut s = json!({"type": "string"});
        for _ in 0..MAX_SCHEMA_DEPTH {
            s = json!({"type": "array", "items": {"type": "object", "additionalProperties": s}});
        }
        assert!(check_size(&s, "s").is_err());
    }

    #[test]
    fn a_pattern_that_compiles_too_large_is_named() {
        let huge = json!({"type": "object", "properties": {
            "a": {"type": "string", "pattern": "\\w{2000}\\w{2000}"}}});
        let c = check_structural(&huge, "s", true);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].field, "s.properties[a].pattern");
        assert!(
            c[0].message.contains("must compile to at most"),
            "{}",
            c[0].message
        );
        // A valid pattern is compiled once and matched from the cache.
        let s = json!({"type": "object", "properties": {
            "a": {"type": "array", "items": {"type": "string", "pattern": "^x[0-9]+$"}}}});
        let mut obj = json!({"a": ["x1", "x2", "y"]});
        let f = apply(&mut obj, &s);
        assert_eq!(f.causes.len(), 1, "{:?}", f.causes);
        assert_eq!(f.causes[0].field, "a[2]");
    }
}
