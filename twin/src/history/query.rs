//! A history query as a user types it (`?from=&to=&step=` on the gateway's API, the same
//! words through the cloud's `devices/history`), read once into a [`Query`] that the history
//! then runs. The grammar:
//!
//! - a time is ms since the epoch, `now`, or `now` less a duration: `-90s`, `-30m`, `-24h`,
//!   `-7d` (`-5000`: ms);
//! - a step is a duration: `30s`, `1m`, `1h`, `1d`, or ms;
//! - `to` is `now` when not given, `from` an hour before `to`; no step: each raw point.
//!
//! And the rules a query keeps: `to` after `from`; a step of at least a second; at most
//! [`MAX_POINTS`] buckets.

use super::MAX_POINTS;
use crate::model::Millis;

/// What a query reads: `[from, to)`, ms since the epoch; a bucket per `step` when there is one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Query {
    pub from: Millis,
    pub to: Millis,
    pub step: Option<Millis>,
}

/// A query's words as a request carries them: `?from=&to=&step=`, or the same fields of the
/// cloud's `devicehistory` message.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
pub struct QueryText {
    pub from: Option<String>,
    pub to: Option<String>,
    pub step: Option<String>,
}

impl QueryText {
    /// The query these words ask at `now`.
    pub fn parse(&self, now: Millis) -> Result<Query, QueryError> {
        Query::parse(
            self.from.as_deref(),
            self.to.as_deref(),
            self.step.as_deref(),
            now,
        )
    }
}

/// Why a query is refused; it names the value and what would do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("{key}={text:?}: give ms since the epoch, now, or -24h, -7d, -30m, -90s")]
    Time { key: &'static str, text: String },
    #[error("step={0:?}: give 30s, 1m, 1h, 1d or ms")]
    Step(String),
    #[error("`to` ({to}) is not after `from` ({from})")]
    Empty { from: Millis, to: Millis },
    #[error("step {0} ms: give at least 1000 (1 s)")]
    StepTooSmall(Millis),
    #[error(
        "{steps} steps of {step} ms from {from} to {to}: at most {MAX_POINTS} buckets are answered; give a larger step or a shorter period"
    )]
    TooManySteps {
        steps: i64,
        step: Millis,
        from: Millis,
        to: Millis,
    },
}

/// The last hour, when `from` is not given.
const DEFAULT_SPAN: Millis = 3_600_000;

impl Query {
    /// The query of a request's `from`, `to` and `step` at `now` (absent or empty: the
    /// defaults).
    pub fn parse(
        from: Option<&str>,
        to: Option<&str>,
        step: Option<&str>,
        now: Millis,
    ) -> Result<Self, QueryError> {
        let to = match to.filter(|t| !t.trim().is_empty()) {
            None => now,
            Some(t) => time("to", t, now)?,
        };
        let from = match from.filter(|t| !t.trim().is_empty()) {
            None => to.saturating_sub(DEFAULT_SPAN),
            Some(t) => time("from", t, now)?,
        };
        let step = match step.filter(|t| !t.trim().is_empty()) {
            None => None,
            Some(t) => Some(duration_ms(t).ok_or_else(|| QueryError::Step(t.to_string()))?),
        };
        Self::new(from, to, step)
    }

    /// A query of `[from, to)`, checked.
    pub fn new(from: Millis, to: Millis, step: Option<Millis>) -> Result<Self, QueryError> {
        if to <= from {
            return Err(QueryError::Empty { from, to });
        }
        if let Some(s) = step {
            if s < 1000 {
                return Err(QueryError::StepTooSmall(s));
            }
            let steps = to.saturating_sub(from).saturating_add(s - 1) / s;
            if steps > MAX_POINTS as i64 {
                return Err(QueryError::TooManySteps {
                    steps,
                    step: s,
                    from,
                    to,
                });
            }
        }
        Ok(Self { from, to, step })
    }
}

/// A time: ms since the epoch, `now`, or `now` less `-N(ms|s|m|h|d)`.
fn time(key: &'static str, text: &str, now: Millis) -> Result<Millis, QueryError> {
    let t = text.trim();
    let refused = || QueryError::Time {
        key,
        text: text.to_string(),
    };
    if t == "now" {
        return Ok(now);
    }
    if let Some(ago) = t.strip_prefix('-') {
        return duration_ms(ago)
            .and_then(|d| now.checked_sub(d))
            .ok_or_else(refused);
    }
    t.parse::<Millis>().map_err(|_| refused())
}

