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
use crate::journal::{Pending, Record, RecordRef};
use crate::model::{DeviceRow, DeviceTwin, OutboxEntry, PropertyTwin, Section, TwinValue, Version};
use api::paths::DeviceId;
use api::v1beta1::PropertyType;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Row, SqliteConnection};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
    #[error("twin database holds an invalid {what}: {value:?}")]
    Corrupt { what: &'static str, value: String },
    #[error("not written: an earlier batch failed to commit and this one was built on it")]
    Abandoned,
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

/// Rows written by one multi-row statement, at most.
pub const ROWS_PER_STATEMENT: usize = 256;

/// The statement sizes a batch is cut into, largest first: a few fixed shapes keep every
/// statement in sqlx's prepared-statement cache (one shape per row count would thrash it).
const STATEMENT_SIZES: [usize; 9] = [ROWS_PER_STATEMENT, 128, 64, 32, 16, 8, 4, 2, 1];

/// `items` cut into chunks of the sizes in [`STATEMENT_SIZES`].
fn statement_chunks<T>(mut items: &[T]) -> impl Iterator<Item = &[T]> {
    std::iter::from_fn(move || {
        let n = STATEMENT_SIZES
            .iter()
            .copied()
            .find(|&n| n <= items.len())?;
        let (chunk, rest) = items.split_at(n);
        items = rest;
        Some(chunk)
    })
}

/// The schema migrations; the database's `user_version` counts those applied.
pub const MIGRATIONS: &[&str] = &[
    // 1: devices, twins, the outbox to the cloud and cached objects.
    "CREATE TABLE device (
        id TEXT PRIMARY KEY NOT NULL,
        namespace TEXT NOT NULL,
        name TEXT NOT NULL,
        description TEXT NOT NULL DEFAULT '',
        model TEXT NOT NULL DEFAULT '',
        protocol TEXT NOT NULL DEFAULT '',
        state TEXT NOT NULL DEFAULT '',
        last_online INTEGER NOT NULL DEFAULT 0,
        desired_version INTEGER NOT NULL DEFAULT 0,
        reported_version INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE twin (
        device_id TEXT NOT NULL,
        name TEXT NOT NULL,
        value_type TEXT NOT NULL,
        optional INTEGER NOT NULL,
        writable INTEGER NOT NULL,
        spec_desired TEXT,
        desired TEXT,
        desired_ts INTEGER,
        desired_cloud INTEGER NOT NULL,
        desired_edge INTEGER NOT NULL,
        reported TEXT,
        reported_ts INTEGER,
        reported_cloud INTEGER NOT NULL,
        reported_edge INTEGER NOT NULL,
        observed TEXT,
        observed_ts INTEGER,
        PRIMARY KEY (device_id, name)
    ) WITHOUT ROWID;
    CREATE TABLE outbox (
        device_id TEXT NOT NULL,
        property TEXT NOT NULL,
        section TEXT NOT NULL,
        value TEXT NOT NULL,
        version_cloud INTEGER NOT NULL,
        version_edge INTEGER NOT NULL,
        timestamp INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        PRIMARY KEY (device_id, property, section)
    ) WITHOUT ROWID;
    CREATE INDEX outbox_seq ON outbox (seq);
    CREATE TABLE meta (
        key TEXT PRIMARY KEY NOT NULL,
        kind TEXT NOT NULL,
        value TEXT NOT NULL
    );",
    // 2: devices clustered by id (one B-tree to write per device update instead of two).
    "CREATE TABLE device2 (
        id TEXT PRIMARY KEY NOT NULL,
        namespace TEXT NOT NULL,
        name TEXT NOT NULL,
        description TEXT NOT NULL DEFAULT '',
        model TEXT NOT NULL DEFAULT '',
        protocol TEXT NOT NULL DEFAULT '',
        state TEXT NOT NULL DEFAULT '',
        last_online INTEGER NOT NULL DEFAULT 0,
        desired_version INTEGER NOT NULL DEFAULT 0,
        reported_version INTEGER NOT NULL DEFAULT 0
    ) WITHOUT ROWID;
    INSERT INTO device2 SELECT id, namespace, name, description, model, protocol, state,
        last_online, desired_version, reported_version FROM device;
    DROP TABLE device;
    ALTER TABLE device2 RENAME TO device;",
    // 3: how far the journal (a separate file) has been folded into these tables.
    "CREATE TABLE folded (
        id INTEGER PRIMARY KEY CHECK (id = 0),
        seq INTEGER NOT NULL
    );
    INSERT INTO folded (id, seq) VALUES (0, 0);",
    // 4: why a device is in its state (a mapper found unreachable, ...).
    "ALTER TABLE device ADD COLUMN state_reason TEXT NOT NULL DEFAULT '';",
    // 5: a property's range (from its model) and its last read error.
    "ALTER TABLE twin ADD COLUMN minimum TEXT;
    ALTER TABLE twin ADD COLUMN maximum TEXT;
    ALTER TABLE twin ADD COLUMN error TEXT;
    ALTER TABLE twin ADD COLUMN error_ts INTEGER;",
    // 6: why the desired value was refused for good (by the device or its mapper).
    "ALTER TABLE twin ADD COLUMN write_error TEXT;
    ALTER TABLE twin ADD COLUMN write_error_ts INTEGER;",
    // 7: the model's unit.
    "ALTER TABLE twin ADD COLUMN unit TEXT;",
];

