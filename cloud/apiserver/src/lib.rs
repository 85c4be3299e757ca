//! The embedded Kubernetes-compatible API of `cloudcore`: what `kubectl` and kube-rs need to
//! declare devices with no cluster, served over HTTPS from one SQLite file.
//!
//! Its surface is small: [`start`] (or [`serve`] on a listener of the caller's) with a
//! [`Config`], the [`Running`] server and the client [`Identity`] each request carries. Inside, all private:
//! - `store`: objects in memory and SQLite, one resourceVersion, batched durable writes, watch
//!   history; or the same view over etcd (`store::etcd`, with its own small v3 client), which
//!   several servers share (cloudcore's replicas).
//! - `api`: the REST verbs (`read`, `watch`, `write`, the body codecs of `encode` and the
//!   built-in kinds' rules of `builtin`); `discovery`: discovery and OpenAPI; `table`:
//!   `kubectl get`'s tables; `schema`: CRD schemas; `patch` and `managed`: patches and
//!   server-side apply.
//! - `credentials`: the serving and admin certificates, tokens and admin kubeconfig, signed by
//!   the CA of the shared `pki` crate, and the fleet's (`Fleet`: replicas on etcd share the
//!   first one's); `controllers`: namespace deletion, CRD cleanup and garbage collection.
//! - `authn`: who a request comes from (client certificates, revoked ones refused, bearer
//!   tokens, impersonation); `authz`: what it may do, as kube-apiserver decides.
//!   `admission`: what the object as stored may hold (NodeRestriction, RBAC escalation,
//!   desired values, a job's Secret); `podsecurity`: Pod Security levels by namespace label.
//! - `routes`: health checks, then every request authenticated; `serve`: the TLS listener,
//!   bounding handshakes per address (`per_address`); `install`: namespaces and objects made
//!   at start.

#![warn(unreachable_pub)]

mod admission;
mod api;
mod authn;
mod authz;
mod controllers;
mod credentials;
mod discovery;
pub mod external;
mod install;
mod managed;
mod meta;
mod patch;
mod per_address;
mod podsecurity;
mod proto;
mod resources;
mod routes;
mod schema;
mod selector;
mod serve;
mod status;
mod store;
mod table;

use anyhow::{Context, Result};
use api::Api;
use axum::Router;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_util::sync::CancellationToken;

/// The Kubernetes version the API reports (`/version`) and follows.
pub const KUBE_VERSION: &str = "v1.33.0";

pub use admission::refused_device;
pub use authn::{ClientCertificate, Identity, Peer, User};
pub use external::{External, ExternalRequest};
pub use per_address::{PerAddress, Turn};
pub use serve::serve;
pub use store::{EtcdOptions, EtcdTls};

/// Settings of the embedded API.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    /// Extra names and addresses for the serving certificate.
    pub sans: Vec<String>,
    /// Events kept for watches to resume from.
    pub history: usize,
    /// Largest request body accepted (413 beyond).
    pub max_body: usize,
    pub bookmark_every: Duration,
    /// fsync at every commit.
    pub fsync: bool,
    /// Objects created at start when absent, or updated when their spec differs (the project's
    /// CRDs).
    pub install: Vec<Value>,
    /// etcd instead of the SQLite file in `data_dir` (several servers can share it).
    pub etcd: Option<store::EtcdOptions>,
    /// Whether this server runs the controllers that must run once (namespace and CRD
    /// cleanup, garbage collection): always when `None`; when given, while it says `true`
    /// (cloudcore's replicas elect one with a Lease).
    pub leader: Option<tokio::sync::watch::Receiver<bool>>,
    /// Which client certificates were revoked (cloudcore's node certificates), if anyone
    /// revokes them: a revoked one authenticates nobody.
    pub revoked: Option<RevocationCheck>,
    /// Pages served beside the API without authentication (cloudcore's fleet page at `/ui`):
    /// they hold no data of their own and read the API with the user's token.
    pub pages: Option<Router>,
    /// Subresources the embedding program serves (cloudcore's `devices/history`, a device's
    /// history read from its gateway; `pods/log` and `pods/exec` through the node's tunnel).
    pub subresources: Vec<Subresource>,
    /// Read-only kinds the embedding program serves (cloudcore's `metrics.k8s.io`
    /// `NodeMetrics` and `PodMetrics`, for `kubectl top`).
    pub externals: Vec<External>,
}

/// A subresource served by the embedding program: `.../{plural}/{name}/{name of this}`,
/// authorized as `verb` on `{plural}/{name of this}` like any other request (RBAC rules name
/// it so), answered by `serve` with the stored object and the request. A method not in
/// `methods` is refused (405).
#[derive(Clone)]
pub struct Subresource {
    pub group: String,
    pub plural: String,
    pub name: String,
    /// The verb it is authorized as: `get` for what reads (`devices/history`, `pods/log`),
    /// `create` for what acts (`pods/exec`, whatever the method, as kube-apiserver does for a
    /// websocket's GET).
    pub verb: &'static str,
    pub methods: &'static [axum::http::Method],
    pub serve: ServeSubresource,
}

/// The request a [`Subresource`] answers, as it came.
pub struct SubresourceRequest {
    /// Who asks (the authenticated user's name): streams are shared per user.
    pub user: String,
    pub method: axum::http::Method,
    /// The query, one value per key (the last).
    pub query: std::collections::HashMap<String, String>,
    /// The query as sent (for keys given more than once: `command` of `pods/exec`).
    pub raw_query: String,
    pub headers: axum::http::HeaderMap,
    /// The connection's upgrade (a websocket), when the client asked for one.
    pub upgrade: Option<hyper::upgrade::OnUpgrade>,
}

