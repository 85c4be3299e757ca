//! The Device and DeviceModel objects this node runs, with model defaults merged into each
//! device, and the difference between two versions of that set.
//!
//! Devices are kept as compact JSON ([`StoredDevice`]) and parsed when used (registering a
//! mapper, pushing a desired value), which is rare: a `Device` with its `configData` maps takes
//! about 14 KB of memory, its JSON about a tenth of that.

use api::merge::{effective_device, into_effective};
use api::paths::DeviceId;
use api::v1beta1::{Device, DeviceModel, namespace_of};
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A change of the catalog, in the order it should be applied (models before their devices).
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    ModelAdded(DeviceModel),
    ModelUpdated(DeviceModel),
    ModelRemoved(DeviceId),
    /// As stored (compact JSON), parsed by each reader when it takes the change: a start lists
    /// every device, and every one parsed at once was the start's peak of memory (several KB
    /// each, against about 1 KB of JSON).
    DeviceAdded(StoredDevice),
    /// The effective spec changed (a reload that changes nothing is no change).
    DeviceUpdated(StoredDevice),
    DeviceRemoved(DeviceId),
}

/// An effective device as compact JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredDevice(Arc<str>);

impl StoredDevice {
    pub fn new(device: &Device) -> Self {
        let json = serde_json::to_string(device).unwrap_or_else(|e| {
            // Serializing a Device cannot fail (its maps have string keys); if it ever did, the
            // device is missing from what mappers see, and this says why.
            tracing::error!(device = %object_id(&device.metadata), error = %e, "failed to store a device");
            String::new()
        });
        Self(json.into())
    }

    /// As stored before (see `manifests::reload_at_start`).
    pub fn from_json(json: String) -> Self {
        Self(json.into())
    }

    /// The compact JSON.
    pub fn json(&self) -> &str {
        &self.0
    }

    /// The device's `namespace/name`, read without parsing the rest of it (what a reader of
    /// a change needs first).
    pub fn id(&self) -> Option<DeviceId> {
        #[derive(serde::Deserialize)]
        struct Head {
            metadata: Meta,
        }
        #[derive(serde::Deserialize)]
        struct Meta {
            name: Option<String>,
            namespace: Option<String>,
        }
        let head: Head = serde_json::from_str(&self.0).ok()?;
        Some(object_id(
            &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: head.metadata.name,
                namespace: head.metadata.namespace,
                ..Default::default()
            },
        ))
    }

    /// Whether the device may declare alarm rules (its JSON names their annotation): the
    /// others need not be parsed to find none.
    pub fn may_have_alarms(&self) -> bool {
        self.0.contains(api::alarm::ANNOTATION)
    }

    /// The device.
    pub fn device(&self) -> Option<Device> {
        match serde_json::from_str(&self.0) {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::error!(error = %e, "a stored device does not parse back; skipped");
                None
            }
        }
    }
}

/// Declared objects by `namespace/name`. Devices are effective: model defaults merged in.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Catalog {
    pub devices: BTreeMap<DeviceId, StoredDevice>,
    pub models: BTreeMap<DeviceId, DeviceModel>,
    /// The file each device was read from.
    pub origins: BTreeMap<DeviceId, String>,
}

/// The catalog shared by the modules.
pub type SharedCatalog = Arc<RwLock<Catalog>>;

/// Reads the shared catalog. A panic elsewhere while writing it leaves a whole catalog (writers
/// replace it in one assignment), so a poisoned lock is still read.
pub fn read(catalog: &SharedCatalog) -> RwLockReadGuard<'_, Catalog> {
    catalog.read().unwrap_or_else(|p| p.into_inner())
}

/// Writes the shared catalog (see [`read`] on poisoning).
pub fn write(catalog: &SharedCatalog) -> RwLockWriteGuard<'_, Catalog> {
    catalog.write().unwrap_or_else(|p| p.into_inner())
}

