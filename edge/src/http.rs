//! The local HTTP API (127.0.0.1 by default): health, Prometheus metrics, devices, twins, and
//! setting desired values.
//!
//! | method and path | |
//! |---|---|
//! | `GET /healthz` | `ok`, or `degraded: ...` while the twin store refuses writes (a full disk) or the manifests directory cannot be read |
//! | `GET /readyz` | `ok`, or 503 while starting (`starting: ...`) or while the twin store refuses writes |
//! | `GET /metrics` | Prometheus text |
//! | `GET /api/v1/devices` | every device: id, state, versions |
//! | `GET /api/v1/devices/{ns}/{name}` | the twin document |
//! | `PUT /api/v1/devices/{ns}/{name}/desired` | body `{"prop": "value", ...}`; optional `?ifVersion=N` (409 when the desired version moved on) |
//! | `GET /api/v1/devices/{ns}/{name}/properties/{p}/history` | the property's reported values over time: `?from=&to=` (ms since the epoch, or `-24h`, `-7d`, `now`; the last hour by default), `?step=` (`1m`, `1h`, `30s` or ms: a bucket per step with min, max, mean, last, count; none: each point), `?format=csv` (or `Accept: text/csv`); property `$state` is the device's state |
//! | `GET /api/v1/alarms` | every alarm (`api::alarm`): device, rule, severity, status (active or cleared, acknowledged or not, or a rule that cannot be evaluated and why), with the counts `active` and `unacknowledged` |
//! | `POST /api/v1/devices/{ns}/{name}/alarms/{rule}/acknowledge` | body `{"by": "name"}` or none; 404 for no such rule, 409 when there is nothing to acknowledge or it already was |
//! | `GET /api/v1/mappers` | registered mappers and their devices |
//! | `GET /api/v1/pods` | edged's pods: phase, containers, refused manifests |
//! | `GET /api/v1/pods/{ns}/{name}/log` | a container's log as text; `?container=`, `?previous=true`, `?tailLines=N` |
//! | `GET /api/v1/status` | the node's name, the twin store's health, the outbox length and its oldest change's age, the cloud link (`none`, `connected`, `cut`) and its queues |
//! | `GET /api/v1/events` | server-sent events: every change of a twin as it is stored (`device`, with the alarms it tells), or `resync` when this reader fell behind; `?devices=ns/a,ns/b` sends the values of those devices only (every device's state still) |
//! | `GET /ui` | the gateway's web page (no token needed to load it; it asks for the token the API needs) |

use crate::dmi::mappers::Mappers;
use crate::metrics::Metrics;
use api::paths::DeviceId;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio_util::sync::CancellationToken;
use twin::TwinService;
use twin::engine::TwinError;
use twin::service::{Op, ServiceError};

#[derive(Clone)]
pub(crate) struct ApiState {
    pub twin: TwinService,
    pub metrics: Arc<Metrics>,
    /// The mapper manager, once the DMI module has started (after the manifests).
    pub mappers: Arc<std::sync::OnceLock<Mappers>>,
    /// Every module has started (`/readyz` says `starting` until then).
    pub started: Arc<std::sync::atomic::AtomicBool>,
    /// edged's pods, when edged runs.
    pub pods: Option<edged::Pods>,
    /// Where edged's runtime writes container logs (`edged.podLogDir`), when edged runs.
    pub pod_log_dir: Option<std::path::PathBuf>,
    /// The token requests must carry (`http.tokenFile`), if any.
    pub token: Option<Arc<str>>,
    /// Without a token: the `Host` names answered besides IP addresses and `localhost`
    /// ([`rt::host::served_names`]).
    pub hosts: Arc<[String]>,
    /// The node's name.
    pub node: Arc<str>,
    /// Whether edgecore is joined to a cloud (`cloud:` in its config).
    pub cloud: bool,
    /// The twin's changes for `GET /api/v1/events`.
    pub events: Feed,
    /// The devices' alarms.
    pub alarms: crate::alarms::Alarms,
    /// edgecore stops: the event streams end at once, so that a page left open does not hold
    /// the shutdown.
    pub stop: CancellationToken,
}

