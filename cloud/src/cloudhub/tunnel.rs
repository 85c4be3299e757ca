//! The cloud's end of the streaming tunnels ([`api::tunnel`]): each node's open tunnel, the
//! streams open on it, and [`Tunnels::open`], what `pods/log` uses to read a log from its node.
//!
//! A stream's frames wait for its reader in a queue of their own, bounded by the credit the
//! node was given: a node that sends beyond it has the stream closed (it cannot fill the
//! cloud's memory), a slow reader slows only its own stream (credit is given back as its
//! reader takes the bytes), and a reader that goes away closes the stream on the node.

use api::tunnel::{Frame, Kind, Open, Outcome, WINDOW};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

/// Frames of one stream that may wait for its reader: a node within its credit sends fewer.
const QUEUED: usize = 1024;

/// Where a stream's frames from the node go, the credit it gave for what the cloud sends, and
/// who opened it.
type Route = (mpsc::Sender<Frame>, Arc<Semaphore>, Arc<str>);

/// One node's open tunnel.
pub(crate) struct Tunnel {
    pub(crate) id: u64,
    /// To the node (the tunnel's writer).
    tx: mpsc::Sender<Frame>,
    /// The streams open on it: where each one's frames go, and the credit the node gave for
    /// what the cloud sends on it.
    streams: Mutex<HashMap<u32, Route>>,
    next: AtomicU32,
    /// Ends the tunnel (a newer one of the same node replaces it).
    pub(crate) end: CancellationToken,
    /// Told whenever a stream ends: a place is free for a port-forward connection that waits.
    freed: tokio::sync::Notify,
    /// Opens waiting for a place ([`Tunnels::open_waiting`]).
    waiting: AtomicUsize,
}

impl Tunnel {
    /// Forgets stream `id` (under the lock `streams`), and tells whoever waits for a place.
    fn forget(&self, streams: &mut HashMap<u32, Route>, id: u32) {
        if streams.remove(&id).is_some() {
            self.freed.notify_waiters();
        }
    }
}

/// Every node's tunnel, on this replica.
pub(crate) struct Tunnels {
    by_node: Mutex<HashMap<String, Arc<Tunnel>>>,
    next_id: AtomicU64,
    /// Streams open at once per node.
    pub per_node: usize,
    /// Streams one user may hold at once on one node: half of `per_node`, so that one user's
    /// streams (sixteen `kubectl logs -f`) never lock everybody else out of a node.
    pub per_user: usize,
    /// A stream that carries nothing either way for this long is closed.
    pub idle: std::time::Duration,
    /// Streams closed because their node sent beyond its credit.
    pub overran: AtomicU64,
    /// Streams opened.
    pub opened: AtomicU64,
}

/// How many opens may wait at once for a place on one node ([`Tunnels::open_waiting`]).
pub(crate) const WAITING: usize = 256;

/// One open waiting for a place on a tunnel, counted while it waits.
struct Waiting(Arc<Tunnel>);

impl Waiting {
    /// Counted among the tunnel's waiting opens, unless [`WAITING`] already wait.
    fn join(tunnel: &Arc<Tunnel>) -> Option<Self> {
        let n = tunnel.waiting.fetch_add(1, Ordering::SeqCst);
        if n >= WAITING {
            tunnel.waiting.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Self(tunnel.clone()))
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why a stream could not be opened.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotOpened {
    #[error(
        "node {0} has no streaming tunnel to this cloudcore (it is away, connected to another replica, or runs with cloud.streams.enable: false)"
    )]
    NoTunnel(String),
    #[error("node {0} has {1} streams open (the most per node); try again when one ends")]
    TooMany(String, usize),
    #[error(
        "{0} has {2} streams open on node {1} (the most one user may hold on a node, half of its streams); end one first"
    )]
    TooManyOfUser(String, String, usize),
    #[error("node {0}'s tunnel closed")]
    Closed(String),
}

