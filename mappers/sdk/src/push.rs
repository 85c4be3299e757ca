//! Push targets from a property's `pushMethod`: MQTT over one persistent connection per broker
//! (feature `mqtt`) and HTTP POST of JSON (feature `http`). A value is handed to the target's
//! queue without waiting; a target that fails is retried with backoff by its own task, and while
//! its queue is full new values are dropped and counted, so pushing never blocks reads.
//!
//! Payload (JSON): `{"namespace","device","property","value","type","timestamp"}`, timestamp in
//! milliseconds. An MQTT push method without a topic publishes KubeEdge's device data message
//! on `$ke/events/device/{namespace}/{name}/data/update` instead.
//!
//! Database sinks (influxdb2, redis, mysql, TDengine) are further [`Target`] variants: each gets
//! its own task and queue the same way.

use crate::metrics::Metrics;
use api::v1beta1::PushMethod;
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Values queued per target; more are dropped (and counted).
const QUEUE: usize = 1024;
const FIRST_RETRY: Duration = Duration::from_millis(200);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// Where a property's values go.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// `address` as KubeEdge writes it (`tcp://host:port`); `topic` `None` means the `$ke`
    /// device data topic.
    Mqtt {
        address: String,
        topic: Option<String>,
        qos: u8,
        retained: bool,
    },
    /// `http://host:port/path`, with a timeout.
    Http { url: String, timeout: Duration },
}

impl Target {
    /// The target of a `pushMethod`, if it has one this build supports.
    pub fn from_push_method(p: &PushMethod) -> Result<Option<Self>, String> {
        if let Some(m) = &p.mqtt {
            let address = m
                .address
                .clone()
                .filter(|a| !a.is_empty())
                .ok_or("pushMethod.mqtt.address is empty")?;
            let qos = m.qos.unwrap_or(0);
            if !(0..=2).contains(&qos) {
                return Err(format!("pushMethod.mqtt.qos {qos} is not 0, 1 or 2"));
            }
            return Ok(Some(Self::Mqtt {
                address,
                topic: m.topic.clone().filter(|t| !t.is_empty()),
                qos: qos as u8,
                retained: m.retained.unwrap_or(false),
            }));
        }
        if let Some(h) = &p.http {
            let host = h
                .host_name
                .clone()
                .filter(|a| !a.is_empty())
                .ok_or("pushMethod.http.hostName is empty")?;
            let host = if host.contains("://") {
                host
            } else {
                format!("http://{host}")
            };
            let port = h.port.map(|p| format!(":{p}")).unwrap_or_default();
            let path = h.request_path.clone().unwrap_or_default();
            let path = if path.starts_with('/') || path.is_empty() {
                path
            } else {
                format!("/{path}")
            };
            let timeout =
                Duration::from_millis(h.timeout.filter(|t| *t > 0).unwrap_or(5000) as u64);
            return Ok(Some(Self::Http {
                url: format!("{host}{port}{path}"),
                timeout,
            }));
        }
        Ok(None)
    }
}

/// One value to push.
#[derive(Clone, Debug)]
struct Message {
    namespace: String,
    device: String,
    property: String,
    value: String,
    value_type: Option<String>,
    timestamp: u64,
}

impl Message {
    fn json(&self) -> Vec<u8> {
        json!({
            "namespace": self.namespace,
            "device": self.device,
            "property": self.property,
            "value": self.value,
            "type": self.value_type,
            "timestamp": self.timestamp,
        })
        .to_string()
        .into_bytes()
    }

    /// KubeEdge's device data message, for `$ke/events/device/{ns}/{name}/data/update`.
    fn ke_data(&self) -> Vec<u8> {
        json!({
            "event_id": "",
            "timestamp": self.timestamp,
            "data": {
                self.property.clone(): {
                    "value": self.value,
                    "metadata": {"type": self.value_type, "timestamp": self.timestamp},
                }
            }
        })
        .to_string()
        .into_bytes()
    }
}

/// The queue of one target.
pub struct Pusher {
    pub target: Target,
    tx: mpsc::Sender<Message>,
    metrics: Arc<Metrics>,
}

impl PartialEq for Pusher {
    fn eq(&self, other: &Self) -> bool {
        self.target == other.target
    }
}

impl std::fmt::Debug for Pusher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.target.fmt(f)
    }
}

