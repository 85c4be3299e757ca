//! Joining by token, as KubeEdge's cloudhub does it: `cloudcore gettoken` prints
//! `{sha256hex(CA DER)}.{JWT}` (HS256, signed with the CA key; claims `exp`, and `jti`, the id
//! under which the token is recorded and limited: see [`super::joins`]); an edge
//! fetches `GET /ca.crt` (DER), checks its hash against the token, and sends its certificate
//! request to `GET /edge.crt` (DER body, headers `Authorization: Bearer {jwt}` and `NodeName`),
//! getting back its certificate (DER). A node that has a certificate renews it with that
//! certificate instead of a token.

use anyhow::{Context, Result};
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The CA the edge certificates are signed with.
#[derive(Clone)]
pub(crate) struct Ca {
    pub pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
    /// The HMAC key of tokens: the CA key's DER, as KubeEdge signs them.
    secret: Vec<u8>,
}

/// The Secret replicas against a cluster share the CA in (as KubeEdge keeps its CA in a
/// Secret): the same name the embedded API's replicas use.
pub(crate) const SHARED_CA: (&str, &str) = ("kube-system", "cloudcore-pki");

/// Replicas against a cluster (`kubeconfig:`): the first one's CA goes into the Secret
/// [`SHARED_CA`]; the others take it (a replica with no CA of its own yet takes it, one whose
/// own differs refuses to start, naming the file).
pub(crate) async fn share_on_cluster(client: &kube::Client, data_dir: &Path) -> Result<()> {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, ObjectMeta, PostParams};
    let api: Api<Secret> = Api::namespaced(client.clone(), SHARED_CA.0);
    let dir = data_dir.join("pki");
    rt::fs::private_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let files = [
        ("ca.crt", dir.join("ca.crt")),
        ("ca.key", dir.join("ca.key")),
    ];
    let fresh = !files[0].1.exists();
    for _ in 0..3 {
        let shared = api
            .get_opt(SHARED_CA.1)
            .await
            .context("cannot read the fleet's CA from the cluster")?;
        let Some(secret) = shared else {
            let (pem, key) = pki::load_or_make_ca(&dir)?;
            let data = [("ca.crt", pem), ("ca.key", key)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
                .collect();
            let s = Secret {
                metadata: ObjectMeta {
                    name: Some(SHARED_CA.1.into()),
                    namespace: Some(SHARED_CA.0.into()),
                    ..Default::default()
                },
                data: Some(data),
                ..Default::default()
            };
            match api.create(&PostParams::default(), &s).await {
                Ok(_) => {
                    tracing::info!(
                        "replicas: this replica's CA is the fleet's now (Secret {}/{})",
                        SHARED_CA.0,
                        SHARED_CA.1
                    );
                    return Ok(());
                }
                // Another replica made it first: read it again.
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(e).context("cannot keep the fleet's CA in the cluster"),
            }
        };
        let data = secret.data.unwrap_or_default();
        for (field, path) in &files {
            let text = data
                .get(*field)
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .with_context(|| {
                    format!("the Secret {}/{} has no {field}", SHARED_CA.0, SHARED_CA.1)
                })?;
            if !pki::adopt_shared(path, &text, fresh)? {
                anyhow::bail!(
                    "{} is not the fleet's CA (the Secret {}/{}): give this replica an empty data directory and it takes the fleet's",
                    path.display(),
                    SHARED_CA.0,
                    SHARED_CA.1
                );
            }
        }
        tracing::info!("replicas: using the fleet's CA from the cluster");
        return Ok(());
    }
    anyhow::bail!("the fleet's CA Secret kept changing in the cluster")
}

impl Ca {
    /// The CA of a data directory (the embedded API's, in `{dataDir}/pki`), made on first use.
    pub(crate) fn load(data_dir: &Path) -> Result<Self> {
        let dir = data_dir.join("pki");
        rt::fs::private_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let (pem, key_pem) = pki::load_or_make_ca(&dir)?;
        Self::from_pem(pem, key_pem)
    }

    /// The CA cloudcore made in a data directory, for its commands (`gettoken`, `token create`):
    /// never made here. A command run before cloudcore's first start, or with another config
    /// than the one cloudcore runs with, would otherwise sign tokens no node can join with, and
    /// leave files the service may not open.
    pub(crate) fn open(data_dir: &Path) -> Result<Self> {
        let dir = data_dir.join("pki");
        let (crt, key) = (dir.join("ca.crt"), dir.join("ca.key"));
        let (Some(pem), Some(key_pem)) = (pki::read(&crt)?, pki::read(&key)?) else {
            anyhow::bail!(
                "no CA at {}: cloudcore has not started with this config (dataDir {}); start it first (systemctl enable --now cloudcore), or give --config the file it runs with",
                crt.display(),
                data_dir.display()
            );
        };
        Self::from_pem(pem, key_pem)
    }

