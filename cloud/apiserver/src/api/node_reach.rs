//! What a node reaches through lists and watches is what it may read one object at a time.
//!
//! A node's certificate may list pods, Nodes, Secrets and ConfigMaps only with a field selector
//! that keeps the answer to its own (`spec.nodeName=NODE`, `metadata.name=NAME`). The selectors
//! here are generated from a grammar that holds what attackers send (commas, parentheses, `!=`,
//! `==`, escapes, spaces, unicode, the same field twice, set syntax); whatever each list or watch
//! of the node answers must be objects the node may `get` by name. An authorizer that read the
//! selector's text again, instead of the parsed selector the list filters with, fails this.

use super::garbage::{Fixture, call_as, in_process};
use crate::User;
use crate::api::{Api, Query};
use axum::http::Method;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use proptest::prelude::*;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// The collections a node might list, and the item path of each.
const COLLECTIONS: &[&str] = &[
    "/api/v1/nodes",
    "/api/v1/pods",
    "/api/v1/namespaces/default/pods",
    "/api/v1/namespaces/kube-system/pods",
    "/api/v1/secrets",
    "/api/v1/namespaces/default/secrets",
    "/api/v1/namespaces/kube-system/secrets",
    "/api/v1/namespaces/default/configmaps",
    "/api/v1/namespaces/kube-system/configmaps",
];

fn node(name: &str) -> User {
    User::new(format!("system:node:{name}"), vec!["system:nodes".into()])
}

fn pod(ns: &str, name: &str, node: &str, secret: &str, config: &str) -> (String, Value) {
    (
        format!("/api/v1/namespaces/{ns}/pods"),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}],
                "volumes": [{"name": "s", "secret": {"secretName": secret}},
                    {"name": "c", "configMap": {"name": config}}]}}),
    )
}

fn object(ns: &str, plural: &str, kind: &str, name: &str) -> (String, Value) {
    (
        format!("/api/v1/namespaces/{ns}/{plural}"),
        json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": name}, "data": {}}),
    )
}

/// Two nodes, each with a pod in `default` and one in `kube-system` naming a Secret and a
/// ConfigMap of its own; Secrets and ConfigMaps no pod names, the fleet's CA key among them.
fn fixture() -> Fixture {
    let f = in_process();
    f.rt.block_on(async {
        let api = &f.api;
        let mut objects = Vec::new();
        for ns in ["default", "kube-system"] {
            objects.push((
                "/api/v1/namespaces".to_string(),
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            ));
        }
        for n in ["n1", "n2"] {
            objects.push((
                "/api/v1/nodes".to_string(),
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}}),
            ));
        }
        objects.extend([
            pod("default", "p1", "n1", "s1", "c1"),
            pod("default", "p2", "n2", "s2", "c2"),
            pod("kube-system", "m1", "n1", "m1-token", "m1-config"),
            pod("kube-system", "m2", "n2", "m2-token", "m2-config"),
        ]);
        for (ns, names) in [
            ("default", ["s1", "s2", "s3"]),
            ("kube-system", ["m1-token", "m2-token", "cloudcore-pki"]),
        ] {
            for n in names {
                objects.push(object(ns, "secrets", "Secret", n));
            }
        }
        for (ns, names) in [
            ("default", ["c1", "c2", "c3"]),
            ("kube-system", ["m1-config", "m2-config", "other"]),
        ] {
            for n in names {
                objects.push(object(ns, "configmaps", "ConfigMap", n));
            }
        }
        for (path, body) in objects {
            let r = call_as(
                api,
                &User::server(),
                Method::POST,
                &path,
                Query::new(),
                "application/json",
                body.to_string().into_bytes(),
            )
            .await;
            assert_eq!(r.status().as_u16(), 201, "{path} {body}");
        }
    });
    f
}

