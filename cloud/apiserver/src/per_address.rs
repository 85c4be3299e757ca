//! Work in progress by client address, bounded per address: at most `limit` things (TLS
//! handshakes on a listener, admission reviews) from one address at once, so that one host
//! neither takes every descriptor or slot nor shuts other hosts out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

/// TLS handshakes in progress at once from one client address, on one listener.
pub(crate) const MAX_HANDSHAKES_PER_ADDRESS: usize = 64;

/// What is in progress, by client address, with its bound per address.
#[derive(Clone)]
pub struct PerAddress {
    counts: Arc<std::sync::Mutex<HashMap<IpAddr, usize>>>,
    limit: usize,
}

/// One thing in progress for an address; ends when dropped.
pub struct Turn {
    of: PerAddress,
    ip: IpAddr,
}

impl PerAddress {
    /// At most `limit` at once per address.
    pub fn new(limit: usize) -> Self {
        PerAddress {
            counts: Arc::default(),
            limit,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One more from `ip` begins, or `None` when that address has its bound under way.
    pub fn begin(&self, ip: IpAddr) -> Option<Turn> {
        let mut m = self.lock();
        let n = m.entry(ip).or_default();
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(Turn {
            of: self.clone(),
            ip,
        })
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut m = self.of.lock();
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_gets_at_most_its_share_and_others_are_not_shut_out() {
        let h = PerAddress::new(MAX_HANDSHAKES_PER_ADDRESS);
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let mut held: Vec<Turn> = (0..MAX_HANDSHAKES_PER_ADDRESS)
            .map(|_| h.begin(a).expect("within the bound"))
            .collect();
        assert!(
            h.begin(a).is_none(),
            "one over the bound from the same address"
        );
        assert!(h.begin(b).is_some(), "another address is served");
        held.pop();
        assert!(h.begin(a).is_some(), "a finished one frees its place");
        drop(held);
        assert!(h.lock().get(&a).is_none_or(|n| *n == 0));
    }
}
