//! Discovery of BLE peripherals through BlueZ: a scan, then each peripheral found (or the one
//! asked for) connected, its GATT services and characteristics listed with their flags, and
//! every readable characteristic read once. A characteristic the Bluetooth SIG assigns
//! (temperature, humidity, pressure, battery level, the device information strings) is drafted
//! with its assigned format, scale and unit; any other by how its bytes look (text, a float, an
//! integer of its length, else bytes). Only reads are sent: nothing is written, and no
//! notification is subscribed to.

use super::{Draft, Seen};
use btleplug::api::{Central, CharPropFlags, Manager as _, Peripheral as _, ScanFilter};
use btleplug::platform::{Adapter, Manager, Peripheral};
use std::fmt::Write as _;
use std::time::Duration;
use uuid::Uuid;

/// What to look for.
#[derive(Clone, Debug)]
pub struct Options {
    /// The adapter (`hci0`); the first one when `None`.
    pub adapter: Option<String>,
    /// Only the peripheral at this address (`C4:7C:8D:6A:12:34`).
    pub address: Option<String>,
    /// How long to scan.
    pub scan: Duration,
    /// How long a connection (with service discovery) or a read may take.
    pub timeout: Duration,
    pub name: String,
    pub max_properties: usize,
}

/// A characteristic found.
#[derive(Clone, Debug)]
pub struct Char {
    pub uuid: Uuid,
    pub service: Uuid,
    pub flags: CharPropFlags,
    /// The value read, or why not.
    pub value: Result<Vec<u8>, String>,
}

/// A peripheral found.
#[derive(Clone, Debug)]
pub struct Found {
    pub address: String,
    pub name: Option<String>,
    pub rssi: Option<i16>,
    /// Its characteristics, or why it could not be connected.
    pub chars: Result<Vec<Char>, String>,
}

/// What a scan found.
#[derive(Clone, Debug, Default)]
pub struct Scanned {
    pub adapter: String,
    pub peripherals: Vec<Found>,
    /// GATT reads sent.
    pub reads: usize,
}

async fn adapter(want: Option<&str>) -> Result<(Adapter, String), String> {
    let manager = Manager::new().await.map_err(|e| {
        format!("cannot reach BlueZ on the D-Bus system bus: {e} (is bluetoothd running?)")
    })?;
    let mut names = Vec::new();
    for a in manager
        .adapters()
        .await
        .map_err(|e| format!("cannot list Bluetooth adapters: {e}"))?
    {
        let name = a
            .adapter_info()
            .await
            .map(|i| i.split_whitespace().next().unwrap_or_default().to_string())
            .unwrap_or_default();
        if want.is_none_or(|w| w == name) {
            return Ok((a, name));
        }
        names.push(name);
    }
    Err(match want {
        Some(w) => format!("no Bluetooth adapter {w} (BlueZ has {names:?})"),
        None => "BlueZ has no Bluetooth adapter".into(),
    })
}

/// Scans, connects to each peripheral found and reads its characteristics. Never writes.
pub async fn scan(o: &Options) -> Result<Scanned, String> {
    let (adapter, name) = adapter(o.adapter.as_deref()).await?;
    let mut out = Scanned {
        adapter: name.clone(),
        ..Default::default()
    };
    adapter
        .start_scan(ScanFilter::default())
        .await
        .map_err(|e| format!("cannot scan on {name}: {e}"))?;
    tokio::time::sleep(o.scan).await;
    let found = adapter
        .peripherals()
        .await
        .map_err(|e| format!("cannot list the peripherals {name} found: {e}"));
    if let Err(e) = adapter.stop_scan().await {
        tracing::debug!(error = %e, "stopping the scan");
    }
    let mut peripherals = found?;
    peripherals.sort_by_key(|p| p.address().to_string());
    for p in peripherals {
        let address = p.address().to_string().to_ascii_uppercase();
        if o.address
            .as_ref()
            .is_some_and(|want| !want.eq_ignore_ascii_case(&address))
        {
            continue;
        }
        let props = p.properties().await.ok().flatten();
        let chars = characteristics(&p, o, &mut out.reads).await;
        let _ = p.disconnect().await;
        out.peripherals.push(Found {
            address,
            name: props.as_ref().and_then(|p| {
                p.local_name
                    .clone()
                    .or_else(|| p.advertisement_name.clone())
            }),
            rssi: props.as_ref().and_then(|p| p.rssi),
            chars,
        });
    }
    Ok(out)
}

