//! The run path: how a command runs in a session's container. [`Runner`] is the seam; the
//! resident agent ([`crate::agent_runner::AgentRunner`], the default) and Docker exec
//! ([`ExecRunner`], the fallback and `SANDBOXD_RUN_BACKEND=exec`) sit behind it.
//!
//! A run executes `/bin/sh -c <command>` in `/workspace` as the sandbox uid. Its output streams
//! as it comes, each stream capped (the rest is drained and dropped, and the run is marked
//! truncated). A timed-out or stopped run has its whole process group killed.

use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures::StreamExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::docker::{AgentMount, Engine, WORKSPACE_MOUNT};

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

/// One piece of a run's life, as streamed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RunEvent {
    /// Bytes on stdout (lossy UTF-8).
    Stdout {
        /// The text.
        data: String,
    },
    /// Bytes on stderr (lossy UTF-8).
    Stderr {
        /// The text.
        data: String,
    },
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunOutcome {
    /// The run id.
    pub run_id: String,
    /// Exit status; 124 after a timeout and 137 after a stop, like `timeout(1)` and SIGKILL.
    pub exit_code: i64,
    /// What the command wrote on stdout (capped). A streamed run's outcome leaves it out (its
    /// events carried it).
    #[serde(default)]
    pub stdout: String,
    /// What the command wrote on stderr (capped); left out like `stdout` when streamed.
    #[serde(default)]
    pub stderr: String,
    /// Whether output was cut at the cap.
    pub truncated: bool,
    /// Whether the timeout ended it.
    pub timed_out: bool,
    /// Whether a stop request ended it.
    pub stopped: bool,
    /// Wall time.
    pub duration_ms: u64,
    /// CPU time of the command and the children it waited for, nanoseconds (agent path only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ns: Option<u64>,
}

/// A run as the sandbox's agent knows it: one in flight, or one that finished (also one whose
/// request was lost when sandboxd restarted).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStatus {
    /// The run id.
    pub run_id: String,
    /// Whether it still runs.
    pub running: bool,
    /// Exit status, once finished.
    pub exit_code: Option<i64>,
    /// Whether the timeout ended it.
    pub timed_out: bool,
    /// Whether a stop ended it.
    pub stopped: bool,
    /// Whether output was cut at the cap.
    pub truncated: bool,
    /// CPU time, nanoseconds, once finished.
    pub cpu_ns: Option<u64>,
    /// Wall time, once finished.
    pub duration_ms: Option<u64>,
    /// Output so far (capped).
    pub stdout: String,
    /// Errors so far (capped).
    pub stderr: String,
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
}

/// Prints the shell's pid on the first stdout line, then becomes the command. The pid is the
/// run's process group (Docker starts each exec as a session leader), which stop and timeout kill.
const WRAPPER: &str = "printf '%s\\n' \"$$\"; exec /bin/sh -c \"$1\"";

/// How long output may keep flowing after the run's group was killed.
const KILL_GRACE: Duration = Duration::from_millis(1500);

/// Runs commands with Docker exec.
#[derive(Clone)]
pub struct ExecRunner {
    engine: Engine,
}

