//! Alarms on the gateway, against the real `edgecore` binary and a test mapper over DMI: rules
//! from a local manifest's annotation evaluated as values and states come (a threshold with
//! its hysteresis, a stale value, a device offline), a rule that cannot be read shown with why,
//! acknowledged over the local API (and refused when there is nothing to acknowledge), kept
//! through a `kill -9`, and ended when the rules are taken away.

mod common;

use common::Edgecore;
use common::mapper::TestMapper;
use serde_json::Value;

/// The oven of the common manifest with `rules` in its annotation.
fn oven_with(rules: &str) -> String {
    let text: String = rules.lines().map(|l| format!("      {l}\n")).collect();
    common::MANIFEST.replace(
        "metadata: {name: oven-1, namespace: default}\n",
        &format!(
            "metadata:\n  name: oven-1\n  namespace: default\n  annotations:\n    devices.kubeedge.io/alarms: |\n{text}"
        ),
    )
}

/// The gateway's alarms, by rule.
fn alarms(e: &Edgecore) -> std::collections::BTreeMap<String, Value> {
    let (status, body) = e.get("/api/v1/alarms");
    assert_eq!(status, 200, "{body}");
    body["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            (
                a["rule"].as_str().unwrap_or_default().to_string(),
                a.clone(),
            )
        })
        .collect()
}

fn status_of(e: &Edgecore, rule: &str) -> Option<String> {
    alarms(e)
        .get(rule)
        .and_then(|a| a["status"].as_str().map(str::to_string))
}

const ACK: &str = "/api/v1/devices/default/oven-1/alarms";

#[test]
fn alarms_are_raised_cleared_acknowledged_and_kept_on_the_gateway() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).expect("mkdir");
    let rules = "hot: temperature > 90 clear < 85 critical\n\
                 quiet: temperature stale 3s minor\n\
                 gone: offline warning\n\
                 typo: temperatur > 3";
    std::fs::write(manifests.join("oven.yaml"), oven_with(rules)).expect("manifest");
    let mut e = Edgecore::with_dir(dir, None);
    e.wait_ready();
    // The line that does not read is shown as a rule that cannot be evaluated, and why.
    let typo = e.eventually("the bad rule shown", |e| alarms(e).remove("typo"));
    assert_eq!(typo["status"], "unevaluable", "{typo}");
    let why = typo["error"].as_str().unwrap_or_default();
    assert!(
        why.contains("line 4") && why.contains("temperatur, which the device does not declare"),
        "{why}"
    );
    // Not online yet (no mapper has reported): `gone` is raised.
    e.eventually("offline while no mapper reports", |e| {
        (status_of(e, "gone")? == "active-unacknowledged").then_some(())
    });
    let m = TestMapper::start("m", &e.dir.path().join("m.sock"), &e.socket);
    m.register("modbus").expect("registered");
    m.report_state("default", "oven-1", "online")
        .expect("state");
    m.report("default", "oven-1", &[("temperature", "95.5")])
        .expect("reported");
    let hot = e.eventually("hot raised", |e| alarms(e).remove("hot"));
    assert_eq!(hot["status"], "active-unacknowledged", "{hot}");
    assert_eq!(hot["message"], "temperature 95.5 > 90");
    assert_eq!(hot["severity"], "critical");
    assert_eq!(hot["device"], "default/oven-1");
    e.eventually("gone cleared, kept until acknowledged", |e| {
        (status_of(e, "gone")? == "cleared-unacknowledged").then_some(())
    });
    // Acknowledged by name; a second time, an unknown rule, a bad body: refused, saying why.
    let (s, a) = e.post(&format!("{ACK}/hot/acknowledge"), r#"{"by": "Ana"}"#);
    assert_eq!(s, 200, "{a}");
    assert_eq!(a["ackedBy"], "Ana (on the gateway)");
    assert_eq!(a["status"], "active-acknowledged");
    let (s, a) = e.post(&format!("{ACK}/hot/acknowledge"), "");
    assert_eq!(s, 409, "{a}");
    assert!(
        a.to_string()
            .contains("already acknowledged by Ana (on the gateway)"),
        "{a}"
    );
    let (s, a) = e.post(&format!("{ACK}/nope/acknowledge"), "");
    assert_eq!(s, 404, "{a}");
    assert!(a.to_string().contains("has no alarm rule nope"), "{a}");
    let (s, a) = e.post(&format!("{ACK}/gone/acknowledge"), "by Ana");
    assert_eq!(s, 400, "{a}");
    // Cleared and acknowledged: `gone` ends and leaves the list.
    let (s, a) = e.post(&format!("{ACK}/gone/acknowledge"), "");
    assert_eq!((s, a["ended"].as_bool()), (200, Some(true)), "{a}");
    assert_eq!(status_of(&e, "gone"), None);
    // What was acknowledged survives a kill -9.
    e.restart(true);
    let hot = alarms(&e).remove("hot").expect("hot kept");
    assert_eq!(hot["status"], "active-acknowledged", "{hot}");
    // The mapper goes silent: the value is stale after 3 s.
    let m = TestMapper::start("m2", &e.dir.path().join("m2.sock"), &e.socket);
    m.register("modbus").expect("registered");
    m.report_state("default", "oven-1", "online")
        .expect("state");
    m.report("default", "oven-1", &[("temperature", "87")])
        .expect("reported");
    let quiet = e.eventually("quiet raised", |e| {
        alarms(e).remove("quiet").filter(|a| a["active"] == true)
    });
    assert!(
        quiet["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("temperature not read for ")),
        "{quiet}"
    );
    // 87 is inside the band: hot stands; 84 clears it, and acknowledged it ends.
    assert_eq!(status_of(&e, "hot").as_deref(), Some("active-acknowledged"));
    m.report("default", "oven-1", &[("temperature", "84")])
        .expect("reported");
    e.eventually("hot ended", |e| {
        (!alarms(e).contains_key("hot")).then_some(())
    });
    // The rules taken away: every alarm ends.
    std::fs::write(e.manifests.join("oven.yaml"), common::MANIFEST).expect("manifest");
    e.eventually("no alarm left", |e| alarms(e).is_empty().then_some(()));
}
