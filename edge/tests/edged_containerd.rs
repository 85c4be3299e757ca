//! edged on a real containerd (Debian's 1.6, its CRI plugin, runc) started by the test as root
//! with its own state directory and socket, and an image built here with umoci from Debian's
//! static busybox (no registry, no network). Needs `apt-get install containerd runc umoci
//! busybox-static` (`.ci/run` installs them).

mod common;
use common::*;
use serde_json::Value;
use sim::containerd::Containerd;
use std::time::Duration;

const PODS: &str = include_str!("manifests/pods.yaml");

/// On the runtime's CNI network: the pod's IP is given to it in its env and is on its eth0.
const NETWORKED: &str = include_str!("manifests/networked.yaml");

const ABSENT: &str = include_str!("manifests/absent.yaml");

/// edgecore `e` started again with edged on containerd `rt` (settings for a quick test, and
/// `more`, ", key: value" pairs).
fn with_edged(e: &mut Edgecore, rt: &Containerd, more: &str) {
    let mut config = std::fs::read_to_string(&e.config).expect("config");
    config.push_str(&format!(
        "edged: {{runtimeEndpoint: \"unix://{}\", staticPodPath: pods, syncPeriodMs: 200, initialBackoffMs: 500, maxBackoffMs: 2000{more}}}\n",
        rt.socket.display()
    ));
    std::fs::write(&e.config, config).expect("config");
    e.start_again();
    e.wait_ready();
}

fn pod<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list["pods"].as_array()?.iter().find(|p| p["name"] == name)
}

