//! The DaemonSet controller of the embedded API (on a real cluster its own controller and
//! scheduler do this): one pod per node that the DaemonSet's `nodeSelector` matches, bound to
//! the node (`spec.nodeName`), owned by the DaemonSet (so deleting it deletes them), replaced
//! when the template changes (`RollingUpdate`, the default) or only when deleted (`OnDelete`),
//! and a failed pod is replaced. Pods on nodes that no longer match, or are gone, are deleted.
//! `status` counts desired, current, ready, up-to-date and available pods.
//!
//! It acts only on complete lists: until every watch has listed once, and while one relists,
//! what it knew is kept; nothing is deleted because a list failed.

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The label with the hash of the template a pod was made from (the name Kubernetes uses).
pub(crate) const HASH_LABEL: &str = "controller-revision-hash";
/// A pod just created is not created again for this long while the watch catches up.
const EXPECT: Duration = Duration::from_secs(10);

/// What to do, from the DaemonSets, nodes and pods seen.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Plan {
    /// Pods to create.
    pub create: Vec<Pod>,
    /// Pods to delete: namespace, name, why.
    pub delete: Vec<(String, String, String)>,
    /// Per DaemonSet (namespace, name): its status.
    pub status: Vec<(String, String, Value)>,
}

/// The hash of a DaemonSet's pod template (10 hex digits).
pub(crate) fn template_hash(ds: &DaemonSet) -> String {
    let text = serde_json::to_string(&ds.spec.as_ref().map(|s| &s.template)).unwrap_or_default();
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    d.as_ref()[..5].iter().map(|b| format!("{b:02x}")).collect()
}

fn matches(selector: Option<&BTreeMap<String, String>>, node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    selector
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
}

fn owner_uid(pod: &Pod) -> Option<&str> {
    pod.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "DaemonSet")
        .map(|o| o.uid.as_str())
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// The pod of `ds` for `node`.
pub(crate) fn new_pod(ds: &DaemonSet, node: &str, hash: &str) -> Pod {
    let spec = ds.spec.clone().unwrap_or_default();
    let mut template = spec.template;
    let mut meta = template.metadata.take().unwrap_or_default();
    let name = ds.metadata.name.clone().unwrap_or_default();
    meta.name = None;
    meta.generate_name = Some(format!("{name}-"));
    meta.namespace = ds.metadata.namespace.clone();
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(HASH_LABEL.into(), hash.into());
    labels.insert(
        "pod-template-generation".into(),
        ds.metadata.generation.unwrap_or(1).to_string(),
    );
    meta.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            name,
            uid: ds.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        },
    ]);
    let mut pod_spec = template.spec.unwrap_or_default();
    pod_spec.node_name = Some(node.to_string());
    Pod {
        metadata: meta,
        spec: Some(pod_spec),
        status: None,
    }
}

