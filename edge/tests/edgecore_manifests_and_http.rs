//! edgecore as a user runs it: manifests in a directory, twins over HTTP and `kectl`, changes to
//! the files applied while it runs, and state kept across restarts and `kill -9`.

mod common;
use common::*;
use std::process::Command;

#[test]
fn manifests_become_twins_and_kectl_shows_and_sets_them() {
    let e = Edgecore::start(None);
    let t = e.twin("default/oven-1").expect("twin from the manifest");
    assert_eq!(desired(&t, "setpoint").as_deref(), Some("80"));
    assert_eq!(t["properties"]["temperature"]["type"], "FLOAT");

    let kectl = bin("kectl");
    let out = Command::new(&kectl)
        .args(["twin", "get", "default/oven-1", "--server", &e.http])
        .output()
        .expect("kectl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("setpoint") && text.contains("80"), "{text}");

    let set = [
        "twin", "set", "oven-1", "setpoint", "120", "--server", &e.http,
    ];
    sim::run(Command::new(&kectl).args(set));
    let t = e.twin("default/oven-1").expect("twin");
    assert_eq!(desired(&t, "setpoint").as_deref(), Some("120"));
    assert_eq!(t["properties"]["setpoint"]["desiredVersion"]["edge"], 1);

    // A negative value needs no `--`: it reaches edgecore, which refuses it below the model's
    // minimum (0), as it refuses one above its maximum (300), saying why; nothing is stored.
    for (value, why) in [
        ("-321", "-321 is below the model minimum 0"),
        ("301", "301 is above the model maximum 300"),
    ] {
        let out = Command::new(&kectl)
            .args([
                "twin", "set", "oven-1", "setpoint", value, "--server", &e.http,
            ])
            .output()
            .expect("kectl runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{value} accepted");
        assert!(stderr.contains(why), "{stderr}");
    }
    let t = e.twin("default/oven-1").expect("twin");
    assert_eq!(desired(&t, "setpoint").as_deref(), Some("120"));
    let (s, v) = e.put(
        "/api/v1/devices/default/oven-1/desired",
        r#"{"setpoint": 301}"#,
    );
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|m| m.contains("above the model maximum 300")),
        "{v}"
    );

    // Errors name what was wrong and fail the command.
    let out = Command::new(&kectl)
        .args([
            "twin",
            "set",
            "oven-1",
            "temperature",
            "5",
            "--server",
            &e.http,
        ])
        .output()
        .expect("kectl runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("read-only"));
}

/// A first start parses the manifests in a helper process of edgecore's own binary; the
/// helper, run as edgecore runs it, writes the result's key and the result, problems included,
/// and says with its exit code when the directory cannot be listed.
#[test]
fn a_first_start_parses_the_manifests_in_a_helper() {
    let e = Edgecore::start(None);
    assert!(e.twin("default/oven-1").is_some());
    let log = e.log();
    assert!(!log.contains("helper process failed"), "{log}");

    std::fs::write(e.manifests.join("broken.yaml"), "kind: Device\nspec: [").expect("write");
    let parse = |dir: &std::path::Path| {
        Command::new(bin("edgecore"))
            .args(["parse-manifests", "--node", "test-node"])
            .arg(dir)
            .output()
            .expect("edgecore runs")
    };
    let out = parse(&e.manifests);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8(out.stdout).expect("UTF-8");
    let mut lines = stdout.lines();
    let key = lines.next().unwrap_or_default();
    assert!(
        key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()),
        "{key}"
    );
    let stored: serde_json::Value =
        serde_json::from_str(lines.next().unwrap_or_default()).expect("JSON");
    assert_eq!(stored["key"], key);
    assert_eq!(stored["devices"][0][0], "default/oven-1", "{stored}");
    assert!(
        stored["broken_files"][0]
            .as_str()
            .is_some_and(|f| f.ends_with("broken.yaml")),
        "{stored}"
    );
    assert_eq!(lines.next(), None);

    let out = parse(&e.dir.path().join("no-such-dir"));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(out.stdout.is_empty());
}

