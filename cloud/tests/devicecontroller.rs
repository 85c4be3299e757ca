//! The device controller against cloudcore's embedded API over real HTTPS, with the real
//! `kubectl` making the changes as a user would. The controller runs in this process on a
//! `MemoryHub`, so the test sees exactly what each node is sent; cloudcore's own controller is off.

mod common;

use api::bus::MemoryHub;
use api::bus::Outbound;
use common::{Cloud, examples, path_str, twin_report};
use devicecontroller::controller;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

struct Rig {
    cloud: Cloud,
    hub: Arc<MemoryHub>,
    ctl: controller::Controller,
    _stop: tokio_util::sync::DropGuard,
    seen: BTreeMap<String, Vec<Outbound>>,
}

impl Rig {
    async fn start() -> Self {
        let cloud = Cloud::start();
        let hub = Arc::new(MemoryHub::new(100_000));
        let stop = CancellationToken::new();
        let ctl = controller::start(
            cloud.client().await,
            hub.clone(),
            controller::Config::default(),
            stop.clone(),
        );
        Self {
            cloud,
            hub,
            ctl,
            _stop: stop.drop_guard(),
            seen: BTreeMap::new(),
        }
    }

    /// Collects what the hub got until `done` holds for it, or panics after 20 s.
    async fn until(&mut self, what: &str, done: impl Fn(&BTreeMap<String, Vec<Outbound>>) -> bool) {
        sim::poll::eventually_async_or(20, what, async || {
            for (n, v) in self.hub.take() {
                self.seen.entry(n).or_default().extend(v);
            }
            match done(&self.seen) {
                true => Ok(()),
                false => Err(format!("{:#?}", summary(&self.seen))),
            }
        })
        .await
    }

    fn kubectl(&self, args: &[&str]) -> String {
        self.cloud.ok(args)
    }
}

fn summary(seen: &BTreeMap<String, Vec<Outbound>>) -> BTreeMap<String, Vec<String>> {
    seen.iter()
        .map(|(n, v)| {
            (
                n.clone(),
                v.iter()
                    .map(|o| format!("{} {}", o.message.route.operation, o.message.route.resource))
                    .collect(),
            )
        })
        .collect()
}

fn has(seen: &BTreeMap<String, Vec<Outbound>>, node: &str, line: &str) -> bool {
    summary(seen)
        .get(node)
        .is_some_and(|v| v.iter().any(|l| l == line))
}

