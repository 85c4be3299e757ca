//! `edgecore join` as a user runs it on a bare gateway, against a cloudcore started by the test:
//! a token whose CA hash is not the cloud's, an expired token, a good one (from a file), a node
//! already joined, `--force`, a join cut after the certificate (as `kill -9` would leave it);
//! each outcome said, nothing half-written; then the node runs on the config join wrote and
//! shows Ready in the cloud; `edgecore reset` (and `--all`). And `kectl debug collect` on a
//! running node (what matters in the bundle, none of the secrets it was given) and `kectl
//! debug check`.

use sim::stack::Cloud;
use sim::{Proc, bin, eventually};
use std::path::Path;
use std::process::Command;

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(bin("edgecore"))
        .args(args)
        .output()
        .expect("edgecore runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits for `node`'s Node to be Ready.
fn ready(cloud: &Cloud, node: &str) {
    eventually(60, &format!("node {node} Ready"), || {
        let (ok, s) = cloud.kubectl(&[
            "get",
            "node",
            node,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ]);
        (ok && s == "True").then_some(())
    });
}

/// The files under `dir`, with their contents.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut all = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                all.push((
                    p.display().to_string(),
                    std::fs::read(&p).unwrap_or_default(),
                ));
            }
        }
    }
    all.sort();
    all
}

