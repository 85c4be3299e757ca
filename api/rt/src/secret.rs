//! Comparing a secret a client sent (a password hash, a bearer token) with the one kept,
//! in time that does not depend on where they differ.

/// Whether `a` and `b` are equal, compared in constant time (for equal lengths).
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token in a token file: its first line, trimmed. An empty first line is an error
/// (`InvalidData`) saying so, not a token that matches an empty `Authorization`.
pub fn token_file(path: &std::path::Path) -> std::io::Result<String> {
    let text = std::fs::read_to_string(path)?;
    let token = text.lines().next().unwrap_or_default().trim().to_string();
    if token.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the file is empty: its first line is the token",
        ));
    }
    Ok(token)
}

/// The bearer token of an `Authorization` header's value (`Bearer TOKEN`), or "".
pub fn bearer(authorization: Option<&http::HeaderValue>) -> &str {
    authorization
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn equal_only_when_equal() {
        assert!(super::same(b"token", b"token"));
        assert!(!super::same(b"token", b"tokem"));
        assert!(!super::same(b"token", b"token2"));
        assert!(super::same(b"", b""));
    }
}