/// Refuses (401) a request without the API's token, when it has one; without one, refuses
/// (403) a request whose `Host` is not one the API serves ([`rt::host::served`]).
async fn require_token(
    State(s): State<ApiState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if s.token.is_none() {
        let host = rt::host::of_request(&req);
        if !rt::host::served(host, &s.hosts) {
            return error(
                StatusCode::FORBIDDEN,
                format!(
                    "the Host {host:?} is not one this API answers without a token (IP addresses, localhost, this host name, http.hosts): add it to http.hosts, or set http.tokenFile"
                ),
            );
        }
    }
    if let Some(token) = &s.token {
        let given = rt::secret::bearer(req.headers().get(axum::http::header::AUTHORIZATION));
        let same = rt::secret::same(given.as_bytes(), token.as_bytes());
        if !same {
            return (
                StatusCode::UNAUTHORIZED,
                Json(serde_json::json!({"error": "this API requires its token: Authorization: Bearer TOKEN (kectl: KECTL_TOKEN)"})),
            )
                .into_response();
        }
    }
    next.run(req).await
}

/// `GET /api/v1/pods/{ns}/{name}/log` query, named as the Kubernetes API names them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogQuery {
    container: Option<String>,
    #[serde(default)]
    previous: bool,
    tail_lines: Option<usize>,
}

/// A container's log as text (`kectl logs`); errors as JSON naming what is missing.
async fn pod_log(
    State(s): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<LogQuery>,
) -> Response {
    s.metrics.http_requests.fetch_add(1, Ordering::Relaxed);
    let Some(root) = s.pod_log_dir.clone() else {
        return error(
            StatusCode::NOT_FOUND,
            "edged is not enabled (no edged section in the config)",
        );
    };
    // The running pod's own directory; older pods of that name keep theirs beside it.
    let uid = s.pods.as_ref().and_then(|p| p.uid(&ns, &name));
    let options = edged::logs::Options {
        container: q.container,
        previous: q.previous,
        tail: q.tail_lines,
        ..Default::default()
    };
    // Read on a blocking thread and sent as it is read (two pieces waiting at most): a large
    // log is never whole in memory. An error that finds nothing to read is the answer's status.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, (u16, String)>>(2);
    tokio::task::spawn_blocking(move || {
        let pieces = tx.clone();
        let r = edged::logs::open_with(&root, &ns, &name, uid.as_deref(), &options, &mut |t| {
            pieces.blocking_send(Ok(t)).is_ok()
        });
        if let Err(e) = r {
            let _ = tx.blocking_send(Err(e));
        }
    });
    let first = rx.recv().await;
    let first = match first {
        Some(Err((code, msg))) => {
            return error(
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                msg,
            );
        }
        other => other,
    };
    let body = futures_util::stream::unfold((first, rx), |(next, mut rx)| async move {
        let item = match next {
            Some(Ok(t)) => Ok::<_, std::io::Error>(axum::body::Bytes::from(t)),
            Some(Err((_, msg))) => Err(std::io::Error::other(msg)),
            None => return None,
        };
        let after = rx.recv().await;
        Some((item, (after, rx)))
    });
    (
        [("content-type", "text/plain; charset=utf-8")],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// edged's pods: phase, containers (state, reason, restarts) and refused manifests.
async fn pods(State(s): State<ApiState>) -> Response {
    match &s.pods {
        Some(p) => Json(p.list()).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            "edged is not enabled (no edged section in the config)",
        ),
    }
}

fn error(code: StatusCode, message: impl Into<String>) -> Response {
    (code, Json(json!({"error": message.into()}))).into_response()
}

fn service_error(e: ServiceError) -> Response {
    let code = StatusCode::from_u16(e.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    error(code, e.to_string())
}

/// Alive: `ok`, or `degraded: ...` while the twin store refuses writes (reads still work, and a
/// restart would not free the disk).
async fn healthz(State(s): State<ApiState>) -> String {
    let mut problems = Vec::new();
    if let Some(reason) = s.twin.stats().degraded() {
        problems.push(format!("the twin store refuses writes: {reason}"));
    }
    if let Some(reason) = s.metrics.manifests_error() {
        problems.push(format!("{reason}; the last good set of devices is kept"));
    }
    if problems.is_empty() {
        "ok".into()
    } else {
        format!("degraded: {}", problems.join("; "))
    }
}

/// Ready to take writes: 200 `ok`, or 503 while the twin store refuses them.
async fn readyz(State(s): State<ApiState>) -> Response {
    if !s.started.load(Ordering::Acquire) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "starting: the stored twins are served; the manifests and the mappers' socket are not ready yet",
        )
            .into_response();
    }
    match s.twin.stats().degraded() {
        None => "ok".into_response(),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("degraded: the twin store refuses writes: {reason}"),
        )
            .into_response(),
    }
}

