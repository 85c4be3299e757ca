//! A BLE device's configuration read from KubeEdge `configData`: the [`Connection`] from
//! `spec.protocol.configData`, a [`Point`] (a GATT characteristic and how to decode it) from each
//! property's `visitors.configData`.

use api::validate::names::Excerpt;
use mapper_sdk::configdata::{ConfigError, bad, get, integer, text};
use mapper_sdk::field::{Field, FieldError, Kind, hex, parse_hex};
use serde_json::{Map, Value};
use std::time::Duration;
use uuid::Uuid;

/// A configured name that is not what its key takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{0} is not a Bluetooth address like C4:7C:8D:6A:12:34")]
    Address(Excerpt),
    #[error("{0} is not a UUID (give 128 bits, or the 16-bit short form like 2A6E)")]
    Uuid(Excerpt),
}

/// A value that does not pass between a characteristic's bytes and the twin's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error(transparent)]
    Field(#[from] FieldError),
    #[error("bytes {start} to {end} are past the end of the {len}-byte value")]
    PastEnd {
        start: usize,
        end: usize,
        len: usize,
    },
    #[error("{0} is not UTF-8")]
    NotUtf8(String),
    #[error("{value} is not one of dataWrite's values {known:?}")]
    NotInDataWrite { value: Excerpt, known: Vec<String> },
    #[error("{0} is not true or false")]
    NotBool(Excerpt),
    #[error("{value} is longer than {max} bytes")]
    TooLong { value: Excerpt, max: usize },
}

/// Which peripheral, and how long to wait for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Connection {
    /// `macAddress` (or `address`), upper case.
    pub address: Option<String>,
    /// `localName` (or `name`): the name the device advertises.
    pub name: Option<String>,
    /// `adapter` (`hci0`); the first adapter when not given.
    pub adapter: Option<String>,
    /// `scanTimeout`: how long to look for the device before it is called offline.
    pub scan_timeout: Duration,
    /// `connectTimeout`: how long a connection (with service discovery) may take.
    pub connect_timeout: Duration,
    /// `timeout`: how long one GATT read or write may take.
    pub timeout: Duration,
}

fn millis(c: &Map<String, Value>, key: &str, default: u64) -> Result<Duration, ConfigError> {
    match integer::<u64>(c, key)? {
        Some(0) => Err(bad(key, "0 ms would never succeed")),
        Some(ms) => Ok(Duration::from_millis(ms)),
        None => Ok(Duration::from_millis(default)),
    }
}

/// `text` of the first of `keys` given, with the key it was found under.
fn either(c: &Map<String, Value>, keys: &[&'static str]) -> Option<(&'static str, String)> {
    keys.iter()
        .find_map(|k| text(c, k).map(|v| (*k, v.trim().to_string())))
        .filter(|(_, v)| !v.is_empty())
}

/// `AA:BB:CC:DD:EE:FF` (also with `-`), upper case, or why not.
pub fn mac_address(s: &str) -> Result<String, NameError> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    let ok = parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()));
    if ok {
        Ok(parts.join(":").to_ascii_uppercase())
    } else {
        Err(NameError::Address(Excerpt::of(s)))
    }
}

impl Connection {
    pub fn from_config(c: &Map<String, Value>) -> Result<Self, ConfigError> {
        let address = match either(c, &["macAddress", "address"]) {
            Some((key, a)) => Some(mac_address(&a).map_err(|e| bad(key, e))?),
            None => None,
        };
        let name = either(c, &["localName", "name"]).map(|(_, n)| n);
        if address.is_none() && name.is_none() {
            return Err(bad(
                "macAddress",
                "missing: give the device's macAddress or the localName it advertises",
            ));
        }
        Ok(Self {
            address,
            name,
            adapter: either(c, &["adapter"]).map(|(_, a)| a),
            scan_timeout: millis(c, "scanTimeout", 10_000)?,
            connect_timeout: millis(c, "connectTimeout", 10_000)?,
            timeout: millis(c, "timeout", 5_000)?,
        })
    }

    /// How the device is named in messages: its address, else its name.
    pub fn target(&self) -> String {
        match (&self.address, &self.name) {
            (Some(a), Some(n)) => format!("{a} ({n:?})"),
            (Some(a), None) => a.clone(),
            (None, Some(n)) => format!("the device advertising {n:?}"),
            (None, None) => "the device".into(),
        }
    }
}

