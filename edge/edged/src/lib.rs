//! edged: runs pods on the gateway through a CRI runtime (containerd), as the kubelet does, for
//! the static pods of a directory (`edged.staticPodPath`).
//!
//! Every sync it compares what the directory declares with what the runtime runs, and acts on
//! the difference; its whole state is in the runtime's labels (`io.kubernetes.pod.*` as the
//! kubelet sets them, and `edgecore.kubeedge.io/managed`). An edgecore that restarts adopts the
//! pods that still run instead of restarting them. A directory that cannot be read is never
//! taken as "no pods": nothing is stopped until it reads again, and a file that stops parsing
//! keeps the pod it declared last.
//!
//! Supported: `hostNetwork` (else the runtime's CNI network, whose IP is the pod's `podIP`,
//! the target of its probes and `status.podIP` in its env), containers with image,
//! `imagePullPolicy`, command, args, `env` values, `workingDir`, `volumeMounts` of `hostPath`
//! and `emptyDir` volumes; `restartPolicy` with the kubelet's exponential backoff
//! (CrashLoopBackOff); `terminationGracePeriodSeconds`. Container logs are written by the
//! runtime under `edged.podLogDir`. Anything else of a Pod's spec is ignored and named in the
//! log.

pub mod cloud;
mod config;
mod container;
mod cri_client;
pub mod logs;
mod plan;
pub mod pods;
mod probe;
mod proto;
mod spec;
mod sync;

pub use cloud::CloudPods;
pub use pods::{ContainerView, PodView, Pods};

pub use config::Config;
use container::{Env, container_config, labels, project_volumes};
pub use cri_client::CriError;
pub use cri_client::{ContainerUsage, Runtime};
use proto::v1 as cri;
/// A registry's credentials for [`Runtime::pull_image_with`] (CRI's `AuthConfig`).
pub use proto::v1::AuthConfig;
use spec::{Desired, cloud_pod, parse_pod};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Labels on every sandbox and container edged makes (the kubelet's names, and ours).
pub const MANAGED: &str = "edgecore.kubeedge.io/managed";
pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// The pod's grace period, kept on its sandbox for when its manifest is gone.
const GRACE: &str = "edgecore.kubeedge.io/grace-seconds";

/// The node's address: the one of the interface with the default route (no packet is sent).
fn default_ip() -> Option<String> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    Some(s.local_addr().ok()?.ip().to_string())
}

/// The static pod directory, or a file in it, could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {}: {source}", path.display())]
pub struct Unreadable {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

/// The retries of one image's pulls (or of one pod's sandbox): not tried again before `until`.
#[derive(Clone, Debug)]
struct Retry {
    backoff: rt::Backoff,
    /// The pause now being waited.
    delay: Duration,
    until: Instant,
}

/// edged's state between syncs: only what the runtime cannot tell.
pub struct Edged {
    config: Config,
    runtime: Runtime,
    pods: Pods,
    /// The last good parse of each file.
    files: BTreeMap<PathBuf, Desired>,
    /// Parse errors logged, by file, with the text that failed (logged once per change).
    bad_files: HashMap<PathBuf, String>,
    /// Restart backoff by (pod uid, container name).
    backoff: HashMap<(String, String), plan::CrashLoop>,
    /// Pull backoff by image, and sandbox backoff by `sandbox {uid}`.
    pulls: HashMap<String, Retry>,
    /// Why a pod's sandbox last failed to start, by pod uid.
    sandbox_errors: HashMap<String, (String, String)>,
    /// When each running container started (by container id), from its first status.
    started: HashMap<String, i64>,
    /// By (pod uid, container name): the attempt that followed an exit, and the exit's code.
    exits: HashMap<(String, String), (u32, i32)>,
    /// Probe state by (container id, readiness?).
    probes: HashMap<(String, bool), probe::ProbeState>,
    /// The IPs of sandboxes on the runtime's network, by sandbox id.
    pod_ips: HashMap<String, String>,
    /// Pods from the cloud, and where their status goes.
    cloud: Option<CloudPods>,
    node: String,
    host_ip: Option<String>,
    /// Cloud pods refused, by uid, with why (logged once).
    bad_cloud: HashMap<String, spec::PodError>,
}

impl Edged {
    pub fn new(mut config: Config, pods: Pods, cloud: Option<CloudPods>, node: &str) -> Self {
        // The runtime is another process with another working directory: every path it is
        // given must be absolute (a relative log directory was written under containerd's).
        for p in [&mut config.static_pod_path, &mut config.pod_log_dir]
            .into_iter()
            .flatten()
        {
            if let Ok(abs) = std::path::absolute(&p) {
                *p = abs;
            }
        }
        let timeout = Duration::from_millis(config.runtime_timeout_ms.max(100));
        let runtime = Runtime::new(&config.runtime_endpoint, timeout);
        let host_ip = config.node_ip.clone().or_else(default_ip);
        Self {
            cloud,
            node: node.to_string(),
            host_ip,
            bad_cloud: HashMap::new(),
            config,
            runtime,
            pods,
            files: BTreeMap::new(),
            bad_files: HashMap::new(),
            backoff: HashMap::new(),
            pulls: HashMap::new(),
            sandbox_errors: HashMap::new(),
            started: HashMap::new(),
            exits: HashMap::new(),
            probes: HashMap::new(),
            pod_ips: HashMap::new(),
        }
    }

