//! The store's schema and statements: the numbered migrations of both files, the column lists,
//! the multi-row statements of a fold cut into a few fixed sizes (so that each stays in sqlx's
//! statement cache), and how connections are opened and migrated.

use sqlx::AssertSqlSafe;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use std::path::Path;
use std::time::Duration;

use super::{Result, StoreError, Synchronous};

/// Rows written by one multi-row statement, at most.
pub const ROWS_PER_STATEMENT: usize = 256;

/// The statement sizes a batch is cut into, largest first: a few fixed shapes keep every
/// statement in sqlx's prepared-statement cache (one shape per row count would thrash it).
pub(super) const STATEMENT_SIZES: [usize; 9] = [ROWS_PER_STATEMENT, 128, 64, 32, 16, 8, 4, 2, 1];

/// `items` cut into chunks of the sizes in [`STATEMENT_SIZES`].
pub(super) fn statement_chunks<T>(mut items: &[T]) -> impl Iterator<Item = &[T]> {
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

/// The device table's columns as migrations 1 and 2 create them (2 rebuilds the table
/// clustered by id).
macro_rules! device_columns {
    () => {
        "id TEXT PRIMARY KEY NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
        description TEXT NOT NULL DEFAULT '', model TEXT NOT NULL DEFAULT '',
        protocol TEXT NOT NULL DEFAULT '', state TEXT NOT NULL DEFAULT '',
        last_online INTEGER NOT NULL DEFAULT 0, desired_version INTEGER NOT NULL DEFAULT 0,
        reported_version INTEGER NOT NULL DEFAULT 0"
    };
}

/// The schema migrations; the database's `user_version` counts those applied.
pub const MIGRATIONS: &[&str] = &[
    // 1: devices, twins, the outbox to the cloud and cached objects.
    concat!(
        "CREATE TABLE device (",
        device_columns!(),
        ");
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
    );"
    ),
    // 2: devices clustered by id (one B-tree to write per device update instead of two).
    concat!(
        "CREATE TABLE device2 (",
        device_columns!(),
        ") WITHOUT ROWID;
    INSERT INTO device2 SELECT id, namespace, name, description, model, protocol, state,
        last_online, desired_version, reported_version FROM device;
    DROP TABLE device;
    ALTER TABLE device2 RENAME TO device;"
    ),
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
    // 8: the value a write error refused.
    "ALTER TABLE twin ADD COLUMN refused TEXT;",
];

pub(super) const TWIN_COLUMNS: &str = "device_id, name, value_type, optional, writable, spec_desired, desired, desired_ts, desired_cloud, desired_edge, reported, reported_ts, reported_cloud, reported_edge, observed, observed_ts, minimum, maximum, error, error_ts, write_error, write_error_ts, unit, refused";
pub(super) const TWIN_PARAMS: usize = 24;
pub(super) const DEVICE_COLUMNS: &str = "id, namespace, name, description, model, protocol, state, last_online, desired_version, reported_version, state_reason";
pub(super) const DEVICE_PARAMS: usize = 11;
pub(super) const OUTBOX_COLUMNS: &str =
    "device_id, property, section, value, version_cloud, version_edge, timestamp, seq";
pub(super) const OUTBOX_PARAMS: usize = 8;

/// The schema migrations of the journal file.
pub const JOURNAL_MIGRATIONS: &[&str] = &[
    // 1: one row per committed batch: its records, JSON-encoded (see `journal`).
    "CREATE TABLE journal (seq INTEGER PRIMARY KEY, body BLOB NOT NULL);",
];

pub(super) fn replace_sql(table: &str, columns: &str, params: usize, rows: usize) -> String {
    let row = format!("({})", vec!["?"; params].join(","));
    let values = vec![row; rows].join(",");
    format!("INSERT OR REPLACE INTO {table} ({columns}) VALUES {values}")
}

/// The multi-row statements of the fold, one per table and statement size, built once.
pub(super) struct Statements {
    pub(super) device: Vec<String>,
    pub(super) twin: Vec<String>,
    pub(super) outbox: Vec<String>,
}

impl Statements {
    pub(super) fn get() -> &'static Self {
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
    pub(super) fn of(table: &'static [String], rows: usize) -> &'static str {
        let at = STATEMENT_SIZES
            .iter()
            .position(|&n| n == rows)
            .unwrap_or(STATEMENT_SIZES.len() - 1);
        &table[at]
    }
}

/// A pool of `connections` connections to the database at `path`, in WAL mode, with a page
/// cache of `cache_kib`, an automatic checkpoint every `checkpoint_pages` pages of WAL (0:
/// none) and the WAL truncated to `wal_limit` bytes after a checkpoint (`None`: never).
pub(super) async fn connect(
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
pub(super) fn connect_options(
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
pub(super) async fn migrate(pool: &SqlitePool, path: &Path, migrations: &[&str]) -> Result<()> {
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
    for (n, sql) in migrations
        .iter()
        .enumerate()
        .skip(usize::try_from(current).unwrap_or(0))
    {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(n: usize) -> Vec<usize> {
        let rows: Vec<usize> = (0..n).collect();
        let chunks: Vec<&[usize]> = statement_chunks(&rows).collect();
        let flat: Vec<usize> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        assert_eq!(flat, rows, "every row once, in order");
        chunks.iter().map(|c| c.len()).collect()
    }

    #[test]
    fn a_batch_is_cut_into_the_fixed_statement_sizes_largest_first() {
        assert_eq!(sizes(0), Vec::<usize>::new());
        assert_eq!(sizes(1), vec![1]);
        assert_eq!(sizes(300), vec![256, 32, 8, 4]);
        assert_eq!(sizes(513), vec![256, 256, 1]);
        assert_eq!(sizes(255), vec![128, 64, 32, 16, 8, 4, 2, 1]);
    }

    #[test]
    fn each_statement_writes_as_many_rows_as_its_size_with_every_column() {
        let sql = replace_sql("outbox", OUTBOX_COLUMNS, OUTBOX_PARAMS, 2);
        assert_eq!(
            sql,
            format!(
                "INSERT OR REPLACE INTO outbox ({OUTBOX_COLUMNS}) VALUES (?,?,?,?,?,?,?,?),(?,?,?,?,?,?,?,?)"
            )
        );
        for (columns, params) in [
            (TWIN_COLUMNS, TWIN_PARAMS),
            (DEVICE_COLUMNS, DEVICE_PARAMS),
            (OUTBOX_COLUMNS, OUTBOX_PARAMS),
        ] {
            assert_eq!(columns.split(", ").count(), params, "{columns}");
        }
        let s = Statements::get();
        for n in STATEMENT_SIZES {
            assert_eq!(
                Statements::of(&s.twin, n).matches('(').count(),
                n + 1,
                "the column list and {n} rows"
            );
        }
    }
}
