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
//! Supported: `hostNetwork` (else the runtime's CNI network), containers with image,
//! `imagePullPolicy`, command, args, `env` values, `workingDir`, `volumeMounts` of `hostPath`
//! and `emptyDir` volumes; `restartPolicy` with the kubelet's exponential backoff
//! (CrashLoopBackOff); `terminationGracePeriodSeconds`. Container logs are written by the
//! runtime under `edged.podLogDir`. Anything else of a Pod's spec is ignored and named in the
//! log.

mod cri_client;
pub mod pods;

pub use pods::{ContainerView, PodView, Pods};

use crate::config::Edged as Config;
use api::cri::v1 as cri;
use cri_client::Runtime;
use k8s_openapi::api::core::v1::Pod;
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

/// A container that ran this long has its backoff reset.
const BACKOFF_RESET: Duration = Duration::from_secs(600);

/// A pod declared in the directory.
#[derive(Clone, Debug)]
struct Desired {
    file: PathBuf,
    namespace: String,
    name: String,
    uid: String,
    pod: Pod,
}

impl Desired {
    fn grace(&self) -> i64 {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30)
    }
}

/// Parses a static pod file. The uid is the manifest's own, or a hash of its content (as the
/// kubelet does for static pods): a changed manifest is a new pod.
fn parse_pod(file: &Path, text: &str) -> Result<Desired, String> {
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let pod: Pod = serde_path_to_error::deserialize(de)
        .map_err(|e| format!("{}: at {}: {}", file.display(), e.path(), e.inner()))?;
    let name = pod
        .metadata
        .name
        .clone()
        .ok_or_else(|| format!("{}: metadata.name is missing", file.display()))?;
    api::validate::names::check_dns1123_subdomain(&name)
        .map_err(|m| format!("{}: metadata.name: {m}", file.display()))?;
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let spec = pod
        .spec
        .as_ref()
        .ok_or_else(|| format!("{}: spec is missing", file.display()))?;
    if spec.containers.is_empty() {
        return Err(format!("{}: spec.containers is empty", file.display()));
    }
    for c in &spec.containers {
        if c.image.as_deref().unwrap_or("").is_empty() {
            return Err(format!(
                "{}: spec.containers[{}].image is missing",
                file.display(),
                c.name
            ));
        }
    }
    let uid = match &pod.metadata.uid {
        Some(u) => u.clone(),
        None => {
            let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
            digest.as_ref()[..16]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        }
    };
    Ok(Desired {
        file: file.to_path_buf(),
        namespace,
        name,
        uid,
        pod,
    })
}

/// Restart delays of one container (or of one image's pulls).
#[derive(Clone, Copy, Debug)]
struct Backoff {
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
    /// Restart backoff by (pod uid, container name), and the exited container it was counted for.
    backoff: HashMap<(String, String), (Backoff, String)>,
    /// Pull backoff by image, and sandbox backoff by `sandbox {uid}`.
    pulls: HashMap<String, Backoff>,
    /// Why a pod's sandbox last failed to start, by pod uid.
    sandbox_errors: HashMap<String, (String, String)>,
    /// When each running container started (by container id), from its first status.
    started: HashMap<String, i64>,
}

impl Edged {
    pub fn new(mut config: Config, pods: Pods) -> Self {
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
        Self {
            config,
            runtime,
            pods,
            files: BTreeMap::new(),
            bad_files: HashMap::new(),
            backoff: HashMap::new(),
            pulls: HashMap::new(),
            sandbox_errors: HashMap::new(),
            started: HashMap::new(),
        }
    }

    fn pod_dir(&self) -> PathBuf {
        self.config
            .static_pod_path
            .clone()
            .unwrap_or_else(|| PathBuf::from("pods"))
    }

