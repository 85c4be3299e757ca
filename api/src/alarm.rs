//! Alarms on a device's values, declared beside the device in its annotation
//! `devices.kubeedge.io/alarms`, one rule per line:
//!
//! ```text
//! too-hot: temperature > 90 clear < 85 critical
//! heater-on: heater == true warning
//! no-reading: temperature stale 30s
//! gone: offline 1m major
//! ```
//!
//! A rule is `NAME: CONDITION [SEVERITY]`; a condition is a threshold (`>`, `>=`, `<`, `<=`,
//! with an optional `clear` on the other side: the hysteresis), a state (`==`, `!=`), a value
//! not read for a while (`stale`), or the device not online for a while (`offline`). Severity
//! is `critical`, `major` (the default), `minor` or `warning`, as ThingsBoard's.
//!
//! The text is read once into [`Rule`]s ([`parse`]: every problem at once, each naming its
//! line); the gateway evaluates them ([`step`], pure: the rule, the alarm as it stands, what
//! the twin holds now) so that they work offline; [`Alarm`] is one occurrence as it travels
//! (MQTT, the local API, the cloud's `DeviceStatus`): active or cleared, acknowledged or not,
//! or a rule that cannot be evaluated and why.

use crate::v1beta1::{Device, DeviceModel, PropertyType};
use crate::validate::{Problem, compare_numbers};
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::fmt;

/// The annotation the rules are written in.
pub const ANNOTATION: &str = "devices.kubeedge.io/alarms";
/// At most this many rules per device.
pub const MAX_RULES: usize = 32;
/// A rule name's longest spelling.
const MAX_NAME: usize = 63;
/// Who acknowledged, at most this long.
pub const MAX_BY: usize = 128;

/// How bad an alarm is; sorted most severe first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Critical,
    Major,
    Minor,
    Warning,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Critical => "critical",
            Self::Major => "major",
            Self::Minor => "minor",
            Self::Warning => "warning",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "critical" => Self::Critical,
            "major" => Self::Major,
            "minor" => Self::Minor,
            "warning" => Self::Warning,
            _ => return None,
        })
    }
}

/// A comparison of a number with a limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    Above,
    AtLeast,
    Below,
    AtMost,
}

impl Cmp {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            ">" => Self::Above,
            ">=" => Self::AtLeast,
            "<" => Self::Below,
            "<=" => Self::AtMost,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Above => ">",
            Self::AtLeast => ">=",
            Self::Below => "<",
            Self::AtMost => "<=",
        }
    }

    fn upward(self) -> bool {
        matches!(self, Self::Above | Self::AtLeast)
    }

    /// Whether `value` satisfies the comparison with `limit` (`None`: not a number).
    fn holds(self, value: &str, limit: &str) -> Option<bool> {
        let o = compare_numbers(value, limit)?;
        Some(match self {
            Self::Above => o == Ordering::Greater,
            Self::AtLeast => o != Ordering::Less,
            Self::Below => o == Ordering::Less,
            Self::AtMost => o != Ordering::Greater,
        })
    }
}

/// What raises an alarm.
#[derive(Clone, Debug, PartialEq)]
pub enum Condition {
    /// `PROP > LIMIT [clear < CLEAR]`: raised past the limit, cleared past `clear` (or as soon
    /// as the limit no longer holds).
    Threshold {
        property: String,
        cmp: Cmp,
        limit: String,
        clear: Option<(Cmp, String)>,
    },
    /// `PROP == VALUE` or `PROP != VALUE`: numbers compared as numbers, the rest as text.
    State {
        property: String,
        value: String,
        equal: bool,
    },
    /// `PROP stale DURATION`: no value read for that long.
    Stale { property: String, after_ms: i64 },
    /// `offline [DURATION]`: the device not online for that long.
    Offline { after_ms: i64 },
}

