//! The protocol between sandboxd and the agent, over the Unix socket in the session's run
//! folder. One connection carries one request.
//!
//! A frame is a 4-byte big-endian length (of what follows), one kind byte and the payload:
//! kind 0 is a JSON [`Msg`], kind 1 bytes of a run's stdout, kind 2 bytes of its stderr. A frame
//! longer than [`MAX_FRAME`] is a protocol error; neither side trusts the other's lengths.
//!
//! A conversation: sandboxd sends [`Msg::Hello`] naming the protocols it speaks and the session it
//! expects; the agent answers [`Msg::Welcome`] with the protocol they share and its own session
//! (sandboxd refuses an agent of another session), or [`Msg::Error`]. Then one request:
//!
//! - [`Msg::Run`]: the agent answers [`Msg::Started`], then output frames as they come, then
//!   [`Msg::Exit`]. While it runs, sandboxd may send [`Msg::Stop`] on the same connection. A
//!   connection that breaks does not end the run: it goes on, and its output (up to the cap) and
//!   exit are kept for [`Msg::Attach`] and [`Msg::Status`].
//! - [`Msg::Attach`]: like a run's stream from the start, for a run already started.
//! - [`Msg::Stop`] with a run id: stops that run, answers [`Msg::Stopped`].
//! - [`Msg::Status`]: answers [`Msg::RunState`].
//! - [`Msg::Stats`]: answers [`Msg::StatsReply`] (sandboxd takes its idle figures from Docker
//!   and its own run table, never from this).
//! - [`Msg::Quiesce`]: before a checkpoint (gVisor): the agent shuts its other connections and
//!   closes its listener, answers [`Msg::Quiesced`] and closes this connection too; it binds its
//!   socket again after the restore (see [`crate::pause`]). Runs go on.
//!
//! Terminals (protocol 2, [`TERMINALS_PROTOCOL`]): a program on a pseudo-terminal that outlives
//! the connection that opened it or watches it.
//!
//! - [`Msg::TermOpen`]: starts one; answers [`Msg::TermOpened`] (or [`Msg::Error`]: codes
//!   `terminal_limit`, `terminal_exists`, `spawn_failed`, `bad_request`) and closes.
//! - [`Msg::TermAttach`]: answers [`Msg::TermAttached`], then the terminal's kept output (its
//!   scrollback) and its live output as stdout frames, then [`Msg::TermExit`] once its program
//!   ended, and closes. On this connection sandboxd sends input as stdin frames and
//!   [`Msg::TermResize`]; closing it detaches (the terminal runs on). `no_such_terminal` for an
//!   unknown id.
//! - [`Msg::TermList`]: answers [`Msg::TermListReply`].
//! - [`Msg::TermKill`]: ends a terminal's program and everything of its session; answers
//!   [`Msg::TermKilled`].
//!
//! File watch (protocol 2 too): [`Msg::Watch`] watches a folder of the sandbox (and, with
//! `recursive`, every folder below it, those made later included) with inotify; the agent
//! answers [`Msg::Watching`], then sends [`Msg::FsEvents`] as changes come (gathered for a few
//! milliseconds, a file written many times in that time reported once), until the connection
//! closes. More folders than `max_watches` are not watched: one [`FsEvent`] of kind `limit`
//! says so, once; `overflow` says changes were lost (the agent then watches the tree anew).
//! Refused with `bad_request` (not an absolute path to a folder, `max_watches` 0, the kernel's
//! own limit); sandboxd keeps watches inside the workspace.
//!
//! Ports (protocol 2 too): [`Msg::PortConnect`] connects to a port on the sandbox's own
//! loopback, inside its network namespace (so it works with no network at all); after
//! [`Msg::PortConnected`] the connection carries the TCP stream's bytes both ways, unframed,
//! until either side closes (each side's end is passed on as a half-close). Refused with
//! `port_closed` (nothing answers there) or `bad_request`.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

/// The newest protocol this build speaks.
pub const PROTOCOL: u32 = 2;
/// The first protocol with terminals ([`Msg::TermOpen`] and the rest).
pub const TERMINALS_PROTOCOL: u32 = 2;
/// The oldest protocol this build still speaks.
pub const MIN_PROTOCOL: u32 = 1;
/// The largest frame either side accepts.
pub const MAX_FRAME: usize = 4 << 20;
/// Name of the socket in the session's run folder.
pub const SOCKET_NAME: &str = "agent.sock";
/// Where the session's run folder (holding the socket) is mounted in the sandbox.
pub const RUN_DIR: &str = "/run/sandboxd";
/// Where the folder holding the agent binary is mounted (read-only) in the sandbox.
pub const BIN_DIR: &str = "/opt/sandboxd";
/// File name of the agent binary in [`BIN_DIR`].
pub const BINARY_NAME: &str = "sandbox-agent";
/// Environment variable naming the agent's session (not passed on to runs).
pub const SESSION_ENV: &str = "SANDBOX_AGENT_SESSION";
/// Prefix of the agent's own environment variables; none reaches a run.
pub const ENV_PREFIX: &str = "SANDBOX_AGENT_";
/// The agent's version (the workspace's).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

