//! The eventbus: KubeEdge's `$hw` MQTT topics served from the twin, on the embedded broker or
//! any external one. Requests are handled in the order they arrive; a malformed payload gets an
//! error on its result topic and changes nothing.

pub(crate) mod auth;
pub(crate) mod broker;
pub(crate) mod payload;
mod quickack;
pub(crate) mod topics;

use crate::metrics::Metrics;
use api::paths::{DeviceId, DeviceTopicKind, NodeTopicKind, Topic};
use api::v1beta1::PropertyType;
use payload::TwinUpdate;
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, QoS};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use twin::engine::Reported;
use twin::service::{Op, ServiceError};
use twin::{DeviceRow, TwinService, now_millis};

/// MQTT 3.1.1's largest packet (the remaining length's limit).
const MQTT_MAX_PACKET: usize = 268_435_455;

/// A request larger than this is refused with 413 without being parsed.
pub(crate) const MAX_REQUEST: usize = broker::MAX_PAYLOAD;

/// Requests handed to the request handler and not yet taken by it.
const REQUEST_QUEUE: usize = 1024;

/// Requests received while the handler's queue is full. QoS 1 requests are held here (the
/// broker's in-flight window bounds them, since they are acknowledged only once handled); QoS 0
/// ones beyond this are dropped and counted.
const HELD_REQUESTS: usize = 4096;

/// Requests are handled on this many lanes, one per hash of their device.
const LANES: usize = 32;

/// Requests waiting in one lane.
const LANE_QUEUE: usize = 64;

/// The lane of a request: by its topic's namespace and name (`$hw/events/device/{ns}/{name}/...`),
/// or the node's topic.
fn lane_of(topic: &str) -> usize {
    use std::hash::{Hash, Hasher};
    let key: Vec<&str> = topic.split('/').take(5).collect();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % LANES as u64) as usize
}

/// How to reach the broker.
#[derive(Clone, Debug)]
pub(crate) struct MqttSettings {
    pub host: String,
    pub port: u16,
    pub client_id: String,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Through the relay that acknowledges every segment at once ([`quickack`]).
    pub quick_ack: bool,
    /// The keep-alive: a broker silent for twice this is left and joined again.
    pub keep_alive: Duration,
}

/// The topic filters edgecore subscribes to.
pub(crate) fn subscriptions(node: &str) -> Vec<String> {
    vec![
        "$hw/events/device/+/+/twin/update".into(),
        "$hw/events/device/+/+/twin/get".into(),
        "$hw/events/device/+/+/state/update".into(),
        format!("$hw/events/node/{node}/membership/get"),
    ]
}

/// Where the eventbus meets the apps.
pub(crate) enum Connection {
    /// An MQTT client of a broker over TCP (an external broker).
    Tcp(MqttSettings),
    /// edgecore's own embedded broker, in the same process: no socket, no MQTT encoding and
    /// no acknowledgements between them ([`broker::Broker::link`], subscribed to
    /// [`subscriptions`]).
    Link(broker::Link),
}

/// Requests taken from the in-process link and not yet handled: as the window of a TCP
/// client, it bounds what a request waits behind during a burst (the publishers wait instead).
/// Requests about one device are handled one after the other, each after the commit of the one
/// before: a `twin/get` behind a burst to its device waits for up to this many commits.
const LINK_WINDOW: usize = 96;

