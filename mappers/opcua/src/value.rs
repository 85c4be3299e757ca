//! Between OPC UA variants and the twin's strings.

use api::validate::names::Excerpt;
use opcua::types::{Array, DateTime, Variant, VariantScalarTypeId};
use serde_json::Value;
use std::str::FromStr;

/// A value that cannot pass between a node and the twin; each names the value and the node's
/// type.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValueError {
    #[error("the node has no value (null)")]
    Null,
    #[error("values of type {0} are not supported")]
    Unsupported(String),
    #[error("the node's value is {0}")]
    NotFinite(f64),
    #[error("{0} is not a JSON array for an array node")]
    NotArray(Excerpt),
    #[error("{0}")]
    Array(String),
    #[error("{value} is not a whole number for a {node:?} node")]
    NotWhole {
        value: Excerpt,
        node: VariantScalarTypeId,
    },
    #[error("{value} is out of range for a {node:?} node")]
    OutOfRange {
        value: i128,
        node: VariantScalarTypeId,
    },
    #[error("{0} is not a boolean (true/false)")]
    NotBoolean(Excerpt),
    #[error("{value} is not a number for a {node:?} node")]
    NotNumber {
        value: Excerpt,
        node: VariantScalarTypeId,
    },
    #[error("{0} is not an RFC 3339 time for a DateTime node")]
    NotTime(Excerpt),
    #[error("writing {0:?} nodes is not supported")]
    WriteUnsupported(VariantScalarTypeId),
}

/// The twin's string for a value read: numbers and booleans as written in JSON, strings and
/// the types read as text (DateTime, Guid, ...) as they are, without quotes, arrays as compact
/// JSON arrays. A value written as [`to_twin`] gives it reads back as the same string, so a
/// desired value's delta clears.
pub fn to_twin(v: &Variant) -> Result<String, ValueError> {
    match v {
        Variant::Empty => Err(ValueError::Null),
        other => to_json(other).map(|j| match j {
            Value::String(s) => s,
            j => j.to_string(),
        }),
    }
}

/// A DateTime as RFC 3339 in UTC with a `Z` and only the fraction digits it needs
/// (`2024-05-06T07:08:09.123Z`), the form JavaScript's `toISOString` and most apps write.
fn datetime(d: &DateTime) -> String {
    d.as_chrono().format("%Y-%m-%dT%H:%M:%S%.fZ").to_string()
}

fn to_json(v: &Variant) -> Result<Value, ValueError> {
    Ok(match v {
        Variant::Boolean(b) => Value::Bool(*b),
        Variant::SByte(n) => Value::from(*n),
        Variant::Byte(n) => Value::from(*n),
        Variant::Int16(n) => Value::from(*n),
        Variant::UInt16(n) => Value::from(*n),
        Variant::Int32(n) => Value::from(*n),
        Variant::UInt32(n) => Value::from(*n),
        Variant::Int64(n) => Value::from(*n),
        Variant::UInt64(n) => Value::from(*n),
        Variant::Float(f) => float(f64::from(*f), &f.to_string())?,
        Variant::Double(f) => float(*f, &f.to_string())?,
        Variant::String(s) => Value::String(s.as_ref().to_string()),
        Variant::DateTime(d) => Value::String(datetime(d)),
        Variant::Guid(g) => Value::String(g.to_string()),
        Variant::StatusCode(s) => Value::String(s.to_string()),
        Variant::ByteString(b) => Value::String(b.as_base64()),
        Variant::LocalizedText(t) => Value::String(t.text.as_ref().to_string()),
        Variant::QualifiedName(q) => Value::String(q.name.as_ref().to_string()),
        Variant::NodeId(n) => Value::String(n.to_string()),
        Variant::Array(a) => Value::Array(a.values.iter().map(to_json).collect::<Result<_, _>>()?),
        Variant::Empty => Value::Null,
        other => {
            return Err(ValueError::Unsupported(format!(
                "{:?}",
                other.scalar_type_id()
            )));
        }
    })
}

