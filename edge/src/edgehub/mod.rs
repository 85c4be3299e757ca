//! edgehub: this node's session with cloudhub, in KubeEdge's wire format.
//!
//! - Joins by token once ([`join`]), then connects to `{server}/{projectID}/{node}/events` with
//!   its certificate, sends a keepalive (and a websocket ping) every `heartbeatSeconds`, and
//!   reconnects with backoff (1 s to 6 s) and jitter when the link drops, or goes silent: no
//!   frame from the cloud for `keepaliveSeconds` (a link that stops carrying bytes without
//!   closing).
//! - Replicas (`cloud.servers`): the node's own replica is the one its name picks among them
//!   (spreading the nodes evenly); when a session ends or a replica cannot be reached, the next
//!   is tried at once (the same certificate, no new join). Away from its own, the node checks
//!   at a random moment within `rebalanceSeconds` whether its own answers again, and moves back.
//! - Downstream (metamanager): a Device or DeviceModel sent by the cloud is persisted in the
//!   twin store before it is acknowledged (`response`, `parent_msg_id`, `"OK"`), then joins the
//!   catalog beside the local manifests (a local manifest wins for the same `namespace/name`).
//!   After a restart without a link, the devices the cloud sent run as before.
//! - Upstream: the twin's outbox (durable) is sent as `twin/edge_updated` messages, one per
//!   device, and `state/update` messages, at most `qps` per second; an entry leaves the outbox
//!   only when the cloud answered (after it stored the DeviceStatus), so a link that drops
//!   loses nothing; messages unanswered 10 s after they were sent are sent again. Values that
//!   changed meanwhile go out as one newest value. The policy (what goes next, what is in
//!   flight, what an answer clears) is [`link`]'s; the session loop only moves bytes, and
//!   reads and handles the cloud's frames while reports wait for the rate.

pub(crate) mod certs;
pub(crate) mod certserver;
mod downstream;
pub(crate) mod jobs;
mod link;
mod nodeinfo;
pub(crate) mod tunnel;
mod upstream;
mod usage;

use crate::catalog::{SharedCatalog, SharedSources};
use crate::config::Cloud;
use anyhow::{Context, Result};
use api::message::Message;
use edged::CloudPods;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::broadcast;
use tokio_tungstenite::tungstenite::Message as Frame;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::sync::CancellationToken;
use twin::TwinService;

/// What edgehub works with.
pub(crate) struct EdgeHub {
    pub cloud: Cloud,
    pub node: String,
    /// The Node's labels this node sets (`nodeLabels`), sent at each session's start.
    pub node_labels: std::collections::BTreeMap<String, String>,
    pub data_dir: PathBuf,
    pub twin: TwinService,
    pub sources: SharedSources,
    pub catalog: SharedCatalog,
    /// Where changes of the cloud's devices and models are published.
    pub sync: crate::meta::sync::CatalogSync,
    /// Where what the cloud sent is kept.
    pub meta: crate::meta::store::MetaStore,
    /// edged's pods from the cloud, when edged runs.
    pub pods: Option<CloudPods>,
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// What the streaming tunnel serves; none when `cloud.streams.enable` is false.
    pub tunnel: Option<std::sync::Arc<tunnel::Services>>,
    /// The container runtime, when edged runs (its containers' usage for `kubectl top`).
    pub runtime: Option<std::sync::Arc<edged::Runtime>>,
    /// Fleet jobs on this node (pre-pulls, upgrades, config updates).
    pub jobs: std::sync::Arc<jobs::Jobs>,
    /// The devices' alarms, acknowledged by the cloud's users too.
    pub alarms: crate::alarms::Alarms,
    /// The certificate server and TLS client of the session now (an upgrade downloads there).
    pub link:
        std::sync::Mutex<Option<(String, std::sync::Arc<tokio_rustls::rustls::ClientConfig>)>>,
}

