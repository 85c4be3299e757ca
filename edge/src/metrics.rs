//! Counters of edgecore, rendered in the Prometheus text format at `/metrics` (by
//! [`rt::metrics`]).

use rt::metrics::Scrape;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Counters and gauges shared by the modules.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Why the manifests directory cannot be read, while it cannot.
    pub manifests_error: std::sync::Mutex<Option<String>>,
    pub mqtt_messages_in: AtomicU64,
    pub mqtt_messages_out: AtomicU64,
    pub mqtt_bad_payloads: AtomicU64,
    pub mqtt_connected: AtomicI64,
    pub mqtt_connection_errors: AtomicU64,
    /// 1 while edgehub holds a session with the cloud.
    pub cloud_connected: AtomicI64,
    /// The link's reports waiting for the rate, messages sent and not answered, and how long
    /// the oldest of those has waited (ms): gauges of the session now.
    pub cloud_queued: AtomicI64,
    pub cloud_in_flight: AtomicI64,
    pub cloud_oldest_in_flight_ms: AtomicI64,
    /// Frames waiting to be written to the cloud's socket.
    pub cloud_frames_to_write: AtomicI64,
    /// Reports sent again for want of an answer; sessions dropped because the cloud was
    /// silent; frames received from the cloud.
    pub cloud_resent: AtomicU64,
    pub cloud_silent: AtomicU64,
    pub cloud_frames_in: AtomicU64,
    /// The cloud server (replica) of that session.
    pub cloud_server: std::sync::Mutex<String>,
    /// QoS 0 requests dropped because the request queue was full.
    pub mqtt_requests_dropped: AtomicU64,
    /// The embedded broker's counters, when it runs.
    pub broker: std::sync::OnceLock<std::sync::Arc<crate::eventbus::broker::BrokerStats>>,
    pub events_dropped: AtomicU64,
    pub dmi_requests: AtomicU64,
    pub dmi_errors: AtomicU64,
    /// Twins of `ReportDeviceStatus` refused while the others of the same report were stored.
    pub dmi_refused_twins: AtomicU64,
    pub mappers_registered: AtomicI64,
    pub mappers_connected: AtomicI64,
    pub mapper_call_errors: AtomicU64,
    /// Mappers found unreachable (each time one goes down).
    pub mapper_failures: AtomicU64,
    /// Devices moved from one mapper to another (failover and rebalancing).
    pub mapper_device_moves: AtomicU64,
    pub manifest_errors: AtomicU64,
    pub http_requests: AtomicU64,
    /// 1 while the streaming tunnel to the cloud is open.
    pub tunnel_open: AtomicI64,
    /// Streams open through it now, streams opened, streams refused (at `maxStreams`), and the
    /// bytes all of them sent up.
    pub streams_open: AtomicI64,
    pub streams_opened: AtomicU64,
    pub streams_refused: AtomicU64,
    pub stream_bytes: AtomicU64,
}

impl Metrics {
    /// Records that the manifests directory cannot be read (`Some`), or can again.
    pub fn set_manifests_error(&self, e: Option<String>) {
        if let Ok(mut m) = self.manifests_error.lock() {
            *m = e;
        }
    }

    /// Why the manifests directory cannot be read, while it cannot.
    pub fn manifests_error(&self) -> Option<String> {
        self.manifests_error.lock().ok().and_then(|m| m.clone())
    }

