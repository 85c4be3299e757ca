//! `kectl twin get|set|list`: edgecore's twins through its local HTTP API.

use anyhow::{Context, bail};
use serde_json::Value;
use std::fmt::Write;

/// The default address of edgecore's HTTP API (`http.address` in its config).
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:10360";

/// A client of edgecore's HTTP API. The token of an API that requires one (`http.tokenFile`)
/// is taken from `KECTL_TOKEN`.
pub struct Client {
    agent: ureq::Agent,
    base: String,
    token: Option<String>,
}

/// Splits `NS/NAME`; a bare `NAME` is in `default`.
pub fn split_id(id: &str) -> anyhow::Result<(String, String)> {
    let (ns, name) = id.split_once('/').unwrap_or(("default", id));
    if ns.is_empty() || name.is_empty() || name.contains('/') {
        bail!("device {id:?} is not NAMESPACE/NAME");
    }
    Ok((ns.to_string(), name.to_string()))
}

impl Client {
    pub fn new(server: &str) -> Self {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(std::time::Duration::from_secs(10)))
            .build()
            .into();
        Self {
            agent,
            base: server.trim_end_matches('/').to_string(),
            token: std::env::var("KECTL_TOKEN")
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty()),
        }
    }

    /// A GET of `url`, with the token when there is one.
    fn get_url(&self, url: String) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        let r = self.agent.get(url);
        match &self.token {
            Some(t) => r.header("authorization", format!("Bearer {t}")),
            None => r,
        }
    }

    fn decode(
        &self,
        what: &str,
        resp: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> anyhow::Result<Value> {
        let mut resp = resp.with_context(|| {
            format!(
                "cannot reach edgecore at {} (is it running? see --server)",
                self.base
            )
        })?;
        let status = resp.status();
        let text = resp
            .body_mut()
            .read_to_string()
            .with_context(|| format!("{what}: unreadable answer"))?;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if !status.is_success() {
            let msg = v
                .get("error")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string());
            bail!("{what}: {msg} (HTTP {})", status.as_u16());
        }
        Ok(v)
    }

    /// The twin document of a device.
    pub fn get(&self, ns: &str, name: &str) -> anyhow::Result<Value> {
        let r = self
            .get_url(format!("{}/api/v1/devices/{ns}/{name}", self.base))
            .call();
        self.decode(&format!("get twin of {ns}/{name}"), r)
    }

    /// A property's history: CSV text when `q.csv`, else the JSON document.
    pub fn history(
        &self,
        ns: &str,
        name: &str,
        property: &str,
        q: &HistoryQuery,
    ) -> anyhow::Result<Value> {
        let HistoryQuery {
            from,
            to,
            step,
            csv,
        } = q;
        let (from, to, step, csv) = (from.as_deref(), to.as_deref(), step.as_deref(), *csv);
        let enc = |s: &str| -> String {
            s.bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                        (b as char).to_string()
                    }
                    _ => format!("%{b:02X}"),
                })
                .collect()
        };
        let mut url = format!(
            "{}/api/v1/devices/{ns}/{name}/properties/{}/history?",
            self.base,
            enc(property)
        );
        for (k, v) in [("from", from), ("to", to), ("step", step)] {
            if let Some(v) = v {
                let _ = write!(url, "{k}={}&", enc(v));
            }
        }
        if csv {
            url.push_str("format=csv");
        }
        let r = self.get_url(url).call();
        self.decode(&format!("history of {ns}/{name} {property}"), r)
    }

    /// Every device.
    pub fn list(&self) -> anyhow::Result<Value> {
        let r = self.get_url(format!("{}/api/v1/devices", self.base)).call();
        self.decode("list devices", r)
    }

    /// edged's pods.
    pub fn pods(&self) -> anyhow::Result<Value> {
        let r = self.get_url(format!("{}/api/v1/pods", self.base)).call();
        self.decode("list pods", r)
    }

    /// A container's log as text: `container` when the pod has several, `previous` for the run
    /// before a restart, the last `tail` lines.
    pub fn logs(
        &self,
        ns: &str,
        name: &str,
        container: Option<&str>,
        previous: bool,
        tail: Option<usize>,
    ) -> anyhow::Result<String> {
        let mut url = format!(
            "{}/api/v1/pods/{ns}/{name}/log?previous={previous}",
            self.base
        );
        if let Some(c) = container {
            let _ = write!(url, "&container={c}");
        }
        if let Some(t) = tail {
            let _ = write!(url, "&tailLines={t}");
        }
        let r = self.get_url(url).call();
        match self.decode(&format!("logs of pod {ns}/{name}"), r)? {
            Value::String(text) => Ok(text),
            // A log whose text happens to be JSON.
            other => Ok(format!("{other}\n")),
        }
    }

    /// Sets desired values; returns the twin after the change.
    pub fn set(
        &self,
        ns: &str,
        name: &str,
        values: &[(String, String)],
        if_version: Option<u64>,
    ) -> anyhow::Result<Value> {
        let body: serde_json::Map<String, Value> = values
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        let mut url = format!("{}/api/v1/devices/{ns}/{name}/desired", self.base);
        if let Some(v) = if_version {
            let _ = write!(url, "?ifVersion={v}");
        }
        let mut req = self
            .agent
            .put(url)
            .header("content-type", "application/json");
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let r = req.send(Value::Object(body).to_string());
        self.decode(&format!("set desired value of {ns}/{name}"), r)
    }
}

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        match cur.get(p) {
            Some(x) => cur = x,
            None => return "",
        }
    }
    cur.as_str().unwrap_or("")
}

