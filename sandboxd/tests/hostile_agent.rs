//! A hostile sandbox against its agent's socket, on the real dockerd. Each test is the attack:
//! the sandbox writing to, replacing or shadowing the socket in its run folder; the socket or the
//! folder swapped for a symlink to a decoy listener the test owns; a fake agent answering with
//! forged exit codes, runs and CPU time; and a sandbox trying to make the idle figures lie. The
//! run folder is root's alone, sandboxd connects without following a swap and trusts only the
//! container's PID 1, and the idle figures come from the container's cgroup and sandboxd's own
//! run table.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Backend, Daemon, container_of, counter, docker, metrics, until};
use sandbox_agent::proto::{self, Msg, RunExit};
use sandboxd_api::client::{Client, ClientError};

async fn session(d: &Daemon, name: &str) -> Client {
    let opened = d
        .admin()
        .open(name, "org-hostile", None, None)
        .await
        .expect("open");
    d.client(&opened.token.expect("a token on create"))
}

fn run_dir(d: &Daemon, session: &str) -> PathBuf {
    d.workspace_root().join(session).join("agent")
}

/// A listening socket the test owns: counts the connections it gets and every byte sent on
/// them, and answers each with `reply` (a fake agent's forged frames) without reading first.
struct Listener {
    connections: Arc<AtomicUsize>,
    received: Arc<Mutex<Vec<u8>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Listener {
    fn bind(path: &Path, reply: Vec<u8>) -> Self {
        let listener = UnixListener::bind(path).expect("bind the test's listener");
        listener.set_nonblocking(true).expect("nonblocking");
        let connections = Arc::new(AtomicUsize::new(0));
        let received = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, r, s) = (connections.clone(), received.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        c.fetch_add(1, Ordering::Relaxed);
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.write_all(&reply);
                        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                        let mut buf = Vec::new();
                        let _ = conn.read_to_end(&mut buf);
                        r.lock().expect("lock").extend(buf);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(_) => return,
                }
            }
        });
        Self {
            connections,
            received,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops accepting; returns (connections, bytes received).
    fn finish(mut self) -> (usize, Vec<u8>) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("the listener thread");
        }
        let received = self.received.lock().expect("lock").clone();
        (self.connections.load(Ordering::Relaxed), received)
    }
}

#[tokio::test]
async fn the_sandbox_cannot_write_see_replace_or_reach_its_agent_socket() {
    let d = Daemon::start_on(Backend::Agent, &[]);
    let s = session(&d, "walls").await;
    // Every attack from inside, each with its exit status (0 would be a hole).
    let attacks = s
        .run(
            "walls",
            concat!(
                "test -e /run/sandboxd/agent.sock; echo see=$?; ",
                "touch /run/sandboxd/x 2>/dev/null; echo write=$?; ",
                "rm -f /run/sandboxd/agent.sock 2>/dev/null; echo remove=$?; ",
                "ln -sf /tmp/decoy.sock /run/sandboxd/agent.sock 2>/dev/null; echo symlink=$?; ",
                "perl -MIO::Socket::UNIX -e 'IO::Socket::UNIX->new(Type => SOCK_STREAM(), Local => \"/run/sandboxd/agent.sock\", Listen => 1) or exit 1' 2>/dev/null; echo bind=$?; ",
                "perl -MIO::Socket::UNIX -e 'IO::Socket::UNIX->new(Type => SOCK_STREAM(), Peer => \"/run/sandboxd/agent.sock\") or do { print \"connect=$!\\n\"; exit 1 }'; ",
                "mv /run/sandboxd /run/elsewhere 2>/dev/null; echo move=$?",
            ),
            Some(30),
            None,
            None,
        )
        .await
        .expect("run");
    assert_eq!(
        attacks.stdout,
        "see=1\nwrite=1\nremove=1\nsymlink=1\nbind=1\nconnect=Permission denied\nmove=1\n",
        "{attacks:?}"
    );
    // On the host: the folder is root's alone, the socket root's and a socket.
    let dir = std::fs::symlink_metadata(run_dir(&d, "walls")).expect("the run folder");
    assert!(dir.is_dir());
    assert_eq!((dir.uid(), dir.gid(), dir.mode() & 0o7777), (0, 0, 0o700));
    let sock =
        std::fs::symlink_metadata(run_dir(&d, "walls").join("agent.sock")).expect("the socket");
    assert!(sock.file_type().is_socket());
    assert_eq!((sock.uid(), sock.mode() & 0o777), (0, 0o600));
    // The agent bound it as root, then dropped for good: PID 1 is the sandbox uid with no
    // capability and no way back (nor are runs anything else).
    let pid1 = s
        .run(
            "walls",
            "grep -E '^(Uid|Gid|CapEff|CapPrm|CapBnd):' /proc/1/status; id -u",
            None,
            None,
            None,
        )
        .await
        .expect("run");
    assert_eq!(
        pid1.stdout,
        "Uid:\t10001\t10001\t10001\t10001\nGid:\t10001\t10001\t10001\t10001\n\
         CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\n10001\n",
        "{pid1:?}"
    );
    // And all of it went through the agent, trusted.
    let m = metrics(&d).await;
    assert_eq!(
        counter(&m, "sandboxd_run_paths_total{path=\"agent\"}"),
        2,
        "{m}"
    );
    assert_eq!(counter(&m, "sandboxd_agent_untrusted_total"), 0, "{m}");
}

