//! The OPC UA protocol on the mapper SDK.

use crate::config::{Connection, Point};
use crate::device::Device;
use mapper_sdk::{Config, DeviceConfig, DriverError, Protocol, StartError};
use std::path::PathBuf;

/// A directory of the certificate store that cannot be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot create {} (common.data_dir): {source}", dir.display())]
struct PkiDirError {
    dir: PathBuf,
    source: std::io::Error,
}

/// The protocol name devices give in `spec.protocol.protocolName`.
pub const PROTOCOL: &str = "opcua";

#[derive(Clone, Debug, Default)]
pub struct OpcUa {
    /// `{common.data_dir}/pki`: the mapper's application certificate and its trust list.
    pki: PathBuf,
}

impl Protocol for OpcUa {
    type Driver = Device;

    fn name(&self) -> &str {
        PROTOCOL
    }

    fn start(&mut self, config: &Config) -> Result<(), StartError> {
        self.pki = PathBuf::from(&config.common.data_dir).join("pki");
        // The application's private key is kept here.
        rt::fs::private_dir(&self.pki).map_err(|source| PkiDirError {
            dir: self.pki.clone(),
            source,
        })?;
        for dir in ["own", "private", "trusted", "rejected"] {
            let d = self.pki.join(dir);
            std::fs::create_dir_all(&d).map_err(|source| PkiDirError { dir: d, source })?;
        }
        tracing::info!(pki = %self.pki.display(), "OPC UA certificates and trust list");
        Ok(())
    }

    fn driver(&self, d: &DeviceConfig) -> Result<Device, DriverError> {
        let conn = d.parse_protocol(Connection::from_config)?;
        let points = d.parse_visitors(|p| Point::from_config(&p.visitor, p.collect))?;
        Ok(Device::new(d.id(), conn, points, self.pki.clone()))
    }
}
