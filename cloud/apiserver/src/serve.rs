//! The TLS listener: connections accepted (a bounded number of handshakes per address,
//! `per_address`), each request carrying the client certificate's [`crate::Identity`].

use axum::Router;
use axum::body::Body;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::per_address::{MAX_HANDSHAKES_PER_ADDRESS, PerAddress};
use crate::{ClientCertificate, Identity, Peer, User};

/// Serves `app` over TLS on `listener` until `stop`; each request carries the [`Identity`]
/// of its client certificate's common name.
pub async fn serve(listener: TcpListener, tls: TlsAcceptor, app: Router, stop: CancellationToken) {
    let mut conns = tokio::task::JoinSet::new();
    // Connections still in their TLS handshake (no credential seen yet), per client address:
    // one over the bound is closed at once, so that one host's half-open connections neither
    // take every descriptor nor shut other hosts out.
    let handshakes = PerAddress::new(MAX_HANDSHAKES_PER_ADDRESS);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            a = listener.accept() => match a {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: wait, then go on accepting.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Some(handshake) = handshakes.begin(peer.ip()) else {
            tracing::debug!(%peer, "too many TLS handshakes at once from this address; connection closed");
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let tls = tls.clone();
        let app = app.clone();
        let stop = stop.clone();
        conns.spawn(async move {
            let accepted = tokio::time::timeout(Duration::from_secs(10), tls.accept(tcp)).await;
            drop(handshake);
            let stream = match accepted {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let der = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| Arc::new(c.to_vec()));
            let ident = der
                .as_deref()
                .and_then(|c| pki::subject(c))
                .map(|(name, groups)| User::new(name, groups));
            let ident = Identity(ident);
            let svc = hyper::service::service_fn(
                move |mut req: hyper::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(ident.clone());
                    req.extensions_mut().insert(Peer(peer));
                    if let Some(d) = &der {
                        req.extensions_mut().insert(ClientCertificate(d.clone()));
                    }
                    let app = app.clone();
                    async move {
                        use tower::ServiceExt;
                        app.oneshot(req.map(Body::new)).await
                    }
                },
            );
            // HTTP/2 when the client chose it (browsers, kubectl and kube-rs do): its requests
            // and watches share the connection. Otherwise HTTP/1.1, whose request headers must
            // arrive within rt::http::HEADER_TIMEOUT (and whose upgrades carry exec, attach
            // and port-forward).
            let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
            if let Err(e) = rt::http::serve_connection(stream, svc, stop, h2).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
        while conns.try_join_next().is_some() {}
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}
