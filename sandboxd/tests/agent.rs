//! The resident agent against the real dockerd: it is PID 1 of every sandbox and carries the
//! runs; stop and timeout leave nothing behind (seen from /proc inside and from the host); a
//! flood leaves it healthy; a sandbox at its process limit frees what finished runs left; a
//! busybox-only image works; a `kill -9` of sandboxd mid-run leaves runs finished or stoppable;
//! a dead agent is reported and its container started again; a container without the agent is
//! served by Docker exec, never a failed run.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Backend, Daemon, container_of, counter, docker, metrics, until};
use sandboxd_api::client::Client;
use sandboxd_api::error::ErrorCode;

async fn token(d: &Daemon, name: &str) -> String {
    let opened = d
        .admin()
        .open(name, "org-agent", None, None)
        .await
        .expect("open");
    opened.token.expect("a token on create")
}

async fn session(d: &Daemon, name: &str, _runtime: Option<&str>) -> Client {
    d.client(&token(d, name).await)
}

/// The command lines of every process of a container, as the host sees them.
fn host_processes(container: &str) -> Vec<String> {
    docker(&["top", container, "-eo", "pid,args"])
        .lines()
        .skip(1)
        .filter_map(|l| {
            l.trim()
                .split_once(' ')
                .map(|(_, args)| args.trim().to_owned())
        })
        .collect()
}