/// Runs the eventbus until `cancel`.
pub(crate) async fn run(
    connection: Connection,
    node: String,
    twin: TwinService,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let mut tasks = tokio::task::JoinSet::new();
    let mut client = None;
    let (outlet, source) = match connection {
        Connection::Tcp(settings) => {
            let (requests_tx, requests_rx) = mpsc::channel(REQUEST_QUEUE);
            let relay = match settings
                .quick_ack
                .then(|| quickack::start(settings.host.clone(), settings.port, cancel.clone()))
            {
                None => None,
                Some(Ok(r)) => Some(r),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "cannot start the MQTT relay; connecting to the broker directly (a broker with Nagle's algorithm on then answers in ~44 ms)");
                    None
                }
            };
            let (c, eventloop) = tcp_client(&settings, relay.as_ref().map(|r| r.address.as_str()));
            tasks.spawn(poll(
                eventloop,
                c.clone(),
                subscriptions(&node),
                requests_tx,
                metrics.clone(),
                relay,
                cancel.clone(),
            ));
            client = Some(c.clone());
            (Outlet::Client(c), Source::Poll(requests_rx))
        }
        Connection::Link(link) => {
            let window = Arc::new(tokio::sync::Semaphore::new(LINK_WINDOW));
            let publisher = link.publisher();
            (
                Outlet::Link {
                    publisher,
                    window: window.clone(),
                },
                Source::Link(link, window),
            )
        }
    };
    let bus = Bus {
        outlet,
        node: node.clone(),
        twin: twin.clone(),
        metrics: metrics.clone(),
    };
    let (lanes, lane_tasks) = bus.lanes(&cancel);
    match source {
        Source::Poll(requests_rx) => {
            tasks.spawn(dispatch(requests_rx, lanes, lane_tasks, cancel.clone()));
        }
        Source::Link(link, window) => {
            tasks.spawn(pump(
                link,
                lanes,
                lane_tasks,
                window,
                metrics.clone(),
                cancel.clone(),
            ));
        }
    }
    tasks.spawn(bus.publish_events(twin.subscribe(), cancel.clone()));
    cancel.cancelled().await;
    if let Some(client) = client {
        let _ = client.try_disconnect();
    }
    while tasks.join_next().await.is_some() {}
}

/// The client of the external broker: through `relay` ([`quickack`]) when there is one.
fn tcp_client(settings: &MqttSettings, relay: Option<&str>) -> (AsyncClient, EventLoop) {
    let mut options = match relay {
        Some(address) => {
            let mut o = MqttOptions::new(&settings.client_id, address, 0);
            o.set_transport(rumqttc::Transport::Unix);
            o
        }
        None => MqttOptions::new(&settings.client_id, &settings.host, settings.port),
    };
    options
        .set_keep_alive(settings.keep_alive)
        .set_clean_session(true)
        // Any size a broker may deliver (MQTT's own limit): one app's oversized publish must
        // not make the client drop its connection and lose everybody else's requests; such a
        // request is refused on its result topic instead ([`MAX_REQUEST`]).
        .set_max_packet_size(MQTT_MAX_PACKET, broker::MAX_PAYLOAD)
        .set_request_channel_capacity(1024)
        .set_inflight(100)
        // A QoS 1 request is acknowledged once it has been handled: the broker sends no more
        // than its in-flight window of unacknowledged ones, which bounds what waits here.
        .set_manual_acks(true);
    if let (Some(u), Some(p)) = (&settings.username, &settings.password) {
        options.set_credentials(u, p);
    }
    let (client, mut eventloop) = AsyncClient::new(options, 1024);
    // Without TCP_NODELAY, each small answer waits for the ACK of the previous segment, which
    // the peer delays by up to 40 ms: every request/answer exchange took 44 ms.
    let mut network = rumqttc::NetworkOptions::new();
    network.set_tcp_nodelay(true);
    eventloop.set_network_options(network);
    (client, eventloop)
}

/// Where requests come from.
enum Source {
    /// The event loop of a TCP client ([`poll`]), through this queue.
    Poll(mpsc::Receiver<rumqttc::Publish>),
    /// The in-process link, with its window of unhandled requests.
    Link(broker::Link, Arc<tokio::sync::Semaphore>),
}

/// The request queue of each lane, and the lanes' tasks.
type Lanes = (
    Vec<mpsc::Sender<rumqttc::Publish>>,
    tokio::task::JoinSet<()>,
);

/// Hands each request to its lane ([`lane_of`]). Waits while that lane is full: the event loop
/// holds further requests, and the broker's in-flight window stops sending more.
async fn to_lane(
    lanes: &[mpsc::Sender<rumqttc::Publish>],
    publish: rumqttc::Publish,
    cancel: &CancellationToken,
) -> bool {
    let lane = &lanes[lane_of(&publish.topic)];
    tokio::select! {
        _ = cancel.cancelled() => false,
        r = lane.send(publish) => r.is_ok(),
    }
}

