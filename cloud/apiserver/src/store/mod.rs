//! The object store: every object in memory as its JSON bytes (what lists and watches send),
//! and durable in SQLite. One writer task applies mutations in batches: it checks each against the
//! committed state plus the batch so far, gives it the next resourceVersion, commits the whole
//! batch in one transaction, and only then answers, updates the readers' view and tells watchers.
//! Readers never see a write that is not durable; a failed commit answers every write of its batch
//! with an error and changes nothing.
//!
//! Watch history: the events of the last `history` writes are kept in memory and in the database
//! (so a watch resumes across a restart). A watch from a version older than the kept history is
//! answered `410 Gone`, as etcd's compaction makes a kube-apiserver do.
//!
//! Or the same view over etcd (`etcd`): several API servers share one etcd cluster, each keeps
//! the objects in memory from etcd's watch, and writes go to etcd as transactions.

use crate::status::Status;
use api::packed::Packed;
use futures_util::TryStreamExt;
use serde_json::Value;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, Row, SqliteConnection};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, oneshot};

mod client;
mod etcd;
mod stored;
mod writer;

use writer::Writer;

/// Where the store's etcd is and how it is used (`modules.apiserver.etcd` in cloudcore's
/// config).
#[derive(Debug, Clone, PartialEq)]
pub struct EtcdOptions {
    /// Client URLs of the members (`http://10.0.0.1:2379`).
    pub endpoints: Vec<String>,
    /// The keys' prefix: several independent fleets can share an etcd cluster.
    pub prefix: String,
    /// How often etcd's history is compacted (to where it was one period before).
    pub compact_every: Duration,
    /// TLS to etcd (`https://` endpoints): the CA that signed etcd's certificates, and this
    /// client's certificate and key for etcd's `--client-cert-auth`, as PEM text.
    pub tls: Option<EtcdTls>,
}

/// The PEM texts of TLS to etcd.
#[derive(Clone, PartialEq)]
pub struct EtcdTls {
    pub ca: String,
    pub cert: Option<String>,
    pub key: Option<String>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("client_certificate", &self.cert.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "/cloudcore/".into(),
            compact_every: Duration::from_secs(300),
            tls: None,
        }
    }
}

/// A stored object: its serialized JSON and what selectors and controllers look at.
#[derive(Debug)]
pub struct Obj {
    pub rv: u64,
    /// Its JSON, compressed when large: read it with [`Obj::json`].
    body: Packed,
    pub labels: Vec<(String, String)>,
    pub uid: String,
    /// `apiVersion` as stored: lists send the stored bytes as they are when it is the one asked for.
    pub api_version: String,
    /// `metadata.namespace`'s deletion or the object's: `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Uids of its owners (`metadata.ownerReferences`), for garbage collection.
    pub owners: Vec<String>,
}

impl Obj {
    pub fn from_value(v: &Value, rv: u64) -> Self {
        let meta = &v["metadata"];
        let labels = meta["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        let owners = meta["ownerReferences"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|o| o["uid"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            rv,
            body: Packed::new(&serde_json::to_vec(v).unwrap_or_default()),
            labels,
            uid: meta["uid"].as_str().unwrap_or_default().to_string(),
            api_version: v["apiVersion"].as_str().unwrap_or_default().to_string(),
            deleting: meta["deletionTimestamp"].is_string(),
            owners,
        }
    }

    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.json()).unwrap_or(Value::Null)
    }

    /// The object's JSON text.
    pub fn json(&self) -> Cow<'_, [u8]> {
        self.body.bytes()
    }

    /// The length of its JSON text.
    pub fn json_len(&self) -> usize {
        self.body.len()
    }

    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }
}

/// Where an object lives: resource (`devices.devices.kubeedge.io`, `configmaps`), namespace
/// (empty for cluster-scoped), name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub res: Arc<str>,
    pub ns: String,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }

    fn code(self) -> i64 {
        match self {
            Self::Added => 0,
            Self::Modified => 1,
            Self::Deleted => 2,
        }
    }

    fn from_code(c: i64) -> Self {
        match c {
            0 => Self::Added,
            1 => Self::Modified,
            _ => Self::Deleted,
        }
    }
}

/// One committed change, as watchers see it.
#[derive(Debug, Clone)]
pub struct Event {
    pub rv: u64,
    pub key: Key,
    pub kind: EventType,
    pub obj: Arc<Obj>,
    /// The object before this change (live events only), for selectors to see an object
    /// start or stop matching.
    pub prev: Option<Arc<Obj>>,
}

/// What a mutation decided.
pub enum Outcome {
    /// Store this object (create or update).
    Put(Value),
    /// Remove the object; the value is its last state, sent to watchers.
    Delete(Value),
    /// Nothing changes; the value is what the request answers.
    Unchanged(Value),
}

