//! cloudhub against an edge node that is not ours: `tests/edge/edge.py` joins and holds its
//! session as KubeEdge's edgehub does, on the `cryptography` and `websockets` libraries. The
//! real `cloudcore` binary runs with its device controller and cloudhub; the real `kubectl`
//! makes the changes.

mod common;

use common::{Cloud, Served, examples, path_str, twin_report};
use serde_json::Value;
use std::io::Write;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

struct Edge {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<Value>,
    seen: Vec<Value>,
}

impl Drop for Edge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn edge_cmd(c: &Cloud, node: &str, token: &str) -> Command {
    let mut cmd = Command::new(common::python());
    cmd.arg(common::workspace().join("cloud/tests/edge/edge.py"))
        .args(["--cert-url", &format!("https://127.0.0.1:{}", c.cert_port)])
        .args(["--hub-url", &format!("wss://127.0.0.1:{}", c.hub_port)])
        .args(["--node", node, "--token", token, "--heartbeat", "2"]);
    cmd
}

impl Edge {
    fn start(c: &Cloud, node: &str, token: &str) -> Self {
        Self::start_args(c, node, token, &[])
    }

    /// An edge that keeps its certificate (in the cloud's test directory, by node name) and so
    /// joins only the first time, as a real edge does.
    fn start_args(c: &Cloud, node: &str, token: &str, args: &[&str]) -> Self {
        let state = c.dir.join(format!("edge-{node}"));
        let (child, stdin, out) = sim::piped(
            edge_cmd(c, node, token)
                .arg("--state")
                .arg(&state)
                .args(args)
                .stderr(Stdio::inherit()),
        );
        let lines = sim::lines(out, |l| serde_json::from_str(&l).ok());
        Self {
            child,
            stdin,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits until a frame (or event line) matching `want` arrives; returns it.
    fn until(&mut self, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        self.until_for(20, what, want)
    }

    /// [`Edge::until`] for up to `secs` seconds.
    fn until_for(&mut self, secs: u64, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        if let Some(v) = self.seen.iter().find(|v| want(v)) {
            return v.clone();
        }
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(v) => {
                    self.seen.push(v.clone());
                    if want(&v) {
                        return v;
                    }
                }
                Err(_) => panic!("edge: no {what}; it got: {:#?}", self.seen),
            }
        }
    }

    fn send(&mut self, frame: &str) {
        writeln!(self.stdin, "{frame}").expect("to the edge");
        self.stdin.flush().expect("flush");
    }
}