impl Pusher {
    /// Queues a value; never waits.
    pub fn push(
        &self,
        namespace: &str,
        device: &str,
        property: &str,
        value: &str,
        value_type: Option<&str>,
        timestamp: u64,
    ) {
        let m = Message {
            namespace: namespace.into(),
            device: device.into(),
            property: property.into(),
            value: value.into(),
            value_type: value_type.map(str::to_string),
            timestamp,
        };
        if self.tx.try_send(m).is_err() {
            self.metrics.push_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The push targets in use, one task each, shared by every property that names the same one.
pub struct Pushers {
    targets: Mutex<HashMap<Target, Arc<Pusher>>>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
}

impl Pushers {
    pub fn new(metrics: Arc<Metrics>, cancel: CancellationToken) -> Self {
        Self {
            targets: Mutex::new(HashMap::new()),
            metrics,
            cancel,
        }
    }

    /// The pusher of `target`, started on first use. Must be called inside a tokio runtime.
    pub fn get(&self, target: Target) -> Result<Arc<Pusher>, String> {
        let mut targets = self.targets.lock().map_err(|_| "push targets poisoned")?;
        if let Some(p) = targets.get(&target) {
            return Ok(p.clone());
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let metrics = self.metrics.clone();
        let cancel = self.cancel.clone();
        match &target {
            Target::Mqtt {
                address,
                topic,
                qos,
                retained,
            } => {
                #[cfg(feature = "mqtt")]
                tokio::spawn(mqtt::run(
                    address.clone(),
                    topic.clone(),
                    *qos,
                    *retained,
                    rx,
                    metrics.clone(),
                    cancel,
                ));
                #[cfg(not(feature = "mqtt"))]
                {
                    let _ = (address, topic, qos, retained, rx, cancel);
                    return Err("this mapper is built without the mqtt feature".into());
                }
            }
            Target::Http { url, timeout } => {
                #[cfg(feature = "http")]
                tokio::spawn(http::run(
                    url.clone(),
                    *timeout,
                    rx,
                    metrics.clone(),
                    cancel,
                ));
                #[cfg(not(feature = "http"))]
                {
                    let _ = (url, timeout, rx, cancel);
                    return Err("this mapper is built without the http feature".into());
                }
            }
        }
        let p = Arc::new(Pusher {
            target: target.clone(),
            tx,
            metrics,
        });
        targets.insert(target, p.clone());
        Ok(p)
    }
}

#[cfg(feature = "mqtt")]
mod mqtt {
    use super::*;
    use rumqttc::{AsyncClient, MqttOptions, QoS};

    fn host_port(address: &str) -> Result<(String, u16), String> {
        let rest = address
            .strip_prefix("tcp://")
            .or_else(|| address.strip_prefix("mqtt://"))
            .unwrap_or(address);
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) => (
                h.to_string(),
                p.parse()
                    .map_err(|_| format!("bad port in MQTT address {address}"))?,
            ),
            None => (rest.to_string(), 1883),
        };
        Ok((host, port))
    }

    pub(super) async fn run(
        address: String,
        topic: Option<String>,
        qos: u8,
        retained: bool,
        mut rx: mpsc::Receiver<Message>,
        metrics: Arc<Metrics>,
        cancel: CancellationToken,
    ) {
        let (host, port) = match host_port(&address) {
            Ok(hp) => hp,
            Err(e) => {
                tracing::error!(error = %e, "MQTT push target unusable");
                return;
            }
        };
        let id = format!("mapper-push-{}", uuid_like());
        let mut options = MqttOptions::new(id, host, port);
        options.set_keep_alive(Duration::from_secs(30));
        let (client, mut eventloop) = AsyncClient::new(options, QUEUE);
        let qos = match qos {
            0 => QoS::AtMostOnce,
            1 => QoS::AtLeastOnce,
            _ => QoS::ExactlyOnce,
        };
        let poll_cancel = cancel.clone();
        let poll_metrics = metrics.clone();
        tokio::spawn(async move {
            let mut backoff = FIRST_RETRY;
            loop {
                let event = tokio::select! {
                    _ = poll_cancel.cancelled() => return,
                    e = eventloop.poll() => e,
                };
                match event {
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_))) => {
                        backoff = FIRST_RETRY;
                        tracing::info!(broker = %address, "push target connected");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        poll_metrics.push_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(broker = %address, error = %e, retry_in = ?backoff, "MQTT push target unreachable");
                        tokio::select! {
                            _ = poll_cancel.cancelled() => return,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(MAX_RETRY);
                    }
                }
            }
        });
        loop {
            let m = tokio::select! {
                _ = cancel.cancelled() => return,
                m = rx.recv() => match m { Some(m) => m, None => return },
            };
            let (t, payload) = match &topic {
                Some(t) => (t.clone(), m.json()),
                None => (
                    format!("$ke/events/device/{}/{}/data/update", m.namespace, m.device),
                    m.ke_data(),
                ),
            };
            // rumqttc queues the publish; it goes out when the connection is up.
            match client.try_publish(t, qos, retained, payload) {
                Ok(()) => metrics.pushes.fetch_add(1, Ordering::Relaxed),
                Err(_) => metrics.push_errors.fetch_add(1, Ordering::Relaxed),
            };
        }
    }

    fn uuid_like() -> String {
        format!(
            "{:x}",
            super::super::device::now_ms() ^ u64::from(std::process::id())
        )
    }
}

#[cfg(feature = "http")]
mod http {
    use super::*;

    pub(super) async fn run(
        url: String,
        timeout: Duration,
        mut rx: mpsc::Receiver<Message>,
        metrics: Arc<Metrics>,
        cancel: CancellationToken,
    ) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(true)
            .build()
            .into();
        let mut backoff = FIRST_RETRY;
        loop {
            let m = tokio::select! {
                _ = cancel.cancelled() => return,
                m = rx.recv() => match m { Some(m) => m, None => return },
            };
            let body = m.json();
            // Retried with backoff until it goes through or newer values fill the queue.
            loop {
                let (agent2, url2, body2) = (agent.clone(), url.clone(), body.clone());
                let r = tokio::task::spawn_blocking(move || {
                    agent2
                        .post(&url2)
                        .header("content-type", "application/json")
                        .send(&body2[..])
                        .map(|_| ())
                })
                .await;
                match r {
                    Ok(Ok(())) => {
                        metrics.pushes.fetch_add(1, Ordering::Relaxed);
                        backoff = FIRST_RETRY;
                        break;
                    }
                    Ok(Err(e)) => {
                        metrics.push_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(url = %url, error = %e, retry_in = ?backoff, "HTTP push failed");
                    }
                    Err(_) => return,
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_RETRY);
                if rx.capacity() == 0 {
                    // The queue is full of newer values: this one is dropped.
                    break;
                }
            }
        }
    }
}
