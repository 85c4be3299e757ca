//! The eventbus: KubeEdge's `$hw` MQTT topics served from the twin, on the embedded broker or
//! any external one. Requests are handled in the order they arrive; a malformed payload gets an
//! error on its result topic and changes nothing.

pub mod broker;
pub mod payload;

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

/// How to reach the broker.
#[derive(Clone, Debug)]
pub struct MqttSettings {
    pub host: String,
    pub port: u16,
    pub client_id: String,
    pub username: Option<String>,
    pub password: Option<String>,
}

/// The topic filters edgecore subscribes to.
pub fn subscriptions(node: &str) -> Vec<String> {
    vec![
        "$hw/events/device/+/+/twin/update".into(),
        "$hw/events/device/+/+/twin/get".into(),
        "$hw/events/device/+/+/state/update".into(),
        format!("$hw/events/node/{node}/membership/get"),
    ]
}

/// Runs the MQTT client of the eventbus until `cancel`.
pub async fn run(
    settings: MqttSettings,
    node: String,
    twin: TwinService,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let mut options = MqttOptions::new(&settings.client_id, &settings.host, settings.port);
    options
        .set_keep_alive(Duration::from_secs(30))
        .set_clean_session(true)
        .set_max_packet_size(broker::MAX_PAYLOAD, broker::MAX_PAYLOAD)
        .set_request_channel_capacity(1024)
        .set_inflight(100);
    if let (Some(u), Some(p)) = (&settings.username, &settings.password) {
        options.set_credentials(u, p);
    }
    let (client, eventloop) = AsyncClient::new(options, 1024);
    let (requests_tx, requests_rx) = mpsc::channel(4096);
    let bus = Bus {
        client: client.clone(),
        node: node.clone(),
        twin: twin.clone(),
        metrics: metrics.clone(),
    };
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(poll(
        eventloop,
        client.clone(),
        subscriptions(&node),
        requests_tx,
        metrics.clone(),
        cancel.clone(),
    ));
    tasks.spawn(bus.clone().handle_requests(requests_rx, cancel.clone()));
    tasks.spawn(bus.publish_events(twin.subscribe(), cancel.clone()));
    cancel.cancelled().await;
    let _ = client.try_disconnect();
    while tasks.join_next().await.is_some() {}
}

/// Drives the connection: reconnects with backoff, subscribes on every connect, and forwards
/// incoming publishes to the request handler.
async fn poll(
    mut eventloop: EventLoop,
    client: AsyncClient,
    filters: Vec<String>,
    requests: mpsc::Sender<(String, Vec<u8>)>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        // `poll` is cancel-safe: rumqttc keeps its state in the event loop between calls.
        let event = tokio::select! {
            _ = cancel.cancelled() => return,
            e = eventloop.poll() => e,
        };
        match event {
            Ok(Event::Incoming(Packet::SubAck(_))) => {
                backoff = Duration::from_millis(100);
            }
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                metrics.mqtt_connected.store(1, Ordering::Relaxed);
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
                let topic = p.topic.clone();
                if requests.send((topic, p.payload.to_vec())).await.is_err() {
                    return;
                }
            }
            Ok(_) => {}
            Err(e) => {
                metrics.mqtt_connected.store(0, Ordering::Relaxed);
                metrics
                    .mqtt_connection_errors
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, retry_in = ?backoff, "MQTT connection failed");
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

#[derive(Clone)]
struct Bus {
    client: AsyncClient,
    node: String,
    twin: TwinService,
    metrics: Arc<Metrics>,
}

impl Bus {
    async fn publish(&self, topic: String, payload: Vec<u8>) {
        match self
            .client
            .publish(topic, QoS::AtLeastOnce, false, payload)
            .await
        {
            Ok(()) => {
                self.metrics
                    .mqtt_messages_out
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(error = %e, "failed to queue MQTT publish"),
        }
    }

    async fn handle_requests(
        self,
        mut rx: mpsc::Receiver<(String, Vec<u8>)>,
        cancel: CancellationToken,
    ) {
        loop {
            let (topic, payload) = tokio::select! {
                _ = cancel.cancelled() => return,
                m = rx.recv() => match m { Some(m) => m, None => return },
            };
            self.handle(&topic, &payload).await;
        }
    }

    async fn handle(&self, topic: &str, payload: &[u8]) {
        let now = now_millis();
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

    fn bad(&self, topic: &str, reason: &str) {
        self.metrics
            .mqtt_bad_payloads
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(topic, reason, "rejected MQTT request");
    }

    async fn twin_update(&self, device: DeviceId, body: &[u8], event_id: &str) {
        let result = Topic::device(device.clone(), DeviceTopicKind::TwinUpdateResult).to_string();
        let now = now_millis();
        let updates = match payload::parse_twin_update(body) {
            Ok(u) => u,
            Err(e) => {
                self.bad(&result, &e.0);
                return self
                    .publish(result, payload::error_result(event_id, now, 400, &e.0))
                    .await;
            }
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
                        });
                    }
                }
                TwinUpdate::Delete { name } => {
                    names.push(name.clone());
                    deletes.push(name);
                }
            }
        }
        let mut ops = Vec::new();
        if !reports.is_empty() {
            ops.push(Op::Report {
                id: device.clone(),
                reports,
            });
        }
        if !desired.is_empty() {
            ops.push(Op::EdgeDesired {
                id: device.clone(),
                values: desired,
                if_version: None,
            });
        }
        for property in deletes {
            ops.push(Op::DeleteProperty {
                id: device.clone(),
                property,
            });
        }
        for op in ops {
            if let Err(e) = self.twin.apply(op).await {
                self.bad(&result, &e.to_string());
                let body = payload::error_result(event_id, now_millis(), e.code(), &e.to_string());
                return self.publish(result, body).await;
            }
        }
        let body = match self.twin.get(&device).await {
            Ok(Some(t)) => payload::update_result(event_id, now_millis(), &t, &names),
            Ok(None) => payload::unknown_device(event_id, now_millis(), &device),
            Err(e) => payload::error_result(event_id, now_millis(), 500, &e.to_string()),
        };
        self.publish(result, body).await;
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
        let state = match payload::parse_state_update(body) {
            Ok(s) => s,
            Err(e) => {
                self.bad(&result, &e.0);
                return self
                    .publish(result, payload::error_result(event_id, now, 400, &e.0))
                    .await;
            }
        };
        let applied = self
            .twin
            .apply(Op::State {
                id: device.clone(),
                state,
            })
            .await;
        let body = match applied {
            Err(ServiceError::Twin(e)) => {
                self.bad(&result, &e.to_string());
                payload::twin_error_result(event_id, now, &e)
            }
            Err(e) => payload::error_result(event_id, now, 500, &e.to_string()),
            Ok(_) => match self.twin.get(&device).await {
                Ok(Some(t)) => payload::state_result(event_id, now, &t.row),
                _ => payload::unknown_device(event_id, now, &device),
            },
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
            if applied.removed || applied.changes.is_empty() {
                continue;
            }
            let topic =
                Topic::device(device.clone(), DeviceTopicKind::TwinUpdateDocument).to_string();
            self.publish(topic, payload::document(&id, now, &applied))
                .await;
            if let Some(body) = payload::delta(&id, now, &applied) {
                let topic = Topic::device(device, DeviceTopicKind::TwinUpdateDelta).to_string();
                self.publish(topic, body).await;
            }
        }
    }
}