async fn characteristics(
    p: &Peripheral,
    o: &Options,
    reads: &mut usize,
) -> Result<Vec<Char>, String> {
    tokio::time::timeout(o.timeout, p.connect())
        .await
        .map_err(|_| format!("no connection within {:?}", o.timeout))?
        .map_err(|e| format!("cannot connect: {e}"))?;
    tokio::time::timeout(o.timeout, p.discover_services())
        .await
        .map_err(|_| format!("no services within {:?}", o.timeout))?
        .map_err(|e| format!("cannot discover services: {e}"))?;
    let mut out = Vec::new();
    for c in p.characteristics() {
        let value = if c.properties.contains(CharPropFlags::READ) {
            *reads += 1;
            match tokio::time::timeout(o.timeout, p.read(&c)).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(format!("the read failed: {e}")),
                Err(_) => Err(format!("no answer within {:?}", o.timeout)),
            }
        } else {
            Err("not readable".into())
        };
        out.push(Char {
            uuid: c.uuid,
            service: c.service_uuid,
            flags: c.properties,
            value,
        });
    }
    Ok(out)
}

/// The 16-bit form of a UUID on the Bluetooth base (`2A6E`), else the whole UUID.
pub fn short(u: &Uuid) -> String {
    let b = u.as_bytes();
    let base = Uuid::from_u128(0x0000_0000_0000_1000_8000_0080_5f9b_34fb);
    let mut masked = *b;
    masked[2] = 0;
    masked[3] = 0;
    if b[0] == 0 && b[1] == 0 && masked == *base.as_bytes() {
        format!("{:02X}{:02X}", b[2], b[3])
    } else {
        u.to_string()
    }
}

/// A characteristic the Bluetooth SIG assigns: its name, the visitor's data type and scale,
/// the model type and unit.
struct Assigned {
    name: &'static str,
    data_type: &'static str,
    scale: Option<f64>,
    model_type: &'static str,
    unit: Option<&'static str>,
}

fn assigned(short: &str) -> Option<Assigned> {
    let a = |name, data_type, scale, model_type, unit| {
        Some(Assigned {
            name,
            data_type,
            scale,
            model_type,
            unit,
        })
    };
    match short {
        "2A19" => a("battery-level", "uint8", None, "INT", Some("%")),
        "2A6E" => a("temperature", "int16", Some(0.01), "FLOAT", Some("°C")),
        "2A6F" => a("humidity", "uint16", Some(0.01), "FLOAT", Some("%")),
        "2A6D" => a("pressure", "uint32", Some(0.1), "FLOAT", Some("Pa")),
        "2A76" => a("uv-index", "uint8", None, "INT", None),
        "2A7B" => a("dew-point", "int8", None, "INT", Some("°C")),
        "2A00" => a("device-name", "string", None, "STRING", None),
        "2A24" => a("model-number", "string", None, "STRING", None),
        "2A25" => a("serial-number", "string", None, "STRING", None),
        "2A26" => a("firmware-revision", "string", None, "STRING", None),
        "2A27" => a("hardware-revision", "string", None, "STRING", None),
        "2A28" => a("software-revision", "string", None, "STRING", None),
        "2A29" => a("manufacturer-name", "string", None, "STRING", None),
        _ => None,
    }
}

/// GATT's own characteristics (appearance, connection parameters, service changed, ...):
/// about the link, not the device's data.
fn housekeeping(service: &str, short: &str) -> bool {
    service == "1801"
        || matches!(
            short,
            "2A01" | "2A04" | "2A05" | "2AA6" | "2AC9" | "2B29" | "2B2A" | "2B3A"
        )
}

/// How bytes of a characteristic no one assigned look: data type, model type, why.
fn guess(bytes: &[u8]) -> (&'static str, &'static str, String) {
    let printable = |b: &u8| (0x20..0x7f).contains(b);
    if bytes.len() >= 2 && bytes.iter().all(printable) {
        return ("string", "STRING", "text".into());
    }
    match bytes.len() {
        1 => ("uint8", "INT", "one byte".into()),
        2 => {
            let v = i16::from_le_bytes([bytes[0], bytes[1]]);
            if v < 0 && v > -4096 {
                (
                    "int16",
                    "INT",
                    "two bytes that read as a small negative number".into(),
                )
            } else {
                ("uint16", "INT", "two bytes".into())
            }
        }
        4 => {
            let f = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            if f.is_normal() && (1e-3..=1e7).contains(&f.abs()) && round(f64::from(f)) {
                (
                    "float32",
                    "FLOAT",
                    format!("four bytes that read as a float32: {f}"),
                )
            } else {
                ("int32", "INT", "four bytes".into())
            }
        }
        8 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(bytes);
            let f = f64::from_le_bytes(b);
            if f.is_normal() && (1e-3..=1e12).contains(&f.abs()) && round(f) {
                (
                    "float64",
                    "FLOAT",
                    format!("eight bytes that read as a float64: {f}"),
                )
            } else {
                ("int64", "INT", "eight bytes".into())
            }
        }
        n => ("bytes", "STRING", format!("{n} bytes, drafted as hex")),
    }
}

