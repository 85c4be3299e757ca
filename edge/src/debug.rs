//! `edgecore debug collect` and `edgecore debug check` (also `kectl debug ...`), as KubeEdge's
//! `keadm debug collect` and `check`:
//!
//! - `collect`: one `tar.gz` for a support request: versions, the config with its secrets
//!   redacted, what the running edgecore's API says (health, readiness, status, mappers,
//!   devices, pods, the metrics: the link's state, the broker's counters), the data directory's
//!   files and sizes (the twin store's health), the node certificate's subject and validity
//!   (never its key), the last lines of the log, and `check`'s lines. Every secret the config
//!   names (the join token, the MQTT password, the API's token) and any private key is
//!   replaced by `REDACTED` in every file of the bundle, whatever key or log line it was
//!   found under; the archive is private (0600).
//! - `check`: a line per prerequisite (`ok`, `warn` or `FAIL`): the clock's sync, the data
//!   directory's disk, serial devices and their permissions, containerd's socket when edged
//!   runs pods, the cloud's reachability, the node certificate's expiry. Exit 1 on a `FAIL`.

use crate::config::ConfigFile;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What a bundle's text stands in for a secret.
pub const REDACTED: &str = "REDACTED";

/// The config edgecore reads from `file` (or its defaults) and its text (none for defaults).
fn load(file: &Path) -> Result<(crate::config::Config, Option<String>)> {
    if file.exists() {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let c = crate::config::Config::load(file).map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok((c, Some(text)))
    } else {
        let c = crate::config::Config::parse("", Path::new("(defaults)"), Path::new("."))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok((c, None))
    }
}

/// Whether a config key names a secret's value (not a file or directory holding one).
fn secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    let path = ["file", "dir", "path", "endpoint", "socket"]
        .iter()
        .any(|p| k.ends_with(p));
    let secret = [
        "token",
        "password",
        "passwd",
        "secret",
        "credential",
        "apikey",
        "authorization",
        "privatekey",
    ]
    .iter()
    .any(|s| k.contains(s));
    secret && !path
}

/// A URL's user and password taken out (`scheme://user:pass@host` → `scheme://REDACTED@host`).
fn redact_userinfo(s: &str) -> String {
    let Some(at) = s.find("://") else {
        return s.to_string();
    };
    let rest = &s[at + 3..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(i) => format!("{}://{REDACTED}{}", &s[..at], &rest[i..]),
        None => s.to_string(),
    }
}

/// The config's YAML with each secret's value replaced, wherever it is.
pub fn redact_config(text: &str) -> String {
    fn walk(v: &mut serde_yaml_ng::Value) {
        match v {
            serde_yaml_ng::Value::Mapping(m) => {
                for (k, v) in m.iter_mut() {
                    if k.as_str().is_some_and(secret_key) && !v.is_mapping() && !v.is_sequence() {
                        *v = serde_yaml_ng::Value::String(REDACTED.into());
                    } else {
                        walk(v);
                    }
                }
            }
            serde_yaml_ng::Value::Sequence(s) => s.iter_mut().for_each(walk),
            serde_yaml_ng::Value::String(s) => *s = redact_userinfo(s),
            serde_yaml_ng::Value::Tagged(t) => walk(&mut t.value),
            _ => {}
        }
    }
    match serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text) {
        Ok(mut v) => {
            walk(&mut v);
            serde_yaml_ng::to_string(&v).unwrap_or_default()
        }
        // A config that does not parse is not copied: its secrets cannot be found in it.
        Err(e) => format!("# the config does not parse ({e}); not included\n"),
    }
}

/// The secrets a config names, as they appear anywhere (its token, passwords, the API's
/// token file's token).
fn secrets(c: &crate::config::Config) -> Vec<String> {
    let mut all = Vec::new();
    if let Some(cloud) = &c.cloud {
        let t = cloud.token.trim();
        all.push(t.to_string());
        // The JWT alone, as it would appear in an Authorization header.
        if let Some((_, jwt)) = t.split_once('.') {
            all.push(jwt.to_string());
        }
    }
    all.extend(c.mqtt.password.clone());
    if let Some(f) = &c.http.token_file
        && let Ok(t) = std::fs::read_to_string(f)
    {
        all.push(t.lines().next().unwrap_or_default().trim().to_string());
    }
    all.retain(|s| s.len() >= 4);
    all
}