#[tokio::test]
async fn the_agent_is_pid_1_carries_runs_reaps_and_reports_cpu() {
    let d = Daemon::start_on(Backend::Agent, &[]);
    let s = session(&d, "pid1", None).await;
    let init = s
        .run("pid1", "tr '\\0' ' ' < /proc/1/cmdline", None, None, None)
        .await
        .expect("run");
    assert!(
        init.stdout
            .starts_with("/opt/sandboxd/sandbox-agent --session pid1"),
        "{init:?}"
    );
    // The agent folder is read-only; the socket folder is not the workspace.
    let ro = s
        .run(
            "pid1",
            "touch /opt/sandboxd/x 2>/dev/null; echo $?; ls /workspace",
            None,
            None,
            None,
        )
        .await
        .expect("run");
    assert_eq!(ro.stdout, "1\n");
    // Orphans are reaped: a grandchild whose parent exits is adopted by PID 1.
    let orphans = s
        .run(
            "pid1",
            "sh -c 'sleep 0.2 &' ; sleep 0.6; grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l",
            None,
            None,
            None,
        )
        .await
        .expect("run");
    assert_eq!(orphans.stdout.trim(), "0", "zombies left: {orphans:?}");
    // CPU time per run and per session.
    let busy = s
        .run(
            "pid1",
            "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done",
            None,
            None,
            None,
        )
        .await
        .expect("run");
    assert!(busy.cpu_ns.is_some_and(|n| n > 10_000_000), "{busy:?}");
    let view = s.get("pid1").await.expect("get");
    assert!(
        view.cpu_ns.is_some_and(|n| n >= busy.cpu_ns.unwrap_or(0)),
        "{view:?}"
    );
    let m = metrics(&d).await;
    assert!(
        counter(&m, "sandboxd_run_paths_total{path=\"agent\"}") >= 4,
        "{m}"
    );
    assert_eq!(
        counter(&m, "sandboxd_run_paths_total{path=\"exec_fallback\"}"),
        0,
        "{m}"
    );
    // The agent forwards SIGTERM and exits: a stop takes far less than Docker's 5 s grace.
    let container = container_of(&d, "pid1");
    let asked = Instant::now();
    s.stop("pid1").await.expect("stop");
    assert!(
        asked.elapsed() < Duration::from_secs(4),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(
        docker(&["inspect", "-f", "{{.State.ExitCode}}", &container]),
        "0"
    );
    let woke = s
        .run("pid1", "echo woke", None, None, None)
        .await
        .expect("wake");
    assert_eq!(woke.stdout, "woke\n");
}

async fn busybox_only_image_works(backend: Backend) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../hack/busybox-image.sh");
    let out = Command::new(script)
        .output()
        .expect("hack/busybox-image.sh");
    assert!(
        out.status.success(),
        "hack/busybox-image.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let image = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let runtimes = format!("busybox={image}");
    let d = Daemon::start_on(backend, &[("SANDBOXD_RUNTIMES", &runtimes)]);
    let s = session(&d, "bb", None).await;
    let r = s
        .run(
            "bb",
            "id -u; pwd; echo hi > f && cat f; test -e /lib/x86_64-linux-gnu/libc.so.6 || echo no-libc",
            Some(30),
            None,
            None,
        )
        .await
        .expect("run in a busybox-only image");
    assert_eq!(
        (r.exit_code, r.stdout.as_str()),
        (0, "10001\n/workspace\nhi\nno-libc\n"),
        "{r:?}"
    );
    let slow = s
        .run("bb", "sleep 30 & sleep 31", Some(1), None, None)
        .await
        .expect("run");
    assert!(slow.timed_out && slow.exit_code == 124, "{slow:?}");
    let left = s
        .run(
            "bb",
            "ps -o args | grep -c '^sleep 3[01]' || true",
            None,
            None,
            None,
        )
        .await
        .expect("run");
    assert_eq!(left.stdout.trim(), "0", "{left:?}");
}

on_both_backends! {
    #[tokio::test]
    busybox_only_image_works,
}

#[tokio::test]
async fn stop_and_timeout_kill_the_tree_fast_and_leave_nothing() {
    let d = Daemon::start_on(Backend::Agent, &[]);
    let tree_token = token(&d, "tree").await;
    let s = d.client(&tree_token);
    let container = container_of(&d, "tree");
    let mut stop_ms = Vec::new();
    for i in 0..5 {
        let run_id = format!("tree-{i}");
        let mut resp = reqwest::Client::new()
            .post(format!("{}/v1/sessions/tree/runs?stream=true", d.base))
            .bearer_auth(&tree_token)
            .json(&serde_json::json!({
                "command": "sh -c 'sleep 100 & sleep 101' & sleep 102 & echo ready; wait",
                "run_id": run_id,
            }))
            .send()
            .await
            .expect("a streamed run");
        // Once "ready" is out, every process of the tree has been started.
        let mut seen = String::new();
        while !seen.contains("ready") {
            let chunk = tokio::time::timeout(Duration::from_secs(20), resp.chunk())
                .await
                .expect("ready in time")
                .expect("the stream")
                .expect("a chunk before the end");
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
        let asked = Instant::now();
        s.stop_run("tree", &run_id).await.expect("stop");
        while let Some(chunk) = resp.chunk().await.expect("the stream") {
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
        stop_ms.push(asked.elapsed().as_secs_f64() * 1000.0);
        let last: serde_json::Value =
            serde_json::from_str(seen.lines().last().expect("an outcome line")).expect("json");
        assert_eq!(
            (
                last["type"].as_str(),
                last["stopped"].as_bool(),
                last["exit_code"].as_i64()
            ),
            (Some("exit"), Some(true), Some(137)),
            "{seen}"
        );
    }
    stop_ms.sort_by(f64::total_cmp);
    // Stop request to outcome, through HTTP: the median is well inside 100 ms.
    assert!(stop_ms[2] < 100.0, "stops took {stop_ms:?} ms");
    let started = Instant::now();
    let timed = s
        .run(
            "tree",
            "sh -c 'sleep 100 & sleep 101' & sleep 102",
            Some(1),
            None,
            None,
        )
        .await
        .expect("run");
    assert!(timed.timed_out && timed.exit_code == 124, "{timed:?}");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "the timeout took {:?}",
        started.elapsed()
    );
    // Nothing left: from /proc inside, and from the host.
    let inside = s
        .run(
            "tree",
            "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'sleep 10[012]' || true",
            None,
            None,
            None,
        )
        .await
        .expect("run");
    assert_eq!(inside.stdout.trim(), "0");
    let host = host_processes(&container);
    assert_eq!(
        host.len(),
        1,
        "only the agent may be left in the container: {host:?}"
    );
    assert!(host[0].contains("sandbox-agent"), "{host:?}");
}

#[tokio::test]
async fn an_output_flood_and_a_fork_bomb_leave_the_agent_healthy() {
    let d = Daemon::start_on(Backend::Agent, &[("SANDBOXD_MAX_OUTPUT_BYTES", "65536")]);
    let s = session(&d, "flood", None).await;
    let container = container_of(&d, "flood");
    let started_at = docker(&["inspect", "-f", "{{.State.StartedAt}}", &container]);
    let flood = s
        .run(
            "flood",
            "yes flood & yes flood >&2 & wait",
            Some(2),
            None,
            None,
        )
        .await
        .expect("the flood returns");
    assert!(flood.timed_out && flood.truncated, "{:?}", flood.exit_code);
    assert_eq!((flood.stdout.len(), flood.stderr.len()), (65536, 65536));
    let bomb = s
        .run(
            "flood",
            "f() { f | f & }; f; while :; do :; done",
            Some(3),
            None,
            None,
        )
        .await
        .expect("the bomb returns");
    // It runs until its timeout, is killed, or its own shell finds no process left to fork
    // (the pids limit, which is the point); whichever, the agent serves on.
    assert!(
        bomb.timed_out || bomb.exit_code == 137 || bomb.stderr.contains("Cannot fork"),
        "{bomb:?}"
    );
    let after = s
        .run("flood", "echo alive", Some(30), None, None)
        .await
        .expect("the agent still serves runs");
    assert_eq!(after.stdout, "alive\n");
    assert_eq!(
        docker(&["inspect", "-f", "{{.State.StartedAt}}", &container]),
        started_at,
        "the container (and its agent) never restarted"
    );
    assert_eq!(
        counter(&metrics(&d).await, "sandboxd_agent_deaths_total"),
        0
    );
    assert_eq!(
        d.admin().index().await.expect("sandboxd healthy").service,
        "sandboxd"
    );
}

/// A Perl program that forks children named `child` (each sleeps) while it can: for ever, or,
/// with `then`, until forks have failed for a while, and then sleeps itself as `then`.
fn grab(child: &str, then: Option<&str>) -> String {
    let (keep_going, after) = match then {
        None => ("1", String::new()),
        Some(name) => ("$failed < 200", format!(" $0 = \"{name}\"; sleep 1000;")),
    };
    format!(
        "my $failed = 0; while ({keep_going}) {{ my $p = fork; if (!defined $p) {{ $failed++; \
         select(undef, undef, undef, 0.005); next }} if ($p == 0) {{ $0 = \"{child}\"; \
         sleep 1000; exit }} }}{after}"
    )
}

/// A finished run whose background jobs hold every process the sandbox may have (what a fork
/// bomb whose own shell gave up leaves behind) does not lock the sandbox: the next run kills
/// them and starts, and a run still running keeps its processes. When running runs hold every
/// process, a run is refused with words that say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_at_its_process_limit_frees_what_finished_runs_left_and_says_when_it_cannot() {
    let d = Daemon::start_on(Backend::Agent, &[("SANDBOXD_PIDS_LIMIT", "48")]);
    let s = session(&d, "full", None).await;
    let container = container_of(&d, "full");
    let keeper = {
        let s = s.clone();
        tokio::spawn(async move {
            s.run("full", "exec sleep 1001", Some(120), None, Some("keeper"))
                .await
        })
    };
    until("the keeper runs", Duration::from_secs(20), || {
        let started = host_processes(&container).iter().any(|p| p == "sleep 1001");
        async move { started.then_some(()) }
    })
    .await;
    // A background job that takes every process there is, and any that comes free, as a fork
    // bomb does; the run itself ends at once.
    let filler = s
        .run(
            "full",
            &format!(
                "perl -e '{}' >/dev/null 2>&1 & exit 0",
                grab("filled", None)
            ),
            Some(30),
            None,
            None,
        )
        .await
        .expect("the filler returns");
    assert_eq!(filler.exit_code, 0, "{filler:?}");
    until(
        "the filler holds the sandbox",
        Duration::from_secs(30),
        || {
            let held = host_processes(&container)
                .iter()
                .filter(|p| *p == "filled")
                .count();
            async move { (held > 30).then_some(()) }
        },
    )
    .await;
    let after = s
        .run("full", "echo alive", Some(30), None, None)
        .await
        .expect("a run starts in a sandbox a finished run's jobs filled");
    assert_eq!(after.stdout, "alive\n");
    let ps = host_processes(&container);
    assert!(
        !ps.iter().any(|p| p == "filled" || p.starts_with("perl")),
        "the finished run's jobs are gone: {ps:?}"
    );
    let kept = s.run_status("full", "keeper").await.expect("keeper status");
    assert!(kept.running, "the running run was left alone: {kept:?}");
    // Now a running run holds every process: nothing may be taken from it.
    let holder = {
        let s = s.clone();
        tokio::spawn(async move {
            s.run(
                "full",
                &format!("exec perl -e '{}'", grab("held", Some("holder"))),
                Some(120),
                None,
                Some("holder"),
            )
            .await
        })
    };
    until(
        "the holder fills the sandbox",
        Duration::from_secs(30),
        || {
            let ps = host_processes(&container);
            let full =
                ps.iter().any(|p| p == "holder") && ps.iter().filter(|p| *p == "held").count() > 30;
            async move { full.then_some(()) }
        },
    )
    .await;
    match s.run("full", "echo crowded", Some(30), None, None).await {
        // Refused at once, whether the agent found a thread for the connection or not.
        Err(sandboxd_api::client::ClientError::Api {
            status: 429,
            code: ErrorCode::ProcessLimit,
            message,
        }) => assert!(
            message.starts_with(
                "the run could not start: cannot start /bin/sh: the sandbox is at its limit of \
                 48 processes"
            ) && message.ends_with("and its running runs hold them all; stop one to make room"),
            "{message}"
        ),
        other => panic!("a run in a sandbox its running runs fill: {other:?}"),
    }
    for id in ["holder", "keeper"] {
        s.stop_run("full", id).await.expect("stop");
    }
    let holder = holder.await.expect("join").expect("the holder returns");
    assert!(holder.stopped && holder.exit_code == 137, "{holder:?}");
    let keeper = keeper.await.expect("join").expect("the keeper returns");
    assert!(keeper.stopped && keeper.exit_code == 137, "{keeper:?}");
    let again = s
        .run("full", "echo room", Some(30), None, None)
        .await
        .expect("stopping the holder made room");
    assert_eq!(again.stdout, "room\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_sandboxd_mid_run_leaves_runs_finished_or_stoppable() {
    let mut d = Daemon::start_on(Backend::Agent, &[]);
    let token = token(&d, "crash").await;
    let s = d.client(&token);
    for (id, cmd) in [
        ("short", "sleep 3; echo fin"),
        ("long", "sleep 30 & sleep 31; echo never"),
    ] {
        let s = s.clone();
        tokio::spawn(async move {
            let _ = s.run("crash", cmd, Some(120), None, Some(id)).await;
        });
    }
    until("both runs in flight", Duration::from_secs(20), || {
        let s = s.clone();
        async move { (s.get("crash").await.ok()?.runs_in_flight == 2).then_some(()) }
    })
    .await;
    // sandboxd counts a run from its request on: wait until the agent has started both.
    let container = container_of(&d, "crash");
    until(
        "both runs started in the sandbox",
        Duration::from_secs(20),
        || {
            let ps = host_processes(&container);
            let started = ps.iter().any(|p| p == "sleep 3") && ps.iter().any(|p| p == "sleep 31");
            async move { started.then_some(()) }
        },
    )
    .await;
    d.process.kill9();
    d.spawn();
    let s = d.client(&token);
    // The restarted sandboxd knows both runs from the agent; its runs in flight (for the
    // idle rule) are only its own, never what the sandbox reports.
    let long = s.run_status("crash", "long").await.expect("status of long");
    assert!(long.running, "{long:?}");
    assert_eq!(s.get("crash").await.expect("get").runs_in_flight, 0);
    let short = until("the short run finished", Duration::from_secs(20), || {
        let s = s.clone();
        async move {
            let st = s.run_status("crash", "short").await.ok()?;
            (!st.running).then_some(st)
        }
    })
    .await;
    assert_eq!((short.exit_code, short.stdout.as_str()), (Some(0), "fin\n"));
    s.stop_run("crash", "long")
        .await
        .expect("stop after restart");
    let long = until("the long run stopped", Duration::from_secs(10), || {
        let s = s.clone();
        async move {
            let st = s.run_status("crash", "long").await.ok()?;
            (!st.running).then_some(st)
        }
    })
    .await;
    assert!(long.stopped && long.exit_code == Some(137), "{long:?}");
    let left = s
        .run(
            "crash",
            "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'sleep 3[01]' || true",
            None,
            None,
            None,
        )
        .await
        .expect("run");
    assert_eq!(left.stdout.trim(), "0");
}

#[tokio::test]
async fn a_dead_agent_is_reported_and_its_container_started_again() {
    let d = Daemon::start_on(Backend::Agent, &[]);
    let s = session(&d, "dead", None).await;
    s.write("dead", "kept.txt", "still here")
        .await
        .expect("write");
    let container = container_of(&d, "dead");
    let pid = docker(&["inspect", "-f", "{{.State.Pid}}", &container]);
    common::process::signal(pid.parse().expect("a pid"), "KILL").expect("kill -KILL");
    until(
        "the container stopped with its agent",
        Duration::from_secs(10),
        || {
            let c = container.clone();
            async move {
                (docker(&["inspect", "-f", "{{.State.Running}}", &c]) == "false").then_some(())
            }
        },
    )
    .await;
    // Never a failed run: the container is started again, files intact.
    let back = s
        .run("dead", "cat kept.txt", None, None, None)
        .await
        .expect("the run after the agent died");
    assert_eq!(back.stdout, "still here");
    assert_eq!(
        docker(&["inspect", "-f", "{{.State.Running}}", &container]),
        "true"
    );
    assert_eq!(
        counter(&metrics(&d).await, "sandboxd_agent_deaths_total"),
        1
    );
}

#[tokio::test]
async fn containers_without_the_agent_fall_back_to_exec_and_the_agent_is_reinstalled() {
    // A session made by a sandboxd on the exec path (as by one that predates the agent).
    let mut d = Daemon::start_on(Backend::Exec, &[]);
    let old_token = token(&d, "old").await;
    d.process.kill9();
    d.env.retain(|(k, _)| k != "SANDBOXD_RUN_BACKEND");
    d.env.push(("SANDBOXD_RUN_BACKEND".into(), "agent".into()));
    // What an older sandboxd left in the agent folder is replaced at start.
    let installed = d
        .workspace_root()
        .join(".sandboxd-agent")
        .join("sandbox-agent");
    std::fs::create_dir_all(installed.parent().expect("parent")).expect("mkdir");
    std::fs::write(&installed, b"an older agent").expect("write");
    d.spawn();
    assert_eq!(
        std::fs::read(&installed).expect("the agent"),
        sandboxd::run::agent::BINARY
    );
    let old = d.client(&old_token);
    let r = old
        .run(
            "old",
            "echo still; tr '\\0' ' ' < /proc/1/cmdline",
            None,
            None,
            None,
        )
        .await
        .expect("never a failed run");
    assert!(r.stdout.starts_with("still\n"), "{r:?}");
    assert!(!r.stdout.contains("sandbox-agent"), "{r:?}");
    let fresh = session(&d, "fresh", None).await;
    let r = fresh
        .run("fresh", "tr '\\0' ' ' < /proc/1/cmdline", None, None, None)
        .await
        .expect("run");
    assert!(r.stdout.contains("sandbox-agent"), "{r:?}");
    let m = metrics(&d).await;
    assert_eq!(
        counter(&m, "sandboxd_run_paths_total{path=\"exec_fallback\"}"),
        1,
        "{m}"
    );
    assert_eq!(
        counter(&m, "sandboxd_run_paths_total{path=\"agent\"}"),
        1,
        "{m}"
    );
}
