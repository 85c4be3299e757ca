//! The embedded MQTT broker: MQTT 3.1.1 over TCP on loopback, enough for the `$hw` API of one
//! gateway and its apps without installing anything.
//!
//! Why not rumqttd: it refuses every subscription whose filter starts with `$` (other than
//! `$share`), so neither edgecore nor a KubeEdge app could subscribe to `$hw/events/...`.
//!
//! What it does: CONNECT with clean sessions, SUBSCRIBE/UNSUBSCRIBE with `+` and `#` (which, as
//! MQTT requires, do not match `$` topics at the first level), PUBLISH at QoS 0 and 1 (QoS 2 is
//! accepted and delivered at most at QoS 1), retained messages, PINGREQ, and the last will of a
//! client that drops. No persistent sessions, TLS or authentication: for those, run a full
//! broker and set `mqtt.mode: external`. Packets are parsed by rumqttc's MQTT codec; a client
//! that sends a malformed packet is disconnected, never the broker.

use bytes::BytesMut;
use rumqttc::{
    ConnAck, ConnectReturnCode, Packet, PubAck, PubComp, PubRec, Publish, QoS, SubAck,
    SubscribeReasonCode, UnsubAck,
};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Errors of starting the embedded broker.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("embedded MQTT broker cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Largest MQTT packet accepted and sent (a whole twin document fits).
pub const MAX_PAYLOAD: usize = 2 * 1024 * 1024;

/// Messages queued for one slow subscriber before further ones are dropped for it.
const CLIENT_QUEUE: usize = 4096;

/// Whether `filter` matches `topic` (MQTT 3.1.1 section 4.7).
pub fn topic_matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut t = topic.split('/');
    for f in filter.split('/') {
        if f == "#" {
            return true;
        }
        match t.next() {
            Some(_) if f == "+" => {}
            Some(level) if level == f => {}
            _ => return false,
        }
    }
    t.next().is_none()
}

fn valid_filter(filter: &str) -> bool {
    if filter.is_empty() {
        return false;
    }
    let levels: Vec<&str> = filter.split('/').collect();
    levels.iter().enumerate().all(|(i, l)| {
        (*l == "#" && i == levels.len() - 1) || *l == "+" || (!l.contains('#') && !l.contains('+'))
    })
}

struct Client {
    client_id: String,
    tx: mpsc::Sender<Packet>,
    filters: Vec<(String, QoS)>,
}

#[derive(Default)]
struct State {
    clients: HashMap<u64, Client>,
    retained: HashMap<String, Publish>,
}

/// Counters of the broker.
#[derive(Debug, Default)]
pub struct BrokerStats {
    pub connections: AtomicU64,
    pub published: AtomicU64,
    pub dropped: AtomicU64,
}

#[derive(Clone, Default)]
struct Shared {
    state: Arc<Mutex<State>>,
    next_id: Arc<AtomicU64>,
    stats: Arc<BrokerStats>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    fn route(&self, publish: &Publish) {
        self.stats.published.fetch_add(1, Ordering::Relaxed);
        let mut state = self.lock();
        if publish.retain {
            if publish.payload.is_empty() {
                state.retained.remove(&publish.topic);
            } else {
                state
                    .retained
                    .insert(publish.topic.clone(), publish.clone());
            }
        }
        for client in state.clients.values() {
            let granted = client
                .filters
                .iter()
                .filter(|(f, _)| topic_matches(f, &publish.topic))
                .map(|(_, q)| *q)
                .max_by_key(|q| *q as u8);
            if let Some(q) = granted {
                let mut out = publish.clone();
                out.qos = min_qos(publish.qos, q);
                out.retain = false;
                out.dup = false;
                if client.tx.try_send(Packet::Publish(out)).is_err() {
                    self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(client = %client.client_id, topic = %publish.topic, "MQTT subscriber too slow; message dropped");
                }
            }
        }
    }
}

fn min_qos(a: QoS, b: QoS) -> QoS {
    let m = (a as u8).min(b as u8).min(1);
    if m == 0 {
        QoS::AtMostOnce
    } else {
        QoS::AtLeastOnce
    }
}

