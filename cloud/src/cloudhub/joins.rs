//! The join tokens cloudcore has given out, so that a token is not a master key: each is
//! recorded (`{dataDir}/pki/join-tokens.json`, 0600 in the 0700 `pki` directory) under the id in
//! its JWT (`jti`), with its expiry, the node name it is limited to (if any), how many joins it
//! allows (if limited) and how many it was used for; `cloudcore token list` shows them and
//! `cloudcore token revoke ID` ends one at once. A token whose id is not recorded (one made
//! before this file existed, or forged with the key) joins nothing.
//!
//! It also keeps the certificate each node was last given (serial and expiry), so that a join
//! by token cannot take over the name of a node that is joined: a name with a certificate that
//! is valid and not revoked joins again only after `cloudcore node revoke NAME`. That revokes
//! every certificate the node was ever given and that has not expired (its renewals too, each
//! recorded as it is issued): the API, cloudhub and the certificate port refuse them all.
//!
//! The file is read and written whole under an exclusive lock, by the running cloudcore (a join
//! counts) and by the `cloudcore token` and `node` commands alike.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One token given out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Token {
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    pub expires: u64,
    /// The only node name it may join as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// How many joins it allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_joins: Option<u32>,
    #[serde(default)]
    pub joins: u32,
    #[serde(default)]
    pub revoked: bool,
}

/// Why a join by token is refused (the edge is answered with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the token is not one this cloudcore gave out (cloudcore token list)")]
    Unknown,
    #[error("the token {0} was revoked")]
    Revoked(String),
    #[error("the token {id} was used for its {max} join(s) already")]
    Used { id: String, max: u32 },
    #[error("the token {id} is for node {allowed:?} only, not {asked:?}")]
    OtherNode {
        id: String,
        allowed: String,
        asked: String,
    },
    #[error(
        "node {node:?} is joined, with a certificate valid until {until} (Unix time); to join it again, revoke that one: cloudcore node revoke {node}"
    )]
    Joined { node: String, until: i64 },
}

/// The certificate a node was last given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NodeCert {
    pub serial: String,
    /// Unix seconds.
    pub not_after: i64,
}

/// The record of tokens of a data directory.
#[derive(Debug, Clone)]
pub struct Book {
    file: PathBuf,
}

#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Records {
    tokens: Vec<Token>,
    #[serde(default)]
    nodes: std::collections::BTreeMap<String, NodeCert>,
    /// Serials of revoked node certificates, with their expiry (forgotten once expired).
    #[serde(default)]
    revoked: std::collections::BTreeMap<String, i64>,
    /// Every certificate given to a node that has not expired, by serial: what a revocation
    /// of the node revokes.
    #[serde(default)]
    issued: std::collections::BTreeMap<String, Issued>,
}

/// A certificate given to a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Issued {
    node: String,
    /// Unix seconds.
    not_after: i64,
}

impl Records {
    /// Takes in another replica's records: every token (the larger join count, revoked if
    /// either revoked it), every revocation, and each node's newer certificate unless revoked.
    /// Merging is the same whichever replica merges first, so replicas converge.
    fn merge(&mut self, other: &Records) {
        for t in &other.tokens {
            match self.tokens.iter_mut().find(|m| m.id == t.id) {
                Some(m) => {
                    m.joins = m.joins.max(t.joins);
                    m.revoked |= t.revoked;
                }
                None => self.tokens.push(t.clone()),
            }
        }
        self.tokens.sort_by(|a, b| a.id.cmp(&b.id));
        for (serial, until) in &other.revoked {
            let e = self.revoked.entry(serial.clone()).or_insert(*until);
            *e = (*e).max(*until);
        }
        for (node, c) in &other.nodes {
            match self.nodes.get(node) {
                Some(m) if m.not_after >= c.not_after => {}
                _ => {
                    self.nodes.insert(node.clone(), c.clone());
                }
            }
        }
        for (serial, i) in &other.issued {
            self.issued
                .entry(serial.clone())
                .or_insert_with(|| i.clone());
        }
        let revoked = &self.revoked;
        self.nodes.retain(|_, c| !revoked.contains_key(&c.serial));
        self.issued
            .retain(|serial, _| !revoked.contains_key(serial));
    }