    /// The Prometheus text of these counters, the twin's and the outbox depth.
    pub fn render(
        &self,
        twin: &twin::service::Stats,
        outbox: Option<(u64, Option<i64>)>,
        history: Option<&twin::history::HistoryStats>,
    ) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let gi = |a: &AtomicI64| a.load(Ordering::Relaxed);
        let mut o = Scrape::default();
        o.counter(
            "edgecore_twin_updates",
            "Twin operations that changed state, committed.",
            g(&twin.applied),
        );
        o.counter(
            "edgecore_twin_unchanged",
            "Twin operations that changed nothing and wrote nothing.",
            g(&twin.unchanged),
        );
        o.counter(
            "edgecore_twin_rejected",
            "Twin operations rejected (invalid, unknown, conflict).",
            g(&twin.rejected),
        );
        o.counter(
            "edgecore_twin_commits",
            "SQLite transactions committed.",
            g(&twin.commits),
        );
        o.counter(
            "edgecore_twin_store_errors",
            "SQLite transactions that failed.",
            g(&twin.store_errors),
        );
        o.counter(
            "edgecore_twin_writes_refused",
            "Twin writes refused without being tried while the store refused writes (a full disk).",
            g(&twin.writes_refused),
        );
        o.gauge(
            "edgecore_twin_store_degraded",
            "1 while the twin store refuses writes.",
            twin.degraded().is_some(),
        );
        o.gauge(
            "edgecore_manifests_unreadable",
            "1 while the manifests directory cannot be read (the last good set of devices is kept).",
            self.manifests_error().is_some(),
        );
        o.gauge("edgecore_devices", "Devices with a twin.", g(&twin.devices));
        if let Some(h) = history {
            o.counter(
                "edgecore_history_points",
                "Reported values written to the twins' history.",
                g(&h.written),
            );
            o.counter(
                "edgecore_history_dropped",
                "Reported values not kept in the history: a write failed or the disk was nearly full (the twins are not affected).",
                g(&h.dropped),
            );
            o.counter(
                "edgecore_history_evicted",
                "History points deleted before their window ended, to hold the history's size and free-space bounds.",
                g(&h.evicted),
            );
        }
        if let Some((depth, oldest)) = outbox {
            o.gauge(
                "edgecore_outbox_depth",
                "Changes waiting to reach the cloud.",
                depth,
            );
            o.gauge(
                "edgecore_outbox_oldest_seconds",
                "Age of the oldest change waiting to reach the cloud (0: none waits).",
                oldest.map_or(0, outbox_age_seconds),
            );
        }
        o.gauge(
            "edgecore_cloud_queued",
            "Reports waiting for the link's rate (qps).",
            gi(&self.cloud_queued),
        );
        o.gauge(
            "edgecore_cloud_in_flight",
            "Reports sent to the cloud and not answered yet.",
            gi(&self.cloud_in_flight),
        );
        o.gauge(
            "edgecore_cloud_oldest_in_flight_ms",
            "How long the oldest report in flight has waited for the cloud's answer.",
            gi(&self.cloud_oldest_in_flight_ms),
        );
        o.gauge(
            "edgecore_cloud_frames_to_write",
            "Frames waiting to be written to the cloud's socket (reports, answers, keepalives).",
            gi(&self.cloud_frames_to_write),
        );
        o.counter(
            "edgecore_cloud_resent",
            "Reports sent again because the cloud did not answer within 10 s of sending.",
            g(&self.cloud_resent),
        );
        o.counter(
            "edgecore_cloud_silent",
            "Sessions dropped because the cloud sent nothing for keepaliveSeconds.",
            g(&self.cloud_silent),
        );
        o.counter(
            "edgecore_cloud_frames_in",
            "Frames received from the cloud.",
            g(&self.cloud_frames_in),
        );
        o.counter(
            "edgecore_mqtt_messages_in",
            "MQTT messages received.",
            g(&self.mqtt_messages_in),
        );
        o.counter(
            "edgecore_mqtt_messages_out",
            "MQTT messages published.",
            g(&self.mqtt_messages_out),
        );
        o.counter(
            "edgecore_mqtt_bad_payloads",
            "MQTT requests with a malformed payload.",
            g(&self.mqtt_bad_payloads),
        );
        o.gauge(
            "edgecore_mqtt_connected",
            "1 while connected to the MQTT broker.",
            gi(&self.mqtt_connected),
        );
        o.gauge(
            "edgecore_cloud_connected",
            "1 while edgehub holds a session with the cloud.",
            gi(&self.cloud_connected),
        );
        o.gauge(
            "edgecore_tunnel_open",
            "1 while the streaming tunnel to the cloud (kubectl logs, exec) is open.",
            gi(&self.tunnel_open),
        );
        o.gauge(
            "edgecore_streams_open",
            "Streams (kubectl logs, exec, attach) open through the tunnel.",
            gi(&self.streams_open),
        );
        o.counter(
            "edgecore_streams_opened",
            "Streams the cloud opened through the tunnel.",
            g(&self.streams_opened),
        );
        o.counter(
            "edgecore_streams_refused",
            "Streams refused: cloud.streams.maxStreams were open.",
            g(&self.streams_refused),
        );
        o.counter(
            "edgecore_stream_bytes",
            "Bytes the streams sent up through the tunnel.",
            g(&self.stream_bytes),
        );
        o.counter(
            "edgecore_mqtt_connection_errors",
            "MQTT connection errors.",
            g(&self.mqtt_connection_errors),
        );
        o.counter(
            "edgecore_mqtt_requests_dropped",
            "QoS 0 $hw requests dropped because the request queue was full.",
            g(&self.mqtt_requests_dropped),
        );
        if let Some(b) = self.broker.get() {
            for (name, help, v) in [
                (
                    "edgecore_broker_connections",
                    "Clients the embedded broker accepted.",
                    &b.connections,
                ),
                (
                    "edgecore_broker_published",
                    "Messages published to the embedded broker.",
                    &b.published,
                ),
                (
                    "edgecore_broker_dropped",
                    "QoS 0 messages dropped for a client whose queue was full.",
                    &b.dropped,
                ),
                (
                    "edgecore_broker_overflowed",
                    "Clients disconnected because their QoS 1 queue overflowed.",
                    &b.overflowed,
                ),
                (
                    "edgecore_broker_keepalive_expired",
                    "Clients disconnected for sending nothing within 1.5 times their keep-alive.",
                    &b.keepalive_expired,
                ),
                (
                    "edgecore_broker_refused",
                    "CONNECTs refused: a wrong user name or password, or anonymous where none may be.",
                    &b.refused,
                ),
                (
                    "edgecore_broker_denied",
                    "Publishes the ACL does not grant their client, acknowledged and dropped.",
                    &b.denied,
                ),
            ] {
                o.counter(name, help, g(v));
            }
            o.gauge(
                "edgecore_broker_subscriptions",
                "Subscriptions held by the embedded broker's clients (one per client and filter).",
                g(&b.subscriptions),
            );
        }
        o.counter(
            "edgecore_events_dropped",
            "Twin events not published because a consumer lagged.",
            g(&self.events_dropped),
        );
        o.counter(
            "edgecore_dmi_requests",
            "DMI requests served.",
            g(&self.dmi_requests),
        );
        o.counter(
            "edgecore_dmi_errors",
            "DMI requests answered with an error.",
            g(&self.dmi_errors),
        );
        o.counter(
            "edgecore_dmi_refused_twins",
            "Reported twins refused (not of their type, too large) while the rest of their report was stored.",
            g(&self.dmi_refused_twins),
        );
        o.gauge(
            "edgecore_mappers_registered",
            "Mappers registered.",
            gi(&self.mappers_registered),
        );
        o.gauge(
            "edgecore_mappers_connected",
            "Mappers reachable on their socket.",
            gi(&self.mappers_connected),
        );
        o.counter(
            "edgecore_mapper_call_errors",
            "Failed calls to mappers.",
            g(&self.mapper_call_errors),
        );
        o.counter(
            "edgecore_mapper_failures",
            "Times a registered mapper was found unreachable (refused, timed out or failed its liveness probes).",
            g(&self.mapper_failures),
        );
        o.counter(
            "edgecore_mapper_device_moves",
            "Devices moved from one mapper to another (failover from an unreachable mapper, or spreading over the live ones).",
            g(&self.mapper_device_moves),
        );
        o.counter(
            "edgecore_manifest_errors",
            "Invalid objects found in the manifests directory.",
            g(&self.manifest_errors),
        );
        o.counter(
            "edgecore_http_requests",
            "Local HTTP API requests.",
            g(&self.http_requests),
        );
        o.render()
    }
}

/// Seconds from `timestamp` (ms since the epoch) to now; 0 for one in the future.
pub fn outbox_age_seconds(timestamp: i64) -> u64 {
    let now = api::message::now_millis();
    u64::try_from(now.saturating_sub(timestamp) / 1000).unwrap_or(0)
}