    fn from_pem(pem: String, key_pem: String) -> Result<Self> {
        let der = pki::pem_to_der(&pem)?;
        let secret = pki::pem_to_der(&key_pem)?;
        Ok(Self {
            pem,
            key_pem,
            der,
            secret,
        })
    }

    /// `sha256hex(CA DER)`, the first part of a token.
    pub(crate) fn hash(&self) -> String {
        pki::node::ca_hash(&self.der)
    }

    /// A join token valid for `ttl`, with `id` as its `jti`.
    pub(crate) fn token(&self, ttl: Duration, id: &str) -> Result<String> {
        let exp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs()
            + ttl.as_secs();
        let jwt = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &Claims {
                exp,
                jti: Some(id.to_string()),
            },
            &jsonwebtoken::EncodingKey::from_secret(&self.secret),
        )?;
        Ok(format!("{}.{jwt}", self.hash()))
    }

    /// Checks the JWT part of a token (what an edge sends as its bearer token): its claims.
    pub(crate) fn verify(&self, jwt: &str) -> Result<Claims, TokenError> {
        let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
        v.required_spec_claims = ["exp".to_string()].into();
        v.leeway = 0;
        jsonwebtoken::decode::<Claims>(
            jwt,
            &jsonwebtoken::DecodingKey::from_secret(&self.secret),
            &v,
        )
        .map(|d| d.claims)
        .map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::ExpiredSignature => TokenError::Expired,
            jsonwebtoken::errors::ErrorKind::InvalidSignature => TokenError::WrongSignature,
            _ => TokenError::Invalid(e),
        })
    }
}

/// What a join token says.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Claims {
    pub exp: u64,
    /// The token's record (tokens made before records were kept have none, and join nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
}

/// Why a bearer token is refused (the edge is answered with this text).
#[derive(Debug, thiserror::Error)]
pub(crate) enum TokenError {
    #[error("the token has expired: get a new one with `cloudcore gettoken`")]
    Expired,
    #[error("the token was not made by this cloudcore (wrong signature)")]
    WrongSignature,
    #[error("the token is not valid: {0}")]
    Invalid(jsonwebtoken::errors::Error),
}

/// What the certificate server needs.
pub(crate) struct CertServer {
    pub ca: Ca,
    pub cert_days: i64,
    /// The tokens given out.
    pub book: super::joins::Book,
    /// Replicas: the API a limited token's joins are claimed through ([`super::joins::claim`]).
    pub claims: Option<kube::Client>,
    /// Where the releases `NodeUpgradeJob`s install are (`{dataDir}/releases`).
    pub releases: std::path::PathBuf,
}

fn refuse(code: StatusCode, why: String) -> Response {
    tracing::warn!(%code, reason = %why, "edge certificate refused");
    (code, why).into_response()
}

/// The user of a request's client certificate and that certificate's serial number.
fn caller(req: &Request) -> (Option<String>, Option<String>) {
    let ident = req
        .extensions()
        .get::<apiserver::Identity>()
        .and_then(|i| i.0.as_ref().map(|u| u.name.clone()));
    let presented = req
        .extensions()
        .get::<apiserver::ClientCertificate>()
        .and_then(|c| pki::serial_and_expiry(&c.0))
        .map(|(serial, _)| serial);
    (ident, presented)
}

impl CertServer {
    /// `GET /ca.crt`, `GET /edge.crt` (and `DELETE`: a node gives its certificates up) and
    /// `GET /releases/{version}/edgecore`.
    pub(crate) fn router(self: Arc<Self>) -> axum::Router {
        let me = self.clone();
        let releases = self.clone();
        axum::Router::new()
            .route(
                "/ca.crt",
                axum::routing::get(move || {
                    let der = self.ca.der.clone();
                    async move { der }
                }),
            )
            .route(
                "/releases/{version}/edgecore",
                axum::routing::get(
                    move |axum::extract::Path(version): axum::extract::Path<String>,
                          req: Request| {
                        let me = releases.clone();
                        let (user, presented) = caller(&req);
                        let node =
                            user.and_then(|u| u.strip_prefix("system:node:").map(str::to_string));
                        async move { me.release(&version, node, presented).await }
                    },
                ),
            )
            .route(
                "/edge.crt",
                axum::routing::get({
                    let me = me.clone();
                    move |req: Request| {
                        let me = me.clone();
                        async move { me.edge_cert(req).await }
                    }
                })
                .delete(move |req: Request| {
                    let me = me.clone();
                    async move { me.give_up(&req) }
                }),
            )
    }

