//! Terminals: programs on pseudo-terminals that outlive the connection that opened them and
//! the ones that watch them ([`Msg::TermOpen`] and the rest, see [`crate::proto`]).
//!
//! A terminal is a pty whose program leads a session of its own with the pty as its
//! controlling terminal. Without `unsafe` there is no `pre_exec` to call `setsid` in the child,
//! so the agent starts its own binary again as a trampoline ([`PTY_EXEC_ARG`], see
//! [`exec_main`]) which does that and then executes the program. Per terminal: one thread
//! reads the master into a scrollback [`Ring`], one supervises its end (the program's wait
//! status comes from the agent's reaper, [`crate::server`]) and its idle time; an attached
//! connection is one thread writing the terminal's output and one reading its input.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;

use crate::pause::Tracked;
use crate::proto::{self, Frame, Msg, TermExit, TermInfo, TermRequest};
use crate::server::{CHUNK, EXIT_GRACE, KILL_WAIT, Leader, Leaders, error, lock, spawn_thread};

/// The argument that makes the agent's binary a terminal's trampoline
/// (`--pty-exec PROGRAM ARGS...`, see [`exec_main`]).
pub const PTY_EXEC_ARG: &str = "--pty-exec";
/// Ended terminals kept for [`Msg::TermList`] and [`Msg::TermAttach`].
const KEEP_ENDED: usize = 16;
/// How long a kill (or an idle close) gives the session after SIGHUP before SIGKILL.
const HANGUP_WAIT: Duration = Duration::from_secs(2);
/// How long a [`Msg::TermKill`] waits for the terminal to be reported ended.
const END_WAIT: Duration = Duration::from_secs(3);
/// How often a thread waiting on a pty looks whether its wait still matters.
const POLL_MS: u16 = 100;
/// `TERM` of a terminal whose request names none.
const DEFAULT_TERM: &str = "xterm-256color";
/// [`TermExit::reason`] of a program that ended by itself.
const EXITED: &str = "exited";
/// [`TermExit::reason`] after a [`Msg::TermKill`].
const KILLED: &str = "killed";
/// [`TermExit::reason`] after its idle time ran out.
const IDLE: &str = "idle";

/// The trampoline's life (`sandbox-agent --pty-exec PROGRAM ARGS...`, its standard streams the
/// terminal): becomes a session leader with the terminal as its controlling one, then
/// executes the program. Returns only when that failed, with the exit status (127); the words
/// went to the terminal.
pub fn exec_main(argv: &[OsString]) -> u8 {
    let Some((program, args)) = argv.split_first() else {
        eprintln!("sandbox-agent: {PTY_EXEC_ARG} needs a program");
        return 127;
    };
    let name = program.to_string_lossy();
    // Started by the agent without a group of its own, so never a group leader: setsid works.
    if let Err(e) = rustix::process::setsid() {
        eprintln!("sandbox-agent: cannot start {name}: setsid: {e}");
        return 127;
    }
    if let Err(e) = rustix::process::ioctl_tiocsctty(io::stdin()) {
        eprintln!("sandbox-agent: cannot start {name}: no controlling terminal: {e}");
        return 127;
    }
    let err = Command::new(program).args(args).exec();
    eprintln!("sandbox-agent: cannot start {name}: {err}");
    127
}

/// The newest bytes of a stream, up to a capacity, addressed by their offset in the whole
/// stream: a reader keeps the offset it got to, and one that fell further behind than the
/// ring holds goes on from the oldest byte kept.
pub(crate) struct Ring {
    /// Byte `o` of the stream is at `o % cap` (the buffer grows to `cap`, then wraps).
    data: Vec<u8>,
    cap: usize,
    end: u64,
}

