//! What simulated devices do over time: a scenario file (YAML).
//!
//! ```yaml
//! seed: 7                      # random walks and fault shares repeat with the same seed
//! devices:
//!   default/oven-1:            # namespace/name (or just name, in default)
//!     properties:
//!       temperature:
//!         value: {follow: {property: setpoint, perSecond: 0.5, when: heater-on, otherwise: 20}}
//!       setpoint: {writes: keep}             # keep (default): a write holds; ignore: it is undone
//!       pressure: {value: {sine: {mean: 2.0, amplitude: 0.5, periodSeconds: 60}}}
//!       level: {value: {randomWalk: {start: 50, step: 1, min: 0, max: 100}}}
//!       speed: {value: {ramp: {from: 0, to: 1500, seconds: 30}}}
//!       mode: {value: {steps: [{at: 0, value: 1}, {at: 20, value: 2}]}}
//!       serial: {value: {constant: "SN-0042"}}
//!     faults:                  # `at` and `seconds` on the scenario's clock, or `share` of requests
//!       - {kind: exception, code: 4, at: 10, seconds: 5}
//!       - {kind: exception, code: 6, share: 0.1}
//!       - {kind: noAnswer, at: 20, seconds: 3}
//!       - {kind: late, delayMs: 1500, at: 30, seconds: 5}
//!       - {kind: garbage, at: 40, seconds: 2}
//!       - {kind: duplicate, at: 42, seconds: 2}  # every answer sent twice
//!       - {kind: truncate, at: 44, seconds: 2}   # only the first half of every answer
//!       - {kind: disconnect, at: 50}
//!       - {kind: reboot, at: 60, seconds: 3}   # no answer, then the start values again
//! ```

