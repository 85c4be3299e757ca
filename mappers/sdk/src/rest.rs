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
        .layer(axum::middleware::from_fn(correlation))
        .with_state(state)
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
        _ => body.trim().to_string(),
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
