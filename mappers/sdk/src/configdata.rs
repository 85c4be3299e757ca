//! Reading KubeEdge `configData` maps: keys matched without regard to case (the examples spell
//! them both ways: `slaveID`/`SlaveID`), numbers and flags also given as strings, and errors that
//! name the key. Shared by every protocol's parser.

use serde_json::{Map, Value};

/// Why a configuration was refused: names the key and what was wrong with it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct ConfigError {
    pub key: String,
    pub reason: String,
}

pub fn bad(key: &str, reason: impl std::fmt::Display) -> ConfigError {
    ConfigError {
        key: key.to_string(),
        reason: reason.to_string(),
    }
}

/// A value of `map` by key, ignoring case.
pub fn get<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v)
}

pub fn text(map: &Map<String, Value>, key: &str) -> Option<String> {
    match get(map, key)? {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

pub fn number(map: &Map<String, Value>, key: &str) -> Result<Option<f64>, ConfigError> {
    match get(map, key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n.as_f64().map(Some).ok_or_else(|| bad(key, "not a number")),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| bad(key, format!("{s:?} is not a number"))),
        Some(other) => Err(bad(key, format!("{other} is not a number"))),
    }
}

pub fn integer<T: TryFrom<i64>>(
    map: &Map<String, Value>,
    key: &str,
) -> Result<Option<T>, ConfigError> {
    let Some(v) = number(map, key)? else {
        return Ok(None);
    };
    if v.fract() != 0.0 {
        return Err(bad(key, format!("{v} is not a whole number")));
    }
    T::try_from(v as i64)
        .map(Some)
        .map_err(|_| bad(key, format!("{v} is out of range")))
}

pub fn flag(map: &Map<String, Value>, key: &str) -> Result<bool, ConfigError> {
    match get(map, key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => Ok(true),
            "false" | "0" | "no" | "" => Ok(false),
            _ => Err(bad(key, format!("{s:?} is not true or false"))),
        },
        Some(other) => Err(bad(key, format!("{other} is not true or false"))),
    }
}

