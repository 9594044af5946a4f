//! The run path: how a command runs in a session's container. [`Runner`] is the seam; the
//! resident agent ([`crate::run::agent::AgentRunner`], the default) and Docker exec
//! ([`ExecRunner`], the fallback and `SANDBOXD_RUN_BACKEND=exec`) sit behind it.
//!
//! A run executes `/bin/sh -c <command>` in `/workspace` as the sandbox uid. Its output streams
//! as it comes, each stream capped (the rest is drained and dropped, and the run is marked
//! truncated). A timed-out or stopped run has its whole process group killed.

pub mod agent;

use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures::StreamExt;
use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::container::docker::{AgentMount, Engine, WORKSPACE_MOUNT};
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
/// How long Docker may take to report a run's exit once its output was read.
const IO_WAIT: Duration = Duration::from_secs(10);

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

        let mut captured = Output::new(spec.max_output_bytes, events);
        let mut pid: Option<u32> = None;
        let mut pid_line = Vec::new();
        let deadline = tokio::time::sleep(spec.timeout);
        tokio::pin!(deadline);
        // After a kill, output still held open by an escaped process is not waited for.
        let grace = tokio::time::sleep(Duration::from_secs(86400 * 365));
        tokio::pin!(grace);
        let mut ended_by = None;
        // The kill runs beside the loop, which reads on: dockerd (20.10) handles an exec's
        // exit only once its output is copied out, one exit per container at a time, so a
        // loop that stopped reading to wait for the kill would wait for ever.
        let mut killing: Option<tokio::task::JoinHandle<()>> = None;
        let kill = |pid: u32| {
            let (runner, container, uid) = (self.clone(), spec.container.clone(), spec.uid);
            tokio::spawn(async move { runner.kill_group(&container, pid, uid).await })
        };
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
                                        killing = Some(kill(pid.unwrap_or(0)));
                                    }
                                }
                                None => { pid_line.extend_from_slice(bytes); continue; }
                            }
                        }
                        if !bytes.is_empty() {
                            captured.stdout(bytes);
                        }
                    }
                    Some(Ok(LogOutput::StdErr { message })) => captured.stderr(&message),
                    Some(Ok(_)) => {}
                },
                // Output that waited for a slow consumer goes out when it has room; the loop
                // itself never waits for it.
                () = captured.room(), if captured.waiting() => captured.send_waiting(),
                () = &mut deadline, if ended_by.is_none() => {
                    ended_by = Some(Ended::Timeout);
                    killing = pid.map(kill);
                }
                () = cancel.cancelled(), if ended_by.is_none() => {
                    ended_by = Some(Ended::Stopped);
                    killing = pid.map(kill);
                }
                _ = async { if let Some(k) = killing.as_mut() { let _ = k.await; } }, if killing.is_some() => {
                    // The group is gone: what output is still held open is not waited for long.
                    killing = None;
                    grace.as_mut().reset(tokio::time::Instant::now() + KILL_GRACE);
                }
                () = &mut grace => break,
            }
        }
        // Closing the attach lets dockerd finish the exec even when an escaped process still
        // holds its output open (dockerd waits for the copy before it reports the exit).
        drop(output);
        if let Some(k) = killing {
            let _ = k.await;
        }
        // A stopped or timed-out run's status is ours to say; only a run that ended by
        // itself needs Docker's word.
        let exited = match tokio::time::timeout(IO_WAIT, docker.inspect_exec(&exec.id)).await {
            Ok(Ok(inspected)) => inspected.exit_code,
            Ok(Err(e)) if ended_by.is_none() => return Err(RunError::Stream(e.to_string())),
            Err(_) if ended_by.is_none() => {
                return Err(RunError::Stream(
                    "docker did not report the run's exit".into(),
                ));
            }
            _ => None,
        };
        // A run killed by a signal (the OOM killer, a fork bomb hitting the pids limit) takes
        // what is left of its process group with it; a run that exits leaves its background jobs.
        if let Some(pid) = pid
            && ended_by.is_none()
            && exited.is_some_and(|c| c >= 128)
        {
            self.kill_group(&spec.container, pid, spec.uid).await;
        }
        let exit_code = match ended_by {
            Some(Ended::Timeout) => 124,
            Some(Ended::Stopped) => 137,
            None => exited.unwrap_or(-1),
        };
        let truncated = captured.truncated();
        let (stdout, stderr) = captured.finish();
        Ok(RunOutcome {
            run_id: spec.run_id,
            exit_code,
            truncated,
            stdout,
            stderr,
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

/// Which output stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn event(self, data: String) -> RunEvent {
        match self {
            Self::Stdout => RunEvent::Stdout { data },
            Self::Stderr => RunEvent::Stderr { data },
        }
    }
}

/// One output stream, kept up to a cap; `sent` is where in it the next event starts.
struct Capture {
    kept: Vec<u8>,
    cap: usize,
    sent: usize,
    truncated: bool,
}

impl Capture {
    fn new(cap: usize) -> Self {
        Self {
            kept: Vec::new(),
            cap,
            sent: 0,
            truncated: false,
        }
    }

    /// Keeps what fits under the cap; the rest is dropped and the stream marked truncated.
    fn keep(&mut self, bytes: &[u8]) {
        let room = self.cap.saturating_sub(self.kept.len());
        let take = bytes.len().min(room);
        if take < bytes.len() {
            self.truncated = true;
        }
        self.kept.extend_from_slice(&bytes[..take]);
    }

