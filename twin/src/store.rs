//! The SQLite store of the twins: WAL journal, numbered migrations, and batched writes.
//!
//! A batch of applied operations is written in one transaction, with the rows of the batch
//! coalesced first (the last state of a property wins) and written by multi-row statements of up
//! to [`ROWS_PER_STATEMENT`] rows: one statement costs about as much as one row, so this is what
//! lets the store keep up under load. A crash leaves the state of the last committed batch.

use crate::engine::Applied;
use crate::model::{DeviceRow, DeviceTwin, OutboxEntry, PropertyTwin, Section, TwinValue, Version};
use api::paths::DeviceId;
use api::v1beta1::PropertyType;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Row, Sqlite, Transaction};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
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
];

const TWIN_COLUMNS: &str = "device_id, name, value_type, optional, writable, spec_desired, desired, desired_ts, desired_cloud, desired_edge, reported, reported_ts, reported_cloud, reported_edge, observed, observed_ts";
const TWIN_PARAMS: usize = 16;
const DEVICE_COLUMNS: &str = "id, namespace, name, description, model, protocol, state, last_online, desired_version, reported_version";
const DEVICE_PARAMS: usize = 10;
const OUTBOX_COLUMNS: &str =
    "device_id, property, section, value, version_cloud, version_edge, timestamp, seq";
const OUTBOX_PARAMS: usize = 8;

/// The twin database.
#[derive(Clone, Debug)]
pub struct Store {
    pool: SqlitePool,
    path: PathBuf,
}

