//! Isolation per runtime, against the real dockerd that `make up` gives gVisor's runsc: a
//! runtime with `isolation: gvisor` runs its sandboxes on gVisor's own kernel, as the same
//! unprivileged, capped, network-less container with the resident agent; a host whose dockerd
//! lacks runsc says so and refuses such a runtime with the reason.

mod common;

use common::{Daemon, base_image};
use sandboxd_api::client::{Client, ClientError};
use sandboxd_api::session::{MemoryOp, SessionView};

/// `base` on runc (the default) and `secure` on gVisor, the same image.
fn runtimes() -> String {
    let image = base_image();
    format!(
        r#"[{{"alias": "base", "image": "{image}"}}, {{"alias": "secure", "image": "{image}", "isolation": "gvisor"}}]"#
    )
}

async fn open(d: &Daemon, name: &str, runtime: &str) -> Client {
    let opened = d
        .admin()
        .open(name, "org-iso", Some(runtime), None)
        .await
        .unwrap_or_else(|e| panic!("open {name} on {runtime}: {e}"));
    d.client(opened.token.as_deref().expect("a token on create"))
}

async fn sh(c: &Client, session: &str, command: &str) -> (i64, String) {
    let out = c
        .run(session, command, Some(30), None, None)
        .await
        .unwrap_or_else(|e| panic!("run {command}: {e}"));
    (out.exit_code, out.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gvisor_runtime_runs_on_gvisors_kernel_and_is_the_same_sandbox_otherwise() {
    let runtimes = runtimes();
    let d = Daemon::start(&[("SANDBOXD_RUNTIMES", runtimes.as_str())]);
    let list = d.admin().runtimes().await.expect("runtimes");
    let offered: Vec<&str> = list.isolation.iter().map(|i| i.as_str()).collect();
    assert_eq!(
        offered,
        ["runc", "gvisor"],
        "the project's dockerd has runsc (make up)"
    );
    let secure = list
        .runtimes
        .iter()
        .find(|r| r.alias == "secure")
        .expect("secure is listed");
    assert_eq!(secure.isolation.as_str(), "gvisor");

    let g = open(&d, "g-1", "secure").await;
    let r = open(&d, "r-1", "base").await;
    // gVisor's kernel, not the node's.
    let (code, dmesg) = sh(&g, "g-1", "dmesg 2>&1 | head -n 3").await;
    assert_eq!(code, 0, "{dmesg}");
    assert!(dmesg.contains("gVisor"), "gVisor's kernel log: {dmesg}");
    // uname -r is gVisor's own release, not the node's kernel.
    let node_release = std::process::Command::new("uname")
        .arg("-r")
        .output()
        .expect("uname runs");
    let node_release = String::from_utf8_lossy(&node_release.stdout).into_owned();
    let (code, release) = sh(&g, "g-1", "uname -r").await;
    assert_eq!(code, 0, "{release}");
    assert_ne!(release, node_release, "gVisor's release, not the node's");
    assert_eq!(
        sh(&r, "r-1", "uname -r").await,
        (0, node_release),
        "runc shows the node's kernel"
    );
    let (_, node_dmesg) = sh(&r, "r-1", "dmesg 2>&1 | head -n 3").await;
    assert!(
        !node_dmesg.contains("gVisor"),
        "runc is the node's kernel: {node_dmesg}"
    );
    let container = common::container_of(&d, "g-1");
    let runtime = common::docker(&["inspect", "-f", "{{.HostConfig.Runtime}}", &container]);
    assert_eq!(runtime.trim(), "runsc");

    // The same sandbox otherwise: uid 10001, no capabilities, no network, the workspace.
    assert_eq!(
        sh(&g, "g-1", "id -u; id -g").await,
        (0, "10001\n10001\n".into())
    );
    let (_, caps) = sh(&g, "g-1", "grep -E '^CapEff:' /proc/self/status").await;
    assert_eq!(caps.trim(), "CapEff:\t0000000000000000");
    let (_, links) = sh(&g, "g-1", "cat /proc/net/dev").await;
    assert!(
        links.contains("lo:") && !links.contains("eth0"),
        "only the loopback interface: {links}"
    );
    assert_eq!(sh(&g, "g-1", "pwd").await, (0, "/workspace\n".into()));
    g.write("g-1", "in.txt", b"from the API".to_vec())
        .await
        .expect("a file written");
    assert_eq!(
        sh(&g, "g-1", "cat in.txt && echo made > out.txt").await,
        (0, "from the API".into())
    );
    let out = g.read("g-1", "out.txt", 0, None).await.expect("read");
    assert_eq!(out, b"made\n");
    // A run past its timeout is stopped there, as under runc.
    let timed = g
        .run("g-1", "sleep 30", Some(1), None, None)
        .await
        .expect("a run that times out");
    assert_eq!(timed.exit_code, 124, "{timed:?}");
    // Every run went through the resident agent, trusted: under gVisor its socket is made on
    // the host by the container's gofer.
    let metrics = reqwest::get(format!("{}/metrics", d.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("a body");
    assert!(
        metrics
            .lines()
            .any(|l| l == "sandboxd_agent_untrusted_total 0"),
        "no agent socket was refused: {metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l == "sandboxd_run_paths_total{path=\"exec_fallback\"} 0"),
        "no run fell back to docker exec: {metrics}"
    );
    // Writes to a file not opened for append still land where the next write expects.
    assert_eq!(
        sh(
            &g,
            "g-1",
            "for i in 1 2 3; do echo $i; done > n.txt; cat n.txt"
        )
        .await,
        (0, "1\n2\n3\n".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_without_gvisor_refuses_a_gvisor_runtime_with_the_reason() {
    let runtimes = runtimes();
    let d = Daemon::start(&[
        ("SANDBOXD_RUNTIMES", runtimes.as_str()),
        ("SANDBOXD_GVISOR_RUNTIME", "no-such-runtime"),
    ]);
    let list = d.admin().runtimes().await.expect("runtimes");
    let offered: Vec<&str> = list.isolation.iter().map(|i| i.as_str()).collect();
    assert_eq!(offered, ["runc"]);
    match d.admin().open("g-2", "org-iso", Some("secure"), None).await {
        Err(ClientError::Api {
            status,
            code,
            message,
        }) => {
            assert_eq!(status, 503);
            assert_eq!(code.as_str(), "isolation_unavailable");
            assert_eq!(
                message,
                "Runtime 'secure' has isolation gvisor, and this host's dockerd offers no OCI runtime 'no-such-runtime' (SANDBOXD_GVISOR_RUNTIME): give dockerd the runtime (its \"runtimes\" setting, runsc on the node) or open the session on a host that has it"
            );
        }
        other => panic!("a gvisor open on a host without it: {other:?}"),
    }
    assert!(
        d.containers().is_empty(),
        "no container is left: {:?}",
        d.containers()
    );
    // The runc runtime is served as before.
    let r = open(&d, "r-2", "base").await;
    assert_eq!(sh(&r, "r-2", "echo ok").await, (0, "ok\n".into()));
}

/// The session's note of its last checkpoint or restore: op, kept, outcome, error.
fn memory(v: &SessionView) -> Option<(MemoryOp, bool, String, Option<String>)> {
    v.memory
        .as_ref()
        .map(|n| (n.op, n.kept, n.outcome.clone(), n.error.clone()))
}

/// The value of `sandboxd_checkpoints_total` for `op` and `outcome`.
async fn checkpoints(d: &Daemon, op: &str, outcome: &str) -> u64 {
    let text = common::metrics(d).await;
    let series = format!("sandboxd_checkpoints_total{{op=\"{op}\",outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{series} in\n{text}"))
}

/// Starts a web server and a sleeper in the background and leaves a file in `/tmp` (the
/// container's memory) and one in the workspace; the sleeper's pid.
async fn leave_state(c: &Client, session: &str) -> String {
    let (code, pid) = sh(
        c,
        session,
        "cd /tmp && echo in-memory > /tmp/kept && echo on-disk > /workspace/kept \
         && (nohup python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &) \
         && (nohup sleep 100000 >/dev/null 2>&1 & echo $!)",
    )
    .await;
    assert_eq!(code, 0, "{pid}");
    // The server answers before the sleep.
    let (code, out) = sh(c, session, &answers(30)).await;
    assert_eq!((code, out.as_str()), (0, "200\n"), "the server answers");
    pid.trim().to_owned()
}

/// A command that prints the status of `GET http://127.0.0.1:8000/`, trying for `secs`.
fn answers(secs: u32) -> String {
    format!(
        "python3 -c \"import time, urllib.request as u\nfor _ in range({n}):\n    try:\n        print(u.urlopen('http://127.0.0.1:8000/', timeout=1).status); break\n    except OSError:\n        time.sleep(0.1)\nelse:\n    print('no answer')\"",
        n = secs * 10
    )
}

/// What survived a sleep: the sleeper alive (its pid running `sleep 100000`: a fresh container
/// reuses small pids), the file in `/tmp`, the file in the workspace, the server's answer
/// (tried once).
async fn what_survived(c: &Client, session: &str, pid: &str) -> String {
    let (_, out) = sh(
        c,
        session,
        &format!(
            "[ \"$(tr -d '\\0' < /proc/{pid}/cmdline 2>/dev/null)\" = sleep100000 ] && echo sleeper; cat /tmp/kept 2>/dev/null; cat /workspace/kept; {}",
            answers(1)
        ),
    )
    .await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gvisor_session_sleeps_and_wakes_with_its_memory_and_a_runc_one_does_not() {
    let image = sandboxd_testkit::tools_image();
    let runtimes = format!(
        r#"[{{"alias": "base", "image": "{image}"}}, {{"alias": "secure", "image": "{image}", "isolation": "gvisor"}}]"#
    );
    let d = Daemon::start(&[("SANDBOXD_RUNTIMES", runtimes.as_str())]);
    let admin = d.admin();
    let g = open(&d, "mem-g", "secure").await;
    let r = open(&d, "mem-r", "base").await;

    // gVisor: the sleep is a checkpoint, the wake a restore; the processes and /tmp are kept.
    let pid = leave_state(&g, "mem-g").await;
    let stopped = admin.stop("mem-g").await.expect("sleep");
    assert_eq!(stopped.state, sandboxd_api::session::SessionState::Stopped);
    assert_eq!(
        memory(&stopped),
        Some((
            MemoryOp::Checkpoint,
            true,
            "asleep with its memory".to_owned(),
            None
        )),
        "the session's view says it sleeps with its memory"
    );
    assert_eq!(checkpoints(&d, "checkpoint", "ok").await, 1);
    let container = common::container_of(&d, "mem-g");
    let running = common::docker(&["inspect", "-f", "{{.State.Running}}", &container]);
    assert_eq!(running.trim(), "false", "the container is stopped");
    assert_eq!(
        what_survived(&g, "mem-g", &pid).await,
        "sleeper\nin-memory\non-disk\n200\n",
        "a run wakes it with its processes and memory"
    );
    assert_eq!(checkpoints(&d, "restore", "ok").await, 1);
    assert_eq!(
        memory(&admin.get("mem-g").await.expect("the session")),
        Some((
            MemoryOp::Restore,
            true,
            "awake with its memory".to_owned(),
            None
        ))
    );
    // Again: the second sleep is as good as the first.
    admin.stop("mem-g").await.expect("sleep again");
    assert_eq!(
        what_survived(&g, "mem-g", &pid).await,
        "sleeper\nin-memory\non-disk\n200\n"
    );

    // runc: today's sleep, the processes end and /tmp is empty; the workspace stays.
    let pid = leave_state(&r, "mem-r").await;
    admin.stop("mem-r").await.expect("sleep");
    assert_eq!(
        what_survived(&r, "mem-r", &pid).await,
        "on-disk\nno answer\n"
    );
    assert_eq!(
        checkpoints(&d, "checkpoint", "ok").await,
        2,
        "no checkpoint of runc"
    );
    assert_eq!(memory(&admin.get("mem-r").await.expect("runc")), None);
    let refused = admin.pause("mem-r").await.expect_err("runc is not paused");
    assert_eq!(
        refused.to_string(),
        "pause_refused (409): session 'mem-r' runs on runtime 'base', whose isolation is not gvisor: only a gVisor sandbox is paused with its memory (stop sleeps it without)"
    );

    // A checkpoint corrupted on the node's disk: the restore fails, the session wakes fresh
    // with its files, and says so in the metric.
    let pid = leave_state(&g, "mem-g").await;
    admin.stop("mem-g").await.expect("sleep");
    let root = common::docker(&["info", "-f", "{{.DockerRootDir}}"]);
    let images = std::path::Path::new(root.trim())
        .join("containers")
        .join(&container)
        .join("checkpoints")
        .join("sandboxd-sleep");
    let mut corrupted = 0;
    for entry in std::fs::read_dir(&images).expect("the checkpoint's folder") {
        let path = entry.expect("an entry").path();
        if path.is_file() {
            std::fs::write(&path, b"not a checkpoint").expect("corrupt");
            corrupted += 1;
        }
    }
    assert!(corrupted > 0, "files in {}", images.display());
    assert_eq!(
        what_survived(&g, "mem-g", &pid).await,
        "on-disk\nno answer\n",
        "woken fresh: the files, not the processes"
    );
    assert_eq!(checkpoints(&d, "restore", "failed").await, 1);
    let (op, kept, outcome, error) = memory(&admin.get("mem-g").await.expect("the session"))
        .expect("a note of the failed restore");
    assert_eq!(
        (op, kept, outcome.as_str()),
        (MemoryOp::Restore, false, "awake fresh with its files")
    );
    assert!(
        error
            .as_deref()
            .is_some_and(|e| e.contains("from checkpoint sandboxd-sleep")),
        "the reason: {error:?}"
    );
    let (code, out) = sh(&g, "mem-g", "id -u; dmesg | head -n 1").await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("10001\n"), "{out}");

    // The audit log has each: three checkpoints, two restores and the failed one with why.
    let rows = |op| {
        let admin = d.admin();
        async move {
            admin
                .operations(&sandboxd_api::audit::OperationQuery {
                    session: Some("mem-g".to_owned()),
                    op: Some(op),
                    ..Default::default()
                })
                .await
                .expect("operations")
                .operations
        }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let (checkpointed, restored) = loop {
        let (c, r) = (
            rows(sandboxd_api::audit::Op::Checkpoint).await,
            rows(sandboxd_api::audit::Op::Restore).await,
        );
        if (c.len() >= 3 && r.len() >= 3) || std::time::Instant::now() > deadline {
            break (c, r);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(checkpointed.len(), 3, "{checkpointed:?}");
    assert!(
        checkpointed
            .iter()
            .all(|o| o.ok && o.target == "asleep with its memory"),
        "{checkpointed:?}"
    );
    let mut restored: Vec<(bool, &str, Option<&str>)> = restored
        .iter()
        .map(|o| (o.ok, o.target.as_str(), o.error.as_deref()))
        .collect();
    restored.sort_by_key(|r| r.0);
    assert_eq!(restored.len(), 3, "{restored:?}");
    assert_eq!(&restored[1..], [(true, "awake with its memory", None); 2]);
    assert_eq!(
        (restored[0].0, restored[0].1),
        (false, "awake fresh with its files")
    );
    assert!(
        restored[0]
            .2
            .is_some_and(|e| e.contains("from checkpoint sandboxd-sleep")),
        "the reason: {restored:?}"
    );

    // A container reclaimed while it slept with its memory takes the checkpoint with it: the
    // next wake is fresh, and the session's note says so (never "asleep with its memory").
    leave_state(&g, "mem-g").await;
    admin.stop("mem-g").await.expect("sleep");
    admin.reclaim("mem-g").await.expect("reclaim");
    assert_eq!(
        sh(&g, "mem-g", "cat /tmp/kept 2>&1 || echo gone")
            .await
            .1
            .lines()
            .last(),
        Some("gone")
    );
    assert_eq!(
        memory(&admin.get("mem-g").await.expect("the session")),
        Some((
            MemoryOp::Restore,
            false,
            "awake fresh with its files".to_owned(),
            Some("its container was removed while it slept, and its checkpoint with it".to_owned())
        ))
    );

    // A destroy of a session asleep with its memory removes the checkpoint with the container.
    admin.stop("mem-g").await.expect("sleep");
    let container = common::container_of(&d, "mem-g");
    let folder = std::path::Path::new(root.trim())
        .join("containers")
        .join(&container);
    assert!(
        folder.join("checkpoints").join("sandboxd-sleep").is_dir(),
        "the checkpoint is on the node's disk"
    );
    admin.destroy("mem-g").await.expect("destroy");
    assert!(!folder.exists(), "{} is gone", folder.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_sandboxd_during_a_sleep_with_memory_leaves_a_session_that_wakes() {
    let image = sandboxd_testkit::tools_image();
    let runtimes = format!(r#"[{{"alias": "secure", "image": "{image}", "isolation": "gvisor"}}]"#);
    let mut d = Daemon::start(&[("SANDBOXD_RUNTIMES", runtimes.as_str())]);
    // Killed at once (before or during the agent's quiesce), a little later (between the
    // quiesce and Docker's checkpoint, or during it) and late (the checkpoint done or nearly).
    for (trial, delay_ms) in [0u64, 30, 120, 400].into_iter().enumerate() {
        let name = format!("kill-{trial}");
        let opened = d
            .admin()
            .open(&name, "org-iso", Some("secure"), None)
            .await
            .expect("open");
        let token = opened.token.expect("a token on create");
        let pid = leave_state(&d.client(&token), &name).await;
        let admin = d.admin();
        let session = name.clone();
        let sleeping = tokio::spawn(async move { admin.stop(&session).await });
        tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
        d.process.kill9();
        let _ = sleeping.await;
        d.spawn();
        // The session runs again (sandboxd is on another port now): with its memory when the checkpoint was whole, else fresh
        // (or, the checkpoint never taken, as it was); its files are there either way.
        let g = d.client(&token);
        // A run while Docker still checkpoints the sandbox (it is paused for it) is answered
        // with an error; a moment later the session runs.
        common::until(
            &format!("trial {trial} (kill after {delay_ms} ms): the session runs"),
            std::time::Duration::from_secs(30),
            async || g.run(&name, "true", Some(30), None, None).await,
        )
        .await;
        let out = what_survived(&g, &name, &pid).await;
        assert!(
            out == "sleeper\nin-memory\non-disk\n200\n" || out == "on-disk\nno answer\n",
            "trial {trial} (kill after {delay_ms} ms): {out:?}"
        );
        let (code, id) = sh(&g, &name, "id -u").await;
        assert_eq!((code, id.as_str()), (0, "10001\n"), "trial {trial}");
        // And it sleeps and wakes with its memory afterwards.
        let pid = leave_state(&g, &name).await;
        d.admin().stop(&name).await.expect("sleep after the kill");
        assert_eq!(
            what_survived(&g, &name, &pid).await,
            "sleeper\nin-memory\non-disk\n200\n",
            "trial {trial}: the next sleep keeps the memory"
        );
        d.admin().destroy(&name).await.expect("destroy");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gvisor_session_on_a_warm_container_sleeps_without_memory_once_then_with_it() {
    let image = sandboxd_testkit::tools_image();
    let runtimes = format!(
        r#"[{{"alias": "secure", "image": "{image}", "isolation": "gvisor", "warm_pool": 1}}]"#
    );
    let d = Daemon::start(&[("SANDBOXD_RUNTIMES", runtimes.as_str())]);
    let admin = d.admin();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !admin
        .runtimes()
        .await
        .expect("runtimes")
        .runtimes
        .iter()
        .any(|r| r.warm_pool.ready >= 1)
    {
        assert!(std::time::Instant::now() < deadline, "the pool fills");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let opened = admin
        .open("warm-g", "org-iso", Some("secure"), None)
        .await
        .expect("open");
    assert_eq!(opened.session.launch, sandboxd_api::Launch::Warm);
    let g = d.client(opened.token.as_deref().expect("a token"));
    // The pool's container binds the pool folder's path: it is replaced at the wake, so its
    // sleep is a plain one (no checkpoint that could never be restored).
    let pid = leave_state(&g, "warm-g").await;
    let refused = admin
        .pause("warm-g")
        .await
        .expect_err("a warm container is not paused");
    assert_eq!(
        refused.to_string(),
        "pause_refused (409): session 'warm-g' runs on a container of its runtime's warm pool, which is replaced at its next wake: it can be paused after that wake (stop sleeps it without its memory)"
    );
    admin.stop("warm-g").await.expect("sleep");
    assert_eq!(checkpoints(&d, "checkpoint", "ok").await, 0);
    assert_eq!(
        what_survived(&g, "warm-g", &pid).await,
        "on-disk\nno answer\n"
    );
    // Its own container from then on: paused on demand with its memory, resumed on demand.
    let pid = leave_state(&g, "warm-g").await;
    let paused = admin.pause("warm-g").await.expect("pause");
    assert_eq!(paused.state, sandboxd_api::SessionState::Stopped);
    assert_eq!(checkpoints(&d, "checkpoint", "ok").await, 1);
    let again = admin
        .pause("warm-g")
        .await
        .expect("a paused session pauses again");
    assert_eq!(again.state, sandboxd_api::SessionState::Stopped);
    assert_eq!(checkpoints(&d, "checkpoint", "ok").await, 1, "once");
    let resumed = admin.resume("warm-g").await.expect("resume");
    assert_eq!(resumed.state, sandboxd_api::SessionState::Running);
    assert_eq!(checkpoints(&d, "restore", "ok").await, 1);
    assert_eq!(
        what_survived(&g, "warm-g", &pid).await,
        "sleeper\nin-memory\non-disk\n200\n"
    );
    // Like stop: the admin token or the session's own, nobody else's.
    assert!(d.client("not-a-token").pause("warm-g").await.is_err());
}

/// A checkpoint counts against the workspace budget beside the workspace disks: one that fits
/// is held while the session sleeps (`GET /v1/policy` shows it) and let go at the wake; on a
/// host whose budget has no room for it, a pause is refused and the session sleeps without its
/// memory, saying why in its view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_counts_against_the_workspace_budget() {
    let runtimes = runtimes();
    let mut d = Daemon::start(&[
        ("SANDBOXD_RUNTIMES", runtimes.as_str()),
        ("SANDBOXD_WORKSPACE_QUOTA", "loop"),
        ("SANDBOXD_WORKSPACE_SIZE", "64m"),
        ("SANDBOXD_WORKSPACE_BUDGET", "4g"),
    ]);
    let admin = d.admin();
    let opened = admin
        .open("budget-g", "org-iso", Some("secure"), None)
        .await
        .expect("open");
    let token = opened.token.expect("a token");
    let g = d.client(&token);
    let held = |admin: Client| async move {
        admin
            .policy()
            .await
            .expect("policy")
            .workspaces
            .expect("the workspaces held")
            .bytes
    };
    assert_eq!(held(d.admin()).await, 64 << 20, "the disk alone");
    assert_eq!(sh(&g, "budget-g", "echo kept > /tmp/kept").await.0, 0);
    admin.pause("budget-g").await.expect("paused");
    let asleep = held(d.admin()).await;
    assert!(
        asleep > (64 << 20) + (64 << 10),
        "the checkpoint counts beside the disk: {asleep}"
    );
    assert_eq!(
        sh(&g, "budget-g", "cat /tmp/kept").await,
        (0, "kept\n".into()),
        "woken with its memory"
    );
    assert_eq!(
        held(d.admin()).await,
        64 << 20,
        "the checkpoint let go at the wake"
    );

    // The same host with a budget of the disk and 4 KiB: no room for a checkpoint.
    d.process.kill9();
    d.with_env(&[("SANDBOXD_WORKSPACE_BUDGET", "67112960")]);
    d.spawn();
    let (admin, g) = (d.admin(), d.client(&token));
    assert_eq!(sh(&g, "budget-g", "echo kept > /tmp/kept").await.0, 0);
    let refused = admin.pause("budget-g").await.expect_err("no room");
    let words = refused.to_string();
    assert!(
        words.starts_with("pause_refused (409): session 'budget-g' could not be paused: its checkpoint of ")
            && words.ends_with(
                " does not fit this host's workspace budget of 64.0 MiB (SANDBOXD_WORKSPACE_BUDGET): 1 workspaces and their checkpoints hold 64 MiB; its container stopped, so it is asleep without its memory"
            ),
        "{words}"
    );
    assert_eq!(held(d.admin()).await, 64 << 20, "nothing held for it");
    let view = admin.get("budget-g").await.expect("the session");
    assert_eq!(view.state, sandboxd_api::session::SessionState::Stopped);
    let (op, kept, outcome, error) = memory(&view).expect("a note");
    assert_eq!(
        (op, kept, outcome.as_str()),
        (MemoryOp::Checkpoint, false, "asleep without its memory")
    );
    assert!(
        error.is_some_and(|e| e.contains("does not fit this host's workspace budget")),
        "the reason"
    );
    assert_eq!(
        sh(&g, "budget-g", "cat /tmp/kept 2>/dev/null || echo gone").await,
        (0, "gone\n".into()),
        "woken without its memory"
    );
}
