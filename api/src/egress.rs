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
    /// Why it was refused (the last reason of the minute); empty when allowed, but for a
    /// connection the egress proxy added a credential to: `credential added: <source>` (never
    /// the value).
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

/// The most credentials one session may be handed.
pub const MAX_CREDENTIALS: usize = 16;
/// The longest header value a credential may carry, in bytes.
pub const MAX_CREDENTIAL_VALUE: usize = 8 * 1024;

/// The credentials the egress proxy adds to a session's requests (`PUT
/// /v1/sessions/{id}/credentials`, admin token): the operator resolves them from Secrets and
/// hands them over; sandboxd keeps them in memory only and replaces the whole set at each call.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CredentialSet {
    /// What the sender calls this set (a digest of the Secrets' versions, never of their
    /// values); shown back as `credentials_version` of the session, so a sender sees whether
    /// the host holds it (a restarted sandboxd holds none).
    pub version: String,
    /// The credentials, at most [`MAX_CREDENTIALS`].
    #[serde(default)]
    pub credentials: Vec<CredentialValue>,
}

/// One credential: the header set on every request to `host` on one of `ports` through the
/// egress proxy (TLS terminated there with the node's egress CA, which the sandbox trusts).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CredentialValue {
    /// The exact host name (lowercase, no wildcard); the session's egress policy must allow it
    /// on every port.
    pub host: String,
    /// The ports it applies on; none listed means 443.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    /// The header set (replacing any the sandbox sent), e.g. `Authorization`.
    pub header: String,
    /// Where the value comes from, in words for logs, audit rows and errors, e.g.
    /// `Secret agents/model-key, key token`. Never the value.
    pub source: String,
    /// The header's value, formatted (e.g. `Bearer sk-…`). Absent when `missing` says why
    /// there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Why there is no value (the Secret or its key is gone): the proxy answers such a
    /// request 502 with these words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
}

impl CredentialValue {
    /// The ports it applies on: its own, else 443.
    pub fn effective_ports(&self) -> &[u16] {
        if self.ports.is_empty() {
            &[443]
        } else {
            &self.ports
        }
    }
}

/// Never the value: a credential printed (a log line, an error, a test's assertion) shows
/// where it comes from and whether it is there.
impl std::fmt::Debug for CredentialValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialValue")
            .field("host", &self.host)
            .field("ports", &self.ports)
            .field("header", &self.header)
            .field("source", &self.source)
            .field("value", &self.value.as_ref().map(|_| "<redacted>"))
            .field("missing", &self.missing)
            .finish()
    }
}

impl std::fmt::Debug for CredentialSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialSet")
            .field("version", &self.version)
            .field("credentials", &self.credentials)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_printed_never_shows_its_value() {
        let set = CredentialSet {
            version: "v1".into(),
            credentials: vec![CredentialValue {
                host: "api.test".into(),
                ports: vec![],
                header: "Authorization".into(),
                source: "Secret agents/model-key, key token".into(),
                value: Some("Bearer sk-very-secret".into()),
                missing: None,
            }],
        };
        let shown = format!("{set:?}");
        assert!(!shown.contains("sk-very-secret"), "{shown}");
        assert!(shown.contains("<redacted>") && shown.contains("Secret agents/model-key"));
        assert_eq!(set.credentials[0].effective_ports(), [443]);
    }
}