impl Ring {
    /// An empty ring keeping at most `cap` bytes.
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            data: Vec::new(),
            cap,
            end: 0,
        }
    }

    /// The offset after the newest byte: every byte the stream has had.
    pub(crate) fn end(&self) -> u64 {
        self.end
    }

    /// The offset of the oldest byte kept.
    pub(crate) fn start(&self) -> u64 {
        self.end - self.end.min(self.cap as u64)
    }

    /// Appends bytes, dropping the oldest beyond the capacity.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        let mut bytes = bytes;
        if bytes.len() > self.cap {
            // Only the last `cap` bytes can be kept: the rest only moves the end on.
            let skip = bytes.len() - self.cap;
            self.end += skip as u64;
            bytes = &bytes[skip..];
        }
        while !bytes.is_empty() {
            let at = (self.end % self.cap as u64) as usize;
            let n = bytes.len().min(self.cap - at);
            if self.data.len() < at + n {
                // Still growing: `at` is the buffer's length until it first wraps.
                self.data.resize(at + n, 0);
            }
            self.data[at..at + n].copy_from_slice(&bytes[..n]);
            self.end += n as u64;
            bytes = &bytes[n..];
        }
    }

    /// Up to `max` kept bytes from offset `from` (from the oldest kept when `from` is older),
    /// in one piece: the offset they start at and the bytes. Empty at the end.
    pub(crate) fn read(&self, from: u64, max: usize) -> (u64, &[u8]) {
        let from = from.max(self.start());
        if from >= self.end || self.cap == 0 {
            return (self.end, &[]);
        }
        let at = (from % self.cap as u64) as usize;
        let left = usize::try_from(self.end - from).unwrap_or(usize::MAX);
        let n = left.min(self.cap - at).min(max);
        (from, &self.data[at..at + n])
    }

    /// Every kept byte, oldest first.
    pub(crate) fn kept(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(usize::try_from(self.end - self.start()).unwrap_or(0));
        let mut at = self.start();
        loop {
            let (from, bytes) = self.read(at, usize::MAX);
            if bytes.is_empty() {
                return out;
            }
            out.extend_from_slice(bytes);
            at = from + bytes.len() as u64;
        }
    }
}

/// What changes in a terminal.
struct State {
    ring: Ring,
    rows: u16,
    cols: u16,
    input_bytes: u64,
    last_activity: Instant,
    attached: u32,
    /// When the last attach let go: the idle time counts from then at the earliest.
    detached_at: Instant,
    /// The master gave its last byte (no process holds the terminal any more).
    eof: bool,
    /// The program's wait status and when it was reaped.
    status: Option<(WaitStatus, Instant)>,
    /// Why the agent is ending it ([`KILLED`], [`IDLE`]), when it is.
    ending: Option<&'static str>,
    /// When what was left of its session was killed after the program exited.
    swept: Option<Instant>,
    exit: Option<TermExit>,
    ended_at: Option<Instant>,
}

/// One terminal.
pub(crate) struct Terminal {
    id: String,
    /// The program's pid, which is its session's id.
    pid: i32,
    argv: Vec<String>,
    started: Instant,
    idle_timeout: Option<Duration>,
    /// Non-blocking (every clone too): no thread ever blocks on the terminal for good.
    master: File,
    state: Mutex<State>,
    changed: Condvar,
}

impl Leader for Terminal {
    fn reaped(&self, status: WaitStatus, _cpu_ns: u64) {
        self.lock().status = Some((status, Instant::now()));
        self.changed.notify_all();
    }
}

