//! Terminals end to end: the built agent binary started as an ordinary child process (not
//! PID 1, no `--user`), driven over its socket as sandboxd would drive it, one request per
//! connection, and used the way a person uses a terminal: type, read, resize, go away, come
//! back. Ports and file watches too, as they are served the same way.
#![cfg(target_os = "linux")]

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use sandbox_agent::proto::{self, Frame, FsEvent, Msg, TermExit, TermInfo, TermRequest};

/// How long one read of the socket may wait; generous, for a slow machine.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a test waits for something it expects on a terminal.
const EXPECT_WITHIN: Duration = Duration::from_secs(15);
const SESSION: &str = "t1";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A running agent; stopped (SIGTERM, then SIGKILL) and its folder removed on drop.
struct Agent {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
}

impl Agent {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "sa-term-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a folder for the socket");
        let socket = dir.join("agent.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_sandbox-agent"))
            .arg("--socket")
            .arg(&socket)
            .arg("--session")
            .arg(SESSION)
            // The agent's own variables reach no program it starts.
            .env("SANDBOX_AGENT_TEST_SECRET", "leaked")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("the agent starts");
        let agent = Self { child, dir, socket };
        let deadline = Instant::now() + EXPECT_WITHIN;
        while UnixStream::connect(&agent.socket).is_err() {
            assert!(Instant::now() < deadline, "the agent never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
        agent
    }

    /// A connection past the handshake.
    fn connect(&self) -> UnixStream {
        let mut conn = UnixStream::connect(&self.socket).expect("connect");
        conn.set_read_timeout(Some(READ_TIMEOUT)).expect("timeout");
        proto::write_msg(
            &mut conn,
            &Msg::Hello {
                protocols: vec![1, 2],
                session: SESSION.into(),
            },
        )
        .expect("hello");
        match read(&mut conn) {
            Some(Frame::Msg(Msg::Welcome {
                protocol, session, ..
            })) => {
                assert_eq!(protocol, 2);
                assert_eq!(session, SESSION);
            }
            other => panic!("expected welcome, got {other:?}"),
        }
        conn
    }

    /// One request, its one answer.
    fn request(&self, msg: &Msg) -> Msg {
        let mut conn = self.connect();
        proto::write_msg(&mut conn, msg).expect("request");
        match read(&mut conn) {
            Some(Frame::Msg(m)) => m,
            other => panic!("expected an answer to {msg:?}, got {other:?}"),
        }
    }

    fn open(&self, req: TermRequest) -> TermInfo {
        match self.request(&Msg::TermOpen(req)) {
            Msg::TermOpened { term } => *term,
            other => panic!("expected term_opened, got {other:?}"),
        }
    }

    fn list(&self) -> Vec<TermInfo> {
        match self.request(&Msg::TermList) {
            Msg::TermListReply { terms } => terms,
            other => panic!("expected term_list_reply, got {other:?}"),
        }
    }

    fn info(&self, id: &str) -> TermInfo {
        self.list()
            .into_iter()
            .find(|t| t.term_id == id)
            .unwrap_or_else(|| panic!("terminal {id} is not listed"))
    }

    fn kill(&self, id: &str) -> bool {
        match self.request(&Msg::TermKill { term_id: id.into() }) {
            Msg::TermKilled { found } => found,
            other => panic!("expected term_killed, got {other:?}"),
        }
    }

    /// Waits until the terminal is listed as ended; how it ended.
    fn ended(&self, id: &str) -> TermExit {
        let deadline = Instant::now() + EXPECT_WITHIN;
        loop {
            let info = self.info(id);
            if let Some(exit) = info.exit {
                assert!(!info.running);
                return exit;
            }
            assert!(Instant::now() < deadline, "terminal {id} never ended");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn attach(&self, id: &str) -> Attached {
        let mut conn = self.connect();
        proto::write_msg(&mut conn, &Msg::TermAttach { term_id: id.into() }).expect("attach");
        match read(&mut conn) {
            Some(Frame::Msg(Msg::TermAttached { term, scrollback })) => {
                assert_eq!(term.term_id, id);
                Attached {
                    conn,
                    out: Vec::new(),
                    scrollback,
                    exit: None,
                }
            }
            other => panic!("expected term_attached, got {other:?}"),
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SIGTERM: the agent ends its terminals before it goes.
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn read(conn: &mut UnixStream) -> Option<Frame> {
    proto::read_frame(conn).expect("a frame (or a clean end) in time")
}

/// An attach connection and what it has read.
struct Attached {
    conn: UnixStream,
    out: Vec<u8>,
    scrollback: u64,
    exit: Option<TermExit>,
}

impl Attached {
    fn send(&mut self, input: &str) {
        self.conn
            .write_all(&proto::encode_input(input.as_bytes()))
            .expect("input");
    }

    fn resize(&mut self, rows: u16, cols: u16) {
        proto::write_msg(&mut self.conn, &Msg::TermResize { rows, cols }).expect("resize");
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.out).into_owned()
    }

    /// Reads one frame; false at the end of the attach.
    fn read_one(&mut self) -> bool {
        match read(&mut self.conn) {
            Some(Frame::Stdout(b)) => {
                self.out.extend(b);
                true
            }
            Some(Frame::Msg(Msg::TermExit(exit))) => {
                self.exit = Some(exit);
                // The exit is the last frame.
                assert!(read(&mut self.conn).is_none(), "a frame after the exit");
                false
            }
            None => false,
            Some(other) => panic!("unexpected {other:?}"),
        }
    }

    /// Reads until the output holds `needle`.
    fn read_until(&mut self, needle: &str) {
        let deadline = Instant::now() + EXPECT_WITHIN;
        while !self.text().contains(needle) {
            assert!(
                Instant::now() < deadline && self.read_one(),
                "never saw {needle:?}; saw {:?}",
                self.text()
            );
        }
    }

    /// Reads to the end of the attach: how the terminal ended.
    fn read_to_exit(&mut self) -> TermExit {
        while self.read_one() {}
        self.exit
            .clone()
            .expect("the attach ended with the terminal's exit")
    }
}

fn shell(id: &str) -> TermRequest {
    TermRequest {
        term_id: id.into(),
        argv: vec!["/bin/sh".into()],
        env: vec![("PS1".into(), "$ ".into())],
        cwd: None,
        rows: 24,
        cols: 80,
        max_terminals: 8,
        idle_timeout_ms: 0,
        scrollback_bytes: 1 << 20,
    }
}

/// Live processes of a session, as pid and command name, from /proc.
fn session_processes(sid: i32) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if let Some((comm, state, session)) = stat(pid)
            && session == sid
            && state != "Z"
        {
            found.push((pid, comm));
        }
    }
    found
}

/// A process's command name, state and session.
fn stat(pid: i32) -> Option<(String, String, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_owned();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some((
        comm,
        fields.first()?.to_string(),
        fields.get(3)?.parse().ok()?,
    ))
}

#[test]
fn a_shell_on_a_terminal_outlives_its_attach() {
    let agent = Agent::start();
    let opened = agent.open(shell("sh"));
    assert!(opened.running);
    assert!(opened.pid > 0);
    assert_eq!(opened.argv, vec!["/bin/sh".to_owned()]);
    assert_eq!((opened.rows, opened.cols), (24, 80));

    let mut a = agent.attach("sh");
    a.send("echo $((6*7))\n");
    a.read_until("42");
    a.resize(33, 101);
    a.send("stty size\n");
    a.read_until("33 101");
    // The quotes keep the echoed command line from matching what it prints.
    a.send("sleep 1; echo fin''ished\n");
    a.read_until("fin''ished");
    drop(a);
    // The detach is the agent's to notice (its reader sees the end of the connection).
    let deadline = Instant::now() + EXPECT_WITHIN;
    while agent.info("sh").attached != 0 {
        assert!(Instant::now() < deadline, "the attach was never let go");
        std::thread::sleep(Duration::from_millis(20));
    }

    std::thread::sleep(Duration::from_millis(1500));
    let mut again = agent.attach("sh");
    assert!(again.scrollback > 0);
    again.read_until("finished\r\n");
    let seen = again.text();
    assert!(
        seen.contains("42"),
        "the scrollback lost the first answer: {seen:?}"
    );
    let info = agent.info("sh");
    assert!(info.running);
    assert_eq!(info.attached, 1);
    assert_eq!((info.rows, info.cols), (33, 101));
    assert!(info.input_bytes > 0 && info.output_bytes > 0);

    again.send("exit 3\n");
    let exit = again.read_to_exit();
    assert_eq!(exit.exit_code, 3);
    assert_eq!(exit.signal, None);
    assert_eq!(exit.reason, "exited");

    let ended = agent.info("sh");
    assert!(!ended.running);
    assert_eq!(ended.exit, Some(exit.clone()));
    // An ended terminal can still be attached: its output, then its exit.
    let mut late = agent.attach("sh");
    assert_eq!(late.read_to_exit(), exit);
    assert!(late.text().contains("finished"));
    // Ended: input and kill find nothing to do.
    assert!(!agent.kill("sh"));
}

#[test]
fn an_empty_argv_is_a_login_shell() {
    let agent = Agent::start();
    let mut req = shell("login");
    req.argv = vec![];
    req.env.push(("GREETING".into(), "hello".into()));
    req.cwd = Some(agent.dir.display().to_string());
    let opened = agent.open(req);
    assert_eq!(opened.argv.last().map(String::as_str), Some("-l"));
    let mut a = agent.attach("login");
    a.send("echo $((6*7)) $TERM ${SANDBOX_AGENT_TEST_SECRET:-unset} $GREETING; pwd\n");
    a.read_until(&format!(
        "42 xterm-256color unset hello\r\n{}",
        agent.dir.display()
    ));
    a.send("exit\n");
    assert_eq!(a.read_to_exit().exit_code, 0);
}

#[test]
fn every_attach_gets_all_output_and_a_kill_ends_the_session() {
    let agent = Agent::start();
    let opened = agent.open(shell("k"));
    let mut a = agent.attach("k");
    let mut b = agent.attach("k");
    assert_eq!(agent.info("k").attached, 2);
    a.send("echo $((6*7))\n");
    a.read_until("42");
    b.read_until("42");
    a.send("sleep 1000\n");
    let deadline = Instant::now() + EXPECT_WITHIN;
    let sleeper = loop {
        if let Some((pid, _)) = session_processes(opened.pid)
            .into_iter()
            .find(|(_, comm)| comm == "sleep")
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "the sleep never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(agent.kill("k"));
    for attach in [&mut a, &mut b] {
        assert_eq!(attach.read_to_exit().reason, "killed");
    }
    assert_eq!(
        agent.info("k").exit.map(|e| e.reason).as_deref(),
        Some("killed")
    );
    assert!(
        stat(sleeper).is_none_or(|(_, state, _)| state == "Z"),
        "the terminal's sleep survived the kill"
    );
    assert!(session_processes(opened.pid).is_empty());
    assert!(!agent.kill("k"));
}

#[test]
fn the_terminal_limit_counts_running_terminals() {
    let agent = Agent::start();
    let sleeper = |id: &str| TermRequest {
        argv: vec!["sleep".into(), "1000".into()],
        max_terminals: 2,
        ..shell(id)
    };
    agent.open(sleeper("a"));
    agent.open(sleeper("b"));
    match agent.request(&Msg::TermOpen(sleeper("c"))) {
        Msg::Error { code, message } => {
            assert_eq!(code, "terminal_limit");
            assert!(message.contains('2'), "{message}");
        }
        other => panic!("expected terminal_limit, got {other:?}"),
    }
    match agent.request(&Msg::TermOpen(TermRequest {
        max_terminals: 8,
        ..sleeper("a")
    })) {
        Msg::Error { code, .. } => assert_eq!(code, "terminal_exists"),
        other => panic!("expected terminal_exists, got {other:?}"),
    }
    assert!(agent.kill("a"));
    assert!(agent.open(sleeper("c")).running);
    let listed: Vec<(String, bool)> = agent
        .list()
        .into_iter()
        .map(|t| (t.term_id, t.running))
        .collect();
    // Running ones first, then the ended one.
    assert_eq!(listed.last(), Some(&("a".to_owned(), false)));
    assert_eq!(listed.len(), 3);
}

#[test]
fn an_idle_terminal_closes_only_when_nobody_is_attached() {
    let agent = Agent::start();
    agent.open(TermRequest {
        idle_timeout_ms: 300,
        ..shell("watched")
    });
    let a = agent.attach("watched");
    std::thread::sleep(Duration::from_millis(1000));
    assert!(agent.info("watched").running, "closed while attached");
    drop(a);
    let since = Instant::now();
    assert_eq!(agent.ended("watched").reason, "idle");
    assert!(since.elapsed() < Duration::from_secs(5));

    let since = Instant::now();
    agent.open(TermRequest {
        idle_timeout_ms: 300,
        ..shell("alone")
    });
    assert_eq!(agent.ended("alone").reason, "idle");
    assert!(since.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_terminal_printing_without_end_keeps_only_its_scrollback() {
    let agent = Agent::start();
    agent.open(TermRequest {
        argv: vec!["yes".into()],
        scrollback_bytes: 64 * 1024,
        ..shell("yes")
    });
    let deadline = Instant::now() + EXPECT_WITHIN;
    while agent.info("yes").output_bytes <= 256 * 1024 {
        assert!(Instant::now() < deadline, "yes printed too little");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Still answering promptly while it prints.
    let asked = Instant::now();
    let info = agent.info("yes");
    assert!(asked.elapsed() < Duration::from_secs(2));
    assert!(info.running);
    let mut a = agent.attach("yes");
    assert!(
        a.scrollback > 0 && a.scrollback <= 64 * 1024,
        "{}",
        a.scrollback
    );
    a.read_until("y\r\ny\r\n");
    // A slow attach (this one reads nothing more) holds neither the program nor the agent.
    let before = agent.info("yes").output_bytes;
    std::thread::sleep(Duration::from_millis(500));
    assert!(agent.info("yes").output_bytes > before + 64 * 1024);
    assert!(agent.kill("yes"));
    drop(a);
}

#[test]
fn unknown_and_unstartable_terminals_are_refused() {
    let agent = Agent::start();
    match agent.request(&Msg::TermAttach {
        term_id: "nope".into(),
    }) {
        Msg::Error { code, .. } => assert_eq!(code, "no_such_terminal"),
        other => panic!("expected no_such_terminal, got {other:?}"),
    }
    assert!(!agent.kill("nope"));
    for req in [
        TermRequest {
            argv: vec!["/no/such/program".into()],
            ..shell("bad")
        },
        TermRequest {
            cwd: Some("/no/such/folder".into()),
            ..shell("bad")
        },
    ] {
        match agent.request(&Msg::TermOpen(req)) {
            Msg::Error { code, message } => {
                assert_eq!(code, "spawn_failed", "{message}");
            }
            other => panic!("expected spawn_failed, got {other:?}"),
        }
    }
    assert!(agent.list().is_empty());

    // A program that passes for one but cannot be executed: the trampoline says so on the
    // terminal and exits 127.
    let script = agent.dir.join("broken");
    std::fs::write(&script, "#!/no/such/interpreter\n").expect("a script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("executable");
    agent.open(TermRequest {
        argv: vec![script.display().to_string()],
        ..shell("broken")
    });
    let mut a = agent.attach("broken");
    let exit = a.read_to_exit();
    assert_eq!((exit.exit_code, exit.reason.as_str()), (127, "exited"));
    assert!(
        a.text().contains("sandbox-agent: cannot start"),
        "{:?}",
        a.text()
    );
}

/// Ports: the agent connects to the sandbox's loopback and the connection carries the bytes
/// both ways, each side's end passed on; a port nothing answers on is refused in words.
#[test]
fn a_port_connection_carries_bytes_both_ways_and_a_closed_port_is_refused() {
    use std::io::Read as _;
    use std::net::{Shutdown, TcpListener};

    let agent = Agent::start();
    let listener = TcpListener::bind("127.0.0.1:0").expect("a listener");
    let port = listener.local_addr().expect("its address").port();
    // An upper-casing echo that answers once the request ended (a half-close).
    let server = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().expect("accepted");
        let mut got = Vec::new();
        c.read_to_end(&mut got).expect("the request");
        c.write_all(&got.to_ascii_uppercase()).expect("the answer");
    });
    let mut conn = agent.connect();
    proto::write_msg(&mut conn, &Msg::PortConnect { port }).expect("connect");
    match read(&mut conn) {
        Some(Frame::Msg(Msg::PortConnected)) => {}
        other => panic!("expected port_connected, got {other:?}"),
    }
    conn.write_all(b"hello through the agent").expect("write");
    conn.shutdown(Shutdown::Write).expect("half-close");
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).expect("the answer");
    assert_eq!(answer, b"HELLO THROUGH THE AGENT");
    server.join().expect("the server");

    let closed = TcpListener::bind("127.0.0.1:0").expect("a port");
    let unused = closed.local_addr().expect("its address").port();
    drop(closed);
    match agent.request(&Msg::PortConnect { port: unused }) {
        Msg::Error { code, message } => {
            assert_eq!(code, "port_closed");
            assert!(
                message.starts_with(&format!(
                    "nothing in the sandbox answers on port {unused} ("
                )),
                "{message}"
            );
        }
        other => panic!("expected port_closed, got {other:?}"),
    }
}

/// A watch connection past its `watching`, and how many folders it watches.
fn watch(agent: &Agent, root: &Path, recursive: bool, max_watches: u32) -> (UnixStream, u32) {
    let mut conn = agent.connect();
    proto::write_msg(
        &mut conn,
        &Msg::Watch {
            path: root.display().to_string(),
            recursive,
            max_watches,
        },
    )
    .expect("watch");
    match read(&mut conn) {
        Some(Frame::Msg(Msg::Watching { watched })) => (conn, watched),
        other => panic!("expected watching, got {other:?}"),
    }
}

/// Reads a watch's events until one is `kind` of `path`; every event read, in order.
fn events_until(conn: &mut UnixStream, kind: &str, path: &str) -> Vec<FsEvent> {
    let deadline = Instant::now() + EXPECT_WITHIN;
    let mut seen = Vec::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "never saw {kind} {path}; saw {seen:?}"
        );
        match read(conn) {
            Some(Frame::Msg(Msg::FsEvents { events })) => {
                assert!(!events.is_empty(), "an empty frame of events");
                let done = events.iter().any(|e| e.kind == kind && e.path == path);
                seen.extend(events);
                if done {
                    return seen;
                }
            }
            other => panic!("expected fs_events, got {other:?} after {seen:?}"),
        }
    }
}

/// The events that are not `modified` (the kernel may give those more often than once), as
/// kind, path, where to and whether a folder.
fn changes(events: &[FsEvent]) -> Vec<(String, String, Option<String>, bool)> {
    events
        .iter()
        .filter(|e| e.kind != "modified")
        .map(|e| (e.kind.clone(), e.path.clone(), e.to.clone(), e.dir))
        .collect()
}

/// An expected change.
fn change(
    kind: &str,
    path: &str,
    to: Option<&str>,
    dir: bool,
) -> (String, String, Option<String>, bool) {
    (kind.into(), path.into(), to.map(Into::into), dir)
}

/// Asserts that every `modified` among `events` is of a file among `paths`.
fn only_modified(events: &[FsEvent], paths: &[&str]) {
    for e in events.iter().filter(|e| e.kind == "modified") {
        assert!(
            paths.contains(&e.path.as_str()) && !e.dir && e.to.is_none(),
            "unexpected {e:?}"
        );
    }
}

/// The inotify instances a process holds, from /proc; `None` when they cannot be read (the
/// agent is not dumpable: only root reads its descriptors).
fn inotify_fds(pid: u32) -> Option<usize> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    let mut n = 0;
    for fd in fds.flatten() {
        if std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:inotify") {
            n += 1;
        }
    }
    Some(n)
}

