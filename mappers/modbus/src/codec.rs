//! A property's value to and from Modbus registers or bits.
//!
//! Registers arrive as 16-bit words, each big-endian on the wire. A value of several registers
//! is read in the property's [`ByteOrder`]: `ABCD` is big-endian (the first register holds the
//! most significant word), `CDAB` swaps the words (KubeEdge's `isRegisterSwap`), `BADC` swaps
//! the bytes inside each word (`isSwap`), `DCBA` both. The engineering value is
//! `raw × scale + offset`; a write inverts it, rounds for integer types and checks both the
//! model's minimum and maximum and the range of the data type.

use std::fmt;

/// How the registers of one value are interpreted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataType {
    /// One bit of the bit tables, or a register that is not zero.
    Bool,
    Int16,
    Uint16,
    Int32,
    Uint32,
    Int64,
    Uint64,
    Float32,
    Float64,
    /// Bytes over a number of registers (two per register), NUL-padded.
    String,
}

impl DataType {
    /// Parses a visitor's `dataType`, case-insensitively: `int16`, `uint16`, `int32`, `uint32`,
    /// `int64`, `uint64`, `float32` (or `float`), `float64` (or `double`), `bool` (or
    /// `boolean`), `string`. `int` is `int16`, as a one-register integer.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "bool" | "boolean" => Self::Bool,
            "int" | "int16" | "short" => Self::Int16,
            "uint" | "uint16" | "ushort" => Self::Uint16,
            "int32" => Self::Int32,
            "uint32" => Self::Uint32,
            "int64" | "long" => Self::Int64,
            "uint64" => Self::Uint64,
            "float" | "float32" => Self::Float32,
            "double" | "float64" => Self::Float64,
            "string" => Self::String,
            _ => return None,
        })
    }

    /// Registers one value takes; `None` for strings (their length is configured).
    pub fn registers(self) -> Option<u16> {
        match self {
            Self::Bool | Self::Int16 | Self::Uint16 => Some(1),
            Self::Int32 | Self::Uint32 | Self::Float32 => Some(2),
            Self::Int64 | Self::Uint64 | Self::Float64 => Some(4),
            Self::String => None,
        }
    }

    fn is_integer(self) -> bool {
        matches!(
            self,
            Self::Int16 | Self::Uint16 | Self::Int32 | Self::Uint32 | Self::Int64 | Self::Uint64
        )
    }

    /// The range of the raw integer, for integer types.
    fn integer_range(self) -> Option<(i128, i128)> {
        Some(match self {
            Self::Int16 => (i16::MIN.into(), i16::MAX.into()),
            Self::Uint16 => (0, u16::MAX.into()),
            Self::Int32 => (i32::MIN.into(), i32::MAX.into()),
            Self::Uint32 => (0, u32::MAX.into()),
            Self::Int64 => (i64::MIN.into(), i64::MAX.into()),
            Self::Uint64 => (0, u64::MAX.into()),
            _ => return None,
        })
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Bool => "bool",
            Self::Int16 => "int16",
            Self::Uint16 => "uint16",
            Self::Int32 => "int32",
            Self::Uint32 => "uint32",
            Self::Int64 => "int64",
            Self::Uint64 => "uint64",
            Self::Float32 => "float32",
            Self::Float64 => "float64",
            Self::String => "string",
        })
    }
}

/// The order of the bytes of a multi-register value, named after a 32-bit value `ABCD` whose
/// most significant byte is `A`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ByteOrder {
    /// Big-endian: registers most significant first, each big-endian.
    #[default]
    Abcd,
    /// Words swapped (least significant register first).
    Cdab,
    /// Bytes swapped inside each register.
    Badc,
    /// Little-endian: both swapped.
    Dcba,
}

impl ByteOrder {
    /// Parses `ABCD`, `CDAB`, `BADC` or `DCBA` (any case); `BIG`/`LITTLE` are accepted too.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_uppercase().as_str() {
            "ABCD" | "AB" | "BIG" | "BIGENDIAN" => Self::Abcd,
            "CDAB" => Self::Cdab,
            "BADC" | "BA" => Self::Badc,
            "DCBA" | "LITTLE" | "LITTLEENDIAN" => Self::Dcba,
            _ => return None,
        })
    }

    /// KubeEdge's two flags: `isSwap` swaps bytes, `isRegisterSwap` swaps registers.
    pub fn from_swaps(is_swap: bool, is_register_swap: bool) -> Self {
        match (is_swap, is_register_swap) {
            (false, false) => Self::Abcd,
            (false, true) => Self::Cdab,
            (true, false) => Self::Badc,
            (true, true) => Self::Dcba,
        }
    }

    fn swaps_words(self) -> bool {
        matches!(self, Self::Cdab | Self::Dcba)
    }

    fn swaps_bytes(self) -> bool {
        matches!(self, Self::Badc | Self::Dcba)
    }
}

