//! Liveness and readiness probes (exec through the runtime, HTTP GET, TCP connect), with the
//! kubelet's defaults and thresholds; and a container's resource limits as CRI takes them.

use crate::cri_client::CriError;
use k8s_openapi::api::core::v1::{Container, Probe};
use std::time::{Duration, Instant};

/// Why a probe failed; its text is the container's probe message.
#[derive(Debug, thiserror::Error)]
pub enum ProbeFailure {
    #[error("port {0} is out of range")]
    PortOutOfRange(i32),
    #[error("no container port named {0}")]
    NoNamedPort(String),
    #[error("the probe has no exec, httpGet or tcpSocket")]
    NoAction,
    #[error("{target}: timed out after {after:?}")]
    Timeout { target: String, after: Duration },
    #[error("{target}: {source}")]
    Io {
        target: String,
        source: std::io::Error,
    },
    #[error("{target}: not an HTTP answer: {line:?}")]
    NotHttp { target: String, line: String },
    #[error("{target}: HTTP {code}")]
    Status { target: String, code: u16 },
    #[error("command {command:?} exited with {code}")]
    Exit { command: Vec<String>, code: i32 },
    #[error(transparent)]
    Exec(#[from] CriError),
}

/// A quantity that is not one (`resources` of a container).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{quantity:?} is not a quantity")]
pub struct QuantityError {
    quantity: String,
}

/// A container's resources that cannot be given to the runtime.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("resources of container {container}: {key}: {source}")]
pub struct ResourcesError {
    container: String,
    key: &'static str,
    source: QuantityError,
}

/// One probe's state for one running container.
#[derive(Clone, Debug)]
pub struct ProbeState {
    /// When the container started (its initial delay counts from here).
    pub since: Instant,
    pub last: Option<Instant>,
    pub successes: i32,
    pub failures: i32,
    /// The verdict so far: readiness starts false, liveness true.
    pub ok: bool,
    pub message: String,
}

impl ProbeState {
    pub fn new(readiness: bool) -> Self {
        Self {
            since: Instant::now(),
            last: None,
            successes: 0,
            failures: 0,
            ok: !readiness,
            message: String::new(),
        }
    }

    /// Whether `p` is due now.
    pub fn due(&self, p: &Probe, now: Instant) -> bool {
        let delay = Duration::from_secs(p.initial_delay_seconds.unwrap_or(0).max(0) as u64);
        let period = Duration::from_secs(p.period_seconds.unwrap_or(10).max(1) as u64);
        now >= self.since + delay && self.last.is_none_or(|l| now >= l + period)
    }

    /// Records a result; returns whether the verdict changed.
    pub fn record(&mut self, p: &Probe, result: Result<(), ProbeFailure>, now: Instant) -> bool {
        self.last = Some(now);
        let before = self.ok;
        match result {
            Ok(()) => {
                self.failures = 0;
                self.successes += 1;
                if self.successes >= p.success_threshold.unwrap_or(1).max(1) {
                    self.ok = true;
                    self.message.clear();
                }
            }
            Err(e) => {
                self.successes = 0;
                self.failures += 1;
                if self.failures >= p.failure_threshold.unwrap_or(3).max(1) {
                    self.ok = false;
                }
                self.message = e.to_string();
            }
        }
        before != self.ok
    }
}

/// The timeout of a probe's action.
pub fn timeout(p: &Probe) -> Duration {
    Duration::from_secs(p.timeout_seconds.unwrap_or(1).max(1) as u64)
}

fn port_of(
    port: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString,
    c: &Container,
) -> Result<u16, ProbeFailure> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| ProbeFailure::PortOutOfRange(*n)),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| ProbeFailure::NoNamedPort(name.clone())),
    }
}

/// The probe's own `host` when it names one, else the pod's.
fn given_or(given: Option<&str>, pod: &str) -> String {
    given.filter(|h| !h.is_empty()).unwrap_or(pod).to_string()
}

/// Runs an HTTP GET or TCP probe against `host` (the pod's address); an exec probe is the
/// caller's (it goes through the runtime). `None` when the probe is an exec probe.
pub async fn network(p: &Probe, c: &Container, host: &str) -> Option<Result<(), ProbeFailure>> {
    let t = timeout(p);
    if let Some(h) = &p.http_get {
        let r = async {
            let port = port_of(&h.port, c)?;
            let host = given_or(h.host.as_deref(), host);
            let path = h
                .path
                .clone()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "/".into());
            http_get(&host, port, &path, t).await
        }
        .await;
        return Some(r);
    }
    if let Some(s) = &p.tcp_socket {
        let r = async {
            let port = port_of(&s.port, c)?;
            let host = given_or(s.host.as_deref(), host);
            let target = || format!("tcp {host}:{port}");
            tokio::time::timeout(t, tokio::net::TcpStream::connect((host.as_str(), port)))
                .await
                .map_err(|_| ProbeFailure::Timeout {
                    target: target(),
                    after: t,
                })?
                .map_err(|source| ProbeFailure::Io {
                    target: target(),
                    source,
                })?;
            Ok(())
        }
        .await;
        return Some(r);
    }
    if p.exec.is_none() {
        return Some(Err(ProbeFailure::NoAction));
    }
    None
}

