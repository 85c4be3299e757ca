//! cloudhub's counters, and how they read on `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct HubMetrics {
    pub sessions: AtomicU64,
    pub sessions_replaced: AtomicU64,
    pub sessions_refused: AtomicU64,
    pub frames_in: AtomicU64,
    pub frames_out: AtomicU64,
    pub resent: AtomicU64,
    pub acked: AtomicU64,
    /// Kept messages dropped because the node acknowledged them through another replica.
    pub acked_elsewhere: AtomicU64,
    pub dropped: AtomicU64,
    pub refused_messages: AtomicU64,
    pub bad_frames: AtomicU64,
    /// Sessions ended because the node stopped reading.
    pub stalled: AtomicU64,
    /// Sessions ended because the node sent nothing for `keepaliveSeconds`.
    pub silent: AtomicU64,
}

impl HubMetrics {
    /// Adds these to a scrape of `/metrics`, with the acknowledgements pending and the
    /// ObjectSync records (written, failed).
    pub(crate) fn scrape(
        &self,
        o: &mut rt::metrics::Scrape,
        (pending, written): (usize, usize),
        records: (u64, u64),
        to_write: usize,
    ) {
        let g = |v: &AtomicU64| v.load(Ordering::Relaxed);
        o.gauge(
            "cloudhub_sessions",
            "Edge nodes connected.",
            g(&self.sessions),
        )
        .counter(
            "cloudhub_sessions_replaced",
            "Sessions replaced by a newer one of the same node.",
            g(&self.sessions_replaced),
        )
        .counter(
            "cloudhub_sessions_refused",
            "Sessions refused: the node limit was reached, or the certificate is revoked.",
            g(&self.sessions_refused),
        )
        .counter(
            "cloudhub_frames_in",
            "Frames received from nodes.",
            g(&self.frames_in),
        )
        .counter(
            "cloudhub_frames_out",
            "Frames sent to nodes.",
            g(&self.frames_out),
        )
        .counter(
            "cloudhub_resent",
            "Messages sent again for want of an acknowledgement.",
            g(&self.resent),
        )
        .counter(
            "cloudhub_acked",
            "Messages the nodes acknowledged.",
            g(&self.acked),
        )
        .counter(
            "cloudhub_acked_elsewhere",
            "Kept messages dropped because their node acknowledged them through another replica.",
            g(&self.acked_elsewhere),
        )
        .counter(
            "cloudhub_dropped",
            "Messages dropped: beyond the queue of a node without a session, or unfit to acknowledge.",
            g(&self.dropped),
        )
        .counter(
            "cloudhub_refused_messages",
            "Messages from nodes about another node, refused.",
            g(&self.refused_messages),
        )
        .counter(
            "cloudhub_bad_frames",
            "Frames that are not a message, skipped.",
            g(&self.bad_frames),
        )
        .counter(
            "cloudhub_sessions_stalled",
            "Sessions ended because the node stopped reading.",
            g(&self.stalled),
        )
        .counter(
            "cloudhub_sessions_silent",
            "Sessions ended because the node sent nothing for keepaliveSeconds.",
            g(&self.silent),
        )
        .gauge(
            "cloudhub_pending_acks",
            "Messages waiting for their acknowledgement.",
            pending,
        )
        .gauge(
            "cloudhub_frames_to_write",
            "Frames waiting to be written to the nodes' sockets.",
            to_write,
        )
        .gauge(
            "cloudhub_in_flight",
            "Messages written to their node and not acknowledged yet (at most 128 a node).",
            written,
        )
        .counter(
            "cloudhub_objectsync_written",
            "ObjectSync records written.",
            records.0,
        )
        .counter(
            "cloudhub_objectsync_failed",
            "ObjectSync records that could not be written.",
            records.1,
        );
    }
}
