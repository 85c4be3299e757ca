//! `kubectl logs`, `exec`, `attach` and `top` of pods on edge nodes, through the streaming tunnel
//! each node opens beside its session: the real `kubectl` against `cloudcore`, two `edgecore`s
//! joined to it, each running pods on a real containerd of its own (busybox). Logs whole,
//! `--tail`, `--timestamps`, `--limit-bytes`, `--since`, `-f` (lines arriving while it runs, and
//! clients that go away closing their streams on the node), `--previous` after a crash; exec
//! with its exit code, stderr, stdin and a terminal of kubectl's size, over a websocket and over
//! SPDY, with each kubectl at hand; attach; top pod and node; port-forward; and a real cluster's
//! way (`sim::kubelet_calls` playing kube-apiserver against cloudcore's kubelet endpoints);
//! refused: a user without `pods/log`, `pods/exec` or the metrics (403), a node's own
//! certificate (403), a node away or revoked (said, with the node's name; a followed stream cut
//! ends kubectl with an error).
//!
//! Runs as root (containerd); `.ci/run` installs containerd, runc, umoci and busybox-static.

use sim::containerd::Containerd;
use sim::stack::{Cloud, kubectl_bin};
use sim::{Node, bin, eventually};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A user `reader` who may get and list pods and nothing of their streams.
const READER: &str = include_str!("manifests/pod_streams_reader.yaml");

const PODS: &str = include_str!("manifests/pod_streams_pods.yaml");

/// The highest `tick N` in a log.
fn last_tick(log: &str) -> Option<u64> {
    log.lines()
        .filter_map(|l| l.strip_prefix("tick ")?.trim().parse().ok())
        .max()
}

/// A kubeconfig for the API with `node`'s own certificate, written in `dir`.
fn node_kubeconfig(cloud: &Cloud, node: &Node, dir: &Path) -> std::path::PathBuf {
    let certs = node.dir.path().join("data/certs");
    let path = dir.join("node.kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"https://127.0.0.1:{}\", insecure-skip-tls-verify: true}}\nusers:\n- name: node\n  user: {{client-certificate: \"{}\", client-key: \"{}\"}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: node}}\ncurrent-context: c\n",
            cloud.api,
            certs.join("edge.crt").display(),
            certs.join("edge.key").display()
        ),
    )
    .expect("write");
    path
}

