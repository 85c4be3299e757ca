//! What a kube-apiserver's controller manager does for the kinds served here: a namespace being
//! deleted has its objects deleted, then goes; a CRD being deleted has its objects deleted,
//! then goes; objects whose owners are all gone are deleted (garbage collection, background
//! propagation). Driven by the store's events, with a periodic sweep behind them.

use crate::api::{Api, delete_outcome};
use crate::store::{Key, Outcome};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

const CRD_KEY: &str = "customresourcedefinitions.apiextensions.k8s.io";
const CLEANUP: &str = "customresourcecleanup.apiextensions.k8s.io";

/// How often the sweep runs when no deletion woke it.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

pub(crate) async fn run(api: Arc<Api>, leader: Option<tokio::sync::watch::Receiver<bool>>) {
    let mut rx = api.store.subscribe();
    // CRDs another server installed while this one started (etcd) are served from now on.
    api.refresh_registry();
    let leading = || leader.as_ref().is_none_or(|l| *l.borrow());
    // Deletions wake the sweep at once; the periodic one is a safety net. It walks every object
    // of the store under its read lock (a fleet holds hundreds of thousands), so not often.
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    loop {
        let wake = tokio::select! {
            _ = api.stop.cancelled() => return,
            _ = tick.tick() => true,
            got = rx.recv() => match got {
                Ok(batch) => {
                    if batch.iter().any(|e| &*e.key.res == CRD_KEY) {
                        api.refresh_registry();
                    }
                    batch.iter().any(|e| {
                        e.obj.deleting
                            || e.kind == crate::store::EventType::Deleted
                            || (e.kind == crate::store::EventType::Added && orphan(&api, e))
                    })
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => true,
                // The store's view was loaded again (etcd): follow the new feed.
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    rx = api.store.subscribe();
                    api.refresh_registry();
                    true
                }
            },
        };
        // The registry follows the CRDs on every server; what deletes runs on the leader only.
        if wake && leading() {
            sweep(&api).await;
        }
    }
}

/// Whether a new object names owners none of which exists (any more): created after its owner
/// was deleted (a controller's write racing the delete), it goes at once rather than at the
/// next periodic sweep. Each owner is looked up by its kind and name, not by a walk of the store.
fn orphan(api: &Api, e: &crate::store::Event) -> bool {
    if e.obj.owners.is_empty() {
        return false;
    }
    let v = e.obj.value();
    let reg = api.registry();
    let t = api.store.read();
    let refs = v["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    !refs.iter().any(|r| {
        let group = r["apiVersion"]
            .as_str()
            .and_then(|a| a.rsplit_once('/'))
            .map_or("", |(g, _)| g);
        let (Some(kind), Some(name), Some(uid)) =
            (r["kind"].as_str(), r["name"].as_str(), r["uid"].as_str())
        else {
            return false;
        };
        let Some(res) = reg.by_kind(group, kind) else {
            // A kind not served here: not judged, left to the periodic sweep.
            return true;
        };
        let ns = if res.namespaced {
            e.key.ns.clone()
        } else {
            String::new()
        };
        t.objects
            .get(&res.store_key)
            .and_then(|m| m.get(&(ns, name.to_string())))
            .is_some_and(|o| o.uid == uid)
    })
}

async fn delete(api: &Api, key: Key) {
    let reg = api.registry();
    let Some(res) = reg
        .resources
        .iter()
        .find(|r| r.store_key == key.res)
        .cloned()
    else {
        // A resource no longer served (its CRD is gone): remove the object as it is.
        let _ = api
            .store
            .mutate(
                key,
                false,
                Box::new(|old, _| match old {
                    Some(v) => Ok(Outcome::Delete(v)),
                    None => Ok(Outcome::Unchanged(Value::Null)),
                }),
            )
            .await;
        return;
    };
    let name = key.name.clone();
    let r = api
        .store
        .mutate(
            key,
            false,
            Box::new(move |old, _| delete_outcome(&res, &name, old, &json!({}))),
        )
        .await;
    if let Err(e) = r
        && e.code != 404
    {
        tracing::warn!(error = %e, "garbage collection could not delete an object");
    }
}

