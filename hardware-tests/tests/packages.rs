//! `scripts/package`'s Debian packages, as an operator meets them: built from the workspace's
//! binaries, checked with `systemd-analyze verify`, installed with Debian's `dpkg` into a fresh
//! root made by the test (`--root`, the maintainer scripts run chrootless with `DPKG_ROOT`),
//! then: cloudcore started as its unit says (its user, no capabilities, no new privileges,
//! emulated with `setpriv`), a gateway joined with the installed `edgecore join` and run as
//! its unit says, a Device reaching its twin, `edgecore reset`, `dpkg --remove` keeping the
//! data, `dpkg --purge` leaving nothing of the packages.
//!
//! Runs as root (`dpkg --root`, `setpriv`); Debian's dpkg, systemd (for `systemd-analyze`) and
//! util-linux (`setpriv`) are on the machine `scripts/test` sets up.

use sim::containerd::run as ok;
use sim::{Proc, eventually, free_port, workspace_root};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every file and directory under `dir` (relative), but those named in `except`.
fn tree(dir: &Path, except: &[&str]) -> Vec<String> {
    let mut all = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let rel = p
                .strip_prefix(dir)
                .map(|r| r.display().to_string())
                .unwrap_or_default();
            if except
                .iter()
                .any(|x| rel == *x || rel.starts_with(&format!("{x}/")))
            {
                continue;
            }
            if p.is_dir() && !p.is_symlink() {
                todo.push(p);
            }
            all.push(rel);
        }
    }
    all.sort();
    all
}

/// The line `key=...` of a unit's `[Service]`.
fn unit_value(unit: &str, key: &str) -> String {
    unit.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_default()
        .to_string()
}

/// The `setpriv` arguments emulating a unit's user, `NoNewPrivileges` and
/// `CapabilityBoundingSet` (with `ids` for the user's uid and gid).
fn sandbox(unit: &str, ids: Option<(u32, u32)>) -> Vec<String> {
    let mut args = Vec::new();
    if let Some((uid, gid)) = ids {
        args.extend([
            format!("--reuid={uid}"),
            format!("--regid={gid}"),
            "--clear-groups".into(),
        ]);
    }
    if unit_value(unit, "NoNewPrivileges") == "yes" {
        args.push("--no-new-privs".into());
    }
    let caps: Vec<String> = unit_value(unit, "CapabilityBoundingSet")
        .split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_ascii_lowercase()))
        .collect();
    let mut bounding = vec!["-all".to_string()];
    bounding.extend(caps);
    args.push(format!("--bounding-set={}", bounding.join(",")));
    args.push("--inh-caps=-all".into());
    args
}

