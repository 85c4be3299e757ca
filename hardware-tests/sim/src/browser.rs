//! A real browser for the web pages' tests and bench: Debian's `chromium`, headless, driven
//! through `chromedriver` (WebDriver) with fantoccini.

use fantoccini::{Client, ClientBuilder, Locator};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use fantoccini;

/// chromedriver, stopped on drop.
pub struct Driver {
    child: Child,
    pub port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// chromedriver on a free port, once it answers; none, saying why, without chromium or it.
pub fn chromedriver() -> Option<Driver> {
    if Command::new("chromium").arg("--version").output().is_err() {
        crate::skip("no chromium (apt-get install chromium chromium-driver)");
        return None;
    }
    let port = crate::free_port();
    let child = match Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            crate::skip(&format!(
                "no chromedriver ({e}; apt-get install chromium-driver)"
            ));
            return None;
        }
    };
    let driver = Driver { child, port };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(driver)
}

/// A new headless browser session (certificates of the project's own CAs accepted).
pub async fn browser(driver: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({"args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,800", "--ignore-certificate-errors"]}),
    );
    caps.insert("acceptInsecureCerts".into(), true.into());
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a browser session")
}

/// The text of the first element `css` matches, `""` when there is none.
pub async fn text(c: &Client, css: &str) -> String {
    match c.find(Locator::Css(css)).await {
        Ok(e) => e.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Polls `css`'s text until `ok` holds; returns it, or panics naming what was shown.
pub async fn wait_text(
    c: &Client,
    css: &str,
    secs: u64,
    what: &str,
    ok: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let t = text(c, css).await;
        if ok(&t) {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: after {secs} s the page shows {t:?} at {css}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// axe-core's accessibility audit of the page as it is now (WCAG 2.1 A and AA rules): each
/// violation of impact `serious` or `critical` as `id (impact): help: the elements`. axe-core is
/// `AXE_CORE` (set by `scripts/test`) or `.cache/axe-core/axe.min.js`; without it the audit is
/// skipped, saying so (a failure in CI, which sets it up).
pub async fn axe(c: &Client) -> Vec<String> {
    let path = std::env::var_os("AXE_CORE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join(".cache/axe-core/axe.min.js"));
    let Ok(source) = std::fs::read_to_string(&path) else {
        crate::skip(&format!(
            "no axe-core at {} (scripts/test --setup-only fetches it)",
            path.display()
        ));
        return Vec::new();
    };
    c.execute(&source, vec![]).await.expect("axe-core loads");
    let run = "const done = arguments[arguments.length - 1];
        axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']}})
          .then((r) => done(JSON.stringify(r.violations
            .filter((v) => v.impact === 'serious' || v.impact === 'critical')
            .map((v) => `${v.id} (${v.impact}): ${v.help}: ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`))))
          .catch((e) => done(JSON.stringify([`axe-core failed: ${e}`])));";
    let out = c.execute_async(run, vec![]).await.expect("the audit runs");
    serde_json::from_str(out.as_str().unwrap_or("[]")).unwrap_or_default()
}

/// Asserts that axe-core finds no serious or critical violation on the page as it is now.
pub async fn assert_accessible(c: &Client, what: &str) {
    let found = axe(c).await;
    assert!(
        found.is_empty(),
        "{what}: accessibility violations (axe-core):\n{}",
        found.join("\n")
    );
}

/// Clicks the element `css`, as a user does (WebDriver's click).
pub async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css}: {e}"))
        .click()
        .await
        .expect("clicked");
}

/// The attribute `name` of the element `css`, if both are there.
pub async fn attr(c: &Client, css: &str, name: &str) -> Option<String> {
    c.find(Locator::Css(css))
        .await
        .ok()?
        .attr(name)
        .await
        .ok()?
}

/// How many pixels the page is wider than the window (0 or less: it fits).
pub async fn overflow(c: &Client) -> i64 {
    c.execute(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth",
        vec![],
    )
    .await
    .expect("measured")
    .as_i64()
    .unwrap_or(1)
}

/// Types `value` into the field `css` and presses the button of its form.
pub async fn submit(c: &Client, field: &str, button: &str, value: &str) {
    let input = c
        .find(Locator::Css(field))
        .await
        .unwrap_or_else(|e| panic!("no {field}: {e}"));
    // A form's field holds the live value: what the user types replaces it, all of it selected
    // first as a user would (Ctrl+A), then typed over.
    use fantoccini::key::Key;
    let select = format!("{}a{}", char::from(Key::Control), char::from(Key::Null));
    input.send_keys(&select).await.expect("selected");
    input.send_keys(value).await.expect("typed");
    c.find(Locator::Css(button))
        .await
        .unwrap_or_else(|e| panic!("no {button}: {e}"))
        .click()
        .await
        .expect("clicked");
}

/// A browser at `url` of a page behind the API's token form (the fleet page), signed in with
/// `token`.
pub async fn signed_in(driver: &Driver, url: &str, token: &str) -> Client {
    let c = browser(driver).await;
    c.goto(url).await.expect("the page");
    submit(&c, "#token", "#login button", token).await;
    c
}

/// What a test expects at one place of a page: the CSS selector, what it is (for the failure
/// message), and when its text is right.
pub type Expect<'a> = (&'a str, &'a str, &'a dyn Fn(&str) -> bool);

/// The fleet page of the cloudcore whose API is on `api_port` at `#/{view}`, signed in with
/// `token`: each of `expect` shows what it should within 60 s, then the view passes axe's
/// audit (`what`). Skipped, saying why, without chromium.
pub fn fleet_view_shows(api_port: u16, token: &str, view: &str, expect: &[Expect<'_>], what: &str) {
    let Some(driver) = chromedriver() else {
        return;
    };
    let url = format!("https://127.0.0.1:{api_port}/ui#/{view}");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let c = signed_in(&driver, &url, token).await;
        for (css, it, ok) in expect {
            wait_text(&c, css, 60, it, ok).await;
        }
        assert_accessible(&c, what).await;
        let _ = c.close().await;
    });
}

/// A screenshot to `target/screenshots/NAME` (and `docs/screenshots/NAME` with
/// `UPDATE_SCREENSHOTS=1`).
pub async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("a screenshot");
    let root = crate::workspace_root();
    let dir = root.join("target/screenshots");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(name), &png);
    if std::env::var_os("UPDATE_SCREENSHOTS").is_some() {
        let docs = root.join("docs/screenshots");
        let _ = std::fs::create_dir_all(&docs);
        let _ = std::fs::write(docs.join(name), &png);
    }
}