impl EdgeHub {
    /// Runs until `cancel`: joins, connects, and reconnects.
    pub(crate) async fn run(self, cancel: CancellationToken) {
        // At most 6 s (and up to half as much again of jitter) between tries: a node whose link
        // comes back is Ready again within about 10 s; a site's nodes spread over those seconds.
        let mut backoff = rt::Backoff::new(Duration::from_secs(1), Duration::from_secs(6));
        let mut renewal_tried = None;
        let replicas = self.cloud.replicas();
        let home = home_of(&self.node, replicas.len());
        let mut at = home;
        // Failures in a row: every replica tried once before the backoff grows.
        let mut failures = 0usize;
        loop {
            let started = Instant::now();
            let back_home = (at != home).then(|| {
                let window = self.cloud.rebalance_seconds.max(1) * 1000;
                Instant::now()
                    + Duration::from_millis(window / 2 + u64::from(rand_u16()) * window / 2 / 65536)
            });
            let r = tokio::select! {
                _ = cancel.cancelled() => return,
                r = self.connect_once(&cancel, &mut renewal_tried, &replicas[at], back_home.map(|t| (t, &replicas[home].0))) => r,
            };
            self.metrics
                .cloud_connected
                .store(0, std::sync::atomic::Ordering::Relaxed);
            self.jobs.session(false);
            let moving_home = matches!(&r, Ok(why) if why == MOVING_HOME);
            if moving_home {
                tracing::info!(server = %replicas[home].0, "edgehub: this node's own replica answers again; moving back to it");
                at = home;
                continue;
            }
            match r {
                Ok(why) => {
                    tracing::warn!(server = %replicas[at].0, reason = %why, "edgehub: session ended; reconnecting")
                }
                Err(e) => tracing::warn!(
                    server = %replicas[at].0,
                    error = format!("{e:#}"),
                    "edgehub: cannot reach the cloud; retrying"
                ),
            }
            let served = started.elapsed() > Duration::from_secs(10);
            if served {
                failures = 0;
            } else {
                failures += 1;
            }
            if replicas.len() > 1 {
                at = (at + 1) % replicas.len();
                // The next replica at once, while some have not been tried since the last
                // working session.
                if served || failures < replicas.len() {
                    tracing::info!(server = %replicas[at].0, "edgehub: trying the next replica");
                    let pause = Duration::from_millis(200 + u64::from(rand_u16()) % 800);
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(pause) => {}
                    }
                    continue;
                }
            }
            if started.elapsed() > Duration::from_secs(60) {
                backoff.reset();
            }
            let pause = backoff.next_delay();
            // Jitter, so that the nodes of a site do not all come back in the same second.
            let jitter =
                Duration::from_millis(u64::from(rand_u16()) % (pause.as_millis() as u64 / 2 + 1));
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(pause + jitter) => {}
            }
        }
    }

    /// Renews the node certificate when it is due, at most once an hour (a failure is logged
    /// and the current certificate kept).
    async fn renew_if_due(
        &self,
        cert_server: &str,
        creds: &mut certs::Credentials,
        tried: &mut Option<Instant>,
    ) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        if !creds.renewal_due(now, self.cloud.renew_before_days)
            || tried.is_some_and(|t| t.elapsed() < Duration::from_secs(3600))
        {
            return;
        }
        *tried = Some(Instant::now());
        let dir = self.data_dir.join("certs");
        match tokio::time::timeout(
            Duration::from_secs(20),
            certs::renew(&dir, cert_server, &self.node, creds),
        )
        .await
        {
            Ok(Ok(new)) => *creds = new,
            Ok(Err(e)) => tracing::warn!(
                error = format!("{e:#}"),
                "edgehub: cannot renew the node certificate; kept, tried again in an hour"
            ),
            Err(_) => tracing::warn!(
                "edgehub: renewing the node certificate timed out; tried again in an hour"
            ),
        }
    }

    async fn connect_once(
        &self,
        cancel: &CancellationToken,
        renewal_tried: &mut Option<Instant>,
        (server, cert_server): &(String, String),
        back_home: Option<(Instant, &String)>,
    ) -> Result<String> {
        let mut creds = certs::credentials(
            &self.data_dir.join("certs"),
            cert_server,
            &self.node,
            &self.cloud.token,
        )
        .await?;
        self.renew_if_due(cert_server, &mut creds, renewal_tried)
            .await;
        let (authority, host) = certserver::host_port(server)?;
        let tcp = connect_spread(&authority, &self.node)
            .await
            .with_context(|| format!("cannot connect to {server}"))?;
        let _ = tcp.set_nodelay(true);
        // The address the node reaches the cloud from: its Node's InternalIP.
        let node_ip = tcp.local_addr().ok().map(|a| a.ip());
        // A link that takes the connection but carries nothing (a dead route behind a proxy)
        // must not hold the node here: each handshake has 10 s.
        let tls = tokio::time::timeout(
            HANDSHAKE,
            tokio_rustls::TlsConnector::from(creds.client_config()?)
                .connect(certserver::server_name(&host)?, tcp),
        )
        .await
        .context("TLS with cloudhub timed out")?
        .context("TLS with cloudhub failed")?;
        let url = format!(
            "{}/{}/{}/events",
            server.trim_end_matches('/'),
            self.cloud.project_id,
            self.node
        );
        let mut req = url.as_str().into_client_request()?;
        req.headers_mut()
            .insert("node_id", self.node.parse().context("node name")?);
        req.headers_mut().insert(
            "project_id",
            self.cloud.project_id.parse().context("project id")?,
        );
        let (ws, _) = tokio::time::timeout(HANDSHAKE, tokio_tungstenite::client_async(req, tls))
            .await
            .context("websocket handshake with cloudhub timed out")?
            .context("websocket handshake with cloudhub failed")?;
        tracing::info!(%server, "edgehub: connected");
        *self.link.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((cert_server.to_string(), creds.client_config()?));
        // The streaming tunnel, beside this session and ended with it.
        let tunnel_end = cancel.child_token();
        let _tunnel_end = tunnel_end.clone().drop_guard();
        if let Some(services) = &self.tunnel {
            let target = tunnel::Target {
                server: server.clone(),
                project_id: self.cloud.project_id.clone(),
                tls: creds.client_config()?,
            };
            tokio::spawn(tunnel::run(services.clone(), target, tunnel_end));
        }
        *self
            .metrics
            .cloud_server
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = server.clone();
        self.metrics
            .cloud_connected
            .store(1, std::sync::atomic::Ordering::Relaxed);
        self.jobs.session(true);
        let (sink, mut frames) = ws.split();
        // The socket is written by a task of its own: the loop below never waits on a slow
        // socket while the cloud's frames wait to be read. What waits to be written is bounded
        // (`OUT_FRAMES`): reports take only half of it; answers and keepalives the rest.
        let (out, out_rx) = tokio::sync::mpsc::channel::<Frame>(OUT_FRAMES);
        let mut writer = tokio::spawn(write_frames(
            sink,
            out_rx,
            Duration::from_secs(self.cloud.keepalive_seconds.max(1)),
        ));
        let send = |f: Frame| {
            let out = out.clone();
            async move {
                out.send(f)
                    .await
                    .map_err(|_| anyhow::anyhow!("the socket's writer ended"))
            }
        };
        let text = |m: &Message| -> Result<Frame> { Ok(Frame::text(serde_json::to_string(m)?)) };
        let mut home_check = back_home.map(|(t, _)| t);
        let mut heartbeat =
            tokio::time::interval(Duration::from_secs(self.cloud.heartbeat_seconds));
        // What the node and its pods use (`kubectl top`): a rate needs two samples, so the
        // first report is one period after the session starts.
        let usage_every = Duration::from_secs(self.cloud.metrics_seconds.max(1));
        let mut usage_tick = tokio::time::interval(usage_every);
        let mut sampler = usage::Sampler::new();
        // Answers given later (a job's work done beside the session).
        let (later_tx, mut later_rx) = tokio::sync::mpsc::channel::<Message>(16);
        // The outbox is read when the twin committed something (checked every 20 ms), and
        // every second anyway (for resends).
        let mut poll = tokio::time::interval(Duration::from_millis(20));
        let mut events = self.twin.subscribe();
        let mut dirty = true;
        let mut last_read = Instant::now();
        let mut link = link::Link::new(
            link::Settings {
                qps: self.cloud.qps,
                burst: self.cloud.burst,
                resend: RESEND,
                keepalive: Duration::from_secs(self.cloud.keepalive_seconds.max(1)),
                // Two seconds of the rate: enough for the cloud's answers to keep it full.
                window: 2 * self.cloud.qps.max(self.cloud.burst / 2) as usize,
            },
            tokio::time::Instant::now(),
        );
        let gauges = LinkGauges(&self.metrics);
        // Pod status: the version of each pod's report sent in this session, and the messages
        // not answered yet. A new session sends every pod's status again.
        let mut pod_sent: BTreeMap<edged::cloud::Key, u64> = BTreeMap::new();
        let mut pod_inflight: HashMap<String, edged::cloud::Key> = HashMap::new();
        let mut pod_retry: HashMap<edged::cloud::Key, Instant> = HashMap::new();
        let reported = self.pods.as_ref().map(|p| p.reported.clone());
        // A session can outlive its certificate: checked every hour.
        let mut renewal = tokio::time::interval_at(
            tokio::time::Instant::now() + Duration::from_secs(3600),
            Duration::from_secs(3600),
        );
        // The node's system info first (its version on the fleet page and in `kubectl get
        // nodes`); the answer says whether the cloud took it.
        let info = nodeinfo::patch(
            &self.node,
            self.pods.as_ref().map(|_| "containerd"),
            &jobs::version(&self.data_dir),
            node_ip,
        );
        let mut info_id = info.header.id.clone();
        // Sent again when refused: the Node may not be made yet (cloudhub makes it as the
        // session starts), at most a few times.
        let mut info_again: Option<Instant> = None;
        let mut info_tries = 1;
        send(text(&info)?).await?;
        if !self.node_labels.is_empty() {
            let reg = nodeinfo::register(&self.node, &self.node_labels);
            send(text(&reg)?).await?;
        }
        // Each device's state again, at the rate of reports, before the outbox.
        for msg in self.device_states().await {
            link.offer(msg, link::Up::Plain);
        }
        // Whether the outbox drains, checked every 10 s: its oldest change older than four
        // keepalives while connected is a stuck link, said once a minute at most.
        let mut drain_check = tokio::time::interval(Duration::from_secs(10));
        let mut stuck_said: Option<Instant> = None;
        // Objects from the cloud stored since the catalog was last rebuilt.
        let mut catalog_stale = false;
        let mut writer_done = false;
        let why: Result<String> = async { Ok(loop {
            let next_up = link.next_at(tokio::time::Instant::now());
            let expires = link.expires_at();
            tokio::select! {
                _ = cancel.cancelled() => break "edgecore stops".to_string(),
                w = &mut writer, if !writer_done => {
                    writer_done = true;
                    break w.unwrap_or_else(|e| format!("the socket's writer failed: {e}"));
                }
                _ = tokio::time::sleep_until(link.silent_at()) => {
                    self.metrics.cloud_silent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    break format!("the cloud was silent for {}s (no frame, not even a pong)", self.cloud.keepalive_seconds);
                }
                _ = renewal.tick() => self.renew_if_due(cert_server, &mut creds, renewal_tried).await,
                _ = drain_check.tick() => {
                    let limit = 4 * self.cloud.keepalive_seconds;
                    if let Ok((depth, Some(oldest))) = self.twin.store().outbox_stats().await
                        && crate::metrics::outbox_age_seconds(oldest) > limit
                        && stuck_said.is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
                    {
                        stuck_said = Some(Instant::now());
                        tracing::warn!(
                            depth,
                            oldest_seconds = crate::metrics::outbox_age_seconds(oldest),
                            queued = link.queued(),
                            in_flight = link.in_flight(),
                            oldest_in_flight_ms = link.oldest_in_flight(tokio::time::Instant::now()).map_or(0, |d| d.as_millis()),
                            "edgehub: the outbox does not drain: its oldest change is older than four keepalives ({limit}s) while connected"
                        );
                    }
                }
                _ = sleep_until_some(info_again) => {
                    info_again = None;
                    info_tries += 1;
                    let info = nodeinfo::patch(&self.node, self.pods.as_ref().map(|_| "containerd"), &jobs::version(&self.data_dir), node_ip);
                    info_id = info.header.id.clone();
                    send(text(&info)?).await?;
                }
                _ = sleep_until_some(home_check) => {
                    if let Some((_, home)) = back_home
                        && reachable(home).await
                    {
                        break MOVING_HOME.into();
                    }
                    // Not yet: checked again half a window later.
                    home_check = Some(Instant::now() + Duration::from_secs(self.cloud.rebalance_seconds.max(2) / 2));
                }
                _ = heartbeat.tick() => {
                    // KubeEdge's keepalive message, which cloudhub's silence timer reads, and a
                    // websocket ping, whose pong tells this side the cloud still reads.
                    let ping = Message::new("websocket", "resource", "keepalive", "node", json!("ping"));
                    send(text(&ping)?).await?;
                    send(Frame::Ping(Vec::new().into())).await?;
                }
                _ = usage_tick.tick(), if self.cloud.metrics_seconds > 0 => {
                    if let Some(content) = usage::sample(&mut sampler, self.runtime.as_deref(), self.cloud.metrics_seconds).await {
                        let msg = Message::new("edgehub", "meta", "update", usage::RESOURCE, content);
                        send(text(&msg)?).await?;
                    }
                }
                Some(answer) = later_rx.recv() => send(text(&answer)?).await?,
                ev = events.recv() => match ev {
                    Ok(a) => dirty |= !a.outbox.is_empty(),
                    Err(broadcast::error::RecvError::Lagged(_)) => dirty = true,
                    Err(broadcast::error::RecvError::Closed) => break "the twin stopped".into(),
                },
                _ = async {
                    match &reported {
                        Some(n) => n.notified().await,
                        None => std::future::pending().await,
                    }
                } => self.offer_pod_status(&mut link, &mut pod_sent, &mut pod_retry),
                _ = sleep_until_some(expires.map(Into::into)) => {
                    // Unanswered since `RESEND` after it was sent: read from the outbox again.
                    let n = link.expire(tokio::time::Instant::now());
                    if n > 0 {
                        self.metrics.cloud_resent.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                        dirty = true;
                    }
                }
                _ = sleep_until_some(next_up.map(Into::into)), if out.capacity() > OUT_FRAMES / 2 => {
                    // Reports, as the rate lets them out, while half the way out is free.
                    let now = tokio::time::Instant::now();
                    while out.capacity() > OUT_FRAMES / 2 {
                        let Some((msg, up)) = link.next_up(now) else { break };
                        if let link::Up::Pod(key) = up {
                            pod_inflight.insert(msg.header.id.clone(), key);
                        }
                        send(text(&msg)?).await?;
                    }
                    gauges.set(&link, OUT_FRAMES - out.capacity());
                }
                _ = poll.tick() => {
                    // What the cloud answered since the last tick leaves the outbox in one
                    // transaction, before the outbox is read again.
                    self.clear_answered(&mut link).await;
                    if last_read.elapsed() >= Duration::from_secs(1) {
                        self.offer_pod_status(&mut link, &mut pod_sent, &mut pod_retry);
                        // Answers lost with nothing else to clear them stay bounded by the
                        // pods there are.
                        if pod_inflight.len() > 4 * pod_sent.len().max(64) {
                            pod_inflight.clear();
                        }
                    }
                    if catalog_stale {
                        catalog_stale = false;
                        let src = self.sources.lock().await;
                        self.sync.publish(&src).await;
                    }
                    gauges.set(&link, OUT_FRAMES - out.capacity());
                    if (!dirty && last_read.elapsed() < Duration::from_secs(1)) || !link.wants_outbox() {
                        continue;
                    }
                    dirty = false;
                    last_read = Instant::now();
                    for (msg, entries) in self.outbox_messages(&link).await {
                        link.offer(msg, link::Up::Entries(entries));
                    }
                }
                f = frames.next() => {
                    link.heard(tokio::time::Instant::now());
                    self.metrics.cloud_frames_in.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let frame = match f {
                        None => break "closed by the cloud".into(),
                        Some(Err(e)) => break format!("read failed: {e}"),
                        Some(Ok(f)) => f,
                    };
                    let data = match frame {
                        Frame::Text(t) => t.as_bytes().to_vec(),
                        Frame::Binary(b) => b.to_vec(),
                        Frame::Close(c) => break format!("closed by the cloud: {c:?}"),
                        _ => continue,
                    };
                    let msg: Message = match serde_json::from_slice(&data) {
                        Ok(m) => m,
                        Err(e) => {
                            tracing::warn!(error = %e, "edgehub: a frame from the cloud is not a message; skipped");
                            continue;
                        }
                    };
                    if !info_id.is_empty() && msg.header.parent_id == info_id {
                        info_id.clear();
                        let refused = msg.route.operation == "error"
                            || msg.content.get("Err").is_some_and(|e| !e.is_null());
                        if refused && info_tries < 5 {
                            tracing::debug!(content = %msg.content, "edgehub: the cloud did not take this node's system info yet; sent again in 2 s");
                            info_again = Some(Instant::now() + Duration::from_secs(2));
                        } else if refused {
                            tracing::warn!(content = %msg.content, "edgehub: the cloud did not take this node's system info (its version is not shown)");
                        }
                        continue;
                    }
                    if let Some(key) = pod_inflight.remove(&msg.header.parent_id) {
                        // The cloud's answer to a pod status: an error is tried again later.
                        if msg.route.operation == "error" {
                            tracing::warn!(pod = %format!("{}/{}", key.0, key.1), content = %msg.content, "edgehub: the cloud could not store a pod status; sent again in 10 s");
                            pod_sent.remove(&key);
                            pod_retry.insert(key, Instant::now() + Duration::from_secs(10));
                        }
                        continue;
                    }
                    // An answer frees its properties: values that changed while it was in
                    // flight go now, not at the next commit.
                    dirty |= !msg.header.parent_id.is_empty();
                    if let Some(answer) = self.received(msg, &mut link, &later_tx, &mut catalog_stale).await {
                        send(text(&answer)?).await?;
                    }
                }
            }
        }) }.await;
        if catalog_stale {
            let src = self.sources.lock().await;
            self.sync.publish(&src).await;
        }
        // Answers taken in before the session ended are not sent again by the next one.
        self.clear_answered(&mut link).await;
        gauges.clear();
        // What waits to be written goes, and the socket is closed, if it can be within 5 s.
        drop(out);
        if !writer_done {
            let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
        }
        why
    }

    /// Clears the entries the cloud has answered from the outbox (one transaction).
    async fn clear_answered(&self, link: &mut link::Link) {
        let answered = link.take_answered();
        if !answered.is_empty()
            && let Err(e) = self.twin.store().ack(&answered).await
        {
            tracing::warn!(error = %e, entries = answered.len(), "edgehub: cannot clear acknowledged reports; sent again later");
        }
    }

    /// Offers the pod status reports not sent in this session yet (newer than the sent ones)
    /// to the link, which sends them at the rate of reports.
    fn offer_pod_status(
        &self,
        link: &mut link::Link,
        sent: &mut BTreeMap<edged::cloud::Key, u64>,
        retry: &mut HashMap<edged::cloud::Key, Instant>,
    ) {
        let Some(pods) = &self.pods else {
            return;
        };
        let now = Instant::now();
        retry.retain(|_, t| *t > now);
        for (key, uid, status, version) in pods.reports_since(sent) {
            if retry.contains_key(&key) {
                continue;
            }
            let msg = edged::cloud::podpatch(&key, &uid, &status);
            link.offer(msg, link::Up::Pod(key.clone()));
            sent.insert(key, version);
        }
    }
}