/// A user's uid and gid in `root`'s /etc/passwd.
fn passwd_entry(root: &Path, name: &str) -> (u32, u32) {
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).expect("passwd");
    let line = passwd
        .lines()
        .find(|l| l.starts_with(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no user {name}: {passwd}"));
    let f: Vec<&str> = line.split(':').collect();
    (f[2].parse().expect("uid"), f[3].parse().expect("gid"))
}

#[test]
fn packages_install_into_a_fresh_root_join_a_node_and_purge_to_nothing() {
    let work = tempfile::tempdir().expect("tempdir");
    let debs_dir = work.path().join("debs");
    // The builder's name and address, as Debian's tools take them (a machine without git's
    // user would otherwise get the placeholder, which lintian rightly refuses).
    let maintainer = "Package Builder <builder@packages.example.org>";
    let made = sim::package(
        &debs_dir,
        &[],
        &[
            ("DEBFULLNAME", "Package Builder"),
            ("DEBEMAIL", "builder@packages.example.org"),
        ],
    );
    let field = |deb: &Path, f: &str| {
        ok(Command::new("dpkg-deb").args(["-f"]).arg(deb).arg(f))
            .trim()
            .to_string()
    };
    // Each package, then its debug symbols (the binaries are stripped).
    let (dbgsym, debs): (Vec<PathBuf>, Vec<PathBuf>) = made
        .into_iter()
        .partition(|d| field(d, "Package").ends_with("-dbgsym"));
    let names: Vec<String> = debs.iter().map(|d| field(d, "Package")).collect();
    assert_eq!(
        names,
        [
            "edgecore",
            "cloudcore",
            "mapper-modbus",
            "mapper-serial",
            "mapper-opcua",
            "mapper-ble"
        ]
    );
    let symbols: Vec<String> = dbgsym.iter().map(|d| field(d, "Package")).collect();
    assert_eq!(
        symbols,
        names
            .iter()
            .map(|n| format!("{n}-dbgsym"))
            .collect::<Vec<_>>()
    );
    // What the binaries link, as dpkg-shlibdeps reads it: a glibc too old refuses the package.
    for (deb, name) in debs.iter().zip(&names) {
        let depends = field(deb, "Depends");
        assert!(depends.contains("libc6 (>= 2."), "{name}: {depends}");
        if name.starts_with("mapper-") {
            assert!(depends.contains("edgecore (>= "), "{name}: {depends}");
        }
        let contents = ok(Command::new("dpkg-deb").arg("-c").arg(deb));
        assert!(
            contents.contains(&format!("./usr/share/doc/{name}/copyright")),
            "{name}: {contents}"
        );
    }
    // Debian's policy checker: nothing but what each package's overrides explain.
    let lint = Command::new("lintian")
        .args(["--tag-display-limit", "0"])
        .args(&debs)
        .args(&dbgsym)
        .output()
        .expect("lintian (scripts/test installs it)");
    let said = String::from_utf8_lossy(&lint.stdout);
    assert!(
        lint.status.success()
            && !said
                .lines()
                .any(|l| l.starts_with("E:") || l.starts_with("W:")),
        "lintian: {said}{}",
        String::from_utf8_lossy(&lint.stderr)
    );
    assert_eq!(field(&debs[0], "Maintainer"), maintainer);
    assert_eq!(field(&debs[0], "Suggests"), "containerd");
    assert_eq!(
        field(&debs[0], "Recommends"),
        "",
        "no containerd pulled onto every gateway"
    );
    let version = ok(Command::new("dpkg-deb")
        .arg("-f")
        .arg(&debs[0])
        .arg("Version"));
    let workspace =
        std::fs::read_to_string(workspace_root().join("Cargo.toml")).expect("Cargo.toml");
    assert!(
        workspace.contains(&format!("version = \"{}\"", version.trim())),
        "the workspace's version: {version}"
    );

    // A fresh root: dpkg's database and the files useradd edits, nothing else.
    let root = work.path().join("root");
    for d in [
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/lib/dpkg/triggers",
        "etc",
    ] {
        std::fs::create_dir_all(root.join(d)).expect("dir");
    }
    for (f, text) in [
        ("var/lib/dpkg/status", ""),
        ("var/lib/dpkg/available", ""),
        ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
        ("etc/group", "root:x:0:\n"),
        ("etc/shadow", "root:*:20000:0:99999:7:::\n"),
        ("etc/gshadow", "root:*::\n"),
    ] {
        std::fs::write(root.join(f), text).expect("write");
    }
    std::fs::copy("/etc/login.defs", root.join("etc/login.defs")).expect("login.defs");
    use std::os::unix::fs::PermissionsExt;
    // Its users must reach their directories through it.
    for d in [work.path(), root.as_path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let dpkg = |args: &[&str]| {
        let mut c = Command::new("dpkg");
        c.arg(format!("--root={}", root.display()))
            .args(["--force-script-chrootless", "--force-depends"])
            .arg(format!("--log={}", work.path().join("dpkg.log").display()))
            .args(args);
        c
    };
    let mut install = dpkg(&["--install"]);
    install.args(&debs);
    let said = ok(&mut install);
    assert!(said.contains("edgecore join --cloud HOST"), "{said}");
    let sections = ok(Command::new("readelf")
        .arg("-S")
        .arg(root.join("usr/bin/edgecore")));
    assert!(!sections.contains(".debug_info"), "stripped: {sections}");
    old_glibc_refuses(&debs[0], work.path());
    let query = |package: &str, field: &str| {
        ok(Command::new("dpkg-query")
            .arg(format!(
                "--admindir={}",
                root.join("var/lib/dpkg").display()
            ))
            .args(["-W", &format!("-f=${{{field}}}"), package]))
    };
    assert!(query("cloudcore", "Conffiles").contains("/etc/cloudcore/cloudcore.yaml"));
    assert!(query("mapper-modbus", "Conffiles").contains("/etc/kubeedge/mappers/modbus.yaml"));
    assert_eq!(query("edgecore", "Status").trim(), "install ok installed");
    let mode = |p: &Path| std::fs::metadata(p).expect("there").permissions().mode() & 0o777;
    assert_eq!(mode(&root.join("var/lib/edgecore")), 0o700);
    assert_eq!(mode(&root.join("var/lib/cloudcore")), 0o700);
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).expect("passwd");
    let user = passwd
        .lines()
        .find(|l| l.starts_with("cloudcore:"))
        .expect("the cloudcore user");
    let fields: Vec<&str> = user.split(':').collect();
    let (uid, gid): (u32, u32) = (
        fields[2].parse().expect("uid"),
        fields[3].parse().expect("gid"),
    );
    assert!(uid > 0 && uid < 1000, "a system user: {user}");
    assert!(user.ends_with(":/usr/sbin/nologin"), "{user}");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(root.join("var/lib/cloudcore"))
            .expect("dir")
            .uid(),
        uid
    );
    // A mapper's config points at the packaged edgecore's DMI socket, shared with the mappers'
    // group, and keeps its own socket and data in its runtime and state directories.
    let modbus =
        std::fs::read_to_string(root.join("etc/kubeedge/mappers/modbus.yaml")).expect("conf");
    for line in [
        "edgecore_sock: /run/edgecore/dmi.sock",
        "socket_path: /run/mapper-modbus/mapper.sock",
        "data_dir: /var/lib/mapper-modbus",
    ] {
        assert!(modbus.contains(line), "{line}: {modbus}");
    }
    // Each mapper has its own system user, in the group that reaches edgecore's DMI socket.
    let group = std::fs::read_to_string(root.join("etc/group")).expect("group");
    let mappers_gid: u32 = group
        .lines()
        .find_map(|l| {
            l.strip_prefix("kubeedge-mappers:x:")?
                .split(':')
                .next()?
                .parse()
                .ok()
        })
        .expect("the kubeedge-mappers group");
    let mapper_user = passwd_entry(&root, "mapper-modbus");
    assert!(
        group.lines().any(|l| l.starts_with("kubeedge-mappers:")
            && l.rsplit(':')
                .next()
                .is_some_and(|m| m.split(',').any(|u| u == "mapper-modbus"))),
        "{group}"
    );
    // Its REST API needs the token postinst made, which only its owner reads.
    assert!(
        modbus.contains("http_token_file: /etc/kubeedge/mappers/modbus.token"),
        "{modbus}"
    );
    let token_file = root.join("etc/kubeedge/mappers/modbus.token");
    let meta = std::fs::metadata(&token_file).expect("the mapper's token");
    assert_eq!(
        (meta.mode() & 0o777, meta.uid()),
        (0o600, mapper_user.0),
        "the token is the mapper's alone"
    );
    let mapper_token = std::fs::read_to_string(&token_file).expect("token");
    assert!(mapper_token.trim().len() >= 32, "{mapper_token:?}");

    // The units: clean for systemd-analyze verify (with systemd's own units beside them).
    let units = root.join("lib/systemd/system");
    let scratch = work.path().join("verify");
    std::fs::create_dir_all(scratch.join("usr/lib/systemd")).expect("dir");
    ok(Command::new("cp")
        .arg("-a")
        .arg("/lib/systemd/system")
        .arg(scratch.join("usr/lib/systemd/")));
    ok(Command::new("cp")
        .arg("-a")
        .arg(root.join("usr"))
        .arg(&scratch));
    let mut names = Vec::new();
    for e in std::fs::read_dir(&units).expect("units").flatten() {
        std::fs::copy(
            e.path(),
            scratch.join("usr/lib/systemd/system").join(e.file_name()),
        )
        .expect("copy");
        names.push(format!(
            "/usr/lib/systemd/system/{}",
            e.file_name().to_string_lossy()
        ));
    }
    assert_eq!(names.len(), 6, "{names:?}");
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", scratch.display()))
        .args(&names)
        .output()
        .expect("systemd-analyze");
    let said = String::from_utf8_lossy(&verify.stderr);
    assert!(
        verify.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );

    // cloudcore as its unit runs it: its user, its sandbox (the config's paths and ports moved
    // into this root).
    let cloud_unit = std::fs::read_to_string(units.join("cloudcore.service")).expect("unit");
    assert_eq!(
        unit_value(&cloud_unit, "ExecStart"),
        "/usr/bin/cloudcore --config /etc/cloudcore/cloudcore.yaml"
    );
    let (api, hub, certs) = (free_port(), free_port(), free_port());
    let cloud_config = work.path().join("cloudcore.yaml");
    let packaged =
        std::fs::read_to_string(root.join("etc/cloudcore/cloudcore.yaml")).expect("conf");
    std::fs::write(
        &cloud_config,
        packaged
            .replace(
                "/var/lib/cloudcore",
                &root.join("var/lib/cloudcore").display().to_string(),
            )
            .replace("127.0.0.1:6443", &format!("127.0.0.1:{api}"))
            .replace("0.0.0.0:10000", &format!("127.0.0.1:{hub}"))
            .replace("0.0.0.0:10002", &format!("127.0.0.1:{certs}"))
            + "  metrics:\n    listen: \"\"\n",
    )
    .expect("write");
    std::fs::set_permissions(&cloud_config, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let as_cloudcore = |args: &[&str]| {
        let mut a = sandbox(&cloud_unit, Some((uid, gid)));
        a.push("--".into());
        a.push(root.join("usr/bin/cloudcore").display().to_string());
        a.extend(args.iter().map(|s| s.to_string()));
        a.extend(["--config".to_string(), cloud_config.display().to_string()]);
        a
    };
    let args = as_cloudcore(&[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _cloud = Proc::spawn(
        Path::new("/usr/bin/setpriv"),
        &args,
        work.path(),
        "cloudcore.log",
    );
    let kubeconfig = root.join("var/lib/cloudcore/admin.kubeconfig");
    let kubectl = |args: &[&str]| sim::stack::kubectl_with(&kubeconfig, None, args);
    eventually(60, "cloudcore's API", || {
        kubectl(&["get", "nodes"]).0.then_some(())
    });
    // The token as an operator gets it: `sudo cloudcore gettoken`, as root, on the service's
    // files; they stay the service user's, or its next join would be refused.
    let token = ok(Command::new(root.join("usr/bin/cloudcore"))
        .args(["gettoken", "--config"])
        .arg(&cloud_config))
    .trim()
    .to_string();
    {
        use std::os::unix::fs::MetadataExt;
        let pki = root.join("var/lib/cloudcore/pki");
        for f in ["join-tokens.json", "join-tokens.lock", "ca.crt", "ca.key"] {
            let m = std::fs::metadata(pki.join(f)).expect(f);
            assert_eq!((m.uid(), m.gid()), (uid, gid), "{f} stays cloudcore's");
        }
    }

    // The gateway: joined with the installed edgecore, then run as its unit runs it.
    let edge_unit = std::fs::read_to_string(units.join("edgecore.service")).expect("unit");
    assert_eq!(
        unit_value(&edge_unit, "ExecStart"),
        "/usr/bin/edgecore --config /etc/kubeedge/edgecore.yaml"
    );
    let edge_config = root.join("etc/kubeedge/edgecore.yaml");
    let joined = ok(Command::new(root.join("usr/bin/edgecore"))
        .args([
            "join",
            "--cloud",
            "127.0.0.1",
            "--hub-port",
            &hub.to_string(),
        ])
        .args([
            "--cert-port",
            &certs.to_string(),
            "--node-name",
            "pkg-node",
            "--token",
            &token,
        ])
        .arg("--config")
        .arg(&edge_config)
        .arg("--data-dir")
        .arg(root.join("var/lib/edgecore"))
        // (This root's group, which the host's /etc/group does not have: by number; the
        // socket under this root's /run.)
        .args(["--dmi-group", &mappers_gid.to_string(), "--dmi-socket"])
        .arg(root.join("run/edgecore/dmi.sock")));
    assert!(
        joined.contains("systemd is not running here; start it with: edgecore --config"),
        "{joined}"
    );
    // Its local listeners moved off the default ports, as an operator might.
    let (http, mqtt) = (free_port(), free_port());
    let mut text = std::fs::read_to_string(&edge_config).expect("config");
    text.push_str(&format!(
        "http: {{address: \"127.0.0.1:{http}\"}}\nmqtt: {{address: \"127.0.0.1:{mqtt}\"}}\n"
    ));
    std::fs::write(&edge_config, text).expect("write");
    let mut args = sandbox(&edge_unit, None);
    args.extend([
        "--".into(),
        root.join("usr/bin/edgecore").display().to_string(),
        "--config".into(),
        edge_config.display().to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let edge = Proc::spawn(
        Path::new("/usr/bin/setpriv"),
        &args,
        work.path(),
        "edgecore.log",
    );
    eventually(60, "node pkg-node Ready", || {
        let (ok, s) = kubectl(&[
            "get",
            "node",
            "pkg-node",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ]);
        (ok && s == "True").then_some(())
    });
    // A Device for it reaches its twin.
    let manifest = std::fs::read_to_string(workspace_root().join("examples/modbus-tcp.yaml"))
        .expect("example")
        .replace("nodeName: edge-node-1", "nodeName: pkg-node");
    let file = work.path().join("oven.yaml");
    std::fs::write(&file, manifest).expect("write");
    assert!(kubectl(&["apply", "-f", file.to_str().expect("path")]).0);
    eventually(60, "the oven's twin on the gateway", || {
        let out = Command::new(root.join("usr/bin/kectl"))
            .args([
                "twin",
                "get",
                "oven-1",
                "--json",
                "--server",
                &format!("http://127.0.0.1:{http}"),
            ])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .contains("temperature")
            .then_some(())
    });
    // edgecore shares its DMI socket with the mappers' group, and nothing else.
    let socket = std::fs::metadata(root.join("run/edgecore/dmi.sock")).expect("socket");
    assert_eq!((socket.gid(), socket.mode() & 0o777), (mappers_gid, 0o660));
    let run = std::fs::metadata(root.join("run/edgecore")).expect("dir");
    assert_eq!((run.gid(), run.mode() & 0o777), (mappers_gid, 0o750));
    // A mapper as its unit runs it (its own user, in kubeedge-mappers, without any capability,
    // no new privileges), on its packaged config with the paths moved into this root, and its
    // runtime and state directories made as systemd makes them: it registers with edgecore
    // through the shared socket, and cannot read the node's key.
    let mapper_unit = std::fs::read_to_string(units.join("mapper-modbus.service")).expect("unit");
    assert_eq!(
        unit_value(&mapper_unit, "ExecStart"),
        "/usr/bin/mapper-modbus --config-file /etc/kubeedge/mappers/modbus.yaml"
    );
    assert_eq!(unit_value(&mapper_unit, "CapabilityBoundingSet"), "");
    let mapper_config = work.path().join("modbus.yaml");
    let mapper_http = free_port();
    std::fs::write(
        &mapper_config,
        modbus
            .replace("/run/", &format!("{}/", root.join("run").display()))
            .replace(
                "/var/lib/mapper-modbus",
                &root.join("var/lib/mapper-modbus").display().to_string(),
            )
            .replace(
                "/etc/kubeedge/mappers/",
                &format!("{}/", root.join("etc/kubeedge/mappers").display()),
            )
            .replace("http_port: 7777", &format!("http_port: {mapper_http}")),
    )
    .expect("write");
    assert_eq!(unit_value(&mapper_unit, "User"), "mapper-modbus");
    for d in ["run/mapper-modbus", "var/lib/mapper-modbus"] {
        std::fs::create_dir_all(root.join(d)).expect("dir");
        std::os::unix::fs::chown(root.join(d), Some(mapper_user.0), Some(mapper_user.1))
            .expect("chown");
    }
    let as_mapper = |args: &mut Vec<String>| {
        args.extend([
            format!("--reuid={}", mapper_user.0),
            format!("--regid={}", mapper_user.1),
            format!("--groups={mappers_gid}"),
        ]);
    };
    let key = root.join("var/lib/edgecore/certs/edge.key");
    assert!(key.exists());
    let mut args = sandbox(&mapper_unit, None);
    as_mapper(&mut args);
    args.extend(["--".into(), "cat".into(), key.display().to_string()]);
    let read = Command::new("setpriv")
        .args(&args)
        .output()
        .expect("setpriv");
    assert!(
        !read.status.success() && read.stdout.is_empty(),
        "the mapper's user read the node's key"
    );
    let mut args = sandbox(&mapper_unit, None);
    as_mapper(&mut args);
    args.extend([
        "--".into(),
        root.join("usr/bin/mapper-modbus").display().to_string(),
        "--config-file".into(),
        mapper_config.display().to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _mapper = Proc::spawn(
        Path::new("/usr/bin/setpriv"),
        &args,
        work.path(),
        "mapper.log",
    );
    eventually(60, "mapper-modbus registered with edgecore", || {
        let listed = ureq::get(&format!("http://127.0.0.1:{http}/api/v1/mappers"))
            .call()
            .ok()?
            .into_body()
            .read_to_string()
            .ok()?;
        listed.contains("modbus").then_some(())
    });
    // Its REST API, asked with curl: nothing without the token (a page's cross-site text/plain
    // POST included), its devices with it.
    let curl = |args: &[&str]| {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
            .args(args)
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let rest = format!("http://127.0.0.1:{mapper_http}/api/v1");
    let write = format!("{rest}/devicemethod/default/oven-1/set-temperature/setpoint");
    assert_eq!(
        curl(&[
            "-X",
            "POST",
            "-H",
            "Content-Type: text/plain",
            "-H",
            "Origin: http://evil.example",
            "-H",
            "Host: evil.example",
            "--data",
            "90",
            &write
        ]),
        "401"
    );
    assert_eq!(curl(&[&format!("{rest}/devices")]), "401");
    let bearer = format!("Authorization: Bearer {}", mapper_token.trim());
    assert_eq!(curl(&["-H", &bearer, &format!("{rest}/devices")]), "200");
    drop(edge);

    // reset, then remove (the data stays), then purge (nothing of the packages is left).
    let reset = ok(Command::new(root.join("usr/bin/edgecore"))
        .args(["reset", "--no-stop", "--config"])
        .arg(&edge_config));
    assert!(
        reset.contains("revoked node pkg-node's certificates"),
        "{reset}"
    );
    assert!(!edge_config.exists());
    let mut remove = dpkg(&["--remove"]);
    remove.args(names_of(&debs));
    ok(&mut remove);
    assert!(
        root.join("var/lib/edgecore/edgecore.db").exists(),
        "remove keeps the data"
    );
    assert!(
        root.join("etc/cloudcore/cloudcore.yaml").exists(),
        "remove keeps conffiles"
    );
    assert!(!root.join("usr/bin/edgecore").exists());
    // The runtime directories go with their units' stop (systemd removes them; here the test
    // made them, so it removes them).
    let _ = std::fs::remove_dir_all(root.join("run"));
    let mut purge = dpkg(&["--purge"]);
    purge.args(names_of(&debs));
    ok(&mut purge);
    let left = tree(
        &root,
        &[
            "var/lib/dpkg",
            "etc/passwd",
            "etc/group",
            "etc/shadow",
            "etc/gshadow",
            "etc/login.defs",
        ],
    );
    // What stays is what Debian keeps: the system user's lines (in the files above), and the
    // empty top directories that were there before (etc, var, var/lib).
    let allowed = ["etc", "var", "var/lib"];
    let extra: Vec<&String> = left
        .iter()
        .filter(|p| !allowed.contains(&p.as_str()) && !p.ends_with('-'))
        .collect();
    assert!(extra.is_empty(), "left after purge: {extra:?}");
}

/// The package names of `debs` (their files' names up to the version).
fn names_of(debs: &[PathBuf]) -> Vec<String> {
    debs.iter()
        .filter_map(|d| {
            d.file_name()?
                .to_str()?
                .split('_')
                .next()
                .map(str::to_string)
        })
        .collect()
}

/// A root whose libc6 is bullseye's (2.31): dpkg refuses to configure edgecore, naming the
/// version it needs, where a `Depends: libc6` without one let it in to fail at its start.
fn old_glibc_refuses(edgecore: &Path, work: &Path) {
    let root = work.join("bullseye");
    for d in ["var/lib/dpkg/info", "var/lib/dpkg/updates", "etc"] {
        std::fs::create_dir_all(root.join(d)).expect("dir");
    }
    let installed = |name: &str, version: &str| {
        format!(
            "Package: {name}\nStatus: install ok installed\nPriority: optional\nSection: libs\nArchitecture: amd64\nVersion: {version}\nDescription: {name}\n\n"
        )
    };
    std::fs::write(
        root.join("var/lib/dpkg/status"),
        installed("libc6", "2.31-13+deb11u5") + &installed("libgcc-s1", "10.2.1-6"),
    )
    .expect("status");
    std::fs::write(root.join("var/lib/dpkg/available"), "").expect("available");
    let out = Command::new("dpkg")
        .arg(format!("--root={}", root.display()))
        .arg("--force-script-chrootless")
        .arg(format!("--log={}", work.join("bullseye.log").display()))
        .arg("--install")
        .arg(edgecore)
        .output()
        .expect("dpkg");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("edgecore depends on libc6 (>= 2.")
            && said.contains("Version of libc6 on system is 2.31"),
        "{said}"
    );
}
