//! The effective device: a `Device` with the defaults of its `DeviceModel` merged in, which is what
//! every consumer (DMI, mappers, validation of visitors) works with.
//!
//! Rules, as KubeEdge v1.22+ applies them: a property's visitor starts from the model property's
//! `visitors` and the device's `configData` keys override it key by key; `spec.protocol` starts
//! from the model's `protocol` and `protocolConfigData`, likewise overridden key by key by the
//! device. Only the device's own properties are in the result.

use crate::v1beta1::{CustomizedValue, Device, DeviceModel, ProtocolConfig};

/// `base` overridden key by key by `over`; `None` when both are absent.
fn overlay(
    base: Option<&CustomizedValue>,
    over: Option<CustomizedValue>,
) -> Option<CustomizedValue> {
    match (base, over) {
        (None, None) => None,
        (Some(b), None) => Some(b.clone()),
        (None, Some(o)) => Some(o),
        (Some(b), Some(o)) => {
            let mut merged = b.0.clone();
            merged.extend(o.0);
            Some(CustomizedValue(merged))
        }
    }
}

fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

fn merge_config(
    base_name: Option<&str>,
    base: Option<&CustomizedValue>,
    own: Option<ProtocolConfig>,
) -> Option<ProtocolConfig> {
    let had_own = own.is_some();
    let (own_name, own_data) = own.map_or((None, None), |o| (o.protocol_name, o.config_data));
    let name = own_name
        .filter(|n| !n.is_empty())
        .or_else(|| non_empty(base_name).map(str::to_string));
    let data = overlay(base, own_data);
    if name.is_none() && data.is_none() && !had_own {
        return None;
    }
    Some(ProtocolConfig {
        protocol_name: name,
        config_data: data,
    })
}

/// The device with the model's defaults merged in. `model` should be the device's model; the
/// function does not check that it is.
pub fn effective_device(device: &Device, model: &DeviceModel) -> Device {
    into_effective(device.clone(), model)
}

/// [`effective_device`] of a device the caller no longer needs (no copy of it is made).
pub fn into_effective(mut device: Device, model: &DeviceModel) -> Device {
    let own = device.spec.protocol.take();
    device.spec.protocol = merge_config(
        model.spec.protocol.as_deref(),
        model.spec.protocol_config_data.as_ref(),
        own,
    );
    for prop in &mut device.spec.properties {
        let Some(model_visitor) = model
            .property(&prop.name)
            .and_then(|mp| mp.visitors.as_ref())
        else {
            continue;
        };
        let own = prop.visitors.take();
        prop.visitors = merge_config(
            model_visitor.protocol_name.as_deref(),
            model_visitor.config_data.as_ref(),
            own,
        );
    }
    device
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).expect("test object parses")
    }

    fn model() -> DeviceModel {
        parse(json!({
            "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
            "metadata": {"name": "m"},
            "spec": {
                "protocol": "modbus",
                "protocolConfigData": {"ip": "10.0.0.1", "port": 502, "slaveID": 1},
                "properties": [
                    {"name": "temp", "type": "INT", "visitors": {"protocolName": "modbus",
                        "configData": {"register": "HoldingRegister", "offset": 2, "limit": 1, "scale": 0.1}}},
                    {"name": "fan", "type": "BOOLEAN"}
                ]
            }
        }))
    }

    #[test]
    fn instance_keys_override_model_defaults_key_by_key() {
        let device: Device = parse(json!({
            "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
            "metadata": {"name": "d"},
            "spec": {
                "deviceModelRef": {"name": "m"},
                "protocol": {"configData": {"ip": "192.168.1.7"}},
                "properties": [
                    {"name": "temp", "visitors": {"configData": {"offset": 7}}},
                    {"name": "fan", "visitors": {"protocolName": "modbus", "configData": {"register": "CoilRegister", "offset": 1}}}
                ]
            }
        }));
        let eff = effective_device(&device, &model());
        let proto = eff.spec.protocol.expect("protocol merged");
        assert_eq!(proto.protocol_name.as_deref(), Some("modbus"));
        assert_eq!(
            serde_json::to_value(proto.config_data).expect("json"),
            json!({"ip": "192.168.1.7", "port": 502, "slaveID": 1})
        );
        let temp = eff.spec.properties[0]
            .visitors
            .clone()
            .expect("visitor merged");
        assert_eq!(temp.protocol_name.as_deref(), Some("modbus"));
        assert_eq!(
            serde_json::to_value(temp.config_data).expect("json"),
            json!({"register": "HoldingRegister", "offset": 7, "limit": 1, "scale": 0.1})
        );
        // A property without a model visitor keeps its own unchanged.
        assert_eq!(eff.spec.properties[1], device.spec.properties[1]);
    }

    #[test]
    fn a_device_without_its_own_config_gets_the_model_defaults() {
        let device: Device = parse(json!({
            "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
            "metadata": {"name": "d"},
            "spec": {"deviceModelRef": {"name": "m"}, "properties": [{"name": "temp"}]}
        }));
        let eff = effective_device(&device, &model());
        assert_eq!(eff.protocol_name(), Some("modbus"));
        let v = eff.spec.properties[0]
            .visitors
            .as_ref()
            .and_then(|v| v.config_data.as_ref());
        assert_eq!(v.and_then(|c| c.get("offset")), Some(&json!(2)));
        // The original is untouched.
        assert!(device.spec.protocol.is_none());
    }
}