    /// Revokes every certificate `node` was given; whether there was one.
    fn revoke_node(&mut self, node: &str, now: i64) -> bool {
        self.revoked.retain(|_, until| *until > now);
        self.issued.retain(|_, i| i.not_after > now);
        let mut any = false;
        if let Some(c) = self.nodes.remove(node) {
            self.revoked.insert(c.serial, c.not_after);
            any = true;
        }
        let theirs: Vec<String> = (self.issued.iter())
            .filter(|(_, i)| i.node == node)
            .map(|(s, _)| s.clone())
            .collect();
        for serial in theirs {
            if let Some(i) = self.issued.remove(&serial) {
                self.revoked.insert(serial, i.not_after);
                any = true;
            }
        }
        any
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Gives `path` the owner and group of its directory when they differ: `cloudcore token create`
/// run by root on the service's files (owned by the `cloudcore` user) must not leave them
/// root's, or the service can no longer open them. Only root can; anyone else made the file
/// their own, in a directory they may write, and nothing is changed.
fn owned_like_dir(path: &Path) {
    use std::os::unix::fs::MetadataExt;
    let (Some(dir), Ok(file)) = (path.parent(), std::fs::metadata(path)) else {
        return;
    };
    let Ok(dir) = std::fs::metadata(dir) else {
        return;
    };
    if (file.uid(), file.gid()) == (dir.uid(), dir.gid()) {
        return;
    }
    if let Err(e) = std::os::unix::fs::chown(path, Some(dir.uid()), Some(dir.gid())) {
        tracing::warn!(file = %path.display(), error = %e, "cannot give the file its directory's owner");
    }
}

impl Book {
    pub fn new(data_dir: &Path) -> Self {
        Self {
            file: data_dir.join("pki").join("join-tokens.json"),
        }
    }

    /// Runs `f` on the records under the lock, and writes them back when it says so.
    fn with<T>(&self, f: impl FnOnce(&mut Records) -> (T, bool)) -> Result<T> {
        use std::os::unix::fs::OpenOptionsExt;
        if let Some(dir) = self.file.parent() {
            rt::fs::private_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let lock_path = self.file.with_extension("lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .with_context(|| format!("cannot open {}", lock_path.display()))?;
        owned_like_dir(&lock_path);
        lock.lock()
            .with_context(|| format!("cannot lock {}", lock_path.display()))?;
        let mut records: Records = match std::fs::read_to_string(&self.file) {
            Ok(text) => serde_json::from_str(&text)
                .with_context(|| format!("{} does not parse", self.file.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Records::default(),
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read {}", self.file.display()));
            }
        };
        let (out, changed) = f(&mut records);
        if changed {
            let text = serde_json::to_string_pretty(&records)?;
            pki::write_private(&self.file, &text)?;
            owned_like_dir(&self.file);
        }
        Ok(out)
    }

    /// Records a new token: valid `ttl_secs`, for `node` only and `max_joins` joins when given.
    pub fn create(
        &self,
        ttl_secs: u64,
        node: Option<String>,
        max_joins: Option<u32>,
    ) -> Result<Token> {
        let created = now();
        let token = Token {
            id: uuid::Uuid::new_v4().simple().to_string()[..12].to_string(),
            created,
            expires: created.saturating_add(ttl_secs),
            node,
            max_joins,
            joins: 0,
            revoked: false,
        };
        let t = token.clone();
        self.with(move |r| {
            // Tokens expired for a day are forgotten.
            let horizon = now().saturating_sub(86_400);
            r.tokens.retain(|t| t.expires > horizon);
            r.tokens.push(t);
            ((), true)
        })?;
        Ok(token)
    }

    /// How many joins token `id` allows, when it is limited.
    pub fn max_joins(&self, id: &str) -> Result<Option<u32>> {
        self.with(|r| {
            let max = r
                .tokens
                .iter()
                .find(|t| t.id == id)
                .and_then(|t| t.max_joins);
            (max, false)
        })
    }

    pub fn list(&self) -> Result<Vec<Token>> {
        self.with(|r| (r.tokens.clone(), false))
    }

    /// Revokes token `id`; `false` when there is none.
    pub fn revoke(&self, id: &str) -> Result<bool> {
        self.with(|r| match r.tokens.iter_mut().find(|t| t.id == id) {
            Some(t) => {
                t.revoked = true;
                (true, true)
            }
            None => (false, false),
        })
    }

    /// A join by token `id` (its signature and expiry already checked) as `node`: allowed, and
    /// counted, or refused with the reason.
    pub fn admit(&self, id: &str, node: &str) -> Result<Result<(), Refused>> {
        self.with(|r| {
            let Some(t) = r.tokens.iter_mut().find(|t| t.id == id) else {
                return (Err(Refused::Unknown), false);
            };
            if t.revoked {
                return (Err(Refused::Revoked(t.id.clone())), false);
            }
            if let Some(allowed) = t.node.as_ref().filter(|n| *n != node) {
                return (
                    Err(Refused::OtherNode {
                        id: t.id.clone(),
                        allowed: allowed.clone(),
                        asked: node.to_string(),
                    }),
                    false,
                );
            }
            if let Some(max) = t.max_joins.filter(|m| t.joins >= *m) {
                return (
                    Err(Refused::Used {
                        id: t.id.clone(),
                        max,
                    }),
                    false,
                );
            }
            let now = i64::try_from(now()).unwrap_or(i64::MAX);
            if let Some(c) = r.nodes.get(node)
                && c.not_after > now
                && !r.revoked.contains_key(&c.serial)
            {
                return (
                    Err(Refused::Joined {
                        node: node.to_string(),
                        until: c.not_after,
                    }),
                    false,
                );
            }
            t.joins += 1;
            (Ok(()), true)
        })
    }

    /// Records the certificate `node` was given.
    pub fn issued(&self, node: &str, serial: String, not_after: i64) -> Result<()> {
        self.with(|r| {
            let now = i64::try_from(now()).unwrap_or(i64::MAX);
            r.issued.retain(|_, i| i.not_after > now);
            r.issued.insert(
                serial.clone(),
                Issued {
                    node: node.to_string(),
                    not_after,
                },
            );
            r.nodes
                .insert(node.to_string(), NodeCert { serial, not_after });
            ((), true)
        })
    }

    /// Revokes every certificate `node` was given (renewals included); `false` when it has
    /// none recorded.
    pub fn revoke_node(&self, node: &str) -> Result<bool> {
        self.with(|r| {
            let now = i64::try_from(now()).unwrap_or(i64::MAX);
            let any = r.revoke_node(node, now);
            (any, any)
        })
    }

    /// Merges another replica's records (their JSON) into this book; the merged JSON, and
    /// whether this book changed.
    fn merge_text(&self, remote: Option<&str>) -> Result<(String, bool)> {
        let theirs: Records = match remote {
            Some(t) => serde_json::from_str(t).context("the shared join records do not parse")?,
            None => Records::default(),
        };
        self.with(|r| {
            let before = r.clone();
            r.merge(&theirs);
            let text = serde_json::to_string(&*r).unwrap_or_default();
            let changed = *r != before;
            ((text, changed), changed)
        })
    }

    /// Whether the certificate with `serial` was revoked.
    pub fn is_revoked(&self, serial: &str) -> Result<bool> {
        self.with(|r| (r.revoked.contains_key(serial), false))
    }

    /// A count that goes up each time the records change (a revocation by `cloudcore node
    /// revoke` in another process, a merge from another replica): what holds a session or a
    /// watch open checks its certificate again at each. The file's size and modification time
    /// are looked at every quarter second, for as long as a receiver is left.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let file = self.file.clone();
        let stamp = move || {
            std::fs::metadata(&file)
                .ok()
                .map(|m| (m.len(), m.modified().ok()))
        };
        tokio::spawn(async move {
            let mut last = stamp();
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
            while !tx.is_closed() {
                tick.tick().await;
                let now = stamp();
                if now != last {
                    last = now;
                    tx.send_modify(|n| *n += 1);
                }
            }
        });
        rx
    }

    /// Returns once the certificate with `serial` is revoked, as `changes` tells it (never,
    /// when there is no serial).
    pub async fn until_revoked(
        &self,
        serial: Option<&str>,
        mut changes: tokio::sync::watch::Receiver<u64>,
    ) {
        let Some(serial) = serial else {
            return std::future::pending().await;
        };
        loop {
            if changes.changed().await.is_err() {
                return std::future::pending().await;
            }
            if self.is_revoked(serial).unwrap_or(false) {
                return;
            }
        }
    }
}

/// The Secret the replicas of a fleet share their join records in.
pub(crate) const SHARED: (&str, &str) = ("kube-system", "cloudcore-joins");

/// Replicas: claims one of the `max` joins of token `id` for `node` through the API, where a
/// create is atomic: the ConfigMaps `kube-system/cloudcore-join-{id}-{n}`, `n` below `max`;
/// the first free one is made, and when all are there the token is used up. Two replicas
/// given the same one-join token at the same moment cannot both admit it (their records
/// only merge a second later). `Ok(false)`: used up.
pub(crate) async fn claim(client: &kube::Client, id: &str, max: u32, node: &str) -> Result<bool> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, ObjectMeta, PostParams};
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), SHARED.0);
    for n in 0..max {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("cloudcore-join-{id}-{n}")),
                labels: Some(
                    [(
                        "app.kubernetes.io/managed-by".to_string(),
                        "cloudcore".to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            data: Some([("node".to_string(), node.to_string())].into()),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &cm).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e).context("cannot claim a join of the token through the API"),
        }
    }
    Ok(false)
}

