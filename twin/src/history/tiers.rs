//! The tiers over time: raw points rolled up into minutes and minutes into hours (one roll-up,
//! [`Tier`], for both pairs), each tier cut at its window, and the file held within its bounds.

use super::{GRACE, HOUR, History, HistoryError, MINUTE};
use crate::model::Millis;
use sqlx::AssertSqlSafe;
use std::sync::atomic::Ordering;

/// A tier rolled up from the one below it.
pub(super) struct Tier {
    /// Its table (and its column in `mark`).
    pub table: &'static str,
    /// Its period, ms.
    pub period: Millis,
    /// The table below.
    below: &'static str,
    /// The aggregates of a period's rows below: `mn`, `mx`, `sm`, `n`.
    aggregates: &'static str,
    /// The last value of a row below: its number and its text.
    last: &'static str,
}

pub(super) const MINUTES: Tier = Tier {
    table: "minute",
    period: MINUTE,
    below: "raw",
    aggregates: "MIN(num) AS mn, MAX(num) AS mx, SUM(num) AS sm, COUNT(num) AS n",
    last: "l.num, l.txt",
};

pub(super) const HOURS: Tier = Tier {
    table: "hour",
    period: HOUR,
    below: "minute",
    aggregates: "MIN(mn) AS mn, MAX(mx) AS mx, SUM(sm) AS sm, SUM(n) AS n",
    last: "l.last_num, l.last_txt",
};

impl Tier {
    /// The end of the last period that ended at least [`GRACE`] ago (its whole duration for
    /// the tier above raw: the minutes of an hour are rolled up a grace after it ended).
    pub(super) fn complete(&self, now: Millis) -> Millis {
        let ended = now - GRACE - if self.below == "raw" { 0 } else { self.period };
        ended.div_euclid(self.period) * self.period
    }

    /// Rows of this tier from `grouped` (each period's `series`, start `b`, `mn`, `mx`, `sm`,
    /// `n`, and `lt`, the time of its latest row below), with the last value below.
    fn insert(&self, grouped: &str) -> String {
        format!(
            "INSERT OR REPLACE INTO {table} (series, t, mn, mx, sm, n, last_num, last_txt)
             SELECT g.series, g.b, g.mn, g.mx, g.sm, g.n, {last} FROM ({grouped}) g
             JOIN {below} l ON l.series = g.series AND l.t = g.lt",
            table = self.table,
            below = self.below,
            last = self.last,
        )
    }

    /// The statement rolling up the periods in `[?, ?)`.
    pub(super) fn range(&self) -> String {
        let (below, p, agg) = (self.below, self.period, self.aggregates);
        self.insert(&format!(
            "SELECT series, (t / {p}) * {p} AS b, {agg}, MAX(t) AS lt
               FROM {below} WHERE t >= ? AND t < ? GROUP BY series, b"
        ))
    }

    /// The statement rolling up again the periods of the dirty minutes before `?`.
    pub(super) fn again(&self) -> String {
        let (below, p, agg) = (self.below, self.period, self.aggregates);
        self.insert(&format!(
            "SELECT x.series AS series, d.b AS b, {agg}, MAX(x.t) AS lt
               FROM (SELECT DISTINCT series, (t / {p}) * {p} AS b FROM dirty WHERE t < ?) d
               JOIN {below} x ON x.series = d.series AND x.t >= d.b AND x.t < d.b + {p}
              GROUP BY x.series, d.b"
        ))
    }
}

