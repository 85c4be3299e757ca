//! Values in frames: hex strings, binary fields at byte offsets, and text numbers with scale.
//! Shared by the protocols whose devices send bytes (serial frames, BLE characteristics).

use crate::configdata::{ConfigError, bad, flag, integer, number, text};
use api::validate::names::Excerpt;
use serde_json::{Map, Value};
use std::fmt::Write as _;

/// A value that does not pass between a frame's bytes and the twin's text; each names the
/// value or the bytes it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    #[error("{0} has an odd number of hex digits")]
    OddHex(Excerpt),
    #[error("{0} is not hex")]
    NotHex(Excerpt),
    #[error(
        "{0} is not int8, uint8, int16, uint16, int32, uint32, int64, uint64, float32 or float64"
    )]
    DataType(Excerpt),
    #[error("length {0} is not 1, 2, 4 or 8")]
    Length(usize),
    #[error("the field at byte {offset} ({width} bytes) is past the end of a {len}-byte frame")]
    PastEnd {
        offset: usize,
        width: usize,
        len: usize,
    },
    #[error("{0} is not true or false")]
    NotBool(Excerpt),
    #[error("{0} is not a number")]
    NotNumber(Excerpt),
    #[error("{value} does not fit in {len} byte(s)")]
    DoesNotFit { value: Excerpt, len: usize },
}

/// Bytes from hex such as `"01 03 00 0A"`, `"01:03"` or `"0103000A"`.
pub fn parse_hex(s: &str) -> Result<Vec<u8>, FieldError> {
    let digits: String = s
        .chars()
        .filter(|c| !matches!(c, ' ' | ':' | '-' | ',' | '\t'))
        .collect();
    let digits = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
        .unwrap_or(&digits);
    if !digits.len().is_multiple_of(2) {
        return Err(FieldError::OddHex(Excerpt::of(s)));
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| {
            digits
                .get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(|| FieldError::NotHex(Excerpt::of(s)))
        })
        .collect()
}

/// `"AA 01 FF"`.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 3);
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        let _ = write!(s, "{b:02X}");
    }
    s
}

/// The type of a binary field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Int {
        len: usize,
        signed: bool,
    },
    Float32,
    Float64,
    /// One bit of a byte.
    Bit(u8),
}

impl Kind {
    /// From `dataType` (`int8` ... `uint64`, `float32`, `float64`), or from `length` and
    /// `signed`.
    pub fn parse(
        data_type: Option<&str>,
        length: Option<usize>,
        signed: bool,
    ) -> Result<Self, FieldError> {
        if let Some(t) = data_type {
            let t = t.trim().to_ascii_lowercase();
            return Ok(match t.as_str() {
                "int8" => Self::Int {
                    len: 1,
                    signed: true,
                },
                "uint8" | "byte" => Self::Int {
                    len: 1,
                    signed: false,
                },
                "int16" => Self::Int {
                    len: 2,
                    signed: true,
                },
                "uint16" => Self::Int {
                    len: 2,
                    signed: false,
                },
                "int32" => Self::Int {
                    len: 4,
                    signed: true,
                },
                "uint32" => Self::Int {
                    len: 4,
                    signed: false,
                },
                "int64" => Self::Int {
                    len: 8,
                    signed: true,
                },
                "uint64" => Self::Int {
                    len: 8,
                    signed: false,
                },
                "float32" | "float" => Self::Float32,
                "float64" | "double" => Self::Float64,
                other => return Err(FieldError::DataType(Excerpt::of(other))),
            });
        }
        match length.unwrap_or(1) {
            len @ (1 | 2 | 4 | 8) => Ok(Self::Int { len, signed }),
            other => Err(FieldError::Length(other)),
        }
    }

    pub fn width(self) -> usize {
        match self {
            Self::Int { len, .. } => len,
            Self::Float32 => 4,
            Self::Float64 => 8,
            Self::Bit(_) => 1,
        }
    }
}

/// A field of a binary frame.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    pub offset: usize,
    pub kind: Kind,
    pub little_endian: bool,
    pub scale: Scale,
}

/// `scale` and `valueOffset`: value = raw * scale + offset.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scale {
    pub scale: f64,
    pub offset: f64,
}

impl Default for Scale {
    fn default() -> Self {
        Self {
            scale: 1.0,
            offset: 0.0,
        }
    }
}

