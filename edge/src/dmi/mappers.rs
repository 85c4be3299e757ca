//! The registered mappers and the `DeviceMapperService` client that keeps each of them told
//! about its devices: RegisterDevice, UpdateDevice (only when the effective spec or a desired value
//! really changed), RemoveDevice, and the model calls.
//!
//! Unlike KubeEdge (one mapper per protocol), several mappers of one protocol share its devices,
//! and a dead mapper's devices do not look alive:
//! - **Liveness.** Every mapper is probed every [`Liveness::interval`] with a `GetDevice` call
//!   (KubeEdge's mappers answer it too, even with an error; only a refused connection or no answer
//!   within [`Liveness::timeout`] fails). After [`Liveness::failures`] failed probes in a row, or
//!   one failed call, the mapper is unreachable: each of its devices becomes `unknown` with the
//!   reason (`mapper modbus-a unreachable since ...`), and its reported values read as stale.
//! - **Failover.** The devices of an unreachable mapper go to the live mappers of their protocol,
//!   with their desired values, unless the annotation [`MAPPER_ANNOTATION`] pins them to it: those
//!   wait for it. Only its devices move.
//! - **Balance.** A new device goes to the live mapper of its protocol that ranks best for it
//!   (rendezvous hashing) among those holding less than an even share. A mapper that registers
//!   or comes back takes back the devices that left it, then, while it holds less than its share,
//!   the devices that rank it best from the most loaded mapper. Nothing else moves: a mapper
//!   restart moves only its own devices, away and back.
//! - **One master per device.** A device moves by a RemoveDevice to its old mapper first, then a
//!   RegisterDevice to the new one. An unreachable old mapper cannot be told; the device is
//!   remembered (`retired`) and removed from it as soon as it answers again, before anything else.
//!
//! Registrations and assignments are stored, so they survive a restart.
//!
//! The placement rules are pure code in `super::placement`, and when a mapper is unreachable is
//! `super::liveness`, each tested there; this module is the actor that takes their decisions
//! and carries them out with DMI calls.

pub use super::liveness::Liveness;

mod failover;
use super::liveness::{Probes, Verdict};
use super::placement::{DeviceFacts, Failover, MapperView, Placement};
use crate::catalog::{Change, SharedCatalog, StoredDevice, object_id};
use crate::meta::store::{MapperRecord, MetaStore};
use crate::metrics::Metrics;
use api::dmi::v1beta1 as pb;
use api::dmi::v1beta1::device_mapper_service_client::DeviceMapperServiceClient;
use api::dmi::{device_to_dmi, model_to_dmi};
use api::paths::DeviceId;
use api::v1beta1::{Device, DeviceModel, TwinProperty};
use serde::Serialize;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use twin::model::rfc3339;
use twin::service::Op;
use twin::{TwinEvent, TwinService};

/// A device annotation naming the mapper that must serve it.
pub const MAPPER_ANNOTATION: &str = "edgecore.kubeedge.io/mapper";

/// How a mapper is doing, for the HTTP API.
#[derive(Clone, Debug, Serialize)]
pub struct MapperStatus {
    pub name: String,
    pub protocol: String,
    pub address: String,
    /// `alive` or `unreachable`.
    pub state: &'static str,
    pub reachable: bool,
    /// When it became unreachable (RFC 3339), while it is.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub since: String,
    /// Why its last probe or call failed, while it is unreachable.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub error: String,
    pub devices: Vec<String>,
    /// Devices moved away while it was unreachable, to be removed from it when it answers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<String>,
}

struct Registered {
    record: MapperRecord,
    client: Option<DeviceMapperServiceClient<Channel>>,
    probes: Probes,
    /// When it became unreachable (ms since the epoch), while it is.
    down_since: twin::model::Millis,
    last_error: String,
    /// Bumped at every registration, so that a probe of an older client is ignored.
    generation: u64,
}

