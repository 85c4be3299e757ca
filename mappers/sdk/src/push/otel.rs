//! The OpenTelemetry sink (feature `otel`): numeric values as OTLP/HTTP gauges.

use super::*;
use serde_json::Value;
use std::collections::BTreeMap;

pub(super) struct Sink {
    url: String,
    agent: ureq::Agent,
    metrics: Arc<Metrics>,
}

impl Sink {
    pub(super) fn new(url: &str, metrics: Arc<Metrics>) -> Self {
        Self {
            url: url.to_string(),
            agent: sink_agent(),
            metrics,
        }
    }
}

fn text(key: &str, value: &str) -> Value {
    json!({"key": key, "value": {"stringValue": value}})
}

/// An OTLP `ExportMetricsServiceRequest` in the protobuf JSON encoding: a gauge per property,
/// a data point per numeric value. Returns it and how many values were not numbers.
pub(super) fn request(batch: &[Message]) -> (Value, usize) {
    let mut by_property: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    let mut skipped = 0;
    for m in batch {
        let point = |v: (&str, Value)| {
            json!({
                "attributes": [text("device.namespace", &m.namespace), text("device.name", &m.device)],
                "timeUnixNano": (m.timestamp.saturating_mul(1_000_000)).to_string(),
                v.0: v.1,
            })
        };
        let p = match typed(&m.value, m.value_type.as_deref()) {
            Typed::Int(i) => point(("asInt", Value::String(i.to_string()))),
            Typed::Float(f) => point(("asDouble", json!(f))),
            Typed::Bool(b) => point(("asInt", Value::String(i64::from(b).to_string()))),
            Typed::Text(_) => {
                skipped += 1;
                continue;
            }
        };
        by_property.entry(&m.property).or_default().push(p);
    }
    let metrics: Vec<Value> = by_property
        .into_iter()
        .map(|(name, points)| json!({"name": name, "gauge": {"dataPoints": points}}))
        .collect();
    let body = json!({"resourceMetrics": [{
        "resource": {"attributes": [text("service.name", "kubeedge-mapper")]},
        "scopeMetrics": [{"scope": {"name": "kubeedge-rs.mapper-sdk"}, "metrics": metrics}],
    }]});
    (body, skipped)
}

impl super::Sink for Sink {
    async fn write(&mut self, batch: &[Message]) -> Result<(), PushError> {
        let (body, skipped) = request(batch);
        self.metrics
            .push_dropped
            .fetch_add(skipped as u64, Ordering::Relaxed);
        let headers = vec![("content-type", "application/json".to_string())];
        post(&self.agent, &self.url, headers, body.to_string()).await
    }
}
