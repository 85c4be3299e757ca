//! The registered mappers and the `DeviceMapperService` client that keeps each of them told
//! about its devices: RegisterDevice, UpdateDevice (only when the effective spec or a desired value
//! really changed), RemoveDevice, and the model calls.
//!
//! Unlike KubeEdge (one mapper per protocol), several mappers of one protocol share the devices:
//! a device goes to the mapper its annotation [`MAPPER_ANNOTATION`] names, or else to the
//! reachable mapper of its protocol holding the fewest devices, and stays there. Registrations and
//! assignments are stored, so they survive a restart. A mapper that cannot be reached is retried
//! with backoff, and its devices' state becomes `unknown` until it answers again.

use crate::catalog::{Change, SharedCatalog, StoredDevice, object_id};
use crate::metrics::Metrics;
use api::dmi::v1beta1 as pb;
use api::dmi::v1beta1::device_mapper_service_client::DeviceMapperServiceClient;
use api::dmi::{device_to_dmi, model_to_dmi};
use api::paths::DeviceId;
use api::v1beta1::{Device, DeviceModel, TwinProperty};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use twin::service::Op;
use twin::{TwinEvent, TwinService};

/// A device annotation naming the mapper that must serve it.
pub const MAPPER_ANNOTATION: &str = "edgecore.kubeedge.io/mapper";

/// The `meta` kind of stored mapper registrations.
const META_KIND: &str = "devicemapper";

/// A registered mapper, as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapperRecord {
    pub name: String,
    pub protocol: String,
    /// The mapper's own Unix socket.
    pub address: String,
    pub version: String,
    pub api_version: String,
    /// Devices assigned to it (`namespace/name`).
    pub devices: BTreeSet<String>,
}

/// How a mapper is doing, for the HTTP API.
#[derive(Clone, Debug, Serialize)]
pub struct MapperStatus {
    pub name: String,
    pub protocol: String,
    pub address: String,
    pub reachable: bool,
    pub devices: Vec<String>,
}

struct Entry {
    record: MapperRecord,
    client: Option<DeviceMapperServiceClient<Channel>>,
    reachable: bool,
    backoff: Duration,
    retry_at: Instant,
}

enum Command {
    Register(pb::MapperInfo, oneshot::Sender<pb::MapperRegisterResponse>),
    List(oneshot::Sender<Vec<MapperStatus>>),
}

/// A handle to the mapper manager task.
#[derive(Clone)]
pub struct Mappers {
    tx: mpsc::Sender<Command>,
}

impl Mappers {
    /// Registers a mapper and returns its devices and their models.
    pub async fn register(&self, info: pb::MapperInfo) -> Option<pb::MapperRegisterResponse> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Command::Register(info, tx)).await.ok()?;
        rx.await.ok()
    }

    /// The registered mappers.
    pub async fn list(&self) -> Vec<MapperStatus> {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Command::List(tx)).await.is_err() {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }
}

