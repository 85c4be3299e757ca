//! BLE devices (`mapper-ble`): every device of the manifests a peripheral behind a scripted
//! BlueZ on a private D-Bus bus (`sim::bluez`: `dbus-daemon` and python-dbusmock), each
//! property's characteristic in its service, its bytes laid out as the mapper's own parser of
//! visitors reads them (offset, length, type, byte order, scale, bits; several properties may
//! share a characteristic). The mapper is pointed at the bus with `DBUS_SYSTEM_BUS_ADDRESS`.
//!
//! Faults: `noAnswer` and `reboot` take the device out of range for their seconds (its
//! connection dropped), `disconnect` drops its connection; the others are Modbus's.

use crate::device::{Ble, SimDevice, SimPoint, Visit};
use mapper_ble::config::{Format, Point};
use serde_json::{Value, json};
use sim::modbus_sim::Sim;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Where a characteristic is when its visitor names no service.
const DEVSIM_SERVICE: &str = "0000fe5d-0000-1000-8000-00805f9b34fb";

/// A characteristic, as `(service, characteristic)` UUIDs in lower case.
type Key = (String, String);

fn key(p: &Point) -> Key {
    (
        p.service
            .map(|s| s.to_string())
            .unwrap_or_else(|| DEVSIM_SERVICE.into()),
        p.characteristic.to_string(),
    )
}

/// The bytes of a characteristic holding each of `points`' values, checked by reading every
/// value back with the mapper's decoder.
pub fn bytes(points: &[(&Point, String)]) -> Result<Vec<u8>, String> {
    let mut out: Vec<u8> = Vec::new();
    for (p, v) in points {
        let (at, b) = p.encode(v).map_err(|e| e.to_string())?;
        let bit = matches!(&p.format, Format::Field(f) if matches!(f.kind, mapper_serial::field::Kind::Bit(_)));
        if out.len() < at + b.len() {
            out.resize(at + b.len(), 0);
        }
        for (i, x) in b.iter().enumerate() {
            if bit {
                out[at + i] |= x;
            } else {
                out[at + i] = *x;
            }
        }
    }
    for (p, v) in points {
        let got = p.decode(&out).map_err(|e| e.to_string())?;
        if !same(&got, v) {
            return Err(format!("reads back as {got:?}, not {v:?}"));
        }
    }
    Ok(out)
}

fn same(got: &str, want: &str) -> bool {
    got == want.trim()
        || matches!((got.parse::<f64>(), want.trim().parse::<f64>()), (Ok(a), Ok(b)) if (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0))
        || matches!(
            (got, want.trim().to_ascii_lowercase().as_str()),
            ("true", "1" | "on") | ("false", "0" | "off")
        )
}

/// `value` as `p` holds it (as the mapper reads it back; an integer field's value rounded), or
/// why it cannot be.
pub fn check(p: &Point, value: &str) -> Result<String, String> {
    let (at, b) = p.encode(value).map_err(|e| e.to_string())?;
    let mut out = vec![0u8; at];
    out.extend(b);
    p.decode(&out).map_err(|e| e.to_string())
}

/// What a property holds at the start.
pub fn initial(p: &Point) -> String {
    match &p.format {
        Format::Bool(_) => "false".into(),
        Format::Field(f) if matches!(f.kind, mapper_serial::field::Kind::Bit(_)) => "false".into(),
        Format::Field(_) => "0".into(),
        Format::Text { .. } => String::new(),
        Format::Bytes { .. } => String::new(),
    }
}

