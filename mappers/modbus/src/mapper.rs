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

/// What a read error means: the link is down, or this property failed. A link error names the
/// device's address (`10.0.0.5:502`, `/dev/ttyUSB0 slave 4`), unless it already does.
fn read_error(e: ModbusError, address: &str) -> DriverError {
    if e.is_link() {
        let text = e.to_string();
        if text.contains(address) {
            DriverError::link(text)
        } else {
            DriverError::link(format!("{address}: {text}"))
        }
    } else {
        DriverError::device(e.to_string())
    }
}

/// What a write error means: a value that cannot be encoded or a read-only register will never
/// be written, so it is a configuration error, not retried.
fn write_error(e: ModbusError, address: &str) -> DriverError {
    match e {
        ModbusError::Codec(_) | ModbusError::ReadOnly(_) | ModbusError::Plan(_) => {
            DriverError::config(e.to_string())
        }
        e => read_error(e, address),
    }
}

impl ModbusDriver {
    /// The device as errors name it: `host:port`, or the serial port and the slave.
    fn address(&self) -> String {
        let c = &self.0.connection;
        match &c.transport {
            crate::device::Transport::Tcp { address } => address.clone(),
            crate::device::Transport::Rtu(serial) => format!("{} slave {}", serial.path, c.slave),
        }
    }
}

impl Driver for ModbusDriver {
    async fn connect(&mut self) -> Result<(), DriverError> {
        let address = self.address();
        self.0
            .connect()
            .await
            .map(|_| ())
            .map_err(|e| read_error(e, &address))
    }

    async fn read(&mut self, due: &[usize]) -> Vec<Reading> {
        let address = self.address();
        self.0.read_with(due, |e| read_error(e, &address)).await
    }

    async fn write(&mut self, index: usize, value: &str) -> Result<(), DriverError> {
        let address = self.address();
        self.0
            .write(index, value)
            .await
            .map_err(|e| write_error(e, &address))
    }

    async fn stop(&mut self) {
        // The connection is shared with the other devices at the address; it closes when the
        // last of them is dropped.
    }

    fn requests(&self) -> u64 {
        self.0.requests()
    }
}
