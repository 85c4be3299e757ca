//! The validating admission webhook for a real cluster: its API server asks cloudcore, before
//! storing a Device, whether the desired values that changed can land on the device (the
//! model's type, minimum, maximum, access mode), and refuses the write with cloudcore's words
//! when they cannot: the same check and the same field paths as the embedded API's admission
//! (`api::validate::unlandable_desired`), as KubeEdge's own admission webhook does for its
//! devices. Served on the certificate server (`certListen`, TLS by the fleet CA); cloudcore
//! registers it as the `ValidatingWebhookConfiguration` `cloudcore-devices` with that CA.
//!
//! The endpoint decides on what the API server sends and reads one DeviceModel; it stores
//! nothing and says nothing beyond the model's bounds, so it needs no client certificate. What
//! an anonymous client can make it spend is bounded: a body of at most [`MAX_BODY`], refused
//! by its `Content-Length` before it is read and cut off while it is read, and sent within
//! [`BODY_TIME`]; at most [`PER_CLIENT`] reviews at once from one address (429 beyond) and
//! [`AT_ONCE`] in all (a review waits [`WAIT`] for a slot, then 503). kube-apiserver sends one
//! review per Device write and waits for it, so it needs few slots.

use anyhow::{Context, Result};
use api::v1beta1::DeviceModel;
use axum::extract::State;
use axum::http::StatusCode;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde_json::{Value, json};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// The path the API server posts `AdmissionReview`s to.
pub(crate) const PATH: &str = "/admission/devices";

/// The registration's name.
pub(crate) const NAME: &str = "cloudcore-devices";

/// An AdmissionReview carries the Device written and the one stored. A Device of a thousand
/// properties with their desired values is about 200 KiB; a review of 1 MiB is refused (413)
/// and, with `failurePolicy: Ignore`, let through by the API server to the edge, which still
/// refuses a value that cannot land on its property.
pub(crate) const MAX_BODY: usize = 1 << 20;

/// Reviews judged at once in all.
pub(crate) const AT_ONCE: usize = 8;

/// Reviews judged at once for one client address.
pub(crate) const PER_CLIENT: usize = 2;

/// How long a review waits for one of the [`AT_ONCE`] slots.
pub(crate) const WAIT: Duration = Duration::from_secs(2);

/// How long a client has to send the whole body once its headers are in.
pub(crate) const BODY_TIME: Duration = Duration::from_secs(5);

#[derive(Clone)]
struct Webhook {
    client: kube::Client,
    slots: Arc<tokio::sync::Semaphore>,
    clients: apiserver::PerAddress,
}

/// The webhook's route, reading models through `client`.
pub(crate) fn router(client: kube::Client) -> axum::Router {
    axum::Router::new()
        .route(PATH, axum::routing::post(review))
        .with_state(Webhook {
            client,
            slots: Arc::new(tokio::sync::Semaphore::new(AT_ONCE)),
            clients: apiserver::PerAddress::new(PER_CLIENT),
        })
}

type Answer = (StatusCode, axum::Json<Value>);

fn refused(code: StatusCode, message: String) -> Answer {
    tracing::debug!(%code, %message, "admission: a review refused");
    (code, axum::Json(json!({"error": message})))
}

/// The body of a review, within the limits the module's header gives.
async fn body_of(
    w: &Webhook,
    req: axum::extract::Request,
) -> Result<
    (
        axum::body::Bytes,
        apiserver::Turn,
        tokio::sync::OwnedSemaphorePermit,
    ),
    Answer,
> {
    let ip = req
        .extensions()
        .get::<apiserver::Peer>()
        .map_or(IpAddr::from([0, 0, 0, 0]), |p| p.0.ip());
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(refused(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("an AdmissionReview of at most {MAX_BODY} bytes is judged here"),
        ));
    }
    let turn = w.clients.begin(ip).ok_or_else(|| {
        refused(
            StatusCode::TOO_MANY_REQUESTS,
            format!("{PER_CLIENT} AdmissionReviews from {ip} are being judged already"),
        )
    })?;
    let permit = tokio::time::timeout(WAIT, w.slots.clone().acquire_owned())
        .await
        .ok()
        .and_then(Result::ok)
        .ok_or_else(|| {
            refused(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{AT_ONCE} AdmissionReviews are being judged already"),
            )
        })?;
    let body = tokio::time::timeout(BODY_TIME, axum::body::to_bytes(req.into_body(), MAX_BODY))
        .await
        .map_err(|_| {
            refused(
                StatusCode::REQUEST_TIMEOUT,
                format!("the AdmissionReview did not arrive within {BODY_TIME:?}"),
            )
        })?
        .map_err(|_| {
            refused(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("an AdmissionReview of at most {MAX_BODY} bytes is judged here"),
            )
        })?;
    Ok((body, turn, permit))
}