    /// `DELETE /edge.crt` (`edgecore reset`): the node of the presented certificate (not
    /// revoked, naming the `NodeName` asked for) gives up every certificate it was given; its
    /// sessions end as with `cloudcore node revoke`, and it can join again with a token.
    fn give_up(&self, req: &Request) -> Response {
        let (ident, presented) = caller(req);
        let Some(node) = req
            .headers()
            .get("NodeName")
            .and_then(|v| v.to_str().ok())
            .filter(|n| !n.is_empty())
        else {
            return refuse(StatusCode::BAD_REQUEST, "no NodeName header".into());
        };
        if ident.as_deref() != Some(&format!("system:node:{node}")) {
            return refuse(
                StatusCode::FORBIDDEN,
                format!("only node {node:?}'s own certificate can give up its certificates"),
            );
        }
        if presented
            .as_deref()
            .is_none_or(|s| self.book.is_revoked(s).unwrap_or(true))
        {
            return refuse(
                StatusCode::UNAUTHORIZED,
                format!("the certificate of node {node:?} was revoked already"),
            );
        }
        match self.book.revoke_node(node) {
            Ok(_) => {
                tracing::info!(%node, "the node gave up its certificates (edgecore reset)");
                (
                    StatusCode::OK,
                    format!("the certificates of node {node:?} are revoked\n"),
                )
                    .into_response()
            }
            Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
        }
    }

