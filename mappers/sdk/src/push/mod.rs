//! Push targets from a property's `pushMethod`: MQTT over one persistent connection per broker
//! (feature `mqtt`) and HTTP POST of JSON (feature `http`). A value is handed to the target's
//! queue without waiting; a target that fails is retried with backoff by its own task, and while
//! its queue is full new values are dropped and counted, so pushing never blocks reads.
//!
//! Payload (JSON): `{"namespace","device","property","value","type","timestamp"}`, timestamp in
//! milliseconds. An MQTT push method without a topic publishes KubeEdge's device data message
//! on `$ke/events/device/{namespace}/{name}/data/update` instead.
//!
//! `pushMethod.dbMethod` and `pushMethod.otel` are further targets, each with its own task and
//! queue the same way, writing what waits in batches (up to [`BATCH`] values per write):
//! - `influxdb2` (feature `influxdb2`): InfluxDB 2's write API (`POST {url}/api/v2/write?org=&bucket=
//!   &precision=ms`, line protocol; token from the `TOKEN` environment variable), one point per
//!   value: `measurement` (default: the device name), the configured `tag`s plus `device`
//!   (`namespace/name`), field `fieldKey` (default: the property name) typed by the property
//!   (`42i`, `21.5`, `true`, `"text"`).
//! - `redis` (feature `redis`): as KubeEdge's mapper, `ZADD {device name} {timestamp ms} {JSON}`
//!   (the JSON above), pipelined; `addr`, `db`; password from `PASSWORD`.
//! - `mysql` (feature `mysql`): as KubeEdge's mapper, one table per property,
//!   `` `{namespace}/{device}/{property}` `` (`id`, `ts` DATETIME(3) UTC, `field` TEXT), created
//!   when missing; `addr`, `database`, `userName`; password from `PASSWORD`.
//! - `otel` (feature `otel`): OTLP/HTTP with the JSON encoding to `endpointURL` (a collector's
//!   `http://host:4318/v1/metrics`): a gauge per property named after it, a data point per
//!   value with the attributes `device.namespace`, `device.name`; non-numeric values are skipped
//!   (and counted as dropped).
//! - TDengine is refused with the reason: it is not built (see the README).

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
/// Values written to a database sink at once, at most.
pub const BATCH: usize = 500;
const FIRST_RETRY: Duration = Duration::from_millis(200);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// The pause between a target's retries: from [`FIRST_RETRY`] up to [`MAX_RETRY`].
fn retry_backoff() -> rt::Backoff {
    rt::Backoff::new(FIRST_RETRY, MAX_RETRY)
}

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
    /// InfluxDB 2's write API.
    Influxdb2 {
        url: String,
        org: String,
        bucket: String,
        measurement: Option<String>,
        tags: Vec<(String, String)>,
        field_key: Option<String>,
    },
    /// A Redis server, `host:port`, and its database number.
    Redis { addr: String, db: i64 },
    /// A MySQL (or MariaDB) server, `host:port`.
    Mysql {
        addr: String,
        database: String,
        user: String,
    },
    /// An OTLP/HTTP metrics endpoint.
    Otel { url: String },
}

/// Why a `pushMethod` cannot be pushed to, or a batch was not written; each names the key or
/// the target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    #[error("pushMethod.{0} is empty")]
    Empty(String),
    #[error("pushMethod.mqtt.qos {0} is not 0, 1 or 2")]
    Qos(i32),
    #[error(
        "pushMethod.dbMethod.TDEngine is not supported by this mapper (no TDengine client is \
         built; see the README)"
    )]
    TdEngine,
    #[error("{0}: this mapper is built without that push target's feature")]
    Feature(String),
    #[error("push targets poisoned")]
    Poisoned,
    /// What the target's client or server said (`target` is its kind and address).
    #[error("{target}: {message}")]
    Target { target: String, message: String },
}

impl PushError {
    #[cfg_attr(
        not(any(
            feature = "influxdb2",
            feature = "redis",
            feature = "mysql",
            feature = "otel"
        )),
        allow(dead_code)
    )]
    fn target(target: impl std::fmt::Display, message: impl std::fmt::Display) -> Self {
        Self::Target {
            target: target.to_string(),
            message: message.to_string(),
        }
    }
}

/// The value at `key`, which must be given and not blank.
fn required(v: Option<String>, key: &str) -> Result<String, PushError> {
    v.filter(|v| !v.trim().is_empty())
        .ok_or_else(|| PushError::Empty(key.into()))
}

