//! What a query answers: raw points as reported, and buckets (min, max, sum, count and last
//! value of a step), merged from the tiers' rows.

use crate::model::Millis;
use sqlx::Row;

pub(super) fn value_of(num: Option<f64>, txt: Option<String>) -> serde_json::Value {
    match (txt, num) {
        (Some(t), _) => serde_json::Value::String(t),
        (None, Some(n)) => serde_json::json!(n),
        (None, None) => serde_json::Value::Null,
    }
}

pub(super) fn raw_point(r: &sqlx::sqlite::SqliteRow) -> RawPoint {
    RawPoint {
        t: r.get(0),
        value: value_of(r.get(1), r.get(2)),
    }
}

/// A point as reported.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RawPoint {
    pub t: Millis,
    /// A number, or the text of a value that is none (booleans as `"true"`/`"false"`).
    #[serde(rename = "v")]
    pub value: serde_json::Value,
}

/// One step of a query: the points of `[t, t + step)`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Bucket {
    pub t: Millis,
    pub min: Option<f64>,
    pub max: Option<f64>,
    #[serde(skip)]
    pub sum: Option<f64>,
    /// Numeric points in it.
    pub count: u64,
    /// The last value in it.
    pub last: serde_json::Value,
    #[serde(skip)]
    pub last_t: Millis,
}

impl Bucket {
    /// The bucket of one point alone.
    pub(super) fn of_point(p: RawPoint) -> Self {
        // A boolean counts as 1 or 0, as the minute and hour tiers count it.
        let n = match &p.value {
            serde_json::Value::String(t) if t == "true" => Some(1.0),
            serde_json::Value::String(t) if t == "false" => Some(0.0),
            v => v.as_f64(),
        };
        Self {
            t: p.t,
            min: n,
            max: n,
            sum: n,
            count: u64::from(n.is_some()),
            last: p.value,
            last_t: p.t,
        }
    }

    pub(super) fn merge(&mut self, b: &Bucket) {
        let pick = |a: Option<f64>, b: Option<f64>, f: fn(f64, f64) -> f64| match (a, b) {
            (Some(x), Some(y)) => Some(f(x, y)),
            (x, y) => x.or(y),
        };
        self.min = pick(self.min, b.min, f64::min);
        self.max = pick(self.max, b.max, f64::max);
        self.sum = pick(self.sum, b.sum, |x, y| x + y);
        self.count += b.count;
        if b.last_t >= self.last_t {
            self.last = b.last.clone();
            self.last_t = b.last_t;
        }
    }

    /// The mean of its numeric points.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum.unwrap_or(0.0) / self.count as f64)
    }
}

/// What a query answers.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub device: String,
    pub property: String,
    pub from: Millis,
    pub to: Millis,
    pub step: Option<Millis>,
    /// Where the buckets come from: `raw`, `minute` or `hour`.
    pub tier: &'static str,
    /// The last point before `from` (the value holding at `from`).
    pub before: Option<RawPoint>,
    /// Without a step: the raw points.
    pub points: Vec<RawPoint>,
    /// With a step: a bucket per step that has points.
    pub buckets: Vec<Bucket>,
    /// More raw points than [`super::MAX_POINTS`]: give a step.
    pub truncated: bool,
}

/// A series as the history API answers it (the gateway's HTTP API and the cloud's
/// `devices/history` alike): `device`, `property`, `from`, `to`, `tier`, `before`, then without a
/// step `points` and `truncated`, with one `step` and `buckets` (`t`, `min`, `max`, `mean`,
/// `last`, `count`).
impl serde::Serialize for Series {
    fn serialize<S: serde::Serializer>(&self, out: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Step<'a> {
            t: Millis,
            min: Option<f64>,
            max: Option<f64>,
            mean: Option<f64>,
            last: &'a serde_json::Value,
            count: u64,
        }
        #[derive(serde::Serialize)]
        struct Answer<'a> {
            device: &'a str,
            property: &'a str,
            from: Millis,
            to: Millis,
            tier: &'static str,
            before: &'a Option<RawPoint>,
            #[serde(skip_serializing_if = "Option::is_none")]
            points: Option<&'a [RawPoint]>,
            #[serde(skip_serializing_if = "Option::is_none")]
            truncated: Option<bool>,
            #[serde(skip_serializing_if = "Option::is_none")]
            step: Option<Millis>,
            #[serde(skip_serializing_if = "Option::is_none")]
            buckets: Option<Vec<Step<'a>>>,
        }
        let stepped = self.step.is_some();
        Answer {
            device: &self.device,
            property: &self.property,
            from: self.from,
            to: self.to,
            tier: self.tier,
            before: &self.before,
            points: (!stepped).then_some(self.points.as_slice()),
            truncated: (!stepped).then_some(self.truncated),
            step: self.step,
            buckets: stepped.then(|| {
                self.buckets
                    .iter()
                    .map(|b| Step {
                        t: b.t,
                        min: b.min,
                        max: b.max,
                        mean: b.mean(),
                        last: &b.last,
                        count: b.count,
                    })
                    .collect()
            }),
        }
        .serialize(out)
    }
}