    fn pod_dir(&self) -> PathBuf {
        self.config
            .static_pod_path
            .clone()
            .unwrap_or_else(|| PathBuf::from("pods"))
    }

    fn log_dir(&self, d: &Desired) -> PathBuf {
        let root = self.config.pod_log_dir.as_deref();
        logs::pod_dir(
            root.unwrap_or(Path::new("pod-logs")),
            &d.namespace,
            &d.name,
            &d.uid,
        )
    }

    /// Runs until `cancel`; pods keep running when edgecore stops (they are adopted at the next
    /// start).
    pub async fn run(mut self, cancel: CancellationToken) {
        match self.runtime.version().await {
            Ok(v) => {
                tracing::info!(runtime = %v.runtime_name, version = %v.runtime_version, api = %v.runtime_api_version, endpoint = %self.config.runtime_endpoint, "edged connected to the container runtime")
            }
            Err(e) => {
                tracing::warn!(endpoint = %self.config.runtime_endpoint, error = %e, "edged cannot reach the container runtime yet; retrying")
            }
        }
        let period = Duration::from_millis(self.config.sync_period_ms.max(50));
        loop {
            if let Err(e) = self.sync().await {
                self.pods.set_runtime_error(Some(e.to_string()));
                tracing::warn!(error = %e, "edged sync failed; pods are left as they are");
            } else {
                self.pods.set_runtime_error(None);
            }
            let changed = self.cloud.as_ref().map(|c| c.changed.clone());
            let cloud_changed = async {
                match &changed {
                    Some(n) => n.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
                _ = cloud_changed => {}
            }
        }
    }

    /// Reads the directory. An error reading it leaves the last known set.
    fn read_dir(&mut self) -> Result<(), Unreadable> {
        let dir = self.pod_dir();
        let unreadable = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Unreadable { path, source }
        };
        let entries = std::fs::read_dir(&dir).map_err(unreadable(&dir))?;
        let mut seen = Vec::new();
        for entry in entries {
            let entry = entry.map_err(unreadable(&dir))?;
            let path = entry.path();
            let yaml = matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            );
            if !yaml {
                continue;
            }
            let text = std::fs::read_to_string(&path).map_err(unreadable(&path))?;
            seen.push(path.clone());
            match parse_pod(&path, &text) {
                Ok(d) => {
                    self.bad_files.remove(&path);
                    self.files.insert(path, d);
                }
                Err(e) => {
                    if self.bad_files.get(&path) != Some(&text) {
                        tracing::warn!(error = %e, "static pod manifest refused; the pod it declared before (if any) keeps running");
                        self.pods.set_file_error(&path, Some(e.to_string()));
                        self.bad_files.insert(path, text);
                    }
                }
            }
        }
        self.files.retain(|f, _| seen.contains(f));
        self.bad_files.retain(|f, _| seen.contains(f));
        self.pods
            .retain_file_errors(|f| seen.iter().any(|s| s == f));
        for f in seen.iter().filter(|f| !self.bad_files.contains_key(*f)) {
            self.pods.set_file_error(f, None);
        }
        Ok(())
    }