/// A characteristic's flags as BlueZ names them (`read, write, notify`).
fn flag_words(f: CharPropFlags) -> String {
    let names = [
        (CharPropFlags::BROADCAST, "broadcast"),
        (CharPropFlags::READ, "read"),
        (
            CharPropFlags::WRITE_WITHOUT_RESPONSE,
            "write-without-response",
        ),
        (CharPropFlags::WRITE, "write"),
        (CharPropFlags::NOTIFY, "notify"),
        (CharPropFlags::INDICATE, "indicate"),
        (
            CharPropFlags::AUTHENTICATED_SIGNED_WRITES,
            "authenticated-signed-writes",
        ),
        (CharPropFlags::EXTENDED_PROPERTIES, "extended-properties"),
    ];
    let words: Vec<&str> = names
        .iter()
        .filter(|(flag, _)| f.contains(*flag))
        .map(|(_, n)| *n)
        .collect();
    words.join(", ")
}

/// Whether a float reads as a value someone set or measured to a few digits.
fn round(f: f64) -> bool {
    let digits = format!("{}", f as f32)
        .chars()
        .filter(char::is_ascii_digit)
        .skip_while(|c| *c == '0')
        .count();
    digits <= 6
}

fn quote(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// A Device name from an advertised name (`env-hall-a`), or `None` when nothing of it is left.
fn device_name(text: &str) -> Option<String> {
    let mut s: String = text
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    while s.contains("--") {
        s = s.replace("--", "-");
    }
    let s = s.trim_matches('-').chars().take(50).collect::<String>();
    (!s.is_empty()).then_some(s)
}

/// The draft manifests of what `s` found: one Device per peripheral.
pub fn draft(s: &Scanned, o: &Options) -> Draft {
    let mut seen: Vec<Seen> = Vec::new();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Drafted by `discover` from the BLE peripherals seen by {} ({} GATT reads; nothing was written, no notification subscribed to).\n# Review every property: the Bluetooth SIG's characteristics are drafted with their assigned format; the others are guesses, said beside each.",
        s.adapter, s.reads
    );
    let many = s.peripherals.len() > 1;
    for p in &s.peripherals {
        let name = match (many, p.name.as_deref().and_then(device_name)) {
            (false, _) => o.name.clone(),
            (true, Some(n)) => n,
            (true, None) => format!(
                "{}-{}",
                o.name,
                p.address.replace(':', "").to_ascii_lowercase()
            ),
        };
        let _ = writeln!(
            out,
            "---\n# {} at {}{}.",
            p.name.as_deref().unwrap_or("A peripheral with no name"),
            p.address,
            p.rssi.map(|r| format!(", {r} dBm")).unwrap_or_default()
        );
        let chars = match &p.chars {
            Ok(c) => c,
            Err(e) => {
                let _ = writeln!(out, "# Not drafted: {e}.");
                continue;
            }
        };
        let mut model_props = String::new();
        let mut device_props = String::new();
        let mut names = std::collections::HashSet::new();
        let mut n = 0;
        for c in chars {
            let short_uuid = short(&c.uuid);
            let service = short(&c.service);
            if housekeeping(&service, &short_uuid) {
                continue;
            }
            let bytes = match &c.value {
                Ok(b) => b,
                Err(why) => {
                    let _ = writeln!(
                        out,
                        "# Characteristic {short_uuid} (service {service}, flags: {}) not drafted: {why}.",
                        flag_words(c.flags)
                    );
                    continue;
                }
            };
            if n == o.max_properties {
                let _ = writeln!(
                    out,
                    "# Characteristic {short_uuid} not drafted (--max-properties {}).",
                    o.max_properties
                );
                continue;
            }
            n += 1;
            let known = assigned(&short_uuid);
            let (data_type, model_type, why, scale, unit, base) = match &known {
                Some(a) => (
                    a.data_type,
                    a.model_type,
                    format!("the Bluetooth SIG's {} ({short_uuid})", a.name),
                    a.scale,
                    a.unit,
                    a.name.to_string(),
                ),
                None => {
                    let (d, m, why) = guess(bytes);
                    (
                        d,
                        m,
                        why,
                        None,
                        None,
                        format!("char-{}", short_uuid.to_ascii_lowercase()),
                    )
                }
            };
            let mut prop = base.clone();
            let mut k = 2;
            while !names.insert(prop.clone()) {
                prop = format!("{base}-{k}");
                k += 1;
            }
            let shown = match data_type {
                "string" => String::from_utf8_lossy(bytes).into_owned(),
                _ => {
                    decode(bytes, data_type, scale).unwrap_or_else(|| mapper_sdk::field::hex(bytes))
                }
            };
            seen.push((name.clone(), prop.clone(), model_type, shown.clone()));
            let writable = c
                .flags
                .intersects(CharPropFlags::WRITE | CharPropFlags::WRITE_WITHOUT_RESPONSE);
            let notifies = c
                .flags
                .intersects(CharPropFlags::NOTIFY | CharPropFlags::INDICATE);
            let _ = write!(
                model_props,
                "    - name: {prop}   # {why}; read {shown}{}\n      type: {model_type}\n      accessMode: {}\n",
                if notifies {
                    "; it notifies (the mapper subscribes)"
                } else {
                    ""
                },
                if writable { "ReadWrite" } else { "ReadOnly" }
            );
            if let Some(u) = unit {
                let _ = writeln!(model_props, "      unit: {}", quote(u));
            }
            let mut visitor = format!("characteristicUUID: {}", quote(&short_uuid));
            if chars.iter().filter(|o| o.uuid == c.uuid).count() > 1 {
                let _ = write!(visitor, ", serviceUUID: {}", quote(&service));
            }
            let _ = write!(visitor, ", dataType: {data_type}");
            if let Some(s) = scale {
                let _ = write!(visitor, ", scale: {s}");
            }
            let _ = writeln!(
                device_props,
                "    - name: {prop}\n      collectCycle: 1000\n      reportCycle: 1000\n      visitors: {{protocolName: ble, configData: {{{visitor}}}}}"
            );
        }
        if n == 0 {
            let _ = writeln!(out, "# No readable characteristic: nothing to draft.");
            continue;
        }
        let adapter = match &o.adapter {
            Some(a) => format!(", adapter: {}", quote(a)),
            None => String::new(),
        };
        let _ = write!(
            out,
            "apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata:\n  name: {name}-model\n  namespace: default\nspec:\n  protocol: ble\n  properties:\n{model_props}---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  # nodeName: the edge node in range of {}\n  deviceModelRef:\n    name: {name}-model\n  protocol:\n    protocolName: ble\n    configData: {{macAddress: {}{adapter}}}\n  properties:\n{device_props}",
            p.address,
            quote(&p.address)
        );
    }
    Draft {
        manifests: out,
        seen,
    }
}

