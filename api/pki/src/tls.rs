//! rustls configurations (ring only): the servers of the project's TLS listeners (the embedded
//! API, cloudhub and its certificate port, the edge's MQTT broker) and its clients (edgehub's
//! join and session, the benches' simulated nodes).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;

/// Whether a listener asks its clients for a certificate signed by its client CA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientCerts {
    /// Refused without one.
    Required,
    /// Verified when sent; clients without one are served too.
    Optional,
}

/// Why a TLS server configuration could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what} is not PEM: {source}")]
    Pem {
        what: &'static str,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{what} holds no certificate")]
    Empty { what: &'static str },
    #[error("the client CA: {0}")]
    Ca(String),
    #[error("the certificate and key: {0}")]
    Config(#[from] rustls::Error),
}

/// The certificates of a PEM text (`what` names it in errors); none is an error.
fn certificates(pem: &str, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|source| TlsError::Pem { what, source })?;
    if certs.is_empty() {
        return Err(TlsError::Empty { what });
    }
    Ok(certs)
}

fn private_key(pem: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|source| TlsError::Pem {
        what: "the key",
        source,
    })
}

/// A TLS 1.2/1.3 client trusting the CAs of `ca_pem` only, presenting `client` (a certificate
/// chain and its key, PEM) when given.
pub fn client_config(
    ca_pem: &str,
    client: Option<(&str, &str)>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certificates(ca_pem, "the CA")? {
        roots.add(c)?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots);
    let cfg = match client {
        None => builder.with_no_client_auth(),
        Some((cert_pem, key_pem)) => builder.with_client_auth_cert(
            certificates(cert_pem, "the client certificate")?,
            private_key(key_pem)?,
        )?,
    };
    Ok(Arc::new(cfg))
}

/// A TLS 1.2/1.3 server serving `cert_pem` (a chain) with `key_pem`. With `clients`, client
/// certificates are verified against `clients.0` (PEM, one or more CAs) as `clients.1` says;
/// without, none is asked for.
pub fn server_config(
    cert_pem: &str,
    key_pem: &str,
    clients: Option<(&str, ClientCerts)>,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = certificates(cert_pem, "the certificate")?;
    let key = private_key(key_pem)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let mut cfg = match clients {
        None => builder.with_no_client_auth().with_single_cert(certs, key)?,
        Some((ca_pem, mode)) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
                let c = c.map_err(|source| TlsError::Pem {
                    what: "the client CA",
                    source,
                })?;
                roots.add(c)?;
            }
            if roots.is_empty() {
                return Err(TlsError::Empty {
                    what: "the client CA",
                });
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            );
            let verifier = match mode {
                ClientCerts::Required => verifier.build(),
                ClientCerts::Optional => verifier.allow_unauthenticated().build(),
            }
            .map_err(|e| TlsError::Ca(e.to_string()))?;
            builder
                .with_client_cert_verifier(verifier)
                .with_single_cert(certs, key)?
        }
    };
    cfg.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_what_is_wrong() {
        let e = server_config("nothing", "nothing", None, &[]).expect_err("no certificate");
        assert!(
            e.to_string()
                .contains("the certificate holds no certificate"),
            "{e}"
        );
        let dir = tempfile::tempdir().expect("dir");
        let (ca, ca_key) = crate::load_or_make_ca(dir.path()).expect("a CA");
        let (cert, key) =
            crate::sign_leaf(&ca, &ca_key, "broker", None, &["localhost".into()], true, 1)
                .expect("a server certificate");
        assert!(server_config(&cert, &key, None, &[]).is_ok());
        let e = server_config(&cert, &key, Some(("", ClientCerts::Required)), &[])
            .expect_err("no client CA");
        assert!(
            e.to_string().contains("the client CA holds no certificate"),
            "{e}"
        );
        assert!(server_config(&cert, &key, Some((&ca, ClientCerts::Optional)), &[]).is_ok());
    }

    #[test]
    fn a_client_trusts_its_ca_and_presents_a_matching_certificate_only() {
        let dir = tempfile::tempdir().expect("dir");
        let (ca, ca_key) = crate::load_or_make_ca(dir.path()).expect("a CA");
        let (cert, key) = crate::sign_leaf(&ca, &ca_key, "app", None, &[], false, 1)
            .expect("a client certificate");
        assert!(client_config(&ca, None).is_ok());
        assert!(client_config(&ca, Some((&cert, &key))).is_ok());
        let e = client_config("", None).expect_err("no CA");
        assert!(e.to_string().contains("the CA holds no certificate"), "{e}");
        let other = tempfile::tempdir().expect("dir");
        let (_, other_key) = crate::load_or_make_ca(other.path()).expect("another CA");
        let e = client_config(&ca, Some((&cert, &other_key))).expect_err("a key of another");
        assert!(e.to_string().contains("the certificate and key"), "{e}");
    }
}
