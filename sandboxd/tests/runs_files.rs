//! Runs and files against the real dockerd: output, exit status, timeout and stop that kill
//! the whole tree, streaming, truncation; file reads and writes; a hostile path corpus.

mod common;

use sandboxd_api::ErrorCode;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{Backend, Daemon, exists, raw, until};
use reqwest::Method;
use sandboxd::run::RunEvent;
use sandboxd_api::client::{Client, ClientError};

async fn session(d: &Daemon, name: &str) -> Client {
    let opened = d
        .admin()
        .open(name, "org-r", None, None)
        .await
        .expect("open");
    d.client(opened.token.as_deref().expect("token"))
}

async fn runs_report_output_status_and_limits(backend: Backend) {
    let d = Daemon::start_on(
        backend,
        &[
            ("SANDBOXD_MAX_OUTPUT_BYTES", "1000"),
            ("SANDBOXD_EXECUTE_TIMEOUT", "3"),
        ],
    );
    let s = session(&d, "runs").await;
    let split = s
        .run("runs", "echo out; echo err >&2; exit 3", None, None, None)
        .await
        .expect("run");
    assert_eq!(
        (
            split.stdout.as_str(),
            split.stderr.as_str(),
            split.exit_code
        ),
        ("out\n", "err\n", 3)
    );
    assert!(!split.truncated && !split.timed_out);
    let missing = s
        .run("runs", "no-such-program", None, None, None)
        .await
        .expect("run");
    assert_eq!(missing.exit_code, 127);
    let env = HashMap::from([("GREETING".to_owned(), "hi there".to_owned())]);
    let with_env = s
        .run("runs", "echo \"$GREETING\"", None, Some(&env), None)
        .await
        .expect("run");
    assert_eq!(with_env.stdout, "hi there\n");
    let flood = s
        .run("runs", "yes | head -c 100000", None, None, None)
        .await
        .expect("run");
    assert!(flood.truncated);
    assert_eq!(flood.stdout.len(), 1000);

    // The timeout is min(requested, SANDBOXD_EXECUTE_TIMEOUT = 3 s) and kills the whole tree.
    let started = Instant::now();
    let slow = s
        .run(
            "runs",
            "sleep 60 & sleep 61; echo never",
            Some(30),
            None,
            None,
        )
        .await
        .expect("run");
    assert!(slow.timed_out, "{slow:?}");
    assert_eq!(slow.exit_code, 124);
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "took {:?}",
        started.elapsed()
    );
    let left = s
        .run(
            "runs",
            "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'sleep 6[01]' || true",
            None,
            None,
            None,
        )
        .await
        .expect("run");
    assert_eq!(
        left.stdout.trim(),
        "0",
        "the timed-out tree left processes behind"
    );

    // Streaming: events as they come, then the outcome.
    let mut events = Vec::new();
    let streamed = s
        .run_streaming("runs", "echo one; echo two >&2; echo three", None, |e| {
            events.push(e)
        })
        .await
        .expect("stream");
    assert_eq!(streamed.exit_code, 0);
    assert!(
        events.contains(&RunEvent::Stderr {
            data: "two\n".into()
        }),
        "{events:?}"
    );
    let out: String = events
        .iter()
        .filter_map(|e| {
            if let RunEvent::Stdout { data } = e {
                Some(data.as_str())
            } else {
                None
            }
        })
        .collect();
    assert_eq!(out, "one\nthree\n");
    assert_eq!(
        (streamed.stdout.as_str(), streamed.stderr.as_str()),
        ("one\nthree\n", "two\n"),
        "the streamed outcome holds the output too"
    );

    let bad = s.run("runs", "  ", None, None, None).await;
    assert!(
        matches!(bad, Err(ClientError::Api { status: 400, .. })),
        "{bad:?}"
    );
}

/// Streaming much output of characters longer than a byte: every event comes before the
/// outcome, and none carries a character cut in two (pipes and Docker hand output over in
/// pieces that split them).
async fn streamed_output_comes_whole_and_before_the_outcome(backend: Backend) {
    let d = Daemon::start_on(backend, &[]);
    let s = session(&d, "stream").await;
    for _ in 0..3 {
        let mut streamed_text = String::new();
        let many = s
            .run_streaming(
                "stream",
                "yes '€' | head -n 100000 | tr -d '\\n'",
                None,
                |e| {
                    if let RunEvent::Stdout { data } = e {
                        streamed_text.push_str(&data);
                    }
                },
            )
            .await
            .expect("stream");
        let expected = "€".repeat(100_000);
        assert!(
            streamed_text == expected,
            "streamed {} bytes, {} of them U+FFFD",
            streamed_text.len(),
            streamed_text.matches('\u{FFFD}').count()
        );
        assert!(
            many.stdout == expected && !many.truncated,
            "the outcome holds {} bytes",
            many.stdout.len()
        );
    }
}