impl Condition {
    /// The property the condition reads (`None` for `offline`).
    pub fn property(&self) -> Option<&str> {
        match self {
            Self::Threshold { property, .. }
            | Self::State { property, .. }
            | Self::Stale { property, .. } => Some(property),
            Self::Offline { .. } => None,
        }
    }

    /// Whether the condition depends on time passing, not only on a change of the twin.
    pub fn timed(&self) -> bool {
        matches!(self, Self::Stale { .. } | Self::Offline { .. })
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Threshold {
                property,
                cmp,
                limit,
                clear,
            } => {
                write!(f, "{property} {} {limit}", cmp.as_str())?;
                if let Some((c, v)) = clear {
                    write!(f, " clear {} {v}", c.as_str())?;
                }
                Ok(())
            }
            Self::State {
                property,
                value,
                equal,
            } => write!(f, "{property} {} {value}", if *equal { "==" } else { "!=" }),
            Self::Stale { property, after_ms } => {
                write!(f, "{property} stale {}", duration_text(*after_ms))
            }
            Self::Offline { after_ms: 0 } => f.write_str("offline"),
            Self::Offline { after_ms } => write!(f, "offline {}", duration_text(*after_ms)),
        }
    }
}

/// One rule of a device.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub name: String,
    pub condition: Condition,
    pub severity: Severity,
}

/// What is wrong with one line of the rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleError {
    /// 1-based.
    pub line: usize,
    pub message: String,
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// A property as the rules may read it: its name and type (`None`: not known, its model not
/// given; a threshold is then taken on trust).
pub type Declared<'a> = (&'a str, Option<PropertyType>);

/// The rules of a text, each line read once; every problem at once. Blank lines and lines
/// starting with `#` are skipped. With `properties`, each rule's property must be one of them
/// (thresholds a number's).
pub fn parse(text: &str, properties: Option<&[Declared<'_>]>) -> (Vec<Rule>, Vec<RuleError>) {
    let mut rules: Vec<Rule> = Vec::new();
    let mut errors = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fail = |m: String| RuleError {
            line: i + 1,
            message: m,
        };
        match parse_line(line, properties) {
            Ok(rule) if rules.iter().any(|r| r.name == rule.name) => errors.push(fail(format!(
                "rule {} is named twice: each rule's name must be its own",
                rule.name
            ))),
            Ok(_) if rules.len() == MAX_RULES => {
                errors.push(fail(format!("more than {MAX_RULES} rules on one device")));
            }
            Ok(rule) => rules.push(rule),
            Err(m) => errors.push(fail(m)),
        }
    }
    (rules, errors)
}

/// The rules a device declares in its annotation, checked against its model's types; none
/// when it has no annotation.
pub fn of_device(
    device: &Device,
    types: &dyn Fn(&str) -> Option<PropertyType>,
) -> (Vec<Rule>, Vec<RuleError>) {
    let Some(text) = text_of(&device.metadata) else {
        return (Vec::new(), Vec::new());
    };
    let declared: Vec<Declared<'_>> = device
        .spec
        .properties
        .iter()
        .map(|p| (p.name.as_str(), types(&p.name)))
        .collect();
    parse(text, Some(&declared))
}

/// The rules' text of an object's metadata.
pub fn text_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()?
        .get(ANNOTATION)
        .map(String::as_str)
}

/// The field path of the alarm rules' problems.
pub fn path() -> String {
    format!("metadata.annotations[{ANNOTATION}]")
}

/// The problems of the device's alarm rules ([`crate::alarm`]), each an error naming its line,
/// checked against `model`'s types. Kept apart from [`crate::validate::validate_device`]: a bad rule makes
/// `kectl validate` fail and the API refuse the write, but a gateway given one (a cluster
/// without cloudcore's webhook) still runs the device and shows the rule as one that cannot be
/// evaluated.
pub fn problems(device: &Device, model: Option<&DeviceModel>) -> Vec<Problem> {
    let types = |name: &str| model.and_then(|m| m.property(name)).and_then(|p| p.type_);
    of_device(device, &types)
        .1
        .into_iter()
        .map(|e| Problem::error(path(), e))
        .collect()
}

