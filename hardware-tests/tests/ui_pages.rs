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
    let (oven, _oven_rt, node, mapper) = oven_gateway(true);
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

        // A value above the model's maximum: refused by the field before anything is asked.
        submit(
            &c,
            "#desired-setpoint",
            r#"form[data-prop="setpoint"] button"#,
            "500",
        )
        .await;
        wait_text(
            &c,
            "#desired-setpoint-error",
            15,
            "the refusal by the field",
            |t| t.contains("500 is above the maximum, 120 Celsius"),
        )
        .await;
        assert_eq!(
            attr(&c, r#"form[data-prop="setpoint"] .confirm"#, "hidden")
                .await
                .as_deref(),
            Some("true"),
            "a value out of range is not asked about"
        );
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
        // The chart's labels as the phone shows them: readable (they were 7 px).
        sim::poll::eventually_async(20, "the chart's labels at least 11 px high", async || {
            let px = c
                .execute(
                    "const t = document.querySelector('#history-chart text.tick'); return t ? t.getBoundingClientRect().height : 0",
                    vec![],
                )
                .await
                .ok()?
                .as_f64()?;
            (px >= 11.0).then_some(())
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

/// The quickstart's oven (its temperature moving when `animated`) on a gateway of its own
/// (`test-node`) with mapper-modbus: the simulator, its runtime, the gateway and the mapper.
fn oven_gateway(animated: bool) -> (Sim, tokio::runtime::Runtime, Node, sim::Proc) {
    let oven = Sim::oven();
    let (port, rt) = oven.start("127.0.0.1:0").expect("the oven");
    if animated {
        rt.spawn(oven.clone().animate_oven(Duration::from_millis(300)));
    }
    let node = Node::start(&oven_on("oven-1", "test-node", port));
    let mapper = node.mapper("mapper-modbus", "modbus", free_port());
    (oven, rt, node, mapper)
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
            t.starts_with("2 nodes · 2 devices · live, following ")
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
        // A BOOLEAN is a switch showing the heater on (as reported); turned off, confirmed, the
        // heater's coil off.
        assert_eq!(
            attr(&c, "#desired-heater-on", "role").await.as_deref(),
            Some("switch")
        );
        sim::poll::eventually_async(30, "the switch on, as the heater is", async || {
            let on = c
                .execute("return document.getElementById('desired-heater-on').checked", vec![])
                .await
                .ok()?;
            (on.as_bool() == Some(true)).then_some(())
        })
        .await;
        click(&c, "#desired-heater-on").await;
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
            wait_text(&c, "#health", 10, "the page live", |t| t.contains("· live, following ")).await;
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
        // The page follows the values of the devices it shows, not the gateway's: the event
        // stream it holds names the 50 on screen.
        let key = sim::poll::eventually_async(10, "the stream for the page shown", async || {
            let key = c.execute("return following.key", vec![]).await.ok()?;
            let key = key.as_str()?.to_string();
            key.contains("default/d119").then_some(key)
        })
        .await;
        assert_eq!(key.split(',').count(), 50, "{key}");
        assert!(!key.contains("default/d000,"), "{key}");
        // Sorted by state, the devices that need someone come first: two online ones go to
        // the end, after the unknown ones.
        for d in ["d003", "d117"] {
            sim::run(std::process::Command::new("mosquitto_pub").args([
                "-p",
                &node.mqtt.to_string(),
                "-t",
                &format!("$hw/events/device/default/{d}/state/update"),
                "-m",
                r#"{"event_id":"","timestamp":0,"state":"online"}"#,
            ]));
        }
        wait_text(&c, "#state-counts", 20, "two online", |t| {
            t == "118 unknown · 2 online"
        })
        .await;
        click(&c, r#"button[data-sort="state"]"#).await;
        wait_text(
            &c,
            "#device-rows tr:first-child td:nth-child(2)",
            10,
            "unknown first",
            |t| t.starts_with("unknown"),
        )
        .await;
        click(&c, "#page-next").await;
        click(&c, "#page-next").await;
        wait_text(&c, "#device-rows", 10, "online last", |t| {
            t.trim_end().ends_with("modbus") && t.contains("default/d117")
        })
        .await;
        let last = text(&c, "#device-rows tr:last-child td:nth-child(2)").await;
        assert!(last.starts_with("online"), "the last row: {last}");
        assert_accessible(&c, "a long device list").await;
        c.close().await.expect("closed");
    });
}

/// Whether the gateway page's switch for the heater is on.
async fn switch_on(c: &sim::browser::fantoccini::Client) -> Option<bool> {
    c.execute(
        "const s = document.getElementById('desired-heater-on'); return s ? s.checked : null",
        vec![],
    )
    .await
    .ok()?
    .as_bool()
}

/// The controls show the truth: the heater's switch is on while the heater is (and follows a
/// value set elsewhere), a number field refuses letters and out-of-range values before asking,
/// a question shows what the property holds now, and a newer value set while it is open (by
/// kectl here) is said there and not overwritten by Write; the switch's history counts its
/// toggles and its spark moves.
#[test]
fn controls_show_the_live_value_and_a_question_never_overwrites_a_newer_one() {
    let Some(driver) = chromedriver() else {
        return;
    };
    let (oven, _oven_rt, node, _mapper) = oven_gateway(false);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        let c = browser(&driver).await;
        c.goto(&format!("{}/ui#/device/default/oven-1", node.http))
            .await
            .expect("the oven's page");
        wait_text(
            &c,
            r#"tr[data-prop="heater-on"] [data-value]"#,
            30,
            "the heater on",
            |t| t == "true",
        )
        .await;
        sim::poll::eventually_async(10, "the switch on, as the heater is", async || {
            (switch_on(&c).await == Some(true)).then_some(())
        })
        .await;
        // Set elsewhere (kectl): the switch follows.
        node.kectl(&["twin", "set", "oven-1", "heater-on", "false"]);
        sim::poll::eventually_async(30, "the switch off, as kectl set it", async || {
            (switch_on(&c).await == Some(false)).then_some(())
        })
        .await;
        sim::poll::eventually_async(30, "the coil off", async || {
            (oven.edit(|s| s.coils.get(&0).copied()) == Some(false)).then_some(())
        })
        .await;
        // Read back off by the mapper (its next read), so that the history has both values.
        wait_text(
            &c,
            r#"tr[data-prop="heater-on"] [data-value]"#,
            30,
            "the heater reported off",
            |t| t == "false",
        )
        .await;
        node.kectl(&["twin", "set", "oven-1", "heater-on", "true"]);
        sim::poll::eventually_async(30, "the switch on again", async || {
            (switch_on(&c).await == Some(true)).then_some(())
        })
        .await;
        // The number field holds the set point; letters and a value out of range are refused
        // by the field, with nothing asked.
        wait_text(
            &c,
            r#"tr[data-prop="setpoint"] [data-value]"#,
            30,
            "80",
            |t| t == "80",
        )
        .await;
        let value = c
            .execute(
                "return document.getElementById('desired-setpoint').value",
                vec![],
            )
            .await
            .expect("the field's value");
        assert_eq!(value.as_str(), Some("80"), "the field holds the set point");
        let setpoint = r#"form[data-prop="setpoint"] button"#;
        for (typed, said) in [
            ("abc", "type a number first"),
            ("12.5", "12.5 is not a whole number"),
            ("-3", "-3 is below the minimum, 0 Celsius"),
        ] {
            submit(&c, "#desired-setpoint", setpoint, typed).await;
            wait_text(&c, "#desired-setpoint-error", 10, said, |t| {
                t.contains(said)
            })
            .await;
            assert_eq!(
                attr(&c, r#"form[data-prop="setpoint"] .confirm"#, "hidden")
                    .await
                    .as_deref(),
                Some("true"),
                "{typed:?} was asked about"
            );
        }
        // A question shows the values now; 85 set by kectl while it is open is said there, and
        // Write does not put 100 over it.
        submit(&c, "#desired-setpoint", setpoint, "100").await;
        wait_text(
            &c,
            r#"form[data-prop="setpoint"] .confirm"#,
            10,
            "the question",
            |t| {
                t.contains("Write 100 Celsius to setpoint of default/oven-1?")
                    && t.contains("Now: desired 80 Celsius, reported 80 Celsius.")
            },
        )
        .await;
        node.kectl(&["twin", "set", "oven-1", "setpoint", "85"]);
        wait_text(
            &c,
            r#"form[data-prop="setpoint"] .moved"#,
            30,
            "the move said",
            |t| t.contains("changed to 85 while this question was open"),
        )
        .await;
        click(&c, r#"form[data-prop="setpoint"] button[name="confirm"]"#).await;
        wait_text(&c, "#desired-setpoint-error", 15, "not written", |t| {
            t.contains("not written") && t.contains("setpoint is now 85")
        })
        .await;
        sim::poll::eventually_async(30, "85 in the register", async || {
            (oven.holding(1) == Some(85)).then_some(())
        })
        .await;
        let desired = node.twin("default/oven-1").expect("the twin")["properties"]["setpoint"]
            ["desired"]["value"]
            .clone();
        assert_eq!(desired, "85", "100 was written over the newer 85");
        // Asked again, it is written.
        submit(&c, "#desired-setpoint", setpoint, "90").await;
        click(&c, r#"form[data-prop="setpoint"] button[name="confirm"]"#).await;
        sim::poll::eventually_async(30, "90 in the register", async || {
            (oven.holding(1) == Some(90)).then_some(())
        })
        .await;
        // The switch's toggles are in its history's last hour, and its spark moves.
        // (The history takes the twin's changes as they are folded: a moment later.)
        let url = format!(
            "{}/api/v1/devices/default/oven-1/properties/heater-on/history?from=-1h&step=30s",
            node.http
        );
        sim::poll::eventually_async(30, "the switch's last hour from 0 to 1", async || {
            let series: serde_json::Value = serde_json::from_str(&http_get(&url)).ok()?;
            let (lo, hi) =
                series["buckets"]
                    .as_array()?
                    .iter()
                    .fold((f64::MAX, f64::MIN), |(lo, hi), b| {
                        (
                            lo.min(b["min"].as_f64().unwrap_or(f64::MAX)),
                            hi.max(b["max"].as_f64().unwrap_or(f64::MIN)),
                        )
                    });
            ((lo, hi) == (0.0, 1.0)).then_some(())
        })
        .await;
        sim::poll::eventually_async(10, "the switch's spark moving", async || {
            let spark = attr(&c, r#"tr[data-prop="heater-on"] svg.spark path"#, "d").await?;
            spark.contains(" V").then_some(())
        })
        .await;
        assert_accessible(&c, "the oven's page with a question open").await;
        c.close().await.expect("closed");
    });
}

/// The body of a GET of `url`.
fn http_get(url: &str) -> String {
    ureq::get(url)
        .call()
        .expect("an answer")
        .body_mut()
        .read_to_string()
        .expect("a body")
}

/// The fleet page never claims what it does not know, and its views share one connection:
/// - the Jobs view (three watches more than the page's four) shows a ConfigUpdateJob applied
///   while it is open (over HTTP/1.1 a browser's six connections were taken, and it never did);
/// - a viewer (the `view` role) is told it may not list nodes or jobs, not that there are none,
///   and is offered no form to set a value;
/// - with the API gone, every device is `unknown` (the API unreachable since ...) and every
///   value `stale`, nodes too, and the health line says so.
#[test]
fn the_fleet_page_says_what_it_does_not_know_and_shares_one_connection() {
    let Some((driver, mut cloud, _oven, port, _oven_rt)) = fleet_and_oven() else {
        return;
    };
    cloud.apply(&oven_on("oven-1", "edge-1", port));
    add_viewer(&mut cloud);
    let node = Node::start_named(&sim::bin_dir(), "edge-1", "", &cloud.edge_config());
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
    let url = format!("https://127.0.0.1:{}/ui", cloud.api);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        // The viewer.
        let c = sim::browser::signed_in(&driver, &url, VIEWER).await;
        wait_text(&c, "#node-rows", 30, "nodes not listable", |t| {
            t.contains("you may not list nodes") && !t.contains("no node has joined")
        })
        .await;
        wait_text(&c, "#health", 30, "what the viewer may not see", |t| {
            t.contains("not allowed to see: nodes")
        })
        .await;
        c.goto(&format!("{url}#/jobs")).await.expect("jobs");
        wait_text(&c, "#job-rows", 30, "jobs not listable", |t| {
            t.contains("you may not list") && !t.contains("no job yet")
        })
        .await;
        c.goto(&format!("{url}#/device/default/oven-1")).await.expect("the oven");
        wait_text(&c, r#"tr[data-prop="setpoint"]"#, 60, "no form for a viewer", |t| {
            t.contains("you may not set it")
        })
        .await;
        assert!(
            c.find(sim::browser::fantoccini::Locator::Css("form.desired")).await.is_err(),
            "a viewer is offered a form"
        );
        assert_accessible(&c, "the fleet's device page for a viewer").await;
        c.close().await.expect("closed");

        // The admin, on the Jobs view: seven watches on one connection, a new job shows.
        let c = sim::browser::signed_in(&driver, &format!("{url}#/jobs"), &cloud.admin_token()).await;
        wait_text(&c, "#health", 60, "every watch live", |t| {
            t.contains("live, following 7 watches")
        })
        .await;
        cloud.apply(
            "apiVersion: operations.kubeedge.io/v1alpha2\nkind: ConfigUpdateJob\nmetadata: {name: metrics-9}\nspec:\n  nodeNames: [edge-1]\n  updateFields: {cloud.metricsSeconds: \"9\"}\n",
        );
        wait_text(&c, "#job-rows", 30, "the new job in the Jobs view", |t| {
            t.contains("metrics-9")
        })
        .await;

        // The API gone: nothing is claimed.
        c.goto(&format!("{url}#/devices")).await.expect("devices");
        wait_text(&c, r#"tr[data-device="default/oven-1"]"#, 60, "the oven online", |t| {
            t.contains("online") && t.contains("setpoint 80")
        })
        .await;
        cloud.kill9();
        wait_text(&c, r#"tr[data-device="default/oven-1"]"#, 60, "unknown and stale", |t| {
            t.contains("unknown")
                && t.contains("the API unreachable since")
                && t.contains("stale")
                && !t.contains("online")
        })
        .await;
        wait_text(&c, "#health", 10, "the API lost", |t| {
            t.contains("the API does not answer since")
        })
        .await;
        c.goto(&format!("{url}#/")).await.expect("nodes");
        wait_text(&c, r#"tr[data-node="edge-1"]"#, 30, "the node unknown", |t| {
            t.contains("unknown") && !t.contains("Ready")
        })
        .await;
        assert_accessible(&c, "the fleet's nodes with the API lost").await;
        c.close().await.expect("closed");
    });
}

