//! The mapper's REST API (mapper-framework's paths, with writes as POST) and `/metrics`.
//!
//! | method and path | |
//! |---|---|
//! | `GET /api/v1/ping` | liveness |
//! | `GET /api/v1/devices` | every device with its state and last values |
//! | `GET /api/v1/device/{ns}/{name}` | one device |
//! | `GET /api/v1/device/{ns}/{name}/{property}` | a live read of one property |
//! | `GET /api/v1/devicemethod/{ns}/{name}` | the device's methods and the properties they write |
//! | `POST /api/v1/devicemethod/{ns}/{name}/{method}/{property}` | body `{"value": "..."}` (or the bare value): writes the property, which the method must list, and answers with the value read back |
//! | `GET /metrics` | Prometheus text |
//!
//! A request's `X-Correlation-ID` header is echoed back.
//!
//! Who may call it: with `common.http_token_file`, every request but ping carries
//! `Authorization: Bearer TOKEN` (401 otherwise); without one, only requests whose `Host` is an
//! IP address, `localhost`, this host's name or one of `common.http_hosts` are answered (403),
//! so a web page cannot reach it by a name of its own (DNS rebinding). A write is taken only
//! as `Content-Type: application/json` (415), which a browser never sends cross-site without
//! asking first (and this API answers no such question), and never from a page of another
//! origin (403): a form or a `text/plain` POST from any page the operator opens moves nothing.

use crate::clock::now_ms;
use crate::device::Command;
use crate::mapper::Devices;
use crate::metrics::Metrics;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};
use std::sync::Arc;

#[derive(Clone)]
pub struct RestState {
    pub devices: Devices,
    pub metrics: Arc<Metrics>,
    pub protocol: String,
    /// The token every request but ping must carry (`common.http_token_file`), if any.
    pub token: Option<Arc<str>>,
    /// Without a token: the `Host` names answered besides IP addresses and `localhost`.
    pub hosts: Arc<[String]>,
}

fn error(code: StatusCode, message: impl Into<String>) -> Response {
    (
        code,
        Json(json!({"apiVersion": "v1", "statusCode": code.as_u16(), "error": message.into()})),
    )
        .into_response()
}

fn ok(data: Value) -> Response {
    Json(json!({"apiVersion": "v1", "statusCode": 200, "timeStamp": now_ms(), "data": data}))
        .into_response()
}

pub fn router(state: RestState) -> Router {
    Router::new()
        .route("/api/v1/ping", get(ping))
        .route("/api/v1/devices", get(list))
        .route("/api/v1/device/{ns}/{name}", get(device))
        .route("/api/v1/device/{ns}/{name}/{property}", get(read))
        .route("/api/v1/devicemethod/{ns}/{name}", get(methods))
        .route(
            "/api/v1/devicemethod/{ns}/{name}/{method}/{property}",
            axum::routing::post(call),
        )
        .route("/metrics", get(metrics))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .layer(axum::middleware::from_fn(correlation))
        .with_state(state)
}

/// Who may call: the token, or without one a `Host` this API serves; a write only as JSON and
/// never from another origin's page (the module's header says why).
async fn guard(State(s): State<RestState>, req: Request, next: Next) -> Response {
    use axum::http::{Method, header};
    let headers = req.headers();
    let host = rt::host::of_request(&req);
    match &s.token {
        Some(token) if req.uri().path() != "/api/v1/ping" => {
            let given = rt::secret::bearer(headers.get(header::AUTHORIZATION));
            if !rt::secret::same(given.as_bytes(), token.as_bytes()) {
                return error(
                    StatusCode::UNAUTHORIZED,
                    "this API requires its token: Authorization: Bearer TOKEN (common.http_token_file)",
                );
            }
        }
        Some(_) => {}
        None if !rt::host::served(host, &s.hosts) => {
            return error(
                StatusCode::FORBIDDEN,
                format!(
                    "the Host {host:?} is not one this API answers without a token (IP addresses, localhost, this host name, common.http_hosts): add it to common.http_hosts, or set common.http_token_file"
                ),
            );
        }
        None => {}
    }
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("(not text)");
            if !rt::host::same_origin(origin, host) {
                return error(
                    StatusCode::FORBIDDEN,
                    format!(
                        "a write from the page {origin:?} is refused: only this API's own origin may change a device"
                    ),
                );
            }
        }
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "a write is taken only as Content-Type: application/json",
            );
        }
    }
    next.run(req).await
}

