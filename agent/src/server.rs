//! The agent itself: PID 1 of a sandbox. It reaps every zombie, forwards signals, and serves
//! runs on its Unix socket. Plain threads: a run is a process group, one thread reading its two
//! pipes (without blocking, so the supervisor may read them too), one supervising its timeout
//! and exit; a connection is one thread writing and one reading. Terminals are in
//! [`crate::terminal`]; this serves their requests and reaps their programs. Ports and file
//! watches are served on their connection's thread by `ports` and `watch`.
//!
//! Over 600 lines: the agent's side of its one protocol (hello, run, output, stop, status), which reads best in one place.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::signal::{SigSet, Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::pause::{Binder, Gate, Tracked};
use crate::proto::{self, Frame, Msg, RunExit, RunRequest, RunState};
use crate::terminal::{self, Terminals};

/// How long output may keep coming after a run's program exited (background jobs that hold
/// its stdout); the run is reported then, and its group keeps running. What the program itself
/// wrote is read before the run is reported, whether its reader got time or not: see
/// [`Pipes::drain`].
pub(crate) const EXIT_GRACE: Duration = Duration::from_millis(100);
/// Reads of one pipe in one drain: 16 chunks are 1 MiB, the most a pipe can hold
/// (`/proc/sys/fs/pipe-max-size`, whose default no sandbox can raise), so a drain reads all a
/// pipe held when it began, and a job that writes on for ever never keeps it going.
const DRAIN_READS: usize = 16;
/// How long a connection served without a thread of its own may take to send a frame.
const CROWDED_READ: Duration = Duration::from_secs(2);
/// How long a stop or timeout waits for the killed group to be gone.
pub(crate) const KILL_WAIT: Duration = Duration::from_secs(3);
/// Finished runs kept for [`Msg::Status`] and [`Msg::Attach`].
const KEEP_FINISHED: usize = 64;
/// The largest output frame.
pub(crate) const CHUNK: usize = 64 * 1024;

/// How the agent is started.
#[derive(Debug, Clone)]
pub struct Options {
    /// The socket to serve on.
    pub socket: PathBuf,
    /// The session this agent belongs to.
    pub session: String,
    /// The uid and gid every run executes as: an agent started as root binds its socket
    /// first, then drops to them for good (see [`drop_privileges`]).
    pub user: Option<(u32, u32)>,
    /// Whether the sandbox may be checkpointed and restored ([`crate::pause`]): an agent
    /// started as root keeps a binder to bind its socket again after a restore.
    pub resumable: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Timeout,
    Stopped,
}

struct Out {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    truncated: bool,
    eof: bool,
    /// The program's wait status and CPU time, once reaped.
    leader: Option<(WaitStatus, u64, Instant)>,
    ended_by: Option<Ended>,
    group_killed: bool,
    exit: Option<RunExit>,
}

/// A run's two pipes, read without blocking by its pump and, when its program has exited, by
/// its supervisor. A read and the push of what it read happen under `reading`, so the two
/// readers never reorder a stream.
struct Pipes {
    out: File,
    err: File,
    reading: Mutex<()>,
}

/// What one read of a pipe gave.
enum Got {
    Bytes,
    Empty,
    Closed,
}

impl Pipes {
    fn new(out: OwnedFd, err: OwnedFd) -> Self {
        use nix::fcntl::{FcntlArg, OFlag, fcntl};
        for fd in [out.as_fd(), err.as_fd()] {
            let flags =
                fcntl(fd, FcntlArg::F_GETFL).map_or(OFlag::empty(), OFlag::from_bits_retain);
            let _ = fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK));
        }
        Self {
            out: File::from(out),
            err: File::from(err),
            reading: Mutex::new(()),
        }
    }

    /// Reads what is in one pipe now (at most [`DRAIN_READS`] chunks) into the run.
    fn read(&self, run: &Run, stderr: bool, buf: &mut [u8]) -> Got {
        let _reading = self
            .reading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut pipe = if stderr { &self.err } else { &self.out };
        let mut got = Got::Empty;
        for _ in 0..DRAIN_READS {
            match pipe.read(buf) {
                Ok(0) => return Got::Closed,
                Ok(n) => {
                    run.push(stderr, &buf[..n]);
                    got = Got::Bytes;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return got,
                Err(_) => return Got::Closed,
            }
        }
        got
    }

    /// Reads what both pipes hold now. Called once the program has exited: what it wrote is
    /// in the pipes before it is reaped, so after this the run has it all, even when the pump
    /// got no time on a busy node (twenty runs waking a sandbox at once).
    fn drain(&self, run: &Run) {
        let mut buf = vec![0u8; CHUNK];
        for stderr in [false, true] {
            self.read(run, stderr, &mut buf);
        }
    }
}

/// What the reaper hands a program's wait status to: the run or terminal it leads.
pub(crate) trait Leader: Send + Sync {
    /// The program exited: its wait status and the CPU time it and its waited-for children
    /// used.
    fn reaped(&self, status: WaitStatus, cpu_ns: u64);
}

