//! The pause between retries of a loop that reconnects or re-tries: it starts at `first`,
//! doubles after every failure up to `max`, and starts over after a success. Every reconnecting
//! loop of the project uses this one type, so that they all back off alike.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// A backoff from `first` up to `max` (`max` is raised to `first` if lower).
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max: max.max(first),
            next: first,
        }
    }

    /// The pause to wait now, and doubles the next one (up to `max`).
    pub fn next_delay(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(self.max);
        now
    }

    /// Waits the pause of [`next_delay`](Self::next_delay).
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_delay()).await;
    }

    /// A success: the next failure waits `first` again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }

    /// The pause the next failure will wait.
    pub fn peek(&self) -> Duration {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_doubles_up_to_the_max_and_starts_over_after_a_success() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(10), ms(50));
        let got: Vec<_> = (0..5).map(|_| b.next_delay()).collect();
        assert_eq!(got, [ms(10), ms(20), ms(40), ms(50), ms(50)]);
        b.reset();
        assert_eq!(b.next_delay(), ms(10));
    }

    #[test]
    fn a_max_below_the_first_pause_is_the_first_pause() {
        let mut b = Backoff::new(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(b.next_delay(), Duration::from_secs(2));
        assert_eq!(b.next_delay(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn wait_sleeps_the_pause() {
        let mut b = Backoff::new(Duration::from_millis(300), Duration::from_secs(1));
        let t0 = tokio::time::Instant::now();
        b.wait().await;
        b.wait().await;
        assert_eq!(t0.elapsed(), Duration::from_millis(900));
    }
}