    /// Where the next event would end: after the last whole character kept, or (`all`, once
    /// the run is over) after everything kept, a cut-off character included (as U+FFFD).
    fn end(&self, all: bool) -> usize {
        if all {
            self.kept.len()
        } else {
            self.sent + whole_chars(&self.kept[self.sent..])
        }
    }

    /// The text from `sent` to `end`, now counted as sent.
    fn take(&mut self, end: usize) -> String {
        let text = String::from_utf8_lossy(&self.kept[self.sent..end]).into_owned();
        self.sent = end;
        text
    }

    fn text(self) -> String {
        String::from_utf8(self.kept)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }
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

/// A run's output: each stream kept up to a cap (the rest is dropped and the run marked
/// truncated), and streamed to `events` as it comes, never waiting for whoever reads them.
///
/// While the events channel is full (a client that reads slowly, or not at all), what is
/// kept and not yet sent waits here and goes out as one event as soon as there is room
/// ([`Output::room`], [`Output::send_waiting`]). So a run's loop never blocks on its consumer
/// (its stop, timeout and kill are always seen), and a run holds at most the cap per stream
/// and the channel's few events, whatever the consumer does. Streamed events carry whole
/// characters: a UTF-8 sequence split between two chunks of output waits for its rest, so the
/// events of each stream put together are exactly its (lossy) output.
pub(crate) struct Output {
    out: Capture,
    err: Capture,
    events: Option<mpsc::Sender<RunEvent>>,
    /// Streams holding kept bytes not yet sent, in the order those bytes came.
    waiting: Vec<Stream>,
}

impl Output {
    /// Output kept up to `cap` bytes per stream, streamed to `events` if given.
    pub(crate) fn new(cap: usize, events: Option<mpsc::Sender<RunEvent>>) -> Self {
        Self {
            out: Capture::new(cap),
            err: Capture::new(cap),
            events,
            waiting: Vec::with_capacity(2),
        }
    }

    fn capture(&mut self, stream: Stream) -> &mut Capture {
        match stream {
            Stream::Stdout => &mut self.out,
            Stream::Stderr => &mut self.err,
        }
    }

    /// Bytes on stdout; never waits.
    pub(crate) fn stdout(&mut self, bytes: &[u8]) {
        self.push(Stream::Stdout, bytes);
    }

    /// Bytes on stderr; never waits.
    pub(crate) fn stderr(&mut self, bytes: &[u8]) {
        self.push(Stream::Stderr, bytes);
    }

    fn push(&mut self, stream: Stream, bytes: &[u8]) {
        let streaming = self.events.is_some();
        let c = self.capture(stream);
        c.keep(bytes);
        if streaming && c.kept.len() > c.sent && !self.waiting.contains(&stream) {
            self.waiting.push(stream);
        }
        self.send(false);
    }

    /// Sends what waits, oldest first, while the channel has room; never waits. `all`: the
    /// run is over, a cut-off character goes too.
    fn send(&mut self, all: bool) {
        let Self {
            out,
            err,
            events,
            waiting,
        } = self;
        while let Some(&stream) = waiting.first() {
            let Some(tx) = events.as_ref() else {
                waiting.clear();
                return;
            };
            let c = match stream {
                Stream::Stdout => &mut *out,
                Stream::Stderr => &mut *err,
            };
            let end = c.end(all);
            if end > c.sent {
                let closed = match tx.try_reserve() {
                    Ok(permit) => {
                        permit.send(stream.event(c.take(end)));
                        false
                    }
                    Err(mpsc::error::TrySendError::Full(())) => return,
                    Err(mpsc::error::TrySendError::Closed(())) => true,
                };
                if closed {
                    // The client went away: the run goes on, its events are dropped.
                    *events = None;
                    waiting.clear();
                    return;
                }
            }
            // Sent, or only part of a character waits (it goes with its rest).
            waiting.remove(0);
        }
    }

    /// Whether kept output waits for room in the events channel.
    pub(crate) fn waiting(&self) -> bool {
        self.events.is_some() && !self.waiting.is_empty()
    }

    /// Resolves when the events channel has room (or is closed); pending forever when
    /// nothing is streamed. Then [`Output::send_waiting`].
    pub(crate) async fn room(&self) {
        match &self.events {
            Some(tx) => drop(tx.reserve().await),
            None => std::future::pending().await,
        }
    }

    /// Sends what waits while there is room; never waits.
    pub(crate) fn send_waiting(&mut self) {
        self.send(false);
    }

    /// Whether either stream was cut at the cap.
    pub(crate) fn truncated(&self) -> bool {
        self.out.truncated || self.err.truncated
    }

    /// Ends the output: what is kept goes out (a cut-off character as U+FFFD), and stdout and
    /// stderr are returned. What the channel has no room for is handed to a task of its own,
    /// which sends it, in order, as the consumer reads (or drops it when the consumer goes
    /// away): the run ends now, whatever its consumer does.
    pub(crate) fn finish(mut self) -> (String, String) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            let c = self.capture(stream);
            if c.kept.len() > c.sent && !self.waiting.contains(&stream) {
                self.waiting.push(stream);
            }
        }
        self.send(true);
        if let Some(tx) = self.events.take()
            && !self.waiting.is_empty()
        {
            let mut rest = Vec::with_capacity(2);
            for stream in std::mem::take(&mut self.waiting) {
                let c = self.capture(stream);
                let end = c.end(true);
                if end > c.sent {
                    rest.push(stream.event(c.take(end)));
                }
            }
            tokio::spawn(async move {
                for event in rest {
                    if tx.send(event).await.is_err() {
                        break;
                    }
                }
            });
        }
        (self.out.text(), self.err.text())
    }
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