const TWIN_COLUMNS: &str = "device_id, name, value_type, optional, writable, spec_desired, desired, desired_ts, desired_cloud, desired_edge, reported, reported_ts, reported_cloud, reported_edge, observed, observed_ts, minimum, maximum, error, error_ts, write_error, write_error_ts, unit";
const TWIN_PARAMS: usize = 23;
const DEVICE_COLUMNS: &str = "id, namespace, name, description, model, protocol, state, last_online, desired_version, reported_version, state_reason";
const DEVICE_PARAMS: usize = 11;
const OUTBOX_COLUMNS: &str =
    "device_id, property, section, value, version_cloud, version_edge, timestamp, seq";
const OUTBOX_PARAMS: usize = 8;

/// The schema migrations of the journal file.
pub const JOURNAL_MIGRATIONS: &[&str] = &[
    // 1: one row per committed batch: its records, JSON-encoded (see `journal`).
    "CREATE TABLE journal (seq INTEGER PRIMARY KEY, body BLOB NOT NULL);",
];

/// The journal is folded in the background once this many rows wait in it, or at
/// [`FOLD_INTERVAL`].
pub const FOLD_AFTER: u64 = 200_000;

/// How often the background fold runs when the journal is not empty.
pub const FOLD_INTERVAL: Duration = Duration::from_secs(2);

/// Journal rows read by one fold transaction, at most. What a fold holds in memory is bounded
/// by the distinct rows it writes (at most the size of the tables), not by this; a large chunk
/// coalesces more, so each B-tree page is written once for more changes.
const FOLD_CHUNK: u64 = 1_000_000;

/// The tables' write-ahead log is truncated to this size after a checkpoint.
const WAL_LIMIT: u64 = 64 * 1024 * 1024;

/// The journal's writer checkpoints its write-ahead log every this many pages (4 MiB).
const JOURNAL_CHECKPOINT: u32 = 1000;

/// Journal rows (committed batches) read by one statement of a fold.
const READ_CHUNK: u64 = 256;

/// Journal rows (committed batches) deleted by one statement once folded.
const DELETE_CHUNK: u64 = 512;

/// The twin database. Cheap to clone: clones share the connections.
#[derive(Clone, Debug)]
pub struct Store {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
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
}

fn replace_sql(table: &str, columns: &str, params: usize, rows: usize) -> String {
    let row = format!("({})", vec!["?"; params].join(","));
    let values = vec![row; rows].join(",");
    format!("INSERT OR REPLACE INTO {table} ({columns}) VALUES {values}")
}

/// The multi-row statements of the fold, one per table and statement size, built once.
struct Statements {
    device: Vec<String>,
    twin: Vec<String>,
    outbox: Vec<String>,
}

