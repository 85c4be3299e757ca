//! The twin document of a device.

use api::paths::DeviceId;
use api::v1beta1::PropertyType;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// The RFC 3339 UTC time (whole seconds) of a Unix time in milliseconds, as KubeEdge writes
/// `lastOnlineTime` and mappers' `since`; `""` for 0 (never).
pub fn rfc3339(ms: Millis) -> String {
    if ms <= 0 {
        return String::new();
    }
    api::rfc3339::of_unix_seconds(ms.div_euclid(1000)).unwrap_or_default()
}

/// KubeEdge's version vector of one twin section: how many times the cloud and the edge have
/// written it. A sync from the cloud carrying a smaller number than the local one is stale.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    pub cloud: u64,
    pub edge: u64,
}

/// A value with the time it was last set (`lastUpdated`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TwinValue {
    pub value: String,
    pub timestamp: Millis,
}

/// One property of a device twin.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PropertyTwin {
    /// The value type from the model (STRING when the model names none).
    #[serde(rename = "type")]
    pub value_type: PropertyType,
    /// Whether the property may be deleted from the edge (KubeEdge's `optional`). Properties
    /// created by a report, rather than declared by the device, are optional.
    pub optional: bool,
    /// Whether a desired value may be set (the model's `accessMode` is not `ReadOnly`).
    pub writable: bool,
    /// The desired value last given by the device spec, to tell a real spec change from a reload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_desired: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<TwinValue>,
    pub desired_version: Version,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported: Option<TwinValue>,
    pub reported_version: Version,
    /// The desired value the mapper last said the device has applied (DMI `observedDesired`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_desired: Option<TwinValue>,
    /// The model's `minimum` of a numeric property: a desired value set at the edge below it is
    /// refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum: Option<String>,
    /// The model's `maximum`, likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum: Option<String>,
    /// The model's `unit` (`Celsius`), for those who read the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// Why the last read (or write) of the property failed, and when; cleared by the next good
    /// value. The reported value, if any, is the last good one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<TwinValue>,
    /// Why the device (or the mapper) refused the desired value for good (not of the
    /// register's type, out of its range), and when; it stands until the desired value changes
    /// or the device reports it applied. The refused value is the desired one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_error: Option<TwinValue>,
    /// The value `write_error` refused: the desired one when the device refused it, the spec's
    /// when the twin refused it before it became desired (it never fit the model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// When the property was last read (a report with a value, changed or not), in memory
    /// only: a steady value read every second costs no write, and `reported.timestamp` stays
    /// when it last changed. Not part of the twin's equality.
    #[serde(skip)]
    pub last_read: Volatile<Option<Millis>>,
}

/// A value kept beside a twin that is no part of its state: any two are equal, so keeping it
/// up to date never makes a change to store or send.
#[derive(Clone, Copy, Debug, Default)]
pub struct Volatile<T>(pub T);

impl<T> PartialEq for Volatile<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl PropertyTwin {
    /// A property with no values yet.
    pub fn new(value_type: PropertyType, optional: bool, writable: bool) -> Self {
        Self {
            value_type,
            optional,
            writable,
            spec_desired: None,
            desired: None,
            desired_version: Version::default(),
            reported: None,
            reported_version: Version::default(),
            observed_desired: None,
            minimum: None,
            maximum: None,
            unit: None,
            error: None,
            write_error: None,
            refused: None,
            last_read: Volatile(None),
        }
    }

    /// Records that `value` was refused for good, and why.
    pub fn refuse(&mut self, value: &str, why: &str, now: Millis) {
        self.write_error = Some(TwinValue {
            value: why.to_string(),
            timestamp: now,
        });
        self.refused = Some(value.to_string());
    }

    /// Forgets a refusal: its value is no longer asked for.
    pub fn clear_refusal(&mut self) {
        self.write_error = None;
        self.refused = None;
    }

    /// The age at `now` of the reported value when it is not live: the device is not
    /// (`device_stale`, see [`DeviceTwin::values_stale`]) or the property's last read failed.
    pub fn stale_age(&self, device_stale: bool, now: Millis) -> Option<Millis> {
        let r = self.reported.as_ref()?;
        (device_stale || self.error.is_some()).then(|| (now - r.timestamp).max(0))
    }

    /// The property's errors as the APIs show them: `error`, why its last read failed or, when
    /// none did, why its desired value was refused (`kind` `read` or `write`); and
    /// `writeError`, the refusal with the refused `desired` value, for a client that shows it
    /// by the desired value.
    pub fn error_fields(&self) -> Vec<(&'static str, serde_json::Value)> {
        let mut out = Vec::new();
        let refusal = self.write_error.as_ref().map(|e| {
            serde_json::json!({
                "message": e.value,
                "timestamp": e.timestamp,
                "kind": "write",
                "desired": self.refused.as_deref().or(self.desired.as_ref().map(|d| d.value.as_str())),
            })
        });
        match (&self.error, &refusal) {
            (Some(e), _) => out.push((
                "error",
                serde_json::json!({"message": e.value, "timestamp": e.timestamp, "kind": "read"}),
            )),
            (None, Some(r)) => out.push(("error", r.clone())),
            (None, None) => {}
        }
        if let Some(r) = refusal {
            out.push(("writeError", r));
        }
        out
    }

