//! One BLE peripheral: found by address or advertised name, connected with a timeout, its GATT
//! characteristics read (one read per characteristic per cycle, however many properties it
//! holds), written, and subscribed to where they can notify.
//!
//! A dropped connection reaches the SDK at once as a link error from the event task (BlueZ's
//! `Connected` going false), the SDK backs off, and [`Device::connect`] finds the device again
//! (scanning when BlueZ does not know it) and subscribes again.

use crate::config::{Connection, Point};
use btleplug::api::{
    Central, CentralEvent, CharPropFlags, Characteristic, Manager as _, Peripheral as _,
    ScanFilter, WriteType,
};
use btleplug::platform::{Adapter, Manager, Peripheral};
use futures_util::StreamExt;
use mapper_sdk::{Driver, DriverError, ReadValue, driver::Changes, driver::Reading};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::{Instant, timeout};

/// How often the devices BlueZ knows are looked through while scanning.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// The Bluetooth adapters, shared by every device of the mapper: one D-Bus connection to
/// BlueZ, and one scan per adapter while any device is being looked for.
#[derive(Clone, Default)]
pub struct Radio(Arc<RadioInner>);

#[derive(Default)]
struct RadioInner {
    manager: tokio::sync::OnceCell<Manager>,
    /// Devices looking for their peripheral, by adapter.
    scanning: Mutex<HashMap<String, usize>>,
}

/// Scanning on an adapter until the last guard is dropped.
struct Scan {
    radio: Radio,
    adapter: Adapter,
    key: String,
}

impl Drop for Scan {
    fn drop(&mut self) {
        let last = {
            let mut s = self
                .radio
                .0
                .scanning
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let n = s.entry(self.key.clone()).or_insert(1);
            *n = n.saturating_sub(1);
            *n == 0
        };
        if last {
            let adapter = self.adapter.clone();
            tokio::spawn(async move {
                if let Err(e) = adapter.stop_scan().await {
                    tracing::debug!(error = %e, "stopping the scan");
                }
            });
        }
    }
}

/// The adapter's name: `hci0` of btleplug's `"hci0 (usb:...)"`.
async fn adapter_name(a: &Adapter) -> String {
    a.adapter_info()
        .await
        .map(|i| i.split_whitespace().next().unwrap_or_default().to_string())
        .unwrap_or_default()
}

impl Radio {
    /// The adapter called `name` (`hci0`), or the first one.
    async fn adapter(&self, name: Option<&str>) -> Result<(Adapter, String), DriverError> {
        let manager = self
            .0
            .manager
            .get_or_try_init(Manager::new)
            .await
            .map_err(|e| {
                DriverError::link(format!(
                    "cannot reach BlueZ on the D-Bus system bus: {e} (is bluetoothd running?)"
                ))
            })?;
        let adapters = manager
            .adapters()
            .await
            .map_err(|e| DriverError::link(format!("cannot list Bluetooth adapters: {e}")))?;
        let mut names = Vec::with_capacity(adapters.len());
        for a in adapters {
            let n = adapter_name(&a).await;
            if name.is_none_or(|want| want == n) {
                return Ok((a, n));
            }
            names.push(n);
        }
        Err(DriverError::link(match name {
            Some(want) => format!("no Bluetooth adapter {want} (BlueZ has {names:?})"),
            None => "BlueZ has no Bluetooth adapter".to_string(),
        }))
    }

    /// Starts scanning on `adapter` unless another device already is.
    async fn scan(&self, adapter: &Adapter, key: &str) -> Result<Scan, DriverError> {
        let first = {
            let mut s = self.0.scanning.lock().unwrap_or_else(|e| e.into_inner());
            let n = s.entry(key.to_string()).or_insert(0);
            *n += 1;
            *n == 1
        };
        let guard = Scan {
            radio: self.clone(),
            adapter: adapter.clone(),
            key: key.to_string(),
        };
        if first {
            adapter
                .start_scan(ScanFilter::default())
                .await
                .map_err(|e| DriverError::link(format!("cannot scan for devices on {key}: {e}")))?;
        }
        Ok(guard)
    }
}

pub struct Device {
    id: String,
    conn: Connection,
    points: Vec<Point>,
    radio: Radio,
    peripheral: Option<Peripheral>,
    /// Each point's characteristic, or why the device does not have it.
    chars: Vec<Result<Characteristic, DriverError>>,
    /// Points whose characteristic notifies them.
    notifying: Vec<bool>,
    events: Option<tokio::task::JoinHandle<()>>,
    changes: Changes,
    requests: u64,
}

