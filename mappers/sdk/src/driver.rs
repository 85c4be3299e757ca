//! What a protocol implements: [`Protocol`] builds a [`Driver`] for one device from its
//! configuration, and the driver connects, reads a batch of properties, writes one, and says how
//! the transport is doing. Everything else (scheduling, DMI, push, REST, metrics) is the SDK's.

use serde_json::{Map, Value};
use std::future::Future;

/// A device as its protocol sees it: KubeEdge's effective spec (model defaults merged), with
/// the model's hints for each property.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceConfig {
    pub namespace: String,
    pub name: String,
    /// `spec.protocol.configData`.
    pub protocol: Map<String, Value>,
    pub properties: Vec<PropertyConfig>,
}

/// One property: its visitor and what the model says about it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PropertyConfig {
    pub name: String,
    /// `visitors.configData`.
    pub visitor: Map<String, Value>,
    /// The model's `type` (`INT`, `FLOAT`, `DOUBLE`, `STRING`, `BOOLEAN`, ...).
    pub value_type: Option<String>,
    /// `false` when the model says `ReadOnly`.
    pub writable: bool,
    pub minimum: Option<f64>,
    pub maximum: Option<f64>,
    pub unit: Option<String>,
    /// `collectCycle` (the SDK's default when the device gives none): how often the property is
    /// polled, or sampled by the device when the driver subscribes to it.
    pub collect: std::time::Duration,
}

impl DeviceConfig {
    /// `namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// `spec.protocol.configData` parsed by `parse`; its error (which names the key) becomes a
    /// configuration error under `protocol.configData.`.
    pub fn parse_protocol<T, E: std::fmt::Display>(
        &self,
        parse: impl FnOnce(&Map<String, Value>) -> Result<T, E>,
    ) -> Result<T, DriverError> {
        parse(&self.protocol).map_err(|e| DriverError::config(format!("protocol.configData.{e}")))
    }

    /// Each property's visitor parsed by `parse`; the first error becomes a configuration error
    /// naming the property and `visitors.configData.`.
    pub fn parse_visitors<T, E: std::fmt::Display>(
        &self,
        mut parse: impl FnMut(&PropertyConfig) -> Result<T, E>,
    ) -> Result<Vec<T>, DriverError> {
        self.properties
            .iter()
            .map(|p| {
                parse(p).map_err(|e| {
                    DriverError::config(format!("property {}: visitors.configData.{e}", p.name))
                })
            })
            .collect()
    }
}

/// What went wrong with a device, and what it means for the device's state.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DriverError {
    pub kind: ErrorKind,
    pub message: String,
}

/// How a [`DriverError`] affects the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The transport failed (refused, dropped, timed out): the device is offline and is
    /// reconnected with backoff.
    Link,
    /// The device answered, but not with a value (an exception, a value that does not decode
    /// or is out of range): this property fails, the others carry on.
    Device,
    /// The configuration cannot work (an unknown register, a bad data type).
    Config,
}

impl DriverError {
    pub fn link(message: impl std::fmt::Display) -> Self {
        Self {
            kind: ErrorKind::Link,
            message: message.to_string(),
        }
    }
    pub fn device(message: impl std::fmt::Display) -> Self {
        Self {
            kind: ErrorKind::Device,
            message: message.to_string(),
        }
    }
    pub fn config(message: impl std::fmt::Display) -> Self {
        Self {
            kind: ErrorKind::Config,
            message: message.to_string(),
        }
    }
}

/// A device's state as KubeEdge spells it in `ReportDeviceStates`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceState {
    /// Not tried yet.
    #[default]
    Unknown,
    /// Connected, and answering.
    Online,
    /// Cannot be reached.
    Offline,
    /// Reached, but no property could be read in the last cycle.
    Unhealthy,
}

impl DeviceState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Online => "online",
            Self::Offline => "offline",
            Self::Unhealthy => "unhealthy",
        }
    }
}

/// A property's value as the twin's string, shared (kept by the driver and the SDK without
/// copying).
pub type Text = std::sync::Arc<str>;

/// A property's value as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadValue {
    /// The value, as the twin's string.
    New(Text),
    /// The same as the value the driver returned for this property last time: a driver that
    /// keeps each property's last value and the raw data it came from says so when the data
    /// did not change, and the reading costs nothing more, there or in the SDK.
    Same,
}