fn replace_sql(table: &str, columns: &str, params: usize, rows: usize) -> String {
    let row = format!("({})", vec!["?"; params].join(","));
    let values = vec![row; rows].join(",");
    format!("INSERT OR REPLACE INTO {table} ({columns}) VALUES {values}")
}

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl Store {
    /// Opens (creating if needed) the database at `path` and migrates it.
    pub async fn open(path: &Path, sync: Synchronous) -> Result<Self> {
        let open_err = |source| StoreError::Open {
            path: path.to_path_buf(),
            source,
        };
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match sync {
                Synchronous::Normal => SqliteSynchronous::Normal,
                Synchronous::Full => SqliteSynchronous::Full,
            })
            .busy_timeout(Duration::from_secs(5))
            // Up to 8 MiB of pages kept per connection (SQLite's default is 2 MiB): the twin
            // table of 10,000 devices then stays in memory instead of being re-read per batch.
            .pragma("cache_size", "-8192")
            .pragma("wal_autocheckpoint", "10000");
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .map_err(open_err)?;
        let store = Self {
            pool,
            path: path.to_path_buf(),
        };
        store.migrate().await?;
        Ok(store)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn migrate(&self) -> Result<()> {
        let current: i64 = sqlx::query_scalar("PRAGMA user_version")
            .fetch_one(&self.pool)
            .await?;
        if current > MIGRATIONS.len() as i64 {
            return Err(StoreError::TooNew {
                path: self.path.clone(),
                found: current,
                known: MIGRATIONS.len(),
            });
        }
        for (n, sql) in MIGRATIONS.iter().enumerate().skip(u(current) as usize) {
            let version = n + 1;
            let err = |source| StoreError::Migrate { version, source };
            let mut tx = self.pool.begin().await.map_err(err)?;
            sqlx::raw_sql(AssertSqlSafe(*sql))
                .execute(&mut *tx)
                .await
                .map_err(err)?;
            sqlx::raw_sql(AssertSqlSafe(format!("PRAGMA user_version = {version}")))
                .execute(&mut *tx)
                .await
                .map_err(err)?;
            tx.commit().await.map_err(err)?;
            tracing::info!(version, path = %self.path.display(), "migrated twin database");
        }
        Ok(())
    }

    /// Every twin in the database.
    pub async fn load_twins(&self) -> Result<Vec<DeviceTwin>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {DEVICE_COLUMNS} FROM device"
        )))
        .fetch_all(&self.pool)
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
            .fetch(&self.pool);
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
        Ok(twins.into_values().collect())
    }

    /// The highest outbox sequence number in use.
    pub async fn max_outbox_seq(&self) -> Result<u64> {
        let v: Option<i64> = sqlx::query_scalar("SELECT MAX(seq) FROM outbox")
            .fetch_one(&self.pool)
            .await?;
        Ok(v.map(u).unwrap_or(0))
    }

    /// Writes the changes of a batch of operations in one transaction.
    pub async fn apply(&self, batch: &[&Applied]) -> Result<()> {
        let mut purge: Vec<String> = Vec::new();
        let mut rows: HashMap<String, Option<&DeviceRow>> = HashMap::new();
        let mut props: HashMap<(String, &str), Option<&PropertyTwin>> = HashMap::new();
        let mut outbox: HashMap<(String, &str, Section), &OutboxEntry> = HashMap::new();
        for a in batch {
            let Some(id) = &a.device else { continue };
            let key = id.to_string();
            if a.removed {
                props.retain(|(d, _), _| d != &key);
                outbox.retain(|(d, _, _), _| d != &key);
                rows.insert(key.clone(), None);
                purge.push(key);
                continue;
            }
            if let Some(row) = &a.row {
                rows.insert(key.clone(), Some(row));
            }
            for c in &a.changes {
                props.insert((key.clone(), c.name.as_str()), c.current.as_ref());
            }
            for o in &a.outbox {
                outbox.insert((key.clone(), o.property.as_str(), o.section), o);
            }
        }
        if purge.is_empty() && rows.is_empty() && props.is_empty() && outbox.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        for id in &purge {
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
        let upserts: Vec<(&String, &DeviceRow)> =
            rows.iter().filter_map(|(k, v)| v.map(|r| (k, r))).collect();
        for chunk in statement_chunks(&upserts) {
            let sql = replace_sql("device", DEVICE_COLUMNS, DEVICE_PARAMS, chunk.len());
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
                    .bind(i(r.reported_version));
            }
            q.execute(&mut *tx).await?;
        }
        let mut deletes = Vec::new();
        let mut twin_rows = Vec::new();
        for ((d, name), p) in &props {
            match p {
                Some(p) => twin_rows.push((d, *name, *p)),
                None => deletes.push((d, *name)),
            }
        }
        for (d, name) in deletes {
            sqlx::query("DELETE FROM twin WHERE device_id = ? AND name = ?")
                .bind(d.as_str())
                .bind(name)
                .execute(&mut *tx)
                .await?;
        }
        for chunk in statement_chunks(&twin_rows) {
            let sql = replace_sql("twin", TWIN_COLUMNS, TWIN_PARAMS, chunk.len());
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for (d, name, p) in chunk {
                q = q
                    .bind(d.as_str())
                    .bind(*name)
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
                    .bind(p.observed_desired.as_ref().map(|v| v.timestamp));
            }
            q.execute(&mut *tx).await?;
        }
        let entries: Vec<(&String, &&OutboxEntry)> =
            outbox.iter().map(|((d, _, _), o)| (d, o)).collect();
        for chunk in statement_chunks(&entries) {
            let sql = replace_sql("outbox", OUTBOX_COLUMNS, OUTBOX_PARAMS, chunk.len());
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
        }
        commit(tx).await
    }

    /// The oldest `limit` changes not yet acknowledged by the cloud.
    pub async fn outbox(&self, limit: usize) -> Result<Vec<OutboxEntry>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {OUTBOX_COLUMNS} FROM outbox ORDER BY seq LIMIT ?"
        )))
        .bind(i(limit as u64))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(outbox_from_row).collect()
    }

    /// How many changes wait for the cloud.
    pub async fn outbox_len(&self) -> Result<u64> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox")
            .fetch_one(&self.pool)
            .await?;
        Ok(u(n))
    }

    /// Removes acknowledged entries. An entry replaced by a newer change since it was sent (a
    /// higher `seq`) stays. Returns how many were removed.
    pub async fn ack(&self, entries: &[OutboxEntry]) -> Result<u64> {
        let mut tx = self.pool.begin().await?;
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
        commit(tx).await?;
        Ok(removed)
    }

    /// Stores an object (a Device, a DeviceModel, a mapper registration) under `key`.
    pub async fn put_meta(&self, key: &str, kind: &str, value: &str) -> Result<()> {
        sqlx::query("INSERT OR REPLACE INTO meta (key, kind, value) VALUES (?, ?, ?)")
            .bind(key)
            .bind(kind)
            .bind(value)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Removes the object under `key`.
    pub async fn delete_meta(&self, key: &str) -> Result<()> {
        sqlx::query("DELETE FROM meta WHERE key = ?")
            .bind(key)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Every object of `kind`, as `(key, value)`.
    pub async fn list_meta(&self, kind: &str) -> Result<Vec<(String, String)>> {
        let rows = sqlx::query("SELECT key, value FROM meta WHERE kind = ? ORDER BY key")
            .bind(kind)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    /// Closes the connections, checkpointing the WAL.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

async fn commit(tx: Transaction<'_, Sqlite>) -> Result<()> {
    tx.commit().await?;
    Ok(())
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
