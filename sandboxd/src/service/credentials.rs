//! A session's egress credentials (`PUT /v1/sessions/{id}/credentials`): checked whole, then
//! handed to the egress gate, which keeps them in memory only. What is refused is said in
//! words that name the credential by its place, host, header and source, never its value;
//! the audit row names the same, never a value.

use sandboxd_api::audit::Op;
use sandboxd_api::egress::{CredentialSet, CredentialValue, MAX_CREDENTIAL_VALUE, MAX_CREDENTIALS};
use sandboxd_catalog::egress::EgressMode;

use super::{Actor, Core, Outcome, ServiceError, SessionView};
use crate::egress::Principal;

/// Headers a credential may not set: the ones that frame a message or belong to one hop.
pub const FORBIDDEN_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
];

/// The longest `version`, `source` or `missing` text.
const MAX_TEXT: usize = 512;

/// Whether `name` is an exact lowercase DNS name (no wildcard, not an address).
fn host_error(host: &str) -> Option<String> {
    if host.is_empty() || host.len() > 253 {
        return Some("a host must be a DNS name of 1 to 253 characters".into());
    }
    if host.contains('*') {
        return Some("a host must be an exact name, not a wildcard".into());
    }
    if host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[') {
        return Some("a host must be a DNS name, not an address".into());
    }
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        return Some("a host must be lowercase".into());
    }
    let labels: Vec<&str> = host.split('.').collect();
    let bad_label = labels.iter().any(|l| {
        l.is_empty()
            || l.len() > 63
            || l.starts_with('-')
            || l.ends_with('-')
            || !l
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    });
    if bad_label {
        return Some(
            "a host must be a DNS name: labels of 1 to 63 of a-z, 0-9 and '-' (not first or last), joined by '.'"
                .into(),
        );
    }
    if labels
        .last()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
    {
        return Some("a host must be a DNS name, not an address".into());
    }
    None
}

/// Whether `header` is an HTTP token a credential may set.
fn header_error(header: &str) -> Option<String> {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if header.is_empty() || !header.bytes().all(tchar) {
        return Some(format!(
            "header '{}' is not an HTTP header name (a token: letters, digits and !#$%&'*+-.^_`|~)",
            header.escape_default()
        ));
    }
    let lower = header.to_ascii_lowercase();
    if FORBIDDEN_HEADERS.contains(&lower.as_str()) {
        return Some(format!(
            "header '{header}' frames the message or belongs to one hop; a credential may not set it (nor any of {})",
            FORBIDDEN_HEADERS.join(", ")
        ));
    }
    None
}

/// A text of the request (version, source, missing): 1 to [`MAX_TEXT`] bytes, no control
/// character.
fn text_error(what: &str, text: &str) -> Option<String> {
    if text.trim().is_empty() || text.len() > MAX_TEXT || text.chars().any(char::is_control) {
        return Some(format!(
            "{what} must be 1 to {MAX_TEXT} bytes without control characters"
        ));
    }
    None
}

/// What is wrong with one credential, apart from the policy: its words, or `None`.
fn credential_error(c: &CredentialValue) -> Option<String> {
    if let Some(e) = host_error(&c.host) {
        return Some(format!("host '{}': {e}", c.host.escape_default()));
    }
    if c.ports.contains(&0) {
        return Some(format!("{}: port 0 is not a port", c.host));
    }
    if let Some(e) = header_error(&c.header) {
        return Some(e);
    }
    if let Some(e) = text_error("source", &c.source) {
        return Some(e);
    }
    match (&c.value, &c.missing) {
        (Some(_), Some(_)) | (None, None) => {
            return Some(format!(
                "{} {} ({}): exactly one of value and missing is needed",
                c.host, c.header, c.source
            ));
        }
        (Some(value), None) => {
            if value.len() > MAX_CREDENTIAL_VALUE {
                return Some(format!(
                    "{} {} ({}): the value is {} bytes, more than {MAX_CREDENTIAL_VALUE}",
                    c.host,
                    c.header,
                    c.source,
                    value.len()
                ));
            }
            if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0)
                || hyper::header::HeaderValue::from_str(value).is_err()
            {
                return Some(format!(
                    "{} {} ({}): the value is not a valid header value (no CR, LF, NUL or other control character)",
                    c.host, c.header, c.source
                ));
            }
        }
        (None, Some(missing)) => {
            if let Some(e) = text_error("missing", missing) {
                return Some(format!("{} {} ({}): {e}", c.host, c.header, c.source));
            }
        }
    }
    None
}

