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