async fn correlation(req: Request, next: Next) -> Response {
    let id: Option<HeaderValue> = req.headers().get("x-correlation-id").cloned();
    let mut resp = next.run(req).await;
    if let Some(id) = id {
        resp.headers_mut().insert("x-correlation-id", id);
    }
    resp
}

async fn ping() -> Response {
    ok(json!("the mapper is running"))
}

async fn metrics(State(s): State<RestState>) -> Response {
    (
        [("content-type", rt::metrics::CONTENT_TYPE)],
        s.metrics.render(&s.protocol),
    )
        .into_response()
}

fn view(k: &str, h: &crate::mapper::DeviceHandle) -> Value {
    let snapshot = h.snapshot.lock().map(|s| s.clone()).unwrap_or_default();
    json!({"device": k, "model": h.model, "state": snapshot.state, "error": snapshot.error, "properties": snapshot.properties})
}

async fn list(State(s): State<RestState>) -> Response {
    let Ok(devices) = s.devices.lock() else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "device table poisoned");
    };
    ok(Value::Array(
        devices.iter().map(|(k, h)| view(k, h)).collect(),
    ))
}

async fn device(State(s): State<RestState>, Path((ns, name)): Path<(String, String)>) -> Response {
    let k = format!("{ns}/{name}");
    let Ok(devices) = s.devices.lock() else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "device table poisoned");
    };
    match devices.get(&k) {
        Some(h) => ok(view(&k, h)),
        None => error(
            StatusCode::NOT_FOUND,
            format!("device {k} is not served by this mapper"),
        ),
    }
}

/// Sends a command to a device task, without holding the table's lock across the wait.
async fn ask(
    s: &RestState,
    k: &str,
    check: impl FnOnce(&crate::mapper::DeviceHandle) -> Result<(), (StatusCode, String)>,
    make: impl FnOnce(tokio::sync::oneshot::Sender<Result<String, crate::DriverError>>) -> Command,
) -> Result<String, Response> {
    let tx = {
        let devices = s
            .devices
            .lock()
            .map_err(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "device table poisoned"))?;
        let h = devices.get(k).ok_or_else(|| {
            error(
                StatusCode::NOT_FOUND,
                format!("device {k} is not served by this mapper"),
            )
        })?;
        check(h).map_err(|(code, message)| error(code, message))?;
        h.sender()
    };
    let tx =
        tx.ok_or_else(|| error(StatusCode::SERVICE_UNAVAILABLE, "the device is not running"))?;
    let (reply, rx) = tokio::sync::oneshot::channel();
    tx.send(make(reply))
        .await
        .map_err(|_| error(StatusCode::SERVICE_UNAVAILABLE, "the device stopped"))?;
    match rx.await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(error(StatusCode::BAD_GATEWAY, e.message)),
        Err(_) => Err(error(StatusCode::SERVICE_UNAVAILABLE, "the device stopped")),
    }
}

fn property_type(h: &crate::mapper::DeviceHandle, property: &str) -> Option<Option<String>> {
    h.config
        .properties
        .iter()
        .find(|p| p.name == property)
        .map(|p| p.value_type.clone())
}

