//! The twins' history as a user reads it (`GET .../properties/{p}/history`, JSON and CSV): every
//! value a mapper's report had acknowledged is there after a `kill -9` mid-stream; the device's
//! state is kept as `$state`; bad queries are named; the counters are in `/metrics`.

mod common;
use common::mapper::TestMapper;
use common::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const HISTORY: &str = "/api/v1/devices/default/oven-1/properties/temperature/history";

fn values(doc: &Value) -> Vec<String> {
    doc["points"]
        .as_array()
        .map(|ps| ps.iter().map(|p| p["v"].to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn every_acknowledged_value_is_in_the_history_after_a_kill_mid_stream() {
    let mut e = Edgecore::start(None);
    let m = TestMapper::start("modbus-h", &e.dir.path().join("modbus-h.sock"), &e.socket);
    m.register("modbus").expect("MapperRegister");
    let stop = Arc::new(AtomicBool::new(false));
    let (acked_tx, acked_rx) = std::sync::mpsc::channel::<u32>();
    let reporter = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut failures = 0;
            for v in 1..100_000u32 {
                if stop.load(Ordering::Relaxed) || failures > 20 {
                    break;
                }
                // A report answered OK is acknowledged: stored durably.
                match m.report("default", "oven-1", &[("temperature", &format!("{v}.5"))]) {
                    Ok(()) => {
                        let _ = acked_tx.send(v);
                    }
                    Err(_) => failures += 1,
                }
                // One point per property per millisecond is what the history keeps (the last):
                // a mapper reports a property every few ms at the very most.
                std::thread::sleep(Duration::from_millis(3));
            }
            m
        })
    };
    // Long enough for folds (every 2 s) to have written some points to the history and left
    // others in the journal.
    let started = Instant::now();
    let mut acked = BTreeSet::new();
    while started.elapsed() < Duration::from_secs(5) {
        if let Ok(v) = acked_rx.recv_timeout(Duration::from_millis(100)) {
            acked.insert(v);
        }
    }
    e.stop(true);
    stop.store(true, Ordering::Relaxed);
    let _m = reporter.join().expect("the reporter");
    acked.extend(acked_rx.try_iter());
    assert!(
        acked.len() > 100,
        "only {} reports acknowledged",
        acked.len()
    );

    e.start_again();
    e.wait_ready();
    let (status, doc) = e.get(&format!("{HISTORY}?from=-1h"));
    assert_eq!(status, 200, "{doc}");
    let got: BTreeSet<u32> = values(&doc)
        .iter()
        .filter_map(|v| v.strip_suffix(".5").and_then(|n| n.parse().ok()))
        .collect();
    let missing: Vec<&u32> = acked.difference(&got).collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged values missing from the history, e.g. {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(10)]
    );
    // In order of time.
    let ts: Vec<i64> = doc["points"]
        .as_array()
        .map(|ps| ps.iter().filter_map(|p| p["t"].as_i64()).collect())
        .unwrap_or_default();
    assert!(ts.windows(2).all(|w| w[0] < w[1]), "points out of order");
}

