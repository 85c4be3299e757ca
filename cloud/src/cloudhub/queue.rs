//! A node's messages that wait for their acknowledgement, and when each is written: cloudhub's
//! delivery policy, without IO (the session's writer moves the frames; [`super::CloudHub`]
//! holds one `Queue` per node and asks it what to write).
//!
//! The rules:
//! 1. At most [`WINDOW`] messages are written and unanswered at once; the rest wait their turn.
//!    A node given 5,000 devices gets them as fast as it answers, not all at once into its
//!    socket, where they would wait behind each other past any resend timer and be sent again
//!    while the first copies are still unread.
//! 2. A newer message about the same object replaces the older, written or not.
//! 3. A written message is written again only once it is `resend` old and either the node has
//!    answered nothing for `resend` (the node or its link is stuck) or it has answered a message
//!    written after this one (it is past it: this one was lost, or refused). A node working
//!    slowly through its window is never sent the same message twice.
//! 4. An answer whose id is not waiting (replaced, already answered, from an older session) is
//!    harmless: it changes nothing.
//! 5. A new session starts over: everything waiting is written again, in order, window by
//!    window.

use super::{ObjectKey, Pending};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// Messages written and not answered at once, per node.
pub(super) const WINDOW: usize = 128;

/// One node's messages waiting for their acknowledgement.
#[derive(Default)]
pub(super) struct Queue {
    waiting: BTreeMap<ObjectKey, Pending>,
    /// The key of each waiting message, by its id (answers name the id).
    by_id: HashMap<u128, ObjectKey>,
    /// Written and not answered.
    in_flight: usize,
    /// The order messages are written in, this session (each written message takes the next).
    next_seq: u64,
    /// The highest `seq` the node answered this session (0: none).
    answered_seq: u64,
    /// When the node last answered one, or the session started.
    progress: Option<Instant>,
}

/// How a waiting message was written: when, and its place in the session's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Written {
    pub(super) at: Instant,
    pub(super) seq: u64,
}

/// What [`Queue::next`] decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Batch {
    /// The frames to write now, in order.
    pub(super) frames: Vec<String>,
    /// How many of them were written before (resends).
    pub(super) resent: u64,
}

impl Queue {
    /// Messages waiting (written or not).
    pub(super) fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Written and not answered.
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Rule 2: `p` waits for its acknowledgement, in place of any older message about `key`.
    pub(super) fn put(&mut self, key: ObjectKey, p: Pending) {
        let id = p.id;
        if let Some(old) = self.waiting.insert(key.clone(), p) {
            if old.written.is_some() {
                self.in_flight -= 1;
            }
            self.by_id.remove(&old.id);
        }
        self.by_id.insert(id, key);
    }

    /// Rule 4: the node answered message `id`; the message it clears, if one was waiting.
    pub(super) fn answered(&mut self, id: u128, now: Instant) -> Option<(ObjectKey, Pending)> {
        let key = self.by_id.remove(&id)?;
        let (key, p) = self.waiting.remove_entry(&key)?;
        if let Some(w) = p.written {
            self.in_flight -= 1;
            self.answered_seq = self.answered_seq.max(w.seq);
        }
        self.progress = Some(now);
        Some((key, p))
    }

    /// Rule 5: a new session; nothing is written on it yet.
    pub(super) fn restart(&mut self, now: Instant) {
        for p in self.waiting.values_mut() {
            p.written = None;
        }
        self.in_flight = 0;
        self.next_seq = 0;
        self.answered_seq = 0;
        self.progress = Some(now);
    }

