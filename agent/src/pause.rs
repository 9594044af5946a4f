//! Pause with memory (gVisor): what lets sandboxd checkpoint a sandbox with its processes and
//! restore it later.
//!
//! gVisor cannot save a socket bound on the host (the agent's: the gofer makes it in the
//! bind-mounted run folder) nor a connection to it. So before a checkpoint sandboxd sends
//! [`Msg::Quiesce`](crate::proto::Msg::Quiesce): the agent shuts every connection, closes its
//! listener and answers [`Msg::Quiesced`](crate::proto::Msg::Quiesced); its runs go on. After the
//! restore it needs its socket again, in a folder only root may write to, while it runs as the
//! sandbox uid for good. The [`Binder`] does that: the agent's binary again, started before the
//! agent drops to the sandbox uid, keeping uid 0 with no capability, which binds the socket and hands the listener
//! to the agent (`SCM_RIGHTS`) once sandboxd has put [`RESUME_MARKER`] in the run folder, which
//! it does only for the restore: a socket bound before the checkpoint would fail it. The binder
//! never execs, takes nothing from the agent but one byte a request, and no process of the
//! sandbox can signal, trace or reach it (another uid, not dumpable).
//!
//! Only an agent started with [`RESUMABLE_ENV`] set to `1` (sandboxd sets it for gvisor
//! runtimes) and as root forks a binder; any other answers a quiesce with `not_resumable`.

use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg,
};

/// The file sandboxd puts in the run folder when a restored sandbox may bind its socket again.
pub const RESUME_MARKER: &str = "resume";
/// The variable that makes the agent resumable (`1`).
pub const RESUMABLE_ENV: &str = "SANDBOX_AGENT_RESUMABLE";
/// The argument that makes the agent's binary the binder (`--binder SOCKET`).
pub const BINDER_ARG: &str = "--binder";
/// How long a quiesce waits for the connections to close and the listener to go.
const QUIESCE_WAIT: Duration = Duration::from_secs(3);
/// How often (milliseconds) the binder looks for the marker while it waits.
const MARKER_POLL: u16 = 5;

/// The agent's end of the binder.
pub struct Binder {
    sock: UnixStream,
}

impl Binder {
    /// Starts the binder for the socket at `socket`: the agent's own binary again, as root,
    /// its standard input one end of a socket pair. Called before the agent drops to the
    /// sandbox uid.
    pub fn spawn(socket: &Path) -> io::Result<Self> {
        let (ours, theirs) = UnixStream::pair()?;
        Command::new(std::env::current_exe()?)
            .arg(BINDER_ARG)
            .arg(socket)
            .env_clear()
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .spawn()?;
        Ok(Self { sock: ours })
    }