/// A folder for a watch in the agent's temporary folder.
fn folder(agent: &Agent, name: &str) -> PathBuf {
    let root = agent.dir.join(name);
    std::fs::create_dir_all(&root).expect("a folder to watch");
    root
}

/// File watch: a recursive watch reports creations, writes, renames and deletions in order,
/// with paths relative to its root, in folders made, moved in or renamed later too; a
/// folder moved out is no longer reported.
#[test]
fn a_recursive_watch_reports_changes_in_order() {
    use std::fs;

    let agent = Agent::start();
    let root = folder(&agent, "w");
    let (mut conn, watched) = watch(&agent, &root, true, 100);
    assert_eq!(watched, 1);

    fs::write(root.join("a.txt"), "one").expect("a file");
    let seen = events_until(&mut conn, "created", "a.txt");
    assert_eq!(
        changes(&seen),
        vec![change("created", "a.txt", None, false)]
    );
    only_modified(&seen, &["a.txt"]);

    fs::OpenOptions::new()
        .append(true)
        .open(root.join("a.txt"))
        .and_then(|mut f| f.write_all(b"two"))
        .expect("a write");
    let seen = events_until(&mut conn, "modified", "a.txt");
    assert_eq!(changes(&seen), vec![]);

    fs::rename(root.join("a.txt"), root.join("b.txt")).expect("a rename");
    fs::remove_file(root.join("b.txt")).expect("a delete");
    fs::create_dir(root.join("sub")).expect("a subfolder");
    fs::write(root.join("sub/c.txt"), "three").expect("a file in it");
    let seen = events_until(&mut conn, "created", "sub/c.txt");
    assert_eq!(
        changes(&seen),
        vec![
            change("renamed", "a.txt", Some("b.txt"), false),
            change("deleted", "b.txt", None, false),
            change("created", "sub", None, true),
            change("created", "sub/c.txt", None, false),
        ]
    );
    only_modified(&seen, &["a.txt", "sub/c.txt"]);

    // A folder renamed: what happens in it has its new path.
    fs::rename(root.join("sub"), root.join("moved")).expect("a folder renamed");
    fs::write(root.join("moved/d.txt"), "four").expect("a file in it");
    let seen = events_until(&mut conn, "created", "moved/d.txt");
    assert_eq!(
        changes(&seen),
        vec![
            change("renamed", "sub", Some("moved"), true),
            change("created", "moved/d.txt", None, false),
        ]
    );
    only_modified(&seen, &["sub/c.txt", "moved/d.txt"]);

    // A folder moved in with things inside: reported, and watched.
    let outside = agent.dir.join("outside");
    fs::create_dir_all(outside.join("inner")).expect("a folder outside");
    fs::write(outside.join("inner/e.txt"), "five").expect("a file outside");
    fs::rename(&outside, root.join("in")).expect("moved in");
    let seen = events_until(&mut conn, "created", "in/inner/e.txt");
    assert_eq!(
        changes(&seen),
        vec![
            change("created", "in", None, true),
            change("created", "in/inner", None, true),
            change("created", "in/inner/e.txt", None, false),
        ]
    );
    fs::write(root.join("in/inner/f.txt"), "six").expect("a file in it");
    let seen = events_until(&mut conn, "created", "in/inner/f.txt");
    assert_eq!(
        changes(&seen),
        vec![change("created", "in/inner/f.txt", None, false)]
    );

    // A folder moved out: deleted, and what happens in it afterwards is not reported.
    fs::rename(root.join("moved"), &outside).expect("moved out");
    let seen = events_until(&mut conn, "deleted", "moved");
    assert_eq!(changes(&seen), vec![change("deleted", "moved", None, true)]);
    fs::write(outside.join("g.txt"), "seven").expect("a file outside");
    fs::write(root.join("end"), "").expect("a marker");
    let seen = events_until(&mut conn, "created", "end");
    assert_eq!(changes(&seen), vec![change("created", "end", None, false)]);
    only_modified(&seen, &["in/inner/f.txt", "end"]);

    // The watched folder itself removed: the last event, and the watch ends.
    fs::remove_dir_all(&root).expect("the root removed");
    let seen = events_until(&mut conn, "deleted", "");
    assert_eq!(seen.last().map(|e| e.dir), Some(true));
    assert!(read(&mut conn).is_none(), "a frame after the root went");
}

