//! Two API servers on one etcd (what cloudcore's replicas are): what is written through one is
//! read and watched through the other, and writes to one object from both at once are neither
//! lost nor applied on a stale object. Skipped, saying so, without Debian's `etcd-server`.

mod common;

use common::Server;
use common::cases::within;
use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use std::collections::BTreeMap;

fn etcd() -> Option<sim::etcd::EtcdCluster> {
    if !sim::etcd::available() {
        sim::skip("no etcd binary (scripts/test installs Debian's etcd-server)");
        return None;
    }
    Some(sim::etcd::EtcdCluster::start(1).expect("etcd starts"))
}

fn configmap(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("n".to_string(), "0".to_string())])),
        ..Default::default()
    }
}

/// Two servers on `etcd`, and a client of ConfigMaps in `default` through each.
async fn two_servers(
    etcd: &sim::etcd::EtcdCluster,
) -> (Server, Server, Api<ConfigMap>, Api<ConfigMap>) {
    let a = Server::start_shared(etcd);
    let b = Server::start_shared(etcd);
    let ca = Api::namespaced(a.client().await, "default");
    let cb = Api::namespaced(b.client().await, "default");
    (a, b, ca, cb)
}

#[tokio::test]
async fn two_servers_on_one_etcd_serve_the_same_objects_and_lose_no_write() {
    let Some(etcd) = etcd() else { return };
    let (_a, _b, ca, cb) = two_servers(&etcd).await;

    // A watch through B, from before the writes through A.
    let start = cb
        .list_metadata(&Default::default())
        .await
        .expect("list through b")
        .metadata
        .resource_version
        .expect("a list version");
    let mut watch = cb
        .watch(&WatchParams::default(), &start)
        .await
        .expect("watch through b")
        .boxed();

    let made = ca
        .create(&PostParams::default(), &configmap("shared"))
        .await
        .expect("create through a");
    // Read your writes on the other server too, by the version A answered.
    let seen = cb.get("shared").await.expect("b has what a wrote");
    assert_eq!(seen.metadata.uid, made.metadata.uid);
    assert_eq!(
        seen.metadata.resource_version, made.metadata.resource_version,
        "one resourceVersion on both servers (etcd's revision)"
    );
    match within("the watch through b", watch.try_next()).await {
        Ok(Some(WatchEvent::Added(cm))) => assert_eq!(cm.metadata.name.as_deref(), Some("shared")),
        other => panic!("expected ADDED shared through b, got {other:?}"),
    }

    // Merge patches through both at once, each adding its own key: the servers decide each
    // on the object as etcd holds it, so none is lost.
    let mut tasks = Vec::new();
    for (who, api) in [("a", ca.clone()), ("b", cb.clone())] {
        tasks.push(tokio::spawn(async move {
            for i in 0..40 {
                let patch = json!({"data": {format!("{who}{i}"): "x"}});
                api.patch("shared", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .expect("a merge patch");
            }
        }));
    }
    // And read-modify-write by version through both: a stale version is refused (409), the
    // writer reads again; every increment lands once.
    for api in [ca.clone(), cb.clone()] {
        tasks.push(tokio::spawn(async move {
            let mut done = 0;
            while done < 20 {
                let mut cm = api.get("shared").await.expect("get");
                let data = cm.data.get_or_insert_with(BTreeMap::new);
                let n: u64 = data.get("n").and_then(|s| s.parse().ok()).unwrap_or(0);
                data.insert("n".into(), (n + 1).to_string());
                match api.replace("shared", &PostParams::default(), &cm).await {
                    Ok(_) => done += 1,
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => panic!("replace: {e}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("a writer");
    }
    let end = ca.get("shared").await.expect("get through a");
    let data = end.data.unwrap_or_default();
    let missing: Vec<String> = ["a", "b"]
        .iter()
        .flat_map(|w| (0..40).map(move |i| format!("{w}{i}")))
        .filter(|k| !data.contains_key(k))
        .collect();
    assert!(missing.is_empty(), "merge patches lost: {missing:?}");
    assert_eq!(
        data.get("n").map(String::as_str),
        Some("40"),
        "40 increments by version through two servers"
    );
    let through_b = cb.get("shared").await.expect("get through b");
    assert_eq!(
        through_b.data.unwrap_or_default(),
        data,
        "both servers agree"
    );
}

/// Three servers started at the same time on an empty etcd: one makes the fleet's CA, the others
/// take it (the one each made is dropped); all three serve the CRDs that one of them installed.
#[test]
fn servers_started_together_on_an_empty_etcd_share_one_ca() {
    let Some(etcd) = etcd() else { return };
    let servers: Vec<Server> = std::thread::scope(|s| {
        let started: Vec<_> = (0..3)
            .map(|_| s.spawn(|| Server::start_shared(&etcd)))
            .collect();
        started
            .into_iter()
            .map(|h| h.join().expect("a server starts"))
            .collect()
    });
    let ca = |s: &Server| std::fs::read_to_string(s.data().join("pki/ca.crt")).expect("ca.crt");
    assert_eq!(ca(&servers[0]), ca(&servers[1]));
    assert_eq!(ca(&servers[0]), ca(&servers[2]));
    for s in &servers {
        let out = s.ok(&["get", "devicemodels", "-A"]);
        assert!(!out.contains("error"), "{out}");
        // The admin token of one is the admin token of all.
        assert_eq!(
            std::fs::read_to_string(s.data().join("tokens.csv")).expect("tokens"),
            std::fs::read_to_string(servers[0].data().join("tokens.csv")).expect("tokens")
        );
    }
}

/// The fleet's CA key is shared through etcd, yet no request reaches it: not a node's, not
/// even the admin's. Every resource the API lists is read whole through both servers, and the
/// key is in none of it (defence in depth: a hole in the authorizer exposes no CA key).
#[test]
fn no_request_of_any_user_reads_the_fleets_ca_key() {
    let Some(etcd) = etcd() else { return };
    let a = Server::start_shared(&etcd);
    let b = Server::start_shared(&etcd);
    let key = std::fs::read_to_string(a.data().join("pki/ca.key")).expect("ca.key");
    assert_eq!(
        key,
        std::fs::read_to_string(b.data().join("pki/ca.key")).expect("b's ca.key"),
        "the replicas share one CA"
    );
    let body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
    let b64 = |t: &str| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(t)
    };
    let resources = a.ok(&["api-resources", "--verbs=list", "-o", "name"]);
    assert!(resources.contains("secrets"), "{resources}");
    for s in [&a, &b] {
        for r in resources.lines().filter(|r| !r.trim().is_empty()) {
            let out = s.ok(&["get", r.trim(), "-A", "-o", "json"]);
            for needle in [&body[..40], &b64(&key)[..40]] {
                assert!(!out.contains(needle), "the CA key is readable in {r}");
            }
        }
        let (ok, out) = {
            let o = s.kubectl(&["get", "secret", "-n", "kube-system", "cloudcore-pki"]);
            (o.status.success(), common::text(&o))
        };
        assert!(!ok && out.contains("NotFound"), "{out}");
    }
}

/// A write acknowledged by one server is seen by a read through the other right after, as a
/// kube-apiserver's consistent reads give it: a get or list without `resourceVersion` waits
/// for the server's view to hold what etcd had committed (each round writes through one and
/// reads through the other at once, so a view a few milliseconds behind would be caught).
#[tokio::test]
async fn a_write_through_one_server_is_read_through_the_other_at_once() {
    let Some(etcd) = etcd() else { return };
    let (_a, _b, ca, cb) = two_servers(&etcd).await;
    ca.create(&PostParams::default(), &configmap("fresh"))
        .await
        .expect("create through a");
    for i in 1..=100 {
        let (write, read) = if i % 2 == 0 { (&ca, &cb) } else { (&cb, &ca) };
        let patch = json!({"data": {"n": i.to_string()}});
        let written = write
            .patch("fresh", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("a merge patch");
        let got = read.get("fresh").await.expect("a get");
        assert_eq!(
            got.data
                .as_ref()
                .and_then(|d| d.get("n"))
                .map(String::as_str),
            Some(i.to_string().as_str()),
            "round {i}: the other server answered an older version ({:?}, written {:?})",
            got.metadata.resource_version,
            written.metadata.resource_version
        );
        let listed = read.list(&Default::default()).await.expect("a list");
        let rv = |c: &ConfigMap| c.metadata.resource_version.clone();
        assert!(
            listed
                .items
                .iter()
                .any(|c| c.metadata.name.as_deref() == Some("fresh") && rv(c) == rv(&written)),
            "round {i}: the list through the other server lacks the write"
        );
    }
}

/// A write is answered once etcd committed it, before the server's view may hold it; what a
/// server reads from its view to decide a later request must still see it. A namespace
/// created through one server takes content at once through the same server (the request
/// waits for the server's own writes of namespaces) and through the other (a namespace it
/// does not hold is looked for again once its view holds what etcd has); a role granted
/// through a server is used at once through it. Each server's view
/// is made to lag etcd, so that neither holds the namespace when the ConfigMap comes.
#[tokio::test]
async fn a_namespace_and_a_role_are_used_at_once_after_their_writes() {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{ApiResource, DynamicObject};
    let Some(etcd) = etcd() else { return };
    // Each server's view 300 ms behind etcd, as under a fleet's load.
    let a = Server::start_shared_lagging(&etcd, 300);
    let b = Server::start_shared_lagging(&etcd, 300);
    let (client_a, client_b) = (a.client().await, b.client().await);
    let namespaces: Api<Namespace> = Api::all(client_a.clone());
    for i in 0..20 {
        let ns = format!("plant-{i}");
        let namespace = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(ns.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .expect("a namespace through a");
        let (through, client) = if i % 2 == 0 {
            ("a", &client_a)
        } else {
            ("b", &client_b)
        };
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        if let Err(e) = cms
            .create(&PostParams::default(), &configmap("first"))
            .await
        {
            panic!("round {i}: a ConfigMap in the namespace just created, through {through}: {e}");
        }
    }
    // A role granted through a server is used at once through it: the request waits for the
    // server's own writes of roles and bindings before it is decided.
    let carol = a.client_as(Some("carol")).await;
    for i in 0..10 {
        // Each round grants her the ConfigMaps of one more namespace.
        let (name, ns) = ("carol".to_string(), format!("plant-{i}"));
        let role: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": name, "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}]}))
        .expect("a Role");
        let binding: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "carol"}]}))
        .expect("a RoleBinding");
        for (kind, o) in [("Role", role), ("RoleBinding", binding)] {
            let ar = ApiResource {
                group: "rbac.authorization.k8s.io".into(),
                version: "v1".into(),
                api_version: "rbac.authorization.k8s.io/v1".into(),
                kind: kind.into(),
                plural: format!("{}s", kind.to_lowercase()),
            };
            Api::<DynamicObject>::namespaced_with(client_a.clone(), &ns, &ar)
                .create(&PostParams::default(), &o)
                .await
                .expect("a grant through a");
        }
        let theirs: Api<ConfigMap> = Api::namespaced(carol.clone(), &ns);
        if let Err(e) = theirs
            .create(&PostParams::default(), &configmap("carols"))
            .await
        {
            panic!("round {i}: carol's ConfigMap just granted, through a: {e}");
        }
    }
}

