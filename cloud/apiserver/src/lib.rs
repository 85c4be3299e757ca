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
//!   the CA of the shared `pki` crate; `controllers`: namespace deletion, CRD cleanup and
//!   garbage collection.

#![warn(unreachable_pub)]

mod api;
mod authz;
mod controllers;
mod credentials;
mod discovery;
mod managed;
mod meta;
mod patch;
mod proto;
mod resources;
mod schema;
mod selector;
mod status;
mod store;
mod table;

use anyhow::{Context, Result};
use api::{Api, Query, json_response};
use axum::Router;
use axum::body::Body;
use axum::extract::{Query as AxQuery, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use status::Status;
use std::collections::HashMap;
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
}

/// Whether the client certificate with a serial number (hex) was revoked.
#[derive(Clone)]
pub struct RevocationCheck(pub Arc<dyn Fn(&str) -> bool + Send + Sync>);

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

    pub fn stopped(&self) -> CancellationToken {
        self.stop.clone()
    }
}

/// Who made a request, as kube-apiserver names it: the user and its groups (a client
/// certificate's common name and organizations, or a bearer token's line in `tokens.csv`).
/// Every authenticated user is also in `system:authenticated`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    pub fn new(name: impl Into<String>, mut groups: Vec<String>) -> Self {
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        Self {
            name: name.into(),
            groups,
        }
    }

    /// The user the server's own requests run as (its bootstrap): a member of
    /// `system:masters`.
    pub(crate) fn server() -> Self {
        Self::new("system:apiserver", vec!["system:masters".into()])
    }

    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// The client certificate of a connection, if it gave one.
#[derive(Clone, Debug)]
pub struct Identity(pub Option<User>);

/// The DER of a connection's client certificate, if it gave one (for those that check it
/// further, as cloudhub's certificate port checks revocation).
#[derive(Clone, Debug)]
pub struct ClientCertificate(pub Arc<Vec<u8>>);

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
    let shared = store.shared();
    let adopted = shared && credentials::adopt_fleet(&store, &config.data_dir)?;
    if adopted {
        tracing::info!("replicas: this server uses the fleet's CA and tokens, from etcd");
    } else if shared {
        tracing::info!(
            "replicas: the first server of the fleet; its CA and tokens go into etcd for the others"
        );
    }
    // Whether this start makes the CA (nothing of this replica's was there before).
    let fresh = !config.data_dir.join("pki/ca.crt").exists();
    let mut pki = credentials::prepare(&config.data_dir, &config.sans, &url)?;
    let mut install = config.install.clone();
    if shared && !adopted {
        install.push(credentials::fleet_secret(&config.data_dir)?);
    }
    let stop = CancellationToken::new();
    let api = Arc::new(Api::new(
        store,
        config.max_body,
        format!("{host}:{}", addr.port()),
        config.bookmark_every,
        stop.clone(),
    ));
    bootstrap(&api, &install).await?;
    if shared && !adopted {
        // Replicas started at the same time on an empty etcd: one made the fleet's Secret
        // first. The others drop the CA they just made and take the fleet's.
        match credentials::adopt_fleet(&api.store, &config.data_dir) {
            Ok(true) => {}
            Ok(false) => anyhow::bail!("the fleet's Secret was not made in etcd"),
            Err(_) if fresh => {
                tracing::info!("replicas: another server made the fleet's CA first; using it");
                credentials::forget(&config.data_dir)?;
                credentials::adopt_fleet(&api.store, &config.data_dir)?;
                pki = credentials::prepare(&config.data_dir, &config.sans, &url)?;
            }
            Err(e) => return Err(e),
        }
    }
    let tls = tls_config(&pki)?;
    tokio::spawn(controllers::run(api.clone(), config.leader.clone()));
    let mut app = router(api.clone(), pki.tokens.clone(), config.revoked.clone());
    if let Some(pages) = config.pages.clone() {
        app = app.merge(pages);
    }
    let task = tokio::spawn(serve(listener, TlsAcceptor::from(tls), app, stop.clone()));
    tracing::info!(%url, kubeconfig = %pki.kubeconfig.display(), "embedded API serving");
    Ok(Running {
        addr,
        kubeconfig: pki.kubeconfig,
        url,
        ca_pem: pki.ca_pem,
        api,
        stop,
        task,
    })
}

fn tls_config(pki: &credentials::Credentials) -> Result<Arc<rustls::ServerConfig>> {
    Ok(::pki::tls::server_config(
        &pki.serving_cert_pem,
        &pki.serving_key_pem,
        Some((&pki.ca_pem, ::pki::tls::ClientCerts::Optional)),
        &[b"http/1.1"],
    )?)
}

