//! An object from the JSON text etcd holds, without building the tree of its body: each
//! replica does this for every change of the fleet (its view follows etcd's watch), and the
//! body (a DeviceStatus's reported values, a Node's status) is copied as it is. Only
//! `metadata` is taken apart: `resourceVersion` is set in it, and what selectors and
//! controllers look at (labels, uid, owners, deletion) is read from it.

use super::Obj;
use api::packed::Packed;
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

impl Obj {
    /// The object stored as `text`, at resourceVersion `rv` (set in `metadata`). The same
    /// object as parsing `text` into a tree, setting the version and writing it out again,
    /// which is what is done when `text` is not a JSON object with a `metadata` object
    /// (or names a member of theirs twice).
    pub fn from_stored(text: &[u8], rv: u64) -> Self {
        stamped(text, rv).unwrap_or_else(|| {
            Self::with_version(serde_json::from_slice(text).unwrap_or(Value::Null), rv)
        })
    }

    /// The object `v` at resourceVersion `rv` (set in its `metadata` when that is an object).
    pub(super) fn with_version(mut v: Value, rv: u64) -> Self {
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
        Self::from_value(&v, rv)
    }
}

/// What is read of the stored object's top level.
#[derive(Deserialize)]
struct Top<'a> {
    #[serde(borrow, default)]
    metadata: Option<&'a RawValue>,
    #[serde(default, rename = "apiVersion")]
    api_version: Option<Value>,
}

/// What is read of its `metadata` (`null` is as absent, as in the tree's way).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta<'a> {
    #[serde(borrow, default)]
    resource_version: Present<'a>,
    #[serde(default)]
    labels: Option<Value>,
    #[serde(default)]
    uid: Option<Value>,
    #[serde(default)]
    deletion_timestamp: Option<Value>,
    #[serde(default)]
    owner_references: Option<Value>,
}

/// A member's text when the member is there, `null` included (an `Option` would read `null`
/// as absent, and the version would then be written beside it, not over it).
#[derive(Default)]
struct Present<'a>(Option<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Present<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'a RawValue>::deserialize(d).map(|r| Self(Some(r)))
    }
}

/// The fast way of [`Obj::from_stored`]; `None` where it does not apply. The version is set
/// in the stored text (its old value replaced, or put first in `metadata`); the rest of the
/// text is kept as it is.
fn stamped(text: &[u8], rv: u64) -> Option<Obj> {
    // A derived struct is also read from an array: only objects are taken here.
    let opens_object = |t: &[u8]| t.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    if !opens_object(text) {
        return None;
    }
    let top: Top = serde_json::from_slice(text).ok()?;
    let meta_raw = top.metadata?;
    if !opens_object(meta_raw.get().as_bytes()) {
        return None;
    }
    let meta: Meta = serde_json::from_str(meta_raw.get()).ok()?;
    let labels = match meta.labels {
        Some(Value::Object(m)) => m
            .into_iter()
            .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_string()))
            .collect(),
        _ => Vec::new(),
    };
    let owners = match &meta.owner_references {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|o| o["uid"].as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    };
    // The parts read are slices of the text: where they are in it says where to write.
    let text_str = std::str::from_utf8(text).ok()?;
    let at = |part: &str| at_in(text_str, part);
    let version = format!("\"{rv}\"");
    let mut out = Vec::with_capacity(text.len() + version.len() + 20);
    match meta.resource_version.0 {
        Some(old) => {
            let from = at(meta_raw.get()) + at_in(meta_raw.get(), old.get());
            out.extend_from_slice(&text[..from]);
            out.extend_from_slice(version.as_bytes());
            out.extend_from_slice(&text[from + old.get().len()..]);
        }
        None => {
            let m = meta_raw.get();
            let open = m.find('{')? + 1;
            let empty = m[open..].trim_start().starts_with('}');
            let from = at(m) + open;
            out.extend_from_slice(&text[..from]);
            out.extend_from_slice(b"\"resourceVersion\":");
            out.extend_from_slice(version.as_bytes());
            if !empty {
                out.push(b',');
            }
            out.extend_from_slice(&text[from..]);
        }
    }
    Some(Obj {
        rv,
        body: Packed::new(&out),
        labels,
        uid: meta
            .uid
            .as_ref()
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        api_version: top
            .api_version
            .as_ref()
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        deleting: meta
            .deletion_timestamp
            .as_ref()
            .is_some_and(Value::is_string),
        owners,
    })
}