/// The path one object of a list is read at.
fn item_path(collection: &str, obj: &Value) -> String {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let plural = collection.rsplit('/').next().unwrap_or_default();
    match obj["metadata"]["namespace"].as_str() {
        Some(ns) => format!("/api/v1/namespaces/{ns}/{plural}/{name}"),
        None => format!("/api/v1/{plural}/{name}"),
    }
}

/// The objects a list or watch by `user` with `selector` answers (`None`: refused), with the
/// status of a refusal checked: 403 or 400, never a server error.
async fn reached(
    api: &Arc<Api>,
    user: &User,
    collection: &str,
    selector: &str,
    watch: bool,
) -> Result<Option<Vec<Value>>, String> {
    let mut q = Query::new();
    q.insert("fieldSelector".into(), selector.into());
    if watch {
        for (k, v) in [
            ("watch", "true"),
            ("sendInitialEvents", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersionMatch", "NotOlderThan"),
        ] {
            q.insert(k.into(), v.into());
        }
    }
    let r = call_as(api, user, Method::GET, collection, q, "", Vec::new()).await;
    let code = r.status().as_u16();
    if code != 200 {
        return match code {
            400 | 403 => Ok(None),
            _ => Err(format!("{collection}?fieldSelector={selector:?}: {code}")),
        };
    }
    if !watch {
        let bytes = r.into_body().collect().await.map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_slice(&bytes.to_bytes()).map_err(|e| e.to_string())?;
        return Ok(Some(v["items"].as_array().cloned().unwrap_or_default()));
    }
    // The initial events, up to the bookmark that ends them.
    let mut body = r.into_body().into_data_stream();
    let mut text = String::new();
    let mut objects = Vec::new();
    let read = async {
        while let Some(chunk) = body.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk.map_err(|e| e.to_string())?));
            while let Some(at) = text.find('\n') {
                let line: String = text.drain(..=at).collect();
                let event: Value = serde_json::from_str(&line).map_err(|e| e.to_string())?;
                match event["type"].as_str() {
                    Some("BOOKMARK") => return Ok(()),
                    Some("ADDED") => objects.push(event["object"].clone()),
                    other => return Err(format!("unexpected event {other:?}: {line}")),
                }
            }
        }
        Err("the watch ended before its initial events did".to_string())
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .map_err(|_| format!("no bookmark from the watch of {collection} by {selector:?}"))??;
    Ok(Some(objects))
}

/// Every object `n1` reached with `selector` through a list or a watch that it may not `get`.
async fn overreach(api: &Arc<Api>, selector: &str) -> Result<BTreeSet<String>, String> {
    let n1 = node("n1");
    let mut beyond = BTreeSet::new();
    for collection in COLLECTIONS {
        for watch in [false, true] {
            let Some(objects) = reached(api, &n1, collection, selector, watch).await? else {
                continue;
            };
            for o in objects {
                let path = item_path(collection, &o);
                let r = call_as(api, &n1, Method::GET, &path, Query::new(), "", Vec::new()).await;
                if r.status().as_u16() != 200 {
                    beyond.insert(path);
                }
            }
        }
    }
    Ok(beyond)
}

