//! The pure twin state machine: every operation checks its input completely, then applies it and
//! returns what changed ([`Applied`]). An operation that changes nothing returns an empty
//! [`Applied`]: no version bump, nothing to write, nothing to send.

use crate::model::{
    DeviceRow, DeviceTwin, Millis, OutboxEntry, PropertyTwin, Section, TwinValue, Version,
};
use api::paths::DeviceId;
use api::v1beta1::{AccessMode, Device, DeviceModel, PropertyType};
use api::validate::names::check_twin_key;
use std::collections::{BTreeMap, HashMap};

mod decl;
mod error;

pub use decl::{DeviceDecl, PropertyDecl};
pub use error::TwinError;

pub type Result<T, E = TwinError> = std::result::Result<T, E>;

/// Size caps of values and documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of one value (desired, reported or observed). Default 64 KiB.
    pub max_value_bytes: usize,
    /// Bytes of all values of one device twin. Default 1 MiB.
    pub max_document_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_value_bytes: 64 * 1024,
            max_document_bytes: 1024 * 1024,
        }
    }
}

/// One reported property from a mapper or an app.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reported {
    pub property: String,
    /// The value read from the device.
    pub value: Option<String>,
    /// The desired value the device has applied, as the mapper knows it.
    pub observed_desired: Option<String>,
    /// For a property the device does not declare: `Some(type)` creates it on first report, as
    /// KubeEdge's MQTT `twin/update` does; `None` (DMI, where the spec lists every property)
    /// refuses it as unknown.
    pub value_type: Option<PropertyType>,
    /// Why the property could not be read: kept on the property with its time (the reported
    /// value stays the last good one) until a value comes.
    pub error: Option<String>,
    /// A desired value the device refused for good, and why: kept on the property while that
    /// is still its desired value.
    pub write_error: Option<(String, String)>,
}

/// One changed property: its state before and after (`None` where it did not exist).
#[derive(Clone, Debug, PartialEq)]
pub struct PropertyChange {
    pub name: String,
    pub last: Option<PropertyTwin>,
    pub current: Option<PropertyTwin>,
}

/// What an operation changed. Empty when nothing changed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Applied {
    pub device: Option<DeviceId>,
    /// The device row after the operation, when it changed.
    pub row: Option<DeviceRow>,
    pub added: bool,
    pub removed: bool,
    pub changes: Vec<PropertyChange>,
    /// Changes that must reach the cloud.
    pub outbox: Vec<OutboxEntry>,
    /// Desired values that differ from the reported ones, over the device's whole twin (as
    /// KubeEdge rebuilds its delta after every update).
    pub delta: BTreeMap<String, String>,
    /// The device's state (or its `last_online`) changed.
    pub state_changed: bool,
    /// The request this change was made for, when its requester publishes the change itself.
    pub event_id: Option<String>,
}

impl Applied {
    /// Whether the operation changed nothing.
    pub fn is_noop(&self) -> bool {
        self.row.is_none()
            && !self.added
            && !self.removed
            && self.changes.is_empty()
            && self.outbox.is_empty()
    }

    /// Whether a desired value changed (what mappers must be told).
    pub fn desired_changed(&self) -> impl Iterator<Item = (&str, &TwinValue)> {
        self.changes.iter().filter_map(|c| {
            let cur = c.current.as_ref()?.desired.as_ref()?;
            let last = c.last.as_ref().and_then(|l| l.desired.as_ref());
            (last.map(|l| &l.value) != Some(&cur.value)).then_some((c.name.as_str(), cur))
        })
    }
}

/// The states a device may report (lower-cased), as KubeEdge accepts them.
pub const DEVICE_STATES: [&str; 5] = ["online", "offline", "ok", "unknown", "unhealthy"];

/// How often an unchanged online state refreshes `last_online`, in milliseconds.
pub const LAST_ONLINE_REFRESH_MS: Millis = 60_000;

/// The twins of all devices of a node.
#[derive(Debug, Default)]
pub struct Engine {
    devices: HashMap<DeviceId, DeviceTwin>,
    limits: Limits,
    next_seq: u64,
}