    fn log_dir(&self, d: &Desired) -> PathBuf {
        self.config
            .pod_log_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("pod-logs"))
            .join(format!("{}_{}_{}", d.namespace, d.name, d.uid))
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
                self.pods.set_runtime_error(Some(e.clone()));
                tracing::warn!(error = %e, "edged sync failed; pods are left as they are");
            } else {
                self.pods.set_runtime_error(None);
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
        }
    }

    /// Reads the directory. An error reading it leaves the last known set.
    fn read_dir(&mut self) -> Result<(), String> {
        let dir = self.pod_dir();
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| format!("cannot read staticPodPath {}: {e}", dir.display()))?;
        let mut seen = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
            let path = entry.path();
            let yaml = matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            );
            if !yaml {
                continue;
            }
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            seen.push(path.clone());
            match parse_pod(&path, &text) {
                Ok(d) => {
                    self.bad_files.remove(&path);
                    self.files.insert(path, d);
                }
                Err(e) => {
                    if self.bad_files.get(&path) != Some(&text) {
                        tracing::warn!(error = %e, "static pod manifest refused; the pod it declared before (if any) keeps running");
                        self.pods.set_file_error(&path, Some(e));
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
    pub async fn sync(&mut self) -> Result<(), String> {
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
        let sandboxes = self.runtime.list_sandboxes().await?;
        let containers = self.runtime.list_containers().await?;
        self.started.retain(|id, _| {
            containers
                .iter()
                .any(|c| &c.id == id && c.state == cri::ContainerState::ContainerRunning as i32)
        });

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
            views.push(view);
        }
        self.pods.set(views);
        let uids: Vec<&String> = desired.values().map(|d| &d.uid).collect();
        self.backoff.retain(|(uid, _), _| uids.contains(&uid));
        self.sandbox_errors.retain(|uid, _| uids.contains(&uid));
        self.pulls.retain(|k, _| {
            k.strip_prefix("sandbox ")
                .is_none_or(|u| uids.iter().any(|x| *x == u))
        });
        Ok(())
    }

    fn sandbox_config(&self, d: &Desired) -> cri::PodSandboxConfig {
        let host_network = d
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        let network = if host_network {
            cri::NamespaceMode::Node
        } else {
            cri::NamespaceMode::Pod
        };
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: d.name.clone(),
                uid: d.uid.clone(),
                namespace: d.namespace.clone(),
                attempt: 0,
            }),
            hostname: if host_network {
                String::new()
            } else {
                d.name.clone()
            },
            log_directory: self.log_dir(d).display().to_string(),
            labels: labels(d, None),
            annotations: [(GRACE.to_string(), d.grace().to_string())].into(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: String::new(),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: network as i32,
                        pid: cri::NamespaceMode::Container as i32,
                        ipc: cri::NamespaceMode::Pod as i32,
                    }),
                    privileged: false,
                }),
            }),
        }
    }

    /// Brings one pod to its spec; returns its status.
    async fn sync_pod(
        &mut self,
        d: &Desired,
        sandbox: Option<&cri::PodSandbox>,
        containers: &[cri::Container],
    ) -> PodView {
        let mut view = PodView::new(&d.namespace, &d.name, &d.uid, &d.file);
        let sandbox_config = self.sandbox_config(d);
        let sandbox_id = match sandbox {
            Some(s) => s.id.clone(),
            None => {
                if let Err(e) = std::fs::create_dir_all(self.log_dir(d)) {
                    view.fail("CreatePodSandboxError", &format!("log directory: {e}"));
                    return view;
                }
                // A sandbox that failed to start is retried with the same backoff as a pull.
                let key = format!("sandbox {}", d.uid);
                if let Some(b) = self.pulls.get(&key)
                    && Instant::now() < b.until
                {
                    let (reason, message) =
                        self.sandbox_errors.get(&d.uid).cloned().unwrap_or_default();
                    view.fail(&reason, &format!("{message} (retried in {:?})", b.delay));
                    return view;
                }
                tracing::info!(pod = %d.name, namespace = %d.namespace, "starting pod sandbox");
                match self.runtime.run_sandbox(sandbox_config.clone()).await {
                    Ok(id) => {
                        self.pulls.remove(&key);
                        self.sandbox_errors.remove(&d.uid);
                        id
                    }
                    Err(e) => {
                        tracing::warn!(pod = %d.name, namespace = %d.namespace, error = %e, "pod sandbox failed to start");
                        self.note_failure(key);
                        self.sandbox_errors
                            .insert(d.uid.clone(), ("CreatePodSandboxError".into(), e.clone()));
                        view.fail("CreatePodSandboxError", &e);
                        return view;
                    }
                }
            }
        };
        view.sandbox_id = sandbox_id.clone();
        let Some(spec) = d.pod.spec.as_ref() else {
            return view;
        };
        let policy = spec
            .restart_policy
            .as_deref()
            .unwrap_or("Always")
            .to_string();
        for c in &spec.containers {
            let mine: Vec<&cri::Container> = containers
                .iter()
                .filter(|x| {
                    x.pod_sandbox_id == sandbox_id && x.labels.get(CONTAINER_NAME) == Some(&c.name)
                })
                .collect();
            let cv = self
                .sync_container(d, &sandbox_id, &sandbox_config, c, &policy, &mine)
                .await;
            view.containers.push(cv);
        }
        view.finish(&policy);
        view
    }

    async fn sync_container(
        &mut self,
        d: &Desired,
        sandbox_id: &str,
        sandbox_config: &cri::PodSandboxConfig,
        c: &k8s_openapi::api::core::v1::Container,
        policy: &str,
        mine: &[&cri::Container],
    ) -> ContainerView {
        let image = c.image.clone().unwrap_or_default();
        let mut cv = ContainerView::new(&c.name, &image);
        let latest = mine
            .iter()
            .max_by_key(|x| x.metadata.as_ref().map(|m| m.attempt).unwrap_or(0))
            .copied();
        let key = (d.uid.clone(), c.name.clone());
        let attempt = match latest {
            None => 0,
            Some(l) => {
                let attempt = l.metadata.as_ref().map(|m| m.attempt).unwrap_or(0);
                cv.restart_count = attempt;
                cv.container_id = l.id.clone();
                let running = l.state == cri::ContainerState::ContainerRunning as i32;
                // A running container's start time does not change: asked for once, not at
                // every sync.
                let known = running.then(|| self.started.get(&l.id).copied()).flatten();
                let status = match known {
                    Some(_) => None,
                    None => match self.runtime.container_status(&l.id).await {
                        Ok(s) => Some(s),
                        Err(e) => {
                            cv.waiting("Unknown", &e);
                            return cv;
                        }
                    },
                };
                if running {
                    let started = known
                        .or(status.as_ref().map(|s| s.started_at))
                        .unwrap_or_default();
                    self.started.insert(l.id.clone(), started);
                    cv.running(started);
                    let ran = now_nanos().saturating_sub(started);
                    if ran > BACKOFF_RESET.as_nanos() as i64 {
                        self.backoff.remove(&key);
                    }
                    return cv;
                }
                let Some(status) = status else {
                    return cv;
                };
                let exited = l.state == cri::ContainerState::ContainerExited as i32;
                cv.terminated(status.exit_code, &status.reason, status.finished_at);
                let restart = match policy {
                    "Never" => false,
                    "OnFailure" => !exited || status.exit_code != 0,
                    _ => true,
                };
                if !restart {
                    return cv;
                }
                // Counted once per exited container: the delay doubles at each exit.
                let now = Instant::now();
                let entry = self.backoff.get(&key).cloned();
                let b = match entry {
                    Some((b, counted)) if counted == l.id => b,
                    Some((b, _)) => {
                        let delay =
                            (b.delay * 2).min(Duration::from_millis(self.config.max_backoff_ms));
                        let nb = Backoff {
                            delay,
                            until: now + delay,
                        };
                        self.backoff.insert(key.clone(), (nb, l.id.clone()));
                        nb
                    }
                    None => {
                        let delay = Duration::from_millis(self.config.initial_backoff_ms);
                        let nb = Backoff {
                            delay,
                            until: now + delay,
                        };
                        self.backoff.insert(key.clone(), (nb, l.id.clone()));
                        nb
                    }
                };
                if now < b.until {
                    cv.back_off(
                        "CrashLoopBackOff",
                        &format!(
                            "back-off {:?} restarting failed container {} (exit code {})",
                            b.delay, c.name, status.exit_code
                        ),
                    );
                    return cv;
                }
                attempt + 1
            }
        };
        // Pull (by policy) and start a new attempt.
        if let Err((reason, message)) = self.ensure_image(&image, c).await {
            cv.waiting(&reason, &message);
            return cv;
        }
        let config = match container_config(d, c, attempt, &self.pod_data_dir(d)) {
            Ok(cfg) => cfg,
            Err(e) => {
                cv.waiting("CreateContainerConfigError", &e);
                return cv;
            }
        };
        // The runtime writes the log file; its directory is the caller's to make.
        let log_dir = self.log_dir(d).join(&c.name);
        if let Err(e) = std::fs::create_dir_all(&log_dir) {
            cv.waiting(
                "CreateContainerError",
                &format!("log directory {}: {e}", log_dir.display()),
            );
            return cv;
        }
        let created = self
            .runtime
            .create_container(sandbox_id, config, sandbox_config.clone())
            .await;
        let id = match created {
            Ok(id) => id,
            Err(e) => {
                cv.waiting("CreateContainerError", &e);
                return cv;
            }
        };
        if let Err(e) = self.runtime.start_container(&id).await {
            cv.waiting("RunContainerError", &e);
            return cv;
        }
        tracing::info!(pod = %d.name, container = %c.name, attempt, "container started");
        // The kubelet keeps the last dead container (for its logs); older ones go.
        for old in mine {
            let a = old.metadata.as_ref().map(|m| m.attempt).unwrap_or(0);
            if a + 1 < attempt
                && let Err(e) = self.runtime.remove_container(&old.id).await
            {
                tracing::debug!(container = %old.id, error = %e, "cannot remove an old container");
            }
        }
        cv.container_id = id;
        cv.restart_count = attempt;
        cv.running(now_nanos());
        cv
    }

    /// Another failure of `key` (an image's pull, a pod's sandbox): retried after the backoff.
    fn note_failure(&mut self, key: String) {
        let delay = self
            .pulls
            .get(&key)
            .map_or(Duration::from_millis(self.config.initial_backoff_ms), |b| {
                (b.delay * 2).min(Duration::from_millis(self.config.max_backoff_ms))
            });
        self.pulls.insert(
            key,
            Backoff {
                delay,
                until: Instant::now() + delay,
            },
        );
    }

    fn pod_data_dir(&self, d: &Desired) -> PathBuf {
        self.config
            .pod_log_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("pod-logs"))
            .with_file_name("pod-volumes")
            .join(&d.uid)
    }

    /// The image is present, or pulled as the pull policy says. A pull that fails while the
    /// image is present uses the present one (an offline gateway keeps restarting its pods).
    async fn ensure_image(
        &mut self,
        image: &str,
        c: &k8s_openapi::api::core::v1::Container,
    ) -> Result<(), (String, String)> {
        let policy = c.image_pull_policy.clone().unwrap_or_else(|| {
            let tag = image.rsplit('/').next().unwrap_or(image);
            if !tag.contains(':') || tag.ends_with(":latest") {
                "Always".into()
            } else {
                "IfNotPresent".into()
            }
        });
        let present = self
            .runtime
            .image_present(image)
            .await
            .map_err(|e| ("ErrImageInspect".to_string(), e))?;
        match policy.as_str() {
            "Never" if !present => {
                return Err((
                    "ErrImageNeverPull".into(),
                    format!("image {image} is not present and imagePullPolicy is Never"),
                ));
            }
            "Never" => return Ok(()),
            "IfNotPresent" if present => return Ok(()),
            _ => {}
        }
        if let Some(b) = self.pulls.get(image)
            && Instant::now() < b.until
        {
            if present {
                return Ok(());
            }
            return Err((
                "ImagePullBackOff".into(),
                format!("back-off {:?} pulling image {image}", b.delay),
            ));
        }
        match self.runtime.pull_image(image).await {
            Ok(_) => {
                self.pulls.remove(image);
                Ok(())
            }
            Err(e) => {
                self.note_failure(image.to_string());
                if present {
                    tracing::warn!(image, error = %e, "image pull failed; the present image is used");
                    return Ok(());
                }
                tracing::warn!(image, error = %e, "image pull failed");
                Err(("ErrImagePull".into(), format!("pulling {image}: {e}")))
            }
        }
    }
}

