//! KubeEdge's `$hw` payloads, flow by flow, field by field and in order (the table in
//! `tests/kubeedge/hw_payloads.json`), as a paho-mqtt app (`tests/kubeedge/hw_app.py`) sees
//! them on the embedded broker and on Mosquitto; and one app's oversized publish costing the
//! others nothing. Needs `python3` with `paho-mqtt` 2 (`.ci/run` installs it) and Mosquitto.

mod common;
use common::*;
use std::path::{Path, PathBuf};

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/kubeedge")
        .join(name)
}

fn flows(e: &Edgecore) {
    let table = script("hw_payloads.json");
    let (ok, text) = kubeedge_script(
        "hw_app.py",
        &[
            &table.display().to_string(),
            "127.0.0.1",
            &e.mqtt_port.to_string(),
            &e.manifests.display().to_string(),
        ],
    );
    assert!(ok, "flows that differ from KubeEdge's:\n{text}");
    assert_eq!(text.matches("\"ok\": true").count(), 9, "{text}");
}

fn external(port: u16) -> Option<(Mosquitto, Edgecore)> {
    let Some(broker) = mosquitto(port) else {
        sim::skip("mosquitto is not installed");
        return None;
    };
    let e = Edgecore::start(Some(port));
    e.wait_mqtt_connected();
    Some((broker, e))
}

#[test]
fn kubeedge_hw_payloads_on_the_embedded_broker() {
    let e = Edgecore::start(None);
    flows(&e);
}

#[test]
fn kubeedge_hw_payloads_on_mosquitto() {
    let Some((_broker, e)) = external(free_port()) else {
        return;
    };
    flows(&e);
}

#[test]
fn an_oversized_publish_on_mosquitto_costs_the_other_apps_nothing() {
    let port = free_port();
    let Some((_broker, e)) = external(port) else {
        return;
    };
    let (ok, text) = kubeedge_script("oversize.py", &["127.0.0.1", &port.to_string()]);
    assert!(ok, "{text}");
    let m = e.get("/metrics").1;
    assert!(
        m.as_str()
            .unwrap_or("")
            .contains("edgecore_mqtt_connection_errors_total 0"),
        "edgecore's client kept its connection: {m}"
    );
}

#[test]
fn an_oversized_publish_on_the_embedded_broker_costs_the_other_apps_nothing() {
    let e = Edgecore::start(None);
    let (ok, text) = kubeedge_script("oversize.py", &["127.0.0.1", &e.mqtt_port.to_string()]);
    // The embedded broker refuses the packet itself (it closes the sender's connection), so no
    // result comes for it; the other app's requests are all answered.
    assert!(text.contains("\"answered\": 20"), "{text}");
    let _ = ok;
}