async fn a_run_is_stopped_by_id_from_a_second_request(backend: Backend) {
    let d = Daemon::start_on(backend, &[]);
    let s = session(&d, "stopper").await;
    let runner = s.clone();
    let run = tokio::spawn(async move {
        runner
            .run(
                "stopper",
                "sleep 100 & sleep 101; echo never",
                Some(120),
                None,
                Some("long-run"),
            )
            .await
    });
    // Wait until the run is in flight (the session reports it), then stop it.
    until("the run in flight", Duration::from_secs(20), || async {
        (s.get("stopper").await.expect("get").runs_in_flight > 0).then_some(())
    })
    .await;
    let asked = Instant::now();
    s.stop_run("stopper", "long-run").await.expect("stop");
    let outcome = run.await.expect("task").expect("run");
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "stopping took {:?}",
        asked.elapsed()
    );
    assert!(outcome.stopped && outcome.exit_code == 137, "{outcome:?}");
    assert!(!outcome.stdout.contains("never"));
    let left = s
        .run(
            "stopper",
            "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'sleep 10[01]' || true",
            None,
            None,
            None,
        )
        .await
        .expect("run");
    assert_eq!(left.stdout.trim(), "0");
    assert!(matches!(
        s.stop_run("stopper", "long-run").await,
        Err(ClientError::Api { status: 404, .. })
    ));
}

/// A streamed run answers only once it is under way: a client that starts one in the background
/// (a sleeping session, so the run waits for its container to start) and stops it as soon as
/// the answer begins always finds it, and the stream ends with the stop.
async fn a_streamed_run_can_be_stopped_as_soon_as_its_answer_starts(backend: Backend) {
    let d = Daemon::start_on(backend, &[]);
    let opened = d
        .admin()
        .open("bg", "org-r", None, None)
        .await
        .expect("open");
    let token = opened.token.expect("a token");
    let s = d.client(&token);
    let url = format!("{}/v1/sessions/bg/runs?stream=true", d.base);
    for i in 0..3 {
        s.stop("bg").await.expect("the session sleeps");
        let run_id = format!("bg-{i}");
        let resp = reqwest::Client::new()
            .post(&url)
            .bearer_auth(&token)
            .json(&serde_json::json!({"command": "sleep 600", "run_id": run_id}))
            .send()
            .await
            .expect("the run answers");
        assert_eq!(resp.status().as_u16(), 200);
        s.stop_run("bg", &run_id)
            .await
            .unwrap_or_else(|e| panic!("stopping {run_id} as its answer started: {e}"));
        let body = tokio::time::timeout(Duration::from_secs(20), resp.text())
            .await
            .expect("the stopped run's stream ends")
            .expect("the stream");
        let last: serde_json::Value =
            serde_json::from_str(body.lines().last().expect("an outcome line")).expect("json");
        assert_eq!(
            (&last["type"], &last["stopped"], &last["exit_code"]),
            (
                &serde_json::json!("exit"),
                &serde_json::json!(true),
                &serde_json::json!(137)
            ),
            "{body}"
        );
    }
}