    /// A release's edgecore, for a node (its certificate, not revoked) a `NodeUpgradeJob`
    /// upgrades; the node checks its SHA-256 from the job's question.
    async fn release(
        &self,
        version: &str,
        node: Option<String>,
        presented: Option<String>,
    ) -> Response {
        let Some(node) = node else {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "a release is given to a node's certificate only".into(),
            );
        };
        if presented
            .as_deref()
            .is_none_or(|s| self.book.is_revoked(s).unwrap_or(true))
        {
            return refuse(
                StatusCode::UNAUTHORIZED,
                format!("the certificate of node {node:?} was revoked"),
            );
        }
        if !api::operations::valid_version(version) {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("{version:?} is not a release name"),
            );
        }
        let path = self.releases.join(version).join("edgecore");
        match tokio::fs::File::open(&path).await {
            Ok(f) => {
                let len = f.metadata().await.map(|m| m.len()).unwrap_or(0);
                tracing::info!(%node, %version, bytes = len, "release sent");
                let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(f));
                (
                    [
                        ("content-type", "application/octet-stream".to_string()),
                        ("content-length", len.to_string()),
                    ],
                    body,
                )
                    .into_response()
            }
            Err(e) => refuse(
                StatusCode::NOT_FOUND,
                format!("no release {version:?} on this cloudcore ({e})"),
            ),
        }
    }

    async fn edge_cert(&self, req: Request) -> Response {
        let (ident, presented) = caller(&req);
        let headers: HeaderMap = req.headers().clone();
        let Some(node) = headers
            .get("NodeName")
            .and_then(|v| v.to_str().ok())
            .filter(|n| !n.is_empty())
        else {
            return refuse(StatusCode::BAD_REQUEST, "no NodeName header".into());
        };
        let node = node.to_string();
        // A Node's name, as Kubernetes checks it: `system:masters` or `a/b` name no node, and
        // the certificate's `system:node:NAME` must not be made for one.
        if let Err(e) = api::validate::node::check_name(&node) {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("the node name {node:?} is not a valid Node name: {e}"),
            );
        }
        let by = if ident.is_some() {
            "certificate"
        } else {
            "token"
        };
        let mut token_id = None;
        match &ident {
            // Renewal: the node's current certificate stands for the token, unless revoked.
            Some(cn) if *cn == format!("system:node:{node}") => {
                let revoked = presented
                    .as_deref()
                    .is_none_or(|s| self.book.is_revoked(s).unwrap_or(true));
                if revoked {
                    return refuse(
                        StatusCode::UNAUTHORIZED,
                        format!(
                            "the certificate of node {node:?} was revoked: join again with a token"
                        ),
                    );
                }
            }
            Some(cn) => {
                return refuse(
                    StatusCode::FORBIDDEN,
                    format!("the client certificate is {cn:?}: it cannot ask for node {node:?}"),
                );
            }
            None => {
                let Some(jwt) = headers
                    .get("Authorization")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                else {
                    return refuse(
                        StatusCode::UNAUTHORIZED,
                        "no token (Authorization: Bearer) and no client certificate".into(),
                    );
                };
                match self.ca.verify(jwt.trim()) {
                    Ok(claims) => token_id = Some(claims.jti.unwrap_or_default()),
                    Err(why) => return refuse(StatusCode::UNAUTHORIZED, why.to_string()),
                }
            }
        }
        let body = match axum::body::to_bytes(req.into_body(), 64 << 10).await {
            Ok(b) => b,
            Err(e) => {
                return refuse(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("cannot read the certificate request: {e}"),
                );
            }
        };
        if let Some(id) = &token_id {
            match self.book.admit(id, &node) {
                Ok(Ok(())) => {}
                Ok(Err(why @ super::joins::Refused::OtherNode { .. })) => {
                    return refuse(StatusCode::FORBIDDEN, why.to_string());
                }
                Ok(Err(why @ super::joins::Refused::Joined { .. })) => {
                    return refuse(StatusCode::CONFLICT, why.to_string());
                }
                Ok(Err(why)) => return refuse(StatusCode::UNAUTHORIZED, why.to_string()),
                Err(e) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
            }
            if let Some(client) = &self.claims {
                let max = match self.book.max_joins(id) {
                    Ok(max) => max,
                    Err(e) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
                };
                if let Some(max) = max {
                    match super::joins::claim(client, id, max, &node).await {
                        Ok(true) => {}
                        Ok(false) => {
                            let why = super::joins::Refused::Used {
                                id: id.clone(),
                                max,
                            };
                            return refuse(StatusCode::UNAUTHORIZED, why.to_string());
                        }
                        Err(e) => {
                            return refuse(StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}"));
                        }
                    }
                }
            }
        }
        match pki::node::sign(&self.ca.pem, &self.ca.key_pem, &body, &node, self.cert_days) {
            Ok(der) => {
                if let Some((serial, not_after)) = pki::serial_and_expiry(&der)
                    && let Err(e) = self.book.issued(&node, serial, not_after)
                {
                    return refuse(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}"));
                }
                tracing::info!(%node, authorized_by = by, "edge certificate issued");
                der.into_response()
            }
            Err(e) => refuse(StatusCode::BAD_REQUEST, format!("{e:#}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_verify_until_they_expire_and_only_with_their_ca() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = Ca::load(dir.path()).expect("ca");
        let token = ca.token(Duration::from_secs(3600), "t1").expect("token");
        let (hash, jwt) = token.split_once('.').expect("hash.jwt");
        assert_eq!(hash.len(), 64);
        assert_eq!(hash, ca.hash());
        assert_eq!(jwt.split('.').count(), 3, "a JWT: header.claims.signature");
        assert_eq!(ca.verify(jwt).expect("valid").jti.as_deref(), Some("t1"));

        let expired = ca.token(Duration::ZERO, "t2").expect("token");
        std::thread::sleep(Duration::from_millis(1100));
        let err = ca
            .verify(expired.split_once('.').expect("jwt").1)
            .expect_err("refused");
        assert!(matches!(err, TokenError::Expired), "{err}");

        let other = tempfile::tempdir().expect("dir");
        let other = Ca::load(other.path()).expect("ca");
        let err = other.verify(jwt).expect_err("refused");
        assert!(matches!(err, TokenError::WrongSignature), "{err}");
        assert_ne!(other.hash(), ca.hash());
    }

    #[test]
    fn a_node_gives_up_its_own_certificates_and_nobody_elses() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = Ca::load(dir.path()).expect("ca");
        let csr = pki::node::request("gw-1").expect("csr");
        let der = pki::node::sign(&ca.pem, &ca.key_pem, &csr.csr_der, "gw-1", 30).expect("cert");
        let (serial, not_after) = pki::serial_and_expiry(&der).expect("serial");
        let book = super::super::joins::Book::new(dir.path());
        book.issued("gw-1", serial.clone(), not_after)
            .expect("recorded");
        let server = CertServer {
            ca,
            cert_days: 30,
            book: super::super::joins::Book::new(dir.path()),
            claims: None,
            releases: dir.path().join("releases"),
        };
        let asking = |user: &str, node: Option<&str>| {
            let mut b = axum::http::Request::delete("/edge.crt");
            if let Some(n) = node {
                b = b.header("NodeName", n);
            }
            let mut req = b.body(axum::body::Body::empty()).expect("request");
            req.extensions_mut()
                .insert(apiserver::Identity(Some(apiserver::User::new(
                    user,
                    vec!["system:nodes".into()],
                ))));
            req.extensions_mut()
                .insert(apiserver::ClientCertificate(Arc::new(der.clone())));
            server.give_up(&req).status()
        };
        assert_eq!(
            asking("system:node:gw-2", Some("gw-1")),
            StatusCode::FORBIDDEN
        );
        assert_eq!(asking("system:node:gw-1", None), StatusCode::BAD_REQUEST);
        assert!(!book.is_revoked(&serial).expect("book"));
        assert_eq!(asking("system:node:gw-1", Some("gw-1")), StatusCode::OK);
        assert!(book.is_revoked(&serial).expect("book"));
        assert_eq!(
            asking("system:node:gw-1", Some("gw-1")),
            StatusCode::UNAUTHORIZED,
            "a revoked certificate gives up nothing more"
        );
    }
}
