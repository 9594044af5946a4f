//! Ports: a process in the sandbox listening on its loopback (`127.0.0.1:PORT` or
//! `0.0.0.0:PORT`), reached through sandboxd once the session has opened the port: HTTP (a
//! WebSocket upgrade included) under `/v1/sessions/{id}/ports/{port}/…`, and a raw TCP stream
//! as a WebSocket at `/v1/sessions/{id}/ports/{port}` (what `kubectl sandbox port-forward`
//! uses). sandboxd's agent makes the connection inside the sandbox, so it needs no network.

use serde::{Deserialize, Serialize};

/// Ports one session may have open at once.
pub const MAX_PORTS: usize = 16;

/// The body of `POST /v1/sessions/{id}/ports`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PortRequest {
    /// The port (1 to 65535).
    pub port: u16,
}

/// The body of `GET`/`POST /v1/sessions/{id}/ports` and `DELETE /v1/sessions/{id}/ports/{port}`:
/// the session's open ports, ascending.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PortList {
    /// The open ports.
    pub ports: Vec<u16>,
}

/// The longest a preview link lasts: 7 days.
pub const MAX_PREVIEW_SECONDS: u64 = 7 * 24 * 3600;

/// How long a preview link lasts when its request names no time: 1 hour.
pub const DEFAULT_PREVIEW_SECONDS: u64 = 3600;

/// The body of `POST /v1/sessions/{id}/previews`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviewRequest {
    /// The open port the link reaches (1 to 65535).
    pub port: u16,
    /// Seconds the link lasts: 1 to 604800 (7 days); 3600 when absent.
    #[serde(default)]
    pub expires_in_seconds: Option<u64>,
}

/// A signed preview link: `path` (under the sandboxd that made it) reaches the port with no
/// other credential until `expires_at`, for a browser. It is bound to the session and the port;
/// rotating the session's token, or the session going, ends every link of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Preview {
    /// The port.
    pub port: u16,
    /// The link, from the root of the sandboxd: `/preview/<token>/` (a path below it reaches
    /// that path of the port).
    pub path: String,
    /// The link's token (the credential: whoever has it reaches the port until it expires).
    pub token: String,
    /// When it stops working, RFC 3339.
    pub expires_at: String,
}