    /// Keeps only the messages `keep` says to; returns how many went.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&ObjectKey, &Pending) -> bool) -> usize {
        let before = self.waiting.len();
        let mut gone = Vec::new();
        self.waiting.retain(|k, p| {
            let k_ = keep(k, p);
            if !k_ {
                gone.push((p.id, p.written.is_some()));
            }
            k_
        });
        for (id, written) in gone {
            self.by_id.remove(&id);
            if written {
                self.in_flight -= 1;
            }
        }
        before - self.waiting.len()
    }

    /// Rules 1 and 3: what to write now, `room` frames at most (what the session's way out
    /// takes); each is marked written at `now`.
    pub(super) fn next(&mut self, now: Instant, resend: Duration, room: usize) -> Batch {
        let stuck = self
            .progress
            .is_none_or(|t| now.saturating_duration_since(t) >= resend);
        let mut batch = Batch::default();
        let mut again = Vec::new();
        for (k, p) in &self.waiting {
            if let Some(w) = p.written
                && now.saturating_duration_since(w.at) >= resend
                && (stuck || self.answered_seq > w.seq)
            {
                again.push(k.clone());
            }
        }
        for k in &again {
            if let Some(p) = self.waiting.get_mut(k) {
                p.written = None;
                self.in_flight -= 1;
            }
        }
        let mut room = room.min(WINDOW.saturating_sub(self.in_flight));
        // Those to write again first, in the order they were written; then the rest in order.
        let mut order: Vec<&ObjectKey> = again.iter().collect();
        let rest: Vec<ObjectKey> = if room > again.len() {
            self.waiting
                .iter()
                .filter(|(k, p)| p.written.is_none() && !again.contains(k))
                .take(room - again.len())
                .map(|(k, _)| k.clone())
                .collect()
        } else {
            Vec::new()
        };
        order.extend(rest.iter());
        for k in order {
            if room == 0 {
                break;
            }
            let Some(p) = self.waiting.get_mut(k) else {
                continue;
            };
            self.next_seq += 1;
            p.written = Some(Written {
                at: now,
                seq: self.next_seq,
            });
            if p.tries > 0 {
                batch.resent += 1;
            }
            p.tries = p.tries.saturating_add(1);
            self.in_flight += 1;
            room -= 1;
            batch.frames.push(p.frame());
        }
        if stuck && !again.is_empty() {
            // The resends start a new wait: the node gets `resend` to answer them.
            self.progress = Some(now);
        }
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::bus::AckKey;
    use api::message::Message;
    use api::packed::Packed;

    const RESEND: Duration = Duration::from_secs(5);

    fn pending(name: &str) -> (ObjectKey, Pending) {
        let m = Message::new(
            "devicecontroller",
            "resource",
            "insert",
            format!("node/n1/default/device/{name}"),
            serde_json::json!({"metadata": {"name": name}}),
        )
        .with_resource_version("1".to_string());
        let ack = AckKey {
            kind: "device",
            namespace: "default".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            resource_version: "1".into(),
        };
        let p = Pending::new(&m, &ack, Packed::new(b"{}")).expect("pending");
        (("device", "default".into(), name.into()), p)
    }

    fn queue_of(n: usize) -> (Queue, Vec<u128>) {
        let mut q = Queue::default();
        let mut ids = Vec::new();
        for i in 0..n {
            let (k, p) = pending(&format!("d{i:05}"));
            ids.push(p.id);
            q.put(k, p);
        }
        (q, ids)
    }

    fn id_of(frame: &str) -> u128 {
        let m: Message = serde_json::from_str(frame).expect("message");
        uuid::Uuid::parse_str(&m.header.id).expect("uuid").as_u128()
    }

    #[test]
    fn no_more_than_a_window_is_written_unanswered_and_answers_open_it() {
        let t0 = Instant::now();
        let (mut q, _) = queue_of(1000);
        q.restart(t0);
        let b = q.next(t0, RESEND, 10_000);
        assert_eq!(b.frames.len(), WINDOW);
        assert_eq!(q.in_flight(), WINDOW);
        assert!(
            q.next(t0, RESEND, 10_000).frames.is_empty(),
            "the window is full"
        );
        // Three answers: three more go.
        for f in &b.frames[..3] {
            assert!(q.answered(id_of(f), t0).is_some());
        }
        let more = q.next(t0, RESEND, 10_000);
        assert_eq!(more.frames.len(), 3);
        assert_eq!(more.resent, 0);
        assert_eq!(q.len(), 997);
    }

    #[test]
    fn the_room_of_the_way_out_bounds_a_batch() {
        let t0 = Instant::now();
        let (mut q, _) = queue_of(50);
        q.restart(t0);
        assert_eq!(q.next(t0, RESEND, 7).frames.len(), 7);
        assert_eq!(q.next(t0, RESEND, 0).frames.len(), 0);
        assert_eq!(q.in_flight(), 7);
    }

    #[test]
    fn a_node_working_slowly_through_its_window_is_never_sent_the_same_twice() {
        let t0 = Instant::now();
        let (mut q, _) = queue_of(300);
        q.restart(t0);
        let mut written: Vec<String> = q.next(t0, RESEND, 10_000).frames;
        let mut resent = 0;
        // One answer every 2 s, in order: far slower than the resend time of every message.
        for step in 1..=60u64 {
            let now = t0 + Duration::from_secs(2 * step);
            let first = written.remove(0);
            assert!(q.answered(id_of(&first), now).is_some());
            let b = q.next(now, RESEND, 10_000);
            resent += b.resent;
            written.extend(b.frames);
        }
        assert_eq!(resent, 0);
        assert_eq!(q.in_flight(), WINDOW);
    }

    #[test]
    fn a_message_the_node_went_past_is_written_again_after_resend() {
        let t0 = Instant::now();
        let (mut q, _) = queue_of(3);
        q.restart(t0);
        let b = q.next(t0, RESEND, 10);
        let (lost, later) = (id_of(&b.frames[0]), id_of(&b.frames[2]));
        // The node answers the second and third (written after the first), never the first.
        q.answered(id_of(&b.frames[1]), t0 + Duration::from_secs(1));
        q.answered(later, t0 + Duration::from_secs(1));
        let early = q.next(t0 + Duration::from_secs(4), RESEND, 10);
        assert!(early.frames.is_empty(), "not before resend");
        let again = q.next(t0 + Duration::from_secs(5), RESEND, 10);
        assert_eq!(again.resent, 1);
        assert_eq!(again.frames.len(), 1);
        assert_eq!(id_of(&again.frames[0]), lost);
        assert!(q.answered(lost, t0 + Duration::from_secs(6)).is_some());
    }

    #[test]
    fn a_node_that_answers_nothing_for_resend_gets_its_window_again() {
        let t0 = Instant::now();
        let (mut q, _) = queue_of(200);
        q.restart(t0);
        assert_eq!(q.next(t0, RESEND, 10_000).frames.len(), WINDOW);
        let b = q.next(t0 + RESEND, RESEND, 10_000);
        assert_eq!(b.frames.len(), WINDOW);
        assert_eq!(b.resent as usize, WINDOW);
        // And not again until another resend period passes without an answer.
        assert!(
            q.next(t0 + RESEND + Duration::from_secs(1), RESEND, 10_000)
                .frames
                .is_empty()
        );
    }

    #[test]
    fn answers_for_ids_not_waiting_are_harmless() {
        let t0 = Instant::now();
        let (mut q, ids) = queue_of(4);
        q.restart(t0);
        let b = q.next(t0, RESEND, 10);
        assert!(q.answered(id_of(&b.frames[0]), t0).is_some());
        assert!(q.answered(ids[0], t0).is_none(), "answered twice");
        assert!(q.answered(12345, t0).is_none(), "never sent");
        assert_eq!(q.in_flight(), 3);
        assert_eq!(q.len(), 3);
        // A replaced message's id clears nothing: the newer one still waits.
        let (k, newer) = pending("d00001");
        let newer_id = newer.id;
        q.put(k, newer);
        assert_eq!(q.in_flight(), 2, "the replaced message was in flight");
        assert!(q.answered(ids[1], t0).is_none());
        assert_eq!(q.len(), 3);
        let b = q.next(t0, RESEND, 10);
        assert_eq!(b.frames.len(), 1);
        assert_eq!(id_of(&b.frames[0]), newer_id);
    }

    #[test]
    fn a_new_session_writes_everything_again_window_by_window() {
        let t0 = Instant::now();
        let (mut q, _) = queue_of(200);
        q.restart(t0);
        q.next(t0, RESEND, 10_000);
        q.restart(t0 + Duration::from_secs(1));
        assert_eq!(q.in_flight(), 0);
        let b = q.next(t0 + Duration::from_secs(1), RESEND, 10_000);
        assert_eq!(b.frames.len(), WINDOW);
        assert_eq!(
            b.resent as usize, WINDOW,
            "written before, in the old session"
        );
        assert_eq!(
            q.retain(|k, _| k.2.as_ref() != "d00000"),
            1,
            "retain drops what it says"
        );
        assert_eq!(q.in_flight(), WINDOW - 1);
    }
}
