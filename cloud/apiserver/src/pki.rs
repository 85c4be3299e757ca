//! The embedded API's certificates and credentials, made on first start and kept in the data
//! directory: a CA, the serving certificate, an admin client certificate, a bearer token, and the
//! admin kubeconfig that ties them together (as k3s writes one).

use anyhow::{Context, Result};
use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::path::{Path, PathBuf};
use time::{Duration, OffsetDateTime};

/// The credentials the server needs at run time.
pub struct Pki {
    pub ca_pem: String,
    pub ca_key_pem: String,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    /// `token -> user` pairs accepted as bearer tokens.
    pub tokens: Vec<(String, String)>,
    pub kubeconfig: PathBuf,
    pub dir: PathBuf,
}

fn write_private(path: &Path, text: &str) -> Result<()> {
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
        let mut f = opts
            .open(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

fn read(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

fn validity(params: &mut CertificateParams, days: i64) {
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
    let key_pair = KeyPair::generate().context("cannot generate the CA key")?;
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
    let cert = params.self_signed(&key_pair)?;
    write_private(&key, &key_pair.serialize_pem())?;
    write_private(&crt, &cert.pem())?;
    Ok((cert.pem(), key_pair.serialize_pem()))
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
    let ca_key = KeyPair::from_pem(ca_key_pem).context("the CA key does not parse")?;
    let issuer =
        Issuer::from_ca_cert_pem(ca_pem, ca_key).context("the CA certificate does not parse")?;
    let key_pair = KeyPair::generate()?;
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
            Err(_) => SanType::DnsName(s.clone().try_into()?),
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
    let cert = params.signed_by(&key_pair, &issuer)?;
    Ok((cert.pem(), key_pair.serialize_pem()))
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
        && days_left(&c).is_some_and(|d| d > 30)
    {
        return Ok((c, k));
    }
    let (c, k) = sign_leaf(ca_pem, ca_key_pem, "cloudcore", None, sans, true, 365)?;
    write_private(&key, &k)?;
    write_private(&crt, &c)?;
    write_private(&names, &want)?;
    Ok((c, k))
}

/// Days until a PEM certificate expires.
fn days_left(pem: &str) -> Option<i64> {
    let der = pem::parse(pem).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.contents()).ok()?;
    let left = cert.validity().not_after.timestamp() - OffsetDateTime::now_utc().unix_timestamp();
    Some(left / 86_400)
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
pub fn prepare(data_dir: &Path, sans: &[String], server_url: &str) -> Result<Pki> {
    let dir = data_dir.join("pki");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (ca_pem, ca_key_pem) = load_or_make_ca(&dir)?;
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
    Ok(Pki {
        ca_pem,
        ca_key_pem,
        serving_cert_pem,
        serving_key_pem,
        tokens,
        kubeconfig,
        dir,
    })
}

/// `token,user,uid,"groups"` lines (kube-apiserver's `--token-auth-file` format).
pub fn parse_tokens(text: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split(',');
        let token = parts.next().unwrap_or_default().trim();
        let user = parts.next().unwrap_or_default().trim();
        if token.is_empty() || user.is_empty() {
            anyhow::bail!("line {}: expected token,user[,uid,\"groups\"]", i + 1);
        }
        out.push((token.to_string(), user.to_string()));
    }
    Ok(out)
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

/// Signs an edge node's certificate request (DER), as KubeEdge's cloudhub does: the subject is
/// `CN=system:node:{node}, O=system:nodes` whatever the request asked, client auth only, valid
/// `days`. The request must name that node and carry a valid signature. Returns the DER.
pub fn sign_node_csr(
    ca_pem: &str,
    ca_key_pem: &str,
    csr_der: &[u8],
    node: &str,
    days: i64,
) -> Result<Vec<u8>> {
    let want = format!("system:node:{node}");
    use x509_parser::prelude::FromDer;
    let (_, req) = x509_parser::certification_request::X509CertificationRequest::from_der(csr_der)
        .map_err(|e| anyhow::anyhow!("the body is not a DER certificate request: {e}"))?;
    req.verify_signature()
        .map_err(|e| anyhow::anyhow!("the certificate request's signature is wrong: {e}"))?;
    let cn = req
        .certification_request_info
        .subject
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok())
        .unwrap_or_default()
        .to_string();
    anyhow::ensure!(
        cn == want,
        "the certificate request is for {cn:?}, not {want:?} (the NodeName header)"
    );
    let csr = rcgen::CertificateSigningRequestParams::from_der(&csr_der.to_vec().into())
        .context("the certificate request does not parse")?;
    let ca_key = KeyPair::from_pem(ca_key_pem).context("the CA key does not parse")?;
    let issuer =
        Issuer::from_ca_cert_pem(ca_pem, ca_key).context("the CA certificate does not parse")?;
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, want);
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    validity(&mut params, days);
    let cert = params.signed_by(&csr.public_key, &issuer)?;
    Ok(cert.der().to_vec())
}

/// The DER of the first certificate of a PEM text.
pub fn pem_to_der(pem_text: &str) -> Result<Vec<u8>> {
    Ok(pem::parse(pem_text)
        .context("not a PEM certificate")?
        .contents()
        .to_vec())
}
