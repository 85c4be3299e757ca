//! The OPC UA protocol on the mapper SDK.

use crate::config::{Connection, Point};
use crate::device::Device;
use mapper_sdk::{Config, DeviceConfig, Driver, DriverError, Protocol, driver::Reading};
use std::path::PathBuf;

/// The protocol name devices give in `spec.protocol.protocolName`.
pub const PROTOCOL: &str = "opcua";

#[derive(Clone, Debug, Default)]
pub struct OpcUa {
    /// `{common.data_dir}/pki`: the mapper's application certificate and its trust list.
    pki: PathBuf,
}

pub struct OpcUaDriver(pub Device);

impl Protocol for OpcUa {
    type Driver = OpcUaDriver;

    fn name(&self) -> &str {
        PROTOCOL
    }

    fn start(&mut self, config: &Config) -> Result<(), String> {
        self.pki = PathBuf::from(&config.common.data_dir).join("pki");
        for dir in ["own", "private", "trusted", "rejected"] {
            let d = self.pki.join(dir);
            std::fs::create_dir_all(&d)
                .map_err(|e| format!("cannot create {} (common.data_dir): {e}", d.display()))?;
        }
        tracing::info!(pki = %self.pki.display(), "OPC UA certificates and trust list");
        Ok(())
    }

    fn driver(&self, d: &DeviceConfig) -> Result<OpcUaDriver, DriverError> {
        let conn = d.parse_protocol(Connection::from_config)?;
        let points = d.parse_visitors(|p| Point::from_config(&p.visitor, p.collect))?;
        Ok(OpcUaDriver(Device::new(
            d.id(),
            conn,
            points,
            self.pki.clone(),
        )))
    }
}

impl Driver for OpcUaDriver {
    async fn connect(&mut self) -> Result<(), DriverError> {
        self.0.connect().await
    }

    async fn read(&mut self, due: &[usize]) -> Vec<Reading> {
        self.0.read(due).await
    }

    async fn write(&mut self, index: usize, value: &str) -> Result<(), DriverError> {
        self.0.write(index, value).await
    }

    async fn stop(&mut self) {
        self.0.stop().await
    }

    fn requests(&self) -> u64 {
        self.0.requests()
    }

    async fn changes(&mut self) -> Vec<Reading> {
        self.0.changes().await
    }

    fn subscribed(&self, index: usize) -> bool {
        self.0.subscribed(index)
    }
}
