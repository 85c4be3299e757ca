//! The wall clock as the messages give it.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (KubeEdge's `timestamp` and the REST API's `timeStamp`);
/// 0 on a clock set before 1970.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}