    /// One comparison of the declared pods with the runtime's, and the actions it calls for.
    pub async fn sync(&mut self) -> Result<(), CriError> {
        if let Err(e) = self.read_dir() {
            // Never "everything was deleted": what runs keeps running.
            tracing::warn!(error = %e, "static pods not re-read; the running ones are kept");
        }
        let mut desired: BTreeMap<String, Desired> = BTreeMap::new();
        for d in self.files.values() {
            let key = format!("{}/{}", d.namespace, d.name);
            if let Some(other) = desired.get(&key) {
                tracing::warn!(pod = %key, file = %d.file.display(), other = %other.file.display(), "two static pod files declare the same pod; the first is used");
                continue;
            }
            desired.insert(key, d.clone());
        }
        let cloud_pods = self.cloud.as_ref().map(CloudPods::pods).unwrap_or_default();
        let mut seen_bad = Vec::new();
        for p in &cloud_pods {
            let uid = p.metadata.uid.clone().unwrap_or_default();
            let host = spec::HostAccess {
                path_prefixes: self.config.host_path_prefixes.clone(),
                network: self.config.host_network,
            };
            match cloud_pod(p, &self.node, &host) {
                Ok(d) => {
                    let key = format!("{}/{}", d.namespace, d.name);
                    if let Some(other) = desired.get(&key) {
                        tracing::warn!(pod = %key, file = %other.file.display(), "a pod from the cloud has the name of a static pod; the static pod runs");
                        continue;
                    }
                    desired.insert(key, d);
                }
                Err(e) => {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    if self.bad_cloud.get(&uid) != Some(&e) {
                        tracing::warn!(pod = %name, error = %e, "a pod from the cloud is refused");
                        self.bad_cloud.insert(uid.clone(), e.clone());
                    }
                    if let Some(c) = &self.cloud {
                        let ns = p
                            .metadata
                            .namespace
                            .clone()
                            .unwrap_or_else(|| "default".into());
                        let mut view = PodView::new(&ns, &name, &uid, "cloud");
                        view.phase = "Failed".into();
                        view.reason = "InvalidPodSpec".into();
                        view.message = e.to_string();
                        c.report(
                            (ns, name),
                            &uid,
                            cloud::pod_status(&view, self.host_ip.as_deref(), false),
                        );
                    }
                    seen_bad.push(uid);
                }
            }
        }
        self.bad_cloud.retain(|u, _| seen_bad.contains(u));
        let sandboxes = self.runtime.list_sandboxes().await?;
        self.pod_ips
            .retain(|id, _| sandboxes.iter().any(|s| s.id == *id));
        let containers = self.runtime.list_containers().await?;
        let running = |id: &String| {
            containers
                .iter()
                .any(|c| &c.id == id && c.state == cri::ContainerState::ContainerRunning as i32)
        };
        self.started.retain(|id, _| running(id));
        self.probes.retain(|(id, _), _| running(id));

        // Sandboxes of pods no longer declared, of an older version, or not ready: torn down.
        let wanted: HashMap<&str, &Desired> =
            desired.values().map(|d| (d.uid.as_str(), d)).collect();
        for s in &sandboxes {
            let uid = s.labels.get(POD_UID).map(String::as_str).unwrap_or("");
            let ready = s.state == cri::PodSandboxState::SandboxReady as i32;
            if wanted.contains_key(uid) && ready {
                continue;
            }
            let grace = s
                .annotations
                .get(GRACE)
                .and_then(|g| g.parse().ok())
                .unwrap_or(30);
            let name = s.labels.get(POD_NAME).cloned().unwrap_or_default();
            tracing::info!(pod = %name, sandbox = %s.id, ready, "stopping a pod that is no longer declared as it runs");
            for c in containers.iter().filter(|c| c.pod_sandbox_id == s.id) {
                if c.state == cri::ContainerState::ContainerRunning as i32 {
                    self.runtime.stop_container(&c.id, grace).await?;
                }
            }
            self.runtime.stop_sandbox(&s.id).await?;
            self.runtime.remove_sandbox(&s.id).await?;
        }

        let mut views = Vec::new();
        for d in desired.values() {
            let sandbox = sandboxes.iter().find(|s| {
                s.labels.get(POD_UID) == Some(&d.uid)
                    && s.state == cri::PodSandboxState::SandboxReady as i32
            });
            let view = self.sync_pod(d, sandbox, &containers).await;
            if d.cloud
                && let Some(c) = &self.cloud
            {
                let status = cloud::pod_status(&view, self.host_ip.as_deref(), d.host_network());
                c.report((d.namespace.clone(), d.name.clone()), &d.uid, status);
            }
            views.push(view);
        }
        self.pods.set(views);
        let uids: Vec<&String> = desired.values().map(|d| &d.uid).collect();
        self.backoff.retain(|(uid, _), _| uids.contains(&uid));
        self.exits.retain(|(uid, _), _| uids.contains(&uid));
        self.sandbox_errors.retain(|uid, _| uids.contains(&uid));
        self.pulls.retain(|k, _| {
            k.strip_prefix("sandbox ")
                .is_none_or(|u| uids.iter().any(|x| *x == u))
        });
        Ok(())
    }
}

fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}