/// Hands the requests of a TCP client's event loop to their lanes, until `cancel`; then waits
/// for the lanes to finish.
async fn dispatch(
    mut rx: mpsc::Receiver<rumqttc::Publish>,
    lanes: Vec<mpsc::Sender<rumqttc::Publish>>,
    mut lane_tasks: tokio::task::JoinSet<()>,
    cancel: CancellationToken,
) {
    loop {
        let publish = tokio::select! {
            _ = cancel.cancelled() => break,
            m = rx.recv() => match m { Some(m) => m, None => break },
        };
        if !to_lane(&lanes, publish, &cancel).await {
            break;
        }
    }
    drop(lanes);
    while lane_tasks.join_next().await.is_some() {}
}

/// Hands the requests of the in-process link straight to their lanes, at most [`LINK_WINDOW`]
/// of them unhandled. It may wait for a lane: the lanes' answers go straight into the broker's
/// routing, not through this task, and edgecore subscribes to none of its own answers.
async fn pump(
    mut link: broker::Link,
    lanes: Vec<mpsc::Sender<rumqttc::Publish>>,
    mut lane_tasks: tokio::task::JoinSet<()>,
    window: Arc<tokio::sync::Semaphore>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    metrics.mqtt_connected.store(1, Ordering::Relaxed);
    pump_requests(&mut link, &lanes, &window, &metrics, &cancel).await;
    drop(lanes);
    while lane_tasks.join_next().await.is_some() {}
}

async fn pump_requests(
    link: &mut broker::Link,
    lanes: &[mpsc::Sender<rumqttc::Publish>],
    window: &tokio::sync::Semaphore,
    metrics: &Metrics,
    cancel: &CancellationToken,
) {
    loop {
        // Given back by the lane once the request is handled ([`Outlet::done`]).
        let permit = tokio::select! {
            _ = cancel.cancelled() => return,
            p = window.acquire() => p,
        };
        let Ok(permit) = permit else { return };
        permit.forget();
        let publish = tokio::select! {
            _ = cancel.cancelled() => return,
            p = link.recv() => match p { Some(p) => p, None => return },
        };
        metrics.mqtt_messages_in.fetch_add(1, Ordering::Relaxed);
        if !to_lane(lanes, publish, cancel).await {
            return;
        }
    }
}

