//! `/metrics` in the Prometheus text format (0.0.4), encoded by prometheus-client.
//!
//! Components keep their counters as atomics on their hot paths (a `fetch_add` costs nothing
//! there); a scrape reads them into a [`Scrape`], which prometheus-client encodes: the names
//! (with `_total` added to counters), `HELP` text escaping, label values, histogram buckets.
//! Histograms are prometheus-client's own ([`Histogram`]), observed where they are measured.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

pub use prometheus_client::metrics::histogram::Histogram;

/// The `Content-Type` of what [`Scrape::render`] returns.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[derive(Debug, Clone)]
enum Value {
    Counter(u64),
    Gauge(i64),
    GaugeF64(f64),
    Histogram(Histogram),
}

#[derive(Debug, Clone)]
struct Sample {
    name: &'static str,
    help: &'static str,
    value: Value,
}

/// The metrics of one scrape, in the order they are added.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// Labels every sample carries (a mapper's `protocol`).
    labels: Vec<(String, String)>,
    samples: Vec<Sample>,
}

impl Scrape {
    /// A scrape whose every sample carries `labels`.
    pub fn with_labels(labels: &[(&str, &str)]) -> Self {
        Self {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            samples: Vec::new(),
        }
    }

    fn add(&mut self, name: &'static str, help: &'static str, value: Value) -> &mut Self {
        self.samples.push(Sample { name, help, value });
        self
    }

    /// A counter; `name` without `_total`, which the encoding adds.
    pub fn counter(&mut self, name: &'static str, help: &'static str, value: u64) -> &mut Self {
        self.add(name, help, Value::Counter(value))
    }

    /// A gauge of a count or a flag (`true` is 1); one beyond `i64` shows as `i64::MAX`.
    pub fn gauge(
        &mut self,
        name: &'static str,
        help: &'static str,
        value: impl TryInto<i64>,
    ) -> &mut Self {
        let value = value.try_into().unwrap_or(i64::MAX);
        self.add(name, help, Value::Gauge(value))
    }

    pub fn gauge_f64(&mut self, name: &'static str, help: &'static str, value: f64) -> &mut Self {
        self.add(name, help, Value::GaugeF64(value))
    }

    /// A histogram as it is now (a handle: later observations do not change this scrape's
    /// text once it is rendered).
    pub fn histogram(
        &mut self,
        name: &'static str,
        help: &'static str,
        histogram: &Histogram,
    ) -> &mut Self {
        self.add(name, help, Value::Histogram(histogram.clone()))
    }

    /// The text format.
    pub fn render(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
            tracing::warn!(error = %e, "metrics not encoded");
        }
        out
    }
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for s in &self.samples {
            let kind = match s.value {
                Value::Counter(_) => MetricType::Counter,
                Value::Gauge(_) | Value::GaugeF64(_) => MetricType::Gauge,
                Value::Histogram(_) => MetricType::Histogram,
            };
            let mut metric = encoder.encode_descriptor(s.name, s.help, None, kind)?;
            let metric = if self.labels.is_empty() {
                metric
            } else {
                metric.encode_family(&self.labels)?
            };
            match &s.value {
                Value::Counter(v) => ConstCounter::new(*v).encode(metric)?,
                Value::Gauge(v) => ConstGauge::new(*v).encode(metric)?,
                Value::GaugeF64(v) => ConstGauge::new(*v).encode(metric)?,
                Value::Histogram(h) => h.encode(metric)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gauges_and_histograms_in_the_text_format() {
        let h = Histogram::new([0.01, 0.1]);
        h.observe(0.005);
        h.observe(0.05);
        let mut s = Scrape::with_labels(&[("protocol", "modbus")]);
        s.counter("mapper_reads", "Property values read.", 7)
            .gauge("mapper_devices", "Devices this mapper serves.", 2)
            .histogram("mapper_read_batch_seconds", "Time of one batch read.", &h);
        let text = s.render();
        for line in [
            "# HELP mapper_reads_total Property values read.",
            "# TYPE mapper_reads_total counter",
            "mapper_reads_total{protocol=\"modbus\"} 7",
            "# TYPE mapper_devices gauge",
            "mapper_devices{protocol=\"modbus\"} 2",
            "# TYPE mapper_read_batch_seconds histogram",
            "mapper_read_batch_seconds_bucket{protocol=\"modbus\",le=\"0.01\"} 1",
            "mapper_read_batch_seconds_bucket{protocol=\"modbus\",le=\"0.1\"} 2",
            "mapper_read_batch_seconds_bucket{protocol=\"modbus\",le=\"+Inf\"} 2",
            "mapper_read_batch_seconds_count{protocol=\"modbus\"} 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
        }
    }

    #[test]
    fn help_text_is_escaped() {
        let mut s = Scrape::default();
        s.gauge("g", "one\nline", 1);
        assert!(s.render().contains("# HELP g one\\nline\n"));
    }
}