/// File watch: a watch that is not recursive reports its folder's entries, not theirs.
#[test]
fn a_flat_watch_does_not_see_into_subfolders() {
    let agent = Agent::start();
    let root = folder(&agent, "flat");
    std::fs::create_dir(root.join("old")).expect("a subfolder");
    let (mut conn, watched) = watch(&agent, &root, false, 100);
    assert_eq!(watched, 1);
    std::fs::write(root.join("old/x.txt"), "").expect("a file in the old one");
    std::fs::create_dir(root.join("sub")).expect("a new subfolder");
    std::fs::write(root.join("sub/c.txt"), "").expect("a file in it");
    std::fs::write(root.join("d.txt"), "").expect("a marker");
    let seen = events_until(&mut conn, "created", "d.txt");
    assert_eq!(
        changes(&seen),
        vec![
            change("created", "sub", None, true),
            change("created", "d.txt", None, false),
        ]
    );
    only_modified(&seen, &["d.txt"]);
}

/// File watch: beyond `max_watches` folders, one `limit` event; the watched ones still report.
#[test]
fn a_watch_watches_at_most_max_watches_folders() {
    let agent = Agent::start();
    let root = folder(&agent, "ten");
    for i in 0..9 {
        std::fs::create_dir(root.join(format!("d{i}"))).expect("a subfolder");
    }
    let (mut conn, watched) = watch(&agent, &root, true, 3);
    assert_eq!(watched, 3);
    for i in 0..9 {
        std::fs::write(root.join(format!("d{i}/f")), "").expect("a file");
    }
    // Made after the bound was reached: reported, not watched, no second `limit`.
    std::fs::create_dir(root.join("late")).expect("a late folder");
    std::fs::write(root.join("late/f"), "").expect("a file in it");
    std::fs::write(root.join("end"), "").expect("a marker");
    let seen = events_until(&mut conn, "created", "end");
    let limits: Vec<&FsEvent> = seen.iter().filter(|e| e.kind == "limit").collect();
    assert_eq!(limits.len(), 1, "{seen:?}");
    assert!(
        limits[0].dir && limits[0].path.starts_with('d'),
        "{limits:?}"
    );
    let files: Vec<&str> = seen
        .iter()
        .filter(|e| e.kind == "created" && e.path.ends_with("/f"))
        .map(|e| e.path.as_str())
        .collect();
    assert_eq!(files.len(), 2, "{seen:?}");
    assert!(files.iter().all(|f| f.starts_with('d')), "{files:?}");
    assert!(
        seen.iter()
            .any(|e| e.kind == "created" && e.path == "late" && e.dir)
    );
    // The watched ones go on reporting.
    let watched_file = files[0].to_owned();
    std::fs::write(root.join(&watched_file), "again").expect("a write");
    let seen = events_until(&mut conn, "modified", &watched_file);
    assert!(seen.iter().all(|e| e.kind != "limit"));
}