fn n(v: &Value, key: &str) -> String {
    v.get(key).map(|x| x.to_string()).unwrap_or_default()
}

/// A twin document as a table.
pub fn format_twin(t: &Value) -> String {
    let mut out = String::new();
    let state = match s(t, &["state"]) {
        "" => "-",
        x => x,
    };
    let state = match s(t, &["stateReason"]) {
        "" => state.to_string(),
        why => format!("{state} ({why})"),
    };
    let _ = writeln!(
        out,
        "{}/{}  model {}  protocol {}  state {}  desired v{}  reported v{}",
        s(t, &["namespace"]),
        s(t, &["name"]),
        s(t, &["model"]),
        s(t, &["protocol"]),
        state,
        n(t, "desiredVersion"),
        n(t, "reportedVersion"),
    );
    let mut rows = vec![[
        "PROPERTY".to_string(),
        "TYPE".into(),
        "DESIRED".into(),
        "REPORTED".into(),
        "DELTA".into(),
    ]];
    if let Some(props) = t.get("properties").and_then(Value::as_object) {
        for (name, p) in props {
            let mut desired = s(p, &["desired", "value"]).to_string();
            if let Some(e) = p.pointer("/writeError/message").and_then(Value::as_str) {
                desired = format!("{desired} (refused: {e})");
            }
            let mut reported = s(p, &["reported", "value"]).to_string();
            if p.pointer("/reported/stale").and_then(Value::as_bool) == Some(true) {
                let age = p
                    .pointer("/reported/ageMs")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                reported = format!("{reported} (stale, {})", age_text(age));
            }
            if p.pointer("/error/kind").and_then(Value::as_str) != Some("write")
                && let Some(e) = p.pointer("/error/message").and_then(Value::as_str)
            {
                reported = format!("{reported} (error: {e})").trim_start().to_string();
            }
            let reported = reported.as_str();
            let wanted = s(p, &["desired", "value"]);
            let delta = if !wanted.is_empty() && wanted != s(p, &["reported", "value"]) {
                "*"
            } else {
                ""
            };
            rows.push([
                name.clone(),
                s(p, &["type"]).to_string(),
                desired,
                reported.to_string(),
                delta.to_string(),
            ]);
        }
    }
    let widths: Vec<usize> = (0..5)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}

/// `ms` as `850ms`, `12s`, `5m03s` or `2h07m`.
fn age_text(ms: i64) -> String {
    let secs = ms / 1000;
    match secs {
        0 => format!("{ms}ms"),
        1..60 => format!("{secs}s"),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
    }
}