/// The programs the reaper hands statuses to, by pid. Held while spawning and while reaping,
/// so a program cannot be reaped before its owner is registered.
pub(crate) type Leaders = Mutex<HashMap<i32, Arc<dyn Leader>>>;

/// One run.
struct Run {
    id: String,
    pgid: Pid,
    started: Instant,
    cap: usize,
    pipes: Pipes,
    state: Mutex<Out>,
    changed: Condvar,
}

impl Leader for Run {
    fn reaped(&self, status: WaitStatus, cpu_ns: u64) {
        self.lock().leader = Some((status, cpu_ns, Instant::now()));
        self.changed.notify_all();
    }
}

impl Run {
    fn lock(&self) -> MutexGuard<'_, Out> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn push(&self, stderr: bool, bytes: &[u8]) {
        let mut s = self.lock();
        let cap = self.cap;
        let buf = if stderr { &mut s.stderr } else { &mut s.stdout };
        let take = bytes.len().min(cap.saturating_sub(buf.len()));
        buf.extend_from_slice(&bytes[..take]);
        if take < bytes.len() {
            s.truncated = true;
        }
        drop(s);
        self.changed.notify_all();
    }

    /// Ends the run: kills its whole process group and waits until it is gone.
    fn end(&self, how: Ended) -> bool {
        {
            let mut s = self.lock();
            if s.exit.is_some() {
                return false;
            }
            s.ended_by.get_or_insert(how);
            s.group_killed = true;
        }
        self.changed.notify_all();
        kill_group(self.pgid);
        self.changed.notify_all();
        true
    }

    fn state(&self) -> RunState {
        let s = self.lock();
        RunState {
            run_id: self.id.clone(),
            running: s.exit.is_none(),
            exit: s.exit.clone(),
            stdout: String::from_utf8_lossy(&s.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&s.stderr).into_owned(),
        }
    }
}

