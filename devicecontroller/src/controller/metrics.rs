//! The device controller's counters and its reconcile-time histogram, for `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct Metrics {
    pub devices: AtomicU64,
    pub nodes: AtomicU64,
    pub messages_sent: AtomicU64,
    pub status_patches: AtomicU64,
    pub status_reports_coalesced: AtomicU64,
    pub status_patch_failures: AtomicU64,
    pub upstream_refused: AtomicU64,
    pub profiles_written: AtomicU64,
    /// The last full reconcile (first list to messages), in microseconds.
    pub reconcile_micros: AtomicU64,
    /// Reports waiting to be written.
    pub upstream_pending: AtomicU64,
    /// Node objects in the API.
    pub nodes_registered: AtomicU64,
    /// Devices bound to a node that has no Node object (once Nodes are listed).
    pub devices_on_unregistered_nodes: AtomicU64,
    /// Replicas: nodes whose sessions this replica holds (whose messages and reports it
    /// handles).
    pub nodes_owned: AtomicU64,
    /// Watch events received, all kinds (Device, DeviceModel, Node, and ObjectSync on
    /// replicas), and of Nodes and of ObjectSync records alone.
    pub watch_events: AtomicU64,
    pub node_events: AtomicU64,
    pub record_events: AtomicU64,
    /// Reports received from nodes (twin and state messages).
    pub reports: AtomicU64,
    /// DeviceStatus objects read before a first patch here (a node new to this replica).
    pub status_reads: AtomicU64,
    /// DeviceStatus patches refused because the object changed since this controller's
    /// version of it (written through another replica): read again and retried.
    pub status_conflicts: AtomicU64,
    /// How long each Device or DeviceModel change took from its watch event to its messages.
    pub reconcile: Histogram,
    /// How long each DeviceStatus patch took, from its start to the API's answer.
    pub status_patch: Histogram,
    /// How old the newest report a DeviceStatus patch carried was when the API answered (from
    /// its arrival here): how fresh what DeviceStatus shows is when it is written.
    pub status_value_age: Ages,
}

/// A [`Histogram`] of ages of values: from a tenth of a second to a minute.
#[derive(Debug)]
pub struct Ages(pub Histogram);

impl Default for Ages {
    fn default() -> Self {
        Self(Histogram::with_buckets([
            0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0,
        ]))
    }
}

/// A histogram of durations (prometheus-client's), in seconds, with its count at hand.
#[derive(Debug)]
pub struct Histogram {
    seconds: rt::metrics::Histogram,
    count: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::with_buckets([0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0])
    }
}

impl Histogram {
    fn with_buckets(bounds: impl IntoIterator<Item = f64>) -> Self {
        Self {
            seconds: rt::metrics::Histogram::new(bounds),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        self.seconds.observe(d.as_secs_f64());
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

impl Metrics {
    /// Adds these to a scrape of `/metrics`.
    pub fn scrape(&self, o: &mut rt::metrics::Scrape) {
        let g = |v: &AtomicU64| v.load(Ordering::Relaxed);
        o.gauge(
            "devicecontroller_devices",
            "Devices the controller knows.",
            g(&self.devices),
        )
        .gauge(
            "devicecontroller_nodes",
            "Nodes with devices bound to them.",
            g(&self.nodes),
        )
        .counter(
            "devicecontroller_messages_sent",
            "Messages sent to the nodes (device and model changes).",
            g(&self.messages_sent),
        )
        .counter(
            "devicecontroller_status_patches",
            "DeviceStatus patches written.",
            g(&self.status_patches),
        )
        .counter(
            "devicecontroller_status_reports_coalesced",
            "Reported values folded into a later patch of the same device.",
            g(&self.status_reports_coalesced),
        )
        .counter(
            "devicecontroller_status_patch_failures",
            "DeviceStatus patches that failed (retried).",
            g(&self.status_patch_failures),
        )
        .counter(
            "devicecontroller_upstream_refused",
            "Reports from nodes refused (malformed, or of a device not theirs).",
            g(&self.upstream_refused),
        )
        .gauge(
            "devicecontroller_upstream_pending",
            "Reports waiting to be written.",
            g(&self.upstream_pending),
        )
        .counter(
            "devicecontroller_profiles_written",
            "Per-node profile ConfigMaps written.",
            g(&self.profiles_written),
        )
        .gauge_f64(
            "devicecontroller_reconcile_seconds",
            "The last full reconcile, from the first list to the messages.",
            g(&self.reconcile_micros) as f64 / 1e6,
        )
        .gauge(
            "devicecontroller_nodes_registered",
            "Node objects in the API.",
            g(&self.nodes_registered),
        )
        .gauge(
            "devicecontroller_devices_on_unregistered_nodes",
            "Devices bound to a node that has no Node object.",
            g(&self.devices_on_unregistered_nodes),
        )
        .gauge(
            "devicecontroller_nodes_owned",
            "Replicas: nodes whose sessions this replica holds.",
            g(&self.nodes_owned),
        )
        .counter(
            "devicecontroller_watch_events",
            "Watch events received (Device, DeviceModel, Node, ObjectSync).",
            g(&self.watch_events),
        )
        .counter(
            "devicecontroller_node_events",
            "Node watch events received.",
            g(&self.node_events),
        )
        .counter(
            "devicecontroller_record_events",
            "ObjectSync watch events received (replicas).",
            g(&self.record_events),
        )
        .counter(
            "devicecontroller_reports",
            "Reports received from nodes.",
            g(&self.reports),
        )
        .counter(
            "devicecontroller_status_reads",
            "DeviceStatus objects read before a first patch here.",
            g(&self.status_reads),
        )
        .counter(
            "devicecontroller_status_conflicts",
            "DeviceStatus patches refused as written through another replica since (read again and retried).",
            g(&self.status_conflicts),
        )
        .histogram(
            "devicecontroller_reconcile_duration_seconds",
            "From a Device or DeviceModel change to its messages.",
            &self.reconcile.seconds,
        )
        .histogram(
            "devicecontroller_status_patch_duration_seconds",
            "From the start of a DeviceStatus patch to the API's answer.",
            &self.status_patch.seconds,
        )
        .histogram(
            "devicecontroller_status_value_age_seconds",
            "From the arrival of the newest report a DeviceStatus patch carried to the API's answer.",
            &self.status_value_age.0.seconds,
        );
    }

    /// The text of [`Self::scrape`] alone.
    pub fn render(&self) -> String {
        let mut o = rt::metrics::Scrape::default();
        self.scrape(&mut o);
        o.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_histogram_counts_what_it_observes_and_the_scrape_names_every_counter() {
        let m = Metrics::default();
        m.reconcile.observe(Duration::from_micros(300));
        m.reconcile.observe(Duration::from_millis(2));
        assert_eq!(m.reconcile.count(), 2);
        m.devices.store(7, Ordering::Relaxed);
        let text = m.render();
        assert!(text.contains("devicecontroller_devices 7"), "{text}");
        assert!(
            text.contains("devicecontroller_reconcile_duration_seconds_count 2"),
            "{text}"
        );
        // Ages have buckets of their own, up to a minute.
        m.status_value_age.0.observe(Duration::from_secs(12));
        let text = m.render();
        for (le, n) in [("10", 0), ("20", 1), ("60", 1)] {
            let line =
                format!("devicecontroller_status_value_age_seconds_bucket{{le=\"{le}\"}} {n}");
            assert!(text.contains(&line), "{line} in {text}");
        }
    }
}
