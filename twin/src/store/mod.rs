//! The SQLite store of the twins: an append-only journal in front of the tables, numbered
//! migrations, and batched writes.
//!
//! Two database files, each in WAL mode:
//! - the **journal** (`NAME-log.db`): each committed batch of operations is one row appended to
//!   it, the post-images of the rows the batch changed. That is one sequential write per commit
//!   however many twins the batch touched, so a commit costs about the same for one report or
//!   thousands. The batch is durable when this row is committed.
//! - the **tables** (`NAME.db`): devices, twins, the outbox and cached objects. The journal is
//!   *folded* into them in the background: many batches at once, coalesced (the last image of a
//!   row wins) and written in key order by multi-row statements, in one transaction that also
//!   records the last journal row it covers. Folded rows are then deleted from the journal.
//!
//! Random B-tree writes, about four per report in a single table store, are what limit SQLite
//! (see docs/benchmarks.md); the fold writes each page once for all the changes it covers. A
//! separate file for the journal means appends never wait for a fold to finish.
//!
//! After a crash (even between a fold's commit and its journal cleanup), opening the store folds
//! what is left, skipping journal rows the tables already cover: the state is that of the last
//! committed batch. Reads that need the tables (loading twins, the outbox) fold first.

use crate::engine::Applied;
use crate::journal::RecordRef;
use crate::model::{DeviceRow, DeviceTwin, OutboxEntry};
use api::paths::DeviceId;
use sqlx::sqlite::SqlitePool;
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Row, SqliteConnection};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

mod fold;
mod rows;
mod schema;

use fold::folded_seq;
pub use fold::{FOLD_AFTER, FOLD_INTERVAL};
use rows::{i, outbox_from_row, u};
use schema::{DEVICE_COLUMNS, OUTBOX_COLUMNS, connect, connect_options, migrate};
pub use schema::{JOURNAL_MIGRATIONS, MIGRATIONS, ROWS_PER_STATEMENT};

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("failed to open twin database {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: sqlx::Error,
    },
    #[error("failed to migrate twin database to schema version {version}: {source}")]
    Migrate {
        version: usize,
        #[source]
        source: sqlx::Error,
    },
    #[error("twin database {path} has schema version {found}, newer than this program's {known}")]
    TooNew {
        path: PathBuf,
        found: i64,
        known: usize,
    },
    #[error("twin database error: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("failed to encode a journal record: {0}")]
    Encode(#[from] serde_json::Error),
    #[error(
        "twin database lacks {what}: it was changed by something other than edgecore (restore it from a backup, or move it aside to start with no twins)"
    )]
    Missing { what: &'static str },
    #[error("twin database holds an invalid {what}: {value:?}")]
    Corrupt { what: &'static str, value: String },
    #[error("not written: an earlier batch failed to commit and this one was built on it")]
    Abandoned,
}

impl StoreError {
    /// Whether the database's content is damaged (not the disk or the driver failing): nothing
    /// to retry or to read around.
    pub fn is_damage(&self) -> bool {
        matches!(self, Self::Corrupt { .. } | Self::Missing { .. })
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// How hard SQLite syncs to disk. With the WAL journal, `Normal` survives any crash of the
/// process (`kill -9`) and may lose the last commits on power loss; `Full` survives power loss at
/// the cost of one fsync per commit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    #[default]
    Normal,
    Full,
}

/// The tables' write-ahead log is truncated to this size after a checkpoint.
const WAL_LIMIT: u64 = 64 * 1024 * 1024;

/// The journal's writer checkpoints its write-ahead log every this many pages (4 MiB).
const JOURNAL_CHECKPOINT: u32 = 1000;

/// The twin database. Cheap to clone: clones share the connections.
#[derive(Clone, Debug)]
pub struct Store {
    inner: Arc<Connections>,
}

#[derive(Debug)]
struct Connections {
    /// The tables.
    pool: SqlitePool,
    /// The journal, read (by folds, which read it in short chunks, so a fold holds no long
    /// read transaction) and checkpointed.
    journal: SqlitePool,
    /// The journal's only writer: commits append to it, folds delete from it. One connection,
    /// so they queue behind each other in order instead of meeting as SQLite's `SQLITE_BUSY`,
    /// whose retries sleep 1, 2, 5, 10 ms and more: a fold's delete made the commits behind it
    /// wait up to 190 ms.
    /// (Its own connection rather than a pool of one, whose connection goes back to the pool in
    /// a task of its own after every statement, which the next commit waits for.) `None` once
    /// closed.
    journal_writer: tokio::sync::Mutex<Option<SqliteConnection>>,
    path: PathBuf,
    /// The sequence number of the next journal row.
    next_seq: AtomicU64,
    /// The sequence number of the last journal row appended (committed) by this process, or
    /// found at open.
    appended: AtomicU64,
    /// Rows appended to the journal and not folded yet.
    unfolded: AtomicU64,
    /// One fold at a time.
    folding: tokio::sync::Mutex<()>,
    /// Wakes the background fold.
    fold_wanted: tokio::sync::Notify,
    /// The twins' history, fed by the fold; `None` when it is off.
    history: Option<crate::history::History>,
}

/// The journal file of the tables at `path`: `NAME-log.db` beside `NAME.db`.
pub fn journal_path(path: &Path) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "twin".into());
    path.with_file_name(format!("{stem}-log.db"))
}