/// The settings of a serial port: `serialPort`, `baudRate` (9600), `dataBits` (8), `parity`
/// (`none`|`even`|`odd`), `stopBits` (1), `flowControl` (`none`|`software`|`hardware`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SerialSettings {
    pub path: String,
    pub baud_rate: u32,
    pub data_bits: u8,
    pub parity: Parity,
    pub stop_bits: u8,
    pub flow_control: FlowControl,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parity {
    None,
    Even,
    Odd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowControl {
    None,
    Software,
    Hardware,
}

impl SerialSettings {
    /// The settings in `c`, or `None` without a `serialPort`.
    pub fn from_config(c: &Map<String, Value>) -> Result<Option<Self>, ConfigError> {
        let Some(path) = text(c, "serialPort") else {
            return Ok(None);
        };
        let parity = match text(c, "parity")
            .unwrap_or_else(|| "none".into())
            .to_ascii_lowercase()
            .as_str()
        {
            "none" | "n" => Parity::None,
            "even" | "e" => Parity::Even,
            "odd" | "o" => Parity::Odd,
            other => return Err(bad("parity", format!("{other:?} is not none, even or odd"))),
        };
        let flow_control = match text(c, "flowControl")
            .unwrap_or_else(|| "none".into())
            .to_ascii_lowercase()
            .as_str()
        {
            "none" => FlowControl::None,
            "software" | "xonxoff" => FlowControl::Software,
            "hardware" | "rtscts" => FlowControl::Hardware,
            other => {
                return Err(bad(
                    "flowControl",
                    format!("{other:?} is not none, software or hardware"),
                ));
            }
        };
        let data_bits = integer(c, "dataBits")?.unwrap_or(8);
        if !(5..=8).contains(&data_bits) {
            return Err(bad("dataBits", format!("{data_bits} is not 5 to 8")));
        }
        let stop_bits = integer(c, "stopBits")?.unwrap_or(1);
        if !(1..=2).contains(&stop_bits) {
            return Err(bad("stopBits", format!("{stop_bits} is not 1 or 2")));
        }
        let baud_rate = integer(c, "baudRate")?.unwrap_or(9600);
        if baud_rate == 0 {
            return Err(bad("baudRate", "0 is not a baud rate"));
        }
        Ok(Some(Self {
            path,
            baud_rate,
            data_bits,
            parity,
            stop_bits,
            flow_control,
        }))
    }

    /// Character time on the line: start bit, data bits, parity bit, stop bits.
    pub fn char_time(&self) -> std::time::Duration {
        let bits = 1
            + u64::from(self.data_bits)
            + u64::from(self.parity != Parity::None)
            + u64::from(self.stop_bits);
        std::time::Duration::from_nanos(bits * 1_000_000_000 / u64::from(self.baud_rate.max(1)))
    }

    /// Opens the port.
    #[cfg(feature = "serial")]
    pub fn open(&self) -> std::io::Result<tokio_serial::SerialStream> {
        use tokio_serial::SerialPortBuilderExt;
        tokio_serial::new(&self.path, self.baud_rate)
            .data_bits(match self.data_bits {
                5 => tokio_serial::DataBits::Five,
                6 => tokio_serial::DataBits::Six,
                7 => tokio_serial::DataBits::Seven,
                _ => tokio_serial::DataBits::Eight,
            })
            .parity(match self.parity {
                Parity::None => tokio_serial::Parity::None,
                Parity::Even => tokio_serial::Parity::Even,
                Parity::Odd => tokio_serial::Parity::Odd,
            })
            .stop_bits(if self.stop_bits == 2 {
                tokio_serial::StopBits::Two
            } else {
                tokio_serial::StopBits::One
            })
            .flow_control(match self.flow_control {
                FlowControl::None => tokio_serial::FlowControl::None,
                FlowControl::Software => tokio_serial::FlowControl::Software,
                FlowControl::Hardware => tokio_serial::FlowControl::Hardware,
            })
            .open_native_async()
            .map_err(std::io::Error::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn keys_ignore_case_and_numbers_may_be_strings() {
        let c = map(json!({"SlaveID": "3", "timeout": 250, "isSwap": "true"}));
        assert_eq!(integer::<u8>(&c, "slaveID"), Ok(Some(3)));
        assert_eq!(integer::<u64>(&c, "TIMEOUT"), Ok(Some(250)));
        assert_eq!(flag(&c, "isswap"), Ok(true));
        assert_eq!(integer::<u8>(&c, "missing"), Ok(None));
        let e = integer::<u8>(&map(json!({"slaveID": 300})), "slaveID").expect_err("range");
        assert_eq!(e.to_string(), "slaveID: 300 is out of range");
        let e = integer::<u8>(&map(json!({"slaveID": "x"})), "slaveID").expect_err("number");
        assert_eq!(e.to_string(), "slaveID: \"x\" is not a number");
    }

    #[test]
    fn serial_settings_with_defaults_and_named_errors() {
        let s = SerialSettings::from_config(&map(json!({"serialPort": "/dev/ttyS0"})))
            .expect("valid")
            .expect("serial");
        assert_eq!(
            (
                s.baud_rate,
                s.data_bits,
                s.parity,
                s.stop_bits,
                s.flow_control
            ),
            (9600, 8, Parity::None, 1, FlowControl::None)
        );
        // 10 bits per character at 9600 baud.
        assert_eq!(s.char_time().as_micros(), 1041);
        assert_eq!(
            SerialSettings::from_config(&map(json!({"ip": "x"}))),
            Ok(None)
        );
        let e = SerialSettings::from_config(&map(json!({"serialPort": "p", "parity": "mark"})))
            .expect_err("parity");
        assert_eq!(e.key, "parity");
        let e = SerialSettings::from_config(&map(json!({"serialPort": "p", "flowControl": "x"})))
            .expect_err("flow");
        assert_eq!(e.key, "flowControl");
    }
}
