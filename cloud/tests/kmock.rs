//! The kube-rs cases every API must pass (`cloud/apiserver/tests/common/cases.rs`), against the
//! third-party Kubernetes emulator kmock (PyPI; `scripts/test` installs it in `.venv`), started
//! by `tests/kmock/server.py`. The same cases run against the embedded API in the apiserver
//! crate's `kube_rs.rs`.

#[path = "../apiserver/tests/common/cases.rs"]
mod cases;
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

struct Kmock {
    child: Child,
    port: u16,
}

impl Drop for Kmock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn kmock() -> Kmock {
    let script = common::workspace().join("cloud/tests/kmock/server.py");
    let mut child = Command::new(common::python())
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python runs");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("kmock prints its port");
    let port = line
        .trim()
        .strip_prefix("PORT ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| {
            panic!("kmock did not start (is it installed? run scripts/test --setup-only): {line:?}")
        });
    Kmock { child, port }
}

async fn client(k: &Kmock) -> kube::Client {
    let url = format!("http://127.0.0.1:{}", k.port).parse().expect("url");
    kube::Client::try_from(kube::Config::new(url)).expect("client")
}

#[tokio::test]
async fn crud_against_kmock() {
    let k = kmock();
    cases::crud(client(&k).await).await;
}

#[tokio::test]
async fn reflector_against_kmock() {
    let k = kmock();
    cases::reflector_follows(client(&k).await).await;
}

/// The device controller against kmock: a model and a device stored there reach their node as
/// on cloudcore, the device gets its DeviceStatus, and a node's report lands in it and is
/// answered (`devicecontroller.rs` runs the full scenario on cloudcore).
#[tokio::test]
async fn device_controller_against_kmock() {
    use api::bus::MemoryHub;
    use devicecontroller::controller;
    use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
    let k = kmock();
    let client = client(&k).await;
    let ar = |kind: &str| {
        ApiResource::from_gvk(&GroupVersionKind::gvk(
            "devices.kubeedge.io",
            "v1beta1",
            kind,
        ))
    };
    let obj =
        |v: serde_json::Value| -> DynamicObject { serde_json::from_value(v).expect("object") };
    Api::<DynamicObject>::namespaced_with(client.clone(), "default", &ar("DeviceModel"))
        .create(&PostParams::default(), &obj(serde_json::json!({"apiVersion": "devices.kubeedge.io/v1beta1",
            "kind": "DeviceModel", "metadata": {"name": "m", "namespace": "default"}, "spec": {"protocol": "modbus"}})))
        .await
        .expect("model");
    Api::<DynamicObject>::namespaced_with(client.clone(), "default", &ar("Device"))
        .create(
            &PostParams::default(),
            &obj(
                serde_json::json!({"apiVersion": "devices.kubeedge.io/v1beta1",
            "kind": "Device", "metadata": {"name": "d1", "namespace": "default"},
            "spec": {"nodeName": "n1", "deviceModelRef": {"name": "m"}}}),
            ),
        )
        .await
        .expect("device");
    let hub = std::sync::Arc::new(MemoryHub::new(1000));
    let stop = tokio_util::sync::CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    let config = controller::Config {
        profiles: false,
        ..controller::Config::default()
    };
    let ctl = controller::start(client.clone(), hub.clone(), config, stop);
    let mut seen: Vec<String> = Vec::new();
    sim::poll::eventually_async_or(20, "the device sent to n1", async || {
        for (_, msgs) in hub.take() {
            seen.extend(
                msgs.iter()
                    .map(|o| format!("{} {}", o.message.route.operation, o.message.route.resource)),
            );
        }
        match seen.iter().any(|l| l == "insert node/n1/default/device/d1") {
            true => Ok(()),
            false => Err(format!("{seen:?}")),
        }
    })
    .await;
    assert_eq!(
        &seen[..3],
        [
            "update node/n1/membership",
            "insert node/n1/default/devicemodel/m",
            "insert node/n1/default/device/d1"
        ]
    );

    // Upstream: the DeviceStatus is made, a report lands in it, and the node gets its answer.
    let statuses: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &ar("DeviceStatus"));
    sim::poll::eventually_async(20, "DeviceStatus d1 on kmock", async || {
        statuses.get_opt("d1").await.ok().flatten()
    })
    .await;
    // The device has no properties in its spec: give it one first, or the report is ignored.
    Api::<DynamicObject>::namespaced_with(client.clone(), "default", &ar("Device"))
        .patch(
            "d1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"spec": {"properties": [{"name": "temperature"}]}}),
            ),
        )
        .await
        .expect("patch device");
    // Sent again (a newer edge version each time) until stored: the first may arrive before
    // the new spec has, and is then answered as ignored, as KubeEdge ignores unknown properties.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut sent = Vec::new();
    let mut answered = std::collections::HashSet::new();
    for version in 1.. {
        let report = common::twin_report("n1", "d1", "temperature", "42", version);
        sent.push(report.header.id.clone());
        ctl.upstream
            .send(("n1".into(), report))
            .await
            .expect("report");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        for o in hub.take().into_values().flatten() {
            answered.insert(o.message.header.parent_id);
        }
        let st = statuses.get("d1").await.expect("status");
        let twins = serde_json::to_value(&st).expect("json")["status"]["twins"].clone();
        if twins[0]["reported"]["value"] == "42" {
            assert_eq!(twins[0]["propertyName"], "temperature", "{twins}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "report not stored on kmock: {twins}"
        );
    }
    // Every report is answered, the stored one once its patch is in.
    while !sent.iter().all(|id| answered.contains(id)) {
        assert!(
            std::time::Instant::now() < deadline,
            "unanswered: {sent:?} {answered:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        for o in hub.take().into_values().flatten() {
            answered.insert(o.message.header.parent_id);
        }
    }
}