impl Core {
    /// Replaces session `id`'s egress credentials with `set`, checked whole first: nothing
    /// changes when any of it is refused. Recorded in the audit log (hosts, headers and
    /// sources, never a value).
    pub async fn put_credentials(
        &self,
        id: &str,
        set: CredentialSet,
        actor: &Actor,
    ) -> Result<SessionView, ServiceError> {
        let started = std::time::Instant::now();
        let row = self.row(id).await?;
        let checked = self.check_credentials(id, &row.runtime, &set);
        let target = set
            .credentials
            .iter()
            .map(|c| {
                let ports = c
                    .effective_ports()
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",");
                format!(
                    "{}:{ports} {} ({}){}",
                    c.host,
                    c.header,
                    c.source,
                    if c.value.is_some() { "" } else { " missing" }
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        let target = format!("credentials {}: {target}", set.version);
        let outcome = match &checked {
            Ok(()) => Outcome {
                ok: true,
                ..Outcome::default()
            },
            Err(e) => Outcome {
                ok: false,
                error: Some(e.to_string()),
                ..Outcome::default()
            },
        };
        if checked.is_ok()
            && let Some(egress) = &self.egress
        {
            egress.gate.set_credentials(id, set);
        }
        self.record(id, actor, Op::Credentials, &target, outcome, started);
        checked?;
        tracing::info!(session = id, "egress credentials replaced");
        self.get(id, false).await
    }

    /// Every refusal of `set` for session `id` of `runtime`, the first one said.
    fn check_credentials(
        &self,
        id: &str,
        runtime: &str,
        set: &CredentialSet,
    ) -> Result<(), ServiceError> {
        let Some(egress) = &self.egress else {
            return Err(ServiceError::invalid(
                "this sandboxd has no egress proxy: credentials cannot be added",
            ));
        };
        if let Some(e) = text_error("version", &set.version) {
            return Err(ServiceError::invalid(e));
        }
        if set.credentials.len() > MAX_CREDENTIALS {
            return Err(ServiceError::invalid(format!(
                "{} credentials: a session holds at most {MAX_CREDENTIALS}",
                set.credentials.len()
            )));
        }
        let mode = self.runtimes.egress_of(runtime).map(|e| e.mode);
        if !set.credentials.is_empty() && mode != Some(EgressMode::Allowlist) {
            return Err(ServiceError::invalid(format!(
                "session {id} (runtime {runtime}) does not reach the network through the egress proxy (its runtime's egress mode is not allowlist): credentials cannot be added to it"
            )));
        }
        let who = Principal {
            session: id.to_owned(),
            runtime: runtime.to_owned(),
            extra: egress.gate.extra_of(id).unwrap_or_default(),
        };
        let policies = egress.gate.policies(&who);
        let mut seen: Vec<(String, u16, usize)> = vec![];
        for (i, c) in set.credentials.iter().enumerate() {
            if let Some(e) = credential_error(c) {
                return Err(ServiceError::invalid(format!("credential {i}: {e}")));
            }
            for &port in c.effective_ports() {
                if !policies.allows(&c.host, port) {
                    return Err(ServiceError::invalid(format!(
                        "credential {i}: {}:{port} is not allowed by the egress policy of {}: a credential's host must be on the allow list",
                        c.host,
                        who.describe()
                    )));
                }
                if let Some((_, _, j)) = seen.iter().find(|(h, p, _)| *h == c.host && *p == port) {
                    return Err(ServiceError::invalid(format!(
                        "credential {i}: {}:{port} has a credential already (credential {j}); one host and port take one",
                        c.host
                    )));
                }
                seen.push((c.host.clone(), port, i));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred(
        host: &str,
        header: &str,
        value: Option<&str>,
        missing: Option<&str>,
    ) -> CredentialValue {
        CredentialValue {
            host: host.into(),
            ports: vec![],
            header: header.into(),
            source: "Secret a/b, key k".into(),
            value: value.map(Into::into),
            missing: missing.map(Into::into),
        }
    }

    #[test]
    fn a_credential_is_checked_without_its_value_in_the_words() {
        let ok = cred("api.test", "Authorization", Some("Bearer sk-1"), None);
        assert_eq!(credential_error(&ok), None);
        for (c, words) in [
            (cred("*.test", "a", Some("v"), None), "not a wildcard"),
            (cred("10.0.0.1", "a", Some("v"), None), "not an address"),
            (cred("Api.test", "a", Some("v"), None), "lowercase"),
            (cred("a..test", "a", Some("v"), None), "labels"),
            (cred("api.test", "Host", Some("v"), None), "one hop"),
            (
                cred("api.test", "Transfer-Encoding", Some("v"), None),
                "one hop",
            ),
            (
                cred("api.test", "bad header", Some("v"), None),
                "not an HTTP header",
            ),
            (cred("api.test", "a", None, None), "exactly one"),
            (
                cred("api.test", "a", Some("v"), Some("gone")),
                "exactly one",
            ),
            (
                cred("api.test", "a", Some("sk-secret\r\nX: y"), None),
                "not a valid header value",
            ),
            (
                cred("api.test", "a", Some("sk-secret\0"), None),
                "not a valid header value",
            ),
        ] {
            let e = credential_error(&c).unwrap_or_else(|| panic!("{c:?} refused"));
            assert!(e.contains(words), "{e}");
            assert!(!e.contains("sk-secret"), "{e}");
        }
        let long = "x".repeat(MAX_CREDENTIAL_VALUE + 1);
        let e = credential_error(&cred("api.test", "a", Some(&long), None)).unwrap_or_default();
        assert!(e.contains("more than 8192"), "{e}");
        assert!(
            credential_error(&cred("api.test", "Proxy-Authorization", Some("v"), None)).is_none()
        );
    }
}