fn token(c: &Cloud) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cloudcore"))
        .arg("gettoken")
        .arg("--config")
        .arg(c.dir.join("cloudcore.yaml"))
        .output()
        .expect("cloudcore gettoken runs");
    assert!(out.status.success(), "{}", common::text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn resource(v: &Value) -> &str {
    v["route"]["resource"].as_str().unwrap_or_default()
}

fn node_status(c: &Cloud, node: &str) -> String {
    let out = c.kubectl(&["get", "node", node, "--no-headers"]);
    common::text(&out)
}

#[tokio::test]
async fn a_kubeedge_shaped_edge_joins_gets_its_devices_and_reports_into_devicestatus() {
    let c = Cloud::start_full("", "");
    let token = token(&c);
    assert_eq!(token.split('.').count(), 4, "{token}");
    c.ok(&["apply", "-f", path_str(&examples().join("modbus-tcp.yaml"))]);

    let mut edge = Edge::start(&c, "edge-node-1", &token);
    let joined = edge.until("join", |v| v["joined"].is_string());
    assert!(
        joined["joined"].as_str().is_some_and(
            |s| s.contains("CN=system:node:edge-node-1") && s.contains("O=system:nodes")
        ),
        "{joined}"
    );
    edge.until("session", |v| v["connected"] == "edge-node-1");
    let dev = edge.until("oven-1", |v| {
        resource(v) == "default/device/oven-1" && v["route"]["operation"] == "insert"
    });
    assert_eq!(dev["content"]["kind"], "Device");
    assert!(
        dev["header"]["resourceversion"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{dev}"
    );
    edge.until("membership", |v| resource(v) == "membership");

    // The node shows Ready.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !node_status(&c, "edge-node-1").contains(" Ready") {
        assert!(
            Instant::now() < deadline,
            "{}",
            node_status(&c, "edge-node-1")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // What KubeEdge's edge sends at every connect (`membership/detail`, group `resource`,
    // operation `get`) and at shutdown (an empty message) is ignored as KubeEdge's cloud
    // ignores it: no answer, no warning.
    let detail = serde_json::json!({
        "header": {"msg_id": "0b5d3a62-0000-4000-8000-000000000001", "timestamp": 1},
        "route": {"source": "twin", "group": "resource", "operation": "get",
                  "resource": "membership/detail"},
        "content": "{\"event_id\":\"\",\"timestamp\":1}"
    });
    edge.send(&detail.to_string());
    edge.send(
        r#"{"header":{"msg_id":"0b5d3a62-0000-4000-8000-000000000002","parent_msg_id":"","timestamp":0,"sync":false},"route":{"source":"","group":"","operation":"","resource":""},"content":null}"#,
    );

    // Garbage frames (5,000 of them) and a truncated message are skipped, with one log line
    // (not 5,000: one per 10 s, the metric counts them all); the session goes on.
    for _ in 0..5000 {
        edge.send("this is not a message");
    }
    let report = twin_report("edge-node-1", "oven-1", "temperature", "77", 1);
    let whole = serde_json::to_string(&report).expect("json");
    edge.send(&whole[..whole.len() / 2]);
    // A report lands in DeviceStatus and is answered once stored.
    let id = report.header.id.clone();
    edge.send(&serde_json::to_string(&report).expect("json"));
    let answer = edge.until("the report's answer", |v| {
        v["header"]["parent_msg_id"] == id
    });
    assert_eq!(answer["route"]["operation"], "response", "{answer}");
    let yaml = c.ok(&["get", "devicestatus", "oven-1", "-o", "yaml"]);
    assert!(yaml.contains("value: \"77\""), "{yaml}");
    assert_eq!(
        c.log().matches("a frame is not a message; skipped").count(),
        1,
        "{}",
        c.log()
    );
    assert!(
        !edge
            .seen
            .iter()
            .any(|v| v["header"]["parent_msg_id"] == detail["header"]["msg_id"]),
        "membership/detail is not answered: {:#?}",
        edge.seen
    );
    assert!(
        !c.log()
            .lines()
            .any(|l| l.contains("WARN") && (l.contains("membership") || l.contains("refused"))),
        "{}",
        c.log()
    );

    // A report about another node's device is refused with an error naming why.
    let other = twin_report("edge-node-2", "oven-1", "temperature", "1", 2);
    let oid = other.header.id.clone();
    edge.send(&serde_json::to_string(&other).expect("json"));
    let err = edge.until("a refusal", |v| v["header"]["parent_msg_id"] == oid);
    assert_eq!(err["route"]["operation"], "error", "{err}");
    assert!(
        err["content"]
            .as_str()
            .is_some_and(|s| s.contains("only send about itself")),
        "{err}"
    );

    // A desired value set with kubectl reaches the node as a device update.
    c.ok(&[
        "patch",
        "device",
        "oven-1",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/properties/1/desired/value","value":"88"}]"#,
    ]);
    edge.until("the desired value", |v| {
        resource(v) == "default/device/oven-1"
            && v["route"]["operation"] == "update"
            && v.to_string().contains("\"88\"")
    });

    // The device is online, as the edge says (KubeEdge's state/update).
    let online = serde_json::json!({
        "header": {"msg_id": "0b5d3a62-0000-4000-8000-0000000000aa", "timestamp": 1},
        "route": {"source": "edgemgr", "group": "twin", "operation": "update",
                  "resource": "node/edge-node-1/device/default/oven-1/state/update"},
        "content": serde_json::json!({"event_id": "s1", "timestamp": 1,
            "Device": {"state": "online", "lastOnlineTime": "2026-11-27T10:00:00Z"}}).to_string()
    });
    edge.send(&online.to_string());
    let state = || {
        c.ok(&[
            "get",
            "devicestatus",
            "oven-1",
            "-o",
            "jsonpath={.status.state}",
        ])
    };
    sim::poll::eventually(20, "the device online in its DeviceStatus", || {
        (state().trim() == "online").then_some(())
    });

    // The edge goes away: its Node turns NotReady, and its device is no longer shown online
    // (what it last said may no longer hold) but unknown.
    drop(edge);
    sim::poll::eventually_or(20, "the Node NotReady", || {
        let s = node_status(&c, "edge-node-1");
        if s.contains("NotReady") {
            Ok(())
        } else {
            Err(s)
        }
    });
    sim::poll::eventually_or(20, "the device unknown in its DeviceStatus", || {
        let s = state();
        if s.trim() == "unknown" {
            Ok(())
        } else {
            Err(s)
        }
    });
}

#[tokio::test]
async fn wrong_tokens_and_certificates_are_refused_with_the_reason() {
    let c = Cloud::start_full("", "");
    let token = token(&c);
    let (hash, jwt) = token.split_once('.').expect("hash.jwt");

    // A token of another CA: the edge refuses the cloud's CA.
    let wrong_hash = format!("{}.{jwt}", "0".repeat(hash.len()));
    let out = edge_cmd(&c, "edge-node-1", &wrong_hash)
        .output()
        .expect("python");
    assert!(!out.status.success());
    assert!(
        common::text(&out).contains("failed to validate CA certificate"),
        "{}",
        common::text(&out)
    );

    // A JWT this cloud did not sign: 401 with the reason.
    let mut parts: Vec<&str> = jwt.split('.').collect();
    parts[2] = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let forged = format!("{hash}.{}", parts.join("."));
    let out = edge_cmd(&c, "edge-node-1", &forged)
        .output()
        .expect("python");
    assert!(!out.status.success());
    let text = common::text(&out);
    assert!(
        text.contains("code: 401") && text.contains("not made by this cloudcore"),
        "{text}"
    );
}

#[test]
fn cloudhub_refuses_a_session_without_a_client_certificate() {
    let c = Cloud::start_full("", "");
    // TLS without a client certificate: the handshake is refused before any websocket.
    let out = Command::new(common::python())
        .args([
            "-c",
            &format!(
                "import asyncio, ssl, websockets\n\
                 ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE\n\
                 async def main():\n\
                 \x20   async with websockets.connect('wss://127.0.0.1:{}/p/edge-node-1/events', ssl=ctx, additional_headers={{'node_id': 'edge-node-1'}}) as ws:\n\
                 \x20       await ws.recv()\n\
                 asyncio.run(main())\n",
                c.hub_port
            ),
        ])
        .output()
        .expect("python");
    let text = common::text(&out);
    assert!(!out.status.success(), "{text}");
    // TLS 1.3: the client's side of the handshake is done before the server checks its
    // certificate; the server then ends the connection before any HTTP.
    assert!(
        text.contains("SSL") || text.contains("connection closed while reading HTTP status line"),
        "refused at TLS, not for another reason: {text}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.log().contains("TLS handshake failed") {
        assert!(Instant::now() < deadline, "{}", c.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(c.log().contains("certificate"), "{}", c.log());
}

/// What a node acknowledged is recorded in ObjectSync (`{node}.{uid}`), as KubeEdge does: after
/// cloudcore restarts, the node is not sent again what it has, and gets the deletes it missed
/// while it was away, even though the cloudcore that queued them is gone.
#[tokio::test]
async fn after_a_restart_a_node_gets_only_what_it_missed_including_deletes() {
    let mut c = Cloud::start_full("", "");
    let token = token(&c);
    c.ok(&["apply", "-f", path_str(&examples().join("modbus-tcp.yaml"))]);
    let mut edge = Edge::start(&c, "edge-node-1", &token);
    edge.until("oven-1", |v| resource(v) == "default/device/oven-1");
    // Both acknowledgements recorded: the device and its model.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let syncs = c.ok(&["get", "objectsyncs", "-o", "name"]);
        if syncs
            .matches("objectsync.reliablesyncs.kubeedge.io/edge-node-1.")
            .count()
            == 2
        {
            break;
        }
        assert!(Instant::now() < deadline, "ObjectSync records: {syncs}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let uid = c.ok(&["get", "device", "oven-1", "-o", "jsonpath={.metadata.uid}"]);
    let rv = c.ok(&[
        "get",
        "objectsync",
        &format!("edge-node-1.{}", uid.trim()),
        "-o",
        "jsonpath={.status.objectResourceVersion}",
    ]);
    let device_rv = c.ok(&[
        "get",
        "device",
        "oven-1",
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ]);
    assert_eq!(rv.trim(), device_rv.trim());

    // The node goes away; the device is deleted; cloudcore restarts.
    drop(edge);
    c.ok(&["delete", "device", "oven-1"]);
    c.restart();
    let mut edge = Edge::start(&c, "edge-node-1", &token);
    edge.until("session", |v| v["connected"] == "edge-node-1");
    let del = edge.until("the delete it missed", |v| {
        resource(v) == "default/device/oven-1" && v["route"]["operation"] == "delete"
    });
    assert_eq!(del["content"]["metadata"]["uid"], uid.trim(), "{del}");
    // Nothing it has is sent again (its model goes too: no device of the node uses it now).
    edge.until("the model's delete", |v| {
        resource(v) == "default/devicemodel/temperature-controller"
            && v["route"]["operation"] == "delete"
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    while let Ok(v) = edge.lines.try_recv() {
        edge.seen.push(v);
    }
    assert!(
        !edge.seen.iter().any(|v| matches!(
            v["route"]["operation"].as_str(),
            Some("insert" | "update")
        ) && resource(v).contains("/device")),
        "{:#?}",
        edge.seen
    );
    // The delete's acknowledgement removes the device's record.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let syncs = c.ok(&["get", "objectsyncs", "-o", "name"]);
        if !syncs.contains(uid.trim()) {
            break;
        }
        assert!(Instant::now() < deadline, "ObjectSync records: {syncs}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A frame over `maxFrameBytes` ends that session (and only it), with the reason in the log;
/// the node connects again and goes on.
#[tokio::test]
async fn an_oversized_frame_ends_the_session_and_the_node_comes_back() {
    let c = Cloud::start_full("", "  cloudHub:\n    maxFrameBytes: 65536\n");
    let token = token(&c);
    c.ok(&["apply", "-f", path_str(&examples().join("modbus-tcp.yaml"))]);
    let mut edge = Edge::start(&c, "edge-node-1", &token);
    edge.until("oven-1", |v| resource(v) == "default/device/oven-1");
    let huge = twin_report(
        "edge-node-1",
        "oven-1",
        "temperature",
        &"9".repeat(100_000),
        1,
    );
    edge.send(&serde_json::to_string(&huge).expect("json"));
    edge.until("the session closed", |v| v["closed"].is_string());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.log().contains("node disconnected") {
        assert!(Instant::now() < deadline, "{}", c.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        c.log().contains("Space limit exceeded") || c.log().contains("too long"),
        "the log names the reason: {}",
        c.log()
    );
    // The node comes back (a new session) and is served.
    let mut edge = Edge::start(&c, "edge-node-1", &token);
    edge.until("session", |v| v["connected"] == "edge-node-1");
    let report = twin_report("edge-node-1", "oven-1", "temperature", "5", 2);
    let id = report.header.id.clone();
    edge.send(&serde_json::to_string(&report).expect("json"));
    edge.until("the answer", |v| v["header"]["parent_msg_id"] == id);
}

/// What KubeEdge's kubelet asks through metamanager, as KubeEdge's edgecontroller answers it:
/// it registers its Node (labels and status merged in), reads it back, patches its status, and
/// renews its Lease (query: NotFound at first, then insert and update). Another node's Node or
/// Lease is refused with a Forbidden `Err`.
#[tokio::test]
async fn a_kubeedge_kubelet_registers_its_node_and_renews_its_lease() {
    let c = Cloud::start_full("", "");
    let token = token(&c);
    let mut edge = Edge::start(&c, "edge-node-1", &token);
    edge.until("session", |v| v["connected"] == "edge-node-1");
    let mut n = 0;
    let mut ask = |edge: &mut Edge, op: &str, resource: &str, content: Value| -> Value {
        n += 1;
        let id = format!("0b5d3a62-0000-4000-8000-{n:012}");
        let msg = serde_json::json!({
            "header": {"msg_id": id, "parent_msg_id": "", "timestamp": 1, "sync": true},
            "route": {"source": "edged", "group": "meta", "operation": op, "resource": resource},
            "content": content,
        });
        edge.send(&msg.to_string());
        edge.until(&format!("the answer to {op} {resource}"), |v| {
            v["header"]["parent_msg_id"] == id
        })
    };
    let node = serde_json::json!({"metadata": {"name": "edge-node-1",
        "labels": {"kubernetes.io/arch": "amd64", "node-role.kubernetes.io/agent": "",
            "node-restriction.kubernetes.io/site": "another-site",
            "node-role.kubernetes.io/control-plane": ""}},
        "status": {"capacity": {"cpu": "2", "memory": "1Gi", "pods": "110"},
            "nodeInfo": {"kubeletVersion": "v1.32.10-kubeedge"},
            "addresses": [{"type": "InternalIP", "address": "192.0.2.7"}]}});
    let a = ask(&mut edge, "insert", "default/node/edge-node-1", node);
    assert_eq!(a["route"]["operation"], "response", "{a}");
    assert_eq!(a["route"]["resource"], "default/node/edge-node-1", "{a}");
    assert!(a["content"]["Err"].is_null(), "{a}");
    assert_eq!(a["content"]["Object"]["kind"], "Node", "{a}");
    assert_eq!(
        a["content"]["Object"]["metadata"]["labels"]["kubernetes.io/arch"], "amd64",
        "{a}"
    );
    // Labels a node may not set on its Node (NodeRestriction) are left out: cloudcore writes
    // the registration with its own credentials, so the API could not refuse them.
    let labels = c.ok(&[
        "get",
        "node",
        "edge-node-1",
        "-o",
        "jsonpath={.metadata.labels}",
    ]);
    assert!(
        !labels.contains("node-restriction") && !labels.contains("control-plane"),
        "{labels}"
    );
    assert!(labels.contains("node-role.kubernetes.io/agent"), "{labels}");
    let wide = c.ok(&["get", "node", "edge-node-1", "-o", "wide"]);
    assert!(
        wide.contains("192.0.2.7") && wide.contains("v1.32.10-kubeedge"),
        "{wide}"
    );

    let a = ask(&mut edge, "query", "default/node/edge-node-1", Value::Null);
    assert_eq!(a["content"]["kind"], "Node", "{a}");
    assert!(
        a["header"]["resourceversion"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{a}"
    );

    let patch = r#"{"status":{"conditions":[{"type":"MemoryPressure","status":"False","reason":"KubeletHasSufficientMemory"}]}}"#;
    let a = ask(
        &mut edge,
        "patch",
        "default/nodepatch/edge-node-1",
        Value::String(patch.into()),
    );
    assert!(a["content"]["Err"].is_null(), "{a}");
    let conditions = c.ok(&[
        "get",
        "node",
        "edge-node-1",
        "-o",
        "jsonpath={.status.conditions[*].type}",
    ]);
    assert!(conditions.contains("MemoryPressure"), "{conditions}");

    let a = ask(
        &mut edge,
        "query",
        "kube-node-lease/lease/edge-node-1",
        Value::Null,
    );
    assert_eq!(a["content"]["Err"]["ErrStatus"]["code"], 404, "{a}");
    assert_eq!(
        a["content"]["Err"]["ErrStatus"]["reason"], "NotFound",
        "{a}"
    );
    let lease = serde_json::json!({"metadata": {"name": "edge-node-1", "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "edge-node-1", "leaseDurationSeconds": 40,
            "renewTime": "2026-11-26T05:00:00.000000Z"}});
    let a = ask(
        &mut edge,
        "insert",
        "kube-node-lease/lease/edge-node-1",
        lease.clone(),
    );
    assert!(a["content"]["Err"].is_null(), "{a}");
    let mut renewed = a["content"]["Object"].clone();
    renewed["spec"]["renewTime"] = serde_json::json!("2026-11-26T05:00:10.000000Z");
    let a = ask(
        &mut edge,
        "update",
        "kube-node-lease/lease/edge-node-1",
        renewed,
    );
    assert!(a["content"]["Err"].is_null(), "{a}");
    let renew = c.ok(&[
        "get",
        "lease",
        "-n",
        "kube-node-lease",
        "edge-node-1",
        "-o",
        "jsonpath={.spec.renewTime}",
    ]);
    assert!(renew.starts_with("2026-11-26T05:00:10"), "{renew}");

    // Not its own: refused, nothing made.
    for (op, resource) in [
        ("query", "default/node/edge-node-2"),
        ("insert", "kube-node-lease/lease/edge-node-2"),
        ("insert", "default/lease/edge-node-1"),
    ] {
        let a = ask(&mut edge, op, resource, lease.clone());
        assert_eq!(
            a["content"]["Err"]["ErrStatus"]["code"], 403,
            "{resource}: {a}"
        );
    }
    let leases = c.ok(&["get", "lease", "-A", "-o", "name"]);
    assert_eq!(
        leases.trim(),
        "lease.coordination.k8s.io/edge-node-1",
        "{leases}"
    );

    // What this cloudcore does not serve is answered at once, named, and not logged as a fault.
    let a = ask(
        &mut edge,
        "query",
        "default/serviceaccounttoken/builder",
        Value::Null,
    );
    assert_eq!(a["route"]["operation"], "error", "{a}");
    assert!(
        a["content"]
            .as_str()
            .is_some_and(|m| m.contains("does not serve \"serviceaccounttoken\"")),
        "{a}"
    );
    assert!(
        !c.log()
            .lines()
            .any(|l| l.contains("WARN") && l.contains("serviceaccounttoken")),
        "{}",
        c.log()
    );
}

/// Two nodes on one cloudcore: each is sent its own devices and none of the other's.
#[tokio::test]
async fn two_nodes_each_get_only_their_own_devices() {
    let c = Cloud::start_full("", "");
    let token = token(&c);
    c.ok(&["apply", "-f", path_str(&examples().join("modbus-tcp.yaml"))]);
    let other = "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata:\n  name: press-2\n  namespace: default\nspec:\n  nodeName: edge-node-2\n  deviceModelRef:\n    name: temperature-controller\n  protocol:\n    protocolName: modbus\n    configData: {ip: 127.0.0.1, port: 5021}\n";
    let out = c.kubectl_stdin(&["apply", "-f", "-"], other);
    assert!(out.status.success(), "{}", common::text(&out));
    let mut one = Edge::start(&c, "edge-node-1", &token);
    let mut two = Edge::start(&c, "edge-node-2", &token);
    one.until("oven-1", |v| resource(v) == "default/device/oven-1");
    two.until("press-2", |v| resource(v) == "default/device/press-2");
    tokio::time::sleep(Duration::from_secs(1)).await;
    for e in [&mut one, &mut two] {
        while let Ok(v) = e.lines.try_recv() {
            e.seen.push(v);
        }
    }
    let names = |e: &Edge| -> Vec<String> {
        e.seen
            .iter()
            .filter(|v| v["route"]["operation"] == "insert")
            .map(|v| resource(v).to_string())
            .collect()
    };
    assert!(
        names(&one)
            .iter()
            .all(|r| !r.starts_with("node/") && !r.ends_with("/press-2")),
        "{:?}",
        names(&one)
    );
    assert!(
        names(&two)
            .iter()
            .all(|r| !r.starts_with("node/") && !r.ends_with("/oven-1")),
        "{:?}",
        names(&two)
    );
    // Both share the model, and each got it.
    for e in [&one, &two] {
        assert!(
            names(e).contains(&"default/devicemodel/temperature-controller".to_string()),
            "{:?}",
            names(e)
        );
    }
}

/// A second connection for the same node replaces the first (logged); the newer is served.
#[tokio::test]
async fn a_second_edge_with_the_same_name_replaces_the_first() {
    let c = Cloud::start_full("", "");
    let token = token(&c);
    c.ok(&["apply", "-f", path_str(&examples().join("modbus-tcp.yaml"))]);
    let mut first = Edge::start(&c, "edge-node-1", &token);
    first.until("oven-1", |v| resource(v) == "default/device/oven-1");
    let mut second = Edge::start(&c, "edge-node-1", &token);
    second.until("session", |v| v["connected"] == "edge-node-1");
    first.until("the first session closed", |v| v["closed"].is_string());
    let report = twin_report("edge-node-1", "oven-1", "temperature", "31", 1);
    let id = report.header.id.clone();
    second.send(&serde_json::to_string(&report).expect("json"));
    second.until("the answer", |v| v["header"]["parent_msg_id"] == id);
    assert!(
        c.log()
            .contains("a second connection for this node replaces the first"),
        "{}",
        c.log()
    );
}

/// A node that stops reading: once a frame has waited `keepaliveSeconds` to be written,
/// cloudhub ends its session (instead of holding it and what is queued for it for good); other
/// nodes are served meanwhile; the node's messages stay queued, one per object, and all reach
/// it when it reads again.
#[tokio::test]
async fn a_node_that_stops_reading_is_dropped_and_others_are_served() {
    let c = Cloud::start_full("", "  cloudHub:\n    keepaliveSeconds: 3\n");
    let token = token(&c);
    // 400 devices of about 50 KB (an annotation): 20 MB, more than the sockets buffer.
    let big = "x".repeat(50_000);
    let mut yaml = String::new();
    for i in 0..400 {
        yaml.push_str(&format!(
            "---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata:\n  name: dev-{i:03}\n  namespace: default\n  annotations: {{filler: \"{big}\"}}\nspec:\n  nodeName: edge-node-1\n  deviceModelRef:\n    name: temperature-controller\n  protocol:\n    protocolName: modbus\n    configData: {{ip: 127.0.0.1, port: 5020}}\n"
        ));
    }
    c.ok(&["apply", "-f", path_str(&examples().join("modbus-tcp.yaml"))]);
    let mut stuck = Edge::start_args(&c, "edge-node-1", &token, &["--no-read"]);
    stuck.until("connected", |v| v.get("connected").is_some());
    let out = c.kubectl_stdin(&["create", "-f", "-"], &yaml);
    assert!(out.status.success(), "{}", common::text(&out));

    // Another node is served while edge-node-1 is stuck.
    let other = "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata:\n  name: press-2\n  namespace: default\nspec:\n  nodeName: edge-node-2\n  deviceModelRef:\n    name: temperature-controller\n  protocol:\n    protocolName: modbus\n    configData: {ip: 127.0.0.1, port: 5021}\n";
    let out = c.kubectl_stdin(&["apply", "-f", "-"], other);
    assert!(out.status.success(), "{}", common::text(&out));
    let mut two = Edge::start(&c, "edge-node-2", &token);
    // press-2 comes behind the 400 large devices in the watch (20 MB to decode first, slow in
    // a debug build on a saturated machine): what matters is that it comes while edge-node-1
    // is stuck.
    two.until_for(60, "press-2", |v| resource(v) == "default/device/press-2");

    // The stuck session is ended by the cloud, for that reason.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !c.log().contains("stopped reading") {
        assert!(
            Instant::now() < deadline,
            "the stuck session was not ended: {}",
            c.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        c.log().lines().any(|l| l.contains("node disconnected")
            && l.contains("edge-node-1")
            && l.contains("stopped reading")),
        "{}",
        c.log()
    );
    drop(stuck);

    // Reading again, the node gets every device.
    let mut back = Edge::start(&c, "edge-node-1", &token);
    for i in [0, 199, 399] {
        let name = format!("default/device/dev-{i:03}");
        back.until(&name, |v| resource(v) == name);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        while let Ok(v) = back.lines.try_recv() {
            back.seen.push(v);
        }
        let got: std::collections::BTreeSet<String> = back
            .seen
            .iter()
            .filter(|v| resource(v).contains("/device/dev-"))
            .map(|v| resource(v).to_string())
            .collect();
        if got.len() == 400 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of 400 devices came",
            got.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A node that sends frames with 1 MiB resource names and never reads: each is dropped as it
/// comes (nothing of it is kept for the session), the cloud serves another node meanwhile, and
/// once the node leaves the cloud holds no more than before (the probe that found ~51 MiB held).
#[tokio::test]
async fn a_node_that_sends_huge_names_and_never_reads_leaves_nothing_held() {
    let c = Cloud::start_full("", "  cloudHub:\n    keepaliveSeconds: 3\n");
    let token = token(&c);
    c.ok(&["apply", "-f", path_str(&examples().join("modbus-tcp.yaml"))]);
    let mut hostile = Edge::start_args(&c, "edge-node-1", &token, &["--no-read"]);
    hostile.until("connected", |v| v.get("connected").is_some());
    let before = c.rss_kb().expect("cloudcore's VmRSS");
    let name = "n".repeat(1 << 20);
    for i in 0..50 {
        let mut report = twin_report("edge-node-1", "oven-1", "temperature", "1", i + 1);
        report.route.resource = format!("node/edge-node-1/default/device/{name}{i}");
        hostile.send(&serde_json::to_string(&report).expect("json"));
    }
    // Meanwhile another node is served.
    let other = "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata:\n  name: press-2\n  namespace: default\nspec:\n  nodeName: edge-node-2\n  deviceModelRef:\n    name: temperature-controller\n  protocol:\n    protocolName: modbus\n    configData: {ip: 127.0.0.1, port: 5021}\n";
    let out = c.kubectl_stdin(&["apply", "-f", "-"], other);
    assert!(out.status.success(), "{}", common::text(&out));
    let mut two = Edge::start(&c, "edge-node-2", &token);
    // press-2 comes behind the 400 large devices in the watch (20 MB to decode first, slow in
    // a debug build on a saturated machine): what matters is that it comes while edge-node-1
    // is stuck.
    two.until_for(60, "press-2", |v| resource(v) == "default/device/press-2");
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.log().matches("too long; dropped unanswered").count() < 50 {
        assert!(
            Instant::now() < deadline,
            "the 50 frames were not all dropped: {}",
            c.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let during = c.rss_kb().expect("cloudcore's VmRSS");
    drop(hostile);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !c
        .log()
        .lines()
        .any(|l| l.contains("node disconnected") && l.contains("edge-node-1"))
    {
        assert!(Instant::now() < deadline, "{}", c.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = c.rss_kb().expect("cloudcore's VmRSS");
    eprintln!(
        "cloudcore VmRSS: {before} kB before, {during} kB with 50 MiB of names sent, {after} kB after the node left"
    );
    // 50 MiB went through; what stays is a few buffers, not the names.
    assert!(after < before + 20 * 1024, "{before} kB -> {after} kB");
}

/// Every file with data or secrets is its owner's only, whatever the umask: the API's database
/// (every Secret), the keys, the tokens, the admin kubeconfig; and a data directory opened up by
/// hand is closed again at the next start.
#[test]
fn the_data_is_private_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| {
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o777
    };
    let mut c = Cloud::start_after_setup("umask 000");
    let data = c.data();
    c.ok(&["create", "secret", "generic", "s", "--from-literal=k=v"]);
    let check = |c: &Cloud| {
        assert_eq!(mode(&data), 0o700, "{}", data.display());
        assert_eq!(mode(&data.join("pki")), 0o700);
        let mut files = vec![data.join("tokens.csv"), data.join("admin.kubeconfig")];
        for db in ["api.db", "api.db-wal", "api.db-shm"] {
            if data.join(db).exists() || db == "api.db" {
                files.push(data.join(db));
            }
        }
        for entry in std::fs::read_dir(data.join("pki")).expect("pki") {
            let p = entry.expect("entry").path();
            if p.extension().is_some_and(|e| e == "key") {
                files.push(p);
            }
        }
        for f in &files {
            assert_eq!(mode(f), 0o600, "{}: {}", f.display(), c.log());
        }
    };
    check(&c);
    c.stop();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).expect("opened");
    std::fs::set_permissions(data.join("api.db"), std::fs::Permissions::from_mode(0o644))
        .expect("opened");
    c.restart();
    check(&c);
    assert!(c.ok(&["get", "secret", "s"]).contains('s'));
}

fn cloudcore_token(c: &Cloud, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cloudcore"))
        .arg("token")
        .args(args)
        .arg("--config")
        .arg(c.dir.join("cloudcore.yaml"))
        .output()
        .expect("cloudcore token runs");
    assert!(out.status.success(), "{}", common::text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A join token is not a master key: it can be limited to one node name and a number of joins,
/// it is listed (never shown again), and revoking it refuses its next join at once.
#[tokio::test]
async fn join_tokens_are_limited_listed_and_revoked() {
    let c = Cloud::start_full("", "");
    let refused = |node: &str, token: &str| {
        let out = edge_cmd(&c, node, token).output().expect("python");
        assert!(!out.status.success(), "{node} joined");
        common::text(&out)
    };
    // A name that is no Node's name gets no certificate (CN=system:node:system:masters).
    let any = token(&c);
    for bad in ["system:masters", "a/b", "Edge-A"] {
        let why = refused(bad, &any);
        assert!(
            why.contains("code: 400") && why.contains("is not a valid Node name"),
            "{bad}: {why}"
        );
    }
    let one = cloudcore_token(&c, &["create", "--node", "edge-a", "--joins", "1"]);
    let why = refused("edge-b", &one);
    assert!(
        why.contains("code: 403") && why.contains("is for node \"edge-a\" only, not \"edge-b\""),
        "{why}"
    );
    let mut a = Edge::start(&c, "edge-a", &one);
    a.until("join", |v| v["joined"].is_string());
    drop(a);
    let why = refused("edge-a", &one);
    assert!(
        why.contains("code: 401") && why.contains("join(s) already"),
        "{why}"
    );

    let listed = cloudcore_token(&c, &["list"]);
    assert!(
        listed.contains("edge-a") && listed.contains("1/1"),
        "{listed}"
    );
    assert!(
        !listed.contains(&any),
        "tokens are never shown again: {listed}"
    );
    let id = listed
        .lines()
        .find(|l| l.contains("(any)"))
        .and_then(|l| l.split_whitespace().next())
        .expect("the unlimited token's id")
        .to_string();
    let mut b = Edge::start(&c, "edge-b", &any);
    b.until("join", |v| v["joined"].is_string());
    drop(b);
    assert!(cloudcore_token(&c, &["revoke", &id]).contains("revoked"));
    let why = refused("edge-c", &any);
    assert!(
        why.contains("code: 401") && why.contains("was revoked"),
        "{why}"
    );
    assert!(cloudcore_token(&c, &["list"]).contains("revoked"));
}

/// A join cannot take over the name of a node that is joined; `cloudcore node revoke` ends that
/// node's certificate (its next session is refused) and lets the name join again.
#[tokio::test]
async fn a_join_cannot_take_over_a_joined_node_until_its_certificate_is_revoked() {
    let c = Cloud::start_full("", "");
    let token = token(&c);
    let mut first = Edge::start(&c, "edge-node-1", &token);
    first.until("session", |v| v["connected"] == "edge-node-1");
    // Another machine with a valid token, claiming the same name.
    let out = edge_cmd(&c, "edge-node-1", &token)
        .output()
        .expect("python");
    let why = common::text(&out);
    assert!(
        !out.status.success() && why.contains("code: 409") && why.contains("is joined"),
        "{why}"
    );
    drop(first);
    // It renews its certificate with itself, as edgehub does before expiry, and holds a
    // session on the new one.
    let mut renewed = Edge::start_args(&c, "edge-node-1", &token, &["--renew"]);
    renewed.until("renewal", |v| v["renewed"].is_string());
    renewed.until("session", |v| v["connected"] == "edge-node-1");
    // Its certificates on the embedded API (its own Node, as the Node authorizer allows),
    // the one from before the renewal and the new one.
    let state = c.dir.join("edge-edge-node-1");
    let kubectl_as = |name: &str, args: &[&str]| {
        let mut cmd = Command::new(common::kubectl_bin());
        cmd.arg(format!("--server=https://127.0.0.1:{}", c.port))
            .arg(format!(
                "--certificate-authority={}",
                state.join("ca.crt").display()
            ))
            .arg(format!(
                "--client-certificate={}",
                state.join(format!("{name}.crt")).display()
            ))
            .arg(format!(
                "--client-key={}",
                state.join(format!("{name}.key")).display()
            ))
            .args(args)
            .env("HOME", &c.dir);
        cmd
    };
    let as_node = |name: &str| {
        let out = kubectl_as(name, &["auth", "can-i", "get", "nodes/edge-node-1"])
            .output()
            .expect("kubectl runs");
        (
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            common::text(&out),
        )
    };
    for name in ["edge", "edge-before-renewal"] {
        assert_eq!(as_node(name).0, "yes", "{name}");
    }
    // A watch of its Node held open with its certificate.
    let mut watch = kubectl_as(
        "edge",
        &[
            "get",
            "node",
            "edge-node-1",
            "--watch",
            "--request-timeout=0",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("kubectl watch runs");
    std::thread::sleep(Duration::from_secs(1));
    assert!(matches!(watch.try_wait(), Ok(None)), "the watch is open");
    let out = Command::new(env!("CARGO_BIN_EXE_cloudcore"))
        .args(["node", "revoke", "edge-node-1", "--config"])
        .arg(c.dir.join("cloudcore.yaml"))
        .output()
        .expect("cloudcore node revoke runs");
    assert!(out.status.success(), "{}", common::text(&out));
    // Both certificates authenticate nobody on the API; the open session and the open watch
    // end at once; neither certificate renews; a new session is refused.
    for name in ["edge", "edge-before-renewal"] {
        let (_, refused) = as_node(name);
        assert!(refused.contains("Unauthorized"), "{name}: {refused}");
    }
    renewed.until("the session ended by the revocation", |v| {
        v["closed"].is_string() || v["refused"].is_string()
    });
    sim::poll::eventually(20, "the node's watch ended", || {
        watch.try_wait().ok().flatten()
    });
    let out = edge_cmd(&c, "edge-node-1", &token)
        .args(["--renew", "--state"])
        .arg(&state)
        .output()
        .expect("python");
    let why = common::text(&out);
    assert!(
        !out.status.success() && why.contains("code: 401") && why.contains("was revoked"),
        "{why}"
    );
    let mut revoked = Edge::start(&c, "edge-node-1", &token);
    revoked.until("the refused session", |v| {
        v["closed"].is_string() || v["refused"].is_string()
    });
    // A new join takes the name.
    let fresh = c.dir.join("a-new-machine");
    let fresh = fresh.to_str().expect("utf-8");
    let mut second = Edge::start_args(&c, "edge-node-1", &token, &["--state", fresh]);
    second.until("session", |v| v["connected"] == "edge-node-1");
}
