//! One task per device: the scheduler that reads properties at their `collectCycle`, grouping
//! those due together into one driver call, reports a changed value at once and an unchanged one
//! only when its `reportCycle` has passed, writes desired values when they change (then reads
//! them back), and tracks the device's state from its transport.

use crate::clock::now_ms;
use crate::driver::{
    DeviceConfig, DeviceState, Driver, DriverError, ErrorKind, ReadValue, Reading, Text,
};
use crate::metrics::Metrics;
use crate::push::Pusher;
use crate::report::{Report, TwinReport};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// KubeEdge's default `collectCycle` and `reportCycle` (1 s) for a property that gives none.
pub const DEFAULT_CYCLE: Duration = Duration::from_secs(1);
/// Properties due within this much of each other are read in one batch.
const GROUP_WINDOW: Duration = Duration::from_millis(5);
/// The first reconnect delay; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How one property is scheduled and pushed.
#[derive(Clone, Debug, PartialEq)]
pub struct PropertySchedule {
    pub collect: Duration,
    pub report: Duration,
    pub push: Vec<Arc<Pusher>>,
}

/// How a device is scheduled (everything of its spec but the desired values).
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub properties: Vec<PropertySchedule>,
    /// `stateReport.reportCycle` when `stateReport.reportToCloud` is set: the state is then
    /// also reported at this cycle, not only when it changes.
    pub state_cycle: Option<Duration>,
}

/// What the REST API and `GetDevice` see of a device.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Snapshot {
    pub state: &'static str,
    /// Why the device cannot run at all (a configuration error), or why it is offline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub properties: BTreeMap<String, PropertyView>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PropertyView {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Milliseconds since the epoch of the last successful read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The desired value last written to the device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub applied_desired: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_error: Option<String>,
}

/// Requests to a device task.
pub enum Command {
    /// New desired values (`property`, `value`) from edgecore.
    Desired(Vec<(String, String)>),
    /// Read one property now.
    Read(String, oneshot::Sender<Result<String, DriverError>>),
    /// Write one property now and read it back.
    Write(String, String, oneshot::Sender<Result<String, DriverError>>),
    /// Say the device's state again: edgecore told the device again (after it found this mapper
    /// unreachable for a while, it set the state `unknown` itself).
    ResendState,
}

struct Prop {
    name: String,
    value_type: Option<String>,
    writable: bool,
    collect: Duration,
    report: Duration,
    push: Vec<Arc<Pusher>>,
    next: Instant,
    value: Option<Text>,
    sent: Option<Text>,
    sent_at: Option<Instant>,
    desired: Option<String>,
    applied: Option<String>,
    /// A desired value the device or the codec refused for good (out of range, not of the
    /// type): not tried again while it stays the desired value; forgotten once another value
    /// is written, so that asking for it again tries it (and says why) again.
    rejected: Option<String>,
    /// Why its last read failed (the device itself answering), until a value comes.
    error: Option<String>,
    /// The error last reported to edgecore for it.
    error_sent: Option<String>,
    /// A desired value the device answered with an error (an exception: it may take it
    /// later): how many tries, when to try again (a growing wait), the error last reported.
    retry: Option<Retry>,
}

struct Retry {
    value: String,
    tries: u32,
    next: Instant,
    said: String,
}

/// The longest wait between tries of a desired value the device answered with an error.
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The same value: the driver's same `Text` (nothing to compare) or equal text.
fn same_text(a: &Text, b: &Text) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

/// The view of property `name`, made when it has none yet (the only allocation).
fn property_view<'a>(
    views: &'a mut BTreeMap<String, PropertyView>,
    name: &str,
) -> &'a mut PropertyView {
    if !views.contains_key(name) {
        views.insert(name.to_string(), PropertyView::default());
    }
    views.get_mut(name).expect("inserted above")
}

/// The wait after the `tries`-th failed try: 1 s, 2 s, 4 s, ... up to [`RETRY_MAX`].
fn retry_wait(tries: u32) -> Duration {
    Duration::from_secs(1u64 << tries.saturating_sub(1).min(6)).min(RETRY_MAX)
}

/// The device task's state.
pub struct DeviceTask<D: Driver> {
    namespace: String,
    name: String,
    driver: D,
    props: Vec<Prop>,
    state: DeviceState,
    /// Why the device is in its state (offline: the link error; unhealthy: what failed).
    state_reason: String,
    connected: bool,
    ever_connected: bool,
    /// The device answered since the last connect: a reconnect after that is worth a log line
    /// (a device that never answers is reconnected every backoff, silently).
    answered: bool,
    /// The link went down after the device had answered.
    lost_after_answer: bool,
    backoff: rt::Backoff,
    retry_at: Instant,
    state_cycle: Option<Duration>,
    state_next: Instant,
    reports: mpsc::Sender<Report>,
    metrics: Arc<Metrics>,
    snapshot: Arc<Mutex<Snapshot>>,
    requests_seen: u64,
}

