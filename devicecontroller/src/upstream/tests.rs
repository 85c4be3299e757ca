use super::*;

fn twin_msg(node: &str, device: &str, prop: &str, value: &str, version: i64, ts: i64) -> Message {
    Message::new(
        "twin",
        "twin",
        "update",
        format!("node/{node}/device/default/{device}/twin/edge_updated"),
        json!({"event_id": "e", "timestamp": ts, "twin": {prop: {
                "actual": {"value": value, "metadata": {"timestamp": ts}},
                "metadata": {"type": "int"},
                "actual_version": {"cloud": 0, "edge": version}}}}),
    )
}

fn facts<'a>(node: &'a str) -> impl FnOnce(&str, &str) -> Option<DeviceFacts<'a>> {
    move |_, name| {
        (name != "unknown").then(|| DeviceFacts {
            node: Some(node),
            properties: vec!["temperature", "setpoint"],
        })
    }
}

#[test]
fn older_reports_that_arrive_while_a_newer_patch_is_in_flight_are_dropped() {
    let mut u = Upstream::new();
    let t0 = Instant::now();
    let msg = |v: &str, ver| twin_msg("n1", "d1", "temperature", v, ver, 100 * ver);
    assert_eq!(
        u.accept("n1", &msg("80", 3), facts("n1")),
        Ok(Taken::Queued)
    );
    let (k, first) = u.due(t0, Duration::ZERO, usize::MAX).remove(0);
    // While the first patch is being written, older reports arrive.
    assert_eq!(
        u.accept("n1", &msg("60", 1), facts("n1")),
        Ok(Taken::Queued)
    );
    assert_eq!(
        u.accept("n1", &msg("70", 2), facts("n1")),
        Ok(Taken::Queued)
    );
    u.stored(&k, &first);
    let (_, next) = u.due(t0, Duration::ZERO, usize::MAX).remove(0);
    assert!(
        next.reported.is_empty(),
        "70 (edge version 2) must not overwrite 80 (version 3): {:?}",
        next.reported
    );
    assert_eq!(next.acks.len(), 2, "both are still answered");
}

#[test]
fn under_a_load_beyond_the_limit_the_oldest_plans_go_first() {
    let mut u = Upstream::new();
    let t0 = Instant::now();
    // "zz" sorts last by name but reports first.
    assert_eq!(
        u.accept(
            "n1",
            &twin_msg("n1", "zz", "temperature", "1", 1, 1),
            facts("n1")
        ),
        Ok(Taken::Queued)
    );
    std::thread::sleep(Duration::from_millis(2));
    for d in ["a1", "a2", "a3"] {
        assert_eq!(
            u.accept(
                "n1",
                &twin_msg("n1", d, "temperature", "1", 1, 1),
                facts("n1")
            ),
            Ok(Taken::Queued)
        );
    }
    let first = u.due(t0, Duration::ZERO, 1);
    assert_eq!(
        first[0].0.1, "zz",
        "the oldest report goes first, whatever its name"
    );
}

#[test]
fn beyond_the_limit_a_quiet_node_is_not_held_back_by_a_busy_one() {
    let mut u = Upstream::new();
    let t0 = Instant::now();
    let busy = |d: &str| twin_msg("busy", d, "temperature", "1", 1, 1);
    for i in 0..50 {
        let d = format!("b{i:02}");
        assert_eq!(
            u.accept("busy", &busy(&d), facts("busy")),
            Ok(Taken::Queued)
        );
    }
    std::thread::sleep(Duration::from_millis(2));
    // The quiet node reports after the busy node's burst.
    assert_eq!(
        u.accept(
            "quiet",
            &twin_msg("quiet", "q1", "temperature", "7", 1, 1),
            facts("quiet")
        ),
        Ok(Taken::Queued)
    );
    let first: Vec<String> = u
        .due(t0, Duration::ZERO, 4)
        .into_iter()
        .map(|(k, _)| k.1)
        .collect();
    assert!(first.contains(&"q1".to_string()), "{first:?}");
    // The busy node's oldest go first among its own.
    assert!(first.contains(&"b00".to_string()), "{first:?}");
    // More of the busy node keep coming, older than the quiet node's next report; the
    // quiet node, served less recently, still goes in the next call.
    assert_eq!(
        u.accept(
            "quiet",
            &twin_msg("quiet", "q2", "temperature", "8", 2, 2),
            facts("quiet")
        ),
        Ok(Taken::Queued)
    );
    let next: Vec<String> = u
        .due(t0, Duration::ZERO, 2)
        .into_iter()
        .map(|(k, _)| k.1)
        .collect();
    assert!(next.contains(&"q2".to_string()), "{next:?}");
    // Nothing is lost: everything left comes in later calls.
    let mut rest = 0;
    while !u.due(t0, Duration::ZERO, 7).is_empty() {
        rest += 1;
        assert!(rest < 100);
    }
    assert_eq!(u.pending(), 0);
}

