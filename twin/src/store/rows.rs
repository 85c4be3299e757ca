//! Rows of the tables read back into the twin model, and the integer conversions SQLite needs.

use crate::model::{OutboxEntry, PropertyTwin, Section, TwinValue, Version};
use api::paths::DeviceId;
use api::v1beta1::PropertyType;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::{Result, StoreError};

pub(super) fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(super) fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

pub(super) fn value_at(r: &SqliteRow, value: usize, ts: usize) -> Result<Option<TwinValue>> {
    let v: Option<String> = r.try_get(value)?;
    let t: Option<i64> = r.try_get(ts)?;
    Ok(v.map(|value| TwinValue {
        value,
        timestamp: t.unwrap_or(0),
    }))
}

pub(super) fn property_type(s: &str) -> Result<PropertyType> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).map_err(|_| {
        StoreError::Corrupt {
            what: "property type",
            value: s.to_string(),
        }
    })
}

pub(super) fn property_from_row(r: &SqliteRow) -> Result<PropertyTwin> {
    let ty: String = r.try_get(2)?;
    Ok(PropertyTwin {
        value_type: property_type(&ty)?,
        optional: r.try_get(3)?,
        writable: r.try_get(4)?,
        spec_desired: r.try_get(5)?,
        desired: value_at(r, 6, 7)?,
        desired_version: Version {
            cloud: u(r.try_get(8)?),
            edge: u(r.try_get(9)?),
        },
        reported: value_at(r, 10, 11)?,
        reported_version: Version {
            cloud: u(r.try_get(12)?),
            edge: u(r.try_get(13)?),
        },
        observed_desired: value_at(r, 14, 15)?,
        minimum: r.try_get(16)?,
        maximum: r.try_get(17)?,
        error: value_at(r, 18, 19)?,
        write_error: value_at(r, 20, 21)?,
        unit: r.try_get(22)?,
        refused: r.try_get(23)?,
        last_read: Default::default(),
    })
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