impl From<Text> for ReadValue {
    fn from(t: Text) -> Self {
        Self::New(t)
    }
}

impl From<String> for ReadValue {
    fn from(s: String) -> Self {
        Self::New(s.into())
    }
}

impl From<&str> for ReadValue {
    fn from(s: &str) -> Self {
        Self::New(s.into())
    }
}

/// The result of reading one property: its index in [`DeviceConfig::properties`] and its value.
pub type Reading = (usize, Result<ReadValue, DriverError>);

/// Readings a device sends by itself (subscriptions, notifications), queued by the tasks that
/// receive them for [`Driver::changes`] to hand over in batches.
pub struct Changes {
    tx: tokio::sync::mpsc::UnboundedSender<Reading>,
    rx: tokio::sync::mpsc::UnboundedReceiver<Reading>,
}

impl Default for Changes {
    fn default() -> Self {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        Self { tx, rx }
    }
}

impl Changes {
    /// Readings taken in one batch at most.
    pub const BATCH: usize = 256;

    /// Where a receiving task sends readings.
    pub fn sender(&self) -> tokio::sync::mpsc::UnboundedSender<Reading> {
        self.tx.clone()
    }

    /// Drops what is queued (sent over a connection that is gone).
    pub fn clear(&mut self) {
        while self.rx.try_recv().is_ok() {}
    }

    /// Waits for the next readings and returns all that are queued, up to [`Changes::BATCH`].
    /// Cancel-safe.
    pub async fn next_batch(&mut self) -> Vec<Reading> {
        let Some(first) = self.rx.recv().await else {
            return std::future::pending().await;
        };
        let mut out = vec![first];
        while out.len() < Self::BATCH {
            match self.rx.try_recv() {
                Ok(r) => out.push(r),
                Err(_) => break,
            }
        }
        out
    }
}

/// One device's connection to its hardware. Methods are called from one task at a time.
pub trait Driver: Send + 'static {
    /// Connects if not connected.
    fn connect(&mut self) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// Reads the properties `due` (indices into [`DeviceConfig::properties`]), which are due at
    /// the same time, so that the driver can plan them together. Each gets its own result.
    fn read(&mut self, due: &[usize]) -> impl Future<Output = Vec<Reading>> + Send;

    /// Writes `value` (the twin's string) to property `index`.
    fn write(
        &mut self,
        index: usize,
        value: &str,
    ) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// Drops the connection.
    fn stop(&mut self) -> impl Future<Output = ()> + Send;

    /// Requests sent so far, for metrics (0 when the protocol does not count them).
    fn requests(&self) -> u64 {
        0
    }

    /// Waits for values the device sends by itself (subscriptions, notifications) and returns
    /// them as a batch. A [`ErrorKind::Link`] error in it takes the device offline, as from
    /// [`Driver::read`]. Must be cancel-safe: the SDK drops it to serve a poll or a command. The
    /// default never resolves, for drivers that only answer polls.
    fn changes(&mut self) -> impl Future<Output = Vec<Reading>> + Send {
        std::future::pending()
    }

    /// `true` when property `index` arrives through [`Driver::changes`] once connected, so the
    /// SDK does not poll it.
    fn subscribed(&self, _index: usize) -> bool {
        false
    }
}

/// Why a protocol could not start (its own error type, whatever it is).
pub type StartError = Box<dyn std::error::Error + Send + Sync>;

/// A protocol: builds drivers.
pub trait Protocol: Send + Sync + 'static {
    type Driver: Driver;

    /// The protocol name devices give in `spec.protocol.protocolName`.
    fn name(&self) -> &str;

    /// Called once with the mapper's configuration before any device is built (to find
    /// `common.data_dir`, say). An error stops the mapper with its message.
    fn start(&mut self, _config: &crate::Config) -> Result<(), StartError> {
        Ok(())
    }

    /// A driver for `device`, or an error naming what in its configuration is wrong. Must not
    /// do IO: the SDK connects through [`Driver::connect`].
    fn driver(&self, device: &DeviceConfig) -> Result<Self::Driver, DriverError>;
}