/// The default namespaces, and `install` created or brought up to date.
async fn bootstrap(api: &Arc<Api>, install: &[Value]) -> Result<()> {
    let mut objects: Vec<Value> = [
        "default",
        "kube-system",
        "kube-public",
        "kube-node-lease",
        "kubeedge",
    ]
    .iter()
    .map(|ns| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
    .collect();
    objects.extend(authz::bootstrap_roles());
    objects.extend(install.iter().cloned());
    for obj in objects {
        let (group, version) = match obj["apiVersion"]
            .as_str()
            .unwrap_or_default()
            .rsplit_once('/')
        {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (
                String::new(),
                obj["apiVersion"].as_str().unwrap_or_default().to_string(),
            ),
        };
        let kind = obj["kind"].as_str().unwrap_or_default();
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let reg = api.registry();
        let res = reg
            .by_kind(&group, kind)
            .with_context(|| format!("cannot install {kind} {name}: kind not served"))?;
        let base = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let ns_part = match obj["metadata"]["namespace"].as_str() {
            Some(ns) if res.namespaced => format!("/namespaces/{ns}"),
            _ => String::new(),
        };
        let path = format!("{base}{ns_part}/{}", res.plural);
        let key = store::Key {
            res: res.store_key.clone(),
            ns: obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            name: name.clone(),
        };
        let existing = api.store.read().get(&key).map(|o| o.value());
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, "application/json".parse()?);
        headers.insert(header::USER_AGENT, "cloudcore".parse()?);
        let (method, path, body) = match existing {
            None => (Method::POST, path, obj.clone()),
            Some(old) if old["spec"] != obj["spec"] => {
                let mut o = obj.clone();
                o["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
                (Method::PUT, format!("{path}/{name}"), o)
            }
            Some(_) => continue,
        };
        let creating = method == Method::POST;
        let r = api
            .clone()
            .dispatch(
                &User::server(),
                method,
                &path,
                Query::new(),
                headers,
                Body::from(body.to_string()),
            )
            .await;
        // Another replica starting at the same time made or updated it first (with the same
        // objects: every replica installs the same).
        if r.status() == StatusCode::CONFLICT {
            tracing::debug!(%kind, %name, creating, "bootstrap: written by another server first");
            // What follows may need it (a namespace): wait until this server's view has it.
            for _ in 0..250 {
                if api.store.read().get(&key).is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            continue;
        }
        if !r.status().is_success() {
            use http_body_util::BodyExt;
            let code = r.status();
            let text = r
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            anyhow::bail!(
                "cannot install {kind} {name}: {code}: {}",
                String::from_utf8_lossy(&text)
            );
        }
    }
    Ok(())
}

#[derive(Clone)]
struct AppState {
    api: Arc<Api>,
    tokens: Arc<Vec<(String, User)>>,
    revoked: Option<RevocationCheck>,
}

fn router(api: Arc<Api>, tokens: Vec<(String, User)>, revoked: Option<RevocationCheck>) -> Router {
    let state = AppState {
        api,
        tokens: Arc::new(tokens),
        revoked,
    };
    Router::new()
        .route("/healthz", get(ok))
        .route("/livez", get(ok))
        .route("/readyz", get(ok))
        .fallback(authenticated)
        .with_state(state)
}

async fn ok() -> &'static str {
    "ok"
}

fn user(state: &AppState, req: &Request) -> Option<User> {
    if let Some(Identity(Some(user))) = req.extensions().get::<Identity>() {
        // Only node certificates are revoked (and checked: the check reads a file).
        let revoked = match (&state.revoked, req.extensions().get::<ClientCertificate>()) {
            (Some(check), Some(cert)) if user.in_group("system:nodes") => {
                pki::serial_and_expiry(&cert.0).is_none_or(|(serial, _)| (check.0)(&serial))
            }
            _ => false,
        };
        return (!revoked).then(|| user.clone());
    }
    let auth = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = auth.strip_prefix("Bearer ")?.trim();
    state
        .tokens
        .iter()
        .find(|(t, _)| rt::secret::same(t.as_bytes(), token.as_bytes()))
        .map(|(_, u)| u.clone())
}

/// The user a request acts as: `Impersonate-User` (with its `Impersonate-Group`s) when the
/// caller may impersonate them (`impersonate` on `users` and `groups`), as `kubectl --as`.
fn impersonated(api: &Api, user: User, headers: &HeaderMap) -> Result<User, Status> {
    let Some(target) = headers
        .get("Impersonate-User")
        .and_then(|v| v.to_str().ok())
    else {
        return Ok(user);
    };
    let groups: Vec<String> = headers
        .get_all("Impersonate-Group")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_string)
        .collect();
    let tables = api.store.read();
    let asks = |resource: &'static str, name: &str| {
        let a = authz::Attributes {
            verb: "impersonate",
            group: "",
            resource,
            sub: None,
            ns: "",
            name: Some(name),
            field_selector: None,
        };
        if authz::allowed(&tables, &user, &a) {
            Ok(())
        } else {
            Err(authz::forbidden(&user, &a))
        }
    };
    asks("users", target)?;
    for g in &groups {
        asks("groups", g)?;
    }
    Ok(User::new(target, groups))
}