/// [`problems`] when the rules changed from `before`'s (a stored Device whose model
/// changed since is not held back by rules that were accepted).
pub fn changed_problems(
    device: &Device,
    model: &DeviceModel,
    before: Option<&Device>,
) -> Vec<Problem> {
    let text = |d: &Device| {
        d.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION).cloned())
    };
    if before.is_some_and(|b| text(b) == text(device)) {
        return Vec::new();
    }
    problems(device, Some(model))
}

fn parse_line(line: &str, properties: Option<&[Declared<'_>]>) -> Result<Rule, String> {
    let Some((name, rest)) = line.split_once(':') else {
        return Err(format!(
            "`{line}` has no `NAME:`; write a rule as `NAME: CONDITION [SEVERITY]`, \
             e.g. `too-hot: temperature > 90 clear < 85 critical`"
        ));
    };
    let name = name.trim();
    check_name(name)?;
    let mut words: Vec<&str> = rest.split_whitespace().collect();
    let severity = match words.last().and_then(|w| Severity::parse(w)) {
        Some(s) => {
            words.pop();
            s
        }
        None => Severity::Major,
    };
    let condition = parse_condition(name, &words)?;
    if let (Some(p), Some(props)) = (condition.property(), properties) {
        let Some((_, kind)) = props.iter().find(|(n, _)| *n == p) else {
            let known: Vec<&str> = props.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "rule {name} reads property {p}, which the device does not declare (it has: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ));
        };
        if let (Condition::Threshold { .. }, Some(kind)) = (&condition, kind)
            && !matches!(
                kind,
                PropertyType::Int | PropertyType::Float | PropertyType::Double
            )
        {
            return Err(format!(
                "rule {name} compares {p} with a number, but {p} is {}: use == or != for \
                 a state",
                kind.as_str()
            ));
        }
    }
    Ok(Rule {
        name: name.to_string(),
        condition,
        severity,
    })
}

fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "rule name `{name}` must be 1-{MAX_NAME} lower-case letters, digits and '-', \
             starting and ending with a letter or digit"
        ))
    }
}

fn parse_condition(name: &str, w: &[&str]) -> Result<Condition, String> {
    let shape = "a condition is `PROP > N [clear < M]`, `PROP == VALUE`, `PROP != VALUE`, \
                 `PROP stale 30s` or `offline [1m]`";
    match w {
        [] => Err(format!("rule {name} has no condition: {shape}")),
        ["offline"] => Ok(Condition::Offline { after_ms: 0 }),
        ["offline", d] => Ok(Condition::Offline {
            after_ms: duration(name, d)?,
        }),
        [p, "stale", d] => Ok(Condition::Stale {
            property: (*p).to_string(),
            after_ms: duration(name, d)?.max(1),
        }),
        [p, op @ ("==" | "!="), v] => Ok(Condition::State {
            property: (*p).to_string(),
            value: (*v).to_string(),
            equal: *op == "==",
        }),
        [p, op, limit, tail @ ..] if Cmp::parse(op).is_some() => {
            let cmp = Cmp::parse(op).unwrap_or(Cmp::Above);
            number(name, limit)?;
            let clear = match tail {
                [] => None,
                ["clear", c, v] => {
                    let Some(c) = Cmp::parse(c) else {
                        return Err(format!(
                            "rule {name}: `clear {c}` is not a comparison (>, >=, <, <=)"
                        ));
                    };
                    number(name, v)?;
                    if c.upward() == cmp.upward() {
                        return Err(format!(
                            "rule {name}: `clear {} {v}` points the same way as `{} {limit}`; \
                             an alarm raised above a limit clears below one (and the other way)",
                            c.as_str(),
                            cmp.as_str()
                        ));
                    }
                    let o = compare_numbers(v, limit);
                    let wrong_side = if cmp.upward() {
                        o == Some(Ordering::Greater)
                    } else {
                        o == Some(Ordering::Less)
                    };
                    if wrong_side {
                        return Err(format!(
                            "rule {name}: clear {} {v} is on the wrong side of the limit {limit}: \
                             the alarm would clear while still raised",
                            c.as_str()
                        ));
                    }
                    Some((c, (*v).to_string()))
                }
                _ => {
                    return Err(format!(
                        "rule {name}: after `{p} {op} {limit}` only `clear < N` (or >, >=, <=) \
                         and a severity may follow, not `{}`",
                        tail.join(" ")
                    ));
                }
            };
            Ok(Condition::Threshold {
                property: (*p).to_string(),
                cmp,
                limit: (*limit).to_string(),
                clear,
            })
        }
        _ => Err(format!(
            "rule {name}: `{}` is not a condition: {shape}",
            w.join(" ")
        )),
    }
}

