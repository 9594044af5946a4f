//! Terminals against the real dockerd, driven like a person: type, read, resize, drop the
//! WebSocket mid-command and come back to the scrollback and the finished output; the audit
//! log; the cap, the idle close and the hostile cases (10,000 opens, a terminal that prints
//! without end), each bounded while sandboxd serves another session.

mod common;

use std::time::{Duration, Instant};

use common::{Backend, Daemon, counter, metrics, until};
use sandboxd_api::audit::{Op, OperationQuery};
use sandboxd_api::client::{Client, ClientError};
use sandboxd_api::error::ErrorCode;
use sandboxd_api::terminal::TerminalRequest;
use sandboxd_api::ws::{TerminalEvent, TerminalSocket};

async fn session(d: &Daemon, name: &str) -> Client {
    let opened = d
        .admin()
        .open(name, "org-term", None, None)
        .await
        .expect("open");
    d.client(&opened.token.expect("a token on create"))
}

/// Reads the socket until `want` is in what it printed (returned), or fails after `within`.
async fn read_until(sock: &mut TerminalSocket, seen: &mut String, want: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while !seen.contains(want) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, sock.next()).await {
            Ok(Some(TerminalEvent::Output(b))) => seen.push_str(&String::from_utf8_lossy(&b)),
            Ok(Some(TerminalEvent::Attached { .. })) => {}
            Ok(other) => panic!("{other:?} before {want:?}; the terminal printed:\n{seen}"),
            Err(_) => panic!("no {want:?} within {within:?}; the terminal printed:\n{seen}"),
        }
    }
}

/// The scrollback count of the first message of an attach.
async fn attached(sock: &mut TerminalSocket) -> u64 {
    match tokio::time::timeout(Duration::from_secs(10), sock.next()).await {
        Ok(Some(TerminalEvent::Attached { scrollback, .. })) => scrollback,
        other => panic!("an attach begins with `attached`, not {other:?}"),
    }
}

