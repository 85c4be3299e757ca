//! Request bodies in (JSON, YAML, protobuf) and responses out, as a client of a version sees them.

use crate::resources::Resource;
use crate::status::Status;
use crate::store::Obj;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Value, json};

/// Decodes a request body by its content type.
/// How deep a YAML body may nest, counting each space of indentation as a level. JSON bodies
/// are held to 128 levels by serde_json as they are read; a YAML parser builds the whole tree of
/// events first, so a deep body is refused by [`check_yaml_depth`] before any parsing (100,000
/// nested `[` took 49 s of CPU to refuse).
const MAX_YAML_DEPTH: usize = 1000;

/// Refuses a YAML body that may nest deeper than [`MAX_YAML_DEPTH`], in one pass over its bytes:
/// per line, the indentation, the `- ` and `? ` block indicators that start it, and the open
/// `[` and `{` of flow collections (outside quotes and comments). It overestimates (an indented
/// line counts its every space), never underestimates.
pub(crate) fn check_yaml_depth(raw: &[u8]) -> Result<(), Status> {
    let mut flow = 0usize;
    let mut deepest = 0usize;
    for line in raw.split(|b| *b == b'\n') {
        let indent = line.iter().take_while(|b| **b == b' ').count();
        let mut rest = &line[indent..];
        let mut block = 0;
        while let [b'-' | b'?', b' ', tail @ ..] = rest {
            block += 1;
            rest = tail;
            while let [b' ', tail @ ..] = rest {
                rest = tail;
            }
        }
        let mut quote: Option<u8> = None;
        let mut escaped = false;
        let mut after_space = true;
        for &b in rest {
            match quote {
                Some(q) => {
                    if escaped {
                        escaped = false;
                    } else if b == b'\\' && q == b'"' {
                        escaped = true;
                    } else if b == q {
                        quote = None;
                    }
                }
                None => match b {
                    b'#' if after_space => break,
                    b'"' | b'\'' => quote = Some(b),
                    b'[' | b'{' => flow += 1,
                    b']' | b'}' => flow = flow.saturating_sub(1),
                    _ => {}
                },
            }
            after_space = b == b' ' || b == b'\t';
            deepest = deepest.max(indent + block + flow);
        }
        deepest = deepest.max(indent + block + flow);
        if deepest > MAX_YAML_DEPTH {
            return Err(Status::bad_request(format!(
                "the body of the request could not be decoded as YAML: it nests deeper than {MAX_YAML_DEPTH} levels (each space of indentation counted as one)"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod depth_tests {
    use super::*;

    #[test]
    fn deep_yaml_is_refused_before_it_is_parsed_and_usual_yaml_passes() {
        let flow = format!("a: {}1{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(check_yaml_depth(flow.as_bytes()).is_err());
        let block = format!("{}x", "- ".repeat(2_000));
        assert!(check_yaml_depth(block.as_bytes()).is_err());
        let indented: String = (0..1_100)
            .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
            .collect();
        assert!(check_yaml_depth(indented.as_bytes()).is_err());
        let quoted = format!(
            "a: \"{}\"\nb: '{}' # [[[[",
            "[".repeat(5_000),
            "{".repeat(5_000)
        );
        assert!(
            check_yaml_depth(quoted.as_bytes()).is_ok(),
            "brackets in strings and comments do not nest"
        );
        let usual = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  labels: {x: y}\ndata:\n  list: \"[1, 2]\"\n  more:\n  - - [1, [2, {a: b}]]\n";
        assert!(check_yaml_depth(usual.as_bytes()).is_ok());
    }
}

pub(crate) fn decode(ct: &str, raw: &[u8]) -> Result<Value, Status> {
    let base = ct.split(';').next().unwrap_or_default().trim();
    let v: Value = match base {
        "" | "application/json" | "*/*" => serde_json::from_slice(raw).map_err(|e| {
            Status::bad_request(format!(
                "the body of the request could not be decoded as JSON: {e}"
            ))
        })?,
        crate::proto::MEDIA => crate::proto::decode(raw).map_err(|e| match e {
            crate::proto::Refused::Garbage(m) => Status::bad_request(m),
            crate::proto::Refused::Kind(m) => {
                let mut s = Status::unsupported_media(crate::proto::MEDIA);
                s.message = m;
                s
            }
        })?,
        "application/yaml" | "application/x-yaml" | "text/yaml" => {
            check_yaml_depth(raw)?;
            serde_yaml_ng::from_slice(raw).map_err(|e| {
                Status::bad_request(format!(
                    "the body of the request could not be decoded as YAML: {e}"
                ))
            })?
        }
        other => return Err(Status::unsupported_media(other)),
    };
    if !v.is_object() {
        return Err(Status::bad_request(
            "the body of the request must be an object",
        ));
    }
    Ok(v)
}

/// Refuses a body of another group or kind than the URL's.
pub(super) fn check_type(body: &Value, res: &Resource, version: &str) -> Result<(), Status> {
    let want = res.api_version(version);
    match body.get("apiVersion").and_then(Value::as_str) {
        Some(v) if v == want => {}
        Some(v)
            if res
                .version(v.rsplit('/').next().unwrap_or_default())
                .is_some()
                && v.rsplit_once('/').map(|(g, _)| g).unwrap_or("") == res.group => {}
        Some(v) => {
            return Err(Status::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({want})"
            )));
        }
        None => {}
    }
    match body.get("kind").and_then(Value::as_str) {
        Some(k) if k == res.kind => Ok(()),
        Some(k) => Err(Status::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            res.kind
        ))),
        None => Ok(()),
    }
}

/// Field selector paths a resource supports.
pub(super) fn allowed_fields(res: &Resource, version: &str) -> Vec<String> {
    let mut out = vec!["metadata.name".to_string()];
    if res.namespaced {
        out.push("metadata.namespace".into());
    }
    match res.kind.as_str() {
        "Secret" => out.push("type".into()),
        "Namespace" => out.push("status.phase".into()),
        "Node" => out.push("spec.unschedulable".into()),
        "Pod" => {
            for f in [
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.serviceAccountName",
                "status.phase",
                "status.podIP",
            ] {
                out.push(f.into());
            }
        }
        "Event" => {
            for f in [
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ] {
                out.push(f.into());
            }
        }
        _ => {}
    }
    let _ = version;
    out
}

/// An object as a client sees it at `version`.
pub(super) fn outward(mut v: Value, res: &Resource, version: &str) -> Value {
    if let Some(m) = v.as_object_mut() {
        m.insert("apiVersion".into(), json!(res.api_version(version)));
        m.insert("kind".into(), json!(res.kind));
    }
    v
}

pub(super) fn put_object(
    out: &mut BytesMut,
    o: &Obj,
    res: &Resource,
    version: &str,
    api_version: &str,
) {
    if o.api_version == api_version {
        out.put_slice(&o.json());
    } else {
        let v = outward(o.value(), res, version);
        out.put_slice(&serde_json::to_vec(&v).unwrap_or_default());
    }
}

pub(crate) fn json_response(code: StatusCode, v: &Value) -> Response {
    raw_json(code, Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
}

pub(super) fn raw_json(code: StatusCode, b: Bytes) -> Response {
    let mut r = (code, b).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

pub(super) fn typed(v: Value, media: &'static str) -> Response {
    typed_bytes(
        Bytes::from(serde_json::to_vec(&v).unwrap_or_default()),
        media,
    )
}

fn typed_bytes(b: Bytes, media: &'static str) -> Response {
    let mut r = raw_json(StatusCode::OK, b);
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(media));
    r.headers_mut()
        .insert(header::VARY, HeaderValue::from_static("Accept"));
    r
}

/// A Table's JSON text (`table::table`) as the response.
pub(super) fn typed_table(json: Vec<u8>) -> Response {
    typed_bytes(
        Bytes::from(json),
        "application/json;as=Table;v=v1;g=meta.k8s.io",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_yaml_bodies_decode_to_the_same_object() {
        let json = decode(
            "application/json; charset=utf-8",
            br#"{"kind":"ConfigMap"}"#,
        );
        let yaml = decode("application/yaml", b"kind: ConfigMap\n");
        assert_eq!(json.ok(), Some(json!({"kind": "ConfigMap"})));
        assert_eq!(yaml.ok(), Some(json!({"kind": "ConfigMap"})));
    }

    #[test]
    fn a_body_that_is_not_an_object_or_of_an_unknown_type_is_refused_with_why() {
        let e = decode("application/json", b"[1]").expect_err("an array");
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "the body of the request must be an object")
        );
        let e = decode("application/json", b"{").expect_err("truncated");
        assert!(
            e.message.contains("could not be decoded as JSON"),
            "{}",
            e.message
        );
        let e = decode("text/plain", b"x").expect_err("unknown type");
        assert_eq!(e.code, 415);
    }
}
