//! ObjectSync records (`reliablesyncs.kubeedge.io/v1alpha1`, named `{node}.{uid}` in the
//! object's namespace, `status.objectResourceVersion`), as KubeEdge's cloudhub keeps them: what
//! each node acknowledged. The device controller reads them at start, so that after a restart a
//! node is sent only what it misses, and deletions made meanwhile.
//!
//! Written one at a time from a bounded queue: a record that cannot be written (the queue full,
//! an API error) only means that the object is sent again after a restart, or a delete sent
//! twice; both are harmless, and counted.

use api::bus::AckKey;
use api::bus::object_sync_name;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc;

/// What a node acknowledged: an object it now holds, or a delete.
#[derive(Debug)]
pub struct Record {
    pub node: String,
    pub ack: AckKey,
    pub deleted: bool,
}

/// The queue of records and what became of them.
pub struct Writer {
    tx: mpsc::Sender<Record>,
    pub written: Arc<AtomicU64>,
    pub failed: Arc<AtomicU64>,
}

impl Writer {
    pub fn start(client: kube::Client) -> Self {
        let (tx, mut rx) = mpsc::channel::<Record>(8192);
        let written = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let (w, f) = (written.clone(), failed.clone());
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "reliablesyncs.kubeedge.io",
            "v1alpha1",
            "ObjectSync",
        ));
        tokio::spawn(async move {
            while let Some(r) = rx.recv().await {
                let api =
                    Api::<DynamicObject>::namespaced_with(client.clone(), &r.ack.namespace, &ar);
                match write(&api, &r).await {
                    Ok(()) => w.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        tracing::warn!(node = %r.node, object = %format!("{}/{}", r.ack.namespace, r.ack.name), error = %e, "cannot write the ObjectSync record; the object is sent again after a restart");
                        f.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        });
        Self {
            tx,
            written,
            failed,
        }
    }

    /// Queues a record; when the queue is full it is dropped and counted.
    pub fn record(&self, r: Record) {
        if r.ack.uid.is_empty() {
            return;
        }
        if self.tx.try_send(r).is_err() {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn write(api: &Api<DynamicObject>, r: &Record) -> Result<(), kube::Error> {
    let name = object_sync_name(&r.node, &r.ack.uid);
    if r.deleted {
        return match api.delete(&name, &DeleteParams::default()).await {
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            other => other.map(|_| ()),
        };
    }
    let (api_version, kind) = match r.ack.kind {
        "device" => ("devices.kubeedge.io/v1beta1", "Device"),
        "pod" => ("v1", "Pod"),
        "configmap" => ("v1", "ConfigMap"),
        "secret" => ("v1", "Secret"),
        _ => ("devices.kubeedge.io/v1beta1", "DeviceModel"),
    };
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "reliablesyncs.kubeedge.io/v1alpha1", "kind": "ObjectSync",
        "metadata": {"name": name, "namespace": r.ack.namespace},
        "spec": {"objectAPIVersion": api_version, "objectKind": kind,
            "objectName": r.ack.name}}))
    .map_err(kube::Error::SerdeError)?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e),
    }
    api.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"objectResourceVersion": r.ack.resource_version}})),
    )
    .await
    .map(|_| ())
}