/// The id of an object: `namespace/name`.
pub fn object_id(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> DeviceId {
    DeviceId::new(namespace_of(meta), meta.name.clone().unwrap_or_default())
}

impl Catalog {
    /// A catalog of valid objects; devices get their model's defaults.
    pub fn build(models: Vec<DeviceModel>, devices: Vec<Device>) -> Self {
        let models: BTreeMap<DeviceId, DeviceModel> = models
            .into_iter()
            .map(|m| (object_id(&m.metadata), m))
            .collect();
        let devices = devices
            .into_iter()
            .map(|d| {
                let id = object_id(&d.metadata);
                let model = d
                    .model_name()
                    .and_then(|m| models.get(&DeviceId::new(&id.namespace, m)));
                let effective = match model {
                    Some(m) => StoredDevice::new(&into_effective(d, m)),
                    None => StoredDevice::new(&d),
                };
                (id, effective)
            })
            .collect();
        Self {
            devices,
            models,
            origins: BTreeMap::new(),
        }
    }

    /// The model of a device.
    pub fn model_of(&self, device: &Device) -> Option<&DeviceModel> {
        let id = object_id(&device.metadata);
        self.models
            .get(&DeviceId::new(id.namespace, device.model_name()?))
    }

    /// What changes `self` into `next`.
    pub fn diff(&self, next: &Catalog) -> Vec<Change> {
        let mut out = Vec::new();
        for (id, m) in &next.models {
            match self.models.get(id) {
                None => out.push(Change::ModelAdded(m.clone())),
                Some(old) if old.spec != m.spec => out.push(Change::ModelUpdated(m.clone())),
                Some(_) => {}
            }
        }
        for (id, d) in &next.devices {
            match self.devices.get(id) {
                None => out.push(Change::DeviceAdded(d.clone())),
                Some(old) if old != d => {
                    // Only a change of the spec (or of the alarm rules beside it) is an
                    // update (not of labels, say).
                    if let (Some(old), Some(new)) = (old.device(), d.device())
                        && (old.spec != new.spec
                            || api::alarm::text_of(&old.metadata)
                                != api::alarm::text_of(&new.metadata))
                    {
                        out.push(Change::DeviceUpdated(d.clone()));
                    }
                }
                Some(_) => {}
            }
        }
        for id in self
            .devices
            .keys()
            .filter(|id| !next.devices.contains_key(id))
        {
            out.push(Change::DeviceRemoved(id.clone()));
        }
        for id in self
            .models
            .keys()
            .filter(|id| !next.models.contains_key(id))
        {
            out.push(Change::ModelRemoved(id.clone()));
        }
        out
    }
}

/// Devices and models received from the cloud (persisted by edgehub before they are
/// acknowledged), by `namespace/name`.
#[derive(Clone, Debug, Default)]
pub struct CloudObjects {
    pub devices: BTreeMap<DeviceId, Device>,
    pub models: BTreeMap<DeviceId, DeviceModel>,
}

/// Where the catalog comes from: the local manifests as last loaded (`None` when that module is
/// off or the directory has not been read), and what the cloud sent.
#[derive(Debug, Default)]
pub struct Sources {
    pub local: Option<Catalog>,
    pub cloud: CloudObjects,
}

/// The sources shared by the manifests watcher and edgehub. Whoever changes them holds the lock
/// until the changes are applied to the twin and published, so two changes never cross.
pub type SharedSources = Arc<tokio::sync::Mutex<Sources>>;

impl Sources {
    /// The catalog both sources make. A device or model declared in a local manifest wins over
    /// the cloud's of the same `namespace/name` (a file on the gateway is a deliberate local
    /// override); the cloud's is then ignored, and logged.
    pub fn merged(&self) -> Catalog {
        let mut out = self.local.clone().unwrap_or_default();
        for (id, m) in &self.cloud.models {
            if out.models.contains_key(id) {
                tracing::debug!(model = %id, "a local manifest declares this model; the cloud's is ignored");
                continue;
            }
            out.models.insert(id.clone(), m.clone());
        }
        for (id, d) in &self.cloud.devices {
            if out.devices.contains_key(id) {
                tracing::warn!(device = %id, "a local manifest declares this device; the cloud's is ignored");
                continue;
            }
            let model = d
                .model_name()
                .and_then(|m| out.models.get(&DeviceId::new(&id.namespace, m)));
            let effective = match model {
                Some(m) => StoredDevice::new(&effective_device(d, m)),
                None => StoredDevice::new(d),
            };
            out.devices.insert(id.clone(), effective);
            out.origins.insert(id.clone(), "cloud".into());
        }
        out
    }

    /// Replaces the catalog with what the sources make now; returns the changes.
    pub fn rebuild(&self, catalog: &SharedCatalog) -> Vec<Change> {
        let next = self.merged();
        let mut current = write(catalog);
        let changes = current.diff(&next);
        *current = next;
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The id read from the head of the JSON is the one the whole device gives, whatever its
    /// namespace (none, empty, another) and wherever `metadata` stands among the fields.
    #[test]
    fn a_stored_devices_id_is_the_one_its_whole_parse_gives() {
        for meta in [
            r#"{"name":"d1"}"#,
            r#"{"name":"d2","namespace":""}"#,
            r#"{"name":"d3","namespace":"plant-7","annotations":{"devices.kubeedge.io/alarms":"hot: t > 1"}}"#,
        ] {
            for json in [
                format!(
                    r#"{{"apiVersion":"devices.kubeedge.io/v1beta1","kind":"Device","metadata":{meta},"spec":{{}}}}"#
                ),
                format!(r#"{{"spec":{{"properties":[]}},"metadata":{meta},"kind":"Device"}}"#),
            ] {
                let stored = StoredDevice::from_json(json.clone());
                let whole = stored.device().expect("a device");
                assert_eq!(stored.id(), Some(object_id(&whole.metadata)), "{json}");
                assert_eq!(
                    stored.may_have_alarms(),
                    api::alarm::text_of(&whole.metadata).is_some(),
                    "{json}"
                );
            }
        }
        assert_eq!(StoredDevice::from_json("not json".into()).id(), None);
    }
}