fn api_error(e: ClientError) -> (u16, ErrorCode, String) {
    match e {
        ClientError::Api {
            status,
            code,
            message,
        } => (status, code, message),
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_is_typed_into_resized_dropped_and_found_again() {
    let d = Daemon::start_on(Backend::Agent, &[]);
    let s = session(&d, "t1").await;
    let t = s
        .open_terminal("t1", &TerminalRequest::default())
        .await
        .expect("a login shell");
    assert!(t.running && (t.rows, t.cols) == (24, 80), "{t:?}");

    let mut sock = s.attach_terminal("t1", &t.id).await.expect("attach");
    attached(&mut sock).await;
    let mut seen = String::new();
    // Typed, not run: the echo of the line holds `6*7`, only the shell's answer `42`.
    sock.send_input(b"echo $((6*7)); id -u\n")
        .await
        .expect("type");
    read_until(&mut sock, &mut seen, "42\r\n10001", Duration::from_secs(20)).await;
    sock.resize(33, 101).await.expect("resize");
    sock.send_input(b"stty size\n").await.expect("type");
    read_until(&mut sock, &mut seen, "33 101", Duration::from_secs(10)).await;
    // Dropped mid-command: the command goes on without anyone watching.
    sock.send_input(b"sleep 2; echo fin$((1+1))shed\n")
        .await
        .expect("type");
    read_until(&mut sock, &mut seen, "sleep 2", Duration::from_secs(10)).await;
    drop(sock);

    let listed = s.terminals("t1").await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(listed[0].running, "{listed:?}");

    // Back: the scrollback first (the earlier answer), then the finished command.
    let mut sock = s.attach_terminal("t1", &t.id).await.expect("attach again");
    let scrollback = attached(&mut sock).await;
    assert!(scrollback > 0);
    let mut again = String::new();
    read_until(
        &mut sock,
        &mut again,
        "42\r\n10001",
        Duration::from_secs(10),
    )
    .await;
    read_until(&mut sock, &mut again, "fin2shed", Duration::from_secs(20)).await;

    // Leaving with a code: the socket says how the terminal ended, and so does the list.
    sock.send_input(b"exit 3\n").await.expect("type");
    let exit = loop {
        match tokio::time::timeout(Duration::from_secs(10), sock.next()).await {
            Ok(Some(TerminalEvent::Output(_))) => {}
            Ok(Some(TerminalEvent::Exit { exit_code, reason })) => break (exit_code, reason),
            other => panic!("expected the exit, got {other:?}"),
        }
    };
    assert_eq!(exit, (3, "exited".to_owned()));
    let listed = s.terminals("t1").await.expect("list");
    assert_eq!(
        (
            listed[0].running,
            listed[0].exit_code,
            listed[0].reason.as_deref()
        ),
        (false, Some(3), Some("exited"))
    );

    // The audit log: the open and the end, with the bytes typed and printed.
    let page = d
        .admin()
        .operations(&OperationQuery {
            session: Some("t1".to_owned()),
            op: Some(Op::Terminal),
            ..OperationQuery::default()
        })
        .await
        .expect("operations");
    let targets: Vec<&str> = page.operations.iter().map(|o| o.target.as_str()).collect();
    let open = format!("open {}: login shell (/bin/bash -l)", t.id);
    assert!(targets.contains(&open.as_str()), "{targets:?}");
    let end = page
        .operations
        .iter()
        .find(|o| o.target.starts_with(&format!("end {}: exited", t.id)))
        .unwrap_or_else(|| panic!("no end row: {targets:?}"));
    assert_eq!(end.exit_code, Some(3));
    assert!(end.bytes.unwrap_or(0) > 0, "{end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminals_are_capped_refused_in_words_and_kept_to_their_session() {
    let d = Daemon::start_on(
        Backend::Agent,
        &[("SANDBOXD_MAX_TERMINALS_PER_SESSION", "2")],
    );
    let s = session(&d, "cap").await;
    let other = session(&d, "other").await;
    let shell = TerminalRequest {
        command: Some("sleep 1000".to_owned()),
        ..TerminalRequest::default()
    };
    let a = s.open_terminal("cap", &shell).await.expect("first");
    s.open_terminal("cap", &shell).await.expect("second");
    let refused = api_error(s.open_terminal("cap", &shell).await.expect_err("third"));
    assert_eq!(
        refused,
        (
            429,
            ErrorCode::TerminalLimit,
            "Session 'cap' already has 2 terminals running (SANDBOXD_MAX_TERMINALS_PER_SESSION). Close one (DELETE /v1/sessions/cap/terminals/{terminal_id}) or wait for one to end.".to_owned()
        )
    );

    // Another session's token reaches none of them.
    let (status, code, _) = api_error(
        other
            .attach_terminal("cap", &a.id)
            .await
            .map(|_| ())
            .expect_err("another session's token is refused"),
    );
    assert_eq!((status, code), (403, ErrorCode::Forbidden));
    let (status, ..) = api_error(
        other
            .kill_terminal("cap", &a.id)
            .await
            .expect_err("refused"),
    );
    assert_eq!(status, 403);
    // Its own session has no such terminal.
    let (status, code, message) = api_error(
        other
            .attach_terminal("other", &a.id)
            .await
            .map(|_| ())
            .expect_err("not its terminal"),
    );
    assert_eq!(
        (status, code, message),
        (
            404,
            ErrorCode::TerminalNotFound,
            format!("No terminal '{}' in session 'other'", a.id)
        )
    );

    // A kill makes room; the killed one says how it ended.
    s.kill_terminal("cap", &a.id).await.expect("kill");
    let killed = until(
        "the killed terminal ended",
        Duration::from_secs(10),
        async || {
            s.terminals("cap")
                .await
                .ok()?
                .into_iter()
                .find(|t| t.id == a.id && !t.running)
        },
    )
    .await;
    assert_eq!(killed.reason.as_deref(), Some("killed"), "{killed:?}");
    s.open_terminal("cap", &shell).await.expect("room again");

    // A bad size is refused in words, before the sandbox is asked.
    let (status, code, message) = api_error(
        s.open_terminal(
            "cap",
            &TerminalRequest {
                rows: 0,
                ..TerminalRequest::default()
            },
        )
        .await
        .expect_err("no rows"),
    );
    assert_eq!(
        (status, code, message.as_str()),
        (
            400,
            ErrorCode::BadRequest,
            "a terminal is 1 to 1000 rows by 1 to 1000 columns, not 0x80"
        )
    );

    // 10,000 opens at the cap: each refused, and another session is served all along.
    let flood = {
        let s = s.clone();
        tokio::spawn(async move {
            let mut refused = 0;
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..16 {
                let s = s.clone();
                let shell = TerminalRequest {
                    command: Some("sleep 1000".to_owned()),
                    ..TerminalRequest::default()
                };
                tasks.spawn(async move {
                    let mut n = 0;
                    for _ in 0..625 {
                        if let Err(ClientError::Api { status: 429, .. }) =
                            s.open_terminal("cap", &shell).await
                        {
                            n += 1;
                        }
                    }
                    n
                });
            }
            while let Some(n) = tasks.join_next().await {
                refused += n.unwrap_or(0);
            }
            refused
        })
    };
    let started = Instant::now();
    let mut served = 0;
    while !flood.is_finished() {
        let r = other
            .run("other", "echo served", None, None, None)
            .await
            .expect("another session is served during the flood");
        assert_eq!(r.stdout, "served\n");
        served += 1;
    }
    let refused = flood.await.expect("the flood");
    assert_eq!(refused, 10_000, "every open past the cap is refused");
    let m = metrics(&d).await;
    assert!(
        counter(&m, "sandboxd_terminal_opens_total{outcome=\"refused\"}") >= 10_001,
        "the refusals are counted"
    );
    assert!(counter(&m, "sandboxd_terminal_opens_total{outcome=\"opened\"}") >= 3);
    assert!(served > 0);
    eprintln!(
        "10,000 refused opens in {:.1} s; {served} runs of another session meanwhile",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        s.terminals("cap")
            .await
            .expect("list")
            .iter()
            .filter(|t| t.running)
            .count(),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_that_prints_without_end_keeps_1_mib_and_an_idle_one_is_closed() {
    let d = Daemon::start_on(Backend::Agent, &[("SANDBOXD_TERMINAL_IDLE_TIMEOUT", "2")]);
    let s = session(&d, "loud").await;
    let other = session(&d, "quiet").await;
    let loud = s
        .open_terminal(
            "loud",
            &TerminalRequest {
                command: Some("yes 0123456789abcdef".to_owned()),
                ..TerminalRequest::default()
            },
        )
        .await
        .expect("open");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut sock = s.attach_terminal("loud", &loud.id).await.expect("attach");
    let scrollback = attached(&mut sock).await;
    assert!(
        scrollback > 0 && scrollback <= 1 << 20,
        "the scrollback is the last 1 MiB at most: {scrollback}"
    );
    let mut seen = String::new();
    read_until(
        &mut sock,
        &mut seen,
        "0123456789abcdef",
        Duration::from_secs(10),
    )
    .await;
    // sandboxd serves another session while it prints.
    let r = other
        .run("quiet", "echo served", None, None, None)
        .await
        .expect("served");
    assert_eq!(r.stdout, "served\n");
    s.kill_terminal("loud", &loud.id).await.expect("kill");
    let exit = loop {
        match tokio::time::timeout(Duration::from_secs(10), sock.next()).await {
            Ok(Some(TerminalEvent::Output(_))) => {}
            Ok(Some(TerminalEvent::Exit { reason, .. })) => break reason,
            other => panic!("expected the exit, got {other:?}"),
        }
    };
    assert_eq!(exit, "killed");
    let left = other
        .run("quiet", "echo served", None, None, None)
        .await
        .expect("served");
    assert_eq!(left.stdout, "served\n");
    let procs = s
        .run(
            "loud",
            "ps -eo args | grep -c '^yes' || true",
            None,
            None,
            None,
        )
        .await
        .expect("ps");
    assert_eq!(
        procs.stdout.trim(),
        "0",
        "the killed terminal's program is gone"
    );

    // Nobody attached, nothing typed or printed for 2 s: closed.
    let idle = s
        .open_terminal(
            "loud",
            &TerminalRequest {
                command: Some("sleep 1000".to_owned()),
                ..TerminalRequest::default()
            },
        )
        .await
        .expect("open");
    let closed = until(
        "the idle terminal closed",
        Duration::from_secs(15),
        async || {
            s.terminals("loud")
                .await
                .ok()?
                .into_iter()
                .find(|t| t.id == idle.id && !t.running)
        },
    )
    .await;
    assert_eq!(closed.reason.as_deref(), Some("idle"), "{closed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_session_wakes_for_a_terminal_and_exec_hosts_refuse_in_words() {
    let d = Daemon::start_on(Backend::Agent, &[]);
    let s = session(&d, "sleepy").await;
    d.admin().stop("sleepy").await.expect("stop");
    let t = s
        .open_terminal(
            "sleepy",
            &TerminalRequest {
                command: Some("echo awake; sleep 1000".to_owned()),
                ..TerminalRequest::default()
            },
        )
        .await
        .expect("a terminal wakes its session");
    let view = d.admin().get("sleepy").await.expect("get");
    assert_eq!(view.state, sandboxd_api::SessionState::Running);
    // Asleep again: its terminals ended with its container; an attach wakes it and finds none.
    d.admin().stop("sleepy").await.expect("stop");
    assert!(s.terminals("sleepy").await.expect("list").is_empty());
    let (status, code, _) = api_error(
        s.attach_terminal("sleepy", &t.id)
            .await
            .map(|_| ())
            .expect_err("gone with the container"),
    );
    assert_eq!((status, code), (404, ErrorCode::TerminalNotFound));
    let view = d.admin().get("sleepy").await.expect("get");
    assert_eq!(view.state, sandboxd_api::SessionState::Running);

    let e = Daemon::start_on(Backend::Exec, &[]);
    let x = session(&e, "execd").await;
    let (status, code, message) = api_error(
        x.open_terminal("execd", &TerminalRequest::default())
            .await
            .expect_err("no agent, no terminal"),
    );
    assert_eq!(
        (status, code, message.as_str()),
        (
            409,
            ErrorCode::TerminalsUnavailable,
            "this host runs commands through docker exec (SANDBOXD_RUN_BACKEND=exec), which has no terminals"
        )
    );
}