impl Terminal {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn wait_timeout<'a>(&self, s: MutexGuard<'a, State>, wait: Duration) -> MutexGuard<'a, State> {
        self.changed
            .wait_timeout(s, wait.max(Duration::from_millis(1)))
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0)
    }

    fn info_of(&self, s: &State) -> TermInfo {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        TermInfo {
            term_id: self.id.clone(),
            pid: self.pid,
            argv: self.argv.clone(),
            rows: s.rows,
            cols: s.cols,
            running: s.exit.is_none(),
            exit: s.exit.clone(),
            attached: s.attached,
            input_bytes: s.input_bytes,
            output_bytes: s.ring.end(),
            idle_ms: ms(s.last_activity.elapsed()),
            age_ms: ms(self.started.elapsed()),
        }
    }

    /// The terminal as [`Msg::TermList`] shows it.
    pub(crate) fn info(&self) -> TermInfo {
        self.info_of(&self.lock())
    }

    fn running(&self) -> bool {
        self.lock().exit.is_none()
    }

    /// Keeps output the master gave; false once the terminal ended (nobody wants more).
    fn push(&self, bytes: &[u8]) -> bool {
        let mut s = self.lock();
        s.ring.push(bytes);
        s.last_activity = Instant::now();
        let more = s.exit.is_none();
        drop(s);
        self.changed.notify_all();
        more
    }

    /// Writes input to the terminal, waiting while its buffer is full, until all is written,
    /// the terminal ended or `give_up` says so. Err: the input that was not written.
    fn input(&self, bytes: &[u8], give_up: &dyn Fn() -> bool) -> io::Result<()> {
        let mut left = bytes;
        while !left.is_empty() {
            match (&self.master).write(left) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    left = &left[n..];
                    let mut s = self.lock();
                    s.input_bytes += n as u64;
                    s.last_activity = Instant::now();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // The program reads no input now (the pty holds a few KiB): wait for room,
                    // but never past the end of the terminal or of the attach.
                    if give_up() || !self.running() {
                        return Err(e);
                    }
                    let mut fds = [PollFd::new(self.master.as_fd(), PollFlags::POLLOUT)];
                    let _ = poll(&mut fds, PollTimeout::from(POLL_MS));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Sets the terminal's size; the kernel sends SIGWINCH to its foreground group.
    fn resize(&self, rows: u16, cols: u16) {
        let mut s = self.lock();
        if set_size(&self.master, rows, cols).is_ok() {
            s.rows = rows;
            s.cols = cols;
        }
    }

    /// Ends the program on behalf of the agent (`reason`): SIGHUP to its session, as when a
    /// terminal hangs up, then SIGKILL when the program is still there after
    /// [`HANGUP_WAIT`]. Does not wait for the terminal to be reported ended. Returns whether
    /// it was running.
    fn hang_up(&self, reason: &'static str) -> bool {
        let mut s = self.lock();
        if s.exit.is_some() {
            return false;
        }
        if s.status.is_some() {
            // It exited by itself and is being reported: its supervisor sweeps the session.
            return true;
        }
        s.ending.get_or_insert(reason);
        drop(s);
        signal_sessions(&HashSet::from([self.pid]), Signal::SIGHUP);
        let deadline = Instant::now() + HANGUP_WAIT;
        let mut s = self.lock();
        while s.status.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(s);
                kill_session(self.pid);
                return true;
            }
            s = self.wait_timeout(s, left);
        }
        true
    }

    /// Waits (at most `wait`) for the terminal to be reported ended.
    fn wait_ended(&self, wait: Duration) {
        let deadline = Instant::now() + wait;
        let mut s = self.lock();
        while s.exit.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            s = self.wait_timeout(s, left);
        }
    }
}

/// Sets a pty's size.
fn set_size(master: &File, rows: u16, cols: u16) -> io::Result<()> {
    rustix::termios::tcsetwinsize(
        master,
        rustix::termios::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )
    .map_err(io::Error::from)
}

/// Opens a pty of the given size: its master (non-blocking) and its slave (which never
/// becomes the agent's controlling terminal).
fn open_pty(rows: u16, cols: u16) -> io::Result<(File, OwnedFd)> {
    use rustix::fs::{Mode, OFlags};
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let name = ptsname(&master, Vec::new())?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let master = File::from(master);
    set_size(&master, rows, cols)?;
    // Non-blocking: input for a program that reads none must not hold an attach's thread (and
    // its connection, which a quiesce waits for) for good.
    let flags = rustix::fs::fcntl_getfl(&master)?;
    rustix::fs::fcntl_setfl(&master, flags | OFlags::NONBLOCK)?;
    Ok((master, slave))
}

/// What an empty argv runs: a login shell.
fn login_shell() -> Vec<String> {
    let shell = if Path::new("/bin/bash").exists() {
        "/bin/bash"
    } else {
        "/bin/sh"
    };
    vec![shell.to_owned(), "-l".to_owned()]
}

/// Where `program` would be found (a path, or a name looked up in `path`), when it is an
/// executable file. The trampoline always starts, so a program it cannot execute would only
/// say so on the terminal: this lets the opener hear it.
fn find_program(program: &str, path: Option<&str>, cwd: Option<&Path>) -> io::Result<PathBuf> {
    let executable = |p: &Path| -> io::Result<()> {
        if !std::fs::metadata(p)?.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "not a file",
            ));
        }
        rustix::fs::access(p, rustix::fs::Access::EXEC_OK).map_err(io::Error::from)
    };
    if program.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "empty program name",
        ));
    }
    if program.contains('/') {
        let p = match cwd {
            Some(dir) if !program.starts_with('/') => dir.join(program),
            _ => PathBuf::from(program),
        };
        return executable(&p).map(|()| p);
    }
    let path = path.unwrap_or("/usr/local/bin:/usr/bin:/bin");
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(program))
        .find(|p| executable(p).is_ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "not found in PATH"))
}

