//! The twins' history: every reported value a twin took (and each device state), kept in its own
//! SQLite file beside the twins (`NAME-history.db`), in three tiers:
//! - **raw**: each value as reported, with its timestamp, for `rawWindow` (a day by default);
//! - **minute** and **hour**: min, max, sum, count and last value of each complete minute and
//!   hour, rolled up from the tier below, for `minuteWindow` (30 days) and `hourWindow` (two
//!   years).
//!
//! It is fed by the twin journal's fold (`store::fold`): the points of each committed batch are
//! written here before the journal rows that hold them are deleted, with the last journal row
//! they cover, so a crash loses none that was acknowledged (the next start ingests what is left
//! of the journal) and none is written twice.
//!
//! History never costs the twins: it has its own file and connections, a write that fails (a
//! full disk) drops those points (counted) instead of holding the journal, and the file is
//! bounded by `maxBytes` and by `minFreeBytes` left free on its disk, the oldest points going
//! first (whichever tier holds them).

mod query;
mod series;
mod tiers;

pub use query::{Query, QueryError, QueryText};
pub use series::{Bucket, RawPoint, Series};

use crate::model::Millis;
use series::{raw_point, value_of};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{AssertSqlSafe, Row};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The property name under which a device's state is kept (`online`, `offline`, ...).
pub const STATE: &str = "$state";

const MINUTE: Millis = 60_000;
const HOUR: Millis = 3_600_000;

/// Only minutes (hours) that ended this long ago are rolled up: a point reported late (the
/// fold runs every few seconds) still lands in its minute.
const GRACE: Millis = 2 * MINUTE;

/// How often the roll-ups, windows and bounds are applied.
pub const MAINTAIN_EVERY: Duration = Duration::from_secs(60);

/// Points written by one statement.
const ROWS_PER_STATEMENT: usize = 200;

/// A query's raw points, at most; more asks for a step. Also the most buckets a stepped query
/// answers (more is refused, naming the limit).
pub const MAX_POINTS: usize = 20_000;

/// Raw points read at once when a stepped query draws its buckets from them.
const RAW_PAGE: usize = 5_000;

/// Retention and bounds.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HistoryConfig {
    /// Whether history is kept at all.
    pub enabled: bool,
    /// How long raw points are kept, in seconds.
    pub raw_window: u64,
    /// How long minute aggregates are kept, in seconds.
    pub minute_window: u64,
    /// How long hour aggregates are kept, in seconds.
    pub hour_window: u64,
    /// The history file's size bound, in bytes: past it the oldest points are dropped.
    pub max_bytes: u64,
    /// Free space left on the disk, in bytes: below it, new points are dropped and old ones
    /// deleted, so that history never takes the space the twins need.
    pub min_free_bytes: u64,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            raw_window: 24 * 3600,
            minute_window: 30 * 24 * 3600,
            hour_window: 730 * 24 * 3600,
            max_bytes: 512 * 1024 * 1024,
            min_free_bytes: 64 * 1024 * 1024,
        }
    }
}

/// One value of one property at one time.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// `namespace/name`.
    pub device: String,
    pub property: String,
    pub t: Millis,
    pub value: String,
}

/// Counters, for metrics.
#[derive(Debug, Default)]
pub struct HistoryStats {
    pub written: AtomicU64,
    /// Points not kept: a write failed (a full disk) or the disk was nearly full.
    pub dropped: AtomicU64,
    /// Points deleted to hold the size and free-space bounds (not the windows).
    pub evicted: AtomicU64,
}

