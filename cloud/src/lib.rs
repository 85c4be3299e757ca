//! `cloudcore`: the embedded Kubernetes-compatible API (`apiserver`, or a real cluster through
//! kube-rs) and the cloud controllers, which reach it through kube-rs only. Its surface is what
//! `main` and the tests use: [`run`] on a [`config::Config`], [`cluster_client`], the join
//! tokens ([`get_token`], [`create_token`], [`JoinBook`]) and [`crds`]. Inside:
//!
//! - [`config`]: `cloudcore.yaml` (KubeEdge's layout), checked with the key path of every error;
//! - `cloudhub`: one TLS websocket per edge node in KubeEdge's format, the certificate port
//!   where nodes join by token, ObjectSync records of what each node acknowledged, each node's
//!   streaming tunnel and latest usage report;
//! - `nodeapi`: what the cloud asks of nodes on a user's behalf (a pod's log, exec, attach,
//!   port-forward, a device's history, `kubectl top`), mounted from one table by the embedded
//!   API and, for a real cluster, the kubelet's port;
//! - `edgecontroller`: pods, ConfigMaps and Secrets to their nodes, pod status back, and the
//!   Nodes (their Ready condition as sessions come and go, KubeEdge kubelets' own requests);
//! - `daemonset`: the DaemonSet controller of the embedded API;
//! - `leader`: the Lease election of replicas, for what runs once;
//! - `jobs`: `ImagePrePullJob`, `NodeUpgradeJob` and `ConfigUpdateJob` over the fleet, on the
//!   leader (`jobs::plan`: their decisions, pure);
//! - `admission`: with a real cluster, the validating webhook of Device writes;
//! - `ui`: the fleet's page, which the API serves at `/ui`.
//!
//! The device controller is the `devicecontroller` crate.
#![warn(unreachable_pub)]

mod admission;
mod cloudhub;
pub mod config;
mod daemonset;
mod edgecontroller;
mod jobs;
mod leader;
mod nodeapi;
mod ui;

/// The record of join tokens and node certificates given out and revoked.
pub use cloudhub::joins::Book as JoinBook;

use anyhow::{Context, Result};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const OBJECTSYNC_CRD: &str = include_str!("../crds/reliablesyncs_v1alpha1_objectsync.yaml");
const CLUSTER_OBJECTSYNC_CRD: &str =
    include_str!("../crds/reliablesyncs_v1alpha1_clusterobjectsync.yaml");
const IMAGEPREPULLJOB_CRD: &str = include_str!("../crds/operations_v1alpha2_imageprepulljob.yaml");
const NODEUPGRADEJOB_CRD: &str = include_str!("../crds/operations_v1alpha2_nodeupgradejob.yaml");
const CONFIGUPDATEJOB_CRD: &str = include_str!("../crds/operations_v1alpha2_configupdatejob.yaml");

/// The CRDs cloudcore installs: Device, DeviceModel, DeviceStatus, ObjectSync,
/// ClusterObjectSync, ImagePrePullJob and NodeUpgradeJob.
pub fn crds() -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for (file, yaml) in devicecontroller::crd_files()?.into_iter().chain([
        ("objectsync".to_string(), OBJECTSYNC_CRD.to_string()),
        (
            "clusterobjectsync".to_string(),
            CLUSTER_OBJECTSYNC_CRD.to_string(),
        ),
        (
            "imageprepulljob".to_string(),
            IMAGEPREPULLJOB_CRD.to_string(),
        ),
        ("nodeupgradejob".to_string(), NODEUPGRADEJOB_CRD.to_string()),
        (
            "configupdatejob".to_string(),
            CONFIGUPDATEJOB_CRD.to_string(),
        ),
    ]) {
        for doc in serde_yaml_ng::Deserializer::from_str(&yaml) {
            use serde::Deserialize;
            let v =
                Value::deserialize(doc).with_context(|| format!("CRD {file} does not parse"))?;
            if !v.is_null() {
                out.push(v);
            }
        }
    }
    Ok(out)
}

