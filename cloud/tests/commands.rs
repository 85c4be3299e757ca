//! `cloudcore gettoken`, `token` and `node` as an operator types them on a cloud host: they work
//! on the files of the cloudcore that runs, never make a CA of their own, and leave the files
//! they write with the owner the service runs as.

use std::path::Path;
use std::process::{Command, Output};

fn cloudcore(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cloudcore"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("cloudcore runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Every file below `dir`, by path.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap_or(&p).display().to_string());
            if p.is_dir() {
                todo.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_command_before_cloudcore_ever_ran_makes_no_ca_and_says_what_to_do() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("cloudcore.yaml");
    std::fs::write(
        &config,
        format!("dataDir: {}\n", dir.path().join("data").display()),
    )
    .expect("config");
    let cfg = config.to_str().expect("path");
    for args in [
        vec!["gettoken", "--config", cfg],
        vec!["token", "create", "--config", cfg],
        vec!["token", "list", "--config", cfg],
        vec!["node", "revoke", "gw-1", "--config", cfg],
    ] {
        let out = cloudcore(dir.path(), &args);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {said}");
        assert!(
            said.contains("no CA at")
                && said.contains("has not started with this config")
                && said.contains("systemctl enable --now cloudcore"),
            "{args:?}: {said}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: no token printed: {said}");
    }
    // Nothing made: no data directory, no CA that no node could join with.
    assert_eq!(tree(dir.path()), vec!["cloudcore.yaml"]);

    // Without --config, in a folder where cloudcore never ran: the same, and still nothing.
    // (Where the package's /etc/cloudcore/cloudcore.yaml exists, it is the one read.)
    if !Path::new("/etc/cloudcore/cloudcore.yaml").exists() {
        let empty = tempfile::tempdir().expect("dir");
        let out = cloudcore(empty.path(), &["gettoken"]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(text(&out).contains("no CA at"), "{}", text(&out));
        assert!(tree(empty.path()).is_empty(), "{:?}", tree(empty.path()));
    }
}

#[test]
fn tokens_come_from_the_running_cloudcores_ca_and_its_files_keep_their_owner() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().join("data");
    let pki = data.join("pki");
    // The CA the service made at its first start.
    std::fs::create_dir_all(&pki).expect("pki");
    let (ca, _) = pki::load_or_make_ca(&pki).expect("ca");
    let hash = pki::node::ca_hash(&pki::pem_to_der(&ca).expect("der"));
    let config = dir.path().join("cloudcore.yaml");
    std::fs::write(&config, format!("dataDir: {}\n", data.display())).expect("config");
    let cfg = config.to_str().expect("path");

    // The service's files belong to its user; the operator is root (`sudo cloudcore ...`).
    let root = sim::is_root();
    let service = 65534; // nobody, standing for the `cloudcore` user
    if root {
        for p in [&data, &pki, &pki.join("ca.crt"), &pki.join("ca.key")] {
            std::os::unix::fs::chown(p, Some(service), Some(service)).expect("chown");
        }
    } else {
        eprintln!("not root: the owners of the files root writes are not checked");
    }
    let out = cloudcore(dir.path(), &["gettoken", "--config", cfg]);
    assert!(out.status.success(), "{}", text(&out));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        token.starts_with(&format!("{hash}.")),
        "a token of the service's CA: {token}"
    );
    let out = cloudcore(
        dir.path(),
        &["token", "create", "--node", "gw-2", "--config", cfg],
    );
    assert!(out.status.success(), "{}", text(&out));
    let listed = cloudcore(dir.path(), &["token", "list", "--config", cfg]);
    assert!(text(&listed).contains("gw-2"), "{}", text(&listed));
    if root {
        for f in ["join-tokens.json", "join-tokens.lock"] {
            let m = std::fs::metadata(pki.join(f)).expect(f);
            assert_eq!(
                (m.uid(), m.gid()),
                (service, service),
                "{f}: left to the service's user, not root's"
            );
            assert_eq!(m.mode() & 0o777, 0o600, "{f}");
        }
    }
}