/// A BLE device of the manifests; or every problem with its field path.
pub fn layout(
    id: &str,
    device: &api::v1beta1::Device,
    model: &api::v1beta1::DeviceModel,
    config: &serde_json::Map<String, Value>,
    named: &[String],
) -> Result<SimDevice, Vec<(String, String)>> {
    let conn = mapper_ble::config::Connection::from_config(config)
        .map_err(|e| vec![(format!("spec.protocol.configData.{}", e.key), e.reason)])?;
    let Some(address) = conn.address.clone() else {
        return Err(vec![(
            "spec.protocol.configData.macAddress".into(),
            "devsim simulates a device by its macAddress (a name alone is not enough)".into(),
        )]);
    };
    let mut errors = Vec::new();
    let mut points: Vec<SimPoint> = Vec::new();
    for (at, p, mp, visitor) in crate::device::properties(device, model, named, &mut errors) {
        let point = match Point::from_config(visitor, mp.and_then(|m| m.type_).map(|t| t.as_str()))
        {
            Ok(pt) => pt,
            Err(e) => {
                errors.push((format!("{at}.visitors.configData.{}", e.key), e.reason));
                continue;
            }
        };
        let initial = initial(&point);
        if let Err(e) = check(&point, &initial) {
            errors.push((format!("{at}.visitors.configData"), e));
            continue;
        }
        points.push(SimPoint::of(p, mp, initial, Visit::Ble(point)));
    }
    // Properties of one characteristic must fit it together.
    let mut by_char: BTreeMap<Key, Vec<(&Point, String)>> = BTreeMap::new();
    for p in &points {
        if let Visit::Ble(bp) = &p.point {
            by_char
                .entry(key(bp))
                .or_default()
                .push((bp, p.initial.clone()));
        }
    }
    for ((_, c), shared) in &by_char {
        if let Err(e) = bytes(shared) {
            errors.push((
                "spec.properties".into(),
                format!("the properties of characteristic {c} do not fit it together: {e}"),
            ));
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(SimDevice {
        ble: Some(Ble {
            address,
            adapter: conn.adapter.unwrap_or_else(|| "hci0".into()),
        }),
        ..SimDevice::bare(id, points)
    })
}

/// The characteristics of one device with the properties in each.
fn characteristics(d: &SimDevice) -> BTreeMap<Key, Vec<(String, Point)>> {
    let mut out: BTreeMap<Key, Vec<(String, Point)>> = BTreeMap::new();
    for p in &d.points {
        if let Visit::Ble(bp) = &p.point {
            out.entry(key(bp))
                .or_default()
                .push((p.name.clone(), bp.clone()));
        }
    }
    out
}

/// Stops the BlueZ of a set of devices when dropped.
#[derive(Debug, Default)]
pub struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Starts BlueZ with `devices` (each with its simulator) and keeps their characteristics and
/// the simulators' values in step on its own thread until the returned guard is dropped.
/// Returns the bus address the mapper takes as `DBUS_SYSTEM_BUS_ADDRESS`.
pub fn start(devices: Vec<(SimDevice, Sim)>) -> Result<(String, Running), String> {
    let adapters: std::collections::BTreeSet<&str> = devices
        .iter()
        .filter_map(|(d, _)| d.ble.as_ref().map(|b| b.adapter.as_str()))
        .collect();
    if adapters.len() > 1 {
        return Err(format!(
            "devsim simulates one Bluetooth adapter, not {adapters:?}"
        ));
    }
    let adapter = adapters.into_iter().next().unwrap_or("hci0").to_string();
    let mut spec_devices = Vec::new();
    let mut tracked = Vec::new();
    for (d, sim) in &devices {
        let Some(ble) = &d.ble else { continue };
        let chars = characteristics(d);
        let mut services: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for ((service, c), props) in &chars {
            let writable = d
                .points
                .iter()
                .any(|p| p.writable && props.iter().any(|(n, _)| *n == p.name));
            let values: Vec<(&Point, String)> =
                props.iter().map(|(n, p)| (p, value(sim, d, n))).collect();
            let b = bytes(&values).map_err(|e| format!("{}: {c}: {e}", d.id))?;
            let mut flags = vec!["read", "notify"];
            if writable {
                flags.push("write");
            }
            services.entry(service.clone()).or_default().push(json!({
                "uuid": c, "flags": flags, "value": mapper_serial::field::hex(&b).replace(' ', ""),
            }));
            tracked.push(Tracked {
                device: d.id.clone(),
                address: ble.address.clone(),
                characteristic: c.clone(),
                props: props.clone(),
                sim: sim.clone(),
                last: Some(b),
                misfit: None,
            });
        }
        spec_devices.push(json!({
            "address": ble.address,
            "name": d.id.rsplit('/').next().unwrap_or_default(),
            "services": services.into_iter().map(|(uuid, characteristics)| json!({"uuid": uuid, "characteristics": characteristics})).collect::<Vec<_>>(),
        }));
    }
    let mut bluez =
        sim::bluez::BlueZ::try_start(&json!({"adapter": adapter, "devices": spec_devices}))?;
    let bus = bluez.bus.clone();
    // BlueZ's reads are not seen one by one: a scenario's clock that starts with the first
    // request starts now.
    for (_, sim) in &devices {
        sim.requests.fetch_add(1, Ordering::Relaxed);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let guard = Running(stop.clone());
    let sims: Vec<(String, String, Sim)> = devices
        .iter()
        .filter_map(|(d, s)| Some((d.id.clone(), d.ble.as_ref()?.address.clone(), s.clone())))
        .collect();
    std::thread::spawn(move || {
        let mut away: BTreeMap<String, bool> = BTreeMap::new();
        let mut epochs: BTreeMap<String, u32> = sims
            .iter()
            .map(|(id, _, s)| (id.clone(), s.edit(|st| st.epoch)))
            .collect();
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            for (id, address, s) in &sims {
                let (silent, epoch) = s.edit(|st| (st.silent, st.epoch));
                let was_away = away.get(id).copied().unwrap_or(false);
                let moved = epochs.get(id) != Some(&epoch);
                epochs.insert(id.clone(), epoch);
                if (silent || moved) && !was_away {
                    let _ = bluez.try_command(&format!("vanish {address}"));
                    away.insert(id.clone(), true);
                } else if !silent && (was_away || moved) {
                    let _ = bluez.try_command(&format!("appear {address}"));
                    away.insert(id.clone(), false);
                }
            }
            for t in &mut tracked {
                t.sync(&mut bluez);
            }
        }
    });
    Ok((bus, guard))
}

/// One characteristic kept in step with its simulator.
struct Tracked {
    device: String,
    address: String,
    characteristic: String,
    props: Vec<(String, Point)>,
    sim: Sim,
    /// What the characteristic was last given (or last seen holding).
    last: Option<Vec<u8>>,
    /// Why its values did not fit, once said (said again only after they fit again).
    misfit: Option<String>,
}

fn value(sim: &Sim, d: &SimDevice, name: &str) -> String {
    sim.edit(|s| s.text.get(name).cloned()).unwrap_or_else(|| {
        d.points
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.initial.clone())
            .unwrap_or_default()
    })
}

impl Tracked {
    fn sync(&mut self, bluez: &mut sim::bluez::BlueZ) {
        let now = bluez
            .try_command(&format!("get {} {}", self.address, self.characteristic))
            .ok()
            .and_then(|h| mapper_serial::field::parse_hex(&h).ok());
        if now.is_some() && now != self.last {
            // Written by the mapper: the device holds it.
            let b = now.clone().unwrap_or_default();
            self.sim.edit(|s| {
                for (n, p) in &self.props {
                    if let Ok(v) = p.decode(&b) {
                        s.text.insert(n.clone(), v);
                    }
                }
            });
            self.last = now;
            return;
        }
        let values: Vec<(&Point, String)> = self
            .props
            .iter()
            .map(|(n, p)| {
                (
                    p,
                    self.sim
                        .edit(|s| s.text.get(n).cloned())
                        .unwrap_or_default(),
                )
            })
            .collect();
        match bytes(&values) {
            Ok(b) if Some(&b) != self.last.as_ref() => {
                self.misfit = None;
                let hex = mapper_serial::field::hex(&b).replace(' ', "");
                if bluez
                    .try_command(&format!(
                        "set {} {} {hex}",
                        self.address, self.characteristic
                    ))
                    .is_ok()
                {
                    self.last = Some(b);
                }
            }
            Ok(_) => self.misfit = None,
            Err(e) => {
                let why = e.to_string();
                if self.misfit.is_none() {
                    tracing::warn!(device = %self.device, characteristic = %self.characteristic, error = %why, "values do not fit (said once until they fit again)");
                    self.misfit = Some(why);
                }
            }
        }
    }
}