async fn read(
    State(s): State<RestState>,
    Path((ns, name, property)): Path<(String, String, String)>,
) -> Response {
    let k = format!("{ns}/{name}");
    let mut ty = None;
    let r = ask(
        &s,
        &k,
        |h| match property_type(h, &property) {
            Some(t) => {
                ty = t;
                Ok(())
            }
            None => Err((
                StatusCode::NOT_FOUND,
                format!("device {k} has no property {property}"),
            )),
        },
        |reply| Command::Read(property.clone(), reply),
    )
    .await;
    match r {
        Ok(value) => ok(json!({
            "deviceName": name, "namespace": ns, "propertyName": property,
            "value": value, "type": ty, "timeStamp": now_ms(),
        })),
        Err(resp) => resp,
    }
}

async fn methods(State(s): State<RestState>, Path((ns, name)): Path<(String, String)>) -> Response {
    let k = format!("{ns}/{name}");
    let Ok(devices) = s.devices.lock() else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "device table poisoned");
    };
    let Some(h) = devices.get(&k) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("device {k} is not served by this mapper"),
        );
    };
    let list: Vec<Value> = h
        .methods
        .iter()
        .map(|(m, props)| {
            let parameters: Vec<Value> = props
                .iter()
                .map(|p| json!({"propertyName": p, "valueType": property_type(h, p).flatten()}))
                .collect();
            json!({"name": m, "path": format!("/api/v1/devicemethod/{ns}/{name}/{m}/{{propertyName}}"), "parameters": parameters})
        })
        .collect();
    ok(json!({"methods": list}))
}