/// etcd with TLS and client certificates (`--client-cert-auth`): the server reaches it with
/// its client certificate; without one, etcd refuses it and the server says so and stops.
#[test]
fn the_store_reaches_etcd_over_tls_with_a_client_certificate() {
    if !sim::etcd::available() {
        sim::skip("no etcd binary (scripts/test installs Debian's etcd-server)");
        return;
    }
    let certs = tempfile::tempdir().expect("dir");
    let dir = certs.path();
    let (ca, ca_key) = pki::load_or_make_ca(dir).expect("a CA");
    let (cert, key) = pki::sign_leaf(&ca, &ca_key, "etcd", None, &["127.0.0.1".into()], true, 1)
        .expect("etcd's certificate");
    let (client, client_key) =
        pki::sign_leaf(&ca, &ca_key, "apiserver", None, &[], false, 1).expect("a client's");
    for (f, text) in [
        ("etcd.crt", &cert),
        ("etcd.key", &key),
        ("client.crt", &client),
        ("client.key", &client_key),
    ] {
        pki::write_private(&dir.join(f), text).expect("written");
    }
    let etcd = sim::etcd::EtcdCluster::start_with(
        1,
        Some(sim::etcd::Tls {
            cert: dir.join("etcd.crt"),
            key: dir.join("etcd.key"),
            client_ca: dir.join("ca.crt"),
        }),
    )
    .expect("etcd with TLS");
    let path = |f: &str| dir.join(f).display().to_string();
    let (ca_file, cert_file, key_file) = (path("ca.crt"), path("client.crt"), path("client.key"));
    let s = Server::start_shared_with(
        &etcd,
        &[
            "--etcd-ca",
            &ca_file,
            "--etcd-cert",
            &cert_file,
            "--etcd-key",
            &key_file,
        ],
    );
    s.ok(&["create", "configmap", "over-tls"]);
    assert!(
        s.ok(&["get", "configmap", "over-tls", "-o", "name"])
            .contains("over-tls")
    );

    // No client certificate: refused by etcd, and the server names etcd in its error.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_apiserver"))
        .arg("--data-dir")
        .arg(dir.join("no-cert"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--etcd",
            &etcd.endpoints()[0],
            "--etcd-ca",
            &ca_file,
        ])
        .output()
        .expect("apiserver runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot read the objects from etcd"), "{err}");
}

