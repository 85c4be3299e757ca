//! Joining a cloudcore by token, as KubeEdge's edgehub certmanager does: `GET /ca.crt` (DER),
//! its SHA-256 checked against the token's first part; a P-256 key and a DER certificate request
//! (`CN=system:node:{node}`, `O=system:nodes`) sent to `GET /edge.crt` with the headers
//! `Authorization: Bearer {jwt}` and `NodeName`; the DER certificate back. Kept as PEM in
//! `{dataDir}/certs/`, so that later starts need no token.
//!
//! Renewal (KubeEdge's `rotateCertificates`): when less than a fifth of the certificate's
//! lifetime is left, a new key and request go to `/edge.crt` with the current certificate as the
//! TLS client certificate instead of a token. A certificate that expired anyway, or one from
//! another CA than the token names (the cloud was rebuilt and the node given a new token), is
//! replaced by joining again with the token.

use super::certserver::{answer, send};
use anyhow::{Context, Result, bail};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::CertificateDer;

/// The node's credentials: the cloud CA and its own certificate and key (PEM).
#[derive(Clone)]
pub(crate) struct Credentials {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl Credentials {
    /// A TLS client configuration trusting the cloud CA and presenting the node's certificate.
    pub(crate) fn client_config(&self) -> Result<Arc<rustls::ClientConfig>> {
        Ok(pki::tls::client_config(
            &self.ca_pem,
            Some((&self.cert_pem, &self.key_pem)),
        )?)
    }

    /// The certificate's validity: not before, not after (Unix seconds).
    pub(crate) fn validity(&self) -> Result<(i64, i64)> {
        pki::validity_of(&self.cert_pem).context("the node certificate")
    }

    /// Whether the certificate is due for renewal at `now` (Unix seconds): less than a fifth of
    /// its lifetime, or fewer than `before_days` days, left.
    pub(crate) fn renewal_due(&self, now: i64, before_days: u64) -> bool {
        match self.validity() {
            Ok((from, to)) => {
                let left = to - now;
                let days = i64::try_from(before_days.saturating_mul(86_400)).unwrap_or(i64::MAX);
                left < (to - from) / 5 || left < days
            }
            Err(_) => true,
        }
    }