#[test]
fn http_api_checks_input_and_conditional_updates() {
    let e = Edgecore::start(None);
    let (s, v) = e.put("/api/v1/devices/default/oven-1/desired", "{not json");
    assert_eq!(s, 400, "{v}");
    let (s, v) = e.put(
        "/api/v1/devices/default/oven-1/desired",
        r#"{"setpoint": "hot"}"#,
    );
    assert_eq!(s, 400);
    assert!(
        v["error"].as_str().unwrap_or("").contains("setpoint"),
        "{v}"
    );
    let (s, _) = e.put("/api/v1/devices/default/nope/desired", r#"{"setpoint": 1}"#);
    assert_eq!(s, 404);
    let (s, _) = e.put(
        "/api/v1/devices/default/oven-1/desired?ifVersion=7",
        r#"{"setpoint": 1}"#,
    );
    assert_eq!(s, 409);
    let (s, v) = e.put(
        "/api/v1/devices/default/oven-1/desired?ifVersion=1",
        r#"{"setpoint": 90}"#,
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["desiredVersion"], 2);
    let (s, m) = e.get("/metrics");
    assert_eq!(s, 200);
    let m = m.as_str().unwrap_or_default().to_string();
    assert!(m.contains("edgecore_twin_updates_total"), "{m}");
    assert!(
        m.contains("edgecore_outbox_depth 1"),
        "the edge-set desired value waits for the cloud: {m}"
    );
}

#[test]
fn editing_the_manifests_applies_without_restart_and_bad_files_are_skipped() {
    let e = Edgecore::start(None);
    // A second device in a new file appears.
    let second = MANIFEST
        .split("---")
        .nth(1)
        .unwrap_or_default()
        .replace("oven-1", "oven-2");
    std::fs::write(e.manifests.join("oven2.yaml"), &second).expect("write");
    e.eventually("oven-2 added", |e| e.twin("default/oven-2"));
    // A broken file is skipped; the valid ones stay.
    std::fs::write(e.manifests.join("broken.yaml"), "kind: Device\nspec: [").expect("write");
    std::fs::write(
        e.manifests.join("oven2.yaml"),
        second.replace("value: \"80\"", "value: \"hot\""),
    )
    .expect("write");
    // A desired value that is not of the property's type is refused on that property, tied
    // to the value, and the last good one stays desired: the device is not held back.
    let t = e.eventually("the bad value refused on its property", |e| {
        e.twin("default/oven-2").filter(|t| {
            t["properties"]["setpoint"]["writeError"]["desired"] == "hot"
                && t["properties"]["setpoint"]["writeError"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("hot"))
        })
    });
    assert_eq!(
        desired(&t, "setpoint").as_deref(),
        Some("80"),
        "the last good value stays desired"
    );
    // A changed desired value in the spec applies.
    std::fs::write(
        e.manifests.join("oven2.yaml"),
        second.replace("value: \"80\"", "value: \"95\""),
    )
    .expect("write");
    e.eventually("new desired value", |e| {
        e.twin("default/oven-2")
            .filter(|t| desired(t, "setpoint").as_deref() == Some("95"))
    });
    // Removing the file removes the device and its twin.
    std::fs::remove_file(e.manifests.join("oven2.yaml")).expect("rm");
    e.eventually("oven-2 removed", |e| {
        e.twin("default/oven-2").is_none().then_some(())
    });
    assert!(e.twin("default/oven-1").is_some());
    let log = std::fs::read_to_string(e.dir.path().join("edgecore.log")).unwrap_or_default();
    assert!(
        log.contains("broken.yaml"),
        "the bad file is named in the log"
    );
}

#[test]
fn twins_survive_sigterm_and_kill_9() {
    let mut e = Edgecore::start(None);
    for (value, hard, what) in [
        ("111", false, "edge-set desired survives a restart"),
        ("112", true, "an answered update survives kill -9"),
    ] {
        let (s, _) = e.put(
            "/api/v1/devices/default/oven-1/desired",
            &format!(r#"{{"setpoint": {value}}}"#),
        );
        assert_eq!(s, 200);
        e.restart(hard);
        let t = e.twin("default/oven-1").expect("twin");
        assert_eq!(desired(&t, "setpoint").as_deref(), Some(value), "{what}");
    }
}

#[test]
fn a_bad_config_names_the_key_and_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("bad.yaml");
    std::fs::write(&cfg, "mqtt:\n  mode: sideways\n").expect("write");
    let out = Command::new(bin("edgecore"))
        .args(["--config", &cfg.display().to_string()])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml") && err.contains("mqtt.mode"),
        "{err}"
    );
}