fn container<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod["containers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

/// Polls `f` for up to 60 s (containers take seconds to start on a loaded machine).
fn wait<T>(e: &Edgecore, what: &str, mut f: impl FnMut(&Value) -> Option<T>) -> T {
    sim::poll::eventually_or(60, what, || {
        let (_, list) = e.get("/api/v1/pods");
        f(&list).ok_or_else(|| format!("{list}\n{}", e.log()))
    })
}

/// The pod's main container runs and is `main_id`, never restarted.
fn assert_main_kept(e: &Edgecore, main_id: &str, what: &str) {
    let (id, restarts) = wait(e, what, |l| {
        let c = container(pod(l, "sleeper")?, "main")?;
        (c["state"] == "running").then(|| {
            (
                c["containerId"].as_str().map(str::to_string),
                c["restartCount"].as_u64(),
            )
        })
    });
    assert_eq!(id.as_deref(), Some(main_id), "{what}: the same container");
    assert_eq!(restarts, Some(0), "{what}: not restarted");
}

#[test]
fn static_pods_run_on_containerd_restart_with_backoff_are_adopted_and_removed() {
    // Also: a containerd restart is survived without restarting the pods.
    let rt_dir = tempfile::tempdir().expect("tempdir");
    let mut rt = Containerd::start(rt_dir.path());
    rt.import_busybox();

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("manifests")).expect("mkdir");
    let mut e = Edgecore::with_dir(dir, None);
    e.wait_ready();
    assert_eq!(
        e.get("/api/v1/pods").0,
        404,
        "no edged section: no pods API"
    );
    e.stop(false);
    let pods_dir = e.dir.path().join("pods");
    std::fs::create_dir_all(&pods_dir).expect("mkdir");
    std::fs::write(pods_dir.join("sleeper.yaml"), PODS).expect("write pod");
    std::fs::write(pods_dir.join("absent.yaml"), ABSENT).expect("write pod");
    std::fs::write(pods_dir.join("net.yaml"), NETWORKED).expect("write pod");
    std::fs::write(
        pods_dir.join("broken.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: b}\nspec: {containers: 7}\n",
    )
    .expect("write pod");
    with_edged(&mut e, &rt, "");

    // The pod runs; its crashing container is restarted with a growing backoff.
    let main_id = wait(&e, "main running", |l| {
        let c = container(pod(l, "sleeper")?, "main")?;
        (c["state"] == "running").then(|| c["containerId"].as_str().map(str::to_string))?
    });
    let crash = wait(&e, "crash restarted twice and backing off", |l| {
        let c = container(pod(l, "sleeper")?, "crash")?;
        (c["restartCount"].as_u64()? >= 2 && c["reason"] == "CrashLoopBackOff").then(|| c.clone())
    });
    assert_eq!(crash["lastExitCode"], 3, "{crash}");
    let (_, list) = e.get("/api/v1/pods");
    assert_eq!(pod(&list, "sleeper").expect("pod")["phase"], "Running");

    // Images: absent with Never, and one that cannot be pulled: each says why.
    wait(&e, "ErrImageNeverPull", |l| {
        let c = container(pod(l, "absent")?, "c")?;
        (c["reason"] == "ErrImageNeverPull").then_some(())
    });
    let d = wait(&e, "a pull that fails", |l| {
        let c = container(pod(l, "absent")?, "d")?;
        let r = c["reason"].as_str()?;
        (r == "ErrImagePull" || r == "ImagePullBackOff").then(|| c.clone())
    });
    assert!(
        d["message"]
            .as_str()
            .unwrap_or("")
            .contains("127.0.0.1:1/none:1"),
        "{d}"
    );
    // The broken manifest is named, and disturbed nothing else.
    let (_, list) = e.get("/api/v1/pods");
    let errors = list["manifestErrors"].to_string();
    assert!(
        errors.contains("broken.yaml") && errors.contains("spec.containers"),
        "{errors}"
    );

    // The container's log, written by containerd where edged asked.
    let logs = e.dir.path().join("data/pod-logs");
    let log = wait(&e, "main's log", |_| {
        let d = std::fs::read_dir(&logs).ok()?.flatten().find(|d| {
            d.file_name()
                .to_string_lossy()
                .starts_with("default_sleeper_")
        })?;
        std::fs::read_to_string(d.path().join("main/0.log"))
            .ok()
            .filter(|t| t.contains("started hello"))
    });
    assert!(log.contains("stdout"), "CRI log format: {log}");
    // The same through the API `kectl logs` uses: the text without CRI's prefixes; a pod of
    // two containers needs one named; the crashing one's previous run.
    let (code, text) = e.get("/api/v1/pods/default/sleeper/log?container=main");
    assert_eq!((code, text), (200, Value::String("started hello\n".into())));
    let (code, err) = e.get("/api/v1/pods/default/sleeper/log");
    assert_eq!(code, 400, "{err}");
    assert!(
        err["error"].as_str().unwrap_or("").contains("name one of"),
        "{err}"
    );
    let (code, text) = e.get("/api/v1/pods/default/sleeper/log?container=crash&previous=true");
    assert_eq!((code, text), (200, Value::String("dying\n".into())));
    let (code, err) = e.get("/api/v1/pods/default/nobody/log");
    assert_eq!(code, 404, "{err}");

    // A pod on the CNI bridge: its own address, in the bridge's subnet, is its podIP, its
    // env's POD_IP and an address of its own network namespace.
    let ip = wait(&e, "net running with an IP", |l| {
        let p = pod(l, "net")?;
        let running = container(p, "c")?["state"] == "running";
        running.then(|| p["podIP"].as_str().map(str::to_string))?
    });
    let prefix = rt.subnet.trim_end_matches("0/24");
    assert!(ip.starts_with(prefix), "{ip} is not in {}", rt.subnet);
    let log = wait(&e, "net's log", |_| {
        let (_, t) = e.get("/api/v1/pods/default/net/log");
        t.as_str()
            .filter(|t| t.contains("Main"))
            .map(str::to_string)
    });
    assert!(log.starts_with(&format!("ip {ip}\n")), "{log}");
    assert!(
        log.contains(&format!("|-- {ip}\n")),
        "{ip} on the pod's interface: {log}"
    );

    // kill -9 of edgecore: the pod keeps running and is adopted, not restarted.
    e.stop(true);
    assert!(
        rt.containers().contains(&main_id),
        "main runs without edgecore"
    );
    e.start_again();
    e.wait_ready();
    assert_main_kept(&e, &main_id, "main adopted");

    // containerd restarted: while it is down the pods API says why nothing is synced; once it
    // is back, the same container runs, not restarted.
    rt.restart(|| {
        wait(&e, "the runtime's error", |l| {
            l["runtimeError"].as_str().map(str::to_string)
        });
    });
    wait(&e, "the runtime back", |l| {
        l["runtimeError"].is_null().then_some(())
    });
    assert_main_kept(&e, &main_id, "main after containerd's restart");
    let (_, list) = e.get("/api/v1/pods");
    assert_eq!(
        pod(&list, "net").map(|p| p["podIP"].clone()),
        Some(Value::String(ip.clone())),
        "the networked pod keeps its address through both restarts"
    );

    // The pods directory vanishing for a moment stops nothing.
    let moved = e.dir.path().join("pods-away");
    std::fs::rename(&pods_dir, &moved).expect("move");
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        rt.containers().contains(&main_id),
        "kept while the directory is away"
    );
    std::fs::rename(&moved, &pods_dir).expect("move back");

    // Removing the manifests stops and removes the pods (grace period 2 s).
    for f in ["sleeper.yaml", "absent.yaml", "broken.yaml", "net.yaml"] {
        std::fs::remove_file(pods_dir.join(f)).expect("rm");
    }
    wait(&e, "no pods", |l| {
        l["pods"]
            .as_array()
            .is_some_and(|p| p.is_empty())
            .then_some(())
    });
    sim::poll::eventually_or(30, "no containers left", || {
        let left = rt.containers();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
}

const PROBED: &str = include_str!("manifests/probed.yaml");

#[test]
fn probes_resources_and_log_rotation() {
    let rt_dir = tempfile::tempdir().expect("tempdir");
    let rt = Containerd::start(rt_dir.path());
    rt.import_busybox();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("manifests")).expect("mkdir");
    std::fs::create_dir_all(dir.path().join("pods")).expect("mkdir");
    std::fs::write(dir.path().join("pods/probed.yaml"), PROBED).expect("write pod");
    let mut e = Edgecore::with_dir(dir, None);
    e.wait_ready();
    e.stop(false);
    with_edged(
        &mut e,
        &rt,
        ", containerLogMaxSizeBytes: 100000, containerLogMaxFiles: 3",
    );

    // A failing readiness probe: running, not ready, the probe's failure named.
    let c = wait(&e, "unready running and not ready", |l| {
        let c = container(pod(l, "probed")?, "unready")?;
        (c["state"] == "running"
            && c["ready"] == false
            && c["message"].as_str()?.contains("Readiness probe failed"))
        .then(|| c.clone())
    });
    // Its limits reached the runtime.
    let id = c["containerId"].as_str().expect("an id").to_string();
    let info: Value = serde_json::from_str(&rt.ctr(&["containers", "info", &id])).expect("json");
    let res = &info["Spec"]["linux"]["resources"];
    assert_eq!(res["memory"]["limit"], 64 * 1024 * 1024, "{res}");
    assert_eq!(res["cpu"]["quota"], 25_000, "{res}");
    // The probe passes once the file is there: ready.
    rt.ctr(&[
        "tasks",
        "exec",
        "--exec-id",
        "touch",
        &id,
        "/bin/sh",
        "-c",
        "echo > /ready",
    ]);
    wait(&e, "unready becomes ready", |l| {
        let c = container(pod(l, "probed")?, "unready")?;
        (c["ready"] == true).then_some(())
    });
    // A failing liveness probe: the container is killed and restarted.
    wait(&e, "dying restarted by its liveness probe", |l| {
        let c = container(pod(l, "probed")?, "dying")?;
        (c["restartCount"].as_u64()? >= 1).then_some(())
    });
    // The chatty container's log is rotated: at most 3 files, none far above the limit.
    let logs = e.dir.path().join("data/pod-logs");
    wait(&e, "rotated logs", |_| {
        let d = std::fs::read_dir(&logs).ok()?.flatten().find(|d| {
            d.file_name()
                .to_string_lossy()
                .starts_with("default_probed_")
        })?;
        let files: Vec<_> = std::fs::read_dir(d.path().join("chatty"))
            .ok()?
            .flatten()
            .collect();
        let rotated = files
            .iter()
            .filter(|f| f.file_name().to_string_lossy().contains(".log."))
            .count();
        (rotated == 2 && files.len() == 3).then_some(())
    });
    e.stop(false);
}
