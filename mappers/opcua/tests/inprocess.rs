//! The OPC UA driver against the in-process async-opcua server of `hardware-tests`: every node
//! id form, batched reads bounded by the server's MaxNodesPerRead, typed writes, the server's
//! refusals per property, subscriptions, a server restart, and security with a trust list.

use mapper_opcua::config::{Connection, Point};
use mapper_opcua::device::Device;
use mapper_sdk::{Driver, DriverError, ErrorKind};
use serde_json::{Value, json};
use sim::opcua_sim::{self, OpcSim, Options};
use std::time::Duration;

fn map(v: Value) -> serde_json::Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}

fn sim(dir: &std::path::Path, tags: usize, max_nodes_per_read: usize) -> OpcSim {
    OpcSim::start(Options {
        port: 0,
        tags,
        pki: dir.join("server-pki"),
        max_nodes_per_read,
    })
    .expect("simulator starts")
}

fn device(dir: &std::path::Path, conn: Value, points: &[Value]) -> Device {
    let conn = Connection::from_config(&map(conn)).expect("connection config");
    let points = points
        .iter()
        .map(|p| Point::from_config(&map(p.clone()), Duration::from_millis(100)).expect("point"))
        .collect();
    Device::new(
        "default/line-1".into(),
        conn,
        points,
        dir.join("mapper-pki"),
    )
}

fn ok(r: &mapper_sdk::driver::Reading) -> &str {
    match &r.1 {
        Ok(mapper_sdk::ReadValue::New(v)) => v,
        Ok(mapper_sdk::ReadValue::Same) => panic!("property {}: unchanged on its own", r.0),
        Err(e) => panic!("property {}: {e}", r.0),
    }
}

