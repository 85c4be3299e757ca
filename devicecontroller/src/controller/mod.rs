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
    /// Replicas: whether this one leads. Only the leader creates DeviceStatus objects and
    /// writes profile ConfigMaps; every replica sends its own nodes their messages and writes
    /// their reports. `None`: alone, always.
    pub leader: Option<tokio::sync::watch::Receiver<bool>>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            patch_interval: Duration::from_millis(100),
            max_in_flight: 64,
            profile_interval: Duration::from_millis(200),
            profiles: true,
            leader: None,
        }
    }
}

/// A running controller.
pub struct Controller {
    /// Messages from nodes: `(node, message)`.
    pub upstream: mpsc::Sender<(String, Message)>,
    /// Nodes that lost their link to the cloud (cloudhub's session ended): their devices
    /// become `unknown` in DeviceStatus until they report again.
    pub lost: mpsc::Sender<String>,
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
    let (lost, lost_rx) = mpsc::channel(4096);
    let metrics = Arc::new(Metrics::default());
    let m = metrics.clone();
    let task = tokio::spawn(async move {
        let state = Reconciler::new(client, hub, config, m);
        state.run(rx, lost_rx, cancel).await;
    });
    Controller {
        upstream: tx,
        lost,
        metrics,
        task,
    }
}