/// The Bluetooth base UUID, which a 16- or 32-bit UUID fills in.
const BASE: u128 = 0x0000_0000_0000_1000_8000_0080_5f9b_34fb;

/// A UUID in full (`00002a6e-0000-1000-8000-00805f9b34fb`) or as the 16- or 32-bit short form
/// of the Bluetooth base UUID (`2A6E`, `0x2a6e`).
pub fn uuid(s: &str) -> Result<Uuid, NameError> {
    let t = s.trim();
    let short = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    if (short.len() == 4 || short.len() == 8) && short.chars().all(|c| c.is_ascii_hexdigit()) {
        let v = u32::from_str_radix(short, 16).map_err(|_| NameError::Uuid(Excerpt::of(s)))?;
        return Ok(Uuid::from_u128(BASE | (u128::from(v) << 96)));
    }
    Uuid::parse_str(t).map_err(|_| NameError::Uuid(Excerpt::of(s)))
}

/// How a characteristic's bytes become the property's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Format {
    /// A number or a bit at a byte offset.
    Field(Field),
    /// A number at a byte offset read as a boolean (not zero is `true`).
    Bool(Field),
    /// UTF-8 text from `offset`, `length` bytes or to the end (a trailing NUL is dropped).
    Text {
        offset: usize,
        length: Option<usize>,
    },
    /// The bytes from `offset`, as hex (`"0A FF"`).
    Bytes {
        offset: usize,
        length: Option<usize>,
    },
}

/// One property: a characteristic and how to decode and encode it.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// `serviceUUID`: the service the characteristic is in, when several have it.
    pub service: Option<Uuid>,
    /// `characteristicUUID`.
    pub characteristic: Uuid,
    pub format: Format,
    /// `notify`: `Some(false)` polls even when the characteristic can notify; `None` subscribes
    /// when it can.
    pub notify: Option<bool>,
    /// `writeWithoutResponse`.
    pub without_response: bool,
    /// `dataWrite` (KubeEdge's Bluetooth mapper): values written as fixed bytes, by value.
    pub data_write: Vec<(String, Vec<u8>)>,
}

/// The `dataType`s a characteristic's value can be, besides the numeric ones of
/// [`mapper_sdk::field::Kind`].
pub const TEXT_TYPES: &[&str] = &["string", "bytes"];

impl Point {
    /// `model_type` is the model's `type` (`INT`, `FLOAT`, `BOOLEAN`, `STRING`, ...).
    pub fn from_config(
        v: &Map<String, Value>,
        model_type: Option<&str>,
    ) -> Result<Self, ConfigError> {
        let characteristic = match text(v, "characteristicUUID") {
            Some(c) => uuid(&c).map_err(|e| bad("characteristicUUID", e))?,
            None => return Err(bad("characteristicUUID", "missing")),
        };
        let service = match text(v, "serviceUUID") {
            Some(s) if !s.trim().is_empty() => Some(uuid(&s).map_err(|e| bad("serviceUUID", e))?),
            _ => None,
        };
        let data_type = text(v, "dataType").map(|t| t.trim().to_ascii_lowercase());
        let model = model_type.unwrap_or("").to_ascii_uppercase();
        let offset = integer::<usize>(v, "offset")?.unwrap_or(0);
        let length = integer::<usize>(v, "length")?;
        let format = match data_type.as_deref() {
            Some("string" | "text") => Format::Text { offset, length },
            Some("bytes" | "hex") => Format::Bytes { offset, length },
            None if model == "STRING" => Format::Text { offset, length },
            None if model == "BYTES" => Format::Bytes { offset, length },
            Some("bool" | "boolean") => {
                let mut c = v.clone();
                c.retain(|k, _| !k.eq_ignore_ascii_case("dataType"));
                Format::Bool(Field::from_config(&c, Some(0), true)?)
            }
            _ => {
                // GATT sends numbers little-endian (Bluetooth Core, Vol 3, Part G, 3.3.3.5).
                let field = Field::from_config(v, Some(0), true).map_err(|mut e| {
                    if e.key == "dataType" {
                        e.reason.push_str(", string or bytes");
                    }
                    e
                })?;
                if model == "BOOLEAN" && !matches!(field.kind, Kind::Bit(_)) {
                    Format::Bool(field)
                } else {
                    Format::Field(field)
                }
            }
        };
        let notify = match get(v, "notify") {
            None | Some(Value::Null) => None,
            Some(_) => Some(mapper_sdk::configdata::flag(v, "notify")?),
        };
        let data_write = match get(v, "dataWrite") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(value, bytes)| {
                    let h = match bytes {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    parse_hex(&h)
                        .map(|b| (value.clone(), b))
                        .map_err(|e| bad("dataWrite", format!("{value}: {e}")))
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(bad(
                    "dataWrite",
                    format!("{other} is not a map of values to hex bytes"),
                ));
            }
        };
        Ok(Self {
            service,
            characteristic,
            format,
            notify,
            without_response: mapper_sdk::configdata::flag(v, "writeWithoutResponse")?,
            data_write,
        })
    }