/// An object larger than etcd takes (its default 1.5 MiB request limit) is refused with 413 and
/// a reason naming etcd; the server goes on.
#[test]
fn an_object_larger_than_etcd_takes_is_refused_by_name() {
    let Some(etcd) = etcd() else { return };
    let s = Server::start_shared(&etcd);
    let big = s.dir.join("big.txt");
    std::fs::write(&big, "x".repeat(2 * 1024 * 1024)).expect("written");
    let out = s.fails(&[
        "create",
        "configmap",
        "big",
        &format!("--from-file=big={}", big.display()),
    ]);
    assert!(out.contains("larger than etcd accepts"), "{out}");
    s.ok(&["create", "configmap", "small", "--from-literal=a=b"]);
}

/// Two of three etcd members gone (the leader among them): the one left has no leader. A write
/// through it is refused saying so (the require-leader metadata every request carries makes
/// etcd answer at once, "no leader", where it held the request until its own timeout); once a
/// member is back and a leader elected, writes go on.
#[test]
fn a_write_while_etcd_has_no_leader_says_so_and_goes_on_after_the_election() {
    if !sim::etcd::available() {
        sim::skip("no etcd binary (scripts/test installs Debian's etcd-server)");
        return;
    }
    let mut etcd = sim::etcd::EtcdCluster::start(3).expect("etcd starts");
    let s = Server::start_shared(&etcd);
    s.ok(&["create", "configmap", "before", "--from-literal=a=b"]);
    let leader = etcd.leader().expect("a leader");
    let other = (leader + 1) % 3;
    etcd.kill(leader);
    etcd.kill(other);
    let out = s.fails(&["create", "configmap", "during", "--from-literal=a=b"]);
    assert!(out.contains("no leader"), "{out}");
    etcd.restart(other).expect("a member back");
    sim::poll::eventually(60, "a write after the election", || {
        s.kubectl(&["create", "configmap", "after", "--from-literal=a=b"])
            .status
            .success()
            .then_some(())
    });
}

