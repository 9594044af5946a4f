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
//! The run folder is sandboxd's, not the sandbox's: owned by root, `0700`, never writable by
//! the sandbox uid. The agent starts as root (with only CAP_SETUID, CAP_SETGID and
//! CAP_SETPCAP), binds the socket there (`0600`, root's), then empties its capability bounding
//! set and drops to the sandbox uid before it serves or runs anything: no process of the
//! sandbox can remove, replace, shadow or connect to the socket. sandboxd opens the folder
//! with `O_PATH | O_NOFOLLOW | O_DIRECTORY`, checks it is root's alone and the socket a
//! socket, and connects through `/proc/self/fd/<fd>/agent.sock` (a path swapped in between is
//! never followed). Before it writes a byte it checks the peer with `SO_PEERCRED`: the
//! listener must have been made by root and by the container's PID 1 as Docker reports it
//! (`State.Pid`, cached per container start). Anything else is not the agent: the run goes to
//! Docker exec (logged, `sandboxd_agent_untrusted_total`), never to the impostor.
//!
//! Never a failed run for want of an agent: a container made without one (by an older
//! sandboxd, or with the exec backend), an agent that speaks no shared protocol, or one that
//! does not answer, is served by Docker exec ([`ExecRunner`]) behind the same seam. An agent
//! that died took its container with it: that is reported (log and
//! `sandboxd_agent_deaths_total`), and the container is started again.
//!
//! Over 600 lines: the agent's installation, its connection and a run through it are one protocol.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::query_parameters::InspectContainerOptions;
use futures::future::BoxFuture;
use sandbox_agent::pause::RESUME_MARKER;
use sandbox_agent::proto::{self, Frame, Msg, RunExit};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::container::docker::DockerEngine;
use crate::container::{AgentMount, Engine};
use crate::metrics::Metrics;
use crate::run::terminal::{TermAttach, TermError};
use crate::run::{ExecRunner, Output, RunError, RunEvent, RunOutcome, RunSpec, RunStatus, Runner};

/// The static agent binary of this build (built by `build.rs` from the `agent/` crate).
pub static BINARY: &[u8] = include_bytes!(env!("SANDBOXD_AGENT_BINARY_PATH"));

pub use crate::container::docker::LABEL_AGENT;

/// The host folder holding the agent binary, under the workspace root (which is the same path
/// on the host and in a sandboxd container, so Docker can bind it).
pub const BIN_FOLDER: &str = ".sandboxd-agent";

/// How long a connect or a short request may take.
pub(super) const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the agent may take to answer a handshake: longer than [`IO_TIMEOUT`], since the
/// first after a start is answered once the sandbox has booted, which a gVisor sandbox held to
/// a small CPU share does in seconds (its kernel boots in the sandbox's own CPU share).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a freshly started container's agent may take to listen.
pub(super) const LISTEN_WAIT: Duration = Duration::from_secs(5);
/// What sandboxd adds to a run's timeout before it stops waiting for the agent's own.
const BACKSTOP: Duration = Duration::from_secs(10);
/// How long an agent may take to let go of its host sockets before a checkpoint (its own
/// wait for its connections is 3 s).
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(5);

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
    metrics: Arc<Metrics>,
    /// Host pid of each session's container's PID 1 (Docker's `State.Pid`) for the current
    /// start of its container; forgotten whenever the container is found stopped. With it, the
    /// session its agent was started for: the container's session label, which is the warm
    /// pool's name for a container a session took from a pool.
    pids: Mutex<HashMap<String, (i32, String)>>,
}

/// Why a handshake failed.
pub(super) struct Refused {
    pub(super) message: String,
    /// The request sent with the hello may have reached the agent (it went silent after it).
    pub(super) maybe_started: bool,
    /// The socket is not the agent's: nothing was written to it, and it is never retried.
    pub(super) untrusted: bool,
}

/// How a session's agent was reached.
enum Reached {
    Agent(Conn),
    Fallback(String),
}