impl Tunnels {
    pub(crate) fn new(per_node: usize) -> Self {
        Self {
            by_node: Mutex::default(),
            next_id: AtomicU64::new(1),
            per_node,
            per_user: (per_node / 2).max(1),
            idle: std::time::Duration::from_secs(4 * 3600),
            overran: AtomicU64::new(0),
            opened: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Tunnel>>> {
        self.by_node.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A node's new tunnel, writing to `tx`; an older one of the node is ended.
    pub(crate) fn attach(&self, node: &str, tx: mpsc::Sender<Frame>) -> Arc<Tunnel> {
        let t = Arc::new(Tunnel {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            tx,
            streams: Mutex::default(),
            next: AtomicU32::new(1),
            end: CancellationToken::new(),
            freed: tokio::sync::Notify::new(),
            waiting: AtomicUsize::new(0),
        });
        if let Some(old) = self.lock().insert(node.to_string(), t.clone()) {
            old.end.cancel();
            // Opens waiting on the old tunnel try the new one.
            old.freed.notify_waiters();
        }
        t
    }

    /// The tunnel `id` of `node` ended: its streams end with it.
    pub(crate) fn detach(&self, node: &str, id: u64) {
        let mut map = self.lock();
        if map.get(node).is_some_and(|t| t.id == id)
            && let Some(gone) = map.remove(node)
        {
            // Opens waiting for a place on it learn that the node has no tunnel now.
            gone.freed.notify_waiters();
        }
    }

    /// The number of tunnels open.
    /// Whether `node` has a tunnel to this cloudcore now.
    pub(crate) fn has(&self, node: &str) -> bool {
        self.lock().contains_key(node)
    }

    pub(crate) fn count(&self) -> usize {
        self.lock().len()
    }

    /// The streams open on every tunnel.
    pub(crate) fn streams(&self) -> usize {
        self.lock()
            .values()
            .map(|t| t.streams.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    /// Adds the tunnels' figures to a scrape of `/metrics`.
    pub(crate) fn scrape(&self, o: &mut rt::metrics::Scrape) {
        o.gauge(
            "cloudhub_tunnels",
            "Nodes with a streaming tunnel open to this cloudcore.",
            self.count(),
        )
        .gauge(
            "cloudhub_streams",
            "Streams (kubectl logs, exec, attach) open through the tunnels.",
            self.streams(),
        )
        .counter(
            "cloudhub_streams_opened",
            "Streams opened through the tunnels.",
            self.opened.load(Ordering::Relaxed),
        )
        .counter(
            "cloudhub_streams_overran",
            "Streams closed because their node sent beyond the credit it was given.",
            self.overran.load(Ordering::Relaxed),
        );
    }

    /// Opens a stream on `node`'s tunnel for `user`.
    pub(crate) async fn open(
        &self,
        node: &str,
        what: &Open,
        user: &str,
    ) -> Result<Stream, NotOpened> {
        let tunnel = self
            .lock()
            .get(node)
            .cloned()
            .ok_or_else(|| NotOpened::NoTunnel(node.into()))?;
        let (tx, rx) = mpsc::channel(QUEUED);
        let credit = Arc::new(Semaphore::new(WINDOW as usize));
        let id = {
            let mut streams = tunnel.streams.lock().unwrap_or_else(|e| e.into_inner());
            let held = streams.values().filter(|r| &*r.2 == user).count();
            if held >= self.per_user {
                return Err(NotOpened::TooManyOfUser(
                    user.into(),
                    node.into(),
                    self.per_user,
                ));
            }
            if streams.len() >= self.per_node {
                return Err(NotOpened::TooMany(node.into(), self.per_node));
            }
            let mut id = tunnel.next.fetch_add(1, Ordering::Relaxed);
            while id == 0 || streams.contains_key(&id) {
                id = tunnel.next.fetch_add(1, Ordering::Relaxed);
            }
            streams.insert(id, (tx, credit.clone(), Arc::from(user)));
            id
        };
        let stream = Stream {
            node: node.to_string(),
            id,
            tunnel: tunnel.clone(),
            rx,
            credit,
            closed: false,
            idle: self.idle,
            active: Arc::new(Mutex::new(tokio::time::Instant::now())),
        };
        let open = Frame::new(id, Kind::Open, serde_json::to_vec(what).unwrap_or_default());
        if tunnel.tx.send(open).await.is_err() {
            return Err(NotOpened::Closed(node.into()));
        }
        self.opened.fetch_add(1, Ordering::Relaxed);
        Ok(stream)
    }

    /// [`Self::open`], waiting up to `patience` for a place when the node's streams, or the
    /// user's share of them, are all taken: each connection of one `kubectl port-forward` is a
    /// stream, and one refused ends kubectl's whole forward, so the 17th download waits for one
    /// of the first to end instead. At most [`WAITING`] opens wait at once on a node; beyond,
    /// and after `patience`, the refusal is said as [`Self::open`] says it.
    pub(crate) async fn open_waiting(
        &self,
        node: &str,
        what: &Open,
        user: &str,
        patience: std::time::Duration,
    ) -> Result<Stream, NotOpened> {
        let deadline = tokio::time::Instant::now() + patience;
        let mut waiting: Option<Waiting> = None;
        loop {
            let Some(tunnel) = self.lock().get(node).cloned() else {
                return Err(NotOpened::NoTunnel(node.into()));
            };
            // Registered before the attempt: a place freed between the two is not missed.
            let freed = tunnel.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match self.open(node, what, user).await {
                Err(e @ (NotOpened::TooMany(..) | NotOpened::TooManyOfUser(..))) => {
                    if waiting.is_none() {
                        waiting = Waiting::join(&tunnel);
                        if waiting.is_none() {
                            return Err(e);
                        }
                    }
                    if tokio::time::timeout_at(deadline, freed).await.is_err() {
                        return Err(e);
                    }
                }
                done => return done,
            }
        }
    }

    /// A frame from `node`'s tunnel, to the stream it belongs to. A stream whose reader is
    /// gone, or whose node sent beyond its credit, is closed on the node.
    pub(crate) fn deliver(&self, tunnel: &Tunnel, node: &str, frame: Frame) {
        let id = frame.stream;
        let last = frame.kind == Kind::Close;
        let mut streams = tunnel.streams.lock().unwrap_or_else(|e| e.into_inner());
        let Some((to, credit, _)) = streams.get(&id) else {
            return;
        };
        if frame.kind == Kind::Credit {
            // Never more than a few windows: a node that credits too much cannot overflow it.
            let n = api::tunnel::creditable(frame.credited(), credit.available_permits());
            credit.add_permits(n);
            return;
        }
        match to.try_send(frame) {
            Ok(()) if last => {
                tunnel.forget(&mut streams, id);
            }
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.overran.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%node, stream = id, "cloudhub: a node sent beyond its stream's credit; stream closed");
                tunnel.forget(&mut streams, id);
                let _ = tunnel.tx.try_send(Frame::close(id, None));
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tunnel.forget(&mut streams, id);
                let _ = tunnel.tx.try_send(Frame::close(id, None));
            }
        }
    }
}

/// Opens a stream on `node` for an API request, waiting up to `patience` for a place (none:
/// refused at once), and waits up to `wait` for the node to accept it: the stream, or the API's
/// answer saying why not (429 beyond the streams per node, 503 a node without a tunnel here,
/// 504 a node that did not answer, the node's own refusal).
pub(crate) async fn open_for_api(
    tunnels: &Tunnels,
    node: &str,
    what: &Open,
    user: &str,
    patience: std::time::Duration,
    wait: std::time::Duration,
) -> Result<Stream, (u16, String)> {
    let mut stream = match tunnels.open_waiting(node, what, user, patience).await {
        Ok(s) => s,
        Err(e @ (NotOpened::TooMany(..) | NotOpened::TooManyOfUser(..))) => {
            return Err((429, e.to_string()));
        }
        Err(e) => return Err((503, e.to_string())),
    };
    match tokio::time::timeout(wait, stream.next()).await {
        Err(_) => Err((
            504,
            format!("node {node} did not open the stream within {wait:?}"),
        )),
        Ok(Event::End(o)) => Err((if o.code >= 400 { o.code } else { 502 }, o.message)),
        Ok(Event::Ready | Event::Data(_)) => Ok(stream),
    }
}

/// What a stream brings: the node's acceptance, its bytes, its end.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Event {
    Ready,
    Data(Vec<u8>),
    /// The end, as the node said it (or the tunnel's end: 502).
    End(Outcome),
}

/// One stream on a node's tunnel; dropping it closes the stream on the node.
pub(crate) struct Stream {
    pub node: String,
    id: u32,
    tunnel: Arc<Tunnel>,
    rx: mpsc::Receiver<Frame>,
    /// What the node lets the cloud send.
    credit: Arc<Semaphore>,
    closed: bool,
    /// Closed once nothing went either way for this long.
    idle: std::time::Duration,
    /// When something last went either way.
    active: Arc<Mutex<tokio::time::Instant>>,
}

fn touch(active: &Mutex<tokio::time::Instant>) {
    *active.lock().unwrap_or_else(|e| e.into_inner()) = tokio::time::Instant::now();
}

/// The sending half of a [`Stream`] (what the cloud's client writes: a command's stdin).
#[derive(Clone)]
pub(crate) struct Sender {
    id: u32,
    tunnel: Arc<Tunnel>,
    credit: Arc<Semaphore>,
    active: Arc<Mutex<tokio::time::Instant>>,
}

impl Sender {
    /// Sends `bytes` to the node on this stream, as one frame, once the node's credit allows;
    /// false once the stream or its tunnel is closed.
    pub(crate) async fn send(&self, bytes: Vec<u8>) -> bool {
        let n = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        let granted = tokio::select! {
            _ = self.tunnel.end.cancelled() => return false,
            p = self.credit.acquire_many(n) => p,
        };
        match granted {
            Ok(p) => p.forget(),
            Err(_) => return false,
        }
        touch(&self.active);
        tokio::select! {
            _ = self.tunnel.end.cancelled() => false,
            r = self.tunnel.tx.send(Frame::new(self.id, Kind::Data, bytes)) => r.is_ok(),
        }
    }
}

impl Stream {
    pub(crate) fn sender(&self) -> Sender {
        Sender {
            id: self.id,
            tunnel: self.tunnel.clone(),
            credit: self.credit.clone(),
            active: self.active.clone(),
        }
    }

    /// The next event. Data is credited back to the node as it is taken.
    pub(crate) async fn next(&mut self) -> Event {
        loop {
            let since = *self.active.lock().unwrap_or_else(|e| e.into_inner());
            let frame = tokio::select! {
                f = self.rx.recv() => f,
                _ = self.tunnel.end.cancelled() => None,
                _ = tokio::time::sleep_until(since + self.idle) => {
                    if *self.active.lock().unwrap_or_else(|e| e.into_inner()) != since {
                        continue;
                    }
                    // Dropped with `closed` false, the stream is closed on the node too.
                    return Event::End(Outcome {
                        code: 408,
                        message: format!(
                            "the stream carried nothing for {:?} (streamIdleSeconds): closed",
                            self.idle
                        ),
                    });
                }
            };
            let Some(frame) = frame else {
                self.closed = true;
                return Event::End(Outcome {
                    code: 502,
                    message: format!("node {}'s streaming tunnel closed", self.node),
                });
            };
            match frame.kind {
                Kind::Ready => return Event::Ready,
                Kind::Data => {
                    touch(&self.active);
                    let n = u32::try_from(frame.payload.len()).unwrap_or(WINDOW);
                    if n > 0 {
                        let _ = self.tunnel.tx.send(Frame::credit(self.id, n)).await;
                    }
                    return Event::Data(frame.payload);
                }
                Kind::Close => {
                    self.closed = true;
                    let outcome = serde_json::from_slice(&frame.payload).unwrap_or(Outcome {
                        code: 200,
                        message: String::new(),
                    });
                    return Event::End(outcome);
                }
                Kind::Open | Kind::Credit => {}
            }
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let mut streams = self
            .tunnel
            .streams
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.tunnel.forget(&mut streams, self.id);
        drop(streams);
        if !self.closed {
            let _ = self.tunnel.tx.try_send(Frame::close(self.id, None));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::tunnel::LogRequest;

    fn log() -> Open {
        Open::Log(LogRequest::default())
    }

    #[tokio::test]
    async fn streams_are_bounded_per_node_credited_as_read_and_closed_when_dropped() {
        let tunnels = Tunnels::new(2);
        assert_eq!(
            tunnels.open("edge-1", &log(), "alice").await.err(),
            Some(NotOpened::NoTunnel("edge-1".into()))
        );
        let (tx, mut to_node) = mpsc::channel(16);
        let t = tunnels.attach("edge-1", tx);
        let mut a = tunnels.open("edge-1", &log(), "alice").await.expect("a");
        let b = tunnels.open("edge-1", &log(), "bob").await.expect("b");
        assert_eq!(
            tunnels.open("edge-1", &log(), "carol").await.err(),
            Some(NotOpened::TooMany("edge-1".into(), 2))
        );
        let open = to_node.recv().await.expect("open");
        assert_eq!(open.kind, Kind::Open);
        let _ = to_node.recv().await.expect("open b");
        tunnels.deliver(&t, "edge-1", Frame::new(open.stream, Kind::Ready, vec![]));
        tunnels.deliver(
            &t,
            "edge-1",
            Frame::new(open.stream, Kind::Data, b"hi".to_vec()),
        );
        // Another node's frames, or a stream not open, go nowhere.
        tunnels.deliver(&t, "edge-1", Frame::new(999, Kind::Data, b"x".to_vec()));
        assert_eq!(a.next().await, Event::Ready);
        assert_eq!(a.next().await, Event::Data(b"hi".to_vec()));
        let credit = to_node.recv().await.expect("credit");
        assert_eq!((credit.kind, credit.credited()), (Kind::Credit, 2));
        // Dropped by its reader: closed on the node, and a place is free again.
        let b_id = {
            let s = t.streams.lock().expect("lock");
            *s.keys().find(|k| **k != open.stream).expect("b")
        };
        drop(b);
        let close = to_node.recv().await.expect("close");
        assert_eq!((close.kind, close.stream), (Kind::Close, b_id));
        let _c = tunnels.open("edge-1", &log(), "bob").await.expect("c");
        // A node that sends beyond its credit has the stream closed.
        for _ in 0..QUEUED {
            tunnels.deliver(
                &t,
                "edge-1",
                Frame::new(open.stream, Kind::Data, b"x".to_vec()),
            );
        }
        tunnels.deliver(
            &t,
            "edge-1",
            Frame::new(open.stream, Kind::Data, b"x".to_vec()),
        );
        assert_eq!(tunnels.overran.load(Ordering::Relaxed), 1);
        // A newer tunnel ends the older one's streams.
        let (tx2, _to_node2) = mpsc::channel(16);
        let _t2 = tunnels.attach("edge-1", tx2);
        // (Frames still queued may come first or not: the end and the queue are raced.)
        loop {
            if let Event::End(o) = a.next().await {
                assert_eq!(o.code, 502, "{o:?}");
                break;
            }
        }
    }

    /// One viewer's sixteen `logs -f` locked everyone, the admin included, out of a node:
    /// a user holds at most half of a node's streams, so others always find a place.
    #[tokio::test]
    async fn one_user_holds_at_most_half_of_a_nodes_streams() {
        let tunnels = Tunnels::new(16);
        let (tx, _to_node) = mpsc::channel(64);
        let _t = tunnels.attach("edge-1", tx);
        let mut viewer = Vec::new();
        for _ in 0..8 {
            viewer.push(
                tunnels
                    .open("edge-1", &log(), "viewer")
                    .await
                    .expect("within the share"),
            );
        }
        assert_eq!(
            tunnels.open("edge-1", &log(), "viewer").await.err(),
            Some(NotOpened::TooManyOfUser(
                "viewer".into(),
                "edge-1".into(),
                8
            ))
        );
        let admin = tunnels.open("edge-1", &log(), "admin").await;
        assert!(admin.is_ok(), "another user still gets a stream");
        viewer.pop();
        assert!(tunnels.open("edge-1", &log(), "viewer").await.is_ok());
    }

    /// Twenty downloads through one `kubectl port-forward`: each connection beyond the user's
    /// share waits for a place instead of being refused (which ends kubectl's whole forward),
    /// and gets it when one ends; a wait past its patience is refused as before.
    #[tokio::test(start_paused = true)]
    async fn a_connection_beyond_the_share_waits_for_a_place_and_gets_it() {
        let tunnels = Arc::new(Tunnels::new(4));
        let (tx, _to_node) = mpsc::channel(64);
        let _t = tunnels.attach("edge-1", tx);
        let patience = std::time::Duration::from_secs(300);
        let a = tunnels.open("edge-1", &log(), "alice").await.expect("a");
        let b = tunnels.open("edge-1", &log(), "alice").await.expect("b");
        // Alice's third waits; bob, within his share, does not.
        let waiter = {
            let t = tunnels.clone();
            tokio::spawn(async move { t.open_waiting("edge-1", &log(), "alice", patience).await })
        };
        let bob = tunnels
            .open_waiting("edge-1", &log(), "bob", patience)
            .await;
        assert!(bob.is_ok(), "another user's is not held up");
        tokio::time::advance(std::time::Duration::from_secs(60)).await;
        assert!(
            !waiter.is_finished(),
            "still waiting for one of alice's to end"
        );
        drop(a);
        let c = waiter
            .await
            .expect("task")
            .expect("a place, once one ended");
        assert_eq!(c.node, "edge-1");
        // Nothing ends: refused after its patience, as a plain open is.
        let late = tunnels
            .open_waiting("edge-1", &log(), "alice", patience)
            .await;
        assert_eq!(
            late.err(),
            Some(NotOpened::TooManyOfUser("alice".into(), "edge-1".into(), 2))
        );
        drop((b, c));
    }

    /// The waiting opens are bounded per node: beyond, refused at once.
    #[tokio::test(start_paused = true)]
    async fn at_most_waiting_opens_wait_on_a_node() {
        let tunnels = Arc::new(Tunnels::new(2));
        let (tx, _to_node) = mpsc::channel(64);
        let t = tunnels.attach("edge-1", tx);
        let _a = tunnels.open("edge-1", &log(), "alice").await.expect("a");
        t.waiting.store(WAITING, Ordering::SeqCst);
        let refused = tunnels
            .open_waiting(
                "edge-1",
                &log(),
                "alice",
                std::time::Duration::from_secs(300),
            )
            .await;
        assert!(refused.is_err());
        assert_eq!(
            t.waiting.load(Ordering::SeqCst),
            WAITING,
            "the count is left as it was"
        );
        // A waiting open counts itself while it waits, and no more after.
        t.waiting.store(0, Ordering::SeqCst);
        let w = {
            let tunnels = tunnels.clone();
            tokio::spawn(async move {
                tunnels
                    .open_waiting("edge-1", &log(), "alice", std::time::Duration::from_secs(5))
                    .await
            })
        };
        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        tokio::task::yield_now().await;
        assert_eq!(t.waiting.load(Ordering::SeqCst), 1);
        assert!(
            w.await.expect("task").is_err(),
            "refused after its patience"
        );
        assert_eq!(t.waiting.load(Ordering::SeqCst), 0);
    }

    /// A stream that carries nothing either way for its idle time is closed (408) and closed
    /// on the node; bytes either way keep it open.
    #[tokio::test(start_paused = true)]
    async fn a_stream_that_carries_nothing_for_its_idle_time_is_closed() {
        let mut tunnels = Tunnels::new(4);
        tunnels.idle = std::time::Duration::from_secs(60);
        let (tx, mut to_node) = mpsc::channel(16);
        let t = tunnels.attach("edge-1", tx);
        let mut s = tunnels.open("edge-1", &log(), "alice").await.expect("s");
        let open = to_node.recv().await.expect("open");
        let started = tokio::time::Instant::now();
        tokio::time::advance(std::time::Duration::from_secs(50)).await;
        tunnels.deliver(
            &t,
            "edge-1",
            Frame::new(open.stream, Kind::Data, b"x".to_vec()),
        );
        assert_eq!(s.next().await, Event::Data(b"x".to_vec()));
        tokio::time::advance(std::time::Duration::from_secs(50)).await;
        assert!(s.sender().send(b"in".to_vec()).await);
        match s.next().await {
            Event::End(o) => assert_eq!(o.code, 408, "{}", o.message),
            other => panic!("{other:?}"),
        }
        assert_eq!(started.elapsed(), std::time::Duration::from_secs(160));
        drop(s);
        let mut kinds = Vec::new();
        while let Ok(f) = to_node.try_recv() {
            kinds.push((f.kind, f.stream));
        }
        assert!(kinds.contains(&(Kind::Close, open.stream)), "{kinds:?}");
        assert_eq!(tunnels.streams(), 0);
    }
}