#[test]
fn a_bare_gateway_joins_in_one_command_and_a_bad_join_says_why_and_writes_nothing() {
    let cloud = Cloud::start();
    let root = tempfile::tempdir().expect("tempdir");
    let config = root.path().join("etc/kubeedge/edgecore.yaml");
    let data = root.path().join("var/lib/edgecore");
    let (hub, certs) = (cloud.hub.to_string(), cloud.certs.to_string());
    let base = [
        "join",
        "--cloud",
        "127.0.0.1",
        "--hub-port",
        &hub,
        "--cert-port",
        &certs,
        "--node-name",
        "gw-1",
        "--config",
        config.to_str().expect("path"),
        "--data-dir",
        data.to_str().expect("path"),
        "--no-start",
    ];
    let join = |more: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(more);
        run(&args)
    };
    let token = cloud.token();

    // A token naming another CA (a cloud rebuilt, or a man in the middle): refused, nothing
    // written.
    let (_, rest) = token.split_once('.').expect("a token");
    let other = format!("{}.{rest}", "0".repeat(64));
    let (code, _, err) = join(&["--token", &other]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("failed to validate the CA certificate"),
        "{err}"
    );
    assert!(!config.exists(), "no config after a refused join");
    assert!(!data.join("certs/edge.crt").exists(), "{err}");

    // An expired token: the cloud's words.
    let expired = cloud.cli(&["token", "create", "--ttl-hours", "0"]);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let (code, _, err) = join(&["--token", &expired]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("expired"), "{err}");
    assert!(!config.exists());

    // Not a token at all; a name that cannot be a node's.
    let (code, _, err) = join(&["--token", "hello"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("is not a join token"), "{err}");

    // The good token, from a file (not on the command line, where `ps` shows it).
    let token_file = root.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).expect("write");
    let (code, out, err) = join(&["--token-file", token_file.to_str().expect("path")]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("the cloud's CA matches the token"), "{out}");
    assert!(out.contains("config written to"), "{out}");
    assert!(out.contains("not started (--no-start)"), "{out}");
    let written = std::fs::read_to_string(&config).expect("config");
    assert!(!written.contains(&token), "the token is not kept");
    assert!(
        data.join("manifests").is_dir(),
        "the manifests directory the config names is there: {out}"
    );
    use std::os::unix::fs::PermissionsExt;
    for f in [
        config.clone(),
        data.join("certs/edge.key"),
        data.join("certs/edge.crt"),
    ] {
        let mode = std::fs::metadata(&f).expect("file").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", f.display());
    }

    // Joined: a second join is refused and changes nothing. --force asks anew, and the cloud
    // refuses a second certificate for a name whose certificate is valid (a leaked token
    // cannot take over a joined node), saying how; the node keeps what it had. Once that
    // certificate is revoked in the cloud, --force replaces the identity.
    let before = files(root.path());
    let (code, _, err) = join(&["--token", &token]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("already joined as gw-1") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(files(root.path()), before, "a refused join changes nothing");
    let (code, _, err) = join(&["--token", &token, "--force"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("cloudcore node revoke gw-1"), "{err}");
    assert_eq!(
        files(root.path()),
        before,
        "a refused --force changes nothing"
    );
    cloud.cli(&["node", "revoke", "gw-1"]);
    let (code, out, err) = join(&["--token", &token, "--force"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let cert = |p: &Path| std::fs::read(p.join("certs/edge.crt")).expect("certificate");
    assert_ne!(
        before
            .iter()
            .find(|(p, _)| p.ends_with("certs/edge.crt"))
            .map(|(_, c)| c.clone()),
        Some(cert(&data)),
        "a new certificate"
    );

    // Cut after the certificate, before the config (what kill -9 there leaves): not joined;
    // join again finishes with the certificate it got.
    let got = cert(&data);
    std::fs::remove_file(&config).expect("remove");
    let (code, out, err) = join(&[
        "--token",
        &token,
        "--label",
        "site=plant-3",
        "--mapper",
        "modbus",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("mapper-modbus not started (--no-start); start it with: mapper-modbus --config-file /etc/kubeedge/mappers/modbus.yaml"),
        "{out}"
    );
    assert_eq!(
        cert(&data),
        got,
        "the unfinished join's certificate is kept"
    );

    // The node runs on what join wrote, with no token, and the cloud sees it.
    let edge = Proc::spawn(
        &bin("edgecore"),
        &["--config", config.to_str().expect("path")],
        root.path(),
        "edgecore.log",
    );
    ready(&cloud, "gw-1");
    let log = std::fs::read_to_string(root.path().join("edgecore.log")).unwrap_or_default();
    assert!(
        !log.contains("cannot list the manifests directory"),
        "a joined node is not degraded by a directory nobody made: {log}"
    );
    // Its label, as join was given it.
    eventually(30, "gw-1's label", || {
        let (ok, site) = cloud.kubectl(&[
            "get",
            "node",
            "gw-1",
            "-o",
            "jsonpath={.metadata.labels.site}",
        ]);
        (ok && site == "plant-3").then_some(())
    });
    let reset = |more: &[&str]| {
        let mut args = vec![
            "reset",
            "--no-stop",
            "--config",
            config.to_str().expect("path"),
        ];
        args.extend_from_slice(more);
        run(&args)
    };
    // Not under a running edgecore.
    let (code, _, err) = reset(&[]);
    assert_eq!(code, Some(1));
    assert!(err.contains("still runs"), "{err}");
    assert!(config.exists() && data.join("certs/edge.crt").exists());
    drop(edge);

    // Reset: the cloud revokes the node's certificates (so the name can join again with a
    // token, no `cloudcore node revoke` needed); certificates and config gone; twins kept.
    let (code, out, err) = reset(&[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("revoked node gw-1's certificates"), "{out}");
    assert!(
        out.contains("edgecore.db"),
        "the twin store is kept and said: {out}"
    );
    assert!(!config.exists() && !data.join("certs").exists());
    assert!(data.join("edgecore.db").exists());
    let (code, _, err) = reset(&[]);
    assert_eq!(code, Some(1), "twice: nothing to reset");
    assert!(err.contains("nothing to reset"), "{err}");
    let (code, out, err) = join(&["--token", &token]);
    assert_eq!(code, Some(0), "joined again after reset: {out}{err}");
    // --all: nothing of the node is left.
    let (code, out, err) = reset(&["--all"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(!data.exists() && !config.exists(), "{out}");
}

/// Every file of a `tar.gz`, unpacked by the system's `tar` into `dir`, with its text.
fn unpack(archive: &Path, dir: &Path) -> Vec<(String, String)> {
    let status = Command::new("tar")
        .arg("xzf")
        .arg(archive)
        .arg("-C")
        .arg(dir)
        .status()
        .expect("tar");
    assert!(status.success(), "the bundle unpacks with tar");
    files(dir)
        .into_iter()
        .map(|(p, b)| (p, String::from_utf8_lossy(&b).into_owned()))
        .collect()
}

#[test]
fn a_support_bundle_says_what_matters_and_holds_no_secret() {
    let cloud = Cloud::start();
    let root = tempfile::tempdir().expect("tempdir");
    let (http, mqtt) = (sim::free_port(), sim::free_port());
    let api_token = "api-token-0815-do-not-leak";
    let token_file = root.path().join("api-token");
    std::fs::write(&token_file, format!("{api_token}\n")).expect("write");
    let join_token = cloud.token();
    let config = root.path().join("edgecore.yaml");
    std::fs::write(
        &config,
        format!(
            "nodeName: gw-9\ndataDir: data\nhttp: {{address: \"127.0.0.1:{http}\", tokenFile: \"{}\"}}\nmqtt: {{address: \"127.0.0.1:{mqtt}\", password: \"mqtt-pass-4711-secret\"}}\n{}",
            token_file.display(),
            cloud.edge_config()
        ),
    )
    .expect("config");
    let edge = Proc::spawn(
        &bin("edgecore"),
        &["--config", config.to_str().expect("path")],
        root.path(),
        "edgecore.log",
    );
    ready(&cloud, "gw-9");
    let kectl = |args: &[&str]| {
        let out = Command::new(bin("kectl"))
            .args(args)
            .output()
            .expect("kectl");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let bundle = root.path().join("bundle.tar.gz");
    let log = root.path().join("edgecore.log");
    let (code, out, err) = kectl(&[
        "debug",
        "collect",
        "--config",
        config.to_str().expect("path"),
        "-o",
        bundle.to_str().expect("path"),
        "--log",
        log.to_str().expect("path"),
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&bundle)
        .expect("bundle")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let unpacked = root.path().join("unpacked");
    std::fs::create_dir(&unpacked).expect("dir");
    let all = unpack(&bundle, &unpacked);
    let file = |name: &str| {
        all.iter()
            .find(|(p, _)| p.ends_with(name))
            .map(|(_, t)| t.clone())
            .unwrap_or_else(|| {
                panic!(
                    "{name} in the bundle: {:?}",
                    all.iter().map(|f| &f.0).collect::<Vec<_>>()
                )
            })
    };
    // What matters is there.
    assert!(
        file("api/healthz.txt").starts_with("200"),
        "{}",
        file("api/healthz.txt")
    );
    assert!(
        file("api/metrics.txt").contains("edgecore_"),
        "the node's counters"
    );
    assert!(file("certificate.txt").contains("system:node:gw-9"));
    assert!(file("store.txt").contains("edgecore.db"));
    assert!(file("edgecore.yaml").contains("REDACTED"));
    assert!(file("edgecore.yaml").contains("nodeName: gw-9"));
    assert!(file("check.txt").contains("reachable"));
    assert!(!file("logs.txt").trim().is_empty(), "the log's last lines");
    // And no secret: the join token (whole and its JWT), the API's token, the MQTT password,
    // the node's private key.
    let key = std::fs::read_to_string(root.path().join("data/certs/edge.key")).expect("key");
    let key_body: Vec<&str> = key.lines().filter(|l| !l.starts_with("-----")).collect();
    let jwt = join_token.split_once('.').expect("token").1;
    for (path, text) in &all {
        for secret in [join_token.as_str(), jwt, api_token, "mqtt-pass-4711-secret"] {
            assert!(!text.contains(secret), "{path} holds a secret");
        }
        for line in &key_body {
            assert!(!text.contains(line), "{path} holds the node's key");
        }
    }

    // The prerequisites, a line each; the cloud away is a failure (exit 1) naming it.
    let check =
        |config: &Path| kectl(&["debug", "check", "--config", config.to_str().expect("path")]);
    let (code, out, err) = check(&config);
    assert!(out.contains("ok   cloud: wss://127.0.0.1"), "{out}{err}");
    assert!(
        out.contains("ok   certificate:") && out.contains("expires in"),
        "{out}"
    );
    assert!(out.contains("disk:") && out.contains("time sync:"), "{out}");
    assert_eq!(code, Some(0), "{out}{err}");
    drop(edge);
    drop(cloud);
    let (code, out, _) = check(&config);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("FAIL cloud: wss://127.0.0.1"), "{out}");
}

/// The `--flags` of the command lines starting with one of `commands` (and their `#`
/// continuation lines) in the README's code block after `start`.
fn readme_flags(start: &str, commands: &[&str]) -> Vec<String> {
    let readme = std::fs::read_to_string(sim::workspace_root().join("README.md")).expect("README");
    let at = readme
        .find(start)
        .unwrap_or_else(|| panic!("{start:?} in the README"));
    let block = &readme[at..];
    let open = block.find("```sh").expect("a code block");
    let close = block[open + 5..].find("```").expect("its end") + open + 5;
    let mut taken = false;
    let mut flags: Vec<String> = Vec::new();
    for line in block[open..close].lines() {
        let line = line.trim_start_matches("sudo ");
        taken = commands.iter().any(|c| line.starts_with(c)) || (taken && line.starts_with('#'));
        if taken {
            flags.extend(
                line.split(|c: char| c.is_whitespace() || matches!(c, '[' | ']' | '='))
                    .filter(|w| w.starts_with("--") && w.len() > 2)
                    .map(str::to_string),
            );
        }
    }
    flags.sort();
    flags.dedup();
    flags
}

#[test]
fn the_help_of_each_command_has_the_options_the_readme_gives() {
    let help = |args: &[&str]| {
        let out = Command::new(bin("edgecore"))
            .args(args)
            .output()
            .expect("edgecore");
        assert!(out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let join_reset = format!(
        "{}{}",
        help(&["join", "--help"]),
        help(&["reset", "--help"])
    );
    let flags = readme_flags(
        "**Joining a gateway in one command**",
        &["edgecore join", "edgecore reset"],
    );
    assert!(flags.len() >= 12, "{flags:?}");
    for f in &flags {
        assert!(
            join_reset.contains(f.as_str()),
            "{f} is in the README, not in --help"
        );
    }
    let package = Command::new(sim::workspace_root().join("scripts/package"))
        .arg("--help")
        .output()
        .expect("scripts/package");
    let package = String::from_utf8_lossy(&package.stdout);
    let flags = readme_flags(
        "## Installing on gateways and cloud hosts",
        &["scripts/package"],
    );
    assert!(!flags.is_empty());
    for f in flags {
        assert!(
            package.contains(f.as_str()),
            "scripts/package --help lacks {f}"
        );
    }
    let debug = help(&["debug", "collect", "--help"]);
    for f in ["--output", "--log", "--config"] {
        assert!(debug.contains(f), "{f}: {debug}");
    }
}
