//! The one client of the cloud's certificate port (cloudhub's HTTPS server, KubeEdge's
//! `:10002`): a join's `GET /ca.crt` and `/edge.crt`, a renewal, giving a certificate up, and
//! an upgrade's release download. Every request has a deadline to connect (10 s) and to be
//! answered (30 s); a download ends after a minute without a byte, leaving nothing behind.

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::ServerName;

const CONNECT: Duration = Duration::from_secs(10);
const ANSWER: Duration = Duration::from_secs(30);
/// The longest a download may go without a byte.
const DOWNLOAD_IDLE: Duration = Duration::from_secs(60);

/// `host:port` and the host of a `scheme://host:port[/...]` address.
pub(crate) fn host_port(url: &str) -> Result<(String, String)> {
    let rest = url
        .split_once("://")
        .map(|(_, r)| r)
        .with_context(|| format!("{url:?} has no scheme"))?;
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.rsplit_once(':') {
        Some((h, p)) if p.parse::<u16>().is_ok() => h,
        _ => bail!("{url:?} has no port"),
    };
    Ok((
        authority.to_string(),
        host.trim_matches(['[', ']']).to_string(),
    ))
}

/// The server name TLS checks: an IP address or a DNS name.
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>> {
    ServerName::try_from(host.to_string()).with_context(|| format!("{host:?} is not a host name"))
}

/// `{method} {base}{path}` over TLS with `headers` and `body`: the answer, its body unread.
pub(crate) async fn send(
    method: hyper::Method,
    base: &str,
    path: &str,
    tls: Arc<rustls::ClientConfig>,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<hyper::Response<Incoming>> {
    let (authority, host) = host_port(base)?;
    let tcp = tokio::time::timeout(CONNECT, tokio::net::TcpStream::connect(&authority))
        .await
        .with_context(|| format!("{base}: connect timed out"))?
        .with_context(|| format!("cannot connect to {base}"))?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(server_name(&host)?, tcp)
        .await
        .with_context(|| format!("TLS with {base} failed"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("Host", authority.as_str());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body)))?;
    tokio::time::timeout(ANSWER, sender.send_request(req))
        .await
        .with_context(|| format!("{base}{path}: no answer within {} s", ANSWER.as_secs()))?
        .with_context(|| format!("{base}{path}: the request failed"))
}

/// The status and whole body of an answer [`send`] got.
pub(crate) async fn answer(resp: hyper::Response<Incoming>) -> Result<(u16, Vec<u8>)> {
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes().to_vec();
    Ok((status, body))
}

/// `GET {base}{path}` with the node's certificate into `to` (private, executable); its SHA-256
/// (lowercase hex). A download cut, stalled or refused, or a full disk, leaves nothing at `to`.
pub(crate) async fn download(
    base: &str,
    path: &str,
    tls: Arc<rustls::ClientConfig>,
    to: &Path,
) -> Result<String> {
    use tokio::io::AsyncWriteExt;
    let resp = send(hyper::Method::GET, base, path, tls, &[], Vec::new()).await?;
    let status = resp.status();
    let mut body = resp.into_body();
    if !status.is_success() {
        let text = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        bail!(
            "{base}{path}: {status}: {}",
            String::from_utf8_lossy(&text).trim()
        );
    }
    let part = to.with_extension("part");
    let mut f = {
        let mut o = tokio::fs::OpenOptions::new();
        o.write(true).create(true).truncate(true).mode(0o700);
        o.open(&part)
            .await
            .with_context(|| format!("cannot write {}", part.display()))?
    };
    let written = async {
        let mut digest = pki::Sha256::new();
        loop {
            let frame = tokio::time::timeout(DOWNLOAD_IDLE, body.frame())
                .await
                .map_err(|_| {
                    anyhow::anyhow!(
                        "{base}{path}: nothing received for {} s",
                        DOWNLOAD_IDLE.as_secs()
                    )
                })?;
            let Some(frame) = frame else { break };
            let frame = frame.with_context(|| format!("{base}{path}: the download broke off"))?;
            if let Some(data) = frame.data_ref() {
                digest.update(data);
                f.write_all(data)
                    .await
                    .with_context(|| format!("cannot write {}", part.display()))?;
            }
        }
        f.sync_all()
            .await
            .with_context(|| format!("cannot write {}", part.display()))?;
        anyhow::Ok(digest)
    }
    .await;
    drop(f);
    let digest = match written {
        Ok(d) => d,
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
    };
    std::fs::rename(&part, to).with_context(|| format!("cannot write {}", to.display()))?;
    Ok(digest.hex())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_needs_a_scheme_and_a_port() {
        assert_eq!(
            host_port("https://10.0.0.1:10002").expect("v4"),
            ("10.0.0.1:10002".into(), "10.0.0.1".into())
        );
        assert_eq!(
            host_port("https://[fd00::1]:10002/x").expect("v6"),
            ("[fd00::1]:10002".into(), "fd00::1".into())
        );
        assert!(host_port("10.0.0.1:10002").is_err());
        assert!(host_port("https://cloud").is_err());
    }
}