#[test]
fn steps_csv_state_and_mistakes_as_a_user_reads_them() {
    let e = Edgecore::start(None);
    let m = TestMapper::start("modbus-s", &e.dir.path().join("modbus-s.sock"), &e.socket);
    m.register("modbus").expect("MapperRegister");
    m.report_state("default", "oven-1", "online")
        .expect("state");
    for v in ["20", "21", "22.5", "19"] {
        m.report("default", "oven-1", &[("temperature", v)])
            .expect("report");
        std::thread::sleep(Duration::from_millis(5));
    }
    m.report_state("default", "oven-1", "offline")
        .expect("state");
    // The fold writes the history every 2 s.
    let doc = e.eventually("the points in the history", |e| {
        let (status, doc) = e.get(&format!("{HISTORY}?from=-10m"));
        (status == 200 && values(&doc).len() == 4).then_some(doc)
    });
    assert_eq!(values(&doc), ["20.0", "21.0", "22.5", "19.0"]);
    // One step over the four: min, max, mean, last.
    let (status, doc) = e.get(&format!("{HISTORY}?from=-10m&step=1h"));
    assert_eq!(status, 200, "{doc}");
    let b = &doc["buckets"][0];
    assert_eq!(
        (b["min"].as_f64(), b["max"].as_f64()),
        (Some(19.0), Some(22.5))
    );
    assert_eq!(b["count"], 4);
    assert_eq!(b["last"].as_f64(), Some(19.0));
    assert_eq!(b["mean"].as_f64(), Some(20.625));
    // CSV, as a spreadsheet opens it.
    let csv = ureq::get(&format!("{}{HISTORY}?from=-10m&format=csv", e.http))
        .call()
        .expect("CSV")
        .body_mut()
        .read_to_string()
        .expect("text");
    assert!(csv.starts_with("t,value\n"), "{csv}");
    assert_eq!(csv.lines().count(), 5, "{csv}");
    // kectl, as a user types it.
    let kectl = |args: &[&str]| {
        let out = std::process::Command::new(bin("kectl"))
            .args([
                "twin",
                "history",
                "oven-1",
                "temperature",
                "--server",
                &e.http,
            ])
            .args(args)
            .output()
            .expect("kectl runs");
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let table = kectl(&["--from", "-10m"]);
    assert!(
        table.starts_with("TIME") && table.contains("22.5"),
        "{table}"
    );
    assert_eq!(table.lines().count(), 5, "{table}");
    let steps = kectl(&["--from", "-10m", "--step", "1h"]);
    assert!(
        steps.contains("MEAN") && steps.contains("20.625"),
        "{steps}"
    );
    assert_eq!(kectl(&["--from", "-10m", "--csv"]), csv);
    // The device's state over time.
    let (status, doc) =
        e.get("/api/v1/devices/default/oven-1/properties/%24state/history?from=-10m");
    assert_eq!(status, 200, "{doc}");
    let states: Vec<String> = doc["points"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter_map(|p| p["v"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(states, ["online", "offline"], "{doc}");
    // Mistakes are named.
    for (query, status, says) in [
        ("from=yesterday", 400, "from=\"yesterday\""),
        ("step=5x", 400, "step=\"5x\""),
        ("from=-1h&to=-2h", 400, "is not after"),
        ("step=10", 400, "at least 1000"),
        // A step per second over 23 hours: refused, naming the limit (it took the gateway from
        // 38 to 288 MiB).
        ("from=-23h&step=1s", 400, "82800 steps of 1000 ms"),
        ("from=-23h&step=1s", 400, "at most 20000 buckets"),
    ] {
        let (got, doc) = e.get(&format!("{HISTORY}?{query}"));
        assert_eq!(got, status, "{query}: {doc}");
        assert!(
            doc["error"].as_str().unwrap_or("").contains(says),
            "{query}: {doc}"
        );
    }
    let (got, doc) = e.get("/api/v1/devices/default/oven-1/properties/humidity/history");
    assert_eq!(got, 404, "{doc}");
    assert!(
        doc["error"]
            .as_str()
            .unwrap_or("")
            .contains("no property \"humidity\""),
        "{doc}"
    );
    let (got, _) = e.get("/api/v1/devices/default/no-such/properties/temperature/history");
    assert_eq!(got, 404);
    assert!(
        e.metrics().contains("edgecore_history_points"),
        "{}",
        e.metrics()
    );
}

/// The device list with `?values=true` (the gateway page's list): each row's reported values in
/// short with the model's unit, marked stale when the device is offline; without it, rows only.
#[test]
fn the_device_list_carries_each_devices_values_when_asked() {
    let e = Edgecore::start(None);
    // The oven's model with a unit for the temperature.
    let with_unit = MANIFEST.replace(
        "{name: temperature, type: FLOAT, accessMode: ReadOnly}",
        "{name: temperature, type: FLOAT, accessMode: ReadOnly, unit: Celsius}",
    );
    std::fs::write(e.manifests.join("oven.yaml"), with_unit).expect("manifest");
    let m = TestMapper::start("modbus-v", &e.dir.path().join("modbus-v.sock"), &e.socket);
    m.register("modbus").expect("MapperRegister");
    m.report_state("default", "oven-1", "online")
        .expect("state");
    m.report(
        "default",
        "oven-1",
        &[("temperature", "21.5"), ("setpoint", "80")],
    )
    .expect("report");
    let oven = |doc: &Value| {
        doc.as_array()
            .and_then(|rows| rows.iter().find(|r| r["name"] == "oven-1").cloned())
            .unwrap_or_default()
    };
    let row = e.eventually("the values in the list", |e| {
        let row = oven(&e.get("/api/v1/devices?values=true").1);
        (row["values"]["temperature"]["unit"] == "Celsius").then_some(row)
    });
    assert_eq!(
        row["values"]["temperature"],
        serde_json::json!({"value": "21.5", "unit": "Celsius"}),
        "{row}"
    );
    assert_eq!(row["state"], "online", "{row}");
    assert!(oven(&e.get("/api/v1/devices").1).get("values").is_none());
    m.report_state("default", "oven-1", "offline")
        .expect("state");
    let row = e.eventually("marked stale", |e| {
        let row = oven(&e.get("/api/v1/devices?values=true").1);
        (row["values"]["temperature"]["stale"] == true).then_some(row)
    });
    assert_eq!(row["values"]["setpoint"]["stale"], true, "{row}");
}
