//! Who may use the embedded broker, in Mosquitto's files so that its tools and habits carry
//! over: a password file as `mosquitto_passwd` writes it (`user:$7$ITERATIONS$SALT$HASH`,
//! PBKDF2-HMAC-SHA512, or the older `$6$SALT$HASH`, SHA-512 of the password and the salt), and
//! an ACL file (`user NAME`, then `topic [read|write|readwrite] TOPIC` lines for that user;
//! `topic` lines before any `user` line are for anonymous clients; `pattern` lines are for
//! every client, with `%u` the user name and `%c` the client id).
//!
//! With no password file, anyone may connect (KubeEdge's default: the broker is on loopback);
//! with one, only its users (unless `allowAnonymous`). With no ACL file, a client may use every
//! topic; with one, only what it grants: a publish it does not grant is acknowledged and
//! dropped, a message it may not read is not delivered to it (as Mosquitto does).

use base64::Engine;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A password file or ACL file that cannot be used; names the file and the line.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AuthError {
    #[error("cannot read {}: {source}", file.display())]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: line {line}: {why}", file.display())]
    Line {
        file: PathBuf,
        line: usize,
        why: String,
    },
}

/// Why a password file's hash is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum HashError {
    #[error("not base64: {0}")]
    NotBase64(String),
    #[error("{0:?} is not a number of iterations")]
    Iterations(String),
    #[error(
        "the password is not hashed as mosquitto_passwd hashes it ($7$ or $6$); run mosquitto_passwd -U on the file"
    )]
    NotMosquitto,
}

#[derive(Debug, Clone)]
enum Hash {
    /// `$7$`: PBKDF2-HMAC-SHA512.
    Pbkdf2 {
        iterations: std::num::NonZeroU32,
        salt: Vec<u8>,
        hash: Vec<u8>,
    },
    /// `$6$`: SHA-512 of the password, then the salt.
    Sha512 { salt: Vec<u8>, hash: Vec<u8> },
}