    /// The property's value in the characteristic's bytes, or why not.
    pub fn decode(&self, bytes: &[u8]) -> Result<String, ValueError> {
        let slice = |offset: usize, length: Option<usize>| {
            let end = length.map_or(bytes.len(), |l| offset + l);
            bytes.get(offset..end).ok_or(ValueError::PastEnd {
                start: offset,
                end,
                len: bytes.len(),
            })
        };
        match &self.format {
            Format::Field(f) => Ok(f.decode(bytes)?),
            Format::Bool(f) => {
                let raw = Field {
                    scale: Default::default(),
                    ..f.clone()
                }
                .decode(bytes)?;
                Ok((raw != "0").to_string())
            }
            Format::Text { offset, length } => {
                let b = slice(*offset, *length)?;
                let b = b.strip_suffix(&[0]).unwrap_or(b);
                String::from_utf8(b.to_vec()).map_err(|_| ValueError::NotUtf8(hex(b)))
            }
            Format::Bytes { offset, length } => Ok(hex(slice(*offset, *length)?)),
        }
    }

    /// `value` as bytes, and the offset they go at, or why it cannot be written.
    pub fn encode(&self, value: &str) -> Result<(usize, Vec<u8>), ValueError> {
        if let Some((_, b)) = self.data_write.iter().find(|(v, _)| v == value.trim()) {
            return Ok((0, b.clone()));
        }
        if !self.data_write.is_empty() {
            return Err(ValueError::NotInDataWrite {
                value: Excerpt::of(value),
                known: self.data_write.iter().map(|(v, _)| v.clone()).collect(),
            });
        }
        match &self.format {
            Format::Field(f) => Ok((f.offset, f.encode(value)?)),
            Format::Bool(f) => {
                let raw = match value.trim().to_ascii_lowercase().as_str() {
                    "true" | "1" | "on" => "1",
                    "false" | "0" | "off" => "0",
                    _ => return Err(ValueError::NotBool(Excerpt::of(value))),
                };
                let f = Field {
                    scale: Default::default(),
                    ..f.clone()
                };
                Ok((f.offset, f.encode(raw)?))
            }
            Format::Text { offset, length } => {
                let b = value.as_bytes().to_vec();
                match length {
                    Some(l) if b.len() > *l => Err(ValueError::TooLong {
                        value: Excerpt::of(value),
                        max: *l,
                    }),
                    _ => Ok((*offset, b)),
                }
            }
            Format::Bytes { offset, .. } => Ok((*offset, parse_hex(value)?)),
        }
    }

