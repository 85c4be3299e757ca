//! A device as the twin is told it: its properties with their types, access and desired
//! values, from a `Device` and its `DeviceModel`.

use super::*;

/// A property as a device declares it.
#[derive(Clone, Debug, PartialEq)]
pub struct PropertyDecl {
    pub name: String,
    pub value_type: PropertyType,
    pub writable: bool,
    /// `spec.properties[].desired.value`.
    pub desired: Option<String>,
    /// The model's `minimum` and `maximum` (numeric properties).
    pub minimum: Option<String>,
    pub maximum: Option<String>,
    /// The model's `unit`.
    pub unit: Option<String>,
}

/// A device as its manifest declares it: what membership needs.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceDecl {
    pub id: DeviceId,
    pub description: String,
    pub model: String,
    pub protocol: String,
    pub properties: Vec<PropertyDecl>,
}

impl DeviceDecl {
    /// The declaration of a device, with property types and access modes from its model.
    pub fn from_device(device: &Device, model: Option<&DeviceModel>) -> Self {
        let id = DeviceId::new(
            api::v1beta1::namespace_of(&device.metadata),
            device.metadata.name.clone().unwrap_or_default(),
        );
        let properties = device
            .spec
            .properties
            .iter()
            .map(|p| {
                let mp = model.and_then(|m| m.property(&p.name));
                PropertyDecl {
                    name: p.name.clone(),
                    value_type: mp.and_then(|m| m.type_).unwrap_or(PropertyType::String),
                    writable: mp.and_then(|m| m.access_mode) != Some(AccessMode::ReadOnly),
                    desired: p.desired.as_ref().map(|d| d.value.clone()),
                    minimum: mp
                        .and_then(|m| m.minimum.clone())
                        .filter(|v| !v.trim().is_empty()),
                    maximum: mp
                        .and_then(|m| m.maximum.clone())
                        .filter(|v| !v.trim().is_empty()),
                    unit: mp
                        .and_then(|m| m.unit.clone())
                        .filter(|v| !v.trim().is_empty()),
                }
            })
            .collect();
        Self {
            id,
            description: String::new(),
            model: device.model_name().unwrap_or_default().to_string(),
            protocol: device.protocol_name().unwrap_or_default().to_string(),
            properties,
        }
    }
}
