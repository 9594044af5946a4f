//! The fast run path: the resident agent (`sandbox-agent`, PID 1 of every sandbox) reached over
//! the Unix socket in the session's run folder, `{workspace root}/{session}/agent/agent.sock`
//! on the host, mounted at [`proto::RUN_DIR`] in the sandbox (outside `/workspace`, no network).
//!
//! sandboxd embeds the static agent of its own build ([`BINARY`]) and installs it into the
//! host folder at start ([`install`]); every sandbox mounts that folder read-only and runs the
//! agent as its entrypoint, so a container that next starts runs the agent of the sandboxd
//! that drives it. A running container keeps the agent it started with; sandboxd speaks the
//! newest protocol both know.
//!
//! Never a failed run for want of an agent: a container made without one (by an older
//! sandboxd, or with the exec backend), an agent that speaks no shared protocol, or one that
//! does not answer, is served by Docker exec ([`ExecRunner`]) behind the same seam. An agent
//! that died took its container with it: that is reported (log and
//! `sandboxd_agent_deaths_total`), and the container is started again.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::query_parameters::InspectContainerOptions;
use futures::future::BoxFuture;
use sandbox_agent::proto::{self, Frame, Msg, RunExit};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::docker::{AgentMount, Engine};
use crate::metrics::Metrics;
use crate::runner::{
    ExecRunner, Output, RunError, RunEvent, RunOutcome, RunSpec, RunStatus, Runner, SessionStats,
};

/// The static agent binary of this build (built by `build.rs` from the `agent/` crate).
pub static BINARY: &[u8] = include_bytes!(env!("SANDBOXD_AGENT_BINARY_PATH"));

/// Label on a container whose PID 1 is the agent: the newest protocol of the sandboxd that
/// made it.
pub const LABEL_AGENT: &str = "sandboxd.dev/agent";

/// The host folder holding the agent binary, under the workspace root (which is the same path
/// on the host and in a sandboxd container, so Docker can bind it).
pub const BIN_FOLDER: &str = ".sandboxd-agent";

/// How long a connect, the handshake or a short request may take.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a freshly started container's agent may take to listen.
const LISTEN_WAIT: Duration = Duration::from_secs(5);
/// What sandboxd adds to a run's timeout before it stops waiting for the agent's own.
const BACKSTOP: Duration = Duration::from_secs(10);

/// Writes the embedded agent into `dir` (atomically: a running sandbox keeps the binary it
/// started, the next start gets this one) unless the same bytes are there. Returns the folder.
pub fn install(dir: &Path) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let target = dir.join(proto::BINARY_NAME);
    if std::fs::read(&target).is_ok_and(|b| b == BINARY) {
        return Ok(dir.to_owned());
    }
    let tmp = dir.join(format!(".{}.{}", proto::BINARY_NAME, std::process::id()));
    std::fs::write(&tmp, BINARY)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, &target)?;
    Ok(dir.to_owned())
}

/// Runs commands through each session's agent, falling back to Docker exec.
pub struct AgentRunner {
    engine: Engine,
    exec: ExecRunner,
    root: PathBuf,
    bin_dir: PathBuf,
    uid: u32,
    metrics: Arc<Metrics>,
}

/// Why a handshake failed.
struct Refused {
    message: String,
    /// The request sent with the hello may have reached the agent (it went silent after it).
    maybe_started: bool,
}

/// How a session's agent was reached.
enum Reached {
    Agent(Conn),
    Fallback(String),
}

struct Conn {
    r: BufReader<OwnedReadHalf>,
    w: OwnedWriteHalf,
}

impl Conn {
    async fn recv(&mut self) -> Result<Option<Frame>, proto::FrameError> {
        read_frame(&mut self.r).await
    }
}

/// Reads one frame; `None` at the end of the stream. Not cancel-safe: a frame half read is
/// lost with the future (see [`next_frame`]).
async fn read_frame(r: &mut BufReader<OwnedReadHalf>) -> Result<Option<Frame>, proto::FrameError> {
    let mut header = [0u8; 4];
    match r.read_exact(&mut header).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = proto::frame_len(header)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    proto::decode(body).map(Some)
}

