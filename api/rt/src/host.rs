//! This machine's host name, as the servers use it (a serving certificate's name, an election
//! identity, a `Host` the local API answers).

/// The kernel's host name, trimmed and lower-case; `None` when it cannot be read or is empty.
pub fn name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_lowercase())
        .filter(|h| !h.is_empty())
}

/// The number of a group: `name` as a number, or its line in `/etc/group`.
pub fn group_id(name: &str) -> Option<u32> {
    if let Ok(n) = name.parse::<u32>() {
        return Some(n);
    }
    let text = std::fs::read_to_string("/etc/group").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then_some(())?;
        f.nth(1)?.parse().ok()
    })
}

/// A request's `Host`: its header, else the authority of its URI (HTTP/2), else "".
pub fn of_request<B>(req: &http::Request<B>) -> &str {
    req.headers()
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()))
        .unwrap_or_default()
}

/// Whether a request's `Host` is one a local API serves without a token: an IP address (a page
/// cannot rebind those), `localhost` or a name under it, or one of `names` (this machine's
/// host name and configured ones: [`served_names`]). A name a web page's own domain resolves
/// to this machine is none of these, so a page the operator opens cannot use the API (DNS
/// rebinding).
pub fn served(host: &str, names: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => {
            return v6
                .split_once(']')
                .is_some_and(|(ip, _)| ip.parse::<std::net::Ipv6Addr>().is_ok());
        }
        None => host.rsplit_once(':').map_or(host, |(n, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                n
            } else {
                host
            }
        }),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
        || names.iter().any(|c| c.eq_ignore_ascii_case(&name))
}

/// The names [`served`] answers besides IP addresses and `localhost`: `configured` and this
/// machine's host name.
pub fn served_names(configured: &[String]) -> std::sync::Arc<[String]> {
    configured.iter().cloned().chain(name()).collect()
}

/// Whether a request's `Origin` (when a browser sent one) is the page of the API itself:
/// `scheme://` followed by exactly the request's `Host`. Anything else (another site, `null`
/// from a sandboxed frame or a file) is a page that must not change state here.
pub fn same_origin(origin: &str, host: &str) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    matches!(scheme, "http" | "https") && !host.is_empty() && rest.eq_ignore_ascii_case(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_token_only_the_hosts_it_serves_are_answered() {
        let configured = ["gw-3.plant.example".to_string()];
        for host in [
            "127.0.0.1:10360",
            "127.0.0.1",
            "10.0.0.7:10360",
            "[::1]:10360",
            "localhost:10360",
            "LOCALHOST",
            "ui.localhost:8080",
            "gw-3.plant.example:10360",
            "gw-3.plant.example.",
        ] {
            assert!(served(host, &configured), "{host}");
        }
        for host in [
            "evil.example:10360",
            "evil.example",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "[evil]:80",
            "",
        ] {
            assert!(!served(host, &configured), "{host}");
        }
    }

    #[test]
    fn only_the_api_own_page_is_its_origin() {
        assert!(same_origin("http://127.0.0.1:7777", "127.0.0.1:7777"));
        assert!(same_origin("https://GW-3:7777", "gw-3:7777"));
        for (origin, host) in [
            ("http://evil.example", "127.0.0.1:7777"),
            ("http://127.0.0.1:8080", "127.0.0.1:7777"),
            ("http://127.0.0.1:7777.evil.example", "127.0.0.1:7777"),
            ("null", "127.0.0.1:7777"),
            ("file://", ""),
            ("ftp://127.0.0.1:7777", "127.0.0.1:7777"),
        ] {
            assert!(!same_origin(origin, host), "{origin} {host}");
        }
    }
}