/// kubectl `args` run with `node`'s own certificate: whether it succeeded, and its stderr.
fn with_node_cert(cloud: &Cloud, node: &Node, dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(kubectl_bin())
        .arg("--kubeconfig")
        .arg(node_kubeconfig(cloud, node, dir))
        .args(args)
        .output()
        .expect("kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn running(cloud: &Cloud, pod: &str) -> bool {
    cloud
        .kubectl(&["get", "pod", pod, "-o", "jsonpath={.status.phase}"])
        .1
        == "Running"
}

#[test]
fn kubectl_logs_reach_edge_pods_through_the_tunnel_and_nothing_else_does() {
    let rt_dir = tempfile::tempdir().expect("tempdir");
    let rt = Containerd::start(rt_dir.path());
    rt.import_busybox();
    let edgecore = bin("edgecore");
    let bins = edgecore.parent().map(Path::to_path_buf).expect("bin dir");
    let cloud = Cloud::start();
    let edged = format!(
        "edged: {{runtimeEndpoint: \"unix://{}\", syncPeriodMs: 500, initialBackoffMs: 1000, maxBackoffMs: 2000}}\n",
        rt.socket.display()
    );
    let mut node = Node::start_named(
        &bins,
        "edge-node-1",
        "",
        &format!("{}  metricsSeconds: 1\n{edged}", cloud.edge_config()),
    );
    // A second node on a containerd of its own, with a pod of its own.
    let rt2_dir = tempfile::tempdir().expect("tempdir");
    let rt2 = Containerd::start(rt2_dir.path());
    rt2.import_busybox();
    let _node2 = Node::start_named(
        &bins,
        "edge-node-2",
        "",
        &format!(
            "{}  metricsSeconds: 1\nedged: {{runtimeEndpoint: \"unix://{}\", syncPeriodMs: 500}}\n",
            cloud.edge_config(),
            rt2.socket.display()
        ),
    );
    let applied = rt_dir.path().join("pods.yaml");
    let other = "---\napiVersion: v1\nkind: Pod\nmetadata: {name: other}\nspec:\n  nodeName: edge-node-2\n  hostNetwork: true\n  containers:\n  - {name: main, image: edged-test/busybox:1, imagePullPolicy: Never, command: [sh, -c, 'echo on the second node; sleep 3600']}\n";
    std::fs::write(&applied, format!("{PODS}{READER}{other}")).expect("write");
    cloud.ok(&["apply", "-f", applied.to_str().expect("path")]);
    eventually(120, "the ticker pod Running", || {
        running(&cloud, "ticker").then_some(())
    });
    // Each node's pods through that node's tunnel.
    eventually(120, "the second node's pod's log", || {
        let (ok, log) = cloud.kubectl(&["logs", "other"]);
        (ok && log == "on the second node\n").then_some(())
    });
    let (ok, said) = cloud.kubectl(&["exec", "other", "--", "echo", "here"]);
    assert!(ok && said == "here\n", "{said}");

    // The whole log, then its parts as kubectl's flags ask.
    // Some seconds of it, for --since=1s to leave some out.
    let whole = eventually(60, "tick 15 in kubectl logs", || {
        let (ok, log) = cloud.kubectl(&["logs", "ticker"]);
        (ok && last_tick(&log).is_some_and(|n| n >= 15)).then_some(log)
    });
    assert!(whole.starts_with("tick 0\ntick 1\n"), "{whole}");
    let tail = cloud.ok(&["logs", "ticker", "--tail=2"]);
    assert_eq!(tail.lines().count(), 2, "{tail}");
    assert!(tail.lines().all(|l| l.starts_with("tick ")), "{tail}");
    let stamped = cloud.ok(&["logs", "ticker", "--timestamps", "--tail=1"]);
    let (time, text) = stamped.trim_end().split_once(' ').expect("time, text");
    assert!(
        time.len() >= 20 && time.as_bytes()[4] == b'-' && time.contains('T'),
        "{stamped}"
    );
    assert!(text.starts_with("tick "), "{stamped}");
    let limited = cloud.ok(&["logs", "ticker", "--limit-bytes=6"]);
    assert_eq!(limited, "tick 0");
    // Lines of the last second are a few; of the last hour, all of them.
    let recent = cloud.ok(&["logs", "ticker", "--since=1s"]);
    let hour = cloud.ok(&["logs", "ticker", "--since=1h"]);
    assert!(
        recent.lines().count() < hour.lines().count() && hour.starts_with("tick 0\n"),
        "1s: {recent}\n1h: {hour}"
    );
    let (ok, bad) = cloud.kubectl(&["logs", "ticker", "-c", "other"]);
    assert!(
        !ok && bad.contains("container other is not valid for pod ticker"),
        "{bad}"
    );

    // Followed: lines written after kubectl started arrive while it runs.
    let kubeconfig = cloud.kubeconfig();
    let follow = |pod: &str| {
        Command::new(kubectl_bin())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["logs", "-f", pod])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl logs -f")
    };
    let start = last_tick(&cloud.ok(&["logs", "ticker"])).unwrap_or(0);
    let mut f = follow("ticker");
    let mut lines = BufReader::new(f.stdout.take().expect("stdout")).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut newest = 0;
    while newest < start + 10 && Instant::now() < deadline {
        match lines.next() {
            Some(Ok(l)) => newest = last_tick(&l).unwrap_or(newest),
            _ => break,
        }
    }
    assert!(
        newest >= start + 10,
        "kubectl logs -f went from tick {start} to tick {newest} only"
    );
    let _ = f.kill();
    let _ = f.wait();
    // Clients that go away close their streams on the node: more than the node's limit (16)
    // come and go, and a log is still read.
    // (A stream is closed once its next bytes find the client gone: a moment, so each one is
    // tried until it opens; one never closed would leave no room after 16.)
    for i in 0..20 {
        eventually(30, &format!("follower {i} reads a line"), || {
            let mut f = follow("ticker");
            let mut out = BufReader::new(f.stdout.take().expect("stdout"));
            let mut first = String::new();
            let _ = out.read_line(&mut first);
            let _ = f.kill();
            let _ = f.wait();
            first.starts_with("tick ").then_some(())
        });
    }
    eventually(30, "a log read after 21 followers went away", || {
        let (ok, log) = cloud.kubectl(&["logs", "ticker", "--tail=1"]);
        (ok && log.starts_with("tick ")).then_some(())
    });
    // One user holds at most half of a node's streams: a viewer's ninth `logs -f` is refused
    // naming the limit, while the admin still reads the log (sixteen of one viewer's locked
    // everyone out before).
    cloud.ok(&[
        "create",
        "rolebinding",
        "viewer-view",
        "--clusterrole=view",
        "--user=viewer",
    ]);
    let follow_as_viewer = || {
        Command::new(kubectl_bin())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["logs", "-f", "ticker", "--as", "viewer"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl logs -f")
    };
    let mut held = Vec::new();
    for i in 0..8 {
        let mut f = follow_as_viewer();
        let mut out = BufReader::new(f.stdout.take().expect("stdout"));
        let mut first = String::new();
        let _ = out.read_line(&mut first);
        assert!(
            first.starts_with("tick "),
            "viewer's follower {i}: {first:?}"
        );
        held.push((f, out));
    }
    let (ok, refused) = cloud.kubectl(&["logs", "ticker", "--tail=1", "--as", "viewer"]);
    assert!(
        !ok && refused.contains("the most one user may hold on a node"),
        "{refused}"
    );
    let (ok, log) = cloud.kubectl(&["logs", "ticker", "--tail=1"]);
    assert!(
        ok && log.starts_with("tick "),
        "the admin is not locked out: {log}"
    );
    for (mut f, _) in held {
        let _ = f.kill();
        let _ = f.wait();
    }
    eventually(
        30,
        "the viewer reads again once its followers went away",
        || {
            let (ok, log) = cloud.kubectl(&["logs", "ticker", "--tail=1", "--as", "viewer"]);
            (ok && log.starts_with("tick ")).then_some(())
        },
    );
    // The node counts them: its tunnel open, every stream opened, none left open.
    let metrics = eventually(30, "no stream left open on the node", || {
        let text = sim::agent()
            .get(&format!("{}/metrics", node.http))
            .call()
            .ok()?
            .body_mut()
            .read_to_string()
            .ok()?;
        text.lines()
            .any(|l| l == "edgecore_streams_open 0")
            .then_some(text)
    });
    let opened: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("edgecore_streams_opened_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        // The sample's whole line: the gauge's HELP text reads "... edgecore_tunnel_open 1 while".
        opened >= 21 && metrics.lines().any(|l| l == "edgecore_tunnel_open 1"),
        "{metrics}"
    );

    // A crashed container's previous run.
    let previous = eventually(120, "the crasher's previous run", || {
        let (ok, log) = cloud.kubectl(&["logs", "crasher", "--previous"]);
        (ok && log.starts_with("run at ")).then_some(log)
    });
    assert_eq!(previous.lines().count(), 1, "{previous}");

    // A command in the container: its output, its stderr, its exit code; with each kubectl,
    // over a websocket and over SPDY (kubectl before 1.30 speaks only SPDY).
    let run_with = |kubectl: &Path, env: &[(&str, &str)], args: &[&str], stdin: Option<&str>| {
        let mut kubectl = Command::new(kubectl);
        kubectl
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .envs(env.iter().copied());
        let out = sim::output_with(&mut kubectl, stdin.unwrap_or_default().as_bytes());
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let run = |args: &[&str], stdin: Option<&str>| run_with(&kubectl_bin(), &[], args, stdin);
    for (kubectl, version) in sim::stack::kubectls() {
        for websockets in ["true", "false"] {
            let way = format!("{version}, KUBECTL_REMOTE_COMMAND_WEBSOCKETS={websockets}");
            let env = [("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", websockets)];
            let run = |args: &[&str], stdin: Option<&str>| run_with(&kubectl, &env, args, stdin);
            let (code, out, err) = run(
                &[
                    "exec",
                    "ticker",
                    "--",
                    "sh",
                    "-c",
                    "echo out; echo err >&2; exit 7",
                ],
                None,
            );
            assert_eq!((code, out.as_str()), (Some(7), "out\n"), "{way}: {err}");
            assert!(err.contains("err"), "{way}: {err}");
            let (code, out, err) = run(&["exec", "ticker", "--", "echo", "two words"], None);
            assert_eq!(
                (code, out.as_str()),
                (Some(0), "two words\n"),
                "{way}: {err}"
            );
            // stdin reaches the command.
            let (code, out, err) = run(
                &[
                    "exec",
                    "-i",
                    "ticker",
                    "--",
                    "sh",
                    "-c",
                    "read line; echo \"got $line\"",
                ],
                Some("hello\n"),
            );
            assert_eq!(
                (code, out.as_str()),
                (Some(0), "got hello\n"),
                "{way}: {err}"
            );
            // A terminal (kubectl under a pty of `script`): the command sees a tty of
            // kubectl's size (which kubectl sends once the stream is open: the command waits
            // for it).
            let tty = Command::new("script")
                .args(["-qec"])
                .arg(format!(
                    "stty cols 101 rows 33; KUBECTL_REMOTE_COMMAND_WEBSOCKETS={websockets} {} --kubeconfig {} exec -it ticker -- sh -c 'tty; for i in $(seq 100); do s=$(stty size 2>/dev/null); [ \"$s\" = \"33 101\" ] && break; sleep 0.1; done; echo \"size $s\"; exit 4'",
                    kubectl.display(),
                    kubeconfig.display()
                ))
                .arg("/dev/null")
                .stdin(Stdio::piped())
                .output()
                .expect("script");
            let said = String::from_utf8_lossy(&tty.stdout);
            assert!(said.contains("/dev/pts/"), "{way}: a terminal: {said}");
            assert!(said.contains("size 33 101"), "{way}: its size: {said}");
            assert_eq!(tty.status.code(), Some(4), "{way}: {said}");
        }
    }
    // What cannot run is said: a command not in the image, a container not running.
    let (code, _, err) = run(&["exec", "ticker", "--", "/no/such"], None);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("no such file") || err.contains("not found"),
        "{err}"
    );
    let (code, _, err) = run(&["exec", "ticker", "-c", "other", "--", "ls"], None);
    assert_ne!(code, Some(0));
    assert!(err.contains("container other is not valid"), "{err}");

    // What the pod and the node use (`kubectl top`, the metrics API), as the node reports it.
    let top = eventually(60, "kubectl top pod ticker", || {
        let (ok, out) = cloud.kubectl(&["top", "pod", "ticker"]);
        (ok && out.contains("ticker")).then_some(out)
    });
    let row: Vec<&str> = top
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert!(
        row.len() == 3 && row[1].ends_with('m') && row[2].ends_with("Mi"),
        "NAME CPU(cores) MEMORY(bytes): {top}"
    );
    let all = cloud.ok(&["top", "pod", "-A"]);
    assert!(
        all.starts_with("NAMESPACE") && all.contains("default ") && all.contains("ticker"),
        "{all}"
    );
    // Both nodes, each with its CPU and memory and their share of its capacity.
    let nodes = eventually(60, "kubectl top node", || {
        let (ok, out) = cloud.kubectl(&["top", "node"]);
        (ok && out.contains("edge-node-2") && !out.contains("<unknown>")).then_some(out)
    });
    assert_eq!(nodes.lines().count(), 3, "{nodes}");
    assert!(
        nodes
            .lines()
            .skip(1)
            .all(|l| l.split_whitespace().filter(|f| f.ends_with('%')).count() == 2),
        "{nodes}"
    );
    let (ok, denied) = cloud.kubectl(&["top", "pod", "ticker", "--as=reader"]);
    assert!(!ok && denied.contains("forbidden"), "{denied}");

    // Attached to the container's own process: its output as it is written.
    let mut attached = Command::new(kubectl_bin())
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["attach", "ticker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl attach");
    let mut out = BufReader::new(attached.stdout.take().expect("stdout"));
    let mut first = String::new();
    let _ = out.read_line(&mut first);
    let _ = attached.kill();
    let _ = attached.wait();
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut attached.stderr.take().expect("stderr"), &mut err);
    assert!(
        first.starts_with("tick "),
        "kubectl attach: {first:?} {err}"
    );

    // The fleet page: the pods of both nodes, and a pod's log followed through its node.
    if let Some(driver) = sim::browser::chromedriver() {
        use sim::browser::{assert_accessible, browser, submit, wait_text};
        let url = format!("https://127.0.0.1:{}/ui#/pods", cloud.api);
        let token = cloud.admin_token();
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async {
            let c = browser(&driver).await;
            c.goto(&url).await.expect("the page");
            submit(&c, "#token", "#login button", &token).await;
            wait_text(
                &c,
                r#"tr[data-pod="default/other"]"#,
                60,
                "the second node's pod",
                |t| t.contains("edge-node-2") && t.contains("Running") && t.contains("1/1"),
            )
            .await;
            wait_text(
                &c,
                r#"tr[data-pod="default/ticker"]"#,
                60,
                "the ticker",
                |t| t.contains("edge-node-1") && t.contains("Running"),
            )
            .await;
            assert_accessible(&c, "the fleet's pods").await;
            c.goto(&format!(
                "https://127.0.0.1:{}/ui#/pod/default/ticker",
                cloud.api
            ))
            .await
            .expect("the pod's page");
            let first = wait_text(&c, "#pod-log", 60, "the ticker's log", |t| {
                last_tick(t).is_some()
            })
            .await;
            let was = last_tick(&first).unwrap_or(0);
            // Followed: lines written since the page opened arrive.
            wait_text(&c, "#pod-log", 60, "newer ticks in the page", |t| {
                last_tick(t).is_some_and(|n| n >= was + 5)
            })
            .await;
            wait_text(&c, "#pod-log-status", 10, "following", |t| t == "following").await;
            assert_accessible(&c, "a pod's log").await;
            let _ = c.close().await;
        });
    }

    // Who may not: a user with pods but not pods/log, a node's own certificate.
    let (ok, denied) = cloud.kubectl(&["logs", "ticker", "--as=reader"]);
    assert!(
        !ok && denied.contains("cannot get resource \"pods/log\""),
        "{denied}"
    );
    let (ok, denied) = cloud.kubectl(&["exec", "ticker", "--as=reader", "--", "ls"]);
    assert!(
        !ok && denied.contains("cannot create resource \"pods/exec\""),
        "{denied}"
    );
    let (ok, said) = with_node_cert(
        &cloud,
        &node,
        rt_dir.path(),
        &["get", "--raw", "/api/v1/namespaces/default/pods/ticker/log"],
    );
    assert!(
        !ok && said.contains("system:node:edge-node-1")
            && said.contains("cannot get resource \"pods/log\""),
        "a node's certificate reads no log: {said}"
    );

    // The node away: said with its name.
    let mut f = follow("ticker");
    let mut out = BufReader::new(f.stdout.take().expect("stdout"));
    let mut first = String::new();
    let _ = out.read_line(&mut first);
    node.kill_edgecore();
    // The follower's stream was cut: kubectl ends, not with a silent "end of log".
    let status = f.wait().expect("kubectl ends");
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut f.stderr.take().expect("stderr"), &mut err);
    assert!(!status.success(), "a cut stream is an error: {err}");
    // Its last line says which pod, which node and why (kubectl alone: "unexpected EOF").
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut out, &mut rest);
    assert!(
        rest.contains("[cloudcore] the log of pod default/ticker on node edge-node-1 was cut: "),
        "{rest}"
    );
    let away = eventually(60, "the node's absence said", || {
        let (ok, log) = cloud.kubectl(&["logs", "ticker"]);
        (!ok && log.contains("edge-node-1")).then_some(log)
    });
    assert!(away.contains("no streaming tunnel"), "{away}");
    node.revive();
    eventually(60, "logs again once the node is back", || {
        let (ok, log) = cloud.kubectl(&["logs", "ticker", "--tail=1"]);
        (ok && log.starts_with("tick ")).then_some(())
    });

    // Revoked: the tunnel ends with the session, and no log is read through it again.
    cloud.cli(&["node", "revoke", "edge-node-1"]);
    // (A log read while the revocation lands is cut short: kubectl says `unexpected EOF`;
    // the next ones are refused naming the node.)
    let revoked = eventually(60, "no log through a revoked node", || {
        let (ok, log) = cloud.kubectl(&["logs", "ticker"]);
        (!ok && log.contains("edge-node-1")).then_some(log)
    });
    assert!(revoked.contains("edge-node-1"), "{revoked}");
    std::thread::sleep(Duration::from_secs(3));
    let (ok, still) = cloud.kubectl(&["logs", "ticker"]);
    assert!(!ok, "a revoked node's tunnel stays closed: {still}");
}

