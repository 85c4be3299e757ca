//! Both halves of a node's join, as KubeEdge's edgehub and cloudhub do them: the node makes a
//! P-256 key and a DER certificate request ([`request`], `CN=system:node:{node}`,
//! `O=system:nodes`) and checks the CA it fetched against its token ([`ca_hash`]); cloudhub
//! signs the request ([`sign`]) into a client certificate in that node's name only.

use crate::{PkiError, Result, crypto, validity};
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose};

/// A node's new key and its certificate request.
pub struct Request {
    /// The request, DER, as `/edge.crt` takes it.
    pub csr_der: Vec<u8>,
    /// The key, PEM: kept beside the certificate that comes back.
    pub key_pem: String,
}

/// The subject a node's certificate carries.
fn subject(params: &mut CertificateParams, node: &str) {
    params
        .distinguished_name
        .push(DnType::CommonName, format!("system:node:{node}"));
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
}

/// A new key and a certificate request for `node`.
pub fn request(node: &str) -> Result<Request> {
    let key = KeyPair::generate().map_err(crypto("cannot generate a key"))?;
    let mut params = CertificateParams::default();
    subject(&mut params, node);
    let csr = params
        .serialize_request(&key)
        .map_err(crypto("cannot make a certificate request"))?;
    Ok(Request {
        csr_der: csr.der().to_vec(),
        key_pem: key.serialize_pem(),
    })
}

/// KubeEdge's CA hash, a join token's first part: SHA-256 of the CA's DER, lower-case hex.
pub fn ca_hash(ca_der: &[u8]) -> String {
    crate::hex(ring::digest::digest(&ring::digest::SHA256, ca_der).as_ref())
}

/// Signs a node's certificate request (DER), as KubeEdge's cloudhub does: the subject is
/// `CN=system:node:{node}, O=system:nodes` whatever the request asked, client auth only, valid
/// `days`. The request must name that node and carry a valid signature. Returns the DER.
pub fn sign(
    ca_pem: &str,
    ca_key_pem: &str,
    csr_der: &[u8],
    node: &str,
    days: i64,
) -> Result<Vec<u8>> {
    let want = format!("system:node:{node}");
    use x509_parser::prelude::FromDer;
    let (_, req) = x509_parser::certification_request::X509CertificationRequest::from_der(csr_der)
        .map_err(|e| PkiError::NotACertificateRequest(e.to_string()))?;
    req.verify_signature()
        .map_err(|e| PkiError::BadSignature(e.to_string()))?;
    let cn = req
        .certification_request_info
        .subject
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok())
        .unwrap_or_default()
        .to_string();
    if cn != want {
        return Err(PkiError::WrongNode { asked: cn, want });
    }
    let csr = rcgen::CertificateSigningRequestParams::from_der(&csr_der.to_vec().into())
        .map_err(crypto("the certificate request does not parse"))?;
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(crypto("the CA key does not parse"))?;
    let issuer = Issuer::from_ca_cert_pem(ca_pem, ca_key)
        .map_err(crypto("the CA certificate does not parse"))?;
    let mut params = CertificateParams::default();
    subject(&mut params, node);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    validity(&mut params, days);
    let cert = params
        .signed_by(&csr.public_key, &issuer)
        .map_err(crypto("cannot sign the node certificate"))?;
    Ok(cert.der().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{certificate_pem, load_or_make_ca, subject as names, tls, validity_of};

    /// A CA in a directory of its own: the directory, the certificate and the key.
    fn ca() -> (tempfile::TempDir, String, String) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ca, key) = load_or_make_ca(dir.path()).expect("ca");
        (dir, ca, key)
    }

    #[test]
    fn a_request_signed_by_the_ca_is_a_client_certificate_the_node_can_present() {
        let (_dir, ca, ca_key) = ca();
        let req = request("edge-1").expect("a request");
        let der = sign(&ca, &ca_key, &req.csr_der, "edge-1", 30).expect("signed");
        assert_eq!(
            names(&der),
            Some(("system:node:edge-1".into(), vec!["system:nodes".into()]))
        );
        let cert_pem = certificate_pem(&der);
        let (from, to) = validity_of(&cert_pem).expect("validity");
        assert_eq!(to - from, 30 * 86_400 + 3600, "30 days, from an hour ago");
        tls::client_config(&ca, Some((&cert_pem, &req.key_pem)))
            .expect("the key and the certificate make a TLS client");
        assert_eq!(ca_hash(&crate::pem_to_der(&ca).expect("DER")).len(), 64);
    }

    #[test]
    fn a_request_is_signed_in_its_own_node_s_name_only() {
        let (_dir, ca, key) = ca();
        let other = request("edge-2").expect("a request");
        let e = sign(&ca, &key, &other.csr_der, "edge-1", 365).expect_err("another node's name");
        assert!(matches!(e, PkiError::WrongNode { .. }), "{e}");
        let e = sign(&ca, &key, b"garbage", "edge-1", 365).expect_err("garbage");
        assert!(matches!(e, PkiError::NotACertificateRequest(_)), "{e}");
        let mut tampered = request("edge-1").expect("a request").csr_der;
        let last = tampered.len() - 1;
        tampered[last] ^= 0xff;
        assert!(
            sign(&ca, &key, &tampered, "edge-1", 365).is_err(),
            "a broken signature"
        );
    }
}
