//! DMI with a test mapper over the real Unix sockets: the mapper registers with the real
//! `edgecore` binary, reports values and states, and edgecore calls the mapper's
//! `DeviceMapperService` for desired values and manifest changes.

mod common;

use common::mapper::{Seen, TestMapper, desired_of};
use common::{Edgecore, reported};
use serde_json::{Value, json};
use std::time::Duration;
use tonic::Code;

const MODEL: &str = include_str!("manifests/dmi_models.yaml");

/// A pressure device; `pin` names the mapper that must serve it.
fn press(name: &str, collect: u32, pin: Option<&str>) -> String {
    let annotations = pin
        .map(|m| format!(", annotations: {{edgecore.kubeedge.io/mapper: {m}}}"))
        .unwrap_or_default();
    format!(
        r#"
apiVersion: devices.kubeedge.io/v1beta1
kind: Device
metadata: {{name: {name}, namespace: default{annotations}}}
spec:
  deviceModelRef: {{name: press-model}}
  nodeName: test-node
  protocol: {{protocolName: modbus, configData: {{ip: 127.0.0.1, port: 5020}}}}
  properties:
    - name: pressure
      collectCycle: {collect}
      visitors: {{protocolName: modbus, configData: {{offset: 8}}}}
    - name: valve
      desired: {{value: "10"}}
      visitors: {{protocolName: modbus, configData: {{register: HoldingRegister, offset: 0, limit: 1}}}}
"#
    )
}

fn start(devices: &[(&str, String)]) -> Edgecore {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).expect("mkdir");
    std::fs::write(manifests.join("models.yaml"), MODEL).expect("write");
    for (file, text) in devices {
        std::fs::write(manifests.join(file), text).expect("write");
    }
    let mut e = Edgecore::with_dir(dir, None);
    e.wait_ready();
    e
}

fn mapper(e: &Edgecore, name: &str) -> TestMapper {
    TestMapper::start(name, &e.dir.path().join(format!("{name}.sock")), &e.socket)
}

fn names(devices: &[api::dmi::v1beta1::Device]) -> Vec<String> {
    let mut v: Vec<String> = devices.iter().map(|d| d.name.clone()).collect();
    v.sort();
    v
}

fn mapper_status(e: &Edgecore, name: &str) -> Value {
    let (status, list) = e.get("/api/v1/mappers");
    assert_eq!(status, 200);
    list.as_array()
        .and_then(|l| l.iter().find(|m| m["name"] == name).cloned())
        .unwrap_or(Value::Null)
}

