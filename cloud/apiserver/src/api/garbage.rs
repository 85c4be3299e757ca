//! Garbage in: random and mangled requests (bodies, paths, content types, methods) never panic
//! the server, never answer 5xx, always answer a Kubernetes `Status` when they fail, and leave
//! alone what no request named (a ConfigMap in a namespace of its own).

use crate::api::{Api, Query};
use crate::store::{Store, StoreOptions};
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, header};
use http_body_util::BodyExt;
use proptest::prelude::*;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const PATHS: &[&str] = &[
    "/api/v1/namespaces/default/configmaps",
    "/api/v1/namespaces/default/configmaps/x",
    "/api/v1/namespaces",
    "/api/v1/namespaces/default",
    "/api/v1/namespaces/default/status",
    "/apis/devices.kubeedge.io/v1beta1/namespaces/default/devices",
    "/apis/devices.kubeedge.io/v1beta1/namespaces/default/devices/d",
    "/apis/devices.kubeedge.io/v1beta1/namespaces/default/devices/d/status",
    "/apis/devices.kubeedge.io/v1beta1/devices",
    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/things.example.com",
    "/apis/reliablesyncs.kubeedge.io/v1alpha1/namespaces/default/objectsyncs/o/status",
    "/apis/nope/v1/things",
    "/api/v1/namespaces/default/configmaps/x/y/z/w",
    "/apis",
    "/api",
];

const TYPES: &[&str] = &[
    "application/json",
    "application/yaml",
    "application/merge-patch+json",
    "application/json-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
    "application/vnd.kubernetes.protobuf",
    "text/plain",
    "",
];

fn valid_bodies() -> Vec<String> {
    vec![
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "b"}}).to_string(),
        json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device", "metadata": {"name": "d"},
            "spec": {"nodeName": "n", "properties": [{"name": "p", "visitors": {"protocolName": "modbus"}}]}}).to_string(),
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "things.example.com"}, "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "things", "kind": "Thing"}, "versions": [{"name": "v1", "served": true, "storage": true,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object"}}}}}]}}).to_string(),
        json!([{"op": "replace", "path": "/spec/nodeName", "value": "m"}]).to_string(),
        json!({"metadata": {"labels": {"a": "b"}}}).to_string(),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_tree(
        prop_oneof![
            Just("apiVersion".to_string()),
            Just("kind".to_string()),
            Just("metadata".to_string()),
            Just("spec".to_string()),
            Just("name".to_string()),
            Just("properties".to_string()),
            "[a-z]{1,6}",
        ]
        .boxed(),
        "[a-zA-Z0-9_./-]{0,12}".boxed(),
    )
}

/// JSON trees for the crate's property tests: leaves of every kind (floats that serde_json
/// reads back as written, so that a value read twice is the same), arrays, and objects whose
/// member names `names` gives; strings from `strings`.
pub(crate) fn json_tree(
    names: BoxedStrategy<String>,
    strings: BoxedStrategy<String>,
) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| json!(i)),
        any::<f64>()
            .prop_filter("finite, read back as written", |f| {
                f.is_finite() && serde_json::from_str::<f64>(&json!(f).to_string()).ok() == Some(*f)
            })
            .prop_map(|f| json!(f)),
        strings.prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(names.clone(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    let valid = valid_bodies();
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200),
        json_value().prop_map(|v| v.to_string().into_bytes()),
        (0..valid.len(), any::<prop::sample::Index>()).prop_map(move |(i, cut)| {
            let b = valid[i].as_bytes();
            b[..cut.index(b.len() + 1)].to_vec()
        }),
        (
            0..valid_bodies().len(),
            any::<prop::sample::Index>(),
            any::<u8>()
        )
            .prop_map(|(i, at, byte)| {
                let mut b = valid_bodies()[i].clone().into_bytes();
                let n = b.len();
                b[at.index(n)] = byte;
                b
            }),
        (0..valid_bodies().len()).prop_map(|i| valid_bodies()[i].clone().into_bytes()),
    ]
}

pub(super) struct Fixture {
    pub(super) rt: tokio::runtime::Runtime,
    pub(super) api: Arc<Api>,
    _dir: tempfile::TempDir,
}