/// The value of little-endian `bytes` as `data_type`, scaled, as the mapper reports it.
fn decode(bytes: &[u8], data_type: &str, scale: Option<f64>) -> Option<String> {
    let mut b = [0u8; 8];
    let n = bytes.len().min(8);
    b[..n].copy_from_slice(&bytes[..n]);
    let v: f64 = match (data_type, bytes.len()) {
        ("uint8", 1..) => f64::from(bytes[0]),
        ("int8", 1..) => f64::from(bytes[0] as i8),
        ("uint16", 2..) => f64::from(u16::from_le_bytes([b[0], b[1]])),
        ("int16", 2..) => f64::from(i16::from_le_bytes([b[0], b[1]])),
        ("uint32", 4..) => f64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ("int32", 4..) => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ("float32", 4..) => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ("int64", 8..) => return Some(i64::from_le_bytes(b).to_string()),
        ("float64", 8..) => f64::from_le_bytes(b),
        _ => return None,
    };
    let v = scale.map_or(v, |s| v * s);
    // Rounded to what the scale can hold, as a reading is shown.
    Some(match scale {
        Some(s) => {
            let places = (-s.log10()).ceil().max(0.0) as usize;
            format!("{v:.places$}")
                .trim_end_matches('0')
                .trim_end_matches('.')
                .to_string()
        }
        None => v.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sig_uuids_have_their_short_form_and_others_stay_whole() {
        let t: Uuid = "00002a6e-0000-1000-8000-00805f9b34fb"
            .parse()
            .expect("uuid");
        assert_eq!(short(&t), "2A6E");
        let custom: Uuid = "12345678-1234-5678-1234-56789abcdef0"
            .parse()
            .expect("uuid");
        assert_eq!(short(&custom), "12345678-1234-5678-1234-56789abcdef0");
    }

    #[test]
    fn bytes_are_guessed_by_how_they_look() {
        assert_eq!(guess(b"P7-RUN").0, "string");
        assert_eq!(guess(&12.5f32.to_le_bytes()).0, "float32");
        assert_eq!(guess(&(-42i16).to_le_bytes()).0, "int16");
        assert_eq!(guess(&[1, 2, 3]).0, "bytes");
        assert_eq!(
            decode(&[0x29, 0x09], "int16", Some(0.01)).as_deref(),
            Some("23.45")
        );
        assert_eq!(
            decode(&[0x02, 0x76, 0x0f, 0x00], "uint32", Some(0.1)).as_deref(),
            Some("101325")
        );
    }
}
