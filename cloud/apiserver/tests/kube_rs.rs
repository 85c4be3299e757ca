//! kube-rs (`Api`, `watcher`, `reflector`) against the embedded API (cloudcore's): what every cloud
//! controller of the project uses, so the same code runs on a real cluster.

mod common;

use api::v1beta1::Device;
use common::cases::within;
use common::{Served, Server};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

fn device(name: &str, node: &str) -> Device {
    let mut d = common::cases::device(name, node);
    d.metadata.labels = Some(BTreeMap::from([("site".to_string(), "hall".to_string())]));
    d
}

fn configmap(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("k".to_string(), name.to_string())])),
        ..Default::default()
    }
}

async fn wait_for(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>, want: String) {
    within(&format!("watcher event {want}"), async {
        loop {
            match rx.recv().await {
                Some(l) if l == want => return,
                Some(_) => {}
                None => panic!("watcher ended"),
            }
        }
    })
    .await
}

/// The cases kmock passes too (`cloud/tests/kmock.rs`).
#[tokio::test]
async fn the_cases_every_api_passes() {
    let c = Server::start();
    common::cases::crud(c.client().await).await;
}

#[tokio::test]
async fn api_crud_conflicts_paging_selectors_and_status() {
    let c = Server::start();
    let client = c.client().await;
    let devices: Api<Device> = Api::namespaced(client.clone(), "default");
    let created = devices
        .create(&PostParams::default(), &device("d1", "n1"))
        .await
        .expect("create");
    let rv1 = created.metadata.resource_version.clone().expect("rv");
    assert_eq!(created.metadata.generation, Some(1));
    let mut changed = created.clone();
    changed.spec.node_name = Some("n2".into());
    let updated = devices
        .replace("d1", &PostParams::default(), &changed)
        .await
        .expect("replace");
    assert_eq!(updated.metadata.generation, Some(2));
    // The same stale version again: 409 Conflict.
    let e = devices
        .replace("d1", &PostParams::default(), &changed)
        .await
        .expect_err("stale");
    assert!(
        matches!(&e, kube::Error::Api(s) if s.code == 409 && s.reason == "Conflict"),
        "{e:?}"
    );
    let again = devices
        .create(&PostParams::default(), &device("d1", "n1"))
        .await
        .expect_err("exists");
    assert!(
        matches!(&again, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{again:?}"
    );
    assert_ne!(
        rv1,
        updated
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default()
    );
    for i in 2..=5 {
        devices
            .create(&PostParams::default(), &device(&format!("d{i}"), "n1"))
            .await
            .expect("create");
    }
    // Paging: 2 at a time, every device once.
    let mut seen = Vec::new();
    let mut lp = ListParams::default().limit(2);
    loop {
        let page = devices.list(&lp).await.expect("list page");
        assert!(page.items.len() <= 2);
        seen.extend(page.items.iter().filter_map(|d| d.metadata.name.clone()));
        match page.metadata.continue_ {
            Some(t) if !t.is_empty() => lp = lp.continue_token(&t),
            _ => break,
        }
    }
    assert_eq!(seen, ["d1", "d2", "d3", "d4", "d5"]);
    // Every device of every namespace, unfiltered: the count of those left comes with each
    // page (the store's size less what the pages gave); with a selector it would cost a walk
    // of the rest, and is left out, as kube-apiserver does.
    let all: Api<Device> = Api::all(client.clone());
    let first = all
        .list(&ListParams::default().limit(2))
        .await
        .expect("page 1");
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let token = first.metadata.continue_.clone().expect("a next page");
    let second = all
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .expect("page 2");
    assert_eq!(second.metadata.remaining_item_count, Some(1));
    let selected = all
        .list(&ListParams::default().limit(2).labels("site=hall"))
        .await
        .expect("selected");
    assert_eq!(selected.items.len(), 2);
    assert!(selected.metadata.continue_.is_some());
    assert_eq!(selected.metadata.remaining_item_count, None);
    let by_field = devices
        .list(&ListParams::default().fields("metadata.name=d3"))
        .await
        .expect("field selector");
    assert_eq!(by_field.items.len(), 1);
    devices
        .patch(
            "d4",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"site": "yard"}}})),
        )
        .await
        .expect("merge patch");
    let yard = devices
        .list(&ListParams::default().labels("site=yard"))
        .await
        .expect("label selector");
    assert_eq!(yard.items.len(), 1);
    // Server-side apply through kube-rs.
    let applied = devices
        .patch(
            "d9",
            &PatchParams::apply("test-controller"),
            &Patch::Apply(
                json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
                "metadata": {"name": "d9"}, "spec": {"nodeName": "n9"}}),
            ),
        )
        .await
        .expect("apply creates");
    assert_eq!(applied.spec.node_name.as_deref(), Some("n9"));
    // The status subresource of a CRD that declares one (ObjectSync).
    let gvk = GroupVersionKind::gvk("reliablesyncs.kubeedge.io", "v1alpha1", "ObjectSync");
    let ar = ApiResource::from_gvk(&gvk);
    let syncs: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let mut os = DynamicObject::new("node-1.uid-1", &ar);
    os.data = json!({"spec": {"objectKind": "Device", "objectName": "d1"}, "status": {"objectResourceVersion": "dropped on create"}});
    let os = syncs
        .create(&PostParams::default(), &os)
        .await
        .expect("objectsync");
    assert!(
        os.data.get("status").is_none(),
        "status is not set by a create: {:?}",
        os.data
    );
    let st = syncs
        .patch_status(
            "node-1.uid-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"objectResourceVersion": "42"}})),
        )
        .await
        .expect("status patch");
    assert_eq!(st.data["status"]["objectResourceVersion"], "42");
    let main = syncs
        .patch(
            "node-1.uid-1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"objectResourceVersion": "7"}, "spec": {"objectName": "d2"}}),
            ),
        )
        .await
        .expect("main patch");
    assert_eq!(
        main.data["status"]["objectResourceVersion"], "42",
        "the main resource leaves status alone"
    );
    assert_eq!(main.data["spec"]["objectName"], "d2");
    // generateName.
    let mut g = device("", "n1");
    g.metadata.name = None;
    g.metadata.generate_name = Some("gen-".into());
    let g = devices
        .create(&PostParams::default(), &g)
        .await
        .expect("generateName");
    let gname = g.metadata.name.clone().unwrap_or_default();
    assert!(gname.starts_with("gen-") && gname.len() == 9, "{gname}");
    // Oversized bodies: 413, nothing stored.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut huge = configmap("huge");
    huge.data = Some(BTreeMap::from([("k".to_string(), "x".repeat(4 << 20))]));
    let e = cms
        .create(&PostParams::default(), &huge)
        .await
        .expect_err("too large");
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 413), "{e:?}");
    assert!(cms.get_opt("huge").await.expect("get").is_none());
    devices
        .delete("d1", &DeleteParams::default())
        .await
        .expect("delete");
    let e = devices.get("d1").await.expect_err("gone");
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 404), "{e:?}");
}