/// The plan for the objects seen. `expected` holds (DaemonSet uid, node) pairs whose pod was
/// just created and is not seen yet.
pub(crate) fn plan(
    sets: &[Arc<DaemonSet>],
    nodes: &[Arc<Node>],
    pods: &[Arc<Pod>],
    expected: &dyn Fn(&str, &str) -> bool,
) -> Plan {
    let mut out = Plan::default();
    let mut by_owner: HashMap<&str, Vec<&Pod>> = HashMap::new();
    for p in pods {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if let Some(uid) = owner_uid(p) {
            by_owner.entry(uid).or_default().push(p);
        }
    }
    for ds in sets {
        if ds.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let (Some(ns), Some(name), Some(uid)) = (
            ds.metadata.namespace.clone(),
            ds.metadata.name.clone(),
            ds.metadata.uid.clone(),
        ) else {
            continue;
        };
        let Some(spec) = ds.spec.as_ref() else {
            continue;
        };
        let selector = spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.node_selector.as_ref());
        let on_delete = spec
            .update_strategy
            .as_ref()
            .and_then(|u| u.type_.as_deref())
            == Some("OnDelete");
        let hash = template_hash(ds);
        let mine = by_owner.get(uid.as_str()).cloned().unwrap_or_default();
        let (mut desired, mut current, mut ready_n, mut updated, mut misscheduled) =
            (0, 0, 0, 0, 0);
        for node in nodes {
            let Some(node_name) = node.metadata.name.as_deref() else {
                continue;
            };
            let on_node: Vec<&Pod> = mine
                .iter()
                .copied()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name))
                .collect();
            let wanted = node.metadata.deletion_timestamp.is_none() && matches(selector, node);
            if !wanted {
                misscheduled += on_node.len();
                for p in on_node {
                    out.delete.push((
                        ns.clone(),
                        p.metadata.name.clone().unwrap_or_default(),
                        format!("node {node_name} no longer matches the DaemonSet's nodeSelector"),
                    ));
                }
                continue;
            }
            desired += 1;
            // One pod per node: the newest stays, the others go; a failed one is replaced.
            let mut keep: Option<&Pod> = None;
            for p in &on_node {
                let pname = p.metadata.name.clone().unwrap_or_default();
                if phase(p) == "Failed" {
                    out.delete
                        .push((ns.clone(), pname, "the pod failed".into()));
                    continue;
                }
                let newer = keep
                    .is_none_or(|k| p.metadata.creation_timestamp > k.metadata.creation_timestamp);
                if let Some(k) = keep.filter(|_| newer) {
                    out.delete.push((
                        ns.clone(),
                        k.metadata.name.clone().unwrap_or_default(),
                        "a second pod of the DaemonSet on the node".into(),
                    ));
                } else if keep.is_some() {
                    out.delete.push((
                        ns.clone(),
                        pname,
                        "a second pod of the DaemonSet on the node".into(),
                    ));
                    continue;
                }
                keep = Some(p);
            }
            match keep {
                Some(p) => {
                    current += 1;
                    let same =
                        p.metadata.labels.as_ref().and_then(|l| l.get(HASH_LABEL)) == Some(&hash);
                    if same {
                        updated += 1;
                    } else if !on_delete {
                        out.delete.push((
                            ns.clone(),
                            p.metadata.name.clone().unwrap_or_default(),
                            "its template changed".into(),
                        ));
                    }
                    if ready(p) {
                        ready_n += 1;
                    }
                }
                None if expected(&uid, node_name) => current += 1,
                None => out.create.push(new_pod(ds, node_name, &hash)),
            }
        }
        let status = json!({
            "desiredNumberScheduled": desired,
            "currentNumberScheduled": current,
            "numberMisscheduled": misscheduled,
            "numberReady": ready_n,
            "updatedNumberScheduled": updated,
            "numberAvailable": ready_n,
            "numberUnavailable": desired - ready_n.min(desired),
            "observedGeneration": ds.metadata.generation.unwrap_or(1),
        });
        let old = serde_json::to_value(&ds.status).unwrap_or(Value::Null);
        let changed =
            status.as_object().into_iter().flatten().any(|(k, v)| {
                old[k.as_str()] != *v && !(v == &json!(0) && old[k.as_str()].is_null())
            });
        if changed {
            out.status.push((ns, name, status));
        }
    }
    out
}

/// A reflector of `api`'s objects that wakes `wake` at every event; its watch retries with
/// backoff, and its store keeps what it had while it does.
pub(crate) fn watch<K>(api: Api<K>, wake: Arc<Notify>, stop: CancellationToken) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream =
        reflector::reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                ev = stream.next() => match ev {
                    None => return,
                    Some(Ok(_)) => wake.notify_one(),
                    Some(Err(e)) => tracing::warn!(kind = std::any::type_name::<K>(), error = %e, "a watch failed; retrying"),
                },
            }
        }
    });
    reader
}