impl<D: Driver> DeviceTask<D> {
    pub fn new(
        config: &DeviceConfig,
        schedule: &Schedule,
        driver: D,
        reports: mpsc::Sender<Report>,
        metrics: Arc<Metrics>,
        snapshot: Arc<Mutex<Snapshot>>,
    ) -> Self {
        let now = Instant::now();
        let props = config
            .properties
            .iter()
            .zip(&schedule.properties)
            .map(|(p, s)| Prop {
                name: p.name.clone(),
                value_type: p.value_type.clone(),
                writable: p.writable,
                collect: s.collect,
                report: s.report,
                push: s.push.clone(),
                next: now,
                value: None,
                sent: None,
                sent_at: None,
                desired: None,
                applied: None,
                rejected: None,
                error: None,
                error_sent: None,
                retry: None,
            })
            .collect();
        Self {
            namespace: config.namespace.clone(),
            name: config.name.clone(),
            driver,
            props,
            state: DeviceState::Unknown,
            state_reason: String::new(),
            connected: false,
            ever_connected: false,
            answered: false,
            lost_after_answer: false,
            backoff: rt::Backoff::new(FIRST_BACKOFF, MAX_BACKOFF),
            retry_at: now,
            state_cycle: schedule.state_cycle,
            state_next: now,
            reports,
            metrics,
            snapshot,
            requests_seen: 0,
        }
    }