#[tokio::test]
async fn a_swapped_socket_or_folder_never_redirects_sandboxd() {
    let d = Daemon::start_on(Backend::Agent, &[]);
    let s = session(&d, "swap").await;
    let dir = run_dir(&d, "swap");
    let real = dir.join("agent.sock");
    let aside = dir.join("agent.sock.real");
    // A decoy listening socket on the host, in a folder the test owns.
    let decoy_dir = tempfile::tempdir().expect("tempdir");
    let decoy_sock = decoy_dir.path().join("agent.sock");
    let decoy = Listener::bind(&decoy_sock, Vec::new());
    let run = |tag: &'static str| {
        let s = s.clone();
        async move {
            s.run("swap", &format!("echo {tag}; exit 3"), None, None, None)
                .await
                .expect("never a failed run")
        }
    };

    // 1. The socket is a symlink to the decoy.
    std::fs::rename(&real, &aside).expect("set the socket aside");
    std::os::unix::fs::symlink(&decoy_sock, &real).expect("symlink");
    let r = run("socket-swapped").await;
    assert_eq!((r.exit_code, r.stdout.as_str()), (3, "socket-swapped\n"));
    std::fs::remove_file(&real).expect("remove the symlink");
    std::fs::rename(&aside, &real).expect("put the socket back");

    // 2. The folder is a symlink to the decoy's folder.
    let dir_aside = dir.with_file_name("agent.real");
    std::fs::rename(&dir, &dir_aside).expect("set the folder aside");
    std::os::unix::fs::symlink(decoy_dir.path(), &dir).expect("symlink");
    let r = run("folder-swapped").await;
    assert_eq!((r.exit_code, r.stdout.as_str()), (3, "folder-swapped\n"));
    std::fs::remove_file(&dir).expect("remove the symlink");
    std::fs::rename(&dir_aside, &dir).expect("put the folder back");

    // 3. The folder is writable by the sandbox uid (as an older sandboxd left it).
    std::os::unix::fs::chown(&dir, Some(10001), Some(10001)).expect("chown");
    let r = run("folder-writable").await;
    assert_eq!((r.exit_code, r.stdout.as_str()), (3, "folder-writable\n"));
    std::os::unix::fs::chown(&dir, Some(0), Some(0)).expect("chown back");

    // Each went to Docker exec; the decoy never got a connection; the agent is used again.
    let r = run("agent-again").await;
    assert_eq!((r.exit_code, r.stdout.as_str()), (3, "agent-again\n"));
    let (connections, received) = decoy.finish();
    assert_eq!(
        (connections, received.len()),
        (0, 0),
        "the decoy was reached"
    );
    let m = metrics(&d).await;
    assert_eq!(counter(&m, "sandboxd_agent_untrusted_total"), 3, "{m}");
    assert_eq!(
        counter(&m, "sandboxd_run_paths_total{path=\"exec_fallback\"}"),
        3,
        "{m}"
    );
    assert_eq!(
        counter(&m, "sandboxd_run_paths_total{path=\"agent\"}"),
        1,
        "{m}"
    );
}

#[tokio::test]
async fn a_fake_agent_is_never_trusted() {
    let d = Daemon::start_on(Backend::Agent, &[]);
    let s = session(&d, "fake").await;
    let dir = run_dir(&d, "fake");
    let real = dir.join("agent.sock");
    std::fs::rename(&real, dir.join("agent.sock.real")).expect("set the socket aside");
    // An impostor where the agent's socket was: a listener made by another process (as root,
    // even), answering every connection at once with forged frames: a welcome for this session,
    // a run that "succeeded", a huge CPU time and runs that do not exist.
    let mut forged = proto::encode_msg(&Msg::Welcome {
        protocol: proto::PROTOCOL,
        version: proto::VERSION.to_owned(),
        session: "fake".to_owned(),
    });
    forged.extend(proto::encode_msg(&Msg::Exit(RunExit {
        exit_code: 0,
        signal: None,
        timed_out: false,
        stopped: false,
        truncated: false,
        cpu_ns: 1,
        duration_ms: 1,
    })));
    forged.extend(proto::encode_msg(&Msg::StatsReply {
        cpu_ns: 1 << 60,
        running: vec!["ghost-1".into(), "ghost-2".into()],
    }));
    let fake = Listener::bind(&real, forged);

    // The run is the real one (Docker exec), not the forged success.
    let r = s
        .run("fake", "echo real; exit 7", None, None, None)
        .await
        .expect("never a failed run");
    assert_eq!((r.exit_code, r.stdout.as_str()), (7, "real\n"), "{r:?}");
    // Neither a run's status nor a stop is taken from it.
    match s.run_status("fake", "ghost-1").await {
        Err(ClientError::Api { status: 404, .. }) => {}
        other => panic!("a ghost run's status: {other:?}"),
    }
    match s.stop_run("fake", "ghost-2").await {
        Err(ClientError::Api { status: 404, .. }) => {}
        other => panic!("a ghost run's stop: {other:?}"),
    }
    // Nor the idle figures.
    let view = s.get("fake").await.expect("get");
    assert_eq!(view.runs_in_flight, 0, "{view:?}");
    assert!(view.cpu_ns.is_some_and(|n| n < 1 << 50), "{view:?}");
    // It was connected to and refused before a byte was written to it.
    let (connections, received) = fake.finish();
    assert!(connections >= 1, "sandboxd never looked");
    assert_eq!(
        received,
        Vec::<u8>::new(),
        "sandboxd wrote to the fake agent"
    );
    let m = metrics(&d).await;
    assert!(counter(&m, "sandboxd_agent_untrusted_total") >= 3, "{m}");
    assert_eq!(
        counter(&m, "sandboxd_run_paths_total{path=\"agent\"}"),
        0,
        "{m}"
    );
    assert_eq!(
        d.admin().index().await.expect("sandboxd healthy").service,
        "sandboxd"
    );
}

