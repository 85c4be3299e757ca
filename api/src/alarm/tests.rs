use super::*;
use proptest::prelude::*;

const PROPS: &[Declared<'static>] = &[
    ("temperature", Some(PropertyType::Float)),
    ("count", Some(PropertyType::Int)),
    ("heater", Some(PropertyType::Boolean)),
    ("mode", Some(PropertyType::String)),
    ("unmodelled", None),
];

fn rule(text: &str) -> Rule {
    let (rules, errors) = parse(text, Some(PROPS));
    assert!(errors.is_empty(), "{text}: {errors:?}");
    rules.into_iter().next().expect("one rule")
}

fn error(text: &str) -> String {
    let (_, errors) = parse(text, Some(PROPS));
    assert_eq!(errors.len(), 1, "{text}: {errors:?}");
    errors[0].to_string()
}

fn value(v: &str) -> Seen<'_> {
    Seen {
        value: Some(v),
        has_property: true,
        last_read: Some(0),
        ..Seen::default()
    }
}

/// Runs `values` through the rule; the alarm's activity after each.
fn run(r: &Rule, values: &[&str]) -> Vec<bool> {
    let mut a: Option<Alarm> = None;
    values
        .iter()
        .enumerate()
        .map(|(t, v)| {
            a = step(r, a.as_ref(), &value(v), t as i64).keep;
            a.as_ref().is_some_and(|a| a.active)
        })
        .collect()
}

#[test]
fn rules_read_as_written() {
    let r = rule("too-hot: temperature > 90 clear < 85 critical");
    assert_eq!(r.name, "too-hot");
    assert_eq!(r.severity, Severity::Critical);
    assert_eq!(r.condition.to_string(), "temperature > 90 clear < 85");
    assert_eq!(rule("x: heater == true").severity, Severity::Major);
    assert_eq!(
        rule("gone: offline 2m warning").condition,
        Condition::Offline { after_ms: 120_000 }
    );
    assert_eq!(
        rule("old: temperature stale 30s").condition.to_string(),
        "temperature stale 30s"
    );
    let (rules, errors) = parse(
        "# a comment\n\na: count >= 3\nb: mode != auto minor\n",
        None,
    );
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(rules.len(), 2);
}

#[test]
fn every_bad_rule_is_named_with_its_line_and_what_is_wrong() {
    for (text, says) in [
        ("temperature > 90", "has no `NAME:`"),
        ("Too_Hot: temperature > 90", "rule name `Too_Hot`"),
        (
            "a: pressure > 3",
            "property pressure, which the device does not declare",
        ),
        ("a: heater > 1", "heater is BOOLEAN: use == or !="),
        ("a: temperature > ninety", "`ninety` is not a number"),
        ("a: temperature > 90 clear > 85", "points the same way"),
        (
            "a: temperature > 90 clear < 95",
            "on the wrong side of the limit 90",
        ),
        (
            "a: temperature < 10 clear > 5",
            "on the wrong side of the limit 10",
        ),
        ("a: temperature stale soon", "`soon` is not a duration"),
        ("a: temperature > 90 or so", "only `clear < N`"),
        ("a: temperature", "is not a condition"),
        ("a:", "has no condition"),
    ] {
        let e = error(text);
        assert!(e.starts_with("line 1: "), "{e}");
        assert!(e.contains(says), "{text}: {e}");
    }
    // A property whose model is not known yet: its threshold is taken on trust.
    assert_eq!(rule("a: unmodelled > 3").name, "a");
    let (rules, errors) = parse("a: count > 1\na: count > 2\n", Some(PROPS));
    assert_eq!(rules.len(), 1);
    assert_eq!(errors[0].line, 2);
    assert!(errors[0].message.contains("named twice"));
    let many: String = (0..40).map(|i| format!("r{i}: count > {i}\n")).collect();
    let (rules, errors) = parse(&many, None);
    assert_eq!(rules.len(), MAX_RULES);
    assert_eq!(errors.len(), 40 - MAX_RULES);
}

