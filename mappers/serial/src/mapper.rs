//! The serial protocol on the mapper SDK.

use crate::device::{Device, Point, Port, SerialError};
use mapper_sdk::{DeviceConfig, Driver, DriverError, Protocol, driver::Reading};

/// The protocol name devices give in `spec.protocol.protocolName`.
pub const PROTOCOL: &str = "serial";

#[derive(Clone, Debug, Default)]
pub struct Serial;

pub struct SerialDriver(pub Device);

impl Protocol for Serial {
    type Driver = SerialDriver;

    fn name(&self) -> &str {
        PROTOCOL
    }

    fn driver(&self, d: &DeviceConfig) -> Result<SerialDriver, DriverError> {
        let port = d.parse_protocol(Port::from_config)?;
        let points = d.parse_visitors(|p| {
            Point::from_config(
                &port,
                &p.name,
                &p.visitor,
                p.value_type.as_deref(),
                p.minimum,
                p.maximum,
            )
        })?;
        Ok(SerialDriver(Device::new(port, points)))
    }
}

fn error(e: SerialError) -> DriverError {
    match e {
        SerialError::Link(m) => DriverError::link(m),
        SerialError::Reply(m) => DriverError::device(m),
        // Not retried until the value changes.
        SerialError::Value(m) => DriverError::config(m),
    }
}

impl Driver for SerialDriver {
    async fn connect(&mut self) -> Result<(), DriverError> {
        self.0.connect().await.map_err(error)
    }

    async fn read(&mut self, due: &[usize]) -> Vec<Reading> {
        self.0
            .read(due)
            .await
            .into_iter()
            .map(|(i, r)| (i, r.map(Into::into).map_err(error)))
            .collect()
    }

    async fn write(&mut self, index: usize, value: &str) -> Result<(), DriverError> {
        self.0.write(index, value).await.map_err(error)
    }

    async fn stop(&mut self) {}

    fn requests(&self) -> u64 {
        self.0.requests()
    }
}
