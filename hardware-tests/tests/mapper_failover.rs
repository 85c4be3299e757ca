//! Mapper liveness, failover and balance with real processes: the `edgecore` binary and two
//! `mapper-modbus` processes of one protocol (`modbus-mapper-a`, `modbus-mapper-b`) reading
//! pymodbus (`sims/modbus_server.py`). Each device reads its own holding register, whose value the
//! test changes, so a device served by nobody (frozen value) or by the wrong mapper shows.
//!
//! The detection and failover times are printed (`--nocapture`), not asserted.

use serde_json::Value;
use sim::{Node, Proc, PyModbus, eventually, free_port, mqtt_messages, reported, write_holdings};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const A: &str = "modbus-mapper-a";
const B: &str = "modbus-mapper-b";

/// Devices `dev-0..` reading holding register 30+i, and `pinned` ones after them pinned to A.
fn manifests(port: u16, free: usize, pinned: usize) -> String {
    let mut out = String::from(include_str!("manifests/counter_value_model.yaml"));
    for i in 0..free + pinned {
        let (name, annotations) = if i < free {
            (format!("dev-{i}"), String::new())
        } else {
            (
                format!("pin-{i}"),
                format!(", annotations: {{edgecore.kubeedge.io/mapper: {A}}}"),
            )
        };
        out.push_str(&sim::fill(
            include_str!("manifests/failover_device.yaml"),
            &[
                ("name", &name),
                ("annotations", &annotations),
                ("port", &port),
                ("reg", &(30 + i)),
            ],
        ));
    }
    out
}

/// `/api/v1/mappers` by name.
fn mappers(node: &Node) -> BTreeMap<String, Value> {
    let (_, list) = node.get("/api/v1/mappers");
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| Some((m["name"].as_str()?.to_string(), m.clone())))
        .collect()
}

