//! `edgecore join`: a bare gateway to a joined node in one command, as `keadm join` does for
//! KubeEdge. Given the cloud's address and a token (`cloudcore gettoken`), it checks the cloud's
//! CA against the token's hash, gets the node's certificate, writes a complete config (the
//! node's name, the data directory, the cloud's addresses; every other key at its default),
//! and starts the `edgecore` service where systemd has one. The token is not written anywhere:
//! the certificate is what the node uses from then on (and renews itself).
//!
//! Order, for a join cut at any point (`kill -9`, power): the certificate first, then the
//! config, each file written whole and renamed. A node is joined when its config exists and
//! names a data directory holding a certificate; until then, running `join` again finishes it
//! (keeping the certificate an unfinished join got, when it is valid and from the token's CA).
//! A joined node's identity is not replaced without `--force`.
//!
//! `edgecore reset` undoes it: the cloud told to revoke the node's certificates (with the
//! certificate itself, where the cloud is reachable; else it says how to revoke there), the
//! certificates, upgrade state and config removed, the twins and their history kept (the rest
//! of the data directory, listed) unless `--all`.

use crate::config::ConfigFile;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

/// What `edgecore join` is given.
#[derive(Clone, Debug)]
pub struct Join {
    /// The cloud's host name or address (cloudhub and its certificate port are on it).
    pub cloud: String,
    pub hub_port: u16,
    pub cert_port: u16,
    pub token: String,
    pub node_name: String,
    /// The config file to write.
    pub config: PathBuf,
    pub data_dir: PathBuf,
    /// Replace a joined node's identity.
    pub force: bool,
    /// Enable and start `edgecore.service` when systemd has it.
    pub start: bool,
    /// The Node's labels (`nodeLabels`).
    pub labels: Vec<(String, String)>,
    /// The mappers to start beside it (`modbus`, `serial`, `opcua`, `ble`: their packages'
    /// `mapper-NAME.service`).
    pub mappers: Vec<String>,
    /// An external MQTT broker (`host:port`) instead of the embedded one.
    pub mqtt_broker: Option<String>,
    /// The DMI socket and the group of the mappers that reach it (`dmi.socket`,
    /// `dmi.socketGroup`), when mappers run as their own users.
    pub dmi: Option<(PathBuf, String)>,
}

/// The group the mapper packages put their users in, given edgecore's DMI socket.
pub const MAPPERS_GROUP: &str = "kubeedge-mappers";

/// The mappers the packages install.
pub const MAPPERS: [&str; 4] = ["modbus", "serial", "opcua", "ble"];

/// A joined node's config: its node, its cloud, its certificate.
#[derive(Debug)]
pub struct Joined {
    pub node: String,
    pub server: String,
    pub certificate: PathBuf,
}

/// The node `config` says is joined, if it is (the file there and a certificate in its data
/// directory); a config that does not parse is an error naming it.
pub fn joined(config: &Path) -> Result<Option<Joined>> {
    if !config.exists() {
        return Ok(None);
    }
    let c = crate::config::Config::load(config).map_err(|e| {
        anyhow::anyhow!(
            "{e} (a config is at {}: --force replaces it)",
            config.display()
        )
    })?;
    let certificate = c.data_dir.join("certs").join("edge.crt");
    let Some(cloud) = c.cloud.as_ref().filter(|_| certificate.exists()) else {
        return Ok(None);
    };
    Ok(Some(Joined {
        node: c.node_name.clone(),
        server: cloud.server.clone(),
        certificate,
    }))
}