/// The time each of the TLS and websocket handshakes with cloudhub has.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// An outbox message not answered this long after it was sent is offered again.
const RESEND: Duration = Duration::from_secs(10);

/// Frames waiting to be written to the socket; reports take at most half.
const OUT_FRAMES: usize = 256;

/// Writes `frames` to the socket until the session drops its sender (then closes the socket) or
/// a write fails or waits longer than `limit` (a cloud that stopped reading). Returns why.
async fn write_frames<S>(
    mut sink: S,
    mut frames: tokio::sync::mpsc::Receiver<Frame>,
    limit: Duration,
) -> String
where
    S: futures_util::Sink<Frame, Error = tokio_tungstenite::tungstenite::Error> + Unpin,
{
    while let Some(f) = frames.recv().await {
        match tokio::time::timeout(limit, sink.send(f)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return format!("write failed: {e}"),
            Err(_) => {
                return format!(
                    "the cloud stopped reading: a frame waited {limit:?} to be written"
                );
            }
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), sink.close()).await;
    "closed".into()
}

/// The link's gauges in `/metrics`, set by the session and cleared when it ends.
struct LinkGauges<'a>(&'a crate::metrics::Metrics);

impl LinkGauges<'_> {
    fn set(&self, link: &link::Link, to_write: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        let m = self.0;
        m.cloud_frames_to_write.store(to_write as i64, Relaxed);
        m.cloud_queued.store(link.queued() as i64, Relaxed);
        m.cloud_in_flight.store(link.in_flight() as i64, Relaxed);
        let oldest = link.oldest_in_flight(tokio::time::Instant::now());
        m.cloud_oldest_in_flight_ms
            .store(oldest.map_or(0, |d| d.as_millis() as i64), Relaxed);
    }

    fn clear(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let m = self.0;
        m.cloud_queued.store(0, Relaxed);
        m.cloud_in_flight.store(0, Relaxed);
        m.cloud_frames_to_write.store(0, Relaxed);
        m.cloud_oldest_in_flight_ms.store(0, Relaxed);
    }
}

