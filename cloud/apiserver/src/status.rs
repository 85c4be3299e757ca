//! Errors as Kubernetes `Status` objects (`meta/v1`), with the reasons, codes and message shapes
//! a kube-apiserver uses, so `kubectl` prints them as it prints a real cluster's.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One cause of an `Invalid` error: a field path and what is wrong with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    /// `FieldValueRequired`, `FieldValueInvalid`, `FieldValueTypeInvalid`, ...
    pub reason: &'static str,
    /// The field path, `spec.properties[0].name`.
    pub field: String,
    /// What kubectl prints after the path: `Required value`, `Invalid value: "x": ...`.
    pub message: String,
}

impl Cause {
    pub fn required(field: impl Into<String>) -> Self {
        Self {
            reason: "FieldValueRequired",
            field: field.into(),
            message: "Required value".into(),
        }
    }

    pub fn invalid(field: impl Into<String>, value: &Value, detail: &str) -> Self {
        Self {
            reason: "FieldValueInvalid",
            field: field.into(),
            message: format!("Invalid value: {}: {detail}", shown(value)),
        }
    }

    pub fn type_invalid(field: impl Into<String>, value: &Value, detail: &str) -> Self {
        Self {
            reason: "FieldValueTypeInvalid",
            field: field.into(),
            message: format!("Invalid value: {}: {detail}", shown(value)),
        }
    }

    pub fn not_supported(field: impl Into<String>, value: &Value, allowed: &[Value]) -> Self {
        let allowed: Vec<String> = allowed.iter().map(shown).collect();
        Self {
            reason: "FieldValueNotSupported",
            field: field.into(),
            message: format!(
                "Unsupported value: {}: supported values: {}",
                shown(value),
                allowed.join(", ")
            ),
        }
    }

    pub fn forbidden(field: impl Into<String>, detail: &str) -> Self {
        Self {
            reason: "FieldValueForbidden",
            field: field.into(),
            message: format!("Forbidden: {detail}"),
        }
    }

    /// kube-apiserver's `field.TooMany` without a count (the count stops at the bound).
    pub fn too_many(field: impl Into<String>, max: usize, what: &str) -> Self {
        Self {
            reason: "FieldValueTooMany",
            field: field.into(),
            message: format!("Too many: must have at most {max} {what}"),
        }
    }

    pub fn unknown_field(field: impl Into<String>) -> Self {
        let field = field.into();
        Self {
            reason: "FieldValueInvalid",
            message: format!("unknown field \"{field}\""),
            field,
        }
    }

    /// `field: message`, as kubectl prints a cause.
    pub fn line(&self) -> String {
        if self.field.is_empty() {
            self.message.clone()
        } else {
            format!("{}: {}", self.field, self.message)
        }
    }
}

/// How a value is shown in a message: strings quoted, the rest as JSON (Go's `%#v`-like).
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Object(_) => "\"object\"".into(),
        Value::Array(_) => "\"array\"".into(),
        other => other.to_string(),
    }
}

/// A failed API request.
#[derive(Debug, Clone)]
pub struct Status {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
    /// Extra headers (e.g. `Retry-After`).
    pub retry_after: Option<u64>,
}

/// What a resource is called in messages: `devices.devices.kubeedge.io`, or `configmaps` for the
/// core group.
pub(crate) fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

impl Status {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let mut s = Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, plural)),
        );
        s.details = Some(json!({"name": name, "group": group, "kind": plural}));
        s
    }

    /// A path that names no resource.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let mut s = Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, plural)),
        );
        s.details = Some(json!({"name": name, "group": group, "kind": plural}));
        s
    }

    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        let mut s = Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, plural)
            ),
        );
        s.details = Some(json!({"name": name, "group": group, "kind": plural}));
        s
    }

    pub fn stale(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 with field causes: `Kind.group "name" is invalid: path: message`.
    pub fn invalid(kind: &str, group: &str, name: &str, causes: Vec<Cause>) -> Self {
        let what = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let lines: Vec<String> = causes.iter().map(Cause::line).collect();
        let message = if lines.len() == 1 {
            format!("{what} \"{name}\" is invalid: {}", lines[0])
        } else {
            format!("{what} \"{name}\" is invalid: [{}]", lines.join(", "))
        };
        let causes: Vec<Value> = causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
            .collect();
        let mut s = Self::new(422, "Invalid", message);
        s.details = Some(json!({"name": name, "group": group, "kind": kind, "causes": causes}));
        s
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    pub fn unsupported_media(ct: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml ({ct} is not)"
            ),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        let mut s = Self::new(503, "ServiceUnavailable", message);
        s.retry_after = Some(1);
        s
    }

    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for Status {}

impl IntoResponse for Status {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = self.to_json().to_string();
        let mut r = (code, body).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.code == 413 {
            // The rest of the body was not read: the connection cannot carry another request.
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let Some(s) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        r
    }
}

/// The success `Status` a delete of a whole object answers with in some cases.
pub(crate) fn success(details: Value) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}
