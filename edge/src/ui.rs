//! The gateway's web page (`GET /ui`): plain HTML and JavaScript compiled into the binary (no
//! build step, nothing fetched from elsewhere), with the style sheet and script it shares with
//! cloudcore's page ([`rt::ui`]), on the HTTP API it reads. Loading the page needs no token; the
//! page asks for the one the API needs and keeps it for the browser tab.

use axum::extract::Path;

const OWN: &[(&str, &str)] = &[
    ("index.html", include_str!("ui/index.html")),
    ("app.js", include_str!("ui/app.js")),
];

/// `GET /ui` and `GET /ui/{file}`.
pub(crate) async fn page(file: Option<Path<String>>) -> axum::http::Response<String> {
    rt::ui::file(file.as_ref().map_or("", |Path(f)| f), OWN)
}
