//! The node's half of the link's policy, without IO: what goes up next and when, what is in
//! flight, when it is sent again, what an answer clears, and when the cloud counts as silent.
//! [`super::EdgeHub`]'s session loop moves the bytes: it offers what the outbox holds, writes
//! what [`Link::next_up`] gives, passes on what the cloud answered, and drops the session when
//! [`Link::silent_at`] comes.
//!
//! The rules:
//! 1. Reports (the outbox's twin and state messages, pod status, the devices' states at a
//!    session's start) go up at most `qps` a second, `burst` at once. Nothing else waits for
//!    that rate: answers to the cloud, keepalives, the node's info are written as they come,
//!    and the cloud's frames are read and handled while reports wait.
//! 2. At most `window` outbox messages are in flight (sent, not answered): the cloud's answers
//!    pace the node, so a cloud that stores DeviceStatus more slowly than the node reports gets
//!    no more than it can take, and nothing is sent twice for being slow.
//! 3. An entry is in flight from the moment its message leaves the limiter, not from when it
//!    was read from the outbox. It is offered again once it is `resend` old and either the
//!    cloud answered nothing for `resend` (the link or the cloud is stuck) or it answered a
//!    message sent after this one (past it: this one was lost).
//! 4. The outbox is read again only when less than a second of the rate waits in the queue, so
//!    what waits is never more than about a second old when it leaves.
//! 5. An answer clears the entries of the message it answers, even after they were offered
//!    again (the store clears an entry only up to the version that was sent, so a newer value
//!    stays); an answer for an id not known here is harmless.
//! 6. The cloud is silent when no frame of any kind came from it for `keepalive`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;
use tokio::time::Instant;
use twin::model::OutboxEntry;

use api::message::Message;

/// What a message going up is, for what happens once it is sent.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Up {
    /// Outbox entries: in flight until answered.
    Entries(Vec<OutboxEntry>),
    /// A pod's status: the session keeps its own books of those.
    Pod(edged::cloud::Key),
    /// Nothing to keep (a device's state sent again at the start of a session).
    Plain,
}

/// The key of an outbox entry, as far as the link tells entries apart: an entry in flight or
/// waiting is not read from the outbox again.
pub(super) type EntryKey = (String, String, String);

fn key_of(e: &OutboxEntry) -> EntryKey {
    (e.namespace.clone(), e.name.clone(), e.property.clone())
}

/// Sent and not answered yet.
struct Flight {
    at: Instant,
    /// Its place in the order messages were sent.
    seq: u64,
    entries: Vec<OutboxEntry>,
}

/// The settings of a link.
#[derive(Debug, Clone, Copy)]
pub(super) struct Settings {
    pub(super) qps: u32,
    pub(super) burst: u32,
    pub(super) resend: Duration,
    pub(super) keepalive: Duration,
    /// Outbox messages in flight at most.
    pub(super) window: usize,
}

/// One session's link policy.
pub(super) struct Link {
    settings: Settings,
    bucket: rt::ratelimit::Bucket,
    queue: VecDeque<(Message, Up)>,
    inflight: HashMap<String, Flight>,
    /// Sent, not answered within `resend`, and offered again: a late answer still clears them.
    late: HashMap<String, Flight>,
    heard: Instant,
    /// Messages offered again for want of an answer, this session.
    pub(super) resent: u64,
    /// The order of sending, and the highest place the cloud answered.
    next_seq: u64,
    answered_seq: u64,
    /// When the cloud last answered a report (or the session started).
    progress: Instant,
    /// Entries the cloud has answered, to be cleared from the outbox in one go
    /// ([`Link::take_answered`]) before it is read again: busy until then.
    answered_entries: Vec<OutboxEntry>,
}

impl Link {
    pub(super) fn new(settings: Settings, now: Instant) -> Self {
        Self {
            settings,
            bucket: rt::ratelimit::Bucket::new(settings.qps, settings.burst),
            queue: VecDeque::new(),
            inflight: HashMap::new(),
            late: HashMap::new(),
            heard: now,
            resent: 0,
            next_seq: 0,
            answered_seq: 0,
            progress: now,
            answered_entries: Vec::new(),
        }
    }

    /// Rule 3: whether the outbox should be read now.
    pub(super) fn wants_outbox(&self) -> bool {
        self.queued_reports() < self.settings.qps.max(1) as usize
    }

    /// How many outbox rows a read should take: enough to get past those in flight or waiting
    /// (which are skipped), plus a few seconds of the rate.
    pub(super) fn read_limit(&self) -> usize {
        let busy: usize = self
            .inflight
            .values()
            .map(|f| f.entries.len())
            .sum::<usize>()
            + self
                .queue
                .iter()
                .map(|(_, u)| match u {
                    Up::Entries(e) => e.len(),
                    _ => 0,
                })
                .sum::<usize>();
        busy + 4 * self.settings.qps.max(self.settings.burst) as usize
    }

