//! The `configData` keys of the protocols this project's mappers serve, so that `kectl validate`
//! finds a misspelt key or a bad value before the mapper does. Each mapper
//! registers its keys here (kept in step with its parser by hand: the mapper stays the
//! authority and refuses a device with the same key named). edgecore logs these problems but
//! loads the device anyway.
//!
//! Keys are matched without regard to case, and numbers and flags may be strings, as the
//! mappers read them. An unknown key is a warning (KubeEdge's `configData` is free-form and
//! other mappers may read more keys); a bad value or a missing required key is an error.

use super::Problem;
use serde_json::{Map, Value};

/// What a key holds.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Text,
    /// A whole number within the bounds.
    Integer(i64, i64),
    Number,
    Flag,
    /// One of these words, in any case.
    OneOf(&'static [&'static str]),
    /// Bytes in hex (`"AA 01"`).
    Hex,
    /// A map of values to bytes in hex (`{ON: "01", OFF: "00"}`).
    HexMap,
    /// A UUID: 128 bits, or the 16- or 32-bit short form of the Bluetooth base UUID (`2A6E`).
    Uuid,
}

/// One key.
#[derive(Clone, Copy, Debug)]
pub struct Key {
    pub name: &'static str,
    pub kind: Kind,
    pub required: bool,
}

const fn key(name: &'static str, kind: Kind) -> Key {
    Key {
        name,
        kind,
        required: false,
    }
}

const fn required(name: &'static str, kind: Kind) -> Key {
    Key {
        name,
        kind,
        required: true,
    }
}

