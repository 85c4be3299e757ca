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
        return api
            .dispatch(&user, method, &path, query, headers, req.into_body())
            .await;
    }
    Status::no_route(&path).into_response()
}