/// Why a value could not be decoded or encoded.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CodecError {
    #[error("expected {expected} registers for a {data_type}, the device sent {got}")]
    Length {
        data_type: DataType,
        expected: usize,
        got: usize,
    },
    #[error("{value:?} is not a {data_type} value")]
    Parse { data_type: DataType, value: String },
    #[error("{value} does not fit a {data_type} after scale and offset (raw {raw})")]
    Range {
        data_type: DataType,
        value: String,
        raw: String,
    },
    #[error("{value} is below the minimum {minimum}")]
    BelowMinimum { value: f64, minimum: f64 },
    #[error("{value} is above the maximum {maximum}")]
    AboveMaximum { value: f64, maximum: f64 },
    #[error("{value:?} is {needed} bytes; the property holds {room}")]
    TooLong {
        value: String,
        needed: usize,
        room: usize,
    },
    #[error("bit {bit} of a register cannot be written on its own")]
    BitWrite { bit: u8 },
}

/// How one property's value maps to registers or bits.
#[derive(Clone, Debug, PartialEq)]
pub struct Codec {
    pub data_type: DataType,
    pub order: ByteOrder,
    /// The configured length of a string, in registers (other types have a fixed size).
    pub registers: u16,
    /// For `Bool` on a register: the bit (0 = least significant) that holds the value.
    pub bit: Option<u8>,
    pub scale: f64,
    pub offset: f64,
    /// The model's `minimum` and `maximum`, checked on writes.
    pub minimum: Option<f64>,
    pub maximum: Option<f64>,
}

impl Codec {
    /// A codec with no scale, offset or limits, in big-endian order.
    pub fn new(data_type: DataType) -> Self {
        Self {
            data_type,
            order: ByteOrder::Abcd,
            registers: data_type.registers().unwrap_or(1),
            bit: None,
            scale: 1.0,
            offset: 0.0,
            minimum: None,
            maximum: None,
        }
    }

    fn is_identity(&self) -> bool {
        self.scale == 1.0 && self.offset == 0.0
    }

    /// The registers in big-endian order (most significant byte first).
    fn normalized_bytes(&self, regs: &[u16]) -> Vec<u8> {
        let mut out = vec![0; regs.len() * 2];
        self.normalize_into(regs, &mut out);
        out
    }

    /// [`Self::normalized_bytes`] into `out` (twice as long as `regs`): a numeric value (at most
    /// 4 registers) is decoded from the stack, without allocating, 125 times per cycle of a
    /// full read.
    fn normalize_into(&self, regs: &[u16], out: &mut [u8]) {
        let n = regs.len();
        for (i, w) in regs.iter().enumerate() {
            let at = if self.order.swaps_words() {
                n - 1 - i
            } else {
                i
            };
            let w = if self.order.swaps_bytes() {
                w.swap_bytes()
            } else {
                *w
            };
            out[2 * at..2 * at + 2].copy_from_slice(&w.to_be_bytes());
        }
    }

