//! The project's one X.509 and TLS stack, shared by the cloud and the edge: a CA kept in a
//! directory, leaf certificates signed by it, the PEM/DER and X.509 helpers around them;
//! [`node`]: both halves of a node's join (the edge's key and certificate request, cloudhub's
//! signature); [`tls`]: the rustls configurations of every listener and client. Used by the
//! embedded API (its serving and admin certificates), cloudhub (node certificates), edgehub
//! (joining, renewing, its session's client) and the edge's MQTT broker (client certificates
//! as users).

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::path::{Path, PathBuf};
use time::{Duration, OffsetDateTime};

pub mod node;
pub mod tls;

/// Why a certificate or key could not be read, made or signed.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Crypto {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("the body is not a DER certificate request: {0}")]
    NotACertificateRequest(String),
    #[error("the certificate request's signature is wrong: {0}")]
    BadSignature(String),
    #[error("the certificate request is for {asked:?}, not {want:?} (the NodeName header)")]
    WrongNode { asked: String, want: String },
    #[error("not an X.509 certificate: {0}")]
    NotACertificate(String),
    #[error("not a PEM certificate: {0}")]
    NotPem(#[from] pem::PemError),
}

pub type Result<T, E = PkiError> = std::result::Result<T, E>;

pub(crate) fn crypto(what: &'static str) -> impl FnOnce(rcgen::Error) -> PkiError {
    move |source| PkiError::Crypto { what, source }
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PkiError {
    let path = path.to_path_buf();
    move |source| PkiError::Io {
        action,
        path,
        source,
    }
}

/// Writes `text` to `path` readable by its owner only (0600), through a temporary file renamed
/// over it, synced.
pub fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp).map_err(io("write", &tmp))?;
        f.write_all(text.as_bytes()).map_err(io("write", &tmp))?;
        f.sync_all().map_err(io("write", &tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(io("write", path))
}

/// The text of `path`, or `None` if there is no such file.
pub fn read(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io("read", path)(e)),
    }
}

pub(crate) fn validity(params: &mut CertificateParams, days: i64) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(days);
}

/// The CA of a data directory: loaded, or made and stored on first start.
pub fn load_or_make_ca(dir: &Path) -> Result<(String, String)> {
    let (crt, key) = (dir.join("ca.crt"), dir.join("ca.key"));
    if let (Some(c), Some(k)) = (read(&crt)?, read(&key)?) {
        return Ok((c, k));
    }
    let key_pair = KeyPair::generate().map_err(crypto("cannot generate the CA key"))?;
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "cloudcore-ca");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params, 3650);
    let cert = params
        .self_signed(&key_pair)
        .map_err(crypto("cannot make the CA certificate"))?;
    write_private(&key, &key_pair.serialize_pem())?;
    write_private(&crt, &cert.pem())?;
    Ok((cert.pem(), key_pair.serialize_pem()))
}

/// Takes a file a fleet of replicas shares (its CA, its tokens) into `path`: written when
/// missing (or when `replace`, for a replica whose own was made at this start), kept when it is
/// the same; `false` when this replica has another one (made for another fleet).
pub fn adopt_shared(path: &Path, shared: &str, replace: bool) -> Result<bool> {
    match read(path)? {
        Some(local) if local == shared => Ok(true),
        Some(_) if !replace => Ok(false),
        _ => write_private(path, shared).map(|()| true),
    }
}

/// Signs a new leaf certificate with the CA; returns (certificate PEM, key PEM).
pub fn sign_leaf(
    ca_pem: &str,
    ca_key_pem: &str,
    common_name: &str,
    organization: Option<&str>,
    sans: &[String],
    server: bool,
    days: i64,
) -> Result<(String, String)> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(crypto("the CA key does not parse"))?;
    let issuer = Issuer::from_ca_cert_pem(ca_pem, ca_key)
        .map_err(crypto("the CA certificate does not parse"))?;
    let key_pair = KeyPair::generate().map_err(crypto("cannot generate a key"))?;
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    if let Some(o) = organization {
        params.distinguished_name.push(DnType::OrganizationName, o);
    }
    for s in sans {
        let san = match s.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                s.clone()
                    .try_into()
                    .map_err(crypto("a subject alternative name is not a DNS name"))?,
            ),
        };
        params.subject_alt_names.push(san);
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![if server {
        ExtendedKeyUsagePurpose::ServerAuth
    } else {
        ExtendedKeyUsagePurpose::ClientAuth
    }];
    validity(&mut params, days);
    let cert = params
        .signed_by(&key_pair, &issuer)
        .map_err(crypto("cannot sign the certificate"))?;
    Ok((cert.pem(), key_pair.serialize_pem()))
}

