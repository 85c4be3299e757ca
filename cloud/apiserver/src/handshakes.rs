//! The TLS handshakes in progress on a listener, by client address: at most
//! [`MAX_HANDSHAKES_PER_ADDRESS`] from one address at once, so that one host's half-open
//! connections neither take every descriptor nor shut other hosts out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

/// TLS handshakes in progress at once from one client address, on one listener.
pub(crate) const MAX_HANDSHAKES_PER_ADDRESS: usize = 64;

/// The TLS handshakes in progress, by client address.
#[derive(Clone, Default)]
pub(crate) struct Handshakes(Arc<std::sync::Mutex<HashMap<IpAddr, usize>>>);

/// One handshake in progress; ends when dropped.
pub(crate) struct Handshake {
    of: Handshakes,
    ip: IpAddr,
}

impl Handshakes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A handshake from `ip` begins, or `None` when that address has too many under way.
    pub(crate) fn begin(&self, ip: IpAddr) -> Option<Handshake> {
        let mut m = self.lock();
        let n = m.entry(ip).or_default();
        if *n >= MAX_HANDSHAKES_PER_ADDRESS {
            return None;
        }
        *n += 1;
        Some(Handshake {
            of: self.clone(),
            ip,
        })
    }
}

impl Drop for Handshake {
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
    fn one_address_gets_at_most_its_share_of_handshakes_and_others_are_not_shut_out() {
        let h = Handshakes::default();
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let mut held: Vec<Handshake> = (0..MAX_HANDSHAKES_PER_ADDRESS)
            .map(|_| h.begin(a).expect("within the bound"))
            .collect();
        assert!(
            h.begin(a).is_none(),
            "one over the bound from the same address"
        );
        assert!(h.begin(b).is_some(), "another address is served");
        held.pop();
        assert!(h.begin(a).is_some(), "a finished handshake frees its place");
        drop(held);
        assert!(h.lock().get(&a).is_none_or(|n| *n == 0));
    }
}