/// The function a mutation runs in the writer, given the current object.
///
/// On etcd it may run more than once: again on the newer object when another server changed it
/// first.
pub(crate) type MutateFn = Box<dyn FnMut(Option<Value>, u64) -> Result<Outcome, Status> + Send>;

/// What a committed mutation answers.
#[derive(Debug, Clone)]
pub struct Done {
    pub value: Value,
    pub deleted: bool,
    /// The write made the object (there was none before).
    pub created: bool,
}

struct Mutation {
    key: Key,
    f: MutateFn,
    dry_run: bool,
    reply: oneshot::Sender<Result<Done, Status>>,
}

/// The objects of one resource, by namespace and name.
pub(crate) type Objects = BTreeMap<(String, String), Arc<Obj>>;

/// The committed state that readers see.
pub struct Tables {
    pub rv: u64,
    pub objects: HashMap<Arc<str>, Objects>,
    history: VecDeque<Event>,
    /// Events with a resourceVersion above this are all in `history`.
    pub compacted: u64,
}

impl Tables {
    /// A copy holding only the objects of the resources `keys` (their store keys), no history.
    pub(crate) fn only(&self, keys: &[&str]) -> Tables {
        Tables {
            rv: self.rv,
            objects: (self.objects.iter())
                .filter(|(k, _)| keys.contains(&k.as_ref()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            history: VecDeque::new(),
            compacted: self.compacted,
        }
    }

    pub fn get(&self, key: &Key) -> Option<&Arc<Obj>> {
        self.objects
            .get(&key.res)
            .and_then(|m| m.get(&(key.ns.clone(), key.name.clone())))
    }

    /// Brings the objects and the history to the end of `events` (committed, in order).
    fn apply(&mut self, rv: u64, events: &[Event]) {
        self.rv = rv;
        for e in events {
            let map = self.objects.entry(e.key.res.clone()).or_default();
            let k = (e.key.ns.clone(), e.key.name.clone());
            if e.kind == EventType::Deleted {
                map.remove(&k);
            } else {
                map.insert(k, e.obj.clone());
            }
        }
        self.history.extend(events.iter().map(|e| Event {
            prev: None,
            ..e.clone()
        }));
    }

    /// Where the history is cut for it to keep `keep` events once `incoming` are added.
    fn compact_point(&self, incoming: &[Event], keep: usize) -> Option<u64> {
        let kept = self.history.len() + incoming.len();
        let drop = kept.saturating_sub(keep);
        if drop == 0 {
            None
        } else if drop <= self.history.len() {
            Some(self.history[drop - 1].rv)
        } else {
            Some(incoming[drop - self.history.len() - 1].rv)
        }
    }

    /// Forgets the events up to `rv`.
    fn trim(&mut self, rv: u64) {
        while self.history.front().is_some_and(|e| e.rv <= rv) {
            self.history.pop_front();
        }
        self.compacted = self.compacted.max(rv);
    }

    /// Events after `rv` (and those at `rv` when it changed several objects), or `None` when
    /// some of them are no longer kept.
    pub fn events_since(&self, rv: u64) -> Option<Vec<Event>> {
        if rv < self.compacted {
            return None;
        }
        let mut start = self.history.partition_point(|e| e.rv <= rv);
        // A revision of several objects (a grouped write on etcd): a client resuming from it
        // may have had only some of its events (its stream broke between them), so all of
        // them are sent again; a client that had them gets the same objects twice.
        let at = self.history.partition_point(|e| e.rv < rv);
        if start - at > 1 {
            start = at;
        }
        Some(self.history.range(start..).cloned().collect())
    }
}

#[derive(Clone)]
pub struct Store {
    tables: Arc<RwLock<Tables>>,
    backend: Backend,
    events: Feed,
}

#[derive(Clone)]
enum Backend {
    Sqlite(mpsc::Sender<Mutation>),
    Etcd(Arc<etcd::EtcdStore>),
}

/// The committed changes, to every watcher. When the view is loaded again from scratch (etcd
/// compacted past what it had seen) the feed is replaced: the watchers see it close and resume,
/// or relist on `410 Gone`.
#[derive(Clone)]
pub(crate) struct Feed(Arc<RwLock<broadcast::Sender<Arc<Vec<Event>>>>>);

impl Feed {
    fn new() -> Self {
        Self(Arc::new(RwLock::new(broadcast::channel(1024).0)))
    }

    fn subscribe(&self) -> broadcast::Receiver<Arc<Vec<Event>>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).subscribe()
    }

    fn send(&self, batch: Vec<Event>) {
        let _ = self
            .0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .send(Arc::new(batch));
    }

