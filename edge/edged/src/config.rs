//! edged's settings, the `modules.edged` part of edgecore's config file.

use serde::Deserialize;
use std::path::PathBuf;

/// edged: static pods from a directory, run on a CRI runtime (containerd).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Config {
    /// The runtime's CRI socket: `unix:///run/containerd/containerd.sock`.
    pub runtime_endpoint: String,
    /// A directory of `v1` Pod YAML files (static pods); default `{dataDir}/pods`.
    pub static_pod_path: Option<PathBuf>,
    /// Where container logs are kept (CRI's log directory); default `{dataDir}/pod-logs`.
    pub pod_log_dir: Option<PathBuf>,
    /// How often pods are compared with what runs, in milliseconds.
    pub sync_period_ms: u64,
    /// A container that exited is restarted after this delay, doubled at each exit up to
    /// `maxBackoffMs` (CrashLoopBackOff), as the kubelet does (10 s, 5 min); reset once it has
    /// run for 10 minutes.
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
    /// Each CRI call's deadline (image pulls: ten times this).
    pub runtime_timeout_ms: u64,
    /// A container's log is rotated when it is larger than this; `containerLogMaxFiles` files
    /// are kept per container, the current one included (the kubelet's 10 MiB and 5).
    pub container_log_max_size_bytes: u64,
    pub container_log_max_files: usize,
    /// The node's address, reported as pods' `hostIP` (and `podIP` with `hostNetwork`);
    /// default: the address of the interface with the default route.
    pub node_ip: Option<String>,
    /// The host directories a pod from the cloud may mount (`hostPath`), each with what is
    /// under it; default `[/etc/kubeedge]`, where KubeEdge's mapper DaemonSets find the DMI
    /// socket. `[]`: none. A pod asking for another path, for `hostPID`, `hostIPC` or a
    /// privileged container is refused with why in its status (`InvalidPodSpec`), whatever the
    /// cloud allowed: a cloud (or a cluster without Pod Security) never hands out the
    /// gateway's root. Static pods, which the gateway's own administrator writes, are not
    /// limited.
    pub host_path_prefixes: Vec<String>,
    /// Whether a pod from the cloud may use the node's network (`hostNetwork`); default yes.
    pub host_network: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            runtime_endpoint: "unix:///run/containerd/containerd.sock".into(),
            static_pod_path: None,
            pod_log_dir: None,
            sync_period_ms: 1000,
            initial_backoff_ms: 10_000,
            max_backoff_ms: 300_000,
            runtime_timeout_ms: 30_000,
            container_log_max_size_bytes: 10 * 1024 * 1024,
            container_log_max_files: 5,
            node_ip: None,
            host_path_prefixes: vec!["/etc/kubeedge".into()],
            host_network: true,
        }
    }
}