impl Scale {
    /// `scale` (1) and `valueOffset` (0) of a visitor's `configData`.
    pub fn from_config(v: &Map<String, Value>) -> Result<Self, ConfigError> {
        let scale = Self {
            scale: number(v, "scale")?.unwrap_or(1.0),
            offset: number(v, "valueOffset")?.unwrap_or(0.0),
        };
        if scale.scale == 0.0 {
            return Err(bad("scale", "0 would make every value the same"));
        }
        Ok(scale)
    }

    pub fn is_identity(&self) -> bool {
        self.scale == 1.0 && self.offset == 0.0
    }

    /// An integer reading as the property's value: unchanged without a scale, else scaled and
    /// rounded to the decimals of scale and offset (`358 * 0.1` is `35.8`).
    pub fn integer(&self, raw: i128) -> String {
        if self.is_identity() {
            raw.to_string()
        } else {
            crate::value::scaled_integer(raw, self.scale, self.offset)
        }
    }

    /// A float reading as the property's value; `text` is how it reads unscaled.
    pub fn float(&self, raw: f64, text: impl FnOnce() -> String) -> String {
        if self.is_identity() {
            text()
        } else {
            (raw * self.scale + self.offset).to_string()
        }
    }

    /// A value back to the raw number.
    pub fn invert(&self, v: f64) -> f64 {
        (v - self.offset) / self.scale
    }
}

impl Field {
    /// A field from a visitor's `configData`: `offset` (the byte; `default_offset` when not
    /// given, required when that is `None`), `bit` (0-7, a boolean) or `dataType` (`int8` ...
    /// `uint64`, `float32`, `float64`) or `length` (1, 2, 4, 8) with `signed`, `endianness` or
    /// `byteOrder` (`big`|`little`, `default_little` when not given), `scale`, `valueOffset`.
    pub fn from_config(
        v: &Map<String, Value>,
        default_offset: Option<usize>,
        default_little: bool,
    ) -> Result<Self, ConfigError> {
        let offset = match integer::<usize>(v, "offset")? {
            Some(o) => o,
            None => default_offset.ok_or_else(|| bad("offset", "missing"))?,
        };
        let kind = match integer::<u8>(v, "bit")? {
            Some(b) if b < 8 => Kind::Bit(b),
            Some(b) => return Err(bad("bit", format!("{b} is not 0 to 7"))),
            None => Kind::parse(
                text(v, "dataType").as_deref(),
                integer(v, "length")?,
                flag(v, "signed")?,
            )
            .map_err(|e| bad("dataType", e))?,
        };
        let (key, order) = match (text(v, "endianness"), text(v, "byteOrder")) {
            (Some(e), _) => ("endianness", Some(e)),
            (None, b) => ("byteOrder", b),
        };
        let little_endian = match order.map(|o| o.to_ascii_lowercase()).as_deref() {
            None => default_little,
            Some("big" | "be") => false,
            Some("little" | "le") => true,
            Some(other) => return Err(bad(key, format!("{other:?} is not big or little"))),
        };
        Ok(Self {
            offset,
            kind,
            little_endian,
            scale: Scale::from_config(v)?,
        })
    }

    /// The field's value in `frame`, or why not.
    pub fn decode(&self, frame: &[u8]) -> Result<String, FieldError> {
        let n = self.kind.width();
        let bytes = frame
            .get(self.offset..self.offset + n)
            .ok_or(FieldError::PastEnd {
                offset: self.offset,
                width: n,
                len: frame.len(),
            })?;
        let mut b = [0u8; 8];
        if self.little_endian {
            b[..n].copy_from_slice(bytes);
        } else {
            for (i, x) in bytes.iter().rev().enumerate() {
                b[i] = *x;
            }
        }
        // b is now little-endian, n bytes.
        let raw = u64::from_le_bytes(b);
        Ok(match self.kind {
            Kind::Bit(bit) => ((raw >> bit) & 1 == 1).to_string(),
            Kind::Int { len, signed } => {
                if signed {
                    let shift = 64 - 8 * len as u32;
                    self.scale
                        .integer(i128::from(((raw << shift) as i64) >> shift))
                } else {
                    self.scale.integer(i128::from(raw))
                }
            }
            Kind::Float32 => {
                let v = f32::from_bits(raw as u32);
                self.scale.float(f64::from(v), || v.to_string())
            }
            Kind::Float64 => {
                let v = f64::from_bits(raw);
                self.scale.float(v, || v.to_string())
            }
        })
    }