#[test]
fn due_plans_beyond_the_limit_wait_for_a_later_call() {
    let mut u = Upstream::new();
    let t0 = Instant::now();
    for d in ["d1", "d2", "d3"] {
        let taken = u.accept(
            "n1",
            &twin_msg("n1", d, "temperature", "1", 1, 100),
            facts("n1"),
        );
        assert_eq!(taken, Ok(Taken::Queued));
    }
    assert_eq!(u.due(t0, Duration::ZERO, 2).len(), 2);
    assert_eq!(u.pending(), 1, "the third stays pending");
    let rest = u.due(t0, Duration::ZERO, 2);
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].1.reported["temperature"].value, "1");
    assert!(u.due(t0, Duration::ZERO, 2).is_empty());
}

#[test]
fn out_of_order_and_duplicate_reports_keep_the_newest() {
    let mut u = Upstream::new();
    let t0 = Instant::now();
    for (v, ver, ts) in [
        ("30", 3, 300),
        ("10", 1, 100),
        ("30", 3, 300),
        ("20", 2, 200),
    ] {
        let taken = u.accept(
            "n1",
            &twin_msg("n1", "d1", "temperature", v, ver, ts),
            facts("n1"),
        );
        assert_eq!(taken, Ok(Taken::Queued));
    }
    let due = u.due(t0, Duration::from_millis(100), usize::MAX);
    assert_eq!(due.len(), 1, "one patch for four reports");
    let (key, plan) = &due[0];
    assert_eq!(plan.reported["temperature"].value, "30");
    assert_eq!(plan.acks.len(), 4, "every report is answered once stored");
    assert_eq!(plan.coalesced, 3);
    u.stored(key, plan);
    // An older report after the store changes nothing, and is answered at once.
    let late = u.accept(
        "n1",
        &twin_msg("n1", "d1", "temperature", "25", 2, 250),
        facts("n1"),
    );
    assert_eq!(late, Ok(Taken::Nothing));
    let body = patch_body(&json!({}), plan, &["temperature"]);
    assert_eq!(
        body,
        json!({"status": {"twins": [{"propertyName": "temperature",
                "reported": {"value": "30", "metadata": {"timestamp": "300", "type": "int"}}}]}})
    );
}

#[test]
fn a_burst_for_one_device_is_a_handful_of_patches() {
    let mut u = Upstream::new();
    let start = Instant::now();
    let mut patches = 0;
    for i in 0..10_000i64 {
        let now = start + Duration::from_micros(i as u64 * 50);
        u.accept(
            "n1",
            &twin_msg("n1", "d1", "temperature", &i.to_string(), i + 1, i),
            facts("n1"),
        )
        .expect("taken");
        for (k, p) in u.due(now, Duration::from_millis(100), usize::MAX) {
            patches += 1;
            u.stored(&k, &p);
        }
    }
    // 10,000 reports over 0.5 s: one patch per 100 ms.
    assert!(patches <= 6, "{patches} patches");
}

