//! The Modbus protocol on the mapper SDK: a [`Device`] per KubeEdge device, its settings and
//! points from `configData`, errors sorted into what they mean for the device's state.

use crate::device::{Connection, Device, ModbusError, ModelHints, Point};
use mapper_sdk::{DeviceConfig, Driver, DriverError, Protocol, driver::Reading};

/// The protocol name devices give in `spec.protocol.protocolName`.
pub const PROTOCOL: &str = "modbus";

/// The Modbus protocol.
#[derive(Clone, Debug, Default)]
pub struct Modbus;

/// One Modbus device on the SDK.
pub struct ModbusDriver(pub Device);

impl Protocol for Modbus {
    type Driver = ModbusDriver;

    fn name(&self) -> &str {
        PROTOCOL
    }

    fn driver(&self, d: &DeviceConfig) -> Result<ModbusDriver, DriverError> {
        let connection = d.parse_protocol(Connection::from_config)?;
        let points = d.parse_visitors(|p| {
            let hints = ModelHints {
                value_type: p.value_type.clone(),
                minimum: p.minimum,
                maximum: p.maximum,
            };
            Point::from_config(&p.name, &p.visitor, &hints)
        })?;
        Ok(ModbusDriver(Device::new(connection, points)))
    }
}

/// What a read error means: the link is down, or this property failed.
fn read_error(e: ModbusError) -> DriverError {
    if e.is_link() {
        DriverError::link(e.to_string())
    } else {
        DriverError::device(e.to_string())
    }
}

/// What a write error means: a value that cannot be encoded or a read-only register will never
/// be written, so it is a configuration error, not retried.
fn write_error(e: ModbusError) -> DriverError {
    match e {
        ModbusError::Codec(_) | ModbusError::ReadOnly(_) | ModbusError::Plan(_) => {
            DriverError::config(e.to_string())
        }
        e => read_error(e),
    }
}

impl Driver for ModbusDriver {
    async fn connect(&mut self) -> Result<(), DriverError> {
        self.0.connect().await.map(|_| ()).map_err(read_error)
    }

    async fn read(&mut self, due: &[usize]) -> Vec<Reading> {
        self.0
            .read(due)
            .await
            .into_iter()
            .map(|(i, r)| (i, r.map_err(read_error)))
            .collect()
    }

    async fn write(&mut self, index: usize, value: &str) -> Result<(), DriverError> {
        self.0.write(index, value).await.map_err(write_error)
    }

    async fn stop(&mut self) {
        self.0.disconnect();
    }

    fn requests(&self) -> u64 {
        self.0.requests()
    }
}