fn devices_of(node: &Node, mapper: &str) -> BTreeSet<String> {
    mappers(node)
        .get(mapper)
        .and_then(|m| m["devices"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|d| {
            d.as_str()
                .map(|d| d.trim_start_matches("default/").to_string())
        })
        .collect()
}

/// Waits until every device `names[i]` reports `values[i]` and is online.
fn wait_values(node: &Node, names: &[String], values: &[u16], secs: u64, what: &str) {
    eventually(secs, what, || {
        names
            .iter()
            .zip(values)
            .all(|(n, v)| {
                node.twin(&format!("default/{n}")).is_some_and(|t| {
                    reported(&t, "value") == Some(v.to_string()) && t["state"] == "online"
                })
            })
            .then_some(())
    });
}

fn start_mapper(node: &Node, name: &str) -> Proc {
    // No REST API (port 0): these tests do not use it, and a port chosen free here could be
    // taken by another test before the mapper binds it.
    node.mapper_named("mapper-modbus", name, "modbus", 0, &[])
}

/// State results on MQTT, per device: (state, reason) in arrival order.
fn states(
    rx: &std::sync::mpsc::Receiver<sim::MqttMessage>,
) -> BTreeMap<String, Vec<(String, String)>> {
    let mut out: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    while let Ok(m) = rx.try_recv() {
        let Ok(v) = serde_json::from_slice::<Value>(&m.payload) else {
            continue;
        };
        let d = &v["device"];
        if let (Some(name), Some(state)) = (d["name"].as_str(), d["state"].as_str()) {
            out.entry(name.to_string()).or_default().push((
                state.to_string(),
                d["reason"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    out
}

#[test]
fn a_killed_mappers_devices_go_unknown_then_to_the_other_mapper_and_come_back_after_its_restart() {
    let sim_port = free_port();
    let _sim = PyModbus::start(sim_port);
    let names: Vec<String> = (0..6).map(|i| format!("dev-{i}")).collect();
    write_holdings(sim_port, 30, &[1000, 1001, 1002, 1003, 1004, 1005]);
    let node = Node::start(&manifests(sim_port, 6, 0));
    let a = start_mapper(&node, A);
    let _b = start_mapper(&node, B);

    // Two mappers of one protocol share the devices evenly.
    let (a_own, b_own) = eventually(20, "both mappers registered with 3 devices each", || {
        let (a, b) = (devices_of(&node, A), devices_of(&node, B));
        (a.len() == 3 && b.len() == 3).then_some((a, b))
    });
    assert!(a_own.is_disjoint(&b_own), "{a_own:?} {b_own:?}");
    wait_values(
        &node,
        &names,
        &[1000, 1001, 1002, 1003, 1004, 1005],
        20,
        "first values",
    );

    let events =
        mqtt_messages(node.mqtt, "$hw/events/device/+/+/state/update/result").expect("subscribe");
    a.signal("-KILL");
    let killed = Instant::now();
    write_holdings(sim_port, 30, &[2000, 2001, 2002, 2003, 2004, 2005]);
    eventually(15, "mapper a found unreachable", || {
        (mappers(&node).get(A)?["state"] == "unreachable").then_some(())
    });
    let detected = killed.elapsed();
    wait_values(
        &node,
        &names,
        &[2000, 2001, 2002, 2003, 2004, 2005],
        20,
        "every device read again, through b",
    );
    let failed_over = killed.elapsed();
    println!("kill -9: detected in {detected:?}, every device read again after {failed_over:?}");
    let a_status = &mappers(&node)[A];
    assert!(
        a_status["since"].as_str().is_some_and(|s| !s.is_empty()),
        "{a_status}"
    );
    assert_eq!(devices_of(&node, B).len(), 6);

    // In between, a's devices were `unknown` with the reason, then online again; b's own devices
    // never changed state.
    std::thread::sleep(Duration::from_millis(300));
    let seen = states(&events);
    for d in &a_own {
        let s = seen.get(d).cloned().unwrap_or_default();
        let unknown = s.iter().position(|(st, why)| {
            st == "unknown"
                && why.contains(&format!("mapper {A} unreachable since"))
                && why.contains(B)
        });
        let online = s.iter().rposition(|(st, _)| st == "online");
        assert!(
            matches!((unknown, online), (Some(u), Some(o)) if u < o),
            "{d}: {s:?}"
        );
    }
    for d in &b_own {
        assert!(
            seen.get(d)
                .is_none_or(|s| s.iter().all(|(st, _)| st == "online")),
            "{d} of mapper b changed state: {:?}",
            seen.get(d)
        );
    }

    // Restarted, a gets back exactly its own devices; b keeps its own.
    let restarted = Instant::now();
    let _a = start_mapper(&node, A);
    eventually(20, "mapper a serving its devices again", || {
        (devices_of(&node, A) == a_own).then_some(())
    });
    assert_eq!(devices_of(&node, B), b_own);
    write_holdings(sim_port, 30, &[3000, 3001, 3002, 3003, 3004, 3005]);
    wait_values(
        &node,
        &names,
        &[3000, 3001, 3002, 3003, 3004, 3005],
        20,
        "every device read after the restart",
    );
    println!(
        "restart: devices spread again and read within {:?}",
        restarted.elapsed()
    );
}

#[test]
fn a_hung_mapper_is_detected_and_its_pinned_device_waits_for_it_with_a_stale_value() {
    let sim_port = free_port();
    let _sim = PyModbus::start(sim_port);
    write_holdings(sim_port, 30, &[10, 11, 12, 13, 14]);
    let names: Vec<String> = vec![
        "dev-0".into(),
        "dev-1".into(),
        "dev-2".into(),
        "dev-3".into(),
        "pin-4".into(),
    ];
    let node = Node::start(&manifests(sim_port, 4, 1));
    let a = start_mapper(&node, A);
    let _b = start_mapper(&node, B);
    eventually(20, "both mappers registered", || {
        let m = mappers(&node);
        (m.contains_key(A) && m.contains_key(B) && devices_of(&node, A).contains("pin-4"))
            .then_some(())
    });
    wait_values(&node, &names, &[10, 11, 12, 13, 14], 20, "first values");
    let a_own = devices_of(&node, A);

    // SIGSTOP: the socket still accepts, nothing answers.
    a.signal("-STOP");
    let stopped = Instant::now();
    write_holdings(sim_port, 30, &[20, 21, 22, 23, 24]);
    eventually(15, "the hung mapper found unreachable", || {
        (mappers(&node).get(A)?["state"] == "unreachable").then_some(())
    });
    println!("SIGSTOP: detected in {:?}", stopped.elapsed());
    // The unpinned devices read again through b; the pinned one waits, unknown, its value stale.
    wait_values(
        &node,
        &names[..4],
        &[20, 21, 22, 23],
        20,
        "unpinned devices read through b",
    );
    let t = node.twin("default/pin-4").expect("twin");
    assert_eq!(t["state"], "unknown", "{t}");
    let why = t["stateReason"].as_str().unwrap_or_default();
    assert!(
        why.contains(&format!("mapper {A} unreachable since")) && why.contains("pinned"),
        "{t}"
    );
    let r = &t["properties"]["value"]["reported"];
    assert_eq!(
        (r["value"].as_str(), r["stale"].as_bool()),
        (Some("14"), Some(true)),
        "{t}"
    );
    assert!(r["ageMs"].as_i64().is_some_and(|a| a > 0), "{t}");
    let shown = node.kectl(&["twin", "get", "default/pin-4"]);
    assert!(
        shown.contains("state unknown (mapper modbus-mapper-a unreachable")
            && shown.contains("(stale, "),
        "{shown}"
    );
    assert_eq!(devices_of(&node, A), BTreeSet::from(["pin-4".to_string()]));

    // SIGCONT: a answers again, takes back what left it (b stops serving those first), and the
    // pinned device is online again with its new value.
    a.signal("-CONT");
    eventually(15, "mapper a alive again with its devices", || {
        (mappers(&node).get(A)?["state"] == "alive" && devices_of(&node, A) == a_own).then_some(())
    });
    assert!(devices_of(&node, B).is_disjoint(&a_own));
    write_holdings(sim_port, 30, &[30, 31, 32, 33, 34]);
    wait_values(
        &node,
        &names,
        &[30, 31, 32, 33, 34],
        20,
        "every device read after SIGCONT",
    );
    let t = node.twin("default/pin-4").expect("twin");
    assert!(t.get("stateReason").is_none(), "{t}");
    assert!(
        t["properties"]["value"]["reported"].get("stale").is_none(),
        "{t}"
    );
}
