//! The store's one writer on SQLite: mutations taken in batches, each checked against the
//! committed state plus the batch so far, committed in one transaction, then answered and
//! published to the readers' view and the watchers.

use super::*;

/// The writer task's state.
pub(super) struct Writer {
    pub(super) conn: SqliteConnection,
    pub(super) opts: SqliteConnectOptions,
    pub(super) tables: Arc<RwLock<Tables>>,
    pub(super) events: Feed,
    pub(super) history: usize,
}

/// Writes taken in one transaction at most.
const BATCH: usize = 512;

impl Writer {
    pub(super) async fn run(mut self, mut rx: mpsc::Receiver<Mutation>) {
        let mut batch = Vec::with_capacity(BATCH);
        while rx.recv_many(&mut batch, BATCH).await > 0 {
            self.apply(std::mem::take(&mut batch)).await;
        }
        let _ = self.conn.close().await;
    }

    async fn apply(&mut self, batch: Vec<Mutation>) {
        let mut rv = self.read().rv;
        let mut overlay: HashMap<Key, Option<Arc<Obj>>> = HashMap::new();
        let mut events: Vec<Event> = Vec::new();
        let mut waiting: Vec<(oneshot::Sender<Result<Done, Status>>, Done)> = Vec::new();
        for m in batch {
            let current = match overlay.get(&m.key) {
                Some(o) => o.clone(),
                None => self.read().get(&m.key).cloned(),
            };
            let next_rv = rv + 1;
            let old = current.as_ref().map(|o| o.value());
            // A bug in a mutation must not take the writer (and every later write) down.
            let mut f = m.f;
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                f(old, next_rv)
            }))
            .unwrap_or_else(|_| {
                tracing::error!(key = ?m.key, "a write failed with a panic; it was refused");
                Err(Status::internal(
                    "the write failed inside the server; nothing was changed",
                ))
            });
            let (kind, mut value) = match out {
                Err(e) => {
                    let _ = m.reply.send(Err(e));
                    continue;
                }
                Ok(Outcome::Unchanged(v)) => {
                    let _ = m.reply.send(Ok(Done {
                        value: v,
                        deleted: false,
                        created: false,
                    }));
                    continue;
                }
                Ok(Outcome::Put(v)) => (
                    if current.is_some() {
                        EventType::Modified
                    } else {
                        EventType::Added
                    },
                    v,
                ),
                Ok(Outcome::Delete(v)) => (EventType::Deleted, v),
            };
            if m.dry_run {
                let _ = m.reply.send(Ok(Done {
                    value,
                    deleted: kind == EventType::Deleted,
                    created: kind == EventType::Added,
                }));
                continue;
            }
            rv = next_rv;
            if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
            }
            let obj = Arc::new(Obj::from_value(&value, rv));
            overlay.insert(
                m.key.clone(),
                (kind != EventType::Deleted).then(|| obj.clone()),
            );
            events.push(Event {
                rv,
                key: m.key,
                kind,
                obj,
                prev: current,
            });
            waiting.push((
                m.reply,
                Done {
                    value,
                    deleted: kind == EventType::Deleted,
                    created: kind == EventType::Added,
                },
            ));
        }
        if events.is_empty() {
            return;
        }
        let compact_to = self.read().compact_point(&events, self.history);
        match self.commit(&events, rv, compact_to).await {
            Ok(()) => {
                {
                    let mut t = self.tables.write().unwrap_or_else(|e| e.into_inner());
                    t.apply(rv, &events);
                    if let Some(c) = compact_to {
                        t.trim(c);
                    }
                }
                self.events.send(events);
                for (reply, done) in waiting {
                    let _ = reply.send(Ok(done));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "the store could not commit a batch; its writes are refused");
                // A failed commit can leave the connection in a transaction of its own: start
                // over on a fresh one (what the twin store learned on a full disk).
                match self.opts.connect().await {
                    Ok(c) => {
                        let old = std::mem::replace(&mut self.conn, c);
                        let _ = old.close().await;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "the store could not reopen its database")
                    }
                }
                for (reply, _) in waiting {
                    let _ = reply.send(Err(Status::internal(format!(
                        "storage error, nothing was changed: {e}"
                    ))));
                }
            }
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Tables> {
        self.tables.read().unwrap_or_else(|e| e.into_inner())
    }

    async fn commit(
        &mut self,
        events: &[Event],
        rv: u64,
        compact_to: Option<u64>,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.conn.begin().await?;
        for e in events {
            let json = e.obj.json();
            if e.kind == EventType::Deleted {
                sqlx::query("DELETE FROM objects WHERE res = ? AND ns = ? AND name = ?")
                    .bind(&*e.key.res)
                    .bind(&e.key.ns)
                    .bind(&e.key.name)
                    .execute(&mut *tx)
                    .await?;
            } else {
                sqlx::query("INSERT OR REPLACE INTO objects (res, ns, name, rv, body) VALUES (?, ?, ?, ?, ?)")
                    .bind(&*e.key.res)
                    .bind(&e.key.ns)
                    .bind(&e.key.name)
                    .bind(e.rv as i64)
                    .bind(&json[..])
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query(
                "INSERT INTO events (rv, res, ns, name, type, body) VALUES (?, ?, ?, ?, ?, ?)",
            )
            .bind(e.rv as i64)
            .bind(&*e.key.res)
            .bind(&e.key.ns)
            .bind(&e.key.name)
            .bind(e.kind.code())
            .bind(&json[..])
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("INSERT OR REPLACE INTO meta (k, v) VALUES ('rv', ?)")
            .bind(rv as i64)
            .execute(&mut *tx)
            .await?;
        if let Some(c) = compact_to {
            sqlx::query("DELETE FROM events WHERE rv <= ?")
                .bind(c as i64)
                .execute(&mut *tx)
                .await?;
            sqlx::query("INSERT OR REPLACE INTO meta (k, v) VALUES ('compacted', ?)")
                .bind(c as i64)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await
    }
}