/// DeviceStatus writes that come at once are committed in one etcd transaction (every
/// device's reports change one; a fleet writes thousands a second), so several objects share
/// a resourceVersion: a watch still sends every change, and a watch resumed from a shared
/// version sends every object of it again (the client's stream may have broken between them).
#[tokio::test]
async fn device_statuses_written_together_share_a_revision_and_no_watch_misses_one() {
    use kube::api::{ApiResource, DynamicObject};
    use std::collections::{BTreeMap, BTreeSet};
    let Some(etcd) = etcd() else { return };
    let a = Server::start_shared(&etcd);
    let ar = ApiResource {
        group: "devices.kubeedge.io".into(),
        version: "v1beta1".into(),
        api_version: "devices.kubeedge.io/v1beta1".into(),
        kind: "DeviceStatus".into(),
        plural: "devicestatuses".into(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(a.client().await, "default", &ar);
    const N: usize = 200;
    let name = |i: usize| format!("meter-{i:03}");
    for i in 0..N {
        let o: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceStatus",
            "metadata": {"name": name(i)}, "spec": {}}))
        .expect("a DeviceStatus");
        api.create(&PostParams::default(), &o)
            .await
            .expect("create");
    }
    let start = api
        .list_metadata(&Default::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("a list version");
    let mut live = api
        .watch(&WatchParams::default(), &start)
        .await
        .expect("watch")
        .boxed();
    // Every status patched, many at once, each with its own value.
    let patches = (0..N).map(|i| {
        let api = api.clone();
        async move {
            let body = json!({"status": {"twins": [{"propertyName": "p",
                "reported": {"value": i.to_string(), "metadata": {"timestamp": "1", "type": "int"}}}]}});
            let o = api
                .patch(&name(i), &PatchParams::default(), &Patch::Merge(&body))
                .await
                .expect("patch");
            (name(i), o.metadata.resource_version.expect("a version"))
        }
    });
    // 32 at a time (as many connections as a client pool opens; the server bounds the TLS
    // handshakes of one address).
    let written: BTreeMap<String, String> = futures_util::stream::iter(patches)
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect();
    let mut by_rv: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (n, rv) in &written {
        by_rv.entry(rv.as_str()).or_default().insert(n.as_str());
    }
    assert!(
        by_rv.len() < N,
        "{N} patches at once were committed at {} revisions: none together",
        by_rv.len()
    );
    // The live watch sends each patch, those that share a revision too.
    let value = |o: &DynamicObject| o.data["status"]["twins"][0]["reported"]["value"].clone();
    let mut seen = BTreeSet::new();
    while seen.len() < N {
        match within("the live watch", live.try_next()).await {
            Ok(Some(WatchEvent::Modified(o))) => {
                let n = o.metadata.name.clone().unwrap_or_default();
                let i: usize = n.trim_start_matches("meter-").parse().expect("a meter");
                assert_eq!(value(&o), json!(i.to_string()), "{n}");
                assert_eq!(o.metadata.resource_version.as_ref(), written.get(&n), "{n}");
                seen.insert(n);
            }
            Ok(Some(WatchEvent::Bookmark(_))) => {}
            other => panic!("expected MODIFIED (from {start}), got {other:?}"),
        }
    }
    // Resumed from a revision several objects share: every one of them comes again.
    let (rv, names) = by_rv
        .iter()
        .max_by_key(|(_, n)| n.len())
        .expect("a revision");
    let mut resumed = api
        .watch(&WatchParams::default(), rv)
        .await
        .expect("watch from a shared revision")
        .boxed();
    let mut again = BTreeSet::new();
    while !names.iter().all(|n| again.contains(*n)) {
        match within("the resumed watch", resumed.try_next()).await {
            Ok(Some(WatchEvent::Modified(o))) => {
                let n = o.metadata.name.clone().unwrap_or_default();
                again.insert(n);
            }
            Ok(Some(WatchEvent::Bookmark(_))) => {}
            other => panic!("expected MODIFIED, got {other:?}"),
        }
    }
}
