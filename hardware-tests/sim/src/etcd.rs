//! A real etcd cluster on loopback (Debian's `etcd-server`): one member or several, each its own
//! process and data directory, for the API's store tests and cloudcore's replica tests. Members
//! can be killed and started again; etcd's history can be compacted.

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether the `etcd` binary is here (`scripts/test` installs it).
pub fn available() -> bool {
    Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

struct Member {
    name: String,
    client: u16,
    peer: u16,
    /// Plain HTTP `/health` (and metrics), beside TLS client URLs.
    metrics: u16,
    child: Option<Child>,
}

impl Member {
    /// An error with its log when the member's process has exited (`dir`: the cluster's).
    fn running(&mut self, dir: &std::path::Path) -> Result<()> {
        if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
            bail!(
                "etcd member {} exited with {status}: {}",
                self.name,
                std::fs::read_to_string(dir.join(format!("{}.log", self.name))).unwrap_or_default()
            );
        }
        Ok(())
    }

    /// The body of `path` on the member's plain HTTP port, if it answers.
    fn fetch(&self, path: &str) -> Option<String> {
        ureq::get(&format!("http://127.0.0.1:{}{path}", self.metrics))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
    }
}

/// TLS of the client URLs: etcd's certificate and key, and the CA its clients' certificates
/// must be signed by (`--client-cert-auth`); PEM files.
#[derive(Clone, Debug)]
pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

/// A running etcd cluster; stopped (and its data removed) when dropped.
pub struct EtcdCluster {
    members: Vec<Member>,
    tls: Option<Tls>,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// `n` members on free loopback ports, healthy (a leader elected) when this returns.
    pub fn start(n: usize) -> Result<Self> {
        Self::start_with(n, None)
    }

    /// [`EtcdCluster::start`] with TLS on the client URLs (`https://`), clients authenticated by
    /// certificate.
    pub fn start_with(n: usize, tls: Option<Tls>) -> Result<Self> {
        let mut last = None;
        // A port taken between choosing it and etcd binding it: start over on others.
        for _ in 0..3 {
            match Self::try_start(n, tls.clone()) {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("etcd did not start")))
    }

