//! Ports of a session: which ports of its sandbox's loopback may be reached through sandboxd
//! (opened with `POST /v1/sessions/{id}/ports` or a SandboxSession's `spec.ports`, kept with
//! the session), and the connection to one, made by its agent inside the sandbox.

use super::*;
use std::time::Instant;

use sandboxd_api::ports::MAX_PORTS;

use crate::run::ports::{PortError, PortStream};

/// Why a port request was refused.
#[derive(Debug, thiserror::Error)]
pub enum PortRefusal {
    /// The port is not open on the session.
    #[error(
        "Port {port} of session '{id}' is not open: open it with POST /v1/sessions/{id}/ports {{\"port\": {port}}} (or the SandboxSession's spec.ports)"
    )]
    NotOpen {
        /// The session.
        id: String,
        /// The port.
        port: u16,
    },
    /// The session has as many ports open as it may.
    #[error(
        "Session '{id}' already has {MAX_PORTS} ports open, the most a session may have: close one (DELETE /v1/sessions/{id}/ports/{{port}})"
    )]
    Limit {
        /// The session.
        id: String,
    },
    /// The connection failed; the text says how.
    #[error("{0}")]
    Connect(PortError),
    /// A preview link that is not one this host signed for a live session and port.
    #[error(
        "This preview link is not valid: it is malformed, or its session is gone or has a new token since it was made. Ask for a new one (POST /v1/sessions/{{id}}/previews)"
    )]
    PreviewInvalid,
    /// A preview link past its expiry.
    #[error(
        "This preview link expired at {at}: ask for a new one (POST /v1/sessions/{{id}}/previews)"
    )]
    PreviewExpired {
        /// When it expired, RFC 3339.
        at: String,
    },
    /// The port took the connection but gave no answer in time.
    #[error(
        "Port {port} of session '{id}' took the connection but sent no answer within {seconds} s"
    )]
    Timeout {
        /// The session.
        id: String,
        /// The port.
        port: u16,
        /// The time it had.
        seconds: u64,
    },
}

/// A port sandboxd takes: 1 to 65535.
fn check_port(port: u16) -> Result<(), ServiceError> {
    if port == 0 {
        return Err(ServiceError::invalid("port must be 1 to 65535, not 0"));
    }
    Ok(())
}

impl Core {
    /// How long a port has to answer a request passed to it (`SANDBOXD_PORT_ANSWER_TIMEOUT`).
    pub fn port_answer_timeout(&self) -> Duration {
        self.settings.port_answer_timeout
    }

    /// The ports session `id` has open.
    pub async fn ports(&self, id: &str) -> Result<Vec<u16>, ServiceError> {
        Ok(self.row(id).await?.ports)
    }

    /// Opens `port` on session `id` (already open: nothing changes). One change at a time per
    /// host, so two opens never lose each other.
    pub async fn open_port(&self, id: &str, port: u16) -> Result<Vec<u16>, ServiceError> {
        check_port(port)?;
        let _one = self.port_changes.lock().await;
        let mut ports = self.row(id).await?.ports;
        if ports.contains(&port) {
            return Ok(ports);
        }
        if ports.len() >= MAX_PORTS {
            return Err(ServiceError::Port(PortRefusal::Limit { id: id.to_owned() }));
        }
        ports.push(port);
        ports.sort_unstable();
        self.store.set_ports(id, &ports).await?;
        Ok(ports)
    }

    /// Closes `port` on session `id`: connections already made go on, new ones are refused.
    pub async fn close_port(&self, id: &str, port: u16) -> Result<Vec<u16>, ServiceError> {
        let _one = self.port_changes.lock().await;
        let mut ports = self.row(id).await?.ports;
        if !ports.contains(&port) {
            return Err(ServiceError::Port(PortRefusal::NotOpen {
                id: id.to_owned(),
                port,
            }));
        }
        ports.retain(|p| *p != port);
        self.store.set_ports(id, &ports).await?;
        Ok(ports)
    }

    /// A connection to open `port` of session `id`, waking it first; audited as a run of
    /// its own kind would be (op `port`, the target the port and the route).
    pub async fn connect_port(
        &self,
        id: &str,
        who: &Actor,
        port: u16,
        what: &str,
    ) -> Result<PortStream, ServiceError> {
        let started = Instant::now();
        let row = self.row(id).await?;
        if !row.ports.contains(&port) {
            self.count_connection("not_open");
            return Err(ServiceError::Port(PortRefusal::NotOpen {
                id: id.to_owned(),
                port,
            }));
        }
        if self.is_rebuilding(id) {
            return Err(ServiceError::Rebuilding { id: id.to_owned() });
        }
        if row.state != crate::storage::store::State::Running {
            self.wake(id).await.map_err(|e| gone_if_destroying(id, e))?;
        }
        let mut touched = row.last_activity_at;
        self.terminal_activity(id, &mut touched).await;
        let connected = self.runner.port_connect(id, port).await;
        self.record(
            id,
            who,
            Op::Port,
            &format!("{port} {what}"),
            Outcome {
                ok: connected.is_ok(),
                error: connected.as_ref().err().map(ToString::to_string),
                ..Outcome::default()
            },
            started,
        );
        self.count_connection(match &connected {
            Ok(_) => "connected",
            Err(PortError::Closed(_)) => "closed",
            Err(_) => "failed",
        });
        connected.map_err(|e| ServiceError::Port(PortRefusal::Connect(e)))
    }

