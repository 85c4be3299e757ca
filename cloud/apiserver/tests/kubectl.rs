//! The real `kubectl` against the embedded API (cloudcore's, here the crate's own `apiserver`
//! binary with cloudcore's CRDs), as a user types it.

mod common;

use common::{Served, Server, examples, path_str, text};
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

const DEVICES: &[&str] = &[
    "flow-1",
    "line-1",
    "meter-a",
    "meter-b",
    "oven-1",
    "probe-1",
    "sensor-hall-a",
];

#[test]
fn apply_examples_then_get_explain_and_reapply() {
    let c = Server::start();
    let ex = examples();
    let out = c.ok(&["apply", "-f", path_str(&ex)]);
    for d in DEVICES {
        assert!(
            out.contains(&format!("device.devices.kubeedge.io/{d} created")),
            "{out}"
        );
    }
    let got = c.ok(&["get", "devices,devicemodels", "-A"]);
    let header = got.lines().next().unwrap_or_default();
    for col in ["NAMESPACE", "NAME", "NODE", "MODEL", "PROTOCOL", "AGE"] {
        assert!(header.contains(col), "columns as on a cluster: {got}");
    }
    for d in DEVICES {
        assert!(
            got.contains(&format!("device.devices.kubeedge.io/{d}")),
            "{got}"
        );
    }
    assert!(
        got.contains("devicemodel.devices.kubeedge.io/temperature-controller"),
        "{got}"
    );
    let row = got
        .lines()
        .find(|l| l.contains("/oven-1 "))
        .expect("oven-1's row");
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        &cells[..5],
        [
            "default",
            "device.devices.kubeedge.io/oven-1",
            "edge-node-1",
            "temperature-controller",
            "modbus"
        ],
        "{row}"
    );
    // -o yaml round-trips what was applied, with the server's metadata.
    let yaml = c.ok(&["get", "device", "oven-1", "-o", "yaml"]);
    let v: serde_json::Value = serde_yaml_ng::from_str(&yaml).expect("yaml");
    assert_eq!(v["spec"]["nodeName"], "edge-node-1");
    assert_eq!(v["metadata"]["generation"], 1);
    assert!(v["metadata"]["uid"].as_str().is_some_and(|u| u.len() == 36));
    assert!(v["metadata"]["creationTimestamp"].is_string());
    let wide = c.ok(&["get", "devicestatuses", "-o", "wide"]);
    assert!(wide.is_empty() || wide.contains("LAST-ONLINE"), "{wide}");
    // Applying again changes nothing; server-side apply takes over the same objects.
    let again = c.ok(&["apply", "-f", path_str(&ex)]);
    assert!(
        again.contains("device.devices.kubeedge.io/oven-1 unchanged"),
        "{again}"
    );
    let ssa = c.ok(&[
        "apply",
        "--server-side",
        "-f",
        path_str(&ex.join("modbus-tcp.yaml")),
    ]);
    assert!(
        ssa.contains("device.devices.kubeedge.io/oven-1 serverside-applied"),
        "{ssa}"
    );
    let explain = c.ok(&["explain", "device.spec.properties"]);
    assert!(explain.contains("KIND:       Device"), "{explain}");
    assert!(explain.contains("collectCycle"), "{explain}");
    let crds = c.ok(&["get", "crds"]);
    for crd in [
        "devices.devices.kubeedge.io",
        "devicemodels.devices.kubeedge.io",
        "devicestatuses.devices.kubeedge.io",
        "objectsyncs.reliablesyncs.kubeedge.io",
        "clusterobjectsyncs.reliablesyncs.kubeedge.io",
        "imageprepulljobs.operations.kubeedge.io",
    ] {
        assert!(crds.contains(crd), "cloudcore installs {crd}: {crds}");
    }
}

