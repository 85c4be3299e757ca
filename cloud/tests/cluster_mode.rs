//! `cloudcore` given a `kubeconfig:` works against that cluster through kube-rs (here another
//! cloudcore's embedded API stands in for a cluster) and leaves its own API off.

mod common;

use common::{Cloud, path_str};
use std::process::{Command, Stdio};

fn run_with(dir: &std::path::Path, config: &str) -> std::process::Child {
    let file = dir.join("cluster-mode.yaml");
    std::fs::write(&file, config).expect("config");
    Command::new(env!("CARGO_BIN_EXE_cloudcore"))
        .arg("--config")
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cloudcore starts")
}

#[test]
fn installs_its_crds_on_the_cluster_of_its_kubeconfig() {
    let cluster = Cloud::start();
    cluster.ok(&["delete", "crd", "objectsyncs.reliablesyncs.kubeedge.io"]);
    assert!(
        !cluster
            .kubectl(&["get", "crd", "objectsyncs.reliablesyncs.kubeedge.io"])
            .status
            .success()
    );
    let dir = tempfile::tempdir().expect("dir");
    let child = run_with(
        dir.path(),
        &format!(
            "kubeconfig: {}\nmodules:\n  apiserver:\n    enable: false\n  deviceController:\n    enable: false\n  cloudHub:\n    enable: false\n  metrics:\n    listen: \"\"\n",
            path_str(&cluster.kubeconfig)
        ),
    );
    sim::poll::eventually(20, "cloudcore's CRDs on the cluster", || {
        (cluster.kubectl(&["get", "crd", "objectsyncs.reliablesyncs.kubeedge.io"]))
            .status
            .success()
            .then_some(())
    });
    assert!(
        !dir.path().join("cloudcore-data").exists(),
        "no embedded API data made"
    );
    let status = terminated(child).wait().expect("exits");
    assert!(status.success(), "{status}");
}

#[test]
fn a_bad_kubeconfig_is_named() {
    let dir = tempfile::tempdir().expect("dir");
    let missing = dir.path().join("nope.kubeconfig");
    let child = run_with(dir.path(), &format!("kubeconfig: {}\n", path_str(&missing)));
    let out = child.wait_with_output().expect("exits");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot read kubeconfig {}", missing.display())),
        "{err}"
    );
    let child = run_with(dir.path(), "modules:\n  apiserver:\n    listen: 6443\n");
    let out = child.wait_with_output().expect("exits");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cluster-mode.yaml: key `modules.apiserver.listen`"),
        "{err}"
    );
}

/// Two cloudcore replicas against `cluster`, started one after the other.
struct Replicas {
    dirs: Vec<tempfile::TempDir>,
    children: Vec<std::process::Child>,
    /// Each one's certificate port.
    cert_ports: Vec<u16>,
}

/// `child`, sent SIGTERM (as systemd stops a service).
fn terminated(child: std::process::Child) -> std::process::Child {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    child
}

fn replicas(cluster: &Cloud) -> Replicas {
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().expect("dir")).collect();
    let mut children = Vec::new();
    let mut cert_ports = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let cert_port = common::free_port();
        let config = format!(
            "kubeconfig: {}\nmodules:\n  apiserver:\n    enable: false\n  cloudHub:\n    listen: \"127.0.0.1:{}\"\n    certListen: \"127.0.0.1:{cert_port}\"\n  leaderElection:\n    identity: replica-{i}\n  metrics:\n    listen: \"\"\n",
            path_str(&cluster.kubeconfig),
            common::free_port(),
        );
        children.push(run_with(dir.path(), &config));
        cert_ports.push(cert_port);
        // The first makes the fleet's CA before the second looks for it.
        let ca = dir.path().join("cloudcore-data/pki/ca.crt");
        sim::poll::eventually(30, &format!("replica {i}'s CA"), || {
            ca.exists().then_some(())
        });
    }
    Replicas {
        dirs,
        children,
        cert_ports,
    }
}

