//! What edged last saw of its pods, for the HTTP API (`GET /api/v1/pods`) and the log.

use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// A container's status, in the shape of a Pod's `containerStatuses` entry.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerView {
    pub name: String,
    pub image: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub container_id: String,
    pub ready: bool,
    pub restart_count: u32,
    /// `running`, `waiting` or `terminated`.
    pub state: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The last exit, while it waits to be restarted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_exit_code: Option<i32>,
    /// Nanoseconds since the epoch: started (running) or finished (terminated).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<i64>,
}

impl ContainerView {
    pub fn new(name: &str, image: &str) -> Self {
        Self {
            name: name.into(),
            image: image.into(),
            state: "waiting".into(),
            reason: "ContainerCreating".into(),
            ..Self::default()
        }
    }

    pub fn running(&mut self, started: i64) {
        self.state = "running".into();
        self.ready = true;
        self.reason.clear();
        self.message.clear();
        self.since = Some(started);
    }

    pub fn terminated(&mut self, exit_code: i32, reason: &str, finished: i64) {
        self.state = "terminated".into();
        self.ready = false;
        self.reason = if reason.is_empty() {
            if exit_code == 0 { "Completed" } else { "Error" }.into()
        } else {
            reason.into()
        };
        self.message.clear();
        self.exit_code = Some(exit_code);
        self.since = Some(finished);
    }

    /// Exited and waiting for its restart (its exit code moves to `lastExitCode`).
    pub fn back_off(&mut self, reason: &str, message: &str) {
        self.last_exit_code = self.exit_code.take();
        self.waiting(reason, message);
    }

    pub fn waiting(&mut self, reason: &str, message: impl std::fmt::Display) {
        self.state = "waiting".into();
        self.ready = false;
        self.reason = reason.into();
        self.message = message.to_string();
    }
}

/// A pod's status.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Where it comes from: its manifest's path, or `cloud`.
    pub source: String,
    /// `Pending`, `Running`, `Succeeded` or `Failed`, as a Pod's `status.phase`.
    pub phase: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub sandbox_id: String,
    /// The pod's own address on the runtime's (CNI) network; empty with `hostNetwork`.
    #[serde(rename = "podIP", skip_serializing_if = "String::is_empty")]
    pub pod_ip: String,
    pub containers: Vec<ContainerView>,
}

impl PodView {
    pub fn new(namespace: &str, name: &str, uid: &str, source: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
            source: source.into(),
            phase: "Pending".into(),
            ..Self::default()
        }
    }

    /// The pod could not be started at all.
    pub fn fail(&mut self, reason: &str, message: &str) {
        self.phase = "Pending".into();
        self.reason = reason.into();
        self.message = message.into();
    }

    /// The phase from the containers, as the kubelet derives it.
    pub fn finish(&mut self, restart_policy: &str) {
        let all = |state: &str| self.containers.iter().all(|c| c.state == state);
        let running = self.containers.iter().any(|c| c.state == "running");
        self.phase = if all("terminated") && restart_policy != "Always" {
            if self.containers.iter().all(|c| c.exit_code == Some(0)) {
                "Succeeded"
            } else {
                "Failed"
            }
        } else if running || self.containers.iter().any(|c| c.restart_count > 0) {
            "Running"
        } else {
            "Pending"
        }
        .into();
    }
}

#[derive(Default)]
struct State {
    pods: Vec<PodView>,
    /// Manifests that were refused, with why.
    file_errors: BTreeMap<PathBuf, String>,
    /// The last sync's failure to talk to the runtime.
    runtime_error: Option<String>,
}

/// edged's pods as last synced. Cheap to clone.
#[derive(Clone, Default)]
pub struct Pods {
    state: Arc<RwLock<State>>,
}

/// The JSON of `GET /api/v1/pods`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodList {
    pub pods: Vec<PodView>,
    pub manifest_errors: BTreeMap<PathBuf, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_error: Option<String>,
}

impl Pods {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn list(&self) -> PodList {
        let s = self.state.read().unwrap_or_else(|p| p.into_inner());
        PodList {
            pods: s.pods.clone(),
            manifest_errors: s.file_errors.clone(),
            runtime_error: s.runtime_error.clone(),
        }
    }

    /// The uid of pod `ns/name` as edged runs it now.
    pub fn uid(&self, ns: &str, name: &str) -> Option<String> {
        let s = self.state.read().unwrap_or_else(|p| p.into_inner());
        let pod = s.pods.iter().find(|v| v.namespace == ns && v.name == name);
        pod.map(|v| v.uid.clone())
    }

    pub(super) fn set(&self, pods: Vec<PodView>) {
        self.write().pods = pods;
    }

    pub(super) fn set_runtime_error(&self, e: Option<String>) {
        self.write().runtime_error = e;
    }

    pub(super) fn set_file_error(&self, file: &Path, e: Option<String>) {
        let mut s = self.write();
        match e {
            Some(e) => {
                s.file_errors.insert(file.to_path_buf(), e);
            }
            None => {
                s.file_errors.remove(file);
            }
        }
    }

    pub(super) fn retain_file_errors(&self, keep: impl Fn(&Path) -> bool) {
        self.write().file_errors.retain(|f, _| keep(f));
    }
}