/// Runs until `cancel`.
pub async fn run(config: config::Config, cancel: CancellationToken) -> Result<()> {
    let crds = crds()?;
    // Replicas: whether this one runs the controllers that run once. Always, alone.
    let elects = config.elects_leader();
    let leader_settings = config.leader_settings();
    let (leading_tx, leading) = tokio::sync::watch::channel(!elects);
    // What the API asks gateways (a device's history, a pod's log), through the hub once it runs.
    let nodes = nodeapi::NodeApi::default();
    let (client, running) = match &config.kubeconfig {
        Some(path) => {
            let client = cluster_client(path).await?;
            install_on_cluster(&client, &crds).await?;
            if elects && config.modules.cloud_hub.enable {
                cloudhub::certs::share_on_cluster(&client, &config.data_dir).await?;
            }
            tracing::info!(kubeconfig = %path.display(), "using the cluster of the kubeconfig; the embedded API is off");
            (client, None)
        }
        None => {
            let mut api_config = config.apiserver(crds)?;
            api_config.leader = Some(leading.clone());
            api_config.subresources.extend(nodes.subresources());
            api_config.externals = nodes.metrics_api();
            // A node certificate revoked by `cloudcore node revoke` authenticates nobody here
            // either.
            let book = cloudhub::joins::Book::new(&config.data_dir);
            let changes = book.changes();
            api_config.revoked = Some(apiserver::RevocationCheck(
                Arc::new(move |serial| book.is_revoked(serial).unwrap_or(true)),
                Some(changes),
            ));
            let running = apiserver::start(api_config).await?;
            // cloudcore's own controllers reach the API in process, as the fleet's admin.
            let client = kube::Client::new(
                running.local(apiserver::User::new(
                    "system:cloudcore",
                    vec!["system:masters".into()],
                )),
                "default",
            );
            eprintln!(
                "cloudcore: API at {}; use it with: kubectl --kubeconfig {} get devices -A",
                running.url,
                running.kubeconfig.display()
            );
            (client, Some(running))
        }
    };
    let stop = CancellationToken::new();
    let (election, _alone) = if elects {
        let task = leader::start(
            client.clone(),
            leader_settings.clone(),
            leading_tx,
            stop.clone(),
        );
        (Some(task), None)
    } else {
        // Alone, it always leads: the sender stays, saying so.
        (None, Some(leading_tx))
    };
    let hub_cfg = &config.modules.cloud_hub;
    let cloudhub = if hub_cfg.enable {
        let replica = elects.then(|| leader_settings.identity.clone());
        let hub = start_cloudhub(&config, client.clone(), replica, &nodes, stop.clone()).await?;
        nodes.attach(hub.clone());
        Some(hub)
    } else {
        None
    };
    // Without cloudhub, the newest 100 messages per node wait in memory (a newer one about an
    // object replaces the older); older ones are dropped and counted.
    let memory = Arc::new(api::bus::MemoryHub::new(100));
    let hub: Arc<dyn api::bus::Hub> = match &cloudhub {
        Some(h) => h.clone(),
        None => memory.clone(),
    };
    let controller = config.modules.device_controller.enable.then(|| {
        devicecontroller::controller::start(
            client.clone(),
            hub,
            devicecontroller::controller::Config {
                leader: Some(leading.clone()),
                // Replicas with cloudhub: each does the work of the nodes whose sessions it holds.
                shared: elects && cloudhub.is_some(),
                ..config.modules.device_controller.config()
            },
            stop.clone(),
        )
    });
    if let (Some(h), Some(c)) = (&cloudhub, &controller) {
        h.set_upstream(c.upstream.clone());
        h.set_sessions(c.sessions.clone());
    }
    // Pods go to edge nodes through cloudhub; without it there is no node to send them to.
    if let Some(h) = &cloudhub
        && config.modules.edge_controller.enable
    {
        let tx = edgecontroller::start(client.clone(), h.clone(), stop.clone());
        h.set_pod_upstream(tx);
    }
    // On a real cluster its own DaemonSet controller does this.
    if running.is_some() && config.modules.daemon_set_controller.enable {
        let c = client.clone();
        leader::while_leading(leading.clone(), stop.clone(), move |token| {
            daemonset::run(c.clone(), token)
        });
    }
    // Fleet jobs ask nodes over their sessions: with cloudhub, on the leader.
    if let Some(h) = &cloudhub {
        let (c, h, d) = (client.clone(), h.clone(), config.data_dir.clone());
        leader::while_leading(leading.clone(), stop.clone(), move |token| {
            jobs::run(c.clone(), h.clone(), d.clone(), token)
        });
    }
    // Join tokens and node certificates given out or revoked through any replica hold on all.
    if cloudhub.is_some() && elects {
        tokio::spawn(cloudhub::joins::share(
            client.clone(),
            cloudhub::joins::Book::new(&config.data_dir),
            stop.clone(),
        ));
    }
    // Acknowledgements made through other replicas (their ObjectSync records) clear what this
    // one keeps for the same nodes, so that a node moving here is not sent them again.
    if let Some(h) = &cloudhub
        && elects
    {
        tokio::spawn(cloudhub::objectsync::follow(
            client.clone(),
            h.clone(),
            stop.clone(),
        ));
    }
    let metrics = controller.as_ref().map(|c| c.metrics.clone());
    if !config.modules.metrics.listen.is_empty() {
        serve_metrics(
            &config.modules.metrics.listen,
            metrics,
            memory.clone(),
            cloudhub.clone(),
            stop.clone(),
        )
        .await?;
    }
    cancel.cancelled().await;
    tracing::info!("stopping");
    stop.cancel();
    if let Some(c) = controller {
        let _ = tokio::time::timeout(Duration::from_secs(2), c.task).await;
    }
    // The Lease given up before the API goes, for another replica to lead at once.
    if let Some(e) = election {
        let _ = tokio::time::timeout(Duration::from_secs(3), e).await;
    }
    if let Some(r) = running {
        r.shutdown(Duration::from_secs(5)).await;
    }
    Ok(())
}

