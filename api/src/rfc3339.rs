//! Times as Kubernetes writes them: RFC 3339 in UTC, to the whole second
//! (`2026-11-29T10:00:00Z`). One formatter for every crate (conditions, Events, pod status,
//! metrics, job results, twins' `lastOnlineTime`).

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// `t` in UTC, to the whole second.
pub fn format(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    let t = t.replace_nanosecond(0).unwrap_or(t);
    t.format(&Rfc3339).unwrap_or_default()
}

/// Now, in UTC, to the whole second.
pub fn now() -> String {
    format(OffsetDateTime::now_utc())
}

/// A `SystemTime`, to the whole second.
pub fn of_system(t: std::time::SystemTime) -> String {
    format(OffsetDateTime::from(t))
}

/// Unix seconds; `None` out of range.
pub fn of_unix_seconds(s: i64) -> Option<String> {
    OffsetDateTime::from_unix_timestamp(s).ok().map(format)
}

/// Unix nanoseconds, to the whole second; `None` out of range.
pub fn of_unix_nanos(n: i128) -> Option<String> {
    OffsetDateTime::from_unix_timestamp_nanos(n)
        .ok()
        .map(format)
}

#[cfg(test)]
mod tests {
    #[test]
    fn whole_seconds_in_utc() {
        assert_eq!(
            super::of_unix_nanos(1_764_410_400_999_999_999).as_deref(),
            Some("2025-11-29T10:00:00Z")
        );
        assert_eq!(
            super::of_unix_seconds(0).as_deref(),
            Some("1970-01-01T00:00:00Z")
        );
        assert_eq!(super::of_unix_seconds(i64::MAX), None);
        let offset = time::OffsetDateTime::from_unix_timestamp(3600)
            .expect("t")
            .to_offset(time::UtcOffset::from_hms(2, 0, 0).expect("offset"));
        assert_eq!(super::format(offset), "1970-01-01T01:00:00Z");
    }
}