impl Statements {
    fn get() -> &'static Self {
        static STATEMENTS: std::sync::OnceLock<Statements> = std::sync::OnceLock::new();
        STATEMENTS.get_or_init(|| {
            let all = |table, columns, params| {
                STATEMENT_SIZES
                    .iter()
                    .map(|&n| replace_sql(table, columns, params, n))
                    .collect()
            };
            Statements {
                device: all("device", DEVICE_COLUMNS, DEVICE_PARAMS),
                twin: all("twin", TWIN_COLUMNS, TWIN_PARAMS),
                outbox: all("outbox", OUTBOX_COLUMNS, OUTBOX_PARAMS),
            }
        })
    }

    /// The statement writing `rows` rows (one of [`STATEMENT_SIZES`]) to a table.
    fn of(table: &'static [String], rows: usize) -> &'static str {
        let at = STATEMENT_SIZES
            .iter()
            .position(|&n| n == rows)
            .unwrap_or(STATEMENT_SIZES.len() - 1);
        &table[at]
    }
}

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
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
    /// folds what the journal holds.
    pub async fn open(path: &Path, sync: Synchronous) -> Result<Self> {
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
            inner: Arc::new(Inner {
                pool,
                journal,
                journal_writer: tokio::sync::Mutex::new(Some(journal_writer)),
                path: path.to_path_buf(),
                next_seq: AtomicU64::new(next),
                appended: AtomicU64::new(next - 1),
                unfolded: AtomicU64::new(0),
                folding: tokio::sync::Mutex::new(()),
                fold_wanted: tokio::sync::Notify::new(),
            }),
        };
        match store.fold_journal(u64::MAX).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(rows = n, path = %path.display(), "folded the journal left by the last run")
            }
            Err(e @ StoreError::Corrupt { .. }) => return Err(e),
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
    async fn fold_journal(&self, upto: u64) -> Result<u64> {
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
                        rows += pending.add(record);
                    }
                    through = seq;
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
    async fn truncate_journal_wal(&self) {
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
        loop {
            tokio::select! {
                () = self.inner.fold_wanted.notified() => {}
                () = tokio::time::sleep(FOLD_INTERVAL) => {}
            }
            if self.pool().is_closed() {
                return;
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
    async fn unfolded_journal(&self) -> Result<Pending> {
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
    async fn fold_or_overlay(&self) -> Result<Option<Pending>> {
        match self.fold().await {
            Ok(_) => Ok(None),
            Err(e @ StoreError::Corrupt { .. }) => Err(e),
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
    async fn reclaim(&self) {
        for (name, pool) in [("tables", self.pool()), ("journal", &self.inner.journal)] {
            if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(pool)
                .await
            {
                tracing::debug!(database = name, error = %e, "cannot truncate the write-ahead log");
            }
        }
    }

    /// Every twin in the database.
    pub async fn load_twins(&self) -> Result<Vec<DeviceTwin>> {
        let overlay = self.fold_or_overlay().await?;
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {DEVICE_COLUMNS} FROM device"
        )))
        .fetch_all(self.pool())
        .await?;
        let mut twins: HashMap<String, DeviceTwin> = HashMap::with_capacity(rows.len());
        for r in rows {
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
            twins.insert(
                id,
                DeviceTwin {
                    row,
                    properties: BTreeMap::new(),
                },
            );
        }
        // Streamed, not collected: the rows of 100,000 properties would be a start-up peak that
        // the allocator keeps.
        let mut rows = sqlx::query(AssertSqlSafe(format!("SELECT {TWIN_COLUMNS} FROM twin")))
            .fetch(self.pool());
        while let Some(r) = tokio_stream::StreamExt::next(&mut rows).await {
            let r = r?;
            let device_id: String = r.try_get(0)?;
            let name: String = r.try_get(1)?;
            let prop = property_from_row(&r)?;
            match twins.get_mut(&device_id) {
                Some(t) => {
                    t.properties.insert(name, prop);
                }
                None => {
                    tracing::warn!(device = %device_id, property = %name, "twin row without a device row; ignored")
                }
            }
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

    /// How many changes wait for the cloud.
    pub async fn outbox_len(&self) -> Result<u64> {
        self.fold().await?;
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox")
            .fetch_one(self.pool())
            .await?;
        Ok(u(n))
    }

    /// Removes acknowledged entries. An entry replaced by a newer change since it was sent (a
    /// higher `seq`) stays. Returns how many were removed.
    pub async fn ack(&self, entries: &[OutboxEntry]) -> Result<u64> {
        self.fold().await?;
        in_transaction(self.pool(), async |tx| {
        let mut removed = 0;
        for e in entries {
            let r = sqlx::query(
                "DELETE FROM outbox WHERE device_id = ? AND property = ? AND section = ? AND seq <= ?",
            )
            .bind(DeviceId::new(&e.namespace, &e.name).to_string())
            .bind(e.property.as_str())
            .bind(e.section.as_str())
            .bind(i(e.seq))
            .execute(&mut *tx)
            .await?;
            removed += r.rows_affected();
        }
        Ok(removed)
        })
        .await
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

/// A pool of `connections` connections to the database at `path`, in WAL mode, with a page
/// cache of `cache_kib`, an automatic checkpoint every `checkpoint_pages` pages of WAL (0:
/// none) and the WAL truncated to `wal_limit` bytes after a checkpoint (`None`: never).
async fn connect(
    path: &Path,
    sync: Synchronous,
    cache_kib: u32,
    checkpoint_pages: u32,
    wal_limit: Option<u64>,
    connections: u32,
) -> Result<SqlitePool> {
    SqlitePoolOptions::new()
        .max_connections(connections)
        .connect_with(connect_options(
            path,
            sync,
            cache_kib,
            checkpoint_pages,
            wal_limit,
        ))
        .await
        .map_err(|source| StoreError::Open {
            path: path.to_path_buf(),
            source,
        })
}

/// How every connection to the database at `path` is set up (see [`connect`]).
fn connect_options(
    path: &Path,
    sync: Synchronous,
    cache_kib: u32,
    checkpoint_pages: u32,
    wal_limit: Option<u64>,
) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(match sync {
            Synchronous::Normal => SqliteSynchronous::Normal,
            Synchronous::Full => SqliteSynchronous::Full,
        })
        .busy_timeout(Duration::from_secs(5))
        // The tables of 10,000 devices stay in an 8 MiB cache (SQLite's default is 2 MiB)
        // instead of being re-read for every fold.
        .pragma("cache_size", format!("-{cache_kib}"))
        .pragma("wal_autocheckpoint", checkpoint_pages.to_string())
        // Statement journals (a multi-row INSERT OR REPLACE needs one) in memory, not in a
        // temporary file written and synced for every statement.
        .pragma("temp_store", "memory")
        // A WAL file left larger than this by a burst is truncated after the next checkpoint
        // (by the first commit after it); -1: never.
        .pragma(
            "journal_size_limit",
            wal_limit.map_or("-1".to_string(), |l| l.to_string()),
        )
}

/// Applies the `migrations` the database at `path` has not had; `user_version` counts those
/// applied.
async fn migrate(pool: &SqlitePool, path: &Path, migrations: &[&str]) -> Result<()> {
    let current: i64 = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(pool)
        .await?;
    if current > migrations.len() as i64 {
        return Err(StoreError::TooNew {
            path: path.to_path_buf(),
            found: current,
            known: migrations.len(),
        });
    }
    for (n, sql) in migrations.iter().enumerate().skip(u(current) as usize) {
        let version = n + 1;
        let err = |source| StoreError::Migrate { version, source };
        let mut tx = pool.begin().await.map_err(err)?;
        sqlx::raw_sql(AssertSqlSafe(*sql))
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        sqlx::raw_sql(AssertSqlSafe(format!("PRAGMA user_version = {version}")))
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        tracing::info!(version, path = %path.display(), "migrated twin database");
    }
    Ok(())
}

/// A journal row's sequence number and records.
fn journal_row(r: &SqliteRow) -> Result<(u64, Vec<Record>)> {
    let seq = u(r.try_get(0)?);
    let body: Vec<u8> = r.try_get(1)?;
    let records = serde_json::from_slice(&body).map_err(|e| StoreError::Corrupt {
        what: "journal row",
        value: format!("{seq}: {e}"),
    })?;
    Ok((seq, records))
}

/// The last journal row the tables cover.
async fn folded_seq(pool: &SqlitePool) -> Result<u64> {
    let seq: i64 = sqlx::query_scalar("SELECT seq FROM folded WHERE id = 0")
        .fetch_one(pool)
        .await?;
    Ok(u(seq))
}

/// Spreads a fold over time: after each [`FOLD_SLICE`] of work it pauses as long, so on a
/// small machine a fold never holds a core for long and commits of new reports (which answer
/// callers) keep their latency. A fold is background work: it only has to keep up on average.
struct Pace {
    since: std::time::Instant,
}

/// Work done by a fold between pauses.
const FOLD_SLICE: Duration = Duration::from_millis(4);

impl Pace {
    fn new() -> Self {
        Self {
            since: std::time::Instant::now(),
        }
    }

    async fn breathe(&mut self) {
        let worked = self.since.elapsed();
        if worked >= FOLD_SLICE {
            tokio::time::sleep(worked).await;
            self.since = std::time::Instant::now();
        }
    }
}

/// Writes coalesced journal records to the tables: removals first, then each table in key
/// order by multi-row statements.
async fn write_pending(tx: &mut SqliteConnection, p: &Pending) -> Result<()> {
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
                .bind(p.unit.as_deref());
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

/// Runs `body` in one transaction on a connection of its own, and closes that connection
/// instead of returning it to the pool when anything fails.
///
/// After an error such as SQLITE_FULL, SQLite may have rolled the transaction back by itself,
/// or kept it open after a failed COMMIT. A pooled connection left in either state no longer
/// matches the transaction depth sqlx keeps for it, and sqlx's savepoints then nest inside the
/// stale transaction: a later "commit" releases a savepoint and commits nothing, while saying it
/// did. The fold would then delete journal rows whose changes never reached the tables, which is
/// how a full disk lost acknowledged values. Closing the connection rolls back whatever it held.
async fn in_transaction<T>(
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

fn value_at(r: &SqliteRow, value: usize, ts: usize) -> Result<Option<TwinValue>> {
    let v: Option<String> = r.try_get(value)?;
    let t: Option<i64> = r.try_get(ts)?;
    Ok(v.map(|value| TwinValue {
        value,
        timestamp: t.unwrap_or(0),
    }))
}

fn property_type(s: &str) -> Result<PropertyType> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).map_err(|_| {
        StoreError::Corrupt {
            what: "property type",
            value: s.to_string(),
        }
    })
}

fn property_from_row(r: &SqliteRow) -> Result<PropertyTwin> {
    let ty: String = r.try_get(2)?;
    Ok(PropertyTwin {
        value_type: property_type(&ty)?,
        optional: r.try_get(3)?,
        writable: r.try_get(4)?,
        spec_desired: r.try_get(5)?,
        desired: value_at(r, 6, 7)?,
        desired_version: Version {
            cloud: u(r.try_get(8)?),
            edge: u(r.try_get(9)?),
        },
        reported: value_at(r, 10, 11)?,
        reported_version: Version {
            cloud: u(r.try_get(12)?),
            edge: u(r.try_get(13)?),
        },
        observed_desired: value_at(r, 14, 15)?,
        minimum: r.try_get(16)?,
        maximum: r.try_get(17)?,
        error: value_at(r, 18, 19)?,
        write_error: value_at(r, 20, 21)?,
        unit: r.try_get(22)?,
    })
}

fn outbox_from_row(r: &SqliteRow) -> Result<OutboxEntry> {
    let device_id: String = r.try_get(0)?;
    let id = DeviceId::parse(&device_id).ok_or_else(|| StoreError::Corrupt {
        what: "device id",
        value: device_id.clone(),
    })?;
    let section: String = r.try_get(2)?;
    Ok(OutboxEntry {
        namespace: id.namespace,
        name: id.name,
        property: r.try_get(1)?,
        section: Section::parse(&section).ok_or(StoreError::Corrupt {
            what: "outbox section",
            value: section,
        })?,
        value: r.try_get(3)?,
        version: Version {
            cloud: u(r.try_get(4)?),
            edge: u(r.try_get(5)?),
        },
        timestamp: r.try_get(6)?,
        seq: u(r.try_get(7)?),
    })
}