const KIND_MSG: u8 = 0;
const KIND_STDOUT: u8 = 1;
const KIND_STDERR: u8 = 2;
const KIND_STDIN: u8 = 3;

/// What a run executes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRequest {
    /// The run id (unique among the agent's runs in flight).
    pub run_id: String,
    /// The program and its arguments (`["/bin/sh", "-c", command]` for a shell command).
    pub argv: Vec<String>,
    /// Extra environment, on top of the container's.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Working directory; the container's (`/workspace`) when absent.
    #[serde(default)]
    pub cwd: Option<String>,
    /// The run's process group is killed after this many milliseconds.
    pub timeout_ms: u64,
    /// Bytes kept per stream; the rest is drained and dropped, and the run marked truncated.
    pub max_output_bytes: u64,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunExit {
    /// Exit status: the program's; 128 + n after signal n; 124 after the timeout; 137 after a stop.
    pub exit_code: i64,
    /// The signal that ended the program, if one did.
    #[serde(default)]
    pub signal: Option<i32>,
    /// The timeout killed it.
    pub timed_out: bool,
    /// A stop killed it.
    pub stopped: bool,
    /// Output was cut at the cap.
    pub truncated: bool,
    /// CPU time (user + system) of the program and the children it waited for, nanoseconds.
    pub cpu_ns: u64,
    /// Wall time, milliseconds.
    pub duration_ms: u64,
}

/// The state of a run the agent knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunState {
    /// The run id.
    pub run_id: String,
    /// Whether it still runs.
    pub running: bool,
    /// How it ended, once it did.
    #[serde(default)]
    pub exit: Option<RunExit>,
    /// Its stdout so far (capped, lossy UTF-8).
    #[serde(default)]
    pub stdout: String,
    /// Its stderr so far (capped, lossy UTF-8).
    #[serde(default)]
    pub stderr: String,
}

/// What a terminal runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TermRequest {
    /// The terminal id (unique among the agent's terminals).
    pub term_id: String,
    /// The program and its arguments; empty: a login shell (`bash -l`, else `sh -l`).
    #[serde(default)]
    pub argv: Vec<String>,
    /// Extra environment, on top of the container's (`TERM` is `xterm-256color` unless given).
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Working directory; the container's (`/workspace`) when absent.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Its size in rows.
    pub rows: u16,
    /// Its size in columns.
    pub cols: u16,
    /// Refused (`terminal_limit`) when this many of the agent's terminals are running.
    pub max_terminals: u32,
    /// Closed after this long with no input, no output and nobody attached; 0: never.
    #[serde(default)]
    pub idle_timeout_ms: u64,
    /// The most output kept for a re-attach (the newest bytes).
    pub scrollback_bytes: u64,
}

/// How a terminal's program ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TermExit {
    /// Exit status: the program's; 128 + n after signal n.
    pub exit_code: i64,
    /// The signal that ended the program, if one did.
    #[serde(default)]
    pub signal: Option<i32>,
    /// Why it ended: `exited` (by itself), `killed` ([`Msg::TermKill`]) or `idle` (its idle
    /// time ran out).
    pub reason: String,
}

/// A terminal as the agent knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TermInfo {
    /// The terminal id.
    pub term_id: String,
    /// Its program's pid (and session id) in the sandbox.
    pub pid: i32,
    /// What it runs.
    pub argv: Vec<String>,
    /// Its size in rows.
    pub rows: u16,
    /// Its size in columns.
    pub cols: u16,
    /// Whether its program still runs.
    pub running: bool,
    /// How it ended, once it did.
    #[serde(default)]
    pub exit: Option<TermExit>,
    /// Connections attached to it now.
    pub attached: u32,
    /// Bytes written to it.
    pub input_bytes: u64,
    /// Bytes it printed.
    pub output_bytes: u64,
    /// Milliseconds since its last input or output.
    pub idle_ms: u64,
    /// Milliseconds since it started.
    pub age_ms: u64,
}

