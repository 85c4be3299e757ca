use super::*;

fn device(name: &str, node: &str, model: &str, rv: &str) -> Value {
    json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
            "metadata": {"namespace": "default", "name": name, "uid": format!("uid-{name}"), "resourceVersion": rv,
                "labels": {"description": format!("the {name}")}, "managedFields": [{"manager": "kubectl"}]},
            "spec": {"nodeName": node, "deviceModelRef": {"name": model},
                "properties": [{"name": "temperature", "collectCycle": 1000}]}})
}

fn model(name: &str, rv: &str, unit: &str) -> Value {
    json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
            "metadata": {"namespace": "default", "name": name, "uid": format!("uid-{name}"), "resourceVersion": rv},
            "spec": {"protocol": "modbus", "properties": [{"name": "temperature", "type": "INT", "unit": unit}]}})
}

/// `(node, operation, resource, resourceversion)` of each message.
fn summary(out: &[Outbound]) -> Vec<(String, String, String, String)> {
    out.iter()
        .map(|o| {
            (
                o.node.clone(),
                o.message.route.operation.clone(),
                o.message.route.resource.clone(),
                o.message.header.resource_version.clone(),
            )
        })
        .collect()
}

fn row(node: &str, op: &str, res: &str, rv: &str) -> (String, String, String, String) {
    (node.into(), op.into(), res.into(), rv.into())
}

fn synced_with(objs: &[Value]) -> (Downstream, Vec<Outbound>) {
    let mut d = Downstream::new();
    for o in objs {
        let out = if o["kind"] == "Device" {
            d.device_applied(o)
        } else {
            d.model_applied(o)
        };
        assert!(
            out.is_empty(),
            "nothing goes out before the first full list"
        );
    }
    let out = d.synced();
    (d, out)
}

#[test]
fn a_new_device_sends_membership_then_model_then_device() {
    let (_, out) = synced_with(&[model("m", "5", "C"), device("d1", "n1", "m", "7")]);
    assert_eq!(
        summary(&out),
        [
            row("n1", "update", "node/n1/membership", ""),
            row("n1", "insert", "node/n1/default/devicemodel/m", "5"),
            row("n1", "insert", "node/n1/default/device/d1", "7"),
        ]
    );
    let m = &out[0].message;
    assert_eq!(
        (m.route.source.as_str(), m.route.group.as_str()),
        ("devicecontroller", "twin")
    );
    assert!(out[0].ack.is_none(), "membership needs no acknowledgement");
    let c = &m.content;
    assert!(c["event_id"].as_str().is_some_and(|e| e.len() == 36));
    assert!(c["timestamp"].as_i64().is_some_and(|t| t > 0));
    assert_eq!(
        c["added_devices"],
        json!([{"id": "default/d1", "name": "d1", "description": "the d1"}])
    );
    assert_eq!(c["removed_devices"], json!([]));
    let dev = &out[2];
    assert_eq!(dev.message.route.group, "resource");
    assert_eq!(dev.message.content["kind"], "Device");
    assert_eq!(dev.message.content["spec"]["deviceModelRef"]["name"], "m");
    assert!(
        dev.message.content["metadata"]
            .get("managedFields")
            .is_none()
    );
    assert_eq!(
        dev.ack,
        Some(AckKey {
            kind: "device",
            namespace: "default".into(),
            name: "d1".into(),
            uid: "uid-d1".into(),
            resource_version: "7".into()
        })
    );
}