    /// Runs until `cancel` or until the command channel closes, then stops the driver.
    pub async fn run(mut self, mut commands: mpsc::Receiver<Command>, cancel: CancellationToken) {
        loop {
            let wake = self.next_wake();
            tokio::select! {
                _ = cancel.cancelled() => break,
                c = commands.recv() => match c {
                    Some(c) => self.command(c).await,
                    None => break,
                },
                _ = tokio::time::sleep_until(wake) => self.cycle().await,
                changes = self.driver.changes(), if self.connected => {
                    self.absorb(&changes, Instant::now()).await;
                }
            }
        }
        self.driver.stop().await;
        if self.state == DeviceState::Online {
            self.metrics.devices_online.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn next_wake(&self) -> Instant {
        let mut wake = self
            .props
            .iter()
            .map(|p| p.next)
            .min()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        if self.state_cycle.is_some() {
            wake = wake.min(self.state_next);
        }
        if !self.connected {
            wake = wake.max(self.retry_at);
        }
        wake
    }

    async fn command(&mut self, c: Command) {
        match c {
            Command::Desired(values) => {
                for (name, value) in values {
                    if let Some(p) = self.props.iter_mut().find(|p| p.name == name)
                        && p.desired.as_deref() != Some(value.as_str())
                    {
                        p.desired = Some(value);
                    }
                }
                self.apply_desired().await;
            }
            Command::Read(name, reply) => {
                let r = match self.index(&name) {
                    Some(i) => self.read_now(i).await,
                    None => Err(DriverError::config(format!("no property {name}"))),
                };
                let _ = reply.send(r);
            }
            Command::Write(name, value, reply) => {
                let r = match self.index(&name) {
                    Some(i) => match self.write(i, &value).await {
                        Ok(()) => self.read_now(i).await,
                        Err(e) => Err(e),
                    },
                    None => Err(DriverError::config(format!("no property {name}"))),
                };
                let _ = reply.send(r);
            }
            Command::ResendState => {
                if self.state != DeviceState::Unknown {
                    self.send_state().await;
                }
            }
        }
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.props.iter().position(|p| p.name == name)
    }

    async fn read_now(&mut self, i: usize) -> Result<String, DriverError> {
        let now = Instant::now();
        let results = self.read(&[i], now).await;
        match results.into_iter().next() {
            Some((_, Ok(ReadValue::New(t)))) => Ok(t.to_string()),
            Some((_, Ok(ReadValue::Same))) => self.props[i]
                .value
                .as_deref()
                .map(str::to_string)
                .ok_or_else(|| DriverError::device("the driver returned no value")),
            Some((_, Err(e))) => Err(e),
            None => Err(DriverError::device("the driver returned nothing")),
        }
    }

    /// Connects when not connected and the backoff allows it.
    async fn ensure_connected(&mut self) -> bool {
        if self.connected {
            return true;
        }
        let now = Instant::now();
        if now < self.retry_at {
            return false;
        }
        match self.driver.connect().await {
            Ok(()) => {
                self.connected = true;
                if let Ok(mut s) = self.snapshot.lock() {
                    s.error = None;
                }
                if self.ever_connected {
                    self.metrics.reconnects.fetch_add(1, Ordering::Relaxed);
                    if std::mem::take(&mut self.lost_after_answer) {
                        tracing::info!(device = %self.id(), "reconnected");
                    } else {
                        tracing::debug!(device = %self.id(), "reconnected (the device has not answered since it went offline)");
                    }
                    // The device may have restarted and lost what was written: desired values
                    // are written again.
                    for p in &mut self.props {
                        p.applied = None;
                    }
                }
                self.ever_connected = true;
                self.answered = false;
                true
            }
            Err(e) => {
                self.link_down(&e).await;
                false
            }
        }
    }

    fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    async fn link_down(&mut self, e: &DriverError) {
        if self.state != DeviceState::Offline {
            tracing::warn!(device = %self.id(), error = %e, retry_in = ?self.backoff.peek(), "device offline");
        }
        self.connected = false;
        self.lost_after_answer |= std::mem::take(&mut self.answered);
        if let Ok(mut s) = self.snapshot.lock() {
            s.error = Some(e.message.clone());
        }
        self.retry_at = Instant::now() + self.backoff.next_delay();
        self.set_state(DeviceState::Offline, e.message.clone())
            .await;
    }

    async fn set_state(&mut self, state: DeviceState, reason: String) {
        if state == self.state {
            return;
        }
        self.state_reason = reason;
        if state == DeviceState::Online {
            self.metrics.devices_online.fetch_add(1, Ordering::Relaxed);
        } else if self.state == DeviceState::Online {
            self.metrics.devices_online.fetch_sub(1, Ordering::Relaxed);
        }
        tracing::info!(device = %self.id(), from = self.state.as_str(), to = state.as_str(), "device state");
        self.state = state;
        if let Ok(mut s) = self.snapshot.lock() {
            s.state = state.as_str();
        }
        self.send_state().await;
    }

    async fn send_state(&mut self) {
        if let Some(c) = self.state_cycle {
            self.state_next = Instant::now() + c;
        }
        let _ = self
            .reports
            .send(Report::State {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                state: self.state.as_str(),
                reason: self.state_reason.clone(),
            })
            .await;
    }

    /// Reads the properties due now and reports what must be reported.
    async fn cycle(&mut self) {
        let now = Instant::now();
        if self.state_cycle.is_some() && self.state_next <= now {
            self.send_state().await;
        }
        let due: Vec<usize> = (0..self.props.len())
            .filter(|&i| self.props[i].next <= now + GROUP_WINDOW)
            .collect();
        if due.is_empty() {
            return;
        }
        for &i in &due {
            let p = &mut self.props[i];
            while p.next <= now + GROUP_WINDOW {
                p.next += p.collect;
            }
        }
        if !self.ensure_connected().await {
            return;
        }
        self.apply_desired().await;
        // Properties the driver subscribed to come through `changes` when they change; at
        // their cycle an unchanged value is reported again once its reportCycle has passed, as
        // a polled one is.
        let (subscribed, due): (Vec<usize>, Vec<usize>) =
            due.into_iter().partition(|&i| self.driver.subscribed(i));
        let stale: Vec<Reading> = subscribed
            .into_iter()
            .filter_map(|i| {
                let p = &self.props[i];
                (p.value.is_some() && p.sent_at.is_some_and(|t| now.duration_since(t) >= p.report))
                    .then_some((i, Ok(ReadValue::Same)))
            })
            .collect();
        if !stale.is_empty() {
            self.absorb(&stale, now).await;
        }
        if !due.is_empty() {
            self.read(&due, now).await;
        }
    }

    /// Reads `due`, updates state and snapshot, and reports and pushes what changed or is due.
    async fn read(&mut self, due: &[usize], now: Instant) -> Vec<Reading> {
        if !self.ensure_connected().await {
            let e = DriverError::link("the device is offline");
            return due.iter().map(|&i| (i, Err(e.clone()))).collect();
        }
        let started = std::time::Instant::now();
        let results = self.driver.read(due).await;
        self.metrics.observe_batch(started.elapsed());
        self.metrics.batches.fetch_add(1, Ordering::Relaxed);
        let requests = self.driver.requests();
        self.metrics.requests.fetch_add(
            requests.saturating_sub(self.requests_seen),
            Ordering::Relaxed,
        );
        self.requests_seen = requests;
        self.absorb(&results, now).await;
        results
    }

    /// Takes in readings, polled or sent by the device: updates state and snapshot, and
    /// reports and pushes what changed or is due. A failed read is that property's: its error is
    /// reported on it (once per new error); the device is unhealthy only when every property is
    /// failing, and offline when the link is down.
    async fn absorb(&mut self, results: &[Reading], now: Instant) {
        let ts = now_ms();
        let mut twins = Vec::new();
        let mut ok = 0usize;
        let mut failed = 0usize;
        let mut link: Option<DriverError> = None;
        {
            // Updated in place: an unchanged value (the driver's same `Text`) allocates nothing.
            let mut snapshot = self.snapshot.lock().ok();
            for (i, r) in results {
                let Some(p) = self.props.get_mut(*i) else {
                    continue;
                };
                match r {
                    Ok(read) => {
                        let (v, same) = match read {
                            ReadValue::New(v) => {
                                let same = p.value.as_ref().is_some_and(|old| same_text(old, v));
                                if !same {
                                    p.value = Some(v.clone());
                                }
                                (v, same)
                            }
                            ReadValue::Same => match p.value.as_ref() {
                                Some(v) => (v, true),
                                None => {
                                    failed += 1;
                                    tracing::warn!(device = %format!("{}/{}", self.namespace, self.name), property = %p.name, "the driver said the value is unchanged before it gave one; ignored");
                                    continue;
                                }
                            },
                        };
                        ok += 1;
                        p.error = None;
                        // A value after a reported error is sent even if unchanged: it clears it.
                        let changed = p.sent.as_ref().is_none_or(|sent| !same_text(sent, v))
                            || p.error_sent.take().is_some();
                        let stale = p.sent_at.is_none_or(|t| now.duration_since(t) >= p.report);
                        if changed || stale {
                            p.sent = Some(v.clone());
                            p.sent_at = Some(now);
                            twins.push(TwinReport {
                                property: p.name.clone(),
                                value: v.to_string(),
                                value_type: p.value_type.clone(),
                                timestamp: ts,
                                observed_desired: p.applied.clone(),
                                error: None,
                            });
                            for push in &p.push {
                                push.push(
                                    &self.namespace,
                                    &self.name,
                                    &p.name,
                                    v,
                                    p.value_type.as_deref(),
                                    ts,
                                );
                            }
                        }
                        if let Some(s) = snapshot.as_deref_mut() {
                            let view = property_view(&mut s.properties, &p.name);
                            if !same || view.value.is_none() {
                                view.value = Some(v.to_string());
                            }
                            view.timestamp = Some(ts);
                            view.error = None;
                        }
                    }
                    Err(e) => {
                        failed += 1;
                        tracing::debug!(device = %format!("{}/{}", self.namespace, self.name), property = %p.name, error = %e, "read failed");
                        if e.kind == ErrorKind::Link {
                            link = Some(e.clone());
                        } else {
                            p.error = Some(e.message.clone());
                            if p.error_sent.as_deref() != Some(e.message.as_str()) {
                                p.error_sent = Some(e.message.clone());
                                twins.push(TwinReport {
                                    property: p.name.clone(),
                                    value: String::new(),
                                    value_type: p.value_type.clone(),
                                    timestamp: ts,
                                    observed_desired: None,
                                    error: Some(e.message.clone()),
                                });
                            }
                        }
                        if let Some(s) = snapshot.as_deref_mut() {
                            property_view(&mut s.properties, &p.name).error =
                                Some(e.message.clone());
                        }
                    }
                }
            }
        }
        self.metrics.reads.fetch_add(ok as u64, Ordering::Relaxed);
        self.metrics
            .read_errors
            .fetch_add(failed as u64, Ordering::Relaxed);
        if !twins.is_empty() {
            let _ = self
                .reports
                .send(Report::Twins {
                    namespace: self.namespace.clone(),
                    name: self.name.clone(),
                    twins,
                })
                .await;
        }
        let failing = self.props.iter().filter(|p| p.error.is_some()).count();
        if let Some(e) = link {
            self.link_down(&e).await;
        } else if failing > 0 && failing == self.props.len() {
            let last = self
                .props
                .iter()
                .rev()
                .find_map(|p| p.error.clone())
                .unwrap_or_default();
            self.set_state(
                DeviceState::Unhealthy,
                format!("no property can be read; the last error: {last}"),
            )
            .await;
        } else if ok > 0 {
            self.answered = true;
            // The backoff starts over only once the device answers: a link that connects but
            // never answers is retried at the growing backoff.
            self.backoff.reset();
            self.set_state(DeviceState::Online, String::new()).await;
        }
    }

    async fn write(&mut self, i: usize, value: &str) -> Result<(), DriverError> {
        if !self.props[i].writable {
            return Err(DriverError::config(format!(
                "{} is ReadOnly in its model",
                self.props[i].name
            )));
        }
        if !self.ensure_connected().await {
            return Err(DriverError::link("the device is offline"));
        }
        self.metrics.writes.fetch_add(1, Ordering::Relaxed);
        let r = self.driver.write(i, value).await;
        if let Err(e) = &r {
            self.metrics.write_errors.fetch_add(1, Ordering::Relaxed);
            if e.kind == ErrorKind::Link {
                self.link_down(e).await;
            }
        }
        r
    }

    /// Writes desired values not yet on the device; a written one is read back at once. A
    /// failed write is tried again at the property's next cycle.
    /// Says in the twin (where kectl, apps, the cloud and the page see it) why `desired` was not
    /// written to `property`.
    async fn write_refused(&mut self, property: &str, desired: &str, error: String) {
        let _ = self
            .reports
            .send(Report::WriteRefused {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                property: property.to_string(),
                desired: desired.to_string(),
                error,
            })
            .await;
    }

    async fn apply_desired(&mut self) {
        for i in 0..self.props.len() {
            let p = &self.props[i];
            let Some(want) = p.desired.clone() else {
                continue;
            };
            if p.applied.as_deref() == Some(want.as_str())
                || p.rejected.as_deref() == Some(want.as_str())
                || want.is_empty()
            {
                continue;
            }
            if p.retry
                .as_ref()
                .is_some_and(|r| r.value == want && Instant::now() < r.next)
            {
                continue;
            }
            if !p.writable {
                tracing::warn!(device = %self.id(), property = %p.name, "desired value ignored: the property is ReadOnly");
                self.props[i].applied = Some(want);
                continue;
            }
            let r = self.write(i, &want).await;
            let name = self.props[i].name.clone();
            match &r {
                Ok(()) => {
                    tracing::info!(device = %self.id(), property = %name, value = %want, "desired value written");
                    let p = &mut self.props[i];
                    p.applied = Some(want.clone());
                    p.rejected = None;
                    p.retry = None;
                    p.sent = None;
                    p.next = Instant::now();
                }
                Err(e) if e.kind == ErrorKind::Config => {
                    tracing::warn!(device = %self.id(), property = %name, value = %want, error = %e, "desired value refused");
                    self.props[i].rejected = Some(want.clone());
                    // Into the twin, where kectl, apps, the cloud and the page see it.
                    self.write_refused(&name, &want, e.message.clone()).await;
                }
                Err(e) if e.kind == ErrorKind::Device => {
                    // The device answered, with an error: tried again after a growing wait, and
                    // said in the twin (where a user looks) the first time and whenever the
                    // answer changes, not at every try.
                    let p = &mut self.props[i];
                    let tries = match &p.retry {
                        Some(r) if r.value == want => r.tries + 1,
                        _ => 1,
                    };
                    let wait = retry_wait(tries);
                    let changed = p
                        .retry
                        .as_ref()
                        .is_none_or(|r| r.value != want || r.said != e.message);
                    p.retry = Some(Retry {
                        value: want.clone(),
                        tries,
                        next: Instant::now() + wait,
                        said: e.message.clone(),
                    });
                    if changed {
                        tracing::warn!(device = %self.id(), property = %name, value = %want, error = %e, "desired value not written; tried again with a growing wait");
                        let error = format!(
                            "{} (not written; tried again after a growing wait, at most every {} s)",
                            e.message,
                            RETRY_MAX.as_secs()
                        );
                        self.write_refused(&name, &want, error).await;
                    } else {
                        tracing::debug!(device = %self.id(), property = %name, value = %want, error = %e, tries, "desired value still not written");
                    }
                }
                Err(e) => {
                    tracing::warn!(device = %self.id(), property = %name, value = %want, error = %e, "desired value not written; will retry")
                }
            }
            if let Ok(mut s) = self.snapshot.lock() {
                let v = s.properties.entry(name).or_default();
                match r {
                    Ok(()) => {
                        v.applied_desired = Some(want);
                        v.write_error = None;
                    }
                    Err(e) => v.write_error = Some(e.message),
                }
            }
            if !self.connected {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