#[test]
fn reports_about_other_nodes_devices_and_foreign_properties() {
    let mut u = Upstream::new();
    let e = u
        .accept(
            "n2",
            &twin_msg("n2", "d1", "temperature", "1", 1, 1),
            facts("n1"),
        )
        .expect_err("not n2's device");
    assert_eq!(
        e,
        Refusal::OtherNode {
            device: "default/d1".into(),
            node: "n2".into()
        }
    );
    let e = u
        .accept(
            "n2",
            &twin_msg("n1", "d1", "temperature", "1", 1, 1),
            facts("n1"),
        )
        .expect_err("a resource of another node");
    assert!(matches!(e, Refusal::OtherNode { .. }), "{e:?}");
    let foreign = u.accept(
        "n1",
        &twin_msg("n1", "d1", "humidity", "1", 1, 1),
        facts("n1"),
    );
    assert_eq!(
        foreign,
        Ok(Taken::Nothing),
        "a property not in the spec is ignored"
    );
    let unknown = u.accept(
        "n1",
        &twin_msg("n1", "unknown", "temperature", "1", 1, 1),
        facts("n1"),
    );
    assert_eq!(unknown, Ok(Taken::Nothing));
    assert_eq!(u.pending(), 0);
}

#[test]
fn a_failed_patch_waits_and_keeps_newer_values() {
    let mut u = Upstream::new();
    let t0 = Instant::now();
    u.accept(
        "n1",
        &twin_msg("n1", "d1", "temperature", "1", 1, 1),
        facts("n1"),
    )
    .expect("taken");
    let (k, p) = u.due(t0, Duration::ZERO, usize::MAX).remove(0);
    u.accept(
        "n1",
        &twin_msg("n1", "d1", "temperature", "2", 2, 2),
        facts("n1"),
    )
    .expect("taken");
    u.failed(k, p, t0 + Duration::from_secs(1));
    assert!(
        u.due(t0, Duration::ZERO, usize::MAX).is_empty(),
        "waits out its retry"
    );
    let (_, p) = u
        .due(t0 + Duration::from_secs(1), Duration::ZERO, usize::MAX)
        .remove(0);
    assert_eq!(p.reported["temperature"].value, "2");
    assert_eq!(
        p.acks.len(),
        2,
        "both reports still answered only when stored"
    );
}

/// A node that lost its link: each of its devices is planned `unknown`, with nothing to
/// acknowledge; a report queued before keeps its values.
#[test]
fn a_lost_node_makes_its_devices_unknown() {
    let mut u = Upstream::new();
    let keys = vec![
        ("default".to_string(), "d1".to_string()),
        ("default".to_string(), "d2".to_string()),
    ];
    let since = "2026-11-27T12:00:00Z";
    assert_eq!(u.node_lost("n1", since, keys.clone()), 2);
    let due = u.due(Instant::now(), Duration::ZERO, usize::MAX);
    assert_eq!(due.len(), 2);
    let current = json!({"status": {"state": "online", "twins": [
            {"propertyName": "temperature", "reported": {"value": "80", "metadata": {"timestamp": "1"}}}]}});
    for (k, plan) in due {
        assert!(keys.contains(&k));
        assert_eq!(plan.state, Some(("unknown".to_string(), String::new())));
        assert!(plan.acks.is_empty() && plan.reported.is_empty());
        // Why and since when; the values kept, marked stale since then.
        let body = patch_body(&current, &plan, &["temperature"]);
        assert_eq!(body["status"]["state"], "unknown");
        assert_eq!(
            body["status"]["extensions"],
            json!({"stateReason": "node n1 lost its link to the cloud", "stateSince": since})
        );
        let t = &body["status"]["twins"][0]["reported"];
        assert_eq!(
            (&t["value"], &t["metadata"]["stale"]),
            (&json!("80"), &json!(since))
        );
    }
    // The node's next state report clears the reason and the marks.
    let lost = json!({"status": {"state": "unknown",
            "extensions": {"stateReason": "node n1 lost its link to the cloud", "stateSince": since, "other": "kept"},
            "twins": [{"propertyName": "temperature", "reported": {"value": "80", "metadata": {"timestamp": "1", "stale": since}}}]}});
    let back = Message::new(
        "twin",
        "twin",
        "update",
        "node/n1/device/default/d1/state/update",
        json!({"event_id": "e", "timestamp": 1, "device": {"state": "online", "lastOnlineTime": "2026-11-27T12:01:00Z"}}),
    );
    assert_eq!(u.accept("n1", &back, facts("n1")), Ok(Taken::Queued));
    let (_, p) = u.due(Instant::now(), Duration::ZERO, usize::MAX).remove(0);
    let body = patch_body(&lost, &p, &["temperature"]);
    assert_eq!(body["status"]["state"], "online");
    assert_eq!(
        body["status"]["extensions"],
        json!({"stateReason": null, "stateSince": null}),
        "a merge patch that removes the two keys and keeps the others"
    );
    assert_eq!(
        body["status"]["twins"][0]["reported"]["metadata"],
        json!({"timestamp": "1"})
    );
}

