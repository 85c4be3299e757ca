//! What edgecore's benchmark binaries (`bench`, `history-bench`) share: the devices they load.

use api::paths::DeviceId;
use api::v1beta1::PropertyType;
use twin::engine::{DeviceDecl, PropertyDecl};

/// The `n`th bench device, `default/dev-{n}`.
pub fn id(n: usize) -> DeviceId {
    DeviceId::new("default", format!("dev-{n}"))
}

/// Device `n` of model `m` with `props` properties `p0`.. of one type.
pub fn decl(n: usize, props: usize, value_type: PropertyType, writable: bool) -> DeviceDecl {
    DeviceDecl {
        id: id(n),
        description: String::new(),
        model: "m".into(),
        protocol: "modbus".into(),
        properties: (0..props)
            .map(|p| PropertyDecl {
                name: format!("p{p}"),
                value_type,
                writable,
                desired: None,
                minimum: None,
                maximum: None,
                unit: None,
            })
            .collect(),
    }
}