/// The agent's terminals: running ones and the last [`KEEP_ENDED`] ended ones.
#[derive(Default)]
pub(crate) struct Terminals {
    table: Mutex<HashMap<String, Arc<Terminal>>>,
}

impl Terminals {
    /// Starts a terminal. Its program is spawned while `leaders` is held and registered there
    /// before it is let go, so the reaper cannot take its status before the terminal owns it.
    /// Err: the refusal to answer.
    pub(crate) fn open(
        self: &Arc<Self>,
        req: TermRequest,
        leaders: &Leaders,
    ) -> Result<Arc<Terminal>, Msg> {
        if req.term_id.is_empty() {
            return Err(error("bad_request", "the terminal id is empty"));
        }
        let argv = if req.argv.is_empty() {
            login_shell()
        } else {
            req.argv.clone()
        };
        let mut table = lock(&self.table);
        if table.get(&req.term_id).is_some_and(|t| t.running()) {
            return Err(error(
                "terminal_exists",
                format!("terminal '{}' is already running", req.term_id),
            ));
        }
        let running = table.values().filter(|t| t.running()).count();
        if running as u64 >= u64::from(req.max_terminals) {
            return Err(error(
                "terminal_limit",
                format!("{running} terminals are running, the most this session may have"),
            ));
        }
        let spawn_failed = |e: &dyn std::fmt::Display| {
            error("spawn_failed", format!("cannot start {}: {e}", argv[0]))
        };
        // Runs' environment: the agent's less its own variables, then the request's.
        let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
            .filter(|(k, _)| !k.to_str().is_some_and(|k| k.starts_with(proto::ENV_PREFIX)))
            .collect();
        env.push(("TERM".into(), DEFAULT_TERM.into()));
        env.extend(req.env.iter().map(|(k, v)| (k.into(), v.into())));
        let path = env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .and_then(|(_, v)| v.to_str());
        let cwd = req.cwd.as_deref().map(Path::new);
        find_program(&argv[0], path, cwd).map_err(|e| spawn_failed(&e))?;
        let (master, slave) =
            open_pty(req.rows, req.cols).map_err(|e| spawn_failed(&format!("no pty: {e}")))?;
        let stdio = || slave.try_clone().map(Stdio::from);
        let (stdin, stdout, stderr) = match (stdio(), stdio(), stdio()) {
            (Ok(i), Ok(o), Ok(e)) => (i, o, e),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return Err(spawn_failed(&e)),
        };
        // The running binary itself, whatever has become of its file since.
        let exe = if Path::new("/proc/self/exe").exists() {
            PathBuf::from("/proc/self/exe")
        } else {
            std::env::current_exe().map_err(|e| spawn_failed(&e))?
        };
        let mut cmd = Command::new(exe);
        cmd.arg(PTY_EXEC_ARG)
            .args(&argv)
            .env_clear()
            .envs(env)
            .stdin(stdin)
            .stdout(stdout)
            .stderr(stderr);
        if let Some(cwd) = cwd {
            cmd.current_dir(cwd);
        }
        let mut held = lock(leaders);
        let spawned = cmd.spawn();
        // The agent's copies of the slave go now: the master sees the end once the program's
        // session lets go of the terminal.
        drop(cmd);
        drop(slave);
        let child = spawned.map_err(|e| spawn_failed(&e))?;
        let pid = i32::try_from(child.id()).unwrap_or(0);
        // Reaped by the agent's reaper, never through `child`.
        drop(child);
        let now = Instant::now();
        let term = Arc::new(Terminal {
            id: req.term_id.clone(),
            pid,
            argv,
            started: now,
            idle_timeout: (req.idle_timeout_ms > 0)
                .then(|| Duration::from_millis(req.idle_timeout_ms)),
            master,
            state: Mutex::new(State {
                ring: Ring::new(usize::try_from(req.scrollback_bytes).unwrap_or(usize::MAX)),
                rows: req.rows,
                cols: req.cols,
                input_bytes: 0,
                last_activity: now,
                attached: 0,
                detached_at: now,
                eof: false,
                status: None,
                ending: None,
                swept: None,
                exit: None,
                ended_at: None,
            }),
            changed: Condvar::new(),
        });
        held.insert(pid, term.clone());
        drop(held);
        table.insert(req.term_id, term.clone());
        drop(table);
        let t = term.clone();
        spawn_thread(move || pump(&t));
        let (t, terms) = (term.clone(), self.clone());
        spawn_thread(move || terms.supervise(&t));
        Ok(term)
    }

