use super::*;

/// A test hub's settings, its join records in `dir`.
fn settings(dir: &std::path::Path, replica: Option<String>) -> Settings {
    Settings {
        joins: joins::Book::new(dir),
        node_limit: 10,
        max_frame_bytes: 1 << 20,
        keepalive: Duration::from_secs(30),
        node_qps: 30,
        node_burst: 60,
        resend: Duration::from_secs(5),
        noack_limit: 10,
        replica,
        streams_per_node: 4,
        stream_idle: Duration::from_secs(3600),
    }
}

#[test]
fn a_message_with_an_oversized_route_does_not_fit() {
    let ok = Message::new(
        "edgehub",
        "twin",
        "update",
        "node/n1/default/device/d1/twin/edge_updated".to_string(),
        serde_json::json!({}),
    );
    assert!(fits(&ok));
    let mut long = ok.clone();
    long.route.resource = format!("node/n1/{}", "x".repeat(1 << 20));
    assert!(!fits(&long));
    let mut id = ok.clone();
    id.header.parent_id = "p".repeat(1000);
    assert!(!fits(&id));
}

#[test]
fn resources_are_trimmed_as_kubeedge_trims_them() {
    for (whole, wire) in [
        ("node/n1/default/device/d1", "default/device/d1"),
        ("node/n1/default/devicemodel/m", "default/devicemodel/m"),
        ("node/n1/membership", "membership"),
        ("node/n1/twin", "twin"),
        ("node/n1/kube-system/pod/p", "kube-system/pod/p"),
        ("node/n1/default/configmap/c", "default/configmap/c"),
        ("node/n1", "node/n1"),
        ("node/n1/", "node/n1/"),
        ("default/device/d1", "default/device/d1"),
    ] {
        assert_eq!(trimmed(whole), wire, "{whole}");
    }
}

#[test]
fn a_frame_from_parts_is_the_message_as_serde_writes_it() {
    let mut m = Message::new(
        "devicecontroller",
        "resource",
        "insert",
        "node/n1/default/device/d1",
        serde_json::json!({"kind": "Device", "metadata": {"name": "d1", "labels": {"a": "é\"x"}}}),
    )
    .with_resource_version(String::from("42"));
    m.header.parent_id = "p".into();
    let content = serde_json::to_vec(&m.content).expect("json");
    let f = frame(&m.header, &m.route, &content);
    // On the wire, the resource is KubeEdge's trimmed one.
    let mut wire = m.clone();
    wire.route.resource = "default/device/d1".into();
    assert_eq!(f, serde_json::to_string(&wire).expect("json"));
    let back: Message = serde_json::from_str(&f).expect("a frame");
    assert_eq!(back, wire);

    // Kept while it waits, and sent again: the same frame, and the same ObjectSync key.
    m.header.parent_id.clear();
    let ack = AckKey {
        kind: "device",
        namespace: "default".into(),
        name: "d1".into(),
        uid: "u-1".into(),
        resource_version: "42".into(),
    };
    let p = Pending::new(&m, &ack, Packed::new(&content)).expect("kept");
    wire.header.parent_id.clear();
    assert_eq!(p.frame(), serde_json::to_string(&wire).expect("json"));
    let key: ObjectKey = ("device", "default".into(), "d1".into());
    assert_eq!(p.ack(&key), ack);
    assert!(!p.is_delete());
    m.route.operation = "delete".into();
    assert!(
        Pending::new(&m, &ack, Packed::new(&content))
            .expect("kept")
            .is_delete()
    );
    m.header.id = "not-a-uuid".into();
    assert!(Pending::new(&m, &ack, Packed::new(&content)).is_none());
}

/// A message kept for a node away from this replica is dropped once the node acknowledged
/// that version (or a newer one) through another replica; an older acknowledgement, or
/// another object's, leaves it.
/// A question goes only to a node with a session; only that node's answer to it ends the
/// wait (another node's answer with the same parent is not taken); silence ends in `Late`.
#[tokio::test]
async fn a_question_is_answered_only_by_the_node_asked() {
    let dir = tempfile::tempdir().expect("dir");
    let hub = CloudHub::new(settings(dir.path(), None));
    let q = || {
        Message::new(
            "cloudhub",
            "twin",
            "query",
            "default/devicehistory/d1",
            serde_json::json!({}),
        )
    };
    assert!(matches!(
        hub.ask("n1", q(), Duration::from_secs(1)).await,
        Err(Unanswered::Away(n)) if n == "n1"
    ));
    let (tx1, mut rx1) = mpsc::channel(8);
    let (tx2, _rx2) = mpsc::channel(8);
    hub.attach("n1", tx1, CancellationToken::new()).expect("n1");
    hub.attach("n2", tx2, CancellationToken::new()).expect("n2");
    let question = q();
    let asking = {
        let hub = hub.clone();
        let question = question.clone();
        tokio::spawn(async move { hub.ask("n1", question, Duration::from_secs(30)).await })
    };
    let sent: Message =
        serde_json::from_str(&rx1.recv().await.expect("the question on n1's session"))
            .expect("a message");
    assert_eq!(sent.header.id, question.header.id);
    // n2 answers n1's question: not taken.
    hub.received("n2", question.response(serde_json::json!({"from": "n2"})))
        .await;
    hub.received("n1", question.response(serde_json::json!({"from": "n1"})))
        .await;
    let answer = asking.await.expect("task").expect("answered");
    assert_eq!(answer.content["from"], "n1");
    assert!(matches!(
        hub.ask("n1", q(), Duration::from_millis(50)).await,
        Err(Unanswered::Late(..))
    ));
    assert!(
        hub.asked.lock().expect("lock").is_empty(),
        "nothing left waiting"
    );
}

#[test]
fn an_acknowledgement_through_another_replica_clears_what_is_kept() {
    let dir = tempfile::tempdir().expect("dir");
    let hub = CloudHub::new(settings(dir.path(), Some("r1".into())));
    let send = |name: &str, rv: &str| {
        let m = Message::new(
            "devicecontroller",
            "resource",
            "update",
            format!("node/n1/default/device/{name}"),
            serde_json::json!({"metadata": {"name": name}}),
        )
        .with_resource_version(rv.to_string());
        hub.send(Outbound {
            node: "n1".into(),
            message: m,
            ack: Some(AckKey {
                kind: "device",
                namespace: "default".into(),
                name: name.into(),
                uid: format!("uid-{name}"),
                resource_version: rv.into(),
            }),
            body: None,
        });
    };
    send("d1", "12");
    send("d2", "7");
    assert_eq!(hub.pending().0, 2);
    hub.acknowledged_elsewhere("n1", "device", "default", "d1", "uid-d1", Some("11"));
    assert_eq!(
        hub.pending().0,
        2,
        "an older version acknowledged: still to send"
    );
    hub.acknowledged_elsewhere("n1", "device", "default", "d1", "uid-other", Some("12"));
    assert_eq!(hub.pending().0, 2, "another object of the same name");
    hub.acknowledged_elsewhere("n1", "device", "default", "d1", "uid-d1", Some("12"));
    assert_eq!(hub.pending().0, 1, "acknowledged elsewhere: not sent again");
    hub.acknowledged_elsewhere("n2", "device", "default", "d2", "uid-d2", Some("9"));
    assert_eq!(hub.pending().0, 1, "another node's acknowledgement");
    assert_eq!(hub.metrics.acked_elsewhere.load(Ordering::Relaxed), 1);
}
