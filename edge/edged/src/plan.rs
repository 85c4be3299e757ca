//! The kubelet's decisions about a container, as pure functions of what the runtime shows and
//! the clock, so that each rule is a unit test: whether an exited container is restarted
//! (`restartPolicy`), how long it waits first (CrashLoopBackOff: a delay that doubles at each
//! exit up to a maximum, and starts over once a run lasted 10 minutes), and which dead
//! containers are removed after a new attempt starts. `Edged` carries the decisions out
//! against CRI.

use std::time::{Duration, Instant};

/// A run longer than this forgets the container's crash loop (the kubelet's 10 minutes).
pub const BACKOFF_RESET: Duration = Duration::from_secs(600);

/// A pod's `restartPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// The spec's value; anything but `Never` and `OnFailure` is `Always`, the default.
    pub fn from_spec(value: &str) -> Self {
        match value {
            "Never" => RestartPolicy::Never,
            "OnFailure" => RestartPolicy::OnFailure,
            _ => RestartPolicy::Always,
        }
    }

    /// Whether a container that stopped is started again: `exited` is false for a container
    /// that was created but never ran (or whose state is unknown), which `OnFailure` restarts.
    pub fn restarts(self, exited: bool, exit_code: i32) -> bool {
        match self {
            RestartPolicy::Never => false,
            RestartPolicy::OnFailure => !exited || exit_code != 0,
            RestartPolicy::Always => true,
        }
    }
}

/// The first and the longest restart delay (`initialBackoffMs`, `maxBackoffMs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delays {
    pub initial: Duration,
    pub max: Duration,
}

/// A container's crash loop: the delay before its next start, and the exited container it was
/// counted for (one exit counts once, however many syncs see it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrashLoop {
    pub delay: Duration,
    pub until: Instant,
    pub counted: String,
}

/// What to do about a container that is not running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterExit {
    /// Its policy keeps it stopped.
    Stay,
    /// CrashLoopBackOff: start it when `delay` (counted from its exit) has passed.
    Wait { delay: Duration },
    /// Start its next attempt now.
    Start,
}

/// The decision about the stopped container `container_id`, given its crash loop so far; and the
/// crash loop to keep (unchanged when the policy keeps it stopped).
pub fn after_exit(
    policy: RestartPolicy,
    exited: bool,
    exit_code: i32,
    container_id: &str,
    previous: Option<&CrashLoop>,
    delays: Delays,
    now: Instant,
) -> (AfterExit, Option<CrashLoop>) {
    if !policy.restarts(exited, exit_code) {
        return (AfterExit::Stay, previous.cloned());
    }
    let loop_ = match previous {
        Some(b) if b.counted == container_id => b.clone(),
        Some(b) => {
            let delay = (b.delay * 2).min(delays.max);
            CrashLoop {
                delay,
                until: now + delay,
                counted: container_id.to_string(),
            }
        }
        None => CrashLoop {
            delay: delays.initial,
            until: now + delays.initial,
            counted: container_id.to_string(),
        },
    };
    let decision = if now < loop_.until {
        AfterExit::Wait { delay: loop_.delay }
    } else {
        AfterExit::Start
    };
    (decision, Some(loop_))
}

/// Whether a container that has run for `ran` has left its crash loop behind.
pub fn crash_loop_forgotten(ran: Duration) -> bool {
    ran > BACKOFF_RESET
}

/// The attempts of a container's dead instances to remove once `started` runs: the kubelet
/// keeps the one before it (for `--previous` logs) and removes older ones.
pub fn dead_to_remove(attempts: &[u32], started: u32) -> Vec<u32> {
    attempts
        .iter()
        .copied()
        .filter(|a| a + 1 < started)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAYS: Delays = Delays {
        initial: Duration::from_secs(10),
        max: Duration::from_secs(300),
    };

    #[test]
    fn the_policy_decides_who_comes_back() {
        use RestartPolicy::*;
        let cases = [
            (Always, true, 0, true),
            (Always, true, 1, true),
            (OnFailure, true, 0, false),
            (OnFailure, true, 137, true),
            (OnFailure, false, 0, true),
            (Never, true, 1, false),
            (Never, false, 0, false),
        ];
        for (policy, exited, code, restarts) in cases {
            assert_eq!(
                policy.restarts(exited, code),
                restarts,
                "{policy:?} exited={exited} code={code}"
            );
        }
        assert_eq!(RestartPolicy::from_spec(""), Always);
        assert_eq!(RestartPolicy::from_spec("always"), Always);
        assert_eq!(RestartPolicy::from_spec("OnFailure"), OnFailure);
    }

    #[test]
    fn a_first_exit_waits_the_initial_delay_then_starts() {
        let t0 = Instant::now();
        let (d, b) = after_exit(RestartPolicy::Always, true, 1, "c1", None, DELAYS, t0);
        assert_eq!(
            d,
            AfterExit::Wait {
                delay: Duration::from_secs(10)
            }
        );
        let b = b.expect("a crash loop");
        assert_eq!(b.until, t0 + Duration::from_secs(10));
        // Seen again by later syncs: the same exit is not counted twice.
        let later = t0 + Duration::from_secs(9);
        let (d, b2) = after_exit(
            RestartPolicy::Always,
            true,
            1,
            "c1",
            Some(&b),
            DELAYS,
            later,
        );
        assert!(matches!(d, AfterExit::Wait { .. }));
        assert_eq!(b2.as_ref(), Some(&b));
        let (d, _) = after_exit(
            RestartPolicy::Always,
            true,
            1,
            "c1",
            Some(&b),
            DELAYS,
            t0 + Duration::from_secs(10),
        );
        assert_eq!(d, AfterExit::Start);
    }

    #[test]
    fn each_new_exit_doubles_the_delay_up_to_the_max() {
        let mut now = Instant::now();
        let mut b: Option<CrashLoop> = None;
        let mut delays = Vec::new();
        for i in 0..8 {
            let id = format!("c{i}");
            let (d, next) =
                after_exit(RestartPolicy::Always, true, 1, &id, b.as_ref(), DELAYS, now);
            let AfterExit::Wait { delay } = d else {
                panic!("exit {i}: {d:?}");
            };
            delays.push(delay.as_secs());
            now += delay;
            b = next;
        }
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn a_kept_stopped_container_leaves_its_crash_loop_as_it_was() {
        let t0 = Instant::now();
        let b = CrashLoop {
            delay: Duration::from_secs(40),
            until: t0,
            counted: "c1".into(),
        };
        let (d, kept) = after_exit(
            RestartPolicy::OnFailure,
            true,
            0,
            "c2",
            Some(&b),
            DELAYS,
            t0,
        );
        assert_eq!(d, AfterExit::Stay);
        assert_eq!(kept, Some(b));
    }

    #[test]
    fn ten_minutes_of_running_forget_the_crash_loop() {
        assert!(!crash_loop_forgotten(Duration::from_secs(600)));
        assert!(crash_loop_forgotten(Duration::from_secs(601)));
    }

    #[test]
    fn the_dead_instance_before_the_new_one_is_kept() {
        assert_eq!(dead_to_remove(&[0, 1, 2, 3], 4), [0, 1, 2]);
        assert_eq!(dead_to_remove(&[3], 4), Vec::<u32>::new());
        assert_eq!(dead_to_remove(&[], 0), Vec::<u32>::new());
    }
}