/// Clients that send their request headers a byte at a time are cut off; the API answers the
/// others meanwhile, however many trickle (more than `http.maxConnections` would otherwise be
/// held for ever).
#[test]
fn clients_that_trickle_their_headers_are_cut_off() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let e = Edgecore::start(None);
    let addr = e.http.trim_start_matches("http://").to_string();
    let slow: Vec<_> = (0..20)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut c = std::net::TcpStream::connect(&addr).expect("connected");
                c.set_read_timeout(Some(Duration::from_millis(200)))
                    .expect("timeout");
                let started = Instant::now();
                for b in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "
                    .iter()
                    .cycle()
                {
                    if c.write_all(&[*b]).is_err() {
                        return started.elapsed();
                    }
                    let mut buf = [0u8; 64];
                    match c.read(&mut buf) {
                        Ok(0) => return started.elapsed(),
                        Err(e)
                            if e.kind() != std::io::ErrorKind::WouldBlock
                                && e.kind() != std::io::ErrorKind::TimedOut =>
                        {
                            return started.elapsed();
                        }
                        _ => {}
                    }
                    assert!(
                        started.elapsed() < Duration::from_secs(120),
                        "a trickling client was never cut off"
                    );
                }
                started.elapsed()
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(e.get("/healthz").0, 200, "served meanwhile");
    let cut: Vec<Duration> = slow
        .into_iter()
        .map(|t| t.join().expect("joined"))
        .collect();
    eprintln!(
        "20 clients trickling headers: cut off after {:?} to {:?}",
        cut.iter().min(),
        cut.iter().max()
    );
    assert_eq!(e.get("/healthz").0, 200);
}