fn err(r: &mapper_sdk::driver::Reading) -> &DriverError {
    match &r.1 {
        Ok(v) => panic!("property {} read {v:?}, expected an error", r.0),
        Err(e) => e,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_every_node_form_in_batches_and_writes_typed_values() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = tokio::task::block_in_place(|| sim(dir.path(), 10, 4));
    let ns = s.ns;
    let mut points = vec![
        json!({"nodeID": format!("ns={ns};s=Temperature")}),
        json!({"nodeID": format!("ns={ns};i=1002")}),
        json!({"nodeID": format!("nsu={};s=Batch", opcua_sim::NAMESPACE)}),
        json!({"nodeID": format!("ns={ns};g={}", opcua_sim::GUID_NODE)}),
        json!({"nodeID": format!("ns={ns};b={}", opcua_sim::OPAQUE_NODE)}),
        json!({"nodeID": format!("ns={ns};s=Levels")}),
        json!({"nodeID": format!("ns={ns};s=Levels"), "indexRange": "1:2"}),
        json!({"nodeID": format!("ns={ns};s=Setpoint"), "dataType": "int16"}),
        json!({"nodeID": format!("ns={ns};s=NoSuchNode")}),
        json!({"nodeID": "nsu=urn:not-there;s=X"}),
        json!({"nodeID": format!("ns={ns};s=Locked")}),
    ];
    for k in 0..10 {
        points.push(json!({"nodeID": format!("ns={ns};s=Tag{k}")}));
    }
    let mut d = device(dir.path(), json!({"url": s.url()}), &points);
    d.connect().await.expect("connects");
    let all: Vec<usize> = (0..points.len()).collect();
    let before = d.requests();
    let r = d.read(&all).await;
    // 21 nodes, one without a namespace on the server: 20 asked, at most 4 per Read.
    assert_eq!(
        d.requests() - before,
        5,
        "ceil(20 / MaxNodesPerRead 4) Read calls"
    );
    let by = |i: usize| {
        r.iter()
            .find(|(j, _)| *j == i)
            .expect("every property answered")
    };
    assert_eq!(ok(by(0)), "20.5");
    assert_eq!(ok(by(1)), "true");
    assert_eq!(ok(by(2)), "B-0001");
    assert_eq!(ok(by(3)), "7.25");
    assert_eq!(ok(by(4)), "9");
    assert_eq!(ok(by(5)), "[1,2,3,4]");
    assert_eq!(ok(by(6)), "[2,3]");
    assert_eq!(ok(by(7)), "50");
    let e = err(by(8));
    assert_eq!(e.kind, ErrorKind::Device);
    assert!(e.message.contains("BadNodeIdUnknown"), "{e}");
    let e = err(by(9));
    assert!(e.message.contains("no namespace urn:not-there"), "{e}");
    assert_eq!(ok(by(10)), "1.5");
    assert_eq!(ok(by(20)), "9");

    // Writes: each in its node's type, learnt from the value or from dataType.
    d.write(0, "21.75").await.expect("double");
    d.write(7, "60").await.expect("int16");
    d.write(2, "B-0002").await.expect("string");
    d.write(5, "[5, 6, 7, 8]").await.expect("array");
    tokio::task::block_in_place(|| {
        assert_eq!(
            s.get("Temperature"),
            Some(opcua::types::Variant::Double(21.75))
        );
        assert_eq!(s.get("Setpoint"), Some(opcua::types::Variant::Int16(60)));
        assert_eq!(s.get("Batch"), Some(opcua::types::Variant::from("B-0002")));
    });
    let r = d.read(&[5]).await;
    assert_eq!(ok(&r[0]), "[5,6,7,8]");
    // Refusals name the reason and the value is left alone.
    let e = d.write(7, "70000").await.expect_err("out of Int16 range");
    assert!(e.message.contains("out of range"), "{e}");
    let e = d.write(0, "hot").await.expect_err("not a number");
    assert!(e.message.contains("not a number"), "{e}");
    let e = d.write(10, "2.5").await.expect_err("user access denied");
    assert!(e.message.contains("BadUserAccessDenied"), "{e}");
    assert_eq!(e.kind, ErrorKind::Config);
    let e = d.write(8, "1").await.expect_err("unknown node");
    assert!(e.message.contains("BadNodeIdUnknown"), "{e}");
    d.stop().await;
    tokio::task::block_in_place(|| drop(s.stop()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_deliver_changes_and_come_back_after_a_server_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = tokio::task::block_in_place(|| sim(dir.path(), 0, 0));
    let ns = s.ns;
    let mut d = device(
        dir.path(),
        json!({"url": s.url(), "keepAlive": 500, "timeout": 1000}),
        &[
            json!({"nodeID": format!("ns={ns};s=Temperature"), "subscribe": true, "samplingInterval": 50}),
            json!({"nodeID": format!("ns={ns};s=Setpoint")}),
        ],
    );
    d.connect().await.expect("connects");
    assert!(d.subscribed(0));
    assert!(!d.subscribed(1), "not asked to subscribe");
    // The initial value, then a change, arrive without a read.
    let first = tokio::time::timeout(Duration::from_secs(5), d.changes())
        .await
        .expect("initial value");
    assert_eq!(first.first().map(ok), Some("20.5"));
    tokio::task::block_in_place(|| s.set("Temperature", 30.25f64));
    let next = tokio::time::timeout(Duration::from_secs(5), d.changes())
        .await
        .expect("change");
    assert_eq!(next.last().map(ok), Some("30.25"));

    // The server goes away: a link error arrives through the change stream.
    let options = tokio::task::block_in_place(|| s.stop());
    let lost = tokio::time::timeout(Duration::from_secs(10), d.changes())
        .await
        .expect("loss noticed");
    assert!(
        lost.iter()
            .any(|(_, r)| matches!(r, Err(e) if e.kind == ErrorKind::Link)),
        "{lost:?}"
    );
    assert!(!d.subscribed(0));
    let e = d.connect().await.expect_err("server down");
    assert_eq!(e.kind, ErrorKind::Link, "{e}");
    // Back on the same port, with a fresh address space: a new session and subscription.
    let s = tokio::task::block_in_place(|| OpcSim::start(options).expect("restart"));
    d.connect().await.expect("reconnects");
    assert!(d.subscribed(0));
    let first = tokio::time::timeout(Duration::from_secs(5), d.changes())
        .await
        .expect("initial value after restart");
    assert_eq!(first.first().map(ok), Some("20.5"));
    tokio::task::block_in_place(|| s.set("Temperature", 12.5f64));
    let next = tokio::time::timeout(Duration::from_secs(5), d.changes())
        .await
        .expect("change after restart");
    assert_eq!(next.last().map(ok), Some("12.5"));
    d.stop().await;
    tokio::task::block_in_place(|| drop(s.stop()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_needs_a_trusted_server_certificate_and_the_right_identity() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = tokio::task::block_in_place(|| sim(dir.path(), 0, 0));
    let ns = s.ns;
    let point = [json!({"nodeID": format!("ns={ns};s=Temperature")})];
    let secure = json!({
        "url": s.url(), "securityPolicy": "Basic256Sha256", "securityMode": "SignAndEncrypt",
        "userName": opcua_sim::USER, "password": opcua_sim::PASSWORD, "timeout": 2000,
    });
    // Not trusted yet: refused, and the certificate is put aside for an operator to move.
    let mut d = device(dir.path(), secure.clone(), &point);
    let e = d.connect().await.expect_err("untrusted server");
    assert!(e.message.contains("not trusted"), "{e}");
    let rejected = std::fs::read_dir(dir.path().join("mapper-pki/rejected"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(rejected, 1, "the server's certificate waits in rejected/");
    // Trusted through serverCertificate: reads, encrypted.
    let mut trusted = secure.clone();
    trusted["serverCertificate"] = json!(s.certificate());
    let mut d = device(dir.path(), trusted.clone(), &point);
    d.connect().await.expect("trusted server");
    assert_eq!(ok(&d.read(&[0]).await[0]), "20.5");
    d.stop().await;
    // A wrong password.
    let mut wrong = trusted.clone();
    wrong["password"] = json!("guess");
    let mut d = device(dir.path(), wrong, &point);
    let e = d.connect().await.expect_err("bad password");
    assert_eq!(e.kind, ErrorKind::Config, "{e}");
    // A security mismatch: the server offers no Aes256Sha256RsaPss endpoint.
    let mut other = trusted.clone();
    other["securityPolicy"] = json!("Aes256Sha256RsaPss");
    let mut d = device(dir.path(), other, &point);
    let e = d.connect().await.expect_err("no such endpoint");
    assert!(
        e.message.contains("offers no endpoint") && e.message.contains("Basic256Sha256"),
        "{e}"
    );
    tokio::task::block_in_place(|| drop(s.stop()));
}