/// Binds `addr` and serves MQTT until `cancel`.
/// Starts the broker on `addr`, serving at most `max_connections` clients at once (more wait in
/// the listen backlog).
pub async fn start(
    addr: SocketAddr,
    max_connections: usize,
    cancel: CancellationToken,
) -> Result<SocketAddr, BrokerError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| BrokerError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| BrokerError::Bind { addr, source })?;
    tracing::info!(addr = %local, "embedded MQTT broker listening");
    let shared = Shared::default();
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(max_connections));
    tokio::spawn(async move {
        let mut backoff = crate::listeners::AcceptBackoff::default();
        loop {
            let permit = tokio::select! {
                _ = cancel.cancelled() => return,
                p = permits.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let accepted = tokio::select! {
                _ = cancel.cancelled() => return,
                a = listener.accept() => a,
            };
            match accepted {
                Ok((stream, peer)) => {
                    backoff.succeeded();
                    let _ = stream.set_nodelay(true);
                    let shared = shared.clone();
                    let cancel = cancel.clone();
                    tokio::spawn(async move {
                        let _permit = permit;
                        if let Err(e) = connection(stream, shared, cancel).await {
                            tracing::debug!(%peer, error = %e, "MQTT client disconnected");
                        }
                    });
                }
                Err(e) => backoff.failed("mqtt", &e).await,
            }
        }
    });
    Ok(local)
}

/// Reads the next packet, or `None` at end of stream.
async fn read_packet(
    stream: &mut tokio::net::tcp::OwnedReadHalf,
    buf: &mut BytesMut,
) -> Result<Option<Packet>, String> {
    loop {
        match Packet::read(buf, MAX_PAYLOAD) {
            Ok(p) => return Ok(Some(p)),
            Err(rumqttc::Error::InsufficientBytes(_)) => {}
            Err(e) => return Err(format!("malformed MQTT packet: {e}")),
        }
        let n = stream
            .read_buf(buf)
            .await
            .map_err(|e| format!("read failed: {e}"))?;
        if n == 0 {
            return Ok(None);
        }
    }
}