impl History {
    /// Rolls complete minutes and hours up, drops what is past its window, and holds the size
    /// and free-space bounds. Run every minute or so.
    pub async fn maintain(&self, now: Millis) -> Result<(), HistoryError> {
        self.roll_up(now).await?;
        let window =
            |s: u64| now.saturating_sub(i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX));
        for (table, cut) in [
            ("raw", window(self.cfg.raw_window)),
            ("minute", window(self.cfg.minute_window)),
            ("hour", window(self.cfg.hour_window)),
        ] {
            sqlx::query(AssertSqlSafe(format!("DELETE FROM {table} WHERE t < ?")))
                .bind(cut)
                .execute(&self.pool)
                .await?;
        }
        self.make_room().await;
        Ok(())
    }

    /// Each tier's rows and, when SQLite can tell (its `dbstat` table), bytes.
    pub async fn tiers(&self) -> Result<Vec<(&'static str, u64, Option<u64>)>, HistoryError> {
        let mut out = Vec::new();
        for table in ["raw", "minute", "hour"] {
            let rows: i64 =
                sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
                    .fetch_one(&self.pool)
                    .await?;
            let bytes: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT SUM(pgsize) FROM dbstat WHERE name = '{table}'"
            )))
            .fetch_one(&self.pool)
            .await
            .ok()
            .flatten();
            out.push((
                table,
                u64::try_from(rows).unwrap_or(0),
                bytes.and_then(|b| u64::try_from(b).ok()),
            ));
        }
        Ok(out)
    }

    /// The file's size in use (pages not free), in bytes.
    pub async fn bytes(&self) -> Result<u64, HistoryError> {
        let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
            .fetch_one(&self.pool)
            .await?;
        let free: i64 = sqlx::query_scalar("PRAGMA freelist_count")
            .fetch_one(&self.pool)
            .await?;
        let size: i64 = sqlx::query_scalar("PRAGMA page_size")
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from((pages - free).max(0) * size).unwrap_or(0))
    }

    /// Deletes the oldest points, whichever tier holds them, until the file is within `maxBytes`
    /// and the disk has `minFreeBytes`: each round cuts the share of the time span the file is
    /// over by (a tenth at least), so a few rounds do it.
    pub(super) async fn make_room(&self) {
        for _ in 0..64 {
            let bytes = self.bytes().await.unwrap_or(0);
            let over = bytes > self.cfg.max_bytes;
            let short = self
                .free_bytes()
                .is_some_and(|f| f < self.cfg.min_free_bytes);
            if !over && !short {
                break;
            }
            let share = if over {
                1.0 - self.cfg.max_bytes as f64 / bytes.max(1) as f64
            } else {
                0.1
            };
            let share = (share + 0.05).clamp(0.1, 1.0);
            // The oldest time across the tiers goes first, whichever tier holds it.
            let span: Result<(Option<i64>, Option<i64>), _> = sqlx::query_as(
                "SELECT MIN(lo), MAX(hi) FROM (SELECT MIN(t) AS lo, MAX(t) AS hi FROM raw
                 UNION ALL SELECT MIN(t), MAX(t) FROM minute UNION ALL SELECT MIN(t), MAX(t) FROM hour)",
            )
            .fetch_one(&self.pool)
            .await;
            let Ok((Some(lo), Some(hi))) = span else {
                break;
            };
            let cut = lo + (((hi - lo) as f64 * share).ceil() as i64).max(1);
            let mut cut_any = false;
            for table in ["raw", "minute", "hour"] {
                match sqlx::query(AssertSqlSafe(format!("DELETE FROM {table} WHERE t < ?")))
                    .bind(cut)
                    .execute(&self.pool)
                    .await
                {
                    Ok(r) => {
                        self.stats
                            .evicted
                            .fetch_add(r.rows_affected(), Ordering::Relaxed);
                        cut_any |= r.rows_affected() > 0;
                    }
                    Err(e) => tracing::debug!(error = %e, "history: cannot delete old points"),
                }
            }
            let _ = sqlx::query("PRAGMA incremental_vacuum")
                .execute(&self.pool)
                .await;
            let _ = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(&self.pool)
                .await;
            if !cut_any {
                break;
            }
        }
    }

    /// Rolls raw points up into minutes, and minutes into hours, for each complete period that
    /// ended at least [`GRACE`] ago and is not rolled up yet; and again the periods that late
    /// points changed after they were rolled up (`dirty`).
    async fn roll_up(&self, now: Millis) -> Result<(), HistoryError> {
        let (minute_mark, hour_mark): (i64, i64) =
            sqlx::query_as("SELECT minute, hour FROM mark WHERE id = 0")
                .fetch_one(&self.pool)
                .await?;
        let dirty: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM dirty")
            .fetch_one(&self.pool)
            .await?;
        if dirty > 0 {
            let mut tx = self.pool.begin().await?;
            // Every dirty minute; the hours of those already rolled up into hours.
            for (tier, upto) in [(&MINUTES, i64::MAX), (&HOURS, hour_mark)] {
                sqlx::query(AssertSqlSafe(tier.again()))
                    .bind(upto)
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query("DELETE FROM dirty").execute(&mut *tx).await?;
            tx.commit().await?;
        }
        for (tier, mark) in [(&MINUTES, minute_mark), (&HOURS, hour_mark)] {
            let upto = tier.complete(now);
            if upto <= mark {
                continue;
            }
            let mut tx = self.pool.begin().await?;
            sqlx::query(AssertSqlSafe(tier.range()))
                .bind(mark)
                .bind(upto)
                .execute(&mut *tx)
                .await?;
            sqlx::query(AssertSqlSafe(format!(
                "UPDATE mark SET {} = ? WHERE id = 0",
                tier.table
            )))
            .bind(upto)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            if tier.table == MINUTES.table {
                self.minute_mark.store(upto, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}
