//! Ports through the resident agent: a connection to a port on the sandbox's loopback, made by
//! the agent inside the sandbox (see `sandbox_agent::proto`'s ports), handed back as one
//! byte stream ([`PortStream`]) that the HTTP proxy and the raw stream use alike.

use std::pin::Pin;
use std::task::{Context, Poll};

use sandbox_agent::proto::Msg;
use tokio::io::{AsyncRead, AsyncWrite, BufReader, ReadBuf};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::run::agent::{AgentRunner, IO_TIMEOUT};
use crate::run::terminal::TermError;

/// Why a port could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// The sandbox cannot be asked (Docker exec runs, an agent from before ports).
    #[error("{0}")]
    Unavailable(String),
    /// Nothing in the sandbox answers on the port.
    #[error("{0}")]
    Closed(String),
    /// The agent could not be reached, or failed the request.
    #[error("{0}")]
    Failed(String),
}

impl From<TermError> for PortError {
    fn from(e: TermError) -> Self {
        match e {
            TermError::Unavailable(m) => Self::Unavailable(m.replace("terminals", "ports")),
            e => Self::Failed(e.to_string()),
        }
    }
}

/// A connection to a port in the sandbox: what the agent read past its answer comes first.
pub struct PortStream {
    r: BufReader<OwnedReadHalf>,
    w: OwnedWriteHalf,
}

impl AsyncRead for PortStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.r).poll_read(cx, buf)
    }
}

impl AsyncWrite for PortStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.w).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.w).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.w).poll_shutdown(cx)
    }
}

impl AgentRunner {
    /// Connects to `port` in the session's sandbox.
    pub async fn port_connect(&self, session: &str, port: u16) -> Result<PortStream, PortError> {
        // The agent's own connect waits up to 5 s; its answer comes within a second more.
        let within = IO_TIMEOUT + std::time::Duration::from_secs(1);
        match self
            .term_request(session, None, &Msg::PortConnect { port }, within)
            .await?
        {
            (Msg::PortConnected, conn) => Ok(PortStream {
                r: conn.r,
                w: conn.w,
            }),
            (Msg::Error { code, message }, _) if code == "port_closed" => {
                Err(PortError::Closed(message))
            }
            (Msg::Error { code, message }, _) => Err(PortError::Failed(format!(
                "the sandbox's agent refused: {code}: {message}"
            ))),
            (other, _) => Err(PortError::Failed(format!(
                "the sandbox's agent answered {other:?}"
            ))),
        }
    }
}