impl Hash {
    fn parse(text: &str) -> Result<Self, HashError> {
        let b64 = |s: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(|e| HashError::NotBase64(e.to_string()))
        };
        let parts: Vec<&str> = text.split('$').collect();
        match parts.as_slice() {
            ["", "7", iterations, salt, hash] => Ok(Self::Pbkdf2 {
                iterations: iterations
                    .parse::<u32>()
                    .ok()
                    .and_then(std::num::NonZeroU32::new)
                    .ok_or_else(|| HashError::Iterations(iterations.to_string()))?,
                salt: b64(salt)?,
                hash: b64(hash)?,
            }),
            ["", "6", salt, hash] => Ok(Self::Sha512 {
                salt: b64(salt)?,
                hash: b64(hash)?,
            }),
            _ => Err(HashError::NotMosquitto),
        }
    }

    fn verify(&self, password: &[u8]) -> bool {
        match self {
            Self::Pbkdf2 {
                iterations,
                salt,
                hash,
            } => ring::pbkdf2::verify(
                ring::pbkdf2::PBKDF2_HMAC_SHA512,
                *iterations,
                salt,
                password,
                hash,
            )
            .is_ok(),
            Self::Sha512 { salt, hash } => {
                let mut ctx = ring::digest::Context::new(&ring::digest::SHA512);
                ctx.update(password);
                ctx.update(salt);
                rt::secret::same(ctx.finish().as_ref(), hash)
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
    ReadWrite,
}

impl Access {
    fn allows(self, write: bool) -> bool {
        match self {
            Self::ReadWrite => true,
            Self::Read => !write,
            Self::Write => write,
        }
    }
}

#[derive(Debug, Default)]
struct Acl {
    /// By user name; `None`: anonymous clients.
    topics: HashMap<Option<String>, Vec<(Access, String)>>,
    /// For every client, `%u` and `%c` replaced.
    patterns: Vec<(Access, String)>,
}

/// The broker's rules of access.
#[derive(Debug)]
pub(crate) struct Auth {
    /// `None`: no password file, anyone connects.
    users: Option<HashMap<String, Hash>>,
    allow_anonymous: bool,
    acl: Option<Acl>,
}

fn read(file: &Path) -> Result<String, AuthError> {
    std::fs::read_to_string(file).map_err(|source| AuthError::Read {
        file: file.to_path_buf(),
        source,
    })
}

impl Default for Auth {
    fn default() -> Self {
        Self::open()
    }
}

impl Auth {
    /// Anyone may connect and use every topic.
    pub(crate) fn open() -> Self {
        Self {
            users: None,
            allow_anonymous: true,
            acl: None,
        }
    }

    /// The rules of `password_file` and `acl_file`; `allow_anonymous` defaults to "only when
    /// there is no password file".
    pub(crate) fn load(
        password_file: Option<&Path>,
        acl_file: Option<&Path>,
        allow_anonymous: Option<bool>,
    ) -> Result<Self, AuthError> {
        let users = match password_file {
            None => None,
            Some(file) => {
                let mut users = HashMap::new();
                for (i, line) in read(file)?.lines().enumerate() {
                    let line = line.trim();
                    if line.is_empty() || line.starts_with('#') {
                        continue;
                    }
                    let bad = |why: String| AuthError::Line {
                        file: file.to_path_buf(),
                        line: i + 1,
                        why,
                    };
                    let (user, hash) = line
                        .split_once(':')
                        .ok_or_else(|| bad("expected user:hash".into()))?;
                    users.insert(
                        user.to_string(),
                        Hash::parse(hash).map_err(|e| bad(e.to_string()))?,
                    );
                }
                Some(users)
            }
        };
        let acl = match acl_file {
            None => None,
            Some(file) => {
                let mut acl = Acl::default();
                let mut user: Option<String> = None;
                for (i, line) in read(file)?.lines().enumerate() {
                    let line = line.trim();
                    if line.is_empty() || line.starts_with('#') {
                        continue;
                    }
                    let bad = |why: &str| AuthError::Line {
                        file: file.to_path_buf(),
                        line: i + 1,
                        why: why.to_string(),
                    };
                    let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
                    let rest = rest.trim();
                    let rule = || -> Result<(Access, String), AuthError> {
                        let (access, topic) = match rest.split_once(' ') {
                            Some(("read", t)) => (Access::Read, t),
                            Some(("write", t)) => (Access::Write, t),
                            Some(("readwrite", t)) => (Access::ReadWrite, t),
                            _ => (Access::ReadWrite, rest),
                        };
                        let topic = topic.trim();
                        if topic.is_empty() {
                            return Err(bad("a topic is missing"));
                        }
                        Ok((access, topic.to_string()))
                    };
                    match word {
                        "user" if !rest.is_empty() => user = Some(rest.to_string()),
                        "topic" => acl.topics.entry(user.clone()).or_default().push(rule()?),
                        "pattern" => acl.patterns.push(rule()?),
                        _ => {
                            return Err(bad(
                                "expected user NAME, topic [read|write|readwrite] TOPIC or pattern [read|write|readwrite] TOPIC",
                            ));
                        }
                    }
                }
                Some(acl)
            }
        };
        let allow_anonymous = allow_anonymous.unwrap_or(users.is_none());
        Ok(Self {
            users,
            allow_anonymous,
            acl,
        })
    }

    /// The user a CONNECT logs in as (`None`: anonymous), or why it is refused.
    pub(crate) fn login(
        &self,
        login: Option<&rumqttc::Login>,
    ) -> Result<Option<String>, rumqttc::ConnectReturnCode> {
        use rumqttc::ConnectReturnCode as Code;
        match (login, &self.users) {
            (None, _) if self.allow_anonymous => Ok(None),
            (None, _) => Err(Code::NotAuthorized),
            (Some(l), None) => Ok(Some(l.username.clone())),
            (Some(l), Some(users)) => match users.get(&l.username) {
                Some(h) if h.verify(l.password.as_bytes()) => Ok(Some(l.username.clone())),
                _ => Err(Code::BadUserNamePassword),
            },
        }
    }

    /// Whether the ACL (if any) lets `user` (client `client_id`) read (`write` false) or write
    /// `topic`.
    pub(crate) fn allows(
        &self,
        user: Option<&str>,
        client_id: &str,
        topic: &str,
        write: bool,
    ) -> bool {
        let Some(acl) = &self.acl else {
            return true;
        };
        if !Self::plain_identity(user, client_id) {
            return false;
        }
        let own = acl
            .topics
            .get(&user.map(str::to_string))
            .into_iter()
            .flatten()
            .any(|(a, f)| a.allows(write) && super::topics::topic_matches(f, topic));
        own || acl.patterns.iter().any(|(a, p)| {
            // A `/` in the id or name would reach into another client's subtree
            // (`clients/%c/#` with id `a/b` is inside client `a`'s): such a pattern grants
            // that client nothing.
            let slash = |s: &str| s.contains('/');
            if (p.contains("%c") && slash(client_id))
                || (p.contains("%u") && user.is_some_and(slash))
            {
                return false;
            }
            let f = p
                .replace("%u", user.unwrap_or_default())
                .replace("%c", client_id);
            a.allows(write) && super::topics::topic_matches(&f, topic)
        })
    }

    /// Whether a client may be served at all under the ACL: a user name or client id with a
    /// wildcard (`+`, `#`) would widen a `%u` or `%c` pattern to other clients' topics, so
    /// such a client is granted nothing (Mosquitto's rule) and its CONNECT is refused.
    pub(crate) fn admits(&self, user: Option<&str>, client_id: &str) -> bool {
        self.acl.is_none() || Self::plain_identity(user, client_id)
    }

    fn plain_identity(user: Option<&str>, client_id: &str) -> bool {
        let wild = |s: &str| s.contains(['+', '#']);
        !wild(client_id) && !user.is_some_and(wild)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login(user: &str, password: &str) -> rumqttc::Login {
        rumqttc::Login::new(user, password)
    }

    /// `mosquitto_passwd`'s `$7$` format, made here with the same algorithm.
    fn pbkdf2_line(user: &str, password: &str) -> String {
        let salt = b"0123456789ab";
        let mut hash = [0u8; 64];
        let iterations = std::num::NonZeroU32::new(101).expect("non-zero");
        ring::pbkdf2::derive(
            ring::pbkdf2::PBKDF2_HMAC_SHA512,
            iterations,
            salt,
            password.as_bytes(),
            &mut hash,
        );
        let b = base64::engine::general_purpose::STANDARD;
        format!("{user}:$7$101${}${}", b.encode(salt), b.encode(hash))
    }

    #[test]
    fn passwords_are_checked_and_anonymous_clients_refused_once_there_is_a_file() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("passwd");
        std::fs::write(&file, format!("{}\n", pbkdf2_line("app", "s3cret"))).expect("written");
        let auth = Auth::load(Some(&file), None, None).expect("loaded");
        assert_eq!(
            auth.login(Some(&login("app", "s3cret"))),
            Ok(Some("app".into()))
        );
        assert_eq!(
            auth.login(Some(&login("app", "wrong"))),
            Err(rumqttc::ConnectReturnCode::BadUserNamePassword)
        );
        assert_eq!(
            auth.login(Some(&login("nobody", "s3cret"))),
            Err(rumqttc::ConnectReturnCode::BadUserNamePassword)
        );
        assert_eq!(
            auth.login(None),
            Err(rumqttc::ConnectReturnCode::NotAuthorized)
        );
        assert_eq!(Auth::open().login(None), Ok(None));
        std::fs::write(&file, "app:plain\n").expect("written");
        let e = Auth::load(Some(&file), None, None).expect_err("a plain password");
        assert!(e.to_string().contains("line 1"), "{e}");
    }

    /// The ACL file `text`, loaded (its directory lives as long as the first half).
    fn acl_of(text: &str) -> (tempfile::TempDir, Auth) {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("acl");
        std::fs::write(&file, text).expect("written");
        let auth = Auth::load(None, Some(&file), None).expect("loaded");
        (dir, auth)
    }

    #[test]
    fn the_acl_grants_per_user_per_pattern_and_nothing_else() {
        let (_dir, auth) = acl_of(
            "topic read $SYS/#\nuser app\ntopic read $hw/events/device/default/oven-1/#\ntopic write $hw/events/device/default/oven-1/twin/update\npattern readwrite clients/%c/#\n",
        );
        let app = Some("app");
        assert!(auth.allows(
            app,
            "c1",
            "$hw/events/device/default/oven-1/twin/update/document",
            false
        ));
        assert!(!auth.allows(
            app,
            "c1",
            "$hw/events/device/default/oven-2/twin/update/document",
            false
        ));
        assert!(auth.allows(
            app,
            "c1",
            "$hw/events/device/default/oven-1/twin/update",
            true
        ));
        assert!(!auth.allows(
            app,
            "c1",
            "$hw/events/device/default/oven-1/twin/update/delta",
            true
        ));
        assert!(auth.allows(app, "c1", "clients/c1/x", true));
        assert!(!auth.allows(app, "c1", "clients/c2/x", true));
        assert!(auth.allows(None, "c9", "$SYS/broker/uptime", false));
        assert!(!auth.allows(
            None,
            "c9",
            "$hw/events/device/default/oven-1/twin/update",
            true
        ));
        assert!(Auth::open().allows(None, "c", "anything", true));
    }

    #[test]
    fn a_client_id_or_user_with_a_wildcard_is_granted_nothing_under_an_acl() {
        let (_dir, auth) = acl_of("pattern readwrite clients/%c/#\npattern read users/%u/#\n");
        // `%c` = `#` would make the pattern `clients/#/#`: every client's topics.
        assert!(!auth.allows(None, "#", "clients/other/x", true));
        assert!(!auth.allows(None, "+", "clients/other/x", false));
        assert!(!auth.allows(Some("a+"), "c1", "clients/c1/x", true));
        assert!(!auth.admits(None, "#"));
        assert!(!auth.admits(Some("#"), "c1"));
        assert!(auth.admits(Some("app"), "c1"));
        assert!(auth.allows(Some("app"), "c1", "clients/c1/x", true));
        assert!(auth.allows(Some("app"), "c1", "users/app/y", false));
        assert!(
            Auth::open().admits(Some("#"), "+"),
            "no ACL, nothing to widen"
        );
    }

    #[test]
    fn a_pattern_grants_nothing_to_an_id_or_user_with_a_slash() {
        let (_dir, auth) = acl_of("pattern readwrite clients/%c/#\npattern read users/%u/#\n");
        // `clients/%c/#` with id `a/b` would be inside client `a`'s topics.
        assert!(!auth.allows(None, "a/b", "clients/a/b/x", true));
        assert!(!auth.allows(Some("app/x"), "c1", "users/app/x/y", false));
        // The other pattern still applies to it.
        assert!(auth.allows(Some("app/x"), "c1", "clients/c1/z", true));
        assert!(auth.allows(None, "a", "clients/a/b/x", true));
    }
}