/// The names a list by `user` answers.
async fn names(api: &Arc<Api>, user: &User, collection: &str, selector: &str) -> Vec<String> {
    let objects = reached(api, user, collection, selector, false).await;
    (objects.ok().flatten().into_iter().flatten())
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

/// The selectors a node is meant to use reach what is its own, and nothing else.
#[test]
fn a_node_lists_its_own_objects_by_selector() {
    let f = fixture();
    f.rt.block_on(async {
        let n1 = node("n1");
        let list = |c: &'static str, s: &'static str| names(&f.api, &n1, c, s);
        assert_eq!(list("/api/v1/pods", "spec.nodeName=n1").await, ["p1", "m1"]);
        assert_eq!(list("/api/v1/nodes", "metadata.name=n1").await, ["n1"]);
        let secrets = "/api/v1/namespaces/kube-system/secrets";
        assert_eq!(list(secrets, "metadata.name=m1-token").await, ["m1-token"]);
        let none: [&str; 0] = [];
        assert_eq!(list(secrets, "metadata.name=cloudcore-pki").await, none);
        assert_eq!(list("/api/v1/pods", "spec.nodeName=n2").await, none);
    });
}

/// The selectors the holes of 2026-11-27 were found with: the authorizer read the first
/// `spec.nodeName=` in the text split on every comma, the list the same text split on the
/// commas outside parentheses.
#[test]
fn crafted_selectors_reach_nothing_more() {
    let f = fixture();
    for s in [
        "spec.nodeName!=(,spec.nodeName=n1,)",
        "metadata.name!=(,metadata.name=m1-token,)",
        "metadata.name!=(,metadata.name=n1,)",
        "spec.nodeName=n1,spec.nodeName!=n1",
        "spec.nodeName=n2,spec.nodeName=n1",
        "spec.nodeName=n1\\,",
        "spec.nodeName==n1,metadata.name in (p2,m2)",
        "metadata.name=m1-token,metadata.name=cloudcore-pki",
    ] {
        let beyond = f.rt.block_on(overreach(&f.api, s));
        assert_eq!(beyond, Ok(BTreeSet::new()), "{s}");
    }
}

fn path() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "spec.nodeName",
        "spec.nodeName",
        "metadata.name",
        "metadata.name",
        "metadata.namespace",
        "status.phase",
        " spec.nodeName",
        "spec.nodeName ",
        "spec",
        "",
    ])
}

fn op() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "=", "=", "==", "!=", "!=", "!", " in ", " notin ", "", "= ", "=\\",
    ])
}

fn atom() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "n1", "n2", "p1", "p2", "m1-token", "cloudcore-pki", "s1", "s2", "s3", "c1", "c3", "",
            "(", ")", "(n1", "n1)", "(n1,n2)", "(p2, m2)", "n1\\,", "\\,n1", "\\\\", "\\", "=",
            "n1=", "ñ1", "n1 ", " n1",
        ])
        .prop_map(String::from),
        1 => "[a-z0-9(),=!\\\\ ñ]{0,8}",
    ]
}

/// A term as a node would write it, or as an attacker would: a value may open a parenthesis
/// that a later term closes, with whole terms inside, as set syntax does.
fn term() -> impl Strategy<Value = String> {
    let simple = || (path(), op(), atom()).prop_map(|(p, o, v)| format!("{p}{o}{v}"));
    let inner = || prop::collection::vec(simple(), 0..3).prop_map(|t| t.join(","));
    let value = prop_oneof![
        4 => atom(),
        1 => inner().prop_map(|i| format!("({i})")),
        1 => inner().prop_map(|i| format!("({i}")),
        1 => inner().prop_map(|i| format!("{i})")),
    ];
    prop_oneof![
        6 => (path(), op(), value).prop_map(|(p, o, v)| format!("{p}{o}{v}")),
        1 => "[ -~ñ]{0,12}",
        1 => prop::sample::select(vec!["(", ")", "!", ",", "\\"]).prop_map(String::from),
    ]
}

fn selector() -> impl Strategy<Value = String> {
    let sep = prop::sample::select(vec![",", ",", ",", ",,", " ,", ", ", "\\,"]);
    prop::collection::vec((term(), sep), 0..5).prop_map(|terms| {
        let mut s = String::new();
        for (i, (t, sep)) in terms.iter().enumerate() {
            if i > 0 {
                s.push_str(sep);
            }
            s.push_str(t);
        }
        s
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn what_a_node_lists_or_watches_it_may_get_one_by_one(s in selector()) {
        thread_local!(static FIX: Fixture = fixture());
        FIX.with(|f| {
            let beyond = f.rt.block_on(overreach(&f.api, &s)).map_err(TestCaseError::fail)?;
            prop_assert!(beyond.is_empty(), "fieldSelector {s:?} reached {beyond:?}");
            Ok(())
        })?;
    }
}