pub(crate) fn router(state: ApiState) -> Router {
    let open = Router::new()
        .route("/ui", get(crate::ui::page))
        .route("/ui/", get(crate::ui::page))
        .route("/ui/{file}", get(crate::ui::page))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz));
    Router::new()
        .route("/metrics", get(metrics))
        .route("/api/v1/devices", get(list))
        .route("/api/v1/pods", get(pods))
        .route("/api/v1/pods/{ns}/{name}/log", get(pod_log))
        .route("/api/v1/devices/{ns}/{name}", get(get_twin))
        .route(
            "/api/v1/devices/{ns}/{name}/desired",
            axum::routing::put(set_desired),
        )
        .route(
            "/api/v1/devices/{ns}/{name}/properties/{property}/history",
            get(history),
        )
        .route("/api/v1/alarms", get(alarms))
        .route(
            "/api/v1/devices/{ns}/{name}/alarms/{rule}/acknowledge",
            axum::routing::post(acknowledge),
        )
        .route("/api/v1/mappers", get(mappers))
        .route("/api/v1/status", get(status))
        .route("/api/v1/events", get(events))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_token,
        ))
        .merge(open)
        .with_state(state)
}

/// The node, the twin store's health and what waits for the cloud.
async fn status(State(s): State<ApiState>) -> Response {
    s.metrics.http_requests.fetch_add(1, Ordering::Relaxed);
    let outbox = s.twin.store().outbox_stats().await.ok();
    let m = &s.metrics;
    Json(json!({
        "node": &*s.node,
        "version": env!("CARGO_PKG_VERSION"),
        "store": match s.twin.stats().degraded() {
            None => "ok".to_string(),
            Some(reason) => format!("degraded: {reason}"),
        },
        "outbox": outbox.map(|o| o.0),
        // How old the oldest change waiting for the cloud is: a link that does not drain
        // shows here first.
        "outboxOldestSeconds": outbox.map(|o| o.1.map_or(0, crate::metrics::outbox_age_seconds)),
        "link": {
            "queued": m.cloud_queued.load(Ordering::Relaxed),
            "inFlight": m.cloud_in_flight.load(Ordering::Relaxed),
            "oldestInFlightMs": m.cloud_oldest_in_flight_ms.load(Ordering::Relaxed),
            "resent": m.cloud_resent.load(Ordering::Relaxed),
            "silentSessions": m.cloud_silent.load(Ordering::Relaxed),
        },
        "cloud": if !s.cloud {
            "none"
        } else if s.metrics.cloud_connected.load(Ordering::Relaxed) == 1 {
            "connected"
        } else {
            "cut"
        },
        // The cloudcore (replica) of the session, or of the last one.
        "cloudServer": s.metrics.cloud_server.lock().map(|g| g.clone()).unwrap_or_default(),
    }))
    .into_response()
}

/// Every alarm (most severe first, then newest), each with its device and status, and the
/// counts a header shows.
async fn alarms(State(s): State<ApiState>) -> Response {
    s.metrics.http_requests.fetch_add(1, Ordering::Relaxed);
    let all = s.alarms.list().await;
    let active = all.iter().filter(|(_, a)| a.active).count();
    let unacknowledged = all
        .iter()
        .filter(|(_, a)| a.error.is_none() && a.acked_at.is_none())
        .count();
    let items: Vec<serde_json::Value> =
        all.into_iter().map(|(id, a)| alarm_view(&id, &a)).collect();
    Json(json!({"items": items, "active": active, "unacknowledged": unacknowledged}))
        .into_response()
}

/// An alarm as the API shows it: with its device and status.
fn alarm_view(id: &DeviceId, a: &api::alarm::Alarm) -> serde_json::Value {
    let mut v = serde_json::to_value(a).unwrap_or_default();
    v["device"] = json!(id.to_string());
    v["status"] = json!(a.status());
    v
}

/// Who acknowledges, as the body may say (`{"by": "name"}`).
#[derive(Deserialize, Default)]
struct Acknowledging {
    #[serde(default)]
    by: Option<String>,
}