impl Engine {
    /// An engine holding `twins`; `next_seq` is the next outbox sequence number.
    pub fn new(twins: Vec<DeviceTwin>, limits: Limits, next_seq: u64) -> Self {
        let devices = twins.into_iter().map(|t| (t.id(), t)).collect();
        Self {
            devices,
            limits,
            next_seq,
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn get(&self, id: &DeviceId) -> Option<&DeviceTwin> {
        self.devices.get(id)
    }

    pub fn len(&self) -> usize {
        self.devices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    pub fn devices(&self) -> impl Iterator<Item = &DeviceTwin> {
        self.devices.values()
    }

    /// Makes every twin again, from a copy written out first, and drops the old ones before
    /// the new ones are made: twins created in a burst (a first start declares a thousand
    /// devices) lie scattered among the burst's short-lived allocations, and the holes between
    /// them stay resident; made again once the burst is over, they pack together. Changes
    /// nothing: what is in memory only (`last_read`) is carried over, and a copy that does not
    /// read back equal to the twins is not used (the error says so and the twins stay as they
    /// were).
    pub fn repack(&mut self) -> Result<(), String> {
        let twins: Vec<&DeviceTwin> = self.devices.values().collect();
        let packed = serde_json::to_vec(&twins).map_err(|e| format!("cannot write: {e}"))?;
        let read: Vec<DeviceTwin> =
            serde_json::from_slice(&packed).map_err(|e| format!("cannot read back: {e}"))?;
        if let Some(t) = twins.iter().zip(&read).find(|(a, b)| **a != *b) {
            return Err(format!("{} reads back different", t.0.id()));
        }
        drop(read);
        let reads: Vec<(DeviceId, String, Millis)> = twins
            .iter()
            .flat_map(|t| {
                t.properties
                    .iter()
                    .filter_map(|(k, p)| p.last_read.0.map(|at| (t.id(), k.clone(), at)))
            })
            .collect();
        drop(twins);
        self.devices = HashMap::new();
        // The same bytes, read by the same code that has just read them.
        let twins: Vec<DeviceTwin> =
            serde_json::from_slice(&packed).map_err(|e| format!("cannot read back: {e}"))?;
        drop(packed);
        self.devices = twins.into_iter().map(|t| (t.id(), t)).collect();
        for (id, name, at) in reads {
            if let Some(p) = self
                .devices
                .get_mut(&id)
                .and_then(|t| t.properties.get_mut(&name))
            {
                p.last_read.0 = Some(at);
            }
        }
        Ok(())
    }

    /// An alarm of the device to tell the cloud (`value`: the alarm as JSON): an outbox entry
    /// alone, the twin unchanged. Nothing for a device the twin does not hold.
    pub fn alarm(&mut self, id: &DeviceId, rule: &str, value: String, now: Millis) -> Applied {
        if !self.devices.contains_key(id) {
            return Applied::default();
        }
        let seq = self.seq();
        Applied {
            device: Some(id.clone()),
            outbox: vec![OutboxEntry {
                namespace: id.namespace.clone(),
                name: id.name.clone(),
                property: rule.to_string(),
                section: Section::Alarm,
                value,
                version: Version::default(),
                timestamp: now,
                seq,
            }],
            ..Applied::default()
        }
    }

    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    fn check_value(&self, property: &str, ty: PropertyType, value: &str) -> Result<()> {
        if value.len() > self.limits.max_value_bytes {
            return Err(TwinError::ValueTooLarge {
                property: property.into(),
                size: value.len(),
                limit: self.limits.max_value_bytes,
            });
        }
        ty.check_value(value)
            .map_err(|reason| TwinError::InvalidValue {
                property: property.into(),
                reason: reason.to_string(),
            })
    }

    fn check_document(&self, twin: &DeviceTwin) -> Result<()> {
        let size = twin.value_bytes();
        if size > self.limits.max_document_bytes {
            return Err(TwinError::DocumentTooLarge {
                device: twin.id(),
                size,
                limit: self.limits.max_document_bytes,
            });
        }
        Ok(())
    }

    fn twin(&self, id: &DeviceId) -> Result<&DeviceTwin> {
        self.devices
            .get(id)
            .ok_or_else(|| TwinError::UnknownDevice(id.clone()))
    }

    /// Adds a device or brings it in line with its declaration. A desired value in the spec that
    /// changed since the last declaration counts as a desired write from the cloud.
    pub fn upsert_device(&mut self, decl: &DeviceDecl, now: Millis) -> Result<Applied> {
        for p in &decl.properties {
            check_twin_key(&p.name).map_err(|reason| TwinError::InvalidName {
                property: p.name.clone(),
                reason,
            })?;
        }
        let added = !self.devices.contains_key(&decl.id);
        let before = self
            .devices
            .get(&decl.id)
            .cloned()
            .unwrap_or_else(|| DeviceTwin::new(&decl.id));
        let mut twin = before.clone();
        twin.row.description.clone_from(&decl.description);
        twin.row.model.clone_from(&decl.model);
        twin.row.protocol.clone_from(&decl.protocol);
        let mut desired_bumped = false;
        for p in &decl.properties {
            let prop = twin
                .properties
                .entry(p.name.clone())
                .or_insert_with(|| PropertyTwin::new(p.value_type, false, p.writable));
            prop.value_type = p.value_type;
            prop.writable = p.writable;
            prop.optional = false;
            prop.minimum.clone_from(&p.minimum);
            prop.maximum.clone_from(&p.maximum);
            prop.unit.clone_from(&p.unit);
            // A model change that puts the desired value out of range says so on the property.
            if prop.spec_desired == p.desired
                && prop.refused.is_none()
                && let Some(d) = prop.desired.clone()
                && let Some(why) = prop.out_of_range(&d.value)
            {
                prop.refuse(&d.value, &why, now);
            }
            if prop.spec_desired != p.desired {
                prop.spec_desired.clone_from(&p.desired);
                let Some(value) = &p.desired else { continue };
                // A spec value that can never land is refused on its property alone, tied to
                // the value (the desired one stays what it was): it holds back no other
                // property, nor a later value of this one.
                let refusal = match self.check_value(&p.name, p.value_type, value) {
                    Err(TwinError::InvalidValue { reason, .. }) => Some(reason),
                    Err(e) => Some(e.to_string()),
                    Ok(()) => prop.out_of_range(value),
                };
                if let Some(why) = refusal {
                    prop.refuse(value, &why, now);
                    continue;
                }
                if prop.desired.as_ref().map(|d| &d.value) != Some(value) {
                    prop.desired = Some(TwinValue {
                        value: value.clone(),
                        timestamp: now,
                    });
                    prop.clear_refusal();
                    prop.desired_version.cloud += 1;
                    desired_bumped = true;
                } else if prop.refused.is_some() && prop.refused.as_ref() != Some(value) {
                    // Back to the value already desired: a refusal of another one is moot.
                    prop.clear_refusal();
                }
            }
        }
        // Declared properties no longer in the spec go; ones created by reports stay.
        twin.properties
            .retain(|name, p| p.optional || decl.properties.iter().any(|d| &d.name == name));
        if desired_bumped {
            twin.row.desired_version += 1;
        }
        self.check_document(&twin)?;
        let applied = diff(&before, &twin, added);
        if applied.is_noop() {
            return Ok(applied);
        }
        self.devices.insert(decl.id.clone(), twin);
        // A new desired value clears a refusal: the cloud hears that too.
        Ok(self.record(applied, false))
    }

    /// Removes a device and its twin.
    pub fn remove_device(&mut self, id: &DeviceId) -> Result<Applied> {
        let twin = self
            .devices
            .remove(id)
            .ok_or_else(|| TwinError::UnknownDevice(id.clone()))?;
        Ok(Applied {
            device: Some(id.clone()),
            removed: true,
            changes: twin
                .properties
                .into_iter()
                .map(|(name, p)| PropertyChange {
                    name,
                    last: Some(p),
                    current: None,
                })
                .collect(),
            ..Applied::default()
        })
    }

    /// A desired value synced from the cloud with its version vector (KubeEdge's sync rule):
    /// rejected when the edge has a newer cloud or edge version, adopted otherwise.
    pub fn cloud_desired(
        &mut self,
        id: &DeviceId,
        property: &str,
        value: &str,
        version: Version,
        now: Millis,
    ) -> Result<Applied> {
        let twin = self.twin(id)?;
        let prop = twin
            .properties
            .get(property)
            .ok_or_else(|| TwinError::UnknownProperty {
                device: id.clone(),
                property: property.into(),
            })?;
        self.check_value(property, prop.value_type, value)?;
        let local = prop.desired_version;
        if local.cloud > version.cloud || local.edge > version.edge {
            return Err(TwinError::StaleVersion {
                property: property.into(),
                current: local,
                requested: version,
                current_value: prop.desired.clone(),
            });
        }
        let mut next = twin.clone();
        let p = next
            .properties
            .get_mut(property)
            .ok_or_else(|| TwinError::UnknownProperty {
                device: id.clone(),
                property: property.into(),
            })?;
        let changed = p.desired.as_ref().map(|d| d.value.as_str()) != Some(value);
        if changed {
            p.desired = Some(TwinValue {
                value: value.into(),
                timestamp: now,
            });
            p.clear_refusal();
        }
        p.desired_version = version;
        if changed {
            next.row.desired_version += 1;
        }
        self.commit(twin.clone(), next, false)
    }

    /// Desired values set at the edge (by an app, the HTTP API or `kectl`). With `if_version`,
    /// applied only if the device's desired version is still that number.
    pub fn edge_desired(
        &mut self,
        id: &DeviceId,
        values: &[(String, String)],
        if_version: Option<u64>,
        now: Millis,
    ) -> Result<Applied> {
        let twin = self.twin(id)?;
        if let Some(expected) = if_version
            && expected != twin.row.desired_version
        {
            return Err(TwinError::Conflict {
                device: id.clone(),
                expected,
                actual: twin.row.desired_version,
            });
        }
        for (name, value) in values {
            let prop = twin
                .properties
                .get(name)
                .ok_or_else(|| TwinError::UnknownProperty {
                    device: id.clone(),
                    property: name.clone(),
                })?;
            if !prop.writable {
                return Err(TwinError::ReadOnly {
                    property: name.clone(),
                });
            }
            self.check_value(name, prop.value_type, value)?;
            if let Some(reason) = prop.out_of_range(value) {
                return Err(TwinError::InvalidValue {
                    property: name.clone(),
                    reason,
                });
            }
        }
        let mut next = twin.clone();
        let mut changed = false;
        for (name, value) in values {
            if let Some(p) = next.properties.get_mut(name)
                && p.desired.as_ref().map(|d| &d.value) != Some(value)
            {
                p.desired = Some(TwinValue {
                    value: value.clone(),
                    timestamp: now,
                });
                p.clear_refusal();
                p.desired_version.edge += 1;
                changed = true;
            }
        }
        if changed {
            next.row.desired_version += 1;
        }
        self.commit(twin.clone(), next, true)
    }

    /// Values reported by a mapper or an app. Values equal to the stored ones change nothing.
    /// A property the device does not declare is created, optional, with the given type.
    pub fn report(&mut self, id: &DeviceId, reports: &[Reported], now: Millis) -> Result<Applied> {
        let applied = self.report_values(id, reports, now)?;
        // Each property read (changed or not) was read now: kept in memory only.
        if let Some(twin) = self.devices.get_mut(id) {
            for r in reports.iter().filter(|r| r.value.is_some()) {
                if let Some(p) = twin.properties.get_mut(&r.property) {
                    p.last_read.0 = Some(now);
                }
            }
        }
        Ok(applied)
    }

    fn report_values(
        &mut self,
        id: &DeviceId,
        reports: &[Reported],
        now: Millis,
    ) -> Result<Applied> {
        let twin = self.twin(id)?;
        for r in reports {
            let ty = match twin.properties.get(&r.property) {
                Some(p) => p.value_type,
                None => {
                    let ty = r.value_type.ok_or_else(|| TwinError::UnknownProperty {
                        device: id.clone(),
                        property: r.property.clone(),
                    })?;
                    check_twin_key(&r.property).map_err(|reason| TwinError::InvalidName {
                        property: r.property.clone(),
                        reason,
                    })?;
                    ty
                }
            };
            for v in [&r.value, &r.observed_desired].into_iter().flatten() {
                self.check_value(&r.property, ty, v)?;
            }
        }
        // Only the properties the report names are copied, changed and compared: this is the hot
        // path, and most reports change one value or none.
        let mut touched: Vec<(&str, Option<&PropertyTwin>, PropertyTwin)> = Vec::new();
        let mut changed = false;
        for r in reports {
            let at = match touched.iter().position(|(n, _, _)| *n == r.property) {
                Some(at) => at,
                None => {
                    let before = twin.properties.get(&r.property);
                    let after = before.cloned().unwrap_or_else(|| {
                        PropertyTwin::new(r.value_type.unwrap_or(PropertyType::String), true, true)
                    });
                    touched.push((r.property.as_str(), before, after));
                    touched.len() - 1
                }
            };
            let p = &mut touched[at].2;
            if let Some(v) = &r.value
                && p.reported.as_ref().map(|x| &x.value) != Some(v)
            {
                p.reported = Some(TwinValue {
                    value: v.clone(),
                    timestamp: now,
                });
                p.reported_version.edge += 1;
                changed = true;
            }
            if let Some(v) = &r.observed_desired
                && p.observed_desired.as_ref().map(|x| &x.value) != Some(v)
            {
                p.observed_desired = Some(TwinValue {
                    value: v.clone(),
                    timestamp: now,
                });
            }
            match (&r.error, &r.value) {
                (Some(e), _) if p.error.as_ref().map(|x| &x.value) != Some(e) => {
                    p.error = Some(TwinValue {
                        value: e.clone(),
                        timestamp: now,
                    });
                }
                (None, Some(_)) => p.error = None,
                _ => {}
            }
            let desired = p.desired.as_ref().map(|d| d.value.as_str());
            match &r.write_error {
                // A refusal of what is no longer desired is old news.
                Some((value, why))
                    if desired == Some(value.as_str())
                        && p.write_error.as_ref().map(|x| &x.value) != Some(why) =>
                {
                    p.refuse(value, why, now);
                }
                _ if p.write_error.is_some()
                    && desired.is_some()
                    && p.observed_desired.as_ref().map(|x| x.value.as_str()) == desired =>
                {
                    p.clear_refusal();
                }
                _ => {}
            }
        }
        touched.retain(|(_, before, after)| *before != Some(after));
        if touched.is_empty() {
            return Ok(Applied::default());
        }
        let size = touched
            .iter()
            .fold(twin.value_bytes(), |size, (_, before, after)| {
                size - before.map_or(0, PropertyTwin::value_bytes) + after.value_bytes()
            });
        if size > self.limits.max_document_bytes {
            return Err(TwinError::DocumentTooLarge {
                device: id.clone(),
                size,
                limit: self.limits.max_document_bytes,
            });
        }
        let touched: Vec<(String, PropertyTwin)> = touched
            .into_iter()
            .map(|(name, _, after)| (name.to_string(), after))
            .collect();
        let Some(twin) = self.devices.get_mut(id) else {
            return Err(TwinError::UnknownDevice(id.clone()));
        };
        if changed {
            twin.row.reported_version += 1;
        }
        let changes = touched
            .into_iter()
            .map(|(name, after)| {
                let last = twin.properties.insert(name.clone(), after.clone());
                PropertyChange {
                    name,
                    last,
                    current: Some(after),
                }
            })
            .collect();
        let applied = Applied {
            device: Some(id.clone()),
            row: changed.then(|| twin.row.clone()),
            changes,
            ..Applied::default()
        };
        Ok(self.record(applied, true))
    }

    /// One `twin/update` of an app: reported values, desired values and deletes of one device,
    /// as one change. Nothing is applied when any part is refused.
    pub fn twin_update(
        &mut self,
        id: &DeviceId,
        desired: &[(String, String)],
        reports: &[Reported],
        deletes: &[String],
        now: Millis,
    ) -> Result<Applied> {
        let before = self.twin(id)?.clone();
        let mut parts = Vec::new();
        let mut run = |engine: &mut Self| -> Result<()> {
            if !reports.is_empty() {
                parts.push(engine.report(id, reports, now)?);
            }
            if !desired.is_empty() {
                parts.push(engine.edge_desired(id, desired, None, now)?);
            }
            for d in deletes {
                parts.push(engine.delete_property(id, d)?);
            }
            Ok(())
        };
        if let Err(e) = run(self) {
            self.devices.insert(id.clone(), before);
            return Err(e);
        }
        let mut merged = Applied::default();
        for part in parts.into_iter().filter(|p| !p.is_noop()) {
            merged.device = part.device;
            merged.row = part.row.or(merged.row);
            merged.outbox.extend(part.outbox);
            for c in part.changes {
                match merged.changes.iter_mut().find(|m| m.name == c.name) {
                    Some(m) => m.current = c.current,
                    None => merged.changes.push(c),
                }
            }
        }
        merged.changes.retain(|c| c.last != c.current);
        if let Some(twin) = self.devices.get(id)
            && !merged.is_noop()
        {
            merged.row = Some(twin.row.clone()).filter(|_| merged.row.is_some());
            merged.delta = twin_delta(twin);
        }
        Ok(merged)
    }

    /// Deletes a property created by reports (KubeEdge allows this for `optional` twins only).
    pub fn delete_property(&mut self, id: &DeviceId, property: &str) -> Result<Applied> {
        let twin = self.twin(id)?;
        match twin.properties.get(property) {
            None => Ok(Applied::default()),
            Some(p) if !p.optional => Err(TwinError::NotOptional {
                property: property.into(),
            }),
            Some(_) => {
                let mut next = twin.clone();
                next.properties.remove(property);
                self.commit(twin.clone(), next, false)
            }
        }
    }

    /// The state of a device as its mapper reports it. `last_online` moves with an online or ok
    /// report, at most once per [`LAST_ONLINE_REFRESH_MS`] while the state stays the same.
    pub fn set_state(
        &mut self,
        id: &DeviceId,
        state: &str,
        reason: &str,
        now: Millis,
    ) -> Result<Applied> {
        let state = state.to_ascii_lowercase();
        if !DEVICE_STATES.contains(&state.as_str()) {
            return Err(TwinError::InvalidState(state));
        }
        let twin = self.twin(id)?;
        let online = matches!(state.as_str(), "online" | "ok");
        let refresh = online && now - twin.row.last_online >= LAST_ONLINE_REFRESH_MS;
        if twin.row.state == state && twin.row.state_reason == reason && !refresh {
            return Ok(Applied::default());
        }
        let mut next = twin.clone();
        next.row.state.clone_from(&state);
        reason.clone_into(&mut next.row.state_reason);
        if online {
            next.row.last_online = now;
        }
        let mut applied = self.commit(twin.clone(), next, false)?;
        applied.state_changed = true;
        let seq = self.seq();
        applied.outbox.push(OutboxEntry {
            namespace: id.namespace.clone(),
            name: id.name.clone(),
            property: String::new(),
            section: Section::State,
            value: state,
            version: Version::default(),
            timestamp: now,
            seq,
        });
        Ok(applied)
    }

    /// Checks the document cap, stores `next` and returns the difference, with outbox entries for
    /// changed desired (when `edge_origin`) and reported values.
    fn commit(
        &mut self,
        before: DeviceTwin,
        next: DeviceTwin,
        edge_origin: bool,
    ) -> Result<Applied> {
        self.check_document(&next)?;
        let applied = diff(&before, &next, false);
        if applied.is_noop() {
            return Ok(applied);
        }
        self.devices.insert(next.id(), next);
        Ok(self.record(applied, edge_origin))
    }

    /// Completes `applied`, a change already made to its device's twin: the delta among the
    /// properties it touched, and the outbox entries for the cloud (a desired value reaches the
    /// outbox when set at the edge, or when the spec's replaced an earlier one).
    fn record(&mut self, mut applied: Applied, edge_origin: bool) -> Applied {
        let Some(id) = applied.device.clone() else {
            return applied;
        };
        if let Some(twin) = self.devices.get(&id) {
            applied.delta = twin_delta(twin);
        }
        let mut outbox = Vec::new();
        for c in &applied.changes {
            let Some(cur) = &c.current else { continue };
            let last = c.last.as_ref();
            if let Some(r) = &cur.reported
                && last.and_then(|l| l.reported.as_ref()) != Some(r)
            {
                outbox.push((
                    c.name.clone(),
                    Section::Reported,
                    r.clone(),
                    cur.reported_version,
                ));
            }
            let errors = |p: &PropertyTwin| (p.error.clone(), p.write_error.clone());
            if last.map(errors) != Some(errors(cur))
                && (cur.error.is_some() || cur.write_error.is_some() || last.is_some())
            {
                let text =
                    |v: &Option<TwinValue>| v.as_ref().map(|x| x.value.clone()).unwrap_or_default();
                let at = [&cur.error, &cur.write_error]
                    .into_iter()
                    .flatten()
                    .map(|x| x.timestamp)
                    .max()
                    .unwrap_or_else(crate::now_millis);
                outbox.push((
                    c.name.clone(),
                    Section::Errors,
                    TwinValue {
                        value: serde_json::json!({"read": text(&cur.error), "write": text(&cur.write_error)}).to_string(),
                        timestamp: at,
                    },
                    cur.reported_version,
                ));
            }
            // A desired value set at the edge goes up (the cloud shows it as an override of
            // the spec's); so does a spec value that replaced an earlier one, so that the cloud
            // learns which value the edge now holds (an override ended).
            let last_desired = last.and_then(|l| l.desired.as_ref());
            if let Some(d) = &cur.desired
                && last_desired != Some(d)
                && (edge_origin || last_desired.is_some())
            {
                outbox.push((
                    c.name.clone(),
                    Section::Desired,
                    d.clone(),
                    cur.desired_version,
                ));
            }
        }
        for (property, section, v, version) in outbox {
            let seq = self.seq();
            applied.outbox.push(OutboxEntry {
                namespace: id.namespace.clone(),
                name: id.name.clone(),
                property,
                section,
                value: v.value,
                version,
                timestamp: v.timestamp,
                seq,
            });
        }
        applied
    }
}

/// The difference between two states of one device.
fn diff(before: &DeviceTwin, after: &DeviceTwin, added: bool) -> Applied {
    let mut changes = Vec::new();
    for (name, cur) in &after.properties {
        let last = before.properties.get(name);
        if last != Some(cur) {
            changes.push(PropertyChange {
                name: name.clone(),
                last: last.cloned(),
                current: Some(cur.clone()),
            });
        }
    }
    for (name, last) in &before.properties {
        if !after.properties.contains_key(name) {
            changes.push(PropertyChange {
                name: name.clone(),
                last: Some(last.clone()),
                current: None,
            });
        }
    }
    let row_changed = added || before.row != after.row;
    Applied {
        device: Some(after.id()),
        row: row_changed.then(|| after.row.clone()),
        added,
        removed: false,
        changes,
        outbox: Vec::new(),
        delta: BTreeMap::new(),
        state_changed: false,
        event_id: None,
    }
}

/// Desired values that differ from the reported ones, over the whole twin.
pub fn twin_delta(twin: &DeviceTwin) -> BTreeMap<String, String> {
    twin.properties
        .iter()
        .filter_map(|(name, p)| p.delta().map(|d| (name.clone(), d.to_string())))
        .collect()
}