    /// Registers from big-endian bytes, in the device's order.
    fn device_words(&self, bytes: &[u8]) -> Vec<u16> {
        let mut words: Vec<u16> = bytes
            .chunks(2)
            .map(|c| {
                let w = u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]);
                if self.order.swaps_bytes() {
                    w.swap_bytes()
                } else {
                    w
                }
            })
            .collect();
        if self.order.swaps_words() {
            words.reverse();
        }
        words
    }

    /// Registers one value takes: the data type's size, or [`Codec::registers`] for strings.
    pub fn width(&self) -> u16 {
        self.data_type.registers().unwrap_or(self.registers)
    }

    /// The value held by `regs` (exactly [`Codec::width`] of them), as the twin's string.
    pub fn decode_registers(&self, regs: &[u16]) -> Result<String, CodecError> {
        let mut out = String::new();
        self.decode_into(regs, &mut out)?;
        Ok(out)
    }

    /// [`Codec::decode_registers`] appended to `out` (a buffer the caller keeps: no
    /// allocation of its own for numbers).
    pub fn decode_into(&self, regs: &[u16], out: &mut String) -> Result<(), CodecError> {
        use std::fmt::Write as _;
        if regs.len() != usize::from(self.width()) {
            return Err(CodecError::Length {
                data_type: self.data_type,
                expected: self.width().into(),
                got: regs.len(),
            });
        }
        let mut stack = [0u8; 8];
        let heap;
        let b: &[u8] = if regs.len() <= 4 {
            self.normalize_into(regs, &mut stack[..regs.len() * 2]);
            &stack[..regs.len() * 2]
        } else {
            heap = self.normalized_bytes(regs);
            &heap
        };
        let raw = match self.data_type {
            DataType::Bool => {
                let w = u16::from_be_bytes([b[0], b[1]]);
                let on = match self.bit {
                    Some(bit) => (w >> (bit & 15)) & 1 == 1,
                    None => w != 0,
                };
                out.push_str(if on { "true" } else { "false" });
                return Ok(());
            }
            DataType::String => {
                let end = b
                    .iter()
                    .rposition(|c| *c != 0 && *c != b' ')
                    .map_or(0, |p| p + 1);
                out.push_str(&String::from_utf8_lossy(&b[..end]));
                return Ok(());
            }
            DataType::Int16 => Raw::Int(i16::from_be_bytes([b[0], b[1]]).into()),
            DataType::Uint16 => Raw::Int(u16::from_be_bytes([b[0], b[1]]).into()),
            DataType::Int32 => Raw::Int(i32::from_be_bytes([b[0], b[1], b[2], b[3]]).into()),
            DataType::Uint32 => Raw::Int(u32::from_be_bytes([b[0], b[1], b[2], b[3]]).into()),
            DataType::Int64 => Raw::Int(i64::from_be_bytes(eight(b)).into()),
            DataType::Uint64 => Raw::Int(u64::from_be_bytes(eight(b)).into()),
            DataType::Float32 => Raw::F32(f32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            DataType::Float64 => Raw::F64(f64::from_be_bytes(eight(b))),
        };
        // Writing to a String cannot fail.
        let _ = if self.is_identity() {
            match raw {
                // i64's formatting where it fits (all but the top half of u64), faster than i128's.
                Raw::Int(v) => match i64::try_from(v) {
                    Ok(v) => write!(out, "{v}"),
                    Err(_) => write!(out, "{v}"),
                },
                Raw::F32(v) => write!(out, "{v}"),
                Raw::F64(v) => write!(out, "{v}"),
            }
        } else {
            match raw {
                // An integer register scaled by 0.1 has one decimal, not the binary float's
                // 35.800000000000004: the result is rounded to the decimals of scale and offset.
                Raw::Int(v) => {
                    out.push_str(&mapper_sdk::value::scaled_integer(
                        v,
                        self.scale,
                        self.offset,
                    ));
                    Ok(())
                }
                Raw::F32(v) => write!(out, "{}", f64::from(v) * self.scale + self.offset),
                Raw::F64(v) => write!(out, "{}", v * self.scale + self.offset),
            }
        };
        Ok(())
    }

    /// The value of a bit-table item.
    pub fn decode_bit(&self, bit: bool) -> String {
        bit.to_string()
    }

    /// Checks a value to write against the model's minimum and maximum.
    fn check_limits(&self, v: f64) -> Result<(), CodecError> {
        if let Some(minimum) = self.minimum
            && v < minimum
        {
            return Err(CodecError::BelowMinimum { value: v, minimum });
        }
        if let Some(maximum) = self.maximum
            && v > maximum
        {
            return Err(CodecError::AboveMaximum { value: v, maximum });
        }
        Ok(())
    }

    fn parse_err(&self, value: &str) -> CodecError {
        CodecError::Parse {
            data_type: self.data_type,
            value: value.to_string(),
        }
    }

    /// The registers to write for `value` (a twin value string), in the device's order.
    pub fn encode_registers(&self, value: &str) -> Result<Vec<u16>, CodecError> {
        let text = value.trim();
        let bytes: Vec<u8> = match self.data_type {
            DataType::Bool => {
                if let Some(bit) = self.bit {
                    return Err(CodecError::BitWrite { bit });
                }
                let on = parse_bool(text).ok_or_else(|| self.parse_err(value))?;
                u16::from(on).to_be_bytes().to_vec()
            }
            DataType::String => {
                let room = usize::from(self.registers) * 2;
                if value.len() > room {
                    return Err(CodecError::TooLong {
                        value: value.to_string(),
                        needed: value.len(),
                        room,
                    });
                }
                let mut b = value.as_bytes().to_vec();
                b.resize(room, 0);
                b
            }
            t if t.is_integer() => {
                let raw = self.integer_raw(text, value)?;
                match t {
                    DataType::Int16 => (raw as i16).to_be_bytes().to_vec(),
                    DataType::Uint16 => (raw as u16).to_be_bytes().to_vec(),
                    DataType::Int32 => (raw as i32).to_be_bytes().to_vec(),
                    DataType::Uint32 => (raw as u32).to_be_bytes().to_vec(),
                    DataType::Int64 => (raw as i64).to_be_bytes().to_vec(),
                    _ => (raw as u64).to_be_bytes().to_vec(),
                }
            }
            DataType::Float32 => {
                let v: f64 = text.parse().map_err(|_| self.parse_err(value))?;
                self.check_limits(v)?;
                let raw = (v - self.offset) / self.scale;
                if !raw.is_finite() || raw.abs() > f64::from(f32::MAX) {
                    return Err(self.range_err(value, raw));
                }
                (raw as f32).to_be_bytes().to_vec()
            }
            _ => {
                let v: f64 = text.parse().map_err(|_| self.parse_err(value))?;
                self.check_limits(v)?;
                let raw = (v - self.offset) / self.scale;
                if !raw.is_finite() {
                    return Err(self.range_err(value, raw));
                }
                raw.to_be_bytes().to_vec()
            }
        };
        Ok(self.device_words(&bytes))
    }

    fn range_err(&self, value: &str, raw: impl fmt::Display) -> CodecError {
        CodecError::Range {
            data_type: self.data_type,
            value: value.to_string(),
            raw: raw.to_string(),
        }
    }

    /// The raw integer for an engineering value, checked against the model's limits and the
    /// type's range. Without scale and offset, integers are parsed exactly (all of `u64`).
    fn integer_raw(&self, text: &str, value: &str) -> Result<i128, CodecError> {
        let (lo, hi) = self
            .data_type
            .integer_range()
            .ok_or_else(|| self.parse_err(value))?;
        let raw: i128 = if self.is_identity() {
            let exact = text
                .parse::<i128>()
                .ok()
                .or_else(|| {
                    // "12.0" is an integer too; "12.5" is not.
                    let f: f64 = text.parse().ok()?;
                    (f.fract() == 0.0 && f.is_finite()).then_some(f as i128)
                })
                .ok_or_else(|| self.parse_err(value))?;
            self.check_limits(exact as f64)?;
            exact
        } else {
            let v: f64 = text.parse().map_err(|_| self.parse_err(value))?;
            self.check_limits(v)?;
            let raw = ((v - self.offset) / self.scale).round();
            if !raw.is_finite() {
                return Err(self.range_err(value, raw));
            }
            raw as i128
        };
        if raw < lo || raw > hi {
            return Err(self.range_err(value, raw));
        }
        Ok(raw)
    }

    /// The bit to write for `value` to a coil.
    pub fn encode_bit(&self, value: &str) -> Result<bool, CodecError> {
        parse_bool(value.trim()).ok_or_else(|| self.parse_err(value))
    }
}