/// A desired value the edge applied says who set it: a value set at the edge over the
/// spec's is an override the pages show.
#[test]
fn the_source_of_an_applied_desired_value_is_kept() {
    let mut u = Upstream::new();
    let m = Message::new(
        "twin",
        "twin",
        "update",
        "node/n1/device/default/d1/twin/edge_updated",
        json!({"event_id": "e", "timestamp": 5, "twin": {"setpoint": {
                "expected": {"value": "75", "metadata": {"timestamp": 5, "source": "edge"}},
                "metadata": {"type": "int"},
                "expected_version": {"cloud": 0, "edge": 1}}}}),
    );
    assert_eq!(u.accept("n1", &m, facts("n1")), Ok(Taken::Queued));
    let (_, p) = u.due(Instant::now(), Duration::ZERO, usize::MAX).remove(0);
    let body = patch_body(&json!({}), &p, &["setpoint"]);
    assert_eq!(
        body["status"]["twins"][0]["observedDesired"],
        json!({"value": "75", "metadata": {"timestamp": "5", "type": "int", "source": "edge"}})
    );
}

#[test]
fn state_reports_and_the_answer() {
    let mut u = Upstream::new();
    let m = Message::new(
        "twin",
        "twin",
        "update",
        "node/n1/device/default/d1/state/update",
        json!({"event_id": "e", "timestamp": 1, "Device": {"state": "online", "lastOnlineTime": "2026-11-24T10:00:00Z"}}),
    );
    assert_eq!(u.accept("n1", &m, facts("n1")), Ok(Taken::Queued));
    let (_, p) = u.due(Instant::now(), Duration::ZERO, usize::MAX).remove(0);
    let body = patch_body(
        &json!({"status": {"twins": [{"propertyName": "gone"}]}}),
        &p,
        &["temperature"],
    );
    assert_eq!(
        body,
        json!({"status": {"twins": [], "state": "online", "lastOnlineTime": "2026-11-24T10:00:00Z"}})
    );
    let a = ack("n1", &m.header.id);
    assert_eq!(
        (
            a.route.resource.as_str(),
            a.route.operation.as_str(),
            a.route.group.as_str()
        ),
        ("node/n1/twin", "response", "twin")
    );
    assert_eq!(a.header.parent_id, m.header.id);
    assert_eq!(a.content, json!("OK"));
}

/// A report carrying alarms beside an empty twin, as the edge sends them.
fn alarm_msg(alarms: Value) -> Message {
    Message::new(
        "twin",
        "twin",
        "update",
        "node/n1/device/default/d1/twin/edge_updated".to_string(),
        json!({"event_id": "e", "timestamp": 1, "twin": {}, "alarms": alarms}),
    )
}

fn hot(extra: Value) -> Value {
    let mut a = json!({"rule": "hot", "severity": "critical", "condition": "temperature > 90",
        "property": "temperature", "active": true, "since": 1000, "message": "temperature 95 > 90"});
    for (k, v) in extra.as_object().into_iter().flatten() {
        a[k] = v.clone();
    }
    a
}

