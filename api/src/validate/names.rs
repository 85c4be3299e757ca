//! Kubernetes name rules (DNS-1123) and KubeEdge's twin key rule.

use std::fmt;

/// Why a name was refused. The name is shown by its first characters only, so that the error
/// about a 1 MiB name stays small.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("must not be empty")]
    Empty,
    #[error("{name} is longer than {max} characters")]
    TooLong { name: Excerpt, max: usize },
    #[error(
        "{name} is not a valid DNS-1123 name: lower-case letters, digits and '-' only, \
         starting and ending with a letter or digit"
    )]
    NotDns1123 { name: Excerpt },
    #[error(
        "{name} contains {found:?}; a property name may hold letters, digits and -_.,:/@# only"
    )]
    NotTwinKey { name: Excerpt, found: char },
}

/// A text as an error message shows it: whole when short, else its first 64 characters and
/// the total length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excerpt(String);

impl Excerpt {
    const SHOWN: usize = 64;

    /// Quoted, as Rust's `{:?}` quotes a string.
    pub fn of(text: &str) -> Self {
        Self::shown(text, |t| format!("{t:?}"))
    }

    /// As it is, where the message format has no quotes (Kubernetes' own messages).
    pub fn plain(text: &str) -> Self {
        Self::shown(text, str::to_string)
    }

    fn shown(text: &str, show: impl Fn(&str) -> String) -> Self {
        let count = text.chars().count();
        if count <= Self::SHOWN {
            return Self(show(text));
        }
        let head: String = text.chars().take(Self::SHOWN).collect();
        Self(format!("{}... ({count} characters)", show(&head)))
    }
}

impl fmt::Display for Excerpt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks a DNS-1123 subdomain (object names): at most 253 characters of lower-case letters,
/// digits, `-` and `.`, starting and ending with a letter or digit.
pub fn check_dns1123_subdomain(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > 253 {
        return Err(NameError::TooLong {
            name: Excerpt::of(name),
            max: 253,
        });
    }
    for label in name.split('.') {
        check_label_chars(name, label)?;
    }
    Ok(())
}

/// Checks a DNS-1123 label (namespaces): at most 63 characters of lower-case letters, digits and
/// `-`, starting and ending with a letter or digit.
pub fn check_dns1123_label(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > 63 {
        return Err(NameError::TooLong {
            name: Excerpt::of(name),
            max: 63,
        });
    }
    check_label_chars(name, name)
}

/// Whether `key` is a label (or annotation) key, a Kubernetes qualified name: an optional
/// prefix that is a DNS-1123 subdomain and `/`, then a name of 1 to 63 letters, digits, `-`,
/// `_` and `.`, starting and ending with a letter or digit.
pub fn label_key_ok(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let dns_label = |s: &str| {
        let b = s.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    };
    !name.is_empty()
        && label_value_ok(name)
        && prefix.is_none_or(|p| !p.is_empty() && p.len() <= 253 && p.split('.').all(dns_label))
}

/// Whether `value` is a label value: empty, or at most 63 letters, digits, `-`, `_` and `.`,
/// starting and ending with a letter or digit.
pub fn label_value_ok(value: &str) -> bool {
    value.is_empty()
        || (value.len() <= 63
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && value.starts_with(|c: char| c.is_ascii_alphanumeric())
            && value.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

fn check_label_chars(whole: &str, label: &str) -> Result<(), NameError> {
    let bad = || {
        Err(NameError::NotDns1123 {
            name: Excerpt::of(whole),
        })
    };
    let Some(first) = label.chars().next() else {
        return bad();
    };
    let last = label.chars().last().unwrap_or(first);
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return bad();
    }
    if label
        .chars()
        .any(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
    {
        return bad();
    }
    Ok(())
}

/// Checks a property name as a twin key: 1 to 128 characters of letters, digits and `-_.,:/@#`
/// (KubeEdge's edge rejects any other twin key).
pub fn check_twin_key(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.chars().count() > 128 {
        return Err(NameError::TooLong {
            name: Excerpt::of(name),
            max: 128,
        });
    }
    if let Some(found) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_.,:/@#".contains(*c)))
    {
        return Err(NameError::NotTwinKey {
            name: Excerpt::of(name),
            found,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns1123_subdomains() {
        for ok in ["a", "beta1-device", "a.b-c.d", "0abc"] {
            assert!(check_dns1123_subdomain(ok).is_ok(), "{ok}");
        }
        for bad in ["", "A", "-a", "a-", "a..b", "a_b", "ä", &"a".repeat(254)] {
            assert!(check_dns1123_subdomain(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn dns1123_labels_reject_dots_and_length() {
        assert!(check_dns1123_label("default").is_ok());
        assert!(check_dns1123_label("a.b").is_err());
        assert!(check_dns1123_label(&"a".repeat(64)).is_err());
    }

    #[test]
    fn label_keys_and_values_are_kubernetes_qualified_names() {
        for ok in ["site", "example.com/line", "a_b.c-1", "k8s.io/x"] {
            assert!(label_key_ok(ok), "{ok}");
        }
        for bad in [
            "",
            "/x",
            "Example.com/x",
            "a/",
            "-a",
            "a b",
            &"a".repeat(64),
        ] {
            assert!(!label_key_ok(bad), "{bad}");
        }
        assert!(label_value_ok("") && label_value_ok("plant-3"));
        assert!(!label_value_ok("plant 3") && !label_value_ok("-x"));
    }

    #[test]
    fn twin_keys() {
        assert!(check_twin_key("temp_1:a/b@c#d,e.f-g").is_ok());
        assert!(check_twin_key("has space").is_err());
        assert!(check_twin_key("").is_err());
        assert!(check_twin_key(&"k".repeat(129)).is_err());
    }

    #[test]
    fn an_error_quotes_a_long_name_by_its_head_only() {
        let long = "a".repeat(1 << 20);
        let message = check_dns1123_subdomain(&long)
            .expect_err("too long")
            .to_string();
        assert!(message.len() < 200, "{} bytes", message.len());
        assert!(message.contains("(1048576 characters)"), "{message}");
        assert!(message.contains("longer than 253"), "{message}");
    }
}