#[tokio::test]
async fn reflector_follows_changes_and_owned_objects_go_with_their_owner() {
    let c = Server::start();
    let client = c.client().await;
    common::cases::reflector_follows(client.clone()).await;
    let devices: Api<Device> = Api::namespaced(client.clone(), "default");
    // A DeviceStatus owned by r0 goes with it.
    let r0 = devices.get("r0").await.expect("r0");
    let gvk = GroupVersionKind::gvk("devices.kubeedge.io", "v1beta1", "DeviceStatus");
    let ar = ApiResource::from_gvk(&gvk);
    let statuses: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let mut st = DynamicObject::new("r0", &ar);
    st.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "devices.kubeedge.io/v1beta1".into(),
            kind: "Device".into(),
            name: "r0".into(),
            uid: r0.metadata.uid.clone().expect("uid"),
            ..Default::default()
        },
    ]);
    st.data = json!({"spec": {}});
    statuses
        .create(&PostParams::default(), &st)
        .await
        .expect("status");
    devices
        .delete("r0", &DeleteParams::default())
        .await
        .expect("delete r0");
    within("the owned DeviceStatus is collected", async {
        while statuses.get_opt("r0").await.expect("get").is_some() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    // One created after its owner went (a controller's write racing the delete) goes at once,
    // not at the next periodic sweep (30 s): within 5 s here.
    st.metadata.name = Some("late".into());
    statuses
        .create(&PostParams::default(), &st)
        .await
        .expect("a late status");
    tokio::time::timeout(Duration::from_secs(5), async {
        while statuses.get_opt("late").await.expect("get").is_some() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the orphan collected within 5 s");
}

#[tokio::test]
async fn a_watch_resumes_across_a_restart_and_relists_after_410() {
    let mut c = Server::start_with(&["--watch-history", "100"]);
    let client = c.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    // A raw watch from a version: events after it, in order.
    let first = cms
        .create(&PostParams::default(), &configmap("w0"))
        .await
        .expect("create");
    let rv0 = first.metadata.resource_version.clone().expect("rv");
    cms.create(&PostParams::default(), &configmap("w1"))
        .await
        .expect("create");
    let mut w = cms
        .watch(&WatchParams::default(), &rv0)
        .await
        .expect("watch")
        .boxed();
    match within("w1 event", w.next()).await {
        Some(Ok(WatchEvent::Added(cm))) => assert_eq!(cm.metadata.name.as_deref(), Some("w1")),
        other => panic!("expected ADDED w1, got {other:?}"),
    }
    drop(w);
    // The runtime watcher, through a restart of the server.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let wcms = cms.clone();
    let task = tokio::spawn(async move {
        let mut s = watcher(
            wcms,
            watcher::Config::default().fields("metadata.name!=filler"),
        )
        .boxed();
        while let Some(e) = s.next().await {
            let _ = tx.send(match e {
                Ok(watcher::Event::Apply(cm)) => {
                    format!("apply {}", cm.metadata.name.unwrap_or_default())
                }
                Ok(watcher::Event::Delete(cm)) => {
                    format!("delete {}", cm.metadata.name.unwrap_or_default())
                }
                Ok(watcher::Event::Init) => "init".into(),
                Ok(watcher::Event::InitApply(cm)) => {
                    format!("initapply {}", cm.metadata.name.unwrap_or_default())
                }
                Ok(watcher::Event::InitDone) => "initdone".into(),
                Err(e) => format!("error {e}"),
            });
        }
    });
    wait_for(&mut rx, "initdone".into()).await;
    c.restart();
    let cms = Api::<ConfigMap>::namespaced(c.client().await, "default");
    cms.create(&PostParams::default(), &configmap("after-restart"))
        .await
        .expect("create");
    wait_for(&mut rx, "apply after-restart".into()).await;
    // Push the watcher's version out of the kept history, then cut its connection: it gets a
    // 410 and lists again.
    for i in 0..150 {
        let mut f = configmap("filler");
        f.data = Some(BTreeMap::from([("i".to_string(), i.to_string())]));
        if i == 0 {
            cms.create(&PostParams::default(), &f)
                .await
                .expect("filler");
        } else {
            cms.replace("filler", &PostParams::default(), &{
                let mut cur = cms.get("filler").await.expect("filler");
                cur.data = f.data.clone();
                cur
            })
            .await
            .expect("filler update");
        }
    }
    c.forget_history();
    c.restart();
    let cms = Api::<ConfigMap>::namespaced(c.client().await, "default");
    wait_for(&mut rx, "init".into()).await;
    wait_for(&mut rx, "initdone".into()).await;
    cms.create(&PostParams::default(), &configmap("after-410"))
        .await
        .expect("create");
    wait_for(&mut rx, "apply after-410".into()).await;
    task.abort();
}

#[tokio::test]
async fn kill_9_during_concurrent_writes_loses_nothing_acknowledged() {
    let mut c = Server::start();
    let client = c.client().await;
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for t in 0..8 {
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0.. {
                let name = format!("cm-{t}-{i}");
                match cms.create(&PostParams::default(), &configmap(&name)).await {
                    Ok(_) => acked.lock().expect("lock").push(name),
                    Err(_) => return,
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    c.kill9();
    for t in tasks {
        let _ = t.await;
    }
    let acked = acked.lock().expect("lock").clone();
    assert!(
        acked.len() > 50,
        "only {} creates acknowledged",
        acked.len()
    );
    c.restart_after_kill9();
    let cms: Api<ConfigMap> = Api::namespaced(c.client().await, "default");
    let stored: std::collections::HashSet<String> = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .collect();
    let lost: Vec<&String> = acked.iter().filter(|n| !stored.contains(*n)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged creates lost: {:?}",
        lost.len(),
        acked.len(),
        &lost[..lost.len().min(5)]
    );
}
