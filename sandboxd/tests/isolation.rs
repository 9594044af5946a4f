//! Inside a session, against the real dockerd: the sandbox is the unprivileged, capped,
//! network-less container the project promises, and abuse leaves sandboxd healthy.

mod common;

use common::{Backend, Daemon};

async fn open(d: &Daemon, name: &str) -> sandboxd_api::client::Client {
    let opened = d
        .admin()
        .open(name, "org-iso", None, None)
        .await
        .expect("open");
    d.client(opened.token.as_deref().expect("a token on create"))
}

async fn sandbox_is_unprivileged_capped_and_offline(backend: Backend) {
    let d = Daemon::start_on(backend, &[]);
    let s = open(&d, "iso-1").await;
    let run = |cmd: &'static str| {
        let s = s.clone();
        async move {
            s.run("iso-1", cmd, Some(30), None, None)
                .await
                .expect("run")
        }
    };
    let id = run("id -u; id -g").await;
    assert_eq!((id.exit_code, id.stdout.as_str()), (0, "10001\n10001\n"));
    let sock = run("test -e /var/run/docker.sock").await;
    assert_eq!(sock.exit_code, 1, "the docker socket must not be there");
    let status = run("grep -E '^(NoNewPrivs|CapEff|CapPrm|CapBnd):' /proc/self/status").await;
    assert!(
        status.stdout.contains("NoNewPrivs:\t1"),
        "{}",
        status.stdout
    );
    assert!(
        status.stdout.contains("CapEff:\t0000000000000000"),
        "{}",
        status.stdout
    );
    assert!(
        status.stdout.contains("CapBnd:\t0000000000000000"),
        "{}",
        status.stdout
    );
    let net = run("ls /sys/class/net").await;
    assert_eq!(net.stdout, "lo\n", "only the loopback interface");
    let tmp = run("grep ' /tmp ' /proc/mounts").await;
    assert!(
        tmp.stdout.starts_with("tmpfs /tmp tmpfs") && tmp.stdout.contains("size=65536k"),
        "{}",
        tmp.stdout
    );
    let cwd = run("pwd; touch here && stat -c %u here").await;
    assert_eq!(cwd.stdout, "/workspace\n10001\n");
    let sh = run("echo {a,b}").await;
    assert_eq!(
        sh.stdout, "{a,b}\n",
        "commands run under POSIX sh, not bash"
    );
    let pids =
        run("cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max").await;
    assert_eq!(pids.stdout.trim(), "512");
}

async fn fork_bomb_and_memory_hog_are_contained(backend: Backend) {
    let d = Daemon::start_on(backend, &[]);
    // The bomb runs in a session with the default memory, so what stops it is the pids limit
    // (512), not the OOM killer; the hog gets a session of its own with 64 MiB.
    let bomb_session = d
        .admin()
        .open("iso-bomb", "org-iso", None, None)
        .await
        .expect("open");
    let s = d.client(bomb_session.token.as_deref().expect("token"));
    // The bomb fills the pids limit while the shell spins on builtins until the timeout, which
    // kills the whole process group. The shell forks once, before the bomb starts: a fork of
    // its own refused by the full pids limit would end it early ("Cannot fork", exit 2).
    let bomb = s
        .run(
            "iso-bomb",
            "(f() { f | f & }; f) & while :; do :; done",
            Some(5),
            None,
            None,
        )
        .await
        .expect("the bomb run returns");
    assert!(bomb.timed_out || bomb.exit_code == 137, "{bomb:?}");
    let pids = s
        .run(
            "iso-bomb",
            "cat /sys/fs/cgroup/pids.current 2>/dev/null || cat /sys/fs/cgroup/pids/pids.current",
            Some(30),
            None,
            None,
        )
        .await
        .expect("run");
    let current: u32 = pids.stdout.trim().parse().unwrap_or(u32::MAX);
    assert!(current < 16, "the bomb left {current} processes: {pids:?}");
    let after = s
        .run("iso-bomb", "echo alive", Some(30), None, None)
        .await
        .expect("the session still runs commands");
    assert_eq!(after.stdout, "alive\n");

    let hog_session = d
        .admin()
        .open(
            "iso-hog",
            "org-iso",
            None,
            Some(&sandboxd_api::Limits {
                mem_limit: Some("64m".into()),
                ..Default::default()
            }),
        )
        .await
        .expect("open");
    let h = d.client(hog_session.token.as_deref().expect("token"));
    let hog = h
        .run(
            "iso-hog",
            "sh -c 'x=$(head -c 300m /dev/zero | tr \"\\\\0\" a); echo held' ; echo rc=$?",
            Some(60),
            None,
            None,
        )
        .await
        .expect("hog run");
    assert!(
        hog.stdout.contains("rc=137") || hog.exit_code == 137,
        "the hog must be OOM-killed: {hog:?}"
    );
    let after = h
        .run("iso-hog", "echo alive", Some(30), None, None)
        .await
        .expect("the session still runs commands");
    assert_eq!(after.stdout, "alive\n");
    assert_eq!(
        d.admin().index().await.expect("sandboxd healthy").service,
        "sandboxd"
    );
}

on_both_backends! {
    #[tokio::test]
    sandbox_is_unprivileged_capped_and_offline,
    #[tokio::test]
    fork_bomb_and_memory_hog_are_contained,
}
