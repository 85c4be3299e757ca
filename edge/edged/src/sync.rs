//! One pod's sync and one container's, as the kubelet's: the sandbox made (its config from the
//! pod), each container's image ensured, started, probed, restarted with backoff, its log
//! rotated; what [`Edged::sync`] calls for each pod that must run.

use super::*;

impl Edged {
    pub(crate) fn sandbox_config(&self, d: &Desired) -> cri::PodSandboxConfig {
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
    pub(crate) async fn sync_pod(
        &mut self,
        d: &Desired,
        sandbox: Option<&cri::PodSandbox>,
        containers: &[cri::Container],
    ) -> PodView {
        let mut view = PodView::new(&d.namespace, &d.name, &d.uid, &d.source());
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
                        self.sandbox_errors.insert(
                            d.uid.clone(),
                            ("CreatePodSandboxError".into(), e.to_string()),
                        );
                        view.fail("CreatePodSandboxError", &e.to_string());
                        return view;
                    }
                }
            }
        };
        view.sandbox_id = sandbox_id.clone();
        if !d.host_network() {
            view.pod_ip = match self.pod_ips.get(&sandbox_id) {
                Some(ip) => ip.clone(),
                None => match self.runtime.sandbox_ip(&sandbox_id).await {
                    Ok(ip) => {
                        if !ip.is_empty() {
                            self.pod_ips.insert(sandbox_id.clone(), ip.clone());
                        }
                        ip
                    }
                    Err(e) => {
                        tracing::warn!(pod = %d.name, sandbox = %sandbox_id, error = %e, "cannot read the pod's IP");
                        String::new()
                    }
                },
            };
        }
        let Some(spec) = d.pod.spec.as_ref() else {
            return view;
        };
        // ConfigMap and Secret volumes follow their objects while the pod runs.
        let projected = project_volumes(d, &self.pod_data_dir(d), self.cloud.as_ref());
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
                .sync_container(
                    d,
                    (&sandbox_id, &sandbox_config),
                    c,
                    &policy,
                    &mine,
                    &projected,
                )
                .await;
            view.containers.push(cv);
        }
        view.finish(&policy);
        view
    }

    pub(crate) async fn sync_container(
        &mut self,
        d: &Desired,
        (sandbox_id, sandbox_config): (&str, &cri::PodSandboxConfig),
        c: &k8s_openapi::api::core::v1::Container,
        policy: &str,
        mine: &[&cri::Container],
        projected: &Result<(), container::ConfigError>,
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
                    // The previous attempt's exit, as the kubelet's `lastState` shows it.
                    if attempt > 0 {
                        cv.last_exit_code = self.last_exit(&key, attempt, mine).await;
                    }
                    let ran = now_nanos().saturating_sub(started);
                    let ran = Duration::from_nanos(u64::try_from(ran).unwrap_or_default());
                    if plan::crash_loop_forgotten(ran) {
                        self.backoff.remove(&key);
                    }
                    self.rotate_log(d, &c.name, attempt, &l.id).await;
                    // As the kubelet: a probe without `host` goes to the pod's IP, which
                    // is the node's own with hostNetwork.
                    let host = if d.host_network() {
                        "127.0.0.1".to_string()
                    } else {
                        let ip = self.pod_ips.get(sandbox_id).cloned();
                        ip.unwrap_or_else(|| "127.0.0.1".into())
                    };
                    if let Some(p) = &c.liveness_probe
                        && let Some((false, why)) = self.probe(&l.id, false, p, c, &host).await
                    {
                        tracing::info!(pod = %d.name, container = %c.name, reason = %why, "liveness probe failed; the container is stopped and restarted");
                        if let Err(e) = self.runtime.stop_container(&l.id, d.grace()).await {
                            tracing::warn!(container = %l.id, error = %e, "cannot stop a container whose liveness probe failed");
                        }
                        self.probes.remove(&(l.id.clone(), false));
                        cv.ready = false;
                        cv.message = format!("Liveness probe failed: {why}");
                        return cv;
                    }
                    if let Some(p) = &c.readiness_probe {
                        let (ok, why) = self
                            .probe(&l.id, true, p, c, &host)
                            .await
                            .unwrap_or((false, String::new()));
                        cv.ready = ok;
                        if !ok && !why.is_empty() {
                            cv.message = format!("Readiness probe failed: {why}");
                        }
                    }
                    return cv;
                }
                let Some(status) = status else {
                    return cv;
                };
                let exited = l.state == cri::ContainerState::ContainerExited as i32;
                self.exits
                    .insert(key.clone(), (attempt + 1, status.exit_code));
                cv.terminated(status.exit_code, &status.reason, status.finished_at);
                let (decision, crash_loop) = plan::after_exit(
                    plan::RestartPolicy::from_spec(policy),
                    exited,
                    status.exit_code,
                    &l.id,
                    self.backoff.get(&key),
                    self.delays(),
                    Instant::now(),
                );
                match crash_loop {
                    Some(b) => self.backoff.insert(key.clone(), b),
                    None => self.backoff.remove(&key),
                };
                match decision {
                    plan::AfterExit::Stay => return cv,
                    plan::AfterExit::Wait { delay } => {
                        cv.back_off(
                            "CrashLoopBackOff",
                            &format!(
                                "back-off {delay:?} restarting failed container {} (exit code {})",
                                c.name, status.exit_code
                            ),
                        );
                        return cv;
                    }
                    plan::AfterExit::Start => attempt + 1,
                }
            }
        };
        // Pull (by policy) and start a new attempt.
        if let Err((reason, message)) = self.ensure_image(&image, c).await {
            cv.waiting(&reason, &message);
            return cv;
        }
        if let Err(e) = projected {
            cv.waiting("CreateContainerConfigError", e);
            return cv;
        }
        let env = Env {
            cloud: self.cloud.as_ref(),
            node: &self.node,
            host_ip: self.host_ip.as_deref().unwrap_or_default(),
            pod_ip: self.pod_ips.get(sandbox_id).map_or("", String::as_str),
        };
        let config = match container_config(d, c, attempt, &self.pod_data_dir(d), &env) {
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
                format!("log directory {}: {e}", log_dir.display()),
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
        let attempt_of = |c: &cri::Container| c.metadata.as_ref().map(|m| m.attempt).unwrap_or(0);
        let attempts: Vec<u32> = mine.iter().map(|c| attempt_of(c)).collect();
        let remove = plan::dead_to_remove(&attempts, attempt);
        for old in mine.iter().filter(|c| remove.contains(&attempt_of(c))) {
            if let Err(e) = self.runtime.remove_container(&old.id).await {
                tracing::debug!(container = %old.id, error = %e, "cannot remove an old container");
            }
        }
        cv.container_id = id;
        cv.restart_count = attempt;
        cv.running(now_nanos());
        cv
    }

    /// Runs the probe if it is due; the verdict and the last failure's message.
    pub(crate) async fn probe(
        &mut self,
        id: &str,
        readiness: bool,
        p: &k8s_openapi::api::core::v1::Probe,
        c: &k8s_openapi::api::core::v1::Container,
        host: &str,
    ) -> Option<(bool, String)> {
        let key = (id.to_string(), readiness);
        let now = Instant::now();
        let state = self
            .probes
            .entry(key.clone())
            .or_insert_with(|| probe::ProbeState::new(readiness));
        if state.due(p, now) {
            let result = match probe::network(p, c, host).await {
                Some(r) => r,
                None => {
                    let cmd = p
                        .exec
                        .as_ref()
                        .and_then(|e| e.command.clone())
                        .unwrap_or_default();
                    match self.runtime.exec_sync(id, &cmd, probe::timeout(p)).await {
                        Ok(0) => Ok(()),
                        Ok(code) => Err(probe::ProbeFailure::Exit { command: cmd, code }),
                        Err(e) => Err(e.into()),
                    }
                }
            };
            let state = self.probes.get_mut(&key)?;
            if state.record(p, result, now) {
                let kind = if readiness { "readiness" } else { "liveness" };
                tracing::info!(container = %c.name, probe = kind, ok = state.ok, message = %state.message, "probe verdict changed");
            }
        }
        let state = self.probes.get(&key)?;
        Some((state.ok, state.message.clone()))
    }

    /// Rotates a running container's log when it is larger than `containerLogMaxSizeBytes`:
    /// renamed with a timestamp, the runtime told to open a new one; the oldest beyond
    /// `containerLogMaxFiles` go.
    pub(crate) async fn rotate_log(
        &mut self,
        d: &Desired,
        container: &str,
        attempt: u32,
        id: &str,
    ) {
        let dir = self.log_dir(d).join(container);
        let current = dir.join(format!("{attempt}.log"));
        let big = std::fs::metadata(&current)
            .is_ok_and(|m| m.len() > self.config.container_log_max_size_bytes);
        if !big {
            return;
        }
        let rotated = dir.join(format!("{attempt}.log.{}", now_nanos()));
        if let Err(e) = std::fs::rename(&current, &rotated) {
            tracing::warn!(file = %current.display(), error = %e, "cannot rotate a container log");
            return;
        }
        if let Err(e) = self.runtime.reopen_log(id).await {
            tracing::warn!(container = %id, error = %e, "the runtime did not reopen a rotated log");
        }
        let mut old: Vec<PathBuf> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.contains(".log."))
            })
            .collect();
        old.sort_by_key(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .and_then(|e| e.parse::<i64>().ok())
                .unwrap_or(0)
        });
        let keep = self.config.container_log_max_files.max(1) - 1;
        while old.len() > keep {
            let gone = old.remove(0);
            let _ = std::fs::remove_file(&gone);
        }
    }

    /// The exit code of the attempt before `attempt` of a container: remembered when it exited,
    /// or asked of the runtime once (after a restart of edgecore; the last dead container is kept).
    pub(crate) async fn last_exit(
        &mut self,
        key: &(String, String),
        attempt: u32,
        mine: &[&cri::Container],
    ) -> Option<i32> {
        if let Some((a, code)) = self.exits.get(key)
            && *a == attempt
        {
            return Some(*code);
        }
        let prev = mine
            .iter()
            .find(|c| c.metadata.as_ref().map(|m| m.attempt) == Some(attempt - 1))?;
        let code = self
            .runtime
            .container_status(&prev.id)
            .await
            .ok()?
            .exit_code;
        self.exits.insert(key.clone(), (attempt, code));
        Some(code)
    }

    /// The backoff's first and longest pause (`edged.initialBackoffMs`, `maxBackoffMs`).
    pub(crate) fn delays(&self) -> plan::Delays {
        plan::Delays {
            initial: Duration::from_millis(self.config.initial_backoff_ms),
            max: Duration::from_millis(self.config.max_backoff_ms),
        }
    }

    /// Another failure of `key` (an image's pull, a pod's sandbox): retried after the backoff.
    pub(crate) fn note_failure(&mut self, key: String) {
        let delays = self.delays();
        let now = Instant::now();
        let retry = self.pulls.entry(key).or_insert_with(|| Retry {
            backoff: rt::Backoff::new(delays.initial, delays.max),
            delay: Duration::ZERO,
            until: now,
        });
        retry.delay = retry.backoff.next_delay();
        retry.until = now + retry.delay;
    }

    pub(crate) fn pod_data_dir(&self, d: &Desired) -> PathBuf {
        self.config
            .pod_log_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("pod-logs"))
            .with_file_name("pod-volumes")
            .join(&d.uid)
    }

    /// The image is present, or pulled as the pull policy says. A pull that fails while the
    /// image is present uses the present one (an offline gateway keeps restarting its pods).
    pub(crate) async fn ensure_image(
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
            .map_err(|e| ("ErrImageInspect".to_string(), e.to_string()))?;
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
