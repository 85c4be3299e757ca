//! An alarm acknowledged through the cloud on the gateway that keeps it:
//! `POST /apis/devices.kubeedge.io/v1beta1/namespaces/{ns}/devices/{name}/alarms?rule=R`, a
//! subresource of the embedded API ([`apiserver::Subresource`]: authorized as `update` on
//! `devices/alarms`, which `edit` and `admin` have and `view` has not). cloudhub asks the
//! device's node over its session (`{ns}/devicealarm/{name}`, operation `acknowledge`, with
//! the user's name); the answer is the alarm as it now stands, or the gateway's refusal (404
//! no such rule, 409 nothing to acknowledge or already done); a node that is away, busy or
//! silent is said (503, 504) with its name. The acknowledgement then reaches `DeviceStatus` and
//! an Event as the gateway's report of it.

use super::history::{ask_gateway, gateway_of};
use super::{failure, off};
use crate::cloudhub::CloudHub;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};
use std::sync::Arc;

/// The message's resource kind and operation, as the edge reads them.
const KIND: &str = "devicealarm";
const OPERATION: &str = "acknowledge";

/// The `devices/alarms` subresource, answered through the hub once it is set.
pub(crate) fn subresource(api: super::NodeApi) -> apiserver::Subresource {
    apiserver::Subresource {
        group: "devices.kubeedge.io".into(),
        plural: "devices".into(),
        name: "alarms".into(),
        verb: "update",
        methods: &[axum::http::Method::POST],
        serve: Arc::new(move |device, request| {
            let hub = api.hub();
            Box::pin(async move {
                match hub {
                    Some(hub) => ask(&hub, &device, request.query.get("rule"), &request.user).await,
                    None => off(),
                }
            })
        }),
    }
}

async fn ask(hub: &CloudHub, device: &Value, rule: Option<&String>, user: &str) -> Response {
    let (ns, name, node) = match gateway_of(device, "alarms") {
        Ok(at) => at,
        Err(why) => return failure(StatusCode::NOT_FOUND, why),
    };
    let Some(rule) = rule.filter(|r| !r.is_empty() && r.len() <= 63) else {
        return failure(
            StatusCode::BAD_REQUEST,
            "give the alarm's rule: ?rule=NAME (as in status.extensions.alarms)",
        );
    };
    let content = json!({"rule": rule, "by": user});
    ask_gateway(hub, node, (ns, name), (KIND, OPERATION), content).await
}