/// The holder of the API's token acknowledges an alarm: `{"by": "name"}` (optional) names
/// them in the record, which says it was done on the gateway.
async fn acknowledge(
    State(s): State<ApiState>,
    Path((ns, name, rule)): Path<(String, String, String)>,
    body: axum::body::Bytes,
) -> Response {
    s.metrics.http_requests.fetch_add(1, Ordering::Relaxed);
    let who: Acknowledging = if body.is_empty() {
        Acknowledging::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(w) => w,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("the body must be {{\"by\": \"name\"}} or empty: {e}"),
                );
            }
        }
    };
    let by = match who.by.as_deref().map(str::trim).filter(|b| !b.is_empty()) {
        Some(b) => format!("{b} (on the gateway)"),
        None => "the gateway's operator".to_string(),
    };
    let id = DeviceId::new(ns, name);
    match s.alarms.acknowledge(&id, &rule, &by).await {
        Ok(a) => Json(alarm_view(&id, &a)).into_response(),
        Err(e @ crate::alarms::AckError::NoRule(..)) => error(StatusCode::NOT_FOUND, e.to_string()),
        Err(e) => error(StatusCode::CONFLICT, e.to_string()),
    }
}

/// The devices a reader of the event stream follows the values of (`?devices=ns/a,ns/b`).
#[derive(Deserialize)]
struct Following {
    devices: Option<String>,
}

/// Devices one event stream may name: a page follows those on its screen (a page of the list and
/// the open device), far fewer.
const MAX_FOLLOWED: usize = 1000;

/// Each twin change as it is stored: `event: device`, data `{"id", "removed", "row", "properties"}`
/// (the device row when it changed; each changed property as the twin document shows it, `null`
/// when it was removed). With `?devices=`, the properties of the devices named only: another
/// device's change comes with its row alone (its state), and not at all when only its values
/// moved, so that a page pays for what it shows. A reader that falls behind the twin's event
/// queue gets `event: resync` (read everything again) instead of what it missed; nothing waits
/// for a slow reader.
async fn events(State(s): State<ApiState>, Query(q): Query<Following>) -> Response {
    use axum::response::sse::{Event, KeepAlive, Sse};
    use tokio::sync::broadcast::error::RecvError;
    s.metrics.http_requests.fetch_add(1, Ordering::Relaxed);
    let followed: Option<std::collections::HashSet<String>> = q.devices.map(|d| {
        d.split(',')
            .filter(|x| !x.is_empty())
            .map(str::to_string)
            .collect()
    });
    if followed.as_ref().is_some_and(|f| f.len() > MAX_FOLLOWED) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("devices: at most {MAX_FOLLOWED} devices in one event stream"),
        );
    }
    let rx = s.events.subscribe();
    let stream = futures_util::stream::unfold(rx, move |mut rx| {
        let followed = followed.clone();
        async move {
            loop {
                let data = match rx.recv().await {
                    Ok(Some(change)) => match &followed {
                        Some(f) if !f.contains(&*change.id) => match &change.row_only {
                            Some(row) => row.clone(),
                            None => continue,
                        },
                        _ => change.whole.clone(),
                    },
                    Ok(None) | Err(RecvError::Lagged(_)) => {
                        let e = Event::default().event("resync").data("{}");
                        return Some((Ok::<_, std::convert::Infallible>(e), rx));
                    }
                    Err(RecvError::Closed) => return None,
                };
                let e = Event::default().event("device").data(&*data);
                return Some((Ok(e), rx));
            }
        }
    });
    let stream = futures_util::StreamExt::take_until(stream, s.stop.clone().cancelled_owned());
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// One stored twin change as the event stream sends it: whole, and (when the device's row
/// changed) as its row alone, for the readers that do not follow the device's values.
pub(crate) struct Change {
    id: Box<str>,
    whole: Arc<str>,
    row_only: Option<Arc<str>>,
}

/// Each stored twin change as the event stream's data, made once for all its readers (and not
/// at all while there are none); `None` when the feed fell behind the twin's events (its
/// readers read everything again).
pub(crate) type Feed = tokio::sync::broadcast::Sender<Option<Arc<Change>>>;

