//! DMI: the `DeviceManagerService` server mappers call on edgecore's Unix socket, and the
//! [`mappers`] manager that calls each mapper's `DeviceMapperService`.
//!
//! There is no rate limit (KubeEdge allows 1 request/s with a burst of 100, shared by all
//! mappers): a report that changes nothing costs a map lookup and writes nothing.

pub(crate) mod liveness;
pub mod mappers;
mod placement;

use crate::metrics::Metrics;
use api::dmi::v1beta1 as pb;
use api::dmi::v1beta1::device_manager_service_server::{
    DeviceManagerService, DeviceManagerServiceServer,
};
use api::paths::DeviceId;
use api::v1beta1::PropertyType;
use mappers::Mappers;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use twin::TwinService;
use twin::engine::{Reported, TwinError};
use twin::service::{Op, ServiceError};

/// The `DeviceManagerService` of edgecore.
#[derive(Clone)]
pub struct DmiServer {
    pub twin: TwinService,
    pub mappers: Mappers,
    pub metrics: Arc<Metrics>,
}

fn device_id(namespace: &str, name: &str) -> Result<DeviceId, Status> {
    if name.is_empty() {
        return Err(Status::invalid_argument("deviceName is empty"));
    }
    let ns = if namespace.is_empty() {
        "default"
    } else {
        namespace
    };
    Ok(DeviceId::new(ns, name))
}

fn status_of(e: ServiceError) -> Status {
    match &e {
        ServiceError::Twin(TwinError::UnknownDevice(_) | TwinError::UnknownProperty { .. }) => {
            Status::not_found(e.to_string())
        }
        ServiceError::Twin(TwinError::Conflict { .. } | TwinError::StaleVersion { .. }) => {
            Status::aborted(e.to_string())
        }
        ServiceError::Twin(_) => Status::invalid_argument(e.to_string()),
        // Not stored (a full disk): the mapper keeps the values and retries.
        ServiceError::Store(_) | ServiceError::Degraded { .. } => {
            Status::unavailable(e.to_string())
        }
        _ => Status::internal(e.to_string()),
    }
}

impl DmiServer {
    fn counted<T>(&self, r: Result<T, Status>) -> Result<T, Status> {
        self.metrics.dmi_requests.fetch_add(1, Ordering::Relaxed);
        if let Err(s) = &r {
            self.metrics.dmi_errors.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(code = ?s.code(), error = %s.message(), "DMI request refused");
        }
        r
    }