/// Errors of the history.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("history database {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: sqlx::Error,
    },
    #[error("history database error: {0}")]
    Sql(#[from] sqlx::Error),
    #[error(transparent)]
    Query(#[from] QueryError),
}

/// The history of the twins.
#[derive(Debug)]
pub struct History {
    pool: SqlitePool,
    path: PathBuf,
    cfg: HistoryConfig,
    series: Mutex<HashMap<(String, String), i64>>,
    /// Minutes before this are rolled up: a point before it marks its minute dirty.
    minute_mark: std::sync::atomic::AtomicI64,
    /// Each device's state as last written (a state is written when it changes).
    states: Mutex<HashMap<String, String>>,
    pub stats: HistoryStats,
}

/// The history file of the twin tables at `path`: `NAME-history.db` beside `NAME.db`.
pub fn history_path(path: &Path) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "twin".into());
    path.with_file_name(format!("{stem}-history.db"))
}

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS series (id INTEGER PRIMARY KEY, device TEXT NOT NULL, property TEXT NOT NULL, UNIQUE (device, property))",
    "CREATE TABLE IF NOT EXISTS raw (series INTEGER NOT NULL, t INTEGER NOT NULL, num REAL, txt TEXT, PRIMARY KEY (series, t)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS minute (series INTEGER NOT NULL, t INTEGER NOT NULL, mn REAL, mx REAL, sm REAL, n INTEGER NOT NULL, last_num REAL, last_txt TEXT, PRIMARY KEY (series, t)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS hour (series INTEGER NOT NULL, t INTEGER NOT NULL, mn REAL, mx REAL, sm REAL, n INTEGER NOT NULL, last_num REAL, last_txt TEXT, PRIMARY KEY (series, t)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS mark (id INTEGER PRIMARY KEY CHECK (id = 0), ingested INTEGER NOT NULL, minute INTEGER NOT NULL, hour INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO mark (id, ingested, minute, hour) VALUES (0, 0, 0, 0)",
    // Minutes already rolled up that a late point (a mapper's timestamp from before a
    // backlog, a fold held up) changed: rolled up again, with their hours.
    "CREATE TABLE IF NOT EXISTS dirty (series INTEGER NOT NULL, t INTEGER NOT NULL, PRIMARY KEY (series, t)) WITHOUT ROWID",
];

/// A value as stored: a number (booleans as 1 and 0) and, unless it is a plain number, its text.
fn split(value: &str) -> (Option<f64>, Option<&str>) {
    match value {
        "true" => (Some(1.0), Some(value)),
        "false" => (Some(0.0), Some(value)),
        v => match v.trim().parse::<f64>() {
            Ok(n) if n.is_finite() => (Some(n), None),
            _ => (None, Some(value)),
        },
    }
}

