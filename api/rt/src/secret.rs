//! Comparing a secret a client sent (a password hash, a bearer token) with the one kept,
//! in time that does not depend on where they differ.

/// Whether `a` and `b` are equal, compared in constant time (for equal lengths).
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
