//! The broker's subscriptions as a tree of topic levels, so that a publish finds its
//! subscribers in time that depends on the topic's depth and the filters that match it, not on
//! how many subscriptions there are (an app that subscribes per device holds thousands).
//!
//! MQTT 3.1.1 section 4.7: a filter is split into levels at `/`; `+` matches exactly one level
//! (an empty one too), a final `#` matches its parent level and any number below it, and
//! neither matches a topic whose first level starts with `$` when it is the filter's first
//! level ([`super::super::topics::topic_matches`] says the same for one filter, and the tests
//! hold the two to each other).

use rumqttc::{Publish, QoS};
use std::collections::HashMap;

/// A client's id in the broker's routing.
pub(super) type ClientId = u64;

#[derive(Default)]
struct Level {
    /// Literal next levels.
    children: HashMap<Box<str>, Level>,
    /// The `+` next level.
    plus: Option<Box<Level>>,
    /// Filters that end at this level: who, at which QoS.
    here: Vec<(ClientId, QoS)>,
    /// Filters that end with `#` below this level (`a/#` is kept at `a`).
    hash: Vec<(ClientId, QoS)>,
}

impl Level {
    fn is_empty(&self) -> bool {
        self.children.is_empty()
            && self.plus.is_none()
            && self.here.is_empty()
            && self.hash.is_empty()
    }
}

/// Sets `id`'s QoS in `subs` (one entry per client and filter).
fn put(subs: &mut Vec<(ClientId, QoS)>, id: ClientId, qos: QoS) {
    match subs.iter_mut().find(|(c, _)| *c == id) {
        Some(s) => s.1 = qos,
        None => subs.push((id, qos)),
    }
}

/// Every subscription of every client.
#[derive(Default)]
pub(super) struct Subscriptions {
    root: Level,
    count: usize,
}

impl Subscriptions {
    /// How many (client, filter) subscriptions are held.
    pub(super) fn len(&self) -> usize {
        self.count
    }

    /// Subscribes `id` to `filter` at `qos` (again: the QoS is replaced). `filter` must be
    /// valid (`topics::valid_filter`).
    pub(super) fn insert(&mut self, filter: &str, id: ClientId, qos: QoS) {
        let mut node = &mut self.root;
        let mut levels = filter.split('/').peekable();
        while let Some(level) = levels.next() {
            if level == "#" && levels.peek().is_none() {
                let before = node.hash.len();
                put(&mut node.hash, id, qos);
                self.count += node.hash.len() - before;
                return;
            }
            node = if level == "+" {
                node.plus.get_or_insert_with(Box::default)
            } else {
                node.children.entry(level.into()).or_default()
            };
        }
        let before = node.here.len();
        put(&mut node.here, id, qos);
        self.count += node.here.len() - before;
    }

    /// Unsubscribes `id` from `filter`; levels left with nothing are dropped.
    pub(super) fn remove(&mut self, filter: &str, id: ClientId) {
        let levels: Vec<&str> = filter.split('/').collect();
        if remove_at(&mut self.root, &levels, id) {
            self.count -= 1;
        }
    }

    /// Calls `each` with every client whose filters match `topic`, once per matching filter
    /// (a client with two matching filters comes twice: the caller takes the higher QoS).
    pub(super) fn matches(&self, topic: &str, each: &mut impl FnMut(ClientId, QoS)) {
        // Wildcards at the first level do not match `$` topics.
        let dollar = topic.starts_with('$');
        walk(&self.root, Some(topic), !dollar, each);
    }
}

/// Removes `id` from the filter of `levels` below `node`; whether it was there. Prunes levels
/// left empty.
fn remove_at(node: &mut Level, levels: &[&str], id: ClientId) -> bool {
    let Some((first, rest)) = levels.split_first() else {
        let before = node.here.len();
        node.here.retain(|(c, _)| *c != id);
        return node.here.len() < before;
    };
    if *first == "#" && rest.is_empty() {
        let before = node.hash.len();
        node.hash.retain(|(c, _)| *c != id);
        return node.hash.len() < before;
    }
    if *first == "+" {
        let Some(next) = node.plus.as_deref_mut() else {
            return false;
        };
        let found = remove_at(next, rest, id);
        if next.is_empty() {
            node.plus = None;
        }
        return found;
    }
    let Some(next) = node.children.get_mut(*first) else {
        return false;
    };
    let found = remove_at(next, rest, id);
    if next.is_empty() {
        node.children.remove(*first);
    }
    found
}

