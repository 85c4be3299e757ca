//! The twin rules: versions, conflicts, delta, no-op reports, edge-set desired, size caps.

use api::paths::DeviceId;
use api::v1beta1::PropertyType;
use twin::engine::{DeviceDecl, Engine, Limits, PropertyDecl, Reported, TwinError};
use twin::{Section, Version};

fn id() -> DeviceId {
    DeviceId::new("default", "oven-1")
}

fn decl(desired: Option<&str>) -> DeviceDecl {
    DeviceDecl {
        id: id(),
        description: String::new(),
        model: "oven".into(),
        protocol: "modbus".into(),
        properties: vec![
            PropertyDecl {
                name: "temperature".into(),
                value_type: PropertyType::Int,
                writable: false,
                desired: None,
                minimum: None,
                maximum: None,
                unit: None,
            },
            PropertyDecl {
                name: "setpoint".into(),
                value_type: PropertyType::Float,
                writable: true,
                desired: desired.map(Into::into),
                minimum: None,
                maximum: None,
                unit: None,
            },
        ],
    }
}

fn engine() -> Engine {
    let mut e = Engine::new(Vec::new(), Limits::default(), 0);
    e.upsert_device(&decl(Some("20")), 1)
        .expect("device is valid");
    e
}

fn report(p: &str, v: &str) -> Reported {
    Reported {
        property: p.into(),
        value: Some(v.into()),
        ..Reported::default()
    }
}

/// A report that may add a property the device does not declare (as MQTT `twin/update` may).
fn adding(p: &str, v: &str) -> Reported {
    Reported {
        value_type: Some(PropertyType::String),
        ..report(p, v)
    }
}

#[test]
fn adding_a_device_creates_its_twin_with_the_spec_desired_value() {
    let e = engine();
    let t = e.get(&id()).expect("twin exists");
    assert_eq!(t.properties.len(), 2);
    let sp = &t.properties["setpoint"];
    assert_eq!(sp.desired.as_ref().map(|d| d.value.as_str()), Some("20"));
    assert_eq!(sp.desired_version, Version { cloud: 1, edge: 0 });
    assert_eq!(t.row.desired_version, 1);
    assert_eq!(t.row.reported_version, 0);
    assert_eq!(t.delta().get("setpoint").map(String::as_str), Some("20"));
}

#[test]
fn redeclaring_the_same_device_changes_nothing() {
    let mut e = engine();
    let a = e.upsert_device(&decl(Some("20")), 2).expect("valid");
    assert!(a.is_noop(), "{a:?}");
}

#[test]
fn a_changed_spec_desired_value_is_a_cloud_write() {
    let mut e = engine();
    let a = e.upsert_device(&decl(Some("25")), 2).expect("valid");
    assert_eq!(a.desired_changed().count(), 1);
    let t = e.get(&id()).expect("twin");
    assert_eq!(t.properties["setpoint"].desired_version.cloud, 2);
    assert_eq!(t.row.desired_version, 2);
}

#[test]
fn a_report_that_changes_a_value_bumps_versions_and_queues_it_for_the_cloud() {
    let mut e = engine();
    let a = e
        .report(&id(), &[report("temperature", "21")], 10)
        .expect("valid");
    assert!(!a.is_noop());
    assert_eq!(a.outbox.len(), 1);
    assert_eq!(a.outbox[0].section, Section::Reported);
    assert_eq!(a.outbox[0].value, "21");
    assert_eq!(a.outbox[0].version, Version { cloud: 0, edge: 1 });
    let t = e.get(&id()).expect("twin");
    assert_eq!(t.row.reported_version, 1);
    assert_eq!(
        t.properties["temperature"]
            .reported
            .as_ref()
            .map(|r| r.timestamp),
        Some(10)
    );
}