/// Removes `finalizer` (from `metadata.finalizers`, or a namespace's `spec.finalizers`) and so
/// lets the object go.
async fn finalize(api: &Api, key: Key, finalizer: &'static str, spec: bool) {
    let r = api
        .store
        .mutate(
            key,
            false,
            Box::new(move |old, _| {
                let Some(mut v) = old else {
                    return Ok(Outcome::Unchanged(Value::Null));
                };
                let list = if spec {
                    &mut v["spec"]["finalizers"]
                } else {
                    &mut v["metadata"]["finalizers"]
                };
                if let Some(a) = list.as_array_mut() {
                    a.retain(|f| f != finalizer);
                }
                let left = v["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|a| !a.is_empty())
                    || v["spec"]["finalizers"]
                        .as_array()
                        .is_some_and(|a| !a.is_empty());
                Ok(if left {
                    Outcome::Put(v)
                } else {
                    Outcome::Delete(v)
                })
            }),
        )
        .await;
    if let Err(e) = r {
        tracing::warn!(error = %e, "could not finalize an object");
    }
}

async fn sweep(api: &Api) {
    let reg = api.registry();
    let mut to_delete: Vec<Key> = Vec::new();
    let mut to_finalize: Vec<(Key, &'static str, bool)> = Vec::new();
    {
        let t = api.store.read();
        // Namespaces being deleted.
        if let Some(nss) = t.objects.get("namespaces") {
            for ((_, ns), o) in nss.iter().filter(|(_, o)| o.deleting) {
                let mut left = 0;
                for r in reg.resources.iter().filter(|r| r.namespaced) {
                    if let Some(m) = t.objects.get(&r.store_key) {
                        for ((ons, name), obj) in m.range((ns.clone(), String::new())..) {
                            if ons != ns {
                                break;
                            }
                            left += 1;
                            if !obj.deleting {
                                to_delete.push(Key {
                                    res: r.store_key.clone(),
                                    ns: ns.clone(),
                                    name: name.clone(),
                                });
                            }
                        }
                    }
                }
                if left == 0 {
                    to_finalize.push((
                        Key {
                            res: Arc::from("namespaces"),
                            ns: String::new(),
                            name: ns.clone(),
                        },
                        "kubernetes",
                        true,
                    ));
                }
                let _ = o;
            }
        }
        // CRDs being deleted.
        if let Some(crds) = t.objects.get(CRD_KEY) {
            for ((_, name), _) in crds.iter().filter(|(_, o)| o.deleting) {
                let objs = t.objects.get(name.as_str());
                match objs.filter(|m| !m.is_empty()) {
                    Some(m) => {
                        let res: Arc<str> = Arc::from(name.as_str());
                        for ((ns, n), o) in m {
                            if !o.deleting {
                                to_delete.push(Key {
                                    res: res.clone(),
                                    ns: ns.clone(),
                                    name: n.clone(),
                                });
                            }
                        }
                    }
                    None => to_finalize.push((
                        Key {
                            res: Arc::from(CRD_KEY),
                            ns: String::new(),
                            name: name.clone(),
                        },
                        CLEANUP,
                        false,
                    )),
                }
            }
        }
        // Dependents whose owners are all gone.
        let uids: HashSet<&str> = t
            .objects
            .values()
            .flat_map(|m| m.values().map(|o| o.uid.as_str()))
            .collect();
        for (res, m) in &t.objects {
            for ((ns, name), o) in m {
                if !o.owners.is_empty()
                    && !o.deleting
                    && o.owners.iter().all(|u| !uids.contains(u.as_str()))
                {
                    to_delete.push(Key {
                        res: res.clone(),
                        ns: ns.clone(),
                        name: name.clone(),
                    });
                }
            }
        }
    }
    for k in to_delete {
        delete(api, k).await;
    }
    for (k, f, spec) in to_finalize {
        finalize(api, k, f, spec).await;
    }
}
