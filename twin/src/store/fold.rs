//! Folding the journal into the tables: journal rows read in short chunks, coalesced (the last
//! image of a row wins), written in key order by multi-row statements in one transaction that
//! records the last row it covers, then deleted from the journal; spread over time so that a
//! fold never holds a core for long ([`Pace`]).

use crate::journal::{Pending, Record};
use crate::model::OutboxEntry;
use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::{AssertSqlSafe, Row, SqliteConnection};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::rows::{i, u};
use super::schema::{Statements, statement_chunks};
use super::{Result, Store, StoreError, in_transaction};

/// The journal is folded in the background once this many rows wait in it, or at
/// [`FOLD_INTERVAL`].
pub const FOLD_AFTER: u64 = 200_000;

/// How often the background fold runs when the journal is not empty.
pub const FOLD_INTERVAL: Duration = Duration::from_secs(2);

/// Journal rows read by one fold transaction, at most. What a fold holds in memory is bounded
/// by the distinct rows it writes (at most the size of the tables), not by this; a large chunk
/// coalesces more, so each B-tree page is written once for more changes.
pub(super) const FOLD_CHUNK: u64 = 1_000_000;

/// Journal rows (committed batches) read by one statement of a fold.
pub(super) const READ_CHUNK: u64 = 256;

/// History points written at once by a fold, at most (a long journal is written in parts).
pub(super) const HISTORY_BATCH: usize = 50_000;

/// Journal rows (committed batches) deleted by one statement once folded.
pub(super) const DELETE_CHUNK: u64 = 512;

impl Store {
    /// Folds into the tables every journal row committed before this call; returns the rows
    /// folded. Rows appended meanwhile are left to the next fold: under a steady stream of
    /// commits a fold that chased the journal's end would never return, and every reader of
    /// the tables (the outbox sent to the cloud, the metrics) would wait behind it for as long
    /// as the stream lasts.
    pub async fn fold(&self) -> Result<u64> {
        // Nothing appended since the last fold: no need to look (the loads and outbox reads of
        // start-up, and every outbox read of an idle gateway, would query twice for nothing).
        if self.unfolded() == 0 {
            return Ok(0);
        }
        self.fold_journal(self.inner.appended.load(Ordering::Acquire))
            .await
    }