/// CPU time of a container's cgroup in nanoseconds, read on the host (cgroup v1 `cpuacct`,
/// else v2 `cpu.stat`).
fn cgroup_cpu_ns(container: &str) -> u64 {
    let pid = docker(&["inspect", "-f", "{{.State.Pid}}", container]);
    let cgroups =
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("the agent's cgroups");
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
        let (Some(controllers), Some(path)) = (controllers, path) else {
            continue;
        };
        if controllers.split(',').any(|c| c == "cpuacct") {
            for mount in ["cpuacct", "cpu,cpuacct", "cpuacct,cpu"] {
                let file = format!("/sys/fs/cgroup/{mount}{path}/cpuacct.usage");
                if let Ok(v) = std::fs::read_to_string(&file) {
                    return v.trim().parse().expect("cpuacct.usage");
                }
            }
        }
        if controllers.is_empty() {
            let file = format!("/sys/fs/cgroup{path}/cpu.stat");
            if let Ok(stat) = std::fs::read_to_string(&file) {
                let usec: u64 = stat
                    .lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .and_then(|v| v.trim().parse().ok())
                    .expect("usage_usec");
                return usec * 1000;
            }
        }
    }
    panic!("no CPU accounting cgroup for {container}: {cgroups}");
}

#[tokio::test]
async fn idle_figures_come_from_the_cgroup_and_sandboxd_s_own_runs() {
    let d = Daemon::start_on(Backend::Agent, &[]);
    let s = session(&d, "idle").await;
    let container = container_of(&d, "idle");
    // A burner that outlives its run, and tries to reach the agent to start runs of its own.
    let r = s
        .run(
            "idle",
            concat!(
                "nohup sh -c 'while :; do :; done' >/dev/null 2>&1 & ",
                "perl -MIO::Socket::UNIX -e 'IO::Socket::UNIX->new(Type => SOCK_STREAM(), Peer => \"/run/sandboxd/agent.sock\") or do { print \"$!\\n\"; exit 1 }'"
            ),
            None,
            None,
            None,
        )
        .await
        .expect("run");
    assert_eq!((r.exit_code, r.stdout.as_str()), (1, "Permission denied\n"));
    // The CPU time is the cgroup's: between two readings of it, and it grows while the burner
    // runs though no run is in flight.
    let before = cgroup_cpu_ns(&container);
    let first = s.get("idle").await.expect("get");
    let after = cgroup_cpu_ns(&container);
    let cpu = first.cpu_ns.expect("cpu of a running session");
    assert!(
        before <= cpu && cpu <= after,
        "{before} <= {cpu} <= {after}"
    );
    assert_eq!(first.runs_in_flight, 0, "{first:?}");
    let later = until("half a CPU second more", Duration::from_secs(20), || {
        let s = s.clone();
        async move {
            let v = s.get("idle").await.ok()?;
            (v.cpu_ns? > cpu + 500_000_000).then_some(v)
        }
    })
    .await;
    assert_eq!(later.runs_in_flight, 0, "{later:?}");
    // A run in flight is one, as sandboxd itself counts it.
    let long = {
        let s = s.clone();
        tokio::spawn(async move { s.run("idle", "sleep 2", None, None, Some("one")).await })
    };
    until("the run in flight", Duration::from_secs(10), || {
        let s = s.clone();
        async move { (s.get("idle").await.ok()?.runs_in_flight == 1).then_some(()) }
    })
    .await;
    let done = long.await.expect("join").expect("run");
    assert_eq!(done.exit_code, 0);
    assert_eq!(s.get("idle").await.expect("get").runs_in_flight, 0);
}