/// The feed of `twin`'s changes, until `cancel`.
pub(crate) fn event_feed(twin: &TwinService, cancel: CancellationToken) -> Feed {
    use tokio::sync::broadcast::error::RecvError;
    let (feed, _) = tokio::sync::broadcast::channel(1024);
    let mut rx = twin.subscribe();
    let out = feed.clone();
    tokio::spawn(async move {
        // Each device's state (and its reason) as last sent: a row whose versions alone moved
        // (a new value) is no news to a reader that does not follow the device.
        let mut states: std::collections::HashMap<String, (String, String)> = Default::default();
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => return,
                r = rx.recv() => r,
            };
            let data = match next {
                Ok(applied) if out.receiver_count() > 0 => {
                    match event_change(&applied, &mut states) {
                        Some(d) => Some(Arc::new(d)),
                        None => continue,
                    }
                }
                Ok(_) => continue,
                Err(RecvError::Lagged(_)) => None,
                Err(RecvError::Closed) => return,
            };
            let _ = out.send(data);
        }
    });
    feed
}

/// A change as [`Change`]: its data whole and, when the device came, went, or changed its state
/// (`states` holds each one's last), its row alone.
fn event_change(
    applied: &twin::engine::Applied,
    states: &mut std::collections::HashMap<String, (String, String)>,
) -> Option<Change> {
    let whole = event_data(applied)?;
    let id = applied.device.as_ref()?.to_string();
    let moved = if applied.removed {
        states.remove(&id);
        true
    } else if let Some(row) = &applied.row {
        let now = (row.state.clone(), row.state_reason.clone());
        states.insert(id.clone(), now.clone()) != Some(now)
    } else {
        false
    };
    // A device made, moved to another state or removed, or an alarm of it: every reader
    // hears of it.
    let alarms = alarms_of(applied);
    let row_only = (moved || !alarms.is_empty()).then(|| {
        Arc::from(
            json!({"id": id, "removed": applied.removed, "row": applied.row, "properties": {},
                "alarms": alarms})
            .to_string(),
        )
    });
    Some(Change {
        id: id.into(),
        whole: Arc::from(whole),
        row_only,
    })
}

/// The event stream's data of one change: `{"id", "removed", "row", "properties"}`.
fn event_data(applied: &twin::engine::Applied) -> Option<String> {
    let id = applied.device.as_ref()?;
    if applied.is_noop() {
        return None;
    }
    let now = twin::now_millis();
    let stale = applied
        .row
        .as_ref()
        .is_some_and(|r| matches!(r.state.as_str(), "unknown" | "offline"));
    let properties: serde_json::Map<String, serde_json::Value> = applied
        .changes
        .iter()
        .map(|c| {
            let v = c
                .current
                .as_ref()
                .map(|p| property_view(p, stale, now))
                .unwrap_or(serde_json::Value::Null);
            (c.name.clone(), v)
        })
        .collect();
    Some(
        json!({
            "id": id.to_string(),
            "removed": applied.removed,
            "row": applied.row,
            "properties": properties,
            "alarms": alarms_of(applied),
        })
        .to_string(),
    )
}

/// The alarms a change tells, as the API shows them.
fn alarms_of(applied: &twin::engine::Applied) -> Vec<serde_json::Value> {
    let Some(id) = &applied.device else {
        return Vec::new();
    };
    applied
        .outbox
        .iter()
        .filter(|e| e.section == twin::model::Section::Alarm)
        .filter_map(|e| serde_json::from_str::<api::alarm::Alarm>(&e.value).ok())
        .map(|a| alarm_view(id, &a))
        .collect()
}

async fn metrics(State(s): State<ApiState>) -> Response {
    s.metrics.http_requests.fetch_add(1, Ordering::Relaxed);
    let outbox = s.twin.store().outbox_stats().await.ok();
    (
        [("content-type", rt::metrics::CONTENT_TYPE)],
        s.metrics.render(
            s.twin.stats(),
            outbox,
            s.twin.store().history().map(|h| &h.stats),
        ),
    )
        .into_response()
}

#[derive(Debug, Default, Deserialize)]
struct ListQuery {
    /// `true`: each row also carries `values`, its reported values in short.
    #[serde(default)]
    values: bool,
}