/// The browser's driver, a cloud and an oven (its port and runtime); none without chromium.
fn fleet_and_oven() -> Option<(
    sim::browser::Driver,
    sim::stack::Cloud,
    Sim,
    u16,
    tokio::runtime::Runtime,
)> {
    let driver = chromedriver()?;
    let cloud = sim::stack::Cloud::start();
    let oven = Sim::oven();
    let (port, rt) = oven.start("127.0.0.1:0").expect("an oven");
    Some((driver, cloud, oven, port, rt))
}

/// A viewer's token: the view role, cluster-wide.
const VIEWER: &str = "viewer-0f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// Gives `cloud` a user with [`VIEWER`]'s token bound to the view role (a restart reads the
/// token file).
fn add_viewer(cloud: &mut sim::stack::Cloud) {
    let tokens = cloud.dir.path().join("data/tokens.csv");
    cloud.kill9();
    let mut text = std::fs::read_to_string(&tokens).expect("tokens.csv");
    text.push_str(&format!("{VIEWER},viewer,viewer,\"viewers\"\n"));
    std::fs::write(&tokens, text).expect("tokens.csv written");
    cloud.spawn();
    cloud.ok(&[
        "create",
        "clusterrolebinding",
        "viewers",
        "--clusterrole=view",
        "--user=viewer",
    ]);
}