use rand::{Rng, SeedableRng};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Scenario {
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub devices: BTreeMap<String, DeviceScenario>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceScenario {
    #[serde(default)]
    pub properties: BTreeMap<String, PropertyScenario>,
    #[serde(default)]
    pub faults: Vec<Fault>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PropertyScenario {
    pub value: Option<Behaviour>,
    #[serde(default)]
    pub writes: Writes,
}

/// What happens to a value the mapper writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Writes {
    /// The written value holds (and ends the property's behaviour).
    #[default]
    Keep,
    /// The write is answered, and undone by the behaviour at the next tick.
    Ignore,
}

/// How a value moves over time.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub enum Behaviour {
    Constant(serde_json::Value),
    #[serde(rename_all = "camelCase")]
    Ramp {
        from: f64,
        to: f64,
        seconds: f64,
    },
    #[serde(rename_all = "camelCase")]
    Sine {
        mean: f64,
        amplitude: f64,
        period_seconds: f64,
    },
    #[serde(rename_all = "camelCase")]
    RandomWalk {
        start: f64,
        step: f64,
        min: f64,
        max: f64,
    },
    Steps(Vec<Step>),
    #[serde(rename_all = "camelCase")]
    Follow {
        property: String,
        per_second: f64,
        /// A boolean property that must be on for the value to follow.
        when: Option<String>,
        /// Where the value drifts while `when` is off.
        otherwise: Option<f64>,
    },
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub at: f64,
    pub value: serde_json::Value,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Fault {
    pub kind: FaultKind,
    /// Start, in seconds of the scenario's clock.
    pub at: Option<f64>,
    /// How long; none: an instant (`disconnect`) or for good.
    pub seconds: Option<f64>,
    /// Instead of a time: this share of requests (0 to 1), all along (`exception` only).
    pub share: Option<f64>,
    /// The exception code (1 to 255), for `exception`.
    pub code: Option<u8>,
    /// The delay before each answer, for `late`.
    pub delay_ms: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FaultKind {
    Exception,
    NoAnswer,
    Late,
    Garbage,
    /// Every answer sent twice.
    Duplicate,
    /// Only the first half of every answer sent.
    Truncate,
    Disconnect,
    Reboot,
}

/// Why a scenario cannot be used, with the field path.
#[derive(Debug, thiserror::Error)]
#[error("scenario{}: {message}", if path.is_empty() { String::new() } else { format!(": {path}") })]
pub struct ScenarioError {
    pub path: String,
    pub message: String,
}

impl Scenario {
    /// Parses a scenario; an unknown key, a wrong type or an impossible fault names its path.
    pub fn parse(text: &str) -> Result<Self, ScenarioError> {
        // Through JSON's data model: YAML's own reads a one-key map as a tagged enum only from
        // `!tag` syntax, and `{ramp: {...}}` is what people write.
        let value: serde_json::Value =
            serde_yaml_ng::from_str(text).map_err(|e| ScenarioError {
                path: String::new(),
                message: e.to_string(),
            })?;
        let s: Scenario = serde_path_to_error::deserialize(value).map_err(|e| ScenarioError {
            path: e.path().to_string(),
            message: e.inner().to_string(),
        })?;
        s.check()?;
        Ok(s)
    }

    /// What the types cannot say: a fault's timing and its arguments, a ramp's length.
    pub fn check(&self) -> Result<(), ScenarioError> {
        for (d, ds) in &self.devices {
            for (i, f) in ds.faults.iter().enumerate() {
                let at = format!("devices.{d}.faults[{i}]");
                let bad = |k: &str, m: &str| ScenarioError {
                    path: format!("{at}.{k}"),
                    message: m.into(),
                };
                match (f.at, f.share) {
                    (Some(_), Some(_)) => {
                        return Err(bad("share", "give `at` or `share`, not both"));
                    }
                    (None, None) => return Err(bad("at", "missing (or `share`)")),
                    (None, Some(sh)) if !(0.0..=1.0).contains(&sh) => {
                        return Err(bad("share", "must be 0 to 1"));
                    }
                    (None, Some(_)) if f.kind != FaultKind::Exception => {
                        return Err(bad("share", "only an exception can be a share of requests"));
                    }
                    _ => {}
                }
                if f.kind == FaultKind::Exception && f.code.is_none_or(|c| c == 0) {
                    return Err(bad("code", "an exception needs its code, 1 to 255"));
                }
                if f.kind == FaultKind::Late && f.delay_ms.is_none() {
                    return Err(bad("delayMs", "a late answer needs its delay"));
                }
            }
            for (p, ps) in &ds.properties {
                if let Some(Behaviour::Ramp { seconds, .. }) = &ps.value
                    && *seconds <= 0.0
                {
                    return Err(ScenarioError {
                        path: format!("devices.{d}.properties.{p}.value.ramp.seconds"),
                        message: "must be more than 0".into(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Every device and property the scenario names is one of `devices` (as laid out from the
    /// manifests), and no two behaviours drive the same registers of one unit (several
    /// Devices on one unit, or two properties on one register, are views of the same registers:
    /// one of them drives them, the others read them).
    pub fn check_against(&self, devices: &[crate::device::SimDevice]) -> Result<(), ScenarioError> {
        use crate::device::Visit;
        // Per Modbus place: the points driven by a behaviour so far, with whose they are.
        let mut driven: BTreeMap<String, Vec<(String, &mapper_modbus::device::Point)>> =
            BTreeMap::new();
        for (key, ds) in &self.devices {
            let id = crate::device::qualified(key);
            let Some(d) = devices.iter().find(|d| d.id == id) else {
                return Err(ScenarioError {
                    path: format!("devices.{key}"),
                    message: crate::device::no_device(&id, devices),
                });
            };
            for (prop, ps) in &ds.properties {
                let Some(p) = d.points.iter().find(|p| &p.name == prop) else {
                    return Err(ScenarioError {
                        path: format!("devices.{key}.properties.{prop}"),
                        message: crate::device::no_property(d, prop),
                    });
                };
                let (Some(place), Visit::Modbus(mp), Some(_)) =
                    (d.modbus_place(), &p.point, &ps.value)
                else {
                    continue;
                };
                let others = driven.entry(place.clone()).or_default();
                if let Some((other, _)) =
                    others.iter().find(|(_, o)| crate::layout::overlaps(o, mp))
                {
                    return Err(ScenarioError {
                        path: format!("devices.{key}.properties.{prop}.value"),
                        message: format!(
                            "{other} drives the same registers of {place}: give one of them a behaviour, the other reads it"
                        ),
                    });
                }
                others.push((format!("{id} {prop}"), mp));
            }
        }
        Ok(())
    }

    /// The scenario of device `id` (`namespace/name`; a bare name is in `default`).
    pub fn device(&self, id: &str) -> Option<&DeviceScenario> {
        self.devices.get(id).or_else(|| {
            id.strip_prefix("default/")
                .and_then(|name| self.devices.get(name))
        })
    }
}

/// A behaviour being played: its state between ticks.
pub struct Player {
    behaviour: Behaviour,
    rng: rand::rngs::StdRng,
    /// The last value of a walk or a follow.
    current: Option<f64>,
}

fn text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

impl Player {
    pub fn new(behaviour: Behaviour, seed: u64) -> Self {
        Self {
            behaviour,
            rng: rand::rngs::StdRng::seed_from_u64(seed),
            current: None,
        }
    }

    /// The value at `t` seconds, `dt` after the previous tick. `look` reads another property's
    /// current value (for `follow`); `now` is this property's current value.
    pub fn value(
        &mut self,
        t: f64,
        dt: f64,
        now: Option<f64>,
        look: impl Fn(&str) -> Option<String>,
    ) -> Option<String> {
        let number = |v: f64| {
            let r = (v * 1e6).round() / 1e6;
            if r.fract() == 0.0 && r.abs() < 1e15 {
                format!("{}", r as i64)
            } else {
                format!("{r}")
            }
        };
        Some(match &self.behaviour {
            Behaviour::Constant(v) => text(v),
            Behaviour::Ramp { from, to, seconds } => {
                number(from + (to - from) * (t / seconds).clamp(0.0, 1.0))
            }
            Behaviour::Sine {
                mean,
                amplitude,
                period_seconds,
            } => number(
                mean + amplitude * (t * std::f64::consts::TAU / period_seconds.max(1e-9)).sin(),
            ),
            Behaviour::RandomWalk {
                start,
                step,
                min,
                max,
            } => {
                let cur = self.current.unwrap_or(*start);
                let next = if dt > 0.0 {
                    (cur + self.rng.gen_range(-1.0..=1.0) * step).clamp(*min, *max)
                } else {
                    cur
                };
                self.current = Some(next);
                number(next)
            }
            Behaviour::Steps(steps) => text(&steps.iter().rev().find(|s| s.at <= t)?.value),
            Behaviour::Follow {
                property,
                per_second,
                when,
                otherwise,
            } => {
                let cur = self.current.or(now).unwrap_or(0.0);
                let on = when
                    .as_ref()
                    .is_none_or(|w| look(w).is_some_and(|v| v == "true" || v == "1"));
                let target = if on {
                    look(property)?.parse::<f64>().ok()?
                } else {
                    otherwise.unwrap_or(cur)
                };
                let k = (per_second * dt).clamp(0.0, 1.0);
                let next = cur + (target - cur) * k;
                self.current = Some(next);
                number(next)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn play(b: Behaviour, ticks: &[(f64, f64)]) -> Vec<Option<String>> {
        let mut p = Player::new(b, 7);
        ticks
            .iter()
            .map(|&(t, dt)| p.value(t, dt, None, |_| None))
            .collect()
    }

    fn some(v: &[&str]) -> Vec<Option<String>> {
        v.iter().map(|s| Some(s.to_string())).collect()
    }

    #[test]
    fn a_ramp_reaches_its_end_in_its_seconds_and_a_sine_swings_by_its_amplitude() {
        let ramp = Behaviour::Ramp {
            from: 0.0,
            to: 1500.0,
            seconds: 30.0,
        };
        let sine = Behaviour::Sine {
            mean: 2.0,
            amplitude: 0.5,
            period_seconds: 60.0,
        };
        // t: 0, 15, 30 (and 45), 60.
        let ticks = [
            (0.0, 0.0),
            (15.0, 15.0),
            (30.0, 15.0),
            (45.0, 15.0),
            (60.0, 15.0),
        ];
        assert_eq!(
            play(ramp, &ticks),
            some(&["0", "750", "1500", "1500", "1500"])
        );
        assert_eq!(play(sine, &ticks), some(&["2", "2.5", "2", "1.5", "2"]));
    }

    #[test]
    fn steps_hold_the_last_value_whose_time_has_come_and_nothing_before_the_first() {
        let steps = || {
            Behaviour::Steps(vec![
                Step {
                    at: 5.0,
                    value: json!(1),
                },
                Step {
                    at: 20.0,
                    value: json!("two"),
                },
            ])
        };
        assert_eq!(
            play(
                steps(),
                &[(0.0, 0.0), (5.0, 5.0), (19.9, 14.9), (20.0, 0.1)]
            ),
            vec![None, Some("1".into()), Some("1".into()), Some("two".into())]
        );
    }

    #[test]
    fn a_random_walk_stays_in_its_bounds_moves_at_most_a_step_and_repeats_with_its_seed() {
        let walk = || Behaviour::RandomWalk {
            start: 50.0,
            step: 1.0,
            min: 49.0,
            max: 51.5,
        };
        let ticks: Vec<(f64, f64)> = (0..500).map(|i| (f64::from(i), 1.0)).collect();
        let a = play(walk(), &ticks);
        assert_eq!(a, play(walk(), &ticks), "the same seed, the same walk");
        let values: Vec<f64> = a
            .iter()
            .map(|v| v.as_deref().and_then(|s| s.parse().ok()).expect("a number"))
            .collect();
        assert!(
            values.iter().all(|v| (49.0..=51.5).contains(v)),
            "{values:?}"
        );
        assert!(values.windows(2).all(|w| (w[1] - w[0]).abs() <= 1.0 + 1e-9));
        assert!(values.iter().any(|v| *v != 50.0), "it moves");
        assert_eq!(
            play(walk(), &[(0.0, 0.0)]),
            some(&["50"]),
            "no time passed: no step"
        );
    }

    #[test]
    fn a_follower_closes_on_its_target_while_its_condition_holds_and_drifts_back_otherwise() {
        let mut p = Player::new(
            Behaviour::Follow {
                property: "setpoint".into(),
                per_second: 0.5,
                when: Some("heater".into()),
                otherwise: Some(20.0),
            },
            1,
        );
        // The set point is 80; the heater on or off.
        let heater = |state: &'static str| {
            move |k: &str| match k {
                "setpoint" => Some("80".to_string()),
                "heater" => Some(state.to_string()),
                _ => None,
            }
        };
        let (on, off) = (heater("true"), heater("false"));
        // Half the way each second: 20 -> 50 -> 65.
        assert_eq!(p.value(1.0, 1.0, Some(20.0), on).as_deref(), Some("50"));
        assert_eq!(p.value(2.0, 1.0, None, on).as_deref(), Some("65"));
        // Heater off: back toward 20: 65 -> 42.5.
        assert_eq!(p.value(3.0, 1.0, None, off).as_deref(), Some("42.5"));
        // A long tick never overshoots.
        assert_eq!(p.value(13.0, 10.0, None, on).as_deref(), Some("80"));
    }

    #[test]
    fn a_scenario_names_the_path_of_what_is_wrong() {
        let err = |text: &str| Scenario::parse(text).expect_err("refused").to_string();
        let e = err("devices:\n  oven:\n    faults:\n      - {kind: exception, at: 1}\n");
        assert!(e.contains("devices.oven.faults[0].code"), "{e}");
        let e = err("devices:\n  oven:\n    faults:\n      - {kind: noAnswer, share: 0.5}\n");
        assert!(e.contains("only an exception"), "{e}");
        let e =
            err("devices:\n  oven:\n    faults:\n      - {kind: exception, code: 4, share: 2}\n");
        assert!(e.contains("must be 0 to 1"), "{e}");
        let e = err("devices:\n  oven:\n    faults:\n      - {kind: late, at: 1}\n");
        assert!(e.contains("delayMs"), "{e}");
        let e = err(
            "devices:\n  oven:\n    properties:\n      speed: {value: {ramp: {from: 0, to: 1, seconds: 0}}}\n",
        );
        assert!(
            e.contains("devices.oven.properties.speed.value.ramp.seconds"),
            "{e}"
        );
        let e = err("devices:\n  oven:\n    properties:\n      speed: {value: {rampp: {}}}\n");
        assert!(e.contains("devices.oven.properties.speed.value"), "{e}");
        let s = Scenario::parse("devices:\n  oven: {}\n  plant/pump: {}\n").expect("a scenario");
        assert!(
            s.device("default/oven").is_some(),
            "a bare name is in default"
        );
        assert!(s.device("plant/pump").is_some());
        assert!(s.device("plant/oven").is_none());
    }
}
