//! The gateway's web page (`GET /ui`): plain HTML, CSS and JavaScript compiled into the binary
//! (no build step, nothing fetched from elsewhere), on the HTTP API it reads. Loading the page
//! needs no token; the page asks for the one the API needs and keeps it for the browser tab.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("ui/index.html");
const APP: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/style.css");

/// Only this origin's own files; no framing, no referrer, no sniffing.
const POLICY: [(header::HeaderName, &str); 4] = [
    (
        header::CONTENT_SECURITY_POLICY,
        "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    ),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::X_FRAME_OPTIONS, "DENY"),
    (header::REFERRER_POLICY, "no-referrer"),
];

fn file(content_type: &'static str, body: &'static str) -> Response {
    let mut r = ([(header::CONTENT_TYPE, content_type)], body).into_response();
    for (k, v) in POLICY {
        r.headers_mut()
            .insert(k, header::HeaderValue::from_static(v));
    }
    r
}

pub(crate) async fn page() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

pub(crate) async fn script() -> Response {
    file("text/javascript; charset=utf-8", APP)
}

pub(crate) async fn style() -> Response {
    file("text/css; charset=utf-8", STYLE)
}