#[test]
fn label_annotate_patch_edit_wait_and_delete() {
    let c = Server::start();
    c.ok(&["apply", "-f", path_str(&examples().join("modbus-tcp.yaml"))]);
    c.ok(&["label", "device", "oven-1", "site=hall-2"]);
    c.ok(&["annotate", "device", "oven-1", "owner=line-team"]);
    let sel = c.ok(&["get", "devices", "-l", "site=hall-2", "-o", "name"]);
    assert_eq!(sel.trim(), "device.devices.kubeedge.io/oven-1");
    assert!(
        c.ok(&["get", "devices", "-l", "site!=hall-2", "-o", "name"])
            .trim()
            .is_empty()
    );
    let to_node_2 = r#"{"spec":{"nodeName":"edge-node-2"}}"#;
    c.ok(&[
        "patch", "device", "oven-1", "--type", "merge", "-p", to_node_2,
    ]);
    let to_node_3 = r#"[{"op":"replace","path":"/spec/nodeName","value":"edge-node-3"}]"#;
    c.ok(&[
        "patch", "device", "oven-1", "--type", "json", "-p", to_node_3,
    ]);
    let got = c.ok(&[
        "get",
        "device",
        "oven-1",
        "-o",
        "jsonpath={.spec.nodeName} {.metadata.generation} {.metadata.annotations.owner}",
    ]);
    assert_eq!(
        got, "edge-node-3 3 line-team",
        "label and annotate leave generation alone"
    );
    let edit = c
        .kubectl_cmd(&["edit", "device", "oven-1"])
        .env("KUBE_EDITOR", "sed -i s/edge-node-3/edge-node-4/")
        .output()
        .expect("kubectl edit");
    assert!(edit.status.success(), "{}", text(&edit));
    assert_eq!(
        c.ok(&["get", "device", "oven-1", "-o", "jsonpath={.spec.nodeName}"]),
        "edge-node-4"
    );
    let stale = c.kubectl_stdin(
        &["replace", "-f", "-"],
        "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: oven-1, resourceVersion: \"1\"}\nspec: {nodeName: x}\n",
    );
    assert!(!stale.status.success());
    assert!(
        text(&stale).contains("Operation cannot be fulfilled on devices.devices.kubeedge.io \"oven-1\": the object has been modified; please apply your changes to the latest version and try again"),
        "{}", text(&stale)
    );
    let established = c.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/devices.devices.kubeedge.io",
        "--timeout=10s",
    ]);
    assert!(established.contains("condition met"), "{established}");
    let waiter = c
        .kubectl_cmd(&["wait", "--for=delete", "device/oven-1", "--timeout=20s"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("kubectl wait");
    std::thread::sleep(Duration::from_millis(500));
    let del = c.ok(&["delete", "device", "oven-1"]);
    assert!(
        del.contains("device.devices.kubeedge.io \"oven-1\" deleted"),
        "{del}"
    );
    let out = waiter.wait_with_output().expect("wait ends");
    assert!(out.status.success(), "{}", text(&out));
    let gone = c.fails(&["get", "device", "oven-1"]);
    assert!(
        gone.contains(
            "Error from server (NotFound): devices.devices.kubeedge.io \"oven-1\" not found"
        ),
        "{gone}"
    );
    // deletecollection with a selector.
    c.ok(&["apply", "-f", path_str(&examples().join("modbus-rtu.yaml"))]);
    c.ok(&["label", "device", "meter-a", "meter-b", "batch=old"]);
    c.ok(&["delete", "devices", "-l", "batch=old"]);
    assert!(c.ok(&["get", "devices", "-o", "name"]).trim().is_empty());
}

#[test]
fn get_watch_shows_each_change() {
    let c = Server::start();
    c.ok(&["apply", "-f", path_str(&examples().join("modbus-tcp.yaml"))]);
    let mut w = c
        .kubectl_cmd(&["get", "devices", "-w", "--output-watch-events"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl get -w");
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = w.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let next = |want: &str| {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(l) = rx.recv_timeout(Duration::from_millis(200))
                && l.starts_with(want)
            {
                return l;
            }
        }
        panic!("no {want} line from kubectl get -w");
    };
    assert!(next("ADDED").contains("oven-1"));
    c.ok(&["label", "device", "oven-1", "a=b"]);
    assert!(next("MODIFIED").contains("oven-1"));
    c.ok(&["delete", "device", "oven-1"]);
    assert!(next("DELETED").contains("oven-1"));
    let _ = w.kill();
    let _ = w.wait();
}

#[test]
fn errors_read_as_a_clusters() {
    let c = Server::start();
    let bad = |yaml: &str| {
        let o = c.kubectl_stdin(&["apply", "-f", "-"], yaml);
        assert!(!o.status.success(), "{}", text(&o));
        text(&o)
    };
    let e = bad(
        "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: Bad_Name}\nspec: {nodeName: n1}\n",
    );
    assert!(e.contains("The Device \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain must consist of"), "{e}");
    let e = bad(
        "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: d2}\nspec: {nodeName: n1, bogus: 1}\n",
    );
    assert!(
        e.contains("strict decoding error: unknown field \"spec.bogus\""),
        "{e}"
    );
    let e = bad(
        "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: d3}\nspec: {nodeName: 5, properties: [{name: 3}]}\n",
    );
    assert!(e.contains("The Device \"d3\" is invalid: \n* spec.nodeName: Invalid value: \"integer\": spec.nodeName in body must be of type string: \"integer\"\n* spec.properties[0].name: Invalid value: \"integer\""), "{e}");
    let e = bad(
        "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: d4, namespace: nowhere}\nspec: {nodeName: n1}\n",
    );
    assert!(e.contains("namespaces \"nowhere\" not found"), "{e}");
    // Nothing of the above was stored.
    assert!(
        c.ok(&["get", "devices", "-A", "-o", "name"])
            .trim()
            .is_empty()
    );
    // --validate=false: the unknown field is pruned, with a warning.
    let o = c.kubectl_stdin(
        &["apply", "--validate=false", "-f", "-"],
        "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: d5}\nspec: {nodeName: n1, bogus: 1}\n",
    );
    assert!(o.status.success(), "{}", text(&o));
    let spec = c.ok(&["get", "device", "d5", "-o", "jsonpath={.spec}"]);
    assert!(
        spec.contains("\"nodeName\":\"n1\"") && !spec.contains("bogus"),
        "{spec}"
    );
    // dry run stores nothing.
    let o = c.kubectl_stdin(
        &["apply", "--dry-run=server", "-f", "-"],
        "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: d6}\nspec: {nodeName: n1}\n",
    );
    assert!(
        o.status.success() && text(&o).contains("(server dry run)"),
        "{}",
        text(&o)
    );
    c.fails(&["get", "device", "d6"]);
    // No credentials: 401, printed as kubectl prints it for a cluster.
    let anon = c.dir.join("anon.kubeconfig");
    let kc = std::fs::read_to_string(&c.kubeconfig).expect("kubeconfig");
    let cut = kc.find("users:").expect("users");
    let ctx = kc.find("contexts:").expect("contexts");
    let with_token = |t: &str| {
        std::fs::write(
            &anon,
            format!(
                "{}users:\n- name: admin\n  user: {{token: {t}}}\n{}",
                &kc[..cut],
                &kc[ctx..]
            ),
        )
        .expect("written");
        c.kubectl(&[
            "--kubeconfig",
            path_str(&anon),
            "get",
            "devices",
            "-o",
            "name",
        ])
    };
    let o = with_token("not-a-token");
    assert!(!o.status.success());
    assert!(
        text(&o).contains("error: You must be logged in to the server (Unauthorized)"),
        "{}",
        text(&o)
    );
    // The admin bearer token of tokens.csv works as the client certificate does.
    let tokens = std::fs::read_to_string(c.data().join("tokens.csv")).expect("tokens.csv");
    let token = tokens.split(',').next().expect("a token");
    let o = with_token(token);
    assert!(
        o.status.success() && text(&o).contains("device.devices.kubeedge.io/d5"),
        "{}",
        text(&o)
    );
}

#[test]
fn namespaces_finalizers_and_built_in_kinds() {
    let c = Server::start();
    c.ok(&["create", "namespace", "plant"]);
    c.ok(&[
        "create",
        "configmap",
        "mapper-config",
        "-n",
        "plant",
        "--from-literal=port=502",
    ]);
    c.ok(&[
        "create",
        "secret",
        "generic",
        "creds",
        "-n",
        "plant",
        "--from-literal=pw=s3cret",
    ]);
    let pw = c.ok(&[
        "get",
        "secret",
        "creds",
        "-n",
        "plant",
        "-o",
        "jsonpath={.data.pw}",
    ]);
    assert_eq!(pw, "czNjcmV0");
    let o = c.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: held, namespace: plant, finalizers: [example.com/hold]}\nspec: {nodeName: n1}\n",
    );
    assert!(o.status.success(), "{}", text(&o));
    c.ok(&["delete", "namespace", "plant", "--wait=false"]);
    sim::poll::eventually_or(10, "the namespace's contents deleted", || {
        let cms = c.ok(&["get", "configmaps,secrets", "-n", "plant", "-o", "name"]);
        if cms.trim().is_empty() {
            Ok(())
        } else {
            Err(cms)
        }
    });
    let ns = c.ok(&[
        "get",
        "namespace",
        "plant",
        "-o",
        "jsonpath={.status.phase}",
    ]);
    assert_eq!(ns, "Terminating", "the finalizer holds the namespace");
    let dt = c.ok(&[
        "get",
        "device",
        "held",
        "-n",
        "plant",
        "-o",
        "jsonpath={.metadata.deletionTimestamp}",
    ]);
    assert!(!dt.is_empty(), "the held device is marked deleted");
    let e = c.kubectl_stdin(
        &["create", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: late, namespace: plant}\n",
    );
    assert!(
        text(&e).contains("because it is being terminated"),
        "{}",
        text(&e)
    );
    c.ok(&[
        "patch",
        "device",
        "held",
        "-n",
        "plant",
        "--type",
        "json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ]);
    sim::poll::eventually(10, "the namespace gone after its last object", || {
        (!c.kubectl(&["get", "namespace", "plant"]).status.success()).then_some(())
    });
}

#[test]
fn kubeedges_own_crds_take_over_ours_in_place() {
    // KubeEdge's own CRD YAMLs (v1alpha2 served beside v1beta1), when given.
    let Some(kubeedge) = std::env::var_os("KUBEEDGE_CRDS").map(std::path::PathBuf::from) else {
        eprintln!("skipped: KUBEEDGE_CRDS does not name KubeEdge's build/crds/devices folder");
        return;
    };
    assert!(
        kubeedge.is_dir(),
        "KUBEEDGE_CRDS={} is not a directory",
        kubeedge.display()
    );
    let c = Server::start();
    let out = c.ok(&["apply", "-f", path_str(&kubeedge)]);
    assert!(
        out.contains(
            "customresourcedefinition.apiextensions.k8s.io/devices.devices.kubeedge.io configured"
        ),
        "{out}"
    );
    c.ok(&["apply", "-f", path_str(&examples().join("modbus-tcp.yaml"))]);
    let v1alpha2 = c.ok(&[
        "get",
        "devices.v1alpha2.devices.kubeedge.io",
        "oven-1",
        "-o",
        "jsonpath={.apiVersion}",
    ]);
    assert_eq!(v1alpha2, "devices.kubeedge.io/v1alpha2");
    assert!(c.ok(&["get", "devices"]).contains("oven-1"));
}

#[test]
fn an_invalid_crd_is_refused_and_a_valid_one_is_served_at_once() {
    let c = Server::start();
    // A CRD whose schema is not structural is refused, with the path, and not stored.
    let bad = c.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: things.example.com}\nspec:\n  group: example.com\n  scope: Namespaced\n  names: {plural: things, kind: Thing}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        type: object\n        properties:\n          spec: {properties: {size: {type: integer}}}\n",
    );
    assert!(!bad.status.success());
    assert!(
        text(&bad).contains("The CustomResourceDefinition \"things.example.com\" is invalid: spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value"),
        "{}", text(&bad)
    );
    c.fails(&["get", "crd", "things.example.com"]);
    // A valid one serves its kind at once, with its schema enforced.
    let good = c.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: things.example.com}\nspec:\n  group: example.com\n  scope: Namespaced\n  names: {plural: things, kind: Thing, shortNames: [th]}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        type: object\n        properties:\n          spec: {type: object, properties: {size: {type: integer, default: 3, maximum: 10}}}\n",
    );
    assert!(good.status.success(), "{}", text(&good));
    c.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/things.example.com",
    ]);
    let t = c.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: example.com/v1\nkind: Thing\nmetadata: {name: t1}\nspec: {}\n",
    );
    assert!(t.status.success(), "{}", text(&t));
    assert_eq!(
        c.ok(&["get", "th", "t1", "-o", "jsonpath={.spec.size}"]),
        "3",
        "default applied"
    );
    let big = c.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: example.com/v1\nkind: Thing\nmetadata: {name: t2}\nspec: {size: 11}\n",
    );
    assert!(
        text(&big).contains(
            "spec.size: Invalid value: 11: spec.size in body should be less than or equal to 10"
        ),
        "{}",
        text(&big)
    );
    // Deleting the CRD takes its objects with it.
    c.ok(&["delete", "crd", "things.example.com"]);
    c.fails(&["get", "crd", "things.example.com"]);
}

