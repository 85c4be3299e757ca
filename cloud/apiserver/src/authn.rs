//! Who a request comes from, as kube-apiserver decides it: a client certificate's common name
//! and organizations (a revoked node certificate authenticates nobody), or a bearer token of
//! `tokens.csv`; then `Impersonate-User` and `Impersonate-Group` when the caller may
//! impersonate them (`kubectl --as`). What the user may then do is `authz`'s.

use crate::RevocationCheck;
use crate::api::Api;
use crate::authz;
use crate::status::Status;
use axum::http::HeaderMap;
use std::sync::Arc;

/// Who made a request, as kube-apiserver names it: the user and its groups (a client
/// certificate's common name and organizations, or a bearer token's line in `tokens.csv`).
/// Every authenticated user is also in `system:authenticated`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    pub fn new(name: impl Into<String>, mut groups: Vec<String>) -> Self {
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        Self {
            name: name.into(),
            groups,
        }
    }

    /// The user the server's own requests run as (its bootstrap): a member of
    /// `system:masters`.
    pub(crate) fn server() -> Self {
        Self::new("system:apiserver", vec!["system:masters".into()])
    }

    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// The client certificate of a connection, if it gave one.
#[derive(Clone, Debug)]
pub struct Identity(pub Option<User>);

/// The DER of a connection's client certificate, if it gave one (for those that check it
/// further, as cloudhub's certificate port checks revocation).
#[derive(Clone, Debug)]
pub struct ClientCertificate(pub Arc<Vec<u8>>);

/// The address a connection comes from (for limits per client).
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub std::net::SocketAddr);

/// The user a request comes from, or `None` (401): the client certificate's (a revoked node
/// certificate authenticates nobody), else the bearer token's line in `tokens.csv`.
pub(crate) fn authenticate(
    identity: Option<&Identity>,
    certificate: Option<&ClientCertificate>,
    authorization: Option<&str>,
    tokens: &[(String, User)],
    revoked: Option<&RevocationCheck>,
) -> Option<User> {
    if let Some(Identity(Some(user))) = identity {
        // Only node certificates are revoked (and checked: the check reads a file).
        let revoked = match (revoked, certificate) {
            (Some(check), Some(cert)) if user.in_group("system:nodes") => {
                pki::serial_and_expiry(&cert.0).is_none_or(|(serial, _)| (check.0)(&serial))
            }
            _ => false,
        };
        return (!revoked).then(|| user.clone());
    }
    let token = authorization?.strip_prefix("Bearer ")?.trim();
    tokens
        .iter()
        .find(|(t, _)| rt::secret::same(t.as_bytes(), token.as_bytes()))
        .map(|(_, u)| u.clone())
}

/// What a request asks to act as: `Impersonate-User` and its `Impersonate-Group`s, `None` when
/// it asks nothing. Whatever cannot be honoured is refused, not left out (the request would then
/// run as someone it did not ask for): groups without a user (as Kubernetes), a value that is
/// not text, and the impersonation headers this server does not implement (`Impersonate-Uid`,
/// `Impersonate-Extra-*`).
pub(crate) fn impersonation(headers: &HeaderMap) -> Result<Option<(String, Vec<String>)>, Status> {
    let text = |name: &str, v: &axum::http::HeaderValue| {
        v.to_str()
            .map(str::to_string)
            .map_err(|_| Status::bad_request(format!("header {name} is not text")))
    };
    let mut user = None;
    let mut groups = Vec::new();
    for (name, value) in headers {
        // (Header names come lower-cased.)
        let name = name.as_str();
        if name == "impersonate-user" {
            if user.is_some() {
                return Err(Status::bad_request("more than one Impersonate-User header"));
            }
            user = Some(text("Impersonate-User", value)?);
        } else if name == "impersonate-group" {
            groups.push(text("Impersonate-Group", value)?);
        } else if name.starts_with("impersonate-") {
            return Err(Status::bad_request(format!(
                "header {name} is not supported here (only Impersonate-User and Impersonate-Group)"
            )));
        }
    }
    match user {
        Some(u) if u.is_empty() => Err(Status::bad_request("Impersonate-User is empty")),
        Some(u) => Ok(Some((u, groups))),
        None if groups.is_empty() => Ok(None),
        None => Err(Status::bad_request(
            "Impersonate-Group without Impersonate-User: a group is impersonated only with a user",
        )),
    }
}

