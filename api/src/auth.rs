//! The admin token of one node, derived from the master token: what a sandboxd started with
//! `SANDBOXD_NODE_NAME` takes, and what the operator sends it; and the hash a token is kept as.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The hash a token is kept as: hex SHA-256 of its bytes (what sandboxd stores, and what a node
/// given only its token's hash compares with).
pub fn hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// What a node's admin token is derived with: the HMAC message is this, then the node's name.
pub const NODE_TOKEN_CONTEXT: &str = "sandboxd-admin-token/v1/";

/// The admin token of `node`: hex(HMAC-SHA256(key = the master admin token,
/// msg = [`NODE_TOKEN_CONTEXT`] + node)). What a sandboxd with `SANDBOXD_NODE_NAME=node`
/// accepts, and what the operator sends to a SandboxHost whose `spec.node` is `node`.
pub fn node_token(master: &str, node: &str) -> String {
    // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(master.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
    mac.update(NODE_TOKEN_CONTEXT.as_bytes());
    mac.update(node.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}