#[test]
fn a_report_that_changes_nothing_changes_nothing() {
    let mut e = engine();
    e.report(&id(), &[report("temperature", "21")], 10)
        .expect("valid");
    let before = e.get(&id()).cloned();
    let a = e
        .report(&id(), &[report("temperature", "21")], 20)
        .expect("valid");
    assert!(a.is_noop());
    assert!(a.outbox.is_empty());
    assert_eq!(
        e.get(&id()).cloned(),
        before,
        "not even the timestamp moves"
    );
}

#[test]
fn delta_covers_the_whole_twin_after_every_update() {
    let mut e = engine();
    // Touching temperature (no desired) still lists setpoint, whose desired differs from its
    // reported value: KubeEdge rebuilds the delta over the whole twin.
    let a = e
        .report(&id(), &[report("temperature", "5")], 1)
        .expect("valid");
    assert_eq!(a.delta.get("setpoint").map(String::as_str), Some("20"));
    assert_eq!(a.delta.len(), 1, "{:?}", a.delta);
    let a = e
        .report(&id(), &[report("setpoint", "19.5")], 2)
        .expect("valid");
    assert_eq!(a.delta.get("setpoint").map(String::as_str), Some("20"));
    let a = e
        .report(&id(), &[report("setpoint", "20")], 3)
        .expect("valid");
    assert!(a.delta.is_empty());
}

#[test]
fn desired_set_at_the_edge_bumps_the_edge_version_and_goes_to_the_cloud() {
    let mut e = engine();
    let a = e
        .edge_desired(&id(), &[("setpoint".into(), "30".into())], None, 5)
        .expect("valid");
    assert_eq!(a.outbox.len(), 1);
    assert_eq!(a.outbox[0].section, Section::Desired);
    assert_eq!(a.outbox[0].version, Version { cloud: 1, edge: 1 });
    assert_eq!(
        a.desired_changed().map(|(n, _)| n).collect::<Vec<_>>(),
        ["setpoint"]
    );
    assert_eq!(e.get(&id()).map(|t| t.row.desired_version), Some(2));
}

/// The cloud hears which desired value the edge holds: not at the first declaration (the
/// spec's own), but when a spec value replaces an earlier one, such as one set at the edge
/// (the override ends).
#[test]
fn a_spec_value_that_replaces_an_edge_one_goes_to_the_cloud() {
    let mut e = Engine::new(Vec::new(), Limits::default(), 0);
    let a = e.upsert_device(&decl(Some("20")), 1).expect("valid");
    assert!(
        a.outbox.iter().all(|o| o.section != Section::Desired),
        "{:?}",
        a.outbox
    );
    e.edge_desired(&id(), &[("setpoint".into(), "30".into())], None, 5)
        .expect("valid");
    let a = e.upsert_device(&decl(Some("25")), 6).expect("valid");
    let sent: Vec<_> = a
        .outbox
        .iter()
        .filter(|o| o.section == Section::Desired)
        .map(|o| (o.property.as_str(), o.value.as_str()))
        .collect();
    assert_eq!(sent, [("setpoint", "25")]);
    // A reload of the same spec changes nothing and sends nothing.
    let a = e.upsert_device(&decl(Some("25")), 7).expect("valid");
    assert!(a.outbox.is_empty(), "{:?}", a.outbox);
}

#[test]
fn conditional_update_with_a_stale_version_is_a_conflict() {
    let mut e = engine();
    let err = e
        .edge_desired(&id(), &[("setpoint".into(), "30".into())], Some(0), 5)
        .expect_err("desired version is 1");
    assert_eq!(
        err,
        TwinError::Conflict {
            device: id(),
            expected: 0,
            actual: 1
        }
    );
    assert_eq!(err.code(), 409);
    e.edge_desired(&id(), &[("setpoint".into(), "30".into())], Some(1), 5)
        .expect("current version");
}

