//! The broker's side of the socket: packets read (rumqttc's codec, at most [`MAX_PAYLOAD`]),
//! the TCP quick-ack, and the writer task that serves a client's answers before its queued
//! publishes and holds QoS 1 ones to the in-flight window.

use super::MAX_PAYLOAD;
use super::session::Disconnect;
use bytes::BytesMut;
use rumqttc::{Packet, Publish, QoS};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Reads the next packet, or `None` at end of stream.
pub(super) async fn read_packet<R: tokio::io::AsyncRead + Unpin>(
    stream: &mut R,
    buf: &mut BytesMut,
    ack: Option<&socket2::Socket>,
) -> Result<Option<Packet>, Disconnect> {
    loop {
        match Packet::read(buf, MAX_PAYLOAD) {
            Ok(p) => return Ok(Some(p)),
            Err(rumqttc::Error::InsufficientBytes(_)) => {}
            Err(e) => return Err(Disconnect::Malformed(e)),
        }
        let n = stream.read_buf(buf).await.map_err(Disconnect::Read)?;
        if n == 0 {
            return Ok(None);
        }
        quick_ack(ack);
    }
}

/// Acknowledges what was just read at once instead of up to 40 ms later (Linux's delayed ACK;
/// the flag does not stay set, so it is set again after every read). A client that leaves
/// Nagle's algorithm on (paho-mqtt, for one) holds each small write until its previous one is
/// acknowledged: when the answer to a request goes out before the client's next packet arrives
/// (edgecore answers in-process, faster than a client of Mosquitto can), nothing else would carry
/// the ACK, and that client would wait 40 ms per request.
pub(super) fn quick_ack(socket: Option<&socket2::Socket>) {
    #[cfg(target_os = "linux")]
    if let Some(s) = socket {
        let _ = s.set_tcp_quickack(true);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = socket;
}

/// A second handle on a client's socket, for [`quick_ack`] (the read and write halves own the
/// first).
pub(super) fn ack_handle(stream: &TcpStream) -> Option<socket2::Socket> {
    use std::os::fd::AsFd;
    stream
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .map(socket2::Socket::from)
}

/// Packets written to a client in one write, at most (about: the last one may pass it).
pub(super) const WRITE_BATCH: usize = 64 * 1024;

/// Appends `packet` to `out`; one that cannot be encoded is left out whole.
pub(super) fn encode(packet: &Packet, out: &mut BytesMut) {
    let start = out.len();
    if let Err(e) = packet.write(out, MAX_PAYLOAD) {
        out.truncate(start);
        tracing::debug!(error = %e, "MQTT packet not encodable; not sent");
    }
}

/// A QoS 1 publish given the next packet identifier.
pub(super) fn numbered(mut p: Publish, pkid: &mut u16) -> Packet {
    *pkid = pkid.checked_add(1).unwrap_or(1);
    p.pkid = *pkid;
    Packet::Publish(p)
}

/// A packet taken from a client's queue: what to write now, or `None` when it is a QoS 1
/// publish, which waits in `pending` for an in-flight permit.
pub(super) fn outgoing(
    packet: Packet,
    queued: &AtomicUsize,
    pending: &mut Option<Publish>,
) -> Option<Packet> {
    match packet {
        Packet::Publish(p) => {
            queued.fetch_sub(p.payload.len() + p.topic.len(), Ordering::Relaxed);
            if p.qos != QoS::AtMostOnce {
                *pending = Some(p);
                return None;
            }
            Some(Packet::Publish(p))
        }
        other => Some(other),
    }
}

/// Writes a client's packets: the answers to its own packets (`ctl`) first and never behind a
/// publish, then the publishes queued for it (`queue`), QoS 1 ones only while an in-flight
/// permit is free (`inflight`, given back by its PUBACKs); whatever is ready goes out in one
/// write. Ends when both queues are closed or the client stops reading.
pub(super) async fn write_out<W: tokio::io::AsyncWrite + Unpin>(
    mut writer: W,
    mut ctl_rx: mpsc::Receiver<Packet>,
    mut rx: mpsc::Receiver<Packet>,
    inflight: Arc<tokio::sync::Semaphore>,
    queued_bytes: Arc<AtomicUsize>,
) {
    let mut out = BytesMut::with_capacity(4096);
    let mut pkid: u16 = 0;
    // A QoS 1 publish waiting for an in-flight permit.
    let mut pending: Option<Publish> = None;
    loop {
        // Each branch is cancel-safe: a message received is written in this iteration, and
        // an unused permit is given back.
        let packet = tokio::select! {
            biased;
            c = ctl_rx.recv() => match c {
                Some(p) => p,
                None => return,
            },
            permit = inflight.acquire(), if pending.is_some() => {
                let Ok(permit) = permit else { return };
                permit.forget();
                let Some(p) = pending.take() else { continue };
                numbered(p, &mut pkid)
            }
            d = rx.recv(), if pending.is_none() => match d {
                Some(p) => match outgoing(p, &queued_bytes, &mut pending) {
                    Some(p) => p,
                    None => continue,
                },
                None => return,
            },
        };
        out.clear();
        encode(&packet, &mut out);
        // Whatever else is ready goes out in the same write: one system call (and one TCP
        // segment) for a burst of answers and acknowledgements instead of one each.
        while out.len() < WRITE_BATCH {
            let next = if let Ok(p) = ctl_rx.try_recv() {
                p
            } else if pending.is_some() {
                let Ok(permit) = inflight.try_acquire() else {
                    break;
                };
                permit.forget();
                let Some(p) = pending.take() else { break };
                numbered(p, &mut pkid)
            } else if let Ok(p) = rx.try_recv() {
                match outgoing(p, &queued_bytes, &mut pending) {
                    Some(p) => p,
                    None => continue,
                }
            } else {
                break;
            };
            encode(&next, &mut out);
        }
        if out.is_empty() {
            continue;
        }
        if writer.write_all(&out).await.is_err() {
            return;
        }
        if out.capacity() > 4 * WRITE_BATCH {
            // A large publish grew the buffer; do not keep it.
            out = BytesMut::with_capacity(4096);
        }
    }
}
