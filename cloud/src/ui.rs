//! The fleet's web page (`GET /ui` on the API's address): plain HTML and JavaScript compiled
//! into cloudcore (no build step, nothing fetched from elsewhere), with the style sheet and
//! script it shares with edgecore's page ([`rt::ui`]). It reads and writes through the API like
//! any client, with the token the user gives it (its requests are authorized as that user's);
//! loading it needs none. It knows cloudcore's own things (the devices' API group, the Node
//! annotation naming a replica, [`crate::edgecontroller::node::SESSION_ANNOTATION`]), so it lives here,
//! and the API mounts it ([`apiserver::Config::pages`]).

use axum::extract::Path;
use axum::routing::get;

const OWN: &[(&str, &str)] = &[
    ("index.html", include_str!("ui/index.html")),
    ("app.js", include_str!("ui/app.js")),
];

/// The page's routes, for [`apiserver::Config::pages`].
pub(crate) fn pages() -> axum::Router {
    axum::Router::new()
        .route("/ui", get(page))
        .route("/ui/", get(page))
        .route("/ui/{file}", get(page))
}

/// `GET /ui` and `GET /ui/{file}`.
async fn page(file: Option<Path<String>>) -> axum::http::Response<String> {
    rt::ui::file(file.as_ref().map_or("", |Path(f)| f), OWN)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_page_reads_the_session_annotation_cloudhub_writes() {
        assert!(
            include_str!("ui/app.js").contains(crate::edgecontroller::node::SESSION_ANNOTATION),
            "the Served by column reads the annotation by name"
        );
    }
}
