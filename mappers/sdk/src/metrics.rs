//! The mapper's counters, rendered in the Prometheus text format at `/metrics`. Names carry the
//! prefix `mapper_` and the label `protocol`.

use std::fmt::Write;
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
    latency: [AtomicU64; BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_us: AtomicU64,
}

impl Metrics {
    /// Records how long one batch read took.
    pub fn observe_batch(&self, took: Duration) {
        let s = took.as_secs_f64();
        for (b, c) in BUCKETS.iter().zip(&self.latency) {
            if s <= *b {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_sum_us
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn render(&self, protocol: &str) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut o = String::new();
        let l = format!("protocol=\"{protocol}\"");
        let counters: [(&str, &str, u64); 12] = [
            (
                "mapper_reads_total",
                "Property values read.",
                g(&self.reads),
            ),
            (
                "mapper_read_errors_total",
                "Property reads that failed.",
                g(&self.read_errors),
            ),
            (
                "mapper_read_batches_total",
                "Batch reads (all properties of a device due together).",
                g(&self.batches),
            ),
            (
                "mapper_requests_total",
                "Requests sent to devices.",
                g(&self.requests),
            ),
            ("mapper_writes_total", "Property writes.", g(&self.writes)),
            (
                "mapper_write_errors_total",
                "Property writes that failed.",
                g(&self.write_errors),
            ),
            (
                "mapper_reconnects_total",
                "Connections made again after a link failure.",
                g(&self.reconnects),
            ),
            (
                "mapper_reports_total",
                "Reports sent to edgecore over DMI.",
                g(&self.reports),
            ),
            (
                "mapper_report_errors_total",
                "Reports to edgecore that failed.",
                g(&self.report_errors),
            ),
            (
                "mapper_pushes_total",
                "Values pushed to push targets.",
                g(&self.pushes),
            ),
            (
                "mapper_push_errors_total",
                "Push attempts that failed (each is retried with backoff).",
                g(&self.push_errors),
            ),
            (
                "mapper_push_dropped_total",
                "Values dropped because their push target's queue was full (the target is down or too slow).",
                g(&self.push_dropped),
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                o,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{l}}} {v}"
            );
        }
        for (name, help, v) in [
            (
                "mapper_devices",
                "Devices this mapper serves.",
                &self.devices,
            ),
            (
                "mapper_devices_online",
                "Devices online.",
                &self.devices_online,
            ),
        ] {
            let v = v.load(Ordering::Relaxed);
            let _ = writeln!(
                o,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{l}}} {v}"
            );
        }
        let name = "mapper_read_batch_seconds";
        let _ = writeln!(
            o,
            "# HELP {name} Time of one batch read.\n# TYPE {name} histogram"
        );
        for (b, c) in BUCKETS.iter().zip(&self.latency) {
            let _ = writeln!(o, "{name}_bucket{{{l},le=\"{b}\"}} {}", g(c));
        }
        let count = g(&self.latency_count);
        let _ = writeln!(o, "{name}_bucket{{{l},le=\"+Inf\"}} {count}");
        let _ = writeln!(
            o,
            "{name}_sum{{{l}}} {}",
            g(&self.latency_sum_us) as f64 / 1e6
        );
        let _ = writeln!(o, "{name}_count{{{l}}} {count}");
        o
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
