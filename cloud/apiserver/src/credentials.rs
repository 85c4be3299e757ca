//! The embedded API's own credentials, made on first start and kept in the data directory: the
//! serving certificate, an admin client certificate, a bearer token, and the admin kubeconfig
//! that ties them together (as k3s writes one), all signed by the CA of [`pki`].

use anyhow::{Context, Result};
use base64::Engine;
use pki::{read, sign_leaf, write_private};
use std::path::{Path, PathBuf};

/// The credentials the server needs at run time.
pub(crate) struct Credentials {
    pub ca_pem: String,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    /// The users of the bearer tokens accepted.
    pub tokens: Vec<(String, crate::User)>,
    pub kubeconfig: PathBuf,
}

/// The serving certificate: the stored one while it names the same hosts and has more than 30
/// days left, otherwise a new one (stored).
fn serving(
    dir: &Path,
    ca_pem: &str,
    ca_key_pem: &str,
    sans: &[String],
) -> Result<(String, String)> {
    let (crt, key, names) = (
        dir.join("serving.crt"),
        dir.join("serving.key"),
        dir.join("serving.names"),
    );
    let want = sans.join("\n");
    if let (Some(c), Some(k), Some(n)) = (read(&crt)?, read(&key)?, read(&names)?)
        && n == want
        && pki::days_left(&c).is_some_and(|d| d > 30)
    {
        return Ok((c, k));
    }
    let (c, k) = sign_leaf(ca_pem, ca_key_pem, "cloudcore", None, sans, true, 365)?;
    write_private(&key, &k)?;
    write_private(&crt, &c)?;
    write_private(&names, &want)?;
    Ok((c, k))
}

fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_lowercase())
        .filter(|s| !s.is_empty() && crate::meta::is_dns_subdomain(s))
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Loads or makes every credential of `data_dir`; `server_url` goes into the kubeconfig.
pub(crate) fn prepare(data_dir: &Path, sans: &[String], server_url: &str) -> Result<Credentials> {
    let dir = data_dir.join("pki");
    rt::fs::private_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (ca_pem, ca_key_pem) = pki::load_or_make_ca(&dir)?;
    let mut all_sans: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    all_sans.extend(host_name());
    for s in sans {
        if !all_sans.contains(s) {
            all_sans.push(s.clone());
        }
    }
    let (serving_cert_pem, serving_key_pem) = serving(&dir, &ca_pem, &ca_key_pem, &all_sans)?;
    let (admin_crt, admin_key) =
        match (read(&dir.join("admin.crt"))?, read(&dir.join("admin.key"))?) {
            (Some(c), Some(k)) => (c, k),
            _ => {
                let (c, k) = sign_leaf(
                    &ca_pem,
                    &ca_key_pem,
                    "admin",
                    Some("system:masters"),
                    &[],
                    false,
                    3650,
                )?;
                write_private(&dir.join("admin.key"), &k)?;
                write_private(&dir.join("admin.crt"), &c)?;
                (c, k)
            }
        };
    let token_file = data_dir.join("tokens.csv");
    let tokens_text = match read(&token_file)? {
        Some(t) => t,
        None => {
            let token = format!(
                "{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            );
            let text = format!("{token},admin,admin,\"system:masters\"\n");
            write_private(&token_file, &text)?;
            text
        }
    };
    let tokens =
        parse_tokens(&tokens_text).with_context(|| format!("in {}", token_file.display()))?;
    let kubeconfig = data_dir.join("admin.kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: cloudcore\n  cluster:\n    server: {server_url}\n    certificate-authority-data: {}\nusers:\n- name: admin\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: cloudcore\n  context:\n    cluster: cloudcore\n    user: admin\n    namespace: default\ncurrent-context: cloudcore\n",
        b64(&ca_pem),
        b64(&admin_crt),
        b64(&admin_key)
    );
    write_private(&kubeconfig, &text)?;
    Ok(Credentials {
        ca_pem,
        serving_cert_pem,
        serving_key_pem,
        tokens,
        kubeconfig,
    })
}

/// `token,user,uid,"group1,group2"` lines (kube-apiserver's `--token-auth-file` format).
pub(crate) fn parse_tokens(text: &str) -> Result<Vec<(String, crate::User)>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.splitn(4, ',');
        let token = parts.next().unwrap_or_default().trim();
        let user = parts.next().unwrap_or_default().trim();
        let _uid = parts.next();
        let groups = parts.next().unwrap_or_default().trim().trim_matches('"');
        if token.is_empty() || user.is_empty() {
            anyhow::bail!("line {}: expected token,user[,uid,\"groups\"]", i + 1);
        }
        let groups = groups
            .split(',')
            .map(str::trim)
            .filter(|g| !g.is_empty())
            .map(str::to_string)
            .collect();
        out.push((token.to_string(), crate::User::new(user, groups)));
    }
    Ok(out)
}

