//! What kube-apiserver does with `kubectl logs/exec/attach/port-forward` of a pod, for testing
//! cloudcore's kubelet endpoints (`modules.cloudStream`) on a machine without a kube-apiserver:
//! a plain-HTTP front for kubectl that sends `/api/v1/namespaces/{ns}/pods/{pod}/{log, exec,
//! attach, portforward}` to the node's kubelet paths (`/containerLogs/{ns}/{pod}/{container}`,
//! `/exec/...` with `input`/`output`/`error` for `stdin`/`stdout`/`stderr`, `/portForward/...`)
//! over TLS with its kubelet client certificate, the client's upgrade (SPDY) passed through as
//! kube-apiserver's upgrade-aware proxy passes it; every other request goes to the embedded API
//! with a token the front is given (kubectl sends none over plain HTTP: the front stands for
//! the API server, which would have authenticated the user itself). kube-apiserver 1.30+ also turns a websocket client's
//! exec into SPDY towards the kubelet: the tests run kubectl with SPDY, which is what reaches
//! the kubelet either way.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A running front; it stops when dropped.
pub struct Front {
    pub port: u16,
    _runtime: tokio::runtime::Runtime,
}

/// Where requests go.
#[derive(Clone)]
struct Upstreams {
    api: u16,
    kubelet: u16,
    /// Trusting the CA of both (cloudcore's).
    api_tls: Arc<rustls::ClientConfig>,
    /// With the kubelet client certificate.
    kubelet_tls: Arc<rustls::ClientConfig>,
    /// The embedded API's bearer token, for what goes there.
    token: String,
}

impl Front {
    /// A front for the embedded API on `api` and the kubelet endpoints on `kubelet` (both
    /// served with certificates of `ca_pem`), presenting `client` (certificate, key) to the
    /// kubelet endpoints and `token` to the API.
    pub fn start(api: u16, kubelet: u16, ca_pem: &str, client: (&str, &str), token: &str) -> Self {
        let upstreams = Upstreams {
            api,
            kubelet,
            token: token.to_string(),
            api_tls: pki::tls::client_config(ca_pem, None).expect("a TLS client"),
            kubelet_tls: pki::tls::client_config(ca_pem, Some(client))
                .expect("a TLS client with the kubelet client certificate"),
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("listen");
        let port = listener.local_addr().expect("address").port();
        runtime.spawn(async move {
            while let Ok((c, _)) = listener.accept().await {
                let u = upstreams.clone();
                tokio::spawn(async move {
                    if let Err(e) = connection(c, &u).await {
                        tracing::debug!(error = %e, "kubelet_calls: connection ended");
                    }
                });
            }
        });
        Self {
            port,
            _runtime: runtime,
        }
    }

    /// A kubeconfig for kubectl to reach this front, written in `dir` as `name`.
    pub fn kubeconfig(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"http://127.0.0.1:{}\"}}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
                self.port
            ),
        )
        .expect("write the kubeconfig");
        path
    }
}

/// The kubelet's path and query for an API path and query, if it is a pod's stream.
pub fn kubelet_target(path: &str, query: &str) -> Option<String> {
    let parts: Vec<&str> = path.split('/').collect();
    let ["", "api", "v1", "namespaces", ns, "pods", pod, sub] = parts.as_slice() else {
        return None;
    };
    let mut container = None;
    let mut pairs = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = match v {
            "true" => "1",
            "false" => "0",
            v => v,
        };
        match (*sub, k) {
            (_, "container") => container = Some(v.to_string()),
            ("exec" | "attach", "stdin") => pairs.push(format!("input={v}")),
            ("exec" | "attach", "stdout") => pairs.push(format!("output={v}")),
            ("exec" | "attach", "stderr") => pairs.push(format!("error={v}")),
            _ => pairs.push(format!("{k}={v}")),
        }
    }
    let query = pairs.join("&");
    match *sub {
        "log" => Some(format!("/containerLogs/{ns}/{pod}/{}?{query}", container?)),
        "exec" | "attach" => Some(format!("/{sub}/{ns}/{pod}/{}?{query}", container?)),
        "portforward" => Some(format!("/portForward/{ns}/{pod}")),
        _ => None,
    }
}

async fn connection(mut client: TcpStream, u: &Upstreams) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let end = loop {
        let mut chunk = [0u8; 4096];
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if buf.len() > 64 * 1024 {
            return Ok(());
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let (method, target) = (
        first.next().unwrap_or_default(),
        first.next().unwrap_or_default(),
    );
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let headers: Vec<(&str, &str)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect();
    let upgrade = headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("upgrade"));
    let (port, tls, target, kubelet) = match kubelet_target(path, query) {
        Some(t) => (u.kubelet, u.kubelet_tls.clone(), t, true),
        None => (u.api, u.api_tls.clone(), target.to_string(), false),
    };
    let mut out = format!("{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n");
    for (k, v) in &headers {
        let skip = k.eq_ignore_ascii_case("host")
            || (!upgrade && k.eq_ignore_ascii_case("connection"))
            || k.eq_ignore_ascii_case("authorization");
        if !skip {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    // The kubelet is given the API server's certificate; the API, the API server's token.
    if !kubelet {
        out.push_str(&format!("Authorization: Bearer {}\r\n", u.token));
    }
    if !upgrade {
        // One request per connection: the next one is read (and routed) afresh.
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")
        .map_err(std::io::Error::other)?
        .to_owned();
    let mut upstream = match tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
    {
        Ok(s) => s,
        Err(e) => {
            // What kube-apiserver answers when it cannot reach a kubelet.
            let body = format!(
                "{{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"status\":\"Failure\",\"message\":\"error dialing backend: {e}\",\"code\":500}}"
            );
            let _ = client
                .write_all(
                    format!(
                        "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )
                .await;
            return Ok(());
        }
    };
    upstream.write_all(out.as_bytes()).await?;
    upstream.write_all(&buf[end..]).await?;
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_streams_go_to_the_kubelets_paths_and_nothing_else_does() {
        assert_eq!(
            kubelet_target(
                "/api/v1/namespaces/default/pods/web/exec",
                "command=sh&command=-c&container=main&stdin=true&stdout=true&stderr=false&tty=false"
            )
            .as_deref(),
            Some("/exec/default/web/main?command=sh&command=-c&input=1&output=1&error=0&tty=0")
        );
        assert_eq!(
            kubelet_target(
                "/api/v1/namespaces/ns/pods/web/log",
                "container=main&follow=true"
            )
            .as_deref(),
            Some("/containerLogs/ns/web/main?follow=1")
        );
        assert_eq!(
            kubelet_target("/api/v1/namespaces/ns/pods/web/portforward", "").as_deref(),
            Some("/portForward/ns/web")
        );
        assert_eq!(kubelet_target("/api/v1/namespaces/ns/pods/web", ""), None);
        assert_eq!(
            kubelet_target("/api/v1/namespaces/ns/pods/web/exec", "command=ls"),
            None
        );
    }
}