/// An API on a SQLite store of its own, in process, and a runtime to drive it.
pub(super) fn in_process() -> Fixture {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("dir");
    let options = StoreOptions {
        history: 1000,
        fsync: false,
        etcd: None,
    };
    let api = rt.block_on(async {
        let store = Store::open(&dir.path().join("api.db"), options)
            .await
            .expect("store");
        Arc::new(Api::new(
            store,
            64 * 1024,
            "127.0.0.1:1".into(),
            Duration::from_secs(60),
            CancellationToken::new(),
        ))
    });
    Fixture { rt, api, _dir: dir }
}

fn fixture() -> Fixture {
    let f = in_process();
    f.rt.block_on(async {
        let api = &f.api;
        for (path, body) in [
            ("/api/v1/namespaces", json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})),
            ("/api/v1/namespaces", json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kept"}})),
            ("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", serde_json::from_str(&crd()).expect("crd")),
            ("/api/v1/namespaces/kept/configmaps", json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keep"}, "data": {"k": "v"}})),
        ] {
            let (code, _) = call(api, Method::POST, path, "application/json", body.to_string().into_bytes()).await;
            assert_eq!(code, 201, "{path}");
        }
    });
    f
}

fn crd() -> String {
    let crds = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../devicecontroller/crds/devices_v1beta1_device.yaml"
    ))
    .expect("device CRD");
    let v: Value = serde_yaml_ng::from_str(&crds).expect("yaml");
    v.to_string()
}

async fn call(
    api: &Arc<Api>,
    method: Method,
    path: &str,
    ct: &str,
    body: Vec<u8>,
) -> (u16, Vec<u8>) {
    let mut q = Query::new();
    q.insert("fieldManager".into(), "fuzz".into());
    let r = call_as(api, &crate::User::server(), method, path, q, ct, body).await;
    let code = r.status().as_u16();
    let bytes = r
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    (code, bytes)
}

/// One request to `api` as `user`, in process.
pub(super) async fn call_as(
    api: &Arc<Api>,
    user: &crate::User,
    method: Method,
    path: &str,
    query: Query,
    ct: &str,
    body: Vec<u8>,
) -> axum::response::Response {
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(ct) {
        headers.insert(header::CONTENT_TYPE, v);
    }
    (api.clone())
        .dispatch(user, method, path, query, headers, Body::from(body).into())
        .await
}

fn keep(api: &Arc<Api>, rt: &tokio::runtime::Runtime) -> Vec<u8> {
    rt.block_on(call(
        api,
        Method::GET,
        "/api/v1/namespaces/kept/configmaps/keep",
        "",
        Vec::new(),
    ))
    .1
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn garbage_never_breaks_the_server(
        method in prop::sample::select(vec![Method::POST, Method::PUT, Method::PATCH, Method::DELETE, Method::GET]),
        path in prop_oneof![9 => prop::sample::select(PATHS.to_vec()).prop_map(String::from), 1 => "/[a-z/]{0,40}"],
        ct in prop::sample::select(TYPES.to_vec()),
        body in body(),
    ) {
        thread_local!(static FIX: Fixture = fixture());
        FIX.with(|f| {
            let before = keep(&f.api, &f.rt);
            let (code, bytes) = f.rt.block_on(call(&f.api, method.clone(), &path, ct, body.clone()));
            prop_assert!(code < 500, "{method} {path} ({ct}) {:?} -> {code}: {}", String::from_utf8_lossy(&body), String::from_utf8_lossy(&bytes));
            let v: Value = serde_json::from_slice(&bytes).map_err(|e| TestCaseError::fail(format!("not JSON: {e}: {}", String::from_utf8_lossy(&bytes))))?;
            if code >= 400 {
                prop_assert_eq!(&v["kind"], "Status");
                prop_assert_eq!(v["code"].as_u64(), Some(u64::from(code)));
                prop_assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
            }
            prop_assert_eq!(keep(&f.api, &f.rt), before, "an object no request named was changed");
            Ok(())
        })?;
    }
}