    /// A terminal, running or ended.
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Terminal>> {
        lock(&self.table).get(id).cloned()
    }

    /// Every terminal: the running ones (oldest first), then the ended ones (in the order
    /// they ended).
    pub(crate) fn list(&self) -> Vec<TermInfo> {
        let all: Vec<Arc<Terminal>> = lock(&self.table).values().cloned().collect();
        let mut infos: Vec<(bool, Instant, TermInfo)> = all
            .iter()
            .map(|t| {
                let s = t.lock();
                (
                    s.exit.is_some(),
                    s.ended_at.unwrap_or(t.started),
                    t.info_of(&s),
                )
            })
            .collect();
        infos.sort_by_key(|(ended, at, _)| (*ended, *at));
        infos.into_iter().map(|(_, _, info)| info).collect()
    }

    /// Ends a terminal's program and everything of its session, and waits (bounded) until
    /// it is reported ended. Returns whether it was running.
    pub(crate) fn kill(&self, id: &str) -> bool {
        let Some(term) = self.get(id) else {
            return false;
        };
        let found = term.hang_up(KILLED);
        term.wait_ended(END_WAIT);
        found
    }

    /// Signals every process of every running terminal's session (the agent is leaving).
    pub(crate) fn signal_all(&self, sig: Signal) {
        let sessions = self.sessions();
        if !sessions.is_empty() {
            signal_sessions(&sessions, sig);
        }
    }

    /// The session ids of the running terminals.
    pub(crate) fn sessions(&self) -> HashSet<i32> {
        lock(&self.table)
            .values()
            .filter(|t| t.running())
            .map(|t| t.pid)
            .collect()
    }

    /// Keeps a bounded number of ended terminals: the oldest ended go first.
    fn retire(&self) {
        let mut table = lock(&self.table);
        let mut ended: Vec<(Instant, String)> = table
            .values()
            .filter_map(|t| Some((t.lock().ended_at?, t.id.clone())))
            .collect();
        if ended.len() <= KEEP_ENDED {
            return;
        }
        ended.sort();
        for (_, id) in &ended[..ended.len() - KEEP_ENDED] {
            table.remove(id);
        }
    }

    /// Waits for a terminal to end: its program exited (the reaper says so) and its output
    /// closed or [`EXIT_GRACE`] passed; then kills what is left of its session and records
    /// how it ended. Closes it when it stayed idle too long with nobody attached.
    fn supervise(&self, term: &Terminal) {
        let mut s = term.lock();
        loop {
            let now = Instant::now();
            if let Some((status, at)) = s.status {
                match s.swept {
                    None if s.eof || now >= at + EXIT_GRACE => {
                        drop(s);
                        kill_session(term.pid);
                        s = term.lock();
                        s.swept = Some(Instant::now());
                    }
                    None => s = term.wait_timeout(s, (at + EXIT_GRACE) - now),
                    // What the killed session printed last is read before the end is told.
                    Some(swept) if !s.eof && now < swept + EXIT_GRACE => {
                        s = term.wait_timeout(s, (swept + EXIT_GRACE) - now);
                    }
                    Some(_) => {
                        let (exit_code, signal) = match status {
                            WaitStatus::Exited(_, c) => (i64::from(c), None),
                            WaitStatus::Signaled(_, sig, _) => (128 + sig as i64, Some(sig as i32)),
                            _ => (-1, None),
                        };
                        s.exit = Some(TermExit {
                            exit_code,
                            signal,
                            reason: s.ending.unwrap_or(EXITED).to_owned(),
                        });
                        s.ended_at = Some(Instant::now());
                        drop(s);
                        term.changed.notify_all();
                        self.retire();
                        return;
                    }
                }
                continue;
            }
            let idle = term
                .idle_timeout
                .filter(|_| s.attached == 0 && s.ending.is_none());
            let Some(idle) = idle else {
                // Woken by the reaper, an attach letting go or a kill.
                s = term
                    .changed
                    .wait(s)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            };
            let due = s.last_activity.max(s.detached_at) + idle;
            if now >= due {
                drop(s);
                term.hang_up(IDLE);
                s = term.lock();
                continue;
            }
            s = term.wait_timeout(s, due - now);
        }
    }
}