/// `GET path` over HTTP/1.0; 200-399 is a success, as the kubelet counts it.
async fn http_get(host: &str, port: u16, path: &str, t: Duration) -> Result<(), ProbeFailure> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let target = || format!("GET http://{host}:{port}{path}");
    let failed = |source| ProbeFailure::Io {
        target: target(),
        source,
    };
    let io = async {
        let mut s = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(failed)?;
        s.write_all(
            format!(
                "GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\nUser-Agent: edged-probe\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .map_err(failed)?;
        let mut head = [0u8; 64];
        let mut n = 0;
        while n < 12 {
            let got = s.read(&mut head[n..]).await.map_err(failed)?;
            if got == 0 {
                break;
            }
            n += got;
        }
        let line = String::from_utf8_lossy(&head[..n]).into_owned();
        let code: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| ProbeFailure::NotHttp {
                target: target(),
                line: line.clone(),
            })?;
        if (200..400).contains(&code) {
            Ok(())
        } else {
            Err(ProbeFailure::Status {
                target: target(),
                code,
            })
        }
    };
    tokio::time::timeout(t, io)
        .await
        .map_err(|_| ProbeFailure::Timeout {
            target: target(),
            after: t,
        })?
}

/// A quantity (`500m`, `2`, `128Mi`, `1G`, `1e3`) as a number of units.
pub fn quantity(q: &str) -> Result<f64, QuantityError> {
    let q = q.trim();
    let suffixes: [(&str, f64); 13] = [
        ("Ki", 1024.0),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    let (num, mult) = suffixes
        .iter()
        .find_map(|(s, m)| q.strip_suffix(s).map(|n| (n, *m)))
        .unwrap_or((q, 1.0));
    let refused = || QuantityError { quantity: q.into() };
    let v: f64 = num.parse().map_err(|_| refused())?;
    if !v.is_finite() || v < 0.0 {
        return Err(refused());
    }
    Ok(v * mult)
}

/// CRI's Linux resources of a container: CPU limit as a CFS quota over a 100 ms period, CPU
/// request as shares, memory limit in bytes.
pub fn resources(
    c: &Container,
) -> Result<Option<crate::proto::v1::LinuxContainerResources>, ResourcesError> {
    let Some(r) = &c.resources else {
        return Ok(None);
    };
    let get = |m: &Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >,
               key: &'static str|
     -> Result<Option<f64>, ResourcesError> {
        m.as_ref()
            .and_then(|m| m.get(key))
            .map(|q| {
                quantity(&q.0).map_err(|source| ResourcesError {
                    container: c.name.clone(),
                    key,
                    source,
                })
            })
            .transpose()
    };
    let cpu_limit = get(&r.limits, "cpu")?;
    let mem_limit = get(&r.limits, "memory")?;
    let cpu_request = get(&r.requests, "cpu")?.or(cpu_limit);
    if cpu_limit.is_none() && mem_limit.is_none() && cpu_request.is_none() {
        return Ok(None);
    }
    const PERIOD: i64 = 100_000;
    Ok(Some(crate::proto::v1::LinuxContainerResources {
        cpu_period: if cpu_limit.is_some() { PERIOD } else { 0 },
        cpu_quota: cpu_limit.map_or(0, |c| ((c * PERIOD as f64) as i64).max(1000)),
        cpu_shares: cpu_request.map_or(0, |c| ((c * 1024.0) as i64).max(2)),
        memory_limit_in_bytes: mem_limit.map_or(0, |m| m as i64),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_and_limits() {
        assert_eq!(quantity("500m").expect("q"), 0.5);
        assert_eq!(quantity("128Mi").expect("q"), 134_217_728.0);
        assert_eq!(quantity("1G").expect("q"), 1e9);
        assert_eq!(quantity("2").expect("q"), 2.0);
        assert!(quantity("lots").is_err());
        let c: Container = serde_json::from_value(serde_json::json!({"name": "c",
            "resources": {"limits": {"cpu": "250m", "memory": "64Mi"}}}))
        .expect("a container");
        let r = resources(&c).expect("ok").expect("some");
        assert_eq!(
            (r.cpu_period, r.cpu_quota, r.cpu_shares),
            (100_000, 25_000, 256)
        );
        assert_eq!(r.memory_limit_in_bytes, 67_108_864);
        let bad: Container = serde_json::from_value(serde_json::json!({"name": "c",
            "resources": {"limits": {"memory": "a lot"}}}))
        .expect("a container");
        let e = resources(&bad).expect_err("refused").to_string();
        assert_eq!(
            e,
            "resources of container c: memory: \"a lot\" is not a quantity"
        );
    }

    #[test]
    fn thresholds_decide_the_verdict() {
        let p: Probe =
            serde_json::from_value(serde_json::json!({"failureThreshold": 2, "periodSeconds": 1}))
                .expect("probe");
        let mut s = ProbeState::new(true);
        let now = Instant::now();
        assert!(s.due(&p, now));
        assert!(s.record(&p, Ok(()), now), "ready after one success");
        assert!(!s.due(&p, now));
        let exit = |code| ProbeFailure::Exit {
            command: vec!["check".into()],
            code,
        };
        assert!(
            !s.record(&p, Err(exit(1)), now),
            "one failure is not enough"
        );
        assert!(s.record(&p, Err(exit(2)), now));
        assert!(!s.ok);
        assert_eq!(s.message, "command [\"check\"] exited with 2");
    }
}