/// Drives the connection: reconnects with backoff, subscribes on every connect, and forwards
/// incoming publishes to the request handler.
///
/// It never waits for the handler: the handler publishes its answers through this event loop,
/// so a loop that waited for room in the handler's queue would stop sending those answers, the
/// handler would wait for them, and the `$hw` API would stall for good (as a burst of 10,000
/// requests did). Requests that find the queue full wait in `held` instead.
async fn poll(
    mut eventloop: EventLoop,
    client: AsyncClient,
    filters: Vec<String>,
    requests: mpsc::Sender<rumqttc::Publish>,
    metrics: Arc<Metrics>,
    relay: Option<quickack::Relay>,
    cancel: CancellationToken,
) {
    let keep_alive = eventloop.mqtt_options.keep_alive();
    let mut backoff = rt::Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
    let mut held: std::collections::VecDeque<rumqttc::Publish> = std::collections::VecDeque::new();
    loop {
        // Both branches are cancel-safe: rumqttc keeps its state in the event loop between
        // calls, and a permit that is not used is given back.
        let event = tokio::select! {
            _ = cancel.cancelled() => return,
            permit = requests.reserve(), if !held.is_empty() => {
                match permit {
                    Ok(permit) => {
                        if let Some(p) = held.pop_front() {
                            permit.send(p);
                        }
                        continue;
                    }
                    Err(_) => return,
                }
            }
            e = eventloop.poll() => e,
        };
        match event {
            Ok(Event::Incoming(Packet::SubAck(ack))) => {
                backoff.reset();
                // Serving once the broker has taken every subscription: an app's request sent
                // before then reaches no one.
                let refused: Vec<&String> = filters
                    .iter()
                    .zip(&ack.return_codes)
                    .filter(|(_, c)| matches!(c, rumqttc::SubscribeReasonCode::Failure))
                    .map(|(f, _)| f)
                    .collect();
                if refused.is_empty() {
                    metrics.mqtt_connected.store(1, Ordering::Relaxed);
                    tracing::info!("subscribed to the $hw topics on the MQTT broker");
                } else {
                    tracing::warn!(refused = ?refused, "the MQTT broker refused edgecore's subscriptions (its ACL?): those $hw requests go unanswered");
                }
            }
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                tracing::info!("connected to MQTT broker");
                let subs = filters
                    .iter()
                    .map(|f| rumqttc::SubscribeFilter::new(f.clone(), QoS::AtLeastOnce));
                if let Err(e) = client.try_subscribe_many(subs) {
                    tracing::warn!(error = %e, "failed to subscribe to $hw topics");
                }
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                metrics.mqtt_messages_in.fetch_add(1, Ordering::Relaxed);
                if held.is_empty() {
                    match requests.try_send(p) {
                        Ok(()) => continue,
                        Err(mpsc::error::TrySendError::Full(p)) => held.push_back(p),
                        Err(mpsc::error::TrySendError::Closed(_)) => return,
                    }
                } else if p.qos == QoS::AtMostOnce && held.len() >= HELD_REQUESTS {
                    metrics
                        .mqtt_requests_dropped
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(topic = %p.topic, "QoS 0 request dropped: the request queue is full");
                } else {
                    held.push_back(p);
                }
            }
            Ok(_) => {}
            Err(e) => {
                metrics.mqtt_connected.store(0, Ordering::Relaxed);
                metrics
                    .mqtt_connection_errors
                    .fetch_add(1, Ordering::Relaxed);
                let pause = backoff.next_delay();
                // Through the relay, the client sees only that its side closed; the relay
                // knows why.
                match relay.as_ref().and_then(quickack::Relay::take_error) {
                    Some(why) => {
                        tracing::warn!(error = %why, client = %e, retry_in = ?pause, "MQTT connection failed")
                    }
                    None if matches!(
                        e,
                        rumqttc::ConnectionError::MqttState(rumqttc::StateError::AwaitPingResp)
                    ) =>
                    {
                        // The broker's host still acknowledges the bytes (a stopped or hung
                        // broker, a link that went silent): only the unanswered ping tells.
                        tracing::warn!(
                            error = %format!("the MQTT broker did not answer a ping within {}s (mqtt.keepAliveSeconds): silent without closing the connection", keep_alive.as_secs()),
                            retry_in = ?pause,
                            "MQTT connection failed"
                        )
                    }
                    None => tracing::warn!(error = %e, retry_in = ?pause, "MQTT connection failed"),
                }
                // Requests of the lost session will not be acknowledged; the broker resends
                // what it must.
                held.clear();
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}

/// How the eventbus answers and acknowledges.
#[derive(Clone)]
enum Outlet {
    Client(AsyncClient),
    Link {
        publisher: broker::LinkPublisher,
        window: Arc<tokio::sync::Semaphore>,
    },
}

#[derive(Clone)]
struct Bus {
    outlet: Outlet,
    node: String,
    twin: TwinService,
    metrics: Arc<Metrics>,
}

impl Bus {
    /// Whether a message on `topic` may reach anyone. Always so on an external broker, which
    /// does not tell; the embedded one does, and the twin events (`update/document`,
    /// `update/delta`) that no app subscribes to are then not even built.
    fn wanted(&self, topic: &str) -> bool {
        match &self.outlet {
            Outlet::Client(_) => true,
            Outlet::Link { publisher, .. } => publisher.wanted(topic),
        }
    }

    async fn publish(&self, topic: String, payload: Vec<u8>) {
        match &self.outlet {
            Outlet::Client(client) => {
                if let Err(e) = client
                    .publish(topic, QoS::AtLeastOnce, false, payload)
                    .await
                {
                    return tracing::warn!(error = %e, "failed to queue MQTT publish");
                }
            }
            Outlet::Link { publisher, .. } => publisher.publish(topic, payload).await,
        }
        self.metrics
            .mqtt_messages_out
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A request has been handled: now the broker may send the next one.
    async fn done(&self, publish: &rumqttc::Publish) {
        match &self.outlet {
            Outlet::Client(client) => {
                if publish.qos != QoS::AtMostOnce
                    && let Err(e) = client.ack(publish).await
                {
                    tracing::debug!(error = %e, "cannot acknowledge an MQTT request");
                }
            }
            Outlet::Link { window, .. } => window.add_permits(1),
        }
    }

    /// Starts [`LANES`] lanes, each handling the requests about its devices (or node) in
    /// order: requests about different devices are handled concurrently (and their twin updates
    /// committed together) while those about one device keep their order.
    fn lanes(&self, cancel: &CancellationToken) -> Lanes {
        let mut lanes = Vec::with_capacity(LANES);
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..LANES {
            let (tx, lane_rx) = mpsc::channel(LANE_QUEUE);
            lanes.push(tx);
            tasks.spawn(self.clone().lane(lane_rx, cancel.clone()));
        }
        (lanes, tasks)
    }

    /// Handles the requests of one lane in order.
    async fn lane(self, mut rx: mpsc::Receiver<rumqttc::Publish>, cancel: CancellationToken) {
        loop {
            let publish = tokio::select! {
                _ = cancel.cancelled() => return,
                m = rx.recv() => match m { Some(m) => m, None => return },
            };
            // Not cancel-safe, and need not be: a request being handled is finished first, and
            // `handle` publishes through the event loop, which keeps running until then.
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = self.handle(&publish.topic, &publish.payload) => {}
            }
            self.done(&publish).await;
        }
    }

    async fn handle(&self, topic: &str, payload: &[u8]) {
        let now = now_millis();
        if payload.len() > MAX_REQUEST {
            return self.refuse_oversized(topic, payload.len()).await;
        }
        let event_id = payload::event_id(payload);
        match Topic::parse(topic) {
            Ok(Topic::Device { device, kind }) => match kind {
                DeviceTopicKind::TwinUpdate => self.twin_update(device, payload, &event_id).await,
                DeviceTopicKind::TwinGet => self.twin_get(device, payload, &event_id).await,
                DeviceTopicKind::StateUpdate => self.state_update(device, payload, &event_id).await,
                _ => {}
            },
            Ok(Topic::Node {
                node,
                kind: NodeTopicKind::MembershipGet,
            }) if node == self.node => {
                let result = Topic::Node {
                    node,
                    kind: NodeTopicKind::MembershipGetResult,
                }
                .to_string();
                let body = match payload::parse_request(payload) {
                    Ok(()) => match self.twin.list().await {
                        Ok(rows) => payload::membership_result(&event_id, now, &rows),
                        Err(e) => payload::error_result(&event_id, now, e.code(), &e.to_string()),
                    },
                    Err(e) => {
                        self.metrics
                            .mqtt_bad_payloads
                            .fetch_add(1, Ordering::Relaxed);
                        payload::error_result(&event_id, now, 400, &e.0)
                    }
                };
                self.publish(result, body).await;
            }
            _ => tracing::debug!(topic, "ignored MQTT message"),
        }
    }

    /// Answers an oversized request on its result topic (no event_id: it is not parsed).
    async fn refuse_oversized(&self, topic: &str, size: usize) {
        let reason = format!("payload of {size} bytes exceeds the limit of {MAX_REQUEST} bytes");
        let result = match Topic::parse(topic) {
            Ok(Topic::Device { device, kind }) => {
                let kind = match kind {
                    DeviceTopicKind::TwinUpdate => DeviceTopicKind::TwinUpdateResult,
                    DeviceTopicKind::TwinGet => DeviceTopicKind::TwinGetResult,
                    DeviceTopicKind::StateUpdate => DeviceTopicKind::StateUpdateResult,
                    _ => return self.bad(topic, &reason),
                };
                Topic::device(device, kind).to_string()
            }
            Ok(Topic::Node {
                node,
                kind: NodeTopicKind::MembershipGet,
            }) => Topic::Node {
                node,
                kind: NodeTopicKind::MembershipGetResult,
            }
            .to_string(),
            _ => return self.bad(topic, &reason),
        };
        self.bad(&result, &reason);
        self.publish(
            result,
            payload::error_result("", now_millis(), 413, &reason),
        )
        .await;
    }

    fn bad(&self, topic: &str, reason: &str) {
        self.metrics
            .mqtt_bad_payloads
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(topic, reason, "rejected MQTT request");
    }

    /// A request's `parsed` payload; or, when it did not parse, the reason answered on `result`
    /// (400, and counted as a bad message) and none.
    async fn or_refused<T>(
        &self,
        parsed: Result<T, payload::BadPayload>,
        result: &str,
        event_id: &str,
        now: i64,
    ) -> Option<T> {
        match parsed {
            Ok(v) => Some(v),
            Err(e) => {
                self.bad(result, &e.0);
                let body = payload::error_result(event_id, now, 400, &e.0);
                self.publish(result.to_string(), body).await;
                None
            }
        }
    }

    async fn twin_update(&self, device: DeviceId, body: &[u8], event_id: &str) {
        let result = Topic::device(device.clone(), DeviceTopicKind::TwinUpdateResult).to_string();
        let now = now_millis();
        let parsed = payload::parse_twin_update(body);
        let Some(updates) = self.or_refused(parsed, &result, event_id, now).await else {
            return;
        };
        let mut desired = Vec::new();
        let mut reports = Vec::new();
        let mut deletes = Vec::new();
        let mut names = Vec::new();
        for u in updates {
            match u {
                TwinUpdate::Set {
                    name,
                    expected,
                    actual,
                    value_type,
                } => {
                    names.push(name.clone());
                    if let Some(e) = expected {
                        desired.push((name.clone(), e));
                    }
                    if actual.is_some() {
                        reports.push(Reported {
                            property: name,
                            value: actual,
                            observed_desired: None,
                            // An app may add a twin property by reporting it, as in KubeEdge.
                            value_type: Some(value_type.unwrap_or(PropertyType::String)),
                            ..Reported::default()
                        });
                    }
                }
                TwinUpdate::Delete { name } => {
                    names.push(name.clone());
                    deletes.push(name);
                }
            }
        }
        // One request, one change: expected and actual together give one document and no
        // stale delta; published here in KubeEdge's order (result, document, delta) with the
        // request's event_id on the document.
        let op = Op::Tagged {
            event_id: event_id.to_string(),
            op: Box::new(Op::TwinUpdate {
                id: device.clone(),
                desired,
                reports,
                deletes,
            }),
        };
        // The twin comes with the change, as it was right after it: no second round trip,
        // which would wait for the next commit as well.
        let (applied, twin) = match self.twin.apply_and_get(op, &device).await {
            Ok(done) => done,
            Err(e) => {
                self.bad(&result, &e.to_string());
                let body = payload::error_result(event_id, now_millis(), e.code(), &e.to_string());
                return self.publish(result, body).await;
            }
        };
        let Some(twin) = twin else {
            let body = payload::unknown_device(event_id, now_millis(), &device);
            return self.publish(result, body).await;
        };
        let now = now_millis();
        if self.wanted(&result) {
            self.publish(result, payload::update_result(event_id, now, &twin, &names))
                .await;
        }
        if !applied.changes.is_empty() {
            self.publish_changes(&device, event_id, now, &applied, Some(&twin))
                .await;
        }
    }

    /// `update/document` (with `event_id`) and `update/delta` (with an id of its own, as
    /// KubeEdge does) of a committed change. `twin` is the device's twin after it, when at hand.
    async fn publish_changes(
        &self,
        device: &DeviceId,
        event_id: &str,
        now: twin::Millis,
        applied: &twin::engine::Applied,
        twin: Option<&twin::DeviceTwin>,
    ) {
        let topic = Topic::device(device.clone(), DeviceTopicKind::TwinUpdateDocument).to_string();
        if self.wanted(&topic) {
            self.publish(topic, payload::document(event_id, now, applied))
                .await;
        }
        if applied.delta.is_empty() {
            return;
        }
        let delta_topic =
            Topic::device(device.clone(), DeviceTopicKind::TwinUpdateDelta).to_string();
        if !self.wanted(&delta_topic) {
            return;
        }
        let fetched;
        let twin = match twin {
            Some(t) => t,
            None => match self.twin.get(device).await {
                Ok(Some(t)) => {
                    fetched = t;
                    &fetched
                }
                _ => return,
            },
        };
        if let Some(body) = payload::delta(&uuid::Uuid::new_v4().to_string(), now, twin) {
            self.publish(delta_topic, body).await;
        }
    }

    async fn twin_get(&self, device: DeviceId, body: &[u8], event_id: &str) {
        let result = Topic::device(device.clone(), DeviceTopicKind::TwinGetResult).to_string();
        let now = now_millis();
        let body = match payload::parse_request(body) {
            Err(e) => {
                self.bad(&result, &e.0);
                payload::error_result(event_id, now, 400, &e.0)
            }
            Ok(()) => match self.twin.get(&device).await {
                Ok(Some(t)) => payload::get_result(event_id, now, &t),
                Ok(None) => payload::unknown_device(event_id, now, &device),
                Err(e) => payload::error_result(event_id, now, 500, &e.to_string()),
            },
        };
        self.publish(result, body).await;
    }

    async fn state_update(&self, device: DeviceId, body: &[u8], event_id: &str) {
        let result = Topic::device(device.clone(), DeviceTopicKind::StateUpdateResult).to_string();
        let now = now_millis();
        let parsed = payload::parse_state_update(body);
        let Some(state) = self.or_refused(parsed, &result, event_id, now).await else {
            return;
        };
        let op = Op::Tagged {
            event_id: event_id.to_string(),
            op: Box::new(Op::State {
                id: device.clone(),
                state,
                reason: String::new(),
            }),
        };
        let body = match self.twin.apply_and_get(op, &device).await {
            Err(ServiceError::Twin(e)) => {
                self.bad(&result, &e.to_string());
                payload::twin_error_result(event_id, now, &e)
            }
            Err(e) => payload::error_result(event_id, now, 500, &e.to_string()),
            Ok((_, Some(t))) => payload::state_result(event_id, now, &t.row),
            Ok((_, None)) => payload::unknown_device(event_id, now, &device),
        };
        self.publish(result, body).await;
    }

    /// Publishes `update/document`, `update/delta` and `membership/updated` for every committed
    /// change, whatever its source (mapper, app, HTTP, manifests).
    async fn publish_events(
        self,
        mut events: broadcast::Receiver<twin::TwinEvent>,
        cancel: CancellationToken,
    ) {
        loop {
            let applied = tokio::select! {
                _ = cancel.cancelled() => return,
                e = events.recv() => match e {
                    Ok(a) => a,
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        self.metrics.events_dropped.fetch_add(n, Ordering::Relaxed);
                        tracing::warn!(dropped = n, "MQTT publishing lags behind twin updates; events dropped");
                        continue;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            };
            let Some(device) = applied.device.clone() else {
                continue;
            };
            let now = now_millis();
            let id = uuid::Uuid::new_v4().to_string();
            if applied.added || applied.removed {
                let row = applied.row.clone().unwrap_or_else(|| DeviceRow {
                    namespace: device.namespace.clone(),
                    name: device.name.clone(),
                    ..DeviceRow::default()
                });
                let (added, removed) = if applied.removed {
                    (vec![], vec![row])
                } else {
                    (vec![row], vec![])
                };
                let topic = Topic::Node {
                    node: self.node.clone(),
                    kind: NodeTopicKind::MembershipUpdated,
                }
                .to_string();
                self.publish(
                    topic,
                    payload::membership_updated(&id, now, &added, &removed),
                )
                .await;
            }
            if applied.removed || applied.event_id.is_some() {
                // A request's own changes are published by its handler.
                continue;
            }
            if applied.state_changed
                && let Some(row) = &applied.row
            {
                // A state from a mapper (DMI) or from edgecore itself, as KubeEdge publishes
                // the result of every state update.
                let topic =
                    Topic::device(device.clone(), DeviceTopicKind::StateUpdateResult).to_string();
                self.publish(topic, payload::state_result(&id, now, row))
                    .await;
            }
            if !applied.changes.is_empty() {
                self.publish_changes(&device, &id, now, &applied, None)
                    .await;
            }
            for e in &applied.outbox {
                if e.section != twin::model::Section::Alarm {
                    continue;
                }
                let alarm: serde_json::Value = serde_json::from_str(&e.value).unwrap_or_default();
                let topic = Topic::device(device.clone(), DeviceTopicKind::Alarm).to_string();
                let body = serde_json::json!({"event_id": uuid::Uuid::new_v4().to_string(),
                    "timestamp": now, "alarm": alarm});
                self.publish(topic, body.to_string().into_bytes()).await;
            }
        }
    }
}
