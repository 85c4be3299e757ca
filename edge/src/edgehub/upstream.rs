//! What a node reports to the cloud: its outbox as one `twin/edge_updated` message per device
//! (its alarms beside the twin) (and one `state/update` per state), without what a device keeps local (`reportToCloud:
//! false`); every device's state at a session's start.

use super::{EdgeHub, link};
use api::message::Message;
use api::paths::DeviceId;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use twin::model::{OutboxEntry, Section};

impl EdgeHub {
    /// The outbox entries neither in flight nor waiting in `link`, as one `twin/edge_updated`
    /// message per device (and one `state/update` per state), each with its entries.
    pub(super) async fn outbox_messages(
        &self,
        link: &link::Link,
    ) -> Vec<(Message, Vec<OutboxEntry>)> {
        let entries = match self.twin.store().outbox_devices(link.read_limit()).await {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "edgehub: cannot read the outbox");
                return Vec::new();
            }
        };
        let busy = link.busy();
        let mut by_device: BTreeMap<(String, String), Vec<OutboxEntry>> = BTreeMap::new();
        let mut out = Vec::new();
        let mut local = Vec::new();
        let mut kept: HashMap<DeviceId, Local> = HashMap::new();
        for e in entries {
            if busy.contains(&(e.namespace.clone(), e.name.clone(), e.property.clone())) {
                continue;
            }
            let id = DeviceId::new(&e.namespace, &e.name);
            let only_here = kept
                .entry(id.clone())
                .or_insert_with(|| self.local_only(&id));
            // Reported values and states the device keeps local; desired values set here go up.
            let stays = match e.section {
                Section::State => only_here.state,
                Section::Reported | Section::Errors => only_here.properties.contains(&e.property),
                _ => false,
            };
            if stays {
                local.push(e);
                continue;
            }
            if e.section == Section::State {
                let msg = self.state_message(&e.namespace, &e.name, &e.value, e.timestamp);
                out.push((msg, vec![e]));
                continue;
            }
            by_device
                .entry((e.namespace.clone(), e.name.clone()))
                .or_default()
                .push(e);
        }
        for ((ns, name), entries) in by_device {
            let (types, spec) = self.property_facts(&DeviceId::new(&ns, &name));
            let mut twin = serde_json::Map::new();
            // Beside KubeEdge's `twin`, which its cloud reads alone: the device's alarms.
            let mut alarms = serde_json::Map::new();
            for e in &entries {
                if e.section == Section::Alarm {
                    let alarm: serde_json::Value =
                        serde_json::from_str(&e.value).unwrap_or_default();
                    alarms.insert(e.property.clone(), alarm);
                    continue;
                }
                let kind = types.get(&e.property).map_or("string", String::as_str);
                let slot = twin
                    .entry(e.property.clone())
                    .or_insert_with(|| json!({"metadata": {"type": kind}}));
                if e.section == Section::Errors {
                    // Beside KubeEdge's keys, which its cloud reads alone.
                    slot["errors"] = serde_json::from_str(&e.value).unwrap_or_default();
                    continue;
                }
                let (value_key, version_key) = match e.section {
                    Section::Reported => ("actual", "actual_version"),
                    _ => ("expected", "expected_version"),
                };
                slot[value_key] = json!({"value": e.value, "metadata": {"timestamp": e.timestamp}});
                if e.section == Section::Desired {
                    // Who the value the edge holds comes from: the spec's, or one set here over
                    // it (an override, which stands until the spec changes).
                    let from_spec = spec.get(&e.property) == Some(&e.value);
                    slot[value_key]["metadata"]["source"] =
                        json!(if from_spec { "cloud" } else { "edge" });
                }
                slot[version_key] = json!({"cloud": e.version.cloud, "edge": e.version.edge});
            }
            let mut content = json!({"event_id": uuid::Uuid::new_v4().to_string(),
                "timestamp": api::message::now_millis(), "twin": twin});
            if !alarms.is_empty() {
                content["alarms"] = alarms.into();
            }
            let msg = Message::new(
                "edgehub",
                "twin",
                "update",
                format!("node/{}/device/{ns}/{name}/twin/edge_updated", self.node),
                content,
            );
            out.push((msg, entries));
        }
        if !local.is_empty() {
            // Never sent: they leave the outbox here (the twin and its MQTT and HTTP APIs have them).
            if let Err(e) = self.twin.store().ack(&local).await {
                tracing::warn!(error = %e, "edgehub: cannot clear values kept local; tried again later");
            }
        }
        out
    }
}