/// The device list as a table.
/// `kectl pods`: a line per container of each pod (columns aligned), then the manifests edged
/// refused and the runtime's error.
pub fn format_pods(list: &Value) -> String {
    let mut rows: Vec<[String; 7]> = vec![
        [
            "POD",
            "PHASE",
            "IP",
            "CONTAINER",
            "STATE",
            "RESTARTS",
            "REASON",
        ]
        .map(String::from),
    ];
    for p in list["pods"].as_array().into_iter().flatten() {
        let pod = format!("{}/{}", s(p, &["namespace"]), s(p, &["name"]));
        let ip = match s(p, &["podIP"]) {
            "" => "-",
            x => x,
        };
        let containers = p["containers"].as_array().cloned().unwrap_or_default();
        if containers.is_empty() {
            let row = [&pod, s(p, &["phase"]), ip, "-", "-", "-", s(p, &["reason"])];
            rows.push(row.map(str::to_string));
        }
        for c in containers {
            let reason = [s(&c, &["reason"]), s(p, &["reason"])]
                .into_iter()
                .find(|r| !r.is_empty())
                .unwrap_or("");
            rows.push([
                pod.clone(),
                s(p, &["phase"]).into(),
                ip.into(),
                s(&c, &["name"]).into(),
                s(&c, &["state"]).into(),
                n(&c, "restartCount"),
                reason.into(),
            ]);
        }
    }
    let mut widths = [0; 7];
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
        let mut line = String::new();
        for (cell, w) in r.iter().zip(widths) {
            let _ = write!(line, "{cell:<w$}   ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    for (file, e) in list["manifestErrors"].as_object().into_iter().flatten() {
        let _ = writeln!(out, "refused {file}: {}", e.as_str().unwrap_or_default());
    }
    if let Some(e) = list["runtimeError"].as_str() {
        let _ = writeln!(out, "runtime: {e}");
    }
    out
}

pub fn format_list(devices: &Value) -> String {
    let mut out = String::from("DEVICE\tPROTOCOL\tSTATE\tDESIRED-V\tREPORTED-V\n");
    for d in devices.as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "{}/{}\t{}\t{}\t{}\t{}",
            s(d, &["namespace"]),
            s(d, &["name"]),
            s(d, &["protocol"]),
            match s(d, &["state"]) {
                "" => "-",
                x => x,
            },
            n(d, "desiredVersion"),
            n(d, "reportedVersion"),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_steps_mean_has_four_decimals_at_most_and_readings_are_as_read() {
        let doc = json!({"buckets": [
            {"t": 0, "min": 76.1, "max": 77.25, "mean": 76.74666666666667, "last": 76.8, "count": 3},
            {"t": 60000, "min": 1, "max": 1, "mean": 1.0, "last": "true", "count": 1}]});
        let table = format_history(&doc);
        let rows: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows[1][1..],
            ["76.1", "77.25", "76.7467", "76.8", "3"],
            "{table}"
        );
        assert_eq!(rows[2][1..], ["1", "1", "1.0", "true", "1"], "{table}");
    }

    #[test]
    fn pods_table_aligns_columns_and_names_refusals() {
        let list = json!({
            "pods": [
                {"namespace": "default", "name": "hello", "phase": "Running", "podIP": "10.1.0.2",
                 "containers": [
                    {"name": "talk", "state": "running", "restartCount": 0},
                    {"name": "oops", "state": "waiting", "restartCount": 3, "reason": "CrashLoopBackOff"}]},
                {"namespace": "kube-system", "name": "m", "phase": "Pending",
                 "reason": "CreatePodSandboxError", "containers": []}],
            "manifestErrors": {"/p/bad.yaml": "spec.containers: invalid type"},
            "runtimeError": "CRI Version: connection refused"
        });
        let table = format_pods(&list);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "POD             PHASE     IP         CONTAINER   STATE     RESTARTS   REASON"
        );
        assert_eq!(
            lines[2],
            "default/hello   Running   10.1.0.2   oops        waiting   3          CrashLoopBackOff"
        );
        assert_eq!(
            lines[3],
            "kube-system/m   Pending   -          -           -         -          CreatePodSandboxError"
        );
        assert_eq!(
            lines[4],
            "refused /p/bad.yaml: spec.containers: invalid type"
        );
        assert_eq!(lines[5], "runtime: CRI Version: connection refused");
    }
}

/// What of a history to ask for: `from`, `to` (ms, `now`, `-24h`), `step` (`1m`), CSV or not.
#[derive(Clone, Debug, Default)]
pub struct HistoryQuery {
    pub from: Option<String>,
    pub to: Option<String>,
    pub step: Option<String>,
    pub csv: bool,
}

/// A history document as a table: one line per point (time, value) or per step (time, min,
/// max, mean, last, count), times in UTC.
pub fn format_history(doc: &Value) -> String {
    let time = |ms: i64| {
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
            .ok()
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_else(|| ms.to_string())
    };
    let shown = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    // A mean is a quotient, not a reading: four decimals at most (76.7467, not 76.74666666666667).
    let mean = |v: &Value| match v.as_f64() {
        Some(x) if x.fract() != 0.0 => {
            let t = format!("{x:.4}");
            t.trim_end_matches('0').trim_end_matches('.').to_string()
        }
        _ => shown(v),
    };
    let mut out = String::new();
    if let Some(points) = doc["points"].as_array() {
        let _ = writeln!(out, "{:<25} VALUE", "TIME");
        for p in points {
            let _ = writeln!(
                out,
                "{:<25} {}",
                time(p["t"].as_i64().unwrap_or(0)),
                shown(&p["v"])
            );
        }
        if doc["truncated"].as_bool() == Some(true) {
            let _ = writeln!(out, "(more points than shown: give --step)");
        }
    } else if let Some(buckets) = doc["buckets"].as_array() {
        let _ = writeln!(
            out,
            "{:<25} {:>12} {:>12} {:>12} {:>12} {:>6}",
            "TIME", "MIN", "MAX", "MEAN", "LAST", "COUNT"
        );
        for b in buckets {
            let _ = writeln!(
                out,
                "{:<25} {:>12} {:>12} {:>12} {:>12} {:>6}",
                time(b["t"].as_i64().unwrap_or(0)),
                shown(&b["min"]),
                shown(&b["max"]),
                mean(&b["mean"]),
                shown(&b["last"]),
                shown(&b["count"])
            );
        }
    }
    out
}
