//! The run path: how a command runs in a session's container. [`Runner`] is the seam; the
//! resident agent ([`crate::run::agent::AgentRunner`], the default) and Docker exec
//! ([`ExecRunner`], the fallback and `SANDBOXD_RUN_BACKEND=exec`) sit behind it.
//!
//! A run executes `/bin/sh -c <command>` in `/workspace` as the sandbox uid. Its output streams
//! as it comes, each stream capped (the rest is drained and dropped, and the run is marked
//! truncated). A timed-out or stopped run has its whole process group killed.

pub mod agent;
mod exec;
mod output;
pub mod ports;
pub mod terminal;
pub mod watch;

pub use exec::ExecRunner;
pub(crate) use output::*;

use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::container::AgentMount;
use crate::run::ports::{PortError, PortStream};
use crate::run::terminal::{TermAttach, TermError};
use sandbox_agent::proto::{TermInfo, TermRequest};
pub use sandboxd_api::run::{RunEvent, RunOutcome, RunStatus};

/// What to run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// The run id.
    pub run_id: String,
    /// The session.
    pub session: String,
    /// The container.
    pub container: String,
    /// The shell command.
    pub command: String,
    /// Extra environment, `NAME=value`.
    pub env: Vec<String>,
    /// uid (and gid) to run as.
    pub uid: u32,
    /// The effective timeout.
    pub timeout: Duration,
    /// Bytes kept per stream.
    pub max_output_bytes: usize,
}

/// A run that could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The container is not running (it exited, or was stopped behind sandboxd's back).
    #[error("the session's container is not running")]
    NotRunning,
    /// The container refused or is gone.
    #[error("the run could not start: {0}")]
    Start(String),
    /// The sandbox is at its process limit and its running runs hold every process (the
    /// agent's words).
    #[error("the run could not start: {0}")]
    ProcessLimit(String),
    /// The stream broke.
    #[error("the run's output stream broke: {0}")]
    Stream(String),
}

/// The seam: something that runs a command in a session's container.
pub trait Runner: Send + Sync {
    /// Runs `spec`, sending output to `events` as it comes (if given), until it exits, times
    /// out or `cancel` fires.
    fn run<'a>(
        &'a self,
        spec: RunSpec,
        events: Option<mpsc::Sender<RunEvent>>,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<RunOutcome, RunError>>;

    /// What a new container of `session` mounts to run the agent as its PID 1; `None` makes a
    /// container without it (the Docker exec path). Creates the session's run folder.
    fn agent_mount(&self, session: &str) -> std::io::Result<Option<AgentMount>> {
        let _ = session;
        Ok(None)
    }

    /// Whether `container`, which session `session` just took from the warm pool, runs: one
    /// look at the engine. A runner that keeps facts of a container's current start (the
    /// agent's PID 1) learns them from that same look, so the session's first run asks the
    /// engine nothing.
    fn taken<'a>(
        &'a self,
        session: &'a str,
        container: &'a str,
    ) -> BoxFuture<'a, Result<bool, String>>;

    /// Whether [`Runner::run`] itself answers `NotRunning` for a container that stopped, so
    /// the core need not ask Docker before each run.
    fn finds_stopped_containers(&self) -> bool {
        false
    }

    /// Told when a running session's container was found stopped behind sandboxd's back,
    /// before it is started again.
    fn container_stopped<'a>(&'a self, session: &'a str, container: &'a str) -> BoxFuture<'a, ()> {
        let _ = (session, container);
        Box::pin(async {})
    }

    /// Asks the session's agent to let go of every host socket before a checkpoint (see
    /// `sandbox_agent::pause`); returns once it has. Err: why not, in words (a run path
    /// without an agent, an agent not started resumable, one that did not answer).
    fn quiesce<'a>(&'a self, session: &'a str) -> BoxFuture<'a, Result<(), String>> {
        let _ = session;
        Box::pin(async { Err("this run path has no agent to quiesce".to_owned()) })
    }

    /// Lets the agent of a session restored from a checkpoint (or one whose checkpoint
    /// failed) bind its socket again.
    fn allow_resume(&self, session: &str) -> std::io::Result<()> {
        let _ = session;
        Ok(())
    }

    /// Stops a run this process did not start (its request was lost in a restart); whether
    /// there was such a run.
    fn stop_detached<'a>(
        &'a self,
        session: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, RunError>> {
        let _ = (session, run_id);
        Box::pin(async { Ok(false) })
    }

    /// The state of a run, running or finished, as the sandbox knows it.
    fn status<'a>(
        &'a self,
        session: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<RunStatus>, RunError>> {
        let _ = (session, run_id);
        Box::pin(async { Ok(None) })
    }

    /// Starts a terminal in the session's container (see [`terminal`]); a run path without
    /// the agent has none.
    fn terminal_open<'a>(
        &'a self,
        session: &'a str,
        container: &'a str,
        req: TermRequest,
    ) -> BoxFuture<'a, Result<TermInfo, TermError>> {
        let _ = (session, container, req);
        Box::pin(async { Err(no_terminals()) })
    }

    /// The session's terminals, running and recently ended.
    fn terminal_list<'a>(
        &'a self,
        session: &'a str,
    ) -> BoxFuture<'a, Result<Vec<TermInfo>, TermError>> {
        let _ = session;
        Box::pin(async { Err(no_terminals()) })
    }

    /// Ends a terminal; whether it was running.
    fn terminal_kill<'a>(
        &'a self,
        session: &'a str,
        term_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, TermError>> {
        let _ = (session, term_id);
        Box::pin(async { Err(no_terminals()) })
    }

    /// Attaches to a terminal.
    fn terminal_attach<'a>(
        &'a self,
        session: &'a str,
        term_id: &'a str,
    ) -> BoxFuture<'a, Result<TermAttach, TermError>> {
        let _ = (session, term_id);
        Box::pin(async { Err(no_terminals()) })
    }

    /// Watches a folder of the sandbox (see [`watch`]).
    fn watch<'a>(
        &'a self,
        session: &'a str,
        path: &'a str,
        recursive: bool,
        max_watches: u32,
    ) -> BoxFuture<'a, Result<watch::Watch, TermError>> {
        let _ = (session, path, recursive, max_watches);
        Box::pin(async {
            Err(TermError::Unavailable(
                no_terminals()
                    .to_string()
                    .replace("terminals", "file watch"),
            ))
        })
    }

    /// Connects to a port on the sandbox's loopback (see [`ports`]).
    fn port_connect<'a>(
        &'a self,
        session: &'a str,
        port: u16,
    ) -> BoxFuture<'a, Result<PortStream, PortError>> {
        let _ = (session, port);
        Box::pin(async { Err(PortError::from(no_terminals())) })
    }
}