/// `flags` as BlueZ spells them, for messages.
fn flag_names(flags: CharPropFlags) -> String {
    let names: Vec<&str> = [
        (CharPropFlags::READ, "read"),
        (CharPropFlags::WRITE, "write"),
        (
            CharPropFlags::WRITE_WITHOUT_RESPONSE,
            "write-without-response",
        ),
        (CharPropFlags::NOTIFY, "notify"),
        (CharPropFlags::INDICATE, "indicate"),
    ]
    .into_iter()
    .filter(|(f, _)| flags.contains(*f))
    .map(|(_, n)| n)
    .collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

fn can_notify(c: &Characteristic) -> bool {
    c.properties
        .intersects(CharPropFlags::NOTIFY | CharPropFlags::INDICATE)
}

impl Device {
    pub fn new(id: String, conn: Connection, points: Vec<Point>, radio: Radio) -> Self {
        let n = points.len();
        Self {
            id,
            conn,
            points,
            radio,
            peripheral: None,
            chars: vec![Err(DriverError::config("not connected")); n],
            notifying: vec![false; n],
            events: None,
            changes: Changes::default(),
            requests: 0,
        }
    }

    fn alive(&self) -> bool {
        self.events.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Whether `p` is the configured device.
    async fn is_target(&self, p: &Peripheral) -> bool {
        if let Some(a) = &self.conn.address
            && !p.address().to_string().eq_ignore_ascii_case(a)
        {
            return false;
        }
        match &self.conn.name {
            None => true,
            Some(n) => p.properties().await.ok().flatten().is_some_and(|pp| {
                pp.local_name.as_deref() == Some(n) || pp.advertisement_name.as_deref() == Some(n)
            }),
        }
    }

    /// The peripheral among those BlueZ knows, scanning for up to `scanTimeout` when it is not.
    async fn find(&self, adapter: &Adapter, name: &str) -> Result<Peripheral, DriverError> {
        let deadline = Instant::now() + self.conn.scan_timeout;
        let mut scan = None;
        loop {
            let known = adapter.peripherals().await.map_err(|e| {
                DriverError::link(format!("cannot list the devices {name} knows: {e}"))
            })?;
            for p in known {
                if self.is_target(&p).await {
                    return Ok(p);
                }
            }
            if Instant::now() >= deadline {
                return Err(DriverError::link(format!(
                    "{} was not seen by {name} within {:?}: is it powered, advertising and in range?",
                    self.conn.target(),
                    self.conn.scan_timeout
                )));
            }
            if scan.is_none() {
                scan = Some(self.radio.scan(adapter, name).await?);
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    /// Subscribes to each characteristic that notifies a point (once per characteristic).
    async fn subscribe(&mut self, p: &Peripheral) {
        self.notifying = vec![false; self.points.len()];
        let mut done: HashMap<(uuid::Uuid, uuid::Uuid), bool> = HashMap::new();
        for i in 0..self.points.len() {
            let Ok(c) = &self.chars[i] else { continue };
            let wanted = self.points[i].notify;
            if wanted == Some(false) {
                continue;
            }
            if !can_notify(c) {
                if wanted == Some(true) {
                    tracing::warn!(device = %self.id, characteristic = %c.uuid, flags = %flag_names(c.properties), "notify is set but the characteristic cannot notify; polling it");
                }
                continue;
            }
            let key = (c.service_uuid, c.uuid);
            let ok = match done.get(&key) {
                Some(ok) => *ok,
                None => {
                    let ok = match timeout(self.conn.timeout, p.subscribe(c)).await {
                        Ok(Ok(())) => true,
                        Ok(Err(e)) => {
                            tracing::warn!(device = %self.id, characteristic = %c.uuid, error = %e, "cannot subscribe; polling it");
                            false
                        }
                        Err(_) => {
                            tracing::warn!(device = %self.id, characteristic = %c.uuid, "subscribing timed out; polling it");
                            false
                        }
                    };
                    done.insert(key, ok);
                    ok
                }
            };
            self.notifying[i] = ok;
        }
    }

    fn teardown(&mut self) {
        if let Some(t) = self.events.take() {
            t.abort();
        }
        self.peripheral = None;
        self.notifying = vec![false; self.points.len()];
        // What the old connection sent is stale now.
        self.changes.clear();
    }

    /// A failed GATT operation as a link error when the device is gone, else a device error.
    async fn failure(&self, what: String, e: Option<btleplug::Error>) -> DriverError {
        let connected = match &self.peripheral {
            Some(p) => p.is_connected().await.unwrap_or(false),
            None => false,
        };
        match e {
            None => DriverError::link(format!(
                "{what}: no answer within timeout ({:?})",
                self.conn.timeout
            )),
            Some(e @ (btleplug::Error::NotConnected | btleplug::Error::DeviceNotFound)) => {
                DriverError::link(format!("{what}: {e}"))
            }
            Some(e) if !connected => DriverError::link(format!("{what}: {e} (disconnected)")),
            Some(e) => DriverError::device(format!("{what}: {e}")),
        }
    }

    /// One characteristic's value.
    async fn read_char(&mut self, c: &Characteristic) -> Result<Vec<u8>, DriverError> {
        let Some(p) = self.peripheral.clone() else {
            return Err(DriverError::link("not connected"));
        };
        self.requests += 1;
        match timeout(self.conn.timeout, p.read(c)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self
                .failure(format!("reading characteristic {}", c.uuid), Some(e))
                .await),
            Err(_) => Err(self
                .failure(format!("reading characteristic {}", c.uuid), None)
                .await),
        }
    }

    /// Reads `due`, one read per characteristic.
    async fn read_now(&mut self, due: &[usize]) -> Vec<Reading> {
        let mut out = Vec::with_capacity(due.len());
        let mut groups: Vec<(Characteristic, Vec<usize>)> = Vec::new();
        for &i in due {
            match &self.chars[i] {
                Err(e) => out.push((i, Err(e.clone()))),
                Ok(c) if !c.properties.contains(CharPropFlags::READ) => out.push((
                    i,
                    Err(DriverError::config(format!(
                        "characteristic {} cannot be read (flags: {}); set notify or use a readable one",
                        c.uuid,
                        flag_names(c.properties)
                    ))),
                )),
                Ok(c) => match groups.iter_mut().find(|(g, _)| g == c) {
                    Some((_, members)) => members.push(i),
                    None => groups.push((c.clone(), vec![i])),
                },
            }
        }
        for (c, members) in groups {
            match self.read_char(&c).await {
                Ok(bytes) => out.extend(members.into_iter().map(|i| {
                    (
                        i,
                        self.points[i]
                            .decode(&bytes)
                            .map(ReadValue::from)
                            .map_err(|e| {
                                DriverError::device(format!("characteristic {}: {e}", c.uuid))
                            }),
                    )
                })),
                Err(e) => out.extend(members.into_iter().map(|i| (i, Err(e.clone())))),
            }
        }
        out
    }
}

/// `step` (to `do_` the device `target`, `doing` it) within `limit` (the connectTimeout); a
/// link error saying which step failed or took too long.
async fn within(
    limit: std::time::Duration,
    step: impl std::future::Future<Output = Result<(), btleplug::Error>>,
    do_: &str,
    doing: &str,
    target: &str,
) -> Result<(), DriverError> {
    match timeout(limit, step).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(DriverError::link(format!("cannot {do_} {target}: {e}"))),
        Err(_) => Err(DriverError::link(format!(
            "{doing} {target} took longer than connectTimeout ({limit:?})"
        ))),
    }
}

impl Driver for Device {
    /// Finds, connects and discovers the device, and subscribes to what can notify.
    async fn connect(&mut self) -> Result<(), DriverError> {
        if self.alive() {
            return Ok(());
        }
        self.teardown();
        let (adapter, name) = self.radio.adapter(self.conn.adapter.as_deref()).await?;
        let p = self.find(&adapter, &name).await?;
        let target = self.conn.target();
        let limit = self.conn.connect_timeout;
        if !p.is_connected().await.unwrap_or(false) {
            within(limit, p.connect(), "connect to", "connecting to", &target).await?;
        }
        // Events first, so that a drop during discovery is not missed.
        let events = adapter
            .events()
            .await
            .map_err(|e| DriverError::link(format!("cannot watch {name}'s events: {e}")))?;
        let notifications = p.notifications().await.map_err(|e| {
            DriverError::link(format!("cannot receive notifications of {target}: {e}"))
        })?;
        let services = p.discover_services();
        let (doing, done) = ("discover the services of", "discovering the services of");
        within(limit, services, doing, done, &target).await?;
        let offered = p.characteristics();
        self.chars = self
            .points
            .iter()
            .map(|pt| {
                offered
                    .iter()
                    .find(|c| {
                        c.uuid == pt.characteristic && pt.service.is_none_or(|s| s == c.service_uuid)
                    })
                    .cloned()
                    .ok_or_else(|| {
                        let services: Vec<String> = p
                            .services()
                            .iter()
                            .map(|s| s.uuid.to_string())
                            .collect();
                        DriverError::config(match pt.service {
                            Some(s) => format!(
                                "{target} has no characteristic {} in service {s} (its services: {services:?})",
                                pt.characteristic
                            ),
                            None => format!(
                                "{target} has no characteristic {} (its services: {services:?})",
                                pt.characteristic
                            ),
                        })
                    })
            })
            .collect();
        self.subscribe(&p).await;
        // Readings of notifying characteristics, by characteristic.
        let mut routes: HashMap<(uuid::Uuid, uuid::Uuid), Vec<(usize, Point)>> = HashMap::new();
        for (i, c) in self.chars.iter().enumerate() {
            if let (true, Ok(c)) = (self.notifying[i], c) {
                routes
                    .entry((c.service_uuid, c.uuid))
                    .or_default()
                    .push((i, self.points[i].clone()));
            }
        }
        let tx = self.changes.sender();
        let pid = p.id();
        let device = self.id.clone();
        self.events = Some(tokio::spawn(async move {
            let mut events = events;
            let mut notifications = notifications;
            loop {
                tokio::select! {
                    n = notifications.next() => {
                        let Some(n) = n else { break };
                        for (i, pt) in routes.get(&(n.service_uuid, n.uuid)).into_iter().flatten() {
                            let r = pt.decode(&n.value).map(ReadValue::from).map_err(DriverError::device);
                            if tx.send((*i, r)).is_err() {
                                return;
                            }
                        }
                    }
                    e = events.next() => match e {
                        Some(CentralEvent::DeviceDisconnected(id)) if id == pid => break,
                        Some(_) => {}
                        None => break,
                    },
                }
            }
            tracing::info!(device = %device, "BLE connection lost");
            let _ = tx.send((0, Err(DriverError::link("the BLE connection was lost"))));
        }));
        self.peripheral = Some(p);
        // Notifying characteristics that can also be read start with their current value.
        let first: Vec<usize> = (0..self.points.len())
            .filter(|&i| {
                self.notifying[i]
                    && matches!(&self.chars[i], Ok(c) if c.properties.contains(CharPropFlags::READ))
            })
            .collect();
        if !first.is_empty() {
            for r in self.read_now(&first).await {
                let _ = self.changes.sender().send(r);
            }
        }
        tracing::info!(device = %self.id, target = %target, adapter = %name, "BLE device connected");
        Ok(())
    }

    async fn read(&mut self, due: &[usize]) -> Vec<Reading> {
        if self.peripheral.is_none() {
            let e = DriverError::link("not connected");
            return due.iter().map(|&i| (i, Err(e.clone()))).collect();
        }
        self.read_now(due).await
    }

    async fn write(&mut self, i: usize, value: &str) -> Result<(), DriverError> {
        let Some(p) = self.peripheral.clone() else {
            return Err(DriverError::link("not connected"));
        };
        let c = self.chars[i].clone()?;
        let flags = c.properties;
        if !flags.intersects(CharPropFlags::WRITE | CharPropFlags::WRITE_WITHOUT_RESPONSE) {
            return Err(DriverError::config(format!(
                "characteristic {} is not writable (flags: {})",
                c.uuid,
                flag_names(flags)
            )));
        }
        let (offset, bytes) = self.points[i].encode(value).map_err(DriverError::config)?;
        let without_response = self.points[i].without_response;
        // The value goes in whole unless the property is one part of the characteristic.
        let shared = self
            .chars
            .iter()
            .enumerate()
            .any(|(j, o)| j != i && matches!(o, Ok(o) if *o == c));
        let payload = if offset == 0 && !shared {
            bytes
        } else if flags.contains(CharPropFlags::READ) {
            let mut current = self.read_char(&c).await?;
            let end = offset + bytes.len();
            if current.len() < end {
                current.resize(end, 0);
            }
            current[offset..end].copy_from_slice(&bytes);
            current
        } else {
            return Err(DriverError::config(format!(
                "characteristic {} holds more than this property but cannot be read, so it cannot be written in part",
                c.uuid
            )));
        };
        let kind = if without_response || !flags.contains(CharPropFlags::WRITE) {
            WriteType::WithoutResponse
        } else {
            WriteType::WithResponse
        };
        self.requests += 1;
        let what = format!("writing characteristic {}", c.uuid);
        match timeout(self.conn.timeout, p.write(&c, &payload, kind)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.failure(what, Some(e)).await),
            Err(_) => Err(self.failure(what, None).await),
        }
    }

    async fn stop(&mut self) {
        let p = self.peripheral.clone();
        self.teardown();
        if let Some(p) = p
            && let Err(e) = p.disconnect().await
        {
            tracing::debug!(device = %self.id, error = %e, "disconnecting");
        }
    }

    fn requests(&self) -> u64 {
        self.requests
    }

    async fn changes(&mut self) -> Vec<Reading> {
        self.changes.next_batch().await
    }

    fn subscribed(&self, i: usize) -> bool {
        self.notifying.get(i).copied().unwrap_or(false) && self.alive()
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if let Some(t) = self.events.take() {
            t.abort();
        }
    }
}