enum Command {
    Register(pb::MapperInfo, oneshot::Sender<pb::MapperRegisterResponse>),
    List(oneshot::Sender<Vec<MapperStatus>>),
}

/// What one probe found.
struct ProbeResult {
    name: String,
    generation: u64,
    result: Result<(), ProbeFailure>,
}

/// Why a probe of a mapper failed.
#[derive(Debug, thiserror::Error)]
enum ProbeFailure {
    #[error("the mapper gave no socket address")]
    NoAddress,
    #[error("no answer to a probe within {0:?}")]
    NoAnswer(Duration),
    #[error("cannot reach it at {0}: {why}", why = unreachable_why(.1))]
    Unreachable(String, tonic::Status),
}

/// Why a mapper's socket could not be reached, in plain words: the system's error under the
/// transport's (a path with no socket, a connection refused), else the transport's message.
fn unreachable_why(s: &tonic::Status) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::NotFound => {
                    format!("no socket at that path ({io}): is the mapper running?")
                }
                std::io::ErrorKind::ConnectionRefused => {
                    format!("the connection was refused ({io}): nothing listens there")
                }
                std::io::ErrorKind::PermissionDenied => {
                    format!("edgecore may not open that socket ({io})")
                }
                _ => io.to_string(),
            };
        }
        source = e.source();
    }
    s.message().to_string()
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

