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

use sim::browser::{browser, chromedriver, screenshot, submit, wait_text};
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
        screenshot(&c, "gateway-devices.png").await;
        // The mappers: the one serving the oven, alive, with its device.
        c.goto(&format!("{}/ui#/mappers", node.http))
            .await
            .expect("the mappers");
        wait_text(&c, "#mapper-rows", 30, "the mapper alive with its device", |t| {
            t.contains("modbus") && t.contains("alive") && t.contains("default/oven-1")
        })
        .await;
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
        wait_text(&c, r#"tr[data-prop="setpoint"] [data-override]"#, 10, "the override", |t| {
            t.contains("set at the edge") && t.contains("spec asks 80")
        })
        .await;
        screenshot(&c, "gateway-oven.png").await;

        // A value above the model's maximum: the twin API's error, by the field.
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

        // On a phone's screen: nothing wider than it, the form still there.
        c.set_window_size(390, 844).await.expect("a phone's size");
        let wide = c
            .execute(
                "return document.documentElement.scrollWidth - document.documentElement.clientWidth",
                vec![],
            )
            .await
            .expect("measured");
        assert!(
            wide.as_i64().unwrap_or(1) <= 0,
            "the page is {wide} px wider than a phone's screen"
        );
        wait_text(&c, r#"form[data-prop="setpoint"]"#, 10, "the form", |t| {
            t.contains("Set setpoint")
        })
        .await;
        screenshot(&c, "gateway-oven-phone.png").await;

        // edgecore gone: the page no longer shows the device as it last knew it, but unknown,
        // because edgecore is unreachable, with its values stale.
        drop(node);
        wait_text(&c, "#device-state", 30, "unknown: edgecore unreachable", |t| {
            t.contains("unknown") && t.contains("edgecore unreachable since")
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
        // No token yet: the page asks for one.
        submit(&c, "#token", "#login button", &token).await;
        for i in 1..=2 {
            wait_text(
                &c,
                &format!(r#"tr[data-node="edge-{i}"]"#),
                60,
                "the node Ready with its device",
                |t| t.contains("Ready") && !t.contains("NotReady") && t.contains('1'),
            )
            .await;
        }
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
        c.goto(&format!("{url}#/device/default/oven-2"))
            .await
            .expect("oven-2's page");
        wait_text(
            &c,
            r#"tr[data-prop="temperature"] [data-value]"#,
            60,
            "oven-2's temperature from DeviceStatus",
            |t| !t.is_empty(),
        )
        .await;
        submit(
            &c,
            "#desired-setpoint",
            r#"form[data-prop="setpoint"] button"#,
            "70",
        )
        .await;
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
        screenshot(&c, "fleet-node-lost.png").await;
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