#[test]
fn kill_9_keeps_what_was_acknowledged_and_sigterm_is_quick() {
    let mut c = Server::start();
    c.ok(&["apply", "-f", path_str(&examples())]);
    c.ok(&["label", "device", "oven-1", "kept=yes"]);
    c.restart_after_kill9();
    let got = c.ok(&["get", "devices", "-o", "name"]);
    for d in DEVICES {
        assert!(
            got.contains(&format!("device.devices.kubeedge.io/{d}")),
            "{d} lost: {got}"
        );
    }
    assert_eq!(
        c.ok(&[
            "get",
            "device",
            "oven-1",
            "-o",
            "jsonpath={.metadata.labels.kept}"
        ]),
        "yes"
    );
    let took = c.stop();
    assert!(took < Duration::from_secs(5), "SIGTERM took {took:?}");
    assert!(c.log().contains("stopping"), "{}", c.log());
}

/// A desired value that can never land is refused at the door, with its field path and the
/// edge's words: above the model's maximum, not of the property's type, on a ReadOnly
/// property. A good value lands; a value stored before the model changed does not hold back a
/// change of another property.
#[test]
fn desired_values_that_cannot_land_are_refused_with_their_path() {
    let s = Server::start();
    let file = common::examples().join("modbus-tcp.yaml");
    s.ok(&["apply", "-f", file.to_str().expect("utf-8")]);
    let patch = |ops: &str| s.kubectl(&["patch", "device", "oven-1", "--type=json", "-p", ops]);
    for (ops, want) in [
        (
            r#"[{"op":"replace","path":"/spec/properties/1/desired/value","value":"130"}]"#,
            r#"spec.properties[1].desired.value: Invalid value: "130": 130 is above the model maximum 120"#,
        ),
        (
            r#"[{"op":"replace","path":"/spec/properties/1/desired/value","value":"abc"}]"#,
            r#"spec.properties[1].desired.value: Invalid value: "abc""#,
        ),
        (
            r#"[{"op":"add","path":"/spec/properties/2/desired","value":{"value":"maybe"}}]"#,
            r#"spec.properties[2].desired.value: Invalid value: "maybe""#,
        ),
        (
            r#"[{"op":"add","path":"/spec/properties/0/desired","value":{"value":"20"}}]"#,
            "is ReadOnly in the model",
        ),
    ] {
        let out = patch(ops);
        let text = common::text(&out);
        assert!(!out.status.success(), "{ops}: {text}");
        assert!(
            text.contains("Device \"oven-1\" is invalid") && text.contains(want),
            "{ops}: {text}"
        );
    }
    let desired = |i: usize| {
        s.ok(&[
            "get",
            "device",
            "oven-1",
            "-o",
            &format!("jsonpath={{.spec.properties[{i}].desired.value}}"),
        ])
    };
    assert_eq!(desired(1).trim(), "80", "nothing refused was stored");
    let out = patch(r#"[{"op":"replace","path":"/spec/properties/1/desired/value","value":"85"}]"#);
    assert!(out.status.success(), "{}", common::text(&out));
    assert_eq!(desired(1).trim(), "85");
    // The model's maximum goes down to 50: the stored 85 no longer fits, yet another
    // property's change is not held back by it.
    let out = s.kubectl(&[
        "patch",
        "devicemodel",
        "temperature-controller",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/properties/1/maximum","value":"50"}]"#,
    ]);
    assert!(out.status.success(), "{}", common::text(&out));
    let out =
        patch(r#"[{"op":"add","path":"/spec/properties/2/desired","value":{"value":"true"}}]"#);
    assert!(out.status.success(), "{}", common::text(&out));
    assert_eq!(desired(2).trim(), "true");
}

/// Who set which value when: each desired value a write changes is an Event on the Device
/// (reason DesiredValueSet, the user and the values in its message), found as kubectl finds a
/// Device's events (`kubectl describe`, `--field-selector involvedObject.name=`); a refused
/// value and a write that changes no desired value make none.
#[test]
fn each_desired_value_set_is_an_event_naming_the_user() {
    let s = Server::start();
    let file = common::examples().join("modbus-tcp.yaml");
    s.ok(&["apply", "-f", file.to_str().expect("utf-8")]);
    let patch = |ops: &str| s.kubectl(&["patch", "device", "oven-1", "--type=json", "-p", ops]);
    let out = patch(r#"[{"op":"replace","path":"/spec/properties/1/desired/value","value":"85"}]"#);
    assert!(out.status.success(), "{}", common::text(&out));
    let out =
        patch(r#"[{"op":"replace","path":"/spec/properties/1/desired/value","value":"130"}]"#);
    assert!(!out.status.success(), "refused: {}", common::text(&out));
    let out = s.kubectl(&["label", "device", "oven-1", "line=2"]);
    assert!(out.status.success(), "{}", common::text(&out));
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.kind=Device,involvedObject.name=oven-1,reason=DesiredValueSet",
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ]);
    let lines: Vec<&str> = events.lines().collect();
    // The apply set 80 (the manifest's), the patch 85; the refused 130 and the label none.
    assert_eq!(lines.len(), 2, "{events}");
    assert!(lines[0].starts_with("setpoint set to 80 by "), "{events}");
    assert!(
        lines[1].starts_with("setpoint set to 85 (was 80) by "),
        "{events}"
    );
    let described = s.ok(&["describe", "device", "oven-1"]);
    assert!(
        described.contains("DesiredValueSet") && described.contains("setpoint set to 85 (was 80)"),
        "{described}"
    );
}

/// The audit is bounded: a Device keeps its last 100 desired-value Events, the newest.
#[test]
fn a_devices_desired_value_events_are_bounded() {
    let s = Server::start();
    let file = common::examples().join("modbus-tcp.yaml");
    s.ok(&["apply", "-f", file.to_str().expect("utf-8")]);
    for v in 0..105 {
        let ops = format!(
            r#"[{{"op":"replace","path":"/spec/properties/1/desired/value","value":"{}"}}]"#,
            v % 100
        );
        let out = s.kubectl(&["patch", "device", "oven-1", "--type=json", "-p", &ops]);
        assert!(out.status.success(), "{}", common::text(&out));
    }
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=oven-1,reason=DesiredValueSet",
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ]);
    assert_eq!(events.lines().count(), 100, "{events}");
    assert!(
        events.contains("setpoint set to 4 (was 3)"),
        "the newest is kept: {events}"
    );
    assert!(
        !events.contains("setpoint set to 80 by"),
        "the oldest went: {events}"
    );
}