/// A float as JSON: its shortest text (`f32` 0.1 stays "0.1", not 0.10000000149011612).
fn float(f: f64, text: &str) -> Result<Value, ValueError> {
    if !f.is_finite() {
        return Err(ValueError::NotFinite(f));
    }
    Ok(serde_json::from_str(text).unwrap_or(Value::Null))
}

/// The variant to write for the twin's string `s` as type `t`; `array` when the node holds an
/// array (the string is then a JSON array).
pub fn from_twin(s: &str, t: VariantScalarTypeId, array: bool) -> Result<Variant, ValueError> {
    if array {
        let items: Vec<Value> =
            serde_json::from_str(s.trim()).map_err(|_| ValueError::NotArray(Excerpt::of(s)))?;
        let values = items
            .iter()
            .map(|v| match v {
                Value::String(s) => scalar(s, t),
                other => scalar(&other.to_string(), t),
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Array::new(t, values)
            .map(|a| Variant::Array(Box::new(a)))
            .map_err(|e| ValueError::Array(e.to_string()));
    }
    scalar(s, t)
}

fn scalar(s: &str, t: VariantScalarTypeId) -> Result<Variant, ValueError> {
    let s = s.trim_matches(|c: char| c.is_whitespace());
    let int = |s: &str| -> Result<i128, ValueError> {
        if let Ok(v) = s.parse::<i128>() {
            return Ok(v);
        }
        // "12.0" from a twin that carries integers as floats.
        match s.parse::<f64>() {
            Ok(f) if f.fract() == 0.0 && f.abs() < 1e30 => Ok(f as i128),
            _ => Err(ValueError::NotWhole {
                value: Excerpt::of(s),
                node: t,
            }),
        }
    };
    macro_rules! ranged {
        ($ty:ty, $variant:ident) => {{
            let v = int(s)?;
            <$ty>::try_from(v)
                .map(Variant::$variant)
                .map_err(|_| ValueError::OutOfRange { value: v, node: t })
        }};
    }
    match t {
        VariantScalarTypeId::Boolean => match s.to_ascii_lowercase().as_str() {
            "true" | "1" => Ok(Variant::Boolean(true)),
            "false" | "0" => Ok(Variant::Boolean(false)),
            _ => Err(ValueError::NotBoolean(Excerpt::of(s))),
        },
        VariantScalarTypeId::SByte => ranged!(i8, SByte),
        VariantScalarTypeId::Byte => ranged!(u8, Byte),
        VariantScalarTypeId::Int16 => ranged!(i16, Int16),
        VariantScalarTypeId::UInt16 => ranged!(u16, UInt16),
        VariantScalarTypeId::Int32 => ranged!(i32, Int32),
        VariantScalarTypeId::UInt32 => ranged!(u32, UInt32),
        VariantScalarTypeId::Int64 => ranged!(i64, Int64),
        VariantScalarTypeId::UInt64 => ranged!(u64, UInt64),
        VariantScalarTypeId::Float => match s.parse::<f32>() {
            Ok(f) if f.is_finite() => Ok(Variant::Float(f)),
            _ => Err(ValueError::NotNumber {
                value: Excerpt::of(s),
                node: t,
            }),
        },
        VariantScalarTypeId::Double => match s.parse::<f64>() {
            Ok(f) if f.is_finite() => Ok(Variant::Double(f)),
            _ => Err(ValueError::NotNumber {
                value: Excerpt::of(s),
                node: t,
            }),
        },
        VariantScalarTypeId::String => Ok(Variant::from(s)),
        VariantScalarTypeId::DateTime => DateTime::from_str(s)
            .map(|d| Variant::DateTime(Box::new(d)))
            .map_err(|_| ValueError::NotTime(Excerpt::of(s))),
        other => Err(ValueError::WriteUnsupported(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_to_the_twin() {
        assert_eq!(to_twin(&Variant::Double(21.5)).as_deref(), Ok("21.5"));
        assert_eq!(to_twin(&Variant::Float(0.1)).as_deref(), Ok("0.1"));
        assert_eq!(to_twin(&Variant::Int32(-7)).as_deref(), Ok("-7"));
        assert_eq!(to_twin(&Variant::Boolean(true)).as_deref(), Ok("true"));
        assert_eq!(to_twin(&Variant::from("batch 7")).as_deref(), Ok("batch 7"));
        let a = Array::new(
            VariantScalarTypeId::Int16,
            vec![Variant::Int16(1), Variant::Int16(2)],
        )
        .expect("array");
        assert_eq!(
            to_twin(&Variant::Array(Box::new(a))).as_deref(),
            Ok("[1,2]")
        );
        assert!(to_twin(&Variant::Empty).is_err());
        assert!(to_twin(&Variant::Double(f64::NAN)).is_err());
    }

    #[test]
    fn twin_strings_to_typed_variants() {
        use VariantScalarTypeId as T;
        assert_eq!(
            from_twin("120.5", T::Double, false),
            Ok(Variant::Double(120.5))
        );
        assert_eq!(from_twin("12", T::Int16, false), Ok(Variant::Int16(12)));
        assert_eq!(from_twin("12.0", T::UInt32, false), Ok(Variant::UInt32(12)));
        assert_eq!(
            from_twin("true", T::Boolean, false),
            Ok(Variant::Boolean(true))
        );
        assert_eq!(
            from_twin("70000", T::Int16, false)
                .expect_err("range")
                .to_string(),
            "70000 is out of range for a Int16 node"
        );
        assert!(from_twin("-1", T::Byte, false).is_err());
        assert!(from_twin("1.5", T::Int32, false).is_err());
        assert!(from_twin("hot", T::Double, false).is_err());
        assert!(from_twin("yes", T::Boolean, false).is_err());
        let v = from_twin("[1, 2, 3]", T::Int32, true).expect("array");
        assert_eq!(
            from_twin("2024-05-06T07:08:09.123+02:00", T::DateTime, false)
                .and_then(|v| to_twin(&v))
                .as_deref(),
            Ok("2024-05-06T05:08:09.123Z")
        );
        assert_eq!(to_twin(&v).as_deref(), Ok("[1,2,3]"));
        assert!(from_twin("1", T::Int32, true).is_err());
    }

    /// Every writable type: the twin's text written to a node reads back as the same text (a
    /// DateTime read back with quotes, `"2024-..."`, never cleared its delta).
    #[test]
    fn every_type_round_trips_its_twin_text() {
        use VariantScalarTypeId as T;
        let cases: &[(T, bool, &str)] = &[
            (T::Boolean, false, "true"),
            (T::SByte, false, "-128"),
            (T::Byte, false, "255"),
            (T::Int16, false, "-32768"),
            (T::UInt16, false, "65535"),
            (T::Int32, false, "-7"),
            (T::UInt32, false, "4294967295"),
            (T::Int64, false, "-9223372036854775808"),
            (T::UInt64, false, "18446744073709551615"),
            (T::Float, false, "0.1"),
            (T::Double, false, "21.5"),
            (T::String, false, "batch \"7\""),
            (T::DateTime, false, "2024-05-06T07:08:09.123Z"),
            (T::DateTime, false, "2024-05-06T07:08:09Z"),
            (T::Boolean, true, "[true,false]"),
            (T::Int32, true, "[1,-2,3]"),
            (T::Double, true, "[0.5,2.25]"),
            (T::String, true, "[\"a\",\"b c\"]"),
            (T::DateTime, true, "[\"2024-05-06T07:08:09.123Z\"]"),
        ];
        for (t, array, text) in cases {
            let v = from_twin(text, *t, *array).unwrap_or_else(|e| panic!("{t:?} {text}: {e}"));
            assert_eq!(to_twin(&v).as_deref(), Ok(*text), "{t:?}");
        }
    }
}