/// What a device keeps off the cloud: properties and state with `reportToCloud: false`.
#[derive(Default)]
struct Local {
    properties: std::collections::HashSet<String>,
    state: bool,
}

impl EdgeHub {
    /// The properties (and state) of a device that say `reportToCloud: false`. Only an explicit
    /// `false` keeps a value local: KubeEdge's mappers report nothing when the field is absent,
    /// but here the twin has every value anyway, so the cloud gets it unless told otherwise.
    fn local_only(&self, id: &DeviceId) -> Local {
        let c = crate::catalog::read(&self.catalog);
        let Some(device) = c.devices.get(id).and_then(|d| d.device()) else {
            return Local::default();
        };
        Local {
            properties: device
                .spec
                .properties
                .iter()
                .filter(|p| p.report_to_cloud == Some(false))
                .map(|p| p.name.clone())
                .collect(),
            state: device
                .spec
                .state_report
                .as_ref()
                .and_then(|s| s.report_to_cloud)
                .or_else(|| device.status.as_ref().and_then(|s| s.report_to_cloud))
                == Some(false),
        }
    }

    /// KubeEdge's state/update of a device: its state, and the last time it was online.
    fn state_message(&self, namespace: &str, name: &str, state: &str, at: i64) -> Message {
        let online = matches!(state, "online" | "ok");
        Message::new(
            "edgehub",
            "twin",
            "update",
            format!("node/{}/device/{namespace}/{name}/state/update", self.node),
            json!({"event_id": uuid::Uuid::new_v4().to_string(),
                "timestamp": api::message::now_millis(),
                "device": {"name": name, "state": state,
                    "lastOnlineTime": if online { twin::model::rfc3339(at) } else { String::new() }}}),
        )
    }

    /// Each device's state as the twin holds it (`unknown` for one no mapper has reported yet),
    /// sent at the start of a session: while the node was away the cloud marked its devices
    /// `unknown` because of it, and a state that did not change meanwhile has nothing in the
    /// outbox to say it is the edge's own again.
    pub(super) async fn device_states(&self) -> Vec<Message> {
        let rows = match self.twin.list().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "edgehub: cannot read the devices' states to send them again");
                return Vec::new();
            }
        };
        rows.into_iter()
            .filter(|r| !self.local_only(&r.id()).state)
            .map(|r| {
                let state = if r.state.is_empty() {
                    "unknown"
                } else {
                    r.state.as_str()
                };
                let at = if r.last_online > 0 {
                    r.last_online
                } else {
                    api::message::now_millis()
                };
                self.state_message(&r.namespace, &r.name, state, at)
            })
            .collect()
    }

    /// The model's type of each property of a device, as KubeEdge's twin metadata names them
    /// (`int`, `float`, `boolean`...), and the desired value of each in the Device spec.
    fn property_facts(&self, id: &DeviceId) -> (HashMap<String, String>, HashMap<String, String>) {
        let c = crate::catalog::read(&self.catalog);
        let Some(device) = c.devices.get(id).and_then(|d| d.device()) else {
            return Default::default();
        };
        let types = c
            .model_of(&device)
            .map(|m| {
                m.spec
                    .properties
                    .iter()
                    .filter_map(|p| Some((p.name.clone(), p.type_?.as_str().to_lowercase())))
                    .collect()
            })
            .unwrap_or_default();
        let spec = device
            .spec
            .properties
            .iter()
            .filter_map(|p| Some((p.name.clone(), p.desired.as_ref()?.value.clone())))
            .collect();
        (types, spec)
    }
}