async fn review(State(w): State<Webhook>, req: axum::extract::Request) -> Answer {
    let (body, _turn, _permit) = match body_of(&w, req).await {
        Ok(b) => b,
        Err(a) => return a,
    };
    let client = &w.client;
    let answer = |r: AdmissionResponse| {
        (
            StatusCode::OK,
            axum::Json(serde_json::to_value(r.into_review()).unwrap_or(Value::Null)),
        )
    };
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({"error": format!("not an AdmissionReview: {e}")})),
            );
        }
    };
    let req: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(r) => r,
        Err(e) => {
            return answer(AdmissionResponse::invalid(format!(
                "an AdmissionReview without a request: {e}"
            )));
        }
    };
    let response = AdmissionResponse::from(&req);
    let Some((device, old)) = device_of(&req) else {
        // Not a Device write this webhook judges (a delete, another kind): allowed.
        return answer(response);
    };
    let ns = req.namespace.as_deref().unwrap_or("default");
    let model = match model_of(client, ns, &device).await {
        Ok(Some(m)) => m,
        // No model (yet): nothing to judge the values by; the Device waits for it.
        Ok(None) => return answer(response),
        Err(e) => {
            // A model that cannot be read now: the write is let through and said in the log;
            // the edge still refuses such a value on its property (never silently).
            tracing::warn!(device = %req.name, error = format!("{e:#}"), "admission: cannot read the DeviceModel; the write is let through");
            return answer(response);
        }
    };
    match apiserver::refused_device(&device, old.as_ref(), &model) {
        None => answer(response),
        Some(message) => {
            tracing::info!(device = %req.name, %message, "admission: a Device write refused");
            let mut denied = response.deny(&message);
            denied.result.code = 422;
            denied.result.reason = "Invalid".into();
            answer(denied)
        }
    }
}

/// The Device written and the one stored, as JSON, when the request is a Device's create or
/// update.
fn device_of(req: &AdmissionRequest<DynamicObject>) -> Option<(Value, Option<Value>)> {
    if req.kind.group != "devices.kubeedge.io" || req.kind.kind != "Device" {
        return None;
    }
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return None;
    }
    let device = serde_json::to_value(req.object.as_ref()?).ok()?;
    let old = req
        .old_object
        .as_ref()
        .and_then(|o| serde_json::to_value(o).ok());
    Some((device, old))
}

/// The DeviceModel `device` refers to, in namespace `ns`, if it names one that exists.
async fn model_of(client: &kube::Client, ns: &str, device: &Value) -> Result<Option<DeviceModel>> {
    let Some(name) = device["spec"]["deviceModelRef"]["name"]
        .as_str()
        .filter(|n| !n.is_empty())
    else {
        return Ok(None);
    };
    kube::Api::<DeviceModel>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .with_context(|| format!("DeviceModel {ns}/{name}"))
}

/// The `ValidatingWebhookConfiguration` that sends Device writes to `url`, trusting `ca_pem`.
pub(crate) fn registration(
    url: &str,
    ca_pem: &str,
    failure_policy: &str,
) -> k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::admissionregistration::v1::{
        RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
    };
    let strings = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect());
    ValidatingWebhookConfiguration {
        metadata: kube::api::ObjectMeta {
            name: Some(NAME.into()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "cloudcore".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        webhooks: Some(vec![ValidatingWebhook {
            name: "devices.cloudcore.kubeedge.io".into(),
            client_config: WebhookClientConfig {
                url: Some(url.into()),
                ca_bundle: Some(ByteString(ca_pem.as_bytes().to_vec())),
                service: None,
            },
            rules: Some(vec![RuleWithOperations {
                api_groups: strings(&["devices.kubeedge.io"]),
                api_versions: strings(&["v1beta1"]),
                operations: strings(&["CREATE", "UPDATE"]),
                resources: strings(&["devices"]),
                scope: Some("Namespaced".into()),
            }]),
            failure_policy: Some(failure_policy.into()),
            side_effects: "None".into(),
            admission_review_versions: vec!["v1".into()],
            timeout_seconds: Some(5),
            ..Default::default()
        }]),
    }
}

/// Registers (server-side apply) the webhook on the cluster.
pub(crate) async fn register(
    client: &kube::Client,
    config: &k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration,
) -> Result<()> {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use kube::api::{Api, Patch, PatchParams};
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    api.patch(
        NAME,
        &PatchParams::apply("cloudcore").force(),
        &Patch::Apply(config),
    )
    .await
    .with_context(|| format!("cannot register the ValidatingWebhookConfiguration {NAME}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What kube-apiserver reads of the registration: Device creates and updates of
    /// `devices.kubeedge.io/v1beta1` to the URL, verified with the fleet CA (base64 PEM).
    #[test]
    fn the_registration_names_the_url_the_ca_and_device_writes() {
        let v = serde_json::to_value(registration(
            "https://cloud.example.com:10002/admission/devices",
            "-----BEGIN CERTIFICATE-----\n",
            "Ignore",
        ))
        .expect("json");
        assert_eq!(v["apiVersion"], "admissionregistration.k8s.io/v1");
        assert_eq!(v["kind"], "ValidatingWebhookConfiguration");
        let w = &v["webhooks"][0];
        assert_eq!(
            w["clientConfig"]["url"],
            "https://cloud.example.com:10002/admission/devices"
        );
        assert_eq!(
            w["clientConfig"]["caBundle"],
            "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="
        );
        assert_eq!(
            w["rules"][0],
            json!({"apiGroups": ["devices.kubeedge.io"], "apiVersions": ["v1beta1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["devices"], "scope": "Namespaced"})
        );
        assert_eq!(
            (&w["failurePolicy"], &w["sideEffects"]),
            (&json!("Ignore"), &json!("None"))
        );
        assert_eq!(w["admissionReviewVersions"], json!(["v1"]));
    }
}