impl Store {
    /// Opens (creating if needed) the database at `path` and its journal, migrates both, and
    /// folds what the journal holds. No history.
    pub async fn open(path: &Path, sync: Synchronous) -> Result<Self> {
        Self::open_with_history(path, sync, None).await
    }

    /// As [`Store::open`], with the twins' history beside the tables when `history` is given
    /// (and enabled); a history that cannot be opened is said and left off, the twins open.
    pub async fn open_with_history(
        path: &Path,
        sync: Synchronous,
        history: Option<crate::history::HistoryConfig>,
    ) -> Result<Self> {
        let history = match history.filter(|h| h.enabled) {
            Some(cfg) => match crate::history::History::open(path, cfg).await {
                Ok(h) => Some(h),
                Err(e) => {
                    tracing::error!(error = %e, "the twins' history cannot be opened; running without it");
                    None
                }
            },
            None => None,
        };
        let journal_path = journal_path(path);
        let pool = connect(path, sync, 8192, 10_000, Some(WAL_LIMIT), 2).await?;
        // The journal is only appended to and read back in order: a small cache is enough.
        // Its writer checkpoints every JOURNAL_CHECKPOINT pages, inside the commit that
        // reaches them (a few ms): a checkpoint left to the fold, every 2 s, had 2 s of commits
        // to copy, and under a steady load it never caught up with the writer, so the log
        // never started over and grew by 35 MB/s (700 MB in 20 s).
        let journal = connect(&journal_path, sync, 1024, 0, None, 2).await?;
        migrate(&pool, path, MIGRATIONS).await?;
        migrate(&journal, &journal_path, JOURNAL_MIGRATIONS).await?;
        let journal_writer = connect_options(&journal_path, sync, 1024, JOURNAL_CHECKPOINT, None)
            .connect()
            .await
            .map_err(|source| StoreError::Open {
                path: journal_path.clone(),
                source,
            })?;
        let folded = folded_seq(&pool).await?;
        let last: Option<i64> = sqlx::query_scalar("SELECT MAX(seq) FROM journal")
            .fetch_one(&journal)
            .await?;
        let next = u(last.unwrap_or(0)).max(folded) + 1;
        let store = Self {
            inner: Arc::new(Connections {
                pool,
                journal,
                journal_writer: tokio::sync::Mutex::new(Some(journal_writer)),
                path: path.to_path_buf(),
                next_seq: AtomicU64::new(next),
                appended: AtomicU64::new(next - 1),
                unfolded: AtomicU64::new(0),
                folding: tokio::sync::Mutex::new(()),
                fold_wanted: tokio::sync::Notify::new(),
                history,
            }),
        };
        match store.fold_journal(u64::MAX).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(rows = n, path = %path.display(), "folded the journal left by the last run")
            }
            Err(e) if e.is_damage() => return Err(e),
            Err(e) => {
                // A full disk: the journal is kept, read over the tables, and folded later.
                let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM journal WHERE seq > ?")
                    .bind(i(folded))
                    .fetch_one(&store.inner.journal)
                    .await?;
                store.inner.unfolded.store(u(rows), Ordering::Relaxed);
                tracing::error!(error = %e, path = %path.display(), "cannot fold the journal left by the last run (is the disk full?); starting on it as it is");
            }
        }
        Ok(store)
    }

    /// The twins' history, when it is kept.
    pub fn history(&self) -> Option<&crate::history::History> {
        self.inner.history.as_ref()
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    fn pool(&self) -> &SqlitePool {
        &self.inner.pool
    }

    /// Rows appended to the journal and not folded into the tables yet.
    pub fn unfolded(&self) -> u64 {
        self.inner.unfolded.load(Ordering::Relaxed)
    }

    /// Every twin in the database.
    pub async fn load_twins(&self) -> Result<Vec<DeviceTwin>> {
        let overlay = self.fold_or_overlay().await?;
        // Each device with its properties in one row (see `rows::properties_json`), streamed:
        // the rows of 100,000 properties collected would be a start-up peak the allocator keeps.
        let mut rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {DEVICE_COLUMNS}, {} FROM device",
            rows::properties_json()
        )))
        .fetch(self.pool());
        let mut twins: HashMap<String, DeviceTwin> = HashMap::new();
        while let Some(r) = tokio_stream::StreamExt::next(&mut rows).await {
            let r = r?;
            let id: String = r.try_get(0)?;
            let row = DeviceRow {
                namespace: r.try_get(1)?,
                name: r.try_get(2)?,
                description: r.try_get(3)?,
                model: r.try_get(4)?,
                protocol: r.try_get(5)?,
                state: r.try_get(6)?,
                last_online: r.try_get(7)?,
                desired_version: u(r.try_get(8)?),
                reported_version: u(r.try_get(9)?),
                state_reason: r.try_get(10)?,
            };
            let properties: String = r.try_get(11)?;
            twins.insert(
                id,
                DeviceTwin {
                    row,
                    properties: rows::properties_from_json(&properties)?,
                },
            );
        }
        drop(rows);
        let orphans: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM twin WHERE device_id NOT IN (SELECT id FROM device)",
        )
        .fetch_one(self.pool())
        .await?;
        if orphans > 0 {
            tracing::warn!(rows = orphans, "twin rows without a device row; ignored");
        }
        if let Some(p) = overlay {
            for id in &p.purge {
                twins.remove(id);
            }
            for (id, row) in p.rows {
                twins
                    .entry(id)
                    .or_insert_with(|| DeviceTwin {
                        row: DeviceRow::default(),
                        properties: BTreeMap::new(),
                    })
                    .row = row;
            }
            for ((id, name), image) in p.props {
                let Some(t) = twins.get_mut(&id) else {
                    continue;
                };
                match image {
                    Some(prop) => t.properties.insert(name, prop),
                    None => t.properties.remove(&name),
                };
            }
        }
        Ok(twins.into_values().collect())
    }

    /// The highest outbox sequence number in use.
    pub async fn max_outbox_seq(&self) -> Result<u64> {
        let overlay = self.fold_or_overlay().await?;
        let v: Option<i64> = sqlx::query_scalar("SELECT MAX(seq) FROM outbox")
            .fetch_one(self.pool())
            .await?;
        let journal = overlay
            .iter()
            .flat_map(|p| p.outbox.values().map(|e| e.seq))
            .max()
            .unwrap_or(0);
        Ok(v.map(u).unwrap_or(0).max(journal))
    }

    /// Writes the changes of a batch of operations: one journal row, one transaction.
    pub async fn apply(&self, batch: &[&Applied]) -> Result<()> {
        let records: Vec<RecordRef> = batch.iter().filter_map(|a| RecordRef::of(a)).collect();
        if records.is_empty() {
            return Ok(());
        }
        let rows: u64 = records.iter().map(RecordRef::weight).sum();
        let body = serde_json::to_vec(&records)?;
        let seq = self.inner.next_seq.fetch_add(1, Ordering::Relaxed);
        // Counted before the row exists, so a fold that reads it always finds it counted (the
        // count reaches 0 exactly when everything appended is folded).
        let waiting = self.inner.unfolded.fetch_add(rows, Ordering::Relaxed) + rows;
        let mut writer = self.inner.journal_writer.lock().await;
        let inserted = match writer.as_mut() {
            Some(conn) => sqlx::query("INSERT INTO journal (seq, body) VALUES (?, ?)")
                .bind(i(seq))
                .bind(body)
                .execute(conn)
                .await
                .map(|_| ()),
            None => Err(sqlx::Error::PoolClosed),
        };
        drop(writer);
        if let Err(e) = inserted {
            self.inner.unfolded.fetch_sub(rows, Ordering::Relaxed);
            return Err(e.into());
        }
        self.inner.appended.fetch_max(seq, Ordering::Release);
        if waiting >= FOLD_AFTER {
            self.inner.fold_wanted.notify_one();
        }
        Ok(())
    }

    /// The oldest `limit` changes not yet acknowledged by the cloud.
    pub async fn outbox(&self, limit: usize) -> Result<Vec<OutboxEntry>> {
        self.fold().await?;
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {OUTBOX_COLUMNS} FROM outbox ORDER BY seq LIMIT ?"
        )))
        .bind(i(limit as u64))
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(outbox_from_row).collect()
    }

    /// The devices of the oldest `limit` changes not yet acknowledged by the cloud, with every
    /// change of theirs (ordered by `seq`): what the node sends up, one report per device with
    /// all its pending values. Taking only the oldest `limit` changes cut each device's values
    /// over many reports (its properties change at different times): with 5,000 devices
    /// changing, a report carried 1.3 values and the link, at its 100 reports a second, never
    /// caught up.
    pub async fn outbox_devices(&self, limit: usize) -> Result<Vec<OutboxEntry>> {
        self.fold().await?;
        let rows = sqlx::query(AssertSqlSafe(format!(
            "WITH oldest AS (SELECT device_id FROM outbox ORDER BY seq LIMIT ?)
             SELECT {OUTBOX_COLUMNS} FROM outbox
             WHERE device_id IN (SELECT device_id FROM oldest) ORDER BY seq"
        )))
        .bind(i(limit as u64))
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(outbox_from_row).collect()
    }

    /// How many changes wait for the cloud.
    pub async fn outbox_len(&self) -> Result<u64> {
        self.fold().await?;
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox")
            .fetch_one(self.pool())
            .await?;
        Ok(u(n))
    }

    /// How many changes wait for the cloud, and the time (ms since the epoch) of the oldest
    /// value among them.
    pub async fn outbox_stats(&self) -> Result<(u64, Option<i64>)> {
        self.fold().await?;
        let (n, oldest): (i64, Option<i64>) =
            sqlx::query_as("SELECT COUNT(*), MIN(timestamp) FROM outbox")
                .fetch_one(self.pool())
                .await?;
        Ok((u(n), oldest))
    }

    /// Removes acknowledged entries. An entry replaced by a newer change since it was sent (a
    /// higher `seq`) stays. Returns how many were removed. One statement for all of them (a
    /// gateway clears hundreds a second; a statement each was a round trip each to SQLite's
    /// thread): the entries go as one JSON array, each looked up by the outbox's key.
    pub async fn ack(&self, entries: &[OutboxEntry]) -> Result<u64> {
        if entries.is_empty() {
            return Ok(0);
        }
        self.fold().await?;
        let keys: Vec<(String, &str, &str, i64)> = entries
            .iter()
            .map(|e| {
                (
                    DeviceId::new(&e.namespace, &e.name).to_string(),
                    e.property.as_str(),
                    e.section.as_str(),
                    i(e.seq),
                )
            })
            .collect();
        let r = sqlx::query(
            "DELETE FROM outbox WHERE (device_id, property, section, seq) IN (
                SELECT o.device_id, o.property, o.section, o.seq FROM json_each(?) AS a
                JOIN outbox AS o ON o.device_id = json_extract(a.value, '$[0]')
                    AND o.property = json_extract(a.value, '$[1]')
                    AND o.section = json_extract(a.value, '$[2]')
                WHERE o.seq <= json_extract(a.value, '$[3]'))",
        )
        .bind(serde_json::to_string(&keys)?)
        .execute(self.pool())
        .await?;
        Ok(r.rows_affected())
    }

    /// Stores an object (a Device, a DeviceModel, a mapper registration) under `key`.
    pub async fn put_meta(&self, key: &str, kind: &str, value: &str) -> Result<()> {
        sqlx::query("INSERT OR REPLACE INTO meta (key, kind, value) VALUES (?, ?, ?)")
            .bind(key)
            .bind(kind)
            .bind(value)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Removes the object under `key`.
    pub async fn delete_meta(&self, key: &str) -> Result<()> {
        sqlx::query("DELETE FROM meta WHERE key = ?")
            .bind(key)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Every object of `kind`, as `(key, value)`.
    pub async fn list_meta(&self, kind: &str) -> Result<Vec<(String, String)>> {
        let rows = sqlx::query("SELECT key, value FROM meta WHERE kind = ? ORDER BY key")
            .bind(kind)
            .fetch_all(self.pool())
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    /// Hands back the page caches of the connections not in use (`PRAGMA shrink_memory`):
    /// after a burst such as a first start, which writes every twin, they hold pages that are
    /// read again from the file (the OS's cache) when needed.
    pub async fn release_cache(&self) {
        for pool in [&self.inner.pool, &self.inner.journal] {
            let mut held = Vec::new();
            while let Some(conn) = pool.try_acquire() {
                held.push(conn);
            }
            for conn in &mut held {
                if let Err(e) = sqlx::query("PRAGMA shrink_memory")
                    .execute(&mut **conn)
                    .await
                {
                    tracing::debug!(error = %e, "shrink_memory");
                }
            }
        }
        if let Some(conn) = self.inner.journal_writer.lock().await.as_mut()
            && let Err(e) = sqlx::query("PRAGMA shrink_memory").execute(conn).await
        {
            tracing::debug!(error = %e, "shrink_memory");
        }
    }

    /// Folds the journal and closes the connections, checkpointing the WAL.
    pub async fn close(&self) {
        if let Err(e) = self.fold().await {
            tracing::warn!(error = %e, "failed to fold the twin journal at close; it is kept and folded at the next start");
        }
        self.inner.pool.close().await;
        self.inner.journal.close().await;
        if let Some(conn) = self.inner.journal_writer.lock().await.take()
            && let Err(e) = conn.close().await
        {
            tracing::debug!(error = %e, "closing the journal's writer");
        }
    }
}

/// Runs `body` in one transaction on a connection of its own, and closes that connection
/// instead of returning it to the pool when anything fails.
///
/// After an error such as SQLITE_FULL, SQLite may have rolled the transaction back by itself,
/// or kept it open after a failed COMMIT. A pooled connection left in either state no longer
/// matches the transaction depth sqlx keeps for it, and sqlx's savepoints then nest inside the
/// stale transaction: a later "commit" releases a savepoint and commits nothing, while saying it
/// did. The fold would then delete journal rows whose changes never reached the tables, which is
/// how a full disk lost acknowledged values. Closing the connection rolls back whatever it held.
pub(super) async fn in_transaction<T>(
    pool: &SqlitePool,
    body: impl AsyncFnOnce(&mut SqliteConnection) -> Result<T>,
) -> Result<T> {
    let mut conn = pool.acquire().await?;
    let result = async {
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
        let value = body(&mut conn).await?;
        sqlx::query("COMMIT").execute(&mut *conn).await?;
        Ok(value)
    }
    .await;
    if result.is_err() {
        drop(conn.detach());
    }
    result
}