#[test]
fn a_threshold_with_a_clear_limit_does_not_flap_inside_the_band() {
    let r = rule("hot: temperature > 90 clear < 85");
    assert_eq!(
        run(
            &r,
            &["80", "91", "88", "86", "85", "84.9", "88", "90", "90.5"]
        ),
        [false, true, true, true, true, false, false, false, true]
    );
    // Without a clear limit it clears as soon as the limit no longer holds.
    let r = rule("hot: temperature >= 90");
    assert_eq!(
        run(&r, &["89", "90", "89.99", "95"]),
        [false, true, false, true]
    );
    // 64-bit counts compare exactly.
    let r = rule("wrap: count > 9007199254740993");
    assert_eq!(
        run(&r, &["9007199254740993", "9007199254740994"]),
        [false, true]
    );
}

#[test]
fn an_alarm_goes_through_thingsboards_four_statuses() {
    let r = rule("hot: temperature > 90 critical");
    let s = step(&r, None, &value("95"), 10);
    assert_eq!(s.told.as_ref().map(|t| t.0), Some(Change::Raised));
    let a = s.keep.expect("raised");
    assert_eq!(a.status(), "active-unacknowledged");
    assert_eq!(a.message, "temperature 95 > 90");
    assert_eq!(a.since, 10);
    // A value still past the limit changes nothing (nothing to store or tell).
    assert_eq!(step(&r, Some(&a), &value("97"), 11).told, None);
    let acked = acknowledge(Some(&a), "admin", 12).expect("acknowledged");
    let a = acked.keep.expect("still active");
    assert_eq!(a.status(), "active-acknowledged");
    assert_eq!(
        acknowledge(Some(&a), "bob", 13),
        Err(AckRefused::Already { by: "admin".into() })
    );
    let cleared = step(&r, Some(&a), &value("80"), 14);
    let (change, told) = cleared.told.expect("told");
    assert_eq!(change, Change::Cleared);
    assert_eq!(told.status(), "cleared-acknowledged");
    assert!(told.ended, "cleared and acknowledged: over");
    assert_eq!(cleared.keep, None);

    // Cleared first, acknowledged after.
    let a = step(&r, None, &value("95"), 20).keep.expect("raised");
    let a = step(&r, Some(&a), &value("80"), 21)
        .keep
        .expect("cleared, kept");
    assert_eq!(a.status(), "cleared-unacknowledged");
    assert_eq!(a.cleared_at, Some(21));
    // Raised again before anyone looked: a new occurrence.
    let again = step(&r, Some(&a), &value("99"), 22).keep.expect("raised");
    assert_eq!((again.since, again.cleared_at), (22, None));
    let a = step(&r, Some(&again), &value("80"), 23)
        .keep
        .expect("cleared");
    let s = acknowledge(Some(&a), "ops", 24).expect("ack");
    assert_eq!(s.keep, None);
    assert_eq!(s.told.map(|t| t.1.ended), Some(true));
    assert_eq!(acknowledge(None, "ops", 25), Err(AckRefused::NoAlarm));
    assert_eq!(acknowledge(Some(&a), "", 25), Err(AckRefused::BadName));
}

#[test]
fn a_rule_that_cannot_be_evaluated_says_why_and_recovers() {
    let r = rule("hot: temperature > 90");
    let s = step(&r, None, &value("n/a"), 1);
    let a = s.keep.expect("kept to be shown");
    assert_eq!(a.status(), "unevaluable");
    assert_eq!(
        a.error.as_deref(),
        Some("temperature is `n/a`, not a number")
    );
    // The same reason again is no news.
    assert_eq!(step(&r, Some(&a), &value("n/a"), 2).told, None);
    assert_eq!(
        step(&r, Some(&a), &value("x"), 2).told.map(|t| t.0),
        Some(Change::Unevaluable)
    );
    let s = step(&r, Some(&a), &value("20"), 3);
    assert_eq!(s.told.map(|t| t.0), Some(Change::Evaluable));
    assert_eq!(s.keep, None);
    let gone = Seen::default();
    let s = step(&r, None, &gone, 4);
    assert_eq!(
        s.keep.and_then(|a| a.error),
        Some("the twin has no property temperature".into())
    );
}