fn number(name: &str, v: &str) -> Result<(), String> {
    match v.parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(()),
        _ => Err(format!("rule {name}: `{v}` is not a number")),
    }
}

/// `30s`, `5m`, `2h` (whole numbers), in milliseconds.
fn duration(name: &str, d: &str) -> Result<i64, String> {
    let (n, unit) = d.split_at(d.find(|c: char| !c.is_ascii_digit()).unwrap_or(d.len()));
    let scale = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => 0,
    };
    match n.parse::<i64>() {
        Ok(n) if scale > 0 && n <= 30 * 24 => Ok(n * scale),
        _ => Err(format!(
            "rule {name}: `{d}` is not a duration: write whole seconds, minutes or hours, \
             e.g. 30s, 5m, 2h (at most 720)"
        )),
    }
}

fn duration_text(ms: i64) -> String {
    match ms {
        m if m % 3_600_000 == 0 => format!("{}h", m / 3_600_000),
        m if m % 60_000 == 0 => format!("{}m", m / 60_000),
        m => format!("{}s", m / 1000),
    }
}

/// One alarm of a device: an occurrence of a rule, as the gateway keeps it and everyone is
/// told (MQTT `$hw/events/device/{id}/alarm`, the local API, `DeviceStatus`'s
/// `status.extensions.alarms`). Times are milliseconds since the epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Alarm {
    pub rule: String,
    pub severity: Severity,
    /// The rule's condition, as the rule reads.
    pub condition: String,
    /// The property it reads (empty for `offline`).
    #[serde(default)]
    pub property: String,
    /// Whether the condition holds (or held last, when it cannot be evaluated now).
    pub active: bool,
    /// When this occurrence was raised (or, for a rule that cannot be evaluated, since when).
    pub since: i64,
    /// What raised it: `temperature 93.5 > 90`.
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleared_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acked_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acked_at: Option<i64>,
    /// Why the rule cannot be evaluated now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Over: cleared and acknowledged, or its rule removed. Told once, then forgotten.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ended: bool,
}

impl Alarm {
    /// ThingsBoard's four statuses, plus a rule that cannot be evaluated.
    pub fn status(&self) -> &'static str {
        match (
            self.active,
            self.cleared_at.is_some(),
            self.acked_at.is_some(),
        ) {
            _ if self.error.is_some() && !self.active => "unevaluable",
            (true, _, false) => "active-unacknowledged",
            (true, _, true) => "active-acknowledged",
            (false, _, false) => "cleared-unacknowledged",
            (false, _, true) => "cleared-acknowledged",
        }
    }
}

