//! Tokens: the admin token reaches everything, a session token only its own session. Session
//! tokens are stored as SHA-256 hashes; comparisons run in constant time; tokens are never logged.

use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The prefix of every session token, so a leaked one is recognisable.
pub const SESSION_TOKEN_PREFIX: &str = "sbx_";

/// The hex SHA-256 of a token: what is stored.
pub fn hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A new random session token (256 bits).
pub fn new_session_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{SESSION_TOKEN_PREFIX}{}", hex::encode(bytes))
}

/// The admin token, kept only as its hash.
#[derive(Clone)]
pub struct AdminToken {
    digest: [u8; 32],
}

impl AdminToken {
    /// Keeps the hash of `token`.
    pub fn new(token: &str) -> Self {
        Self {
            digest: Sha256::digest(token.as_bytes()).into(),
        }
    }

    /// Whether `presented` is the admin token, compared in constant time.
    pub fn matches(&self, presented: &str) -> bool {
        let d: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        bool::from(self.digest.ct_eq(&d))
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

/// Whether a stored hash matches a presented token, in constant time.
pub fn hash_matches(stored_hex: &str, presented: &str) -> bool {
    let presented = hash(presented);
    bool::from(stored_hex.as_bytes().ct_eq(presented.as_bytes()))
}

/// The bearer token of an `Authorization` header value.
pub fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_token_matches_only_itself() {
        let admin = AdminToken::new("admin-secret");
        assert!(admin.matches("admin-secret"));
        assert!(!admin.matches("admin-secreT"));
        assert!(!admin.matches(""));
        assert!(!format!("{admin:?}").contains("secret"));
    }

    #[test]
    fn session_tokens_are_random_and_stored_hashed() {
        let (a, b) = (new_session_token(), new_session_token());
        assert_ne!(a, b);
        assert!(a.starts_with(SESSION_TOKEN_PREFIX) && a.len() == SESSION_TOKEN_PREFIX.len() + 64);
        let stored = hash(&a);
        assert!(!stored.contains(&a[4..]));
        assert!(hash_matches(&stored, &a));
        assert!(!hash_matches(&stored, &b));
    }

    #[test]
    fn bearer_header() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(bearer("abc"), None);
    }
}