/// Days until a PEM certificate expires.
pub fn days_left(pem: &str) -> Option<i64> {
    let der = pem::parse(pem).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.contents()).ok()?;
    let left = cert.validity().not_after.timestamp() - OffsetDateTime::now_utc().unix_timestamp();
    Some(left / 86_400)
}

/// The user a client certificate names, as kube-apiserver reads it: the common name, and the
/// organizations as groups.
pub fn subject(der: &[u8]) -> Option<(String, Vec<String>)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())?
        .to_string();
    let groups = cert
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .map(str::to_string)
        .collect();
    Some((cn, groups))
}

/// The serial number (hex) and the end of validity (Unix seconds) of a DER certificate.
pub fn serial_and_expiry(der: &[u8]) -> Option<(String, i64)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some((
        hex(cert.raw_serial()),
        cert.validity().not_after.timestamp(),
    ))
}

/// Bytes as lower-case hex (serials, digests).
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A SHA-256 digest taken piece by piece (a release as it downloads).
pub struct Sha256(ring::digest::Context);

impl Default for Sha256 {
    fn default() -> Self {
        Self::new()
    }
}

impl Sha256 {
    pub fn new() -> Self {
        Self(ring::digest::Context::new(&ring::digest::SHA256))
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The digest as lower-case hex.
    pub fn hex(self) -> String {
        hex(self.0.finish().as_ref())
    }
}

/// The SHA-256 of a file's bytes as lower-case hex, read 64 KiB at a time.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut digest = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        digest.update(&buf[..n]);
    }
    Ok(digest.hex())
}

/// The common name of a DER certificate.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_string)
}

/// A DER certificate as PEM.
pub fn certificate_pem(der: &[u8]) -> String {
    pem::encode(&pem::Pem::new("CERTIFICATE", der.to_vec()))
}

/// The validity of a PEM certificate: not before, not after (Unix seconds).
pub fn validity_of(pem_text: &str) -> Result<(i64, i64)> {
    let der = pem_to_der(pem_text)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| PkiError::NotACertificate(e.to_string()))?;
    let v = cert.validity();
    Ok((v.not_before.timestamp(), v.not_after.timestamp()))
}

/// The DER of the first certificate of a PEM text.
pub fn pem_to_der(pem_text: &str) -> Result<Vec<u8>> {
    Ok(pem::parse(pem_text)?.contents().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_digest_is_the_known_sha256_of_its_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("abc");
        std::fs::write(&f, "abc").expect("write");
        // FIPS 180-2's example for "abc".
        assert_eq!(
            sha256_file(&f).expect("digest"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        // Piece by piece, across the 64 KiB reads.
        let big = vec![7u8; (1 << 16) + 3];
        std::fs::write(&f, &big).expect("write");
        let mut d = Sha256::new();
        d.update(&big[..10]);
        d.update(&big[10..]);
        assert_eq!(sha256_file(&f).expect("digest"), d.hex());
        assert!(sha256_file(&dir.path().join("none")).is_err());
    }

    #[test]
    fn the_ca_is_made_once_and_kept_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = load_or_make_ca(dir.path()).expect("made");
        let again = load_or_make_ca(dir.path()).expect("loaded");
        assert_eq!(first, again);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("ca.key"))
                .expect("key file")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_leaf_certificate_names_its_hosts_and_lasts_its_days() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ca, key) = load_or_make_ca(dir.path()).expect("ca");
        let sans = ["localhost".to_string(), "10.0.0.1".to_string()];
        let (cert, _) = sign_leaf(&ca, &key, "cloudhub", None, &sans, true, 365).expect("leaf");
        let left = days_left(&cert).expect("a certificate");
        assert!((364..=365).contains(&left), "{left}");
        let der = pem_to_der(&cert).expect("PEM");
        assert_eq!(common_name(&der).as_deref(), Some("cloudhub"));
        assert!(matches!(pem_to_der("not pem"), Err(PkiError::NotPem(_))));
    }
}