/// Two replicas against one cluster (`kubeconfig:`): the first one's CA is the fleet's (a
/// Secret in the cluster), the second takes it; one of them holds the leader Lease.
#[test]
fn replicas_against_a_cluster_share_the_ca_and_elect_one_leader() {
    let cluster = Cloud::start();
    let Replicas { dirs, children, .. } = replicas(&cluster);
    let holder = sim::poll::eventually_or(30, "a leader", || {
        let holder = "get lease -n kubeedge cloudcore -o jsonpath={.spec.holderIdentity}";
        let out = cluster.kubectl(&holder.split(' ').collect::<Vec<_>>());
        let h = String::from_utf8_lossy(&out.stdout).to_string();
        if h.starts_with("replica-") {
            Ok(h)
        } else {
            Err(h)
        }
    });
    assert!(holder == "replica-0" || holder == "replica-1", "{holder}");
    let ca = |d: &tempfile::TempDir| {
        std::fs::read_to_string(d.path().join("cloudcore-data/pki/ca.crt")).expect("ca.crt")
    };
    assert_eq!(ca(&dirs[0]), ca(&dirs[1]), "one CA for the fleet");
    for c in children {
        let _ = terminated(c).wait();
    }
}

/// A one-join token given to two replicas at the same moment joins one node, not two: the
/// join is claimed through the cluster's API, where a create is atomic, and the join records
/// (merged between replicas a second later) cannot both admit it.
#[test]
fn a_one_join_token_joins_once_across_replicas() {
    let cluster = Cloud::start();
    let Replicas {
        dirs,
        children,
        cert_ports,
    } = replicas(&cluster);
    let cloudcore = |i: usize, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_cloudcore"))
            .args(args)
            .arg("--config")
            .arg(dirs[i].path().join("cluster-mode.yaml"))
            .output()
            .expect("cloudcore runs");
        assert!(out.status.success(), "{}", common::text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let token = cloudcore(0, &["token", "create", "--joins", "1"]);
    let listed = cloudcore(0, &["token", "list"]);
    let id = listed
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().next())
        .expect("the token's id")
        .to_string();
    // The other replica knows the token once the records are merged.
    sim::poll::eventually(30, "the token on replica 1", || {
        cloudcore(1, &["token", "list"]).contains(&id).then_some(())
    });
    for port in &cert_ports {
        sim::poll::eventually(30, "the certificate port", || {
            std::net::TcpStream::connect(("127.0.0.1", *port)).ok()
        });
    }
    let joins: Vec<std::process::Output> = std::thread::scope(|s| {
        let started: Vec<_> = cert_ports
            .iter()
            .enumerate()
            .map(|(i, port)| {
                let token = token.clone();
                s.spawn(move || {
                    Command::new(common::python())
                        .arg(common::workspace().join("cloud/tests/edge/edge.py"))
                        .args(["--cert-url", &format!("https://127.0.0.1:{port}")])
                        .args(["--hub-url", "wss://127.0.0.1:1"])
                        .args(["--node", &format!("edge-{i}"), "--token", &token])
                        .output()
                        .expect("python runs")
                })
            })
            .collect();
        started
            .into_iter()
            .map(|h| h.join().expect("a join"))
            .collect()
    });
    let joined: Vec<bool> = joins
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("\"joined\""))
        .collect();
    assert_eq!(
        joined.iter().filter(|j| **j).count(),
        1,
        "{:?}",
        joins.iter().map(common::text).collect::<Vec<_>>()
    );
    let refused = joins
        .iter()
        .zip(&joined)
        .find(|(_, j)| !**j)
        .map(|(o, _)| common::text(o))
        .unwrap_or_default();
    assert!(
        refused.contains("code: 401") && refused.contains("join(s) already"),
        "{refused}"
    );
    for c in children {
        let _ = terminated(c).wait();
    }
}