/// A protocol's keys: of the device's `spec.protocol.configData` (with groups of which at least
/// one key must be given) and of each property's `visitors.configData`.
#[derive(Debug)]
pub struct Schema {
    pub protocol: &'static str,
    pub device: &'static [Key],
    pub device_one_of: &'static [&'static [&'static str]],
    pub visitor: &'static [Key],
}

const SERIAL_PORT: [Key; 6] = [
    key("serialPort", Kind::Text),
    key("baudRate", Kind::Integer(1, 4_000_000)),
    key("dataBits", Kind::Integer(5, 8)),
    key(
        "parity",
        Kind::OneOf(&["none", "even", "odd", "n", "e", "o"]),
    ),
    key("stopBits", Kind::Integer(1, 2)),
    key(
        "flowControl",
        Kind::OneOf(&["none", "software", "hardware", "xonxoff", "rtscts"]),
    ),
];

/// `mapper-modbus` (`mappers/modbus/src/device.rs`).
pub const MODBUS: Schema = Schema {
    protocol: "modbus",
    device: &[
        key("ip", Kind::Text),
        key("port", Kind::Integer(1, 65535)),
        SERIAL_PORT[0],
        SERIAL_PORT[1],
        SERIAL_PORT[2],
        SERIAL_PORT[3],
        SERIAL_PORT[4],
        SERIAL_PORT[5],
        key("slaveID", Kind::Integer(0, 255)),
        key("timeout", Kind::Integer(1, 3_600_000)),
        key("collectTimeout", Kind::Integer(1, 3_600_000)),
        key("retries", Kind::Integer(0, 255)),
        key("collectRetryTimes", Kind::Integer(0, 255)),
        key("maxGap", Kind::Integer(0, 2000)),
        key("maxRegisters", Kind::Integer(1, 125)),
        key("maxBits", Kind::Integer(1, 2000)),
    ],
    device_one_of: &[&["ip", "serialPort"]],
    visitor: &[
        required(
            "register",
            Kind::OneOf(&[
                "CoilRegister",
                "Coil",
                "Coils",
                "DiscreteInputRegister",
                "DiscreteInput",
                "DiscreteInputs",
                "Discrete",
                "InputRegister",
                "Input",
                "HoldingRegister",
                "Holding",
            ]),
        ),
        required("offset", Kind::Integer(0, 65535)),
        key("limit", Kind::Integer(1, 2000)),
        key(
            "dataType",
            Kind::OneOf(&[
                "bool", "boolean", "int", "int16", "short", "uint", "uint16", "ushort", "int32",
                "uint32", "int64", "long", "uint64", "float", "float32", "double", "float64",
                "string",
            ]),
        ),
        key(
            "byteOrder",
            Kind::OneOf(&[
                "ABCD",
                "AB",
                "BIG",
                "BIGENDIAN",
                "CDAB",
                "BADC",
                "BA",
                "DCBA",
                "LITTLE",
                "LITTLEENDIAN",
            ]),
        ),
        key("isSwap", Kind::Flag),
        key("isRegisterSwap", Kind::Flag),
        key("bit", Kind::Integer(0, 15)),
        key("scale", Kind::Number),
        key("valueOffset", Kind::Number),
    ],
};

/// `mapper-serial` (`mappers/serial/src/device.rs`).
pub const SERIAL: Schema = Schema {
    protocol: "serial",
    device: &[
        required("serialPort", Kind::Text),
        SERIAL_PORT[1],
        SERIAL_PORT[2],
        SERIAL_PORT[3],
        SERIAL_PORT[4],
        SERIAL_PORT[5],
        key(
            "mode",
            Kind::OneOf(&["ascii", "text", "line", "binary", "hex"]),
        ),
        key("timeout", Kind::Integer(1, 3_600_000)),
        key("terminator", Kind::Text),
        key("requestTerminator", Kind::Text),
        key(
            "checksum",
            Kind::OneOf(&[
                "none",
                "sum",
                "sum8",
                "xor",
                "xor8",
                "crc16-modbus",
                "crc16_modbus",
                "crc16-ccitt",
                "crc16_ccitt",
            ]),
        ),
        key("frameGap", Kind::Number),
    ],
    device_one_of: &[],
    visitor: &[
        required("request", Kind::Text),
        key("pattern", Kind::Text),
        key("capture", Kind::Text),
        key(
            "dataType",
            Kind::OneOf(&[
                "string", "int", "integer", "float", "double", "boolean", "bool", "int8", "uint8",
                "byte", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32",
                "float64",
            ]),
        ),
        key("scale", Kind::Number),
        key("valueOffset", Kind::Number),
        key("write", Kind::Text),
        key("writeReply", Kind::Text),
        key("responseLength", Kind::Integer(1, 65536)),
        key("responsePrefix", Kind::Hex),
        key("offset", Kind::Integer(0, 65535)),
        key("length", Kind::Integer(1, 8)),
        key("signed", Kind::Flag),
        key("endianness", Kind::OneOf(&["big", "little", "be", "le"])),
        key("bit", Kind::Integer(0, 7)),
        key("writeResponseLength", Kind::Integer(0, 65536)),
    ],
};

/// `mappers/opcua` (`config.rs`).
pub const OPCUA: Schema = Schema {
    protocol: "opcua",
    device: &[
        key("url", Kind::Text),
        key("endpoint", Kind::Text),
        key(
            "securityPolicy",
            Kind::OneOf(&[
                "None",
                "Basic256Sha256",
                "Aes128Sha256RsaOaep",
                "Aes128-Sha256-RsaOaep",
                "Aes128_Sha256_RsaOaep",
                "Aes256Sha256RsaPss",
                "Aes256-Sha256-RsaPss",
                "Aes256_Sha256_RsaPss",
                "Basic128Rsa15",
                "Basic256",
                "http://opcfoundation.org/UA/SecurityPolicy#None",
                "http://opcfoundation.org/UA/SecurityPolicy#Basic256Sha256",
                "http://opcfoundation.org/UA/SecurityPolicy#Aes128_Sha256_RsaOaep",
                "http://opcfoundation.org/UA/SecurityPolicy#Aes256_Sha256_RsaPss",
                "http://opcfoundation.org/UA/SecurityPolicy#Basic128Rsa15",
                "http://opcfoundation.org/UA/SecurityPolicy#Basic256",
            ]),
        ),
        key(
            "securityMode",
            Kind::OneOf(&[
                "None",
                "Sign",
                "SignAndEncrypt",
                "sign_and_encrypt",
                "sign-and-encrypt",
            ]),
        ),
        key("userName", Kind::Text),
        key("password", Kind::Text),
        key("passwordFile", Kind::Text),
        key("identityCertificate", Kind::Text),
        key("identityPrivateKey", Kind::Text),
        key("certificate", Kind::Text),
        key("privateKey", Kind::Text),
        key("serverCertificate", Kind::Text),
        key("timeout", Kind::Integer(1, 3_600_000)),
        key("keepAlive", Kind::Integer(1, 3_600_000)),
        key("maxNodesPerRead", Kind::Integer(0, 1_000_000)),
    ],
    device_one_of: &[&["url", "endpoint"]],
    visitor: &[
        required("nodeID", Kind::Text),
        key(
            "dataType",
            Kind::OneOf(&[
                "boolean", "bool", "sbyte", "byte", "int16", "uint16", "int32", "int", "uint32",
                "int64", "uint64", "float", "double", "string", "datetime",
            ]),
        ),
        key("indexRange", Kind::Text),
        key("subscribe", Kind::Flag),
        key("samplingInterval", Kind::Integer(0, 86_400_000)),
        key("queueSize", Kind::Integer(1, 65_535)),
        key(
            "deadbandType",
            Kind::OneOf(&["none", "absolute", "percent"]),
        ),
        key("deadbandValue", Kind::Number),
    ],
};

/// mapper-ble (`mappers/ble/src/config.rs`).
pub const BLE: Schema = Schema {
    protocol: "ble",
    device: &[
        key("macAddress", Kind::Text),
        key("address", Kind::Text),
        key("localName", Kind::Text),
        key("name", Kind::Text),
        key("adapter", Kind::Text),
        key("scanTimeout", Kind::Integer(1, 3_600_000)),
        key("connectTimeout", Kind::Integer(1, 3_600_000)),
        key("timeout", Kind::Integer(1, 3_600_000)),
    ],
    device_one_of: &[&["macAddress", "address", "localName", "name"]],
    visitor: &[
        required("characteristicUUID", Kind::Uuid),
        key("serviceUUID", Kind::Uuid),
        key("offset", Kind::Integer(0, 512)),
        key("length", Kind::Integer(1, 512)),
        key(
            "dataType",
            Kind::OneOf(&[
                "int8", "uint8", "byte", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                "float32", "float", "float64", "double", "bool", "boolean", "string", "text",
                "bytes", "hex",
            ]),
        ),
        key("signed", Kind::Flag),
        key("bit", Kind::Integer(0, 7)),
        key("byteOrder", Kind::OneOf(&["big", "little", "be", "le"])),
        key("endianness", Kind::OneOf(&["big", "little", "be", "le"])),
        key("scale", Kind::Number),
        key("valueOffset", Kind::Number),
        key("notify", Kind::Flag),
        key("writeWithoutResponse", Kind::Flag),
        key("dataWrite", Kind::HexMap),
    ],
};

/// The registered protocols.
pub const SCHEMAS: &[&Schema] = &[&MODBUS, &SERIAL, &OPCUA, &BLE];

/// The schema of `protocol`, if a mapper of this project serves it.
pub fn schema(protocol: &str) -> Option<&'static Schema> {
    SCHEMAS.iter().copied().find(|s| s.protocol == protocol)
}