/// `GET /api/v1/devices[?values=true]`: one row per device; with `values`, each row also has
/// `values: {property: {value, unit?, stale?, error?}}` (its reported values, marked stale as
/// the twin document marks them, and the last read's error).
async fn list(State(s): State<ApiState>, Query(q): Query<ListQuery>) -> Response {
    s.metrics.http_requests.fetch_add(1, Ordering::Relaxed);
    if !q.values {
        return match s.twin.list().await {
            Ok(rows) => Json(rows).into_response(),
            Err(e) => service_error(e),
        };
    }
    let twins = match s.twin.all().await {
        Ok(t) => t,
        Err(e) => return service_error(e),
    };
    let now = twin::now_millis();
    let rows: Vec<serde_json::Value> = twins
        .iter()
        .map(|t| {
            let mut row = serde_json::to_value(&t.row).unwrap_or_default();
            let values: serde_json::Map<String, serde_json::Value> = t
                .properties
                .iter()
                .filter_map(|(name, p)| {
                    let r = p.reported.as_ref()?;
                    let mut v = json!({"value": r.value});
                    if let Some(unit) = p.unit.as_deref().filter(|u| !u.is_empty()) {
                        v["unit"] = unit.into();
                    }
                    if p.stale_age(t.values_stale(), now).is_some() {
                        v["stale"] = true.into();
                    }
                    if let Some(e) = &p.error {
                        v["error"] = e.value.clone().into();
                    }
                    Some((name.clone(), v))
                })
                .collect();
            row["values"] = values.into();
            row
        })
        .collect();
    Json(rows).into_response()
}

async fn get_twin(State(s): State<ApiState>, Path((ns, name)): Path<(String, String)>) -> Response {
    s.metrics.http_requests.fetch_add(1, Ordering::Relaxed);
    twin_response(&s, &DeviceId::new(ns, name)).await
}

#[derive(Debug, Default, Deserialize)]
struct HistoryQuery {
    from: Option<String>,
    to: Option<String>,
    step: Option<String>,
    format: Option<String>,
}

/// A property's history (see the table above).
async fn history(
    State(s): State<ApiState>,
    Path((ns, name, property)): Path<(String, String, String)>,
    Query(q): Query<HistoryQuery>,
    headers: axum::http::HeaderMap,
) -> Response {
    s.metrics.http_requests.fetch_add(1, Ordering::Relaxed);
    let series = match history_series(&s.twin, &DeviceId::new(ns, name), &property, &q).await {
        Ok(series) => series,
        Err((code, message)) => {
            return error(
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                message,
            );
        }
    };
    let csv = q.format.as_deref() == Some("csv")
        || headers
            .get(axum::http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/csv"));
    if csv {
        return (
            [(axum::http::header::CONTENT_TYPE, "text/csv; charset=utf-8")],
            series_csv(&series),
        )
            .into_response();
    }
    Json(series).into_response()
}

/// A series as CSV with a header: `t,value` without a step, `t,min,max,mean,last,count` with
/// one (`t` in ms since the epoch).
fn series_csv(series: &twin::history::Series) -> String {
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => csv_field(s),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    };
    let num = |n: Option<f64>| n.map(|n| n.to_string()).unwrap_or_default();
    let mut out = String::new();
    match series.step {
        None => {
            out.push_str("t,value\n");
            for p in &series.points {
                out.push_str(&format!("{},{}\n", p.t, text(&p.value)));
            }
        }
        Some(_) => {
            out.push_str("t,min,max,mean,last,count\n");
            for b in &series.buckets {
                out.push_str(&format!(
                    "{},{},{},{},{},{}\n",
                    b.t,
                    num(b.min),
                    num(b.max),
                    num(b.mean()),
                    text(&b.last),
                    b.count
                ));
            }
        }
    }
    out
}