/// Prometheus text on `GET /metrics`.
async fn serve_metrics(
    listen: &str,
    controller: Option<Arc<devicecontroller::controller::Metrics>>,
    hub: Arc<api::bus::MemoryHub>,
    cloudhub: Option<Arc<cloudhub::CloudHub>>,
    stop: CancellationToken,
) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} (modules.metrics.listen)"))?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let controller = controller.clone();
            let hub = hub.clone();
            let cloudhub = cloudhub.clone();
            async move {
                let mut o = rt::metrics::Scrape::default();
                if let Some(m) = &controller {
                    m.scrape(&mut o);
                }
                if let Some(h) = &cloudhub {
                    h.metrics
                        .scrape(&mut o, h.pending(), h.records(), h.to_write());
                    h.tunnels.scrape(&mut o);
                }
                o.gauge(
                    "cloudcore_node_messages_pending",
                    "Messages for nodes waiting in cloudcore's bus.",
                    hub.len(),
                )
                .counter(
                    "cloudcore_node_messages_dropped",
                    "Messages for nodes dropped because the bus was full.",
                    hub.dropped.load(std::sync::atomic::Ordering::Relaxed),
                );
                ([("content-type", rt::metrics::CONTENT_TYPE)], o.render())
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    });
    Ok(())
}