/// `kubectl port-forward` to a pod's port on an edge node: a web server in a busybox pod, the
/// connection made by the node's containerd, its bytes through the tunnel. kubectl's two ways
/// (SPDY in a websocket, the default since 1.31; the SPDY upgrade with
/// `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`), several connections at once, a megabyte whole; a
/// port nothing listens on said by kubectl; a user without `pods/portforward`, a node's
/// certificate and a node away refused.
#[test]
fn kubectl_port_forward_reaches_a_pods_port_through_the_tunnel() {
    let rt_dir = tempfile::tempdir().expect("tempdir");
    let rt = Containerd::start(rt_dir.path());
    rt.import_busybox();
    let edgecore = bin("edgecore");
    let bins = edgecore.parent().map(Path::to_path_buf).expect("bin dir");
    // A real cluster's CA, which signs its API server's kubelet client certificate: what
    // cloudcore's kubelet endpoints (cloudStream) take.
    let cluster_ca_dir = rt_dir.path().join("cluster-ca");
    std::fs::create_dir_all(&cluster_ca_dir).expect("dir");
    let (cluster_ca, cluster_key) = pki::load_or_make_ca(&cluster_ca_dir).expect("a CA");
    let stream_port = sim::free_port();
    let cloud = Cloud::start_with_modules(&format!(
        "  cloudStream:\n    listen: \"127.0.0.1:{stream_port}\"\n    clientCaFile: \"{}\"\n",
        cluster_ca_dir.join("ca.crt").display()
    ));
    let mut node = Node::start_named(
        &bins,
        "edge-node-1",
        "",
        &format!(
            "{}edged: {{runtimeEndpoint: \"unix://{}\", syncPeriodMs: 500}}\n",
            cloud.edge_config(),
            rt.socket.display()
        ),
    );
    let port = sim::free_port();
    let unused = sim::free_port();
    // A megabyte that says where each of its parts was: a part out of place shows.
    let web = sim::fill(
        include_str!("manifests/pod_streams_web.yaml"),
        &[("port", &port)],
    );
    let applied = rt_dir.path().join("web.yaml");
    std::fs::write(&applied, format!("{web}{READER}")).expect("write");
    cloud.ok(&["apply", "-f", applied.to_str().expect("path")]);
    eventually(120, "the web pod Running", || {
        running(&cloud, "web").then_some(())
    });
    let expected: Vec<u8> = {
        let mut all = String::new();
        for i in 0..200_000 {
            all.push_str(&format!("{i:06}\n"));
        }
        all.into_bytes()[..1_048_576].to_vec()
    };

    let kubectls = sim::stack::kubectls();
    if kubectls.len() < 2 {
        eprintln!("note: only {kubectls:?} is here; port-forward is tried with that kubectl alone");
    }
    for (kubectl, version) in &kubectls {
        for websockets in ["true", "false"] {
            let way = format!("{version}, KUBECTL_PORT_FORWARD_WEBSOCKETS={websockets}");
            let env = [("KUBECTL_PORT_FORWARD_WEBSOCKETS", websockets)];
            let pf = cloud.port_forward_with(kubectl, "pod/web", port, &[], &env);
            // The server may take a moment to listen after the pod shows Running.
            let (status, body) = eventually(30, "the pod's page through port-forward", || {
                pf.get("/index.html")
                    .ok()
                    .filter(|(s, _)| s.contains("200"))
            });
            assert!(status.contains("200"), "{way}: {status}");
            assert_eq!(body, b"hello from the pod\n", "{way}");
            // Several connections at once, each a megabyte, each whole and in order.
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..4).map(|_| s.spawn(|| pf.get("/big"))).collect();
                for h in handles {
                    let (status, body) = h.join().expect("thread").expect("GET /big");
                    assert!(status.contains("200"), "{way}: {status}");
                    assert!(
                        body == expected,
                        "{way}: {} bytes, not the file's",
                        body.len()
                    );
                }
            });
            // Fifty connections open at once, more than the streams one user may hold on a
            // node: those beyond wait for a place (one refused would end kubectl's whole
            // forward), and every one is answered whole.
            use std::io::{Read, Write};
            let mut many: Vec<std::net::TcpStream> = (0..50)
                .map(|_| std::net::TcpStream::connect(("127.0.0.1", pf.local)).expect("connect"))
                .collect();
            // Every request sent before any answer is read: none waits on another's reader.
            for c in &mut many {
                c.set_read_timeout(Some(Duration::from_secs(120)))
                    .expect("timeout");
                write!(c, "GET /index.html HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").expect("ask");
            }
            for (i, mut c) in many.into_iter().enumerate() {
                let mut all = Vec::new();
                c.read_to_end(&mut all).expect("answer");
                assert!(
                    all.ends_with(b"\r\n\r\nhello from the pod\n"),
                    "{way}: connection {i} of 50: {:?}",
                    String::from_utf8_lossy(&all)
                );
            }
            // One after another, on the same kubectl.
            for _ in 0..5 {
                let (_, body) = pf.get("/index.html").expect("again");
                assert_eq!(body, b"hello from the pod\n", "{way}");
            }
        }
    }

    // A real cluster's way: its API server calls the node's kubelet port, which the Node
    // gives (10350, with the address the node reaches the cloud from); a DNAT sends that to
    // cloudStream. Here `sim::kubelet_calls` plays the API server (its kubelet client
    // certificate, the kubelet's paths, SPDY as kube-apiserver speaks it to kubelets).
    let endpoint = cloud.ok(&[
        "get",
        "node",
        "edge-node-1",
        "-o",
        "jsonpath={.status.daemonEndpoints.kubeletEndpoint.Port} {.status.addresses[?(@.type==\"InternalIP\")].address}",
    ]);
    assert_eq!(endpoint, "10350 127.0.0.1", "the Node's kubelet endpoint");
    let api_ca = std::fs::read_to_string(cloud.dir.path().join("data/pki/ca.crt")).expect("CA");
    let (client_cert, client_key) = pki::sign_leaf(
        &cluster_ca,
        &cluster_key,
        "kube-apiserver-kubelet-client",
        Some("system:masters"),
        &[],
        false,
        1,
    )
    .expect("the API server's kubelet client certificate");
    let token = cloud.admin_token();
    // An API server in front of cloudcore presenting `cert` to the kubelet endpoints, and a
    // kubeconfig for kubectl to use it (`name`).
    let front = |cert: &str, key: &str, name: &str| {
        let f =
            sim::kubelet_calls::Front::start(cloud.api, stream_port, &api_ca, (cert, key), &token);
        let kubeconfig = f.kubeconfig(rt_dir.path(), name);
        (f, kubeconfig)
    };
    let (_front, via_cluster) = front(&client_cert, &client_key, "cluster.kubeconfig");
    let spdy = [
        ("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false"),
        ("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false"),
    ];
    let kubectl_with = |kubeconfig: &Path, args: &[&str]| {
        let out = Command::new(kubectl_bin())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .envs(spdy)
            .stdin(Stdio::null())
            .output()
            .expect("kubectl");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // `exec web -- sh -c SCRIPT`.
    let sh_c = |script: &'static str| ["exec", "web", "--", "sh", "-c", script];
    let (code, log, err) = kubectl_with(&via_cluster, &["logs", "web"]);
    assert_eq!(
        (code, log.as_str()),
        (Some(0), format!("serving on {port}\n").as_str()),
        "kubectl logs through the kubelet endpoint: {err}"
    );
    let (code, out, err) = kubectl_with(&via_cluster, &sh_c("echo from the node; exit 5"));
    assert_eq!(
        (code, out.as_str()),
        (Some(5), "from the node\n"),
        "kubectl exec through the kubelet endpoint: {err}"
    );
    {
        let pf =
            sim::stack::port_forward(&kubectl_bin(), &via_cluster, "pod/web", port, &[], &spdy);
        let (_, body) = pf
            .get("/index.html")
            .expect("a page through the kubelet endpoint");
        assert_eq!(body, b"hello from the pod\n");
    }
    // A certificate of the cluster's CA whose user may not proxy to nodes: the cluster's
    // SubjectAccessReview says no; one of another CA (the node's own): refused in the handshake.
    let (reader_cert, reader_key) =
        pki::sign_leaf(&cluster_ca, &cluster_key, "reader", None, &[], false, 1).expect("cert");
    let (_reader_front, as_reader) = front(&reader_cert, &reader_key, "reader-front.kubeconfig");
    for args in [&["logs", "web"][..], &["exec", "web", "--", "true"]] {
        let (code, _, err) = kubectl_with(&as_reader, args);
        assert_ne!(code, Some(0), "{args:?}");
        assert!(
            err.contains("user=reader") && err.contains("subresource=proxy"),
            "{args:?}: {err}"
        );
    }
    // A node's identity signed by the client CA (as when the fleet CA is given as
    // clientCaFile): refused by cloudStream itself, whatever the authorization says.
    let (as_node_cert, as_node_key) = pki::sign_leaf(
        &cluster_ca,
        &cluster_key,
        "system:node:edge-node-1",
        Some("system:nodes"),
        &[],
        false,
        1,
    )
    .expect("cert");
    let (_node_id_front, node_identity) =
        front(&as_node_cert, &as_node_key, "node-id-front.kubeconfig");
    for args in [&["logs", "web"][..], &["exec", "web", "--", "true"]] {
        let (code, _, err) = kubectl_with(&node_identity, args);
        assert_ne!(code, Some(0), "{args:?}");
        assert!(
            err.contains("system:node:edge-node-1") && err.contains("opens no stream"),
            "{args:?}: {err}"
        );
    }
    let certs = node.dir.path().join("data/certs");
    let node_cert = std::fs::read_to_string(certs.join("edge.crt")).expect("node cert");
    let node_key = std::fs::read_to_string(certs.join("edge.key")).expect("node key");
    let (_node_front, as_node) = front(&node_cert, &node_key, "node-front.kubeconfig");
    // (TLS 1.3: the refusal comes after the client's side of the handshake, so the front
    // sees the connection end rather than a failed dial.)
    let (code, _, err) = kubectl_with(&as_node, &sh_c("echo > /tmp/www/by-the-node"));
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains("EOF") || err.contains("error dialing backend"),
        "{err}"
    );
    let (code, seen, err) = kubectl_with(
        &via_cluster,
        &sh_c("test -e /tmp/www/by-the-node && echo ran || echo absent"),
    );
    assert_eq!(
        (code, seen.as_str()),
        (Some(0), "absent\n"),
        "the node's request ran: {err}"
    );

    // A port nothing listens on: the runtime's refusal, as kubectl prints it (kubectl then
    // ends, having lost the forward).
    let mut pf = cloud.port_forward("pod/web", unused, &[], &[]);
    let got = pf.get("/");
    assert!(got.is_err(), "no answer from a closed port: {got:?}");
    let (status, err) = pf.ended(30).expect("kubectl ends after the error");
    assert!(!status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "error forwarding port {unused} to pod default/web on node edge-node-1"
        )),
        "{err}"
    );

    // Who may not: a user with pods but not pods/portforward; a node's own certificate.
    let (ok, denied) = cloud.kubectl(&[
        "port-forward",
        "pod/web",
        &format!(":{port}"),
        "--as=reader",
    ]);
    assert!(
        !ok && denied.contains("cannot create resource \"pods/portforward\""),
        "{denied}"
    );
    let (ok, said) = with_node_cert(
        &cloud,
        &node,
        rt_dir.path(),
        &["port-forward", "pod/web", &format!(":{port}")],
    );
    assert!(
        !ok && said.contains("system:node:edge-node-1") && said.contains("pods/portforward"),
        "a node's certificate forwards nothing: {said}"
    );

    // A forward open when the node goes: kubectl loses it; a new one says the node is away.
    let pf = cloud.port_forward("pod/web", port, &[], &[]);
    assert!(pf.get("/index.html").is_ok());
    node.kill_edgecore();
    let got = pf.get("/index.html");
    assert!(
        got.is_err() || got.as_ref().is_ok_and(|(_, b)| b.is_empty()),
        "{got:?}"
    );
    drop(pf);
    let away = eventually(60, "the node's absence said", || {
        let (ok, said) = cloud.kubectl(&["port-forward", "pod/web", &format!(":{port}")]);
        (!ok && said.contains("edge-node-1")).then_some(said)
    });
    assert!(away.contains("no streaming tunnel"), "{away}");
}