    /// The byte range of the characteristic this property owns, when it is not the whole value.
    pub fn width(&self) -> Option<usize> {
        match &self.format {
            Format::Field(f) | Format::Bool(f) => Some(f.kind.width()),
            Format::Text { length, .. } | Format::Bytes { length, .. } => *length,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use sim::object as map;

    #[test]
    fn addresses_names_and_timeouts() {
        let c = Connection::from_config(&map(json!({"macAddress": "c4-7c-8d-6a-12-34"})))
            .expect("address");
        assert_eq!(c.address.as_deref(), Some("C4:7C:8D:6A:12:34"));
        assert_eq!(c.timeout, Duration::from_secs(5));
        let c = Connection::from_config(&map(json!({"localName": "env-1", "scanTimeout": "2000"})))
            .expect("name");
        assert_eq!(c.name.as_deref(), Some("env-1"));
        assert_eq!(c.scan_timeout, Duration::from_secs(2));
        let e = Connection::from_config(&map(json!({}))).expect_err("neither");
        assert_eq!(e.key, "macAddress");
        let e = Connection::from_config(&map(json!({"macAddress": "C4:7C:8D"}))).expect_err("bad");
        assert!(e.to_string().contains("not a Bluetooth address"), "{e}");
        let e = Connection::from_config(&map(json!({"name": "x", "timeout": 0}))).expect_err("0");
        assert_eq!(e.key, "timeout");
    }

    #[test]
    fn short_and_full_uuids() {
        let full = "00002a6e-0000-1000-8000-00805f9b34fb";
        assert_eq!(uuid("2A6E").expect("16-bit").to_string(), full);
        assert_eq!(uuid("0x2a6e").expect("0x").to_string(), full);
        assert_eq!(uuid(full).expect("full").to_string(), full);
        assert!(uuid("2A6").is_err());
        assert!(uuid("temperature").is_err());
    }

    #[test]
    fn characteristics_decode_little_endian_by_default_and_scale() {
        // The example's temperature: sint16, 0.01 degrees (org.bluetooth.characteristic.temperature).
        let p = Point::from_config(
            &map(json!({"characteristicUUID": "2A6E", "length": 2, "signed": true, "scale": 0.01})),
            Some("FLOAT"),
        )
        .expect("temperature");
        assert_eq!(p.decode(&(-1234i16).to_le_bytes()), Ok("-12.34".into()));
        assert_eq!(p.encode("21.5"), Ok((0, 2150i16.to_le_bytes().to_vec())));
        let be = Point::from_config(
            &map(json!({"characteristicUUID": "2A6E", "offset": 1, "dataType": "uint16", "byteOrder": "big"})),
            Some("INT"),
        )
        .expect("big");
        assert_eq!(be.decode(&[9, 1, 2]), Ok("258".into()));
        assert!(
            be.decode(&[9, 1])
                .expect_err("short")
                .to_string()
                .contains("past the end")
        );
        let bit = Point::from_config(
            &map(json!({"characteristicUUID": "ff01", "bit": 3})),
            Some("BOOLEAN"),
        )
        .expect("bit");
        assert_eq!(bit.decode(&[0b1000]), Ok("true".into()));
    }

    #[test]
    fn booleans_text_bytes_and_data_write() {
        let led = Point::from_config(&map(json!({"characteristicUUID": "ff01"})), Some("BOOLEAN"))
            .expect("led");
        assert_eq!(led.decode(&[2]), Ok("true".into()));
        assert_eq!(led.encode("false"), Ok((0, vec![0])));
        assert!(led.encode("maybe").is_err());
        let name = Point::from_config(&map(json!({"characteristicUUID": "2A00"})), Some("STRING"))
            .expect("name");
        assert_eq!(name.decode(b"env-1\0"), Ok("env-1".into()));
        assert!(
            name.decode(&[0xff, 0xfe])
                .expect_err("utf8")
                .to_string()
                .contains("not UTF-8")
        );
        let raw = Point::from_config(
            &map(json!({"characteristicUUID": "2A00", "dataType": "bytes", "offset": 1})),
            Some("STRING"),
        )
        .expect("bytes");
        assert_eq!(raw.decode(&[1, 0xab, 0xcd]), Ok("AB CD".into()));
        let switch = Point::from_config(
            &map(
                json!({"characteristicUUID": "ff02", "dataWrite": {"ON": "01 01", "OFF": "0100"}}),
            ),
            Some("STRING"),
        )
        .expect("dataWrite");
        assert_eq!(switch.encode("ON"), Ok((0, vec![1, 1])));
        assert!(
            switch
                .encode("DIM")
                .expect_err("unknown")
                .to_string()
                .contains("dataWrite")
        );
        let e = Point::from_config(
            &map(json!({"characteristicUUID": "ff01", "dataType": "int3"})),
            None,
        )
        .expect_err("type");
        assert_eq!(e.key, "dataType");
        assert!(e.reason.contains("string or bytes"), "{e}");
        let e = Point::from_config(&map(json!({"serviceUUID": "181a"})), None).expect_err("char");
        assert_eq!(e.key, "characteristicUUID");
    }
}