    fn try_start(n: usize, tls: Option<Tls>) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client: crate::free_port(),
                peer: crate::free_port(),
                metrics: crate::free_port(),
                child: None,
            })
            .collect();
        let mut c = Self { members, tls, dir };
        for i in 0..n {
            c.spawn(i, true)?;
        }
        c.wait_healthy(Duration::from_secs(60))?;
        Ok(c)
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, i: usize, new: bool) -> Result<()> {
        let cluster = self.initial_cluster();
        let dir = self.dir.path().to_path_buf();
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut tls_args: Vec<String> = Vec::new();
        if let Some(t) = &self.tls {
            for (flag, p) in [
                ("--cert-file", &t.cert),
                ("--key-file", &t.key),
                ("--trusted-ca-file", &t.client_ca),
            ] {
                tls_args.push(flag.into());
                tls_args.push(p.display().to_string());
            }
            tls_args.push("--client-cert-auth".into());
        }
        let m = &mut self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{}.log", m.name)))?;
        let child = Command::new("etcd")
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(dir.join(&m.name))
            .args([
                "--listen-client-urls",
                &format!("{scheme}://127.0.0.1:{}", m.client),
                "--advertise-client-urls",
                &format!("{scheme}://127.0.0.1:{}", m.client),
                "--listen-metrics-urls",
                &format!("http://127.0.0.1:{}", m.metrics),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{}", m.peer),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{}", m.peer),
                "--initial-cluster",
                &cluster,
                "--initial-cluster-token",
                "sim",
                "--initial-cluster-state",
                if new { "new" } else { "existing" },
                // A busy test machine: slower heartbeats than the defaults keep one leader.
                "--heartbeat-interval",
                "200",
                "--election-timeout",
                "2000",
                "--log-level",
                "warn",
            ])
            .args(&tls_args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("cannot run etcd (apt-get install etcd-server)")?;
        m.child = Some(child);
        Ok(())
    }

    /// Waits until every running member answers `/health` with a leader.
    fn wait_healthy(&mut self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let mut all = true;
            for m in &mut self.members {
                if m.child.is_none() {
                    continue;
                }
                m.running(self.dir.path())?;
                let healthy = m.fetch("/health").is_some_and(|b| b.contains("\"true\""));
                all &= healthy;
            }
            if all {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("etcd did not become healthy within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The members' client URLs.
    pub fn endpoints(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.members
            .iter()
            .map(|m| format!("{scheme}://127.0.0.1:{}", m.client))
            .collect()
    }

    /// The `host:port` of the running members' metrics (`/metrics`, plain HTTP).
    pub fn metrics_addrs(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| format!("127.0.0.1:{}", m.metrics))
            .collect()
    }

    /// The process ids of the members running now.
    pub fn pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|m| m.child.as_ref().map(Child::id))
            .collect()
    }

    /// `kill -9` of member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data, and waits until it has rejoined: it knows the
    /// cluster's leader (`etcd_server_has_leader 1` in its metrics). Not `/health`: in etcd 3.4
    /// that is a read through raft with a short timeout, which a cluster under a fleet's writes
    /// can fail for minutes while every member serves.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        self.kill(i);
        self.spawn(i, false)?;
        let within = Duration::from_secs(60);
        let deadline = Instant::now() + within;
        loop {
            let m = &mut self.members[i];
            m.running(self.dir.path())?;
            let rejoined = m
                .fetch("/metrics")
                .is_some_and(|b| b.lines().any(|l| l == "etcd_server_has_leader 1"));
            if rejoined {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "etcd member {} did not rejoin (know a leader) within {within:?}",
                    m.name
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The index of the member that leads the cluster now, as the running members say
    /// (etcd's JSON gateway, `maintenance/status`). Plain HTTP clusters only.
    pub fn leader(&self) -> Result<usize> {
        let mut ids = Vec::new();
        let mut leader = None;
        for m in &self.members {
            if m.child.is_none() {
                ids.push(None);
                continue;
            }
            let s: Value = ureq::post(&format!(
                "http://127.0.0.1:{}/v3/maintenance/status",
                m.client
            ))
            .send_json(json!({}))?
            .body_mut()
            .read_json()?;
            ids.push(s["header"]["member_id"].as_str().map(str::to_string));
            leader = leader.or(s["leader"].as_str().map(str::to_string));
        }
        let leader = leader.context("no running member names a leader")?;
        ids.iter()
            .position(|id| id.as_deref() == Some(leader.as_str()))
            .context("the leader is not a running member")
    }

    /// Compacts etcd's history to its current revision (what a long-running cluster does);
    /// returns that revision. Plain HTTP clusters only.
    pub fn compact(&self) -> Result<u64> {
        let url = self
            .members
            .iter()
            .find(|m| m.child.is_some())
            .map(|m| format!("http://127.0.0.1:{}", m.client))
            .context("no etcd member is running")?;
        // etcd's JSON gateway: bytes are base64 (`AA==` is the key "\0", any key will do).
        let r: Value = ureq::post(&format!("{url}/v3/kv/range"))
            .send_json(json!({"key": "AA=="}))?
            .body_mut()
            .read_json()?;
        let rev: u64 = r["header"]["revision"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .context("etcd's range answer has no revision")?;
        ureq::post(&format!("{url}/v3/kv/compaction"))
            .send_json(json!({"revision": rev.to_string(), "physical": true}))?;
        Ok(rev)
    }

    /// The data directory (members' logs are `m{i}.log` in it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The members' logs, for a failed test's message.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                let p: PathBuf = self.dir.path().join(format!("{}.log", m.name));
                format!(
                    "--- {} ---\n{}",
                    m.name,
                    std::fs::read_to_string(p).unwrap_or_default()
                )
            })
            .collect()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