/// The first retry delay of an unreachable mapper; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts the manager: loads stored registrations and follows catalog and twin changes.
pub async fn start(
    twin: TwinService,
    catalog: SharedCatalog,
    catalog_changes: broadcast::Receiver<Vec<Change>>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) -> Mappers {
    let mut mappers = BTreeMap::new();
    match twin.store().list_meta(META_KIND).await {
        Ok(rows) => {
            for (key, value) in rows {
                match serde_json::from_str::<MapperRecord>(&value) {
                    Ok(record) => {
                        tracing::info!(mapper = %record.name, protocol = %record.protocol, devices = record.devices.len(), "restored mapper registration");
                        mappers.insert(record.name.clone(), entry(record));
                    }
                    Err(e) => {
                        tracing::warn!(key, error = %e, "ignoring unreadable stored mapper registration")
                    }
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read stored mapper registrations"),
    }
    let (tx, rx) = mpsc::channel(64);
    let manager = Manager {
        mappers,
        twin: twin.clone(),
        catalog,
        metrics,
        sent: HashMap::new(),
    };
    manager.update_gauges();
    tokio::spawn(manager.run(rx, catalog_changes, twin.subscribe(), cancel));
    Mappers { tx }
}

fn entry(record: MapperRecord) -> Entry {
    let client = connect(&record.address);
    Entry {
        record,
        client,
        reachable: true,
        backoff: FIRST_BACKOFF,
        retry_at: Instant::now(),
    }
}

/// A lazy gRPC channel to a mapper's Unix socket (`unix:///path` or a plain path).
fn connect(address: &str) -> Option<DeviceMapperServiceClient<Channel>> {
    if address
        .strip_prefix("unix://")
        .unwrap_or(address)
        .is_empty()
    {
        return None;
    }
    Some(DeviceMapperServiceClient::new(api::dmi::uds_channel(
        address,
        CALL_TIMEOUT,
    )))
}

struct Manager {
    mappers: BTreeMap<String, Entry>,
    twin: TwinService,
    catalog: SharedCatalog,
    metrics: Arc<Metrics>,
    /// Per device, a fingerprint of the spec and desired values its mapper last accepted, so that
    /// an UpdateDevice goes out only when something the mapper sees really changed.
    sent: HashMap<String, u64>,
}

/// A call to a mapper.
enum Call {
    Register(pb::Device),
    Update(pb::Device),
    Remove(DeviceId),
    CreateModel(pb::DeviceModel),
    UpdateModel(pb::DeviceModel),
    RemoveModel(DeviceId),
}

impl Manager {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Command>,
        mut catalog_changes: broadcast::Receiver<Vec<Change>>,
        mut twin_events: broadcast::Receiver<TwinEvent>,
        cancel: CancellationToken,
    ) {
        // Restored mappers may have missed changes while edgecore was down.
        self.resync_all().await;
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                Some(cmd) = rx.recv() => match cmd {
                    Command::Register(info, reply) => {
                        let r = self.register(info).await;
                        let _ = reply.send(r);
                    }
                    Command::List(reply) => {
                        let _ = reply.send(self.status());
                    }
                },
                c = catalog_changes.recv() => match c {
                    Ok(changes) => self.on_catalog(changes).await,
                    Err(broadcast::error::RecvError::Lagged(_)) => self.resync_all().await,
                    Err(broadcast::error::RecvError::Closed) => {}
                },
                e = twin_events.recv() => match e {
                    Ok(applied) => self.on_twin(&applied).await,
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        self.metrics.events_dropped.fetch_add(n, Ordering::Relaxed);
                        self.resync_all().await;
                    }
                    Err(broadcast::error::RecvError::Closed) => {}
                },
                _ = tick.tick() => self.retry().await,
            }
        }
    }

    fn status(&self) -> Vec<MapperStatus> {
        self.mappers
            .values()
            .map(|e| MapperStatus {
                name: e.record.name.clone(),
                protocol: e.record.protocol.clone(),
                address: e.record.address.clone(),
                reachable: e.reachable,
                devices: e.record.devices.iter().cloned().collect(),
            })
            .collect()
    }

    fn update_gauges(&self) {
        self.metrics
            .mappers_registered
            .store(self.mappers.len() as i64, Ordering::Relaxed);
        let up = self.mappers.values().filter(|e| e.reachable).count();
        self.metrics
            .mappers_connected
            .store(up as i64, Ordering::Relaxed);
    }

    async fn persist(&self, name: &str) {
        let Some(e) = self.mappers.get(name) else {
            return;
        };
        let key = format!("{META_KIND}/{name}");
        match serde_json::to_string(&e.record) {
            Ok(v) => {
                if let Err(err) = self.twin.store().put_meta(&key, META_KIND, &v).await {
                    tracing::warn!(mapper = name, error = %err, "failed to store mapper registration");
                }
            }
            Err(err) => {
                tracing::warn!(mapper = name, error = %err, "failed to encode mapper registration")
            }
        }
    }

    fn owner(&self, id: &str) -> Option<&str> {
        self.mappers
            .values()
            .find(|e| e.record.devices.contains(id))
            .map(|e| e.record.name.as_str())
    }

    /// Picks the mapper for a device that has none: the one its annotation names, or the
    /// reachable mapper of its protocol with the fewest devices.
    fn assign(&mut self, device: &Device) -> Option<String> {
        let id = object_id(&device.metadata).to_string();
        if let Some(owner) = self.owner(&id) {
            return Some(owner.to_string());
        }
        let protocol = device.protocol_name().unwrap_or_default();
        let pinned = device
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MAPPER_ANNOTATION));
        let chosen = match pinned {
            Some(name) => self.mappers.get(name).map(|e| e.record.name.clone()),
            None => self
                .mappers
                .values()
                .filter(|e| e.record.protocol == protocol && e.reachable)
                .min_by_key(|e| e.record.devices.len())
                .map(|e| e.record.name.clone()),
        }?;
        if let Some(e) = self.mappers.get_mut(&chosen) {
            e.record.devices.insert(id);
        }
        Some(chosen)
    }

    /// The device as DMI sends it (effective spec with the twin's desired values), and a
    /// fingerprint of it.
    async fn dmi_device(&self, device: &Device) -> (pb::Device, u64) {
        let mut device = device.clone();
        let id = object_id(&device.metadata);
        if let Ok(Some(t)) = self.twin.get(&id).await {
            for p in &mut device.spec.properties {
                if let Some(d) = t.properties.get(&p.name).and_then(|x| x.desired.as_ref()) {
                    let metadata = p.desired.as_ref().and_then(|x| x.metadata.clone());
                    p.desired = Some(TwinProperty {
                        value: d.value.clone(),
                        metadata,
                    });
                }
            }
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        serde_json::to_string(&device)
            .unwrap_or_default()
            .hash(&mut h);
        (device_to_dmi(&device, None), h.finish())
    }

    /// Sends a device to its mapper: RegisterDevice, or UpdateDevice unless the mapper already
    /// has exactly this spec and these desired values.
    async fn push_device(&mut self, mapper: &str, device: &Device, register: bool) {
        let id = object_id(&device.metadata).to_string();
        let (dev, fingerprint) = self.dmi_device(device).await;
        if !register && self.sent.get(&id) == Some(&fingerprint) {
            return;
        }
        let call = if register {
            Call::Register(dev)
        } else {
            Call::Update(dev)
        };
        if self.call(mapper, call).await {
            self.sent.insert(id, fingerprint);
        }
    }

    async fn register(&mut self, info: pb::MapperInfo) -> pb::MapperRegisterResponse {
        let address = String::from_utf8_lossy(&info.address).to_string();
        let previous = self.mappers.remove(&info.name);
        let mut record = MapperRecord {
            name: info.name.clone(),
            protocol: info.protocol.clone(),
            address,
            version: info.version.clone(),
            api_version: info.api_version.clone(),
            devices: BTreeSet::new(),
        };
        if let Some(p) = previous
            && p.record.protocol == record.protocol
        {
            record.devices = p.record.devices;
        }
        tracing::info!(mapper = %record.name, protocol = %record.protocol, address = %record.address, "mapper registered");
        let name = record.name.clone();
        self.mappers.insert(name.clone(), entry(record));
        let devices: Vec<Device> = {
            let catalog = crate::catalog::read(&self.catalog);
            catalog
                .devices
                .values()
                .filter_map(StoredDevice::device)
                .collect()
        };
        // Forget assignments of devices that no longer exist, then take unassigned ones.
        let existing: BTreeSet<String> = devices
            .iter()
            .map(|d| object_id(&d.metadata).to_string())
            .collect();
        if let Some(e) = self.mappers.get_mut(&name) {
            e.record.devices.retain(|d| existing.contains(d));
        }
        let mut mine = Vec::new();
        for d in &devices {
            if self.assign(d).as_deref() == Some(name.as_str()) {
                mine.push(d.clone());
            }
        }
        self.persist(&name).await;
        self.update_gauges();
        let mut response = pb::MapperRegisterResponse::default();
        let mut models = BTreeMap::new();
        for d in &mine {
            let (dev, fingerprint) = self.dmi_device(d).await;
            self.sent
                .insert(object_id(&d.metadata).to_string(), fingerprint);
            response.device_list.push(dev);
            let catalog = crate::catalog::read(&self.catalog);
            if let Some(m) = catalog.model_of(d) {
                models.insert(object_id(&m.metadata), model_to_dmi(m));
            }
        }
        response.model_list = models.into_values().collect();
        response
    }

    async fn on_catalog(&mut self, changes: Vec<Change>) {
        for change in changes {
            match change {
                Change::DeviceAdded(d) => {
                    if let Some(m) = self.assign(&d) {
                        self.persist(&m).await;
                        self.push_device(&m, &d, true).await;
                    }
                }
                Change::DeviceUpdated(d) => {
                    let id = object_id(&d.metadata).to_string();
                    match self.owner(&id).map(str::to_string) {
                        Some(m) => self.push_device(&m, &d, false).await,
                        None => {
                            if let Some(m) = self.assign(&d) {
                                self.persist(&m).await;
                                self.push_device(&m, &d, true).await;
                            }
                        }
                    }
                }
                Change::DeviceRemoved(id) => {
                    let key = id.to_string();
                    self.sent.remove(&key);
                    if let Some(m) = self.owner(&key).map(str::to_string) {
                        if let Some(e) = self.mappers.get_mut(&m) {
                            e.record.devices.remove(&key);
                        }
                        self.persist(&m).await;
                        self.call(&m, Call::Remove(id)).await;
                    }
                }
                Change::ModelAdded(m) => {
                    self.model_call(&m, Call::CreateModel(model_to_dmi(&m)))
                        .await
                }
                Change::ModelUpdated(m) => {
                    self.model_call(&m, Call::UpdateModel(model_to_dmi(&m)))
                        .await
                }
                Change::ModelRemoved(id) => {
                    let names: Vec<String> = self.mappers.keys().cloned().collect();
                    for n in names {
                        self.call(&n, Call::RemoveModel(id.clone())).await;
                    }
                }
            }
        }
        self.update_gauges();
    }

    async fn model_call(&mut self, model: &DeviceModel, call: Call) {
        let protocol = model.spec.protocol.clone().unwrap_or_default();
        let names: Vec<String> = self
            .mappers
            .values()
            .filter(|e| protocol.is_empty() || e.record.protocol == protocol)
            .map(|e| e.record.name.clone())
            .collect();
        for n in names {
            let c = match &call {
                Call::CreateModel(m) => Call::CreateModel(m.clone()),
                Call::UpdateModel(m) => Call::UpdateModel(m.clone()),
                _ => continue,
            };
            self.call(&n, c).await;
        }
    }

    /// Pushes new desired values to the mapper of the device.
    async fn on_twin(&mut self, applied: &twin::engine::Applied) {
        let Some(id) = &applied.device else { return };
        if applied.removed || applied.desired_changed().next().is_none() {
            return;
        }
        let key = id.to_string();
        let Some(owner) = self.owner(&key).map(str::to_string) else {
            return;
        };
        let device = {
            let catalog = crate::catalog::read(&self.catalog);
            catalog.devices.get(id).and_then(StoredDevice::device)
        };
        if let Some(d) = device {
            self.push_device(&owner, &d, false).await;
        }
    }

    /// Tells every reachable mapper about all its devices again.
    async fn resync_all(&mut self) {
        let names: Vec<String> = self.mappers.keys().cloned().collect();
        for n in names {
            self.resync(&n).await;
        }
    }

    async fn resync(&mut self, name: &str) {
        let ids: Vec<String> = self
            .mappers
            .get(name)
            .map(|e| e.record.devices.iter().cloned().collect())
            .unwrap_or_default();
        for id in ids {
            let Some(id) = DeviceId::parse(&id) else {
                continue;
            };
            let device = {
                let catalog = crate::catalog::read(&self.catalog);
                catalog.devices.get(&id).and_then(StoredDevice::device)
            };
            if let Some(d) = device {
                self.push_device(name, &d, true).await;
            }
        }
    }

    /// Retries unreachable mappers whose backoff has passed.
    async fn retry(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .mappers
            .values()
            .filter(|e| !e.reachable && e.retry_at <= now)
            .map(|e| e.record.name.clone())
            .collect();
        for name in due {
            let probe = self.send(&name, Call::Remove(DeviceId::new("edgecore-probe", "none")));
            if probe.await.is_ok() {
                tracing::info!(mapper = %name, "mapper reachable again");
                if let Some(e) = self.mappers.get_mut(&name) {
                    e.reachable = true;
                    e.backoff = FIRST_BACKOFF;
                }
                self.update_gauges();
                self.resync(&name).await;
            } else if let Some(e) = self.mappers.get_mut(&name) {
                e.backoff = (e.backoff * 2).min(MAX_BACKOFF);
                e.retry_at = Instant::now() + e.backoff;
            }
        }
    }

    /// Calls a mapper; a transport failure marks it unreachable and its devices `unknown`.
    /// Returns whether the mapper received the call.
    async fn call(&mut self, name: &str, call: Call) -> bool {
        if !self.mappers.get(name).is_some_and(|e| e.reachable) {
            return false;
        }
        let Err(status) = self.send(name, call).await else {
            return true;
        };
        self.metrics
            .mapper_call_errors
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(mapper = name, error = %status.message(), "mapper unreachable; retrying with backoff");
        let ids: Vec<String> = match self.mappers.get_mut(name) {
            Some(e) => {
                e.reachable = false;
                e.retry_at = Instant::now() + e.backoff;
                e.record.devices.iter().cloned().collect()
            }
            None => Vec::new(),
        };
        self.update_gauges();
        for id in ids.iter().filter_map(|i| DeviceId::parse(i)) {
            let _ = self
                .twin
                .apply(Op::State {
                    id,
                    state: "unknown".into(),
                })
                .await;
        }
        false
    }

    /// Sends one call. Only transport failures are errors: a mapper that answers with an error
    /// status is reachable (the error is logged).
    async fn send(&mut self, name: &str, call: Call) -> Result<(), tonic::Status> {
        let Some(client) = self.mappers.get(name).and_then(|e| e.client.clone()) else {
            return Err(tonic::Status::unavailable("mapper has no socket address"));
        };
        let mut client = client;
        let result = match call {
            Call::Register(device) => client
                .register_device(pb::RegisterDeviceRequest {
                    device: Some(device),
                })
                .await
                .map(|_| ()),
            Call::Update(device) => client
                .update_device(pb::UpdateDeviceRequest {
                    device: Some(device),
                })
                .await
                .map(|_| ()),
            Call::Remove(id) => client
                .remove_device(pb::RemoveDeviceRequest {
                    device_name: id.name,
                    device_namespace: id.namespace,
                })
                .await
                .map(|_| ()),
            Call::CreateModel(model) => client
                .create_device_model(pb::CreateDeviceModelRequest { model: Some(model) })
                .await
                .map(|_| ()),
            Call::UpdateModel(model) => client
                .update_device_model(pb::UpdateDeviceModelRequest { model: Some(model) })
                .await
                .map(|_| ()),
            Call::RemoveModel(id) => client
                .remove_device_model(pb::RemoveDeviceModelRequest {
                    model_name: id.name,
                    model_namespace: id.namespace,
                })
                .await
                .map(|_| ()),
        };
        match result {
            Ok(()) => Ok(()),
            Err(s)
                if matches!(
                    s.code(),
                    tonic::Code::Unavailable
                        | tonic::Code::DeadlineExceeded
                        | tonic::Code::Cancelled
                ) =>
            {
                Err(s)
            }
            Err(s) => {
                tracing::debug!(mapper = name, code = ?s.code(), error = %s.message(), "mapper refused a call");
                Ok(())
            }
        }
    }
}
