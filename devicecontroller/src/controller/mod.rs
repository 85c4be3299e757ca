//! The device controller's runtime on kube-rs: watchers on Device, DeviceModel and DeviceStatus
//! feed the pure [`Downstream`] and [`Upstream`]; messages go to a [`Hub`] (cloudhub implements
//! it; `api::bus::MemoryHub` keeps them in memory); DeviceStatus objects, their patches and the
//! per-node profile ConfigMaps are written through kube-rs, at most `max_in_flight` at once.

use api::message::Message;
use kube::api::{ApiResource, GroupVersionKind};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

mod metrics;
mod objectsync;
mod state;

pub use metrics::{Histogram, Metrics};
pub use objectsync::{Delivered, delivered_of};
use state::Reconciler;

type Key = (String, String);

/// What the controller reads of a Node: its metadata.
type NodeMeta = kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Node>;

/// The label of a profile ConfigMap: the node it is for.
pub const PROFILE_LABEL: &str = "devices.kubeedge.io/profile-node";

use api::bus::Hub;

/// Settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// At most one DeviceStatus patch per device per this interval.
    pub patch_interval: Duration,
    /// API writes in flight at once.
    pub max_in_flight: usize,
    /// Per-node profile ConfigMaps are rewritten at most this often.
    pub profile_interval: Duration,
    /// Write the per-node profile ConfigMaps at all.
    pub profiles: bool,
    /// A profile longer than this (bytes) is not written: its ConfigMap says why instead.
    /// Kubernetes keeps a ConfigMap's data under 1 MiB ([`profile::MAX_BYTES`]).
    pub profile_max_bytes: usize,
    /// Replicas: whether this one leads. Only the leader makes the DeviceStatus objects that
    /// do not exist and writes profile ConfigMaps. `None`: alone, always.
    pub leader: Option<tokio::sync::watch::Receiver<bool>>,
    /// Replicas: each sends messages only to the nodes whose sessions it holds (told through
    /// [`Controller::sessions`]), and writes only their reports. Alone
    /// (`false`), every node is this controller's: messages wait for a node not connected.
    pub shared: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            patch_interval: Duration::from_millis(100),
            max_in_flight: 128,
            profile_interval: Duration::from_millis(200),
            profiles: true,
            profile_max_bytes: crate::profile::MAX_BYTES,
            leader: None,
            shared: false,
        }
    }
}

/// Nodes whose sessions came to this cloudcore or went, told by cloudhub: the newest of each
/// node until the controller takes them (so bounded by the nodes, and a node that left and came
/// back before the controller looked has only come back).
#[derive(Debug, Default)]
pub struct Sessions {
    changed: std::sync::Mutex<std::collections::BTreeMap<String, bool>>,
    notify: tokio::sync::Notify,
}

impl Sessions {
    /// `node`'s session came here (replicas: from now on this controller sends it its
    /// messages and writes its reports).
    pub fn arrived(&self, node: &str) {
        self.set(node, true);
    }

    /// `node` lost its link (its session ended, none other open here): its devices become
    /// `unknown` in DeviceStatus until it reports again.
    pub fn lost(&self, node: &str) {
        self.set(node, false);
    }

    fn set(&self, node: &str, up: bool) {
        self.lock().insert(node.to_string(), up);
        self.notify.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, bool>> {
        self.changed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The changes since the last call: node -> whether its session is here now.
    fn take(&self) -> std::collections::BTreeMap<String, bool> {
        std::mem::take(&mut *self.lock())
    }
}

/// A running controller.
pub struct Controller {
    /// Messages from nodes: `(node, message)`.
    pub upstream: mpsc::Sender<(String, Message)>,
    /// Sessions that came and went.
    pub sessions: Arc<Sessions>,
    pub metrics: Arc<Metrics>,
    pub task: tokio::task::JoinHandle<()>,
}

fn gvk(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "devices.kubeedge.io",
        "v1beta1",
        kind,
    ))
}

/// Starts the controller.
pub fn start(
    client: kube::Client,
    hub: Arc<dyn Hub>,
    config: Config,
    cancel: CancellationToken,
) -> Controller {
    let (tx, rx) = mpsc::channel(4096);
    let sessions = Arc::new(Sessions::default());
    let sessions_in = sessions.clone();
    let metrics = Arc::new(Metrics::default());
    let m = metrics.clone();
    let task = tokio::spawn(async move {
        let state = Reconciler::new(client, hub, config, m);
        state.run(rx, sessions_in, cancel).await;
    });
    Controller {
        upstream: tx,
        sessions,
        metrics,
        task,
    }
}