    /// Folds the journal's rows up to sequence number `upto`, whether or not this process
    /// appended them.
    pub(super) async fn fold_journal(&self, upto: u64) -> Result<u64> {
        let _one = self.inner.folding.lock().await;
        let mut total = 0;
        loop {
            let folded = folded_seq(self.pool()).await?;
            if folded >= upto {
                // Folded meanwhile by the fold this one waited for.
                break;
            }
            let mut pending = Pending::default();
            let mut rows = 0u64;
            let mut through = folded;
            let mut pace = Pace::new();
            // The history takes the points of the rows it does not have yet, before the
            // tables' transaction: a crash after it leaves rows the next fold skips.
            let history = self.inner.history.as_ref();
            let history_mark = match history {
                Some(h) => h.ingested().await.unwrap_or(0),
                None => u64::MAX,
            };
            let mut points = Vec::new();
            loop {
                let chunk = sqlx::query(
                    "SELECT seq, body FROM journal WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
                )
                .bind(i(through))
                .bind(i(upto))
                .bind(i(READ_CHUNK))
                .fetch_all(&self.inner.journal)
                .await?;
                let last_chunk = (chunk.len() as u64) < READ_CHUNK;
                for r in &chunk {
                    let (seq, records) = journal_row(r)?;
                    for record in records {
                        if let Some(h) = history
                            && seq > history_mark
                        {
                            record.history(h, &mut points);
                        }
                        rows += pending.add(record);
                    }
                    through = seq;
                }
                if let Some(h) = history
                    && points.len() >= HISTORY_BATCH
                {
                    h.ingest(&points, through).await;
                    points.clear();
                }
                if last_chunk || rows >= FOLD_CHUNK {
                    break;
                }
                // Decoding is CPU work too, and reading chunks rarely makes the task yield.
                pace.breathe().await;
            }
            if through == folded {
                break;
            }
            if let Some(h) = history
                && through > history_mark
            {
                h.ingest(&points, through).await;
            }
            drop(points);
            in_transaction(self.pool(), async |tx| {
                write_pending(tx, &pending).await?;
                sqlx::query("UPDATE folded SET seq = ? WHERE id = 0")
                    .bind(i(through))
                    .execute(&mut *tx)
                    .await?;
                Ok(())
            })
            .await?;
            drop(pending);
            // Folded: the journal rows may go. A crash before this delete is harmless, the
            // rows are skipped by `seq > folded` and deleted by the next fold.
            // In short statements: each holds the journal's writer, and the commits wait behind it.
            let mut from = folded;
            while from < through {
                let to = through.min(from.saturating_add(DELETE_CHUNK));
                // The first also takes the rows a crash left below `folded`.
                let lower = if from == folded { 0 } else { from };
                let mut writer = self.inner.journal_writer.lock().await;
                sqlx::query("DELETE FROM journal WHERE seq > ? AND seq <= ?")
                    .bind(i(lower))
                    .bind(i(to))
                    .execute(writer.as_mut().ok_or(sqlx::Error::PoolClosed)?)
                    .await?;
                drop(writer);
                from = to;
            }
            // Copy the journal's WAL back into its file (without waiting for or blocking the
            // writer), so the WAL is reused from its start instead of growing.
            sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                .execute(&self.inner.journal)
                .await?;
            let _ = self
                .inner
                .unfolded
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_sub(rows))
                });
            total += rows;
        }
        if total > 0 && self.unfolded() == 0 {
            self.truncate_journal_wal().await;
        }
        Ok(total)
    }

    /// Gives the journal's write-ahead log back to the file system once everything in it is
    /// folded and nothing new was committed meanwhile. Its size is not limited otherwise: a
    /// limit is applied by the first commit after each checkpoint, which truncated a log grown
    /// to hundreds of MB under load while that commit (and every request behind it) waited,
    /// up to 200 ms. Done by the journal's writer, so no commit meets it half done.
    pub(super) async fn truncate_journal_wal(&self) {
        let mut writer = self.inner.journal_writer.lock().await;
        let Some(conn) = writer.as_mut() else { return };
        if self.unfolded() > 0 {
            return;
        }
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(conn)
            .await
        {
            tracing::debug!(error = %e, "cannot truncate the journal's write-ahead log");
        }
    }

    /// Folds the journal whenever [`FOLD_AFTER`] rows wait in it, or every [`FOLD_INTERVAL`]
    /// when it is not empty, until the store is closed. Spawned by the twin service.
    pub async fn fold_in_background(self) {
        let mut maintained = std::time::Instant::now();
        loop {
            tokio::select! {
                () = self.inner.fold_wanted.notified() => {}
                () = tokio::time::sleep(FOLD_INTERVAL) => {}
            }
            if self.pool().is_closed() {
                return;
            }
            // The history's roll-ups, windows and bounds, every minute.
            if let Some(h) = self.history()
                && maintained.elapsed() >= crate::history::MAINTAIN_EVERY
            {
                maintained = std::time::Instant::now();
                if let Err(e) = h.maintain(crate::now_millis()).await {
                    tracing::warn!(error = %e, "history: roll-up or retention failed; tried again in a minute");
                }
            }
            if self.unfolded() == 0 {
                continue;
            }
            let start = std::time::Instant::now();
            match self.fold().await {
                Ok(rows) => tracing::debug!(
                    rows,
                    ms = start.elapsed().as_millis() as u64,
                    "folded the twin journal"
                ),
                Err(e) if self.pool().is_closed() => {
                    tracing::debug!(error = %e, "fold stopped by closing the store");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "failed to fold the twin journal; it is kept and retried");
                    self.reclaim().await;
                }
            }
        }
    }

    /// The journal rows the tables do not cover yet, coalesced, read without writing anything.
    pub(super) async fn unfolded_journal(&self) -> Result<Pending> {
        let folded = folded_seq(self.pool()).await?;
        let mut pending = Pending::default();
        let mut journal = sqlx::query("SELECT seq, body FROM journal WHERE seq > ? ORDER BY seq")
            .bind(i(folded))
            .fetch(&self.inner.journal);
        while let Some(r) = tokio_stream::StreamExt::next(&mut journal).await {
            for record in journal_row(&r?)?.1 {
                pending.add(record);
            }
        }
        Ok(pending)
    }

    /// Folds the journal; when that cannot be done (a full disk), returns what it holds, to be
    /// read over the tables instead, so that loading never needs to write.
    pub(super) async fn fold_or_overlay(&self) -> Result<Option<Pending>> {
        match self.fold().await {
            Ok(_) => Ok(None),
            Err(e) if e.is_damage() => Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "cannot fold the twin journal; reading it over the tables");
                self.reclaim().await;
                Ok(Some(self.unfolded_journal().await?))
            }
        }
    }

    /// After a failed write (a full disk): copies both write-ahead logs into their databases and
    /// truncates them, giving their space back. A WAL that cannot grow makes every commit fail,
    /// and the automatic checkpoint that would shrink it only runs after a commit succeeds.
    pub(super) async fn reclaim(&self) {
        for (name, pool) in [("tables", self.pool()), ("journal", &self.inner.journal)] {
            if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(pool)
                .await
            {
                tracing::debug!(database = name, error = %e, "cannot truncate the write-ahead log");
            }
        }
    }
}

/// A journal row's sequence number and records.
pub(super) fn journal_row(r: &SqliteRow) -> Result<(u64, Vec<Record>)> {
    let seq = u(r.try_get(0)?);
    let body: Vec<u8> = r.try_get(1)?;
    let records = serde_json::from_slice(&body).map_err(|e| StoreError::Corrupt {
        what: "journal row",
        value: format!("{seq}: {e}"),
    })?;
    Ok((seq, records))
}