/// `text` with each of `secrets` and any PEM private key replaced.
pub fn scrub(text: &str, secrets: &[String]) -> String {
    let mut text = text.to_string();
    for s in secrets {
        text = text.replace(s.as_str(), REDACTED);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(start) = rest.find("-----BEGIN ") {
        let header_end = rest[start..].find('\n').map_or(rest.len(), |i| start + i);
        let header = &rest[start..header_end];
        if !header.contains("PRIVATE KEY") {
            out.push_str(&rest[..header_end]);
            rest = &rest[header_end..];
            continue;
        }
        out.push_str(&rest[..start]);
        out.push_str(&format!("[{REDACTED} private key]"));
        // To the end of its END line (or of the text, when it has none).
        rest = match rest[header_end..].find("-----END ") {
            Some(i) => {
                let from = header_end + i;
                let stop = rest[from + 9..]
                    .find("-----")
                    .map_or(rest.len(), |j| from + 9 + j + 5);
                &rest[stop..]
            }
            None => "",
        };
    }
    out.push_str(rest);
    without_orphan_key_bodies(&out)
}

/// A PEM line: base64 only, at most 80 characters.
fn base64_line(line: &str) -> bool {
    let t = line.trim_end();
    !t.is_empty()
        && t.len() <= 80
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
}

/// `text` without the body of a private key whose BEGIN line is not in it (a log's tail cut
/// there): each `-----END ... PRIVATE KEY-----` left over, with the base64 lines before it,
/// becomes one redaction line.
fn without_orphan_key_bodies(text: &str) -> String {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut drop = vec![false; lines.len()];
    for (i, l) in lines.iter().enumerate() {
        if l.trim_start().starts_with("-----END ") && l.contains("PRIVATE KEY") {
            drop[i] = true;
            let mut j = i;
            while j > 0 && base64_line(lines[j - 1]) {
                j -= 1;
                drop[j] = true;
            }
        }
    }
    let mut out = String::with_capacity(text.len());
    for (i, l) in lines.iter().enumerate() {
        if !drop[i] {
            out.push_str(l);
        } else if i == 0 || !drop[i - 1] {
            out.push_str(&format!("[{REDACTED} private key]\n"));
        }
    }
    out
}

/// `GET http://{address}{path}` (with the API's token): the status and body, or why none.
async fn api_get(address: std::net::SocketAddr, token: Option<&str>, path: &str) -> String {
    use http_body_util::BodyExt;
    let fetch = async {
        let tcp = tokio::net::TcpStream::connect(address).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
        let mut req = hyper::Request::get(path).header("Host", address.to_string());
        if let Some(t) = token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let resp = sender
            .send_request(req.body(http_body_util::Empty::<bytes::Bytes>::new())?)
            .await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        anyhow::Ok(format!("{status}\n{}", String::from_utf8_lossy(&body)))
    };
    match tokio::time::timeout(Duration::from_secs(10), fetch).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => format!("not answered: {e:#} (is edgecore running on {address}?)"),
        Err(_) => format!("no answer within 10 s from {address}"),
    }
}

/// The local API's token, when the config names a token file (its first line).
fn api_token(config: &crate::config::Config) -> Option<String> {
    config
        .http
        .token_file
        .as_ref()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .map(|t| t.lines().next().unwrap_or_default().trim().to_string())
}

