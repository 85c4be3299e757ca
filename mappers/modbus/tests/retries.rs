//! `retries` against the project's simulator (`sim::modbus_sim`, on tokio-modbus's
//! server): a device that drops its connection every third request, and one that answers too
//! late.

use mapper_modbus::device::{Connection, Device, ModbusError, ModelHints, Point};
use serde_json::{Value, json};
use sim::modbus_sim::Sim;
use sim::object;
use std::time::Duration;

fn device(port: u16, extra: Value) -> Device {
    let mut config = object(json!({"ip": "127.0.0.1", "port": port, "timeout": 300}));
    config.extend(object(extra));
    let c = Connection::from_config(&config).expect("valid protocol config");
    let p = Point::from_config(
        "count",
        &object(json!({"register": "HoldingRegister", "offset": 0})),
        &ModelHints::default(),
    )
    .expect("valid visitor");
    Device::new(c, vec![p])
}

/// Ten reads; the results.
async fn ten_reads(d: &mut Device) -> Vec<Result<String, ModbusError>> {
    let mut out = Vec::new();
    for _ in 0..10 {
        let (_, r) = d.read(&[0]).await.pop().expect("one result");
        out.push(r.map(|t| t.to_string()));
    }
    out
}

/// Runs `f` on a runtime of the test's own (the simulator has another).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

#[test]
fn a_dropped_connection_is_retried_on_a_new_one_when_asked() {
    let sim = Sim::with(|s| {
        s.holding.insert(0, 7);
        s.drop_after = Some(2);
    });
    let (port, _rt) = sim.start("127.0.0.1:0").expect("simulator");

    // Without retries, every third read fails with the dropped connection.
    let mut plain = device(port, json!({}));
    let results = block_on(ten_reads(&mut plain));
    let failed = results.iter().filter(|r| r.is_err()).count();
    assert_eq!(failed, 3, "{results:?}");
    assert!(results.iter().flatten().all(|v| v == "7"), "{results:?}");

    // KubeEdge's spelling: collectRetryTimes. Every read succeeds; the dropped requests were
    // sent again.
    let mut retrying = device(port, json!({"collectRetryTimes": "1"}));
    let results = block_on(ten_reads(&mut retrying));
    assert!(
        results.iter().all(|r| matches!(r.as_deref(), Ok("7"))),
        "{results:?}"
    );
    assert!(retrying.requests() > 10, "{} requests", retrying.requests());
}

#[test]
fn a_late_device_costs_one_timeout_per_attempt() {
    let sim = Sim::with(|s| {
        s.holding.insert(0, 7);
        s.delay = Duration::from_millis(1000);
    });
    let (port, _rt) = sim.start("127.0.0.1:0").expect("simulator");
    let mut d = device(port, json!({"retries": 2}));
    let (_, r) = block_on(d.read(&[0])).pop().expect("one result");
    assert!(
        matches!(r, Err(ModbusError::Timeout(t)) if t == Duration::from_millis(300)),
        "{r:?}"
    );
    assert_eq!(d.requests(), 3, "the request and two retries");
}

#[test]
fn a_zero_timeout_is_refused_with_its_key() {
    let e = Connection::from_config(&object(json!({"ip": "127.0.0.1", "timeout": 0})))
        .expect_err("refused");
    assert!(e.to_string().starts_with("timeout:"), "{e}");
    let e = Connection::from_config(&object(json!({"ip": "127.0.0.1", "retries": -1})))
        .expect_err("refused");
    assert!(e.to_string().starts_with("retries:"), "{e}");
}
