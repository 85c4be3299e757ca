//! The HTTP routes: health checks without credentials, then every other request
//! authenticated (`authn`), and `/version`, `/openapi/v3` and the API itself (`api`).

use axum::Router;
use axum::extract::{Query as AxQuery, Request, State};
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use std::sync::Arc;

use crate::api::{Api, Query, json_response};
use crate::status::Status;
use crate::{ClientCertificate, Identity, KUBE_VERSION, RevocationCheck, User, authn, discovery};

#[derive(Clone)]
struct AppState {
    api: Arc<Api>,
    tokens: Arc<Vec<(String, User)>>,
    revoked: Option<RevocationCheck>,
}

pub(crate) fn router(
    api: Arc<Api>,
    tokens: Vec<(String, User)>,
    revoked: Option<RevocationCheck>,
) -> Router {
    let state = AppState {
        api,
        tokens: Arc::new(tokens),
        revoked,
    };
    Router::new()
        .route("/healthz", get(ok))
        .route("/livez", get(ok))
        .route("/readyz", get(ok))
        .fallback(authenticated)
        .with_state(state)
}

async fn ok() -> &'static str {
    "ok"
}

fn is_watch(q: &Query) -> bool {
    matches!(q.get("watch").map(String::as_str), Some("true" | "1"))
}

/// The serial of the certificate a node authenticated with.
fn node_serial(user: &User, cert: Option<&ClientCertificate>) -> Option<String> {
    if !user.in_group("system:nodes") {
        return None;
    }
    pki::serial_and_expiry(&cert?.0).map(|(serial, _)| serial)
}

/// `response`, whose body ends as soon as `check` says the certificate `serial` is revoked
/// (checked each time its count of changes goes up).
fn until_revoked(response: Response, serial: String, check: RevocationCheck) -> Response {
    let RevocationCheck(revoked, Some(mut changes)) = check else {
        return response;
    };
    let (parts, body) = response.into_parts();
    let ended = async move {
        while changes.changed().await.is_ok() {
            if revoked(&serial) {
                tracing::info!(%serial, "a watch of a revoked node certificate ended");
                return;
            }
        }
        std::future::pending::<()>().await
    };
    let stream = futures_util::StreamExt::take_until(body.into_data_stream(), Box::pin(ended));
    Response::from_parts(parts, axum::body::Body::from_stream(stream))
}

async fn authenticated(
    State(state): State<AppState>,
    AxQuery(query): AxQuery<Query>,
    req: Request,
) -> Response {
    let user = authn::authenticate(
        req.extensions().get::<Identity>(),
        req.extensions().get::<ClientCertificate>(),
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
        &state.tokens,
        state.revoked.as_ref(),
    );
    let Some(user) = user else {
        return Status::unauthorized().into_response();
    };
    // Impersonation is decided on the roles in the view: with the server's own writes of them
    // (which `Api::dispatch` waits for anyway; here only when there is impersonation to decide).
    if req.headers().contains_key("Impersonate-User") {
        state.api.store.own_writes(&crate::api::DECIDING).await;
    }
    let user = match authn::impersonated(&state.api, user, req.headers()) {
        Ok(u) => u,
        Err(s) => return s.into_response(),
    };
    let uri: Uri = req.uri().clone();
    let path = uri.path().to_string();
    let method = req.method().clone();
    let headers = req.headers().clone();
    let api = state.api.clone();
    if method == Method::GET {
        match path.as_str() {
            "/version" => {
                return json_response(
                    StatusCode::OK,
                    &json!({"major": "1", "minor": "33",
                    "gitVersion": format!("{KUBE_VERSION}+cloudcore-{}", env!("CARGO_PKG_VERSION")),
                    "gitCommit": "", "gitTreeState": "clean", "buildDate": "",
                    "goVersion": "", "compiler": "rustc", "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH)}),
                );
            }
            "/openapi/v3" => {
                return json_response(
                    StatusCode::OK,
                    &discovery::openapi_v3_index(&api.registry()),
                );
            }
            _ => {}
        }
        if let Some(gv) = path.strip_prefix("/openapi/v3/") {
            let reg = api.registry();
            let doc = match gv.split('/').collect::<Vec<_>>().as_slice() {
                ["api", v] => discovery::openapi_v3(&reg, "", v),
                ["apis", g, v] => discovery::openapi_v3(&reg, g, v),
                _ => None,
            };
            return match doc {
                Some(d) => json_response(StatusCode::OK, &d),
                None => Status::no_route(&path).into_response(),
            };
        }
    }
    if path == "/api" || path.starts_with("/api/") || path == "/apis" || path.starts_with("/apis/")
    {
        // A watch opened with a node's certificate ends when that certificate is revoked.
        let revocable = is_watch(&query)
            .then(|| node_serial(&user, req.extensions().get::<ClientCertificate>()))
            .flatten()
            .zip(state.revoked.clone());
        let mut req = req;
        let upgrade = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>();
        let incoming = crate::api::Incoming {
            body: req.into_body(),
            raw_query: uri.query().unwrap_or_default().to_string(),
            upgrade,
        };
        let response = api
            .dispatch(&user, method, &path, query, headers, incoming)
            .await;
        return match revocable {
            Some((serial, check)) => until_revoked(response, serial, check),
            None => response,
        };
    }
    Status::no_route(&path).into_response()
}
