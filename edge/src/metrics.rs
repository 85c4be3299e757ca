//! Counters of edgecore, rendered in the Prometheus text format at `/metrics`.

use std::fmt::Write;
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
}

fn line(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
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
    pub fn render(&self, twin: &twin::service::Stats, outbox_depth: Option<u64>) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let gi = |a: &AtomicI64| a.load(Ordering::Relaxed);
        let mut o = String::new();
        line(
            &mut o,
            "edgecore_twin_updates_total",
            "counter",
            "Twin operations that changed state, committed.",
            g(&twin.applied),
        );
        line(
            &mut o,
            "edgecore_twin_unchanged_total",
            "counter",
            "Twin operations that changed nothing and wrote nothing.",
            g(&twin.unchanged),
        );
        line(
            &mut o,
            "edgecore_twin_rejected_total",
            "counter",
            "Twin operations rejected (invalid, unknown, conflict).",
            g(&twin.rejected),
        );
        line(
            &mut o,
            "edgecore_twin_commits_total",
            "counter",
            "SQLite transactions committed.",
            g(&twin.commits),
        );
        line(
            &mut o,
            "edgecore_twin_store_errors_total",
            "counter",
            "SQLite transactions that failed.",
            g(&twin.store_errors),
        );
        line(
            &mut o,
            "edgecore_twin_writes_refused_total",
            "counter",
            "Twin writes refused without being tried while the store refused writes (a full disk).",
            g(&twin.writes_refused),
        );
        line(
            &mut o,
            "edgecore_twin_store_degraded",
            "gauge",
            "1 while the twin store refuses writes.",
            u64::from(twin.degraded().is_some()).to_string(),
        );
        line(
            &mut o,
            "edgecore_manifests_unreadable",
            "gauge",
            "1 while the manifests directory cannot be read (the last good set of devices is kept).",
            u64::from(self.manifests_error().is_some()).to_string(),
        );
        line(
            &mut o,
            "edgecore_devices",
            "gauge",
            "Devices with a twin.",
            g(&twin.devices),
        );
        if let Some(d) = outbox_depth {
            line(
                &mut o,
                "edgecore_outbox_depth",
                "gauge",
                "Changes waiting to reach the cloud.",
                d,
            );
        }
        line(
            &mut o,
            "edgecore_mqtt_messages_in_total",
            "counter",
            "MQTT messages received.",
            g(&self.mqtt_messages_in),
        );
        line(
            &mut o,
            "edgecore_mqtt_messages_out_total",
            "counter",
            "MQTT messages published.",
            g(&self.mqtt_messages_out),
        );
        line(
            &mut o,
            "edgecore_mqtt_bad_payloads_total",
            "counter",
            "MQTT requests with a malformed payload.",
            g(&self.mqtt_bad_payloads),
        );
        line(
            &mut o,
            "edgecore_mqtt_connected",
            "gauge",
            "1 while connected to the MQTT broker.",
            gi(&self.mqtt_connected),
        );
        line(
            &mut o,
            "edgecore_mqtt_connection_errors_total",
            "counter",
            "MQTT connection errors.",
            g(&self.mqtt_connection_errors),
        );
        line(
            &mut o,
            "edgecore_mqtt_requests_dropped_total",
            "counter",
            "QoS 0 $hw requests dropped because the request queue was full.",
            g(&self.mqtt_requests_dropped),
        );
        if let Some(b) = self.broker.get() {
            for (name, help, v) in [
                (
                    "edgecore_broker_connections_total",
                    "Clients the embedded broker accepted.",
                    &b.connections,
                ),
                (
                    "edgecore_broker_published_total",
                    "Messages published to the embedded broker.",
                    &b.published,
                ),
                (
                    "edgecore_broker_dropped_total",
                    "QoS 0 messages dropped for a client whose queue was full.",
                    &b.dropped,
                ),
                (
                    "edgecore_broker_overflowed_total",
                    "Clients disconnected because their QoS 1 queue overflowed.",
                    &b.overflowed,
                ),
                (
                    "edgecore_broker_keepalive_expired_total",
                    "Clients disconnected for sending nothing within 1.5 times their keep-alive.",
                    &b.keepalive_expired,
                ),
            ] {
                line(&mut o, name, "counter", help, g(v));
            }
        }
        line(
            &mut o,
            "edgecore_events_dropped_total",
            "counter",
            "Twin events not published because a consumer lagged.",
            g(&self.events_dropped),
        );
        line(
            &mut o,
            "edgecore_dmi_requests_total",
            "counter",
            "DMI requests served.",
            g(&self.dmi_requests),
        );
        line(
            &mut o,
            "edgecore_dmi_errors_total",
            "counter",
            "DMI requests answered with an error.",
            g(&self.dmi_errors),
        );
        line(
            &mut o,
            "edgecore_dmi_refused_twins_total",
            "counter",
            "Reported twins refused (not of their type, too large) while the rest of their report was stored.",
            g(&self.dmi_refused_twins),
        );
        line(
            &mut o,
            "edgecore_mappers_registered",
            "gauge",
            "Mappers registered.",
            gi(&self.mappers_registered),
        );
        line(
            &mut o,
            "edgecore_mappers_connected",
            "gauge",
            "Mappers reachable on their socket.",
            gi(&self.mappers_connected),
        );
        line(
            &mut o,
            "edgecore_mapper_call_errors_total",
            "counter",
            "Failed calls to mappers.",
            g(&self.mapper_call_errors),
        );
        line(
            &mut o,
            "edgecore_mapper_failures_total",
            "counter",
            "Times a registered mapper was found unreachable (refused, timed out or failed its liveness probes).",
            g(&self.mapper_failures),
        );
        line(
            &mut o,
            "edgecore_mapper_device_moves_total",
            "counter",
            "Devices moved from one mapper to another (failover from an unreachable mapper, or spreading over the live ones).",
            g(&self.mapper_device_moves),
        );
        line(
            &mut o,
            "edgecore_manifest_errors_total",
            "counter",
            "Invalid objects found in the manifests directory.",
            g(&self.manifest_errors),
        );
        line(
            &mut o,
            "edgecore_http_requests_total",
            "counter",
            "Local HTTP API requests.",
            g(&self.http_requests),
        );
        o
    }
}