/// Replicas: keeps this replica's book and the fleet's (the Secret [`SHARED`]) merged, every
/// second: a token made or revoked, a join counted, a certificate given or revoked on one
/// replica reaches the others within seconds. Runs until `stop`.
pub(crate) async fn share(
    client: kube::Client,
    book: Book,
    stop: tokio_util::sync::CancellationToken,
) {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, ObjectMeta, PostParams};
    let api: Api<Secret> = Api::namespaced(client, SHARED.0);
    let field = "join-tokens.json";
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let remote = match api.get_opt(SHARED.1).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "join records: cannot read the shared ones");
                continue;
            }
        };
        let remote_text = remote
            .as_ref()
            .and_then(|s| s.data.as_ref()?.get(field))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned());
        let book2 = book.clone();
        let theirs = remote_text.clone();
        let merged = tokio::task::spawn_blocking(move || book2.merge_text(theirs.as_deref())).await;
        let (text, _) = match merged {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "join records: cannot merge the shared ones"
                );
                continue;
            }
            Err(_) => continue,
        };
        let same = remote_text
            .as_deref()
            .and_then(|t| serde_json::from_str::<Records>(t).ok())
            .zip(serde_json::from_str::<Records>(&text).ok())
            .is_some_and(|(a, b)| a == b);
        if same {
            continue;
        }
        let data =
            std::collections::BTreeMap::from([(field.to_string(), ByteString(text.into_bytes()))]);
        let r = match remote {
            Some(mut s) => {
                s.data = Some(data);
                api.replace(SHARED.1, &PostParams::default(), &s)
                    .await
                    .map(|_| ())
            }
            None => {
                let s = Secret {
                    metadata: ObjectMeta {
                        name: Some(SHARED.1.into()),
                        namespace: Some(SHARED.0.into()),
                        ..Default::default()
                    },
                    data: Some(data),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &s).await.map(|_| ())
            }
        };
        // 409: another replica wrote first; merged again next round.
        if let Err(e) = r {
            tracing::debug!(error = %e, "join records: the shared ones were not written this round");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node that renewed holds two valid certificates: revoking the node revokes both, and
    /// a replica that merges the records later refuses both as well.
    #[test]
    fn revoking_a_node_revokes_every_certificate_it_was_given() {
        let dir = tempfile::tempdir().expect("dir");
        let book = Book::new(dir.path());
        let far = i64::MAX / 2;
        book.issued("n1", "01".into(), far).expect("joined");
        book.issued("n1", "02".into(), far).expect("renewed");
        book.issued("n2", "03".into(), far).expect("another node");
        book.issued("n1", "04".into(), 1).expect("an expired one");
        let mut other = Records::default();
        other.merge(&book.with(|r| (r.clone(), false)).expect("read"));
        assert!(book.revoke_node("n1").expect("revoked"));
        for serial in ["01", "02"] {
            assert!(book.is_revoked(serial).expect("read"), "{serial}");
        }
        assert!(
            !book.is_revoked("03").expect("read"),
            "another node's stands"
        );
        assert!(!book.revoke_node("n1").expect("nothing left"));
        other.merge(&book.with(|r| (r.clone(), false)).expect("read"));
        assert!(other.revoked.contains_key("01") && other.revoked.contains_key("02"));
        assert!(!other.nodes.contains_key("n1") && other.nodes.contains_key("n2"));
    }

    #[test]
    fn tokens_are_limited_counted_and_revoked() {
        let dir = tempfile::tempdir().expect("dir");
        let book = Book::new(dir.path());
        let any = book.create(3600, None, None).expect("created");
        let one = book
            .create(3600, Some("n1".into()), Some(1))
            .expect("created");
        assert_eq!(book.admit(&any.id, "a").expect("read"), Ok(()));
        assert_eq!(book.admit(&any.id, "b").expect("read"), Ok(()));
        assert!(matches!(
            book.admit(&one.id, "n2").expect("read"),
            Err(Refused::OtherNode { .. })
        ));
        assert_eq!(book.admit(&one.id, "n1").expect("read"), Ok(()));
        assert!(matches!(
            book.admit(&one.id, "n1").expect("read"),
            Err(Refused::Used { max: 1, .. })
        ));
        assert!(book.revoke(&any.id).expect("revoked"));
        assert!(matches!(
            book.admit(&any.id, "a").expect("read"),
            Err(Refused::Revoked(_))
        ));
        assert_eq!(
            book.admit("not-given-out", "a").expect("read"),
            Err(Refused::Unknown)
        );
        let listed = book.list().expect("listed");
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].joins, 2);
        assert!(listed[0].revoked);

        // A joined node's name is not taken over until its certificate is revoked.
        let again = book.create(3600, None, None).expect("created");
        book.issued("n1", "0a".into(), i64::MAX).expect("recorded");
        assert!(matches!(
            book.admit(&again.id, "n1").expect("read"),
            Err(Refused::Joined { .. })
        ));
        assert!(!book.is_revoked("0a").expect("read"));
        assert!(book.revoke_node("n1").expect("revoked"));
        assert!(book.is_revoked("0a").expect("read"));
        assert_eq!(book.admit(&again.id, "n1").expect("read"), Ok(()));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("pki/join-tokens.json"))
            .expect("file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn replicas_records_merge_the_same_whichever_merges_first() {
        let a_dir = tempfile::tempdir().expect("dir");
        let b_dir = tempfile::tempdir().expect("dir");
        let (a, b) = (Book::new(a_dir.path()), Book::new(b_dir.path()));
        let t = a.create(3600, None, Some(2)).expect("created on a");
        a.issued("n1", "s1".into(), i64::MAX).expect("issued");
        // b learns a's records, counts a join with the token, revokes n1's certificate.
        let (text, changed) = b
            .merge_text(Some(&a.merge_text(None).expect("a").0))
            .expect("b");
        assert!(changed);
        assert!(text.contains(&t.id));
        assert_eq!(b.admit(&t.id, "n2").expect("read"), Ok(()));
        assert!(b.revoke_node("n1").expect("revoked"));
        // a merges b's: the join counts, n1's certificate is revoked there too; merging again
        // changes nothing, and b merging a's back changes nothing either.
        let b_text = b.merge_text(None).expect("b").0;
        let (a_text, changed) = a.merge_text(Some(&b_text)).expect("a");
        assert!(changed);
        assert!(a.is_revoked("s1").expect("read"));
        assert_eq!(a.admit(&t.id, "n3").expect("read"), Ok(()));
        let (_, b_changed) = b
            .merge_text(Some(&a.merge_text(None).expect("a").0))
            .expect("b");
        assert!(b_changed, "b takes a's count of n3's join");
        let (_, again) = a
            .merge_text(Some(&b.merge_text(None).expect("b").0))
            .expect("a");
        assert!(!again, "converged: {a_text}");
        // The token's two joins are used, on either replica.
        assert!(matches!(
            b.admit(&t.id, "n4").expect("read"),
            Err(Refused::Used { .. })
        ));
    }
}
