//! File watch through the resident agent: inotify inside the sandbox, its changes streamed
//! back on one connection (see `sandbox_agent::proto`'s file watch) until sandboxd lets go of
//! it or the sandbox stops.

use sandbox_agent::proto::{Frame, FsEvent, Msg};
use tokio::io::BufReader;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::run::agent::{AgentRunner, IO_TIMEOUT, read_frame};
use crate::run::terminal::TermError;

/// A watch in place: the folders it watches, then its changes.
pub struct Watch {
    /// Folders watched (the bound may have left some out: a `limit` event says which).
    pub watched: u32,
    r: BufReader<OwnedReadHalf>,
    /// Held: closing it ends the watch in the sandbox.
    _w: OwnedWriteHalf,
}

impl Watch {
    /// The next changes; `None` when the sandbox ended the watch (its container stopped). Not
    /// cancel-safe: read it in a task of its own.
    pub async fn next(&mut self) -> Result<Option<Vec<FsEvent>>, String> {
        loop {
            return match read_frame(&mut self.r).await {
                Ok(Some(Frame::Msg(Msg::FsEvents { events }))) => Ok(Some(events)),
                Ok(Some(_)) => continue,
                Ok(None) => Ok(None),
                Err(e) => Err(e.to_string()),
            };
        }
    }
}

impl AgentRunner {
    /// Watches `path` (absolute, in the sandbox) of the session's sandbox.
    pub async fn watch(
        &self,
        session: &str,
        path: &str,
        recursive: bool,
        max_watches: u32,
    ) -> Result<Watch, TermError> {
        let msg = Msg::Watch {
            path: path.to_owned(),
            recursive,
            max_watches,
        };
        // The first walk of a large tree takes a while before the agent answers.
        let within = IO_TIMEOUT * 6;
        match self.term_request(session, None, &msg, within).await? {
            (Msg::Watching { watched }, conn) => Ok(Watch {
                watched,
                r: conn.r,
                _w: conn.w,
            }),
            (Msg::Error { code, message }, _) if code == "bad_request" => {
                Err(TermError::NotFound(message))
            }
            (Msg::Error { code, message }, _) => Err(TermError::Failed(format!(
                "the sandbox's agent refused: {code}: {message}"
            ))),
            (other, _) => Err(TermError::Failed(format!(
                "the sandbox's agent answered {other:?}"
            ))),
        }
    }
}
