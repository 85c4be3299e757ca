//! The mapper SDK: everything a protocol mapper does apart from talking to its hardware.
//!
//! A protocol implements [`driver::Protocol`] and [`driver::Driver`] (connect, read a batch of
//! properties, write one, stop); [`run`] does the rest:
//! - registers with edgecore over DMI (`MapperRegister` with data), retrying until it answers,
//!   and serves `DeviceMapperService` on the mapper's own Unix socket;
//! - runs one scheduler task per device ([`device`]): each property is read at its
//!   `collectCycle`, the properties due together are read in one batch, a changed value is
//!   reported at once and an unchanged one at its `reportCycle`, desired values are written when
//!   they change (no restart of the device) and read back, and the device's state
//!   (online/offline/unhealthy) is reported on change and at `stateReport.reportCycle`;
//! - sends reports over one long-lived DMI channel from one task ([`report`]), keeping what
//!   could not be delivered;
//! - pushes values to the property's `pushMethod` targets ([`push`]);
//! - serves a REST API and Prometheus metrics ([`rest`], [`metrics`]).

pub mod clock;
pub mod config;
pub mod configdata;
pub mod device;
pub mod driver;
pub mod field;
pub mod line;
pub mod mapper;
pub mod metrics;
pub mod push;
pub mod report;
pub mod rest;
pub mod value;

pub use config::Config;
pub use driver::{
    DeviceConfig, DeviceState, Driver, DriverError, ErrorKind, PropertyConfig, Protocol, ReadValue,
    StartError, Text,
};

use api::dmi::v1beta1::device_mapper_service_server::DeviceMapperServiceServer;
use std::path::Path;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Why the mapper could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot listen on the mapper socket {path}: {source}")]
    Socket {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen on the REST address {address}: {source}")]
    Http {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the REST token file {path}: {source}")]
    Token {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{protocol}: {source}")]
    Protocol {
        protocol: String,
        source: driver::StartError,
    },
}

/// Binds `path`, replacing a stale socket left by a crash (but not one that answers).
fn bind(path: &Path) -> Result<tokio::net::UnixListener, RunError> {
    let err = |source| RunError::Socket {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    if path.exists() && std::os::unix::net::UnixStream::connect(path).is_err() {
        let _ = std::fs::remove_file(path);
    }
    tokio::net::UnixListener::bind(path).map_err(err)
}

/// Runs the mapper until `cancel`.
pub async fn run<P: Protocol>(
    mut protocol: P,
    config: Config,
    cancel: CancellationToken,
) -> Result<(), RunError> {
    protocol
        .start(&config)
        .map_err(|source| RunError::Protocol {
            protocol: protocol.name().to_string(),
            source,
        })?;
    let metrics = Arc::new(metrics::Metrics::default());
    let socket = config.socket();
    let listener = bind(&socket)?;
    let token = match config.common.http_token_file.as_str() {
        "" => None,
        path => Some(Arc::<str>::from(
            rt::secret::token_file(Path::new(path)).map_err(|source| RunError::Token {
                path: path.to_string(),
                source,
            })?,
        )),
    };
    let hosts = rt::host::served_names(&config.common.http_hosts);
    let http = if config.common.http_port != 0 {
        let address = format!("{}:{}", config.common.address, config.common.http_port);
        let l = tokio::net::TcpListener::bind(&address)
            .await
            .map_err(|source| RunError::Http {
                address: address.clone(),
                source,
            })?;
        tracing::info!(%address, "REST API listening");
        Some(l)
    } else {
        None
    };

    let (reports_tx, reports_rx) = tokio::sync::mpsc::channel(4096);
    let reporter = tokio::spawn(report::run(
        report::client(&config.common.edgecore_sock),
        reports_rx,
        metrics.clone(),
        cancel.clone(),
    ));
    let protocol_name = protocol.name().to_string();
    let mapper = mapper::Mapper::new(
        protocol,
        config,
        metrics.clone(),
        reports_tx,
        cancel.clone(),
    );

    tracing::info!(socket = %socket.display(), "DeviceMapperService listening");
    let incoming = rt::transport::uds_incoming(listener, 64);
    let grpc = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DeviceMapperServiceServer::new(mapper.clone()))
            .serve_with_incoming_shutdown(incoming, cancel.clone().cancelled_owned()),
    );
    let rest = http.map(|l| {
        let router = rest::router(rest::RestState {
            devices: mapper.shared.devices.clone(),
            metrics: metrics.clone(),
            protocol: protocol_name,
            token,
            hosts,
        });
        let c = cancel.clone();
        tokio::spawn(async move {
            if let Err(e) = axum::serve(l, router)
                .with_graceful_shutdown(c.cancelled_owned())
                .await
            {
                tracing::error!(error = %e, "REST API failed");
            }
        })
    });

    mapper.register().await;
    cancel.cancelled().await;
    tracing::info!("stopping");
    if let Err(e) = grpc.await.unwrap_or(Ok(())) {
        tracing::error!(error = %e, "DeviceMapperService failed");
    }
    if let Some(r) = rest {
        let _ = r.await;
    }
    let _ = reporter.await;
    // Device tasks stop their drivers on the same cancellation; give them a moment.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let _ = std::fs::remove_file(&socket);
    Ok(())
}

#[derive(clap::Parser)]
struct Args {
    /// The mapper's config file (mapper-framework's `config.yaml`).
    #[arg(
        long = "config-file",
        short = 'c',
        visible_alias = "config",
        default_value = "./config.yaml"
    )]
    config_file: std::path::PathBuf,
}

/// The whole `main` of a mapper binary: `--config-file FILE` (default `./config.yaml`), logs
/// to stderr filtered by `RUST_LOG` (default `info`), stops on SIGINT or SIGTERM. The config's
/// `common.protocol` must be the protocol's name.
pub fn main<P: Protocol>(protocol: P) -> std::process::ExitCode {
    use clap::Parser;
    use std::process::ExitCode;
    let args = Args::parse();
    let bin = protocol.name().to_string();
    rt::bootstrap::init_tracing("info");
    let config = match Config::load(&args.config_file) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mapper-{bin}: {e}");
            return ExitCode::from(2);
        }
    };
    if config.common.protocol != protocol.name() {
        eprintln!(
            "mapper-{bin}: {}: common.protocol is {:?}; this mapper serves {:?}",
            args.config_file.display(),
            config.common.protocol,
            protocol.name()
        );
        return ExitCode::from(2);
    }
    // One thread serves many devices: every device waits on IO, not on the CPU.
    rt::bootstrap::run(
        &format!("mapper-{bin}"),
        rt::bootstrap::Threads::One,
        |cancel| run(protocol, config, cancel),
    )
}