#[test]
fn a_mapper_registers_reports_and_receives_desired_values() {
    let e = start(&[("press-1.yaml", press("press-1", 1000, None))]);
    let m = mapper(&e, "modbus-a");
    let resp = m.register("modbus").expect("MapperRegister");

    // Only its protocol's devices, with the model's defaults merged in and the desired value.
    assert_eq!(names(&resp.device_list), ["press-1"]);
    assert_eq!(
        resp.model_list
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>(),
        ["press-model"]
    );
    let d = &resp.device_list[0];
    let (device, _) = api::dmi::device_from_dmi(d).expect("a decodable device");
    let protocol = device.spec.protocol.expect("protocol");
    assert_eq!(
        serde_json::to_value(protocol.config_data).expect("json"),
        json!({"ip": "127.0.0.1", "port": 5020, "slaveID": 3, "timeout": 500})
    );
    let pressure = device
        .spec
        .properties
        .iter()
        .find(|p| p.name == "pressure")
        .and_then(|p| p.visitors.clone())
        .expect("pressure visitor");
    assert_eq!(
        serde_json::to_value(pressure.config_data).expect("json"),
        json!({"register": "InputRegister", "offset": 8, "limit": 2, "scale": 0.01})
    );
    assert_eq!(desired_of(d, "valve").as_deref(), Some("10"));
    let listed = mapper_status(&e, "modbus-a");
    assert_eq!(listed["reachable"], true);
    assert_eq!(listed["devices"], json!(["default/press-1"]));

    // Reported values, observedDesired and state reach the twin.
    m.report("default", "press-1", &[("pressure", "1.25")])
        .expect("report");
    let t = e.twin("default/press-1").expect("twin");
    assert_eq!(reported(&t, "pressure").as_deref(), Some("1.25"));
    m.report_twins(
        "default",
        "press-1",
        vec![api::dmi::v1beta1::Twin {
            property_name: "valve".into(),
            observed_desired: Some(api::dmi::v1beta1::TwinProperty {
                value: "10".into(),
                metadata: Default::default(),
            }),
            reported: Some(api::dmi::v1beta1::TwinProperty {
                value: "10".into(),
                metadata: Default::default(),
            }),
        }],
    )
    .expect("report with observedDesired");
    m.report_state("default", "press-1", "online")
        .expect("state");
    let t = e.twin("default/press-1").expect("twin");
    assert_eq!(t["state"], "online");
    assert!(t["lastOnline"].as_i64().unwrap_or(0) > 0, "{t}");
    assert_eq!(t["properties"]["valve"]["observedDesired"]["value"], "10");
    assert_eq!(reported(&t, "valve").as_deref(), Some("10"));

    // A desired value set at the edge is pushed to the mapper.
    m.clear();
    let (status, body) = e.put(
        "/api/v1/devices/default/press-1/desired",
        r#"{"valve": "42"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let seen = m.wait_for("UpdateDevice with valve 42", |s| {
        matches!(s, Seen::Update(d) if d.name == "press-1" && desired_of(d, "valve").as_deref() == Some("42"))
    });
    // The rest of the spec rides along unchanged.
    let Seen::Update(d) = seen else {
        unreachable!()
    };
    assert_eq!(
        d.spec.map(|s| s.properties.len()),
        Some(2),
        "the update carries the whole device"
    );

    // Garbage: each refused with a code and a message naming the problem; nothing stored changes.
    let err = m
        .report("default", "no-such", &[("pressure", "1")])
        .expect_err("unknown device");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("no-such"), "{}", err.message());
    let err = m
        .report("default", "", &[("pressure", "1")])
        .expect_err("empty name");
    assert_eq!(err.code(), Code::InvalidArgument);
    // One bad twin fails that twin only: the others of the report are stored, and the refused
    // one is named (KubeEdge handles each twin on its own).
    let refused = m
        .report_refused(
            "default",
            "press-1",
            &[("pressure", "hot"), ("valve", "15")],
        )
        .expect("the report is taken");
    assert!(refused.contains("pressure"), "{refused}");
    assert!(!refused.contains("valve"), "{refused}");
    let t = e.twin("default/press-1").expect("twin");
    assert_eq!(reported(&t, "valve").as_deref(), Some("15"));
    // A twin the device does not declare is added, as KubeEdge and MQTT twin/update add it.
    let refused = m
        .report_refused("default", "press-1", &[("humidity", "3")])
        .expect("an added twin");
    assert_eq!(refused, "");
    let t = e.twin("default/press-1").expect("twin");
    assert_eq!(reported(&t, "humidity").as_deref(), Some("3"));
    let err = m
        .report_state("default", "press-1", "exploded")
        .expect_err("unknown state");
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = m
        .call_register(api::dmi::v1beta1::MapperRegisterRequest {
            with_data: true,
            mapper: None,
        })
        .expect_err("no mapper info");
    assert_eq!(err.code(), Code::InvalidArgument);
    let t = e.twin("default/press-1").expect("twin");
    assert_eq!(reported(&t, "pressure").as_deref(), Some("1.25"));
    assert_eq!(t["state"], "online");

    // A report that changes nothing bumps no version.
    let before = t["reportedVersion"].clone();
    m.report("default", "press-1", &[("pressure", "1.25")])
        .expect("report");
    let t = e.twin("default/press-1").expect("twin");
    assert_eq!(t["reportedVersion"], before);
}

