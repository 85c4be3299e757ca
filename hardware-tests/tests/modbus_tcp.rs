//! End to end over Modbus TCP: the real `edgecore`, `mapper-modbus` and `kectl` binaries against
//! pymodbus (`sims/modbus_server.py`, a server the project did not write). Needs `python3` with
//! `pymodbus` 3.16 (`.ci/run` installs it).

use sim::{
    Node, PyModbus, agent, eventually, free_port, get, mqtt_messages, post, read_holding, reported,
};

fn manifests(port: u16) -> String {
    sim::fill(
        include_str!("manifests/modbus_tcp.yaml"),
        &[("port", &port)],
    )
}

#[test]
fn values_flow_desired_values_land_and_faults_stay_contained() {
    let sim_port = free_port();
    let mut sim = PyModbus::start(sim_port);
    let node = Node::start(&manifests(sim_port));
    let rest_port = free_port();
    let mapper = node.mapper("mapper-modbus", "modbus", rest_port);
    let rest = format!("http://127.0.0.1:{rest_port}");
    let http = agent();

    // Reported values of every type reach the twin; the property whose register does not exist
    // fails alone. The device's state is a report of its own, which may come after the values.
    let twin = eventually(20, "reported values and the state online", || {
        let t = node.twin("default/plc-1")?;
        (reported(&t, "temperature").is_some()
            && reported(&t, "heater").is_some()
            && reported(&t, "setpoint").as_deref() == Some("42")
            && t["state"] == "online")
            .then_some(t)
    });
    assert_eq!(reported(&twin, "temperature").as_deref(), Some("65"));
    let pressure: f64 = reported(&twin, "pressure")
        .and_then(|v| v.parse().ok())
        .expect("pressure is a number");
    assert!((pressure - 123.456).abs() < 1e-3, "{pressure}");
    assert_eq!(reported(&twin, "label").as_deref(), Some("PLC-7"));
    assert_eq!(reported(&twin, "heater").as_deref(), Some("true"));
    assert_eq!(reported(&twin, "missing"), None);
    assert_eq!(twin["state"], "online", "{twin}");
    // The manifest's desired value was written to the register.
    assert_eq!(read_holding(sim_port, 30), 42);

    // The mapper's REST API: the failing property names its exception; a live read.
    let (status, dev) = get(&http, &format!("{rest}/api/v1/device/default/plc-1"));
    assert_eq!(status, 200, "{dev}");
    let err = dev["data"]["properties"]["missing"]["error"]
        .as_str()
        .unwrap_or_default();
    assert!(err.contains("exception"), "{dev}");
    let (status, live) = get(&http, &format!("{rest}/api/v1/device/default/plc-1/label"));
    assert_eq!(
        (status, live["data"]["value"].as_str()),
        (200, Some("PLC-7")),
        "{live}"
    );

    // The failing property's error is on its twin with its time (kectl shows it), and the
    // device stays online: live reads of that property do not flip it to unhealthy either.
    let t = eventually(10, "the error of `missing` in the twin", || {
        let t = node.twin("default/plc-1")?;
        t["properties"]["missing"]["error"]["message"]
            .as_str()
            .filter(|m| m.contains("exception"))?;
        Some(t)
    });
    assert!(
        t["properties"]["missing"]["error"]["timestamp"].as_i64() > Some(0),
        "{t}"
    );
    assert_eq!(t["state"], "online", "{t}");
    let shown = node.kectl(&["twin", "get", "default/plc-1"]);
    assert!(shown.contains("(error: "), "{shown}");
    let states = mqtt_messages(
        node.mqtt,
        "$hw/events/device/default/plc-1/state/update/result",
    )
    .expect("subscribe");
    for _ in 0..5 {
        let _ = get(
            &http,
            &format!("{rest}/api/v1/device/default/plc-1/missing"),
        );
    }
    std::thread::sleep(std::time::Duration::from_millis(600));
    let seen: Vec<String> = states
        .try_iter()
        .filter_map(|m| {
            let v: serde_json::Value = serde_json::from_slice(&m.payload).ok()?;
            Some(v["device"]["state"].as_str()?.to_string())
        })
        .collect();
    assert!(seen.iter().all(|s| s == "online"), "{seen:?}");

    // A device with a typo in its configData: edgecore skips it with the key named, as
    // `kectl validate` does and as its mapper would, so the mapper never gets it; the others run.
    let log = node.edgecore.log_text();
    assert!(
        log.contains("plc-typo")
            && log.contains("\"HoldingRegistr\" is not one of")
            && log.contains("(skipped)"),
        "{log}"
    );
    assert!(node.twin("default/plc-typo").is_none());
    let (status, _) = get(&http, &format!("{rest}/api/v1/device/default/plc-typo"));
    assert_eq!(status, 404);

    // kectl twin set: the value reaches the register, then comes back as reported.
    node.kectl(&["twin", "set", "default/plc-1", "setpoint", "55"]);
    eventually(10, "setpoint written to the register", || {
        (read_holding(sim_port, 30) == 55).then_some(())
    });
    eventually(10, "setpoint reported", || {
        let t = node.twin("default/plc-1")?;
        (reported(&t, "setpoint").as_deref() == Some("55")).then_some(())
    });
    // Out of the model's range: refused before anything is sent.
    let method = format!("{rest}/api/v1/devicemethod/default/plc-1/set-temperature");
    let (status, v) = post(&http, &format!("{method}/setpoint"), r#"{"value": "250"}"#);
    assert_eq!(status, 502, "{v}");
    assert!(
        v["error"].as_str().unwrap_or_default().contains("maximum"),
        "{v}"
    );
    assert_eq!(read_holding(sim_port, 30), 55);
    // A method call writes and answers with the value read back.
    let (status, v) = post(&http, &format!("{method}/setpoint"), r#"{"value": "61"}"#);
    assert_eq!(
        (status, v["data"]["value"].as_str()),
        (200, Some("61")),
        "{v}"
    );
    // A property the method does not list is refused.
    let (status, _) = post(&http, &format!("{method}/heater"), "false");
    assert_eq!(status, 403);
    cross_site_pages_move_nothing(&format!("{method}/setpoint"), sim_port);

    // The planner merges the reads: over a few cycles, fewer requests than properties read (6
    // per cycle in 4 requests: HR0-13 merged, HR25 and HR30 split apart once the device refused
    // the merged request over the missing registers, the coil). Counted over at least 18 reads,
    // however long they take on this machine; one request more than whole cycles make is
    // allowed (a desired value's write or a cycle cut by a sample), six reads in six requests
    // would be far over.
    let sample = || {
        let text = http
            .get(&format!("{rest}/metrics"))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
            .unwrap_or_default();
        let counter = |name: &str| -> f64 {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0)
        };
        (
            counter("mapper_reads_total{") + counter("mapper_read_errors_total{"),
            counter("mapper_requests_total{"),
        )
    };
    let (reads0, requests0) = sample();
    let (reads, requests) = eventually(60, "18 property reads", || {
        let (reads1, requests1) = sample();
        let (reads, requests) = (reads1 - reads0, requests1 - requests0);
        (reads >= 18.0).then_some((reads, requests))
    });
    assert!(
        requests <= (reads * 4.0 / 6.0).ceil() + 1.0,
        "{reads} property reads in {requests} requests: the reads are not merged"
    );

    // The server dies: the device goes offline; it comes back: online, values flow again.
    sim.sim.kill();
    eventually(15, "offline", || {
        let t = node.twin("default/plc-1")?;
        (t["state"] == "offline").then_some(())
    });
    let _sim = PyModbus::start(sim_port);
    eventually(20, "online again", || {
        let t = node.twin("default/plc-1")?;
        (t["state"] == "online").then_some(())
    });
    // The new server started from its initial registers (HR30 = 30): after reconnecting, the
    // mapper writes the twin's desired value again.
    eventually(10, "desired value restored", || {
        (read_holding(sim_port, 30) == 55).then_some(())
    });
    eventually(10, "restored value reported", || {
        let t = node.twin("default/plc-1")?;
        (reported(&t, "setpoint").as_deref() == Some("55")).then_some(())
    });
    assert!(
        mapper.log_text().contains("reconnected"),
        "{}",
        mapper.log_text()
    );
}

/// A page of another site that the operator opens, in a real browser (chromium): its simple
/// cross-site POST (`no-cors`, `text/plain`) and its JSON `fetch` (which needs a preflight the
/// mapper never grants) both leave the register as it was (61). The same POST wrote the
/// register before the mapper's REST API checked origins and content types.
fn cross_site_pages_move_nothing(target: &str, sim_port: u16) {
    let Some(driver) = sim::browser::chromedriver() else {
        return;
    };
    let site = tempfile::tempdir().expect("dir");
    std::fs::write(
        site.path().join("page.html"),
        "<!doctype html><html lang=en><title>another site</title><p>hello</p></html>",
    )
    .expect("page");
    let page_port = free_port();
    let _server = sim::Proc::spawn(
        &sim::python(),
        &[
            "-m",
            "http.server",
            &page_port.to_string(),
            "--bind",
            "127.0.0.1",
        ],
        site.path(),
        "page-server.log",
    );
    eventually(20, "the other site's server", || {
        std::net::TcpStream::connect(("127.0.0.1", page_port)).ok()
    });
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let target = target.to_string();
    let answers = rt.block_on(async move {
        let c = sim::browser::browser(&driver).await;
        c.goto(&format!("http://localhost:{page_port}/page.html"))
            .await
            .expect("the page loads");
        let attack = "const [url, done] = arguments;
            const body = JSON.stringify({value: '90'});
            const simple = fetch(url, {method: 'POST', mode: 'no-cors',
                headers: {'Content-Type': 'text/plain'}, body})
              .then(() => 'answered', (e) => 'failed: ' + e);
            const json = fetch(url, {method: 'POST',
                headers: {'Content-Type': 'application/json'}, body})
              .then((r) => 'status ' + r.status, (e) => 'failed: ' + e);
            Promise.all([simple, json]).then((r) => done(r.join('; ')));";
        let out = c
            .execute_async(attack, vec![serde_json::Value::String(target)])
            .await
            .expect("the page's script runs");
        let _ = c.close().await;
        out.as_str().unwrap_or_default().to_string()
    });
    // The simple POST reached the mapper and was answered (opaquely); the JSON one was stopped
    // at its preflight. Either way the register is untouched.
    assert!(
        answers.starts_with("answered; failed"),
        "what the page saw: {answers}"
    );
    assert_eq!(
        read_holding(sim_port, 30),
        61,
        "the page's POST wrote the register"
    );
}
