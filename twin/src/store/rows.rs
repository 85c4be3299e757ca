//! Rows of the tables read back into the twin model, and the integer conversions SQLite needs.

use crate::model::{OutboxEntry, PropertyTwin, Section, TwinValue, Version};
use api::paths::DeviceId;
use api::v1beta1::PropertyType;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use std::collections::BTreeMap;

use super::{Result, StoreError};

pub(super) fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(super) fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

pub(super) fn property_type(s: &str) -> Result<PropertyType> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).map_err(|_| {
        StoreError::Corrupt {
            what: "property type",
            value: s.to_string(),
        }
    })
}

/// The properties of one device as `load_twins` reads them: SQLite makes each row of `twin`
/// (its [`TWIN_COLUMNS`](super::schema::TWIN_COLUMNS) after `device_id`, in that order) a JSON
/// array, and a device's rows one array of those ([`properties_json`]). One column per device
/// instead of 24 per property: the driver's per-value cost was most of a start's time (10,000
/// properties: ~85 of 100 ms).
#[derive(serde::Deserialize)]
struct PropertyColumns(
    String,
    String,
    i64,
    i64,
    Option<String>,
    Option<String>,
    Option<i64>,
    i64,
    i64,
    Option<String>,
    Option<i64>,
    i64,
    i64,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<String>,
);

/// The SQL expression of a device's properties as [`properties_from_json`] reads them, for a
/// query whose device table is named `device`.
pub(super) fn properties_json() -> String {
    let columns = super::schema::TWIN_COLUMNS
        .split(", ")
        .skip(1)
        .map(|c| format!("t.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "(SELECT json_group_array(json_array({columns})) FROM twin t WHERE t.device_id = device.id)"
    )
}

/// The properties of one device from [`properties_json`]'s text, each put in the map as it is
/// read (no list of rows first: a start reads every device, and lists made and dropped between
/// the twins' long-lived allocations left the heap fragmented).
pub(super) fn properties_from_json(json: &str) -> Result<BTreeMap<String, PropertyTwin>> {
    use serde::de::{DeserializeSeed, Deserializer, SeqAccess, Visitor};
    struct Properties;
    impl<'de> Visitor<'de> for Properties {
        type Value = BTreeMap<String, PropertyTwin>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array of twin rows")
        }
        fn visit_seq<A: SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(r) = seq.next_element::<PropertyColumns>()? {
                let (name, property) = property(r).map_err(serde::de::Error::custom)?;
                out.insert(name, property);
            }
            Ok(out)
        }
    }
    impl<'de> DeserializeSeed<'de> for Properties {
        type Value = BTreeMap<String, PropertyTwin>;
        fn deserialize<D: Deserializer<'de>>(
            self,
            d: D,
        ) -> std::result::Result<Self::Value, D::Error> {
            d.deserialize_seq(self)
        }
    }
    let mut de = serde_json::Deserializer::from_str(json);
    Properties
        .deserialize(&mut de)
        .and_then(|m| de.end().map(|()| m))
        .map_err(|e| StoreError::Corrupt {
            what: "twin row",
            value: e.to_string(),
        })
}

fn property(r: PropertyColumns) -> Result<(String, PropertyTwin)> {
    let at = |value: Option<String>, ts: Option<i64>| {
        value.map(|value| TwinValue {
            value,
            timestamp: ts.unwrap_or(0),
        })
    };
    Ok((
        r.0,
        PropertyTwin {
            value_type: property_type(&r.1)?,
            optional: r.2 != 0,
            writable: r.3 != 0,
            spec_desired: r.4,
            desired: at(r.5, r.6),
            desired_version: Version {
                cloud: u(r.7),
                edge: u(r.8),
            },
            reported: at(r.9, r.10),
            reported_version: Version {
                cloud: u(r.11),
                edge: u(r.12),
            },
            observed_desired: at(r.13, r.14),
            minimum: r.15,
            maximum: r.16,
            error: at(r.17, r.18),
            write_error: at(r.19, r.20),
            unit: r.21,
            refused: r.22,
            last_read: Default::default(),
        },
    ))
}

pub(super) fn outbox_from_row(r: &SqliteRow) -> Result<OutboxEntry> {
    let device_id: String = r.try_get(0)?;
    let id = DeviceId::parse(&device_id).ok_or_else(|| StoreError::Corrupt {
        what: "device id",
        value: device_id.clone(),
    })?;
    let section: String = r.try_get(2)?;
    Ok(OutboxEntry {
        namespace: id.namespace,
        name: id.name,
        property: r.try_get(1)?,
        section: Section::parse(&section).ok_or(StoreError::Corrupt {
            what: "outbox section",
            value: section,
        })?,
        value: r.try_get(3)?,
        version: Version {
            cloud: u(r.try_get(4)?),
            edge: u(r.try_get(5)?),
        },
        timestamp: r.try_get(6)?,
        seq: u(r.try_get(7)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_out_of_sqlites_range_saturate_instead_of_wrapping() {
        assert_eq!(i(u64::MAX), i64::MAX);
        assert_eq!(i(7), 7);
        assert_eq!(u(-1), 0);
        assert_eq!(u(7), 7);
    }

    #[test]
    fn a_stored_property_type_is_read_back_and_garbage_is_named_as_corrupt() {
        assert_eq!(
            property_type("INT").ok(),
            Some(PropertyType::Int),
            "as manifests spell it"
        );
        let e = property_type("integer!").expect_err("not a type");
        assert!(
            matches!(&e, StoreError::Corrupt { what: "property type", value } if value == "integer!"),
            "{e}"
        );
    }
}
