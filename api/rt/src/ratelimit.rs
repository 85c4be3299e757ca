//! A token bucket for rates of messages: `qps` per second, up to `burst` at once. Waiting for a
//! token (rather than dropping) pushes back on whoever sends: the socket is read, or the queue
//! drained, no faster.

use std::time::Duration;
use tokio::time::Instant;

pub struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    pub fn new(qps: u32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: f64::from(qps.max(1)),
            burst,
            tokens: burst,
            at: Instant::now(),
        }
    }

    /// How long until a token is there (zero: now), without taking it: for a loop that does
    /// other work meanwhile instead of waiting in [`Bucket::take`].
    pub fn ready_in(&mut self) -> Duration {
        self.refill();
        if self.tokens >= 1.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((1.0 - self.tokens) / self.qps)
        }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.at).as_secs_f64() * self.qps).min(self.burst);
        self.at = now;
    }

    /// How long to wait before the next message may go (zero: now), taking its token.
    pub fn reserve(&mut self) -> Duration {
        self.reserve_n(1)
    }

    /// As [`Bucket::reserve`] for `n` tokens at once (a rate of bytes: one token per byte).
    pub fn reserve_n(&mut self, n: u32) -> Duration {
        self.refill();
        self.tokens -= f64::from(n);
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }

    /// Waits for a token.
    pub async fn take(&mut self) {
        self.take_n(1).await;
    }

    /// Waits for `n` tokens.
    pub async fn take_n(&mut self, n: u32) {
        let wait = self.reserve_n(n);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// A log line about something that may repeat fast (a peer's bad frames): the first one is
/// written, then at most one per `every`, saying how many were not written in between. The
/// count is what a metric gives; the log only says that it happens, and what it looks like.
pub struct Quiet {
    every: Duration,
    last: Option<Instant>,
    skipped: u64,
}

impl Quiet {
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            skipped: 0,
        }
    }

    /// One more happened: `Some(skipped since the last line)` when this one is to be logged.
    pub fn note(&mut self) -> Option<u64> {
        let now = Instant::now();
        match self.last {
            Some(t) if now.duration_since(t) < self.every => {
                self.skipped += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.skipped))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_goes_at_once_then_one_per_interval() {
        let mut b = Bucket::new(10, 3);
        for _ in 0..3 {
            assert_eq!(b.reserve(), Duration::ZERO);
        }
        assert_eq!(b.reserve(), Duration::from_millis(100));
        assert_eq!(
            b.reserve(),
            Duration::from_millis(200),
            "the next waits longer"
        );
        // Time refills the bucket at qps, never beyond the burst.
        tokio::time::advance(Duration::from_secs(10)).await;
        for _ in 0..3 {
            assert_eq!(b.reserve(), Duration::ZERO);
        }
        assert_eq!(b.reserve(), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn ready_in_says_when_a_token_is_there_without_taking_it() {
        let mut b = Bucket::new(10, 2);
        assert_eq!(b.ready_in(), Duration::ZERO);
        assert_eq!(b.ready_in(), Duration::ZERO, "asking takes nothing");
        b.reserve();
        b.reserve();
        assert_eq!(b.ready_in(), Duration::from_millis(100));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(b.ready_in(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_of_bytes_waits_in_proportion_to_the_bytes() {
        let mut b = Bucket::new(1000, 1000);
        assert_eq!(b.reserve_n(1000), Duration::ZERO);
        assert_eq!(b.reserve_n(500), Duration::from_millis(500));
        assert_eq!(b.reserve_n(1500), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_writes_one_line_then_one_per_interval_with_what_it_skipped() {
        let mut q = super::Quiet::new(Duration::from_secs(10));
        assert_eq!(q.note(), Some(0));
        for _ in 0..4999 {
            assert_eq!(q.note(), None);
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(q.note(), Some(4999));
        assert_eq!(q.note(), None);
    }
}
