//! Tokens: the admin token reaches everything, a session token only its own session. Session
//! tokens are stored as SHA-256 hashes; comparisons run in constant time; tokens are never logged.
//!
//! A sandboxd that knows its node (`SANDBOXD_NODE_NAME`) takes as admin token only the one
//! derived for that node from the master admin token ([`node_token`]), so a token that reaches
//! one node opens no other.

use rand::RngCore;
pub use sandboxd_api::auth::{NODE_TOKEN_CONTEXT, node_token};
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

    /// The admin token a sandboxd takes: the one derived for `node` from `master` when it
    /// knows its node (the master itself is then refused), else the master.
    pub fn accepted(master: &str, node: Option<&str>) -> Self {
        match node {
            Some(node) => Self::new(&node_token(master, node)),
            None => Self::new(master),
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
    fn node_tokens_match_a_fixed_vector() {
        // Computed independently:
        //   python3 -c 'import hmac, hashlib; print(hmac.new(b"master-secret",
        //     b"sandboxd-admin-token/v1/worker-1", hashlib.sha256).hexdigest())'
        // and `printf %s sandboxd-admin-token/v1/worker-1 |
        //   openssl dgst -sha256 -hmac master-secret` print the same.
        assert_eq!(
            node_token("master-secret", "worker-1"),
            "bbfec97528119c08a66defbe0f62aee6f7a0631364eb7af3de8340fea16add74"
        );
        assert_eq!(
            node_token("master-secret", "worker-2"),
            "87c38615d199acd2f4c90d1c3716c24bda792fa1e7cf3173836df8bd20b26e8c"
        );
        assert_ne!(
            node_token("master-secret", "worker-1"),
            node_token("other-master", "worker-1")
        );
    }

    #[test]
    fn a_node_takes_only_its_own_token() {
        let master = "master-secret";
        let on_a = AdminToken::accepted(master, Some("a"));
        assert!(on_a.matches(&node_token(master, "a")));
        assert!(!on_a.matches(master));
        assert!(!on_a.matches(&node_token(master, "b")));
        let single = AdminToken::accepted(master, None);
        assert!(single.matches(master));
        assert!(!single.matches(&node_token(master, "a")));
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