/// A host for a URL: an IPv6 address in brackets.
fn url_host(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// The config `join` writes: YAML with its values quoted as JSON strings (a name or address
/// with YAML's special characters stays a string).
pub fn config_text(j: &Join) -> String {
    let q = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    let host = url_host(&j.cloud);
    let mut text = format!(
        "# Written by `edgecore join`; every key not here has its default (README: edgecore's config).\n\
         nodeName: {}\n\
         dataDir: {}\n\
         cloud:\n  server: {}\n  certServer: {}\n",
        q(&j.node_name),
        q(&j.data_dir.to_string_lossy()),
        q(&format!("wss://{host}:{}", j.hub_port)),
        q(&format!("https://{host}:{}", j.cert_port)),
    );
    if !j.labels.is_empty() {
        text.push_str("nodeLabels:\n");
        for (k, v) in &j.labels {
            text.push_str(&format!("  {}: {}\n", q(k), q(v)));
        }
    }
    if let Some(broker) = &j.mqtt_broker {
        text.push_str(&format!(
            "mqtt:\n  mode: external\n  address: {}\n",
            q(broker)
        ));
    }
    if let Some((socket, group)) = &j.dmi {
        text.push_str(&format!(
            "dmi:\n  socket: {}\n  socketGroup: {}\n",
            q(&socket.to_string_lossy()),
            q(group)
        ));
    }
    text
}

/// Whether `name` is a Kubernetes node name (a DNS subdomain: lower-case letters, digits, `-`
/// and `.`, starting and ending with a letter or digit, at most 253).
fn node_name_ok(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    !name.is_empty()
        && name.len() <= 253
        && edge(name.chars().next())
        && edge(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

/// Joins: returns what it did, a line each.
pub async fn join(j: &Join) -> Result<Vec<String>> {
    if !node_name_ok(&j.node_name) {
        bail!(
            "--node-name {:?} is not a node name (lower-case letters, digits, '-' and '.', starting and ending with a letter or digit)",
            j.node_name
        );
    }
    if let Some(m) = j.mappers.iter().find(|m| !MAPPERS.contains(&m.as_str())) {
        bail!("--mapper {m:?}: the mappers are {}", MAPPERS.join(", "));
    }
    if j.token.trim().split('.').count() != 4 {
        bail!("--token is not a join token ({{CA hash}}.{{JWT}}, from `cloudcore gettoken`)");
    }
    let before = joined(&j.config);
    let was_joined = matches!(before, Ok(Some(_)));
    match before {
        Ok(Some(done)) if !j.force => bail!(
            "this gateway is already joined as {} to {} (config {}, certificate {}): `edgecore reset` first, or --force to replace its identity",
            done.node,
            done.server,
            j.config.display(),
            done.certificate.display()
        ),
        Err(e) if !j.force => return Err(e),
        _ => {}
    }
    let text = config_text(j);
    let base = j.config.parent().map(Path::to_path_buf).unwrap_or_default();
    // The very text written is what edgecore will read: checked the way it reads it.
    let config = crate::config::Config::parse(&text, &j.config, &base)
        .map_err(|e| anyhow::anyhow!("the config join would write is refused: {e}"))?;
    let Some(cloud) = config.cloud.as_ref() else {
        bail!("the config join would write has no cloud section");
    };
    let mut did = Vec::new();
    // A fresh certificate for this name, got beside the current one (which stays until the
    // new one is there: a refused --force leaves the node as it was).
    rt::fs::private_dir(&config.data_dir)
        .with_context(|| format!("cannot create {}", config.data_dir.display()))?;
    let certs = config.data_dir.join("certs");
    let kept_name = std::fs::read_to_string(certs.join("edge.crt"))
        .ok()
        .and_then(|pem| pki::pem_to_der(&pem).ok())
        .and_then(|der| pki::subject(&der))
        .map(|(cn, _)| cn);
    if !was_joined && kept_name == Some(format!("system:node:{}", j.node_name)) {
        // An unfinished join of this node (cut before its config was written): its
        // certificate is kept if it is valid and from the token's CA, else got again.
        crate::edgehub::certs::credentials(&certs, &cloud.cert_server, &j.node_name, &j.token)
            .await
            .with_context(|| format!("cannot join {}", cloud.cert_server))?;
    } else {
        let joining = config.data_dir.join("certs.joining");
        remove_dir(&joining)?;
        crate::edgehub::certs::credentials(&joining, &cloud.cert_server, &j.node_name, &j.token)
            .await
            .with_context(|| format!("cannot join {}", cloud.cert_server))?;
        remove_dir(&certs)?;
        std::fs::rename(&joining, &certs).with_context(|| {
            format!("cannot rename {} to {}", joining.display(), certs.display())
        })?;
    }
    did.push(format!(
        "the cloud's CA matches the token; node certificate for {} in {}",
        j.node_name,
        certs.display()
    ));
    if let Some(dir) = j.config.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    pki::write_private(&j.config, &text)?;
    did.push(format!(
        "config written to {} (node {}, cloud {})",
        j.config.display(),
        j.node_name,
        cloud.server
    ));
    // The directory the config names for manifests: made here, so that edgecore starts on an
    // empty one (a missing directory at start is a fault it reports, never "no devices").
    if config.modules.manifests {
        let dir = config.manifests_dir();
        if !dir.exists() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            did.push(format!("manifests directory {} made", dir.display()));
        }
    }
    did.push(service(
        j,
        "edgecore",
        &format!("edgecore --config {}", j.config.display()),
    ));
    for m in &j.mappers {
        let name = format!("mapper-{m}");
        let by_hand = format!("{name} --config-file /etc/kubeedge/mappers/{m}.yaml");
        did.push(service(j, &name, &by_hand));
    }
    Ok(did)
}

/// What `edgecore reset` is given.
#[derive(Clone, Debug)]
pub struct Reset {
    pub config: PathBuf,
    /// Remove the whole data directory (twins, history, pods' logs) too.
    pub all: bool,
    /// Stop and disable `edgecore.service` and the enabled `mapper-*.service` where systemd has
    /// them.
    pub stop: bool,
}

/// Undoes a join: returns what it did, a line each.
pub async fn reset(r: &Reset) -> Result<Vec<String>> {
    if !r.config.exists() {
        bail!(
            "no config at {}: nothing to reset (give --config)",
            r.config.display()
        );
    }
    let c = crate::config::Config::load(&r.config).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut did = Vec::new();
    if r.stop {
        did.push(stop_service());
    }
    // An edgecore still running would go on with what is removed under it.
    let socket = c.dmi_socket();
    if tokio::net::UnixStream::connect(&socket).await.is_ok() {
        bail!(
            "edgecore still runs on {} (its DMI socket {} answers): stop it first",
            c.data_dir.display(),
            socket.display()
        );
    }
    let certs = c.data_dir.join("certs");
    if let Some(cloud) = &c.cloud
        && certs.join("edge.crt").exists()
    {
        match crate::edgehub::certs::give_up(&certs, &cloud.cert_server, &c.node_name).await {
            Ok(()) => did.push(format!(
                "{} revoked node {}'s certificates",
                cloud.cert_server, c.node_name
            )),
            Err(e) => did.push(format!(
                "the cloud was not told ({e:#}): revoke there with `cloudcore node revoke {}`",
                c.node_name
            )),
        }
    }
    for d in ["certs", "certs.joining", "upgrade"] {
        remove_dir(&c.data_dir.join(d))?;
    }
    match std::fs::remove_file(&r.config) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", r.config.display())),
    }
    did.push(format!(
        "removed the certificates, the upgrade state and {}",
        r.config.display()
    ));
    if r.all {
        remove_dir(&c.data_dir)?;
        did.push(format!("removed {}", c.data_dir.display()));
    } else {
        let mut kept: Vec<String> = std::fs::read_dir(&c.data_dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        kept.sort();
        did.push(format!(
            "kept in {}: {} (the twins and their history; --all removes them)",
            c.data_dir.display(),
            if kept.is_empty() {
                "nothing".into()
            } else {
                kept.join(", ")
            }
        ));
    }
    Ok(did)
}

/// Stops and disables `edgecore.service` where systemd has it; what happened.
fn stop_service() -> String {
    if !Path::new("/run/systemd/system").exists() {
        return "systemd is not running here: no service to stop".into();
    }
    let systemctl = |args: &[&str]| std::process::Command::new("systemctl").args(args).output();
    // The mappers' units too (join enables those it is given): without edgecore they only
    // poll the devices for nobody.
    let mut units = vec!["edgecore.service".to_string()];
    if let Ok(o) = systemctl(&[
        "list-unit-files",
        "mapper-*.service",
        "--state=enabled",
        "--no-legend",
    ]) {
        units.extend(enabled_units(&String::from_utf8_lossy(&o.stdout)));
    }
    let mut did = Vec::new();
    for unit in &units {
        did.push(match systemctl(&["disable", "--now", unit]) {
            Ok(o) if o.status.success() => format!("{unit} stopped and disabled"),
            Ok(o) => format!(
                "{unit} not stopped: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => format!("cannot run systemctl: {e}"),
        });
    }
    did.join("; ")
}

/// The units of `systemctl list-unit-files --no-legend` lines (`NAME STATE PRESET`).
fn enabled_units(listed: &str) -> Vec<String> {
    listed
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|u| u.starts_with("mapper-") && u.ends_with(".service"))
        .map(str::to_string)
        .collect()
}

/// Removes `dir` and what it holds, if it is there.
fn remove_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot remove {}", dir.display())),
    }
}