#[tokio::test]
async fn kubectl_apply_reaches_each_node_and_reports_reach_devicestatus() {
    let mut r = Rig::start().await;
    r.kubectl(&["apply", "-f", path_str(&examples())]);
    // edge-node-1 gets its five devices (flow-1 and probe-1 name no node): one membership per
    // device as it arrives, then its model once, then the device.
    r.until("edge-node-1's devices", |s| {
        ["oven-1", "meter-a", "meter-b", "line-1", "sensor-hall-a"]
            .iter()
            .all(|d| {
                has(
                    s,
                    "edge-node-1",
                    &format!("insert node/edge-node-1/default/device/{d}"),
                )
            })
    })
    .await;
    let n1 = &r.seen["edge-node-1"];
    assert_eq!(
        r.seen.len(),
        1,
        "only edge-node-1 has devices: {:?}",
        summary(&r.seen)
    );
    let pos = |line: &str| {
        n1.iter().position(|o| {
            format!("{} {}", o.message.route.operation, o.message.route.resource) == line
        })
    };
    let model =
        pos("insert node/edge-node-1/default/devicemodel/energy-meter").expect("model sent");
    let meter = pos("insert node/edge-node-1/default/device/meter-a").expect("device sent");
    assert!(model < meter, "the model goes before its devices");
    let inserts = n1
        .iter()
        .filter(|o| {
            o.message
                .route
                .resource
                .ends_with("/devicemodel/energy-meter")
        })
        .count();
    assert_eq!(inserts, 1, "a model shared by two devices goes once");
    let added: Vec<String> = n1
        .iter()
        .filter(|o| o.message.route.resource == "node/edge-node-1/membership")
        .flat_map(|o| {
            o.message.content["added_devices"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|d| d["id"].as_str().map(str::to_string))
        .collect();
    let mut added_sorted = added.clone();
    added_sorted.sort();
    assert_eq!(
        added_sorted,
        [
            "default/line-1",
            "default/meter-a",
            "default/meter-b",
            "default/oven-1",
            "default/sensor-hall-a"
        ]
    );
    let oven = n1
        .iter()
        .find(|o| o.message.route.resource == "node/edge-node-1/default/device/oven-1")
        .expect("oven");
    let rv = r.kubectl(&[
        "get",
        "device",
        "oven-1",
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ]);
    assert_eq!(oven.message.header.resource_version, rv);
    assert_eq!(oven.message.content["spec"]["nodeName"], "edge-node-1");
    assert!(oven.ack.is_some());

    // Every device gets a DeviceStatus it owns; the node's profile ConfigMap appears.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let names = r.kubectl(&["get", "devicestatuses", "-o", "name"]);
        if names.lines().count() == 7 {
            break;
        }
        assert!(Instant::now() < deadline, "DeviceStatus objects: {names}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let owner = r.kubectl(&[
        "get",
        "devicestatus",
        "oven-1",
        "-o",
        "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}",
    ]);
    assert_eq!(owner, "Device/oven-1");
    let profile = loop {
        let o = r.cloud.kubectl(&[
            "get",
            "configmap",
            "device-profile-config-edge-node-1",
            "-o",
            "jsonpath={.data.deviceProfile\\.json}",
        ]);
        if o.status.success() && !o.stdout.is_empty() {
            break String::from_utf8_lossy(&o.stdout).into_owned();
        }
        assert!(Instant::now() < deadline, "no profile ConfigMap");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    check_v1_14_profile(&serde_json::from_str(&profile).expect("deviceProfile.json is JSON"));

    // A node reports: the newest value lands in DeviceStatus, and the report is answered.
    for (v, ver) in [("80", 3), ("60", 1), ("80", 3), ("70", 2)] {
        r.ctl
            .upstream
            .send((
                "edge-node-1".into(),
                twin_report("edge-node-1", "oven-1", "temperature", v, ver),
            ))
            .await
            .expect("sent");
    }
    r.until("the answers", |s| {
        s.get("edge-node-1").is_some_and(|v| {
            v.iter()
                .filter(|o| {
                    o.message.route.operation == "response"
                        && o.message.route.resource == "node/edge-node-1/twin"
                })
                .count()
                == 4
        })
    })
    .await;
    let reported = r.kubectl(&[
        "get",
        "devicestatus",
        "oven-1",
        "-o",
        "jsonpath={.status.twins[?(@.propertyName==\"temperature\")].reported.value}",
    ]);
    assert_eq!(reported, "80", "the newest report wins");
    // A node reporting about another node's device is refused, with an error answer.
    r.ctl
        .upstream
        .send((
            "edge-node-2".into(),
            twin_report("edge-node-2", "oven-1", "temperature", "1", 9),
        ))
        .await
        .expect("sent");
    r.until("the refusal", |s| {
        s.get("edge-node-2")
            .is_some_and(|v| v.iter().any(|o| o.message.route.operation == "error"))
    })
    .await;
    assert_eq!(
        r.kubectl(&[
            "get",
            "devicestatus",
            "oven-1",
            "-o",
            "jsonpath={.status.twins[?(@.propertyName==\"temperature\")].reported.value}"
        ]),
        "80"
    );

    // A move: the old node loses the device (and the model it no longer uses), the new one gets both.
    r.kubectl(&[
        "patch",
        "device",
        "oven-1",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"nodeName":"edge-node-2"}}"#,
    ]);
    r.until("the move", |s| {
        has(
            s,
            "edge-node-1",
            "delete node/edge-node-1/default/device/oven-1",
        ) && has(
            s,
            "edge-node-1",
            "delete node/edge-node-1/default/devicemodel/temperature-controller",
        ) && has(
            s,
            "edge-node-2",
            "insert node/edge-node-2/default/devicemodel/temperature-controller",
        ) && has(
            s,
            "edge-node-2",
            "insert node/edge-node-2/default/device/oven-1",
        )
    })
    .await;
    // A label is not the spec: nothing is sent.
    let before: usize = r.seen.values().map(Vec::len).sum();
    r.kubectl(&["label", "device", "meter-a", "site=hall"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    r.until("quiet", |_| true).await;
    let after: usize = r.seen.values().map(Vec::len).sum();
    assert_eq!(before, after, "{:?}", summary(&r.seen));
    // A property removed from the spec leaves the status.
    r.kubectl(&[
        "patch",
        "device",
        "oven-1",
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/spec/properties","value":[{"name":"setpoint"}]}]"#,
    ]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while r
        .kubectl(&[
            "get",
            "devicestatus",
            "oven-1",
            "-o",
            "jsonpath={.status.twins[*].propertyName}",
        ])
        .contains("temperature")
    {
        assert!(
            Instant::now() < deadline,
            "the removed property stays in the status"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Deleting the device: the node is told, and its DeviceStatus goes with it.
    r.kubectl(&["delete", "device", "meter-b"]);
    r.until("the delete", |s| {
        has(
            s,
            "edge-node-1",
            "delete node/edge-node-1/default/device/meter-b",
        )
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while r
        .cloud
        .kubectl(&["get", "devicestatus", "meter-b"])
        .status
        .success()
    {
        assert!(
            Instant::now() < deadline,
            "meter-b's DeviceStatus outlived it"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The v1.14 `deviceProfile.json` shape (KubeEdge's `types/deviceprofile.go`): the known keys
/// only, with their types.
fn check_v1_14_profile(p: &Value) {
    let keys = |v: &Value, allowed: &[&str]| {
        for k in v.as_object().expect("object").keys() {
            assert!(allowed.contains(&k.as_str()), "unexpected key {k} in {v}");
        }
    };
    keys(p, &["deviceInstances", "deviceModels", "protocols"]);
    let instances = p["deviceInstances"].as_array().expect("deviceInstances");
    assert_eq!(instances.len(), 5);
    let mut protocols = Vec::new();
    for i in instances {
        keys(
            i,
            &[
                "id",
                "name",
                "protocol",
                "model",
                "twins",
                "data",
                "propertyVisitors",
            ],
        );
        assert!(i["id"].is_string() && i["model"].is_string());
        protocols.push(i["protocol"].as_str().expect("protocol").to_string());
        for v in i["propertyVisitors"].as_array().expect("visitors") {
            keys(
                v,
                &[
                    "name",
                    "propertyName",
                    "modelName",
                    "protocol",
                    "reportCycle",
                    "collectCycle",
                    "customizedValues",
                    "visitorConfig",
                ],
            );
            assert!(v["propertyName"].is_string() && v["modelName"].is_string());
        }
    }
    for p in p["protocols"].as_array().expect("protocols") {
        keys(
            p,
            &["name", "protocol", "protocolConfig", "protocolCommonConfig"],
        );
        assert!(protocols.contains(&p["name"].as_str().expect("name").to_string()));
    }
    let kinds: Vec<&str> = p["protocols"]
        .as_array()
        .expect("protocols")
        .iter()
        .filter_map(|p| p["protocol"].as_str())
        .collect();
    for want in ["modbus", "opcua", "ble"] {
        assert!(kinds.contains(&want), "{want} in {kinds:?}");
    }
    for m in p["deviceModels"].as_array().expect("models") {
        keys(m, &["name", "description", "properties"]);
        for prop in m["properties"].as_array().expect("properties") {
            keys(
                prop,
                &[
                    "name",
                    "dataType",
                    "description",
                    "accessMode",
                    "defaultValue",
                    "minimum",
                    "maximum",
                    "unit",
                ],
            );
            assert!(
                ["int", "float", "double", "string", "boolean", "bytes"]
                    .contains(&prop["dataType"].as_str().unwrap_or("int")),
                "{prop}"
            );
        }
    }
}

#[tokio::test]
async fn cloudcores_own_controller_makes_the_devicestatuses() {
    let c = Cloud::start_full("", "");
    c.ok(&["apply", "-f", path_str(&examples().join("modbus-tcp.yaml"))]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c
        .kubectl(&["get", "devicestatus", "oven-1"])
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "no DeviceStatus: {}", c.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The node's profile ConfigMap follows (profiles are written at most every 200 ms).
    loop {
        let cm = c.ok(&["get", "configmap", "-o", "name"]);
        if cm.contains("configmap/device-profile-config-edge-node-1") {
            break;
        }
        assert!(Instant::now() < deadline, "no profile ConfigMap: {cm}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn profile_configmaps_of_nodes_gone_while_stopped_are_deleted() {
    let c = Cloud::start();
    c.ok(&[
        "create",
        "configmap",
        "device-profile-config-gone",
        "--from-literal=deviceProfile.json={}",
    ]);
    c.ok(&[
        "label",
        "configmap",
        "device-profile-config-gone",
        "devices.kubeedge.io/profile-node=gone",
    ]);
    c.ok(&["apply", "-f", path_str(&examples().join("modbus-tcp.yaml"))]);
    let hub = Arc::new(MemoryHub::new(1000));
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    let _ctl = controller::start(c.client().await, hub, controller::Config::default(), stop);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let cms = c.ok(&[
            "get",
            "configmaps",
            "-l",
            "devices.kubeedge.io/profile-node",
            "-o",
            "name",
        ]);
        if cms.trim() == "configmap/device-profile-config-edge-node-1" {
            break;
        }
        assert!(Instant::now() < deadline, "profile ConfigMaps: {cms}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Node objects: devices on nodes without one are counted; a node whose Node object is deleted
/// and made again (a reinstalled gateway) is sent everything again, and only that node.
#[tokio::test]
async fn a_node_deleted_and_registered_again_gets_everything_again() {
    let mut r = Rig::start().await;
    r.kubectl(&["apply", "-f", path_str(&examples().join("modbus-tcp.yaml"))]);
    let oven = "insert node/edge-node-1/default/device/oven-1";
    r.until("oven-1 on edge-node-1", |s| has(s, "edge-node-1", oven))
        .await;
    let devices = metric(&r, "devicecontroller_devices");
    assert_eq!(devices, "1");
    wait(
        &r,
        "devicecontroller_devices_on_unregistered_nodes",
        &devices,
    )
    .await;
    let node = tempfile::NamedTempFile::new().expect("file");
    std::fs::write(
        node.path(),
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: edge-node-1\n",
    )
    .expect("write");
    r.kubectl(&["create", "-f", path_str(node.path())]);
    wait(&r, "devicecontroller_nodes_registered", "1").await;
    r.seen.clear();
    r.kubectl(&["delete", "node", "edge-node-1"]);
    wait(&r, "devicecontroller_nodes_registered", "0").await;
    r.kubectl(&["create", "-f", path_str(node.path())]);
    r.until("oven-1 sent again", |s| has(s, "edge-node-1", oven))
        .await;
    let lines = summary(&r.seen);
    assert_eq!(
        lines["edge-node-1"].first().map(String::as_str),
        Some("update node/edge-node-1/membership"),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .all(|(n, v)| n == "edge-node-1" || v.iter().all(|l| !l.starts_with("insert"))),
        "only the node that came back is sent its objects again: {lines:#?}"
    );
    // Each change after the first list is timed from its watch event to its messages.
    let before = r.ctl.metrics.reconcile.count();
    r.kubectl(&["label", "device", "oven-1", "hall=b"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while r.ctl.metrics.reconcile.count() == before {
        assert!(
            Instant::now() < deadline,
            "the label's watch event was not timed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        r.ctl
            .metrics
            .render()
            .contains("devicecontroller_reconcile_duration_seconds_bucket{le=\"+Inf\"}")
    );
}

fn metric(r: &Rig, name: &str) -> String {
    r.ctl
        .metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")).map(str::to_string))
        .unwrap_or_default()
}

async fn wait(r: &Rig, name: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(r, name) != want {
        assert!(
            Instant::now() < deadline,
            "{name} is {} not {want}",
            metric(r, name)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The node's profile ConfigMap as `(deviceProfile.json's length, the omitted annotation)`.
fn profile_cm(c: &Cloud) -> Option<(Option<usize>, Option<String>)> {
    let out = c.kubectl(&[
        "get",
        "configmap",
        "device-profile-config-edge-node-1",
        "-o",
        "json",
    ]);
    if !out.status.success() {
        return None;
    }
    let cm: Value = serde_json::from_slice(&out.stdout).ok()?;
    Some((
        cm["data"]["deviceProfile.json"].as_str().map(str::len),
        cm["metadata"]["annotations"][devicecontroller::profile::OMITTED]
            .as_str()
            .map(str::to_string),
    ))
}

/// A controller on `c` whose profiles hold at most `max` bytes, until dropped.
async fn profile_controller(
    c: &Cloud,
    max: usize,
) -> (controller::Controller, tokio_util::sync::DropGuard) {
    let stop = CancellationToken::new();
    let ctl = controller::start(
        c.client().await,
        Arc::new(MemoryHub::new(1000)),
        controller::Config {
            profile_max_bytes: max,
            ..controller::Config::default()
        },
        stop.clone(),
    );
    (ctl, stop.drop_guard())
}

/// A profile over what a ConfigMap holds is not sent to the API at every change (which refuses
/// it): the ConfigMap says why instead, and holds the profile again once it fits.
#[tokio::test]
async fn a_profile_too_large_for_a_configmap_says_so_there_and_comes_back_when_it_fits() {
    let c = Cloud::start();
    c.ok(&["apply", "-f", path_str(&examples().join("modbus-tcp.yaml"))]);
    // One device's profile, written whole.
    let one = {
        let _ctl = profile_controller(&c, devicecontroller::profile::MAX_BYTES).await;
        sim::poll::eventually_async_or(20, "the profile of oven-1", async || {
            profile_cm(&c)
                .and_then(|(l, _)| l)
                .ok_or_else(|| "no profile yet".to_string())
        })
        .await
    };
    // A controller that takes one device's profile but not two.
    let _ctl = profile_controller(&c, one + one / 2).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let second = dir.path().join("oven-2.yaml");
    let text = std::fs::read_to_string(examples().join("modbus-tcp.yaml")).expect("example");
    let device = text
        .split("\n---\n")
        .find(|d| d.contains("kind: Device\n"))
        .expect("a Device in the example")
        .replace("oven-1", "oven-2");
    std::fs::write(&second, device).expect("write");
    c.ok(&["apply", "-f", path_str(&second)]);
    sim::poll::eventually_async_or(
        20,
        "the profile said too large",
        async || match profile_cm(&c) {
            Some((None, Some(why))) => {
                assert!(
                    why.contains("profile of 2 devices") && why.contains("not written"),
                    "{why}"
                );
                Ok(())
            }
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    c.ok(&["delete", "device", "oven-2"]);
    sim::poll::eventually_async_or(
        20,
        "the profile back once it fits",
        async || match profile_cm(&c) {
            Some((Some(len), None)) if len == one => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
}
