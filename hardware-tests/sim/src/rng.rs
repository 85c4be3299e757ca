//! A small seeded generator for the property tests (xorshift64): the same seed gives the same
//! cases, and a failing run prints the seed to repeat it.

/// xorshift64.
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value; 0 is made odd).
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// The seed in the environment variable `var`, else one from the clock; printed as `VAR=seed`
/// so that a failing run can be repeated.
pub fn seed(var: &str) -> u64 {
    let seed = std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    println!("{var}={seed}");
    seed
}
