//! The MySQL sink (feature `mysql`): as KubeEdge's mapper, one table per property, created when missing.

use super::*;
use sqlx::Connection;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use std::collections::BTreeMap;
use std::collections::HashSet;

pub(super) struct Sink {
    options: MySqlConnectOptions,
    connection: Option<MySqlConnection>,
    /// Tables known to exist.
    tables: HashSet<String>,
    addr: String,
}

/// A MySQL identifier in backticks.
fn quoted(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

impl Sink {
    pub(super) fn new(addr: &str, database: &str, user: &str) -> Self {
        let (host, port) = match addr.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse::<u16>().unwrap_or(3306)),
            None => (addr.to_string(), 3306),
        };
        let mut options = MySqlConnectOptions::new()
            .host(&host)
            .port(port)
            .username(user)
            .database(database);
        if let Ok(p) = std::env::var("PASSWORD") {
            options = options.password(&p);
        }
        Self {
            options,
            connection: None,
            tables: HashSet::new(),
            addr: addr.to_string(),
        }
    }

    async fn try_write(&mut self, batch: &[Message]) -> Result<(), sqlx::Error> {
        if self.connection.is_none() {
            let mut c = MySqlConnection::connect_with(&self.options).await?;
            sqlx::query("SET time_zone = '+00:00'")
                .execute(&mut c)
                .await?;
            self.connection = Some(c);
        }
        let Some(c) = self.connection.as_mut() else {
            return Err(sqlx::Error::PoolClosed);
        };
        let mut by_table: BTreeMap<String, Vec<&Message>> = BTreeMap::new();
        for m in batch {
            by_table
                .entry(format!("{}/{}/{}", m.namespace, m.device, m.property))
                .or_default()
                .push(m);
        }
        for (table, rows) in by_table {
            let name = quoted(&table);
            if !self.tables.contains(&table) {
                let sql = format!(
                    "CREATE TABLE IF NOT EXISTS {name} (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, ts DATETIME(3) NOT NULL, field TEXT)"
                );
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .execute(&mut *c)
                    .await?;
                self.tables.insert(table.clone());
            }
            let values = vec!["(FROM_UNIXTIME(? / 1000), ?)"; rows.len()].join(", ");
            let sql = format!("INSERT INTO {name} (ts, field) VALUES {values}");
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for m in rows {
                q = q.bind(m.timestamp as i64).bind(m.value.as_str());
            }
            q.execute(&mut *c).await?;
        }
        Ok(())
    }
}

impl super::Sink for Sink {
    async fn write(&mut self, batch: &[Message]) -> Result<(), PushError> {
        self.try_write(batch).await.map_err(|e| {
            // A broken connection is made again; a table that was dropped is created again.
            self.connection = None;
            self.tables.clear();
            PushError::target(format_args!("mysql {}", self.addr), e)
        })
    }
}
