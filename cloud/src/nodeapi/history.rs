//! A device's history, read through the cloud from the gateway that keeps it:
//! `GET /apis/devices.kubeedge.io/v1beta1/namespaces/{ns}/devices/{name}/history?property=P`
//! (with the gateway's own `from`, `to`, `step`), a subresource of the embedded API
//! ([`apiserver::Subresource`]: authorized as `get` on `devices/history`). cloudhub asks the
//! device's node over its session (`{ns}/devicehistory/{name}`, operation `query`) and the
//! answer is the gateway's own (`GET .../properties/{p}/history`); a node that is away, busy or
//! silent is said (503, 504) with its name.

use super::{failure, off};
use crate::cloudhub::{CloudHub, Unanswered};
use api::message::Message;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How long a gateway has to answer.
const WAIT: Duration = Duration::from_secs(10);
/// The longest query value passed on (times, steps and property names are short).
const MAX_VALUE: usize = 128;

/// The message's resource kind and operation, as the edge reads them.
pub(super) const KIND: &str = "devicehistory";
pub(super) const OPERATION: &str = "query";

/// The `devices/history` subresource, answered through the hub once it is set.
pub(crate) fn subresource(api: super::NodeApi) -> apiserver::Subresource {
    apiserver::Subresource {
        group: "devices.kubeedge.io".into(),
        plural: "devices".into(),
        name: "history".into(),
        verb: "get",
        methods: &[axum::http::Method::GET],
        serve: Arc::new(move |device, request| {
            let hub = api.hub();
            Box::pin(async move {
                match hub {
                    Some(hub) => ask(&hub, &device, &request.query).await,
                    None => off(),
                }
            })
        }),
    }
}

/// The question to the device's node, its answer as the API's.
async fn ask(hub: &CloudHub, device: &Value, query: &HashMap<String, String>) -> Response {
    let (ns, name, node) = match gateway_of(device, "history") {
        Ok(at) => at,
        Err(why) => return failure(StatusCode::NOT_FOUND, why),
    };
    let mut content = serde_json::Map::new();
    for key in ["property", "from", "to", "step"] {
        if let Some(v) = query.get(key) {
            if v.len() > MAX_VALUE {
                return failure(
                    StatusCode::BAD_REQUEST,
                    format!("{key} is longer than {MAX_VALUE} characters"),
                );
            }
            content.insert(key.into(), v.clone().into());
        }
    }
    if !content.contains_key("property") {
        return failure(
            StatusCode::BAD_REQUEST,
            "give the property: ?property=NAME (and from, to, step as the gateway takes them)",
        );
    }
    ask_gateway(
        hub,
        node,
        (ns, name),
        (KIND, OPERATION),
        Value::Object(content),
    )
    .await
}

/// The device's namespace, name and node (the gateway that keeps its `what`), or why there is
/// none.
pub(super) fn gateway_of<'a>(
    device: &'a Value,
    what: &str,
) -> Result<(&'a str, &'a str, &'a str), String> {
    let ns = device["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    let name = device["metadata"]["name"].as_str().unwrap_or_default();
    match device["spec"]["nodeName"]
        .as_str()
        .filter(|n| !n.is_empty())
    {
        Some(node) => Ok((ns, name, node)),
        None => Err(format!(
            "device {ns}/{name} has no spec.nodeName: no gateway keeps its {what}"
        )),
    }
}

/// A question about device `ns/name` to its gateway `node` (resource `{ns}/{kind}/{name}`),
/// the gateway's answer as the API's (`node` added to it), or its refusal with its status,
/// or why it was not answered.
pub(super) async fn ask_gateway(
    hub: &CloudHub,
    node: &str,
    (ns, name): (&str, &str),
    (kind, operation): (&str, &str),
    content: Value,
) -> Response {
    let question = Message::new(
        "cloudhub",
        "twin",
        operation,
        format!("{ns}/{kind}/{name}"),
        content,
    );
    match hub.ask(node, question, WAIT).await {
        Ok(answer) if answer.route.operation == "response" => {
            let mut series = answer.content;
            if let Some(o) = series.as_object_mut() {
                o.insert("node".into(), node.into());
            }
            (StatusCode::OK, axum::Json(series)).into_response()
        }
        Ok(answer) => {
            // The gateway's refusal: its status and message.
            let code = answer.content["code"]
                .as_u64()
                .and_then(|c| u16::try_from(c).ok())
                .and_then(|c| StatusCode::from_u16(c).ok())
                .filter(|c| c.is_client_error() || c.is_server_error())
                .unwrap_or(StatusCode::BAD_GATEWAY);
            let message = answer.content["message"]
                .as_str()
                .or(answer.content.as_str())
                .unwrap_or("the gateway refused without saying why");
            failure(code, format!("node {node}: {message}"))
        }
        Err(e @ (Unanswered::Away(_) | Unanswered::Busy(_))) => {
            failure(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
        Err(e @ Unanswered::Late(..)) => failure(StatusCode::GATEWAY_TIMEOUT, e.to_string()),
    }
}