/// How long a call to a mapper (other than a probe) may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts the manager: loads stored registrations and follows catalog and twin changes.
pub async fn start(
    twin: TwinService,
    catalog: SharedCatalog,
    catalog_changes: broadcast::Receiver<Vec<Change>>,
    metrics: Arc<Metrics>,
    liveness: Liveness,
    cancel: CancellationToken,
) -> Mappers {
    let mut mappers = BTreeMap::new();
    let meta = MetaStore::new(twin.store().clone());
    match meta.mapper_records().await {
        Ok(records) => {
            for record in records {
                tracing::info!(mapper = %record.name, protocol = %record.protocol, devices = record.devices.len(), "restored mapper registration");
                mappers.insert(record.name.clone(), entry(record, 0, liveness));
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read stored mapper registrations"),
    }
    let (tx, rx) = mpsc::channel(64);
    let (probe_tx, probe_rx) = mpsc::channel(64);
    let manager = Manager {
        mappers,
        twin: twin.clone(),
        meta,
        catalog,
        metrics,
        liveness,
        sent: HashMap::new(),
        probe_tx,
        down: Vec::new(),
        generations: 0,
    };
    manager.update_gauges();
    tokio::spawn(manager.run(rx, probe_rx, catalog_changes, twin.subscribe(), cancel));
    Mappers { tx }
}

fn entry(record: MapperRecord, generation: u64, liveness: Liveness) -> Registered {
    let client = connect(&record.address);
    Registered {
        record,
        client,
        probes: Probes::new(Instant::now(), &liveness),
        down_since: 0,
        last_error: String::new(),
        generation,
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
    Some(DeviceMapperServiceClient::new(rt::transport::uds_channel(
        address,
        CALL_TIMEOUT,
    )))
}

struct Manager {
    mappers: BTreeMap<String, Registered>,
    twin: TwinService,
    meta: MetaStore,
    catalog: SharedCatalog,
    metrics: Arc<Metrics>,
    liveness: Liveness,
    /// Per device, a fingerprint of the spec and desired values its mapper last accepted, so that
    /// an UpdateDevice goes out only when something the mapper sees really changed.
    sent: HashMap<String, u64>,
    probe_tx: mpsc::Sender<ProbeResult>,
    /// Mappers found unreachable and not handled yet (their devices to mark and move).
    down: Vec<String>,
    generations: u64,
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

/// The mapper a device's annotation pins it to.
fn pin(device: &Device) -> Option<&str> {
    device
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MAPPER_ANNOTATION))
        .map(String::as_str)
        .filter(|m| !m.is_empty())
}

/// What placement needs to know of a device.
fn facts(device: &Device) -> DeviceFacts {
    DeviceFacts {
        id: object_id(&device.metadata).to_string(),
        protocol: device.protocol_name().map(str::to_string),
        pin: pin(device).map(str::to_string),
    }
}

/// Whether a transport failure, not an answer: only these count against a mapper's liveness.
fn unreachable(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
    )
}

impl Manager {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Command>,
        mut probes: mpsc::Receiver<ProbeResult>,
        mut catalog_changes: broadcast::Receiver<Vec<Change>>,
        mut twin_events: broadcast::Receiver<TwinEvent>,
        cancel: CancellationToken,
    ) {
        // Restored mappers may have missed changes while edgecore was down.
        self.resync_all().await;
        self.handle_down().await;
        let mut tick =
            tokio::time::interval(self.liveness.interval.min(Duration::from_millis(250)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                Some(p) = probes.recv() => self.on_probe(p).await,
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
                _ = tick.tick() => self.start_probes(),
            }
            self.handle_down().await;
        }
    }

    fn status(&self) -> Vec<MapperStatus> {
        self.mappers
            .values()
            .map(|e| MapperStatus {
                name: e.record.name.clone(),
                protocol: e.record.protocol.clone(),
                address: e.record.address.clone(),
                state: if e.probes.alive() {
                    "alive"
                } else {
                    "unreachable"
                },
                reachable: e.probes.alive(),
                since: if e.probes.alive() {
                    String::new()
                } else {
                    rfc3339(e.down_since)
                },
                error: if e.probes.alive() {
                    String::new()
                } else {
                    e.last_error.clone()
                },
                devices: e.record.devices.iter().cloned().collect(),
                retired: e.record.retired.iter().cloned().collect(),
            })
            .collect()
    }

    fn update_gauges(&self) {
        self.metrics
            .mappers_registered
            .store(self.mappers.len() as i64, Ordering::Relaxed);
        let up = self.mappers.values().filter(|e| e.probes.alive()).count();
        self.metrics
            .mappers_connected
            .store(up as i64, Ordering::Relaxed);
    }

    async fn persist(&self, name: &str) {
        let Some(e) = self.mappers.get(name) else {
            return;
        };
        if let Err(err) = self.meta.save_mapper(&e.record).await {
            tracing::warn!(mapper = name, error = %err, "failed to store mapper registration");
        }
    }

    fn owner(&self, id: &str) -> Option<&str> {
        self.mappers
            .values()
            .find(|e| e.record.devices.contains(id))
            .map(|e| e.record.name.as_str())
    }

    fn alive(&self, name: &str) -> bool {
        self.mappers.get(name).is_some_and(|e| e.probes.alive())
    }

    fn devices(&self) -> Vec<Device> {
        let catalog = crate::catalog::read(&self.catalog);
        catalog
            .devices
            .values()
            .filter_map(StoredDevice::device)
            .collect()
    }

    fn device(&self, id: &DeviceId) -> Option<Device> {
        let catalog = crate::catalog::read(&self.catalog);
        catalog.devices.get(id).and_then(StoredDevice::device)
    }

    /// The mappers as placement sees them.
    /// Borrows the mappers' device sets: cheap enough to take for every decision.
    fn placement(&self) -> Placement<'_> {
        Placement {
            mappers: self
                .mappers
                .iter()
                .map(|(n, e)| {
                    let view = MapperView {
                        protocol: e.record.protocol.clone(),
                        alive: e.probes.alive(),
                        devices: Cow::Borrowed(&e.record.devices),
                    };
                    (n.clone(), view)
                })
                .collect(),
        }
    }

    /// Every device of the catalog, as placement sees it.
    fn catalog_facts(&self) -> BTreeMap<String, DeviceFacts> {
        self.devices()
            .iter()
            .map(|d| {
                let f = facts(d);
                (f.id.clone(), f)
            })
            .collect()
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

    /// Takes a device from `from` (told to remove it first, or remembered as retired when it
    /// cannot be told) and gives it to `to`; `tell` sends it to `to` (RegisterDevice), which a
    /// registering mapper does not need (it gets it in its response).
    async fn move_device(&mut self, device: &Device, from: Option<&str>, to: &str, tell: bool) {
        let id = object_id(&device.metadata);
        let key = id.to_string();
        if let Some(from) = from.filter(|f| *f != to) {
            let told = self.alive(from) && self.call(from, Call::Remove(id.clone())).await;
            if let Some(e) = self.mappers.get_mut(from) {
                e.record.devices.remove(&key);
                if !told {
                    e.record.retired.insert(key.clone());
                }
            }
            self.persist(from).await;
            self.metrics
                .mapper_device_moves
                .fetch_add(1, Ordering::Relaxed);
            tracing::info!(device = %key, from, to, "device moved to another mapper");
        }
        if let Some(e) = self.mappers.get_mut(to) {
            e.record.retired.remove(&key);
            e.record.devices.insert(key.clone());
        }
        self.persist(to).await;
        self.sent.remove(&key);
        if tell {
            self.push_device(to, device, true).await;
        }
    }

    /// A mapper joins (registers, or answers again): it takes back the devices that left it
    /// while it was away (`reclaim`, still of its protocol and not pinned elsewhere), then, while
    /// it holds fewer than its share, the devices that rank it best from the most loaded live
    /// mapper of its protocol. Nothing else moves. `registering`: it is not serving yet, so the
    /// devices it gets are not sent (its registration response carries them).
    async fn join(&mut self, name: &str, reclaim: BTreeSet<String>, registering: bool) {
        let tell = !registering;
        let moves = self.placement().join(name, &reclaim, &self.catalog_facts());
        for m in moves {
            let Some(device) = DeviceId::parse(&m.device).and_then(|id| self.device(&id)) else {
                continue;
            };
            self.move_device(&device, m.from.as_deref(), &m.to, tell)
                .await;
            // It died on the way: what is left of the plan waits for it to come back.
            if !self.alive(name) {
                break;
            }
        }
    }

    async fn register(&mut self, info: pb::MapperInfo) -> pb::MapperRegisterResponse {
        let address = String::from_utf8_lossy(&info.address).to_string();
        let previous = self.mappers.remove(&info.name);
        let record = MapperRecord {
            name: info.name.clone(),
            protocol: info.protocol.clone(),
            address,
            version: info.version.clone(),
            api_version: info.api_version.clone(),
            devices: BTreeSet::new(),
            retired: BTreeSet::new(),
        };
        // A registering mapper is a new process that serves nothing yet: what it had, and what
        // left it while it was away, it takes back.
        let reclaim: BTreeSet<String> = previous
            .filter(|p| p.record.protocol == record.protocol)
            .map(|p| p.record.devices.union(&p.record.retired).cloned().collect())
            .unwrap_or_default();
        tracing::info!(mapper = %record.name, protocol = %record.protocol, address = %record.address, "mapper registered");
        let name = record.name.clone();
        self.generations += 1;
        self.mappers
            .insert(name.clone(), entry(record, self.generations, self.liveness));
        let devices = self.devices();
        // Devices pinned to it, and devices of its protocol without a mapper, are its own.
        let reclaim = self
            .placement()
            .claims_on_register(&name, reclaim, &self.catalog_facts());
        self.join(&name, reclaim, true).await;
        self.persist(&name).await;
        self.update_gauges();
        let mine: Vec<&Device> = devices
            .iter()
            .filter(|d| self.owner(&object_id(&d.metadata).to_string()) == Some(name.as_str()))
            .collect();
        let mut response = pb::MapperRegisterResponse::default();
        let mut models = BTreeMap::new();
        for d in mine {
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

    /// Gives a device a mapper, or moves it when its pin or protocol no longer fits the one it
    /// has; otherwise tells its mapper what changed.
    async fn place(&mut self, device: &Device, added: bool) {
        let id = object_id(&device.metadata).to_string();
        let owner = self.owner(&id).map(str::to_string);
        let device_facts = facts(device);
        let (fits, to) = {
            let placement = self.placement();
            let fits = owner
                .as_deref()
                .is_some_and(|o| placement.fits(&device_facts, o));
            (fits, placement.choose(&device_facts, None))
        };
        if fits && let Some(o) = owner {
            self.push_device(&o, device, added).await;
            return;
        }
        match to {
            Some(to) => self.move_device(device, owner.as_deref(), &to, true).await,
            None => {
                // No mapper for it now: it leaves the one that no longer fits and waits.
                if let Some(o) = owner {
                    let told = self.alive(&o)
                        && self
                            .call(&o, Call::Remove(object_id(&device.metadata)))
                            .await;
                    if let Some(e) = self.mappers.get_mut(&o) {
                        e.record.devices.remove(&id);
                        if !told {
                            e.record.retired.insert(id.clone());
                        }
                    }
                    self.persist(&o).await;
                }
            }
        }
    }

    async fn on_catalog(&mut self, changes: Vec<Change>) {
        for change in changes {
            match change {
                Change::DeviceAdded(d) => {
                    if let Some(d) = d.device() {
                        self.place(&d, true).await
                    }
                }
                Change::DeviceUpdated(d) => {
                    if let Some(d) = d.device() {
                        self.place(&d, false).await
                    }
                }
                Change::DeviceRemoved(id) => {
                    let key = id.to_string();
                    self.sent.remove(&key);
                    if let Some(m) = self.owner(&key).map(str::to_string) {
                        let told = self.alive(&m) && self.call(&m, Call::Remove(id)).await;
                        if let Some(e) = self.mappers.get_mut(&m) {
                            e.record.devices.remove(&key);
                            if !told {
                                e.record.retired.insert(key);
                            }
                        }
                        self.persist(&m).await;
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
        if let Some(d) = self.device(id) {
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
            if let Some(d) = self.device(&id) {
                self.push_device(name, &d, true).await;
            }
        }
    }

    /// Calls a mapper; a transport failure marks it unreachable. Returns whether the mapper
    /// received the call.
    async fn call(&mut self, name: &str, call: Call) -> bool {
        if !self.alive(name) {
            return false;
        }
        let Err(status) = self.send(name, call).await else {
            return true;
        };
        self.metrics
            .mapper_call_errors
            .fetch_add(1, Ordering::Relaxed);
        self.mark_down(name, format!("call failed: {}", status.message()));
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
            Err(s) if unreachable(&s) => Err(s),
            Err(s) => {
                tracing::debug!(mapper = name, code = ?s.code(), error = %s.message(), "mapper refused a call");
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe that found no socket, or a refused connection, says so in plain words with the
    /// mapper's address (it said "No such file or directory" alone).
    #[test]
    fn an_unreachable_mapper_is_named_with_its_address_and_why_in_plain_words() {
        let gone =
            tonic::Status::from_error(Box::new(std::io::Error::from(std::io::ErrorKind::NotFound)));
        let said = ProbeFailure::Unreachable("/run/mapper-modbus.sock".into(), gone).to_string();
        assert!(
            said.starts_with("cannot reach it at /run/mapper-modbus.sock: no socket at that path")
                && said.ends_with("is the mapper running?"),
            "{said}"
        );
        let refused = tonic::Status::from_error(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        let said = ProbeFailure::Unreachable("127.0.0.1:7070".into(), refused).to_string();
        assert!(said.contains("the connection was refused"), "{said}");
        let other = tonic::Status::unavailable("h2 protocol error");
        let said = ProbeFailure::Unreachable("x".into(), other).to_string();
        assert_eq!(said, "cannot reach it at x: h2 protocol error");
    }
}