impl ExecRunner {
    /// A runner on `engine`.
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }

    async fn kill_group(&self, container: &str, pid: u32, uid: u32) {
        if pid < 2 {
            return;
        }
        // POSIX kill (dash has no `--`): a negative pid is the process group. Then wait, on
        // shell builtins only (the group may hold every pid the limit allows), until the group
        // is gone, so a stopped or timed-out run leaves nothing behind when it returns.
        let script = "kill -KILL \"-$1\" 2>/dev/null || kill -KILL \"$1\" 2>/dev/null; \
             i=0; while kill -0 \"-$1\" 2>/dev/null && [ $i -lt 200000 ]; do i=$((i+1)); done; true";
        let options = CreateExecOptions {
            cmd: Some(vec![
                "/bin/sh".to_owned(),
                "-c".to_owned(),
                script.to_owned(),
                "kill".to_owned(),
                pid.to_string(),
            ]),
            user: Some(format!("{uid}:{uid}")),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            ..Default::default()
        };
        let Ok(docker) = self.engine.client() else {
            return;
        };
        let Ok(exec) = docker.create_exec(container, options).await else {
            return;
        };
        if let Ok(StartExecResults::Attached { mut output, .. }) =
            docker.start_exec(&exec.id, None::<StartExecOptions>).await
        {
            while output.next().await.is_some() {}
        }
    }

    async fn run_exec(
        &self,
        spec: RunSpec,
        events: Option<mpsc::Sender<RunEvent>>,
        cancel: CancellationToken,
    ) -> Result<RunOutcome, RunError> {
        let started = Instant::now();
        let docker = self
            .engine
            .client()
            .map_err(|e| RunError::Start(e.to_string()))?;
        let options = CreateExecOptions {
            cmd: Some(vec![
                "/bin/sh".to_owned(),
                "-c".to_owned(),
                WRAPPER.to_owned(),
                "sandboxd-run".to_owned(),
                spec.command.clone(),
            ]),
            env: Some(spec.env.clone()),
            user: Some(format!("{0}:{0}", spec.uid)),
            working_dir: Some(WORKSPACE_MOUNT.to_owned()),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            ..Default::default()
        };
        let exec = docker
            .create_exec(&spec.container, options)
            .await
            .map_err(|e| match e {
                bollard::errors::Error::DockerResponseServerError {
                    status_code: 409, ..
                } => RunError::NotRunning,
                e => RunError::Start(e.to_string()),
            })?;
        let StartExecResults::Attached { mut output, .. } = docker
            .start_exec(&exec.id, None::<StartExecOptions>)
            .await
            .map_err(|e| RunError::Start(e.to_string()))?
        else {
            return Err(RunError::Start("docker started the exec detached".into()));
        };

        let mut out = Capture::new(spec.max_output_bytes);
        let mut err = Capture::new(spec.max_output_bytes);
        let mut pid: Option<u32> = None;
        let mut pid_line = Vec::new();
        let deadline = tokio::time::sleep(spec.timeout);
        tokio::pin!(deadline);
        // After a kill, output still held open by an escaped process is not waited for.
        let grace = tokio::time::sleep(Duration::from_secs(86400 * 365));
        tokio::pin!(grace);
        let mut ended_by = None;
        loop {
            tokio::select! {
                chunk = output.next() => match chunk {
                    None => break,
                    Some(Err(e)) => return Err(RunError::Stream(e.to_string())),
                    Some(Ok(LogOutput::StdOut { message })) => {
                        let mut bytes = &message[..];
                        if pid.is_none() {
                            // The wrapper's first line is the pid, not output.
                            match bytes.iter().position(|b| *b == b'\n') {
                                Some(i) => {
                                    pid_line.extend_from_slice(&bytes[..i]);
                                    pid = std::str::from_utf8(&pid_line).ok().and_then(|s| s.trim().parse().ok()).or(Some(0));
                                    bytes = &bytes[i + 1..];
                                    // Stopped or timed out before its pid was known: kill now.
                                    if ended_by.is_some() {
                                        self.kill_group(&spec.container, pid.unwrap_or(0), spec.uid).await;
                                        grace.as_mut().reset(tokio::time::Instant::now() + KILL_GRACE);
                                    }
                                }
                                None => { pid_line.extend_from_slice(bytes); continue; }
                            }
                        }
                        if !bytes.is_empty() {
                            out.push(bytes, &events, |data| RunEvent::Stdout { data }).await;
                        }
                    }
                    Some(Ok(LogOutput::StdErr { message })) => err.push(&message, &events, |data| RunEvent::Stderr { data }).await,
                    Some(Ok(_)) => {}
                },
                () = &mut deadline, if ended_by.is_none() => {
                    ended_by = Some(Ended::Timeout);
                    if let Some(pid) = pid {
                        self.kill_group(&spec.container, pid, spec.uid).await;
                        grace.as_mut().reset(tokio::time::Instant::now() + KILL_GRACE);
                    }
                }
                () = cancel.cancelled(), if ended_by.is_none() => {
                    ended_by = Some(Ended::Stopped);
                    if let Some(pid) = pid {
                        self.kill_group(&spec.container, pid, spec.uid).await;
                        grace.as_mut().reset(tokio::time::Instant::now() + KILL_GRACE);
                    }
                }
                () = &mut grace => break,
            }
        }
        let inspected = docker
            .inspect_exec(&exec.id)
            .await
            .map_err(|e| RunError::Stream(e.to_string()))?;
        // A run killed by a signal (the OOM killer, a fork bomb hitting the pids limit) takes
        // what is left of its process group with it; a run that exits leaves its background jobs.
        if let Some(pid) = pid
            && ended_by.is_none()
            && inspected.exit_code.is_some_and(|c| c >= 128)
        {
            self.kill_group(&spec.container, pid, spec.uid).await;
        }
        let exit_code = match ended_by {
            Some(Ended::Timeout) => 124,
            Some(Ended::Stopped) => 137,
            None => inspected.exit_code.unwrap_or(-1),
        };
        out.flush(&events, |data| RunEvent::Stdout { data }).await;
        err.flush(&events, |data| RunEvent::Stderr { data }).await;
        Ok(RunOutcome {
            run_id: spec.run_id,
            exit_code,
            truncated: out.truncated || err.truncated,
            stdout: out.text(),
            stderr: err.text(),
            timed_out: ended_by == Some(Ended::Timeout),
            stopped: ended_by == Some(Ended::Stopped),
            duration_ms: started.elapsed().as_millis() as u64,
            cpu_ns: None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Timeout,
    Stopped,
}

impl Runner for ExecRunner {
    fn run<'a>(
        &'a self,
        spec: RunSpec,
        events: Option<mpsc::Sender<RunEvent>>,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<RunOutcome, RunError>> {
        Box::pin(self.run_exec(spec, events, cancel))
    }
}

/// One output stream, kept up to a cap. Streamed events carry whole characters: a UTF-8
/// sequence split between two chunks of output waits for its rest, so the events of a run put
/// together are exactly its (lossy) output.
pub(crate) struct Capture {
    kept: Vec<u8>,
    cap: usize,
    /// Where in `kept` the next event starts.
    sent: usize,
    pub(crate) truncated: bool,
}

/// The length of `bytes` without a UTF-8 sequence cut off at its end.
fn whole_chars(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let b = bytes[bytes.len() - back];
        if b & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back for its lead
        }
        let need = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if need > back {
            bytes.len() - back
        } else {
            bytes.len()
        };
    }
    bytes.len()
}

