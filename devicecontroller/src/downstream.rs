//! The downstream logic, pure: from the Devices and DeviceModels it has seen, what every node
//! must hold, diffed against what the node was last sent, as KubeEdge's messages
//! (kubeedge/kubeedge `cloud/pkg/devicecontroller/controller/downstream.go`):
//!
//! - membership: `node/{node}/membership`, group `twin`, op `update`, content
//!   `{event_id, timestamp, added_devices: [{id: "{ns}/{name}", name, description}], removed_devices}`;
//! - a model: `node/{node}/{ns}/devicemodel/{name}`, group `resource`, op `insert`/`update`/`delete`,
//!   `resourceversion` = the model's, content the DeviceModel object;
//! - a device: `node/{node}/{ns}/device/{name}`, the same, content the Device object (model
//!   defaults not merged, as KubeEdge sends it).
//!
//! Better than KubeEdge's: a spec that did not change sends nothing; a model edit goes to every node
//! whose devices use it; a device moved to another node leaves the old one and joins the new one;
//! a device whose model does not exist yet waits for it and goes out when it appears; a model is
//! removed from a node when its last device there goes.

use api::bus::{AckKey, Outbound};
use api::message::{Message, group, operation, source};
use api::packed::Packed;
use api::paths::Resource;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// `{namespace, name}` of an object.
pub type Key = (String, String);

/// A device as kept: its JSON text, compressed (parsed again only to send it), and the hash of
/// its spec.
/// A parsed `serde_json::Value` costs about ten times its text, and a controller holds every
/// device of a site.
#[derive(Clone, Debug)]
struct DeviceEntry {
    node: String,
    model: String,
    description: String,
    spec: u64,
    object: Packed,
    /// The names of `spec.properties`, which every report is checked against.
    properties: Arc<[String]>,
}

#[derive(Clone, Debug)]
struct ModelEntry {
    spec: u64,
    object: Packed,
}

/// What a node was last sent: the hash of each object's spec.
#[derive(Clone, Debug, Default)]
struct Sent {
    devices: BTreeMap<Key, u64>,
    models: BTreeMap<Key, u64>,
}

/// A hash of a spec (serde_json's maps are sorted, so equal specs give equal text).
fn spec_hash(spec: &Value) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    spec.to_string().hash(&mut h);
    h.finish()
}

fn parse(text: &Packed) -> Value {
    serde_json::from_slice(&text.bytes()).unwrap_or(Value::Null)
}

