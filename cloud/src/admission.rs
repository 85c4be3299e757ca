//! The validating admission webhook for a real cluster: its API server asks cloudcore, before
//! storing a Device, whether the desired values that changed can land on the device (the
//! model's type, minimum, maximum, access mode), and refuses the write with cloudcore's words
//! when they cannot: the same check and the same field paths as the embedded API's admission
//! (`api::validate::unlandable_desired`), as KubeEdge's own admission webhook does for its
//! devices. Served on the certificate server (`certListen`, TLS by the fleet CA); cloudcore
//! registers it as the `ValidatingWebhookConfiguration` `cloudcore-devices` with that CA.
//!
//! The endpoint decides on what the API server sends and reads one DeviceModel; it stores
//! nothing and says nothing beyond the model's bounds, so it needs no client certificate. Its
//! bodies are bounded ([`MAX_BODY`]).

use anyhow::{Context, Result};
use api::v1beta1::DeviceModel;
use axum::extract::State;
use axum::http::StatusCode;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde_json::{Value, json};

/// The path the API server posts `AdmissionReview`s to.
pub const PATH: &str = "/admission/devices";

/// The registration's name.
pub const NAME: &str = "cloudcore-devices";

/// An AdmissionReview carries the object and the old one: twice the API server's 1.5 MiB
/// object limit, and some.
pub const MAX_BODY: usize = 4 << 20;

/// The webhook's route, reading models through `client`.
pub fn router(client: kube::Client) -> axum::Router {
    axum::Router::new()
        .route(PATH, axum::routing::post(review))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(client)
}

async fn review(
    State(client): State<kube::Client>,
    body: axum::body::Bytes,
) -> (StatusCode, axum::Json<Value>) {
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
    let model = match model_of(&client, ns, &device).await {
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
pub fn registration(
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
pub async fn register(
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