#[test]
fn manifest_changes_reach_the_mapper() {
    let e = start(&[("press-1.yaml", press("press-1", 1000, None))]);
    let m = mapper(&e, "modbus-a");
    m.register("modbus").expect("register");

    // A new device is registered with its mapper.
    std::fs::write(
        e.manifests.join("press-2.yaml"),
        press("press-2", 1000, None),
    )
    .expect("write");
    m.wait_for("RegisterDevice press-2", |s| {
        s.key() == "register/default/press-2"
    });

    // Rewriting a file without changing the spec sends nothing ...
    std::fs::write(
        e.manifests.join("press-2.yaml"),
        format!("# touched\n{}", press("press-2", 1000, None)),
    )
    .expect("write");
    std::thread::sleep(Duration::from_millis(600));
    // ... and a real change sends one UpdateDevice with the new spec.
    std::fs::write(
        e.manifests.join("press-2.yaml"),
        press("press-2", 250, None),
    )
    .expect("write");
    let seen = m.wait_for("UpdateDevice press-2", |s| {
        s.key() == "update/default/press-2"
    });
    let Seen::Update(d) = seen else {
        unreachable!()
    };
    let cycle = d
        .spec
        .as_ref()
        .and_then(|s| s.properties.iter().find(|p| p.name == "pressure"))
        .map(|p| p.collect_cycle);
    assert_eq!(cycle, Some(250));
    let updates = m.keys().iter().filter(|k| k.starts_with("update/")).count();
    assert_eq!(updates, 1, "only the real change is sent: {:?}", m.keys());

    // A model change is told to the mapper of its protocol.
    std::fs::write(
        e.manifests.join("models.yaml"),
        MODEL.replace("timeout: 500", "timeout: 900"),
    )
    .expect("write");
    m.wait_for("UpdateDeviceModel press-model", |s| {
        s.key() == "updateModel/default/press-model"
    });
    // The model's protocol defaults changed the effective spec of its devices too.
    m.wait_for("UpdateDevice press-1 with the new timeout", |s| match s {
        Seen::Update(d) if d.name == "press-1" => {
            api::dmi::device_from_dmi(d)
                .ok()
                .and_then(|(d, _)| d.spec.protocol?.config_data)
                .and_then(|c| c.get("timeout").cloned())
                == Some(json!(900))
        }
        _ => false,
    });

    // A removed file removes the device from the mapper and the twin.
    std::fs::remove_file(e.manifests.join("press-2.yaml")).expect("rm");
    m.wait_for("RemoveDevice press-2", |s| {
        s.key() == "remove/default/press-2"
    });
    e.eventually("the twin of press-2 to go", |e| {
        e.twin("default/press-2").is_none().then_some(())
    });
    // The OPC UA device never went to the Modbus mapper.
    assert!(
        !m.keys().iter().any(|k| k.contains("ua-")),
        "{:?}",
        m.keys()
    );
}

#[test]
fn a_vanished_mapper_is_retried_and_its_devices_go_unknown() {
    let e = start(&[("press-1.yaml", press("press-1", 1000, None))]);
    let mut m = mapper(&e, "modbus-a");
    m.register("modbus").expect("register");
    m.report_state("default", "press-1", "online")
        .expect("state");

    m.halt();
    // The next call to the mapper fails: its devices become unknown.
    let (status, _) = e.put(
        "/api/v1/devices/default/press-1/desired",
        r#"{"valve": "55"}"#,
    );
    assert_eq!(status, 200);
    e.eventually("press-1 to become unknown", |e| {
        e.twin("default/press-1")
            .filter(|t| t["state"] == "unknown")
    });
    assert_eq!(mapper_status(&e, "modbus-a")["reachable"], false);

    // The mapper comes back on the same socket without registering: edgecore's retry finds it
    // and sends its devices again, with the desired value set while it was gone.
    m.clear();
    m.serve();
    m.wait_for("RegisterDevice press-1 with valve 55", |s| {
        matches!(s, Seen::Register(d) if d.name == "press-1" && desired_of(d, "valve").as_deref() == Some("55"))
    });
    e.eventually("the mapper to be reachable", |e| {
        (mapper_status(e, "modbus-a")["reachable"] == true).then_some(())
    });
}

#[test]
fn registrations_survive_an_edgecore_crash() {
    let mut e = start(&[("press-1.yaml", press("press-1", 1000, None))]);
    let m = mapper(&e, "modbus-a");
    m.register("modbus").expect("register");

    e.restart(true);
    assert_eq!(
        mapper_status(&e, "modbus-a")["devices"],
        json!(["default/press-1"])
    );
    // Without registering again, the mapper still gets desired values ...
    m.clear();
    let (status, _) = e.put(
        "/api/v1/devices/default/press-1/desired",
        r#"{"valve": "77"}"#,
    );
    assert_eq!(status, 200);
    m.wait_for(
        "UpdateDevice press-1 with valve 77",
        |s| matches!(s, Seen::Update(d) if desired_of(d, "valve").as_deref() == Some("77")),
    );
    // ... and its reports are accepted on the new DMI socket.
    m.report("default", "press-1", &[("pressure", "2.5")])
        .expect("report after restart");
    let t = e.twin("default/press-1").expect("twin");
    assert_eq!(reported(&t, "pressure").as_deref(), Some("2.5"));
}