/// With `http.tokenFile`, the API answers only requests that carry the token (kectl sends
/// `KECTL_TOKEN`); health checks stay open.
#[test]
fn the_http_api_can_require_a_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("api.token");
    std::fs::write(&file, "s3cret-token\n").expect("token");
    let e = Edgecore::start_with("", &format!(", tokenFile: {}", file.display()));
    assert_eq!(e.get("/healthz").0, 200);
    let (status, body) = e.get("/api/v1/devices");
    assert_eq!(status, 401, "{body}");
    assert!(body.to_string().contains("KECTL_TOKEN"), "{body}");
    let kectl = |token: Option<&str>| {
        let mut c = Command::new(bin("kectl"));
        c.args(["twin", "list", "--server", &e.http]);
        match token {
            Some(t) => c.env("KECTL_TOKEN", t),
            None => c.env_remove("KECTL_TOKEN"),
        };
        c.output().expect("kectl runs")
    };
    let out = kectl(None);
    assert!(!out.status.success());
    let out = kectl(Some("wrong"));
    assert!(!out.status.success());
    let out = kectl(Some("s3cret-token"));
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("oven-1"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// DNS rebinding: without a token, a request whose `Host` is a name of a web page's own domain
/// (resolved to this machine) is refused, a read and a desired value alike; IP addresses,
/// `localhost` and the names in `http.hosts` are answered.
#[test]
fn without_a_token_a_foreign_host_is_refused() {
    use std::io::{Read, Write};
    let e = Edgecore::start_with("", ", hosts: [gw-3.plant.example]");
    let addr = e.http.trim_start_matches("http://").to_string();
    let raw = |method: &str, path: &str, host: &str, body: &str| {
        let mut c = std::net::TcpStream::connect(&addr).expect("connected");
        write!(
            c,
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .expect("sent");
        let mut out = String::new();
        c.read_to_string(&mut out).expect("read");
        out
    };
    let desired = "/api/v1/devices/default/oven-1/desired";
    for host in [
        "evil.example",
        "evil.example:10360",
        "127.0.0.1.evil.example",
    ] {
        let out = raw("GET", "/api/v1/devices", host, "");
        assert!(
            out.starts_with("HTTP/1.1 403")
                && out.contains("http.hosts")
                && !out.contains("oven-1\""),
            "{host}: {out}"
        );
        let out = raw("PUT", desired, host, r#"{"setpoint": "99"}"#);
        assert!(out.starts_with("HTTP/1.1 403"), "{host}: {out}");
    }
    let (_, twin) = e.get("/api/v1/devices/default/oven-1");
    assert!(!twin.to_string().contains("\"99\""), "{twin}");
    for host in [addr.as_str(), "localhost", "gw-3.plant.example:10360"] {
        let out = raw("GET", "/api/v1/devices", host, "");
        assert!(
            out.starts_with("HTTP/1.1 200") && out.contains("oven-1"),
            "{host}: {out}"
        );
    }
}

/// A page left open holds an event stream (`/api/v1/events`); at SIGTERM the stream ends at
/// once and edgecore stops without waiting out its 10 s drain for it.
#[test]
fn an_open_event_stream_ends_at_shutdown() {
    use std::io::{Read, Write};
    let mut e = Edgecore::start(None);
    let addr = e.http.trim_start_matches("http://").to_string();
    let mut c = std::net::TcpStream::connect(&addr).expect("connected");
    write!(c, "GET /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").expect("sent");
    let mut head = [0u8; 12];
    c.read_exact(&mut head).expect("the stream's head");
    assert_eq!(&head, b"HTTP/1.1 200", "{}", String::from_utf8_lossy(&head));
    e.stop(false);
    // The stream ends (the connection closes): read to its end.
    c.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .expect("timeout");
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    let log = e.log();
    assert!(log.contains("edgecore stopped"), "{log}");
    assert!(!log.contains("did not stop within"), "{log}");
}

/// A model's range changed in a local manifest reaches the running twin at once; the desired
/// value it no longer allows is refused on its property, visibly.
#[test]
fn a_model_change_reaches_the_running_twin() {
    let e = Edgecore::start(None);
    e.eventually("oven-1", |e| e.twin("default/oven-1"));
    std::fs::write(
        e.manifests.join("oven.yaml"),
        common::MANIFEST.replace("maximum: \"300\"", "maximum: \"50\""),
    )
    .expect("write");
    let t = e.eventually("the new maximum in the twin", |e| {
        e.twin("default/oven-1")
            .filter(|t| t["properties"]["setpoint"]["maximum"] == "50")
    });
    let refusal = &t["properties"]["setpoint"]["writeError"];
    assert_eq!(refusal["desired"], "80", "{t}");
    assert!(
        refusal["message"]
            .as_str()
            .is_some_and(|m| m.contains("80 is above the model maximum 50")),
        "{t}"
    );
}

/// A restart on the same files takes the last start's result instead of parsing them again;
/// a file edited while edgecore was stopped is parsed, and its change applies.
#[test]
fn a_restart_reads_back_unchanged_manifests_and_parses_edited_ones() {
    let mut e = Edgecore::start(None);
    e.restart(false);
    assert!(
        e.log().contains("read back instead of parsing"),
        "{}",
        e.log()
    );
    // A new file: parsed, with its problem.
    std::fs::write(e.manifests.join("broken.yaml"), "kind: Device\nspec: [").expect("write");
    e.restart(false);
    assert!(!e.log().contains("read back instead of parsing"));
    e.restart(false);
    let log = e.log();
    assert!(log.contains("read back instead of parsing"), "{log}");
    assert!(
        log.contains("broken.yaml"),
        "its problems are still said: {log}"
    );
    let t = e.twin("default/oven-1").expect("twin");
    assert_eq!(desired(&t, "setpoint").as_deref(), Some("80"));
    e.stop(false);
    std::fs::write(
        e.manifests.join("oven.yaml"),
        MANIFEST.replace("value: \"80\"", "value: \"95\""),
    )
    .expect("write");
    e.restart(false);
    let log = e.log();
    assert!(!log.contains("read back instead of parsing"), "{log}");
    let t = e.twin("default/oven-1").expect("twin");
    assert_eq!(desired(&t, "setpoint").as_deref(), Some("95"));
    e.restart(true);
    assert!(e.log().contains("read back instead of parsing"));
    let t = e.twin("default/oven-1").expect("twin");
    assert_eq!(desired(&t, "setpoint").as_deref(), Some("95"));
}

/// A page follows the values of the devices on its screen (`?devices=`): another device's new
/// values do not reach it, its removal does, and the followed device's values do.
#[test]
fn an_event_stream_carries_the_values_of_the_devices_it_follows_only() {
    use std::io::Write;
    let e = Edgecore::start(None);
    std::fs::write(
        e.manifests.join("oven-2.yaml"),
        common::MANIFEST
            .split("\n---\n")
            .filter(|d| d.contains("kind: Device\n"))
            .collect::<Vec<_>>()
            .join("\n---\n")
            .replace("name: oven-1", "name: oven-2"),
    )
    .expect("a second oven");
    e.eventually("oven-2", |e| e.twin("default/oven-2"));
    let addr = e.http.trim_start_matches("http://").to_string();
    let mut c = std::net::TcpStream::connect(&addr).expect("connected");
    write!(
        c,
        "GET /api/v1/events?devices=default/oven-1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )
    .expect("sent");
    c.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    let lines = sim::lines(c, |l| l.strip_prefix("data: ").map(str::to_string));
    // oven-2's new desired value: not for this reader. Then oven-1's, which is.
    for (oven, value) in [("oven-2", 91), ("oven-1", 92)] {
        let path = format!("/api/v1/devices/default/{oven}/desired");
        let (s, _) = e.put(&path, &format!(r#"{{"setpoint": {value}}}"#));
        assert_eq!(s, 200);
    }
    let mut seen = Vec::new();
    loop {
        let data = lines
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("oven-1's change");
        let v: serde_json::Value = serde_json::from_str(&data).expect("JSON");
        seen.push(v.clone());
        if v["id"] == "default/oven-1" && v["properties"]["setpoint"]["desired"]["value"] == "92" {
            break;
        }
    }
    // (Its row may come, the first time the feed sees it: a state is every reader's.)
    assert!(
        seen.iter()
            .filter(|v| v["id"] == "default/oven-2")
            .all(|v| v["properties"] == serde_json::json!({})),
        "oven-2's values reached a reader that does not follow it: {seen:?}"
    );
    // oven-2 removed: every reader hears of it.
    std::fs::remove_file(e.manifests.join("oven-2.yaml")).expect("removed");
    let gone = (0..100)
        .filter_map(|_| lines.recv_timeout(std::time::Duration::from_secs(30)).ok())
        .map(|d| serde_json::from_str::<serde_json::Value>(&d).expect("JSON"))
        .find(|v| v["id"] == "default/oven-2")
        .expect("oven-2's removal");
    assert_eq!(gone["removed"], true, "{gone}");
    assert_eq!(gone["properties"], serde_json::json!({}), "{gone}");
}
