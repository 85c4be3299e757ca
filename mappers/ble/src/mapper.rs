//! The BLE protocol on the mapper SDK.

use crate::config::{Connection, Point};
use crate::device::{Device, Radio};
use mapper_sdk::{DeviceConfig, DriverError, Protocol};

/// The protocol name devices give in `spec.protocol.protocolName`.
pub const PROTOCOL: &str = "ble";

/// Devices share one connection to BlueZ and one scan per adapter.
#[derive(Clone, Default)]
pub struct Ble {
    radio: Radio,
}

impl Protocol for Ble {
    type Driver = Device;

    fn name(&self) -> &str {
        PROTOCOL
    }

    fn driver(&self, d: &DeviceConfig) -> Result<Device, DriverError> {
        let conn = d.parse_protocol(Connection::from_config)?;
        let points =
            d.parse_visitors(|p| Point::from_config(&p.visitor, p.value_type.as_deref()))?;
        Ok(Device::new(d.id(), conn, points, self.radio.clone()))
    }
}
