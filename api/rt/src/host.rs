//! This machine's host name, as the servers use it (a serving certificate's name, an election
//! identity, a `Host` the local API answers).

/// The kernel's host name, trimmed and lower-case; `None` when it cannot be read or is empty.
pub fn name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_lowercase())
        .filter(|h| !h.is_empty())
}