/// The files every replica of a fleet must share (on etcd): the CA that signs every
/// certificate and token, and the bearer tokens; in the Secret `kube-system/cloudcore-pki`
/// (as KubeEdge keeps its CA in a Secret), made by the first replica.
const FLEET_FILES: [(&str, &str); 3] = [
    ("ca.crt", "pki/ca.crt"),
    ("ca.key", "pki/ca.key"),
    ("tokens.csv", "tokens.csv"),
];

pub(crate) const FLEET_SECRET: (&str, &str) = ("kube-system", "cloudcore-pki");

/// Takes the fleet's files from its Secret into `data_dir` (those missing are written; one
/// that differs is an error naming it). `false` when there is no Secret yet (this replica is
/// the first).
fn adopt_fleet(store: &crate::store::Store, data_dir: &Path) -> Result<bool> {
    let key = crate::store::Key {
        res: std::sync::Arc::from("secrets"),
        ns: FLEET_SECRET.0.into(),
        name: FLEET_SECRET.1.into(),
    };
    let Some(secret) = store.read().get(&key).map(|o| o.value()) else {
        return Ok(false);
    };
    rt::fs::private_dir(&data_dir.join("pki"))?;
    for (field, file) in FLEET_FILES {
        let text = secret["data"][field]
            .as_str()
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .and_then(|b| String::from_utf8(b).ok())
            .with_context(|| {
                format!(
                    "the Secret {}/{} has no {field}",
                    FLEET_SECRET.0, FLEET_SECRET.1
                )
            })?;
        let path = data_dir.join(file);
        if !pki::adopt_shared(&path, &text, false)? {
            anyhow::bail!(
                "{} is not the fleet's (the Secret {}/{} in etcd): this data directory was made for another fleet (or another replica started first at the same time); give this replica an empty data directory and it takes the fleet's CA and tokens",
                path.display(),
                FLEET_SECRET.0,
                FLEET_SECRET.1
            );
        }
    }
    Ok(true)
}

/// Where this server stands among replicas sharing one etcd (one CA and one `tokens.csv`, the
/// first replica's, kept in the Secret `kube-system/cloudcore-pki`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fleet {
    /// No etcd: nothing is shared.
    Alone,
    /// The fleet's CA and tokens were in etcd, and are now this server's.
    Adopted,
    /// None in etcd yet: this server offers its own (the Secret goes into its install).
    /// `fresh`: its CA is made at this start, so it can drop it if another server wins.
    Offering { fresh: bool },
}

impl Fleet {
    /// Before this server's credentials are prepared: takes the fleet's when there are.
    pub(crate) fn join(store: &crate::store::Store, data_dir: &Path) -> Result<Self> {
        if !store.shared() {
            return Ok(Self::Alone);
        }
        if adopt_fleet(store, data_dir)? {
            tracing::info!("replicas: this server uses the fleet's CA and tokens, from etcd");
            return Ok(Self::Adopted);
        }
        tracing::info!(
            "replicas: the first server of the fleet; its CA and tokens go into etcd for the others"
        );
        Ok(Self::Offering {
            fresh: !data_dir.join("pki/ca.crt").exists(),
        })
    }

    /// The fleet's Secret this server offers in its install, if it offers one.
    pub(crate) fn secret(self, data_dir: &Path) -> Result<Option<serde_json::Value>> {
        match self {
            Self::Offering { .. } => fleet_secret(data_dir).map(Some),
            Self::Alone | Self::Adopted => Ok(None),
        }
    }

    /// After the install: replicas started together on an empty etcd all offered theirs, and
    /// one Secret was made first. A server whose CA was made at this start drops it and takes
    /// the fleet's (`true`: its credentials changed); one whose CA was there before refuses to
    /// start (its data directory is another fleet's).
    pub(crate) fn settle(self, store: &crate::store::Store, data_dir: &Path) -> Result<bool> {
        let Self::Offering { fresh } = self else {
            return Ok(false);
        };
        match adopt_fleet(store, data_dir) {
            Ok(true) => Ok(false),
            Ok(false) => anyhow::bail!("the fleet's Secret was not made in etcd"),
            Err(_) if fresh => {
                tracing::info!("replicas: another server made the fleet's CA first; using it");
                forget(data_dir)?;
                adopt_fleet(store, data_dir)?;
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }
}

/// Removes the credentials this replica made (its CA lost the race to be the fleet's).
fn forget(data_dir: &Path) -> Result<()> {
    for f in ["pki", "tokens.csv", "admin.kubeconfig"] {
        let p = data_dir.join(f);
        let r = if p.is_dir() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
        match r {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot remove {}", p.display())),
        }
    }
    Ok(())
}

/// The fleet's Secret made from `data_dir`'s files (the first replica's).
fn fleet_secret(data_dir: &Path) -> Result<serde_json::Value> {
    let mut data = serde_json::Map::new();
    for (field, file) in FLEET_FILES {
        let path = data_dir.join(file);
        let text = read(&path)?.with_context(|| format!("{} is missing", path.display()))?;
        data.insert(field.into(), serde_json::Value::String(b64(&text)));
    }
    Ok(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": FLEET_SECRET.1, "namespace": FLEET_SECRET.0},
        "data": data,
    }))
}