    fn reset(&self) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = broadcast::channel(1024).0;
    }
}

/// Store settings.
#[derive(Debug, Clone)]
pub(crate) struct StoreOptions {
    /// Events kept for watches to resume from.
    pub history: usize,
    /// `full`: fsync at every commit (survives power loss); otherwise WAL `normal` (survives a
    /// killed process).
    pub fsync: bool,
    /// etcd instead of the SQLite file.
    pub etcd: Option<EtcdOptions>,
}

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    #[error("no etcd endpoints given")]
    NoEndpoints,
    #[error("etcd endpoint {endpoint}: {why}")]
    Endpoint { endpoint: String, why: String },
    #[error("cannot read the objects from etcd ({endpoints}): {source}")]
    Load {
        endpoints: String,
        #[source]
        source: client::EtcdError,
    },
    #[error("cannot open {}: {source}", path.display())]
    Sqlite {
        path: std::path::PathBuf,
        #[source]
        source: sqlx::Error,
    },
    #[error("{}: stored object {res} is not JSON: {source}", path.display())]
    NotJson {
        path: std::path::PathBuf,
        res: String,
        #[source]
        source: serde_json::Error,
    },
}

/// What can go wrong reading the SQLite file, before its path is added.
enum SqliteLoad {
    Sql(sqlx::Error),
    NotJson(String, serde_json::Error),
}

impl From<sqlx::Error> for SqliteLoad {
    fn from(e: sqlx::Error) -> Self {
        Self::Sql(e)
    }
}

impl Store {
    pub(crate) async fn open(path: &Path, opts: StoreOptions) -> Result<Self, OpenError> {
        if let Some(e) = &opts.etcd {
            let events = Feed::new();
            let (tables, backend) = etcd::EtcdStore::open(e, opts.history, events.clone()).await?;
            return Ok(Self {
                tables,
                backend: Backend::Etcd(backend),
                events,
            });
        }
        Self::open_sqlite(path, opts).await.map_err(|e| match e {
            SqliteLoad::Sql(source) => OpenError::Sqlite {
                path: path.to_path_buf(),
                source,
            },
            SqliteLoad::NotJson(res, source) => OpenError::NotJson {
                path: path.to_path_buf(),
                res,
                source,
            },
        })
    }