#[test]
fn what_nodes_acknowledged_before_a_restart_is_not_sent_again_and_what_went_is_deleted() {
    let mut d = Downstream::new();
    assert!(d.model_applied(&model("m", "5", "C")).is_empty());
    assert!(d.device_applied(&device("d1", "n1", "m", "7")).is_empty());
    assert!(d.device_applied(&device("d3", "n1", "m", "9")).is_empty());
    // n1 has d1 and m as they are, d3 at an older version, and "gone", deleted since.
    d.seed_delivered(
        "n1",
        "device",
        ("default".into(), "d1".into()),
        "uid-d1",
        "7",
    );
    d.seed_delivered(
        "n1",
        "devicemodel",
        ("default".into(), "m".into()),
        "uid-m",
        "5",
    );
    d.seed_delivered(
        "n1",
        "device",
        ("default".into(), "d3".into()),
        "uid-d3",
        "8",
    );
    d.seed_delivered(
        "n1",
        "device",
        ("default".into(), "gone".into()),
        "uid-gone",
        "3",
    );
    // n2 had d1 before it moved to n1.
    d.seed_delivered(
        "n2",
        "device",
        ("default".into(), "d1".into()),
        "uid-d1",
        "6",
    );
    let out = d.synced();
    assert_eq!(
        summary(&out),
        [
            row("n1", "update", "node/n1/membership", ""),
            row("n1", "update", "node/n1/default/device/d3", "9"),
            row("n1", "delete", "node/n1/default/device/gone", "3"),
            row("n2", "update", "node/n2/membership", ""),
            row("n2", "delete", "node/n2/default/device/d1", "7"),
        ]
    );
    assert_eq!(out[0].message.content["removed_devices"][0]["name"], "gone");
    assert_eq!(out[0].message.content["added_devices"], json!([]));
    let gone = out[2].ack.as_ref().expect("a delete is acknowledged");
    assert_eq!(
        gone.uid, "uid-gone",
        "its ObjectSync can be found and removed"
    );
    assert!(d.reconcile_node("n1").is_empty() && d.reconcile_node("n2").is_empty());
}

#[test]
fn a_forgotten_node_is_sent_everything_again_and_others_nothing() {
    let (mut d, _) = synced_with(&[
        model("m", "5", "C"),
        device("d1", "n1", "m", "7"),
        device("d2", "n2", "m", "8"),
    ]);
    assert!(d.reconcile_node("n1").is_empty(), "n1 is up to date");
    assert_eq!((d.devices_on("n1"), d.devices_on("n3")), (1, 0));
    d.forget_node("n1");
    assert_eq!(
        summary(&d.reconcile_node("n1")),
        [
            row("n1", "update", "node/n1/membership", ""),
            row("n1", "insert", "node/n1/default/devicemodel/m", "5"),
            row("n1", "insert", "node/n1/default/device/d1", "7"),
        ]
    );
    assert!(d.reconcile_node("n2").is_empty(), "n2 was not forgotten");
}

#[test]
fn unchanged_specs_send_nothing_and_changed_ones_an_update() {
    let (mut d, _) = synced_with(&[model("m", "5", "C"), device("d1", "n1", "m", "7")]);
    let mut relabeled = device("d1", "n1", "m", "8");
    relabeled["metadata"]["labels"]["site"] = json!("hall");
    assert!(
        d.device_applied(&relabeled).is_empty(),
        "a label is not the spec"
    );
    let mut changed = device("d1", "n1", "m", "9");
    changed["spec"]["properties"][0]["collectCycle"] = json!(500);
    assert_eq!(
        summary(&d.device_applied(&changed)),
        [row("n1", "update", "node/n1/default/device/d1", "9")]
    );
    assert!(
        d.model_applied(&model("m", "6", "C")).is_empty(),
        "a model with the same spec"
    );
}

#[test]
fn a_model_edit_reaches_every_node_that_uses_it() {
    let (mut d, _) = synced_with(&[
        model("m", "5", "C"),
        device("d1", "n1", "m", "7"),
        device("d2", "n2", "m", "8"),
        device("d3", "n2", "m", "9"),
    ]);
    assert_eq!(
        summary(&d.model_applied(&model("m", "10", "F"))),
        [
            row("n1", "update", "node/n1/default/devicemodel/m", "10"),
            row("n2", "update", "node/n2/default/devicemodel/m", "10"),
        ]
    );
}

#[test]
fn a_device_moved_leaves_the_old_node_and_joins_the_new_one() {
    let (mut d, _) = synced_with(&[model("m", "5", "C"), device("d1", "n1", "m", "7")]);
    let out = d.device_applied(&device("d1", "n2", "m", "8"));
    assert_eq!(
        summary(&out),
        [
            row("n1", "update", "node/n1/membership", ""),
            row("n1", "delete", "node/n1/default/device/d1", "8"),
            row("n1", "delete", "node/n1/default/devicemodel/m", "5"),
            row("n2", "update", "node/n2/membership", ""),
            row("n2", "insert", "node/n2/default/devicemodel/m", "5"),
            row("n2", "insert", "node/n2/default/device/d1", "8"),
        ]
    );
    assert_eq!(
        out[0].message.content["removed_devices"],
        json!([{"id": "default/d1", "name": "d1", "description": ""}])
    );
    assert_eq!(d.node_of("default", "d1"), Some("n2"));
}

