//! The kube-rs cases every API must pass (`common/cases.rs`), against the third-party
//! Kubernetes emulator kmock (PyPI; `scripts/test` installs it in `.venv`), started by
//! `tests/kmock/server.py`. The same cases run against cloudcore in `kube_rs.rs`.

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

fn python() -> std::path::PathBuf {
    let venv = common::workspace().join(".venv/bin/python3");
    if venv.is_file() {
        venv
    } else {
        "python3".into()
    }
}

fn kmock() -> Kmock {
    let script = common::workspace().join("cloud/tests/kmock/server.py");
    let mut child = Command::new(python())
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
    common::cases::crud(client(&k).await).await;
}

#[tokio::test]
async fn reflector_against_kmock() {
    let k = kmock();
    common::cases::reflector_follows(client(&k).await).await;
}

/// The device controller's downstream against kmock: a model and a device stored there reach
/// their node as on cloudcore (`devicecontroller.rs` runs the full scenario there).
#[tokio::test]
async fn device_controller_against_kmock() {
    use devicecontroller::controller::{self, MemoryHub};
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
    let _ctl = controller::start(client, hub.clone(), config, stop);
    let mut seen: Vec<String> = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !seen.iter().any(|l| l == "insert node/n1/default/device/d1") {
        for (_, msgs) in hub.take() {
            seen.extend(
                msgs.iter()
                    .map(|o| format!("{} {}", o.message.route.operation, o.message.route.resource)),
            );
        }
        assert!(
            std::time::Instant::now() < deadline,
            "messages so far: {seen:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        &seen[..3],
        [
            "update node/n1/membership",
            "insert node/n1/default/devicemodel/m",
            "insert node/n1/default/device/d1"
        ]
    );
}