enum Raw {
    Int(i128),
    F32(f32),
    F64(f64),
}

fn eight(b: &[u8]) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(&b[..8]);
    out
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "on" => Some(true),
        "false" | "0" | "off" => Some(false),
        _ => None,
    }
}

/// The decimal places of `x` as written in a manifest (0.1 has 1, 0.025 has 3), at most 15.
#[cfg(test)]
mod tests {
    use super::*;

    fn codec(t: DataType, order: ByteOrder) -> Codec {
        Codec {
            order,
            ..Codec::new(t)
        }
    }

    #[test]
    fn a_float32_reads_in_all_four_byte_orders() {
        // 123.456 as float32 is 0x42F6E979: A=42 B=F6 C=E9 D=79.
        let cases = [
            (ByteOrder::Abcd, [0x42F6, 0xE979]),
            (ByteOrder::Cdab, [0xE979, 0x42F6]),
            (ByteOrder::Badc, [0xF642, 0x79E9]),
            (ByteOrder::Dcba, [0x79E9, 0xF642]),
        ];
        for (order, regs) in cases {
            let c = codec(DataType::Float32, order);
            assert_eq!(
                c.decode_registers(&regs).as_deref(),
                Ok("123.456"),
                "{order:?}"
            );
            assert_eq!(
                c.encode_registers("123.456"),
                Ok(regs.to_vec()),
                "{order:?}"
            );
        }
    }