    /// Why `value` is outside the property's `minimum`/`maximum`, if it is (numbers only).
    pub fn out_of_range(&self, value: &str) -> Option<String> {
        if !self.value_type.is_numeric() {
            return None;
        }
        api::validate::out_of_range(value, self.minimum.as_deref(), self.maximum.as_deref())
    }

    /// The desired value when it differs from the reported one.
    pub fn delta(&self) -> Option<&str> {
        let desired = self.desired.as_ref()?;
        match &self.reported {
            Some(r) if r.value == desired.value => None,
            _ => Some(&desired.value),
        }
    }

    /// Bytes of values this property holds, for the document size cap.
    pub fn value_bytes(&self) -> usize {
        [&self.desired, &self.reported, &self.observed_desired]
            .iter()
            .filter_map(|v| v.as_ref().map(|v| v.value.len()))
            .sum()
    }
}

/// Identity, state and section versions of a device: one row of the `device` table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRow {
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The model the device refers to.
    #[serde(default)]
    pub model: String,
    /// The protocol name of the device (which mappers serve it).
    #[serde(default)]
    pub protocol: String,
    /// `online`, `offline`, `ok`, `unknown` or `unhealthy`; empty until a mapper reports one.
    #[serde(default)]
    pub state: String,
    /// Why the device is in its state, when something other than its mapper's report set it
    /// (`mapper modbus-a unreachable since ...`); empty otherwise.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state_reason: String,
    /// When the device was last seen online (ms since the epoch), 0 if never.
    #[serde(default)]
    pub last_online: Millis,
    /// Monotonic version of the desired section: bumped by every desired change.
    pub desired_version: u64,
    /// Monotonic version of the reported section: bumped by every reported change.
    pub reported_version: u64,
}

impl DeviceRow {
    /// `{namespace}/{name}`.
    pub fn id(&self) -> DeviceId {
        DeviceId::new(&self.namespace, &self.name)
    }
}

/// The twin of one device: identity, state and properties.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceTwin {
    #[serde(flatten)]
    pub row: DeviceRow,
    pub properties: BTreeMap<String, PropertyTwin>,
}

impl DeviceTwin {
    /// An empty twin.
    pub fn new(id: &DeviceId) -> Self {
        Self {
            row: DeviceRow {
                namespace: id.namespace.clone(),
                name: id.name.clone(),
                ..DeviceRow::default()
            },
            properties: BTreeMap::new(),
        }
    }

    /// `{namespace}/{name}`.
    pub fn id(&self) -> DeviceId {
        self.row.id()
    }

    /// Bytes of values the document holds.
    pub fn value_bytes(&self) -> usize {
        self.properties
            .values()
            .map(PropertyTwin::value_bytes)
            .sum()
    }

    /// Whether the reported values are not live: the device is `unknown` or `offline`, so each
    /// reported value is the last one read before that.
    pub fn values_stale(&self) -> bool {
        matches!(self.row.state.as_str(), "unknown" | "offline")
    }

    /// Every property whose desired value differs from its reported value.
    pub fn delta(&self) -> BTreeMap<String, String> {
        self.properties
            .iter()
            .filter_map(|(k, p)| p.delta().map(|d| (k.clone(), d.to_string())))
            .collect()
    }
}

/// Which part of a twin an outbox entry carries to the cloud.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Section {
    Desired,
    Reported,
    /// The device state; the entry's property is empty.
    State,
    /// Why a property's read failed and why its desired value was refused: the entry's value
    /// is `{"read": "...", "write": "..."}` (empty strings when none).
    Errors,
    /// One alarm of the device (`api::alarm::Alarm` as JSON); the entry's property is the
    /// rule's name.
    Alarm,
}

impl Section {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Desired => "desired",
            Self::Reported => "reported",
            Self::State => "state",
            Self::Errors => "errors",
            Self::Alarm => "alarm",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "desired" => Some(Self::Desired),
            "reported" => Some(Self::Reported),
            "state" => Some(Self::State),
            "errors" => Some(Self::Errors),
            "alarm" => Some(Self::Alarm),
            _ => None,
        }
    }
}

/// A change that must reach the cloud. Entries are coalesced per device, property and section:
/// the newest value wins and carries its version. `seq` orders entries, so an acknowledgement
/// of an older send never removes a newer value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxEntry {
    pub namespace: String,
    pub name: String,
    pub property: String,
    pub section: Section,
    pub value: String,
    pub version: Version,
    pub timestamp: Millis,
    pub seq: u64,
}

#[cfg(test)]
mod rfc3339_tests {
    use super::rfc3339;

    #[test]
    fn rfc3339_formats_utc_in_whole_seconds() {
        assert_eq!(rfc3339(0), "");
        assert_eq!(rfc3339(-5), "");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
    }
}
