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

    /// Counts a connection to a port by its outcome (`sandboxd_port_connections_total`).
    fn count_connection(&self, outcome: &str) {
        self.metrics
            .port_connections
            .get_or_create(&crate::metrics::Outcome::new(outcome))
            .inc();
    }
}
