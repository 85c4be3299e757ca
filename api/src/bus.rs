//! The cloud's message bus: the messages the controllers (devices, edge objects) address to
//! nodes, and the [`Hub`] that carries them (cloudhub, or [`MemoryHub`] with no cloudhub). It
//! sits below the controllers and cloudhub, which are all built on it, as KubeEdge's
//! `cloud/pkg/common/messagelayer` does.

use crate::message::Message;
use crate::packed::Packed;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the hub needs to resend a message until the node acknowledges it, and to drop it when a
/// newer version of the same object supersedes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckKey {
    /// `device` or `devicemodel`.
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
}

/// A message for one node.
#[derive(Clone, Debug, PartialEq)]
pub struct Outbound {
    pub node: String,
    pub message: Message,
    /// `None` for messages that need no acknowledgement (membership).
    pub ack: Option<AckKey>,
    /// The content's JSON text as the controller keeps it (shared, not copied), when there is
    /// one: a hub that holds the message until it is acknowledged keeps this instead of its own
    /// copy of the object.
    pub body: Option<Packed>,
}

/// Where messages for nodes go: cloudhub, or memory.
pub trait Hub: Send + Sync + 'static {
    fn send(&self, out: Outbound);
}

/// A hub that keeps each node's messages in memory, bounded: a message about an object
/// replaces an older one about the same object still queued (it supersedes it); beyond `limit`
/// messages per node the oldest are dropped and counted.
pub struct MemoryHub {
    /// Per node: each message as its JSON text, compressed (a fraction of a parsed message's
    /// memory).
    queues: Mutex<BTreeMap<String, VecDeque<Queued>>>,
    limit: usize,
    pub dropped: AtomicU64,
}

struct Queued {
    ack: Option<AckKey>,
    text: Packed,
}

impl MemoryHub {
    pub fn new(limit: usize) -> Self {
        Self {
            queues: Mutex::new(BTreeMap::new()),
            limit: limit.max(1),
            dropped: AtomicU64::new(0),
        }
    }

    /// Takes every queued message, node by node.
    pub fn take(&self) -> BTreeMap<String, Vec<Outbound>> {
        let mut q = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *q)
            .into_iter()
            .map(|(node, v)| {
                let msgs = v
                    .into_iter()
                    .filter_map(|m| {
                        Some(Outbound {
                            node: node.clone(),
                            message: serde_json::from_slice(&m.text.bytes()).ok()?,
                            ack: m.ack,
                            body: None,
                        })
                    })
                    .collect();
                (node, msgs)
            })
            .collect()
    }

    /// Messages queued for all nodes.
    pub fn len(&self) -> usize {
        self.queues
            .lock()
            .map(|q| q.values().map(VecDeque::len).sum())
            .unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Hub for MemoryHub {
    fn send(&self, out: Outbound) {
        let mut q = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        let queue = q.entry(out.node.clone()).or_default();
        if let Some(k) = &out.ack {
            queue.retain(|o| {
                o.ack.as_ref().is_none_or(|a| {
                    (a.kind, &a.namespace, &a.name) != (k.kind, &k.namespace, &k.name)
                })
            });
        }
        queue.push_back(Queued {
            text: Packed::new(&serde_json::to_vec(&out.message).unwrap_or_default()),
            ack: out.ack,
        });
        while queue.len() > self.limit {
            queue.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The ObjectSync name of what `node` acknowledged: `{node}.{uid}`, as KubeEdge names it.
pub fn object_sync_name(node: &str, uid: &str) -> String {
    format!("{node}.{uid}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(node: &str, name: &str, version: &str) -> Outbound {
        Outbound {
            node: node.into(),
            message: Message::new(
                "devicecontroller",
                "twin",
                "update",
                name,
                serde_json::json!({"v": version}),
            ),
            ack: Some(AckKey {
                kind: "device",
                namespace: "default".into(),
                name: name.into(),
                uid: format!("uid-{name}"),
                resource_version: version.into(),
            }),
            body: None,
        }
    }

    fn versions(hub: &MemoryHub, node: &str) -> Vec<String> {
        hub.take()
            .remove(node)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|o| o.ack.map(|a| format!("{}@{}", a.name, a.resource_version)))
            .collect()
    }

    #[test]
    fn a_newer_message_about_an_object_replaces_the_queued_one() {
        let hub = MemoryHub::new(10);
        hub.send(out("n1", "a", "1"));
        hub.send(out("n1", "b", "1"));
        hub.send(out("n1", "a", "2"));
        hub.send(out("n2", "a", "1"));
        assert_eq!(versions(&hub, "n1"), ["b@1", "a@2"]);
        assert_eq!(
            versions(&hub, "n2"),
            Vec::<String>::new(),
            "taken with n1's"
        );
        assert_eq!(hub.dropped.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn beyond_its_limit_a_nodes_queue_drops_the_oldest_and_counts_them() {
        let hub = MemoryHub::new(2);
        for name in ["a", "b", "c", "d"] {
            hub.send(out("n1", name, "1"));
        }
        assert_eq!(hub.len(), 2);
        assert_eq!(hub.dropped.load(Ordering::Relaxed), 2);
        assert_eq!(versions(&hub, "n1"), ["c@1", "d@1"]);
        assert!(hub.is_empty());
    }
}