async fn call(
    State(s): State<RestState>,
    Path((ns, name, method, property)): Path<(String, String, String, String)>,
    body: String,
) -> Response {
    let k = format!("{ns}/{name}");
    let value = match serde_json::from_str::<Value>(&body) {
        Ok(Value::Object(o)) => match o.get("value") {
            Some(Value::String(v)) => v.clone(),
            Some(v) => v.to_string(),
            None => return error(StatusCode::BAD_REQUEST, "the body has no \"value\""),
        },
        Ok(Value::String(v)) => v,
        Ok(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
        Ok(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "the body is {\"value\": ...} or a bare JSON string, number or boolean",
            );
        }
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the body is not JSON: {e}"),
            );
        }
    };
    if value.is_empty() {
        return error(StatusCode::BAD_REQUEST, "the value is empty");
    }
    let r = ask(
        &s,
        &k,
        |h| match h.methods.get(&method) {
            None => Err((
                StatusCode::NOT_FOUND,
                format!("device {k} has no method {method}"),
            )),
            Some(props) if !props.contains(&property) => Err((
                StatusCode::FORBIDDEN,
                format!("method {method} does not list property {property}"),
            )),
            Some(_) => Ok(()),
        },
        |reply| Command::Write(property.clone(), value.clone(), reply),
    )
    .await;
    match r {
        Ok(read_back) => ok(
            json!({"deviceName": name, "namespace": ns, "propertyName": property, "written": value, "value": read_back}),
        ),
        Err(resp) => resp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request as HttpRequest;
    use tower::ServiceExt;

    fn api(token: Option<&str>) -> Router {
        router(RestState {
            devices: Devices::default(),
            metrics: Arc::default(),
            protocol: "modbus".into(),
            token: token.map(Arc::from),
            hosts: Arc::from(vec!["gw-3.plant.example".to_string()]),
        })
    }

    async fn status(api: Router, req: HttpRequest<Body>) -> (u16, String) {
        let resp = api.oneshot(req).await.expect("the router answers");
        let code = resp.status().as_u16();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        (code, String::from_utf8_lossy(&body).into_owned())
    }

    fn write(host: &str, content_type: &str, origin: Option<&str>) -> HttpRequest<Body> {
        let mut b =
            HttpRequest::post("/api/v1/devicemethod/default/oven-1/set-temperature/setpoint")
                .header("host", host)
                .header("content-type", content_type);
        if let Some(o) = origin {
            b = b.header("origin", o);
        }
        b.body(Body::from(r#"{"value": "90"}"#)).expect("request")
    }

    /// A request that got past the guard reaches the handler, which does not know oven-1 (404).
    const PASSED: u16 = 404;

    #[tokio::test]
    async fn a_cross_site_simple_post_moves_nothing() {
        // What a page's form or `fetch(..., {mode: "no-cors"})` sends: text/plain or a form,
        // its own Origin, a Host by IP.
        for ct in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
        ] {
            let (code, body) = status(
                api(None),
                write("127.0.0.1:7777", ct, Some("http://evil.example")),
            )
            .await;
            assert_eq!(code, 403, "{ct}: {body}");
            let (code, body) = status(api(None), write("127.0.0.1:7777", ct, None)).await;
            assert_eq!(code, 415, "{ct}: {body}");
            assert!(body.contains("application/json"), "{body}");
        }
        let (code, body) = status(
            api(None),
            write("127.0.0.1:7777", "application/json", Some("null")),
        )
        .await;
        assert_eq!(code, 403, "{body}");
        // The API's own origin, or a client that sends none (curl, a script), as JSON: taken.
        for origin in [Some("http://127.0.0.1:7777"), None] {
            let (code, body) = status(
                api(None),
                write("127.0.0.1:7777", "application/json; charset=utf-8", origin),
            )
            .await;
            assert_eq!(code, PASSED, "{origin:?}: {body}");
        }
    }

    #[tokio::test]
    async fn without_a_token_a_rebound_name_is_refused() {
        let (code, body) = status(
            api(None),
            write("evil.example:7777", "application/json", None),
        )
        .await;
        assert_eq!(code, 403, "{body}");
        assert!(
            body.contains("evil.example") && body.contains("http_token_file"),
            "{body}"
        );
        let read = HttpRequest::get("/api/v1/devices")
            .header("host", "evil.example")
            .body(Body::empty())
            .expect("request");
        assert_eq!(status(api(None), read).await.0, 403);
        let (code, _) = status(
            api(None),
            write("gw-3.plant.example:7777", "application/json", None),
        )
        .await;
        assert_eq!(code, PASSED);
    }

    #[tokio::test]
    async fn with_a_token_every_request_but_ping_carries_it() {
        let get = |path: &str, auth: Option<&str>| {
            let mut b = HttpRequest::get(path).header("host", "evil.example");
            if let Some(a) = auth {
                b = b.header("authorization", a);
            }
            b.body(Body::empty()).expect("request")
        };
        for path in [
            "/api/v1/devices",
            "/metrics",
            "/api/v1/device/default/oven-1",
        ] {
            for auth in [None, Some("Bearer wrong"), Some("s3cret"), Some("Bearer ")] {
                let (code, body) = status(api(Some("s3cret")), get(path, auth)).await;
                assert_eq!(code, 401, "{path} {auth:?}: {body}");
                assert!(body.contains("Authorization: Bearer TOKEN"), "{body}");
            }
        }
        assert_eq!(
            status(api(Some("s3cret")), get("/api/v1/ping", None))
                .await
                .0,
            200
        );
        assert_eq!(
            status(
                api(Some("s3cret")),
                get("/api/v1/devices", Some("Bearer s3cret"))
            )
            .await
            .0,
            200
        );
        let mut w = write("127.0.0.1:7777", "application/json", None);
        assert_eq!(status(api(Some("s3cret")), w).await.0, 401);
        w = write("127.0.0.1:7777", "application/json", None);
        w.headers_mut()
            .insert("authorization", HeaderValue::from_static("Bearer s3cret"));
        assert_eq!(status(api(Some("s3cret")), w).await.0, PASSED);
        // The token does not make a cross-site write acceptable.
        w = write("127.0.0.1:7777", "text/plain", Some("http://evil.example"));
        w.headers_mut()
            .insert("authorization", HeaderValue::from_static("Bearer s3cret"));
        assert_eq!(status(api(Some("s3cret")), w).await.0, 403);
    }
}