/// The link with the cloud as the running edgecore's `/api/v1/status` tells it: connected,
/// and its outbox draining (its oldest change younger than four keepalives).
fn link_verdict(answer: &str, keepalive_seconds: u64) -> (Verdict, String) {
    let Some(("200 OK", body)) = answer.split_once('\n') else {
        return (
            Verdict::Warn,
            format!("cannot ask edgecore how the link goes: {}", answer.trim()),
        );
    };
    let Ok(st) = serde_json::from_str::<serde_json::Value>(body) else {
        return (Verdict::Warn, "edgecore's status is not JSON".into());
    };
    let depth = st["outbox"].as_u64().unwrap_or(0);
    let oldest = st["outboxOldestSeconds"].as_u64().unwrap_or(0);
    let link = &st["link"];
    let said = format!(
        "outbox {depth} changes, the oldest {oldest}s old; {} reports waiting for the rate, {} sent and not answered (the oldest {} ms), {} sent again",
        link["queued"], link["inFlight"], link["oldestInFlightMs"], link["resent"]
    );
    match st["cloud"].as_str().unwrap_or_default() {
        "connected" if depth > 0 && oldest > 4 * keepalive_seconds => (
            Verdict::Warn,
            format!(
                "connected to {}, but the outbox does not drain: {said}",
                st["cloudServer"].as_str().unwrap_or_default()
            ),
        ),
        "connected" => (
            Verdict::Ok,
            format!(
                "connected to {}; {said}",
                st["cloudServer"].as_str().unwrap_or_default()
            ),
        ),
        other => (Verdict::Warn, format!("not connected ({other}); {said}")),
    }
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n") + "\n"
}

/// What `edgecore debug collect` is given.
#[derive(Clone, Debug)]
pub struct Collect {
    pub config: PathBuf,
    /// The archive to write.
    pub out: PathBuf,
    /// edgecore's log file, when it does not log to the journal.
    pub log: Option<PathBuf>,
}

/// Writes the bundle; what it holds, a line each.
pub async fn collect(c: &Collect) -> Result<Vec<String>> {
    let (config, text) = load(&c.config)?;
    let secrets = secrets(&config);
    let mut files: Vec<(String, String)> = Vec::new();
    let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    files.push((
        "versions.txt".into(),
        format!(
            "edgecore {} (running version {})\nkernel: {}\nos: {}\nnode: {}\n",
            env!("CARGO_PKG_VERSION"),
            crate::upgrade::version(&config.data_dir),
            std::fs::read_to_string("/proc/version")
                .unwrap_or_default()
                .trim(),
            os.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .unwrap_or_default()
                .trim_matches('"'),
            config.node_name
        ),
    ));
    files.push((
        "edgecore.yaml".into(),
        match &text {
            Some(t) => redact_config(t),
            None => format!(
                "# no config at {}: every default applies\n",
                c.config.display()
            ),
        },
    ));
    let token = api_token(&config);
    for (name, path) in [
        ("api/healthz.txt", "/healthz"),
        ("api/readyz.txt", "/readyz"),
        ("api/status.json", "/api/v1/status"),
        ("api/mappers.json", "/api/v1/mappers"),
        ("api/devices.json", "/api/v1/devices"),
        ("api/pods.json", "/api/v1/pods"),
        ("api/metrics.txt", "/metrics"),
    ] {
        files.push((
            name.into(),
            api_get(config.http.address, token.as_deref(), path).await,
        ));
    }
    files.push(("store.txt".into(), store(&config.data_dir)));
    files.push(("certificate.txt".into(), certificate(&config.data_dir)));
    files.push(("logs.txt".into(), logs(c.log.as_deref())));
    let (lines, _) = checks(&config).await;
    files.push(("check.txt".into(), lines.join("\n") + "\n"));
    let stamp = time::OffsetDateTime::now_utc().unix_timestamp();
    let top = format!("edgecore-debug-{}-{stamp}", config.node_name);
    let mut archive = Vec::new();
    {
        let gz = flate2::write::GzEncoder::new(&mut archive, flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        for (name, body) in &files {
            let body = scrub(body, &secrets);
            let mut header = tar::Header::new_gnu();
            header.set_size(body.len() as u64);
            header.set_mode(0o600);
            header.set_mtime(u64::try_from(stamp).unwrap_or(0));
            header.set_cksum();
            tar.append_data(&mut header, format!("{top}/{name}"), body.as_bytes())
                .with_context(|| format!("cannot add {name}"))?;
        }
        tar.into_inner()?.finish()?;
    }
    let tmp = c.out.with_extension("partial");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        f.write_all(&archive)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &c.out).with_context(|| format!("cannot write {}", c.out.display()))?;
    let mut did = vec![format!(
        "{} written ({} bytes; secrets the config names and private keys replaced by {REDACTED})",
        c.out.display(),
        archive.len()
    )];
    did.extend(
        files
            .iter()
            .map(|(n, b)| format!("  {top}/{n} ({} bytes)", b.len())),
    );
    Ok(did)
}