/// One change a watch saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsEvent {
    /// `created`, `modified`, `deleted`, `renamed`; `limit` when a folder was left unwatched
    /// (the bound was reached); `overflow` when the kernel dropped events (its queue was full).
    pub kind: String,
    /// The path, relative to the watched folder's root given in [`Msg::Watch`] (`a/b.txt`,
    /// `` for the root itself: its `deleted` is the last event, then the watch ends); for
    /// `renamed`, where it was.
    pub path: String,
    /// For `renamed`: where it went (a move out of the watched tree is `deleted`, one into it
    /// `created`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Whether it is a folder.
    #[serde(default)]
    pub dir: bool,
}

/// A JSON message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Msg {
    /// sandboxd: the protocols it speaks and the session it expects.
    Hello {
        /// Protocol versions.
        protocols: Vec<u32>,
        /// The session id.
        session: String,
    },
    /// Agent: the protocol both speak, its version and its session.
    Welcome {
        /// The chosen protocol.
        protocol: u32,
        /// The agent's version.
        version: String,
        /// The agent's session.
        session: String,
    },
    /// sandboxd: start a run.
    Run(RunRequest),
    /// sandboxd: stream a run already started, from its first byte.
    Attach {
        /// The run id.
        run_id: String,
    },
    /// sandboxd: stop a run (on a run's own connection, `run_id` may be absent).
    Stop {
        /// The run id.
        #[serde(default)]
        run_id: Option<String>,
    },
    /// sandboxd: the state of a run.
    Status {
        /// The run id.
        run_id: String,
    },
    /// sandboxd: CPU time of the sandbox and the runs in flight.
    Stats,
    /// sandboxd: let go of every host socket for a checkpoint.
    Quiesce,
    /// Agent: answer to [`Msg::Quiesce`]: no host socket is left once this connection closes.
    Quiesced,
    /// Agent: the run started.
    Started {
        /// The run id.
        run_id: String,
        /// Its pid (and process group) in the sandbox.
        pid: i32,
    },
    /// Agent: the run ended.
    Exit(RunExit),
    /// Agent: answer to [`Msg::Stop`] with a run id.
    Stopped {
        /// Whether such a run was in flight.
        found: bool,
    },
    /// Agent: answer to [`Msg::Status`]; `None` when no such run is known.
    RunState {
        /// The state.
        state: Option<RunState>,
    },
    /// Agent: answer to [`Msg::Stats`].
    StatsReply {
        /// CPU time every process of the sandbox has used, nanoseconds (its cgroup, else the
        /// agent and everything it reaped).
        cpu_ns: u64,
        /// Ids of the runs in flight.
        running: Vec<String>,
    },
    /// sandboxd: start a terminal.
    TermOpen(TermRequest),
    /// Agent: the terminal started.
    TermOpened {
        /// The terminal (boxed: a message is as large as its largest kind).
        term: Box<TermInfo>,
    },
    /// sandboxd: stream a terminal's kept and live output, and send it input.
    TermAttach {
        /// The terminal id.
        term_id: String,
    },
    /// Agent: answer to [`Msg::TermAttach`]; `scrollback` bytes of kept output follow first.
    TermAttached {
        /// The terminal (boxed, as in [`Msg::TermOpened`]).
        term: Box<TermInfo>,
        /// Bytes of kept output sent before the live stream.
        scrollback: u64,
    },
    /// sandboxd, on an attach connection: the terminal's new size.
    TermResize {
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
    /// Agent, on an attach connection: the terminal's program ended (the last frame).
    TermExit(TermExit),
    /// sandboxd: end a terminal.
    TermKill {
        /// The terminal id.
        term_id: String,
    },
    /// Agent: answer to [`Msg::TermKill`].
    TermKilled {
        /// Whether such a terminal was running.
        found: bool,
    },
    /// sandboxd: the agent's terminals.
    TermList,
    /// Agent: answer to [`Msg::TermList`], running and recently ended ones.
    TermListReply {
        /// The terminals.
        terms: Vec<TermInfo>,
    },
    /// sandboxd: watch a folder (see the module docs).
    Watch {
        /// The folder, absolute, in the sandbox (sandboxd names one under `/workspace`).
        path: String,
        /// Every folder below it too.
        recursive: bool,
        /// The most folders watched at once.
        max_watches: u32,
    },
    /// Agent: the watch is in place; `watched` folders are watched.
    Watching {
        /// Folders watched.
        watched: u32,
    },
    /// Agent: changes a watch saw, oldest first.
    FsEvents {
        /// The changes.
        events: Vec<FsEvent>,
    },
    /// sandboxd: connect to `127.0.0.1:port` (else `[::1]:port`) in the sandbox.
    PortConnect {
        /// The port.
        port: u16,
    },
    /// Agent: connected; the port's bytes follow, unframed.
    PortConnected,
    /// Agent: the request failed.
    Error {
        /// A stable code (`wrong_session`, `no_protocol`, `run_exists`, `spawn_failed`,
        /// `process_limit`: the sandbox is at its process limit and its running runs hold every
        /// process, `bad_request`; for a quiesce `not_resumable`, `busy`).
        code: String,
        /// In words.
        message: String,
    },
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A JSON message.
    Msg(Msg),
    /// Bytes on a run's stdout.
    Stdout(Vec<u8>),
    /// Bytes on a run's stderr.
    Stderr(Vec<u8>),
    /// Input for a terminal (sandboxd to the agent, on an attach connection).
    Stdin(Vec<u8>),
}