    /// The entries in flight or waiting: not to be read from the outbox again.
    pub(super) fn busy(&self) -> HashSet<EntryKey> {
        let flying = self.inflight.values().flat_map(|f| f.entries.iter());
        let waiting = self.queue.iter().flat_map(|(_, u)| match u {
            Up::Entries(e) => e.iter(),
            _ => [].iter(),
        });
        flying
            .chain(waiting)
            .chain(self.answered_entries.iter())
            .map(key_of)
            .collect()
    }

    /// Keeps answered `entries` until [`Link::take_answered`]: clearing each answer's entries
    /// from the outbox on its own was one SQLite transaction, and a fold of the journal, per
    /// answer (hundreds a second on a gateway whose values change).
    pub(super) fn clear_later(&mut self, entries: Vec<OutboxEntry>) {
        self.answered_entries.extend(entries);
    }

    /// The answered entries kept since the last call, to clear from the outbox at once. At most
    /// what was in flight: bounded by the window.
    pub(super) fn take_answered(&mut self) -> Vec<OutboxEntry> {
        std::mem::take(&mut self.answered_entries)
    }

    /// A report to send when the rate allows.
    pub(super) fn offer(&mut self, msg: Message, up: Up) {
        self.queue.push_back((msg, up));
    }

    /// Reports waiting for the rate.
    pub(super) fn queued(&self) -> usize {
        self.queue.len()
    }

    fn queued_reports(&self) -> usize {
        self.queue
            .iter()
            .filter(|(_, u)| matches!(u, Up::Entries(_)))
            .count()
    }

    /// Messages sent and not answered.
    pub(super) fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// Rules 1 and 2: the next report, if the rate lets it go at `now`; its entries are in
    /// flight from now.
    pub(super) fn next_up(&mut self, now: Instant) -> Option<(Message, Up)> {
        let (_, up) = self.queue.front()?;
        if !self.bucket.ready_in().is_zero() || (matches!(up, Up::Entries(_)) && self.window_full())
        {
            return None;
        }
        let (msg, up) = self.queue.pop_front()?;
        self.bucket.reserve();
        if let Up::Entries(entries) = &up {
            self.next_seq += 1;
            self.inflight.insert(
                msg.header.id.clone(),
                Flight {
                    at: now,
                    seq: self.next_seq,
                    entries: entries.clone(),
                },
            );
        }
        Some((msg, up))
    }

    /// Rule 2.
    fn window_full(&self) -> bool {
        self.inflight.len() >= self.settings.window.max(1)
    }

    /// When the next report may go: `None` with nothing waiting, or while the window is full
    /// (an answer opens it).
    pub(super) fn next_at(&mut self, now: Instant) -> Option<Instant> {
        let (_, up) = self.queue.front()?;
        if matches!(up, Up::Entries(_)) && self.window_full() {
            return None;
        }
        Some(now + self.bucket.ready_in())
    }

    /// Rule 3: what was sent `resend` ago, not answered, and given up on is offered again
    /// (its entries are read from the outbox again, as the newest values). Returns how many
    /// messages.
    pub(super) fn expire(&mut self, now: Instant) -> usize {
        let resend = self.settings.resend;
        let stuck = now.saturating_duration_since(self.progress) >= resend;
        let due: Vec<String> = (self.inflight.iter())
            .filter(|(_, f)| {
                now.saturating_duration_since(f.at) >= resend
                    && (stuck || self.answered_seq > f.seq)
            })
            .map(|(id, _)| id.clone())
            .collect();
        if stuck && !due.is_empty() {
            // The resends get their own `resend` to be answered.
            self.progress = now;
        }
        for id in &due {
            if let Some(f) = self.inflight.remove(id) {
                self.late.insert(id.clone(), f);
            }
        }
        // What is late for ten resend periods is not waited for any more: its entries were
        // sent again (and answered, or late again) long since.
        self.late
            .retain(|_, f| now.saturating_duration_since(f.at) < resend * 10);
        self.resent += due.len() as u64;
        due.len()
    }

    /// When to look again at what is in flight: the oldest's resend time, or, once that has
    /// passed with the cloud still answering, the moment the cloud would count as stuck.
    pub(super) fn expires_at(&self) -> Option<Instant> {
        let resend = self.settings.resend;
        let stuck_at = self.progress + resend;
        self.inflight
            .values()
            .map(|f| {
                let due = f.at + resend;
                if self.answered_seq > f.seq {
                    due
                } else {
                    due.max(stuck_at)
                }
            })
            .min()
    }