/// Starts cloudhub: the certificate server and the websocket server, with their serving
/// certificate signed by the cloud CA for `advertiseAddress`, this host and loopback.
async fn start_cloudhub(
    config: &config::Config,
    client: kube::Client,
    replica: Option<String>,
    nodes: &nodeapi::NodeApi,
    stop: CancellationToken,
) -> Result<Arc<cloudhub::CloudHub>> {
    let c = &config.modules.cloud_hub;
    let claims = replica.is_some().then(|| client.clone());
    let ca = cloudhub::certs::Ca::load(&config.data_dir)?;
    let mut sans = c.advertise_address.clone();
    sans.extend(["127.0.0.1".to_string(), "localhost".to_string()]);
    if let Some(h) = rt::host::name()
        && !sans.contains(&h)
    {
        sans.push(h);
    }
    let (cert, key) = pki::sign_leaf(&ca.pem, &ca.key_pem, "cloudhub", None, &sans, true, 365)?;
    use pki::tls::{ClientCerts, server_config};
    let ws_tls = server_config(
        &cert,
        &key,
        Some((&ca.pem, ClientCerts::Required)),
        &[b"http/1.1"],
    )?;
    let cert_tls = server_config(
        &cert,
        &key,
        Some((&ca.pem, ClientCerts::Optional)),
        &[b"http/1.1"],
    )?;
    let hub = cloudhub::CloudHub::new(cloudhub::Settings {
        joins: cloudhub::joins::Book::new(&config.data_dir),
        node_limit: c.node_limit,
        max_frame_bytes: c.max_frame_bytes,
        keepalive: Duration::from_secs(c.keepalive_seconds),
        node_qps: c.node_qps,
        node_burst: c.node_burst,
        resend: Duration::from_secs(c.resend_seconds),
        noack_limit: 100,
        replica,
        streams_per_node: c.streams_per_node,
        stream_idle: std::time::Duration::from_secs(c.stream_idle_seconds.max(1)),
    });
    hub.spawn_resender(stop.clone());
    hub.set_records(cloudhub::objectsync::Writer::start(client.clone()));
    let listener = tokio::net::TcpListener::bind(c.listen)
        .await
        .with_context(|| format!("cannot listen on {} (modules.cloudHub.listen)", c.listen))?;
    let cert_listener = tokio::net::TcpListener::bind(c.cert_listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (modules.cloudHub.certListen)",
                c.cert_listen
            )
        })?;
    let certs = Arc::new(cloudhub::certs::CertServer {
        ca,
        cert_days: c.edge_cert_days,
        book: cloudhub::joins::Book::new(&config.data_dir),
        claims,
        releases: config.data_dir.join("releases"),
    });
    let ca_pem = certs.ca.pem.clone();
    if config.cloud_stream() {
        serve_cloud_stream(
            config,
            (&certs.ca.pem, &certs.ca.key_pem),
            &sans,
            nodes.kubelet(client.clone()),
            stop.clone(),
        )
        .await?;
    }
    let mut cert_routes = certs.router();
    if let Some(url) = config.admission_webhook() {
        // A real cluster's API server asks here whether a Device's desired values can land.
        cert_routes = cert_routes.merge(admission::router(client.clone()));
        match url {
            Some(url) => {
                let w = &config.modules.admission_webhook;
                let reg = admission::registration(&url, &ca_pem, &w.failure_policy);
                match admission::register(&client, &reg).await {
                    Ok(()) => {
                        eprintln!("cloudcore: Device writes are checked by the webhook at {url}")
                    }
                    Err(e) => tracing::warn!(
                        error = format!("{e:#}"),
                        "admission: the webhook is served but not registered; the cluster stores Devices whose desired values cannot land (the edge still refuses them)"
                    ),
                }
            }
            None => tracing::warn!(
                "admission: the webhook is served at {} but not registered: give modules.admissionWebhook.url or modules.cloudHub.advertiseAddress",
                admission::PATH
            ),
        }
    }
    tokio::spawn(apiserver::serve(
        cert_listener,
        tokio_rustls::TlsAcceptor::from(cert_tls),
        cert_routes,
        stop.clone(),
    ));
    tokio::spawn(cloudhub::serve(
        hub.clone(),
        listener,
        tokio_rustls::TlsAcceptor::from(ws_tls),
        client,
        stop,
    ));
    eprintln!(
        "cloudcore: cloudhub at wss://{} (certificates at https://{}); a join token: cloudcore gettoken",
        c.listen, c.cert_listen
    );
    Ok(hub)
}

