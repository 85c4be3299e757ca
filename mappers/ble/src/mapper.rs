//! The BLE protocol on the mapper SDK.

use crate::config::{Connection, Point};
use crate::device::{Device, Radio};
use mapper_sdk::{DeviceConfig, Driver, DriverError, Protocol, driver::Reading};

/// The protocol name devices give in `spec.protocol.protocolName`.
pub const PROTOCOL: &str = "ble";

/// Devices share one connection to BlueZ and one scan per adapter.
#[derive(Clone, Default)]
pub struct Ble {
    radio: Radio,
}

pub struct BleDriver(pub Device);

impl Protocol for Ble {
    type Driver = BleDriver;

    fn name(&self) -> &str {
        PROTOCOL
    }

    fn driver(&self, d: &DeviceConfig) -> Result<BleDriver, DriverError> {
        let conn = Connection::from_config(&d.protocol)
            .map_err(|e| DriverError::config(format!("protocol.configData.{e}")))?;
        let points = d
            .properties
            .iter()
            .map(|p| {
                Point::from_config(&p.visitor, p.value_type.as_deref()).map_err(|e| {
                    DriverError::config(format!("property {}: visitors.configData.{e}", p.name))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(BleDriver(Device::new(
            d.id(),
            conn,
            points,
            self.radio.clone(),
        )))
    }
}

impl Driver for BleDriver {
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