/// The user a request acts as: `Impersonate-User` (with its `Impersonate-Group`s) when the
/// caller may impersonate them (`impersonate` on `users` and `groups`), as `kubectl --as`.
pub(crate) fn impersonated(api: &Api, user: User, headers: &HeaderMap) -> Result<User, Status> {
    let Some((target, groups)) = impersonation(headers)? else {
        return Ok(user);
    };
    let tables = api.store.read();
    let asks = |resource: &'static str, name: &str| {
        let a = authz::Attributes {
            verb: "impersonate",
            group: "",
            resource,
            sub: None,
            ns: "",
            name: Some(name),
            field_selector: None,
        };
        if authz::allowed(&tables, &user, &a) {
            Ok(())
        } else {
            Err(authz::forbidden(&user, &a))
        }
    };
    asks("users", &target)?;
    for g in &groups {
        asks("groups", g)?;
    }
    Ok(User::new(target, groups))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Vec<(String, User)> {
        vec![(
            "s3cret".into(),
            User::new("admin", vec!["system:masters".into()]),
        )]
    }

    #[test]
    fn an_impersonation_that_cannot_be_honoured_is_refused_not_left_out() {
        use axum::http::HeaderValue;
        let ask = |pairs: &[(&'static str, &[u8])]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(*k, HeaderValue::from_bytes(v).expect("a header value"));
            }
            impersonation(&h).map_err(|s| s.message)
        };
        assert_eq!(ask(&[]), Ok(None));
        assert_eq!(ask(&[("accept", b"*/*")]), Ok(None));
        assert_eq!(
            ask(&[
                ("Impersonate-User", b"alice"),
                ("Impersonate-Group", b"devs"),
                ("impersonate-group", b"ops"),
            ]),
            Ok(Some(("alice".into(), vec!["devs".into(), "ops".into()])))
        );
        let refused = |pairs: &[(&'static str, &[u8])], says: &str| {
            let e = ask(pairs).expect_err(says);
            assert!(e.contains(says), "{e}");
        };
        refused(
            &[("Impersonate-Group", b"system:masters")],
            "without Impersonate-User",
        );
        refused(
            &[("Impersonate-User", b"\xff\xfe")],
            "Impersonate-User is not text",
        );
        refused(
            &[
                ("Impersonate-User", b"alice"),
                ("Impersonate-Group", b"\xffx"),
            ],
            "Impersonate-Group is not text",
        );
        refused(&[("Impersonate-User", b"")], "Impersonate-User is empty");
        refused(
            &[("Impersonate-User", b"alice"), ("Impersonate-User", b"bob")],
            "more than one",
        );
        refused(
            &[("Impersonate-User", b"alice"), ("Impersonate-Uid", b"42")],
            "impersonate-uid is not supported",
        );
        refused(
            &[("Impersonate-Extra-Scopes", b"view")],
            "impersonate-extra-scopes is not supported",
        );
    }

    #[test]
    fn a_bearer_token_of_tokens_csv_is_its_user_and_anything_else_nobody() {
        let t = tokens();
        let who = |h: Option<&str>| authenticate(None, None, h, &t, None).map(|u| u.name);
        assert_eq!(who(Some("Bearer s3cret")), Some("admin".into()));
        assert_eq!(who(Some("Bearer  s3cret ")), Some("admin".into()));
        assert_eq!(who(Some("Bearer wrong")), None);
        assert_eq!(who(Some("Basic s3cret")), None);
        assert_eq!(who(Some("s3cret")), None);
        assert_eq!(who(None), None);
        let u = authenticate(None, None, Some("Bearer s3cret"), &t, None).expect("admin");
        assert!(u.in_group("system:authenticated"), "every user is");
    }

    #[test]
    fn a_client_certificate_wins_and_a_revoked_node_certificate_authenticates_nobody() {
        let dir = tempfile::tempdir().expect("dir");
        let (ca, key) = pki::load_or_make_ca(dir.path()).expect("a CA");
        let (cert, _) = pki::sign_leaf(
            &ca,
            &key,
            "system:node:edge-1",
            Some("system:nodes"),
            &[],
            false,
            1,
        )
        .expect("a node certificate");
        let der = ClientCertificate(Arc::new(pki::pem_to_der(&cert).expect("DER")));
        let node = Identity(Some(User::new(
            "system:node:edge-1",
            vec!["system:nodes".into()],
        )));
        let t = tokens();
        let revoke_all = RevocationCheck(Arc::new(|_| true), None);
        let revoke_none = RevocationCheck(Arc::new(|_| false), None);
        let who = |id: &Identity, check: &RevocationCheck| {
            authenticate(Some(id), Some(&der), Some("Bearer s3cret"), &t, Some(check))
                .map(|u| u.name)
        };
        assert_eq!(
            who(&node, &revoke_none),
            Some("system:node:edge-1".into()),
            "the certificate, not the token"
        );
        assert_eq!(
            who(&node, &revoke_all),
            None,
            "revoked: nobody, not the token's user"
        );
        let person = Identity(Some(User::new("alice", vec![])));
        assert_eq!(
            who(&person, &revoke_all),
            Some("alice".into()),
            "only node certificates are checked for revocation"
        );
        assert_eq!(
            who(&Identity(None), &revoke_all),
            Some("admin".into()),
            "no certificate: the token"
        );
    }
}
