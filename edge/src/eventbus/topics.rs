//! MQTT topic names and filters (MQTT 3.1.1 section 4.7), shared by the broker's routing and
//! the ACL. Filters are checked with rumqttc's `valid_filter`; matching is ours because
//! rumqttc's `matches` refuses every `$` topic and does not let `a/#` match `a`.

/// Whether `filter` matches `topic`: `+` is one level, a final `#` the rest (zero levels or
/// more), and neither matches a `$` topic at the first level.
pub(crate) fn topic_matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut t = topic.split('/');
    for f in filter.split('/') {
        if f == "#" {
            return true;
        }
        match t.next() {
            Some(_) if f == "+" => {}
            Some(level) if level == f => {}
            _ => return false,
        }
    }
    t.next().is_none()
}

/// Whether `topic` may be published to: not empty, no wildcard.
pub(crate) fn valid_topic(topic: &str) -> bool {
    !topic.is_empty() && rumqttc::valid_topic(topic)
}

/// Whether `filter` may be subscribed to.
pub(crate) fn valid_filter(filter: &str) -> bool {
    rumqttc::valid_filter(filter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plus_is_one_level_and_a_final_hash_is_the_rest() {
        let update = "$hw/events/device/+/+/twin/update";
        assert!(topic_matches(
            update,
            "$hw/events/device/default/a/twin/update"
        ));
        assert!(!topic_matches(
            update,
            "$hw/events/device/default/a/twin/update/result"
        ));
        assert!(topic_matches(
            "$hw/events/device/#",
            "$hw/events/device/default/a/twin/update/result"
        ));
        assert!(topic_matches("a/#", "a"), "a final # matches its parent");
        assert!(topic_matches("a/+", "a/b"));
        assert!(!topic_matches("a/+", "a/b/c"));
        assert!(!topic_matches("a/b", "a/b/c"));
        assert!(!topic_matches("a/b/c", "a/b"));
    }

    #[test]
    fn wildcards_at_the_first_level_do_not_match_dollar_topics() {
        assert!(!topic_matches("#", "$hw/events/x"));
        assert!(!topic_matches("+/events/x", "$hw/events/x"));
        assert!(topic_matches("$hw/#", "$hw/events/x"));
    }

    #[test]
    fn filters_with_misplaced_wildcards_and_topics_with_any_are_refused() {
        assert!(valid_filter("$hw/#"));
        assert!(valid_filter("+/a/+"));
        assert!(!valid_filter("a/#/b"));
        assert!(!valid_filter("a/b+"));
        assert!(!valid_filter(""));
        assert!(valid_topic("$hw/events/x"));
        assert!(!valid_topic(""));
        assert!(!valid_topic("a/+"));
        assert!(!valid_topic("a/#"));
    }
}
