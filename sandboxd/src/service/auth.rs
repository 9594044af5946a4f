//! Tokens: the admin token reaches everything, a session token only its own session. Session
//! tokens are stored as SHA-256 hashes; comparisons run in constant time; tokens are never logged.
//!
//! A sandboxd that knows its node (`SANDBOXD_NODE_NAME`) takes as admin token only the one
//! derived for that node from the master admin token ([`node_token`]), so a token that reaches
//! one node opens no other.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::RngCore;
pub use sandboxd_api::auth::{NODE_TOKEN_CONTEXT, hash, node_token};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tracing::{info, warn};

/// The prefix of every session token, so a leaked one is recognisable.
pub const SESSION_TOKEN_PREFIX: &str = "sbx_";

/// The hex SHA-256 of a token: what is stored.
/// A new random session token (256 bits).
pub fn new_session_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{SESSION_TOKEN_PREFIX}{}", hex::encode(bytes))
}

/// The admin token, kept only as its hash: fixed at start, or read from a file of hashes.
#[derive(Clone)]
pub struct AdminToken {
    source: Arc<Source>,
}

enum Source {
    Fixed([u8; 32]),
    File(HashFile),
}

/// How long a hash read from its file is used before the file is read again, so a changed
/// (rotated) token is taken and the old one refused within this time.
pub const HASH_REREAD: Duration = Duration::from_secs(5);
/// The least time between two reads of the file when a presented token does not match: a token
/// whose hash was just written is taken within this time, and refused tokens cannot make
/// sandboxd read the file more often.
pub const HASH_REREAD_ON_MISS: Duration = Duration::from_secs(1);

/// The hash of one node's admin token in a file `<dir>/<node>` (hex SHA-256, 64 digits).
struct HashFile {
    path: PathBuf,
    state: Mutex<HashState>,
}

#[derive(Default)]
struct HashState {
    digest: Option<[u8; 32]>,
    read_at: Option<Instant>,
    /// What the last read found, to log only changes.
    seen: Option<Found>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Found {
    Hash,
    Missing,
    Invalid,
}

/// The hash in `path`, or what is wrong with it.
fn read_hash(path: &Path) -> Result<[u8; 32], (Found, String)> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err((Found::Missing, "no such file".into()));
        }
        Err(e) => return Err((Found::Invalid, format!("cannot be read: {e}"))),
    };
    let text = text.trim();
    let mut digest = [0u8; 32];
    match hex::decode_to_slice(text, &mut digest) {
        Ok(()) => Ok(digest),
        Err(_) => Err((
            Found::Invalid,
            format!(
                "holds {} characters, not the 64 hex digits of a SHA-256",
                text.chars().count()
            ),
        )),
    }
}

impl HashFile {
    /// Reads the file again and logs what changed.
    fn reread(&self, state: &mut HashState) {
        let found = read_hash(&self.path);
        state.read_at = Some(Instant::now());
        let kind = match &found {
            Ok(_) => Found::Hash,
            Err((kind, _)) => *kind,
        };
        let changed = match (&found, state.digest) {
            (Ok(d), Some(old)) => *d != old,
            _ => state.seen != Some(kind),
        };
        if changed {
            match &found {
                Ok(_) => {
                    info!(file = %self.path.display(), "admin token hash for this node read: this node's token is taken")
                }
                Err((Found::Missing, _)) => {
                    warn!(file = %self.path.display(), "no admin token hash for this node yet: every admin request is refused until the operator writes it (it does when it sees this node's SandboxHost)")
                }
                Err((_, why)) => {
                    warn!(file = %self.path.display(), why = %why, "the admin token hash for this node is unusable: every admin request is refused until it is fixed")
                }
            }
        }
        state.seen = Some(kind);
        state.digest = found.ok();
    }

    fn matches(&self, presented: &[u8; 32]) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.read_at.is_none_or(|at| at.elapsed() >= HASH_REREAD) {
            self.reread(&mut state);
        }
        let hit = |s: &HashState| s.digest.is_some_and(|d| bool::from(d.ct_eq(presented)));
        if hit(&state) {
            return true;
        }
        if state
            .read_at
            .is_none_or(|at| at.elapsed() >= HASH_REREAD_ON_MISS)
        {
            self.reread(&mut state);
            return hit(&state);
        }
        false
    }
}

impl AdminToken {
    /// Keeps the hash of `token`.
    pub fn new(token: &str) -> Self {
        Self {
            source: Arc::new(Source::Fixed(Sha256::digest(token.as_bytes()).into())),
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

    /// The token whose hex SHA-256 is in `dir/node`, read now and again every
    /// [`HASH_REREAD`] and on a token that does not match (at most every
    /// [`HASH_REREAD_ON_MISS`]). While the file is missing or unusable, every token is refused.
    pub fn hash_file(dir: &Path, node: &str) -> Self {
        let file = HashFile {
            path: dir.join(node),
            state: Mutex::default(),
        };
        file.reread(&mut file.state.lock().unwrap_or_else(|p| p.into_inner()));
        Self {
            source: Arc::new(Source::File(file)),
        }
    }

    /// Whether `presented` is the admin token, compared in constant time.
    pub fn matches(&self, presented: &str) -> bool {
        let d: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        match self.source.as_ref() {
            Source::Fixed(digest) => bool::from(digest.ct_eq(&d)),
            Source::File(file) => file.matches(&d),
        }
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
    fn a_hash_file_takes_its_token_once_it_appears_and_follows_its_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let admin = AdminToken::hash_file(dir.path(), "node-a");
        assert!(!admin.matches("token-a"), "no file: nothing is taken");
        std::thread::sleep(HASH_REREAD_ON_MISS);
        std::fs::write(dir.path().join("node-a"), format!("{}\n", hash("token-a"))).expect("write");
        assert!(admin.matches("token-a"), "read again on a miss");
        assert!(!admin.matches("token-b"));
        std::thread::sleep(HASH_REREAD_ON_MISS);
        std::fs::write(dir.path().join("node-a"), hash("token-b")).expect("write");
        assert!(
            admin.matches("token-b"),
            "a changed hash is taken on a miss"
        );
        std::thread::sleep(HASH_REREAD);
        assert!(
            !admin.matches("token-a"),
            "the old token is refused once read again"
        );
        std::fs::write(dir.path().join("node-a"), "not a hash").expect("write");
        std::thread::sleep(HASH_REREAD);
        assert!(
            !admin.matches("token-b"),
            "an unusable file refuses every token"
        );
        assert!(!admin.matches("not a hash"));
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