/// Starts `{unit}.service` where systemd has it, or says how to start it by hand (`by_hand`).
fn service(j: &Join, unit: &str, by_hand: &str) -> String {
    let by_hand = format!("start it with: {by_hand}");
    if !j.start {
        return format!("{unit} not started (--no-start); {by_hand}");
    }
    if !Path::new("/run/systemd/system").exists() {
        return format!("systemd is not running here; {by_hand}");
    }
    let systemctl = |args: &[&str]| {
        std::process::Command::new("systemctl")
            .args(args)
            .output()
            .map(|o| {
                (
                    o.status.success(),
                    String::from_utf8_lossy(&o.stderr).trim().to_string(),
                )
            })
    };
    let file = format!("{unit}.service");
    match systemctl(&["cat", &file]) {
        Ok((true, _)) => {}
        _ => {
            return format!("no {file} unit is installed (its package installs one); {by_hand}");
        }
    }
    match systemctl(&["enable", &file]).and_then(|_| systemctl(&["restart", &file])) {
        Ok((true, _)) => format!("{file} enabled and (re)started: `systemctl status {unit}`"),
        Ok((false, e)) => {
            format!("{file} did not start: {e}; `journalctl -u {unit}` says why")
        }
        Err(e) => format!("cannot run systemctl: {e}; {by_hand}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_stops_every_enabled_mapper_unit_systemctl_lists() {
        let listed =
            "mapper-modbus.service enabled enabled\nmapper-opcua.service   enabled  enabled\n\n";
        assert_eq!(
            enabled_units(listed),
            vec!["mapper-modbus.service", "mapper-opcua.service"]
        );
        // Nothing else, whatever systemctl prints around them.
        assert!(enabled_units("0 unit files listed.\nsshd.service enabled\n").is_empty());
    }

    fn args(dir: &Path) -> Join {
        Join {
            cloud: "cloud.example.com".into(),
            hub_port: 10000,
            cert_port: 10002,
            token: "a.b.c.d".into(),
            node_name: "gw-1".into(),
            config: dir.join("edgecore.yaml"),
            data_dir: dir.join("data"),
            force: false,
            start: false,
            labels: Vec::new(),
            mappers: Vec::new(),
            mqtt_broker: None,
            dmi: None,
        }
    }

    #[test]
    fn the_config_written_is_one_edgecore_reads_with_the_nodes_name_and_cloud() {
        let dir = tempfile::tempdir().expect("dir");
        let mut j = args(dir.path());
        j.cloud = "fd00::1".into();
        let text = config_text(&j);
        let c = crate::config::Config::parse(&text, &j.config, dir.path()).expect("parses");
        assert_eq!(c.node_name, "gw-1");
        assert_eq!(c.data_dir, dir.path().join("data"));
        let cloud = c.cloud.expect("cloud");
        assert_eq!(cloud.server, "wss://[fd00::1]:10000");
        assert_eq!(cloud.cert_server, "https://[fd00::1]:10002");
        assert!(cloud.token.is_empty(), "the token is not kept");
        assert!(joined(&j.config).expect("none").is_none());
        // Labels and an external broker, as given.
        j.labels = vec![
            ("site".into(), "plant-3".into()),
            ("example.com/line".into(), "2".into()),
        ];
        j.mqtt_broker = Some("10.0.0.5:1883".into());
        let c =
            crate::config::Config::parse(&config_text(&j), &j.config, dir.path()).expect("parses");
        assert_eq!(
            c.node_labels.get("site").map(String::as_str),
            Some("plant-3")
        );
        assert_eq!(
            c.node_labels.get("example.com/line").map(String::as_str),
            Some("2")
        );
        assert_eq!(c.mqtt.mode, crate::config::MqttMode::External);
        assert_eq!(c.mqtt.address, "10.0.0.5:1883");
        // Mappers as their own users: the socket outside dataDir, with their group.
        j.dmi = Some(("/run/edgecore/dmi.sock".into(), "0".into()));
        let c =
            crate::config::Config::parse(&config_text(&j), &j.config, dir.path()).expect("parses");
        assert_eq!(c.dmi_socket(), Path::new("/run/edgecore/dmi.sock"));
        assert_eq!(c.dmi.socket_group.as_deref(), Some("0"));
        j.dmi = Some((dir.path().join("data/dmi.sock"), "0".into()));
        let e = crate::config::Config::parse(&config_text(&j), &j.config, dir.path())
            .expect_err("inside dataDir");
        assert!(e.to_string().contains("dmi.socketGroup"), "{e}");
        j.dmi = Some(("/run/edgecore/dmi.sock".into(), "no-such-group-here".into()));
        let e = crate::config::Config::parse(&config_text(&j), &j.config, dir.path())
            .expect_err("no such group");
        assert!(e.to_string().contains("no-such-group-here"), "{e}");
        j.dmi = None;
        // A label a node may not set on itself is refused by the config check.
        j.labels = vec![("node-restriction.kubernetes.io/zone".into(), "a".into())];
        let e = crate::config::Config::parse(&config_text(&j), &j.config, dir.path())
            .expect_err("refused");
        assert!(e.to_string().contains("NodeRestriction"), "{e}");
    }

    #[tokio::test]
    async fn bad_names_and_tokens_are_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().expect("dir");
        let mut j = args(dir.path());
        j.node_name = "GW_1".into();
        let e = join(&j).await.expect_err("bad name");
        assert!(e.to_string().contains("is not a node name"), "{e}");
        let mut j = args(dir.path());
        j.token = "not-a-token".into();
        let e = join(&j).await.expect_err("bad token");
        assert!(e.to_string().contains("is not a join token"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
        for ok in ["gw-1", "a", "plant-3.line-2"] {
            assert!(node_name_ok(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a b"] {
            assert!(!node_name_ok(bad), "{bad}");
        }
    }
}