/// What answers a [`Subresource`]: the stored object and the request in, the answer out.
pub type ServeSubresource = Arc<
    dyn Fn(
            serde_json::Value,
            SubresourceRequest,
        ) -> futures_util::future::BoxFuture<'static, axum::response::Response>
        + Send
        + Sync,
>;

impl std::fmt::Debug for Subresource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Subresource({}/{}/{})",
            self.group, self.plural, self.name
        )
    }
}

/// Whether the client certificate with a serial number (hex) was revoked; and, when given, a
/// count that goes up when revocations may have changed: a watch open with a node's
/// certificate ends as soon as that certificate is revoked.
#[derive(Clone)]
pub struct RevocationCheck(
    pub Arc<dyn Fn(&str) -> bool + Send + Sync>,
    pub Option<tokio::sync::watch::Receiver<u64>>,
);

impl std::fmt::Debug for RevocationCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RevocationCheck")
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("cloudcore-data"),
            listen: SocketAddr::from(([127, 0, 0, 1], 6443)),
            sans: Vec::new(),
            history: 10_000,
            max_body: 3 * 1024 * 1024,
            bookmark_every: Duration::from_secs(60),
            fsync: false,
            install: Vec::new(),
            etcd: None,
            leader: None,
            revoked: None,
            pages: None,
            subresources: Vec::new(),
            externals: Vec::new(),
        }
    }
}

/// A running API server.
pub struct Running {
    pub addr: SocketAddr,
    pub kubeconfig: PathBuf,
    pub url: String,
    pub ca_pem: String,
    pub api: Arc<Api>,
    /// The routes, as the listener serves them.
    app: axum::Router,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops accepting, ends watches and waits for open requests (at most `grace`).
    pub async fn shutdown(self, grace: Duration) {
        self.stop.cancel();
        if tokio::time::timeout(grace, self.task).await.is_err() {
            tracing::warn!("API connections did not close within {grace:?}");
        }
    }

    /// The API in this process, as `user`: what the listener serves, without TLS, a socket or
    /// HTTP framing (cloudcore's own controllers, which would otherwise send every write
    /// through its own TLS listener). The same authorization, admission and limits apply.
    pub fn local(&self, user: User) -> axum::Router {
        self.app
            .clone()
            .layer(axum::Extension(Identity(Some(user))))
            .layer(axum::Extension(Peer(std::net::SocketAddr::from((
                [127, 0, 0, 1],
                0,
            )))))
    }

    pub fn stopped(&self) -> CancellationToken {
        self.stop.clone()
    }
}

/// Starts the API: credentials, store, default namespaces, installed objects, then the
/// listener.
pub async fn start(config: Config) -> Result<Running> {
    // Private: the database holds every Secret, the directory the keys and tokens.
    rt::fs::private_dir(&config.data_dir).with_context(|| {
        format!(
            "cannot make the data directory {} private",
            config.data_dir.display()
        )
    })?;
    let database = config.data_dir.join("api.db");
    if config.etcd.is_none() {
        rt::fs::private_database(&database)
            .with_context(|| format!("cannot make {} private", database.display()))?;
    }
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr()?;
    let host = if addr.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else if addr.is_ipv6() {
        format!("[{}]", addr.ip())
    } else {
        addr.ip().to_string()
    };
    let url = format!("https://{host}:{}", addr.port());
    let store = store::Store::open(
        &database,
        store::StoreOptions {
            history: config.history,
            fsync: config.fsync,
            etcd: config.etcd.clone(),
        },
    )
    .await?;
    // Replicas on etcd share one CA and the tokens: the first one's, kept in etcd.
    let fleet = credentials::Fleet::join(&store, &config.data_dir).await?;
    let mut pki = credentials::prepare(&config.data_dir, &config.sans, &url)?;
    if fleet.settle(&store, &config.data_dir).await? {
        pki = credentials::prepare(&config.data_dir, &config.sans, &url)?;
    }
    let stop = CancellationToken::new();
    let mut api = Api::new(
        store,
        config.max_body,
        format!("{host}:{}", addr.port()),
        config.bookmark_every,
        stop.clone(),
    );
    api.subresources = config.subresources.clone();
    if !config.externals.is_empty() {
        api.externals = config.externals.clone();
        api.refresh_registry();
    }
    let api = Arc::new(api);
    install::bootstrap(&api, &config.install).await?;
    let tls = tls_config(&pki)?;
    tokio::spawn(controllers::run(api.clone(), config.leader.clone()));
    let mut app = routes::router(api.clone(), pki.tokens.clone(), config.revoked.clone());
    if let Some(pages) = config.pages.clone() {
        app = app.merge(pages);
    }
    let task = tokio::spawn(serve(
        listener,
        TlsAcceptor::from(tls),
        app.clone(),
        stop.clone(),
    ));
    tracing::info!(%url, kubeconfig = %pki.kubeconfig.display(), "embedded API serving");
    Ok(Running {
        addr,
        kubeconfig: pki.kubeconfig,
        url,
        ca_pem: pki.ca_pem,
        api,
        app,
        stop,
        task,
    })
}

fn tls_config(pki: &credentials::Credentials) -> Result<Arc<rustls::ServerConfig>> {
    Ok(::pki::tls::server_config(
        &pki.serving_cert_pem,
        &pki.serving_key_pem,
        Some((&pki.ca_pem, ::pki::tls::ClientCerts::Optional)),
        // HTTP/2 first, as kube-apiserver offers it.
        &[b"h2", b"http/1.1"],
    )?)
}
