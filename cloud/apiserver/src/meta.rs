//! Object metadata rules: names, labels, timestamps.

use crate::status::Cause;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

pub(crate) const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
pub(crate) const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// A DNS-1123 label (namespace names, resource plurals): `api::validate::names`' check.
pub(crate) fn is_dns_label(s: &str) -> bool {
    api::validate::names::check_dns1123_label(s).is_ok()
}

/// A DNS-1123 subdomain (object names): `api::validate::names`' check.
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    api::validate::names::check_dns1123_subdomain(s).is_ok()
}

/// Checks `metadata.name` (a DNS-1123 label for namespaces, a subdomain otherwise).
pub(crate) fn check_name(name: &str, label: bool) -> Option<Cause> {
    if name.is_empty() {
        return Some(Cause {
            reason: "FieldValueRequired",
            field: "metadata.name".into(),
            message: "Required value: name or generateName is required".into(),
        });
    }
    let (ok, msg) = if label {
        (is_dns_label(name), LABEL_MSG)
    } else {
        (is_dns_subdomain(name), SUBDOMAIN_MSG)
    };
    if ok {
        None
    } else if name.len() > if label { 63 } else { 253 } {
        Some(Cause::invalid(
            "metadata.name",
            &json!(name),
            &format!(
                "must be no more than {} characters",
                if label { 63 } else { 253 }
            ),
        ))
    } else {
        Some(Cause::invalid("metadata.name", &json!(name), msg))
    }
}

use api::validate::names::{label_key_ok as qualified_name_ok, label_value_ok};

/// Checks labels and annotation keys.
pub(crate) fn check_meta(meta: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    if let Some(labels) = meta.get("labels") {
        match labels.as_object() {
            Some(m) => {
                for (k, v) in m {
                    if !qualified_name_ok(k) {
                        causes.push(Cause::invalid(
                            "metadata.labels",
                            &json!(k),
                            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                        ));
                    }
                    match v.as_str() {
                        Some(s) if label_value_ok(s) => {}
                        _ => causes.push(Cause::invalid(
                            "metadata.labels",
                            v,
                            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                        )),
                    }
                }
            }
            None if labels.is_null() => {}
            None => causes.push(Cause::type_invalid(
                "metadata.labels",
                labels,
                "must be a map of strings",
            )),
        }
    }
    if let Some(ann) = meta.get("annotations") {
        match ann.as_object() {
            Some(m) => {
                let mut total = 0;
                for (k, v) in m {
                    total += k.len() + v.as_str().map(str::len).unwrap_or(0);
                    if !qualified_name_ok(k) {
                        causes.push(Cause::invalid(
                            "metadata.annotations",
                            &json!(k),
                            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                        ));
                    }
                    if !v.is_string() {
                        causes.push(Cause::type_invalid(
                            format!("metadata.annotations.{k}"),
                            v,
                            "must be a string",
                        ));
                    }
                }
                if total > 256 * 1024 {
                    causes.push(Cause::invalid(
                        "metadata.annotations",
                        &json!(""),
                        "Too long: must have at most 262144 bytes",
                    ));
                }
            }
            None if ann.is_null() => {}
            None => causes.push(Cause::type_invalid(
                "metadata.annotations",
                ann,
                "must be a map of strings",
            )),
        }
    }
    if let Some(f) = meta.get("finalizers")
        && !f.is_null()
        && !f
            .as_array()
            .is_some_and(|a| a.iter().all(|x| x.as_str().is_some_and(qualified_name_ok)))
    {
        causes.push(Cause::invalid(
            "metadata.finalizers",
            f,
            "must be a list of qualified names",
        ));
    }
    causes
}

pub(crate) fn now_rfc3339() -> String {
    rfc3339(OffsetDateTime::now_utc())
}

pub(crate) fn rfc3339(t: OffsetDateTime) -> String {
    api::rfc3339::format(t)
}

/// Seconds since an RFC 3339 time, if it parses.
pub(crate) fn age_seconds(ts: &str) -> Option<i64> {
    let t = OffsetDateTime::parse(ts, &Rfc3339).ok()?;
    Some((OffsetDateTime::now_utc() - t).whole_seconds())
}

/// An age as kubectl prints it (`5s`, `3m12s`, `4h`, `12d`), as Kubernetes' `HumanDuration`.
pub(crate) fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 192 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let d = (hours / 24) % 365;
        return if d == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{d}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// A random 5-character suffix for `generateName`, from the alphabet Kubernetes uses.
pub(crate) fn name_suffix() -> String {
    const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let id = uuid::Uuid::new_v4();
    id.as_bytes()[..5]
        .iter()
        .map(|b| ALPHA[*b as usize % ALPHA.len()] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_dns_subdomain("plc-1.floor2"));
        assert!(!is_dns_subdomain("PLC_1"));
        assert!(!is_dns_label("a.b"));
        assert!(check_name("Bad_Name", false).is_some());
        assert!(check_name(&"a".repeat(64), true).is_some());
    }

    #[test]
    fn durations_as_kubectl_prints() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(192), "3m12s");
        assert_eq!(human_duration(3 * 3600), "3h");
        assert_eq!(human_duration(3 * 86_400 + 3600), "3d1h");
        assert_eq!(human_duration(30 * 86_400), "30d");
    }
}