/// A frame that could not be read.
#[derive(Debug)]
pub enum FrameError {
    /// The connection failed or closed mid-frame.
    Io(io::Error),
    /// The peer sent something that is not a frame.
    Protocol(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(e) => write!(f, "{e}"),
            Self::Protocol(m) => write!(f, "protocol error: {m}"),
        }
    }
}

impl std::error::Error for FrameError {}

impl From<io::Error> for FrameError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// Encodes a message frame.
pub fn encode_msg(msg: &Msg) -> Vec<u8> {
    // Serializing these plain types cannot fail.
    let body = serde_json::to_vec(msg).unwrap_or_default();
    encode(KIND_MSG, &body)
}

/// Encodes an output frame (`stderr` false: stdout).
pub fn encode_output(stderr: bool, bytes: &[u8]) -> Vec<u8> {
    encode(if stderr { KIND_STDERR } else { KIND_STDOUT }, bytes)
}

/// Encodes a terminal's input frame.
pub fn encode_input(bytes: &[u8]) -> Vec<u8> {
    encode(KIND_STDIN, bytes)
}

/// Encodes a frame.
pub fn encode_frame(frame: &Frame) -> Vec<u8> {
    match frame {
        Frame::Msg(m) => encode_msg(m),
        Frame::Stdout(b) => encode_output(false, b),
        Frame::Stderr(b) => encode_output(true, b),
        Frame::Stdin(b) => encode_input(b),
    }
}

fn encode(kind: u8, body: &[u8]) -> Vec<u8> {
    let len = u32::try_from(body.len() + 1).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(body.len() + 5);
    out.extend_from_slice(&len.to_be_bytes());
    out.push(kind);
    out.extend_from_slice(body);
    out
}

/// The length of a frame's kind and payload, from its 4-byte header; refuses what is too long
/// or empty.
pub fn frame_len(header: [u8; 4]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    if len == 0 || len > MAX_FRAME + 1 {
        return Err(FrameError::Protocol(format!(
            "frame of {len} bytes (at most {} allowed)",
            MAX_FRAME + 1
        )));
    }
    Ok(len)
}

/// Decodes a frame's kind byte and payload (what follows the header).
pub fn decode(body: Vec<u8>) -> Result<Frame, FrameError> {
    let Some((&kind, payload)) = body.split_first() else {
        return Err(FrameError::Protocol("empty frame".into()));
    };
    match kind {
        KIND_MSG => serde_json::from_slice(payload)
            .map(Frame::Msg)
            .map_err(|e| FrameError::Protocol(format!("bad message: {e}"))),
        KIND_STDOUT => Ok(Frame::Stdout(payload.to_vec())),
        KIND_STDERR => Ok(Frame::Stderr(payload.to_vec())),
        KIND_STDIN => Ok(Frame::Stdin(payload.to_vec())),
        k => Err(FrameError::Protocol(format!("unknown frame kind {k}"))),
    }
}

/// Reads one frame; `Ok(None)` at a clean end of the stream.
pub fn read_frame(r: &mut impl Read) -> Result<Option<Frame>, FrameError> {
    let mut header = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = frame_len(header)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    decode(body).map(Some)
}

/// Writes one message frame.
pub fn write_msg(w: &mut impl Write, msg: &Msg) -> io::Result<()> {
    w.write_all(&encode_msg(msg))
}