impl Target {
    /// The targets of a `pushMethod`: its MQTT or HTTP target, its OTel endpoint and each of its
    /// databases.
    pub fn from_push_method(p: &PushMethod) -> Result<Vec<Self>, PushError> {
        let mut out = Vec::new();
        out.extend(Self::mqtt_or_http(p)?);
        if let Some(o) = &p.otel {
            let url = required(o.endpoint_url.clone(), "otel.endpointURL")?;
            out.push(Self::Otel { url });
        }
        let Some(db) = &p.db_method else {
            return Ok(out);
        };
        if let Some(i) = &db.influxdb2 {
            let c = i.influxdb2_client_config.clone().unwrap_or_default();
            let d = i.influxdb2_data_config.clone().unwrap_or_default();
            let need = |v: Option<String>, key: &str| {
                required(
                    v,
                    &format!("dbMethod.influxdb2.influxdb2ClientConfig.{key}"),
                )
            };
            out.push(Self::Influxdb2 {
                url: need(c.url, "url")?.trim_end_matches('/').to_string(),
                org: need(c.org, "org")?,
                bucket: need(c.bucket, "bucket")?,
                measurement: d.measurement.filter(|m| !m.is_empty()),
                tags: d.tag.unwrap_or_default().into_iter().collect(),
                field_key: d.field_key.filter(|f| !f.is_empty()),
            });
        }
        if let Some(r) = &db.redis {
            let c = r.redis_client_config.clone().unwrap_or_default();
            let addr = required(c.addr, "dbMethod.redis.redisClientConfig.addr")?;
            out.push(Self::Redis {
                addr,
                db: i64::from(c.db.unwrap_or(0)),
            });
        }
        if let Some(m) = &db.mysql {
            let c = m.mysql_client_config.clone().unwrap_or_default();
            let need = |v: Option<String>, key: &str| {
                required(v, &format!("dbMethod.mysql.mysqlClientConfig.{key}"))
            };
            out.push(Self::Mysql {
                addr: need(c.addr, "addr")?,
                database: need(c.database, "database")?,
                user: need(c.user_name, "userName")?,
            });
        }
        if db.tdengine.is_some() {
            return Err(PushError::TdEngine);
        }
        Ok(out)
    }

    /// A name for logs: the target's kind and address (no secrets).
    pub fn describe(&self) -> String {
        match self {
            Self::Mqtt { address, .. } => format!("mqtt {address}"),
            Self::Http { url, .. } => format!("http {url}"),
            Self::Influxdb2 { url, bucket, .. } => format!("influxdb2 {url} bucket {bucket}"),
            Self::Redis { addr, db } => format!("redis {addr} db {db}"),
            Self::Mysql { addr, database, .. } => format!("mysql {addr}/{database}"),
            Self::Otel { url } => format!("otel {url}"),
        }
    }

    fn mqtt_or_http(p: &PushMethod) -> Result<Option<Self>, PushError> {
        if let Some(m) = &p.mqtt {
            let address = required(m.address.clone(), "mqtt.address")?;
            let qos = m.qos.unwrap_or(0);
            if !(0..=2).contains(&qos) {
                return Err(PushError::Qos(qos));
            }
            return Ok(Some(Self::Mqtt {
                address,
                topic: m.topic.clone().filter(|t| !t.is_empty()),
                qos: qos as u8,
                retained: m.retained.unwrap_or(false),
            }));
        }
        if let Some(h) = &p.http {
            let host = required(h.host_name.clone(), "http.hostName")?;
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
            self.metrics.push_dropped.fetch_add(1, Ordering::Relaxed);
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
    pub fn get(&self, target: Target) -> Result<Arc<Pusher>, PushError> {
        let mut targets = self.targets.lock().map_err(|_| PushError::Poisoned)?;
        if let Some(p) = targets.get(&target) {
            return Ok(p.clone());
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let metrics = self.metrics.clone();
        let cancel = self.cancel.clone();
        #[allow(unreachable_patterns)]
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
                    return Err(PushError::Feature(target.describe()));
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
                    return Err(PushError::Feature(target.describe()));
                }
            }
            #[cfg(feature = "influxdb2")]
            Target::Influxdb2 { .. } => {
                let sink = influxdb2::Sink::new(&target)?;
                tokio::spawn(run_sink(
                    target.describe(),
                    sink,
                    rx,
                    metrics.clone(),
                    cancel,
                ));
            }
            #[cfg(feature = "redis")]
            Target::Redis { addr, db } => {
                let sink = redis_sink::Sink::new(addr, *db)?;
                tokio::spawn(run_sink(
                    target.describe(),
                    sink,
                    rx,
                    metrics.clone(),
                    cancel,
                ));
            }
            #[cfg(feature = "mysql")]
            Target::Mysql {
                addr,
                database,
                user,
            } => {
                let sink = mysql::Sink::new(addr, database, user);
                tokio::spawn(run_sink(
                    target.describe(),
                    sink,
                    rx,
                    metrics.clone(),
                    cancel,
                ));
            }
            #[cfg(feature = "otel")]
            Target::Otel { url } => {
                let sink = otel::Sink::new(url, metrics.clone());
                tokio::spawn(run_sink(
                    target.describe(),
                    sink,
                    rx,
                    metrics.clone(),
                    cancel,
                ));
            }
            other => {
                let _ = (rx, cancel);
                return Err(PushError::Feature(other.describe()));
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
mod mqtt;

#[cfg(feature = "http")]
mod http;

/// A database or OTel sink: writes a batch of values, all or nothing.
#[cfg(any(
    feature = "influxdb2",
    feature = "redis",
    feature = "mysql",
    feature = "otel"
))]
trait Sink: Send + 'static {
    fn write<'a>(
        &'a mut self,
        batch: &'a [Message],
    ) -> impl std::future::Future<Output = Result<(), PushError>> + Send + 'a;
}