/// Reads a terminal's output into its ring until no process holds the terminal any more (the
/// master gives EIO) or the terminal ended (a process that left its session may hold it on).
fn pump(term: &Terminal) {
    let mut buf = vec![0u8; CHUNK];
    let mut master = &term.master;
    loop {
        let mut fds = [PollFd::new(master.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(POLL_MS)) {
            Ok(0) => {
                if !term.running() {
                    break;
                }
                continue;
            }
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => break,
        }
        match master.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if !term.push(&buf[..n]) {
                    break;
                }
            }
            Err(e)
                if e.kind() == io::ErrorKind::Interrupted
                    || e.kind() == io::ErrorKind::WouldBlock => {}
            // EIO: the last holder of the slave is gone.
            Err(_) => break,
        }
    }
    term.lock().eof = true;
    term.changed.notify_all();
}

/// Signals every live process whose session is one of `sessions`; returns how many it
/// signalled. Without /proc, each session's first group (the leader's) is signalled.
fn signal_sessions(sessions: &HashSet<i32>, sig: Signal) -> usize {
    // Session 0 is the kernel's and 1 the agent's own when it is PID 1: never a terminal's.
    let sessions: HashSet<i32> = sessions.iter().copied().filter(|&s| s > 1).collect();
    match crate::server::processes() {
        Some(all) => all
            .iter()
            .filter(|p| sessions.contains(&p.session))
            .filter(|p| kill(Pid::from_raw(p.pid), sig).is_ok())
            .count(),
        None => sessions
            .iter()
            .filter(|&&sid| killpg(Pid::from_raw(sid), sig).is_ok())
            .count(),
    }
}

/// Kills every process of a session with SIGKILL until none is left alive (bounded by
/// [`KILL_WAIT`]): processes forked while the signal went out are caught by the next round.
fn kill_session(sid: i32) {
    let sessions = HashSet::from([sid]);
    let deadline = Instant::now() + KILL_WAIT;
    while signal_sessions(&sessions, Signal::SIGKILL) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// An attach: counted in its terminal while it lasts.
struct Attachment<'a>(&'a Terminal);

impl Drop for Attachment<'_> {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.attached = s.attached.saturating_sub(1);
        s.detached_at = Instant::now();
        drop(s);
        self.0.changed.notify_all();
    }
}