#[test]
/// Alarms end to end: a rule the API refuses names its line; the oven overheats, the gateway
/// raises the alarm (MQTT, the event stream, DeviceStatus), the fleet page lists it with the
/// header's count, the admin acknowledges it there, the gateway's page says by whom; inside the
/// hysteresis band it stands, below it clears and leaves both tables; raised again, the
/// gateway's operator acknowledges it on the gateway's page; a viewer sees it and may not
/// acknowledge; each change is an Event on the Device, and so is a set point moved on the
/// gateway (the fleet's audit).
fn an_alarm_raised_on_the_gateway_is_acknowledged_on_the_fleet_page_and_cleared() {
    let Some((driver, mut cloud, oven, port, _oven_rt)) = fleet_and_oven() else {
        return;
    };
    let with_rules = |rules: &str| {
        oven_on("oven-1", "edge-1", port).replace(
            "  labels:\n    description: curing-oven-1\n",
            &format!(
                "  labels:\n    description: curing-oven-1\n  annotations:\n    devices.kubeedge.io/alarms: |\n{}",
                rules.lines().map(|l| format!("      {l}\n")).collect::<String>()
            ),
        )
    };
    // A rule that cannot be read is refused by the API, naming its line and what is wrong.
    let file = cloud.dir.path().join("bad-rules.yaml");
    std::fs::write(&file, with_rules("too-hot: temperature > 90 clear < 95")).expect("manifest");
    let (ok, out) = cloud.kubectl(&["apply", "-f", file.to_str().expect("path")]);
    assert!(!ok, "a bad rule stored: {out}");
    assert!(
        out.contains("line 1: rule too-hot: clear < 95 is on the wrong side of the limit 90"),
        "{out}"
    );
    cloud.apply(&with_rules(
        "too-hot: temperature > 90 clear < 85 critical\nheater-off: heater-on == false warning",
    ));
    add_viewer(&mut cloud);
    let node = Node::start_named(&sim::bin_dir(), "edge-1", "", &cloud.edge_config());
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
    // An app on the gateway's broker hears every change of the oven's alarms.
    let mqtt = sim::have("mosquitto_sub").then(|| {
        std::process::Command::new("mosquitto_sub")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &node.mqtt.to_string(),
                "-v",
                "-C",
                "3",
            ])
            .args(["-t", "$hw/events/device/default/oven-1/alarm"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("mosquitto_sub")
    });
    let url = format!("https://127.0.0.1:{}/ui", cloud.api);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let c =
            sim::browser::signed_in(&driver, &format!("{url}#/alarms"), &cloud.admin_token()).await;
        wait_text(
            &c,
            "#alarm-rows",
            60,
            "no alarm while the oven is at 21.5",
            |t| t.contains("no alarm"),
        )
        .await;
        // The oven overheats: the gateway raises the alarm, the fleet page shows it.
        oven.edit(|s| {
            s.holding.insert(0, 953);
        });
        let row = r#"tr[data-alarm="default/oven-1/too-hot"]"#;
        wait_text(&c, row, 60, "the alarm raised", |t| {
            t.contains("critical")
                && t.contains("temperature 95.3 > 90")
                && t.contains("active, unacknowledged")
        })
        .await;
        wait_text(&c, "#alarm-count", 10, "the header's count", |t| {
            t == "1 alarm active · 1 unacknowledged"
        })
        .await;
        assert_accessible(&c, "the fleet's alarms").await;
        screenshot(&c, "fleet-alarms.png").await;
        click(&c, &format!("{row} button[data-ack]")).await;
        wait_text(&c, row, 60, "acknowledged by the admin", |t| {
            t.contains("active, acknowledged by admin")
        })
        .await;
        wait_text(&c, "#alarm-count", 30, "nothing left unacknowledged", |t| {
            t == "1 alarm active · 0 unacknowledged"
        })
        .await;
        // The gateway's own page says the same, from its own evaluation.
        let g = browser(&driver).await;
        g.goto(&format!("{}/ui#/alarms", node.http))
            .await
            .expect("the gateway's page");
        wait_text(
            &g,
            row,
            60,
            "the gateway's alarm, acknowledged from the cloud",
            |t| t.contains("temperature 95.3 > 90") && t.contains("acknowledged by admin"),
        )
        .await;
        wait_text(&g, "#alarm-count", 10, "the gateway's count", |t| {
            t == "1 alarm active · 0 unacknowledged"
        })
        .await;
        assert_accessible(&g, "the gateway's alarms").await;
        // Inside the hysteresis band it stands; below its clear limit it clears and, already
        // acknowledged, leaves both tables.
        oven.edit(|s| {
            s.holding.insert(0, 870);
        });
        sim::poll::eventually_async(30, "the gateway reads 87", async || {
            let t = node.twin("default/oven-1")?;
            (t["properties"]["temperature"]["reported"]["value"] == "87").then_some(())
        })
        .await;
        let (_, alarms) = node.get("/api/v1/alarms");
        assert_eq!(
            alarms["items"][0]["status"], "active-acknowledged",
            "{alarms}"
        );
        wait_text(&c, row, 10, "still active at 87", |t| t.contains("active")).await;
        oven.edit(|s| {
            s.holding.insert(0, 800);
        });
        wait_text(&c, "#alarm-rows", 60, "cleared and gone", |t| {
            t.contains("no alarm")
        })
        .await;
        wait_text(&g, "#alarm-rows", 60, "gone on the gateway", |t| {
            t.contains("no alarm")
        })
        .await;
        wait_text(&c, "#alarm-count", 10, "no count", |t| t.is_empty()).await;
        // Raised again; the gateway's operator acknowledges it on the gateway's page.
        oven.edit(|s| {
            s.holding.insert(0, 990);
        });
        wait_text(&g, row, 60, "raised again", |t| {
            t.contains("active, unacknowledged")
        })
        .await;
        click(&g, &format!("{row} button[data-ack]")).await;
        wait_text(&c, row, 60, "acknowledged on the gateway", |t| {
            t.contains("acknowledged by the gateway's operator")
        })
        .await;
        g.close().await.expect("closed");
        c.close().await.expect("closed");
        // A viewer sees the alarm and is not offered to acknowledge it.
        let v = sim::browser::signed_in(&driver, &format!("{url}#/alarms"), VIEWER).await;
        wait_text(&v, row, 60, "the viewer sees it", |t| {
            t.contains("active, acknowledged")
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            v.find(sim::browser::fantoccini::Locator::Css("button[data-ack]"))
                .await
                .is_err(),
            "a viewer is offered to acknowledge"
        );
        // A set point moved on the gateway (kectl, its local API) is in the fleet's audit too.
        node.kectl(&["twin", "set", "default/oven-1", "setpoint", "70"]);
        v.goto(&format!("{url}#/device/default/oven-1"))
            .await
            .expect("the oven");
        wait_text(
            &v,
            "#change-rows",
            60,
            "the gateway's change in the audit",
            |t| t.contains("setpoint set to 70 on the gateway edge-1"),
        )
        .await;
        v.close().await.expect("closed");
    });
    // Each change is an Event on the Device.
    let events = cloud.ok(&[
        "get",
        "events",
        "-n",
        "default",
        "--field-selector",
        "involvedObject.name=oven-1",
    ]);
    for (reason, says) in [
        ("AlarmRaised", "too-hot (critical): temperature 95.3 > 90"),
        ("AlarmAcknowledged", "too-hot acknowledged by admin"),
        ("AlarmCleared", "too-hot cleared"),
    ] {
        assert!(
            events.contains(reason) && events.contains(says),
            "{reason}: {events}"
        );
    }
    if let Some(sub) = mqtt {
        let out = sub.wait_with_output().expect("mosquitto_sub");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(r#""rule":"too-hot""#) && text.contains(r#""active":true"#),
            "{text}"
        );
        assert!(text.contains(r#""ackedBy":"admin""#), "{text}");
        assert!(
            text.contains(r#""clearedAt""#) && text.contains(r#""ended":true"#),
            "{text}"
        );
    } else {
        eprintln!(
            "mosquitto_sub not installed (Debian's mosquitto-clients): the MQTT alarm topic not checked here"
        );
    }
}
