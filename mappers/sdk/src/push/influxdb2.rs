//! The InfluxDB 2 sink (feature `influxdb2`): batches written in line protocol to the write API.

use super::*;

/// Escapes a measurement (commas, spaces) or a tag key, tag value or field key (also `=`).
fn escape(s: &str, equals: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == ',' || c == ' ' || (equals && c == '=') || c == '\\' {
            out.push('\\');
        }
        match c {
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// One point of line protocol, with a millisecond timestamp.
pub(super) fn line(
    m: &Message,
    measurement: Option<&str>,
    tags: &[(String, String)],
    field_key: Option<&str>,
) -> String {
    let mut out = escape(measurement.unwrap_or(&m.device), false);
    let mut all: Vec<(&str, String)> = tags.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    if !tags.iter().any(|(k, _)| k == "device") {
        all.push(("device", format!("{}/{}", m.namespace, m.device)));
    }
    all.sort();
    for (k, v) in all {
        if v.is_empty() {
            continue;
        }
        out.push(',');
        out.push_str(&escape(k, true));
        out.push('=');
        out.push_str(&escape(&v, true));
    }
    out.push(' ');
    out.push_str(&escape(field_key.unwrap_or(&m.property), true));
    out.push('=');
    match typed(&m.value, m.value_type.as_deref()) {
        Typed::Int(i) => out.push_str(&format!("{i}i")),
        Typed::Float(f) => out.push_str(&format!("{f:?}")),
        Typed::Bool(b) => out.push_str(if b { "true" } else { "false" }),
        Typed::Text(t) => {
            out.push('"');
            out.push_str(&t.replace('\\', "\\\\").replace('"', "\\\""));
            out.push('"');
        }
    }
    out.push(' ');
    out.push_str(&m.timestamp.to_string());
    out
}

pub(super) struct Sink {
    write_url: String,
    token: Option<String>,
    measurement: Option<String>,
    tags: Vec<(String, String)>,
    field_key: Option<String>,
    agent: ureq::Agent,
}

impl Sink {
    pub(super) fn new(target: &Target) -> Result<Self, PushError> {
        let Target::Influxdb2 {
            url,
            org,
            bucket,
            measurement,
            tags,
            field_key,
        } = target
        else {
            return Err(PushError::target(
                target.describe(),
                "not an influxdb2 target",
            ));
        };
        let q = |s: &str| {
            s.bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                        (b as char).to_string()
                    }
                    b => format!("%{b:02X}"),
                })
                .collect::<String>()
        };
        Ok(Self {
            write_url: format!(
                "{url}/api/v2/write?org={}&bucket={}&precision=ms",
                q(org),
                q(bucket)
            ),
            token: std::env::var("TOKEN").ok().filter(|t| !t.is_empty()),
            measurement: measurement.clone(),
            tags: tags.clone(),
            field_key: field_key.clone(),
            agent: sink_agent(),
        })
    }
}

impl super::Sink for Sink {
    async fn write(&mut self, batch: &[Message]) -> Result<(), PushError> {
        let body: String = batch
            .iter()
            .map(|m| {
                line(
                    m,
                    self.measurement.as_deref(),
                    &self.tags,
                    self.field_key.as_deref(),
                ) + "\n"
            })
            .collect();
        let mut headers = vec![("content-type", "text/plain; charset=utf-8".to_string())];
        if let Some(t) = &self.token {
            headers.push(("authorization", format!("Token {t}")));
        }
        post(&self.agent, &self.write_url, headers, body).await
    }
}
