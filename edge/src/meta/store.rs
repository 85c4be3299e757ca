//! What edgecore keeps besides the twins, typed, in the twin database's key-value table: the
//! devices and models the cloud sent (kept before they are acknowledged, so that they run at
//! the next start with or without a link), the pods, ConfigMaps and Secrets the cloud sent for
//! edged, and the mappers' registrations. Each record's kind and key are spelled here only.

use crate::catalog::{CloudObjects, object_id};
use api::paths::DeviceId;
use api::v1beta1::{Device, DeviceModel};
use edged::CloudPods;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeSet;

const CLOUD_DEVICE: &str = "cloud-device";
const CLOUD_MODEL: &str = "cloud-model";
const CLOUD_POD: &str = "cloud-pod";
const CLOUD_CONFIGMAP: &str = "cloud-configmap";
const CLOUD_SECRET: &str = "cloud-secret";
const MAPPER: &str = "devicemapper";
/// The result of loading the manifests at the last start (one row).
const MANIFESTS_CACHE: &str = "manifests-result";

/// A registered mapper, as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MapperRecord {
    pub name: String,
    pub protocol: String,
    /// The mapper's own Unix socket.
    pub address: String,
    pub version: String,
    pub api_version: String,
    /// Devices assigned to it (`namespace/name`).
    pub devices: BTreeSet<String>,
    /// Devices moved away from it while it could not be told: removed from it as soon as it
    /// answers again.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub retired: BTreeSet<String>,
}

/// Why metadata could not be stored or read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MetaError {
    #[error(transparent)]
    Store(#[from] twin::StoreError),
    #[error("cannot encode {what}: {source}")]
    Encode {
        what: String,
        #[source]
        source: serde_json::Error,
    },
}

type Result<T, E = MetaError> = std::result::Result<T, E>;

/// The kinds of object the cloud sends for edged.
const POD_KINDS: [(&str, &str); 3] = [
    ("configmap", CLOUD_CONFIGMAP),
    ("secret", CLOUD_SECRET),
    ("pod", CLOUD_POD),
];

fn pod_meta_kind(kind: &str) -> &'static str {
    match kind {
        "pod" => CLOUD_POD,
        "configmap" => CLOUD_CONFIGMAP,
        _ => CLOUD_SECRET,
    }
}

/// The metadata side of the twin database.
#[derive(Clone)]
pub(crate) struct MetaStore {
    store: twin::Store,
}

impl MetaStore {
    pub(crate) fn new(store: twin::Store) -> Self {
        Self { store }
    }

    /// What the cloud sent before, as last stored. A record that does not parse is skipped and
    /// logged: one bad row does not keep the others from running.
    pub(crate) async fn cloud_objects(&self) -> Result<CloudObjects> {
        let mut out = CloudObjects::default();
        for (key, text) in self.store.list_meta(CLOUD_DEVICE).await? {
            match serde_json::from_str::<Device>(&text) {
                Ok(d) => {
                    out.devices.insert(object_id(&d.metadata), d);
                }
                Err(e) => {
                    tracing::error!(%key, error = %e, "a stored cloud device does not parse; skipped")
                }
            }
        }
        for (key, text) in self.store.list_meta(CLOUD_MODEL).await? {
            match serde_json::from_str::<DeviceModel>(&text) {
                Ok(m) => {
                    out.models.insert(object_id(&m.metadata), m);
                }
                Err(e) => {
                    tracing::error!(%key, error = %e, "a stored cloud model does not parse; skipped")
                }
            }
        }
        Ok(out)
    }

    /// What the manifests gave at the last start (`manifests::reload_at_start`).
    pub(crate) async fn manifests_cache(&self) -> Result<Option<String>> {
        let mut rows = self.store.list_meta(MANIFESTS_CACHE).await?;
        Ok(rows.pop().map(|(_, v)| v))
    }

    pub(crate) async fn save_manifests_cache(&self, text: &str) -> Result<()> {
        Ok(self
            .store
            .put_meta("manifests/result", MANIFESTS_CACHE, text)
            .await?)
    }

    pub(crate) async fn save_cloud_device(&self, id: &DeviceId, d: &Device) -> Result<()> {
        let text = encode(&format!("device {id}"), d)?;
        let key = format!("device/{id}");
        Ok(self.store.put_meta(&key, CLOUD_DEVICE, &text).await?)
    }

    pub(crate) async fn save_cloud_model(&self, id: &DeviceId, m: &DeviceModel) -> Result<()> {
        let text = encode(&format!("model {id}"), m)?;
        let key = format!("devicemodel/{id}");
        Ok(self.store.put_meta(&key, CLOUD_MODEL, &text).await?)
    }

    /// Forgets a device (`kind` `device`) or model (`devicemodel`) the cloud sent.
    pub(crate) async fn delete_cloud_object(&self, kind: &str, id: &DeviceId) -> Result<()> {
        Ok(self.store.delete_meta(&format!("{kind}/{id}")).await?)
    }

    /// Fills `into` with what the cloud sent for edged before. A record that does not parse is
    /// skipped and logged.
    pub(crate) async fn load_pod_objects(&self, into: &CloudPods) -> Result<()> {
        for (kind, meta) in POD_KINDS {
            for (key, text) in self.store.list_meta(meta).await? {
                let parsed = serde_json::from_str::<Value>(&text)
                    .map_err(anyhow::Error::from)
                    .and_then(|v| {
                        let k = (
                            v["metadata"]["namespace"]
                                .as_str()
                                .unwrap_or("default")
                                .to_string(),
                            v["metadata"]["name"]
                                .as_str()
                                .unwrap_or_default()
                                .to_string(),
                        );
                        Ok(into.put(kind, k, v)?)
                    });
                if let Err(e) = parsed {
                    tracing::error!(%key, error = %e, "a stored object from the cloud does not parse; skipped");
                }
            }
        }
        Ok(())
    }

    /// Keeps a pod, ConfigMap or Secret (`kind`) the cloud sent for edged.
    pub(crate) async fn save_pod_object(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        content: &Value,
    ) -> Result<()> {
        let key = format!("{kind}/{namespace}/{name}");
        Ok(self
            .store
            .put_meta(&key, pod_meta_kind(kind), &content.to_string())
            .await?)
    }

    pub(crate) async fn delete_pod_object(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<()> {
        Ok(self
            .store
            .delete_meta(&format!("{kind}/{namespace}/{name}"))
            .await?)
    }

    /// The stored mapper registrations; one that does not parse is skipped and logged.
    pub(crate) async fn mapper_records(&self) -> Result<Vec<MapperRecord>> {
        let mut out = Vec::new();
        for (key, value) in self.store.list_meta(MAPPER).await? {
            match serde_json::from_str::<MapperRecord>(&value) {
                Ok(record) => out.push(record),
                Err(e) => {
                    tracing::warn!(key, error = %e, "ignoring unreadable stored mapper registration")
                }
            }
        }
        Ok(out)
    }

    pub(crate) async fn save_mapper(&self, record: &MapperRecord) -> Result<()> {
        let text = encode(&format!("mapper {}", record.name), record)?;
        let key = format!("{MAPPER}/{}", record.name);
        Ok(self.store.put_meta(&key, MAPPER, &text).await?)
    }
}

fn encode(what: &str, value: &impl serde::Serialize) -> Result<String> {
    serde_json::to_string(value).map_err(|source| MetaError::Encode {
        what: what.to_string(),
        source,
    })
}