/// Visits the subscriptions below `node` that match `rest`, the topic's levels not walked yet
/// (`None`: none left; `Some("")`: one empty level).
fn walk(node: &Level, rest: Option<&str>, wild: bool, each: &mut impl FnMut(ClientId, QoS)) {
    if wild {
        // `#` matches the parent level and everything below it.
        for &(c, q) in &node.hash {
            each(c, q);
        }
    }
    let Some(rest) = rest else {
        for &(c, q) in &node.here {
            each(c, q);
        }
        return;
    };
    let (first, rest) = match rest.split_once('/') {
        Some((first, rest)) => (first, Some(rest)),
        None => (rest, None),
    };
    if let Some(next) = node.children.get(first) {
        walk(next, rest, true, each);
    }
    if wild && let Some(next) = node.plus.as_deref() {
        walk(next, rest, true, each);
    }
}

/// The retained messages, one per topic, as a tree of topic levels: a new subscription finds
/// those its filter matches by walking the filter's levels, not every retained message.
#[derive(Default)]
pub(super) struct Retained {
    root: Topic,
    count: usize,
}

#[derive(Default)]
struct Topic {
    children: HashMap<Box<str>, Topic>,
    /// The retained message of the topic that ends at this level.
    here: Option<Publish>,
}

impl Retained {
    /// Retained messages held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.count
    }

    /// Keeps `publish` as its topic's retained message; an empty payload clears the topic.
    pub(super) fn set(&mut self, publish: &Publish) {
        let levels: Vec<&str> = publish.topic.split('/').collect();
        if publish.payload.is_empty() {
            if clear_at(&mut self.root, &levels) {
                self.count -= 1;
            }
            return;
        }
        let mut node = &mut self.root;
        for level in levels {
            node = node.children.entry(level.into()).or_default();
        }
        if node.here.replace(publish.clone()).is_none() {
            self.count += 1;
        }
    }

    /// Calls `each` with every retained message whose topic `filter` matches (a valid filter).
    pub(super) fn matching(&self, filter: &str, each: &mut impl FnMut(&Publish)) {
        let levels: Vec<&str> = filter.split('/').collect();
        visit(&self.root, &levels, true, each);
    }
}

/// Clears the topic of `levels` below `node`; whether it held a message. Prunes empty levels.
fn clear_at(node: &mut Topic, levels: &[&str]) -> bool {
    let Some((first, rest)) = levels.split_first() else {
        return node.here.take().is_some();
    };
    let Some(next) = node.children.get_mut(*first) else {
        return false;
    };
    let cleared = clear_at(next, rest);
    if next.here.is_none() && next.children.is_empty() {
        node.children.remove(*first);
    }
    cleared
}

/// Visits the messages below `node` that the filter's `levels` not walked yet match; at the
/// first level (`root`), a wildcard does not match a `$` topic.
fn visit(node: &Topic, levels: &[&str], root: bool, each: &mut impl FnMut(&Publish)) {
    let Some((first, rest)) = levels.split_first() else {
        if let Some(p) = &node.here {
            each(p);
        }
        return;
    };
    let wild = |name: &str| !(root && name.starts_with('$'));
    match *first {
        "#" => {
            // The parent level too (`a/#` matches `a`), and everything below.
            if let Some(p) = &node.here {
                each(p);
            }
            for (name, next) in &node.children {
                if wild(name) {
                    everything(next, each);
                }
            }
        }
        "+" => {
            for (name, next) in &node.children {
                if wild(name) {
                    visit(next, rest, false, each);
                }
            }
        }
        literal => {
            if let Some(next) = node.children.get(literal) {
                visit(next, rest, false, each);
            }
        }
    }
}