/// The last journal row the tables cover.
pub(super) async fn folded_seq(pool: &SqlitePool) -> Result<u64> {
    let seq: Option<i64> = sqlx::query_scalar("SELECT seq FROM folded WHERE id = 0")
        .fetch_optional(pool)
        .await?;
    let seq = seq.ok_or(StoreError::Missing {
        what: "its journal's fold mark (the row of table `folded`)",
    })?;
    Ok(u(seq))
}

/// Spreads a fold over time: after each [`FOLD_SLICE`] of work it pauses as long, so on a
/// small machine a fold never holds a core for long and commits of new reports (which answer
/// callers) keep their latency. A fold is background work: it only has to keep up on average.
pub(super) struct Pace {
    since: std::time::Instant,
}

/// Work done by a fold between pauses.
pub(super) const FOLD_SLICE: Duration = Duration::from_millis(4);

impl Pace {
    pub(super) fn new() -> Self {
        Self {
            since: std::time::Instant::now(),
        }
    }

    pub(super) async fn breathe(&mut self) {
        let worked = self.since.elapsed();
        if worked >= FOLD_SLICE {
            tokio::time::sleep(worked).await;
            self.since = std::time::Instant::now();
        }
    }
}

/// Writes coalesced journal records to the tables: removals first, then each table in key
/// order by multi-row statements.
pub(super) async fn write_pending(tx: &mut SqliteConnection, p: &Pending) -> Result<()> {
    let p = p.sorted();
    let mut pace = Pace::new();
    for id in p.purge {
        for table in [
            "DELETE FROM device WHERE id = ?",
            "DELETE FROM twin WHERE device_id = ?",
            "DELETE FROM outbox WHERE device_id = ?",
        ] {
            sqlx::query(AssertSqlSafe(table))
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
    }
    for chunk in statement_chunks(&p.rows) {
        let sql = Statements::of(&Statements::get().device, chunk.len());
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for (id, r) in chunk {
            q = q
                .bind(id.as_str())
                .bind(r.namespace.as_str())
                .bind(r.name.as_str())
                .bind(r.description.as_str())
                .bind(r.model.as_str())
                .bind(r.protocol.as_str())
                .bind(r.state.as_str())
                .bind(r.last_online)
                .bind(i(r.desired_version))
                .bind(i(r.reported_version))
                .bind(r.state_reason.as_str());
        }
        q.execute(&mut *tx).await?;
        pace.breathe().await;
    }
    let mut twin_rows = Vec::new();
    for ((d, name), image) in &p.props {
        match image {
            Some(t) => twin_rows.push((d, name, t)),
            None => {
                sqlx::query("DELETE FROM twin WHERE device_id = ? AND name = ?")
                    .bind(d.as_str())
                    .bind(name.as_str())
                    .execute(&mut *tx)
                    .await?;
            }
        }
    }
    for chunk in statement_chunks(&twin_rows) {
        let sql = Statements::of(&Statements::get().twin, chunk.len());
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for (d, name, p) in chunk {
            q = q
                .bind(d.as_str())
                .bind(name.as_str())
                .bind(p.value_type.as_str())
                .bind(p.optional)
                .bind(p.writable)
                .bind(p.spec_desired.as_deref())
                .bind(p.desired.as_ref().map(|v| v.value.as_str()))
                .bind(p.desired.as_ref().map(|v| v.timestamp))
                .bind(i(p.desired_version.cloud))
                .bind(i(p.desired_version.edge))
                .bind(p.reported.as_ref().map(|v| v.value.as_str()))
                .bind(p.reported.as_ref().map(|v| v.timestamp))
                .bind(i(p.reported_version.cloud))
                .bind(i(p.reported_version.edge))
                .bind(p.observed_desired.as_ref().map(|v| v.value.as_str()))
                .bind(p.observed_desired.as_ref().map(|v| v.timestamp))
                .bind(p.minimum.as_deref())
                .bind(p.maximum.as_deref())
                .bind(p.error.as_ref().map(|v| v.value.as_str()))
                .bind(p.error.as_ref().map(|v| v.timestamp))
                .bind(p.write_error.as_ref().map(|v| v.value.as_str()))
                .bind(p.write_error.as_ref().map(|v| v.timestamp))
                .bind(p.unit.as_deref())
                .bind(p.refused.as_deref());
        }
        q.execute(&mut *tx).await?;
        pace.breathe().await;
    }
    let entries: Vec<(&String, &OutboxEntry)> =
        p.outbox.iter().map(|((d, _, _), o)| (d, *o)).collect();
    for chunk in statement_chunks(&entries) {
        let sql = Statements::of(&Statements::get().outbox, chunk.len());
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for (d, o) in chunk {
            q = q
                .bind(d.as_str())
                .bind(o.property.as_str())
                .bind(o.section.as_str())
                .bind(o.value.as_str())
                .bind(i(o.version.cloud))
                .bind(i(o.version.edge))
                .bind(o.timestamp)
                .bind(i(o.seq));
        }
        q.execute(&mut *tx).await?;
        pace.breathe().await;
    }
    Ok(())
}
