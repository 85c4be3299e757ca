//! Kubernetes name rules (DNS-1123) and KubeEdge's twin key rule.

/// Checks a DNS-1123 subdomain (object names): at most 253 characters of lower-case letters,
/// digits, `-` and `.`, starting and ending with a letter or digit.
pub fn check_dns1123_subdomain(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > 253 {
        return Err(format!("{name:?} is longer than 253 characters"));
    }
    for label in name.split('.') {
        check_label_chars(name, label)?;
    }
    Ok(())
}

/// Checks a DNS-1123 label (namespaces): at most 63 characters of lower-case letters, digits and
/// `-`, starting and ending with a letter or digit.
pub fn check_dns1123_label(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > 63 {
        return Err(format!("{name:?} is longer than 63 characters"));
    }
    check_label_chars(name, name)
}

fn check_label_chars(whole: &str, label: &str) -> Result<(), String> {
    let bad = || {
        Err(format!(
            "{whole:?} is not a valid DNS-1123 name: lower-case letters, digits and '-' only, \
             starting and ending with a letter or digit"
        ))
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
pub fn check_twin_key(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.chars().count() > 128 {
        return Err(format!("{name:?} is longer than 128 characters"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_.,:/@#".contains(*c)))
    {
        return Err(format!(
            "{name:?} contains {c:?}; a property name may hold letters, digits and -_.,:/@# only"
        ));
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
    fn twin_keys() {
        assert!(check_twin_key("temp_1:a/b@c#d,e.f-g").is_ok());
        assert!(check_twin_key("has space").is_err());
        assert!(check_twin_key("").is_err());
        assert!(check_twin_key(&"k".repeat(129)).is_err());
    }
}