pub(super) struct Conn {
    pub(super) r: BufReader<OwnedReadHalf>,
    pub(super) w: OwnedWriteHalf,
    /// The protocol the agent chose in its welcome.
    pub(super) protocol: u32,
}

impl Conn {
    pub(super) async fn recv(&mut self) -> Result<Option<Frame>, proto::FrameError> {
        read_frame(&mut self.r).await
    }
}

/// Reads one frame; `None` at the end of the stream. Not cancel-safe: a frame half read is
/// lost with the future (see [`next_frame`]).
pub(super) async fn read_frame(
    r: &mut BufReader<OwnedReadHalf>,
) -> Result<Option<Frame>, proto::FrameError> {
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
    pub fn new(engine: Engine, root: &Path, metrics: Arc<Metrics>) -> io::Result<Self> {
        let bin_dir = install(&root.join(BIN_FOLDER))?;
        Ok(Self {
            exec: ExecRunner::new(engine.clone()),
            engine,
            root: root.to_owned(),
            bin_dir,
            metrics,
            pids: Mutex::default(),
        })
    }

    fn run_dir(&self, session: &str) -> PathBuf {
        self.root.join(session).join("agent")
    }

    fn forget_pid(&self, session: &str) {
        self.pids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(session);
    }

    /// Whether `pid` (a host pid) is the PID 1 of the session's container as Docker reports
    /// it, and then the session its agent was started for (see [`Self::pids`]); asks Docker
    /// only when the cached pid of the container's current start differs.
    /// `container` is the session's container id when the caller has it from the session's
    /// row; else it is looked up by the session's container name.
    async fn is_container_pid1(
        &self,
        session: &str,
        container: Option<&str>,
        pid: i32,
    ) -> Result<Option<String>, String> {
        let cached = self
            .pids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(session)
            .cloned();
        if let Some((p, agent_session)) = cached
            && p == pid
        {
            return Ok(Some(agent_session));
        }
        self.metrics.agent_pid_lookups.inc();
        let pid1 = self.learn_pid1(session, container).await?;
        Ok(pid1.and_then(|(p, agent_session)| (p == pid).then_some(agent_session)))
    }

    /// Asks Docker for the PID 1 of the session's container and the session its agent was
    /// started for, and remembers both for the container's current start (see [`Self::pids`]);
    /// `None` (and nothing remembered) when the container does not run.
    async fn learn_pid1(
        &self,
        session: &str,
        container: Option<&str>,
    ) -> Result<Option<(i32, String)>, String> {
        let name = container.map_or_else(|| self.engine.container_name(session), str::to_owned);
        let inspected = self
            .engine
            .docker()
            .map_err(|e| e.to_string())?
            .client()
            .inspect_container(&name, None::<InspectContainerOptions>)
            .await
            .map_err(|e| format!("inspect container {name}: {e}"))?;
        let agent_session = inspected
            .config
            .as_ref()
            .and_then(|c| c.labels.as_ref())
            .and_then(|l| l.get(crate::container::docker::LABEL_SESSION))
            .cloned()
            .unwrap_or_else(|| session.to_owned());
        let state = inspected.state.unwrap_or_default();
        let pid1 = match (state.running, state.pid) {
            (Some(true), Some(p)) if p > 0 => i32::try_from(p).unwrap_or(0),
            _ => {
                self.forget_pid(session);
                return Ok(None);
            }
        };
        // Under gVisor the PID 1 Docker reports is the sandbox's kernel (runsc-sandbox), and a
        // socket bound in a bind-mounted folder is made on the host by the container's gofer:
        // the agent's socket is the gofer's. Inside, gVisor's own permission checks keep the
        // root-owned run folder the agent's alone, as the node's kernel does under runc.
        let served_by = gvisor_gofer(pid1).unwrap_or(pid1);
        self.pids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(session.to_owned(), (served_by, agent_session.clone()));
        Ok(Some((served_by, agent_session)))
    }

    /// Connects to the session's socket without following anything the path may have been
    /// swapped for: the run folder is opened `O_PATH | O_NOFOLLOW | O_DIRECTORY` and must be
    /// root's alone (not writable by group or others: never the sandbox's), the socket must be
    /// a socket in it (not a symlink), and the connect goes through the folder's descriptor.
    async fn connect(&self, session: &str) -> Result<UnixStream, Refused> {
        use rustix::fs::{AtFlags, FileType, Mode, OFlags};
        let dir = self.run_dir(session);
        let refused = |message: String, untrusted: bool| Refused {
            message,
            maybe_started: false,
            untrusted,
        };
        let fd = rustix::fs::open(
            &dir,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            // ELOOP/ENOTDIR: a symlink or a file where the folder should be.
            let swapped = matches!(e, rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR);
            refused(format!("open {}: {e}", dir.display()), swapped)
        })?;
        let st = rustix::fs::fstat(&fd)
            .map_err(|e| refused(format!("stat {}: {e}", dir.display()), false))?;
        if st.st_uid != 0 || st.st_mode & 0o022 != 0 {
            return Err(refused(
                format!(
                    "the run folder {} is not root's alone (owner uid {}, mode {:o}): the sandbox could replace its socket",
                    dir.display(),
                    st.st_uid,
                    st.st_mode & 0o7777
                ),
                true,
            ));
        }
        let sock = rustix::fs::statat(&fd, proto::SOCKET_NAME, AtFlags::SYMLINK_NOFOLLOW).map_err(
            |e| {
                refused(
                    format!("{}: {e}", dir.join(proto::SOCKET_NAME).display()),
                    false,
                )
            },
        )?;
        if FileType::from_raw_mode(sock.st_mode) != FileType::Socket {
            return Err(refused(
                format!("{} is not a socket", dir.join(proto::SOCKET_NAME).display()),
                true,
            ));
        }
        // Resolved through the open folder: no swap of a path component is followed.
        let through = format!("/proc/self/fd/{}/{}", fd.as_raw_fd(), proto::SOCKET_NAME);
        let stream = tokio::time::timeout(IO_TIMEOUT, UnixStream::connect(&through))
            .await
            .map_err(|_| refused("connecting timed out".to_owned(), false))?
            .map_err(|e| refused(format!("connect: {e}"), false))?;
        drop(fd);
        Ok(stream)
    }

    /// Whether the peer of `stream` is the session's agent: the listener was made by root (the
    /// agent binds before it drops to the sandbox uid; nothing of the sandbox is ever root) and
    /// by the container's PID 1. Returns the session that agent was started for.
    async fn check_peer(
        &self,
        session: &str,
        container: Option<&str>,
        stream: &UnixStream,
    ) -> Result<String, Refused> {
        let untrusted = |message: String| Refused {
            message,
            maybe_started: false,
            untrusted: true,
        };
        let cred = stream
            .peer_cred()
            .map_err(|e| untrusted(format!("cannot read the socket's peer credentials: {e}")))?;
        let pid = match cred.pid() {
            Some(p) if p > 0 => p,
            _ => {
                return Err(untrusted(
                    "the socket's peer has no pid sandboxd can see: run sandboxd in the host's PID namespace (hostPID)".to_owned(),
                ));
            }
        };
        if cred.uid() != 0 {
            return Err(untrusted(format!(
                "the socket is served by pid {pid} as uid {}, not by the agent (root when it binds)",
                cred.uid()
            )));
        }
        match self.is_container_pid1(session, container, pid).await {
            Ok(Some(agent_session)) => Ok(agent_session),
            Ok(None) => Err(untrusted(format!(
                "the socket is served by pid {pid}, which is not the PID 1 of the session's container"
            ))),
            Err(e) => Err(untrusted(format!(
                "cannot tell whether pid {pid} is the container's PID 1: {e}"
            ))),
        }
    }

    /// Connects and shakes hands. Only the container's own agent (see [`Self::connect`] and
    /// [`Self::check_peer`]) is written to, and only one that says it serves this session is
    /// used.
    ///
    /// `request`, when given, is written in the same write as the hello (no round trip of its
    /// own): the agent reads it only after it has accepted the hello, so an agent of another
    /// session, or one that speaks no shared protocol, never acts on it.
    pub(super) async fn handshake(
        &self,
        session: &str,
        container: Option<&str>,
        request: Option<&Msg>,
    ) -> Result<Conn, Refused> {
        let refused = |message: String| Refused {
            message,
            maybe_started: false,
            untrusted: false,
        };
        let checked = match self.connect(session).await {
            Ok(stream) => self
                .check_peer(session, container, &stream)
                .await
                .map(|s| (stream, s)),
            Err(e) => Err(e),
        };
        // The agent serves the session its container was started for: this one, or the warm
        // pool's name for a container this session took from a pool.
        let (stream, agent_session) = match checked {
            Ok(checked) => checked,
            Err(e) => {
                if e.untrusted {
                    warn!(session, reason = %e.message, "refused the sandbox's agent socket: not the agent");
                    self.metrics.agent_untrusted.inc();
                }
                return Err(e);
            }
        };
        let (r, w) = stream.into_split();
        let mut conn = Conn {
            r: BufReader::with_capacity(256 * 1024, r),
            w,
            protocol: 0,
        };
        let mut hello = proto::encode_msg(&Msg::Hello {
            protocols: (proto::MIN_PROTOCOL..=proto::PROTOCOL).collect(),
            session: agent_session.clone(),
        });
        if let Some(m) = request {
            hello.extend(proto::encode_msg(m));
        }
        let welcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
            conn.w
                .write_all(&hello)
                .await
                .map_err(|e| refused(e.to_string()))?;
            conn.recv().await.map_err(|e| refused(e.to_string()))
        })
        .await
        .map_err(|_| {
            // A gVisor sandbox quiesced for a checkpoint that never came may still accept on
            // the host and never answer: its agent listens again once it sees the marker.
            let _ = self.let_rebind(session);
            Refused {
                message: "the agent did not answer the handshake".to_owned(),
                // It was written a request it may act on yet.
                maybe_started: request.is_some(),
                untrusted: false,
            }
        })??;
        match welcome {
            Some(Frame::Msg(Msg::Welcome {
                protocol,
                session: theirs,
                version,
            })) => {
                if theirs != agent_session {
                    return Err(refused(format!(
                        "the socket of session '{session}' is served by an agent of session '{theirs}'"
                    )));
                }
                if proto::negotiate(&[protocol]).is_none() {
                    return Err(refused(format!(
                        "the agent ({version}) chose protocol {protocol}, which this sandboxd does not speak"
                    )));
                }
                conn.protocol = protocol;
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
        let first = match self
            .handshake(&spec.session, Some(&spec.container), Some(request))
            .await
        {
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
        // Not the agent: never written to, never waited for; Docker exec carries the run.
        if first.untrusted {
            return Ok(Reached::Fallback(format!(
                "its agent socket is not trusted: {}",
                first.message
            )));
        }
        // The no-op engine (the operator bench's) has no container to look at: the run fails
        // here with its message, before any wait for an agent.
        let inspected = self
            .engine
            .docker()
            .map_err(|e| RunError::Start(e.to_string()))?
            .client()
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
            self.forget_pid(&spec.session);
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
            match self
                .handshake(&spec.session, Some(&spec.container), Some(request))
                .await
            {
                Ok(conn) => return Ok(Reached::Agent(conn)),
                Err(e) if e.maybe_started => return Err(silent(&e)),
                Err(e) if e.untrusted => {
                    return Ok(Reached::Fallback(format!(
                        "its agent socket is not trusted: {}",
                        e.message
                    )));
                }
                Err(e) => last = e,
            }
        }
        // An agent quiesced for a checkpoint that never came (sandboxd was killed between the
        // two) waits for the marker to listen again: this run goes through Docker exec, the
        // next through the agent.
        let _ = self.let_rebind(&spec.session);
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
            cwd: Some(crate::container::WORKSPACE_MOUNT.to_owned()),
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
        let Conn { r, mut w, .. } = conn;
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
                    Ok(Some(Frame::Msg(Msg::Started { .. }))) => {
                        self.metrics.observe_run_start("agent", started);
                    }
                    Ok(Some(Frame::Msg(Msg::Error { code, message }))) if code == "process_limit" => {
                        return Err(RunError::ProcessLimit(message));
                    }
                    Ok(Some(Frame::Msg(Msg::Error { code, message }))) => {
                        return Err(RunError::Start(format!("the agent refused the run: {code}: {message}")));
                    }
                    Ok(Some(Frame::Msg(other))) => {
                        return Err(RunError::Stream(format!("the agent sent {other:?} mid-run")));
                    }
                    Ok(Some(Frame::Stdin(_))) => {
                        return Err(RunError::Stream("the agent sent input mid-run".to_owned()));
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
        let running = match self.engine.docker() {
            Ok(docker) => docker
                .client()
                .inspect_container(&spec.container, None::<InspectContainerOptions>)
                .await
                .ok()
                .and_then(|c| c.state),
            Err(_) => None,
        };
        match running {
            Some(state) if !state.running.unwrap_or(false) => {
                self.forget_pid(&spec.session);
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
            .handshake(session, None, Some(&msg))
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

impl AgentRunner {
    /// Puts the resume marker in the session's run folder: an agent quiesced for a checkpoint
    /// binds its socket again (see `sandbox_agent::pause`); any other ignores it, and the next
    /// quiesce removes it first.
    fn let_rebind(&self, session: &str) -> io::Result<()> {
        std::fs::write(self.run_dir(session).join(RESUME_MARKER), b"")
    }

    /// See [`Runner::quiesce`]: the marker of an earlier resume goes first (a binder that saw
    /// it would bind the socket again before the checkpoint); done when the agent answered
    /// and closed the connection, its last host socket.
    async fn quiesce_agent(&self, session: &str) -> Result<(), String> {
        match std::fs::remove_file(self.run_dir(session).join(RESUME_MARKER)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot remove the resume marker: {e}")),
        }
        let mut conn = self
            .handshake(session, None, Some(&Msg::Quiesce))
            .await
            .map_err(|e| e.message)?;
        tokio::time::timeout(QUIESCE_TIMEOUT, async {
            match conn.recv().await {
                Ok(Some(Frame::Msg(Msg::Quiesced))) => {}
                Ok(Some(Frame::Msg(Msg::Error { code, message }))) => {
                    return Err(format!("the agent cannot quiesce: {code}: {message}"));
                }
                other => return Err(format!("the agent answered a quiesce with {other:?}")),
            }
            match conn.recv().await {
                Ok(None) | Err(_) => Ok(()),
                Ok(Some(other)) => Err(format!("the agent sent {other:?} after quiescing")),
            }
        })
        .await
        .map_err(|_| {
            format!(
                "the agent did not quiesce within {} s",
                QUIESCE_TIMEOUT.as_secs()
            )
        })?
    }
}

impl Runner for AgentRunner {
    fn quiesce<'a>(&'a self, session: &'a str) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(self.quiesce_agent(session))
    }

    fn allow_resume(&self, session: &str) -> io::Result<()> {
        // The socket of the life before the checkpoint stays: gVisor's restore finds again
        // every file the sandbox knew (a missing one fails it); the binder replaces it.
        self.let_rebind(session)
    }

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

    fn taken<'a>(
        &'a self,
        session: &'a str,
        container: &'a str,
    ) -> BoxFuture<'a, Result<bool, String>> {
        Box::pin(async move {
            if self.engine.is_noop() {
                return self.exec.taken(session, container).await;
            }
            Ok(self.learn_pid1(session, Some(container)).await?.is_some())
        })
    }

    fn agent_mount(&self, session: &str) -> io::Result<Option<AgentMount>> {
        let run_dir = self.run_dir(session);
        self.forget_pid(session);
        // Root's alone: only the agent, while still root, binds there (see the module docs).
        // Whatever is there and is not that (a folder an older sandboxd handed the sandbox uid,
        // with what the sandbox left in it) is replaced.
        match std::fs::symlink_metadata(&run_dir) {
            Ok(m) if m.is_dir() && m.uid() == 0 && m.mode() & 0o022 == 0 => {}
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&run_dir)?,
            Ok(_) => std::fs::remove_file(&run_dir)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        if let Some(parent) = run_dir.parent() {
            std::fs::create_dir_all(parent)?;
        }
        match std::fs::create_dir(&run_dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        std::os::unix::fs::chown(&run_dir, Some(0), Some(0))?;
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

    fn terminal_open<'a>(
        &'a self,
        session: &'a str,
        container: &'a str,
        req: sandbox_agent::proto::TermRequest,
    ) -> BoxFuture<'a, Result<sandbox_agent::proto::TermInfo, TermError>> {
        Box::pin(self.term_open(session, container, req))
    }

    fn terminal_list<'a>(
        &'a self,
        session: &'a str,
    ) -> BoxFuture<'a, Result<Vec<sandbox_agent::proto::TermInfo>, TermError>> {
        Box::pin(self.term_list(session))
    }

    fn terminal_kill<'a>(
        &'a self,
        session: &'a str,
        term_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, TermError>> {
        Box::pin(self.term_kill(session, term_id))
    }

    fn terminal_attach<'a>(
        &'a self,
        session: &'a str,
        term_id: &'a str,
    ) -> BoxFuture<'a, Result<TermAttach, TermError>> {
        Box::pin(self.term_attach(session, term_id))
    }

    fn port_connect<'a>(
        &'a self,
        session: &'a str,
        port: u16,
    ) -> BoxFuture<'a, Result<crate::run::ports::PortStream, crate::run::ports::PortError>> {
        Box::pin(AgentRunner::port_connect(self, session, port))
    }

    fn watch<'a>(
        &'a self,
        session: &'a str,
        path: &'a str,
        recursive: bool,
        max_watches: u32,
    ) -> BoxFuture<'a, Result<crate::run::watch::Watch, TermError>> {
        Box::pin(AgentRunner::watch(
            self,
            session,
            path,
            recursive,
            max_watches,
        ))
    }

    fn container_stopped<'a>(&'a self, session: &'a str, container: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Ok(docker) = self.engine.docker().map(DockerEngine::client) else {
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
                && !state.running.unwrap_or(false)
            {
                self.forget_pid(session);
                if has_agent {
                    self.report_death(session, &state);
                }
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
}

/// The first word of a process's command line (`/proc/<pid>/cmdline`), if it can be read.
fn command_of(pid: i32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let first = raw.split(|b| *b == 0).next()?;
    Some(String::from_utf8_lossy(first).into_owned())
}

/// The parent of a process (`/proc/<pid>/stat`'s fourth field, after the command in brackets).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(1)?.parse().ok()
}

/// When `pid1` is a gVisor sandbox (`runsc-sandbox`), its gofer: the `runsc-gofer` process
/// beside it under the same containerd shim (one shim per container). `None` otherwise.
fn gvisor_gofer(pid1: i32) -> Option<i32> {
    if command_of(pid1)? != "runsc-sandbox" {
        return None;
    }
    let shim = parent_of(pid1)?;
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|p| parent_of(*p) == Some(shim) && command_of(*p).as_deref() == Some("runsc-gofer"))
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