/// What a session that ends to go back to the node's own replica says.
const MOVING_HOME: &str = "moving back to this node's own replica";

/// The node's own replica among `n`: a hash of its name (FNV-1a), the same at every start.
fn home_of(node: &str, n: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % n.max(1) as u64) as usize
}

/// Connects to `authority`; a name that resolves to several addresses (replicas behind one
/// name) is tried address by address, starting at the one this node's name picks, so that
/// nodes spread over them.
async fn connect_spread(authority: &str, node: &str) -> Result<tokio::net::TcpStream> {
    let mut addrs: Vec<std::net::SocketAddr> =
        tokio::time::timeout(Duration::from_secs(10), tokio::net::lookup_host(authority))
            .await
            .context("resolving timed out")??
            .collect();
    addrs.sort();
    addrs.dedup();
    anyhow::ensure!(!addrs.is_empty(), "{authority} resolves to no address");
    let start = home_of(node, addrs.len());
    let mut last = None;
    for k in 0..addrs.len() {
        let addr = addrs[(start + k) % addrs.len()];
        match tokio::time::timeout(
            Duration::from_secs(10),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            Ok(Ok(tcp)) => return Ok(tcp),
            Ok(Err(e)) => last = Some(anyhow::anyhow!("{addr}: {e}")),
            Err(_) => last = Some(anyhow::anyhow!("{addr}: connect timed out")),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no address")))
}

/// Sleeps until `t`; never, for `None`.
async fn sleep_until_some(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// Whether `server` (`wss://host:port`) takes a TCP connection within 2 s.
async fn reachable(server: &str) -> bool {
    let Ok((authority, _)) = certserver::host_port(server) else {
        return false;
    };
    matches!(
        tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::TcpStream::connect(&authority)
        )
        .await,
        Ok(Ok(_))
    )
}

/// A few random bits for jitter (the clock's nanoseconds: no generator needed for this).
fn rand_u16() -> u16 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u16)
        .unwrap_or(0)
}
