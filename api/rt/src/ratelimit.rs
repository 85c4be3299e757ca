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
}