    /// Asks for the socket again: returns once sandboxd has put the marker in the run folder
    /// (after a restore) with a freshly bound listener.
    pub fn listener(&self) -> io::Result<UnixListener> {
        (&self.sock).write_all(&[1])?;
        let mut byte = [0u8; 1];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = recvmsg(
            &self.sock,
            &mut [IoSliceMut::new(&mut byte)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        let mut fd = None;
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = message {
                for owned in fds {
                    fd.get_or_insert(owned);
                }
            }
        }
        match (got.bytes, fd) {
            (0, _) => Err(io::Error::other("the binder is gone")),
            (_, Some(fd)) => Ok(UnixListener::from(fd)),
            (_, None) => Err(io::Error::other("the binder could not bind the socket")),
        }
    }

    /// Ends the binder (it sees the connection close).
    pub fn close(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// The binder's life (`sandbox-agent --binder SOCKET`, standard input its end of the pair):
/// uid 0 without a capability, binding `socket` for the agent after each restore.
pub fn binder_main(socket: &Path) -> io::Result<()> {
    use rustix::thread::{CapabilitySet, CapabilitySets, set_capabilities};
    let agent = UnixStream::from(io::stdin().as_fd().try_clone_to_owned()?);
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    set_capabilities(
        None,
        CapabilitySets {
            effective: CapabilitySet::empty(),
            permitted: CapabilitySet::empty(),
            inheritable: CapabilitySet::empty(),
        },
    )?;
    let _ = rustix::thread::set_no_new_privs(true);
    let _ = nix::sys::prctl::set_dumpable(false);
    let marker = socket
        .parent()
        .map_or_else(|| PathBuf::from(RESUME_MARKER), |d| d.join(RESUME_MARKER));
    let mut byte = [0u8; 1];
    loop {
        if (&agent).read(&mut byte)? == 0 {
            return Ok(());
        }
        // Until the marker is there, or the agent is gone.
        while !marker.exists() {
            let mut fds = [PollFd::new(agent.as_fd(), PollFlags::POLLIN)];
            if poll(&mut fds, PollTimeout::from(MARKER_POLL)).map_err(io::Error::from)? > 0 {
                return Ok(());
            }
        }
        let _ = std::fs::remove_file(&marker);
        let bound = crate::server::bind(socket);
        let fds = match &bound {
            Ok(listener) => vec![listener.as_fd()],
            Err(_) => vec![],
        };
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() {
            control.push(SendAncillaryMessage::ScmRights(&fds));
        }
        sendmsg(
            &agent,
            &[IoSlice::new(&[u8::from(!fds.is_empty())])],
            &mut control,
            SendFlags::empty(),
        )?;
    }
}

/// What a quiesce and the accept loop share: whether the agent is quiescing, whether its
/// listener is open, and the connections it serves (a clone of each, to shut them).
pub struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
    /// Written by a quiesce to wake the accept loop out of its poll.
    wake: (OwnedFd, OwnedFd),
    binder: Option<Binder>,
}

#[derive(Default)]
struct GateState {
    quiescing: bool,
    listening: bool,
    conns: HashMap<u64, UnixStream>,
    next: u64,
}

/// A connection the gate tracks: it is forgotten when the last clone of this is dropped.
pub struct Tracked {
    gate: Arc<Gate>,
    id: u64,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.gate.lock().conns.remove(&self.id);
        self.gate.changed.notify_all();
    }
}

impl Gate {
    /// A gate; `binder` when the agent is resumable.
    pub fn new(binder: Option<Binder>) -> io::Result<Arc<Self>> {
        let wake = nix::unistd::pipe().map_err(io::Error::from)?;
        Ok(Arc::new(Self {
            state: Mutex::new(GateState {
                listening: true,
                ..GateState::default()
            }),
            changed: Condvar::new(),
            wake,
            binder,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The descriptor the accept loop polls beside its listener.
    pub fn waker(&self) -> std::os::fd::BorrowedFd<'_> {
        self.wake.0.as_fd()
    }

    /// Takes what woke the accept loop.
    pub fn drain_waker(&self) {
        let mut buf = [0u8; 64];
        let mut fds = [PollFd::new(self.wake.0.as_fd(), PollFlags::POLLIN)];
        while poll(&mut fds, PollTimeout::ZERO).unwrap_or(0) > 0 {
            if nix::unistd::read(&self.wake.0, &mut buf).unwrap_or(0) == 0 {
                return;
            }
        }
    }

    /// Whether a quiesce asked the accept loop to close its listener.
    pub fn quiescing(&self) -> bool {
        self.lock().quiescing
    }

    /// Tracks a connection (a clone of it is kept to shut it on a quiesce).
    pub fn track(self: &Arc<Self>, conn: &UnixStream) -> Arc<Tracked> {
        let mut s = self.lock();
        let id = s.next;
        s.next += 1;
        if let Ok(clone) = conn.try_clone() {
            s.conns.insert(id, clone);
        }
        Arc::new(Tracked {
            gate: self.clone(),
            id,
        })
    }

    /// The accept loop closed its listener and waits for the binder: a listener bound after
    /// the restore, or why there is none.
    pub fn closed_and_wait(&self) -> io::Result<UnixListener> {
        self.lock().listening = false;
        self.changed.notify_all();
        let Some(binder) = &self.binder else {
            return Err(io::Error::other("not resumable"));
        };
        let listener = binder.listener()?;
        let mut s = self.lock();
        s.quiescing = false;
        s.listening = true;
        Ok(listener)
    }

    /// Quiesces for a checkpoint, on behalf of the connection `own`: every other connection
    /// shut and gone and the listener closed, within [`QUIESCE_WAIT`]. Err: why not, in words.
    pub fn quiesce(&self, own: &Tracked) -> Result<(), (String, String)> {
        if self.binder.is_none() {
            return Err((
                "not_resumable".into(),
                "this agent was not started resumable (SANDBOX_AGENT_RESUMABLE=1, as root): its sandbox cannot be checkpointed".into(),
            ));
        }
        let mut s = self.lock();
        s.quiescing = true;
        for (id, conn) in &s.conns {
            if *id != own.id {
                let _ = conn.shutdown(std::net::Shutdown::Both);
            }
        }
        drop(s);
        let _ = nix::unistd::write(&self.wake.1, &[1]);
        let deadline = Instant::now() + QUIESCE_WAIT;
        let mut s = self.lock();
        while s.listening || s.conns.keys().any(|id| *id != own.id) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let open = s.conns.len().saturating_sub(1);
                return Err((
                    "busy".into(),
                    format!(
                        "{open} connection(s) still open after {} s{}",
                        QUIESCE_WAIT.as_secs(),
                        if s.listening {
                            ", and the listener is still open"
                        } else {
                            ""
                        }
                    ),
                ));
            }
            s = self
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        Ok(())
    }

    /// Ends the binder, when there is one (the agent is leaving).
    pub fn close(&self) {
        if let Some(b) = &self.binder {
            b.close();
        }
    }
}