    /// KubeEdge's hash of the CA (a token's first part).
    fn ca_hash(&self) -> Option<String> {
        pki::pem_to_der(&self.ca_pem)
            .ok()
            .map(|der| pki::node::ca_hash(&der))
    }
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The credentials kept in `dir`, or new ones got with the token and kept there.
pub(crate) async fn credentials(
    dir: &Path,
    cert_server: &str,
    node: &str,
    token: &str,
) -> Result<Credentials> {
    let (ca, crt, key) = (
        dir.join("ca.crt"),
        dir.join("edge.crt"),
        dir.join("edge.key"),
    );
    if let (Ok(ca_pem), Ok(cert_pem), Ok(key_pem)) = (
        std::fs::read_to_string(&ca),
        std::fs::read_to_string(&crt),
        std::fs::read_to_string(&key),
    ) {
        let kept = Credentials {
            ca_pem,
            cert_pem,
            key_pem,
        };
        let token_ca = token.trim().split('.').next().unwrap_or_default();
        let expired = kept.validity().map_or(true, |(_, to)| to <= now_secs())
            || kept.client_config().is_err();
        let other_ca = !token_ca.is_empty() && kept.ca_hash().as_deref() != Some(token_ca);
        if !(expired || other_ca) {
            return Ok(kept);
        }
        if token.is_empty() {
            bail!(
                "the node certificate in {} has expired or does not match its key, and there is no cloud.token to join again with (cloudcore gettoken)",
                dir.display()
            );
        }
        if other_ca {
            tracing::warn!(dir = %dir.display(), "edgehub: the kept certificate is from another CA than cloud.token names; joining again");
        } else {
            tracing::warn!(dir = %dir.display(), "edgehub: the kept certificate has expired or does not match its key; joining again with cloud.token");
        }
    }
    if token.is_empty() {
        bail!(
            "no certificate in {} and no cloud.token to get one with (cloudcore gettoken)",
            dir.display()
        );
    }
    let parts: Vec<&str> = token.trim().split('.').collect();
    if parts.len() != 4 {
        bail!("cloud.token is not {{CA hash}}.{{JWT}} (4 parts separated by dots)");
    }
    // The CA is not known yet: it is fetched without verification and then checked against
    // the token, which is what makes it trusted.
    let (status, ca_der) = answer(
        send(
            hyper::Method::GET,
            cert_server,
            "/ca.crt",
            insecure()?,
            &[],
            Vec::new(),
        )
        .await?,
    )
    .await?;
    if status != 200 {
        bail!("{cert_server}/ca.crt answered {status}");
    }
    let hash = pki::node::ca_hash(&ca_der);
    if hash != parts[0] {
        bail!(
            "failed to validate the CA certificate of {cert_server}: the token names CA {}, the server's is {hash}",
            parts[0]
        );
    }
    let ca_pem = pki::certificate_pem(&ca_der);
    let verified = pki::tls::client_config(&ca_pem, None)?;
    let bearer = format!("Bearer {}", parts[1..].join("."));
    let creds = request_certificate(
        cert_server,
        node,
        verified,
        &[("Authorization", &bearer), ("NodeName", node)],
        ca_pem,
    )
    .await?;
    keep(dir, &creds)?;
    tracing::info!(%node, dir = %dir.display(), "joined the cloud: certificate received");
    Ok(creds)
}

/// A new key, and a certificate for it from `/edge.crt` (authorized by `headers` or by the TLS
/// client certificate in `tls`).
async fn request_certificate(
    cert_server: &str,
    node: &str,
    tls: Arc<rustls::ClientConfig>,
    headers: &[(&str, &str)],
    ca_pem: String,
) -> Result<Credentials> {
    let request = pki::node::request(node)?;
    let (status, body) = answer(
        send(
            hyper::Method::GET,
            cert_server,
            "/edge.crt",
            tls,
            headers,
            request.csr_der,
        )
        .await?,
    )
    .await?;
    if status != 200 {
        bail!(
            "{cert_server}/edge.crt refused the certificate request ({status}): {}",
            String::from_utf8_lossy(&body)
        );
    }
    Ok(Credentials {
        ca_pem,
        cert_pem: pki::certificate_pem(&body),
        key_pem: request.key_pem,
    })
}

/// Writes the credentials to `dir`, each file replaced whole (a crash leaves the old or the new
/// one). A crash between the key and the certificate leaves a pair that does not match: the
/// next start finds that and joins again with the token.
fn keep(dir: &Path, creds: &Credentials) -> Result<()> {
    rt::fs::private_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    pki::write_private(&dir.join("ca.crt"), &creds.ca_pem)?;
    pki::write_private(&dir.join("edge.key"), &creds.key_pem)?;
    pki::write_private(&dir.join("edge.crt"), &creds.cert_pem)?;
    Ok(())
}

/// Renews `current` with itself (no token) and keeps the new credentials in `dir`.
pub(crate) async fn renew(
    dir: &Path,
    cert_server: &str,
    node: &str,
    current: &Credentials,
) -> Result<Credentials> {
    let tls = current.client_config()?;
    let creds = request_certificate(
        cert_server,
        node,
        tls,
        &[("NodeName", node)],
        current.ca_pem.clone(),
    )
    .await?;
    keep(dir, &creds)?;
    match creds.validity() {
        Ok((_, to)) => tracing::info!(%node, not_after = to, "edgehub: node certificate renewed"),
        Err(e) => {
            tracing::warn!(%node, error = format!("{e:#}"), "edgehub: the renewed certificate cannot be read")
        }
    }
    Ok(creds)
}

/// Gives up the node's certificate kept in `dir` (`DELETE /edge.crt` with it): the cloud
/// revokes every certificate it gave the node.
pub(crate) async fn give_up(dir: &Path, cert_server: &str, node: &str) -> Result<()> {
    let kept = Credentials {
        ca_pem: std::fs::read_to_string(dir.join("ca.crt"))?,
        cert_pem: std::fs::read_to_string(dir.join("edge.crt"))?,
        key_pem: std::fs::read_to_string(dir.join("edge.key"))?,
    };
    let (status, body) = answer(
        send(
            hyper::Method::DELETE,
            cert_server,
            "/edge.crt",
            kept.client_config()?,
            &[("NodeName", node)],
            Vec::new(),
        )
        .await?,
    )
    .await?;
    if status != 200 {
        bail!(
            "{cert_server}/edge.crt answered {status}: {}",
            String::from_utf8_lossy(&body).trim()
        );
    }
    Ok(())
}

/// A TLS client that accepts any server certificate: only for fetching the CA, which the
/// token's hash then checks.
fn insecure() -> Result<Arc<rustls::ClientConfig>> {
    #[derive(Debug)]
    struct AnyServer(Arc<rustls::crypto::CryptoProvider>);
    impl rustls::client::danger::ServerCertVerifier for AnyServer {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node certificate valid for a year (from an hour ago), signed by a CA in `dir`.
    fn creds(dir: &Path) -> Credentials {
        let (ca, ca_key) = pki::load_or_make_ca(dir).expect("a CA");
        let request = pki::node::request("n").expect("a request");
        let der = pki::node::sign(&ca, &ca_key, &request.csr_der, "n", 365).expect("signed");
        Credentials {
            ca_pem: ca,
            cert_pem: pki::certificate_pem(&der),
            key_pem: request.key_pem,
        }
    }

    #[test]
    fn a_certificate_is_due_in_the_last_fifth_of_its_life_or_its_last_days() {
        // A year and an hour: a fifth is 73 days and 12 minutes, so due from about day 292.
        let dir = tempfile::tempdir().expect("dir");
        let c = creds(dir.path());
        let (from, to) = c.validity().expect("validity");
        assert_eq!(to - from, 365 * 86_400 + 3600);
        let day = |n: i64| from + n * 86_400;
        assert!(!c.renewal_due(day(0), 0));
        assert!(!c.renewal_due(day(290), 0));
        assert!(c.renewal_due(day(293), 0));
        assert!(c.renewal_due(day(400), 0), "expired is due");
        // renewBeforeDays moves it earlier, never later.
        assert!(c.renewal_due(day(200), 200));
        assert!(!c.renewal_due(day(100), 200));
        assert!(c.renewal_due(day(0), 400));
        // Garbage is due (and then replaced).
        let mut bad = c.clone();
        bad.cert_pem = "not a certificate".into();
        assert!(bad.renewal_due(day(0), 0));
        assert_eq!(c.ca_hash().map(|h| h.len()), Some(64));
    }
}
