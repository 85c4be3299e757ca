//! The MQTT `$hw` path under what apps do (paho-mqtt, `tests/kubeedge/mqtt_faults.py`): a burst
//! of 10,000 QoS 1 requests must not stall it, keep-alive 0 means no keep-alive, and a
//! subscriber that stops reading is disconnected without pinning edgecore's memory; an app
//! using edgecore's own client id takes nothing from it.

mod common;
use common::*;
use std::time::{Duration, Instant};

fn faults(mode: &str, port: u16) -> (bool, String) {
    kubeedge_script("mqtt_faults.py", &[mode, "127.0.0.1", &port.to_string()])
}

fn rss_kib(pid: u32) -> u64 {
    sim::vm_rss_kb(&pid.to_string())
}

#[test]
fn a_burst_of_10000_requests_does_not_stall_the_hw_api_nor_the_stop() {
    let mut e = Edgecore::start(None);
    let (ok, text) = faults("burst", e.mqtt_port);
    assert!(ok, "twin/get after the burst: {text}");
    // And HTTP and MQTT still work, and edgecore stops promptly.
    assert_eq!(e.get("/healthz").0, 200);
    let start = Instant::now();
    e.stop(false);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "SIGTERM took {:?}",
        start.elapsed()
    );
}

#[test]
fn keep_alive_0_turns_keep_alive_off() {
    let e = Edgecore::start(None);
    let (ok, text) = faults("keepalive0", e.mqtt_port);
    assert!(ok, "a keep-alive 0 client idle for 4 s: {text}");
}

#[test]
fn an_app_with_edgecores_client_id_does_not_take_the_hw_api_away() {
    let e = Edgecore::start(None);
    // The harness's edgecore runs with `clientId: edgecore-{http port}`.
    let http_port = e.http.rsplit(':').next().unwrap_or_default();
    let (ok, text) = kubeedge_script(
        "mqtt_faults.py",
        &[
            "sameid",
            "127.0.0.1",
            &e.mqtt_port.to_string(),
            &format!("edgecore-{http_port}"),
        ],
    );
    assert!(
        ok,
        "twin/get while an app is connected as \"edgecore\": {text}"
    );
}

#[test]
fn a_stalled_subscriber_is_disconnected_and_pins_no_memory() {
    let e = Edgecore::start(None);
    let before = rss_kib(e.child.id());
    let (ok, text) = faults("stalled", e.mqtt_port);
    assert!(ok, "the stalled subscriber is disconnected: {text}");
    let after = rss_kib(e.child.id());
    // 200 x 1 MiB went to a client that reads nothing: at most its 16 MiB queue (and the
    // allocator's slack) may stay; before, all 200 MiB and more did.
    assert!(
        after < before + 64 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    let m = e.get("/metrics").1;
    let m = m.as_str().unwrap_or("");
    assert!(
        !m.contains("edgecore_broker_overflowed_total 0")
            || !m.contains("edgecore_broker_keepalive_expired_total 0"),
        "the disconnection is counted: {m}"
    );
}
