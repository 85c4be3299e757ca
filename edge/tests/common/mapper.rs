//! A test mapper: the `DeviceMapperService` server on its own Unix socket, recording every call
//! edgecore makes, plus a `DeviceManagerService` client to edgecore's DMI socket. It runs on a
//! runtime of its own so that the tests stay plain blocking code.
#![allow(dead_code)]

use api::dmi::v1beta1 as pb;
use api::dmi::v1beta1::device_manager_service_client::DeviceManagerServiceClient;
use api::dmi::v1beta1::device_mapper_service_server::{
    DeviceMapperService, DeviceMapperServiceServer,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// A call edgecore made to the mapper.
#[derive(Clone, Debug)]
pub enum Seen {
    Register(pb::Device),
    Update(pb::Device),
    Remove(String),
    CreateModel(String),
    UpdateModel(String),
    RemoveModel(String),
}

impl Seen {
    /// `register/ns/name`, `update/ns/name`, ... for compact assertions.
    pub fn key(&self) -> String {
        match self {
            Seen::Register(d) => format!("register/{}/{}", d.namespace, d.name),
            Seen::Update(d) => format!("update/{}/{}", d.namespace, d.name),
            Seen::Remove(id) => format!("remove/{id}"),
            Seen::CreateModel(id) => format!("createModel/{id}"),
            Seen::UpdateModel(id) => format!("updateModel/{id}"),
            Seen::RemoveModel(id) => format!("removeModel/{id}"),
        }
    }
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Seen>>>);

impl Recorder {
    fn push(&self, s: Seen) {
        if let Ok(mut v) = self.0.lock() {
            v.push(s);
        }
    }
}

#[tonic::async_trait]
impl DeviceMapperService for Recorder {
    async fn register_device(
        &self,
        r: Request<pb::RegisterDeviceRequest>,
    ) -> Result<Response<pb::RegisterDeviceResponse>, Status> {
        let d = r.into_inner().device.unwrap_or_default();
        let resp = pb::RegisterDeviceResponse {
            device_name: d.name.clone(),
            device_namespace: d.namespace.clone(),
        };
        self.push(Seen::Register(d));
        Ok(Response::new(resp))
    }
    async fn remove_device(
        &self,
        r: Request<pb::RemoveDeviceRequest>,
    ) -> Result<Response<pb::RemoveDeviceResponse>, Status> {
        let r = r.into_inner();
        self.push(Seen::Remove(format!(
            "{}/{}",
            r.device_namespace, r.device_name
        )));
        Ok(Response::new(pb::RemoveDeviceResponse::default()))
    }
    async fn update_device(
        &self,
        r: Request<pb::UpdateDeviceRequest>,
    ) -> Result<Response<pb::UpdateDeviceResponse>, Status> {
        self.push(Seen::Update(r.into_inner().device.unwrap_or_default()));
        Ok(Response::new(pb::UpdateDeviceResponse::default()))
    }
    async fn create_device_model(
        &self,
        r: Request<pb::CreateDeviceModelRequest>,
    ) -> Result<Response<pb::CreateDeviceModelResponse>, Status> {
        let m = r.into_inner().model.unwrap_or_default();
        self.push(Seen::CreateModel(format!("{}/{}", m.namespace, m.name)));
        Ok(Response::new(pb::CreateDeviceModelResponse::default()))
    }
    async fn remove_device_model(
        &self,
        r: Request<pb::RemoveDeviceModelRequest>,
    ) -> Result<Response<pb::RemoveDeviceModelResponse>, Status> {
        let r = r.into_inner();
        self.push(Seen::RemoveModel(format!(
            "{}/{}",
            r.model_namespace, r.model_name
        )));
        Ok(Response::new(pb::RemoveDeviceModelResponse::default()))
    }
    async fn update_device_model(
        &self,
        r: Request<pb::UpdateDeviceModelRequest>,
    ) -> Result<Response<pb::UpdateDeviceModelResponse>, Status> {
        let m = r.into_inner().model.unwrap_or_default();
        self.push(Seen::UpdateModel(format!("{}/{}", m.namespace, m.name)));
        Ok(Response::new(pb::UpdateDeviceModelResponse::default()))
    }
    async fn get_device(
        &self,
        _r: Request<pb::GetDeviceRequest>,
    ) -> Result<Response<pb::GetDeviceResponse>, Status> {
        Err(Status::unimplemented("the test mapper keeps no devices"))
    }
}

pub struct TestMapper {
    pub name: String,
    pub socket: PathBuf,
    rt: tokio::runtime::Runtime,
    seen: Recorder,
    stop: Option<oneshot::Sender<()>>,
    edgecore: DeviceManagerServiceClient<Channel>,
}

impl TestMapper {
    /// Serves the mapper socket `socket` and connects to edgecore's DMI socket `edgecore`.
    pub fn start(name: &str, socket: &Path, edgecore: &Path) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let client = {
            let _guard = rt.enter();
            DeviceManagerServiceClient::new(rt::transport::uds_channel(
                &edgecore.to_string_lossy(),
                Duration::from_secs(10),
            ))
        };
        let mut m = Self {
            name: name.to_string(),
            socket: socket.to_path_buf(),
            rt,
            seen: Recorder::default(),
            stop: None,
            edgecore: client,
        };
        m.serve();
        m
    }

    /// (Re)starts serving on the socket.
    pub fn serve(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let listener = {
            let _guard = self.rt.enter();
            tokio::net::UnixListener::bind(&self.socket).expect("bind mapper socket")
        };
        let (tx, rx) = oneshot::channel::<()>();
        let svc = DeviceMapperServiceServer::new(self.seen.clone());
        self.rt.spawn(async move {
            let incoming = rt::transport::uds_incoming(listener, 64);
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await;
        });
        self.stop = Some(tx);
    }

    /// Stops serving and removes the socket, as a crashed mapper would leave edgecore.
    pub fn halt(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = std::fs::remove_file(&self.socket);
        std::thread::sleep(Duration::from_millis(100));
    }

    pub fn register(&self, protocol: &str) -> Result<pb::MapperRegisterResponse, Status> {
        let mut c = self.edgecore.clone();
        let req = pb::MapperRegisterRequest {
            with_data: true,
            mapper: Some(pb::MapperInfo {
                name: self.name.clone(),
                version: "v1.0.0".into(),
                api_version: "v1beta1".into(),
                protocol: protocol.into(),
                address: self.socket.display().to_string().into_bytes(),
                state: "running".into(),
            }),
        };
        self.rt
            .block_on(c.mapper_register(req))
            .map(|r| r.into_inner())
    }

    pub fn call_register(
        &self,
        req: pb::MapperRegisterRequest,
    ) -> Result<pb::MapperRegisterResponse, Status> {
        let mut c = self.edgecore.clone();
        self.rt
            .block_on(c.mapper_register(req))
            .map(|r| r.into_inner())
    }

    /// Reports `(property, value)` pairs for `ns/name`.
    pub fn report(&self, ns: &str, name: &str, values: &[(&str, &str)]) -> Result<(), Status> {
        self.report_refused(ns, name, values).map(|_| ())
    }

    pub fn report_twins(&self, ns: &str, name: &str, twins: Vec<pb::Twin>) -> Result<(), Status> {
        self.report_twins_refused(ns, name, twins).map(|_| ())
    }

    /// Reports twins; returns what edgecore said it refused (`x-refused-twins`), or "".
    pub fn report_refused(
        &self,
        ns: &str,
        name: &str,
        values: &[(&str, &str)],
    ) -> Result<String, Status> {
        let twins = values
            .iter()
            .map(|(p, v)| pb::Twin {
                property_name: p.to_string(),
                observed_desired: None,
                reported: Some(pb::TwinProperty {
                    value: v.to_string(),
                    metadata: Default::default(),
                }),
            })
            .collect();
        self.report_twins_refused(ns, name, twins)
    }

    fn report_twins_refused(
        &self,
        ns: &str,
        name: &str,
        twins: Vec<pb::Twin>,
    ) -> Result<String, Status> {
        let mut c = self.edgecore.clone();
        let req = pb::ReportDeviceStatusRequest {
            device_name: name.into(),
            device_namespace: ns.into(),
            reported_device: Some(pb::DeviceStatus {
                twins,
                report_to_cloud: true,
                report_cycle: 0,
            }),
        };
        self.rt.block_on(c.report_device_status(req)).map(|r| {
            r.metadata()
                .get("x-refused-twins")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        })
    }

    pub fn report_state(&self, ns: &str, name: &str, state: &str) -> Result<(), Status> {
        let mut c = self.edgecore.clone();
        let req = pb::ReportDeviceStatesRequest {
            device_name: name.into(),
            device_namespace: ns.into(),
            state: state.into(),
        };
        self.rt.block_on(c.report_device_states(req)).map(|_| ())
    }

    /// The calls seen so far, without edgecore's reachability probes.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen
            .0
            .lock()
            .map(|v| {
                v.iter()
                    .filter(|s| !s.key().starts_with("remove/edgecore-probe/"))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn keys(&self) -> Vec<String> {
        self.seen().iter().map(Seen::key).collect()
    }

    pub fn clear(&self) {
        if let Ok(mut v) = self.seen.0.lock() {
            v.clear();
        }
    }

    /// Waits up to 10 s for a call matching `f`, and returns it.
    pub fn wait_for(&self, what: &str, f: impl Fn(&Seen) -> bool) -> Seen {
        let what = format!("mapper {} to see {what}", self.name);
        sim::poll::eventually_or(10, &what, || {
            (self.seen().into_iter().find(|s| f(s))).ok_or_else(|| format!("{:?}", self.keys()))
        })
    }
}

impl Drop for TestMapper {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The desired value of `prop` in a device as DMI sends it.
pub fn desired_of(d: &pb::Device, prop: &str) -> Option<String> {
    d.spec
        .as_ref()?
        .properties
        .iter()
        .find(|p| p.name == prop)?
        .desired
        .as_ref()
        .map(|t| t.value.clone())
}