/// The kubelet's streaming endpoints of the edge nodes (`modules.cloudStream`), through `hub`'s
/// tunnels, on their own TLS listener taking the clients `clientCaFile` signed.
async fn serve_cloud_stream(
    config: &config::Config,
    (ca, ca_key): (&str, &str),
    sans: &[String],
    endpoints: axum::Router,
    stop: CancellationToken,
) -> Result<()> {
    let c = &config.modules.cloud_stream;
    let read = |key: &str, path: &std::path::Path| {
        std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {} (modules.cloudStream.{key})", path.display()))
    };
    let Some(client_ca) = &c.client_ca_file else {
        anyhow::bail!(
            "modules.cloudStream.clientCaFile is needed to serve the kubelet's endpoints"
        );
    };
    let client_ca = read("clientCaFile", client_ca)?;
    let (cert, key) = match (&c.cert_file, &c.key_file) {
        (Some(cert), Some(key)) => (read("certFile", cert)?, read("keyFile", key)?),
        _ => pki::sign_leaf(ca, ca_key, "cloudstream", None, sans, true, 365)?,
    };
    let tls = pki::tls::server_config(
        &cert,
        &key,
        Some((&client_ca, pki::tls::ClientCerts::Required)),
        &[b"http/1.1"],
    )
    .context("modules.cloudStream")?;
    let listener = tokio::net::TcpListener::bind(c.listen)
        .await
        .with_context(|| format!("cannot listen on {} (modules.cloudStream.listen)", c.listen))?;
    tokio::spawn(apiserver::serve(
        listener,
        tokio_rustls::TlsAcceptor::from(tls),
        endpoints,
        stop,
    ));
    eprintln!(
        "cloudcore: the edge nodes' kubelet endpoints (logs, exec, attach, port-forward) at https://{}",
        c.listen
    );
    Ok(())
}

/// Whether cloudcore has made its files in `config`'s data directory (its CA): the commands that
/// work on them (`gettoken`, `token`, `node revoke`) refuse to make them, which would leave a
/// CA no node joins and files owned by whoever ran the command.
pub fn started_here(config: &config::Config) -> Result<()> {
    cloudhub::certs::Ca::open(&config.data_dir).map(|_| ())
}

/// `cloudcore gettoken`: a join token for edge nodes.
pub fn get_token(config: &config::Config) -> Result<String> {
    create_token(config, None, None, None)
}

/// A join token, recorded: valid `ttl_hours` (else `modules.cloudHub.tokenTtlHours`), for
/// `node` only and at most `max_joins` joins when given.
pub fn create_token(
    config: &config::Config,
    ttl_hours: Option<u64>,
    node: Option<String>,
    max_joins: Option<u32>,
) -> Result<String> {
    let ca = cloudhub::certs::Ca::open(&config.data_dir)?;
    let ttl = ttl_hours.unwrap_or(config.modules.cloud_hub.token_ttl_hours) * 3600;
    let record = cloudhub::joins::Book::new(&config.data_dir).create(ttl, node, max_joins)?;
    ca.token(Duration::from_secs(ttl), &record.id)
}

/// A kube-rs client of the cluster a kubeconfig names, or with `in-cluster`, of the cluster
/// cloudcore runs in as a pod (its ServiceAccount's token and CA, `KUBERNETES_SERVICE_HOST`).
pub async fn cluster_client(path: &std::path::Path) -> Result<kube::Client> {
    if path == std::path::Path::new(config::IN_CLUSTER) {
        let cfg = kube::Config::incluster().context(
            "kubeconfig: in-cluster, but this is not a pod with a ServiceAccount (KUBERNETES_SERVICE_HOST, /var/run/secrets/kubernetes.io/serviceaccount)",
        )?;
        return kube::Client::try_from(cfg).context("cannot make an in-cluster client");
    }
    let kc = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .with_context(|| format!("kubeconfig {} is not usable", path.display()))?;
    kube::Client::try_from(cfg).context("cannot make a client of the kubeconfig")
}

/// Installs (server-side apply) the CRDs on a real cluster.
async fn install_on_cluster(client: &kube::Client, crds: &[Value]) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, Patch, PatchParams};
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        api.patch(
            name,
            &PatchParams::apply("cloudcore").force(),
            &Patch::Apply(crd),
        )
        .await
        .with_context(|| format!("cannot install CRD {name} on the cluster"))?;
    }
    Ok(())
}
