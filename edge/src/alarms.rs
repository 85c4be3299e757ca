//! Alarms: each device's rules (`api::alarm`, from its `devices.kubeedge.io/alarms`
//! annotation) evaluated here, on the gateway, as its twin changes and as time passes, so that
//! they work offline. Each change of an alarm is kept (in the twin database's key-value table,
//! one record per device) and goes out as an outbox entry of the twin (section `alarm`): up to
//! the cloud with the device's reports (`DeviceStatus`'s `status.extensions.alarms` and an
//! Event there), to MQTT apps on `$hw/events/device/{ns}/{name}/alarm` and to the event
//! stream of the local API, from the twin's one broadcast. Acknowledged from the local API or
//! by the cloud (`{ns}/devicealarm/{name}`, operation `acknowledge`).

use crate::catalog::{Change, SharedCatalog};
use api::alarm::{self, Alarm, Rule, Seen, Step};
use api::paths::DeviceId;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, broadcast};
use tokio_util::sync::CancellationToken;
use twin::TwinService;
use twin::model::{DeviceTwin, Millis};
use twin::service::Op;

/// The key-value table's kind of a device's alarms.
const KIND: &str = "alarms";
/// How often rules that depend on time (`stale`, `offline`) are evaluated.
const TICK: Duration = Duration::from_secs(1);

/// One device's rules and alarms.
#[derive(Default)]
struct Entry {
    rules: Vec<Rule>,
    /// Lines of the annotation that do not read: each shown as a rule that cannot be evaluated.
    bad: Vec<(String, String)>,
    alarms: BTreeMap<String, Alarm>,
    /// Since when the device has not been online, as seen here.
    offline_since: Option<Millis>,
}

/// The alarms of every device, shared by the evaluation task and the APIs.
#[derive(Clone)]
pub(crate) struct Alarms {
    book: Arc<Mutex<HashMap<DeviceId, Entry>>>,
    twin: TwinService,
    /// When this edgecore started: a value is not taken as stale for the time it was down.
    started: Millis,
}

/// Why an acknowledgement was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AckError {
    #[error("device {0} has no alarm rule {1}")]
    NoRule(DeviceId, String),
    #[error(transparent)]
    Refused(#[from] alarm::AckRefused),
}

