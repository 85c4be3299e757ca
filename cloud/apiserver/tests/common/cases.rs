//! kube-rs cases that run against any Kubernetes-compatible API: the embedded one
//! (`kube_rs.rs`), and the third-party emulator kmock (`cloud/tests/kmock.rs`), so that nothing
//! the controllers do depends on quirks of ours.

use api::v1beta1::{Device, DeviceSpec};
use futures_util::StreamExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;
use std::time::Duration;

pub fn device(name: &str, node: &str) -> Device {
    Device::new(
        name,
        DeviceSpec {
            node_name: Some(node.into()),
            ..DeviceSpec::default()
        },
    )
}

pub async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// Create, get, list, merge patch, replace, delete.
pub async fn crud(client: kube::Client) {
    let devices: Api<Device> = Api::namespaced(client, "default");
    let created = devices
        .create(&PostParams::default(), &device("c1", "n1"))
        .await
        .expect("create");
    assert!(created.metadata.resource_version.is_some());
    assert_eq!(
        devices
            .get("c1")
            .await
            .expect("get")
            .spec
            .node_name
            .as_deref(),
        Some("n1")
    );
    devices
        .create(&PostParams::default(), &device("c2", "n2"))
        .await
        .expect("create");
    let names: Vec<String> = devices
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|d| d.metadata.name)
        .collect();
    assert!(
        names.contains(&"c1".to_string()) && names.contains(&"c2".to_string()),
        "{names:?}"
    );
    let patched = devices
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": "n3"}})),
        )
        .await
        .expect("merge patch");
    assert_eq!(patched.spec.node_name.as_deref(), Some("n3"));
    let mut cur = devices.get("c2").await.expect("get");
    cur.spec.node_name = Some("n4".into());
    let replaced = devices
        .replace("c2", &PostParams::default(), &cur)
        .await
        .expect("replace");
    assert_eq!(replaced.spec.node_name.as_deref(), Some("n4"));
    devices
        .delete("c1", &DeleteParams::default())
        .await
        .expect("delete");
    let e = devices.get("c1").await.expect_err("gone");
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 404), "{e:?}");
}

/// A reflector follows creates and deletes.
pub async fn reflector_follows(client: kube::Client) {
    let devices: Api<Device> = Api::namespaced(client, "default");
    let (reader, writer) = reflector::store::<Device>();
    let stream = reflector(writer, watcher(devices.clone(), watcher::Config::default()))
        .applied_objects()
        .boxed();
    let task = tokio::spawn(async move {
        let mut s = stream;
        while s.next().await.is_some() {}
    });
    within("reflector ready", reader.wait_until_ready())
        .await
        .expect("ready");
    for i in 0..3 {
        devices
            .create(&PostParams::default(), &device(&format!("r{i}"), "n1"))
            .await
            .expect("create");
    }
    devices
        .delete("r1", &DeleteParams::default())
        .await
        .expect("delete");
    within("reflector sees r0 and r2", async {
        loop {
            let mut names: Vec<String> = reader
                .state()
                .iter()
                .filter_map(|d| d.metadata.name.clone())
                .filter(|n| n.starts_with('r'))
                .collect();
            names.sort();
            if names == ["r0", "r2"] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    task.abort();
}