#[test]
fn cloud_sync_with_an_older_version_is_rejected_with_the_current_state() {
    let mut e = engine();
    e.edge_desired(&id(), &[("setpoint".into(), "30".into())], None, 5)
        .expect("valid");
    // The edge has {cloud:1, edge:1}; a cloud write that has not seen the edge write is stale.
    let err = e
        .cloud_desired(&id(), "setpoint", "40", Version { cloud: 2, edge: 0 }, 6)
        .expect_err("stale");
    match err {
        TwinError::StaleVersion {
            current,
            current_value,
            ..
        } => {
            assert_eq!(current, Version { cloud: 1, edge: 1 });
            assert_eq!(current_value.map(|v| v.value), Some("30".to_string()));
        }
        other => panic!("unexpected {other:?}"),
    }
    e.cloud_desired(&id(), "setpoint", "40", Version { cloud: 2, edge: 1 }, 7)
        .expect("up to date");
    let t = e.get(&id()).expect("twin");
    assert_eq!(
        t.properties["setpoint"].desired_version,
        Version { cloud: 2, edge: 1 }
    );
}

#[test]
fn read_only_properties_take_no_desired_value() {
    let mut e = engine();
    let err = e
        .edge_desired(&id(), &[("temperature".into(), "3".into())], None, 5)
        .expect_err("read-only");
    assert!(matches!(err, TwinError::ReadOnly { .. }), "{err}");
}

#[test]
fn values_are_checked_against_the_property_type_and_nothing_is_half_applied() {
    let mut e = engine();
    let err = e
        .report(
            &id(),
            &[report("setpoint", "21.5"), report("temperature", "warm")],
            5,
        )
        .expect_err("not an int");
    assert!(err.to_string().contains("temperature"), "{err}");
    let t = e.get(&id()).expect("twin");
    assert!(
        t.properties["setpoint"].reported.is_none(),
        "first value not applied"
    );
}

#[test]
fn an_undeclared_property_is_created_only_when_the_report_gives_its_type() {
    let mut e = engine();
    let err = e
        .report(&id(), &[report("humidity", "40")], 5)
        .expect_err("DMI reports only declared properties");
    assert!(
        matches!(&err, TwinError::UnknownProperty { property, .. } if property == "humidity"),
        "{err}"
    );
    let typed = Reported {
        value_type: Some(PropertyType::Int),
        ..report("humidity", "40")
    };
    e.report(&id(), &[typed], 6).expect("MQTT may add one");
    let t = e.get(&id()).expect("twin");
    assert_eq!(t.properties["humidity"].value_type, PropertyType::Int);
}