/// Reads one frame with a reader of its own, handing the reader back: kept as one future
/// across the branches of a run's loop, so a branch that wins mid-frame never cuts a frame.
async fn next_frame(
    mut r: BufReader<OwnedReadHalf>,
) -> (
    BufReader<OwnedReadHalf>,
    Result<Option<Frame>, proto::FrameError>,
) {
    let frame = read_frame(&mut r).await;
    (r, frame)
}

impl AgentRunner {
    /// A runner for sessions under `root` (the workspace root), installing the embedded agent
    /// into `{root}/.sandboxd-agent`.
    pub fn new(engine: Engine, root: &Path, uid: u32, metrics: Arc<Metrics>) -> io::Result<Self> {
        let bin_dir = install(&root.join(BIN_FOLDER))?;
        Ok(Self {
            exec: ExecRunner::new(engine.clone()),
            engine,
            root: root.to_owned(),
            bin_dir,
            uid,
            metrics,
        })
    }

    fn run_dir(&self, session: &str) -> PathBuf {
        self.root.join(session).join("agent")
    }

    fn socket(&self, session: &str) -> PathBuf {
        self.run_dir(session).join(proto::SOCKET_NAME)
    }

    /// Connects and shakes hands. Only a socket (never a symlink the sandbox put there) is
    /// connected to, and only an agent that says it serves this session is used.
    ///
    /// `request`, when given, is written in the same write as the hello (no round trip of its
    /// own): the agent reads it only after it has accepted the hello, so an agent of another
    /// session, or one that speaks no shared protocol, never acts on it.
    async fn handshake(&self, session: &str, request: Option<&Msg>) -> Result<Conn, Refused> {
        let path = self.socket(session);
        let refused = |message: String| Refused {
            message,
            maybe_started: false,
        };
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_socket() => {}
            Ok(_) => return Err(refused(format!("{} is not a socket", path.display()))),
            Err(e) => return Err(refused(format!("{}: {e}", path.display()))),
        }
        let stream = tokio::time::timeout(IO_TIMEOUT, UnixStream::connect(&path))
            .await
            .map_err(|_| refused("connecting timed out".to_owned()))?
            .map_err(|e| refused(format!("connect: {e}")))?;
        let (r, w) = stream.into_split();
        let mut conn = Conn {
            r: BufReader::with_capacity(256 * 1024, r),
            w,
        };
        let mut hello = proto::encode_msg(&Msg::Hello {
            protocols: (proto::MIN_PROTOCOL..=proto::PROTOCOL).collect(),
            session: session.to_owned(),
        });
        if let Some(m) = request {
            hello.extend(proto::encode_msg(m));
        }
        let welcome = tokio::time::timeout(IO_TIMEOUT, async {
            conn.w
                .write_all(&hello)
                .await
                .map_err(|e| refused(e.to_string()))?;
            conn.recv().await.map_err(|e| refused(e.to_string()))
        })
        .await
        .map_err(|_| Refused {
            message: "the agent did not answer the handshake".to_owned(),
            // It was written a request it may act on yet.
            maybe_started: request.is_some(),
        })??;
        match welcome {
            Some(Frame::Msg(Msg::Welcome {
                protocol,
                session: theirs,
                version,
            })) => {
                if theirs != session {
                    return Err(refused(format!(
                        "the socket of session '{session}' is served by an agent of session '{theirs}'"
                    )));
                }
                if proto::negotiate(&[protocol]).is_none() {
                    return Err(refused(format!(
                        "the agent ({version}) chose protocol {protocol}, which this sandboxd does not speak"
                    )));
                }
                Ok(conn)
            }
            Some(Frame::Msg(Msg::Error { code, message })) => {
                Err(refused(format!("the agent refused: {code}: {message}")))
            }
            other => Err(refused(format!("unexpected answer to hello: {other:?}"))),
        }
    }

    /// Reaches the session's agent, handing it `request` with the hello: waits for a
    /// starting agent, reports a dead one (its container stopped with it: `NotRunning`, and the
    /// core starts it again), and falls back to exec for a container that has none.
    async fn reach(&self, spec: &RunSpec, request: &Msg) -> Result<Reached, RunError> {
        let first = match self.handshake(&spec.session, Some(request)).await {
            Ok(conn) => return Ok(Reached::Agent(conn)),
            Err(e) => e,
        };
        // An agent that went silent after it was handed the run may still start it: never
        // run it a second time through exec.
        let silent = |e: &Refused| {
            RunError::Start(format!(
                "the sandbox's agent did not answer ({}); the run may have started",
                e.message
            ))
        };
        if first.maybe_started {
            return Err(silent(&first));
        }
        // The no-op engine (the operator bench's) has no container to look at: the run fails
        // here with its message, before any wait for an agent.
        let inspected = self
            .engine
            .client()
            .map_err(|e| RunError::Start(e.to_string()))?
            .inspect_container(&spec.container, None::<InspectContainerOptions>)
            .await
            .map_err(|e| match e {
                bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                } => RunError::NotRunning,
                e => RunError::Start(e.to_string()),
            })?;
        let has_agent = inspected
            .config
            .as_ref()
            .and_then(|c| c.labels.as_ref())
            .is_some_and(|l| l.contains_key(LABEL_AGENT));
        let state = inspected.state.unwrap_or_default();
        if !state.running.unwrap_or(false) {
            if has_agent {
                self.report_death(&spec.session, &state);
            }
            return Err(RunError::NotRunning);
        }
        if !has_agent {
            return Ok(Reached::Fallback(
                "its container was made without the agent".into(),
            ));
        }
        // Just started: the agent binds its socket within milliseconds.
        let deadline = Instant::now() + LISTEN_WAIT;
        let mut last = first;
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
            match self.handshake(&spec.session, Some(request)).await {
                Ok(conn) => return Ok(Reached::Agent(conn)),
                Err(e) if e.maybe_started => return Err(silent(&e)),
                Err(e) => last = e,
            }
        }
        Ok(Reached::Fallback(format!(
            "its agent does not answer: {}",
            last.message
        )))
    }

    /// What the agent is asked to run for `spec`.
    fn request_of(spec: &RunSpec) -> Msg {
        Msg::Run(proto::RunRequest {
            run_id: spec.run_id.clone(),
            argv: vec!["/bin/sh".into(), "-c".into(), spec.command.clone()],
            env: spec
                .env
                .iter()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            cwd: Some(crate::docker::WORKSPACE_MOUNT.to_owned()),
            timeout_ms: u64::try_from(spec.timeout.as_millis()).unwrap_or(u64::MAX),
            max_output_bytes: spec.max_output_bytes as u64,
        })
    }

    fn report_death(&self, session: &str, state: &bollard::models::ContainerState) {
        warn!(
            session,
            exit_code = state.exit_code,
            oom_killed = state.oom_killed,
            error = state.error.as_deref().unwrap_or(""),
            "the sandbox's agent died (its container stopped); starting the container again"
        );
        self.metrics.agent_deaths.inc();
    }

    async fn run_agent(
        &self,
        conn: Conn,
        started: Instant,
        spec: RunSpec,
        events: Option<mpsc::Sender<RunEvent>>,
        cancel: CancellationToken,
    ) -> Result<RunOutcome, RunError> {
        // The run request went with the hello (see `reach`).
        let mut output = Output::new(spec.max_output_bytes, events);
        let backstop = tokio::time::sleep(spec.timeout + BACKSTOP);
        tokio::pin!(backstop);
        let mut stop_sent = false;
        let Conn { r, mut w } = conn;
        let stop = proto::encode_msg(&Msg::Stop { run_id: None });
        // One frame is read at a time, by one future that lives until the frame is whole
        // (the other branches win often: a reader that came back for more output).
        let reading = next_frame(r);
        tokio::pin!(reading);
        let exit: RunExit = loop {
            tokio::select! {
                (r, frame) = &mut reading => {
                    reading.set(next_frame(r));
                    match frame {
                    Ok(Some(Frame::Stdout(b))) => output.stdout(&b),
                    Ok(Some(Frame::Stderr(b))) => output.stderr(&b),
                    Ok(Some(Frame::Msg(Msg::Exit(exit)))) => break exit,
                    Ok(Some(Frame::Msg(Msg::Started { .. }))) => {}
                    Ok(Some(Frame::Msg(Msg::Error { code, message }))) => {
                        return Err(RunError::Start(format!("the agent refused the run: {code}: {message}")));
                    }
                    Ok(Some(Frame::Msg(other))) => {
                        return Err(RunError::Stream(format!("the agent sent {other:?} mid-run")));
                    }
                    Ok(None) | Err(_) => return Err(self.lost_mid_run(&spec, frame.err()).await),
                    }
                },
                // Output that waited for a slow consumer goes out when it has room; the loop
                // itself never waits for it.
                () = output.room(), if output.waiting() => output.send_waiting(),
                () = cancel.cancelled(), if !stop_sent => {
                    stop_sent = true;
                    if w.write_all(&stop).await.is_err() {
                        return Err(self.lost_mid_run(&spec, None).await);
                    }
                }
                () = &mut backstop => {
                    if stop_sent {
                        return Err(RunError::Stream("the agent did not end the run after a stop".into()));
                    }
                    stop_sent = true;
                    let _ = w.write_all(&stop).await;
                    backstop.as_mut().reset(tokio::time::Instant::now() + BACKSTOP);
                }
            }
        };
        let truncated = exit.truncated || output.truncated();
        let (stdout, stderr) = output.finish();
        Ok(RunOutcome {
            run_id: spec.run_id,
            exit_code: exit.exit_code,
            truncated,
            stdout,
            stderr,
            timed_out: exit.timed_out,
            stopped: exit.stopped,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            cpu_ns: Some(exit.cpu_ns),
        })
    }

    /// The agent's connection broke mid-run: if the agent died, its container went with it:
    /// report it and start the container again.
    async fn lost_mid_run(&self, spec: &RunSpec, e: Option<proto::FrameError>) -> RunError {
        let running = match self.engine.client() {
            Ok(docker) => docker
                .inspect_container(&spec.container, None::<InspectContainerOptions>)
                .await
                .ok()
                .and_then(|c| c.state),
            Err(_) => None,
        };
        match running {
            Some(state) if !state.running.unwrap_or(false) => {
                self.report_death(&spec.session, &state);
                let restarted = self.engine.start(&spec.container).await;
                RunError::Stream(format!(
                    "the sandbox's agent died during the run; its container was started again ({})",
                    match restarted {
                        Ok(()) => "running".to_owned(),
                        Err(e) => e.to_string(),
                    }
                ))
            }
            _ => RunError::Stream(format!(
                "the connection to the sandbox's agent broke mid-run{}",
                e.map(|e| format!(": {e}")).unwrap_or_default()
            )),
        }
    }

    async fn request(&self, session: &str, msg: Msg) -> Result<Msg, String> {
        let mut conn = self
            .handshake(session, Some(&msg))
            .await
            .map_err(|e| e.message)?;
        tokio::time::timeout(IO_TIMEOUT, async {
            match conn.recv().await {
                Ok(Some(Frame::Msg(m))) => Ok(m),
                Ok(other) => Err(format!("unexpected answer {other:?}")),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
        .map_err(|_| "the agent did not answer".to_owned())?
    }
}

impl Runner for AgentRunner {
    fn run<'a>(
        &'a self,
        spec: RunSpec,
        events: Option<mpsc::Sender<RunEvent>>,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<RunOutcome, RunError>> {
        Box::pin(async move {
            let started = Instant::now();
            match self.reach(&spec, &Self::request_of(&spec)).await? {
                Reached::Agent(conn) => {
                    self.metrics.run_path("agent");
                    self.run_agent(conn, started, spec, events, cancel).await
                }
                Reached::Fallback(why) => {
                    debug!(session = %spec.session, why, "running with docker exec");
                    self.metrics.run_path("exec_fallback");
                    self.exec.run(spec, events, cancel).await
                }
            }
        })
    }

    fn agent_mount(&self, session: &str) -> io::Result<Option<AgentMount>> {
        let run_dir = self.run_dir(session);
        std::fs::create_dir_all(&run_dir)?;
        std::os::unix::fs::chown(&run_dir, Some(self.uid), Some(self.uid))?;
        std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o700))?;
        // A socket left by the container's earlier life is the agent's to replace.
        Ok(Some(AgentMount {
            bin_dir: self.bin_dir.display().to_string(),
            run_dir: run_dir.display().to_string(),
            protocol: proto::PROTOCOL,
        }))
    }

    fn finds_stopped_containers(&self) -> bool {
        true
    }

    fn container_stopped<'a>(&'a self, session: &'a str, container: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Ok(docker) = self.engine.client() else {
                return;
            };
            let Ok(inspected) = docker
                .inspect_container(container, None::<InspectContainerOptions>)
                .await
            else {
                return;
            };
            let has_agent = inspected
                .config
                .as_ref()
                .and_then(|c| c.labels.as_ref())
                .is_some_and(|l| l.contains_key(LABEL_AGENT));
            if let Some(state) = inspected.state
                && has_agent
                && !state.running.unwrap_or(false)
            {
                self.report_death(session, &state);
            }
        })
    }

    fn stop_detached<'a>(
        &'a self,
        session: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, RunError>> {
        Box::pin(async move {
            match self
                .request(
                    session,
                    Msg::Stop {
                        run_id: Some(run_id.to_owned()),
                    },
                )
                .await
            {
                Ok(Msg::Stopped { found }) => Ok(found),
                Ok(other) => Err(RunError::Stream(format!("unexpected answer {other:?}"))),
                // No agent (an exec session, a stopped container): no such run.
                Err(_) => Ok(false),
            }
        })
    }

    fn status<'a>(
        &'a self,
        session: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<RunStatus>, RunError>> {
        Box::pin(async move {
            match self
                .request(
                    session,
                    Msg::Status {
                        run_id: run_id.to_owned(),
                    },
                )
                .await
            {
                Ok(Msg::RunState { state }) => Ok(state.map(|s| RunStatus {
                    run_id: s.run_id,
                    running: s.running,
                    exit_code: s.exit.as_ref().map(|e| e.exit_code),
                    timed_out: s.exit.as_ref().is_some_and(|e| e.timed_out),
                    stopped: s.exit.as_ref().is_some_and(|e| e.stopped),
                    truncated: s.exit.as_ref().is_some_and(|e| e.truncated),
                    cpu_ns: s.exit.as_ref().map(|e| e.cpu_ns),
                    duration_ms: s.exit.as_ref().map(|e| e.duration_ms),
                    stdout: s.stdout,
                    stderr: s.stderr,
                })),
                Ok(other) => Err(RunError::Stream(format!("unexpected answer {other:?}"))),
                Err(_) => Ok(None),
            }
        })
    }

    fn session_stats<'a>(
        &'a self,
        session: &'a str,
    ) -> BoxFuture<'a, Result<Option<SessionStats>, RunError>> {
        Box::pin(async move {
            match self.request(session, Msg::Stats).await {
                Ok(Msg::StatsReply { cpu_ns, running }) => Ok(Some(SessionStats {
                    cpu_ns,
                    runs_in_flight: running,
                })),
                Ok(other) => Err(RunError::Stream(format!("unexpected answer {other:?}"))),
                Err(_) => Ok(None),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_agent_is_a_static_elf() {
        assert_eq!(&BINARY[..4], b"\x7fELF");
        // No program interpreter (PT_INTERP) among the program headers: a static binary runs in
        // any image, a busybox one included.
        let u16_at = |o: usize| u16::from_le_bytes([BINARY[o], BINARY[o + 1]]) as usize;
        let mut phoff = [0u8; 8];
        phoff.copy_from_slice(&BINARY[32..40]);
        let phoff = u64::from_le_bytes(phoff) as usize;
        let (size, count) = (u16_at(54), u16_at(56));
        assert!(count > 0);
        for i in 0..count {
            let at = phoff + i * size;
            let kind =
                u32::from_le_bytes([BINARY[at], BINARY[at + 1], BINARY[at + 2], BINARY[at + 3]]);
            assert_ne!(
                kind, 3,
                "the agent has a program interpreter: it is not static"
            );
        }
    }

    #[test]
    fn install_is_atomic_and_idempotent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("agent");
        install(&bin).expect("install");
        let path = bin.join(proto::BINARY_NAME);
        assert_eq!(std::fs::read(&path).expect("read"), BINARY);
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        std::fs::write(&path, b"an older agent").expect("write");
        install(&bin).expect("install again");
        assert_eq!(std::fs::read(&path).expect("read"), BINARY);
        assert_eq!(std::fs::read_dir(&bin).expect("ls").count(), 1);
    }
}