#[test]
fn alarms_land_in_the_status_extensions_and_each_change_is_one_event() {
    let mut u = Upstream::new();
    let t0 = Instant::now();
    let take = |u: &mut Upstream, alarms: Value| {
        assert_eq!(
            u.accept("n1", &alarm_msg(alarms), facts("n1")),
            Ok(Taken::Queued)
        );
        u.due(t0, Duration::ZERO, usize::MAX).remove(0).1
    };
    let reasons = |e: Vec<DeviceEvent>| e.into_iter().map(|e| e.reason).collect::<Vec<_>>();
    // Raised: kept by rule beside the state's keys, a Warning event.
    let plan = take(&mut u, json!({"hot": hot(json!({}))}));
    let stored = json!({"status": {"twins": [], "extensions": {"stateReason": "r"}}});
    let body = patch_body(&stored, &plan, &["temperature"]);
    assert_eq!(
        body["status"]["extensions"]["alarms"]["hot"]["active"],
        true
    );
    assert!(
        body["status"]["extensions"].get("stateReason").is_none(),
        "{body}"
    );
    let events = device_events(&stored, &plan, "n1");
    assert_eq!(events.len(), 1);
    assert!(events[0].warning);
    assert_eq!(events[0].message, "hot (critical): temperature 95 > 90");
    // The same alarm told again (a resend) makes no second event.
    let now = json!({"status": {"extensions": {"alarms": {"hot": hot(json!({}))}}}});
    assert!(device_events(&now, &plan, "n1").is_empty());
    // Acknowledged and cleared while the link was cut: folded into one report, both said,
    // in their order, and the alarm leaves the status.
    let plan = take(
        &mut u,
        json!({"hot": hot(json!({"active": false, "ackedBy": "ops", "ackedAt": 2000,
            "clearedAt": 3000, "ended": true}))}),
    );
    assert_eq!(
        reasons(device_events(&now, &plan, "n1")),
        ["AlarmAcknowledged", "AlarmCleared"]
    );
    let body = patch_body(&now, &plan, &["temperature"]);
    assert_eq!(body["status"]["extensions"]["alarms"]["hot"], Value::Null);
    // Raised, cleared and raised again before anything reached the cloud: the new occurrence.
    let plan = take(
        &mut u,
        json!({"hot": hot(json!({"since": 5000, "message": "temperature 99 > 90"}))}),
    );
    assert_eq!(reasons(device_events(&now, &plan, "n1")), ["AlarmRaised"]);
    // A rule that cannot be evaluated says why, once.
    let plan = take(
        &mut u,
        json!({"bad": {"rule": "bad", "severity": "major", "condition": "", "active": false,
            "since": 1, "error": "line 2: nonsense"}}),
    );
    let events = device_events(&json!({}), &plan, "n1");
    assert_eq!(
        events[0].message,
        "bad: cannot be evaluated: line 2: nonsense"
    );
    // A message that carries nothing else than a bad alarm entry is refused nothing, taken
    // nothing: an alarm that is not an object is dropped.
    assert_eq!(
        u.accept("n1", &alarm_msg(json!({"x": "nonsense"})), facts("n1")),
        Ok(Taken::Nothing)
    );
}

#[test]
fn a_desired_value_set_on_the_gateway_is_an_event_of_the_device() {
    let mut u = Upstream::new();
    let msg = |value: &str, source: &str| {
        Message::new(
            "twin",
            "twin",
            "update",
            "node/n1/device/default/d1/twin/edge_updated".to_string(),
            json!({"event_id": "e", "timestamp": 5, "twin": {"setpoint": {
                "expected": {"value": value, "metadata": {"timestamp": 5, "source": source}},
                "metadata": {"type": "int"}, "expected_version": {"cloud": 1, "edge": 2}}}}),
        )
    };
    let stored = json!({"status": {"twins": [{"propertyName": "setpoint",
        "observedDesired": {"value": "80", "metadata": {"source": "cloud"}}}]}});
    assert_eq!(
        u.accept("n1", &msg("70", "edge"), facts("n1")),
        Ok(Taken::Queued)
    );
    let (_, plan) = u.due(Instant::now(), Duration::ZERO, usize::MAX).remove(0);
    let events = device_events(&stored, &plan, "n1");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason, DESIRED_VALUE_SET);
    assert_eq!(
        events[0].message,
        "setpoint set to 70 (was 80) on the gateway n1"
    );
    assert_eq!(
        events[0].field.as_deref(),
        Some("spec.properties{setpoint}.desired")
    );
    // The spec's own value applied (source cloud) is the API's to audit, not this.
    assert_eq!(
        u.accept("n1", &msg("90", "cloud"), facts("n1")),
        Ok(Taken::Queued)
    );
    let (_, plan) = u.due(Instant::now(), Duration::ZERO, usize::MAX).remove(0);
    assert!(device_events(&stored, &plan, "n1").is_empty());
}