/// File watch: what is not a folder is refused, and so is a watch below protocol 2.
#[test]
fn a_watch_of_no_folder_is_refused() {
    let agent = Agent::start();
    let file = agent.dir.join("file");
    std::fs::write(&file, "").expect("a file");
    let link = agent.dir.join("link");
    std::os::unix::fs::symlink(&agent.dir, &link).expect("a link to a folder");
    for (path, words) in [
        (file.display().to_string(), "is not a folder"),
        (link.display().to_string(), "is not a folder"),
        (agent.dir.join("none").display().to_string(), "no folder"),
        ("relative".to_owned(), "not an absolute path"),
    ] {
        match agent.request(&Msg::Watch {
            path: path.clone(),
            recursive: true,
            max_watches: 10,
        }) {
            Msg::Error { code, message } => {
                assert_eq!(code, "bad_request", "{message}");
                assert!(message.contains(words), "{path}: {message}");
            }
            other => panic!("expected bad_request for {path}, got {other:?}"),
        }
    }

    let mut conn = UnixStream::connect(&agent.socket).expect("connect");
    conn.set_read_timeout(Some(READ_TIMEOUT)).expect("timeout");
    proto::write_msg(
        &mut conn,
        &Msg::Hello {
            protocols: vec![1],
            session: SESSION.into(),
        },
    )
    .expect("hello");
    assert!(matches!(
        read(&mut conn),
        Some(Frame::Msg(Msg::Welcome { protocol: 1, .. }))
    ));
    proto::write_msg(
        &mut conn,
        &Msg::Watch {
            path: agent.dir.display().to_string(),
            recursive: false,
            max_watches: 10,
        },
    )
    .expect("watch");
    match read(&mut conn) {
        Some(Frame::Msg(Msg::Error { code, message })) => {
            assert_eq!(code, "bad_request");
            assert!(message.contains("protocol 2"), "{message}");
        }
        other => panic!("expected bad_request, got {other:?}"),
    }
}