fn labels(d: &Desired, container: Option<&str>) -> HashMap<String, String> {
    let mut l: HashMap<String, String> = [
        (MANAGED.to_string(), "true".to_string()),
        (POD_NAME.to_string(), d.name.clone()),
        (POD_NAMESPACE.to_string(), d.namespace.clone()),
        (POD_UID.to_string(), d.uid.clone()),
    ]
    .into();
    if let Some(c) = container {
        l.insert(CONTAINER_NAME.to_string(), c.to_string());
    }
    l
}

/// The CRI container of a Pod's container: command, args, env values, working directory and
/// the mounts of its `hostPath` and `emptyDir` volumes.
fn container_config(
    d: &Desired,
    c: &k8s_openapi::api::core::v1::Container,
    attempt: u32,
    volumes_dir: &Path,
) -> Result<cri::ContainerConfig, String> {
    let mut envs = Vec::new();
    for e in c.env.iter().flatten() {
        if e.value_from.is_some() {
            return Err(format!(
                "env {} of container {}: valueFrom is not supported yet",
                e.name, c.name
            ));
        }
        envs.push(cri::KeyValue {
            key: e.name.clone(),
            value: e.value.clone().unwrap_or_default(),
        });
    }
    let volumes = d
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default();
    let mut mounts = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let v = volumes
            .iter()
            .find(|v| v.name == m.name)
            .ok_or_else(|| format!("volumeMount {}: no volume of that name", m.name))?;
        let host = if let Some(h) = &v.host_path {
            if !h.path.starts_with('/') {
                return Err(format!(
                    "volume {}: hostPath.path {:?} is not an absolute path",
                    v.name, h.path
                ));
            }
            PathBuf::from(&h.path)
        } else if v.empty_dir.is_some() {
            let dir = volumes_dir.join(&v.name);
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("emptyDir {}: {}: {e}", v.name, dir.display()))?;
            dir
        } else {
            return Err(format!(
                "volume {}: only hostPath and emptyDir are supported yet",
                v.name
            ));
        };
        mounts.push(cri::Mount {
            container_path: m.mount_path.clone(),
            host_path: host.display().to_string(),
            readonly: m.read_only.unwrap_or(false),
        });
    }
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt,
        }),
        image: Some(cri::ImageSpec {
            image: c.image.clone().unwrap_or_default(),
        }),
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs,
        mounts,
        labels: labels(d, Some(&c.name)),
        annotations: HashMap::new(),
        log_path: format!("{}/{attempt}.log", c.name),
    })
}

fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_static_pod_gets_a_uid_from_its_content_and_clear_errors() {
        let f = Path::new("/p/a.yaml");
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: m}\nspec:\n  hostNetwork: true\n  containers:\n  - {name: c, image: 'x:1'}\n";
        let a = parse_pod(f, text).expect("valid");
        assert_eq!((a.namespace.as_str(), a.name.as_str()), ("default", "m"));
        assert_eq!(a.uid.len(), 32);
        let b = parse_pod(f, &text.replace("x:1", "x:2")).expect("valid");
        assert_ne!(a.uid, b.uid, "a changed manifest is a new pod");
        let e = parse_pod(
            f,
            "apiVersion: v1\nkind: Pod\nmetadata: {name: m}\nspec:\n  containers:\n  - {name: c}\n",
        )
        .expect_err("no image");
        assert!(e.contains("spec.containers[c].image is missing"), "{e}");
        let e = parse_pod(
            f,
            "apiVersion: v1\nkind: Pod\nmetadata: {name: m}\nspec:\n  containers: 3\n",
        )
        .expect_err("bad type");
        assert!(e.contains("spec.containers"), "{e}");
        let e = parse_pod(
            f,
            "apiVersion: v1\nkind: Pod\nmetadata: {name: M_}\nspec:\n  containers: []\n",
        )
        .expect_err("bad name");
        assert!(e.contains("metadata.name"), "{e}");
    }

    #[test]
    fn unsupported_volumes_and_env_sources_are_named() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: m}\nspec:\n  volumes:\n  - {name: s, secret: {secretName: x}}\n  - {name: h, hostPath: {path: /etc}}\n  containers:\n  - name: c\n    image: 'x:1'\n    volumeMounts: [{name: h, mountPath: /h, readOnly: true}]\n    env: [{name: A, value: b}]\n  - name: d\n    image: 'x:1'\n    volumeMounts: [{name: s, mountPath: /s}]\n";
        let d = parse_pod(Path::new("/p/a.yaml"), text).expect("valid");
        let spec = d.pod.spec.clone().expect("spec");
        let cfg = container_config(&d, &spec.containers[0], 2, Path::new("/tmp/v")).expect("ok");
        assert_eq!(cfg.mounts[0].host_path, "/etc");
        assert!(cfg.mounts[0].readonly);
        assert_eq!(cfg.envs[0].key, "A");
        assert_eq!(cfg.log_path, "c/2.log");
        assert_eq!(cfg.labels.get(POD_UID), Some(&d.uid));
        let e = container_config(&d, &spec.containers[1], 0, Path::new("/tmp/v"))
            .expect_err("secret volume");
        assert!(e.contains("volume s: only hostPath and emptyDir"), "{e}");
        let rel = parse_pod(
            Path::new("/p/a.yaml"),
            &text.replace("path: /etc", "path: etc"),
        )
        .expect("valid");
        let spec = rel.pod.spec.clone().expect("spec");
        let e = container_config(&rel, &spec.containers[0], 0, Path::new("/tmp/v"))
            .expect_err("relative hostPath");
        assert!(e.contains("is not an absolute path"), "{e}");
    }
}