/// Against a real cluster the cluster's API server stores Devices, so cloudcore serves it a
/// validating webhook: an `AdmissionReview` as kube-apiserver posts it, with a desired value
/// the model cannot take, is refused with the field path and the reason; one that fits, or an
/// update that leaves a stored value alone, is allowed. (The stand-in cluster here does not
/// call webhooks itself: the reviews are posted as kube-apiserver would.)
#[test]
fn the_admission_webhook_refuses_desired_values_that_cannot_land() {
    let cluster = Cloud::start();
    let example = common::workspace().join("examples/modbus-tcp.yaml");
    cluster.ok(&["apply", "-f", path_str(&example)]);
    let dir = tempfile::tempdir().expect("dir");
    let cert_port = common::free_port();
    let child = run_with(
        dir.path(),
        &format!(
            "kubeconfig: {}\nmodules:\n  apiserver:\n    enable: false\n  deviceController:\n    enable: false\n  cloudHub:\n    listen: \"127.0.0.1:{}\"\n    certListen: \"127.0.0.1:{cert_port}\"\n    advertiseAddress: [127.0.0.1]\n  metrics:\n    listen: \"\"\n",
            path_str(&cluster.kubeconfig),
            common::free_port(),
        ),
    );
    let ca = dir.path().join("cloudcore-data/pki/ca.crt");
    sim::poll::eventually(30, "the webhook's port", || {
        (ca.exists() && std::net::TcpStream::connect(("127.0.0.1", cert_port)).is_ok())
            .then_some(())
    });
    let device = |setpoint: &str, heater: &str| {
        serde_json::json!({
            "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
            "metadata": {"name": "oven-1", "namespace": "default"},
            "spec": {"deviceModelRef": {"name": "temperature-controller"},
                "nodeName": "edge-node-1", "protocol": {"protocolName": "modbus"},
                "properties": [
                    {"name": "temperature"},
                    {"name": "setpoint", "desired": {"value": setpoint}},
                    {"name": "heater-on", "desired": {"value": heater}}]}})
    };
    let review = |object: serde_json::Value, old: Option<serde_json::Value>| {
        let gvk = serde_json::json!({"group": "devices.kubeedge.io", "version": "v1beta1", "kind": "Device"});
        let body = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": gvk, "requestKind": gvk,
                "resource": {"group": "devices.kubeedge.io", "version": "v1beta1", "resource": "devices"},
                "name": "oven-1", "namespace": "default",
                "operation": if old.is_some() { "UPDATE" } else { "CREATE" },
                "userInfo": {"username": "admin", "groups": ["system:masters"]},
                "object": object, "oldObject": old, "dryRun": false}});
        let script = "import json,ssl,sys,urllib.request\n\
            ctx=ssl.create_default_context(cafile=sys.argv[2])\n\
            req=urllib.request.Request(sys.argv[1],data=sys.stdin.buffer.read(),headers={'Content-Type':'application/json'})\n\
            print(urllib.request.urlopen(req,context=ctx,timeout=10).read().decode())\n";
        let mut python = Command::new(common::python());
        python
            .args(["-c", script])
            .arg(format!("https://127.0.0.1:{cert_port}/admission/devices"))
            .arg(&ca);
        let out = sim::output_with(&mut python, body.to_string().as_bytes());
        assert!(out.status.success(), "{}", common::text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a review back");
        assert_eq!(
            v["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002",
            "{v}"
        );
        v["response"].clone()
    };

    let r = review(device("130", "maybe"), None);
    assert_eq!(r["allowed"], false, "{r}");
    assert_eq!(r["status"]["code"], 422, "{r}");
    let message = r["status"]["message"].as_str().unwrap_or_default();
    for part in [
        "spec.properties[1].desired.value: Invalid value: \"130\": 130 is above the model maximum 120",
        "spec.properties[2].desired.value: Invalid value: \"maybe\"",
    ] {
        assert!(message.contains(part), "{part} in {message}");
    }
    let r = review(device("85", "true"), None);
    assert_eq!(r["allowed"], true, "{r}");
    // 130 stored before (a model changed since, say): a write of another property passes.
    let r = review(device("130", "false"), Some(device("130", "true")));
    assert_eq!(r["allowed"], true, "{r}");
    let r = review(device("140", "false"), Some(device("130", "true")));
    assert_eq!(r["allowed"], false, "{r}");

    // What an anonymous client sent to knock it over: eight 4 MiB reviews at once, with their
    // length and chunked (curl). Each is refused (413) and cloudcore's peak memory hardly moves
    // (it took 440-580 MiB more when it parsed them whole).
    let status = |pid: u32, key: &str| -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            })
            .unwrap_or(0)
    };
    let before = status(child.id(), "VmRSS:");
    let big = dir.path().join("big-review.json");
    // Just under the old 4 MiB cap, as small JSON values (each a 32-byte value once parsed).
    let filler = vec!["0"; (4 << 20) / 2 - 100].join(",");
    std::fs::write(
        &big,
        format!(r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"object":{{"kind":"Device","spec":{{"x":[{filler}]}}}}}}}}}}"#),
    )
    .expect("write");
    let url = format!("https://127.0.0.1:{cert_port}/admission/devices");
    let curls: Vec<_> = (0..8)
        .map(|i| {
            let mut c = Command::new("curl");
            c.args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
                .arg(&ca)
                .args(["-H", "Content-Type: application/json", "--data-binary"])
                .arg(format!("@{}", big.display()))
                .arg(&url);
            if i % 2 == 1 {
                c.args(["-H", "Transfer-Encoding: chunked"]);
            }
            c.stdout(Stdio::piped()).spawn().expect("curl")
        })
        .collect();
    for c in curls {
        let out = c.wait_with_output().expect("curl");
        let code = String::from_utf8_lossy(&out.stdout).into_owned();
        // 413 (or 429/503 while others hold the slots); or, when the server answered before
        // curl finished sending, the connection reset under curl (000, or 100 when curl had
        // only seen its `Expect: 100-continue` answered): refused either way, never judged
        // (a judged review is 200, or 400 for this one).
        assert!(
            ["413", "000", "100", "429", "503"].contains(&code.as_str()),
            "{code}"
        );
    }
    let peak = status(child.id(), "VmHWM:");
    assert!(
        peak < before + 100 * 1024,
        "cloudcore grew from {before} kB to a peak of {peak} kB"
    );
    // Two clients that send their headers and then hold their bodies take this address's
    // slots: a third review from it is refused at once (429), the held ones time out (408),
    // and then a review is judged again.
    let hold = "import socket,ssl,sys,time\n\
        ctx=ssl.create_default_context(cafile=sys.argv[2])\n\
        held=[]\n\
        for _ in range(2):\n\
        \x20s=ctx.wrap_socket(socket.create_connection(('127.0.0.1',int(sys.argv[1]))),server_hostname='127.0.0.1')\n\
        \x20s.sendall(b'POST /admission/devices HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nContent-Type: application/json\\r\\nContent-Length: 1000\\r\\n\\r\\n{')\n\
        \x20held.append(s)\n\
        print('held',flush=True)\n\
        for s in held: print(s.recv(200).split(b'\\r\\n')[0].decode(),flush=True)\n";
    let mut holder = Command::new(common::python())
        .args(["-c", hold, &cert_port.to_string()])
        .arg(&ca)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python runs");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(
        holder.stdout.take().expect("stdout"),
    ));
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("held"));
    // Once the held requests reach the handler (their headers read), a third is refused;
    // until then it is judged (400: `{}` is no review). Asked until refused, well within the
    // held ones' 5 s.
    let started = std::time::Instant::now();
    let third = loop {
        let out = Command::new("curl")
            .args(["-s", "-w", " %{http_code}", "--cacert"])
            .arg(&ca)
            .args([
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                "{}",
            ])
            .arg(&url)
            .output()
            .expect("curl");
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        if said.ends_with(" 429") || started.elapsed() > std::time::Duration::from_secs(4) {
            break said;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(
        third.ends_with(" 429") && third.contains("127.0.0.1"),
        "{third}"
    );
    for _ in 0..2 {
        let line = lines.next().and_then(Result::ok).unwrap_or_default();
        assert!(line.contains("408"), "{line}");
    }
    let _ = holder.wait();
    let r = review(device("85", "true"), None);
    assert_eq!(r["allowed"], true, "{r}");

    // The stand-in cluster does not serve ValidatingWebhookConfigurations: cloudcore says it
    // could not register the webhook, and keeps running.
    let out = terminated(child).wait_with_output().expect("exits");
    assert!(out.status.success(), "{}", common::text(&out));
    let log = common::text(&out);
    assert!(
        log.contains("the webhook is served but not registered"),
        "{log}"
    );
}