impl Capture {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            kept: Vec::new(),
            cap,
            sent: 0,
            truncated: false,
        }
    }

    pub(crate) async fn push(
        &mut self,
        bytes: &[u8],
        events: &Option<mpsc::Sender<RunEvent>>,
        event: impl FnOnce(String) -> RunEvent,
    ) {
        let room = self.cap.saturating_sub(self.kept.len());
        let take = bytes.len().min(room);
        if take < bytes.len() {
            self.truncated = true;
        }
        if take == 0 {
            return;
        }
        self.kept.extend_from_slice(&bytes[..take]);
        if events.is_some() {
            let end = self.sent + whole_chars(&self.kept[self.sent..]);
            self.send(end, events, event).await;
        }
    }

    /// Streams what is kept and not yet sent, a cut-off character included (as U+FFFD).
    pub(crate) async fn flush(
        &mut self,
        events: &Option<mpsc::Sender<RunEvent>>,
        event: impl FnOnce(String) -> RunEvent,
    ) {
        self.send(self.kept.len(), events, event).await;
    }

    async fn send(
        &mut self,
        end: usize,
        events: &Option<mpsc::Sender<RunEvent>>,
        event: impl FnOnce(String) -> RunEvent,
    ) {
        let Some(tx) = events else { return };
        if end <= self.sent {
            return;
        }
        let text = String::from_utf8_lossy(&self.kept[self.sent..end]).into_owned();
        self.sent = end;
        // A client that went away does not stop the run.
        let _ = tx.send(event(text)).await;
    }

    pub(crate) fn text(self) -> String {
        String::from_utf8(self.kept)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn capture_caps_and_marks_truncated() {
        let mut c = Capture::new(5);
        c.push(b"abc", &None, |data| RunEvent::Stdout { data })
            .await;
        assert!(!c.truncated);
        c.push(b"defgh", &None, |data| RunEvent::Stdout { data })
            .await;
        assert!(c.truncated);
        assert_eq!(c.text(), "abcde");
    }

    #[tokio::test]
    async fn capture_streams_what_it_keeps() {
        let (tx, mut rx) = mpsc::channel(4);
        let mut c = Capture::new(3);
        c.push(b"hello", &Some(tx), |data| RunEvent::Stderr { data })
            .await;
        assert_eq!(
            rx.recv().await,
            Some(RunEvent::Stderr { data: "hel".into() })
        );
    }

    #[tokio::test]
    async fn streamed_events_carry_whole_characters() {
        let text = "añ€😀 end".as_bytes();
        // Every way of cutting the output in two: the events put together are the output.
        for cut in 0..=text.len() {
            let (tx, mut rx) = mpsc::channel(8);
            let events = Some(tx);
            let mut c = Capture::new(1024);
            c.push(&text[..cut], &events, |data| RunEvent::Stdout { data })
                .await;
            c.push(&text[cut..], &events, |data| RunEvent::Stdout { data })
                .await;
            c.flush(&events, |data| RunEvent::Stdout { data }).await;
            drop(events);
            let mut got = String::new();
            while let Some(RunEvent::Stdout { data }) = rx.recv().await {
                got.push_str(&data);
            }
            assert_eq!(got, "añ€😀 end", "cut at {cut}");
            assert_eq!(c.text(), "añ€😀 end");
        }
        // A character cut off at the cap is streamed as U+FFFD, as the outcome shows it.
        let (tx, mut rx) = mpsc::channel(8);
        let events = Some(tx);
        let mut c = Capture::new(2);
        c.push("a€".as_bytes(), &events, |data| RunEvent::Stdout { data })
            .await;
        c.flush(&events, |data| RunEvent::Stdout { data }).await;
        drop(events);
        let mut got = String::new();
        while let Some(RunEvent::Stdout { data }) = rx.recv().await {
            got.push_str(&data);
        }
        assert_eq!(got, c.text());
        assert_eq!(got, "a\u{FFFD}");
    }
}
