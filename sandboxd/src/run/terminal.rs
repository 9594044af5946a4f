//! Terminals through the resident agent: open, list and kill are one request each on a
//! connection of their own; an attach is a connection that stays, carrying the terminal's
//! output one way and its input and size the other (see `sandbox_agent::proto`). The terminal
//! itself lives in the agent, so a dropped attach, or sandboxd restarting, leaves it running.

use sandbox_agent::proto::{self, Frame, Msg, TermExit, TermInfo, TermRequest};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::run::agent::{AgentRunner, Conn, IO_TIMEOUT, LISTEN_WAIT, read_frame};

/// How long a kill may take: the agent answers once the terminal's session is gone.
const KILL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why a terminal request failed.
#[derive(Debug, thiserror::Error)]
pub enum TermError {
    /// The sandbox cannot hold terminals (Docker exec runs, an agent from before terminals).
    #[error("{0}")]
    Unavailable(String),
    /// The sandbox runs as many terminals as it may.
    #[error("{0}")]
    Limit(String),
    /// No such terminal; the text says which.
    #[error("{0}")]
    NotFound(String),
    /// A terminal of this id runs.
    #[error("terminal '{0}' is already running")]
    Exists(String),
    /// The agent could not be reached, or failed the request; the text says how.
    #[error("{0}")]
    Failed(String),
}

/// What an attach reads next.
#[derive(Debug, PartialEq, Eq)]
pub enum TermEvent {
    /// Bytes the terminal printed (its scrollback first).
    Output(Vec<u8>),
    /// The terminal's program ended: the last event.
    Exit(TermExit),
}

/// An attach to a terminal: what it was when attached, then [`TermOutput`] and [`TermInput`].
pub struct TermAttach {
    /// The terminal.
    pub term: TermInfo,
    /// Bytes of kept output that come first.
    pub scrollback: u64,
    /// Its output.
    pub output: TermOutput,
    /// Its input.
    pub input: TermInput,
}

/// The output side of an attach.
pub struct TermOutput(BufReader<OwnedReadHalf>);

impl TermOutput {
    /// The next output or the exit; `None` when the agent closed the connection without an
    /// exit (the container stopped). Not cancel-safe: read it in a task of its own.
    pub async fn next(&mut self) -> Result<Option<TermEvent>, String> {
        loop {
            return match read_frame(&mut self.0).await {
                Ok(Some(Frame::Stdout(b) | Frame::Stderr(b))) => Ok(Some(TermEvent::Output(b))),
                Ok(Some(Frame::Msg(Msg::TermExit(exit)))) => Ok(Some(TermEvent::Exit(exit))),
                // Nothing else is sent on an attach; what an older agent might add is passed by.
                Ok(Some(_)) => continue,
                Ok(None) => Ok(None),
                Err(e) => Err(e.to_string()),
            };
        }
    }
}

/// The input side of an attach; dropping it (with the output side) detaches.
pub struct TermInput(OwnedWriteHalf);

impl TermInput {
    /// Types `bytes` into the terminal.
    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        for chunk in bytes.chunks(64 * 1024) {
            self.0.write_all(&proto::encode_input(chunk)).await?;
        }
        Ok(())
    }

    /// Gives the terminal a new size.
    pub async fn resize(&mut self, rows: u16, cols: u16) -> std::io::Result<()> {
        self.0
            .write_all(&proto::encode_msg(&Msg::TermResize { rows, cols }))
            .await
    }
}

/// An agent's refusal of a terminal request, in sandboxd's terms.
fn refusal(code: &str, message: String, term_id: &str) -> TermError {
    match code {
        "terminal_limit" => TermError::Limit(message),
        "no_such_terminal" => TermError::NotFound(format!("no terminal '{term_id}'")),
        "terminal_exists" => TermError::Exists(term_id.to_owned()),
        _ => TermError::Failed(format!("the sandbox's agent refused: {code}: {message}")),
    }
}