#[test]
fn values_with_spaces_json_and_more_than_512_characters_are_fine() {
    let mut e = engine();
    let long = "a b ".repeat(300);
    e.report(&id(), &[adding("note", &long)], 5)
        .expect("no 512 limit");
    e.report(&id(), &[adding("json", r#"{"a": [1, 2]}"#)], 5)
        .expect("json values");
    let t = e.get(&id()).expect("twin");
    assert!(t.properties["note"].optional, "created by a report");
}

#[test]
fn value_and_document_caps_give_clear_errors() {
    let limits = Limits {
        max_value_bytes: 10,
        max_document_bytes: 25,
    };
    let mut e = Engine::new(Vec::new(), limits, 0);
    e.upsert_device(&decl(None), 1).expect("valid");
    let err = e
        .report(&id(), &[adding("x", "12345678901")], 2)
        .expect_err("value too large");
    assert_eq!(
        err.to_string(),
        "value of property \"x\" is 11 bytes, more than the limit of 10"
    );
    e.report(
        &id(),
        &[adding("a", "1234567890"), adding("b", "1234567890")],
        3,
    )
    .expect("20 bytes fit");
    let err = e
        .report(&id(), &[adding("c", "1234567890")], 4)
        .expect_err("document too large");
    assert!(
        matches!(
            err,
            TwinError::DocumentTooLarge {
                size: 30,
                limit: 25,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn removing_a_device_removes_its_twin() {
    let mut e = engine();
    let a = e.remove_device(&id()).expect("known");
    assert!(a.removed);
    assert_eq!(a.changes.len(), 2);
    assert!(e.get(&id()).is_none());
    assert!(matches!(
        e.report(&id(), &[report("temperature", "1")], 1),
        Err(TwinError::UnknownDevice(_))
    ));
}

#[test]
fn a_property_dropped_from_the_spec_is_removed_but_reported_extras_stay() {
    let mut e = engine();
    e.report(&id(), &[adding("extra", "1")], 1).expect("valid");
    let mut d = decl(Some("20"));
    d.properties.retain(|p| p.name != "setpoint");
    let a = e.upsert_device(&d, 2).expect("valid");
    assert_eq!(a.changes.len(), 1);
    assert!(a.changes[0].current.is_none());
    let t = e.get(&id()).expect("twin");
    assert!(t.properties.contains_key("extra"));
    assert!(!t.properties.contains_key("setpoint"));
}

#[test]
fn state_changes_are_recorded_once_and_unknown_states_rejected() {
    let mut e = engine();
    let a = e.set_state(&id(), "Online", "", 100_000).expect("valid");
    assert_eq!(a.outbox.len(), 1);
    let t = e.get(&id()).expect("twin");
    assert_eq!(t.row.state, "online");
    assert_eq!(t.row.last_online, 100_000);
    assert!(
        e.set_state(&id(), "online", "", 110_000)
            .expect("valid")
            .is_noop()
    );
    // A minute later the last-online time moves.
    assert!(
        !e.set_state(&id(), "online", "", 160_000)
            .expect("valid")
            .is_noop()
    );
    assert!(matches!(
        e.set_state(&id(), "sleepy", "", 1),
        Err(TwinError::InvalidState(_))
    ));
    e.set_state(&id(), "offline", "", 170_000).expect("valid");
    assert_eq!(e.get(&id()).map(|t| t.row.last_online), Some(160_000));
}

#[test]
fn a_state_reason_is_kept_until_the_mapper_reports_a_state() {
    let mut e = engine();
    e.set_state(&id(), "online", "", 1).expect("valid");
    let a = e
        .set_state(&id(), "unknown", "mapper m unreachable", 2)
        .expect("valid");
    assert!(a.state_changed);
    let t = e.get(&id()).expect("twin");
    assert_eq!(
        (t.row.state.as_str(), t.row.state_reason.as_str()),
        ("unknown", "mapper m unreachable")
    );
    assert!(t.values_stale());
    // A new reason alone is a change too; the same state and reason is not.
    assert!(
        !e.set_state(&id(), "unknown", "mapper n unreachable", 3)
            .expect("valid")
            .is_noop()
    );
    assert!(
        e.set_state(&id(), "unknown", "mapper n unreachable", 4)
            .expect("valid")
            .is_noop()
    );
    e.set_state(&id(), "online", "", 5).expect("valid");
    let t = e.get(&id()).expect("twin");
    assert_eq!(t.row.state_reason, "");
    assert!(!t.values_stale());
}

#[test]
fn only_optional_properties_can_be_deleted() {
    let mut e = engine();
    e.report(&id(), &[adding("extra", "1")], 1).expect("valid");
    assert!(matches!(
        e.delete_property(&id(), "setpoint"),
        Err(TwinError::NotOptional { .. })
    ));
    let a = e.delete_property(&id(), "extra").expect("optional");
    assert_eq!(a.changes.len(), 1);
}

#[test]
fn outbox_sequence_numbers_increase() {
    let mut e = engine();
    let a = e
        .report(&id(), &[report("temperature", "1")], 1)
        .expect("valid");
    let b = e
        .report(&id(), &[report("temperature", "2")], 2)
        .expect("valid");
    assert!(b.outbox[0].seq > a.outbox[0].seq);
}

#[test]
fn expected_and_actual_in_one_twin_update_are_one_change_without_a_stale_delta() {
    let mut e = engine();
    let a = e
        .twin_update(
            &id(),
            &[("setpoint".into(), "25".into())],
            &[report("setpoint", "25")],
            &[],
            7,
        )
        .expect("valid");
    assert_eq!(a.changes.len(), 1, "{:?}", a.changes);
    let c = &a.changes[0];
    assert_eq!(c.name, "setpoint");
    let last = c.last.as_ref().expect("setpoint existed");
    let current = c.current.as_ref().expect("setpoint exists");
    assert_eq!(last.desired.as_ref().map(|v| v.value.as_str()), Some("20"));
    assert_eq!(
        current.desired.as_ref().map(|v| v.value.as_str()),
        Some("25")
    );
    assert_eq!(
        current.reported.as_ref().map(|v| v.value.as_str()),
        Some("25")
    );
    assert!(a.delta.is_empty(), "no stale delta: {:?}", a.delta);
}

#[test]
fn a_refused_part_of_a_twin_update_applies_nothing() {
    let mut e = engine();
    let before = e.get(&id()).cloned();
    let r = e.twin_update(
        &id(),
        &[("setpoint".into(), "not a number".into())],
        &[report("temperature", "6")],
        &[],
        8,
    );
    assert!(r.is_err());
    assert_eq!(e.get(&id()).cloned(), before, "the report was rolled back");
}

#[test]
fn an_int_twin_holds_the_whole_unsigned_64_bit_range() {
    let mut e = engine();
    // temperature is INT: a uint64 register above i64::MAX is a valid value.
    e.report(&id(), &[report("temperature", "18446744073709551557")], 2)
        .expect("u64 accepted");
    e.report(&id(), &[report("temperature", "-9223372036854775808")], 3)
        .expect("i64::MIN accepted");
    for bad in ["18446744073709551616", "-9223372036854775809", "1.5"] {
        assert!(
            matches!(
                e.report(&id(), &[report("temperature", bad)], 4),
                Err(TwinError::InvalidValue { .. })
            ),
            "{bad}"
        );
    }
}

#[test]
fn a_desired_value_outside_the_model_range_is_refused_at_the_edge() {
    let mut e = Engine::new(Vec::new(), Limits::default(), 0);
    let mut d = decl(None);
    d.properties[1].value_type = PropertyType::Int;
    d.properties[1].minimum = Some("0".into());
    d.properties[1].maximum = Some("3".into());
    e.upsert_device(&d, 1).expect("valid");
    let set =
        |e: &mut Engine, v: &str| e.edge_desired(&id(), &[("setpoint".into(), v.into())], None, 2);
    let err = set(&mut e, "4").expect_err("above the maximum");
    assert_eq!(err.code(), 400);
    assert!(
        err.to_string().contains("4 is above the model maximum 3"),
        "{err}"
    );
    let err = set(&mut e, "-1").expect_err("below the minimum");
    assert!(
        err.to_string().contains("-1 is below the model minimum 0"),
        "{err}"
    );
    set(&mut e, "3").expect("the maximum itself is allowed");
    assert_eq!(
        e.get(&id())
            .and_then(|t| t.properties["setpoint"].desired.clone())
            .map(|d| d.value),
        Some("3".into())
    );
    // A value a device reports is not refused for its range: the device says what it is.
    e.report(&id(), &[report("setpoint", "9")], 3)
        .expect("reported values are facts");
}

#[test]
fn a_property_error_is_kept_with_its_time_until_a_value_comes() {
    let mut e = engine();
    e.report(&id(), &[report("temperature", "21")], 2)
        .expect("valid");
    let failed = Reported {
        property: "temperature".into(),
        error: Some("exception 2 (illegal data address)".into()),
        ..Reported::default()
    };
    let a = e
        .report(&id(), std::slice::from_ref(&failed), 3)
        .expect("valid");
    assert!(
        a.outbox.iter().all(|e| e.section == Section::Errors),
        "an error is not a value for the cloud: {:?}",
        a.outbox
    );
    assert!(
        a.outbox[0]
            .value
            .contains("exception 2 (illegal data address)"),
        "{:?}",
        a.outbox
    );
    let p = &e.get(&id()).expect("twin").properties["temperature"];
    assert_eq!(p.reported.as_ref().map(|r| r.value.as_str()), Some("21"));
    assert_eq!(
        p.error.as_ref().map(|x| (x.value.as_str(), x.timestamp)),
        Some(("exception 2 (illegal data address)", 3))
    );
    // The same error again changes nothing (its time stays when it began).
    assert!(e.report(&id(), &[failed], 4).expect("valid").is_noop());
    e.report(&id(), &[report("temperature", "22")], 5)
        .expect("valid");
    assert_eq!(
        e.get(&id()).expect("twin").properties["temperature"].error,
        None
    );
}

#[test]
fn a_refused_desired_value_stands_until_the_desired_value_changes_or_lands() {
    let mut e = engine();
    let refusal = |value: &str| Reported {
        property: "setpoint".into(),
        write_error: Some((value.into(), format!("{value} does not fit"))),
        ..Reported::default()
    };
    let write_error = |e: &Engine| {
        e.get(&id())
            .and_then(|t| t.properties["setpoint"].write_error.clone())
            .map(|x| (x.value, x.timestamp))
    };
    // The desired value is 20 (the spec's): a refusal of another value is old news.
    e.report(&id(), &[refusal("-5")], 2).expect("valid");
    assert_eq!(write_error(&e), None);
    e.report(&id(), &[refusal("20")], 3).expect("valid");
    assert_eq!(write_error(&e), Some(("20 does not fit".into(), 3)));
    // Reads go on: a reported value does not clear it.
    e.report(&id(), &[report("setpoint", "7")], 4)
        .expect("valid");
    assert_eq!(write_error(&e), Some(("20 does not fit".into(), 3)));
    // A new desired value clears it.
    e.edge_desired(&id(), &[("setpoint".into(), "21".into())], None, 5)
        .expect("valid");
    assert_eq!(write_error(&e), None);
    e.report(&id(), &[refusal("21")], 6).expect("valid");
    assert_eq!(write_error(&e), Some(("21 does not fit".into(), 6)));
    // The device saying it applied the desired value clears it too.
    let applied = Reported {
        property: "setpoint".into(),
        value: Some("21".into()),
        observed_desired: Some("21".into()),
        ..Reported::default()
    };
    e.report(&id(), &[applied], 7).expect("valid");
    assert_eq!(write_error(&e), None);
}

/// Two writable properties, `a` of at most 120, `b` free.
fn pair(a: &str, b: &str) -> DeviceDecl {
    let prop = |name: &str, desired: &str, maximum: Option<&str>| PropertyDecl {
        name: name.into(),
        value_type: PropertyType::Int,
        writable: true,
        desired: Some(desired.into()),
        minimum: None,
        maximum: maximum.map(Into::into),
        unit: None,
    };
    DeviceDecl {
        id: id(),
        description: String::new(),
        model: "oven".into(),
        protocol: "modbus".into(),
        properties: vec![prop("a", a, Some("120")), prop("b", b, None)],
    }
}

/// A spec value that can never land (out of range, not of the type) is refused on its own
/// property, tied to that value, while the desired value stays the last good one: the other
/// property's change lands, and the next good value of the refused one lands and clears it.
#[test]
fn a_refused_spec_value_holds_back_no_other_property_nor_a_later_value() {
    let mut e = Engine::new(Vec::new(), Limits::default(), 0);
    e.upsert_device(&pair("80", "1"), 1).expect("valid");
    let state = |e: &Engine, p: &str| {
        let t = e.get(&id()).expect("twin");
        let p = &t.properties[p];
        let errors = p.error_fields();
        let write = errors
            .iter()
            .find(|(k, _)| *k == "writeError")
            .map(|(_, v)| {
                format!(
                    "{}: {}",
                    v["desired"].as_str().unwrap_or(""),
                    v["message"].as_str().unwrap_or("")
                )
            });
        (p.desired.as_ref().map(|d| d.value.clone()), write)
    };
    for (step, (a, b)) in [("130", "2"), ("abc", "3")].into_iter().enumerate() {
        e.upsert_device(&pair(a, b), 2 + step as i64)
            .expect("the device is applied, the bad value refused on its own");
        assert_eq!(state(&e, "b").0.as_deref(), Some(b), "b lands");
        let (desired, refusal) = state(&e, "a");
        assert_eq!(
            desired.as_deref(),
            Some("80"),
            "a keeps its last good value"
        );
        let refusal = refusal.expect("the refusal is shown");
        assert!(refusal.starts_with(&format!("{a}: ")), "{refusal}");
        if a == "130" {
            assert!(
                refusal.ends_with("130 is above the model maximum 120"),
                "{refusal}"
            );
        }
    }
    e.upsert_device(&pair("85", "3"), 5).expect("valid");
    assert_eq!(
        state(&e, "a"),
        (Some("85".to_string()), None),
        "85 lands, the refusal goes"
    );
    // Asked again, refused again.
    e.upsert_device(&pair("130", "3"), 6).expect("valid");
    assert!(state(&e, "a").1.is_some_and(|r| r.starts_with("130: ")));
    // Back to the value already desired: the refusal of another value is moot.
    e.upsert_device(&pair("85", "3"), 7).expect("valid");
    assert_eq!(state(&e, "a"), (Some("85".to_string()), None));
}

#[test]
fn repacking_the_twins_changes_none_of_them() {
    let mut e = Engine::new(Vec::new(), Limits::default(), 0);
    let ids: Vec<DeviceId> = (0..50)
        .map(|i| {
            DeviceId::new(
                if i % 2 == 0 { "default" } else { "line-ä" },
                format!("d-{i}"),
            )
        })
        .collect();
    for (i, d) in ids.iter().enumerate() {
        let mut dd = decl(Some("20.5"));
        dd.id = d.clone();
        e.upsert_device(&dd, 1).expect("valid");
        let mut failed = report("temperature", "");
        failed.value = None;
        failed.error = Some(format!("timeout after {i} ms: \"quoted\" \u{1F525}"));
        let reports = match i % 4 {
            0 => vec![report("temperature", &i64::MIN.to_string())],
            1 => vec![failed],
            2 => vec![adding("json", r#"{"a": [1, 2.50, 18446744073709551615]}"#)],
            _ => vec![report("temperature", "7"), report("setpoint", "20.5")],
        };
        e.report(d, &reports, 10 + i as i64).expect("valid");
        if i % 3 == 0 {
            e.edge_desired(d, &[("setpoint".into(), "1e3".into())], None, 20)
                .expect("valid");
        }
        if i % 5 == 0 {
            e.set_state(d, "online", "", 30).expect("valid");
        }
    }
    let sorted = |e: &Engine| {
        let mut all: Vec<_> = e.devices().cloned().collect();
        all.sort_by_key(|t| t.id().to_string());
        all
    };
    let before = sorted(&e);
    e.repack().expect("the twins read back");
    assert_eq!(sorted(&e), before, "every twin as it was");
    assert_eq!(e.len(), ids.len());
    // What is kept in memory only is kept too.
    let t = e.get(&ids[0]).expect("twin");
    assert_eq!(t.properties["temperature"].last_read.0, Some(10));
    // And the engine goes on from where it was: versions keep counting.
    let v = t.row.reported_version;
    e.report(&ids[0], &[report("temperature", "8")], 99)
        .expect("valid");
    let t = e.get(&ids[0]).expect("twin");
    assert_eq!(t.row.reported_version, v + 1);
    assert_eq!(t.properties["temperature"].last_read.0, Some(99));
}