/// `30s`, `5m`, `1h`, `7d` or plain ms, in ms.
fn duration_ms(text: &str) -> Option<Millis> {
    let t = text.trim();
    let (n, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, "ms"),
    };
    let n: Millis = n.parse().ok()?;
    let unit = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: Millis = 1_700_000_000_000;

    fn q(from: Option<&str>, to: Option<&str>, step: Option<&str>) -> Result<Query, QueryError> {
        Query::parse(from, to, step, NOW)
    }

    #[test]
    fn nothing_given_is_the_last_hour_point_by_point() {
        assert_eq!(
            q(None, None, None),
            Ok(Query {
                from: NOW - 3_600_000,
                to: NOW,
                step: None
            })
        );
        assert_eq!(q(Some(""), Some(" "), Some("")), q(None, None, None));
    }

    #[test]
    fn a_time_is_epoch_ms_now_or_now_less_a_duration() {
        let from = |t: &str| q(Some(t), None, None).map(|q| q.from);
        assert_eq!(from("1699999990000"), Ok(1_699_999_990_000));
        assert_eq!(from("-90s"), Ok(NOW - 90_000));
        assert_eq!(from("-30m"), Ok(NOW - 1_800_000));
        assert_eq!(from("-24h"), Ok(NOW - 86_400_000));
        assert_eq!(from("-7d"), Ok(NOW - 604_800_000));
        assert_eq!(from("-5000"), Ok(NOW - 5000));
        assert_eq!(
            q(Some("-1h"), Some("now"), None).map(|q| q.to),
            Ok(NOW),
            "now"
        );
    }

    #[test]
    fn from_defaults_to_an_hour_before_to() {
        assert_eq!(
            q(None, Some("-1d"), None).map(|q| (q.from, q.to)),
            Ok((NOW - 86_400_000 - 3_600_000, NOW - 86_400_000))
        );
    }

    #[test]
    fn a_time_that_is_none_of_these_is_refused_naming_the_key() {
        for bad in [
            "yesterday",
            "-1w",
            "-h",
            "1.5",
            "+1h",
            "--1h",
            "-99999999999999999d",
        ] {
            let e = q(Some(bad), None, None).expect_err(bad);
            assert_eq!(
                e,
                QueryError::Time {
                    key: "from",
                    text: bad.into()
                }
            );
            assert!(e.to_string().starts_with("from="), "{e}");
        }
        assert!(matches!(
            q(None, Some("later"), None),
            Err(QueryError::Time { key: "to", .. })
        ));
    }

    #[test]
    fn a_step_is_a_duration() {
        let step = |s: &str| q(Some("-1d"), None, Some(s)).map(|q| q.step);
        assert_eq!(step("30s"), Ok(Some(30_000)));
        assert_eq!(step("1m"), Ok(Some(60_000)));
        assert_eq!(step("1h"), Ok(Some(3_600_000)));
        assert_eq!(step("5000"), Ok(Some(5000)));
        assert_eq!(step("1 m"), Err(QueryError::Step("1 m".into())));
        assert_eq!(step("fast"), Err(QueryError::Step("fast".into())));
    }

    #[test]
    fn to_must_be_after_from() {
        assert_eq!(
            q(Some("now"), Some("-1h"), None),
            Err(QueryError::Empty {
                from: NOW,
                to: NOW - 3_600_000
            })
        );
        assert!(q(Some("now"), Some("now"), None).is_err());
    }

    #[test]
    fn a_step_under_a_second_is_refused() {
        assert_eq!(
            q(None, None, Some("999")),
            Err(QueryError::StepTooSmall(999))
        );
        assert!(q(None, None, Some("1s")).is_ok());
    }

    #[test]
    fn more_buckets_than_the_limit_are_refused_naming_it() {
        // 23 hours at 1 s: 82,800 buckets.
        let e = q(Some("-23h"), None, Some("1s")).expect_err("too many");
        assert!(matches!(e, QueryError::TooManySteps { steps: 82_800, .. }));
        assert!(e.to_string().contains("at most 20000 buckets"), "{e}");
        // Exactly the limit is answered.
        assert!(q(Some("-20000s"), None, Some("1s")).is_ok());
        assert!(q(Some("-20001s"), None, Some("1s")).is_err());
    }

    /// Times and steps from the grammar's own parts: what it accepts is what it means.
    fn ago() -> impl Strategy<Value = (String, Millis)> {
        (
            0u32..100_000,
            prop_oneof![
                Just(("", 1)),
                Just(("ms", 1)),
                Just(("s", 1000)),
                Just(("m", 60_000)),
                Just(("h", 3_600_000)),
                Just(("d", 86_400_000))
            ],
        )
            .prop_map(|(n, (unit, ms))| (format!("-{n}{unit}"), Millis::from(n) * ms))
    }

    proptest! {
        #[test]
        fn every_duration_of_the_grammar_is_read_as_it_says((text, ms) in ago()) {
            let got = Query::parse(Some(&text), Some("now"), None, NOW);
            if ms == 0 {
                let empty = matches!(got, Err(QueryError::Empty { .. }));
                prop_assert!(empty, "{:?}", got);
            } else {
                prop_assert_eq!(got.map(|q| q.from), Ok(NOW - ms));
            }
        }

        #[test]
        fn any_text_is_answered_without_a_panic(from in ".{0,12}", to in ".{0,12}", step in ".{0,8}") {
            let _ = Query::parse(Some(&from), Some(&to), Some(&step), NOW);
        }
    }
}