/// Every message at and below `node`.
fn everything(node: &Topic, each: &mut impl FnMut(&Publish)) {
    if let Some(p) = &node.here {
        each(p);
    }
    for next in node.children.values() {
        everything(next, each);
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::topics::topic_matches;
    use super::*;
    use proptest::prelude::*;

    fn matched(s: &Subscriptions, topic: &str) -> Vec<(ClientId, u8)> {
        let mut out = Vec::new();
        s.matches(topic, &mut |c, q| out.push((c, q as u8)));
        out.sort_unstable();
        out
    }

    #[test]
    fn levels_plus_hash_and_dollar_topics() {
        let mut s = Subscriptions::default();
        s.insert("$hw/events/device/+/+/twin/update", 1, QoS::AtLeastOnce);
        s.insert(
            "$hw/events/device/default/oven-1/twin/update/result",
            2,
            QoS::AtMostOnce,
        );
        s.insert("#", 3, QoS::AtLeastOnce);
        s.insert("a/#", 4, QoS::AtLeastOnce);
        s.insert("+/b", 5, QoS::AtLeastOnce);
        assert_eq!(
            matched(&s, "$hw/events/device/default/oven-1/twin/update"),
            [(1, 1)],
            "# does not match a $ topic"
        );
        assert_eq!(
            matched(&s, "$hw/events/device/default/oven-1/twin/update/result"),
            [(2, 0)]
        );
        assert_eq!(matched(&s, "a"), [(3, 1), (4, 1)], "a/# matches a");
        assert_eq!(matched(&s, "a/b"), [(3, 1), (4, 1), (5, 1)]);
        assert_eq!(
            matched(&s, "/b"),
            [(3, 1), (5, 1)],
            "+ matches an empty level"
        );
        assert_eq!(s.len(), 5);
        s.insert("a/#", 4, QoS::AtMostOnce);
        assert_eq!(s.len(), 5, "a second subscription replaces the QoS");
        assert_eq!(matched(&s, "a"), [(3, 1), (4, 0)]);
        for (f, c) in [
            ("$hw/events/device/+/+/twin/update", 1),
            ("$hw/events/device/default/oven-1/twin/update/result", 2),
            ("#", 3),
            ("a/#", 4),
            ("+/b", 5),
        ] {
            s.remove(f, c);
        }
        s.remove("never/subscribed", 9);
        assert_eq!(s.len(), 0);
        assert!(s.root.is_empty(), "empty levels are pruned");
    }

    fn level() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("a".to_string()),
            Just("b".to_string()),
            Just(String::new()),
            Just("$hw".to_string()),
            Just("$SYS".to_string()),
            "[a-c]{1,3}",
        ]
    }

    fn topic() -> impl Strategy<Value = String> {
        prop::collection::vec(level(), 1..6).prop_map(|v| v.join("/"))
    }

    fn filter() -> impl Strategy<Value = String> {
        (
            prop::collection::vec(prop_oneof![3 => level(), 1 => Just("+".to_string())], 0..5),
            any::<bool>(),
        )
            .prop_map(|(mut v, hash)| {
                if hash || v.is_empty() {
                    v.push("#".to_string());
                }
                v.join("/")
            })
    }

    proptest! {
        /// The tree gives, for any topic, exactly the subscriptions whose filter matches it one
        /// by one; and after removing some, exactly the rest.
        #[test]
        fn the_tree_agrees_with_matching_filter_by_filter(
            subs in prop::collection::vec((filter(), 0u64..6, any::<bool>()), 0..40),
            topics in prop::collection::vec(topic(), 1..20),
            drop_every in 2usize..5,
        ) {
            let mut s = Subscriptions::default();
            let mut flat: Vec<(String, ClientId, QoS)> = Vec::new();
            for (f, c, q) in &subs {
                let q = if *q { QoS::AtLeastOnce } else { QoS::AtMostOnce };
                s.insert(f, *c, q);
                flat.retain(|(x, y, _)| !(x == f && y == c));
                flat.push((f.clone(), *c, q));
            }
            let check = |s: &Subscriptions, flat: &[(String, ClientId, QoS)]| {
                for t in &topics {
                    let mut want: Vec<(ClientId, u8)> = flat
                        .iter()
                        .filter(|(f, _, _)| topic_matches(f, t))
                        .map(|(_, c, q)| (*c, *q as u8))
                        .collect();
                    want.sort_unstable();
                    prop_assert_eq!(matched(s, t), want, "topic {:?}", t);
                }
                prop_assert_eq!(s.len(), flat.len());
                Ok(())
            };
            check(&s, &flat)?;
            let gone: Vec<_> = flat.iter().step_by(drop_every).cloned().collect();
            for (f, c, _) in &gone {
                s.remove(f, *c);
            }
            flat.retain(|x| !gone.contains(x));
            check(&s, &flat)?;
        }
    }

    proptest! {
        /// The retained tree gives, for any filter, exactly the retained topics it matches one
        /// by one; a topic set again holds its last message, and an empty one clears it.
        #[test]
        fn retained_messages_agree_with_matching_topic_by_topic(
            sets in prop::collection::vec((topic(), 0u8..3), 0..40),
            filters in prop::collection::vec(filter(), 1..20),
        ) {
            let mut r = Retained::default();
            let mut flat: HashMap<String, u8> = HashMap::new();
            for (t, v) in &sets {
                // 0: an empty payload, which clears the topic.
                let payload = if *v == 0 { Vec::new() } else { vec![*v] };
                r.set(&Publish::new(t.as_str(), QoS::AtMostOnce, payload));
                if *v == 0 {
                    flat.remove(t);
                } else {
                    flat.insert(t.clone(), *v);
                }
            }
            prop_assert_eq!(r.len(), flat.len());
            for f in &filters {
                let mut got: Vec<(String, u8)> = Vec::new();
                r.matching(f, &mut |p| got.push((p.topic.clone(), p.payload[0])));
                got.sort();
                let mut want: Vec<(String, u8)> = flat
                    .iter()
                    .filter(|(t, _)| topic_matches(f, t))
                    .map(|(t, v)| (t.clone(), *v))
                    .collect();
                want.sort();
                prop_assert_eq!(got, want, "filter {:?}", f);
            }
        }
    }
}
