//! What a session's sandbox reached through the egress proxy and resolver, and what was
//! refused: `GET /v1/sessions/{id}/egress`, one row per name, port, verdict and minute.

use serde::{Deserialize, Serialize};

/// One name, port and verdict within one minute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EgressRecord {
    /// The minute's start (RFC 3339).
    pub minute: String,
    /// The runtime the session ran on then.
    pub runtime: String,
    /// The name asked for (a TLS SNI, an HTTP Host, a DNS question), or the address dialled
    /// when there was none.
    pub name: String,
    /// The port (53 for DNS).
    pub port: u16,
    /// allowed or denied (a connection), resolved or refused (a DNS query).
    pub verdict: String,
    /// How many connections or queries.
    pub count: u64,
    /// Bytes sent by the sandbox.
    pub bytes_out: u64,
    /// Bytes received by the sandbox.
    pub bytes_in: u64,
    /// Why it was refused (the last reason of the minute); empty when allowed.
    pub reason: String,
}

/// A session's egress log, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EgressLog {
    /// The session.
    pub session: String,
    /// Its rows of the last `minutes` minutes.
    pub records: Vec<EgressRecord>,
}