/// The data directory's files and sizes, and its disk's free space.
fn store(data_dir: &Path) -> String {
    let mut out = format!("{}\n", data_dir.display());
    let mut entries: Vec<(String, u64, bool)> = std::fs::read_dir(data_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let m = e.metadata().ok();
            (
                e.file_name().to_string_lossy().into_owned(),
                m.as_ref().map_or(0, |m| m.len()),
                m.is_some_and(|m| m.is_dir()),
            )
        })
        .collect();
    entries.sort();
    if entries.is_empty() {
        out.push_str("  (missing or empty)\n");
    }
    for (name, size, dir) in entries {
        if dir {
            out.push_str(&format!("  {name}/\n"));
        } else {
            out.push_str(&format!("  {name} {size} bytes\n"));
        }
    }
    if let Some((free, total)) = disk(data_dir) {
        out.push_str(&format!("disk: {free} bytes free of {total}\n"));
    }
    out
}

/// Free and total bytes of the disk holding `dir`.
fn disk(dir: &Path) -> Option<(u64, u64)> {
    let s = rustix::fs::statvfs(dir).ok()?;
    Some((s.f_bavail * s.f_frsize, s.f_blocks * s.f_frsize))
}

/// The node certificate's subject and validity (not its key).
fn certificate(data_dir: &Path) -> String {
    let file = data_dir.join("certs").join("edge.crt");
    let Ok(pem) = std::fs::read_to_string(&file) else {
        return format!("no node certificate at {} (not joined)\n", file.display());
    };
    let subject = pki::pem_to_der(&pem)
        .ok()
        .and_then(|d| pki::subject(&d))
        .map(|(cn, groups)| format!("{cn} {groups:?}"))
        .unwrap_or_else(|| "unreadable".into());
    match pki::validity_of(&pem) {
        Ok((from, to)) => format!(
            "{}\nsubject: {subject}\nvalid from {from} to {to} (Unix time)\n",
            file.display()
        ),
        Err(e) => format!("{}: {e}\n", file.display()),
    }
}

/// The last lines of edgecore's log: `log`, else the journal's `edgecore` unit.
fn logs(log: Option<&Path>) -> String {
    const LINES: usize = 5000;
    if let Some(f) = log {
        return match std::fs::read_to_string(f) {
            Ok(t) => tail(&t, LINES),
            Err(e) => format!("cannot read {}: {e}\n", f.display()),
        };
    }
    match std::process::Command::new("journalctl")
        .args([
            "-u",
            "edgecore",
            "-n",
            &LINES.to_string(),
            "--no-pager",
            "-o",
            "short-iso",
        ])
        .output()
    {
        Ok(o) => {
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
        }
        Err(e) => format!("no journal ({e}): give edgecore's log file with --log\n"),
    }
}

/// One check's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Ok,
    Warn,
    Fail,
}

fn line(v: Verdict, what: &str, said: impl AsRef<str>) -> String {
    let v = match v {
        Verdict::Ok => "ok  ",
        Verdict::Warn => "warn",
        Verdict::Fail => "FAIL",
    };
    format!("{v} {what}: {}", said.as_ref())
}

/// The prerequisites, a line each; whether none failed.
pub async fn check(config_file: &Path) -> Result<(Vec<String>, bool)> {
    let (c, _) = load(config_file)?;
    Ok(checks(&c).await)
}

