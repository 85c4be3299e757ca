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
fn a_profile_is_rewritten_only_when_its_text_changes() {
    assert_eq!(text_hash("{\"a\":1}"), text_hash("{\"a\":1}"));
    assert_ne!(text_hash("{\"a\":1}"), text_hash("{\"a\":2}"));
}