/// Kills every process of a group with SIGKILL and waits (bounded) until none is left alive:
/// members forked while the signal went out are caught by the next round.
pub fn kill_group(pgid: Pid) {
    let deadline = Instant::now() + KILL_WAIT;
    loop {
        let _ = killpg(pgid, Signal::SIGKILL);
        if !group_alive(pgid) || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Whether any process of the group is alive (not a zombie), read from /proc.
fn group_alive(pgid: Pid) -> bool {
    let want = pgid.as_raw();
    match processes() {
        Some(all) => all.iter().any(|p| p.pgrp == want),
        None => killpg(pgid, None).is_ok(),
    }
}

/// A live process, as /proc shows it.
pub(crate) struct Proc {
    /// Its pid.
    pub(crate) pid: i32,
    /// Its process group.
    pub(crate) pgrp: i32,
    /// Its session.
    pub(crate) session: i32,
}

/// Every live process (not a zombie) the agent can see, read from /proc; `None` when /proc
/// cannot be read.
pub(crate) fn processes() -> Option<Vec<Proc>> {
    let dir = std::fs::read_dir("/proc").ok()?;
    let mut found = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let pgrp = fields.nth(1).and_then(|p| p.parse::<i32>().ok());
        let session = fields.next().and_then(|p| p.parse::<i32>().ok());
        if let (Some(pgrp), Some(session)) = (pgrp, session)
            && state != Some("Z")
            && state != Some("X")
        {
            found.push(Proc { pid, pgrp, session });
        }
    }
    Some(found)
}

/// Everything the agent holds.
struct Agent {
    session: String,
    runs: Mutex<HashMap<String, Arc<Run>>>,
    finished: Mutex<Vec<String>>,
    /// Held while spawning and while reaping, so a program cannot be reaped before its run or
    /// terminal is registered as the owner of its pid.
    leaders: Leaders,
    terms: Arc<Terminals>,
    pid1: bool,
}

/// Locks a mutex, poisoned or not (a panicked holder leaves nothing half-done that matters).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn cpu_ns(u: &nix::sys::resource::Usage) -> u64 {
    let t = |tv: nix::sys::time::TimeVal| {
        u64::try_from(tv.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(tv.tv_usec()).unwrap_or(0) * 1_000
    };
    t(u.user_time()) + t(u.system_time())
}

fn children_cpu() -> u64 {
    getrusage(UsageWho::RUSAGE_CHILDREN)
        .map(|u| cpu_ns(&u))
        .unwrap_or(0)
}

/// CPU time of the whole sandbox: its cgroup (v2 or v1), else the agent and all it reaped.
fn sandbox_cpu_ns() -> u64 {
    if let Ok(stat) = std::fs::read_to_string("/sys/fs/cgroup/cpu.stat")
        && let Some(usec) = stat
            .lines()
            .find_map(|l| l.strip_prefix("usage_usec "))
            .and_then(|v| v.trim().parse::<u64>().ok())
    {
        return usec * 1000;
    }
    for p in [
        "/sys/fs/cgroup/cpuacct/cpuacct.usage",
        "/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage",
        "/sys/fs/cgroup/cpuacct,cpu/cpuacct.usage",
    ] {
        if let Ok(v) = std::fs::read_to_string(p)
            && let Ok(ns) = v.trim().parse::<u64>()
        {
            return ns;
        }
    }
    let own = getrusage(UsageWho::RUSAGE_SELF)
        .map(|u| cpu_ns(&u))
        .unwrap_or(0);
    own + children_cpu()
}

impl Agent {
    /// Reaps every child that has exited; a run's or terminal's program hands its status to
    /// its owner.
    fn reap(&self) {
        let mut leaders = lock(&self.leaders);
        loop {
            let before = children_cpu();
            match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
                Err(Errno::EINTR) => {}
                Err(_) => return,
                Ok(status) => {
                    let cpu = children_cpu().saturating_sub(before);
                    if let Some(pid) = status.pid()
                        && let Some(leader) = leaders.remove(&pid.as_raw())
                    {
                        leader.reaped(status, cpu);
                    }
                }
            }
        }
    }

    fn start(self: &Arc<Self>, req: RunRequest) -> Result<Arc<Run>, Msg> {
        let Some((program, args)) = req.argv.split_first() else {
            return Err(error("bad_request", "argv is empty"));
        };
        let mut runs = lock(&self.runs);
        if runs
            .get(&req.run_id)
            .is_some_and(|r| r.lock().exit.is_none())
        {
            return Err(error(
                "run_exists",
                format!("run '{}' is already running", req.run_id),
            ));
        }
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_clear()
            .envs(
                std::env::vars_os()
                    .filter(|(k, _)| !k.to_str().is_some_and(|k| k.starts_with(proto::ENV_PREFIX))),
            )
            .envs(req.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(cwd) = &req.cwd {
            cmd.current_dir(cwd);
        }
        let mut leaders = lock(&self.leaders);
        let mut spawned = cmd.spawn();
        // A sandbox at its process limit (a fork bomb a finished run left running, or
        // background jobs): what finished runs left behind makes room for this one.
        for _ in 0..5 {
            if !spawned
                .as_ref()
                .is_err_and(|e| e.raw_os_error() == Some(Errno::EAGAIN as i32))
            {
                break;
            }
            drop(leaders);
            let reclaimed = self.reclaim(&runs);
            // The killed processes are zombies until reaped, and zombies count too.
            self.reap();
            leaders = lock(&self.leaders);
            if !reclaimed {
                break;
            }
            spawned = cmd.spawn();
        }
        let mut child = spawned.map_err(|e| {
            if e.raw_os_error() == Some(Errno::EAGAIN as i32) {
                crowded_error(program, Some(&e))
            } else {
                error("spawn_failed", format!("cannot start {program}: {e}"))
            }
        })?;
        let pid = i32::try_from(child.id()).unwrap_or(0);
        let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
            // Never so with piped output; the reaper reaps the killed program.
            kill_group(Pid::from_raw(pid));
            return Err(error("spawn_failed", "the run's pipes are missing"));
        };
        // The program is reaped by the agent's reaper, never through `child`.
        drop(child);
        let run = Arc::new(Run {
            id: req.run_id.clone(),
            pgid: Pid::from_raw(pid),
            started: Instant::now(),
            cap: usize::try_from(req.max_output_bytes).unwrap_or(usize::MAX),
            pipes: Pipes::new(OwnedFd::from(out), OwnedFd::from(err)),
            state: Mutex::new(Out {
                stdout: Vec::new(),
                stderr: Vec::new(),
                truncated: false,
                eof: false,
                leader: None,
                ended_by: None,
                group_killed: false,
                exit: None,
            }),
            changed: Condvar::new(),
        });
        leaders.insert(pid, run.clone());
        drop(leaders);
        runs.insert(req.run_id.clone(), run.clone());
        drop(runs);
        let r = run.clone();
        spawn_thread(move || pump(&r));
        let r = run.clone();
        let agent = self.clone();
        let timeout = Duration::from_millis(req.timeout_ms);
        spawn_thread(move || agent.supervise(&r, timeout));
        Ok(run)
    }

    /// Waits for a run to end (its program exited and its output closed, or the timeout), and
    /// records how.
    fn supervise(&self, run: &Run, timeout: Duration) {
        let deadline = run.started + timeout;
        let mut s = run.lock();
        loop {
            let now = Instant::now();
            if s.ended_by.is_none() && now >= deadline {
                drop(s);
                run.end(Ended::Timeout);
                s = run.lock();
                continue;
            }
            if let Some((status, cpu, at)) = s.leader {
                // A program killed by a signal (OOM, the pids limit) takes its group with it.
                if matches!(status, WaitStatus::Signaled(..)) && !s.group_killed {
                    s.group_killed = true;
                    drop(s);
                    kill_group(run.pgid);
                    s = run.lock();
                    continue;
                }
                if !s.eof && now >= at + EXIT_GRACE {
                    // The pipes are still open (a background job holds them): read what the
                    // program left in them before reporting it, its pump may not have had
                    // the time.
                    drop(s);
                    run.pipes.drain(run);
                    s = run.lock();
                }
                if s.eof || now >= at + EXIT_GRACE {
                    let (code, signal) = match status {
                        WaitStatus::Exited(_, c) => (i64::from(c), None),
                        WaitStatus::Signaled(_, sig, _) => (128 + sig as i64, Some(sig as i32)),
                        _ => (-1, None),
                    };
                    let exit_code = match s.ended_by {
                        Some(Ended::Timeout) => 124,
                        Some(Ended::Stopped) => 137,
                        None => code,
                    };
                    s.exit = Some(RunExit {
                        exit_code,
                        signal,
                        timed_out: s.ended_by == Some(Ended::Timeout),
                        stopped: s.ended_by == Some(Ended::Stopped),
                        truncated: s.truncated,
                        cpu_ns: cpu,
                        duration_ms: u64::try_from(run.started.elapsed().as_millis())
                            .unwrap_or(u64::MAX),
                    });
                    drop(s);
                    run.changed.notify_all();
                    self.retire(&run.id);
                    return;
                }
                let wait = (at + EXIT_GRACE).saturating_duration_since(now);
                s = run
                    .changed
                    .wait_timeout(s, wait.max(Duration::from_millis(1)))
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
                continue;
            }
            let wait = if s.ended_by.is_none() {
                deadline.saturating_duration_since(now)
            } else {
                Duration::from_millis(50)
            };
            s = run
                .changed
                .wait_timeout(s, wait.max(Duration::from_millis(1)))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Kills what finished runs left behind (their background jobs, and, when the agent is
    /// PID 1, any process of the sandbox outside the groups of running runs) so that a run can
    /// start in a sandbox at its process limit. Running runs are never touched. Returns whether
    /// anything was killed.
    fn reclaim(&self, runs: &HashMap<String, Arc<Run>>) -> bool {
        let running: HashSet<i32> = runs
            .values()
            .filter(|r| r.lock().exit.is_none())
            .map(|r| r.pgid.as_raw())
            .collect();
        let (groups, loose): (BTreeSet<i32>, Vec<i32>) = if self.pid1 {
            // A terminal's jobs have groups of their own: its session tells them.
            let terminals = self.terms.sessions();
            let stray: Vec<(i32, i32)> = processes()
                .unwrap_or_default()
                .into_iter()
                .filter(|p| {
                    p.pid != 1 && !running.contains(&p.pgrp) && !terminals.contains(&p.session)
                })
                .map(|p| (p.pid, p.pgrp))
                .collect();
            (
                stray.iter().map(|&(_, g)| g).filter(|&g| g > 1).collect(),
                // In the agent's own group: killed one by one, never by group.
                stray
                    .iter()
                    .filter(|&&(_, g)| g <= 1)
                    .map(|&(p, _)| p)
                    .collect(),
            )
        } else {
            let finished = runs
                .values()
                .filter(|r| r.lock().exit.is_some())
                .map(|r| r.pgid.as_raw())
                .filter(|&g| !running.contains(&g) && group_alive(Pid::from_raw(g)))
                .collect();
            (finished, Vec::new())
        };
        for pid in &loose {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        for g in &groups {
            kill_group(Pid::from_raw(*g));
        }
        !groups.is_empty() || !loose.is_empty()
    }

    /// [`Self::reclaim`] outside a spawn, then reaps what it killed (zombies count against the
    /// limit too).
    fn make_room(&self) -> bool {
        let runs = lock(&self.runs);
        let reclaimed = self.reclaim(&runs);
        drop(runs);
        self.reap();
        reclaimed
    }

    /// Keeps a bounded number of finished runs.
    fn retire(&self, id: &str) {
        let mut finished = lock(&self.finished);
        finished.push(id.to_owned());
        if finished.len() > KEEP_FINISHED {
            let old = finished.remove(0);
            let mut runs = lock(&self.runs);
            if runs.get(&old).is_some_and(|r| r.lock().exit.is_some()) {
                runs.remove(&old);
            }
        }
    }

    fn run(&self, id: &str) -> Option<Arc<Run>> {
        lock(&self.runs).get(id).cloned()
    }

    fn running(&self) -> Vec<Arc<Run>> {
        lock(&self.runs)
            .values()
            .filter(|r| r.lock().exit.is_none())
            .cloned()
            .collect()
    }

    /// Serves one connection. A `crowded` one is served on the accept loop's own thread, as the
    /// sandbox has no process left for one of its own: it gets no run and no stream.
    fn serve(
        self: &Arc<Self>,
        mut conn: UnixStream,
        crowded: bool,
        gate: &Gate,
        tracked: &Arc<Tracked>,
    ) -> Result<(), proto::FrameError> {
        let Some(Frame::Msg(Msg::Hello { protocols, session })) = proto::read_frame(&mut conn)?
        else {
            proto::write_msg(&mut conn, &error("bad_request", "expected hello"))?;
            return Ok(());
        };
        let Some(protocol) = proto::negotiate(&protocols) else {
            proto::write_msg(
                &mut conn,
                &error(
                    "no_protocol",
                    format!(
                        "this agent speaks protocols {}..={}, not {protocols:?}",
                        proto::MIN_PROTOCOL,
                        proto::PROTOCOL
                    ),
                ),
            )?;
            return Ok(());
        };
        proto::write_msg(
            &mut conn,
            &Msg::Welcome {
                protocol,
                version: proto::VERSION.to_owned(),
                session: self.session.clone(),
            },
        )?;
        if session != self.session {
            proto::write_msg(
                &mut conn,
                &error(
                    "wrong_session",
                    format!("this agent serves session '{}'", self.session),
                ),
            )?;
            return Ok(());
        }
        let Some(Frame::Msg(request)) = proto::read_frame(&mut conn)? else {
            return Ok(());
        };
        match request {
            Msg::Run(req) if crowded => {
                let program = req.argv.first().map_or("the run", String::as_str);
                proto::write_msg(&mut conn, &crowded_error(program, None))?;
            }
            Msg::Attach { .. } if crowded => {
                proto::write_msg(&mut conn, &crowded_error("a stream of the run", None))?;
            }
            Msg::TermOpen(_) | Msg::TermAttach { .. } | Msg::TermList | Msg::TermKill { .. }
                if protocol < proto::TERMINALS_PROTOCOL =>
            {
                proto::write_msg(
                    &mut conn,
                    &error(
                        "bad_request",
                        format!(
                            "terminals need protocol {}, not {protocol}",
                            proto::TERMINALS_PROTOCOL
                        ),
                    ),
                )?;
            }
            Msg::PortConnect { .. } if protocol < proto::TERMINALS_PROTOCOL => {
                proto::write_msg(
                    &mut conn,
                    &error(
                        "bad_request",
                        format!(
                            "ports need protocol {}, not {protocol}",
                            proto::TERMINALS_PROTOCOL
                        ),
                    ),
                )?;
            }
            Msg::PortConnect { port } if crowded => {
                proto::write_msg(
                    &mut conn,
                    &crowded_error(&format!("a connection to port {port}"), None),
                )?;
            }
            Msg::PortConnect { port } => crate::ports::connect(port, conn, tracked)?,
            Msg::Watch { .. } if protocol < proto::TERMINALS_PROTOCOL => {
                proto::write_msg(
                    &mut conn,
                    &error(
                        "bad_request",
                        format!(
                            "file watch needs protocol {}, not {protocol}",
                            proto::TERMINALS_PROTOCOL
                        ),
                    ),
                )?;
            }
            Msg::Watch { path, .. } if crowded => {
                proto::write_msg(
                    &mut conn,
                    &crowded_error(&format!("a watch of {path}"), None),
                )?;
            }
            Msg::Watch {
                path,
                recursive,
                max_watches,
            } => crate::watch::watch(&path, recursive, max_watches, conn, tracked)?,
            Msg::TermOpen(req) if crowded => {
                let program = req.argv.first().map_or("a terminal", String::as_str);
                proto::write_msg(&mut conn, &crowded_error(program, None))?;
            }
            Msg::TermAttach { .. } if crowded => {
                proto::write_msg(&mut conn, &crowded_error("a stream of the terminal", None))?;
            }
            Msg::TermOpen(req) => match self.terms.open(req, &self.leaders) {
                Ok(term) => proto::write_msg(
                    &mut conn,
                    &Msg::TermOpened {
                        term: Box::new(term.info()),
                    },
                )?,
                Err(msg) => proto::write_msg(&mut conn, &msg)?,
            },
            Msg::TermAttach { term_id } => match self.terms.get(&term_id) {
                Some(term) => terminal::attach(&term, conn, tracked)?,
                None => proto::write_msg(
                    &mut conn,
                    &error("no_such_terminal", format!("no terminal '{term_id}'")),
                )?,
            },
            Msg::TermList => {
                let terms = self.terms.list();
                proto::write_msg(&mut conn, &Msg::TermListReply { terms })?;
            }
            Msg::TermKill { term_id } => {
                let found = self.terms.kill(&term_id);
                proto::write_msg(&mut conn, &Msg::TermKilled { found })?;
            }
            Msg::Run(req) => match self.start(req) {
                Ok(run) => {
                    proto::write_msg(
                        &mut conn,
                        &Msg::Started {
                            run_id: run.id.clone(),
                            pid: run.pgid.as_raw(),
                        },
                    )?;
                    stream(&run, conn, tracked)?;
                }
                Err(msg) => proto::write_msg(&mut conn, &msg)?,
            },
            Msg::Attach { run_id } => match self.run(&run_id) {
                Some(run) => stream(&run, conn, tracked)?,
                None => proto::write_msg(
                    &mut conn,
                    &error("no_such_run", format!("no run '{run_id}'")),
                )?,
            },
            Msg::Stop { run_id } => {
                let found = run_id
                    .and_then(|id| self.run(&id))
                    .is_some_and(|r| r.end(Ended::Stopped));
                proto::write_msg(&mut conn, &Msg::Stopped { found })?;
            }
            Msg::Status { run_id } => {
                let state = self.run(&run_id).map(|r| r.state());
                proto::write_msg(&mut conn, &Msg::RunState { state })?;
            }
            Msg::Stats => {
                let running = self.running().iter().map(|r| r.id.clone()).collect();
                proto::write_msg(
                    &mut conn,
                    &Msg::StatsReply {
                        cpu_ns: sandbox_cpu_ns(),
                        running,
                    },
                )?;
            }
            Msg::Quiesce => match gate.quiesce(tracked) {
                Ok(()) => proto::write_msg(&mut conn, &Msg::Quiesced)?,
                Err((code, message)) => proto::write_msg(&mut conn, &error(&code, message))?,
            },
            other => proto::write_msg(
                &mut conn,
                &error("bad_request", format!("unexpected {other:?}")),
            )?,
        }
        Ok(())
    }

    /// Forwards a signal: to everything in the sandbox when the agent is PID 1, else to the
    /// process groups of its runs.
    fn forward(&self, sig: Signal) {
        if self.pid1 {
            let _ = kill(Pid::from_raw(-1), sig);
        } else {
            for run in self.running() {
                let _ = killpg(run.pgid, sig);
            }
        }
    }
}

/// The refusal of a run in a sandbox whose running runs hold every process it may have.
fn crowded_error(what: &str, cause: Option<&io::Error>) -> Msg {
    let limit = process_limit().map_or_else(
        || "its process limit".to_owned(),
        |n| format!("its limit of {n} processes"),
    );
    let cause = cause.map_or_else(String::new, |e| format!(" ({e})"));
    error(
        "process_limit",
        format!(
            "cannot start {what}: the sandbox is at {limit}{cause} and its running runs hold \
             them all; stop one to make room"
        ),
    )
}

/// The sandbox's limit of processes (its pids cgroup, v2 or v1), when it has one.
fn process_limit() -> Option<u64> {
    ["/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse().ok())
}

/// An error answer.
pub(crate) fn error(code: &str, message: impl Into<String>) -> Msg {
    Msg::Error {
        code: code.to_owned(),
        message: message.into(),
    }
}

/// Reads a run's stdout and stderr into the run until both close, or until the run is over
/// and no more comes (a background job holding the pipe open does not keep a thread forever).
fn pump(run: &Run) {
    let mut buf = vec![0u8; CHUNK];
    let pipes = &run.pipes;
    let (mut out_open, mut err_open) = (true, true);
    while out_open || err_open {
        let mut kinds = Vec::with_capacity(2);
        let mut polled = Vec::with_capacity(2);
        if out_open {
            kinds.push(false);
            polled.push(PollFd::new(pipes.out.as_fd(), PollFlags::POLLIN));
        }
        if err_open {
            kinds.push(true);
            polled.push(PollFd::new(pipes.err.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut polled, PollTimeout::from(100u16)) {
            Ok(0) => {
                if run.lock().exit.is_some() {
                    break;
                }
                continue;
            }
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(_) => break,
        }
        let ready: Vec<bool> = kinds
            .iter()
            .zip(&polled)
            .filter(|(_, p)| p.revents().is_some_and(|r| !r.is_empty()))
            .map(|(stderr, _)| *stderr)
            .collect();
        drop(polled);
        for stderr in ready {
            // Empty: the supervisor read it first.
            if let Got::Closed = pipes.read(run, stderr, &mut buf) {
                if stderr {
                    err_open = false;
                } else {
                    out_open = false;
                }
            }
        }
    }
    run.lock().eof = true;
    run.changed.notify_all();
}

/// Streams a run to a connection from its first byte, then its exit. A stop frame on the
/// connection stops the run; a connection that breaks leaves the run running.
fn stream(
    run: &Arc<Run>,
    conn: UnixStream,
    tracked: &Arc<Tracked>,
) -> Result<(), proto::FrameError> {
    let mut reader = conn.try_clone()?;
    let stopper = run.clone();
    let done = Arc::new(AtomicBool::new(false));
    let done_r = done.clone();
    // The reader holds the connection too: a quiesce waits for it to let go.
    let held = tracked.clone();
    spawn_thread(move || {
        let _held = held;
        while let Ok(Some(frame)) = proto::read_frame(&mut reader) {
            if let Frame::Msg(Msg::Stop { .. }) = frame {
                stopper.end(Ended::Stopped);
            }
            if done_r.load(Ordering::Relaxed) {
                break;
            }
        }
    });
    let mut w = io::BufWriter::with_capacity(CHUNK + 16, &conn);
    let (mut sent_out, mut sent_err) = (0usize, 0usize);
    let result = loop {
        let (out, err, exit) = {
            let mut s = run.lock();
            while s.stdout.len() == sent_out && s.stderr.len() == sent_err && s.exit.is_none() {
                s = run
                    .changed
                    .wait(s)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            let out = s.stdout[sent_out..].to_vec();
            let err = s.stderr[sent_err..].to_vec();
            (out, err, s.exit.clone())
        };
        sent_out += out.len();
        sent_err += err.len();
        let mut wrote = Ok(());
        for chunk in out.chunks(CHUNK) {
            wrote = wrote.and_then(|()| w.write_all(&proto::encode_output(false, chunk)));
        }
        for chunk in err.chunks(CHUNK) {
            wrote = wrote.and_then(|()| w.write_all(&proto::encode_output(true, chunk)));
        }
        if let Some(exit) = exit {
            wrote = wrote.and_then(|()| w.write_all(&proto::encode_msg(&Msg::Exit(exit))));
            break wrote.and_then(|()| w.flush());
        }
        if let Err(e) = wrote.and_then(|()| w.flush()) {
            break Err(e);
        }
    };
    done.store(true, Ordering::Relaxed);
    drop(w);
    let _ = conn.shutdown(std::net::Shutdown::Both);
    result.map_err(Into::into)
}

/// Binds the socket: a stale one from an earlier life of the container is replaced; only its
/// owner (root, when the agent starts as root: never the sandbox uid) may connect.
///
/// The folder is sandboxd's (owned by root, `0700`, see `sandboxd::run::agent`): an agent
/// started as root binds there before it drops to the sandbox uid, so no process of the
/// sandbox can remove, replace or shadow the socket, nor connect to it.
pub(crate) fn bind(path: &Path) -> io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Runs the agent until SIGTERM, SIGINT or SIGQUIT: then every process gets the signal, and
/// the agent exits when they are gone (or after a grace period). Returns the exit status.
pub fn main(opts: Options) -> io::Result<i32> {
    // Every thread inherits the blocked set; the signal thread takes them with sigwait. Runs
    // start with an empty mask (the standard library resets it in the child).
    let mut signals = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGHUP,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGWINCH,
    ] {
        signals.add(s);
    }
    signals.thread_block().map_err(io::Error::from)?;
    // Processes of the sandbox share the agent's uid: keep them out of its memory (ptrace,
    // /proc/1/mem, /proc/1/environ).
    let _ = nix::sys::prctl::set_dumpable(false);
    let agent = Arc::new(Agent {
        session: opts.session.clone(),
        runs: Mutex::default(),
        finished: Mutex::default(),
        leaders: Mutex::default(),
        terms: Arc::default(),
        pid1: std::process::id() == 1,
    });
    let listener = bind(&opts.socket)
        .map_err(|e| io::Error::new(e.kind(), format!("bind {}: {e}", opts.socket.display())))?;
    // Still one thread: the binder starts as root before the drop, and the drop below applies
    // to the whole process.
    let binder = match (opts.resumable, opts.user) {
        (true, Some(_)) if nix::unistd::geteuid().is_root() => Some(
            Binder::spawn(&opts.socket)
                .map_err(|e| io::Error::new(e.kind(), format!("start the binder: {e}")))?,
        ),
        _ => None,
    };
    if let Some((uid, gid)) = opts.user {
        drop_privileges(uid, gid)?;
    }
    // A change of uid resets the flag: set it again for the uid the agent keeps.
    let _ = nix::sys::prctl::set_dumpable(false);
    let gate = Gate::new(binder)?;
    let (a, g) = (agent.clone(), gate.clone());
    spawn_thread(move || accept(&a, &g, listener));
    loop {
        let sig = signals.wait().map_err(io::Error::from)?;
        match sig {
            Signal::SIGCHLD => agent.reap(),
            Signal::SIGTERM | Signal::SIGINT | Signal::SIGQUIT => {
                gate.close();
                agent.forward(sig);
                let _ = std::fs::remove_file(&opts.socket);
                shutdown(&agent);
                return Ok(0);
            }
            other => agent.forward(other),
        }
    }
}

/// Accepts connections, each served on a thread of its own; closes the listener when a quiesce
/// asks, and serves again on the listener the binder hands back after the restore.
fn accept(agent: &Arc<Agent>, gate: &Arc<Gate>, mut listener: UnixListener) {
    let _ = listener.set_nonblocking(true);
    loop {
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(gate.waker(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
        // Every quiesce writes the wake pipe: only then is the gate looked at, not on each
        // connection (the runs' hot path).
        let woken = !fds[1].revents().unwrap_or(PollFlags::empty()).is_empty();
        if woken {
            gate.drain_waker();
        }
        if woken && gate.quiescing() {
            drop(listener);
            match gate.closed_and_wait() {
                Ok(again) => {
                    listener = again;
                    let _ = listener.set_nonblocking(true);
                    continue;
                }
                // The binder is gone (the agent is leaving): nothing more to serve.
                Err(_) => return,
            }
        }
        let conn = match listener.accept() {
            Ok((conn, _)) => conn,
            Err(_) => continue,
        };
        let _ = conn.set_nonblocking(false);
        let tracked = gate.track(&conn);
        let slot = Arc::new(Mutex::new(Some(conn)));
        let serve = || {
            let (slot, a, g, t) = (slot.clone(), agent.clone(), gate.clone(), tracked.clone());
            move || {
                let conn = lock(&slot).take();
                if let Some(conn) = conn {
                    let _ = a.serve(conn, false, &g, &t);
                }
            }
        };
        if std::thread::Builder::new().spawn(serve()).is_ok() {
            continue;
        }
        // No thread for the connection: what finished runs left may hold every process.
        agent.make_room();
        if std::thread::Builder::new().spawn(serve()).is_ok() {
            continue;
        }
        // Running runs hold them all: answered here and at once (a stop or a status is
        // served, a run refused), never left waiting for a thread.
        let conn = lock(&slot).take();
        if let Some(conn) = conn {
            let _ = conn.set_read_timeout(Some(CROWDED_READ));
            let _ = agent.serve(conn, true, gate, &tracked);
        }
    }
}

/// Becomes `uid`:`gid` for good, with no supplementary group and an empty capability
/// bounding set, so neither the agent nor anything it starts can gain a capability again (the
/// sandbox runs with no-new-privileges too). Called while the agent is the only thread. An
/// agent already running as `uid` (not started as root) keeps what it has.
fn drop_privileges(uid: u32, gid: u32) -> io::Result<()> {
    use nix::unistd::{Gid, Uid, getegid, geteuid, getgid, getuid, setgid, setgroups, setuid};
    use rustix::thread::{
        CapabilitySet, capability_is_in_bounding_set, remove_capability_from_bounding_set,
    };
    let fail = |what: &str, e: nix::Error| {
        io::Error::other(format!("cannot drop to uid {uid} (gid {gid}): {what}: {e}"))
    };
    if geteuid().as_raw() == uid && getuid().as_raw() == uid {
        return Ok(());
    }
    // Every capability the bounding set holds (CAP_SETPCAP last, as dropping needs it).
    let setpcap = CapabilitySet::SETPCAP;
    for bit in (0..64u32)
        .filter(|b| 1u64 << b != setpcap.bits())
        .chain([setpcap.bits().trailing_zeros()])
    {
        let cap = CapabilitySet::from_bits_retain(1u64 << bit);
        match capability_is_in_bounding_set(cap) {
            Ok(true) => remove_capability_from_bounding_set(cap).map_err(|e| {
                io::Error::other(format!(
                    "cannot empty the capability bounding set (capability {bit}): {e}"
                ))
            })?,
            Ok(false) => {}
            // Past the kernel's last capability.
            Err(_) => {}
        }
    }
    setgroups(&[]).map_err(|e| fail("setgroups", e))?;
    setgid(Gid::from_raw(gid)).map_err(|e| fail("setgid", e))?;
    setuid(Uid::from_raw(uid)).map_err(|e| fail("setuid", e))?;
    // Never go on as root: a drop that did not take is an error.
    if getuid().as_raw() != uid
        || geteuid().as_raw() != uid
        || getgid().as_raw() != gid
        || getegid().as_raw() != gid
        || setuid(Uid::from_raw(0)).is_ok()
    {
        return Err(io::Error::other(format!(
            "the drop to uid {uid} (gid {gid}) did not take"
        )));
    }
    Ok(())
}

/// Hangs up the terminals, then reaps until no child is left or the grace period ends; what
/// is left of the terminals' sessions then is killed (their jobs need not be the agent's
/// children).
fn shutdown(agent: &Agent) {
    agent.terms.signal_all(Signal::SIGHUP);
    let start = Instant::now();
    let mut hung_up = true;
    while start.elapsed() < Duration::from_secs(3) {
        if hung_up && start.elapsed() >= Duration::from_secs(1) {
            agent.terms.signal_all(Signal::SIGKILL);
            hung_up = false;
        }
        agent.reap();
        if matches!(
            waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)),
            Err(Errno::ECHILD)
        ) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    agent.terms.signal_all(Signal::SIGKILL);
}

/// Starts `f` on a thread of its own, retrying while the sandbox's process limit leaves no room
/// for a thread (a fork bomb at the pids limit): `std::thread::spawn` would panic there and
/// take the agent's accept loop or a run's supervisor with it. After about 10 s without a
/// thread the work runs on the caller's thread rather than being lost.
pub(crate) fn spawn_thread<F: FnOnce() + Send + 'static>(f: F) {
    type Job = Box<dyn FnOnce() + Send>;
    let job: Arc<Mutex<Option<Job>>> = Arc::new(Mutex::new(Some(Box::new(f))));
    for attempt in 0..200u64 {
        let j = job.clone();
        let started = std::thread::Builder::new().spawn(move || {
            let f = j.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(f) = f {
                f();
            }
        });
        if started.is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5 * (attempt.min(9) + 1)));
    }
    let f = job.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(f) = f {
        f();
    }
}