#[test]
fn two_mappers_of_one_protocol_share_the_devices() {
    let e = start(&[
        ("press-1.yaml", press("press-1", 1000, Some("modbus-b"))),
        ("press-2.yaml", press("press-2", 1000, None)),
    ]);
    let a = mapper(&e, "modbus-a");
    let b = mapper(&e, "modbus-b");
    // press-1 is pinned to b, so a does not take it even though it registers first.
    assert_eq!(
        names(&a.register("modbus").expect("a").device_list),
        ["press-2"]
    );
    assert_eq!(
        names(&b.register("modbus").expect("b").device_list),
        ["press-1"]
    );

    // New devices go to the mapper with fewer devices.
    std::fs::write(
        e.manifests.join("press-3.yaml"),
        press("press-3", 1000, None),
    )
    .expect("write");
    let first = e.eventually("press-3 to be registered", |_| {
        [&a, &b]
            .into_iter()
            .find(|m| m.keys().contains(&"register/default/press-3".to_string()))
            .map(|m| m.name.clone())
    });
    std::fs::write(
        e.manifests.join("press-4.yaml"),
        press("press-4", 1000, None),
    )
    .expect("write");
    let second = e.eventually("press-4 to be registered", |_| {
        [&a, &b]
            .into_iter()
            .find(|m| m.keys().contains(&"register/default/press-4".to_string()))
            .map(|m| m.name.clone())
    });
    assert_ne!(
        first, second,
        "the two new devices are spread over both mappers"
    );
    let a_devices = mapper_status(&e, "modbus-a")["devices"].clone();
    let b_devices = mapper_status(&e, "modbus-b")["devices"].clone();
    assert_eq!(a_devices.as_array().map(Vec::len), Some(2), "{a_devices}");
    assert_eq!(b_devices.as_array().map(Vec::len), Some(2), "{b_devices}");

    // A desired value goes to the owner only.
    a.clear();
    b.clear();
    let (status, _) = e.put(
        "/api/v1/devices/default/press-1/desired",
        r#"{"valve": "5"}"#,
    );
    assert_eq!(status, 200);
    b.wait_for("UpdateDevice press-1", |s| {
        s.key() == "update/default/press-1"
    });
    assert!(
        !a.keys().iter().any(|k| k.contains("press-1")),
        "{:?}",
        a.keys()
    );

    // A mapper that registers again (restarted) keeps its devices.
    let again = a.register("modbus").expect("a again");
    assert_eq!(
        names(&again.device_list),
        serde_json::from_value::<Vec<String>>(a_devices)
            .expect("list")
            .iter()
            .map(|id| id.trim_start_matches("default/").to_string())
            .collect::<Vec<_>>()
    );
}

/// A steady value read again: the twin says when it was last read (`reported.lastRead`) while
/// `reported.timestamp` stays when it last changed; nothing is written for it.
#[test]
fn a_steady_value_shows_when_it_was_last_read() {
    let e = start(&[("press-1.yaml", press("press-1", 1000, None))]);
    let m = mapper(&e, "modbus-a");
    m.register("modbus").expect("MapperRegister");
    m.report("default", "press-1", &[("pressure", "1.5")])
        .expect("reported");
    let first = e.eventually("the value in the twin", |e| {
        let t = e.twin("default/press-1")?;
        let r = t["properties"]["pressure"]["reported"].clone();
        (r["value"] == "1.5").then_some(r)
    });
    let changed = first["timestamp"].as_i64().expect("timestamp");
    let read = first["lastRead"].as_i64().expect("lastRead");
    assert!(read >= changed, "{first}");
    std::thread::sleep(std::time::Duration::from_millis(20));
    m.report("default", "press-1", &[("pressure", "1.5")])
        .expect("reported again");
    let again = e.eventually("a later read of the same value", |e| {
        let t = e.twin("default/press-1")?;
        let r = t["properties"]["pressure"]["reported"].clone();
        (r["lastRead"].as_i64() > Some(read)).then_some(r)
    });
    assert_eq!(again["timestamp"].as_i64(), Some(changed), "{again}");
    assert_eq!(again["value"], "1.5");
}
