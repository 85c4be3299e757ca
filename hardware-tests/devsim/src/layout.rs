//! From manifests to simulated devices: each Modbus `Device` (TCP, or RTU on a serial line)
//! with its model's properties,
//! each property where its visitor says (read by the mapper's own parser, so that the simulator
//! lays a register out exactly as `mapper-modbus` reads it), and every declaration that cannot
//! work named with its field path.

use api::manifest::{Object, parse_documents};
use api::v1beta1::{Device, DeviceModel, PropertyType};
use mapper_modbus::device::{Connection, ModelHints, Point, Transport};
use std::collections::BTreeMap;

pub use crate::device::{Rtu, SimDevice, SimPoint, Visit};

/// A declaration that cannot be simulated (or read by the mapper), with where it is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {path}: {message}")]
pub struct LayoutError {
    /// `Device default/oven-1`, `document 3`.
    pub object: String,
    /// `spec.properties[temperature].visitors.configData.offset`.
    pub path: String,
    pub message: String,
}

/// Every problem found, one per line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct LayoutErrors(pub Vec<LayoutError>);

fn id(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// The Modbus TCP devices of `text` (one or more manifests, multi-document YAML), laid out.
/// Devices of other protocols are skipped; every problem found is returned together.
pub fn load(text: &str) -> Result<Vec<SimDevice>, LayoutErrors> {
    let mut errors = Vec::new();
    let mut devices: Vec<Device> = Vec::new();
    let mut models: BTreeMap<String, DeviceModel> = BTreeMap::new();
    for doc in parse_documents(text) {
        for p in doc
            .problems
            .iter()
            .filter(|p| p.severity == api::validate::Severity::Error)
        {
            errors.push(LayoutError {
                object: format!("document {} ({} {})", doc.index + 1, doc.kind, doc.name),
                path: p.path.clone(),
                message: p.message.clone(),
            });
        }
        match doc.object {
            Some(Object::Device(d)) => devices.push(*d),
            Some(Object::DeviceModel(m)) => {
                models.insert(id(&m.metadata), *m);
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for d in &devices {
        let did = id(&d.metadata);
        let object = format!("Device {did}");
        let err = |path: &str, message: String| LayoutError {
            object: object.clone(),
            path: path.to_string(),
            message,
        };
        let kind = match d.protocol_name() {
            Some(
                p @ (mapper_modbus::mapper::PROTOCOL
                | mapper_serial::mapper::PROTOCOL
                | mapper_opcua::mapper::PROTOCOL
                | mapper_ble::mapper::PROTOCOL),
            ) => p,
            _ => continue,
        };
        let ns = d.metadata.namespace.as_deref().unwrap_or("default");
        let model_name = d.model_name().unwrap_or_default();
        let Some(model) = models.get(&format!("{ns}/{model_name}")) else {
            errors.push(err(
                "spec.deviceModelRef.name",
                format!("model {ns}/{model_name} is not in the manifests"),
            ));
            continue;
        };
        // The gateway's own checks first: what edgecore would refuse is not simulated.
        let refused: Vec<_> = api::validate::validate_model(model)
            .into_iter()
            .map(|p| (format!("DeviceModel {ns}/{model_name}"), p))
            .chain(
                api::validate::validate_device(d, Some(model))
                    .into_iter()
                    .chain(api::validate::validate_config_data(d, Some(model)))
                    .map(|p| (object.clone(), p)),
            )
            .filter(|(_, p)| p.is_error())
            .collect();
        // Properties already named are not laid out (one message per mistake).
        let named: Vec<String> = refused.iter().map(|(_, p)| p.path.clone()).collect();
        let fatal = refused
            .iter()
            .any(|(_, p)| !p.path.starts_with("spec.properties["));
        errors.extend(refused.into_iter().map(|(object, p)| LayoutError {
            object,
            path: p.path,
            message: p.message,
        }));
        if fatal {
            continue;
        }
        let device = api::merge::effective_device(d, model);
        let config = device
            .spec
            .protocol
            .as_ref()
            .and_then(|p| p.config_data.as_ref())
            .map(|c| c.0.clone())
            .unwrap_or_default();
        let own = match kind {
            mapper_serial::mapper::PROTOCOL => Some(crate::serial::layout as Layout),
            mapper_opcua::mapper::PROTOCOL => Some(crate::opcua::layout as Layout),
            mapper_ble::mapper::PROTOCOL => Some(crate::ble::layout as Layout),
            _ => None,
        };
        if let Some(layout) = own {
            match layout(&did, &device, model, &config, &named) {
                Ok(sd) => out.push(sd),
                Err(e) => errors.extend(
                    e.into_iter()
                        .map(|(path, message): (String, String)| err(&path, message)),
                ),
            }
            continue;
        }
        let (address, unit, rtu) = match Connection::from_config(&config) {
            Ok(c) => match c.transport {
                Transport::Tcp { address } => (address, c.slave, None),
                Transport::Rtu(serial) => (
                    String::new(),
                    c.slave,
                    Some(Rtu {
                        port: serial.path,
                        slave: c.slave,
                        baud_rate: serial.baud_rate,
                    }),
                ),
            },
            Err(e) => {
                errors.push(err(
                    &format!("spec.protocol.configData.{}", e.key),
                    e.reason,
                ));
                continue;
            }
        };
        let mut points: Vec<SimPoint> = Vec::new();
        let mut missing = Vec::new();
        let visited = crate::device::properties(&device, model, &named, &mut missing);
        errors.extend(
            missing
                .into_iter()
                .map(|(path, message)| err(&path, message)),
        );
        for (at, p, mp, visitor) in visited {
            let num = |s: Option<&String>| s.and_then(|v| v.trim().parse::<f64>().ok());
            let hints = ModelHints {
                value_type: mp.and_then(|m| m.type_).map(|t| t.as_str().to_string()),
                minimum: num(mp.and_then(|m| m.minimum.as_ref())),
                maximum: num(mp.and_then(|m| m.maximum.as_ref())),
            };
            let point = match Point::from_config(&p.name, visitor, &hints) {
                Ok(pt) => pt,
                Err(e) => {
                    errors.push(err(
                        &format!("{at}.visitors.configData.{}", e.key),
                        e.reason,
                    ));
                    continue;
                }
            };
            // Not the desired value: a device starts where it starts, and the mapper must write
            // the desired value for it to land (a scenario's `constant` sets a start value).
            let initial = default_value(&point, mp.and_then(|m| m.type_));
            points.push(SimPoint::of(p, mp, initial, Visit::Modbus(point)));
        }
        out.push(SimDevice {
            id: did,
            address,
            unit,
            rtu,
            serial: None,
            opcua: None,
            ble: None,
            points,
        });
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(LayoutErrors(errors))
    }
}

/// How the devices of a protocol other than Modbus are laid out.
type Layout = fn(
    &str,
    &Device,
    &DeviceModel,
    &serde_json::Map<String, serde_json::Value>,
    &[String],
) -> Result<SimDevice, Vec<(String, String)>>;

fn default_value(point: &Point, ty: Option<PropertyType>) -> String {
    use mapper_modbus::codec::DataType;
    match point.codec.data_type {
        DataType::Bool => "false".into(),
        DataType::String => String::new(),
        _ if ty == Some(PropertyType::String) => String::new(),
        _ => "0".into(),
    }
}

/// Whether two properties claim the same registers or bits (two bits of one register do not).
pub(crate) fn overlaps(a: &Point, b: &Point) -> bool {
    if a.read.table != b.read.table {
        return false;
    }
    let (a0, a1) = (
        u32::from(a.read.address),
        u32::from(a.read.address) + u32::from(a.read.count),
    );
    let (b0, b1) = (
        u32::from(b.read.address),
        u32::from(b.read.address) + u32::from(b.read.count),
    );
    if a0 >= b1 || b0 >= a1 {
        return false;
    }
    !matches!((a.codec.bit, b.codec.bit), (Some(x), Some(y)) if x != y && a.read.count == 1 && b.read.count == 1)
}

#[cfg(test)]
mod tests {
    //! Golden register maps: each value's words worked out by hand (two's complement, IEEE 754,
    //! the byte orders' definitions), not by the mapper's codec, so that a bug in the mapper's
    //! own parsing or encoding, which devsim shares, cannot hide here.
    use super::*;
    use crate::run::{hold, value_of};
    use sim::modbus_sim::State;

    fn manifest(visitors: &[(&str, &str, &str)]) -> String {
        let mut model = String::from(
            "apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata: {name: m, namespace: default}\nspec:\n  protocol: modbus\n  properties:\n",
        );
        let mut device = String::from(
            "---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: d, namespace: default}\nspec:\n  deviceModelRef: {name: m}\n  protocol:\n    protocolName: modbus\n    configData: {ip: 127.0.0.1, port: 5020}\n  properties:\n",
        );
        for (name, ty, visitor) in visitors {
            model.push_str(&format!("    - {{name: {name}, type: {ty}}}\n"));
            device.push_str(&format!(
                "    - name: {name}\n      visitors:\n        protocolName: modbus\n        configData: {visitor}\n"
            ));
        }
        model + &device
    }

    /// Lays `visitors` out, holds each value, and gives each property's holding words.
    fn held(cases: &[(&str, &str, &str, &str)]) -> (State, Vec<SimPoint>) {
        let text = manifest(
            &cases
                .iter()
                .map(|(n, t, v, _)| (*n, *t, *v))
                .collect::<Vec<_>>(),
        );
        let devices = load(&text).expect("laid out");
        let points = devices.into_iter().next().expect("one device").points;
        let mut state = State::default();
        for (name, _, _, value) in cases {
            let p = points.iter().find(|p| p.name == *name).expect("its point");
            hold(&mut state, p, None, value).expect("held");
        }
        (state, points)
    }

    fn words(state: &State, from: u16, n: u16) -> Vec<u16> {
        (from..from + n)
            .map(|a| state.holding.get(&a).copied().unwrap_or(0))
            .collect()
    }

    #[test]
    fn sixty_four_bit_integers_are_laid_out_exactly_beyond_a_doubles_precision() {
        let cases = [
            (
                "max",
                "INT",
                "{register: HoldingRegister, offset: 0, dataType: uint64}",
                "18446744073709551615",
            ),
            // 2^53 + 1: a double would make it 2^53.
            (
                "odd",
                "INT",
                "{register: HoldingRegister, offset: 4, dataType: uint64}",
                "9007199254740993",
            ),
            (
                "neg",
                "INT",
                "{register: HoldingRegister, offset: 8, dataType: int64}",
                "-2",
            ),
            (
                "swapped",
                "INT",
                "{register: HoldingRegister, offset: 12, dataType: uint64, byteOrder: DCBA}",
                "1",
            ),
        ];
        let (state, points) = held(&cases);
        assert_eq!(words(&state, 0, 4), [0xFFFF; 4]);
        assert_eq!(words(&state, 4, 4), [0x0020, 0x0000, 0x0000, 0x0001]);
        assert_eq!(words(&state, 8, 4), [0xFFFF, 0xFFFF, 0xFFFF, 0xFFFE]);
        // DCBA: the bytes reversed, 00..01 becomes 01 00 | 00 00 | 00 00 | 00 00.
        assert_eq!(words(&state, 12, 4), [0x0100, 0x0000, 0x0000, 0x0000]);
        for (name, _, _, value) in cases {
            let p = points.iter().find(|p| p.name == name).expect("its point");
            assert_eq!(
                value_of(&state, p).as_deref(),
                Some(value),
                "{name} read back"
            );
        }
    }

    #[test]
    fn thirty_two_bit_values_in_each_byte_order_and_scaled_sixteen_bit_ones() {
        let cases = [
            // 21.5 as IEEE 754 single: 0x41AC0000.
            (
                "f-abcd",
                "FLOAT",
                "{register: HoldingRegister, offset: 0, dataType: float32}",
                "21.5",
            ),
            (
                "f-cdab",
                "FLOAT",
                "{register: HoldingRegister, offset: 2, dataType: float32, isRegisterSwap: true}",
                "21.5",
            ),
            // -100000 as int32: 0xFFFE7960.
            (
                "i-badc",
                "INT",
                "{register: HoldingRegister, offset: 4, dataType: int32, isSwap: true}",
                "-100000",
            ),
            // 35.8 with scale 0.1 is the register 358 (0x0166).
            (
                "scaled",
                "FLOAT",
                "{register: HoldingRegister, offset: 6, limit: 1, scale: 0.1}",
                "35.8",
            ),
        ];
        let (state, _) = held(&cases);
        assert_eq!(words(&state, 0, 2), [0x41AC, 0x0000]);
        assert_eq!(words(&state, 2, 2), [0x0000, 0x41AC]);
        assert_eq!(words(&state, 4, 2), [0xFEFF, 0x6079]);
        assert_eq!(words(&state, 6, 1), [0x0166]);
    }

    #[test]
    fn properties_on_the_same_registers_are_views_of_them() {
        // The mapper reads both (one int32, and its low register as an int16): so does devsim.
        let text = manifest(&[
            (
                "a",
                "INT",
                "{register: HoldingRegister, offset: 0, dataType: int32}",
            ),
            (
                "b",
                "INT",
                "{register: HoldingRegister, offset: 1, dataType: int16}",
            ),
        ]);
        let devices = load(&text).expect("views of the same registers are valid");
        let points = &devices[0].points;
        assert_eq!(points.len(), 2);
        let mut state = State::default();
        hold(&mut state, &points[0], None, "-2").expect("held");
        assert_eq!(value_of(&state, &points[1]).as_deref(), Some("-2"));
        hold(&mut state, &points[1], None, "7").expect("held");
        assert_eq!(value_of(&state, &points[0]).as_deref(), Some("-65529"));
    }
}