/// Serves an attach: [`Msg::TermAttached`], the kept output, the live output, then
/// [`Msg::TermExit`] once the terminal ended. A thread reads the connection meanwhile: input
/// and resizes; its end (the peer closed) ends the attach, not the terminal. A connection
/// that cannot keep up falls behind and skips what the ring no longer holds: it never holds
/// the terminal or another attach.
pub(crate) fn attach(
    term: &Arc<Terminal>,
    conn: UnixStream,
    tracked: &Arc<Tracked>,
) -> Result<(), proto::FrameError> {
    let (info, kept, mut cursor) = {
        let mut s = term.lock();
        s.attached += 1;
        let kept = s.ring.kept();
        (term.info_of(&s), kept, s.ring.end())
    };
    term.changed.notify_all();
    let _attachment = Attachment(term);
    let mut w = &conn;
    w.write_all(&proto::encode_msg(&Msg::TermAttached {
        term: Box::new(info),
        scrollback: kept.len() as u64,
    }))?;
    let gone = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let mut reader = conn.try_clone()?;
    let (t, g, d) = (term.clone(), gone.clone(), done.clone());
    // The reader holds the connection too: a quiesce waits for it to let go.
    let held = tracked.clone();
    spawn_thread(move || {
        let _held = held;
        read_input(&t, &mut reader, &d);
        // Detached: the writer stops waiting for output.
        let s = t.lock();
        g.store(true, Ordering::Relaxed);
        drop(s);
        t.changed.notify_all();
        let _ = reader.shutdown(std::net::Shutdown::Both);
    });
    let result = (|| -> io::Result<()> {
        for chunk in kept.chunks(CHUNK) {
            w.write_all(&proto::encode_output(false, chunk))?;
        }
        drop(kept);
        loop {
            let (bytes, exit) = {
                let mut s = term.lock();
                while s.ring.end() == cursor && s.exit.is_none() && !gone.load(Ordering::Relaxed) {
                    s = term
                        .changed
                        .wait(s)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                if gone.load(Ordering::Relaxed) {
                    return Ok(());
                }
                let (from, bytes) = s.ring.read(cursor, CHUNK);
                cursor = from + bytes.len() as u64;
                let exit = if cursor == s.ring.end() {
                    s.exit.clone()
                } else {
                    None
                };
                (bytes.to_vec(), exit)
            };
            if !bytes.is_empty() {
                w.write_all(&proto::encode_output(false, &bytes))?;
            }
            if let Some(exit) = exit {
                return w.write_all(&proto::encode_msg(&Msg::TermExit(exit)));
            }
        }
    })();
    done.store(true, Ordering::Relaxed);
    let _ = conn.shutdown(std::net::Shutdown::Both);
    result.map_err(Into::into)
}

/// Reads an attach's connection: input to the terminal, resizes; anything else is ignored.
/// Returns when the peer closed (or sent what is not a frame) or the attach is `done`.
fn read_input(term: &Terminal, conn: &mut UnixStream, done: &AtomicBool) {
    // The peer closed (or shut its side), though frames it sent before may be unread.
    let peer_gone = |conn: &UnixStream| {
        use rustix::event::{PollFd, PollFlags, Timespec};
        let mut fds = [PollFd::new(conn, PollFlags::RDHUP)];
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        rustix::event::poll(&mut fds, Some(&now)).unwrap_or(0) > 0
    };
    while let Ok(Some(frame)) = proto::read_frame(conn) {
        if done.load(Ordering::Relaxed) {
            return;
        }
        match frame {
            Frame::Stdin(bytes) => {
                // A write that fails loses this input, nothing more.
                let give_up = || done.load(Ordering::Relaxed) || peer_gone(conn);
                let _ = term.input(&bytes, &give_up);
            }
            Frame::Msg(Msg::TermResize { rows, cols }) => term.resize(rows, cols),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_keeps_the_newest_bytes_at_their_offsets() {
        let mut r = Ring::new(8);
        assert_eq!((r.start(), r.end()), (0, 0));
        assert_eq!(r.read(0, 100), (0, &b""[..]));
        r.push(b"hello");
        assert_eq!((r.start(), r.end()), (0, 5));
        assert_eq!(r.read(1, 100), (1, &b"ello"[..]));
        assert_eq!(r.read(1, 2), (1, &b"el"[..]));
        r.push(b" world");
        // 11 bytes pushed, 8 kept: "lo world", wrapped inside the buffer.
        assert_eq!((r.start(), r.end()), (3, 11));
        assert_eq!(r.kept(), b"lo world");
        // One piece ends where the buffer wraps; the next read goes on from there.
        assert_eq!(r.read(3, 100), (3, &b"lo wo"[..]));
        assert_eq!(r.read(8, 100), (8, &b"rld"[..]));
        assert_eq!(r.read(9, 1), (9, &b"l"[..]));
        assert_eq!(r.read(11, 100), (11, &b""[..]));
    }

    #[test]
    fn a_reader_that_fell_behind_skips_to_the_oldest_kept_byte() {
        let mut r = Ring::new(4);
        r.push(b"abcdefghij");
        assert_eq!((r.start(), r.end()), (6, 10));
        assert_eq!(r.kept(), b"ghij");
        // A reader at offset 2 lost "cdef": it goes on from "g" (in two pieces, as "ghij"
        // wraps in the buffer).
        assert_eq!(r.read(2, 100), (6, &b"gh"[..]));
        assert_eq!(r.read(8, 100), (8, &b"ij"[..]));
        r.push(b"k");
        assert_eq!(r.read(2, 100), (7, &b"h"[..]));
    }

    #[test]
    fn a_ring_fed_in_small_pieces_matches_the_stream_tail() {
        let stream: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        for cap in [1, 3, 7, 64, 999, 1000, 5000] {
            let mut r = Ring::new(cap);
            for piece in stream.chunks(13) {
                r.push(piece);
            }
            let keep = cap.min(stream.len());
            assert_eq!(r.end(), stream.len() as u64);
            assert_eq!(r.kept(), &stream[stream.len() - keep..], "cap {cap}");
        }
    }

    #[test]
    fn an_empty_ring_counts_bytes_and_keeps_none() {
        let mut r = Ring::new(0);
        r.push(b"abc");
        assert_eq!((r.start(), r.end()), (3, 3));
        assert!(r.kept().is_empty());
        assert_eq!(r.read(0, 10), (3, &b""[..]));
    }
}