/// Checks `map` against `keys`; problems under `path` (`spec.protocol.configData`).
pub fn check(
    map: &Map<String, Value>,
    keys: &[Key],
    one_of: &[&[&str]],
    protocol: &str,
    path: &str,
    out: &mut Vec<Problem>,
) {
    for (k, v) in map {
        let here = format!("{path}.{k}");
        let Some(key) = keys.iter().find(|key| key.name.eq_ignore_ascii_case(k)) else {
            let known: Vec<&str> = keys.iter().map(|k| k.name).collect();
            out.push(Problem::warning(
                here,
                format!(
                    "not a {protocol} key; the {protocol} mapper ignores it (known: {})",
                    known.join(", ")
                ),
            ));
            continue;
        };
        if let Some(e) = check_value(v, key.kind) {
            out.push(Problem::error(here, e));
        }
    }
    let has = |name: &str| map.keys().any(|k| k.eq_ignore_ascii_case(name));
    for key in keys.iter().filter(|k| k.required && !has(k.name)) {
        out.push(Problem::error(
            format!("{path}.{}", key.name),
            format!("required by the {protocol} mapper"),
        ));
    }
    for group in one_of {
        if !group.iter().any(|k| has(k)) {
            out.push(Problem::error(
                path.to_string(),
                format!("the {protocol} mapper needs one of {}", group.join(", ")),
            ));
        }
    }
}

