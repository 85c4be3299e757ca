//! The gateway's page (`/ui` on edgecore's HTTP listener) in a real browser: Debian's
//! `chromium`, driven through `chromedriver` (WebDriver) with fantoccini, against the real
//! edgecore and mapper-modbus on the quickstart's oven. The page shows the temperature
//! changing, a desired set point typed into its form lands on the simulated register and
//! shows as reported, a value the twin API refuses shows its error by the field, and a killed
//! mapper turns the device `unknown` with its reason. Screenshots go to `target/screenshots/`
//! (and to `docs/screenshots/` with `UPDATE_SCREENSHOTS=1`, where the README takes them from).

use fantoccini::{Client, ClientBuilder, Locator};
use sim::modbus_sim::Sim;
use sim::{Node, free_port};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// chromedriver on a free port, once it answers; none (the test is skipped) without it.
fn chromedriver() -> Option<(Driver, u16)> {
    if Command::new("chromium").arg("--version").output().is_err() {
        eprintln!("skipped: no chromium (apt-get install chromium chromium-driver)");
        return None;
    }
    let port = free_port();
    let child = match Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("skipped: no chromedriver ({e}; apt-get install chromium-driver)");
            return None;
        }
    };
    let driver = Driver(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some((driver, port))
}

async fn browser(port: u16) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({"args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,800"]}),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a browser session")
}

/// The text of the first element `css` matches, `""` when there is none.
async fn text(c: &Client, css: &str) -> String {
    match c.find(Locator::Css(css)).await {
        Ok(e) => e.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Polls `css`'s text until `ok` holds; returns it, or panics naming what was shown.
async fn wait_text(
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
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("a screenshot");
    let root = sim::workspace_root();
    let dir = root.join("target/screenshots");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(name), &png);
    if std::env::var_os("UPDATE_SCREENSHOTS").is_some() {
        let docs = root.join("docs/screenshots");
        let _ = std::fs::create_dir_all(&docs);
        let _ = std::fs::write(docs.join(name), &png);
    }
}

#[test]
fn the_oven_page_is_live_takes_a_set_point_and_says_why_a_device_is_unknown() {
    let Some((_driver, driver_port)) = chromedriver() else {
        return;
    };
    let oven = Sim::oven();
    let (port, _oven_rt) = oven.start("127.0.0.1:0").expect("the oven");
    {
        let oven = oven.clone();
        _oven_rt.spawn(oven.animate_oven(Duration::from_millis(300)));
    }
    let manifest = std::fs::read_to_string(sim::workspace_root().join("examples/modbus-tcp.yaml"))
        .expect("example")
        .replace("port: 5020", &format!("port: {port}"))
        .replace("nodeName: edge-node-1", "nodeName: test-node");
    let node = Node::start(&manifest);
    let mapper = node.mapper("mapper-modbus", "modbus", free_port());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        let c = browser(driver_port).await;

        // The device list, then the oven's page.
        c.goto(&format!("{}/ui", node.http))
            .await
            .expect("the page");
        wait_text(&c, "#device-rows", 30, "the oven in the list", |t| {
            t.contains("default/oven-1") && t.contains("online")
        })
        .await;
        screenshot(&c, "gateway-devices.png").await;
        c.goto(&format!("{}/ui#/device/default/oven-1", node.http))
            .await
            .expect("the oven's page");
        let temperature = r#"tr[data-prop="temperature"] [data-value]"#;
        let first = wait_text(&c, temperature, 30, "a temperature", |t| !t.is_empty()).await;
        let moved = wait_text(&c, temperature, 30, "the temperature changing", |t| {
            !t.is_empty() && t != first
        })
        .await;
        eprintln!("temperature on the page: {first} then {moved}");

        // A set point typed into the form lands on the register and comes back as reported.
        let input = c
            .find(Locator::Css("#desired-setpoint"))
            .await
            .expect("the set point's field");
        input.send_keys("65").await.expect("typed");
        c.find(Locator::Css(r#"form[data-prop="setpoint"] button"#))
            .await
            .expect("its button")
            .click()
            .await
            .expect("clicked");
        let deadline = Instant::now() + Duration::from_secs(30);
        while oven.holding(1) != Some(65) {
            assert!(Instant::now() < deadline, "65 never reached the register");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        wait_text(
            &c,
            r#"tr[data-prop="setpoint"] [data-value]"#,
            30,
            "65 reported",
            |t| t == "65",
        )
        .await;
        wait_text(&c, r#"tr[data-prop="setpoint"]"#, 10, "landed", |t| {
            t.contains("landed")
        })
        .await;
        screenshot(&c, "gateway-oven.png").await;

        // A value above the model's maximum: the twin API's error, by the field.
        let input = c
            .find(Locator::Css("#desired-setpoint"))
            .await
            .expect("the set point's field");
        input.send_keys("500").await.expect("typed");
        c.find(Locator::Css(r#"form[data-prop="setpoint"] button"#))
            .await
            .expect("its button")
            .click()
            .await
            .expect("clicked");
        wait_text(
            &c,
            "#desired-setpoint-error",
            15,
            "the refusal by the field",
            |t| t.contains("500 is above the model maximum 120"),
        )
        .await;
        assert_eq!(oven.holding(1), Some(65), "the register keeps 65");

        // The mapper killed: the device is unknown, and the page says why.
        drop(mapper);
        let state = wait_text(&c, "#device-state", 30, "unknown with its reason", |t| {
            t.contains("unknown") && t.contains("unreachable")
        })
        .await;
        eprintln!("after the mapper was killed: {state}");
        wait_text(&c, temperature, 10, "the value kept", |t| !t.is_empty()).await;
        wait_text(
            &c,
            r#"tr[data-prop="temperature"]"#,
            10,
            "marked stale",
            |t| t.contains("stale"),
        )
        .await;
        screenshot(&c, "gateway-oven-unknown.png").await;
        c.close().await.expect("closed");
    });
}