async fn authenticated(
    State(state): State<AppState>,
    AxQuery(query): AxQuery<Query>,
    req: Request,
) -> Response {
    let Some(user) = user(&state, &req) else {
        return Status::unauthorized().into_response();
    };
    let user = match impersonated(&state.api, user, req.headers()) {
        Ok(u) => u,
        Err(s) => return s.into_response(),
    };
    let uri: Uri = req.uri().clone();
    let path = uri.path().to_string();
    let method = req.method().clone();
    let headers = req.headers().clone();
    let api = state.api.clone();
    if method == Method::GET {
        match path.as_str() {
            "/version" => {
                return json_response(
                    StatusCode::OK,
                    &json!({"major": "1", "minor": "33",
                    "gitVersion": format!("{KUBE_VERSION}+cloudcore-{}", env!("CARGO_PKG_VERSION")),
                    "gitCommit": "", "gitTreeState": "clean", "buildDate": "",
                    "goVersion": "", "compiler": "rustc", "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH)}),
                );
            }
            "/openapi/v3" => {
                return json_response(
                    StatusCode::OK,
                    &discovery::openapi_v3_index(&api.registry()),
                );
            }
            _ => {}
        }
        if let Some(gv) = path.strip_prefix("/openapi/v3/") {
            let reg = api.registry();
            let doc = match gv.split('/').collect::<Vec<_>>().as_slice() {
                ["api", v] => discovery::openapi_v3(&reg, "", v),
                ["apis", g, v] => discovery::openapi_v3(&reg, g, v),
                _ => None,
            };
            return match doc {
                Some(d) => json_response(StatusCode::OK, &d),
                None => Status::no_route(&path).into_response(),
            };
        }
    }
    if path == "/api" || path.starts_with("/api/") || path == "/apis" || path.starts_with("/apis/")
    {
        return api
            .dispatch(&user, method, &path, query, headers, req.into_body())
            .await;
    }
    Status::no_route(&path).into_response()
}

/// TLS handshakes in progress at once from one client address, on one listener.
const MAX_HANDSHAKES_PER_ADDRESS: usize = 64;

/// The TLS handshakes in progress, by client address.
#[derive(Clone, Default)]
struct Handshakes(Arc<std::sync::Mutex<HashMap<std::net::IpAddr, usize>>>);

/// One handshake in progress; ends when dropped.
struct Handshake {
    of: Handshakes,
    ip: std::net::IpAddr,
}

impl Handshakes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<std::net::IpAddr, usize>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn begin(&self, ip: std::net::IpAddr) -> Option<Handshake> {
        let mut m = self.lock();
        let n = m.entry(ip).or_default();
        if *n >= MAX_HANDSHAKES_PER_ADDRESS {
            return None;
        }
        *n += 1;
        Some(Handshake {
            of: self.clone(),
            ip,
        })
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        let mut m = self.of.lock();
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// Serves `app` over TLS on `listener` until `stop`; each request carries the [`Identity`]
/// of its client certificate's common name.
pub async fn serve(listener: TcpListener, tls: TlsAcceptor, app: Router, stop: CancellationToken) {
    let mut conns = tokio::task::JoinSet::new();
    // Connections still in their TLS handshake (no credential seen yet), per client address:
    // one over the bound is closed at once, so that one host's half-open connections neither
    // take every descriptor nor shut other hosts out.
    let handshakes = Handshakes::default();
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
            // Each request's headers must arrive within rt::http::HEADER_TIMEOUT.
            if let Err(e) = rt::http::serve_connection(stream, svc, stop).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
        while conns.try_join_next().is_some() {}
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}
