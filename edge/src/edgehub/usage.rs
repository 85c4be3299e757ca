//! What this node and its pods use, for `kubectl top` in the cloud (the metrics API that
//! metrics-server serves on a cluster): sampled every `cloud.metricsSeconds`, sent up over the
//! session as `node/{node}/metrics` (the latest only; nothing is kept or resent). CPU is a rate
//! between two samples (nanocores): the node's from `/proc/stat`, each container's from the
//! runtime's cumulative usage (CRI `ListContainerStats`); memory is the node's in use
//! (`MemTotal - MemAvailable`) and each container's working set.

use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::Instant;

/// The message's resource: cloudhub keeps the latest per node.
pub(crate) const RESOURCE: &str = "metrics";

/// The CPU time counters of `/proc/stat`'s first line: (busy, total), in clock ticks.
pub(crate) fn cpu_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 4 {
        return None;
    }
    let total: u64 = v.iter().take(8).sum();
    // idle and iowait are not busy.
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// Memory in use, bytes: `MemTotal - MemAvailable` of `/proc/meminfo`.
pub(crate) fn memory_in_use(meminfo: &str) -> Option<u64> {
    let field = |name: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    Some(field("MemTotal:")?.saturating_sub(field("MemAvailable:")?))
}

pub(crate) use edged::ContainerUsage as ContainerSample;

/// Rates between samples.
#[derive(Default)]
pub(crate) struct Sampler {
    node: Option<(Instant, u64)>,
    containers: HashMap<(String, String, String), (u64, i64)>,
    /// Clock ticks per second of `/proc/stat` (USER_HZ, 100 on Linux).
    pub(crate) ticks_per_second: u64,
}

impl Sampler {
    pub(crate) fn new() -> Self {
        Self {
            ticks_per_second: 100,
            ..Self::default()
        }
    }

    /// The node's CPU in nanocores since the last sample (none at the first).
    pub(crate) fn node_cpu(&mut self, now: Instant, busy_ticks: u64) -> Option<u64> {
        let rate = self.node.and_then(|(then, before)| {
            let secs = now.duration_since(then).as_secs_f64();
            (secs > 0.0).then(|| {
                let ticks = busy_ticks.saturating_sub(before) as f64;
                (ticks / self.ticks_per_second.max(1) as f64 / secs * 1e9) as u64
            })
        });
        self.node = Some((now, busy_ticks));
        rate
    }

    /// Each container's CPU in nanocores since its last sample (a container seen for the
    /// first time, or restarted, has none yet) and its memory; containers gone are forgotten.
    pub(crate) fn containers(
        &mut self,
        samples: &[ContainerSample],
    ) -> Vec<(ContainerSample, u64)> {
        let mut next = HashMap::new();
        let mut out = Vec::new();
        for s in samples {
            let key = (s.namespace.clone(), s.pod.clone(), s.container.clone());
            if let Some((cpu, at)) = self.containers.get(&key)
                && s.at_ns > *at
                && s.cpu_ns >= *cpu
            {
                let rate = (s.cpu_ns - cpu) as f64 / ((s.at_ns - at) as f64 / 1e9);
                out.push((s.clone(), rate as u64));
            }
            next.insert(key, (s.cpu_ns, s.at_ns));
        }
        self.containers = next;
        out
    }
}

/// The message's content: the node's usage and its pods', as the metrics API shows them.
pub(crate) fn content(
    timestamp: &str,
    window_seconds: u64,
    node: Option<(u64, u64)>,
    containers: &[(ContainerSample, u64)],
) -> Value {
    let mut pods: std::collections::BTreeMap<(String, String), Vec<Value>> = Default::default();
    for (s, cpu) in containers {
        pods.entry((s.namespace.clone(), s.pod.clone()))
            .or_default()
            .push(json!({"name": s.container, "cpu": cpu, "memory": s.memory}));
    }
    json!({
        "timestamp": timestamp,
        "window": window_seconds,
        "node": node.map(|(cpu, memory)| json!({"cpu": cpu, "memory": memory})),
        "pods": pods.into_iter().map(|((ns, name), containers)| json!({"namespace": ns, "name": name, "containers": containers})).collect::<Vec<_>>(),
    })
}

/// One sample: the node's `/proc` files and the runtime's stats (when edged runs), as the
/// message's content; none until a rate can be given.
pub(crate) async fn sample(
    sampler: &mut Sampler,
    runtime: Option<&edged::Runtime>,
    window_seconds: u64,
) -> Option<Value> {
    let now = Instant::now();
    let stat = tokio::fs::read_to_string("/proc/stat").await.ok();
    let meminfo = tokio::fs::read_to_string("/proc/meminfo").await.ok();
    let node_cpu = stat
        .as_deref()
        .and_then(cpu_ticks)
        .and_then(|(busy, _)| sampler.node_cpu(now, busy));
    let node = node_cpu.zip(meminfo.as_deref().and_then(memory_in_use));
    let containers = match runtime {
        Some(rt) => match rt.container_usage().await {
            Ok(u) => sampler.containers(&u),
            Err(e) => {
                tracing::debug!(error = %e, "edgehub: no container stats for kubectl top");
                Vec::new()
            }
        },
        None => Vec::new(),
    };
    if node.is_none() && containers.is_empty() {
        return None;
    }
    let timestamp = api::rfc3339::now();
    Some(content(&timestamp, window_seconds, node, &containers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn proc_files_are_read_as_the_kernel_writes_them() {
        let stat = "cpu  100 5 50 800 20 1 2 0 0 0\ncpu0 50 2 25 400 10 0 1 0 0 0\n";
        assert_eq!(cpu_ticks(stat), Some((158, 978)));
        assert_eq!(cpu_ticks("intr 1 2 3\n"), None);
        let mem = "MemTotal:       16000 kB\nMemFree:         1000 kB\nMemAvailable:    6000 kB\n";
        assert_eq!(memory_in_use(mem), Some(10000 * 1024));
        assert_eq!(memory_in_use("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn rates_come_from_two_samples_and_a_restart_starts_again() {
        let mut s = Sampler::new();
        let t = Instant::now();
        assert_eq!(s.node_cpu(t, 1000), None);
        // 50 ticks in half a second at 100 ticks/s: one core.
        assert_eq!(
            s.node_cpu(t + Duration::from_millis(500), 1050),
            Some(1_000_000_000)
        );
        let c = |cpu_ns, at_ns| ContainerSample {
            namespace: "default".into(),
            pod: "p".into(),
            container: "c".into(),
            cpu_ns,
            at_ns,
            memory: 4096,
        };
        assert!(s.containers(&[c(1_000_000_000, 1_000_000_000)]).is_empty());
        let r = s.containers(&[c(1_250_000_000, 2_000_000_000)]);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].1, 250_000_000, "a quarter of a core");
        // Restarted: its counter went back; no rate until the next sample.
        assert!(s.containers(&[c(10, 3_000_000_000)]).is_empty());
        let v = content("2026-11-28T00:00:00Z", 15, Some((5, 6)), &r);
        assert_eq!(v["pods"][0]["containers"][0]["cpu"], 250_000_000);
        assert_eq!(v["node"]["memory"], 6);
    }
}