/// Runs until `stop`.
pub(crate) async fn run(client: kube::Client, stop: CancellationToken) {
    let wake = Arc::new(Notify::new());
    let sets = watch(
        Api::<DaemonSet>::all(client.clone()),
        wake.clone(),
        stop.clone(),
    );
    let nodes = watch(Api::<Node>::all(client.clone()), wake.clone(), stop.clone());
    let pods = watch(Api::<Pod>::all(client.clone()), wake.clone(), stop.clone());
    for ready in [
        sets.wait_until_ready().await.is_ok(),
        nodes.wait_until_ready().await.is_ok(),
        pods.wait_until_ready().await.is_ok(),
    ] {
        if !ready {
            return;
        }
    }
    tracing::info!("daemonset controller: lists complete; reconciling");
    let mut expected: HashMap<(String, String), Instant> = HashMap::new();
    loop {
        let now = Instant::now();
        expected.retain(|_, t| now.duration_since(*t) < EXPECT);
        let p = plan(
            &sets.state(),
            &nodes.state(),
            &pods.state(),
            &|uid, node| expected.contains_key(&(uid.to_string(), node.to_string())),
        );
        for pod in p.create {
            let ns = pod.metadata.namespace.clone().unwrap_or_default();
            let node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            let owner = owner_uid(&pod).unwrap_or_default().to_string();
            match Api::<Pod>::namespaced(client.clone(), &ns)
                .create(&PostParams::default(), &pod)
                .await
            {
                Ok(made) => {
                    tracing::info!(pod = made.metadata.name.as_deref().unwrap_or_default(), %ns, %node, "daemonset controller: pod created");
                    expected.insert((owner, node), Instant::now());
                }
                Err(e) => {
                    tracing::warn!(%ns, %node, error = %e, "daemonset controller: cannot create a pod")
                }
            }
        }
        for (ns, name, why) in p.delete {
            tracing::info!(pod = %name, %ns, %why, "daemonset controller: deleting a pod");
            match Api::<Pod>::namespaced(client.clone(), &ns)
                .delete(&name, &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    tracing::warn!(pod = %name, %ns, error = %e, "daemonset controller: cannot delete a pod")
                }
            }
        }
        for (ns, name, status) in p.status {
            if let Err(e) = Api::<DaemonSet>::namespaced(client.clone(), &ns)
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": status})),
                )
                .await
            {
                tracing::debug!(daemonset = %name, %ns, error = %e, "daemonset controller: cannot write status");
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
        // Events come in bursts (a list, a rollout): acted on together.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(selector: Value) -> Arc<DaemonSet> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "mapper", "namespace": "default", "uid": "ds-1", "generation": 1},
                "spec": {"selector": {"matchLabels": {"app": "m"}},
                    "template": {"metadata": {"labels": {"app": "m"}},
                        "spec": {"nodeSelector": selector, "containers": [{"name": "c", "image": "i:1"}]}}}
            }))
            .expect("a DaemonSet"),
        )
    }

    fn node(name: &str, labels: Value) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
                .expect("a Node"),
        )
    }

    fn pod_of(d: &DaemonSet, node: &str, name: &str, hash: &str, status: Value) -> Arc<Pod> {
        let mut p = new_pod(d, node, hash);
        p.metadata.name = Some(name.into());
        p.status = serde_json::from_value(status).ok();
        Arc::new(p)
    }

    #[test]
    fn one_pod_per_matching_node_and_none_elsewhere() {
        let d = ds(json!({"gw": "modbus"}));
        let nodes = [
            node("a", json!({"gw": "modbus"})),
            node("b", json!({"gw": "ble"})),
            node("c", json!({"gw": "modbus", "x": "y"})),
        ];
        let p = plan(std::slice::from_ref(&d), &nodes, &[], &|_, _| false);
        let bound: Vec<_> = p
            .create
            .iter()
            .map(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(bound, ["a", "c"]);
        let first = &p.create[0];
        assert_eq!(first.metadata.generate_name.as_deref(), Some("mapper-"));
        let owner = &first.metadata.owner_references.as_ref().expect("owned")[0];
        assert_eq!((owner.uid.as_str(), owner.controller), ("ds-1", Some(true)));
        assert_eq!(p.status[0].2["desiredNumberScheduled"], 2);
        assert_eq!(p.status[0].2["currentNumberScheduled"], 0);

        // Created and not yet seen: not created twice.
        let p = plan(std::slice::from_ref(&d), &nodes, &[], &|_, n| n == "a");
        assert_eq!(p.create.len(), 1);

        // A pod on a node that stopped matching goes; a failed pod is replaced; the
        // template's change replaces the pod.
        let hash = template_hash(&d);
        let pods = [
            pod_of(
                &d,
                "a",
                "mapper-1",
                &hash,
                json!({"phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}]}),
            ),
            pod_of(&d, "b", "mapper-2", &hash, json!({"phase": "Running"})),
            pod_of(&d, "c", "mapper-3", &hash, json!({"phase": "Failed"})),
        ];
        let p = plan(std::slice::from_ref(&d), &nodes, &pods, &|_, _| false);
        let deleted: Vec<&str> = p.delete.iter().map(|d| d.1.as_str()).collect();
        assert_eq!(deleted, ["mapper-2", "mapper-3"]);
        assert_eq!(p.create.len(), 1, "c's failed pod is replaced");
        let s = &p.status[0].2;
        assert_eq!(
            (s["numberReady"].clone(), s["numberMisscheduled"].clone()),
            (json!(1), json!(1))
        );

        let pods = [pod_of(
            &d,
            "a",
            "mapper-1",
            "old",
            json!({"phase": "Running"}),
        )];
        let p = plan(std::slice::from_ref(&d), &nodes[..1], &pods, &|_, _| false);
        assert_eq!(p.delete[0].1, "mapper-1");
        assert_eq!(p.delete[0].2, "its template changed");
        let mut on_delete = (*d).clone();
        if let Some(s) = on_delete.spec.as_mut() {
            s.update_strategy = serde_json::from_value(json!({"type": "OnDelete"})).ok();
        }
        let p = plan(&[Arc::new(on_delete)], &nodes[..1], &pods, &|_, _| false);
        assert!(p.delete.is_empty(), "OnDelete keeps the old pod");
    }
}
