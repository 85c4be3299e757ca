//! The CRI calls edged makes, each with a deadline and an error that names the call.

use crate::proto::v1 as cri;
use cri::image_service_client::ImageServiceClient;
use cri::runtime_service_client::RuntimeServiceClient;
use std::collections::HashMap;
use std::time::Duration;
use tonic::transport::Channel;

pub struct Runtime {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    /// The deadline of each call; image pulls get ten times it.
    timeout: Duration,
}

/// A CRI call that failed: which call, and the runtime's status (its code tells a missing
/// object from a runtime that is down).
#[derive(Debug, thiserror::Error)]
#[error("CRI {call}: {} ({:?})", status.message(), status.code())]
pub struct CriError {
    pub call: &'static str,
    #[source]
    pub status: tonic::Status,
}

impl CriError {
    pub fn code(&self) -> tonic::Code {
        self.status.code()
    }
}

/// A container's usage as [`Runtime::container_usage`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerUsage {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// Cumulative CPU time, nanoseconds, read at `at_ns` (Unix nanoseconds).
    pub cpu_ns: u64,
    pub at_ns: i64,
    /// Working set, bytes.
    pub memory: u64,
}

fn failed(call: &'static str, status: tonic::Status) -> CriError {
    CriError { call, status }
}

fn managed() -> HashMap<String, String> {
    [(super::MANAGED.to_string(), "true".to_string())].into()
}

impl Runtime {
    /// A lazy connection to `endpoint` (`unix:///path`): it is dialled at the first call and
    /// again after the runtime restarts.
    pub fn new(endpoint: &str, timeout: Duration) -> Self {
        // The channel's own deadline is the longest a call may take (a pull, or a stop with a
        // long grace period); each call is bounded by `timeout` besides.
        let channel = rt::transport::uds_channel(endpoint, Duration::from_secs(3600));
        Self {
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
            timeout,
        }
    }