/// Feeds a sink from its queue: what waits is written in batches of up to [`BATCH`]; a failed
/// batch is retried with backoff while newer values wait in the queue (and are dropped, counted,
/// when it is full), so a sink that is down never holds up reads.
#[cfg(any(
    feature = "influxdb2",
    feature = "redis",
    feature = "mysql",
    feature = "otel"
))]
async fn run_sink<S: Sink>(
    name: String,
    mut sink: S,
    mut rx: mpsc::Receiver<Message>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let mut backoff = retry_backoff();
    let mut failing = false;
    loop {
        let first = tokio::select! {
            _ = cancel.cancelled() => return,
            m = rx.recv() => match m { Some(m) => m, None => return },
        };
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(m) => batch.push(m),
                Err(_) => break,
            }
        }
        loop {
            match sink.write(&batch).await {
                Ok(()) => {
                    metrics
                        .pushes
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    if std::mem::take(&mut failing) {
                        tracing::info!(target = %name, "push target writes again");
                    }
                    backoff.reset();
                    break;
                }
                Err(e) => {
                    metrics.push_errors.fetch_add(1, Ordering::Relaxed);
                    failing = true;
                    tracing::warn!(target = %name, error = %e, values = batch.len(), retry_in = ?backoff.peek(), "push failed; retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        }
    }
}

/// A value typed by its property: `Int`, `Float` or `Bool` when it reads as one, else text.
#[cfg(any(feature = "influxdb2", feature = "otel"))]
#[derive(Clone, Copy, Debug, PartialEq)]
enum Typed<'a> {
    Int(i64),
    Float(f64),
    Bool(bool),
    Text(&'a str),
}

#[cfg(any(feature = "influxdb2", feature = "otel"))]
fn typed<'a>(value: &'a str, value_type: Option<&str>) -> Typed<'a> {
    let v = value.trim();
    let ty = value_type.map(str::to_ascii_uppercase);
    match ty.as_deref() {
        Some("STRING") | Some("BYTES") => Typed::Text(value),
        Some("BOOLEAN") => match v {
            "true" | "1" => Typed::Bool(true),
            "false" | "0" => Typed::Bool(false),
            _ => Typed::Text(value),
        },
        Some("FLOAT") | Some("DOUBLE") => v
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .map_or(Typed::Text(value), Typed::Float),
        _ => {
            if let Ok(i) = v.parse::<i64>() {
                Typed::Int(i)
            } else if let Some(f) = v.parse::<f64>().ok().filter(|f| f.is_finite()) {
                Typed::Float(f)
            } else {
                Typed::Text(value)
            }
        }
    }
}

/// The HTTP client of the HTTP sinks (InfluxDB's write API, OTLP/HTTP).
#[cfg(any(feature = "influxdb2", feature = "otel"))]
fn sink_agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into()
}

/// POSTs `body` to `url` (off the runtime's threads); a status other than 2xx is an error with
/// the server's answer.
#[cfg(any(feature = "influxdb2", feature = "otel"))]
async fn post(
    agent: &ureq::Agent,
    url: &str,
    headers: Vec<(&'static str, String)>,
    body: String,
) -> Result<(), PushError> {
    let (agent, url) = (agent.clone(), url.to_string());
    tokio::task::spawn_blocking(move || {
        let mut r = agent.post(&url);
        for (k, v) in &headers {
            r = r.header(*k, v);
        }
        match r.send(body.as_bytes()) {
            Ok(resp) if resp.status().is_success() => Ok(()),
            Ok(mut resp) => {
                let status = resp.status();
                let text = resp.body_mut().read_to_string().unwrap_or_default();
                Err(PushError::target(
                    &url,
                    format_args!("HTTP {status}: {}", text.trim()),
                ))
            }
            Err(e) => Err(PushError::target(&url, e)),
        }
    })
    .await
    .map_err(|e| PushError::target("the push task", e))?
}

#[cfg(feature = "influxdb2")]
mod influxdb2;

#[cfg(feature = "redis")]
mod redis_sink;

#[cfg(feature = "mysql")]
mod mysql;

#[cfg(feature = "otel")]
mod otel;

#[cfg(all(test, feature = "influxdb2", feature = "otel"))]
mod sink_tests;
