//! Whether a mapper is alive, as its probes and calls find it. The rules, on tokio's clock:
//!
//! 1. A mapper is probed every [`Liveness::interval`], one probe at a time: the next is not
//!    started while one is under way (a probe ends by itself after [`Liveness::timeout`]).
//! 2. [`Liveness::failures`] failed probes in a row make a live mapper unreachable; one answer
//!    resets the count.
//! 3. One failed call makes it unreachable at once.
//! 4. An unreachable mapper is probed on, and its first answer makes it alive again; until then
//!    each failure is its latest error.
//!
//! [`Probes`] decides; `super::mappers` starts the probes, makes the calls and acts on the
//! verdicts.

use std::time::Duration;
use tokio::time::Instant;

/// How mappers are watched (`dmi.probeIntervalMs`, `dmi.probeTimeoutMs`, `dmi.probeFailures`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    pub interval: Duration,
    pub timeout: Duration,
    pub failures: u32,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            failures: 2,
        }
    }
}

/// What a probe's end means.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing changes.
    Same,
    /// An unreachable mapper answered: it is alive again ([`Probes::up`]).
    Revived,
    /// A live mapper failed too many probes in a row: it is unreachable ([`Probes::down`]),
    /// for this reason.
    Down(String),
    /// An unreachable mapper failed again, for this reason.
    StillDown(String),
}

/// One mapper's liveness.
#[derive(Debug)]
pub(crate) struct Probes {
    alive: bool,
    /// Failed probes in a row.
    failures: u32,
    /// A probe is under way.
    probing: bool,
    next: Instant,
}

impl Probes {
    /// A mapper that just registered: alive, first probed one interval from `now`.
    pub(crate) fn new(now: Instant, l: &Liveness) -> Self {
        Self {
            alive: true,
            failures: 0,
            probing: false,
            next: now + l.interval,
        }
    }

    pub(crate) fn alive(&self) -> bool {
        self.alive
    }

    /// Whether to start a probe at `now`; when so, it is under way until [`Self::answered`].
    pub(crate) fn start(&mut self, now: Instant, l: &Liveness) -> bool {
        if self.probing || self.next > now {
            return false;
        }
        self.next = now + l.interval;
        self.probing = true;
        true
    }

    /// A probe ended: `Ok` when the mapper answered, or why it did not.
    pub(crate) fn answered(&mut self, result: Result<(), String>, l: &Liveness) -> Verdict {
        self.probing = false;
        match result {
            Ok(()) => {
                self.failures = 0;
                if self.alive {
                    Verdict::Same
                } else {
                    Verdict::Revived
                }
            }
            Err(error) => {
                self.failures = self.failures.saturating_add(1);
                if !self.alive {
                    Verdict::StillDown(error)
                } else if self.failures >= l.failures {
                    Verdict::Down(format!(
                        "{error} ({} probes in a row failed)",
                        self.failures
                    ))
                } else {
                    Verdict::Same
                }
            }
        }
    }

    /// It is unreachable (a verdict, or a failed call); `false` when it already was.
    pub(crate) fn down(&mut self) -> bool {
        std::mem::replace(&mut self.alive, false)
    }

    /// It answers again.
    pub(crate) fn up(&mut self) {
        self.alive = true;
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Liveness = Liveness {
        interval: Duration::from_secs(1),
        timeout: Duration::from_millis(500),
        failures: 3,
    };

    fn fail() -> Result<(), String> {
        Err("connection refused".into())
    }

    #[tokio::test(start_paused = true)]
    async fn a_mapper_is_probed_every_interval_and_never_twice_at_once() {
        let mut p = Probes::new(Instant::now(), &L);
        assert!(!p.start(Instant::now(), &L), "not before one interval");
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(!p.start(Instant::now(), &L));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(p.start(Instant::now(), &L), "due after one interval");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(
            !p.start(Instant::now(), &L),
            "a probe under way holds the next back, however long"
        );
        assert_eq!(p.answered(Ok(()), &L), Verdict::Same);
        assert!(p.start(Instant::now(), &L), "overdue: at once");
        p.answered(Ok(()), &L);
        assert!(!p.start(Instant::now(), &L), "then one interval again");
    }

    #[tokio::test(start_paused = true)]
    async fn failures_in_a_row_make_it_unreachable_and_one_answer_resets_the_count() {
        let mut p = Probes::new(Instant::now(), &L);
        assert_eq!(p.answered(fail(), &L), Verdict::Same);
        assert_eq!(p.answered(fail(), &L), Verdict::Same);
        assert_eq!(
            p.answered(Ok(()), &L),
            Verdict::Same,
            "the count starts again"
        );
        assert_eq!(p.answered(fail(), &L), Verdict::Same);
        assert_eq!(p.answered(fail(), &L), Verdict::Same);
        assert_eq!(
            p.answered(fail(), &L),
            Verdict::Down("connection refused (3 probes in a row failed)".into())
        );
        assert!(p.down());
        assert!(!p.alive());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_call_makes_it_unreachable_at_once() {
        let mut p = Probes::new(Instant::now(), &L);
        assert!(p.down(), "it was alive");
        assert!(!p.down(), "already down: nothing to do twice");
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_mapper_is_probed_on_and_its_first_answer_revives_it() {
        let mut p = Probes::new(Instant::now(), &L);
        p.down();
        tokio::time::advance(L.interval).await;
        assert!(p.start(Instant::now(), &L), "still probed");
        assert_eq!(
            p.answered(Err("no answer".into()), &L),
            Verdict::StillDown("no answer".into())
        );
        assert_eq!(p.answered(Ok(()), &L), Verdict::Revived);
        p.up();
        assert!(p.alive());
        assert_eq!(p.answered(fail(), &L), Verdict::Same, "a fresh count");
    }
}
