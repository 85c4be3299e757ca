//! The web pages in a real browser: Debian's `chromium`, driven through `chromedriver`
//! (WebDriver) with fantoccini. Screenshots go to `target/screenshots/` (and to
//! `docs/screenshots/` with `UPDATE_SCREENSHOTS=1`, where the README takes them from).
//!
//! - The gateway's page (`/ui` on edgecore's HTTP listener), against the real edgecore and
//!   mapper-modbus on the quickstart's oven: the temperature changing, a desired set point typed
//!   into its form landing on the simulated register and shown as reported, a value the twin
//!   API refuses shown with its error by the field, a killed mapper turning the device
//!   `unknown` with its reason.
//! - The fleet's page (`/ui` on cloudcore's API), with two edgecores joined: both nodes Ready
//!   with their devices, a device's values from DeviceStatus, and a desired value set on the
//!   page landing on that node's register.

use sim::browser::{
    assert_accessible, attr, browser, chromedriver, click, overflow, screenshot, submit, text,
    wait_text,
};
use sim::modbus_sim::Sim;
use sim::{Node, free_port};
use std::time::Duration;

#[test]
fn the_oven_page_is_live_takes_a_set_point_and_says_why_a_device_is_unknown() {
    let Some(driver) = chromedriver() else {
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
        let c = browser(&driver).await;

        // The device list, then the oven's page.
        c.goto(&format!("{}/ui", node.http))
            .await
            .expect("the page");
        wait_text(&c, "#health", 30, "the store's health", |t| {
            t.contains("live") && t.contains("twin store ok") && !t.contains("cloud")
        })
        .await;
        wait_text(&c, "#device-rows", 30, "the oven in the list", |t| {
            t.contains("default/oven-1") && t.contains("online")
        })
        .await;
        wait_text(&c, "#state-counts", 10, "the count per state", |t| {
            t == "1 online"
        })
        .await;
        // Its values in the list with their units, moving with the oven's.
        let row = r#"tr[data-device="default/oven-1"] td:nth-child(3)"#;
        let first = wait_text(&c, row, 30, "the oven's values in the list", |t| {
            t.contains("setpoint 80 Celsius") && t.contains("temperature ")
        })
        .await;
        wait_text(&c, row, 30, "the temperature moving in the list", |t| {
            t.contains("temperature ") && t != first
        })
        .await;
        assert_accessible(&c, "the gateway's device list").await;
        screenshot(&c, "gateway-devices.png").await;
        // A device the gateway does not have: said, with no empty table under it.
        c.goto(&format!("{}/ui#/device/default/no-such", node.http))
            .await
            .expect("a missing device's page");
        wait_text(&c, "#device-state", 10, "not found", |t| {
            t.contains("no device default/no-such on this gateway")
        })
        .await;
        assert_eq!(
            attr(&c, "#property-table", "hidden").await.as_deref(),
            Some("true"),
            "an empty table under a missing device"
        );
        // The mappers: the one serving the oven, alive, with its device.
        c.goto(&format!("{}/ui#/mappers", node.http))
            .await
            .expect("the mappers");
        wait_text(
            &c,
            "#mapper-rows",
            30,
            "the mapper alive with its device",
            |t| t.contains("modbus") && t.contains("alive") && t.contains("default/oven-1"),
        )
        .await;
        assert_accessible(&c, "the gateway's mappers").await;
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
        submit(
            &c,
            "#desired-setpoint",
            r#"form[data-prop="setpoint"] button"#,
            "65",
        )
        .await;
        // Nothing is written before the user confirms what goes to the PLC.
        wait_text(
            &c,
            r#"form[data-prop="setpoint"] .confirm"#,
            10,
            "the confirmation",
            |t| t.contains("Write 65 Celsius to setpoint of default/oven-1?"),
        )
        .await;
        assert_ne!(oven.holding(1), Some(65), "written before it was confirmed");
        click(&c, r#"form[data-prop="setpoint"] button[name="confirm"]"#).await;
        sim::poll::eventually_async(30, "65 in the register", async || {
            (oven.holding(1) == Some(65)).then_some(())
        })
        .await;
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
        // 65 was set here, over the spec's 80: the page says which stands and why.
        wait_text(
            &c,
            r#"tr[data-prop="setpoint"] [data-override]"#,
            10,
            "the override",
            |t| t.contains("set at the edge") && t.contains("spec asks 80"),
        )
        .await;
        // The history: temperature over the last hour from the gateway's history, as a step
        // line over a min/max band; then the last 24 hours.
        wait_text(&c, "#history-summary", 40, "a chart", |t| {
            t.contains("the last hour")
        })
        .await;
        click(&c, r#"#history-prop option[value="temperature"]"#).await;
        wait_text(&c, "#history-summary", 40, "the chart's summary", |t| {
            t.starts_with("temperature, the last hour") && t.contains(" to ")
        })
        .await;
        // Steps: a value held (H), then a change (V). The first load may hold a few seconds
        // in which the value did not change yet (a busy machine); the page reads the history
        // again every 10 s.
        let mut line = String::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !(line.contains(" H") && line.contains(" V")) {
            assert!(
                std::time::Instant::now() < deadline,
                "drawn as steps: {line}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
            line = attr(&c, "#history-chart path.line", "d")
                .await
                .unwrap_or_default();
        }
        click(&c, r#"#history-ranges button[data-range="24h"]"#).await;
        wait_text(&c, "#history-summary", 20, "24 hours", |t| {
            t.contains("the last 24 hours in steps of 10m")
        })
        .await;
        let pressed = attr(
            &c,
            r#"#history-ranges button[data-range="24h"]"#,
            "aria-pressed",
        )
        .await;
        assert_eq!(pressed.as_deref(), Some("true"));
        assert_accessible(&c, "the oven's page with its chart").await;
        c.execute("window.scrollTo(0, 0)", vec![])
            .await
            .expect("scrolled");
        screenshot(&c, "gateway-oven.png").await;
        c.execute(
            "document.getElementById('history-panel').scrollIntoView()",
            vec![],
        )
        .await
        .expect("scrolled");
        screenshot(&c, "gateway-oven-history.png").await;

        // A value above the model's maximum: the twin API's error, by the field.
        submit(
            &c,
            "#desired-setpoint",
            r#"form[data-prop="setpoint"] button"#,
            "500",
        )
        .await;
        click(&c, r#"form[data-prop="setpoint"] button[name="confirm"]"#).await;
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
        wait_text(&c, "#banner", 30, "the banner naming the mapper", |t| {
            t.contains("mapper")
                && t.contains("unreachable")
                && t.contains("its devices are not read")
        })
        .await;
        wait_text(&c, temperature, 10, "the value kept", |t| !t.is_empty()).await;
        wait_text(
            &c,
            r#"tr[data-prop="temperature"]"#,
            10,
            "marked stale",
            |t| t.contains("stale"),
        )
        .await;
        // The time the device was not online is shaded on the chart, and said.
        wait_text(&c, "#history-summary", 40, "the time not online", |t| {
            t.contains("not online for")
        })
        .await;
        assert!(
            attr(&c, "#history-chart rect.gap", "width").await.is_some(),
            "a gap on the chart"
        );
        screenshot(&c, "gateway-oven-unknown.png").await;

        // On a phone's screen: nothing wider than it, the form still there.
        c.set_window_size(390, 844).await.expect("a phone's size");
        let wide = overflow(&c).await;
        assert!(
            wide <= 0,
            "the page is {wide} px wider than a phone's screen"
        );
        wait_text(&c, r#"form[data-prop="setpoint"]"#, 10, "the form", |t| {
            t.contains("Set setpoint")
        })
        .await;
        assert_accessible(&c, "the oven's page on a phone").await;
        screenshot(&c, "gateway-oven-phone.png").await;

        // edgecore gone: the page no longer shows the device as it last knew it, but unknown,
        // because edgecore is unreachable, with its values stale.
        drop(node);
        wait_text(
            &c,
            "#device-state",
            30,
            "unknown: edgecore unreachable",
            |t| t.contains("unknown") && t.contains("edgecore unreachable since"),
        )
        .await;
        wait_text(&c, "#banner", 30, "the banner", |t| {
            t.contains("edgecore does not answer since")
        })
        .await;
        wait_text(&c, r#"tr[data-prop="setpoint"]"#, 10, "marked stale", |t| {
            t.contains("stale")
        })
        .await;
        c.close().await.expect("closed");
    });
}

fn oven_on(name: &str, node: &str, port: u16) -> String {
    std::fs::read_to_string(sim::workspace_root().join("examples/modbus-tcp.yaml"))
        .expect("example")
        .replace("port: 5020", &format!("port: {port}"))
        .replace("nodeName: edge-node-1", &format!("nodeName: {node}"))
        .replace("name: oven-1", &format!("name: {name}"))
}

#[test]
fn the_fleet_page_lists_two_nodes_and_sets_a_device_through_its_spec() {
    use sim::stack::Cloud;
    let Some(driver) = chromedriver() else {
        return;
    };
    let mut cloud = Cloud::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let ovens: Vec<(Sim, u16, tokio::runtime::Runtime)> = (0..2)
        .map(|_| {
            let oven = Sim::oven();
            let (port, rt) = oven.start("127.0.0.1:0").expect("an oven");
            (oven, port, rt)
        })
        .collect();
    for (i, (_, port, _)) in ovens.iter().enumerate() {
        let file = dir.path().join(format!("oven-{i}.yaml"));
        std::fs::write(
            &file,
            oven_on(
                &format!("oven-{}", i + 1),
                &format!("edge-{}", i + 1),
                *port,
            ),
        )
        .expect("manifest");
        cloud.ok(&["apply", "-f", file.to_str().expect("path")]);
    }
    let bins = sim::bin_dir();
    let mut nodes: Vec<Node> = (1..=2)
        .map(|i| Node::start_named(&bins, &format!("edge-{i}"), "", &cloud.edge_config()))
        .collect();
    let _mappers: Vec<_> = nodes
        .iter()
        .map(|n| n.mapper("mapper-modbus", "modbus", free_port()))
        .collect();
    let token = cloud.admin_token();
    let url = format!("https://127.0.0.1:{}/ui", cloud.api);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let c = browser(&driver).await;
        c.goto(&url).await.expect("the page");
        // No token yet: the page asks for one; a wrong one is said, the right one opens it.
        submit(&c, "#token", "#login button", "not-the-token").await;
        wait_text(&c, "#login-error", 20, "the wrong token refused", |t| {
            t == "that token was not accepted"
        })
        .await;
        c.execute("document.getElementById('token').value = ''", vec![])
            .await
            .expect("cleared");
        submit(&c, "#token", "#login button", &token).await;
        for i in 1..=2 {
            wait_text(
                &c,
                &format!(r#"tr[data-node="edge-{i}"]"#),
                60,
                "the node Ready with its device and edgecore's version",
                |t| {
                    t.contains("Ready")
                        && !t.contains("NotReady")
                        && t.contains('1')
                        && t.contains(&format!("v{}-edgecore", env!("CARGO_PKG_VERSION")))
                },
            )
            .await;
        }
        assert_accessible(&c, "the fleet's nodes").await;
        screenshot(&c, "fleet-nodes.png").await;
        c.goto(&format!("{url}#/devices")).await.expect("devices");
        for i in 1..=2 {
            wait_text(
                &c,
                &format!(r#"tr[data-device="default/oven-{i}"]"#),
                60,
                "the device on its node, online",
                |t| t.contains(&format!("edge-{i}")) && t.contains("online"),
            )
            .await;
        }
        wait_text(&c, "#state-counts", 10, "the count per state", |t| {
            t == "2 online"
        })
        .await;
        // Sorted by node, the other way round: edge-2's device first.
        click(&c, r#"button[data-sort="node"]"#).await;
        click(&c, r#"button[data-sort="node"]"#).await;
        wait_text(
            &c,
            "#device-rows tr:first-child td:first-child",
            10,
            "oven-2 first",
            |t| t == "default/oven-2",
        )
        .await;
        // Each device's values in the list, with the model's unit.
        wait_text(
            &c,
            r#"tr[data-device="default/oven-2"]"#,
            60,
            "oven-2's values in the list",
            |t| t.contains("temperature") && t.contains("setpoint 80"),
        )
        .await;
        // Followed by watches, not read again and again.
        wait_text(&c, "#health", 10, "the page live", |t| {
            t == "2 nodes · 2 devices · live"
        })
        .await;
        // Values move under it: a link the keyboard is on keeps the focus.
        c.execute("document.querySelector('#device-rows a').focus()", vec![])
            .await
            .expect("focused");
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        let focused = c
            .execute(
                "return document.activeElement ? document.activeElement.textContent : ''",
                vec![],
            )
            .await
            .expect("the focused element");
        assert_eq!(
            focused.as_str(),
            Some("default/oven-2"),
            "the focus was taken away"
        );
        // Following a link moves the focus to the new view's heading.
        click(&c, r##"#device-rows a[href="#/device/default/oven-2"]"##).await;
        wait_text(&c, "#device-title", 10, "oven-2's page", |t| t == "default/oven-2").await;
        sim::poll::eventually_async(10, "the focus on the heading", async || {
            let id = c
                .execute("return document.activeElement.id", vec![])
                .await
                .ok()?;
            (id.as_str() == Some("device-title")).then_some(())
        })
        .await;
        wait_text(
            &c,
            r#"tr[data-prop="temperature"] [data-value]"#,
            60,
            "oven-2's temperature from DeviceStatus",
            |t| !t.is_empty(),
        )
        .await;
        // A number field with the model's range and unit by it.
        assert_eq!(
            (
                attr(&c, "#desired-setpoint", "type").await.as_deref(),
                attr(&c, "#desired-setpoint", "max").await.as_deref()
            ),
            (Some("number"), Some("120"))
        );
        assert_eq!(text(&c, "#desired-setpoint-hint").await, "0 to 120 Celsius");
        submit(
            &c,
            "#desired-setpoint",
            r#"form[data-prop="setpoint"] button"#,
            "70",
        )
        .await;
        // Said back before anything is written; Cancel writes nothing and returns to the field.
        wait_text(&c, r#"form[data-prop="setpoint"] .confirm"#, 10, "the confirmation", |t| {
            t.contains("Write 70 Celsius to setpoint of default/oven-2?")
        })
        .await;
        click(&c, r#"form[data-prop="setpoint"] button.cancel"#).await;
        let focused = c
            .execute("return document.activeElement.id", vec![])
            .await
            .expect("the focused element");
        assert_eq!(focused.as_str(), Some("desired-setpoint"));
        let spec = cloud.ok(&["get", "device", "oven-2", "-o", "jsonpath={.spec.properties[1].desired.value}"]);
        assert_eq!(spec, "80", "nothing set before it was confirmed");
        click(&c, r#"form[data-prop="setpoint"] button[type="submit"]:not([name])"#).await;
        click(&c, r#"form[data-prop="setpoint"] button[name="confirm"]"#).await;
        sim::poll::eventually_async(60, "70 in oven-2's register", async || {
            (ovens[1].0.holding(1) == Some(70)).then_some(())
        })
        .await;
        assert_eq!(
            ovens[0].0.holding(1),
            Some(80),
            "oven-1 keeps its set point"
        );
        wait_text(
            &c,
            r#"tr[data-prop="setpoint"]"#,
            60,
            "70 reported and landed",
            |t| t.contains("70") && t.contains("landed"),
        )
        .await;
        // A BOOLEAN is a switch: off, confirmed, the heater's coil off.
        assert_eq!(
            attr(&c, "#desired-heater-on", "role").await.as_deref(),
            Some("switch")
        );
        click(&c, r#"form[data-prop="heater-on"] button[type="submit"]"#).await;
        wait_text(&c, r#"form[data-prop="heater-on"] .confirm"#, 10, "the confirmation", |t| {
            t.contains("Write false to heater-on of default/oven-2?")
        })
        .await;
        click(&c, r#"form[data-prop="heater-on"] button[name="confirm"]"#).await;
        sim::poll::eventually_async(60, "the heater off", async || {
            (ovens[1].0.edit(|s| s.coils.get(&0).copied()) == Some(false)).then_some(())
        })
        .await;
        // Its history, read through the cloud from edge-2 (kubectl's raw GET, then the chart).
        let raw = cloud.ok(&[
            "get",
            "--raw",
            "/apis/devices.kubeedge.io/v1beta1/namespaces/default/devices/oven-2/history?property=setpoint&from=-1h",
        ]);
        let series: serde_json::Value = serde_json::from_str(&raw).expect("a history as JSON");
        assert_eq!(series["node"], "edge-2", "{series}");
        assert!(
            series["points"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["v"].as_f64() == Some(70.0))),
            "70 in the set point's history from edge-2: {series}"
        );
        // Bad questions get the gateway's (or the API's) answer naming what was wrong.
        let history = "/apis/devices.kubeedge.io/v1beta1/namespaces/default/devices/oven-2/history";
        for (query, said) in [
            ("?property=setpoint&from=yesterday", r#"node edge-2: from="yesterday": give ms since the epoch"#),
            ("?property=pressure", r#"node edge-2: default/oven-2 has no property "pressure""#),
            ("", "give the property: ?property=NAME"),
            ("?property=setpoint&step=500", "node edge-2: step 500 ms: give at least 1000"),
        ] {
            let (ok, text) = cloud.kubectl(&["get", "--raw", &format!("{history}{query}")]);
            assert!(!ok && text.contains(said), "{query}: {text}");
        }
        // Only read: a POST is refused, naming why.
        let body = dir.path().join("empty.json");
        std::fs::write(&body, "{}").expect("body");
        let (ok, text) = cloud.kubectl(&[
            "create",
            "--raw",
            &format!("{history}?property=setpoint"),
            "-f",
            body.to_str().expect("path"),
        ]);
        assert!(!ok && text.contains("devices/history only answers GET"), "{text}");
        wait_text(&c, "#history-summary", 40, "the chart from edge-2", |t| {
            t.starts_with("setpoint, the last hour in steps of 30s: 70 to 80 Celsius, last 70 Celsius")
        })
        .await;
        // Who set it, from the Device's events.
        wait_text(&c, "#change-rows", 30, "the change with its user", |t| {
            t.contains("setpoint set to 70 (was 80) by ")
        })
        .await;
        assert_accessible(&c, "the fleet's device page").await;
        screenshot(&c, "fleet-device.png").await;
        // Set on the gateway over the spec's 70: an override, in DeviceStatus and on the page.
        nodes[1].kectl(&["twin", "set", "oven-2", "setpoint", "75"]);
        sim::poll::eventually_async(60, "75 in oven-2's register", async || {
            (ovens[1].0.holding(1) == Some(75)).then_some(())
        })
        .await;
        wait_text(
            &c,
            r#"tr[data-prop="setpoint"] [data-override]"#,
            60,
            "the override on the fleet page",
            |t| t.contains("set at the edge to 75") && t.contains("spec asks 70"),
        )
        .await;
        let od = cloud.status("oven-2")["status"]["twins"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["propertyName"] == "setpoint").cloned())
            .unwrap_or_default();
        assert_eq!(
            (
                &od["observedDesired"]["value"],
                &od["observedDesired"]["metadata"]["source"]
            ),
            (&serde_json::json!("75"), &serde_json::json!("edge")),
            "{od}"
        );
        screenshot(&c, "fleet-override.png").await;
        // edge-2 killed: its device is unknown, says why, and its values are stale; back with
        // edgecore, it is online again and they are not.
        nodes[1].kill_edgecore();
        wait_text(&c, "#device-state", 60, "unknown, with the reason", |t| {
            t.contains("unknown") && t.contains("node edge-2 lost its link to the cloud")
        })
        .await;
        wait_text(
            &c,
            r#"tr[data-prop="temperature"]"#,
            10,
            "the value marked stale",
            |t| t.contains("stale"),
        )
        .await;
        let status = cloud.status("oven-2")["status"].clone();
        assert_eq!(status["state"], "unknown", "{status}");
        assert!(
            status["extensions"]["stateSince"].is_string(),
            "since when: {status}"
        );
        // The chart says why there is none now: the gateway is away.
        click(&c, r#"#history-ranges button[data-range="24h"]"#).await;
        wait_text(&c, "#history-summary", 30, "the gateway away, said", |t| {
            t.contains("no history: node edge-2 has no session with this cloudcore")
        })
        .await;
        screenshot(&c, "fleet-node-lost.png").await;
        c.goto(&format!("{url}#/devices")).await.expect("devices");
        wait_text(
            &c,
            r#"tr[data-device="default/oven-2"]"#,
            10,
            "the lost device's values marked stale in the list, its state with the reason",
            |t| t.contains("stale") && t.contains("unknown") && t.contains("lost its link"),
        )
        .await;
        // On a phone's screen: nothing wider than it, every column there.
        c.set_window_size(390, 844).await.expect("a phone's size");
        for view in ["#/", "#/devices", "#/device/default/oven-2"] {
            c.goto(&format!("{url}{view}")).await.expect("a view");
            wait_text(&c, "#health", 10, "the page live", |t| t.ends_with("live")).await;
            let wide = overflow(&c).await;
            assert!(wide <= 0, "{view} is {wide} px wider than a phone's screen");
            assert_accessible(&c, &format!("the fleet's {view} on a phone")).await;
        }
        wait_text(&c, r#"form[data-prop="setpoint"]"#, 10, "the set point's form on a phone", |t| {
            t.contains("Set")
        })
        .await;
        c.set_window_size(1100, 800).await.expect("back to a desktop's size");
        nodes[1].revive();
        wait_text(&c, "#device-state", 60, "online again", |t| {
            t.contains("online") && !t.contains("lost its link")
        })
        .await;
        wait_text(
            &c,
            r#"tr[data-prop="temperature"]"#,
            10,
            "no longer stale",
            |t| !t.contains("stale") && t.contains("current"),
        )
        .await;
        // A gateway's own page says whether its cloud link holds.
        c.goto(&format!("{}/ui", nodes[0].http))
            .await
            .expect("edge-1's page");
        wait_text(&c, "#health", 30, "the cloud link up", |t| {
            t.contains("cloud connected")
        })
        .await;
        drop(cloud.proc.take());
        wait_text(&c, "#health", 60, "the cloud link cut", |t| {
            t.contains("cloud link cut")
        })
        .await;
        c.close().await.expect("closed");
    });
}

/// 120 devices on one gateway: the list shows 50 at a time with the pages to go through, sorts
/// by a column both ways (saying so to screen readers), and counts the devices per state.
#[test]
fn a_long_device_list_pages_and_sorts() {
    let Some(driver) = chromedriver() else {
        return;
    };
    let mut manifest = String::from(
        "apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata: {name: m, namespace: default}\nspec:\n  protocol: modbus\n  properties:\n    - {name: v, type: INT, accessMode: ReadOnly}\n",
    );
    for i in 0..120 {
        manifest.push_str(&format!(
            "---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {{name: d{i:03}, namespace: default}}\nspec:\n  deviceModelRef: {{name: m}}\n  nodeName: test-node\n  protocol: {{protocolName: modbus, configData: {{ip: 127.0.0.1, port: 1}}}}\n  properties:\n    - {{name: v, visitors: {{protocolName: modbus, configData: {{register: HoldingRegister, offset: 0}}}}}}\n"
        ));
    }
    let node = Node::start(&manifest);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        let c = browser(&driver).await;
        c.goto(&format!("{}/ui", node.http))
            .await
            .expect("the page");
        wait_text(&c, "#device-count", 30, "the first page", |t| {
            t == "1 to 50 of 120 devices (120 in all)"
        })
        .await;
        wait_text(&c, "#state-counts", 10, "the count per state", |t| {
            t == "120 unknown"
        })
        .await;
        wait_text(
            &c,
            "#device-rows tr:first-child td:first-child",
            10,
            "d000 first",
            |t| t == "default/d000",
        )
        .await;
        click(&c, "#page-next").await;
        wait_text(&c, "#device-count", 10, "the second page", |t| {
            t == "51 to 100 of 120 devices (120 in all)"
        })
        .await;
        wait_text(
            &c,
            "#device-rows tr:first-child td:first-child",
            10,
            "d050 first",
            |t| t == "default/d050",
        )
        .await;
        // By device, the other way: the last one first, back on page 2 of the new order.
        click(&c, r#"button[data-sort="id"]"#).await;
        wait_text(
            &c,
            "#device-rows tr:first-child td:first-child",
            10,
            "descending",
            |t| t == "default/d069",
        )
        .await;
        assert_eq!(
            attr(&c, "#devices th:first-child", "aria-sort")
                .await
                .as_deref(),
            Some("descending")
        );
        click(&c, "#page-prev").await;
        wait_text(
            &c,
            "#device-rows tr:first-child td:first-child",
            10,
            "d119 first",
            |t| t == "default/d119",
        )
        .await;
        assert_accessible(&c, "a long device list").await;
        c.close().await.expect("closed");
    });
}