#[test]
fn a_device_waits_for_its_model() {
    let (mut d, out) = synced_with(&[device("d1", "n1", "later", "7")]);
    assert!(out.is_empty(), "no model, nothing sent");
    assert_eq!(
        summary(&d.model_applied(&model("later", "8", "C"))),
        [
            row("n1", "update", "node/n1/membership", ""),
            row("n1", "insert", "node/n1/default/devicemodel/later", "8"),
            row("n1", "insert", "node/n1/default/device/d1", "7"),
        ]
    );
    // The model goes: its devices leave the node.
    assert_eq!(
        summary(&d.model_deleted(&model("later", "9", "C"))),
        [
            row("n1", "update", "node/n1/membership", ""),
            row("n1", "delete", "node/n1/default/device/d1", "7"),
            row("n1", "delete", "node/n1/default/devicemodel/later", "9"),
        ]
    );
}

#[test]
fn deletes_and_unbound_devices() {
    let (mut d, _) = synced_with(&[
        model("m", "5", "C"),
        device("d1", "n1", "m", "7"),
        device("d2", "n1", "m", "8"),
        device("free", "", "m", "9"),
    ]);
    assert!(
        d.nodes() == ["n1"],
        "a device without nodeName goes nowhere"
    );
    assert_eq!(
        summary(&d.device_deleted(&device("d1", "n1", "m", "11"))),
        [
            row("n1", "update", "node/n1/membership", ""),
            row("n1", "delete", "node/n1/default/device/d1", "11"),
        ],
        "the model stays while d2 uses it"
    );
    assert_eq!(
        summary(&d.device_deleted(&device("d2", "n1", "m", "12"))),
        [
            row("n1", "update", "node/n1/membership", ""),
            row("n1", "delete", "node/n1/default/device/d2", "12"),
            row("n1", "delete", "node/n1/default/devicemodel/m", "5"),
        ]
    );
    assert!(
        d.device_deleted(&device("never", "n1", "m", "1"))
            .is_empty()
    );
}

#[test]
fn a_replica_sends_only_to_its_sessions_and_a_node_arriving_gets_what_it_did_not_acknowledge() {
    let mut d = Downstream::new();
    d.share();
    let (d1, d2) = (
        ("default".to_string(), "d1".to_string()),
        ("default".to_string(), "d2".to_string()),
    );
    for o in [
        model("m", "5", "C"),
        device("d1", "n1", "m", "7"),
        device("d2", "n1", "m", "8"),
        device("d3", "n2", "m", "9"),
    ] {
        let _ = if o["kind"] == "Device" {
            d.device_applied(&o)
        } else {
            d.model_applied(&o)
        };
    }
    // n2's session is here; n1's is on another replica.
    assert!(d.own("n2").is_empty(), "nothing before the first list");
    let out = d.synced();
    assert!(
        out.iter().all(|o| o.node == "n2") && !out.is_empty(),
        "{:?}",
        summary(&out)
    );
    // Changes of n1's devices go out from the replica that holds it, not this one.
    assert!(d.device_applied(&device("d1", "n1", "m", "17")).is_empty());
    // n1 acknowledged through the other replica: m, d1 at 17, d2 at an older 6.
    d.seed_delivered(
        "n1",
        "devicemodel",
        ("default".into(), "m".into()),
        "uid-m",
        "5",
    );
    d.seed_delivered("n1", "device", d1.clone(), "uid-d1", "17");
    d.seed_delivered("n1", "device", d2.clone(), "uid-d2", "6");
    // Then d2 was deleted, and n1 acknowledged the delete there (its record went).
    assert!(d.device_deleted(&device("d2", "n1", "m", "8")).is_empty());
    d.undelivered("n1", "device", &d2);
    // n1 comes here: it is sent nothing it holds, and nothing twice.
    assert!(d.own("n1").is_empty(), "n1 holds what it must");
    assert!(d.own("n1").is_empty(), "owned once");
    // A change now reaches n1 from here; n1 leaving stops it.
    let edited = |rv: &str, cycle: u64| {
        let mut v = device("d1", "n1", "m", rv);
        v["spec"]["properties"][0]["collectCycle"] = json!(cycle);
        v
    };
    assert_eq!(
        summary(&d.device_applied(&edited("18", 2000))),
        [row("n1", "update", "node/n1/default/device/d1", "18")]
    );
    d.disown("n1");
    assert!(d.device_applied(&edited("19", 3000)).is_empty());
    // Back with 19 unacknowledged: it is sent 19.
    assert_eq!(
        summary(&d.own("n1")),
        [row("n1", "update", "node/n1/default/device/d1", "19")]
    );
}
