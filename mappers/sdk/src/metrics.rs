//! The mapper's counters, rendered in the Prometheus text format at `/metrics`. Names carry the
//! prefix `mapper_` and the label `protocol`.

use rt::metrics::{Histogram, Scrape};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the read latency histogram, in seconds.
const BUCKETS: [f64; 10] = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0];

#[derive(Debug, Default)]
pub struct Metrics {
    /// Property values read.
    pub reads: AtomicU64,
    /// Property reads that failed.
    pub read_errors: AtomicU64,
    /// Batches read (one driver call each).
    pub batches: AtomicU64,
    /// Requests the drivers sent (when the protocol counts them).
    pub requests: AtomicU64,
    pub writes: AtomicU64,
    pub write_errors: AtomicU64,
    /// Connections made again after a link failure.
    pub reconnects: AtomicU64,
    /// ReportDeviceStatus / ReportDeviceStates calls, and those that failed.
    pub reports: AtomicU64,
    pub report_errors: AtomicU64,
    pub pushes: AtomicU64,
    pub push_errors: AtomicU64,
    /// Values not pushed because their target's queue was full (it is down or too slow).
    pub push_dropped: AtomicU64,
    pub devices: AtomicI64,
    pub devices_online: AtomicI64,
    latency: BatchLatency,
}

/// The time of one batch read.
#[derive(Debug)]
struct BatchLatency(Histogram);

impl Default for BatchLatency {
    fn default() -> Self {
        Self(Histogram::new(BUCKETS))
    }
}

impl Metrics {
    /// Records how long one batch read took.
    pub fn observe_batch(&self, took: Duration) {
        self.latency.0.observe(took.as_secs_f64());
    }

    pub fn render(&self, protocol: &str) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let gi = |a: &AtomicI64| a.load(Ordering::Relaxed);
        let mut o = Scrape::with_labels(&[("protocol", protocol)]);
        o.counter("mapper_reads", "Property values read.", g(&self.reads))
            .counter(
                "mapper_read_errors",
                "Property reads that failed.",
                g(&self.read_errors),
            )
            .counter(
                "mapper_read_batches",
                "Batch reads (all properties of a device due together).",
                g(&self.batches),
            )
            .counter(
                "mapper_requests",
                "Requests sent to devices.",
                g(&self.requests),
            )
            .counter("mapper_writes", "Property writes.", g(&self.writes))
            .counter(
                "mapper_write_errors",
                "Property writes that failed.",
                g(&self.write_errors),
            )
            .counter(
                "mapper_reconnects",
                "Connections made again after a link failure.",
                g(&self.reconnects),
            )
            .counter(
                "mapper_reports",
                "Reports sent to edgecore over DMI.",
                g(&self.reports),
            )
            .counter(
                "mapper_report_errors",
                "Reports to edgecore that failed.",
                g(&self.report_errors),
            )
            .counter(
                "mapper_pushes",
                "Values pushed to push targets.",
                g(&self.pushes),
            )
            .counter(
                "mapper_push_errors",
                "Push attempts that failed (each is retried with backoff).",
                g(&self.push_errors),
            )
            .counter(
                "mapper_push_dropped",
                "Values dropped because their push target's queue was full (the target is down or too slow).",
                g(&self.push_dropped),
            )
            .gauge(
                "mapper_devices",
                "Devices this mapper serves.",
                gi(&self.devices),
            )
            .gauge(
                "mapper_devices_online",
                "Devices online.",
                gi(&self.devices_online),
            )
            .histogram(
                "mapper_read_batch_seconds",
                "Time of one batch read.",
                &self.latency.0,
            );
        o.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let m = Metrics::default();
        m.observe_batch(Duration::from_micros(1500));
        m.observe_batch(Duration::from_millis(30));
        let text = m.render("modbus");
        assert!(
            text.contains("mapper_read_batch_seconds_bucket{protocol=\"modbus\",le=\"0.001\"} 0")
        );
        assert!(
            text.contains("mapper_read_batch_seconds_bucket{protocol=\"modbus\",le=\"0.002\"} 1")
        );
        assert!(
            text.contains("mapper_read_batch_seconds_bucket{protocol=\"modbus\",le=\"0.05\"} 2")
        );
        assert!(text.contains("mapper_read_batch_seconds_count{protocol=\"modbus\"} 2"));
    }
}