/// What the twin holds now for a rule.
#[derive(Clone, Debug, Default)]
pub struct Seen<'a> {
    /// The property's last good value (`None`: none yet, or the twin has no such property).
    pub value: Option<&'a str>,
    /// Whether the twin has the property at all.
    pub has_property: bool,
    /// When the property was last read (a value, changed or not).
    pub last_read: Option<i64>,
    /// Since when the device has not been online (`None`: it is online, or never said).
    pub offline_since: Option<i64>,
    /// Why, when something other than the device said so (`mapper m unreachable`).
    pub state: &'a str,
}

/// What changed in one evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Raised,
    Cleared,
    Acknowledged,
    /// The rule cannot be evaluated (the alarm's `error` says why).
    Unevaluable,
    /// It can be again.
    Evaluable,
    /// Its rule is gone.
    Removed,
}

impl Change {
    /// The reason of the Kubernetes Event that tells it.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Raised => "AlarmRaised",
            Self::Cleared => "AlarmCleared",
            Self::Acknowledged => "AlarmAcknowledged",
            Self::Unevaluable => "AlarmUnevaluable",
            Self::Evaluable => "AlarmEvaluable",
            Self::Removed => "AlarmRemoved",
        }
    }
}

/// The result of one evaluation: the alarm to keep (`None`: no alarm), and the change to tell
/// with the alarm as it is told (ended ones included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub keep: Option<Alarm>,
    pub told: Option<(Change, Alarm)>,
}

impl Step {
    fn same(prev: Option<&Alarm>) -> Self {
        Step {
            keep: prev.cloned(),
            told: None,
        }
    }

    fn tell(change: Change, a: Alarm) -> Self {
        let keep = (!a.ended).then(|| a.clone());
        Step {
            keep,
            told: Some((change, a)),
        }
    }
}

/// The property's value (`None`: none yet), or why there is no such property.
fn value_of<'a>(property: &str, seen: &Seen<'a>) -> Result<Option<&'a str>, String> {
    if !seen.has_property {
        return Err(format!("the twin has no property {property}"));
    }
    Ok(seen.value)
}

/// Whether the condition holds now: `Ok(Some(message))` it does, `Ok(None)` it does not,
/// `Err(why)` it cannot be told. `active` is whether the alarm is raised (the hysteresis).
fn holds(rule: &Rule, active: bool, seen: &Seen<'_>, now: i64) -> Result<Option<String>, String> {
    match &rule.condition {
        Condition::Offline { after_ms } => Ok(seen
            .offline_since
            .filter(|s| now - s >= *after_ms)
            .map(|_| {
                if seen.state.is_empty() {
                    "the device is not online".to_string()
                } else {
                    format!("the device is {}", seen.state)
                }
            })),
        Condition::Stale { property, after_ms } => {
            value_of(property, seen)?;
            Ok(match seen.last_read {
                Some(t) if now - t < *after_ms => None,
                Some(t) => Some(format!(
                    "{property} not read for {} s",
                    (now - t).div_euclid(1000)
                )),
                None => None,
            })
        }
        Condition::State {
            property,
            value,
            equal,
        } => {
            let Some(v) = value_of(property, seen)? else {
                return Ok(None);
            };
            let same = match compare_numbers(v, value) {
                Some(o) => o == Ordering::Equal,
                None => v.trim().eq_ignore_ascii_case(value.trim()),
            };
            Ok((same == *equal).then(|| format!("{property} is {v}")))
        }
        Condition::Threshold {
            property,
            cmp,
            limit,
            clear,
        } => {
            let Some(v) = value_of(property, seen)? else {
                return Ok(None);
            };
            let nan = || format!("{property} is `{v}`, not a number");
            let past = cmp.holds(v, limit).ok_or_else(nan)?;
            let raised = match (active, clear) {
                // Raised, with a hysteresis: it stands until the clear limit is passed.
                (true, Some((c, cv))) => !c.holds(v, cv).ok_or_else(nan)?,
                _ => past,
            };
            Ok(raised.then(|| {
                if past {
                    format!("{property} {v} {} {limit}", cmp.as_str())
                } else {
                    format!("{property} {v}, not yet past its clear limit")
                }
            }))
        }
    }
}