async fn connection(
    stream: TcpStream,
    shared: Shared,
    cancel: CancellationToken,
) -> Result<(), String> {
    let (mut reader, mut writer) = stream.into_split();
    let mut buf = BytesMut::with_capacity(4096);
    let connect = match tokio::time::timeout(
        std::time::Duration::from_secs(10),
        read_packet(&mut reader, &mut buf),
    )
    .await
    {
        Ok(Ok(Some(Packet::Connect(c)))) => c,
        Ok(Ok(Some(other))) => return Err(format!("first packet is not CONNECT: {other:?}")),
        Ok(Ok(None)) => return Ok(()),
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err("no CONNECT within 10 s".into()),
    };
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let client_id = if connect.client_id.is_empty() {
        format!("anonymous-{id}")
    } else {
        connect.client_id.clone()
    };
    let (tx, mut rx) = mpsc::channel::<Packet>(CLIENT_QUEUE);
    {
        let mut state = shared.lock();
        // A second connection with the same client id takes over (MQTT 3.1.1 section 3.1.4).
        state.clients.retain(|_, c| c.client_id != client_id);
        state.clients.insert(
            id,
            Client {
                client_id: client_id.clone(),
                tx: tx.clone(),
                filters: Vec::new(),
            },
        );
    }
    shared.stats.connections.fetch_add(1, Ordering::Relaxed);
    let _ = tx.try_send(Packet::ConnAck(ConnAck::new(
        ConnectReturnCode::Success,
        false,
    )));
    let writer_task = tokio::spawn(async move {
        let mut out = BytesMut::with_capacity(4096);
        let mut pkid: u16 = 0;
        while let Some(mut packet) = rx.recv().await {
            if let Packet::Publish(p) = &mut packet
                && p.qos != QoS::AtMostOnce
            {
                pkid = pkid.checked_add(1).unwrap_or(1);
                p.pkid = pkid;
            }
            out.clear();
            if packet.write(&mut out, MAX_PAYLOAD).is_err() {
                continue;
            }
            if writer.write_all(&out).await.is_err() {
                return;
            }
        }
    });
    let keep_alive =
        std::time::Duration::from_secs(u64::from(connect.keep_alive.max(1)) * 3 / 2 + 1);
    let result = loop {
        let next = tokio::select! {
            _ = cancel.cancelled() => break Ok(false),
            r = tokio::time::timeout(keep_alive, read_packet(&mut reader, &mut buf)) => r,
        };
        let packet = match next {
            Err(_) => break Err("keep-alive timeout".to_string()),
            Ok(Err(e)) => break Err(e),
            Ok(Ok(None)) => break Ok(false),
            Ok(Ok(Some(p))) => p,
        };
        match packet {
            Packet::Publish(p) => {
                if p.topic.is_empty() || p.topic.contains(['+', '#']) {
                    break Err(format!("invalid topic name {:?}", p.topic));
                }
                match p.qos {
                    QoS::AtMostOnce => {}
                    QoS::AtLeastOnce => {
                        let _ = tx.send(Packet::PubAck(PubAck::new(p.pkid))).await;
                    }
                    QoS::ExactlyOnce => {
                        let _ = tx.send(Packet::PubRec(PubRec::new(p.pkid))).await;
                    }
                }
                shared.route(&p);
            }
            Packet::PubRel(r) => {
                let _ = tx.send(Packet::PubComp(PubComp::new(r.pkid))).await;
            }
            Packet::Subscribe(s) => {
                let mut codes = Vec::with_capacity(s.filters.len());
                let mut retained = Vec::new();
                {
                    let mut state = shared.lock();
                    for f in &s.filters {
                        if !valid_filter(&f.path) {
                            codes.push(SubscribeReasonCode::Failure);
                            continue;
                        }
                        let q = min_qos(f.qos, QoS::AtLeastOnce);
                        codes.push(SubscribeReasonCode::Success(q));
                        if let Some(c) = state.clients.get_mut(&id) {
                            c.filters.retain(|(x, _)| x != &f.path);
                            c.filters.push((f.path.clone(), q));
                        }
                        for r in state.retained.values() {
                            if topic_matches(&f.path, &r.topic) {
                                let mut r = r.clone();
                                r.qos = min_qos(r.qos, q);
                                retained.push(r);
                            }
                        }
                    }
                }
                let _ = tx.send(Packet::SubAck(SubAck::new(s.pkid, codes))).await;
                for mut r in retained {
                    r.retain = true;
                    let _ = tx.send(Packet::Publish(r)).await;
                }
            }
            Packet::Unsubscribe(u) => {
                if let Some(c) = shared.lock().clients.get_mut(&id) {
                    c.filters.retain(|(f, _)| !u.topics.contains(f));
                }
                let _ = tx.send(Packet::UnsubAck(UnsubAck::new(u.pkid))).await;
            }
            Packet::PingReq => {
                let _ = tx.send(Packet::PingResp).await;
            }
            Packet::Disconnect => break Ok(true),
            Packet::Connect(_) => break Err("second CONNECT".into()),
            _ => {}
        }
    };
    shared.lock().clients.remove(&id);
    // The will is published when a client goes away without DISCONNECT.
    if !matches!(result, Ok(true))
        && let Some(will) = &connect.last_will
    {
        let mut p = Publish::new(will.topic.clone(), will.qos, will.message.to_vec());
        p.retain = will.retain;
        shared.route(&p);
    }
    drop(tx);
    let _ = writer_task.await;
    result.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_match_as_mqtt_says() {
        assert!(topic_matches(
            "$hw/events/device/+/+/twin/update",
            "$hw/events/device/default/a/twin/update"
        ));
        assert!(!topic_matches(
            "$hw/events/device/+/+/twin/update",
            "$hw/events/device/default/a/twin/update/result"
        ));
        assert!(topic_matches(
            "$hw/events/device/#",
            "$hw/events/device/default/a/twin/update/result"
        ));
        assert!(
            !topic_matches("#", "$hw/events/x"),
            "wildcards do not match $ topics"
        );
        assert!(!topic_matches("+/events/x", "$hw/events/x"));
        assert!(topic_matches("a/#", "a"));
        assert!(topic_matches("a/+", "a/b"));
        assert!(!topic_matches("a/+", "a/b/c"));
    }

    #[test]
    fn invalid_filters_are_refused() {
        assert!(valid_filter("$hw/#"));
        assert!(!valid_filter("a/#/b"));
        assert!(!valid_filter("a/b+"));
        assert!(!valid_filter(""));
    }
}
