//! The fleet's web page (`GET /ui`): plain HTML and JavaScript compiled into cloudcore (no build
//! step, nothing fetched from elsewhere), with the style sheet and script it shares with
//! edgecore's page ([`rt::ui`]). It reads and writes through this API like any client, with the
//! token the user gives it (its requests are authorized as that user's); loading it needs none.

use axum::extract::Path;

const OWN: &[(&str, &str)] = &[
    ("index.html", include_str!("ui/index.html")),
    ("app.js", include_str!("ui/app.js")),
];

/// `GET /ui` and `GET /ui/{file}`.
pub(crate) async fn page(file: Option<Path<String>>) -> axum::http::Response<String> {
    rt::ui::file(file.as_ref().map_or("", |Path(f)| f), OWN)
}