/// What is wrong with `v` as `kind`, if anything.
fn check_value(v: &Value, kind: Kind) -> Option<String> {
    if let Kind::HexMap = kind {
        let Value::Object(m) = v else {
            return Some(format!("{v} is not a map of values to bytes in hex"));
        };
        return m
            .iter()
            .find_map(|(k, b)| check_value(b, Kind::Hex).map(|e| format!("{k}: {e}")));
    }
    let text = match v {
        Value::String(s) => s.trim().to_string(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => return None,
        other => return Some(format!("{other} is not a single value")),
    };
    match kind {
        Kind::Text => None,
        Kind::Number => text
            .parse::<f64>()
            .is_err()
            .then(|| format!("{text:?} is not a number")),
        Kind::Integer(lo, hi) => match text.parse::<f64>() {
            Ok(x) if x.fract() != 0.0 => Some(format!("{text} is not a whole number")),
            Ok(x) if x < lo as f64 || x > hi as f64 => {
                Some(format!("{text} is outside {lo} to {hi}"))
            }
            Ok(_) => None,
            Err(_) => Some(format!("{text:?} is not a number")),
        },
        Kind::Flag => (!matches!(
            text.to_ascii_lowercase().as_str(),
            "true" | "false" | "1" | "0" | "yes" | "no" | ""
        ))
        .then(|| format!("{text:?} is not true or false")),
        Kind::OneOf(words) => (!words.iter().any(|w| w.eq_ignore_ascii_case(&text)))
            .then(|| format!("{text:?} is not one of {}", words.join(", "))),
        Kind::HexMap => None,
        Kind::Uuid => {
            let short = text.strip_prefix("0x").unwrap_or(&text);
            let is_short =
                matches!(short.len(), 4 | 8) && short.chars().all(|c| c.is_ascii_hexdigit());
            let groups: Vec<&str> = text.split('-').collect();
            let is_full = groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
                && groups
                    .iter()
                    .all(|g| g.chars().all(|c| c.is_ascii_hexdigit()));
            (!is_short && !is_full).then(|| {
                format!("{text:?} is not a UUID (128 bits, or the 16-bit short form like 2A6E)")
            })
        }
        Kind::Hex => {
            let digits: String = text
                .chars()
                .filter(|c| !matches!(c, ' ' | ':' | '-' | ','))
                .collect();
            let digits = digits.strip_prefix("0x").unwrap_or(&digits);
            (!digits.len().is_multiple_of(2) || !digits.chars().all(|c| c.is_ascii_hexdigit()))
                .then(|| format!("{text:?} is not bytes in hex"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn problems(v: Value, schema: &Schema, visitor: bool) -> Vec<String> {
        let Value::Object(m) = v else { return vec![] };
        let mut out = Vec::new();
        if visitor {
            check(&m, schema.visitor, &[], schema.protocol, "v", &mut out);
        } else {
            check(
                &m,
                schema.device,
                schema.device_one_of,
                schema.protocol,
                "p",
                &mut out,
            );
        }
        out.iter().map(ToString::to_string).collect()
    }

    /// The problems of `v` as a device's `protocol.configData`.
    fn device(v: Value, schema: &Schema) -> Vec<String> {
        problems(v, schema, false)
    }

    /// The problems of `v` as a property visitor's `configData`.
    fn visitor(v: Value, schema: &Schema) -> Vec<String> {
        problems(v, schema, true)
    }

    /// Whether one of `problems` says every one of `parts`.
    fn says(problems: &[String], parts: &[&str]) -> bool {
        problems
            .iter()
            .any(|p| parts.iter().all(|part| p.contains(part)))
    }

    #[test]
    fn modbus_keys_in_both_spellings_and_named_errors() {
        assert!(
            device(
                json!({"ip": "10.0.0.1", "port": "502", "SlaveID": 1}),
                &MODBUS
            )
            .is_empty()
        );
        let p = device(json!({"port": 70000, "slaveId": "x"}), &MODBUS);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(says(&p, &["p.port", "outside 1 to 65535"]), "{p:?}");
        assert!(says(&p, &["needs one of ip, serialPort"]), "{p:?}");
        let p = visitor(
            json!({"register": "HoldingRegistr", "offset": 1, "scal": 2}),
            &MODBUS,
        );
        assert!(says(&p, &["v.register", "is not one of"]), "{p:?}");
        assert!(says(&p, &["v.scal", "not a modbus key"]), "{p:?}");
        let p = visitor(json!({"register": "coilregister"}), &MODBUS);
        assert!(says(&p, &["v.offset", "required"]), "{p:?}");
    }

    #[test]
    fn opcua_keys() {
        assert!(
            device(json!({"url": "opc.tcp://plc:4840", "securityPolicy": "basic256sha256", "securityMode": "SignAndEncrypt"}), &OPCUA)
            .is_empty()
        );
        let p = visitor(
            json!({"nodeId": "ns=2;s=T", "subscribe": "sometimes", "deadbandType": "relative"}),
            &OPCUA,
        );
        assert_eq!(p.len(), 2, "{p:?}");
        let p = device(
            json!({"securityPolicy": "Basic512", "browseName": "x"}),
            &OPCUA,
        );
        assert!(says(&p, &["needs one of url"]), "{p:?}");
        assert!(says(&p, &["Basic256Sha256"]), "{p:?}");
    }

    #[test]
    fn serial_keys() {
        assert!(
            device(
                json!({"serialPort": "/dev/ttyS0", "mode": "binary", "checksum": "crc16-modbus"}),
                &SERIAL
            )
            .is_empty()
        );
        let p = visitor(
            json!({"request": "AA 01", "responsePrefix": "AZ", "bit": 9}),
            &SERIAL,
        );
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(schema("bluetooth").is_none());
    }

    #[test]
    fn ble_keys_uuids_and_data_write() {
        assert!(
            device(
                json!({"macAddress": "C4:7C:8D:6A:12:34", "scanTimeout": "5000"}),
                &BLE
            )
            .is_empty()
        );
        let p = device(json!({"adapter": "hci0"}), &BLE);
        assert!(says(&p, &["needs one of macAddress"]), "{p:?}");
        assert!(
            visitor(json!({"serviceUUID": "0000181a-0000-1000-8000-00805f9b34fb", "characteristicUUID": "2A6E", "length": 2, "signed": true, "byteOrder": "little", "scale": 0.01, "dataWrite": {"ON": "01", "OFF": "00"}}), &BLE)
            .is_empty()
        );
        let p = visitor(
            json!({"characteristicUUID": "2A6", "dataWrite": {"ON": "0G"}, "bit": 8}),
            &BLE,
        );
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(says(&p, &["is not a UUID"]), "{p:?}");
        assert!(says(&p, &["ON: "]), "{p:?}");
        let p = visitor(json!({"serviceUUID": "181a"}), &BLE);
        assert!(says(&p, &["characteristicUUID", "required"]), "{p:?}");
    }
}