/// The protocol two sides share: the newest both speak.
pub fn negotiate(theirs: &[u32]) -> Option<u32> {
    theirs
        .iter()
        .copied()
        .filter(|p| (MIN_PROTOCOL..=PROTOCOL).contains(p))
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let frames = [
            Frame::Msg(Msg::Hello {
                protocols: vec![1],
                session: "s".into(),
            }),
            Frame::Stdout(b"out\0bytes".to_vec()),
            Frame::Stderr(vec![]),
            Frame::Msg(Msg::Exit(RunExit {
                exit_code: 3,
                signal: None,
                timed_out: false,
                stopped: false,
                truncated: true,
                cpu_ns: 7,
                duration_ms: 1,
            })),
        ];
        let mut wire = Vec::new();
        for f in &frames {
            wire.extend(encode_frame(f));
        }
        let mut r = &wire[..];
        for f in &frames {
            assert_eq!(read_frame(&mut r).expect("a frame").as_ref(), Some(f));
        }
        assert!(read_frame(&mut r).expect("clean end").is_none());
    }

    #[test]
    fn hostile_frames_are_refused() {
        assert!(frame_len(u32::MAX.to_be_bytes()).is_err());
        assert!(frame_len(0u32.to_be_bytes()).is_err());
        assert!(decode(vec![9, 1, 2]).is_err());
        assert!(decode(vec![0, b'{']).is_err());
        // A header promising more than arrives is an error, not a hang or a panic.
        let mut r = &[0u8, 0, 0, 10, 0, b'{'][..];
        assert!(read_frame(&mut r).is_err());
    }

    #[test]
    fn negotiation_picks_the_newest_shared_protocol() {
        assert_eq!(negotiate(&[1]), Some(1));
        assert_eq!(negotiate(&[1, 2, 99]), Some(2));
        assert_eq!(negotiate(&[0, 99]), None);
        assert_eq!(negotiate(&[]), None);
    }
}

/// Properties of the frame codec on arbitrary input: decoding never panics, and decoding what
/// was encoded gives it back.
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;

    fn msg() -> impl Strategy<Value = Msg> {
        prop_oneof![
            (prop::collection::vec(any::<u32>(), 0..4), any::<String>())
                .prop_map(|(protocols, session)| Msg::Hello { protocols, session }),
            (any::<String>(), any::<String>())
                .prop_map(|(code, message)| Msg::Error { code, message }),
            (
                any::<String>(),
                prop::collection::vec(any::<String>(), 0..4),
                prop::collection::vec((any::<String>(), any::<String>()), 0..3),
                prop::option::of(any::<String>()),
                any::<u64>(),
                any::<u64>(),
            )
                .prop_map(|(run_id, argv, env, cwd, timeout_ms, max_output_bytes)| {
                    Msg::Run(RunRequest {
                        run_id,
                        argv,
                        env,
                        cwd,
                        timeout_ms,
                        max_output_bytes,
                    })
                }),
            (
                any::<i64>(),
                prop::option::of(any::<i32>()),
                any::<[bool; 3]>(),
                any::<u64>(),
                any::<u64>()
            )
                .prop_map(
                    |(exit_code, signal, [timed_out, stopped, truncated], cpu_ns, duration_ms)| {
                        Msg::Exit(RunExit {
                            exit_code,
                            signal,
                            timed_out,
                            stopped,
                            truncated,
                            cpu_ns,
                            duration_ms,
                        })
                    }
                ),
            prop::option::of(any::<String>()).prop_map(|run_id| Msg::Stop { run_id }),
        ]
    }

    fn frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            msg().prop_map(Frame::Msg),
            prop::collection::vec(any::<u8>(), 0..2048).prop_map(Frame::Stdout),
            prop::collection::vec(any::<u8>(), 0..2048).prop_map(Frame::Stderr),
            prop::collection::vec(any::<u8>(), 0..2048).prop_map(Frame::Stdin),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn decoding_any_bytes_never_panics(body in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(body.clone());
            let _ = read_frame(&mut body.as_slice());
            let mut header = [0u8; 4];
            for (h, b) in header.iter_mut().zip(&body) {
                *h = *b;
            }
            if let Ok(len) = frame_len(header) {
                prop_assert!((1..=MAX_FRAME + 1).contains(&len));
            }
        }

        #[test]
        fn a_stream_of_frames_reads_back_as_written(frames in prop::collection::vec(frame(), 0..6)) {
            let mut wire = Vec::new();
            for f in &frames {
                wire.extend(encode_frame(f));
            }
            let mut r = wire.as_slice();
            let mut read = Vec::new();
            while let Some(f) = read_frame(&mut r).map_err(|e| TestCaseError::fail(e.to_string()))? {
                read.push(f);
            }
            prop_assert_eq!(read, frames);
        }

        #[test]
        fn a_cut_frame_is_an_error_never_a_frame(f in frame(), cut in any::<prop::sample::Index>()) {
            let wire = encode_frame(&f);
            let at = cut.index(wire.len());
            prop_assume!(at > 0);
            let mut r = &wire[..at];
            prop_assert!(read_frame(&mut r).is_err());
        }
    }
}