    /// Stores the twins of one report. Each twin stands on its own, as in KubeEdge: a value that
    /// is refused (not of its property's type, too large) fails that twin only; the others are
    /// stored, and the refused ones are named in the response's `x-refused-twins` metadata and
    /// the log. A twin the device does not declare is added, typed by its `metadata.type`
    /// (string by default), as KubeEdge's edgecore adds it (`dealTwinAdd`) and as MQTT
    /// `twin/update` does.
    async fn report_status(
        &self,
        request: Request<pb::ReportDeviceStatusRequest>,
    ) -> Result<Response<pb::ReportDeviceStatusResponse>, Status> {
        let errors: std::collections::BTreeMap<String, String> = property_errors(
            request.metadata(),
            api::dmi::PROPERTY_ERRORS_HEADER,
            "error texts",
        )?;
        let refusals: std::collections::BTreeMap<String, api::dmi::WriteRefusal> = property_errors(
            request.metadata(),
            api::dmi::WRITE_ERRORS_HEADER,
            "{\"desired\", \"error\"}",
        )?;
        let req = request.into_inner();
        let id = device_id(&req.device_namespace, &req.device_name)?;
        let status = req.reported_device.unwrap_or_default();
        let mut reports: Vec<Reported> = status
            .twins
            .into_iter()
            .filter(|t| !t.property_name.is_empty())
            .map(|t| {
                let value_type = t
                    .reported
                    .as_ref()
                    .and_then(|r| r.metadata.get("type"))
                    .and_then(|ty| api::v1beta1::PropertyType::from_twin_type(ty))
                    .unwrap_or(PropertyType::String);
                Reported {
                    property: t.property_name,
                    value: t.reported.map(|r| r.value),
                    observed_desired: t
                        .observed_desired
                        .map(|d| d.value)
                        .filter(|v| !v.is_empty()),
                    value_type: Some(value_type),
                    ..Reported::default()
                }
            })
            .collect();
        for (property, error) in errors {
            if !reports.iter().any(|r| r.property == property) {
                reports.push(Reported {
                    property,
                    error: Some(error),
                    ..Reported::default()
                });
            }
        }
        for (property, r) in refusals {
            let refusal = Some((r.desired, r.error));
            match reports.iter_mut().find(|x| x.property == property) {
                Some(x) => x.write_error = refusal,
                None => reports.push(Reported {
                    property,
                    write_error: refusal,
                    ..Reported::default()
                }),
            }
        }
        if reports.is_empty() {
            return Ok(Response::new(pb::ReportDeviceStatusResponse {}));
        }
        let batch = Op::Report {
            id: id.clone(),
            reports: reports.clone(),
        };
        let refused = match self.twin.apply(batch).await {
            Ok(_) => Vec::new(),
            Err(ServiceError::Twin(e)) if e.is_about_a_value() => {
                // Some twin was refused: store the others one by one.
                let mut refused = Vec::new();
                for r in reports {
                    let property = r.property.clone();
                    let op = Op::Report {
                        id: id.clone(),
                        reports: vec![r],
                    };
                    match self.twin.apply(op).await {
                        Ok(_) => {}
                        Err(ServiceError::Twin(e)) if e.is_about_a_value() => {
                            refused.push(format!("{property}: {e}"));
                        }
                        Err(e) => return Err(status_of(e)),
                    }
                }
                refused
            }
            Err(e) => return Err(status_of(e)),
        };
        let mut response = Response::new(pb::ReportDeviceStatusResponse {});
        if !refused.is_empty() {
            self.metrics
                .dmi_refused_twins
                .fetch_add(refused.len() as u64, Ordering::Relaxed);
            tracing::warn!(device = %id, refused = %refused.join("; "), "reported twins refused; the others were stored");
            let text: String = refused
                .join("; ")
                .chars()
                .filter(|c| c.is_ascii() && !c.is_ascii_control())
                .collect();
            if let Ok(v) = tonic::metadata::MetadataValue::try_from(text.as_str()) {
                response.metadata_mut().insert(REFUSED_TWINS, v);
            }
        }
        Ok(response)
    }
}

/// The property errors a mapper sent beside its values ([`api::dmi::PROPERTY_ERRORS_HEADER`]).
fn property_errors<T: serde::de::DeserializeOwned>(
    metadata: &tonic::metadata::MetadataMap,
    header: &str,
    what: &str,
) -> Result<std::collections::BTreeMap<String, T>, Status> {
    let Some(v) = metadata.get_bin(header) else {
        return Ok(Default::default());
    };
    let bytes = v
        .to_bytes()
        .map_err(|e| Status::invalid_argument(format!("{header} is not base64: {e}")))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        Status::invalid_argument(format!(
            "{header} must be a JSON object of property names to {what}: {e}"
        ))
    })
}

/// The response metadata of `ReportDeviceStatus` that names the twins it refused, each as
/// `property: reason`, separated by `; `.
pub const REFUSED_TWINS: &str = "x-refused-twins";

#[tonic::async_trait]
impl DeviceManagerService for DmiServer {
    async fn mapper_register(
        &self,
        request: Request<pb::MapperRegisterRequest>,
    ) -> Result<Response<pb::MapperRegisterResponse>, Status> {
        let req = request.into_inner();
        let r = async {
            let info = req
                .mapper
                .ok_or_else(|| Status::invalid_argument("mapper is missing"))?;
            if info.name.is_empty() || info.protocol.is_empty() {
                return Err(Status::invalid_argument(
                    "mapper.name and mapper.protocol are required",
                ));
            }
            let mut resp = self
                .mappers
                .register(info)
                .await
                .ok_or_else(|| Status::unavailable("edgecore is shutting down"))?;
            if !req.with_data {
                resp = pb::MapperRegisterResponse::default();
            }
            Ok(Response::new(resp))
        }
        .await;
        self.counted(r)
    }