impl History {
    /// Opens (creating) the history beside the twin tables at `tables`.
    pub async fn open(tables: &Path, cfg: HistoryConfig) -> Result<Self, HistoryError> {
        let path = history_path(tables);
        let opts = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5))
            // Space freed by deletions goes back to the disk (set before the first table).
            .pragma("auto_vacuum", "incremental")
            .pragma("cache_size", "-4096")
            .pragma("temp_store", "memory")
            .pragma("journal_size_limit", (16 * 1024 * 1024).to_string());
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(opts)
            .await
            .map_err(|source| HistoryError::Open {
                path: path.clone(),
                source,
            })?;
        for s in SCHEMA {
            sqlx::query(AssertSqlSafe(*s))
                .execute(&pool)
                .await
                .map_err(|source| HistoryError::Open {
                    path: path.clone(),
                    source,
                })?;
        }
        // The history is private: it holds every value the devices reported.
        #[cfg(unix)]
        for p in [
            path.clone(),
            path.with_extension("db-wal"),
            path.with_extension("db-shm"),
        ] {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600));
        }
        let minute_mark: i64 = sqlx::query_scalar("SELECT minute FROM mark WHERE id = 0")
            .fetch_one(&pool)
            .await
            .map_err(|source| HistoryError::Open {
                path: path.clone(),
                source,
            })?;
        Ok(Self {
            pool,
            path,
            cfg,
            series: Mutex::new(HashMap::new()),
            minute_mark: std::sync::atomic::AtomicI64::new(minute_mark),
            states: Mutex::new(HashMap::new()),
            stats: HistoryStats::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn config(&self) -> &HistoryConfig {
        &self.cfg
    }

    /// The last journal row whose points are here.
    pub async fn ingested(&self) -> Result<u64, HistoryError> {
        let n: i64 = sqlx::query_scalar("SELECT ingested FROM mark WHERE id = 0")
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Whether a device's state `state` at `t` is a change worth a point.
    pub fn state_changed(&self, device: &str, state: &str) -> bool {
        let mut s = self.states.lock().unwrap_or_else(|e| e.into_inner());
        if s.get(device).map(String::as_str) == Some(state) {
            return false;
        }
        s.insert(device.to_string(), state.to_string());
        true
    }

    /// Forgets a removed device's last state (its history stays until it ages out).
    pub fn forget(&self, device: &str) {
        self.states
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(device);
    }

    async fn series_id(
        &self,
        conn: &mut sqlx::SqliteConnection,
        device: &str,
        property: &str,
    ) -> Result<i64, sqlx::Error> {
        let key = (device.to_string(), property.to_string());
        if let Some(id) = self
            .series
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(*id);
        }
        sqlx::query("INSERT OR IGNORE INTO series (device, property) VALUES (?, ?)")
            .bind(device)
            .bind(property)
            .execute(&mut *conn)
            .await?;
        let id: i64 = sqlx::query_scalar("SELECT id FROM series WHERE device = ? AND property = ?")
            .bind(device)
            .bind(property)
            .fetch_one(&mut *conn)
            .await?;
        self.series
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, id);
        Ok(id)
    }

    /// Free bytes on the history's disk, when they can be told.
    fn free_bytes(&self) -> Option<u64> {
        let dir = self.path.parent()?;
        let s = rustix::fs::statvfs(dir).ok()?;
        Some(s.f_bavail.saturating_mul(s.f_frsize))
    }

    /// Writes `points`, the journal's rows up to `through`. Never fails the caller: points
    /// that cannot be written (a full disk) are dropped and counted.
    pub async fn ingest(&self, points: &[Point], through: u64) {
        if let Some(free) = self.free_bytes()
            && free < self.cfg.min_free_bytes
        {
            self.stats
                .dropped
                .fetch_add(points.len() as u64, Ordering::Relaxed);
            tracing::debug!(free, "history: the disk is nearly full; points dropped");
            self.make_room().await;
            let _ = self.mark_ingested(through).await;
            return;
        }
        match self.write(points, through).await {
            Ok(()) => {
                self.stats
                    .written
                    .fetch_add(points.len() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                self.stats
                    .dropped
                    .fetch_add(points.len() as u64, Ordering::Relaxed);
                tracing::warn!(error = %e, points = points.len(), "history: points not written (dropped; the twins are not affected)");
                self.make_room().await;
                let _ = self.mark_ingested(through).await;
            }
        }
    }

    async fn mark_ingested(&self, through: u64) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE mark SET ingested = MAX(ingested, ?) WHERE id = 0")
            .bind(i64::try_from(through).unwrap_or(i64::MAX))
            .execute(&self.pool)
            .await
            .map(|_| ())
    }

    async fn write(&self, points: &[Point], through: u64) -> Result<(), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let mut rows: Vec<(i64, Millis, Option<f64>, Option<&str>)> =
            Vec::with_capacity(points.len());
        for p in points {
            let id = self.series_id(&mut tx, &p.device, &p.property).await?;
            let (num, txt) = split(&p.value);
            rows.push((id, p.t, num, txt));
        }
        for chunk in rows.chunks(ROWS_PER_STATEMENT) {
            let values = vec!["(?, ?, ?, ?)"; chunk.len()].join(", ");
            let sql = format!("INSERT OR REPLACE INTO raw (series, t, num, txt) VALUES {values}");
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for (id, t, num, txt) in chunk {
                q = q.bind(id).bind(t).bind(num).bind(txt);
            }
            q.execute(&mut *tx).await?;
        }
        let mark = self.minute_mark.load(Ordering::Relaxed);
        let mut late: Vec<(i64, Millis)> = rows
            .iter()
            .filter(|r| r.1 < mark)
            .map(|r| (r.0, r.1.div_euclid(MINUTE) * MINUTE))
            .collect();
        late.sort_unstable();
        late.dedup();
        for chunk in late.chunks(ROWS_PER_STATEMENT) {
            let values = vec!["(?, ?)"; chunk.len()].join(", ");
            let sql = format!("INSERT OR IGNORE INTO dirty (series, t) VALUES {values}");
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for (id, t) in chunk {
                q = q.bind(id).bind(t);
            }
            q.execute(&mut *tx).await?;
        }
        sqlx::query("UPDATE mark SET ingested = MAX(ingested, ?) WHERE id = 0")
            .bind(i64::try_from(through).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }

    /// The history of one property from `from` to `to` (ms since the epoch, `to` excluded):
    /// each raw point without a `step`; with one, a bucket per step (min, max, mean, last and
    /// how many points), from the finest tier that holds the period.
    pub async fn query(
        &self,
        device: &str,
        property: &str,
        from: Millis,
        to: Millis,
        step: Option<Millis>,
        now: Millis,
    ) -> Result<Series, HistoryError> {
        let Query { from, to, step } = Query::new(from, to, step)?;
        let id: Option<i64> =
            sqlx::query_scalar("SELECT id FROM series WHERE device = ? AND property = ?")
                .bind(device)
                .bind(property)
                .fetch_optional(&self.pool)
                .await?;
        let mut out = Series {
            device: device.to_string(),
            property: property.to_string(),
            from,
            to,
            step,
            tier: "raw",
            before: None,
            points: Vec::new(),
            buckets: Vec::new(),
            truncated: false,
        };
        let Some(id) = id else {
            return Ok(out);
        };
        // The value holding at `from`: a step is drawn from the left edge.
        out.before = sqlx::query(
            "SELECT t, num, txt FROM raw WHERE series = ? AND t < ? ORDER BY t DESC LIMIT 1",
        )
        .bind(id)
        .bind(from)
        .fetch_optional(&self.pool)
        .await?
        .map(|r| raw_point(&r));
        let raw_from =
            now - i64::try_from(self.cfg.raw_window.saturating_mul(1000)).unwrap_or(i64::MAX);
        let Some(step) = step else {
            let rows = sqlx::query("SELECT t, num, txt FROM raw WHERE series = ? AND t >= ? AND t < ? ORDER BY t LIMIT ?")
                .bind(id)
                .bind(from)
                .bind(to)
                .bind(i64::try_from(MAX_POINTS + 1).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
                .await?;
            out.truncated = rows.len() > MAX_POINTS;
            out.points = rows.iter().take(MAX_POINTS).map(raw_point).collect();
            return Ok(out);
        };
        let (minute_mark, hour_mark): (i64, i64) =
            sqlx::query_as("SELECT minute, hour FROM mark WHERE id = 0")
                .fetch_one(&self.pool)
                .await?;
        // The finest tier that is coarse enough for the step and still holds `from`; the part
        // after its roll-up mark comes from the tier below.
        let minute_from =
            now - i64::try_from(self.cfg.minute_window.saturating_mul(1000)).unwrap_or(i64::MAX);
        let use_hour = step >= HOUR || from < minute_from;
        let use_minute = !use_hour && (step >= MINUTE || from < raw_from);
        // A step finer than the tier the range is read from cannot be answered: the step is
        // the tier's (and the answer says so), not minute aggregates labelled as seconds.
        let step = if use_hour {
            step.max(HOUR)
        } else if use_minute {
            step.max(MINUTE)
        } else {
            step
        };
        out.step = Some(step);
        let mut acc: std::collections::BTreeMap<Millis, Bucket> = Default::default();
        // Steps on the clock's boundaries (whole minutes, whole hours), not counted from
        // `from`: the same step always covers the same time, and a tier's rows fit whole.
        let bucket_of = |t: Millis| t.div_euclid(step) * step;
        let mut add = |t: Millis, b: Bucket| {
            acc.entry(bucket_of(t))
                .and_modify(|a| a.merge(&b))
                .or_insert_with(|| Bucket {
                    t: bucket_of(t),
                    ..b
                });
        };
        let mut raw_since = from;
        if use_hour || use_minute {
            let (table, mark) = if use_hour {
                ("hour", hour_mark)
            } else {
                ("minute", minute_mark)
            };
            out.tier = table;
            for b in self.tier_buckets(table, id, from, to.min(mark)).await? {
                add(b.t, b);
            }
            raw_since = mark.max(from);
            if use_hour {
                // Hours not rolled up yet: from the minutes, then the raw points.
                for b in self
                    .tier_buckets("minute", id, raw_since, to.min(minute_mark))
                    .await?
                {
                    add(b.t, b);
                }
                raw_since = minute_mark.max(raw_since);
            }
        }
        // The raw points, a page at a time: what is held is the buckets (at most MAX_POINTS),
        // never the period's points.
        // (series, t) is the key: each page starts after the last one's time.
        let mut since = raw_since;
        while since < to {
            let rows = sqlx::query(
                "SELECT t, num, txt FROM raw WHERE series = ? AND t >= ? AND t < ? ORDER BY t LIMIT ?",
            )
            .bind(id)
            .bind(since)
            .bind(to)
            .bind(i64::try_from(RAW_PAGE).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await?;
            let mut last = None;
            for r in &rows {
                let p = raw_point(r);
                last = Some(p.t);
                add(p.t, Bucket::of_point(p));
            }
            match last {
                Some(t) if rows.len() == RAW_PAGE => since = t + 1,
                _ => break,
            }
        }
        out.buckets = acc.into_values().collect();
        Ok(out)
    }

    /// The stored buckets of roll-up tier `table` (`minute` or `hour`) of series `id` in
    /// `[from, to)`.
    async fn tier_buckets(
        &self,
        table: &'static str,
        id: i64,
        from: Millis,
        to: Millis,
    ) -> Result<Vec<Bucket>, HistoryError> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT t, mn, mx, sm, n, last_num, last_txt FROM {table} WHERE series = ? AND t >= ? AND t < ? ORDER BY t"
        )))
        .bind(id)
        .bind(from)
        .bind(to)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| {
                let t: i64 = r.get(0);
                Bucket {
                    t,
                    min: r.get(1),
                    max: r.get(2),
                    sum: r.get(3),
                    count: r.get::<i64, _>(4).max(0) as u64,
                    last: value_of(r.get(5), r.get(6)),
                    last_t: t,
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(property: &str, t: Millis, value: &str) -> Point {
        Point {
            device: "default/oven".into(),
            property: property.into(),
            t,
            value: value.into(),
        }
    }

    /// The oven's series of `property`, which the test expects to be answered.
    async fn oven(
        h: &History,
        property: &str,
        from: Millis,
        to: Millis,
        step: Option<Millis>,
        now: Millis,
    ) -> Series {
        h.query("default/oven", property, from, to, step, now)
            .await
            .expect("query")
    }

    async fn open(cfg: HistoryConfig) -> (tempfile::TempDir, History) {
        let dir = tempfile::tempdir().expect("tempdir");
        let h = History::open(&dir.path().join("edgecore.db"), cfg)
            .await
            .expect("opens");
        (dir, h)
    }

    #[tokio::test]
    async fn raw_points_come_back_in_order_with_the_value_before_the_range() {
        let (_d, h) = open(HistoryConfig::default()).await;
        let base = 1_700_000_000_000;
        let points: Vec<Point> = (0..10)
            .map(|k| p("temp", base + k * 1000, &(20 + k).to_string()))
            .collect();
        h.ingest(&points, 7).await;
        // The same again (a journal row read twice): nothing doubles.
        h.ingest(&points, 7).await;
        assert_eq!(h.ingested().await.expect("mark"), 7);
        let s = oven(&h, "temp", base + 3000, base + 6000, None, base + 10_000).await;
        let got: Vec<(Millis, serde_json::Value)> =
            s.points.iter().map(|p| (p.t, p.value.clone())).collect();
        assert_eq!(
            got,
            [
                (base + 3000, serde_json::json!(23.0)),
                (base + 4000, serde_json::json!(24.0)),
                (base + 5000, serde_json::json!(25.0))
            ]
        );
        assert_eq!(s.before.as_ref().map(|b| b.t), Some(base + 2000));
    }

    /// A viewer's `step=1s` over 23 hours took the gateway from 38 to 288 MiB: refused now,
    /// naming the limit; a stepped query over more raw points than a page counts every one.
    #[tokio::test]
    async fn stepped_queries_are_bounded_by_buckets_and_read_raw_points_by_pages() {
        let (_d, h) = open(HistoryConfig::default()).await;
        let base = 1_700_000_000_000 / HOUR * HOUR;
        let e = h
            .query(
                "default/oven",
                "temp",
                base - 23 * HOUR,
                base,
                Some(1000),
                base,
            )
            .await
            .expect_err("too many buckets");
        assert!(
            e.to_string().contains("82800 steps of 1000 ms")
                && e.to_string().contains("at most 20000 buckets"),
            "{e}"
        );
        let n = 2 * RAW_PAGE as i64 + 7;
        let points: Vec<Point> = (0..n)
            .map(|k| p("temp", base + k * 100, &(k % 50).to_string()))
            .collect();
        h.ingest(&points, 1).await;
        let s = oven(
            &h,
            "temp",
            base,
            base + n * 100,
            Some(60_000),
            base + n * 100,
        )
        .await;
        let counted: u64 = s.buckets.iter().map(|b| b.count).sum();
        assert_eq!(counted, n as u64);
    }

    /// Steps fall on the clock's boundaries whatever `from` is, and a step finer than the tier
    /// a range is read from is answered at the tier's (the answer's step says which).
    #[tokio::test]
    async fn steps_fall_on_the_clock_and_a_step_too_fine_for_its_tier_is_raised() {
        let (_d, h) = open(HistoryConfig::default()).await;
        let base = 1_700_000_000_000 / HOUR * HOUR;
        let points: Vec<Point> = (0..120)
            .map(|k| p("level", base + k * 30_000, &k.to_string()))
            .collect();
        h.ingest(&points, 1).await;
        // From 17 s past a minute, in minute steps: the buckets start on whole minutes.
        let now = base + HOUR;
        let s = oven(
            &h,
            "level",
            base + 17_000,
            base + 10 * MINUTE,
            Some(MINUTE),
            now,
        )
        .await;
        assert!(s.buckets.iter().all(|b| b.t % MINUTE == 0), "{s:?}");
        assert_eq!(s.buckets[1].t, base + MINUTE);
        assert_eq!(s.buckets[1].count, 2);
        // A day later the raw points are gone (rolled up): a 1 s step is answered in minutes.
        let later = base + 26 * HOUR;
        h.maintain(later).await.expect("maintain");
        let s = oven(&h, "level", base, base + 10 * MINUTE, Some(1000), later).await;
        assert_eq!((s.tier, s.step), ("minute", Some(MINUTE)), "{s:?}");
        assert_eq!(s.buckets.len(), 10);
        assert!(s.buckets.iter().all(|b| b.t % MINUTE == 0), "{s:?}");
    }

    /// A switch toggled twice within the hour: its raw-tier steps (the last hour's chart) count
    /// both changes as 1 and 0, as the minute and hour tiers do, not `count 0` and no range.
    #[tokio::test]
    async fn a_booleans_steps_count_it_as_one_and_zero_at_every_tier() {
        let (_d, h) = open(HistoryConfig::default()).await;
        let base = 1_700_000_000_000 / HOUR * HOUR;
        let points = [
            p("heater-on", base + 1000, "true"),
            p("heater-on", base + 2000, "false"),
            p("heater-on", base + 3000, "true"),
        ];
        h.ingest(&points, 1).await;
        let now = base + 10_000;
        let s = oven(&h, "heater-on", base, base + MINUTE, Some(30_000), now).await;
        assert_eq!(s.tier, "raw");
        let b = &s.buckets[0];
        assert_eq!((b.min, b.max, b.count), (Some(0.0), Some(1.0), 3), "{s:?}");
        assert_eq!(b.last, serde_json::json!("true"));
        h.maintain(base + 2 * HOUR).await.expect("maintain");
        let s = oven(
            &h,
            "heater-on",
            base,
            base + HOUR,
            Some(HOUR),
            base + 2 * HOUR,
        )
        .await;
        let b = &s.buckets[0];
        assert_eq!((b.min, b.max, b.count), (Some(0.0), Some(1.0), 3), "{s:?}");
    }

    #[tokio::test]
    async fn minutes_and_hours_roll_up_min_max_mean_last() {
        let (_d, h) = open(HistoryConfig::default()).await;
        let base = 1_700_000_000_000 / HOUR * HOUR;
        // Two hours of a value every 10 s: v = minute index (0..120) + 0.5 on odd points.
        let mut points = Vec::new();
        for k in 0..720 {
            let t = base + k * 10_000;
            let v = (k / 6) as f64 + if k % 2 == 1 { 0.5 } else { 0.0 };
            points.push(p("level", t, &v.to_string()));
            points.push(p("mode", t, if k % 2 == 0 { "auto" } else { "manual" }));
        }
        h.ingest(&points, 1).await;
        let now = base + 3 * HOUR;
        h.maintain(now).await.expect("maintain");
        // 24 one-minute steps of the first hour's minutes 10..34, from the minute tier.
        let s = oven(
            &h,
            "level",
            base + 10 * MINUTE,
            base + 34 * MINUTE,
            Some(MINUTE),
            now,
        )
        .await;
        assert_eq!(s.tier, "minute");
        assert_eq!(s.buckets.len(), 24);
        let b = &s.buckets[0];
        assert_eq!((b.min, b.max, b.count), (Some(10.0), Some(10.5), 6));
        assert_eq!(b.mean(), Some(10.25));
        assert_eq!(b.last, serde_json::json!(10.5));
        // Hour steps over both hours, from the hour tier.
        let s = oven(&h, "level", base, base + 2 * HOUR, Some(HOUR), now).await;
        assert_eq!(s.tier, "hour");
        assert_eq!(s.buckets.len(), 2);
        assert_eq!(
            (s.buckets[1].min, s.buckets[1].max),
            (Some(60.0), Some(119.5))
        );
        assert_eq!(s.buckets[1].count, 360);
        // Text keeps its last value per step.
        let s = oven(&h, "mode", base, base + 2 * HOUR, Some(HOUR), now).await;
        assert_eq!(s.buckets[0].last, serde_json::json!("manual"));
        assert_eq!(s.buckets[0].count, 0);
    }

    /// A point that comes after its minute was rolled up (a mapper's old timestamp, a fold held
    /// up) is rolled up again with its minute and hour.
    #[tokio::test]
    async fn late_points_are_rolled_up_again() {
        let (_d, h) = open(HistoryConfig::default()).await;
        let base = 1_700_000_000_000 / HOUR * HOUR;
        h.ingest(&[p("level", base + 1000, "1")], 1).await;
        let now = base + 2 * HOUR + 10 * MINUTE;
        h.maintain(now).await.expect("maintain");
        h.ingest(&[p("level", base + 2000, "9")], 2).await;
        h.maintain(now + MINUTE).await.expect("maintain");
        for step in [MINUTE, HOUR] {
            let s = oven(&h, "level", base, base + HOUR, Some(step), now + MINUTE).await;
            assert_eq!(s.buckets.len(), 1, "{s:?}");
            let b = &s.buckets[0];
            assert_eq!(
                (b.min, b.max, b.count),
                (Some(1.0), Some(9.0), 2),
                "step {step}"
            );
            assert_eq!(b.last, serde_json::json!(9.0));
        }
    }

    #[tokio::test]
    async fn windows_and_the_size_bound_drop_the_oldest_first() {
        let (_d, h) = open(HistoryConfig {
            raw_window: 3600,
            max_bytes: 400 * 1024,
            min_free_bytes: 0,
            ..HistoryConfig::default()
        })
        .await;
        let base = 1_700_000_000_000 / HOUR * HOUR;
        // Six hours of 20 properties at one point a second: far past 400 KiB.
        for hour in 0..6 {
            let mut points = Vec::new();
            for s in 0..3600 {
                for q in 0..20 {
                    points.push(p(
                        &format!("p{q}"),
                        base + hour * HOUR + s * 1000,
                        &format!("{}.{q}", s % 97),
                    ));
                }
            }
            h.ingest(&points, hour as u64 + 1).await;
            h.maintain(base + (hour + 1) * HOUR)
                .await
                .expect("maintain");
            let bytes = h.bytes().await.expect("size");
            assert!(bytes <= 400 * 1024, "hour {hour}: {bytes} bytes");
        }
        assert!(h.stats.evicted.load(Ordering::Relaxed) > 0);
        // The newest raw points are kept; the oldest went first.
        let now = base + 6 * HOUR;
        let s = oven(&h, "p0", now - 60_000, now, None, now).await;
        assert!(!s.points.is_empty(), "the last minute is kept");
        let s = oven(&h, "p0", base, base + 60_000, None, now).await;
        assert!(s.points.is_empty(), "the first minute is gone");
    }
}
