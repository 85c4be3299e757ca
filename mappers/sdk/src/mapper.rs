//! The mapper: the devices it runs (one [`DeviceTask`] each), the `DeviceMapperService` server
//! edgecore calls on the mapper's socket, and registration with edgecore.

use crate::config::Config;
use crate::device::{Command, DEFAULT_CYCLE, DeviceTask, PropertySchedule, Schedule, Snapshot};
use crate::driver::{DeviceConfig, DeviceState, PropertyConfig, Protocol};
use crate::metrics::Metrics;
use crate::push::{Pushers, Target};
use crate::report::Report;
use api::dmi::v1beta1 as pb;
use api::dmi::v1beta1::device_mapper_service_server::DeviceMapperService;
use api::dmi::{device_from_dmi, model_from_dmi, twin_to_dmi};
use api::v1beta1::{AccessMode, DeviceModel};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// A running device.
pub struct DeviceHandle {
    pub config: DeviceConfig,
    pub schedule: Schedule,
    /// `spec.deviceModelReference`.
    pub model: String,
    /// Method name → the properties it may write.
    pub methods: BTreeMap<String, Vec<String>>,
    pub snapshot: Arc<Mutex<Snapshot>>,
    /// The device as edgecore last sent it, encoded: read back only to answer `GetDevice` and
    /// to start the device again when its model changes. As a struct (`configData` as protobuf
    /// `Struct`s) it took ~7 KB a device of 10 properties; encoded, under 1 KB.
    source: Vec<u8>,
    tx: Option<mpsc::Sender<Command>>,
    cancel: CancellationToken,
}

impl DeviceHandle {
    /// The device as edgecore last sent it.
    fn source(&self) -> Result<pb::Device, Status> {
        <pb::Device as prost::Message>::decode(self.source.as_slice())
            .map_err(|e| Status::internal(format!("the stored device does not decode: {e}")))
    }

    /// The running task's command channel; `None` when the device's configuration was refused.
    pub fn sender(&self) -> Option<mpsc::Sender<Command>> {
        self.tx.clone()
    }
}

/// Devices by `namespace/name`, shared with the REST API.
pub type Devices = Arc<Mutex<BTreeMap<String, DeviceHandle>>>;

/// What the mapper shares between its servers.
pub struct Shared<P: Protocol> {
    pub protocol: P,
    pub config: Config,
    pub metrics: Arc<Metrics>,
    pub devices: Devices,
    models: Mutex<HashMap<String, DeviceModel>>,
    reports: mpsc::Sender<Report>,
    pushers: Pushers,
    cancel: CancellationToken,
}

/// The `DeviceMapperService` of this mapper.
pub struct Mapper<P: Protocol> {
    pub shared: Arc<Shared<P>>,
}

impl<P: Protocol> Clone for Mapper<P> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

fn key(namespace: &str, name: &str) -> String {
    let ns = if namespace.is_empty() {
        "default"
    } else {
        namespace
    };
    format!("{ns}/{name}")
}

fn cycle(ms: Option<i64>) -> Duration {
    match ms {
        Some(ms) if ms > 0 => Duration::from_millis(ms as u64),
        _ => DEFAULT_CYCLE,
    }
}