    #[test]
    fn kubeedge_swap_flags_name_the_orders() {
        assert_eq!(ByteOrder::from_swaps(false, false), ByteOrder::Abcd);
        assert_eq!(ByteOrder::from_swaps(false, true), ByteOrder::Cdab);
        assert_eq!(ByteOrder::from_swaps(true, false), ByteOrder::Badc);
        assert_eq!(ByteOrder::from_swaps(true, true), ByteOrder::Dcba);
        assert_eq!(ByteOrder::parse("cdab"), Some(ByteOrder::Cdab));
        assert_eq!(ByteOrder::parse("XYZW"), None);
    }

    #[test]
    fn integers_of_every_width_and_sign() {
        let c = codec(DataType::Int16, ByteOrder::Abcd);
        assert_eq!(c.decode_registers(&[0xFFFE]).as_deref(), Ok("-2"));
        let c = codec(DataType::Uint16, ByteOrder::Abcd);
        assert_eq!(c.decode_registers(&[0xFFFE]).as_deref(), Ok("65534"));
        let c = codec(DataType::Int32, ByteOrder::Cdab);
        assert_eq!(c.decode_registers(&[0xFFFF, 0xFFFF]).as_deref(), Ok("-1"));
        assert_eq!(c.encode_registers("-70000"), Ok(vec![0xEE90, 0xFFFE]));
        let c = codec(DataType::Uint64, ByteOrder::Abcd);
        assert_eq!(
            c.decode_registers(&[0xFFFF; 4]).as_deref(),
            Ok("18446744073709551615")
        );
        assert_eq!(
            c.encode_registers("18446744073709551615"),
            Ok(vec![0xFFFF; 4])
        );
        let c = codec(DataType::Int64, ByteOrder::Dcba);
        let regs = c.encode_registers("-1234567890123").expect("encodes");
        assert_eq!(c.decode_registers(&regs).as_deref(), Ok("-1234567890123"));
    }

    #[test]
    fn scale_and_offset_apply_on_read_and_are_inverted_on_write() {
        let c = Codec {
            scale: 0.1,
            offset: -40.0,
            ..Codec::new(DataType::Uint16)
        };
        // raw 650 -> 650 * 0.1 - 40 = 25
        assert_eq!(c.decode_registers(&[650]).as_deref(), Ok("25"));
        // One decimal, as the scale has, not the binary float's 25.800000000000004.
        assert_eq!(c.decode_registers(&[658]).as_deref(), Ok("25.8"));
        assert_eq!(c.decode_registers(&[399]).as_deref(), Ok("-0.1"));
        assert_eq!(c.encode_registers("25"), Ok(vec![650]));
        // Rounded to the nearest raw step.
        assert_eq!(c.encode_registers("25.04"), Ok(vec![650]));
        // Below raw 0 after the offset: out of a uint16's range.
        assert!(matches!(
            c.encode_registers("-41"),
            Err(CodecError::Range { .. })
        ));
    }

    #[test]
    fn writes_outside_the_model_limits_or_the_type_are_refused_with_the_reason() {
        let c = Codec {
            minimum: Some(0.0),
            maximum: Some(100.0),
            ..Codec::new(DataType::Int16)
        };
        assert_eq!(
            c.encode_registers("101"),
            Err(CodecError::AboveMaximum {
                value: 101.0,
                maximum: 100.0
            })
        );
        assert!(
            c.encode_registers("-1")
                .expect_err("below")
                .to_string()
                .contains("below the minimum 0")
        );
        let c = Codec::new(DataType::Int16);
        assert!(matches!(
            c.encode_registers("40000"),
            Err(CodecError::Range { .. })
        ));
        assert!(matches!(
            c.encode_registers("12.5"),
            Err(CodecError::Parse { .. })
        ));
        assert_eq!(c.encode_registers("12.0"), Ok(vec![12]));
        assert!(matches!(
            c.encode_registers("warm"),
            Err(CodecError::Parse { .. })
        ));
    }

