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
    rt::host::name().filter(|s| crate::meta::is_dns_subdomain(s))
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
/// certificate and token, and the bearer tokens; made by the first replica.
///
/// They are kept aside in etcd ([`FLEET_ASIDE`]), outside the objects the API serves, so no
/// request of any user reaches the CA key, whatever its authorization decides (an older fleet
/// kept them in the Secret [`FLEET_SECRET`], which a node could read through a hole in the
/// authorizer: it is moved aside, then deleted, at the first start of this version).
const FLEET_FILES: [(&str, &str); 3] = [
    ("ca.crt", "pki/ca.crt"),
    ("ca.key", "pki/ca.key"),
    ("tokens.csv", "tokens.csv"),
];

/// The name the fleet's files are kept aside under (JSON: field -> text).
const FLEET_ASIDE: &str = "fleet-pki";

/// Where an older fleet kept its files.
pub(crate) const FLEET_SECRET: (&str, &str) = ("kube-system", "cloudcore-pki");

type Files = std::collections::BTreeMap<String, String>;

/// The fleet's files kept aside in etcd, moved there first from the Secret of an older fleet.
async fn fleet_files(store: &crate::store::Store) -> Result<Option<Files>> {
    if let Some(raw) = store.aside(FLEET_ASIDE).await? {
        let files: Files =
            serde_json::from_slice(&raw).context("the fleet's files in etcd do not parse")?;
        return Ok(Some(files));
    }
    let key = crate::store::Key {
        res: std::sync::Arc::from("secrets"),
        ns: FLEET_SECRET.0.into(),
        name: FLEET_SECRET.1.into(),
    };
    let Some(secret) = store.read().get(&key).map(|o| o.value()) else {
        return Ok(None);
    };
    let mut files = Files::new();
    for (field, _) in FLEET_FILES {
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
        files.insert(field.to_string(), text);
    }
    let (kept, _) = store
        .aside_first(FLEET_ASIDE, serde_json::to_vec(&files)?)
        .await?;
    let files: Files = serde_json::from_slice(&kept).context("the fleet's files do not parse")?;
    store
        .mutate(
            key,
            false,
            Box::new(|old, _| {
                Ok(match old {
                    Some(v) => crate::store::Outcome::Delete(v),
                    None => crate::store::Outcome::Unchanged(serde_json::Value::Null),
                })
            }),
        )
        .await
        .map_err(|s| {
            anyhow::anyhow!(
                "cannot delete the Secret {}/{}: {}",
                FLEET_SECRET.0,
                FLEET_SECRET.1,
                s.message
            )
        })?;
    tracing::info!(
        "replicas: the fleet's CA and tokens moved from the Secret {}/{} to where no request reaches them",
        FLEET_SECRET.0,
        FLEET_SECRET.1
    );
    Ok(Some(files))
}

/// Writes the fleet's files into `data_dir` (those missing are written; `false` when one
/// differs: this data directory is another fleet's).
fn adopt_fleet(files: &Files, data_dir: &Path) -> Result<bool> {
    rt::fs::private_dir(&data_dir.join("pki"))?;
    for (field, file) in FLEET_FILES {
        let text = files
            .get(field)
            .with_context(|| format!("the fleet's files in etcd have no {field}"))?;
        if !pki::adopt_shared(&data_dir.join(file), text, false)? {
            return Ok(false);
        }
    }
    Ok(true)
}

fn not_the_fleets(data_dir: &Path) -> anyhow::Error {
    anyhow::anyhow!(
        "{} is not the fleet's (the one in etcd): this data directory was made for another fleet (or another replica started first at the same time); give this replica an empty data directory and it takes the fleet's CA and tokens",
        data_dir.join("pki/ca.crt").display()
    )
}

/// Where this server stands among replicas sharing one etcd (one CA and one `tokens.csv`, the
/// first replica's, kept aside in etcd).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fleet {
    /// No etcd: nothing is shared.
    Alone,
    /// The fleet's CA and tokens were in etcd, and are now this server's.
    Adopted,
    /// None in etcd yet: this server offers its own ([`Fleet::settle`]).
    /// `fresh`: its CA is made at this start, so it can drop it if another server wins.
    Offering { fresh: bool },
}

impl Fleet {
    /// Before this server's credentials are prepared: takes the fleet's when there are.
    pub(crate) async fn join(store: &crate::store::Store, data_dir: &Path) -> Result<Self> {
        if !store.shared() {
            return Ok(Self::Alone);
        }
        if let Some(files) = fleet_files(store).await? {
            if !adopt_fleet(&files, data_dir)? {
                return Err(not_the_fleets(data_dir));
            }
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

    /// Once this server's credentials are prepared: an offering server puts its files in
    /// etcd unless another did first. Replicas started together on an empty etcd all offer
    /// theirs and one wins; a server whose CA was made at this start drops it and takes the
    /// fleet's (`true`: its credentials changed); one whose CA was there before refuses to
    /// start (its data directory is another fleet's).
    pub(crate) async fn settle(self, store: &crate::store::Store, data_dir: &Path) -> Result<bool> {
        let Self::Offering { fresh } = self else {
            return Ok(false);
        };
        let mut ours = Files::new();
        for (field, file) in FLEET_FILES {
            let path = data_dir.join(file);
            let text = read(&path)?.with_context(|| format!("{} is missing", path.display()))?;
            ours.insert(field.to_string(), text);
        }
        let (kept, put) = store
            .aside_first(FLEET_ASIDE, serde_json::to_vec(&ours)?)
            .await?;
        if put {
            return Ok(false);
        }
        let theirs: Files =
            serde_json::from_slice(&kept).context("the fleet's files in etcd do not parse")?;
        if theirs == ours {
            return Ok(false);
        }
        if !fresh {
            return Err(not_the_fleets(data_dir));
        }
        tracing::info!("replicas: another server made the fleet's CA first; using it");
        forget(data_dir)?;
        if !adopt_fleet(&theirs, data_dir)? {
            return Err(not_the_fleets(data_dir));
        }
        Ok(true)
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