async fn files_are_read_written_and_listed_in_place(backend: Backend) {
    let d = Daemon::start_on(backend, &[("SANDBOXD_MAX_READ_BYTES", "1048576")]);
    let s = session(&d, "files").await;
    assert_eq!(
        s.write("files", "a/b/c.txt", "hello world")
            .await
            .expect("write"),
        11
    );
    let on_disk = d.workspace("files").join("a/b/c.txt");
    assert_eq!(
        std::fs::read_to_string(&on_disk).expect("on disk"),
        "hello world"
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&on_disk).expect("meta").uid(), 10001);
    assert_eq!(
        std::fs::metadata(d.workspace("files").join("a"))
            .expect("meta")
            .uid(),
        10001
    );
    assert_eq!(
        s.read("files", "a/b/c.txt", 6, Some(5))
            .await
            .expect("read"),
        b"world"
    );
    let seen = s
        .run("files", "cat a/b/c.txt", None, None, None)
        .await
        .expect("run");
    assert_eq!(seen.stdout, "hello world");
    s.mkdir("files", "x/y").await.expect("mkdir");
    s.write("files", "node_modules/pkg/index.js", "x")
        .await
        .expect("write");
    let names: Vec<_> = s
        .ls("files", "")
        .await
        .expect("ls")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["a", "x"], "toolchain folders are left out");
    let tree = s.tree("files", "").await.expect("tree");
    assert!(tree.entries.iter().any(|e| e.path == "a/b/c.txt"));
    assert!(!tree.entries.iter().any(|e| e.path.contains("node_modules")));
    // Past the read limit: refused with a message naming it.
    s.write("files", "big.bin", vec![7u8; 2 * 1048576])
        .await
        .expect("write big");
    match s.read("files", "big.bin", 0, None).await {
        Err(ClientError::Api {
            status: 413,
            code,
            message,
        }) => {
            assert_eq!(code, ErrorCode::TooLarge);
            assert!(message.contains("1048576"), "{message}");
        }
        other => panic!("expected too_large, got {other:?}"),
    }
    assert_eq!(
        s.read("files", "big.bin", 0, Some(1048576))
            .await
            .expect("a part")
            .len(),
        1048576
    );
    s.remove("files", "a", true).await.expect("remove");
    assert!(!exists(&d.workspace("files").join("a")));
}

async fn hostile_paths_are_refused_and_nothing_outside_is_touched(backend: Backend) {
    let d = Daemon::start_on(backend, &[]);
    let s = session(&d, "hostile").await;
    // A sentinel next to the workspace, and links the agent makes inside the container.
    let sentinel = d.workspace_root().join("hostile").join("sentinel.txt");
    std::fs::write(&sentinel, "outside").expect("sentinel");
    let made = s.run("hostile", "ln -s /etc etc_link && ln -s ../.. up && ln -s /etc/passwd pw && ln -s loop1 loop2 && ln -s loop2 loop1 && echo ok", None, None, None).await.expect("run");
    assert_eq!(made.stdout, "ok\n");
    let base = format!("{}/v1/sessions/hostile/files", d.base);
    let token = s.clone();
    let _ = token;
    let admin = d.token.clone();
    for path in [
        "../sentinel.txt",
        "%2e%2e/sentinel.txt",
        "a/..%2f..%2fsentinel.txt",
        "%2Fetc%2Fpasswd",
        "etc_link/passwd",
        "up/sentinel.txt",
        "pw",
        "loop1",
        "bad%00name",
    ] {
        let (status, body) = raw(Method::GET, &format!("{base}/{path}"), Some(&admin), None).await;
        assert!((400..500).contains(&status), "read {path}: {status} {body}");
        assert!(
            !body.to_string().contains("root:x:0:0"),
            "read {path} leaked /etc/passwd"
        );
        let (status, body) = raw(
            Method::PUT,
            &format!("{base}/{path}"),
            Some(&admin),
            Some("pwned"),
        )
        .await;
        assert!(
            (400..500).contains(&status),
            "write {path}: {status} {body}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(&sentinel).expect("sentinel"),
        "outside"
    );
    assert!(!exists(&d.workspace_root().join("hostile").join("pwned")));
    assert!(
        std::fs::read_to_string("/etc/passwd")
            .expect("host passwd")
            .starts_with("root:")
    );
    // Removing the link removes the link, never its target.
    s.remove("hostile", "pw", false).await.expect("remove link");
    assert!(exists(std::path::Path::new("/etc/passwd")));
    let (status, body) = raw(
        Method::GET,
        &format!("{}/v1/sessions/hostile/ls?path=..", d.base),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["code"], "outside_workspace");
}

on_both_backends! {
    #[tokio::test]
    runs_report_output_status_and_limits,
    #[tokio::test]
    streamed_output_comes_whole_and_before_the_outcome,
    #[tokio::test]
    a_run_is_stopped_by_id_from_a_second_request,
    #[tokio::test]
    a_streamed_run_can_be_stopped_as_soon_as_its_answer_starts,
    #[tokio::test]
    files_are_read_written_and_listed_in_place,
    #[tokio::test]
    hostile_paths_are_refused_and_nothing_outside_is_touched,
}