    /// `value` as the field's bytes, or why it does not fit.
    pub fn encode(&self, value: &str) -> Result<Vec<u8>, FieldError> {
        let n = self.kind.width();
        let not_a_number = || FieldError::NotNumber(Excerpt::of(value));
        let raw: u64 = match self.kind {
            Kind::Bit(bit) => match value.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "on" => 1 << bit,
                "false" | "0" | "off" => 0,
                _ => return Err(FieldError::NotBool(Excerpt::of(value))),
            },
            Kind::Float32 | Kind::Float64 => {
                let v: f64 = value.trim().parse().map_err(|_| not_a_number())?;
                let v = self.scale.invert(v);
                if self.kind == Kind::Float32 {
                    u64::from((v as f32).to_bits())
                } else {
                    v.to_bits()
                }
            }
            Kind::Int { len, signed } => {
                let v: f64 = value.trim().parse().map_err(|_| not_a_number())?;
                let v = self.scale.invert(v).round();
                let bits = 8 * len as u32;
                let (lo, hi) = if signed {
                    (
                        -(2f64.powi(bits as i32 - 1)),
                        2f64.powi(bits as i32 - 1) - 1.0,
                    )
                } else {
                    (0.0, 2f64.powi(bits as i32) - 1.0)
                };
                if !(lo..=hi).contains(&v) {
                    return Err(FieldError::DoesNotFit {
                        value: Excerpt::plain(value),
                        len,
                    });
                }
                if signed { (v as i64) as u64 } else { v as u64 }
            }
        };
        let le = raw.to_le_bytes();
        let mut out = le[..n].to_vec();
        if !self.little_endian {
            out.reverse();
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(offset: usize, kind: Kind, little_endian: bool) -> Field {
        Field {
            offset,
            kind,
            little_endian,
            scale: Scale::default(),
        }
    }

    #[test]
    fn hex_in_several_spellings() {
        assert_eq!(parse_hex("01 03 0a"), Ok(vec![1, 3, 10]));
        assert_eq!(parse_hex("0x01030A"), Ok(vec![1, 3, 10]));
        assert_eq!(parse_hex("01:03"), Ok(vec![1, 3]));
        assert!(parse_hex("013").is_err());
        assert!(parse_hex("zz").is_err());
        assert_eq!(hex(&[0xAA, 1]), "AA 01");
    }

    #[test]
    fn fields_by_offset_length_endianness_and_sign() {
        let frame = [0xAA, 0xFF, 0x38, 0x2C, 0x01, 0x81];
        let i16be = field(
            1,
            Kind::Int {
                len: 2,
                signed: true,
            },
            false,
        );
        assert_eq!(i16be.decode(&frame), Ok("-200".into()));
        let u16le = field(
            2,
            Kind::Int {
                len: 2,
                signed: false,
            },
            true,
        );
        assert_eq!(u16le.decode(&frame), Ok("11320".into()));
        let bit = field(5, Kind::Bit(7), false);
        assert_eq!(bit.decode(&frame), Ok("true".into()));
        let past = field(
            5,
            Kind::Int {
                len: 2,
                signed: false,
            },
            false,
        );
        assert!(
            past.decode(&frame)
                .expect_err("short")
                .to_string()
                .contains("past the end")
        );
        let mut scaled = field(
            2,
            Kind::Int {
                len: 2,
                signed: false,
            },
            false,
        );
        scaled.scale.scale = 0.01;
        assert_eq!(scaled.decode(&frame), Ok("143.8".into()));
        let f = field(0, Kind::Float32, false);
        assert_eq!(f.decode(&1.5f32.to_be_bytes()), Ok("1.5".into()));
    }

    #[test]
    fn encode_is_the_inverse_and_range_checked() {
        let mut f = field(
            0,
            Kind::Int {
                len: 2,
                signed: true,
            },
            true,
        );
        f.scale.scale = 0.1;
        let bytes = f.encode("-20.5").expect("fits");
        assert_eq!(bytes, (-205i16).to_le_bytes().to_vec());
        assert_eq!(f.decode(&bytes), Ok("-20.5".into()));
        let u8f = field(
            0,
            Kind::Int {
                len: 1,
                signed: false,
            },
            false,
        );
        assert!(
            u8f.encode("256")
                .expect_err("range")
                .to_string()
                .contains("does not fit")
        );
        assert!(u8f.encode("-1").is_err());
        assert!(u8f.encode("x").is_err());
        assert_eq!(
            field(0, Kind::Float32, false).encode("1.5"),
            Ok(1.5f32.to_be_bytes().to_vec())
        );
    }
}