    #[test]
    fn strings_are_nul_padded_and_trimmed() {
        let c = Codec {
            registers: 4,
            ..Codec::new(DataType::String)
        };
        let regs = c.encode_registers("PLC-7").expect("fits");
        assert_eq!(regs, vec![0x504C, 0x432D, 0x3700, 0x0000]);
        assert_eq!(c.decode_registers(&regs).as_deref(), Ok("PLC-7"));
        assert!(matches!(
            c.encode_registers("a much longer name"),
            Err(CodecError::TooLong {
                needed: 18,
                room: 8,
                ..
            })
        ));
        let swapped = Codec {
            order: ByteOrder::Badc,
            ..c
        };
        assert_eq!(
            swapped
                .decode_registers(&[0x4C50, 0x2D43, 0x0037, 0])
                .as_deref(),
            Ok("PLC-7")
        );
    }

    #[test]
    fn bools_from_bits_registers_and_bit_fields() {
        let c = Codec::new(DataType::Bool);
        assert_eq!(c.decode_registers(&[0]).as_deref(), Ok("false"));
        assert_eq!(c.decode_registers(&[7]).as_deref(), Ok("true"));
        assert_eq!(c.encode_registers("on"), Ok(vec![1]));
        assert_eq!(c.encode_bit("0"), Ok(false));
        assert!(c.encode_bit("maybe").is_err());
        let b = Codec {
            bit: Some(3),
            ..Codec::new(DataType::Bool)
        };
        assert_eq!(b.decode_registers(&[0b1000]).as_deref(), Ok("true"));
        assert_eq!(b.decode_registers(&[0b0111]).as_deref(), Ok("false"));
        assert_eq!(
            b.encode_registers("true"),
            Err(CodecError::BitWrite { bit: 3 })
        );
    }

    #[test]
    fn a_short_answer_is_an_error_not_a_panic() {
        let c = Codec::new(DataType::Float64);
        assert_eq!(
            c.decode_registers(&[1, 2]),
            Err(CodecError::Length {
                data_type: DataType::Float64,
                expected: 4,
                got: 2
            })
        );
    }

    /// 0x12345678 as each byte order puts it in two registers, decoded without the encoder.
    #[test]
    fn each_byte_order_reads_its_own_registers() {
        for (order, regs) in [
            (ByteOrder::Abcd, [0x1234, 0x5678]),
            (ByteOrder::Cdab, [0x5678, 0x1234]),
            (ByteOrder::Badc, [0x3412, 0x7856]),
            (ByteOrder::Dcba, [0x7856, 0x3412]),
        ] {
            let c = codec(DataType::Uint32, order);
            assert_eq!(
                c.decode_registers(&regs).as_deref(),
                Ok("305419896"),
                "{order:?}"
            );
        }
        let c = codec(DataType::Uint64, ByteOrder::Cdab);
        assert_eq!(
            c.decode_registers(&[0x0000, 0x0000, 0x0000, 0x0001])
                .as_deref(),
            Ok("281474976710656")
        );
    }

    proptest::proptest! {
        #[test]
        fn every_int32_round_trips_in_every_order(v: i32, order in 0u8..4) {
            let order = [ByteOrder::Abcd, ByteOrder::Cdab, ByteOrder::Badc, ByteOrder::Dcba][order as usize];
            let c = codec(DataType::Int32, order);
            let regs = c.encode_registers(&v.to_string()).expect("in range");
            proptest::prop_assert_eq!(c.decode_registers(&regs), Ok(v.to_string()));
        }

        #[test]
        fn every_float64_round_trips(v in proptest::num::f64::NORMAL) {
            let c = codec(DataType::Float64, ByteOrder::Dcba);
            let regs = c.encode_registers(&v.to_string()).expect("finite");
            proptest::prop_assert_eq!(c.decode_registers(&regs), Ok(v.to_string()));
        }

        #[test]
        fn decoding_garbage_never_panics(regs in proptest::collection::vec(proptest::num::u16::ANY, 0..6), t in 0usize..10) {
            let types = [DataType::Bool, DataType::Int16, DataType::Uint16, DataType::Int32, DataType::Uint32, DataType::Int64, DataType::Uint64, DataType::Float32, DataType::Float64, DataType::String];
            let c = Codec { registers: 2, ..Codec::new(types[t]) };
            let _ = c.decode_registers(&regs);
        }
    }
}
