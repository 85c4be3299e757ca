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
pub(crate) struct Record {
    pub node: String,
    pub ack: AckKey,
    pub deleted: bool,
}

/// The queue of records and what became of them.
pub(crate) struct Writer {
    tx: mpsc::Sender<Record>,
    pub written: Arc<AtomicU64>,
    pub failed: Arc<AtomicU64>,
}

impl Writer {
    pub(crate) fn start(client: kube::Client) -> Self {
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
    pub(crate) fn record(&self, r: Record) {
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

/// Follows every ObjectSync record (replicas): an acknowledgement a node gave through another
/// replica clears what `hub` keeps for it. Runs until `stop`.
pub(crate) async fn follow(
    client: kube::Client,
    hub: Arc<super::CloudHub>,
    stop: tokio_util::sync::CancellationToken,
) {
    use futures_util::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "reliablesyncs.kubeedge.io",
        "v1alpha1",
        "ObjectSync",
    ));
    let api = Api::<DynamicObject>::all_with(client, &ar);
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    loop {
        let ev = tokio::select! {
            _ = stop.cancelled() => return,
            ev = events.next() => ev,
        };
        match ev {
            None => return,
            Some(Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o))) => {
                seen(&hub, &o, true)
            }
            Some(Ok(watcher::Event::Delete(o))) => seen(&hub, &o, false),
            Some(Ok(_)) => {}
            Some(Err(e)) => tracing::debug!(error = %e, "ObjectSync watch: retrying"),
        }
    }
}

/// The record's node, object and version, handed to the hub.
fn seen(hub: &super::CloudHub, o: &DynamicObject, live: bool) {
    let (Some(name), Some(ns)) = (o.metadata.name.as_deref(), o.metadata.namespace.as_deref())
    else {
        return;
    };
    let Some((node, uid)) = split_name(name) else {
        return;
    };
    let kind = match o.data["spec"]["objectKind"].as_str() {
        Some("Device") => "device",
        Some("DeviceModel") => "devicemodel",
        Some("Pod") => "pod",
        Some("ConfigMap") => "configmap",
        Some("Secret") => "secret",
        _ => return,
    };
    let Some(object) = o.data["spec"]["objectName"].as_str() else {
        return;
    };
    let rv = o.data["status"]["objectResourceVersion"].as_str();
    if live && rv.is_none() {
        return;
    }
    hub.acknowledged_elsewhere(node, kind, ns, object, uid, if live { rv } else { None });
}

/// `{node}.{uid}`: a node name may have dots, a uid (a UUID) has none.
fn split_name(name: &str) -> Option<(&str, &str)> {
    let (node, uid) = name.rsplit_once('.')?;
    (!node.is_empty() && !uid.is_empty()).then_some((node, uid))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_record_name_splits_at_its_last_dot() {
        assert_eq!(
            super::split_name("edge.site-1.0f8e9c2a-1b2c-4d5e-8f90-123456789abc"),
            Some(("edge.site-1", "0f8e9c2a-1b2c-4d5e-8f90-123456789abc"))
        );
        assert_eq!(super::split_name("nodot"), None);
    }
}