/// The prerequisites of the node `c` configures, a line each; whether none failed.
async fn checks(c: &crate::config::Config) -> (Vec<String>, bool) {
    let mut lines = Vec::new();
    let mut failed = false;
    let mut say = |v: Verdict, what: &str, said: String| {
        failed |= v == Verdict::Fail;
        lines.push(line(v, what, said));
    };
    // The clock: certificates and twin timestamps need it right.
    let synced = std::fs::metadata("/run/systemd/timesync/synchronized").is_ok()
        || std::process::Command::new("timedatectl")
            .args(["show", "-p", "NTPSynchronized", "--value"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "yes");
    say(
        if synced { Verdict::Ok } else { Verdict::Warn },
        "time sync",
        if synced {
            "the clock is synchronized".into()
        } else {
            "no sign of a synchronized clock (systemd-timesyncd, chrony): certificates and timestamps need the right time".into()
        },
    );
    // The data directory's disk.
    let probe = if c.data_dir.exists() {
        c.data_dir.clone()
    } else {
        c.data_dir
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"))
    };
    match disk(&probe) {
        Some((free, _)) if free < 64 << 20 => say(
            Verdict::Fail,
            "disk",
            format!(
                "{free} bytes free under {} (at least 64 MiB needed)",
                probe.display()
            ),
        ),
        Some((free, total)) => say(
            Verdict::Ok,
            "disk",
            format!(
                "{} MiB free of {} MiB under {}",
                free >> 20,
                total >> 20,
                probe.display()
            ),
        ),
        None => say(
            Verdict::Warn,
            "disk",
            format!("cannot read the free space of {}", probe.display()),
        ),
    }
    // Serial devices: there, and usable by this user.
    let mut serial: Vec<PathBuf> = std::fs::read_dir("/dev")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("ttyUSB") || n.starts_with("ttyACM") || n.starts_with("ttyAMA")
            })
        })
        .collect();
    serial.sort();
    if serial.is_empty() {
        say(
            Verdict::Ok,
            "serial",
            "no USB or board serial ports (/dev/ttyUSB*, ttyACM*, ttyAMA*)".into(),
        );
    }
    for p in serial {
        let usable = rustix::fs::access(
            &p,
            rustix::fs::Access::READ_OK | rustix::fs::Access::WRITE_OK,
        )
        .is_ok();
        say(
            if usable { Verdict::Ok } else { Verdict::Warn },
            "serial",
            if usable {
                format!("{} readable and writable", p.display())
            } else {
                format!(
                    "{} not readable and writable by this user (add it to the device's group, usually dialout)",
                    p.display()
                )
            },
        );
    }
    // containerd, when edged runs pods.
    if let Some(e) = &c.edged {
        let socket = e.runtime_endpoint.trim_start_matches("unix://").to_string();
        match tokio::net::UnixStream::connect(&socket).await {
            Ok(_) => say(Verdict::Ok, "containerd", format!("{socket} answers")),
            Err(err) => say(
                Verdict::Fail,
                "containerd",
                format!("{socket}: {err} (edged runs pods there)"),
            ),
        }
    }
    // The cloud: reachable, and the certificate's time left.
    if let Some(cloud) = &c.cloud {
        for url in [&cloud.server, &cloud.cert_server] {
            let reach = match crate::edgehub::certserver::host_port(url) {
                Ok((authority, _)) => {
                    match tokio::time::timeout(
                        Duration::from_secs(5),
                        tokio::net::TcpStream::connect(&authority),
                    )
                    .await
                    {
                        Ok(Ok(_)) => Ok(format!("{url} reachable")),
                        Ok(Err(e)) => Err(format!("{url}: {e}")),
                        Err(_) => Err(format!("{url}: no answer within 5 s")),
                    }
                }
                Err(e) => Err(format!("{url}: {e:#}")),
            };
            match reach {
                Ok(s) => say(Verdict::Ok, "cloud", s),
                Err(s) => say(Verdict::Fail, "cloud", s),
            }
        }
        // The running edgecore's link: connected, and the outbox draining.
        let status = api_get(c.http.address, api_token(c).as_deref(), "/api/v1/status").await;
        let (v, said) = link_verdict(&status, cloud.keepalive_seconds);
        say(v, "cloud link", said);
        let file = c.data_dir.join("certs").join("edge.crt");
        match std::fs::read_to_string(&file).map(|p| pki::validity_of(&p)) {
            Ok(Ok((_, to))) => {
                let now = time::OffsetDateTime::now_utc().unix_timestamp();
                let days = (to - now) / 86_400;
                let v = if to <= now {
                    Verdict::Fail
                } else if days < 30 {
                    Verdict::Warn
                } else {
                    Verdict::Ok
                };
                say(
                    v,
                    "certificate",
                    format!("{} expires in {days} days", file.display()),
                );
            }
            Ok(Err(e)) => say(
                Verdict::Fail,
                "certificate",
                format!("{}: {e}", file.display()),
            ),
            Err(_) => say(
                Verdict::Warn,
                "certificate",
                format!(
                    "none at {} yet (joined at the first start, or with `edgecore join`)",
                    file.display()
                ),
            ),
        }
    } else {
        say(
            Verdict::Ok,
            "cloud",
            "no cloud section: local manifests only".into(),
        );
    }
    (lines, !failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_check_warns_of_an_outbox_that_does_not_drain_while_connected() {
        let status = |cloud: &str, depth: u64, oldest: u64| {
            format!(
                "200 OK\n{}",
                serde_json::json!({"cloud": cloud, "cloudServer": "wss://c:10000", "outbox": depth,
                    "outboxOldestSeconds": oldest, "link": {"queued": 3, "inFlight": 7,
                    "oldestInFlightMs": 120, "resent": 0}})
            )
        };
        let (v, said) = link_verdict(&status("connected", 40, 2), 30);
        assert_eq!(v, Verdict::Ok, "{said}");
        assert!(
            said.contains("outbox 40 changes, the oldest 2s old"),
            "{said}"
        );
        let (v, said) = link_verdict(&status("connected", 804, 121), 30);
        assert_eq!(v, Verdict::Warn);
        assert!(said.contains("does not drain"), "{said}");
        // Old changes are expected while the link is down; said, not a failure.
        let (v, said) = link_verdict(&status("cut", 804, 900), 30);
        assert_eq!(v, Verdict::Warn);
        assert!(said.starts_with("not connected (cut)"), "{said}");
        let (v, said) = link_verdict("not answered: connection refused", 30);
        assert_eq!(v, Verdict::Warn);
        assert!(said.contains("connection refused"), "{said}");
    }

    #[test]
    fn secrets_are_redacted_by_their_keys_wherever_they_are_and_paths_kept() {
        let text = "cloud:\n  server: wss://c:10000\n  token: abc.def.ghi.jkl\nmqtt:\n  password: hunter22\n  passwordFile: /etc/mosquitto/passwd\nhttp:\n  tokenFile: /etc/edgecore/api-token\npush:\n  - url: https://bob:pw1234@db.example.com/write\n    headers: {Authorization: Bearer sekrit}\n";
        let out = redact_config(text);
        for gone in ["abc.def", "hunter22", "pw1234", "sekrit", "bob"] {
            assert!(!out.contains(gone), "{gone}: {out}");
        }
        for kept in [
            "/etc/mosquitto/passwd",
            "/etc/edgecore/api-token",
            "db.example.com/write",
            "wss://c:10000",
        ] {
            assert!(out.contains(kept), "{kept}: {out}");
        }
        assert!(redact_config(": : bad").contains("not included"));
    }

    #[test]
    fn scrubbing_takes_out_each_secret_and_every_private_key_but_not_certificates() {
        let text = "token=s3cr3t-value here\n-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\ntail\n-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n";
        let out = scrub(text, &["s3cr3t-value".into()]);
        assert!(
            !out.contains("s3cr3t") && !out.contains("MIIE") && !out.contains("AAAA"),
            "{out}"
        );
        assert!(out.contains("BEGIN CERTIFICATE-----\nMIIB"), "{out}");
        assert!(out.contains("tail"), "{out}");
        // A log's tail that starts inside a key: its BEGIN line is gone, its body is not kept.
        let cut = "Yk1JSUV2Z0lCQURBTkJna3Foa2lHOXcwQkFRRUZBQVNDQktnd2dnU2tBZ0VBQW9JQkFRQzRy\nMIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQC4r==\n-----END RSA PRIVATE KEY-----\n2026-11-29T10:00:00Z INFO next line\n";
        let out = scrub(cut, &[]);
        assert!(
            !out.contains("MIIEvgIB") && !out.contains("Yk1JSUV2") && !out.contains("-----END"),
            "{out}"
        );
        assert!(
            out.starts_with("[REDACTED private key]\n") && out.contains("INFO next line"),
            "{out}"
        );
    }

    #[test]
    fn secret_keys_are_told_from_paths() {
        for k in [
            "token",
            "password",
            "clientSecret",
            "apiKey",
            "Authorization",
        ] {
            assert!(secret_key(k), "{k}");
        }
        for k in ["tokenFile", "passwordFile", "keyFile", "server", "certDir"] {
            assert!(!secret_key(k), "{k}");
        }
    }
}