    async fn report_device_status(
        &self,
        request: Request<pb::ReportDeviceStatusRequest>,
    ) -> Result<Response<pb::ReportDeviceStatusResponse>, Status> {
        let r = self.report_status(request).await;
        self.counted(r)
    }

    async fn report_device_states(
        &self,
        request: Request<pb::ReportDeviceStatesRequest>,
    ) -> Result<Response<pb::ReportDeviceStatesResponse>, Status> {
        let reason = request
            .metadata()
            .get_bin(api::dmi::STATE_REASON_HEADER)
            .and_then(|v| v.to_bytes().ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let req = request.into_inner();
        let r = async {
            let id = device_id(&req.device_namespace, &req.device_name)?;
            self.twin
                .apply(Op::State {
                    id,
                    state: req.state,
                    reason,
                })
                .await
                .map_err(status_of)?;
            Ok(Response::new(pb::ReportDeviceStatesResponse {}))
        }
        .await;
        self.counted(r)
    }
}

/// Errors of starting the DMI server.
#[derive(Debug, thiserror::Error)]
pub enum DmiError {
    #[error("cannot create the directory of DMI socket {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen on DMI socket {path}: {source}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot give {path} to group {gid} (dmi.socketGroup): {source}")]
    Group {
        path: PathBuf,
        gid: u32,
        #[source]
        source: std::io::Error,
    },
}

/// Binds the socket, replacing a stale one left by a crash. With `group`, the socket is that
/// group's (0660) and so is its directory (0750): mappers of the group reach it, no one else.
pub fn bind(path: &Path, group: Option<u32>) -> Result<tokio::net::UnixListener, DmiError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| DmiError::Dir {
            path: path.to_path_buf(),
            source,
        })?;
    }
    if path.exists() && std::os::unix::net::UnixStream::connect(path).is_err() {
        let _ = std::fs::remove_file(path);
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(|source| DmiError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    if let Some(gid) = group {
        use std::os::unix::fs::PermissionsExt;
        let share = |p: &Path, mode: u32| {
            std::os::unix::fs::chown(p, None, Some(gid))
                .and_then(|()| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)))
                .map_err(|source| DmiError::Group {
                    path: p.to_path_buf(),
                    gid,
                    source,
                })
        };
        if let Some(dir) = path.parent() {
            share(dir, 0o750)?;
        }
        share(path, 0o660)?;
    }
    Ok(listener)
}

/// Serves DMI on `listener` until `cancel`.
pub async fn serve(
    listener: tokio::net::UnixListener,
    path: PathBuf,
    max_connections: usize,
    server: DmiServer,
    cancel: CancellationToken,
) {
    tracing::info!(socket = %path.display(), max_connections, "DMI server listening");
    let incoming = rt::transport::uds_incoming(listener, max_connections);
    let result = tonic::transport::Server::builder()
        .add_service(DeviceManagerServiceServer::new(server))
        .serve_with_incoming_shutdown(incoming, cancel.cancelled())
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "DMI server failed");
    }
    let _ = std::fs::remove_file(&path);
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// With a group, the socket is the group's 0660 and its directory the group's 0750 (a
    /// mapper of the group reaches it, nobody else); without, as the umask makes them.
    #[tokio::test]
    async fn a_socket_with_a_group_is_shared_with_that_group_only() {
        let d = tempfile::tempdir().expect("dir");
        let gid = std::fs::metadata(d.path()).expect("meta").gid();
        let path = d.path().join("run/edgecore/dmi.sock");
        let _l = super::bind(&path, Some(gid)).expect("bound");
        let sock = std::fs::metadata(&path).expect("socket");
        assert_eq!(
            (sock.gid(), sock.permissions().mode() & 0o777),
            (gid, 0o660)
        );
        let dir = std::fs::metadata(d.path().join("run/edgecore")).expect("dir");
        assert_eq!((dir.gid(), dir.permissions().mode() & 0o777), (gid, 0o750));
    }
}