impl AgentRunner {
    /// Sends `msg` with the hello and reads the one answer.
    pub(super) async fn term_request(
        &self,
        session: &str,
        container: Option<&str>,
        msg: &Msg,
        within: std::time::Duration,
    ) -> Result<(Msg, Conn), TermError> {
        // A container just started (a wake) has an agent about to listen: waited for as a run
        // waits for it (under gVisor its kernel boots first). Never an agent that may have
        // taken the request, nor a socket that is not the agent's.
        let started = std::time::Instant::now();
        let mut conn = loop {
            match self.handshake(session, container, Some(msg)).await {
                Ok(conn) => break conn,
                Err(e) if !e.untrusted && !e.maybe_started && started.elapsed() < LISTEN_WAIT => {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                Err(e) => {
                    return Err(TermError::Failed(format!(
                        "cannot reach the sandbox's agent: {}",
                        e.message
                    )));
                }
            }
        };
        // An agent of an older protocol closes the connection on a message it cannot read.
        if conn.protocol < proto::TERMINALS_PROTOCOL {
            return Err(TermError::Unavailable(
                "the session's sandbox runs an agent from before terminals: rebuild the session \
                 (POST /v1/sessions/{id}/rebuild) to give it one"
                    .to_owned(),
            ));
        }
        let answer = tokio::time::timeout(within, conn.recv())
            .await
            .map_err(|_| TermError::Failed("the sandbox's agent did not answer".to_owned()))?;
        match answer {
            Ok(Some(Frame::Msg(m))) => Ok((m, conn)),
            Ok(other) => Err(TermError::Failed(format!(
                "the sandbox's agent answered {other:?}"
            ))),
            Err(e) => Err(TermError::Failed(format!(
                "the connection to the sandbox's agent broke: {e}"
            ))),
        }
    }

    /// Starts a terminal in the session's container.
    pub async fn term_open(
        &self,
        session: &str,
        container: &str,
        req: TermRequest,
    ) -> Result<TermInfo, TermError> {
        let term_id = req.term_id.clone();
        match self
            .term_request(session, Some(container), &Msg::TermOpen(req), IO_TIMEOUT)
            .await?
        {
            (Msg::TermOpened { term }, _) => Ok(*term),
            (Msg::Error { code, message }, _) => Err(refusal(&code, message, &term_id)),
            (other, _) => Err(TermError::Failed(format!(
                "the sandbox's agent answered {other:?}"
            ))),
        }
    }

    /// The terminals the session's agent knows.
    pub async fn term_list(&self, session: &str) -> Result<Vec<TermInfo>, TermError> {
        match self
            .term_request(session, None, &Msg::TermList, IO_TIMEOUT)
            .await?
        {
            (Msg::TermListReply { terms }, _) => Ok(terms),
            (Msg::Error { code, message }, _) => Err(refusal(&code, message, "")),
            (other, _) => Err(TermError::Failed(format!(
                "the sandbox's agent answered {other:?}"
            ))),
        }
    }

    /// Ends a terminal; whether it was running.
    pub async fn term_kill(&self, session: &str, term_id: &str) -> Result<bool, TermError> {
        let msg = Msg::TermKill {
            term_id: term_id.to_owned(),
        };
        // The agent answers once the terminal ended: SIGHUP, up to 2 s, then SIGKILL.
        match self.term_request(session, None, &msg, KILL_TIMEOUT).await? {
            (Msg::TermKilled { found }, _) => Ok(found),
            (Msg::Error { code, message }, _) => Err(refusal(&code, message, term_id)),
            (other, _) => Err(TermError::Failed(format!(
                "the sandbox's agent answered {other:?}"
            ))),
        }
    }

    /// Attaches to a terminal.
    pub async fn term_attach(&self, session: &str, term_id: &str) -> Result<TermAttach, TermError> {
        let msg = Msg::TermAttach {
            term_id: term_id.to_owned(),
        };
        match self.term_request(session, None, &msg, IO_TIMEOUT).await? {
            (Msg::TermAttached { term, scrollback }, conn) => Ok(TermAttach {
                term: *term,
                scrollback,
                output: TermOutput(conn.r),
                input: TermInput(conn.w),
            }),
            (Msg::Error { code, message }, _) => Err(refusal(&code, message, term_id)),
            (other, _) => Err(TermError::Failed(format!(
                "the sandbox's agent answered {other:?}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_refusals_keep_their_meaning() {
        assert!(matches!(
            refusal("terminal_limit", "8 running".into(), "t"),
            TermError::Limit(m) if m == "8 running"
        ));
        assert!(matches!(
            refusal("no_such_terminal", String::new(), "t1"),
            TermError::NotFound(t) if t == "no terminal 't1'"
        ));
        assert_eq!(
            refusal("spawn_failed", "no /bin/bash".into(), "t").to_string(),
            "the sandbox's agent refused: spawn_failed: no /bin/bash"
        );
    }
}