#[test]
fn time_rules_wait_for_their_duration() {
    let stale = rule("old: temperature stale 30s");
    let at = |t: i64| Seen {
        value: Some("20"),
        has_property: true,
        last_read: Some(t),
        ..Seen::default()
    };
    assert_eq!(step(&stale, None, &at(0), 29_999).keep, None);
    let a = step(&stale, None, &at(0), 30_000).keep.expect("stale");
    assert_eq!(a.message, "temperature not read for 30 s");
    assert!(
        !step(&stale, Some(&a), &at(30_500), 31_000)
            .keep
            .expect("kept")
            .active
    );

    let off = rule("gone: offline 1m");
    let down = |since: Option<i64>| Seen {
        offline_since: since,
        state: "offline",
        ..Seen::default()
    };
    assert_eq!(step(&off, None, &down(Some(0)), 59_000).keep, None);
    let a = step(&off, None, &down(Some(0)), 60_000)
        .keep
        .expect("offline");
    assert_eq!(a.message, "the device is offline");
    assert_eq!(a.property, "");
    assert!(
        !step(&off, Some(&a), &down(None), 61_000)
            .keep
            .expect("kept")
            .active
    );
}

#[test]
fn the_alarm_json_is_camel_case_and_reads_back() {
    let a = step(&rule("hot: temperature > 90"), None, &value("95"), 5)
        .keep
        .expect("raised");
    let j = serde_json::to_value(&a).expect("json");
    assert_eq!(j["severity"], "major");
    assert_eq!(j["since"], 5);
    assert!(j.get("clearedAt").is_none() && j.get("ended").is_none());
    let back: Alarm = serde_json::from_value(j).expect("reads back");
    assert_eq!(back, a);
}

fn arb_condition() -> impl Strategy<Value = String> {
    let num = || (-1000i64..1000).prop_map(|n| n.to_string());
    prop_oneof![
        (num(), 0i64..50, any::<bool>(), any::<bool>()).prop_map(|(l, gap, up, with_clear)| {
            let lim: i64 = l.parse().unwrap_or(0);
            let (op, cop, c) = if up {
                (">", "<", lim - gap)
            } else {
                ("<", ">", lim + gap)
            };
            if with_clear {
                format!("temperature {op} {l} clear {cop} {c}")
            } else {
                format!("count {op}= {l}")
            }
        }),
        prop_oneof![Just("heater == true"), Just("mode != auto")].prop_map(String::from),
        (1i64..120).prop_map(|s| format!("temperature stale {s}s")),
        (0i64..60).prop_map(|m| format!("offline {m}m")),
    ]
}

proptest! {
    /// A rule as written reads back to the same rule, and its condition prints as written.
    #[test]
    fn a_written_rule_reads_back(name in "[a-z][a-z0-9-]{0,20}[a-z0-9]", cond in arb_condition(),
                                 sev in prop_oneof![Just("critical"), Just("major"), Just("minor"), Just("warning")]) {
        let text = format!("{name}: {cond} {sev}");
        let (rules, errors) = parse(&text, Some(PROPS));
        prop_assert!(errors.is_empty(), "{}: {:?}", text, errors);
        let r = &rules[0];
        prop_assert_eq!(&r.name, &name);
        prop_assert_eq!(r.severity.as_str(), sev);
        let again = parse(&format!("{name}: {} {sev}", r.condition), Some(PROPS)).0;
        prop_assert_eq!(&again[0], r);
    }

    /// Whatever the values, a threshold alarm is raised only past its limit and cleared only
    /// past its clear limit; between them it keeps its state.
    #[test]
    fn a_threshold_alarm_follows_its_hysteresis(lim in -100i64..100, gap in 0i64..20,
                                                values in proptest::collection::vec(-150i64..150, 1..40)) {
        let r = rule(&format!("h: temperature > {lim} clear < {}", lim - gap));
        let mut a: Option<Alarm> = None;
        for (t, v) in values.iter().enumerate() {
            let was = a.as_ref().is_some_and(|a| a.active);
            a = step(&r, a.as_ref(), &value(&v.to_string()), t as i64).keep;
            let now = a.as_ref().is_some_and(|a| a.active);
            if *v > lim { prop_assert!(now) }
            else if *v < lim - gap { prop_assert!(!now) }
            else { prop_assert_eq!(now, was) }
        }
    }

    /// Any text gives rules or errors naming a line of it, never a panic.
    #[test]
    fn any_text_is_read_or_refused_by_line(text in "[a-z0-9 :<>=!.#\n-]{0,200}") {
        let (rules, errors) = parse(&text, Some(PROPS));
        let lines = text.lines().count();
        for e in &errors { prop_assert!(e.line >= 1 && e.line <= lines) }
        prop_assert!(rules.len() <= MAX_RULES);
    }
}