/// The refusal of a terminal by a run path without the agent.
fn no_terminals() -> TermError {
    TermError::Unavailable(
        "this host runs commands through docker exec (SANDBOXD_RUN_BACKEND=exec), which has no \
         terminals"
            .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(rx: &mut mpsc::Receiver<RunEvent>) -> Vec<RunEvent> {
        let mut got = Vec::new();
        while let Ok(e) = rx.try_recv() {
            got.push(e);
        }
        got
    }

    #[tokio::test]
    async fn output_caps_and_marks_truncated() {
        let mut o = Output::new(5, None);
        o.stdout(b"abc");
        assert!(!o.truncated());
        o.stdout(b"defgh");
        o.stderr(b"ok");
        assert!(o.truncated());
        assert_eq!(o.finish(), ("abcde".to_owned(), "ok".to_owned()));
    }

    #[tokio::test]
    async fn output_streams_what_it_keeps() {
        let (tx, mut rx) = mpsc::channel(4);
        let mut o = Output::new(3, Some(tx));
        o.stderr(b"hello");
        assert_eq!(
            rx.recv().await,
            Some(RunEvent::Stderr { data: "hel".into() })
        );
    }

    #[tokio::test]
    async fn a_consumer_that_does_not_read_never_blocks_the_run() {
        // A channel of one event that nobody reads: every push returns at once, what does
        // not fit waits (at most the cap) and goes out as one event when there is room.
        let (tx, mut rx) = mpsc::channel(1);
        let mut o = Output::new(1000, Some(tx));
        for _ in 0..10_000 {
            o.stdout(b"y\n");
            o.stderr(b"e");
        }
        assert!(o.truncated());
        assert!(o.waiting());
        assert_eq!(drain(&mut rx), [RunEvent::Stdout { data: "y\n".into() }]);
        // Room again: the waiting bytes go out, the stream that waited longest first (stderr:
        // its first byte came before the second line of stdout), as one event.
        o.room().await;
        o.send_waiting();
        assert_eq!(
            drain(&mut rx),
            [RunEvent::Stderr {
                data: "e".repeat(1000)
            }]
        );
        let (out, err) = o.finish();
        assert_eq!((out.len(), err.len()), (1000, 1000));
        // The rest (stdout) is sent by a task of its own once the consumer reads.
        assert_eq!(
            rx.recv().await,
            Some(RunEvent::Stdout {
                data: "y\n".repeat(499)
            })
        );
        assert_eq!(rx.recv().await, None);
    }

    #[tokio::test]
    async fn a_consumer_that_went_away_stops_the_events_not_the_run() {
        let (tx, rx) = mpsc::channel(1);
        let mut o = Output::new(10, Some(tx));
        drop(rx);
        o.stdout(b"abc");
        assert!(!o.waiting());
        o.stdout(b"def");
        assert_eq!(o.finish().0, "abcdef");
    }

    #[tokio::test]
    async fn streamed_events_carry_whole_characters() {
        let text = "añ€😀 end".as_bytes();
        // Every way of cutting the output in two: the events put together are the output.
        for cut in 0..=text.len() {
            let (tx, mut rx) = mpsc::channel(8);
            let mut o = Output::new(1024, Some(tx));
            o.stdout(&text[..cut]);
            o.stdout(&text[cut..]);
            let (out, _) = o.finish();
            let mut got = String::new();
            while let Some(RunEvent::Stdout { data }) = rx.recv().await {
                got.push_str(&data);
            }
            assert_eq!(got, "añ€😀 end", "cut at {cut}");
            assert_eq!(out, "añ€😀 end");
        }
        // A character cut off at the cap is streamed as U+FFFD, as the outcome shows it.
        let (tx, mut rx) = mpsc::channel(8);
        let mut o = Output::new(2, Some(tx));
        o.stdout("a€".as_bytes());
        let (out, _) = o.finish();
        let mut got = String::new();
        while let Some(RunEvent::Stdout { data }) = rx.recv().await {
            got.push_str(&data);
        }
        assert_eq!(got, out);
        assert_eq!(got, "a\u{FFFD}");
    }
}