    async fn open_sqlite(path: &Path, opts: StoreOptions) -> Result<Self, SqliteLoad> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(if opts.fsync {
                SqliteSynchronous::Full
            } else {
                SqliteSynchronous::Normal
            })
            .busy_timeout(Duration::from_secs(5));
        let mut conn = options.connect().await?;
        for stmt in [
            "CREATE TABLE IF NOT EXISTS objects (res TEXT NOT NULL, ns TEXT NOT NULL, name TEXT NOT NULL, rv INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (res, ns, name)) WITHOUT ROWID",
            "CREATE TABLE IF NOT EXISTS events (rv INTEGER PRIMARY KEY, res TEXT NOT NULL, ns TEXT NOT NULL, name TEXT NOT NULL, type INTEGER NOT NULL, body BLOB NOT NULL)",
            "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL)",
        ] {
            sqlx::query(stmt).execute(&mut conn).await?;
        }
        let meta = |k: &'static str| sqlx::query("SELECT v FROM meta WHERE k = ?").bind(k);
        let rv: i64 = match meta("rv").fetch_optional(&mut conn).await? {
            Some(r) => r.try_get(0)?,
            None => 0,
        };
        let compacted: i64 = match meta("compacted").fetch_optional(&mut conn).await? {
            Some(r) => r.try_get(0)?,
            None => 0,
        };
        let mut objects: HashMap<Arc<str>, Objects> = HashMap::new();
        let mut names: HashMap<String, Arc<str>> = HashMap::new();
        // Row by row: a site's objects are not held twice (rows and parsed) while loading.
        {
            let mut rows =
                sqlx::query("SELECT res, ns, name, rv, body FROM objects").fetch(&mut conn);
            while let Some(r) = rows.try_next().await? {
                let res: String = r.try_get(0)?;
                let res = names
                    .entry(res.clone())
                    .or_insert_with(|| Arc::from(res.as_str()))
                    .clone();
                let body: Vec<u8> = r.try_get(4)?;
                let v: Value = serde_json::from_slice(&body)
                    .map_err(|e| SqliteLoad::NotJson(res.to_string(), e))?;
                let orv: i64 = r.try_get(3)?;
                objects.entry(res).or_default().insert(
                    (r.try_get(1)?, r.try_get(2)?),
                    Arc::new(Obj::from_value(&v, orv as u64)),
                );
            }
        }
        let mut history = VecDeque::new();
        {
            let mut rows =
                sqlx::query("SELECT rv, res, ns, name, type, body FROM events ORDER BY rv")
                    .fetch(&mut conn);
            while let Some(r) = rows.try_next().await? {
                let res: String = r.try_get(1)?;
                let res = names
                    .entry(res.clone())
                    .or_insert_with(|| Arc::from(res.as_str()))
                    .clone();
                let erv = r.try_get::<i64, _>(0)? as u64;
                let (ns, name): (String, String) = (r.try_get(2)?, r.try_get(3)?);
                let kind = EventType::from_code(r.try_get(4)?);
                // The latest event of a live object shares the stored object (not a second copy).
                let current = objects
                    .get(&res)
                    .and_then(|m| m.get(&(ns.clone(), name.clone())))
                    .filter(|o| o.rv == erv && kind != EventType::Deleted)
                    .cloned();
                let obj = match current {
                    Some(o) => o,
                    None => {
                        let body: Vec<u8> = r.try_get(5)?;
                        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        Arc::new(Obj::from_value(&v, erv))
                    }
                };
                history.push_back(Event {
                    rv: erv,
                    key: Key { res, ns, name },
                    kind,
                    obj,
                    prev: None,
                });
            }
        }
        let tables = Arc::new(RwLock::new(Tables {
            rv: rv as u64,
            objects,
            history,
            compacted: compacted as u64,
        }));
        let (tx, rx) = mpsc::channel(4096);
        let events = Feed::new();
        let writer = Writer {
            conn,
            opts: options,
            tables: tables.clone(),
            events: events.clone(),
            history: opts.history.max(100),
        };
        tokio::spawn(writer.run(rx));
        Ok(Self {
            tables,
            backend: Backend::Sqlite(tx),
            events,
        })
    }

    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, Tables> {
        self.tables.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Vec<Event>>> {
        self.events.subscribe()
    }

    /// The events of resource `res` after `rv` that the view no longer keeps in memory, up to
    /// where it is: from etcd's own history when it still has them. `Err` with the oldest
    /// version that can be resumed from when they are gone (`410 Gone`).
    pub async fn replay(&self, res: &Arc<str>, rv: u64) -> Result<(Vec<Event>, u64), u64> {
        match &self.backend {
            Backend::Sqlite(_) => Err(self.read().compacted),
            Backend::Etcd(e) => e.replay(res, rv).await,
        }
    }

    /// Before a read of the latest objects (a get or list without `resourceVersion`): on etcd,
    /// waits for the view to hold what etcd had committed, so that a write made through another
    /// server is seen. On SQLite the view is always current.
    pub async fn fresh(&self) {
        if let Backend::Etcd(e) = &self.backend {
            e.fresh().await;
        }
    }

    /// Before this server reads `resources` from its view to decide a request: on etcd, waits
    /// for the view to hold every write of them this server answered (a write is answered on
    /// etcd's commit, which the view follows). On SQLite the view is always current.
    pub async fn own_writes(&self, resources: &[&str]) {
        if let Backend::Etcd(e) = &self.backend {
            e.own_writes(resources).await;
        }
    }

    /// Whether the objects live in etcd (shared with other servers).
    pub fn shared(&self) -> bool {
        matches!(self.backend, Backend::Etcd(_))
    }

    /// On etcd, the value kept aside under `name`: outside the objects, served by no request
    /// (`None` on SQLite, which no other server shares).
    pub(crate) async fn aside(&self, name: &str) -> Result<Option<Vec<u8>>, client::EtcdError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(None),
            Backend::Etcd(e) => e.aside(name).await,
        }
    }

    /// On etcd, keeps `value` aside under `name` unless there is one: the value kept and
    /// whether it is `value` (on SQLite: `value`, kept nowhere).
    pub(crate) async fn aside_first(
        &self,
        name: &str,
        value: Vec<u8>,
    ) -> Result<(Vec<u8>, bool), client::EtcdError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok((value, true)),
            Backend::Etcd(e) => e.aside_first(name, value).await,
        }
    }

    /// Runs `f` in the writer on the current object at `key`, and answers once it is durable.
    pub async fn mutate(&self, key: Key, dry_run: bool, f: MutateFn) -> Result<Done, Status> {
        let tx = match &self.backend {
            Backend::Sqlite(tx) => tx,
            Backend::Etcd(e) => return e.mutate(&self.tables, key, dry_run, f).await,
        };
        let (reply, rx) = oneshot::channel();
        tx.send(Mutation {
            key,
            f,
            dry_run,
            reply,
        })
        .await
        .map_err(|_| Status::unavailable("the store is shutting down"))?;
        rx.await
            .map_err(|_| Status::internal("the store's writer stopped"))?
    }
}