    /// Rule 5: the cloud answered message `id`: the entries it clears (none for an id not
    /// known here).
    pub(super) fn answered(&mut self, id: &str, now: Instant) -> Option<Vec<OutboxEntry>> {
        if let Some(f) = self.inflight.remove(id) {
            self.answered_seq = self.answered_seq.max(f.seq);
            self.progress = now;
            return Some(f.entries);
        }
        self.late.remove(id).map(|f| f.entries)
    }

    /// Rule 6: a frame came from the cloud.
    pub(super) fn heard(&mut self, now: Instant) {
        self.heard = now;
    }

    /// When the cloud counts as silent, if nothing comes before.
    pub(super) fn silent_at(&self) -> Instant {
        self.heard + self.settings.keepalive
    }

    /// The oldest message in flight: how long it has waited for its answer.
    pub(super) fn oldest_in_flight(&self, now: Instant) -> Option<Duration> {
        self.inflight
            .values()
            .map(|f| now.saturating_duration_since(f.at))
            .max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use twin::model::{Section, Version};

    fn settings() -> Settings {
        Settings {
            qps: 10,
            burst: 5,
            resend: Duration::from_secs(10),
            keepalive: Duration::from_secs(30),
            window: 1000,
        }
    }

    fn entry(device: usize, property: &str, seq: u64) -> OutboxEntry {
        OutboxEntry {
            namespace: "default".into(),
            name: format!("dev-{device}"),
            property: property.into(),
            section: Section::Reported,
            value: seq.to_string(),
            version: Version {
                cloud: 0,
                edge: seq,
            },
            timestamp: 0,
            seq,
        }
    }

    fn report(device: usize) -> (Message, Up) {
        let e = entry(device, "p0", device as u64 + 1);
        let m = Message::new(
            "edgehub",
            "twin",
            "update",
            format!("node/n1/device/default/dev-{device}/twin/edge_updated"),
            serde_json::json!({}),
        );
        (m, Up::Entries(vec![e]))
    }

    /// Everything the limiter lets out at `now`.
    fn drain(link: &mut Link) -> Vec<Message> {
        let mut out = Vec::new();
        while let Some((m, _)) = link.next_up(Instant::now()) {
            out.push(m);
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_resent_before_the_limiter_let_it_out() {
        let mut link = Link::new(settings(), Instant::now());
        for d in 0..400 {
            let (m, u) = report(d);
            link.offer(m, u);
        }
        // 400 reports at 10 a second take 40 s to leave; none of them may be offered again
        // for want of an answer before it was sent.
        let mut sent = 0;
        while link.queued() > 0 {
            sent += drain(&mut link).len();
            let now = Instant::now();
            assert_eq!(link.expire(now), 0, "nothing is resent before it is sent");
            // No answers: but every message is younger than `resend` since it left.
            let Some(next) = link.next_at(now) else { break };
            tokio::time::advance(next - now).await;
            // Answers for everything sent more than 5 s ago.
            let old: Vec<String> = link
                .inflight
                .iter()
                .filter(|(_, f)| Instant::now() - f.at >= Duration::from_secs(5))
                .map(|(id, _)| id.clone())
                .collect();
            for id in old {
                assert!(link.answered(&id, Instant::now()).is_some());
            }
        }
        sent += drain(&mut link).len();
        assert_eq!(sent, 400);
        assert_eq!(link.resent, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_holds_reports_but_a_burst_goes_at_once() {
        let mut link = Link::new(settings(), Instant::now());
        for d in 0..20 {
            let (m, u) = report(d);
            link.offer(m, u);
        }
        assert_eq!(drain(&mut link).len(), 5, "the burst");
        let now = Instant::now();
        assert_eq!(
            link.next_at(now),
            Some(now + Duration::from_millis(100)),
            "then one every 1/qps"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            drain(&mut link).len(),
            5,
            "a second's tokens, up to the burst"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn unanswered_for_resend_after_sending_is_offered_again_and_a_late_answer_still_clears_it()
     {
        let mut link = Link::new(settings(), Instant::now());
        let (m, u) = report(1);
        let id = m.header.id.clone();
        link.offer(m, u);
        assert_eq!(drain(&mut link).len(), 1);
        assert!(link.busy().contains(&key_of(&entry(1, "p0", 0))));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(link.expire(Instant::now()), 0);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(link.expire(Instant::now()), 1);
        assert_eq!(link.resent, 1);
        assert!(link.busy().is_empty(), "free to be read again");
        // The answer to the first copy arrives after all: its entries are cleared.
        let cleared = link.answered(&id, Instant::now()).expect("still known");
        assert_eq!(cleared, vec![entry(1, "p0", 2)]);
        assert!(link.answered(&id, Instant::now()).is_none(), "once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_window_waits_for_answers_whatever_the_rate_allows() {
        let mut link = Link::new(
            Settings {
                window: 3,
                ..settings()
            },
            Instant::now(),
        );
        for d in 0..10 {
            let (m, u) = report(d);
            link.offer(m, u);
        }
        let sent = drain(&mut link);
        assert_eq!(sent.len(), 3, "the window, though the burst is 5");
        assert_eq!(link.next_at(Instant::now()), None, "nothing to wake for");
        // A pod's status is not an outbox message: it does not wait for the window.
        link.queue
            .push_front((report(99).0, Up::Pod(("ns".into(), "p".into()))));
        assert_eq!(drain(&mut link).len(), 1);
        assert!(link.answered(&sent[0].header.id, Instant::now()).is_some());
        assert_eq!(drain(&mut link).len(), 1, "one answer, one more");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cloud_answering_slowly_is_sent_nothing_twice() {
        let mut link = Link::new(
            Settings {
                window: 5,
                ..settings()
            },
            Instant::now(),
        );
        for d in 0..60 {
            let (m, u) = report(d);
            link.offer(m, u);
        }
        let mut flying: Vec<String> = drain(&mut link).into_iter().map(|m| m.header.id).collect();
        // One answer every 3 s, oldest first: each message waits 15 s for its answer, longer
        // than `resend`, but the cloud is busy, not stuck.
        for _ in 0..40 {
            tokio::time::advance(Duration::from_secs(3)).await;
            let now = Instant::now();
            assert_eq!(link.expire(now), 0, "nothing resent");
            assert!(link.answered(&flying.remove(0), now).is_some());
            flying.extend(drain(&mut link).into_iter().map(|m| m.header.id));
        }
        assert_eq!(link.resent, 0);
        // The cloud stops answering: after `resend` without an answer, the window goes again.
        let stuck_at = link.expires_at().expect("in flight");
        assert_eq!(stuck_at, Instant::now() + Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(link.expire(Instant::now()), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_the_cloud_went_past_is_offered_again_after_resend() {
        let mut link = Link::new(settings(), Instant::now());
        for d in 0..3 {
            let (m, u) = report(d);
            link.offer(m, u);
        }
        let sent = drain(&mut link);
        tokio::time::advance(Duration::from_secs(1)).await;
        // The second and third are answered; the first never is.
        for m in &sent[1..] {
            assert!(link.answered(&m.header.id, Instant::now()).is_some());
        }
        assert_eq!(
            link.expires_at(),
            Some(Instant::now() + Duration::from_secs(9)),
            "its own resend time: the cloud went past it"
        );
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(link.expire(Instant::now()), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn answers_for_ids_not_known_are_harmless() {
        let mut link = Link::new(settings(), Instant::now());
        let (m, u) = report(1);
        link.offer(m, u);
        drain(&mut link);
        assert!(link.answered("not-ours", Instant::now()).is_none());
        assert!(link.answered("", Instant::now()).is_none());
        assert_eq!(link.in_flight(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_outbox_is_read_only_when_less_than_a_second_waits() {
        let mut link = Link::new(settings(), Instant::now());
        assert!(link.wants_outbox());
        for d in 0..10 {
            let (m, u) = report(d);
            link.offer(m, u);
        }
        assert!(!link.wants_outbox(), "a second of the rate waits");
        // Pod status and states do not count as outbox reports.
        let pod = (String::from("ns"), String::from("p"));
        link.offer(report(99).0, Up::Pod(pod));
        drain(&mut link);
        assert!(link.wants_outbox());
        // A read gets past what is busy (5 in flight, 5 waiting), plus a few seconds of the
        // rate.
        assert_eq!(link.read_limit(), 10 + 4 * 10);
    }

    #[tokio::test(start_paused = true)]
    async fn the_cloud_is_silent_keepalive_after_its_last_frame() {
        let t0 = Instant::now();
        let mut link = Link::new(settings(), t0);
        assert_eq!(link.silent_at(), t0 + Duration::from_secs(30));
        tokio::time::advance(Duration::from_secs(20)).await;
        link.heard(Instant::now());
        assert_eq!(link.silent_at(), t0 + Duration::from_secs(50));
        // Reports sent meanwhile are not frames from the cloud.
        let (m, u) = report(1);
        link.offer(m, u);
        drain(&mut link);
        assert_eq!(link.silent_at(), t0 + Duration::from_secs(50));
    }
}