/// Where `part` (a slice of `whole`) starts in it.
fn at_in(whole: &str, part: &str) -> usize {
    part.as_ptr() as usize - whole.as_ptr() as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The tree's way: what `from_stored` is to be equal to.
    fn through_tree(text: &[u8], rv: u64) -> Obj {
        Obj::with_version(serde_json::from_slice(text).unwrap_or(Value::Null), rv)
    }

    /// `a` (the fast way) against `b` (the tree's way) for the object stored as `text`: the
    /// same facts, and the same object as `text` read once with the version set. (Not `b`'s
    /// text read again: `serde_json` reads some floats a last digit off, and the tree's way
    /// reads a number twice where the fast way keeps its stored text.)
    fn same(a: &Obj, b: &Obj, text: &[u8]) -> Result<(), TestCaseError> {
        let fail = |e: serde_json::Error| TestCaseError::fail(e.to_string());
        let mut want: Value = serde_json::from_slice(text).map_err(fail)?;
        if let Some(m) = want.get_mut("metadata").and_then(Value::as_object_mut) {
            m.insert("resourceVersion".into(), Value::String(b.rv.to_string()));
        }
        let got: Value = serde_json::from_slice(&a.json()).map_err(fail)?;
        prop_assert_eq!(got, want);
        prop_assert_eq!(a.rv, b.rv);
        prop_assert_eq!(&a.labels, &b.labels);
        prop_assert_eq!(&a.uid, &b.uid);
        prop_assert_eq!(&a.api_version, &b.api_version);
        prop_assert_eq!(a.deleting, b.deleting);
        prop_assert_eq!(&a.owners, &b.owners);
        Ok(())
    }

    #[test]
    fn a_device_status_is_stamped_and_its_body_kept() {
        let v = json!({
            "apiVersion": "devices.kubeedge.io/v1beta1",
            "kind": "DeviceStatus",
            "metadata": {"name": "d", "namespace": "default", "uid": "u1", "resourceVersion": "3",
                "labels": {"a": "b", "n": 1}, "ownerReferences": [{"uid": "o1"}, {"name": "x"}]},
            "status": {"twins": [{"propertyName": "t", "reported": {"value": "21.5"}}]},
        });
        let text = serde_json::to_vec(&v).unwrap_or_default();
        let o = Obj::from_stored(&text, 42);
        assert_eq!(o.value()["metadata"]["resourceVersion"], "42");
        assert_eq!(o.value()["status"], v["status"]);
        assert_eq!(
            o.labels,
            vec![("a".into(), "b".into()), ("n".into(), String::new())]
        );
        assert_eq!(o.owners, vec!["o1".to_string()]);
        assert_eq!(o.uid, "u1");
        assert!(!o.deleting);
        // The stored text kept, but for the version.
        let stored = String::from_utf8_lossy(&text)
            .replace(r#""resourceVersion":"3""#, r#""resourceVersion":"42""#);
        assert_eq!(String::from_utf8_lossy(&o.json()), stored);
        let bare = br#"{"metadata":{ },"status":{"v":1.50}}"#;
        assert_eq!(
            &*Obj::from_stored(bare, 9).json(),
            br#"{"metadata":{"resourceVersion":"9" },"status":{"v":1.50}}"#
        );
    }

    #[test]
    fn odd_texts_give_the_tree_ways_object() {
        for text in [
            &br#"{"metadata":{"na\u006de":"x","uid":7,"labels":null},"kind":"K"}"#[..],
            br#"{"metadata":{"resourceVersion":1,"resourceVersion":2}}"#,
            br#"{"metadata":{"resourceVersion":null}}"#,
            br#"{"metadata":{"uid":"u","resourceVersion":{"a":[1]}}}"#,
            br#"{"metadata":{},"metadata":{"uid":"u"}}"#,
            br#"{"metadata":"not an object"}"#,
            br#"{"metadata":null}"#,
            br#"{"kind":"no metadata"}"#,
            br#"["metadata",{"uid":"u"}]"#,
            br#"  {"metadata" : {  } }  "#,
        ] {
            let r = same(&Obj::from_stored(text, 7), &through_tree(text, 7), text);
            assert!(r.is_ok(), "{}: {r:?}", String::from_utf8_lossy(text));
        }
        for text in [
            &b"not json"[..],
            br#"{"metadata":{"deletionTimestamp":"2026-01-01T00:00:00Z"}} trailing"#,
        ] {
            let a = Obj::from_stored(text, 7);
            assert_eq!(a.json(), through_tree(text, 7).json());
            assert_eq!(&*a.json(), b"null");
        }
    }

    fn json_value() -> impl Strategy<Value = Value> {
        crate::api::garbage::json_tree(name().boxed(), "[a-zA-Z0-9 \"\\\\é\u{1}/-]{0,8}".boxed())
    }

    fn name() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(vec![
                "apiVersion",
                "kind",
                "metadata",
                "labels",
                "uid",
                "resourceVersion",
                "ownerReferences",
                "deletionTimestamp",
                "status",
                "a",
                "zz",
            ])
            .prop_map(str::to_string),
            "[a-zA-Z\"é\u{1}]{0,4}",
        ]
    }

    proptest! {
        // Cheap cases, and the odd ones (a member that is `null`) are rare: many of them.
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// Whatever JSON object is stored, in whatever spacing, the fast way gives the object
        /// (and the facts read from it) that parsing, stamping and writing the tree gives.
        #[test]
        fn the_fast_way_is_the_tree_way(
            top in prop::collection::btree_map(name(), json_value(), 0..6),
            meta in prop::option::of(prop::collection::btree_map(name(), json_value(), 0..6)),
            pretty in any::<bool>(),
            rv in any::<u64>(),
        ) {
            let mut v = Value::Object(top.into_iter().collect());
            if let Some(meta) = meta {
                v["metadata"] = Value::Object(meta.into_iter().collect());
            }
            let text = if pretty {
                serde_json::to_vec_pretty(&v)
            } else {
                serde_json::to_vec(&v)
            }
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
            same(&Obj::from_stored(&text, rv), &through_tree(&text, rv), &text)?;
        }
    }
}