/// The downstream state.
#[derive(Debug, Default)]
pub struct Downstream {
    devices: BTreeMap<Key, DeviceEntry>,
    models: BTreeMap<Key, ModelEntry>,
    by_node: HashMap<String, BTreeSet<Key>>,
    by_model: HashMap<Key, BTreeSet<Key>>,
    sent: BTreeMap<String, Sent>,
    /// Until the first full list is in, changes are only recorded.
    synced: bool,
    /// Objects just deleted, for the delete messages of the reconcile that follows.
    tombstones: BTreeMap<(&'static str, Key), Value>,
    /// Per node: objects it acknowledged before this start that no longer exist (from
    /// [`Downstream::seed_delivered`]), for its delete messages; kept until sent.
    gone: BTreeMap<(String, &'static str, Key), Value>,
    /// Replicas: the nodes whose sessions this replica holds, the only ones it sends to; what
    /// the others hold is what they acknowledged through any replica (their ObjectSync
    /// records, [`Downstream::seed_delivered`]). `None`: alone, every node.
    owned: Option<HashSet<String>>,
}

fn key_of(obj: &Value) -> Option<Key> {
    let m = &obj["metadata"];
    Some((
        m["namespace"].as_str().unwrap_or("default").to_string(),
        m["name"].as_str()?.to_string(),
    ))
}

fn rv(obj: &Value) -> String {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The object as sent: with its kind, without the server's bookkeeping.
fn outward(obj: &Value, kind: &str) -> Value {
    let mut o = obj.clone();
    if !o.is_object() {
        return json!({});
    }
    o["apiVersion"] = json!("devices.kubeedge.io/v1beta1");
    o["kind"] = json!(kind);
    if let Some(m) = o["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    o
}

fn outward_text(obj: &Value, kind: &str) -> Packed {
    Packed::new(outward(obj, kind).to_string().as_bytes())
}

impl Downstream {
    pub fn new() -> Self {
        Self::default()
    }

    /// Nodes that hold devices now.
    pub fn nodes(&self) -> Vec<String> {
        self.by_node
            .iter()
            .filter(|(_, s)| !s.is_empty())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The devices bound to `node`: `(namespace, name)`.
    pub fn devices_of(&self, node: &str) -> Vec<Key> {
        self.by_node
            .get(node)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether the first full list is in.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// Every device's key.
    pub fn device_keys(&self) -> Vec<Key> {
        self.devices.keys().cloned().collect()
    }

    /// Every model's key.
    pub fn model_keys(&self) -> Vec<Key> {
        self.models.keys().cloned().collect()
    }

    /// Devices known.
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// The node a device is bound to, if any.
    pub fn node_of(&self, namespace: &str, name: &str) -> Option<&str> {
        self.devices
            .get(&(namespace.to_string(), name.to_string()))
            .map(|d| d.node.as_str())
            .filter(|n| !n.is_empty())
    }

    /// The names of a device's `spec.properties`.
    pub fn properties(&self, namespace: &str, name: &str) -> Option<&[String]> {
        self.devices
            .get(&(namespace.to_string(), name.to_string()))
            .map(|d| &d.properties[..])
    }

    /// The stored Device object.
    pub fn device(&self, namespace: &str, name: &str) -> Option<Value> {
        self.devices
            .get(&(namespace.to_string(), name.to_string()))
            .map(|d| parse(&d.object))
    }

    /// The stored DeviceModel object.
    pub fn model(&self, namespace: &str, name: &str) -> Option<Value> {
        self.models
            .get(&(namespace.to_string(), name.to_string()))
            .map(|m| parse(&m.object))
    }

    /// Devices bound to `node`, with their models when those exist.
    pub fn node_devices(&self, node: &str) -> Vec<(Value, Option<Value>)> {
        self.by_node
            .get(node)
            .map(|keys| {
                keys.iter()
                    .filter_map(|k| self.devices.get(k).map(|d| (k, d)))
                    .map(|(k, d)| (parse(&d.object), self.model(&k.0, &d.model)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The full list is in: from now on every change is reconciled. Returns the messages of
    /// every node.
    pub fn synced(&mut self) -> Vec<Outbound> {
        let nodes = self.mark_synced();
        nodes.iter().flat_map(|n| self.reconcile_node(n)).collect()
    }

    /// The full list is in; returns the nodes to reconcile one by one with
    /// [`Downstream::reconcile_node`] (so that only one node's messages exist at a time: a
    /// message holds a whole parsed object).
    pub fn mark_synced(&mut self) -> Vec<String> {
        self.synced = true;
        let mut nodes: BTreeSet<String> = self.by_node.keys().cloned().collect();
        nodes.extend(self.sent.keys().cloned());
        nodes.into_iter().collect()
    }

    /// What a node acknowledged before this start (its ObjectSync records: the object's kind,
    /// key, uid and the resourceVersion the node has). Called before [`Downstream::mark_synced`],
    /// after the first full list (and on replicas, for the nodes of other replicas, as their
    /// records change): the reconcile that follows sends the node only what it misses,
    /// an update where its version is older, and a delete for what no longer exists (or exists
    /// again under another uid), including deletions made while this controller was down.
    pub fn seed_delivered(
        &mut self,
        node: &str,
        kind: &'static str,
        key: Key,
        uid: &str,
        rv: &str,
    ) {
        let current = match kind {
            "device" => self.devices.get(&key).map(|d| (d.spec, parse(&d.object))),
            _ => self.models.get(&key).map(|m| (m.spec, parse(&m.object))),
        };
        let sent = self.sent.entry(node.to_string()).or_default();
        let map = if kind == "device" {
            &mut sent.devices
        } else {
            &mut sent.models
        };
        match current {
            Some((spec, obj)) if obj["metadata"]["uid"].as_str() == Some(uid) => {
                // Up to date, or an older version: then an update goes (hash 0 never matches).
                let same = obj["metadata"]["resourceVersion"].as_str() == Some(rv);
                map.insert(key, if same { spec } else { 0 });
            }
            _ => {
                map.insert(key.clone(), 0);
                // The delete carries the version the node has: a message to be acknowledged
                // has a resourceVersion (KubeEdge's edge answers only those).
                let api_kind = if kind == "device" {
                    "Device"
                } else {
                    "DeviceModel"
                };
                self.gone.insert(
                    (node.to_string(), kind, key.clone()),
                    json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": api_kind,
                        "metadata": {"namespace": key.0, "name": key.1, "uid": uid,
                            "resourceVersion": rv}}),
                );
            }
        }
    }

    /// Replicas: from now on only the nodes [`Downstream::own`] names are sent messages.
    pub fn share(&mut self) {
        self.owned.get_or_insert_with(HashSet::new);
    }

    /// Nodes owned (replicas), 0 alone.
    pub fn owned_count(&self) -> usize {
        self.owned.as_ref().map_or(0, HashSet::len)
    }

    /// Whether messages for `node` are this controller's to send.
    pub fn owns(&self, node: &str) -> bool {
        self.owned.as_ref().is_none_or(|o| o.contains(node))
    }

    /// `node`'s session is here now: the messages that bring it from what it acknowledged to
    /// what it must hold.
    pub fn own(&mut self, node: &str) -> Vec<Outbound> {
        let new = self
            .owned
            .as_mut()
            .is_some_and(|o| o.insert(node.to_string()));
        if new {
            self.reconcile_node(node)
        } else {
            Vec::new()
        }
    }

    /// `node`'s session left this replica: what it was sent stays as the baseline until its
    /// acknowledgements through another replica say more.
    pub fn disown(&mut self, node: &str) {
        if let Some(o) = self.owned.as_mut() {
            o.remove(node);
        }
    }

    /// A node acknowledged the deletion of an object through another replica (its ObjectSync
    /// record is gone): it no longer holds it.
    pub fn undelivered(&mut self, node: &str, kind: &'static str, key: &Key) {
        if let Some(sent) = self.sent.get_mut(node) {
            match kind {
                "device" => sent.devices.remove(key),
                _ => sent.models.remove(key),
            };
        }
        self.gone.remove(&(node.to_string(), kind, key.clone()));
    }

    /// `node` starts over (its Node object was deleted: a gateway reinstalled, or gone): what
    /// it was sent is forgotten, so that the next [`Downstream::reconcile_node`] sends it
    /// everything it must hold.
    pub fn forget_node(&mut self, node: &str) {
        self.sent.remove(node);
    }

    /// Devices bound to `node`.
    pub fn devices_on(&self, node: &str) -> usize {
        self.by_node.get(node).map_or(0, BTreeSet::len)
    }

    /// The messages that bring `node` up to date.
    pub fn reconcile_node(&mut self, node: &str) -> Vec<Outbound> {
        self.reconcile_nodes([node.to_string()].into())
    }

    /// A Device was added or changed.
    pub fn device_applied(&mut self, obj: &Value) -> Vec<Outbound> {
        let Some(key) = key_of(obj) else {
            return Vec::new();
        };
        let entry = DeviceEntry {
            node: obj["spec"]["nodeName"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            model: obj["spec"]["deviceModelRef"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            description: obj["metadata"]["labels"]["description"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            // The alarm rules beside the spec are the node's to evaluate: a change of them
            // goes down as a change of the spec does.
            spec: spec_hash(&json!([
                obj["spec"],
                obj["metadata"]["annotations"][api::alarm::ANNOTATION]
            ])),
            object: outward_text(obj, "Device"),
            properties: obj["spec"]["properties"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|p| p["name"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
        };
        let mut nodes = BTreeSet::new();
        if let Some(old) = self.devices.remove(&key) {
            self.unindex(&key, &old);
            nodes.insert(old.node);
        }
        nodes.insert(entry.node.clone());
        self.index(&key, &entry);
        self.devices.insert(key, entry);
        self.reconcile_nodes(nodes)
    }

    /// A Device was deleted (its last state).
    pub fn device_deleted(&mut self, obj: &Value) -> Vec<Outbound> {
        let Some(key) = key_of(obj) else {
            return Vec::new();
        };
        match self.devices.remove(&key) {
            Some(old) => {
                self.unindex(&key, &old);
                self.tombstones
                    .insert(("device", key), outward(obj, "Device"));
                self.reconcile_nodes([old.node].into())
            }
            None => Vec::new(),
        }
    }

    /// A DeviceModel was added or changed.
    pub fn model_applied(&mut self, obj: &Value) -> Vec<Outbound> {
        let Some(key) = key_of(obj) else {
            return Vec::new();
        };
        self.models.insert(
            key.clone(),
            ModelEntry {
                spec: spec_hash(&obj["spec"]),
                object: outward_text(obj, "DeviceModel"),
            },
        );
        let nodes = self.nodes_using(&key);
        self.reconcile_nodes(nodes)
    }

    /// A DeviceModel was deleted (its last state): its devices leave their nodes until it is
    /// back.
    pub fn model_deleted(&mut self, obj: &Value) -> Vec<Outbound> {
        let Some(key) = key_of(obj) else {
            return Vec::new();
        };
        if self.models.remove(&key).is_none() {
            return Vec::new();
        }
        self.tombstones
            .insert(("devicemodel", key.clone()), outward(obj, "DeviceModel"));
        let nodes = self.nodes_using(&key);
        self.reconcile_nodes(nodes)
    }

    fn nodes_using(&self, model: &Key) -> BTreeSet<String> {
        self.by_model
            .get(model)
            .map(|ds| {
                ds.iter()
                    .filter_map(|k| self.devices.get(k))
                    .map(|d| d.node.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn index(&mut self, key: &Key, d: &DeviceEntry) {
        if !d.node.is_empty() {
            self.by_node
                .entry(d.node.clone())
                .or_default()
                .insert(key.clone());
        }
        self.by_model
            .entry((key.0.clone(), d.model.clone()))
            .or_default()
            .insert(key.clone());
    }

    fn unindex(&mut self, key: &Key, d: &DeviceEntry) {
        if let Some(s) = self.by_node.get_mut(&d.node) {
            s.remove(key);
            if s.is_empty() {
                self.by_node.remove(&d.node);
            }
        }
        let mk = (key.0.clone(), d.model.clone());
        if let Some(s) = self.by_model.get_mut(&mk) {
            s.remove(key);
            if s.is_empty() {
                self.by_model.remove(&mk);
            }
        }
    }

    fn reconcile_nodes(&mut self, nodes: BTreeSet<String>) -> Vec<Outbound> {
        let out = if self.synced {
            nodes
                .into_iter()
                .filter(|n| !n.is_empty())
                .flat_map(|n| self.reconcile(&n))
                .collect()
        } else {
            Vec::new()
        };
        self.tombstones.clear();
        out
    }

    /// What `node` must hold, against what it was sent; the messages that close the gap.
    /// Compared in place: what the node was sent is updated for what changed only, so that a
    /// node of thousands of devices given one more does not cost a copy of all of them (a
    /// gateway given 5,000 devices took the controller minutes).
    fn reconcile(&mut self, node: &str) -> Vec<Outbound> {
        if !self.owns(node) {
            // Another replica's: what it was sent is left as its acknowledgements say.
            return Vec::new();
        }
        let mut had = self.sent.remove(node).unwrap_or_default();
        // The spec of each model this node's devices use, if it exists (looked up once each).
        let mut model_specs: HashMap<(&str, &str), Option<u64>> = HashMap::new();
        let mut want_models: BTreeMap<Key, u64> = BTreeMap::new();
        let mut added: Vec<&Key> = Vec::new();
        let mut changed: Vec<(&Key, &'static str)> = Vec::new();
        let mut wanted = 0usize;
        let empty = BTreeSet::new();
        let keys = self.by_node.get(node).unwrap_or(&empty);
        for k in keys {
            let Some((spec, model_spec)) =
                wanted_spec(&self.devices, &self.models, &mut model_specs, k)
            else {
                continue;
            };
            wanted += 1;
            if let Some(d) = self.devices.get(k) {
                want_models
                    .entry((k.0.clone(), d.model.clone()))
                    .or_insert(model_spec);
            }
            match had.devices.get(k) {
                None => {
                    added.push(k);
                    changed.push((k, operation::INSERT));
                }
                Some(old) if *old != spec => changed.push((k, operation::UPDATE)),
                Some(_) => {}
            }
        }
        let removed: Vec<Key> = had
            .devices
            .keys()
            .filter(|k| {
                !keys.contains(*k)
                    || wanted_spec(&self.devices, &self.models, &mut model_specs, k).is_none()
            })
            .cloned()
            .collect();
        let mut out = Vec::new();
        if !added.is_empty() || !removed.is_empty() {
            let entry = |k: &Key, desc: &str| json!({"id": format!("{}/{}", k.0, k.1), "name": k.1, "description": desc});
            let added: Vec<Value> = added
                .iter()
                .map(|k| {
                    entry(
                        k,
                        self.devices
                            .get(*k)
                            .map(|d| d.description.as_str())
                            .unwrap_or(""),
                    )
                })
                .collect();
            let removed: Vec<Value> = removed.iter().map(|k| entry(k, "")).collect();
            let msg = Message::new(
                source::DEVICE_CONTROLLER,
                group::TWIN,
                operation::UPDATE,
                format!("node/{node}/membership"),
                json!({"event_id": uuid::Uuid::new_v4().to_string(), "timestamp": api::message::now_millis(),
                    "added_devices": added, "removed_devices": removed}),
            );
            out.push(Outbound {
                node: node.to_string(),
                message: msg,
                ack: None,
                body: None,
            });
        }
        for (k, spec) in &want_models {
            let op = match had.models.get(k) {
                None => operation::INSERT,
                Some(old) if old != spec => operation::UPDATE,
                Some(_) => continue,
            };
            if let Some(m) = self.models.get(k) {
                out.push(object_message(node, "devicemodel", k, op, &m.object));
            }
        }
        for (k, op) in &changed {
            if let Some(d) = self.devices.get(*k) {
                out.push(object_message(node, "device", k, op, &d.object));
                had.devices.insert((*k).clone(), d.spec);
            }
        }
        for k in &removed {
            had.devices.remove(k);
            let last = self
                .devices
                .get(k)
                .map(|d| parse(&d.object))
                .or_else(|| self.tombstones.get(&("device", k.clone())).cloned())
                .or_else(|| self.gone.remove(&(node.to_string(), "device", k.clone())));
            out.push(delete_message(node, "device", k, last.as_ref()));
        }
        let gone_models: Vec<Key> = had
            .models
            .keys()
            .filter(|k| !want_models.contains_key(*k))
            .cloned()
            .collect();
        for k in &gone_models {
            let last = self
                .models
                .get(k)
                .map(|m| parse(&m.object))
                .or_else(|| self.tombstones.get(&("devicemodel", k.clone())).cloned())
                .or_else(|| {
                    self.gone
                        .remove(&(node.to_string(), "devicemodel", k.clone()))
                });
            out.push(delete_message(node, "devicemodel", k, last.as_ref()));
        }
        had.models = want_models;
        debug_assert_eq!(had.devices.len(), wanted);
        if !had.devices.is_empty() || !had.models.is_empty() {
            self.sent.insert(node.to_string(), had);
        }
        out
    }
}

/// Device `k`'s spec hash and its model's, if both exist (a device whose model does not exist
/// yet is not wanted on its node); `memo` holds each model's once looked up.
fn wanted_spec<'a>(
    devices: &'a BTreeMap<Key, DeviceEntry>,
    models: &BTreeMap<Key, ModelEntry>,
    memo: &mut HashMap<(&'a str, &'a str), Option<u64>>,
    k: &Key,
) -> Option<(u64, u64)> {
    let (key, d) = devices.get_key_value(k)?;
    let model = *memo
        .entry((key.0.as_str(), d.model.as_str()))
        .or_insert_with(|| {
            models
                .get(&(key.0.clone(), d.model.clone()))
                .map(|m| m.spec)
        });
    model.map(|m| (d.spec, m))
}

fn object_message(node: &str, kind: &'static str, k: &Key, op: &str, text: &Packed) -> Outbound {
    let mut out = message_of(node, kind, k, op, parse(text));
    out.body = Some(text.clone());
    out
}

fn message_of(node: &str, kind: &'static str, k: &Key, op: &str, obj: Value) -> Outbound {
    let resource = Resource::Object {
        node: node.into(),
        namespace: k.0.clone(),
        kind: kind.into(),
        name: k.1.clone(),
    };
    let version = rv(&obj);
    let uid = obj["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let msg = Message::new(
        source::DEVICE_CONTROLLER,
        group::RESOURCE,
        op,
        resource.to_string(),
        obj,
    )
    .with_resource_version(version.clone());
    Outbound {
        node: node.to_string(),
        message: msg,
        ack: Some(AckKey {
            kind,
            namespace: k.0.clone(),
            name: k.1.clone(),
            uid,
            resource_version: version,
        }),
        body: None,
    }
}

/// A delete carries the object as last seen (or its name alone when it is gone).
fn delete_message(node: &str, kind: &'static str, k: &Key, obj: Option<&Value>) -> Outbound {
    let api_kind = if kind == "device" {
        "Device"
    } else {
        "DeviceModel"
    };
    let obj = obj.cloned().unwrap_or_else(|| {
        json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": api_kind,
            "metadata": {"namespace": k.0, "name": k.1}})
    });
    message_of(node, kind, k, operation::DELETE, obj)
}

#[cfg(test)]
mod tests;
