use super::*;

#[test]
fn a_large_nodes_profile_is_made_less_often_in_proportion_to_its_devices() {
    let i = Duration::from_millis(200);
    assert_eq!(profile_every(i, 0), i);
    assert_eq!(profile_every(i, 249), i);
    assert_eq!(profile_every(i, 1000), Duration::from_millis(1000));
    assert_eq!(profile_every(i, 5000), Duration::from_millis(4200));
}

#[test]
fn an_object_without_a_namespace_is_in_default_and_one_without_a_name_has_no_key() {
    assert_eq!(
        key_of(&json!({"metadata": {"name": "oven-1"}})),
        Some(("default".into(), "oven-1".into()))
    );
    assert_eq!(
        key_of(&json!({"metadata": {"name": "oven-1", "namespace": "plant"}})),
        Some(("plant".into(), "oven-1".into()))
    );
    assert_eq!(key_of(&json!({"metadata": {"namespace": "plant"}})), None);
}

#[test]
fn a_status_is_kept_as_its_version_and_its_twins_only() {
    let twins = json!([{"propertyName": "temperature", "reported": {"value": "21.5"}}]);
    let v = json!({
        "metadata": {"name": "oven-1", "resourceVersion": "17", "labels": {"a": "b"}},
        "spec": {"big": "x".repeat(1000)},
        "status": {"twins": twins, "state": "online"}
    });
    let e = StatusEntry::of(&v);
    assert_eq!(e.rv, 17);
    assert_eq!(e.value(), json!({"status": {"twins": twins}}));
    assert_eq!(rv_num(&json!({"metadata": {"resourceVersion": "x"}})), 0);
    assert_eq!(rv_num(&json!({})), 0);
}

#[test]
fn a_patchs_answer_is_kept_as_the_whole_object_would_be() {
    let twins = json!([{"propertyName": "t", "reported": {"value": "21.50", "metadata": {"timestamp": "1"}}}]);
    for v in [
        json!({"metadata": {"name": "a", "resourceVersion": "17", "managedFields": [{"x": 1}]},
            "spec": {"deviceRef": {"name": "a"}}, "status": {"twins": twins}}),
        json!({"metadata": {"resourceVersion": "18"},
            "status": {"twins": twins, "extensions": {upstream::STATE_REASON: "offline", upstream::STATE_SINCE: "t"}}}),
        json!({"metadata": {"resourceVersion": "19"}, "status": {"twins": twins, "extensions": {"other": 1}}}),
        json!({"metadata": {"resourceVersion": "20"}, "status": {}}),
        json!({"metadata": {"resourceVersion": "21"}}),
        json!({"metadata": {}, "status": {"twins": null}}),
    ] {
        let text = v.to_string();
        let answered: Answered = serde_json::from_str(&text).expect("an answer");
        let lean = StatusEntry::answered(&answered);
        let whole = StatusEntry::of(&v);
        assert_eq!(lean.rv, whole.rv, "{text}");
        assert_eq!(lean.value(), whole.value(), "{text}");
    }
}

#[test]
fn a_profile_is_rewritten_only_when_its_text_changes() {
    assert_eq!(text_hash("{\"a\":1}"), text_hash("{\"a\":1}"));
    assert_ne!(text_hash("{\"a\":1}"), text_hash("{\"a\":2}"));
}