impl Alarms {
    /// The alarms kept at the last run (their rules come with [`Alarms::run`]).
    pub(crate) async fn load(twin: TwinService) -> Self {
        let mut book: HashMap<DeviceId, Entry> = HashMap::new();
        match twin.store().list_meta(KIND).await {
            Ok(rows) => {
                for (key, value) in rows {
                    let (Some(id), Ok(alarms)) = (
                        DeviceId::parse(&key),
                        serde_json::from_str::<BTreeMap<String, Alarm>>(&value),
                    ) else {
                        tracing::warn!(%key, "a stored alarm record does not read; dropped");
                        continue;
                    };
                    book.entry(id).or_default().alarms = alarms;
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the stored alarms"),
        }
        Self {
            book: Arc::new(Mutex::new(book)),
            twin,
            started: twin::now_millis(),
        }
    }

    /// Every alarm, each with its device: most severe first, then newest.
    pub(crate) async fn list(&self) -> Vec<(DeviceId, Alarm)> {
        let book = self.book.lock().await;
        let mut out: Vec<(DeviceId, Alarm)> = book
            .iter()
            .flat_map(|(id, e)| e.alarms.values().map(|a| (id.clone(), a.clone())))
            .collect();
        out.sort_by(|(ia, a), (ib, b)| {
            (a.severity, std::cmp::Reverse(a.since), ia, &a.rule).cmp(&(
                b.severity,
                std::cmp::Reverse(b.since),
                ib,
                &b.rule,
            ))
        });
        out
    }

    /// `by` acknowledges the alarm of `rule` on `id`.
    pub(crate) async fn acknowledge(
        &self,
        id: &DeviceId,
        rule: &str,
        by: &str,
    ) -> Result<Alarm, AckError> {
        let mut book = self.book.lock().await;
        let entry = book
            .get_mut(id)
            .filter(|e| e.alarms.contains_key(rule) || e.rules.iter().any(|r| r.name == rule))
            .ok_or_else(|| AckError::NoRule(id.clone(), rule.to_string()))?;
        let step = alarm::acknowledge(entry.alarms.get(rule), by, twin::now_millis())?;
        let Some((_, told)) = step.told.clone() else {
            return Err(alarm::AckRefused::NoAlarm.into());
        };
        self.record(id, entry, rule, step).await;
        Ok(told)
    }

    /// Keeps what `step` left of the alarm of `rule`, and tells what changed.
    async fn record(&self, id: &DeviceId, entry: &mut Entry, rule: &str, step: Step) {
        let Some((change, told)) = step.told else {
            return;
        };
        match step.keep {
            Some(a) => {
                entry.alarms.insert(rule.to_string(), a);
            }
            None => {
                entry.alarms.remove(rule);
            }
        }
        let key = id.to_string();
        let stored = if entry.alarms.is_empty() {
            self.twin.store().delete_meta(&key).await
        } else {
            match serde_json::to_string(&entry.alarms) {
                Ok(v) => self.twin.store().put_meta(&key, KIND, &v).await,
                Err(e) => {
                    tracing::error!(error = %e, "cannot encode alarms");
                    Ok(())
                }
            }
        };
        if let Err(e) = stored {
            tracing::warn!(device = %id, error = %e, "cannot keep an alarm; it is told anyway");
        }
        tracing::info!(device = %id, rule, change = change.reason(), status = told.status(), "alarm");
        let value = serde_json::to_string(&told).unwrap_or_default();
        let op = Op::Alarm {
            id: id.clone(),
            rule: rule.to_string(),
            value,
        };
        if let Err(e) = self.twin.apply(op).await {
            tracing::warn!(device = %id, rule, error = %e, "cannot tell an alarm's change");
        }
    }

    /// Evaluates the rules of the catalog's devices as the twin changes and as time passes.
    pub(crate) async fn run(
        self,
        catalog: SharedCatalog,
        mut changes: broadcast::Receiver<Vec<Change>>,
        mut events: broadcast::Receiver<twin::TwinEvent>,
        cancel: CancellationToken,
    ) {
        self.every_device(&catalog).await;
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                c = changes.recv() => match c {
                    Ok(changes) => {
                        for c in changes {
                            let id = match &c {
                                Change::DeviceAdded(d) | Change::DeviceUpdated(d) => {
                                    match d.id() {
                                        Some(id) => id,
                                        None => continue,
                                    }
                                }
                                Change::DeviceRemoved(id) => id.clone(),
                                // A model gives the rules their properties' types.
                                Change::ModelAdded(_) | Change::ModelUpdated(_) => {
                                    self.every_device(&catalog).await;
                                    continue;
                                }
                                Change::ModelRemoved(_) => continue,
                            };
                            self.rules_changed(&catalog, &id).await;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => self.every_device(&catalog).await,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                e = events.recv() => match e {
                    Ok(applied) => self.twin_changed(&applied).await,
                    Err(broadcast::error::RecvError::Lagged(_)) => self.evaluate_all(false).await,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick() => self.evaluate_all(true).await,
            }
        }
    }

    /// The rules of every device that has some (or had alarms), read again.
    async fn every_device(&self, catalog: &SharedCatalog) {
        let ids: Vec<DeviceId> = {
            let c = crate::catalog::read(catalog);
            c.devices
                .iter()
                .filter(|(_, d)| d.may_have_alarms())
                .map(|(id, _)| id.clone())
                .collect()
        };
        let kept: Vec<DeviceId> = self.book.lock().await.keys().cloned().collect();
        for id in ids.iter().chain(kept.iter().filter(|i| !ids.contains(i))) {
            self.rules_changed(catalog, id).await;
        }
    }

    /// The device's rules as the catalog has them now: alarms of rules gone end, each rule is
    /// evaluated on the twin.
    async fn rules_changed(&self, catalog: &SharedCatalog, id: &DeviceId) {
        let (rules, bad) = {
            let c = crate::catalog::read(catalog);
            // A device without the annotation has no rules: not parsed to find none.
            let stored = c.devices.get(id).filter(|d| d.may_have_alarms());
            match stored.and_then(|d| d.device()) {
                Some(device) => {
                    let model = c.model_of(&device);
                    let types = |p: &str| model.and_then(|m| m.property(p)).and_then(|p| p.type_);
                    let (rules, errors) = alarm::of_device(&device, &types);
                    let lines: Vec<&str> = alarm::text_of(&device.metadata)
                        .unwrap_or_default()
                        .lines()
                        .collect();
                    let bad = errors
                        .into_iter()
                        .map(|e| {
                            let name = lines
                                .get(e.line - 1)
                                .and_then(|l| l.split_once(':'))
                                .map(|(n, _)| n.trim().to_string())
                                .filter(|n| {
                                    !n.is_empty()
                                        && n.len() <= 63
                                        && !rules.iter().any(|r| &r.name == n)
                                })
                                .unwrap_or_else(|| format!("line-{}", e.line));
                            (name, e.to_string())
                        })
                        .collect();
                    (rules, bad)
                }
                None => (Vec::new(), Vec::new()),
            }
        };
        let mut book = self.book.lock().await;
        let entry = book.entry(id.clone()).or_default();
        entry.rules = rules;
        entry.bad = bad;
        let gone: Vec<String> = entry
            .alarms
            .keys()
            .filter(|r| {
                !entry.rules.iter().any(|x| &x.name == *r) && !entry.bad.iter().any(|b| &b.0 == *r)
            })
            .cloned()
            .collect();
        for rule in gone {
            if let Some(a) = entry.alarms.get(&rule) {
                let step = alarm::removed(a);
                self.record(id, entry, &rule, step).await;
            }
        }
        let now = twin::now_millis();
        for (name, why) in entry.bad.clone() {
            if entry.alarms.get(&name).and_then(|a| a.error.as_ref()) == Some(&why) {
                continue;
            }
            let a = Alarm {
                rule: name.clone(),
                severity: alarm::Severity::Major,
                condition: String::new(),
                property: String::new(),
                active: false,
                since: now,
                message: format!("cannot be evaluated: {why}"),
                cleared_at: None,
                acked_by: None,
                acked_at: None,
                error: Some(why),
                ended: false,
            };
            let step = Step {
                keep: Some(a.clone()),
                told: Some((alarm::Change::Unevaluable, a)),
            };
            self.record(id, entry, &name, step).await;
        }
        if entry.rules.is_empty() && entry.alarms.is_empty() {
            book.remove(id);
            return;
        }
        let twin = self.twin.get(id).await.ok().flatten();
        self.evaluate(id, entry, twin.as_ref(), |_| true, now).await;
    }

    /// Evaluates the rules of the devices a twin change touched, on what it changed.
    async fn twin_changed(&self, applied: &twin::engine::Applied) {
        let Some(id) = &applied.device else { return };
        let mut book = self.book.lock().await;
        let Some(entry) = book.get_mut(id) else {
            return;
        };
        if applied.removed {
            // The device went (its DeviceStatus goes with it in the cloud).
            book.remove(id);
            if let Err(e) = self.twin.store().delete_meta(&id.to_string()).await {
                tracing::warn!(device = %id, error = %e, "cannot forget a removed device's alarms");
            }
            return;
        }
        let touched = |r: &Rule| match r.condition.property() {
            Some(p) => applied.changes.iter().any(|c| c.name == p),
            None => applied.row.is_some(),
        };
        if !entry.rules.iter().any(touched) {
            return;
        }
        let twin = self.twin.get(id).await.ok().flatten();
        self.evaluate(id, entry, twin.as_ref(), touched, twin::now_millis())
            .await;
    }

    /// Evaluates every device's rules (`timed`: only those that depend on time).
    async fn evaluate_all(&self, timed: bool) {
        let ids: Vec<DeviceId> = {
            let book = self.book.lock().await;
            book.iter()
                .filter(|(_, e)| !timed || e.rules.iter().any(|r| r.condition.timed()))
                .map(|(id, _)| id.clone())
                .collect()
        };
        for id in ids {
            let twin = self.twin.get(&id).await.ok().flatten();
            let mut book = self.book.lock().await;
            if let Some(entry) = book.get_mut(&id) {
                let which = |r: &Rule| !timed || r.condition.timed();
                self.evaluate(&id, entry, twin.as_ref(), which, twin::now_millis())
                    .await;
            }
        }
    }

    /// Evaluates the rules `which` picks on the device's twin as it is now.
    async fn evaluate(
        &self,
        id: &DeviceId,
        entry: &mut Entry,
        twin: Option<&DeviceTwin>,
        which: impl Fn(&Rule) -> bool,
        now: Millis,
    ) {
        let (state, reason) = twin
            .map(|t| (t.row.state.as_str(), t.row.state_reason.as_str()))
            .unwrap_or(("", ""));
        let online = matches!(state, "online" | "ok");
        entry.offline_since = match (online, entry.offline_since) {
            (true, _) => None,
            (false, Some(t)) => Some(t),
            (false, None) => Some(now),
        };
        let shown_state = match (state, reason) {
            ("", _) => "not reported by its mapper yet".to_string(),
            (s, "") => s.to_string(),
            (s, r) => format!("{s}: {r}"),
        };
        let rules: Vec<Rule> = entry.rules.iter().filter(|r| which(r)).cloned().collect();
        for rule in rules {
            let p = rule
                .condition
                .property()
                .and_then(|p| twin.and_then(|t| t.properties.get(p)));
            let seen = Seen {
                value: p
                    .and_then(|p| p.reported.as_ref())
                    .map(|r| r.value.as_str()),
                has_property: p.is_some() || rule.condition.property().is_none(),
                last_read: p.map(|p| {
                    p.last_read
                        .0
                        .or(p.reported.as_ref().map(|r| r.timestamp))
                        .unwrap_or(0)
                        .max(self.started)
                }),
                offline_since: entry.offline_since,
                state: &shown_state,
            };
            let step = alarm::step(&rule, entry.alarms.get(&rule.name), &seen, now);
            self.record(id, entry, &rule.name, step).await;
        }
    }
}