/// File watch: closing the connection ends the watch and lets its inotify instance go; the
/// agent serves the next one.
#[test]
fn closing_a_watch_ends_it() {
    let agent = Agent::start();
    let root = folder(&agent, "closed");
    let pid = agent.child.id();
    let before = inotify_fds(pid);
    let (mut conn, _) = watch(&agent, &root, true, 10);
    if let Some(before) = before {
        assert_eq!(inotify_fds(pid), Some(before + 1));
    } else {
        eprintln!("the agent's descriptors cannot be read (not root): not counted");
    }
    std::fs::write(root.join("one"), "").expect("a file");
    events_until(&mut conn, "created", "one");
    drop(conn);
    if let Some(before) = before {
        let deadline = Instant::now() + EXPECT_WITHIN;
        while inotify_fds(pid) != Some(before) {
            assert!(
                Instant::now() < deadline,
                "the inotify instance outlived its watch"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let (mut again, watched) = watch(&agent, &root, true, 10);
    assert_eq!(watched, 1);
    std::fs::write(root.join("two"), "").expect("a file");
    let seen = events_until(&mut again, "created", "two");
    assert_eq!(changes(&seen), vec![change("created", "two", None, false)]);
}

/// File watch: a watch of a large tree is bounded, and the agent answers other requests
/// promptly while it watches and a program makes thousands of files.
#[test]
fn a_watch_of_a_large_tree_is_bounded() {
    let agent = Agent::start();
    let root = folder(&agent, "large");
    for i in 0..40 {
        for j in 0..50 {
            std::fs::create_dir_all(root.join(format!("a{i}/b{j}"))).expect("a folder");
        }
    }
    let started = Instant::now();
    let (mut conn, watched) = watch(&agent, &root, true, 100);
    assert_eq!(watched, 100);
    assert!(started.elapsed() < Duration::from_secs(5));
    let writer = {
        let root = root.clone();
        std::thread::spawn(move || {
            for i in 0..40 {
                for j in 0..50 {
                    std::fs::write(root.join(format!("a{i}/b{j}/f")), "x").expect("a file");
                }
                std::fs::write(root.join(format!("f{i}")), "x").expect("a file");
            }
        })
    };
    for _ in 0..5 {
        let asked = Instant::now();
        assert!(matches!(
            agent.request(&Msg::TermList),
            Msg::TermListReply { .. }
        ));
        assert!(asked.elapsed() < Duration::from_secs(2));
    }
    writer.join().expect("the writer");
    std::fs::write(root.join("end"), "").expect("a marker");
    let seen = events_until(&mut conn, "created", "end");
    assert_eq!(seen.iter().filter(|e| e.kind == "limit").count(), 1);
    assert!(seen.iter().any(|e| e.kind == "created" && e.path == "f39"));
    // Only watched folders report: the root and 99 below it.
    let reporting: std::collections::HashSet<&str> = seen
        .iter()
        .filter(|e| e.kind == "created" && !e.dir)
        .map(|e| e.path.rsplit_once('/').map_or("", |(folder, _)| folder))
        .collect();
    assert!(
        reporting.len() <= 100,
        "{} folders reported",
        reporting.len()
    );
}

/// File watch: a peer that does not read while the tree changes fast makes the kernel drop
/// events: one `overflow` says so, and the watch goes on, its subfolders watched again.
#[test]
fn a_watch_that_falls_behind_reports_an_overflow_and_goes_on() {
    let agent = Agent::start();
    let root = folder(&agent, "flood");
    std::fs::create_dir(root.join("sub")).expect("a subfolder");
    let (mut conn, watched) = watch(&agent, &root, true, 10);
    assert_eq!(watched, 2);
    // Nothing is read meanwhile: events of long names fill the connection, so the agent waits
    // to write; then writes to two files by turns (the kernel merges only repeats of its last
    // event) fill the kernel's queue (16,384 events by default).
    let long = "n".repeat(200);
    for i in 0..2000 {
        std::fs::File::create(root.join(format!("{long}{i}"))).expect("a file");
    }
    let open = |name: &str| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(root.join(name))
            .expect("a file to write")
    };
    let (mut a, mut b) = (open("a"), open("b"));
    for _ in 0..20_000 {
        a.write_all(b"a").expect("a write");
        b.write_all(b"b").expect("a write");
    }
    let seen = events_until(&mut conn, "overflow", "");
    assert!(seen.len() < 40_000, "{} events", seen.len());
    // What came after the overflow is reported again, below the root too.
    std::fs::write(root.join("sub/after"), "").expect("a file below");
    let seen = events_until(&mut conn, "created", "sub/after");
    assert!(seen.iter().all(|e| e.kind != "limit"), "{seen:?}");
}
