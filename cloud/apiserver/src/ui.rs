//! The fleet's web page (`GET /ui`): plain HTML and JavaScript compiled into cloudcore (no build
//! step, nothing fetched from elsewhere), with the style sheet and script it shares with
//! edgecore's page ([`rt::ui`]). It reads and writes through this API like any client, with the
//! token the user gives it (its requests are authorized as that user's); loading it needs none.

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

const OWN: &[(&str, &str)] = &[
    ("index.html", include_str!("ui/index.html")),
    ("app.js", include_str!("ui/app.js")),
];

/// `GET /ui` and `GET /ui/{file}`.
pub(crate) async fn page(file: Option<Path<String>>) -> Response {
    let name = file.map(|Path(f)| f).unwrap_or_default();
    match rt::ui::file(&name, OWN) {
        Some(r) => r.into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}