    /// A signed preview link to open `port` of session `id`, lasting `seconds` (default one
    /// hour, at most 7 days). The signature is an HMAC-SHA256 keyed by the session's token
    /// hash (a secret only the store holds) over the session, the port and the expiry: the link
    /// reaches that port of that session only, until it expires, the session's token changes
    /// or the session goes.
    pub async fn preview(
        &self,
        id: &str,
        port: u16,
        seconds: Option<u64>,
    ) -> Result<sandboxd_api::ports::Preview, ServiceError> {
        use sandboxd_api::ports::{DEFAULT_PREVIEW_SECONDS, MAX_PREVIEW_SECONDS};
        check_port(port)?;
        let seconds = seconds.unwrap_or(DEFAULT_PREVIEW_SECONDS);
        if !(1..=MAX_PREVIEW_SECONDS).contains(&seconds) {
            return Err(ServiceError::invalid(format!(
                "expires_in_seconds must be 1 to {MAX_PREVIEW_SECONDS} (7 days), not {seconds}"
            )));
        }
        let row = self.row(id).await?;
        if !row.ports.contains(&port) {
            return Err(ServiceError::Port(PortRefusal::NotOpen {
                id: id.to_owned(),
                port,
            }));
        }
        let expires = chrono::Utc::now().timestamp() + i64::try_from(seconds).unwrap_or(0);
        let token = preview::sign(&row.token_hash, id, port, expires);
        Ok(sandboxd_api::ports::Preview {
            port,
            path: format!("/preview/{token}/"),
            token,
            expires_at: preview::rfc3339(expires),
        })
    }

    /// The session and port a preview link reaches, checked: signed by this host for a session
    /// that still has the token it was signed with, and not expired.
    pub async fn preview_target(&self, token: &str) -> Result<(String, u16), ServiceError> {
        let invalid = || ServiceError::Port(PortRefusal::PreviewInvalid);
        let (id, port, expires) = preview::parse(token).ok_or_else(invalid)?;
        let row = match self.row(&id).await {
            Ok(row) => row,
            Err(ServiceError::NoSuchSession { .. }) => return Err(invalid()),
            Err(e) => return Err(e),
        };
        if !preview::verify(&row.token_hash, token) {
            return Err(invalid());
        }
        if expires <= chrono::Utc::now().timestamp() {
            return Err(ServiceError::Port(PortRefusal::PreviewExpired {
                at: preview::rfc3339(expires),
            }));
        }
        Ok((id, port))
    }

    /// Counts a connection to a port by its outcome (`sandboxd_port_connections_total`).
    fn count_connection(&self, outcome: &str) {
        self.metrics
            .port_connections
            .get_or_create(&crate::metrics::Outcome::new(outcome))
            .inc();
    }
}

/// Preview links: `<session, base64url>.<port>.<expiry, Unix seconds>.<HMAC-SHA256, hex>`.
pub(crate) mod preview {
    use base64::Engine as _;
    use hmac::{Hmac, Mac};
    use sha2::Sha256;

    const CONTEXT: &str = "sandboxd-preview/v1";

    fn engine() -> base64::engine::GeneralPurpose {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
    }

    fn mac(key: &str, id: &str, port: u16, expires: i64) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key.as_bytes())
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        m.update(format!("{CONTEXT}\n{id}\n{port}\n{expires}").as_bytes());
        m
    }

    /// The link's token for session `id`'s `port` until `expires`, keyed by `key`.
    pub fn sign(key: &str, id: &str, port: u16, expires: i64) -> String {
        let sig = hex::encode(mac(key, id, port, expires).finalize().into_bytes());
        format!("{}.{port}.{expires}.{sig}", engine().encode(id))
    }

    /// The session, port and expiry a token names (unchecked), or `None` for a malformed one.
    pub fn parse(token: &str) -> Option<(String, u16, i64)> {
        let mut parts = token.split('.');
        let id = String::from_utf8(engine().decode(parts.next()?).ok()?).ok()?;
        let port = parts.next()?.parse::<u16>().ok().filter(|p| *p > 0)?;
        let expires = parts.next()?.parse::<i64>().ok()?;
        let sig = parts.next()?;
        (parts.next().is_none() && sig.len() == 64).then_some((id, port, expires))
    }

    /// Whether `token` is signed with `key` (compared in constant time).
    pub fn verify(key: &str, token: &str) -> bool {
        let Some((id, port, expires)) = parse(token) else {
            return false;
        };
        let Some(sig) = token.rsplit('.').next().and_then(|s| hex::decode(s).ok()) else {
            return false;
        };
        mac(key, &id, port, expires).verify_slice(&sig).is_ok()
    }

    /// `at` (Unix seconds) as RFC 3339.
    pub fn rfc3339(at: i64) -> String {
        chrono::DateTime::from_timestamp(at, 0)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_else(|| at.to_string())
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_link_is_bound_to_its_key_session_port_and_expiry() {
            let token = sign("key", "web.1", 3000, 1_900_000_000);
            assert_eq!(
                parse(&token),
                Some(("web.1".to_owned(), 3000, 1_900_000_000))
            );
            assert!(verify("key", &token));
            assert!(!verify("another key", &token));
            let (head, sig) = token.rsplit_once('.').expect("four parts");
            let other_port = token.replacen(".3000.", ".3001.", 1);
            assert!(!verify("key", &other_port));
            let later = format!("{}.{sig}", head.replace("1900000000", "1900000001"));
            assert!(!verify("key", &later));
            let other_session = sign("key", "web", 3000, 1_900_000_000);
            assert_ne!(other_session, token);
            for bad in ["", "x", "a.b.c.d", &format!("{token}.x"), "d2Vi.0.1.00"] {
                assert!(parse(bad).is_none() || !verify("key", bad), "{bad}");
            }
            assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        }
    }
}