/// A CSV field: quoted when it holds a comma, a quote or a line break (quotes doubled), and a
/// leading `= + - @` neutralized so that a spreadsheet does not run it as a formula.
fn csv_field(s: &str) -> String {
    let s = if s.starts_with(['=', '+', '-', '@']) && s.parse::<f64>().is_err() {
        format!("'{s}")
    } else {
        s.to_string()
    };
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

/// A property's history as `GET .../properties/{p}/history` answers it, or the status and
/// message of why not.
async fn history_series(
    twin: &TwinService,
    id: &DeviceId,
    property: &str,
    q: &HistoryQuery,
) -> Result<twin::history::Series, (u16, String)> {
    let now = twin::now_millis();
    let query =
        twin::history::Query::parse(q.from.as_deref(), q.to.as_deref(), q.step.as_deref(), now)
            .map_err(|e| (400, e.to_string()))?;
    twin.history(id, property, query, now)
        .await
        .map_err(|e| (e.code(), e.to_string()))
}

/// The twin document of a device, or 404.
async fn twin_response(s: &ApiState, id: &DeviceId) -> Response {
    match s.twin.get(id).await {
        Ok(Some(t)) => Json(twin_view(&t, twin::now_millis())).into_response(),
        Ok(None) => service_error(TwinError::UnknownDevice(id.clone()).into()),
        Err(e) => service_error(e),
    }
}

/// The twin document as the API shows it. A property whose last read failed carries
/// `"error": {"message", "timestamp", "kind": "read"}`, one whose desired value was refused
/// `"writeError": {"message", "timestamp", "kind": "write", "desired"}` (and `"error"` the same
/// when its read did not fail); its reported value, and every reported value while the
/// device is `unknown` or `offline`, carries `"stale": true` and its age in milliseconds
/// (`ageMs`): it is the last value read, not a live one.
pub(crate) fn twin_view(t: &twin::DeviceTwin, now: twin::model::Millis) -> serde_json::Value {
    let mut v = serde_json::to_value(t).unwrap_or_default();
    let device_stale = t.values_stale();
    for (name, p) in &t.properties {
        if let Some(view) = v.get_mut("properties").and_then(|ps| ps.get_mut(name)) {
            *view = property_view(p, device_stale, now);
        }
    }
    v
}

/// One property as the twin document shows it (see [`twin_view`]).
pub(crate) fn property_view(
    p: &twin::PropertyTwin,
    device_stale: bool,
    now: twin::model::Millis,
) -> serde_json::Value {
    let mut v = serde_json::to_value(p).unwrap_or_default();
    let Some(view) = v.as_object_mut() else {
        return v;
    };
    view.remove("writeError");
    view.remove("error");
    for (k, e) in p.error_fields() {
        view.insert(k.into(), e);
    }
    if let Some(age) = p.stale_age(device_stale, now)
        && let Some(serde_json::Value::Object(reported)) = view.get_mut("reported")
    {
        reported.insert("stale".into(), true.into());
        reported.insert("ageMs".into(), age.into());
    }
    // When it was last read: `timestamp` is when the value last changed.
    if let Some(read) = p.last_read.0
        && let Some(serde_json::Value::Object(reported)) = view.get_mut("reported")
    {
        reported.insert("lastRead".into(), read.into());
    }
    v
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct IfVersion {
    if_version: Option<u64>,
}

async fn set_desired(
    State(s): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<IfVersion>,
    body: axum::body::Bytes,
) -> Response {
    s.metrics.http_requests.fetch_add(1, Ordering::Relaxed);
    let values: BTreeMap<String, serde_json::Value> = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("body must be a JSON object of property names to values: {e}"),
            );
        }
    };
    let mut pairs = Vec::with_capacity(values.len());
    for (k, v) in values {
        let v = match v {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            other => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("value of {k:?} must be a string, number or boolean, not {other}"),
                );
            }
        };
        pairs.push((k, v));
    }
    if pairs.is_empty() {
        return error(StatusCode::BAD_REQUEST, "no property given");
    }
    let id = DeviceId::new(ns, name);
    let op = Op::EdgeDesired {
        id: id.clone(),
        values: pairs,
        if_version: q.if_version,
    };
    if let Err(e) = s.twin.apply(op).await {
        return service_error(e);
    }
    twin_response(&s, &id).await
}

async fn mappers(State(s): State<ApiState>) -> Response {
    s.metrics.http_requests.fetch_add(1, Ordering::Relaxed);
    match s.mappers.get() {
        Some(m) => Json(m.list().await).into_response(),
        None => Json(Vec::<()>::new()).into_response(),
    }
}

/// Serves the API on `listener` until `cancel`, at most `max_connections` at once.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    max_connections: usize,
    state: ApiState,
    cancel: CancellationToken,
) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, max_connections, "HTTP API listening");
    }
    let mut listener = crate::listeners::LimitedTcp::new(listener, max_connections);
    let app = router(state);
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let (io, peer) = tokio::select! {
            _ = cancel.cancelled() => break,
            a = axum::serve::Listener::accept(&mut listener) => a,
        };
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        let stop = cancel.clone();
        // Each request's headers must arrive within rt::http::HEADER_TIMEOUT: a client that
        // trickles them does not keep one of the `max_connections`.
        conns.spawn(async move {
            if let Err(e) = rt::http::serve_connection(io, svc, stop, false).await {
                tracing::debug!(%peer, error = %e, "HTTP connection ended with an error");
            }
        });
        while conns.try_join_next().is_some() {}
    }
    while conns.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_are_quoted_and_formulas_neutralized() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("=cmd()"), "'=cmd()");
        assert_eq!(csv_field("-12.5"), "-12.5");
    }
}