impl<P: Protocol> Mapper<P> {
    pub fn new(
        protocol: P,
        config: Config,
        metrics: Arc<Metrics>,
        reports: mpsc::Sender<Report>,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                protocol,
                config,
                pushers: Pushers::new(metrics.clone(), cancel.clone()),
                metrics,
                devices: Arc::new(Mutex::new(BTreeMap::new())),
                models: Mutex::new(HashMap::new()),
                reports,
                cancel,
            }),
        }
    }

    pub fn put_model(&self, m: &pb::DeviceModel) -> Result<(), Status> {
        let model = model_from_dmi(m).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let k = key(&m.namespace, &m.name);
        if let Ok(mut models) = self.shared.models.lock() {
            models.insert(k, model);
        }
        Ok(())
    }

    /// Starts a device, or updates a running one: new desired values go to the running task;
    /// any other change of the spec restarts it.
    pub fn put_device(&self, d: &pb::Device) -> Result<(), Status> {
        let (device, _) =
            device_from_dmi(d).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let k = key(&d.namespace, &d.name);
        let protocol = device.protocol_name().unwrap_or_default();
        if !protocol.is_empty() && protocol != self.shared.protocol.name() {
            return Err(Status::invalid_argument(format!(
                "device {k} has protocol {protocol}; this mapper serves {}",
                self.shared.protocol.name()
            )));
        }
        let model_name = device.model_name().unwrap_or_default().to_string();
        let model = self
            .shared
            .models
            .lock()
            .ok()
            .and_then(|m| m.get(&key(&d.namespace, &model_name)).cloned());
        let mut config = DeviceConfig {
            namespace: if d.namespace.is_empty() {
                "default".into()
            } else {
                d.namespace.clone()
            },
            name: d.name.clone(),
            protocol: device
                .spec
                .protocol
                .as_ref()
                .and_then(|p| p.config_data.as_ref())
                .map(|c| c.0.clone())
                .unwrap_or_default(),
            properties: Vec::new(),
        };
        let mut schedule = Schedule {
            properties: Vec::new(),
            state_cycle: None,
        };
        let state = device.state_report();
        if state.report_to_cloud {
            schedule.state_cycle = Some(cycle(state.report_cycle));
        }
        let mut desired = Vec::new();
        let mut problems = Vec::new();
        for p in &device.spec.properties {
            let mp = model
                .as_ref()
                .and_then(|m| m.spec.properties.iter().find(|mp| mp.name == p.name));
            let num = |s: Option<&String>| s.and_then(|v| v.trim().parse::<f64>().ok());
            config.properties.push(PropertyConfig {
                name: p.name.clone(),
                visitor: p
                    .visitors
                    .as_ref()
                    .and_then(|v| v.config_data.as_ref())
                    .map(|c| c.0.clone())
                    .unwrap_or_default(),
                value_type: mp.and_then(|m| m.type_).map(|t| t.as_str().to_string()),
                writable: mp.and_then(|m| m.access_mode) != Some(AccessMode::ReadOnly),
                minimum: num(mp.and_then(|m| m.minimum.as_ref())),
                maximum: num(mp.and_then(|m| m.maximum.as_ref())),
                unit: mp.and_then(|m| m.unit.clone()),
                collect: cycle(p.collect_cycle),
            });
            let mut push = Vec::new();
            match p.push_method.as_deref().map(Target::from_push_method) {
                Some(Ok(targets)) => {
                    for t in targets {
                        match self.shared.pushers.get(t) {
                            Ok(pusher) => push.push(pusher),
                            Err(e) => problems.push(format!("{}: {e}", p.name)),
                        }
                    }
                }
                Some(Err(e)) => problems.push(format!("{}: {e}", p.name)),
                None => {}
            }
            schedule.properties.push(PropertySchedule {
                collect: cycle(p.collect_cycle),
                report: cycle(p.report_cycle),
                push,
            });
            if let Some(v) = p
                .desired
                .as_ref()
                .map(|d| d.value.clone())
                .filter(|v| !v.is_empty())
            {
                desired.push((p.name.clone(), v));
            }
        }
        for problem in &problems {
            tracing::warn!(device = %k, problem, "push method ignored");
        }
        let mut devices = self
            .shared
            .devices
            .lock()
            .map_err(|_| Status::internal("device table poisoned"))?;
        if let Some(h) = devices.get(&k)
            && h.config == config
            && h.schedule == schedule
            && h.tx.is_some()
        {
            if let Some(tx) = &h.tx
                && tx.try_send(Command::Desired(desired.clone())).is_err()
            {
                tracing::warn!(device = %k, "device busy; desired values will be sent again");
                let tx = tx.clone();
                tokio::spawn(async move { tx.send(Command::Desired(desired)).await });
            }
            if let Some(tx) = &h.tx {
                // Best effort: a full queue means the device is busy reporting anyway.
                let _ = tx.try_send(Command::ResendState);
            }
            return Ok(());
        }
        if let Some(old) = devices.remove(&k) {
            tracing::info!(device = %k, "device spec changed; restarting it");
            old.cancel.cancel();
            self.shared.metrics.devices.fetch_sub(1, Ordering::Relaxed);
        }
        let snapshot = Arc::new(Mutex::new(Snapshot {
            state: DeviceState::Unknown.as_str(),
            ..Snapshot::default()
        }));
        let cancel = self.shared.cancel.child_token();
        let methods = device
            .spec
            .methods
            .iter()
            .map(|m| (m.name.clone(), m.property_names.clone()))
            .collect();
        let mut handle = DeviceHandle {
            config: config.clone(),
            schedule: schedule.clone(),
            model: model_name,
            methods,
            snapshot: snapshot.clone(),
            source: prost::Message::encode_to_vec(d),
            tx: None,
            cancel: cancel.clone(),
        };
        self.shared.metrics.devices.fetch_add(1, Ordering::Relaxed);
        let result = match self.shared.protocol.driver(&config) {
            Ok(driver) => {
                let (tx, rx) = mpsc::channel(16);
                let _ = tx.try_send(Command::Desired(desired));
                handle.tx = Some(tx);
                let task = DeviceTask::new(
                    &config,
                    &schedule,
                    driver,
                    self.shared.reports.clone(),
                    self.shared.metrics.clone(),
                    snapshot,
                );
                tracing::info!(device = %k, properties = config.properties.len(), "device started");
                tokio::spawn(task.run(rx, cancel));
                Ok(())
            }
            Err(e) => {
                tracing::error!(device = %k, error = %e, "device configuration refused");
                if let Ok(mut s) = snapshot.lock() {
                    s.state = DeviceState::Unhealthy.as_str();
                    s.error = Some(e.message.clone());
                }
                let _ = self.shared.reports.try_send(Report::State {
                    namespace: config.namespace.clone(),
                    name: config.name.clone(),
                    state: DeviceState::Unhealthy.as_str(),
                    reason: format!(
                        "the mapper refused the device's configuration: {}",
                        e.message
                    ),
                });
                Err(Status::invalid_argument(format!("device {k}: {e}")))
            }
        };
        devices.insert(k, handle);
        result
    }

    pub fn remove_device(&self, namespace: &str, name: &str) {
        let k = key(namespace, name);
        if let Ok(mut devices) = self.shared.devices.lock()
            && let Some(h) = devices.remove(&k)
        {
            tracing::info!(device = %k, "device removed");
            h.cancel.cancel();
            self.shared.metrics.devices.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Registers with edgecore (`withData`), retrying with backoff until it answers, and
    /// starts the devices it returns.
    pub async fn register(&self) -> bool {
        let c = &self.shared.config;
        let mut client = crate::report::client(&c.common.edgecore_sock);
        let mut backoff = rt::Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        loop {
            let request = pb::MapperRegisterRequest {
                with_data: true,
                mapper: Some(pb::MapperInfo {
                    name: c.common.name.clone(),
                    version: c.common.version.clone(),
                    api_version: c.common.api_version.clone(),
                    protocol: c.common.protocol.clone(),
                    address: c.socket().to_string_lossy().as_bytes().to_vec(),
                    state: "ok".into(),
                }),
            };
            let attempt = tokio::select! {
                _ = self.shared.cancel.cancelled() => return false,
                r = client.mapper_register(request) => r,
            };
            match attempt {
                Ok(r) => {
                    let r = r.into_inner();
                    tracing::info!(edgecore = %c.common.edgecore_sock, devices = r.device_list.len(), models = r.model_list.len(), "registered with edgecore");
                    for m in &r.model_list {
                        if let Err(e) = self.put_model(m) {
                            tracing::warn!(model = %m.name, error = %e.message(), "model refused");
                        }
                    }
                    for d in &r.device_list {
                        if let Err(e) = self.put_device(d) {
                            tracing::warn!(device = %d.name, error = %e.message(), "device refused");
                        }
                    }
                    return true;
                }
                Err(e) => {
                    tracing::warn!(edgecore = %c.common.edgecore_sock, error = %e.message(), retry_in = ?backoff.peek(), "cannot register with edgecore");
                    tokio::select! {
                        _ = self.shared.cancel.cancelled() => return false,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        }
    }
}

fn device_of(req: Option<pb::Device>) -> Result<pb::Device, Status> {
    let d = req.ok_or_else(|| Status::invalid_argument("device is missing"))?;
    if d.name.is_empty() {
        return Err(Status::invalid_argument("device.name is empty"));
    }
    Ok(d)
}

#[tonic::async_trait]
impl<P: Protocol> DeviceMapperService for Mapper<P> {
    async fn register_device(
        &self,
        request: Request<pb::RegisterDeviceRequest>,
    ) -> Result<Response<pb::RegisterDeviceResponse>, Status> {
        let d = device_of(request.into_inner().device)?;
        self.put_device(&d)?;
        Ok(Response::new(pb::RegisterDeviceResponse {
            device_name: d.name,
            device_namespace: d.namespace,
        }))
    }

    async fn remove_device(
        &self,
        request: Request<pb::RemoveDeviceRequest>,
    ) -> Result<Response<pb::RemoveDeviceResponse>, Status> {
        let r = request.into_inner();
        Mapper::remove_device(self, &r.device_namespace, &r.device_name);
        Ok(Response::new(pb::RemoveDeviceResponse {}))
    }

    async fn update_device(
        &self,
        request: Request<pb::UpdateDeviceRequest>,
    ) -> Result<Response<pb::UpdateDeviceResponse>, Status> {
        let d = device_of(request.into_inner().device)?;
        self.put_device(&d)?;
        Ok(Response::new(pb::UpdateDeviceResponse {}))
    }

    async fn create_device_model(
        &self,
        request: Request<pb::CreateDeviceModelRequest>,
    ) -> Result<Response<pb::CreateDeviceModelResponse>, Status> {
        let m = request
            .into_inner()
            .model
            .ok_or_else(|| Status::invalid_argument("model is missing"))?;
        self.put_model(&m)?;
        Ok(Response::new(pb::CreateDeviceModelResponse {
            device_model_name: m.name,
            device_model_namespace: m.namespace,
        }))
    }

    async fn remove_device_model(
        &self,
        request: Request<pb::RemoveDeviceModelRequest>,
    ) -> Result<Response<pb::RemoveDeviceModelResponse>, Status> {
        let r = request.into_inner();
        if let Ok(mut m) = self.shared.models.lock() {
            m.remove(&key(&r.model_namespace, &r.model_name));
        }
        Ok(Response::new(pb::RemoveDeviceModelResponse {}))
    }

    async fn update_device_model(
        &self,
        request: Request<pb::UpdateDeviceModelRequest>,
    ) -> Result<Response<pb::UpdateDeviceModelResponse>, Status> {
        let m = request
            .into_inner()
            .model
            .ok_or_else(|| Status::invalid_argument("model is missing"))?;
        self.put_model(&m)?;
        // The model's types, ranges and access modes are part of each device's configuration:
        // its devices start again with the new ones.
        let ns = if m.namespace.is_empty() {
            "default"
        } else {
            m.namespace.as_str()
        };
        let sources: Vec<pb::Device> = self
            .shared
            .devices
            .lock()
            .map(|d| {
                d.values()
                    .filter(|h| h.config.namespace == ns && h.model == m.name)
                    .filter_map(|h| h.source().ok())
                    .collect()
            })
            .unwrap_or_default();
        for d in sources {
            if let Err(e) = self.put_device(&d) {
                tracing::warn!(device = %d.name, error = %e.message(), "device refused after its model changed");
            }
        }
        Ok(Response::new(pb::UpdateDeviceModelResponse {}))
    }

    async fn get_device(
        &self,
        request: Request<pb::GetDeviceRequest>,
    ) -> Result<Response<pb::GetDeviceResponse>, Status> {
        let r = request.into_inner();
        let k = key(&r.device_namespace, &r.device_name);
        let devices = self
            .shared
            .devices
            .lock()
            .map_err(|_| Status::internal("device table poisoned"))?;
        let h = devices
            .get(&k)
            .ok_or_else(|| Status::not_found(format!("device {k} is not served by this mapper")))?;
        let source = h.source()?;
        let snapshot = h.snapshot.lock().map(|s| s.clone()).unwrap_or_default();
        let twins = snapshot
            .properties
            .iter()
            .filter_map(|(name, v)| {
                let value = v.value.clone()?;
                Some(twin_to_dmi(&api::v1beta1::Twin {
                    property_name: name.clone(),
                    reported: Some(api::v1beta1::TwinProperty {
                        value,
                        metadata: None,
                    }),
                    // Always there, empty until applied, as KubeEdge's mapper-framework does.
                    observed_desired: Some(api::v1beta1::TwinProperty {
                        value: v.applied_desired.clone().unwrap_or_default(),
                        metadata: None,
                    }),
                }))
            })
            .collect();
        Ok(Response::new(pb::GetDeviceResponse {
            device: Some(pb::Device {
                name: h.config.name.clone(),
                namespace: h.config.namespace.clone(),
                // The spec as edgecore sent it, as a mapper-framework mapper answers.
                spec: source.spec,
                status: Some(pb::DeviceStatus {
                    twins,
                    report_to_cloud: true,
                    report_cycle: 0,
                }),
            }),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{Driver, DriverError};
    use api::dmi::{device_to_dmi, model_to_dmi};

    /// A protocol whose devices never answer: what is tested here is the table of devices.
    struct Quiet;
    struct QuietDriver;

    impl Driver for QuietDriver {
        async fn connect(&mut self) -> Result<(), DriverError> {
            Err(DriverError::link("not here"))
        }
        async fn read(&mut self, due: &[usize]) -> Vec<crate::driver::Reading> {
            due.iter()
                .map(|&i| (i, Err(DriverError::link("not here"))))
                .collect()
        }
        async fn write(&mut self, _: usize, _: &str) -> Result<(), DriverError> {
            Err(DriverError::link("not here"))
        }
        async fn stop(&mut self) {}
    }

    impl Protocol for Quiet {
        type Driver = QuietDriver;
        fn name(&self) -> &str {
            "modbus"
        }
        fn driver(&self, _: &DeviceConfig) -> Result<QuietDriver, DriverError> {
            Ok(QuietDriver)
        }
    }

    fn device(unit: u8) -> pb::Device {
        let d: api::v1beta1::Device = serde_json::from_value(serde_json::json!({
            "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
            "metadata": {"name": "plc-1", "namespace": "line-2"},
            "spec": {"deviceModelRef": {"name": "plc"},
                "protocol": {"protocolName": "modbus",
                    "configData": {"ip": "192.0.2.7", "port": 502, "slaveID": unit, "nested": {"a": [1, "b", null]}}},
                "properties": [{"name": "temp", "collectCycle": 60000, "reportCycle": 60000,
                    "desired": {"value": "21"},
                    "visitors": {"protocolName": "modbus",
                        "configData": {"register": "HoldingRegister", "offset": 3, "scale": 0.1}}}]}
        }))
        .expect("device");
        device_to_dmi(&d, None)
    }

    fn model(unit: &str) -> pb::DeviceModel {
        let m: api::v1beta1::DeviceModel = serde_json::from_value(serde_json::json!({
            "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
            "metadata": {"name": "plc", "namespace": "line-2"},
            "spec": {"protocol": "modbus", "properties": [
                {"name": "temp", "type": "FLOAT", "accessMode": "ReadWrite", "unit": unit}]}
        }))
        .expect("model");
        model_to_dmi(&m)
    }

    async fn spec_answered(mapper: &Mapper<Quiet>) -> Option<pb::DeviceSpec> {
        mapper
            .get_device(Request::new(pb::GetDeviceRequest {
                device_name: "plc-1".into(),
                device_namespace: "line-2".into(),
            }))
            .await
            .expect("served")
            .into_inner()
            .device?
            .spec
    }

    #[tokio::test]
    async fn the_device_as_sent_is_answered_and_started_again_with_a_new_model() {
        let config = Config::parse(
            "common: {name: m, protocol: modbus}",
            std::path::Path::new("/x"),
        )
        .expect("config");
        let (reports, _rx) = mpsc::channel(1024);
        let cancel = CancellationToken::new();
        let mapper = Mapper::new(Quiet, config, Arc::default(), reports, cancel.clone());
        mapper.put_model(&model("C")).expect("model");
        let sent = device(4);
        mapper.put_device(&sent).expect("device");
        assert_eq!(spec_answered(&mapper).await, sent.spec);

        // A new model starts the device again from what edgecore sent, with the model's unit.
        mapper
            .update_device_model(Request::new(pb::UpdateDeviceModelRequest {
                model: Some(model("F")),
            }))
            .await
            .expect("model updated");
        let unit = |m: &Mapper<Quiet>| {
            m.shared.devices.lock().expect("devices")["line-2/plc-1"]
                .config
                .properties[0]
                .unit
                .clone()
        };
        assert_eq!(unit(&mapper).as_deref(), Some("F"));
        assert_eq!(spec_answered(&mapper).await, sent.spec);

        // Another spec replaces the one kept.
        let changed = device(5);
        mapper.put_device(&changed).expect("device");
        assert_eq!(spec_answered(&mapper).await, changed.spec);
        assert_ne!(changed.spec, sent.spec);
        cancel.cancel();
    }
}
