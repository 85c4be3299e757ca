//! The simulated devices: what each is (where it is served, its points) and where each point
//! is as its mapper reads it. The protocols' layouts (`layout` for Modbus, `serial`, `opcua`,
//! `ble`) make these from manifests; `run` serves them.

use api::v1beta1::{Device, DeviceModel};
use mapper_modbus::device::Point;

/// A device to simulate.
#[derive(Clone, Debug)]
pub struct SimDevice {
    /// `namespace/name`.
    pub id: String,
    /// `host:port` from `spec.protocol.configData` (`ip`, `port`); empty on a serial line.
    pub address: String,
    /// Its unit id (`slaveID`) at that address; several devices may share an address (a
    /// gateway), each with its own.
    pub unit: u8,
    /// On a serial line (Modbus RTU): `serialPort`, the slave id, the baud rate.
    pub rtu: Option<Rtu>,
    /// A device with its own serial protocol (`mapper-serial`): its line's settings.
    pub serial: Option<mapper_serial::device::Port>,
    /// An OPC UA device (`mapper-opcua`): its server's endpoint URL (`address` is its host and
    /// port).
    pub opcua: Option<String>,
    /// A BLE device (`mapper-ble`): its MAC address and adapter.
    pub ble: Option<Ble>,
    pub points: Vec<SimPoint>,
}

/// A device as a scenario or a HIL step names it (`namespace/name`, or a name in `default`),
/// as `SimDevice::id` has it.
pub(crate) fn qualified(name: &str) -> String {
    if name.contains('/') {
        name.to_string()
    } else {
        format!("default/{name}")
    }
}

/// Why `id` is not one of `devices`, naming those there are.
pub(crate) fn no_device(id: &str, devices: &[SimDevice]) -> String {
    format!(
        "no simulated Device {id} in the manifests (they have: {})",
        devices
            .iter()
            .map(|d| d.id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Why `prop` is not a property of `d`, naming those it has.
pub(crate) fn no_property(d: &SimDevice, prop: &str) -> String {
    format!(
        "Device {} has no property {prop} (its properties: {})",
        d.id,
        d.points
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Where a Modbus RTU device is: its line and its slave id on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rtu {
    pub port: String,
    pub slave: u8,
    pub baud_rate: u32,
}

/// One property of a simulated device.
#[derive(Clone, Debug)]
pub struct SimPoint {
    pub name: String,
    /// The model's `type`: how an expected value is compared with what is read (a 64-bit
    /// integer exactly, a float within a tolerance, a string as text).
    pub kind: Option<api::v1beta1::PropertyType>,
    pub point: Visit,
    /// The value it holds at the start: zero, `false` or an empty string (a scenario's
    /// behaviour takes over from its first tick).
    pub initial: String,
    /// The model's `accessMode` is not `ReadOnly`.
    pub writable: bool,
}

impl SimPoint {
    /// The device's property `p` at `point`, typed and made writable as its model's `mp` says.
    pub(crate) fn of(
        p: &api::v1beta1::DeviceProperty,
        mp: Option<&api::v1beta1::ModelProperty>,
        initial: String,
        point: Visit,
    ) -> SimPoint {
        SimPoint {
            name: p.name.clone(),
            kind: mp.and_then(|m| m.type_),
            initial,
            writable: mp.and_then(|m| m.access_mode) != Some(api::v1beta1::AccessMode::ReadOnly),
            point,
        }
    }
}

impl SimDevice {
    /// Where a Modbus device answers (`unit 1 at host:502`, `slave 3 on /dev/ttyUSB0`): devices
    /// at one place are views of one unit and share its registers. `None` for other protocols.
    pub fn modbus_place(&self) -> Option<String> {
        if self.serial.is_some() || self.opcua.is_some() || self.ble.is_some() {
            return None;
        }
        Some(match &self.rtu {
            Some(r) => format!("slave {} on {}", r.slave, r.port),
            None => format!("unit {} at {}", self.unit, self.address),
        })
    }

    /// A device with `points` and nowhere yet (the caller says where: `address`, `rtu`, ...).
    pub fn bare(id: &str, points: Vec<SimPoint>) -> Self {
        Self {
            id: id.to_string(),
            address: String::new(),
            unit: 0,
            rtu: None,
            serial: None,
            opcua: None,
            ble: None,
            points,
        }
    }
}

/// Where a property is, as its mapper reads it.
#[derive(Clone, Debug)]
pub enum Visit {
    /// Registers or bits (`mapper-modbus`).
    Modbus(Point),
    /// Its part of a reply on a serial line (`mapper-serial`).
    Serial(mapper_serial::device::Point),
    /// A variable of an OPC UA server (`mapper-opcua`), of its type.
    OpcUa(
        mapper_opcua::config::Point,
        opcua::types::VariantScalarTypeId,
    ),
    /// Its part of a GATT characteristic (`mapper-ble`).
    Ble(mapper_ble::config::Point),
}

/// Where a BLE device is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ble {
    /// Its MAC address, upper case.
    pub address: String,
    pub adapter: String,
}

/// A property to lay out: its path (`spec.properties[i]`), the device's property, the model's,
/// and its visitor's `configData`.
pub(crate) type Visited<'a> = (
    String,
    &'a api::v1beta1::DeviceProperty,
    Option<&'a api::v1beta1::ModelProperty>,
    &'a serde_json::Map<String, serde_json::Value>,
);

/// Each property of `device` to lay out: those not already `named` (by the gateway's
/// validators) and with a visitor; one without is added to `errors` with its path.
pub(crate) fn properties<'a>(
    device: &'a Device,
    model: &'a DeviceModel,
    named: &[String],
    errors: &mut Vec<(String, String)>,
) -> Vec<Visited<'a>> {
    let mut out = Vec::new();
    for (i, p) in device.spec.properties.iter().enumerate() {
        let at = format!("spec.properties[{i}]");
        if named
            .iter()
            .any(|n| n == &at || n.starts_with(&format!("{at}.")))
        {
            continue;
        }
        let Some(visitor) = p
            .visitors
            .as_ref()
            .and_then(|v| v.config_data.as_ref())
            .map(|c| &c.0)
        else {
            errors.push((
                format!("{at}.visitors"),
                "no visitor: the mapper cannot read it".to_string(),
            ));
            continue;
        };
        let mp = model.spec.properties.iter().find(|m| m.name == p.name);
        out.push((at, p, mp, visitor));
    }
    out
}