#[test]
fn a_forgotten_device_and_a_retry_keep_the_turns_between_nodes() {
    let mut u = Upstream::new();
    let t0 = Instant::now();
    for (node, d) in [("n1", "a"), ("n1", "b"), ("n2", "c")] {
        assert_eq!(
            u.accept(
                node,
                &twin_msg(node, d, "temperature", "1", 1, 1),
                facts(node)
            ),
            Ok(Taken::Queued)
        );
    }
    u.forget(&("default".to_string(), "a".to_string()));
    let first: Vec<String> = u
        .due(t0, Duration::ZERO, 2)
        .into_iter()
        .map(|(k, _)| k.1)
        .collect();
    assert_eq!(
        first,
        ["b", "c"],
        "the forgotten device is skipped, one of each node"
    );
    // A failed patch waits out its retry, then comes back on its own node's turn.
    let (k, p) = (
        ("default".to_string(), "c".to_string()),
        Plan {
            node: "n2".into(),
            ..Plan::default()
        },
    );
    u.failed(k, p, t0 + Duration::from_secs(1));
    assert!(
        u.due(t0, Duration::ZERO, 5).is_empty(),
        "not before its retry"
    );
    let later = u.due(t0 + Duration::from_secs(1), Duration::ZERO, 5);
    assert_eq!(later.len(), 1);
    assert_eq!(later[0].1.node, "n2");
    assert_eq!(u.pending(), 0);
}

/// Reports `device` of `node` (one value), queued.
fn report(u: &mut Upstream, node: &str, device: &str) {
    let m = twin_msg(node, device, "temperature", "5", 1, 1);
    assert_eq!(u.accept(node, &m, facts(node)), Ok(Taken::Queued));
}

fn names(due: Vec<(Key, Plan)>) -> Vec<String> {
    due.into_iter().map(|(k, _)| k.1).collect()
}

#[test]
fn with_more_plans_than_room_a_value_just_reported_goes_before_an_older_one() {
    let mut u = Upstream::new();
    // Plans taken lately waited a minute: one queued a second ago is not overdue.
    let t0 = Instant::now();
    for i in 0..8 {
        report(&mut u, "busy", &format!("w{i}"));
    }
    assert_eq!(
        u.due(t0 + Duration::from_secs(60), Duration::ZERO, 8).len(),
        8
    );
    report(&mut u, "n1", "stale");
    report(&mut u, "n2", "elsewhere");
    std::thread::sleep(FRESH + Duration::from_millis(200));
    let now = Instant::now();
    report(&mut u, "n1", "fresh");
    assert_eq!(
        names(u.due(now, Duration::ZERO, 1)),
        ["fresh"],
        "of the node that just reported, its fresh value, not its older plan"
    );
    // With room left and nothing fresh, the others in their turn: none is lost.
    let mut rest = names(u.due(now, Duration::ZERO, 5));
    rest.sort();
    assert_eq!(rest, ["elsewhere", "stale"]);
    assert_eq!(u.pending(), 0);
}

#[test]
fn an_overdue_plan_goes_before_fresh_ones_of_its_node() {
    let mut u = Upstream::new();
    // Nothing was taken yet: a plan that waited more than FRESH is overdue.
    report(&mut u, "n1", "rare");
    std::thread::sleep(FRESH + Duration::from_millis(200));
    let now = Instant::now();
    report(&mut u, "n1", "often");
    assert_eq!(names(u.due(now, Duration::ZERO, 1)), ["rare"]);
    assert_eq!(names(u.due(now, Duration::ZERO, 1)), ["often"]);
}

#[test]
fn a_plan_merged_keeps_its_first_queue_time_and_its_newest_report() {
    let mut u = Upstream::new();
    let before = Instant::now();
    report(&mut u, "n1", "d1");
    let between = Instant::now();
    report(&mut u, "n1", "d1");
    let (_, p) = u.due(Instant::now(), Duration::ZERO, 1).remove(0);
    let (q, l) = (
        p.queued_at.expect("queued"),
        p.last_report.expect("reported"),
    );
    assert!(q >= before && q <= between, "queued with the first report");
    assert!(l >= between, "the newest report's time");
    assert_eq!(p.coalesced, 1);
}