    fn request<T>(&self, message: T, timeout: Duration) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        r.set_timeout(timeout);
        r
    }

    pub async fn version(&self) -> Result<cri::VersionResponse, CriError> {
        let r = self
            .runtime
            .clone()
            .version(self.request(
                cri::VersionRequest {
                    version: "v1".into(),
                },
                self.timeout,
            ))
            .await
            .map_err(|s| failed("Version", s))?;
        Ok(r.into_inner())
    }

    pub async fn list_sandboxes(&self) -> Result<Vec<cri::PodSandbox>, CriError> {
        let r = self
            .runtime
            .clone()
            .list_pod_sandbox(self.request(
                cri::ListPodSandboxRequest {
                    filter: Some(cri::PodSandboxFilter {
                        label_selector: managed(),
                        ..Default::default()
                    }),
                },
                self.timeout,
            ))
            .await
            .map_err(|s| failed("ListPodSandbox", s))?;
        Ok(r.into_inner().items)
    }

    pub async fn list_containers(&self) -> Result<Vec<cri::Container>, CriError> {
        let r = self
            .runtime
            .clone()
            .list_containers(self.request(
                cri::ListContainersRequest {
                    filter: Some(cri::ContainerFilter {
                        label_selector: managed(),
                        ..Default::default()
                    }),
                },
                self.timeout,
            ))
            .await
            .map_err(|s| failed("ListContainers", s))?;
        Ok(r.into_inner().containers)
    }

    pub async fn run_sandbox(&self, config: cri::PodSandboxConfig) -> Result<String, CriError> {
        let r = self
            .runtime
            .clone()
            .run_pod_sandbox(self.request(
                cri::RunPodSandboxRequest {
                    config: Some(config),
                    runtime_handler: String::new(),
                },
                self.timeout,
            ))
            .await
            .map_err(|s| failed("RunPodSandbox", s))?;
        Ok(r.into_inner().pod_sandbox_id)
    }

    /// The IP the runtime's network (CNI) gave a sandbox; empty on the host's network.
    pub async fn sandbox_ip(&self, id: &str) -> Result<String, CriError> {
        let r = self
            .runtime
            .clone()
            .pod_sandbox_status(self.request(
                cri::PodSandboxStatusRequest {
                    pod_sandbox_id: id.into(),
                    verbose: false,
                },
                self.timeout,
            ))
            .await
            .map_err(|s| failed("PodSandboxStatus", s))?;
        Ok(r.into_inner()
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .unwrap_or_default())
    }

    pub async fn stop_sandbox(&self, id: &str) -> Result<(), CriError> {
        self.runtime
            .clone()
            .stop_pod_sandbox(self.request(
                cri::StopPodSandboxRequest {
                    pod_sandbox_id: id.into(),
                },
                self.timeout,
            ))
            .await
            .map_err(|s| failed("StopPodSandbox", s))?;
        Ok(())
    }

    pub async fn remove_sandbox(&self, id: &str) -> Result<(), CriError> {
        self.runtime
            .clone()
            .remove_pod_sandbox(self.request(
                cri::RemovePodSandboxRequest {
                    pod_sandbox_id: id.into(),
                },
                self.timeout,
            ))
            .await
            .map_err(|s| failed("RemovePodSandbox", s))?;
        Ok(())
    }

    pub async fn create_container(
        &self,
        sandbox: &str,
        config: cri::ContainerConfig,
        sandbox_config: cri::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let r = self
            .runtime
            .clone()
            .create_container(self.request(
                cri::CreateContainerRequest {
                    pod_sandbox_id: sandbox.into(),
                    config: Some(config),
                    sandbox_config: Some(sandbox_config),
                },
                self.timeout,
            ))
            .await
            .map_err(|s| failed("CreateContainer", s))?;
        Ok(r.into_inner().container_id)
    }

    pub async fn start_container(&self, id: &str) -> Result<(), CriError> {
        self.runtime
            .clone()
            .start_container(self.request(
                cri::StartContainerRequest {
                    container_id: id.into(),
                },
                self.timeout,
            ))
            .await
            .map_err(|s| failed("StartContainer", s))?;
        Ok(())
    }

    /// Stops a container: SIGTERM, then SIGKILL after `grace` seconds.
    pub async fn stop_container(&self, id: &str, grace: i64) -> Result<(), CriError> {
        let req = self.request(
            cri::StopContainerRequest {
                container_id: id.into(),
                timeout: grace,
            },
            Duration::from_secs(grace.max(0) as u64) + self.timeout,
        );
        self.runtime
            .clone()
            .stop_container(req)
            .await
            .map_err(|s| failed("StopContainer", s))?;
        Ok(())
    }

    pub async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        self.runtime
            .clone()
            .remove_container(self.request(
                cri::RemoveContainerRequest {
                    container_id: id.into(),
                },
                self.timeout,
            ))
            .await
            .map_err(|s| failed("RemoveContainer", s))?;
        Ok(())
    }

    pub async fn container_status(&self, id: &str) -> Result<cri::ContainerStatus, CriError> {
        let r = self
            .runtime
            .clone()
            .container_status(self.request(
                cri::ContainerStatusRequest {
                    container_id: id.into(),
                    verbose: false,
                },
                self.timeout,
            ))
            .await
            .map_err(|s| failed("ContainerStatus", s))?;
        r.into_inner().status.ok_or_else(|| {
            failed(
                "ContainerStatus",
                tonic::Status::not_found(format!("no status for {id}")),
            )
        })
    }

    /// Runs `cmd` in a container; its exit code (a probe).
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<i32, CriError> {
        let r = self
            .runtime
            .clone()
            .exec_sync(self.request(
                cri::ExecSyncRequest {
                    container_id: id.into(),
                    cmd: cmd.to_vec(),
                    timeout: timeout.as_secs().max(1) as i64,
                },
                timeout + self.timeout,
            ))
            .await
            .map_err(|s| failed("ExecSync", s))?;
        Ok(r.into_inner().exit_code)
    }

    /// Asks the runtime to prepare a command in a container: the URL of its streaming server
    /// where the command's streams are then served (once).
    pub async fn exec(
        &self,
        id: &str,
        cmd: &[String],
        (tty, stdin, stdout, stderr): (bool, bool, bool, bool),
    ) -> Result<String, CriError> {
        let r = self
            .runtime
            .clone()
            .exec(self.request(
                cri::ExecRequest {
                    container_id: id.into(),
                    cmd: cmd.to_vec(),
                    tty,
                    stdin,
                    stdout,
                    // A terminal has one output: the runtime refuses stderr beside it.
                    stderr: stderr && !tty,
                },
                self.timeout,
            ))
            .await
            .map_err(|s| failed("Exec", s))?;
        Ok(r.into_inner().url)
    }

    /// As [`Runtime::exec`] for the container's own process (`kubectl attach`): no command.
    pub async fn attach(
        &self,
        id: &str,
        (tty, stdin, stdout, stderr): (bool, bool, bool, bool),
    ) -> Result<String, CriError> {
        let r = self
            .runtime
            .clone()
            .attach(self.request(
                cri::AttachRequest {
                    container_id: id.into(),
                    stdin,
                    tty,
                    stdout,
                    stderr: stderr && !tty,
                },
                self.timeout,
            ))
            .await
            .map_err(|s| failed("Attach", s))?;
        Ok(r.into_inner().url)
    }

    /// Asks the runtime to prepare a connection to `port` in the pod's network (`kubectl
    /// port-forward`): the URL of its streaming server where it is then served (once).
    pub async fn port_forward(&self, sandbox_id: &str, port: u16) -> Result<String, CriError> {
        let r = self
            .runtime
            .clone()
            .port_forward(self.request(
                cri::PortForwardRequest {
                    pod_sandbox_id: sandbox_id.into(),
                    port: vec![i32::from(port)],
                },
                self.timeout,
            ))
            .await
            .map_err(|s| failed("PortForward", s))?;
        Ok(r.into_inner().url)
    }

    /// Each container's CPU time and memory as the runtime measures them (`kubectl top`): by
    /// (namespace, pod, container) from the kubelet's labels, with the cumulative CPU
    /// nanoseconds, when they were read (Unix nanoseconds) and the working set in bytes.
    pub async fn container_usage(&self) -> Result<Vec<ContainerUsage>, CriError> {
        let r = self
            .runtime
            .clone()
            .list_container_stats(self.request(
                cri::ListContainerStatsRequest { filter: None },
                self.timeout,
            ))
            .await
            .map_err(|s| failed("ListContainerStats", s))?;
        Ok(r.into_inner()
            .stats
            .into_iter()
            .filter_map(|s| {
                let a = s.attributes?;
                let label = |k: &str| a.labels.get(k).cloned().unwrap_or_default();
                let cpu = s.cpu?;
                Some(ContainerUsage {
                    namespace: label("io.kubernetes.pod.namespace"),
                    pod: label("io.kubernetes.pod.name"),
                    container: label("io.kubernetes.container.name"),
                    cpu_ns: cpu.usage_core_nano_seconds.map(|v| v.value)?,
                    at_ns: cpu.timestamp,
                    memory: s
                        .memory
                        .and_then(|m| m.working_set_bytes)
                        .map_or(0, |v| v.value),
                })
            })
            .filter(|u| !u.pod.is_empty() && !u.container.is_empty())
            .collect())
    }

    /// Has the runtime open the container's log file again (after it was rotated).
    pub async fn reopen_log(&self, id: &str) -> Result<(), CriError> {
        self.runtime
            .clone()
            .reopen_container_log(self.request(
                cri::ReopenContainerLogRequest {
                    container_id: id.into(),
                },
                self.timeout,
            ))
            .await
            .map_err(|s| failed("ReopenContainerLog", s))?;
        Ok(())
    }

    pub async fn image_present(&self, image: &str) -> Result<bool, CriError> {
        let r = self
            .images
            .clone()
            .image_status(self.request(
                cri::ImageStatusRequest {
                    image: Some(cri::ImageSpec {
                        image: image.into(),
                    }),
                    verbose: false,
                },
                self.timeout,
            ))
            .await
            .map_err(|s| failed("ImageStatus", s))?;
        Ok(r.into_inner().image.is_some_and(|i| !i.id.is_empty()))
    }

    pub async fn pull_image(&self, image: &str) -> Result<String, CriError> {
        self.pull_image_with(image, None).await
    }

    /// Pulls with a registry's credentials.
    pub async fn pull_image_with(
        &self,
        image: &str,
        auth: Option<cri::AuthConfig>,
    ) -> Result<String, CriError> {
        let req = self.request(
            cri::PullImageRequest {
                image: Some(cri::ImageSpec {
                    image: image.into(),
                }),
                auth,
                sandbox_config: None,
            },
            self.timeout * 10,
        );
        let r = self
            .images
            .clone()
            .pull_image(req)
            .await
            .map_err(|s| failed("PullImage", s))?;
        Ok(r.into_inner().image_ref)
    }
}