/// One evaluation of `rule`, with the alarm as it stands and what the twin holds now.
pub fn step(rule: &Rule, prev: Option<&Alarm>, seen: &Seen<'_>, now: i64) -> Step {
    let active = prev.is_some_and(|a| a.active);
    let fresh = |message: String, active: bool| Alarm {
        rule: rule.name.clone(),
        severity: rule.severity,
        condition: rule.condition.to_string(),
        property: rule.condition.property().unwrap_or_default().to_string(),
        active,
        since: now,
        message,
        cleared_at: None,
        acked_by: None,
        acked_at: None,
        error: None,
        ended: false,
    };
    match (holds(rule, active, seen, now), prev) {
        (Err(why), Some(a)) if a.error.as_deref() == Some(why.as_str()) => Step::same(prev),
        (Err(why), Some(a)) => {
            let mut a = a.clone();
            a.error = Some(why);
            Step::tell(Change::Unevaluable, a)
        }
        (Err(why), None) => {
            let mut a = fresh(format!("cannot be evaluated: {why}"), false);
            a.error = Some(why);
            Step::tell(Change::Unevaluable, a)
        }
        (Ok(Some(_)), Some(a)) if a.active => {
            if a.error.is_some() {
                let mut a = a.clone();
                a.error = None;
                return Step::tell(Change::Evaluable, a);
            }
            Step::same(prev)
        }
        // Raised: a new occurrence (a cleared one that was not acknowledged is replaced).
        (Ok(Some(message)), _) => Step::tell(Change::Raised, fresh(message, true)),
        (Ok(None), None) => Step::same(None),
        (Ok(None), Some(a)) if a.active => {
            let mut a = a.clone();
            a.active = false;
            a.error = None;
            a.cleared_at = Some(now);
            a.ended = a.acked_at.is_some();
            Step::tell(Change::Cleared, a)
        }
        (Ok(None), Some(a)) if a.error.is_some() => {
            let mut a = a.clone();
            a.error = None;
            // A rule that could not be evaluated and holds nothing: nothing is left to show.
            a.ended = a.cleared_at.is_none() || a.acked_at.is_some();
            Step::tell(Change::Evaluable, a)
        }
        (Ok(None), Some(_)) => Step::same(prev),
    }
}

/// Why an acknowledgement was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AckRefused {
    NoAlarm,
    Already { by: String },
    BadName,
}

impl fmt::Display for AckRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoAlarm => f.write_str("no alarm of that rule stands: nothing to acknowledge"),
            Self::Already { by } => write!(f, "already acknowledged by {by}"),
            Self::BadName => write!(
                f,
                "who acknowledges must be named in 1-{MAX_BY} printable characters"
            ),
        }
    }
}

impl std::error::Error for AckRefused {}

/// `by` acknowledges the alarm at `now`: a cleared one ends.
pub fn acknowledge(prev: Option<&Alarm>, by: &str, now: i64) -> Result<Step, AckRefused> {
    if by.is_empty() || by.len() > MAX_BY || by.chars().any(char::is_control) {
        return Err(AckRefused::BadName);
    }
    let Some(a) = prev.filter(|a| a.active || a.cleared_at.is_some()) else {
        return Err(AckRefused::NoAlarm);
    };
    if let Some(by) = &a.acked_by {
        return Err(AckRefused::Already { by: by.clone() });
    }
    let mut a = a.clone();
    a.acked_by = Some(by.to_string());
    a.acked_at = Some(now);
    a.ended = !a.active;
    Ok(Step::tell(Change::Acknowledged, a))
}

/// The alarm of a rule that is gone (or whose device is): told once, ended.
pub fn removed(prev: &Alarm) -> Step {
    let mut a = prev.clone();
    a.ended = true;
    Step::tell(Change::Removed, a)
}

#[cfg(test)]
mod tests;
