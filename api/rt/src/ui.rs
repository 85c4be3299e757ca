//! What the web pages of edgecore (`/ui`, the gateway) and cloudcore (`/ui`, the fleet) share:
//! their style sheet, the script both load first (escaping, the API call with the token the
//! page asks for, states, ages, tables, value forms), the history chart, and the headers they are served with. Plain files compiled into
//! the binaries: no build step, nothing fetched from elsewhere.

/// `/ui/style.css`.
pub const STYLE: &str = include_str!("ui/style.css");

/// `/ui/common.js`.
pub const COMMON_JS: &str = include_str!("ui/common.js");

/// `/ui/chart.js`: the history chart of a device's page.
pub const CHART_JS: &str = include_str!("ui/chart.js");

/// Only the page's own origin; no framing, no referrer, no sniffing.
pub const HEADERS: [(&str, &str); 4] = [
    (
        "content-security-policy",
        "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    ),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
];

/// The content type of a page file by its name.
pub fn content_type(name: &str) -> &'static str {
    match name.rsplit('.').next() {
        Some("css") => "text/css; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        _ => "text/html; charset=utf-8",
    }
}

/// The page file `name` (`""` or `index.html` for the page itself) from the page's own files
/// `own` (`index.html`, `app.js`) and the shared ones, with its headers; 404 for another name.
pub fn file(name: &str, own: &[(&str, &'static str)]) -> http::Response<String> {
    let name = if name.is_empty() { "index.html" } else { name };
    let found = own
        .iter()
        .chain(
            [
                ("common.js", COMMON_JS),
                ("chart.js", CHART_JS),
                ("style.css", STYLE),
            ]
            .iter(),
        )
        .find(|(n, _)| *n == name);
    let mut r = http::Response::builder();
    let body = match found {
        Some((_, body)) => {
            r = r.header(http::header::CONTENT_TYPE, content_type(name));
            for (k, v) in HEADERS {
                r = r.header(k, v);
            }
            body.to_string()
        }
        None => {
            r = r.status(http::StatusCode::NOT_FOUND);
            format!("no page file {name}")
        }
    };
    r.body(body).unwrap_or_default()
}
