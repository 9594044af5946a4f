//! The workspace behaves through `/v1` as the agent inside sees it: links with container paths,
//! a symlink loop in a listing, the sandbox user's permissions, FIFOs, a cancelled run, and a
//! destroy while a command runs. Each is made the way an agent makes it (commands in its
//! container) against the real dockerd. The same behaviours through pydantic-ai-backend's own
//! client are `sandboxd/tests/python/test_dropin.py` (run by `tests/wire.rs`).

mod common;

use std::time::{Duration, Instant};

use common::{Backend, Daemon, raw, until};
use reqwest::Method;
use sandboxd_api::client::{Client, ClientError};

async fn session(d: &Daemon, name: &str) -> Client {
    let opened = d
        .admin()
        .open(name, "org-dropin", None, None)
        .await
        .expect("open");
    d.client(opened.token.as_deref().expect("token"))
}

/// Runs `command` in the sandbox and checks it succeeded.
async fn agent_does(s: &Client, id: &str, command: &str) {
    let ran = s.run(id, command, None, None, None).await.expect("run");
    assert_eq!(
        ran.exit_code, 0,
        "`{command}` in the sandbox: {}",
        ran.stderr
    );
}

fn api_code(e: &ClientError) -> (u16, &str) {
    match e {
        ClientError::Api { status, code, .. } => (*status, code.as_str()),
        other => panic!("expected an API error, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn links_with_container_paths_are_followed_and_links_out_refused() {
    let d = Daemon::start(&[]);
    let id = "links";
    let s = session(&d, id).await;
    agent_does(
        &s,
        id,
        "mkdir -p notes build/v3 && echo hi > notes/a.txt && ln -s /workspace/notes/a.txt abs \
         && ln -s /workspace/build/v3 latest && ln -s /etc/passwd out",
    )
    .await;
    assert_eq!(s.read(id, "abs", 0, None).await.expect("read"), b"hi\n");
    s.write(id, "abs", "written through\n")
        .await
        .expect("write through the link");
    assert_eq!(
        std::fs::read(d.workspace(id).join("notes/a.txt")).expect("target"),
        b"written through\n"
    );
    assert!(
        std::fs::symlink_metadata(d.workspace(id).join("abs"))
            .expect("link")
            .file_type()
            .is_symlink()
    );
    s.write(id, "latest/out.txt", "v3").await.expect("write");
    let seen = s
        .run(id, "cat /workspace/build/v3/out.txt", None, None, None)
        .await
        .expect("run");
    assert_eq!(seen.stdout, "v3");
    let listed: Vec<_> = s
        .ls(id, "latest")
        .await
        .expect("ls")
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert_eq!(listed, ["latest/out.txt"]);
    let refused = s.read(id, "out", 0, None).await.expect_err("a link out");
    assert_eq!(api_code(&refused), (403, "outside_workspace"));
    assert!(
        refused.to_string().contains("leads outside the workspace"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_symlink_loop_is_listed_as_a_link_beside_the_rest() {
    let d = Daemon::start(&[]);
    let id = "loops";
    let s = session(&d, id).await;
    agent_does(
        &s,
        id,
        "mkdir d && echo a > d/a.txt && ln -s loop2 d/loop1 && ln -s /workspace/d/loop1 d/loop2",
    )
    .await;
    let listed: Vec<_> = s
        .ls(id, "d")
        .await
        .expect("ls")
        .into_iter()
        .map(|e| (e.name, e.kind))
        .collect();
    use sandboxd::workspace::EntryKind;
    assert_eq!(
        listed,
        [
            ("a.txt".to_owned(), EntryKind::File),
            ("loop1".to_owned(), EntryKind::Symlink),
            ("loop2".to_owned(), EntryKind::Symlink),
        ]
    );
    assert_eq!(s.tree(id, "").await.expect("tree").entries.len(), 4);
    let e = s.read(id, "d/loop1", 0, None).await.expect_err("a loop");
    assert_eq!(api_code(&e), (400, "invalid_path"));
}

#[tokio::test(flavor = "multi_thread")]
async fn file_operations_have_the_sandbox_users_permissions() {
    let d = Daemon::start(&[]);
    let id = "perms";
    let s = session(&d, id).await;
    agent_does(
        &s,
        id,
        "echo secret > locked && chmod 000 locked && mkdir ro && echo in > ro/in.txt && chmod 555 ro",
    )
    .await;
    let e = s.read(id, "locked", 0, None).await.expect_err("unreadable");
    assert_eq!(api_code(&e), (403, "permission_denied"));
    assert!(
        e.to_string()
            .contains("'locked': permission denied for the sandbox user"),
        "{e}"
    );
    let e = s.write(id, "locked", "x").await.expect_err("unwritable");
    assert_eq!(api_code(&e), (403, "permission_denied"));
    let e = s
        .write(id, "ro/new.txt", "x")
        .await
        .expect_err("read-only dir");
    assert_eq!(api_code(&e), (403, "permission_denied"));
    let e = s
        .remove(id, "ro/in.txt", false)
        .await
        .expect_err("read-only dir");
    assert_eq!(api_code(&e), (403, "permission_denied"));
    // The sandbox itself agrees: the same file is unreadable inside.
    let inside = s
        .run(id, "cat locked", None, None, None)
        .await
        .expect("run");
    assert_ne!(inside.exit_code, 0);
    assert!(
        inside.stderr.contains("Permission denied"),
        "{}",
        inside.stderr
    );
    // And what the agent may do still works.
    s.write(id, "mine.txt", "ok").await.expect("write");
    agent_does(&s, id, "chmod 644 locked && chmod 755 ro").await;
    assert_eq!(
        s.read(id, "locked", 0, None).await.expect("read"),
        b"secret\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn reading_a_fifo_answers_at_once() {
    let d = Daemon::start(&[]);
    let id = "fifo";
    let s = session(&d, id).await;
    agent_does(&s, id, "mkfifo pipe && ln -s /workspace/pipe to-pipe").await;
    for path in ["pipe", "to-pipe"] {
        let started = Instant::now();
        let e = s.read(id, path, 0, None).await.expect_err("a FIFO");
        assert!(started.elapsed() < Duration::from_secs(5), "{path} blocked");
        assert_eq!(api_code(&e), (409, "not_a_regular_file"), "{path}");
        assert!(
            e.to_string()
                .contains("is not a regular file (a FIFO, socket or device)"),
            "{e}"
        );
    }
}

/// Waits until the process whose pid the sandbox wrote to `file` is gone.
async fn until_gone(s: &Client, id: &str, file: &str, deadline: Duration) {
    let probe =
        format!("kill -0 \"$(cat /workspace/{file})\" 2>/dev/null && echo alive || echo gone");
    until(
        &format!("the process of {file} is gone"),
        deadline,
        || async {
            let r = s.run(id, &probe, None, None, None).await.ok()?;
            (r.stdout == "gone\n").then_some(())
        },
    )
    .await;
}

async fn a_cancelled_run_stops_its_process_tree(backend: Backend) {
    let d = Daemon::start_on(backend, &[]);
    let id = "cancel";
    let s = session(&d, id).await;
    // Cancelled by dropping the request: the HTTP client gives up after a second.
    let started = Instant::now();
    let (status, _) = tokio::time::timeout(
        Duration::from_secs(2),
        raw(
            Method::POST,
            &format!("{}/v1/sessions/{id}/runs", d.base),
            Some(&d.token),
            Some(r#"{"command": "echo $$ > dropped.pid; sleep 120 & wait"}"#),
        ),
    )
    .await
    .map_or((0, serde_json::Value::Null), |r| r);
    assert_eq!(status, 0, "the run answered before it was dropped");
    until(
        "the dropped run's pid file",
        Duration::from_secs(10),
        || async { s.read(id, "dropped.pid", 0, None).await.ok().map(drop) },
    )
    .await;
    until_gone(&s, id, "dropped.pid", Duration::from_secs(15)).await;
    assert!(started.elapsed() < Duration::from_secs(30));
    let view = s.get(id).await.expect("get");
    assert_eq!(view.runs_in_flight, 0, "a dropped run is not in flight");
    // A streamed run whose client goes away, though it prints nothing more.
    let streamed = reqwest::Client::new()
        .post(format!("{}/v1/sessions/{id}/runs?stream=true", d.base))
        .bearer_auth(&d.token)
        .header("content-type", "application/json")
        .body(r#"{"command": "echo $$ > streamed.pid; echo begun; sleep 120 & wait"}"#)
        .send()
        .await
        .expect("the streamed run starts");
    assert_eq!(streamed.status().as_u16(), 200);
    until(
        "the streamed run's pid file",
        Duration::from_secs(10),
        || async { s.read(id, "streamed.pid", 0, None).await.ok().map(drop) },
    )
    .await;
    drop(streamed);
    until_gone(&s, id, "streamed.pid", Duration::from_secs(15)).await;
    // Cancelled with the stop route, from a second request.
    let bg = {
        let s = s.clone();
        tokio::spawn(async move {
            s.run(
                id,
                "echo $$ > stopped.pid; sleep 120 & wait",
                None,
                None,
                Some("to-stop"),
            )
            .await
        })
    };
    until("the run is in flight", Duration::from_secs(20), || async {
        let v = s.get(id).await.ok()?;
        (v.runs_in_flight > 0).then_some(())
    })
    .await;
    s.stop_run(id, "to-stop").await.expect("stop");
    let outcome = tokio::time::timeout(Duration::from_secs(15), bg)
        .await
        .expect("the stopped run answers promptly")
        .expect("task")
        .expect("run");
    assert!(outcome.stopped && outcome.exit_code == 137, "{outcome:?}");
    until_gone(&s, id, "stopped.pid", Duration::from_secs(15)).await;
}

async fn a_destroy_during_a_run_ends_it_with_session_gone(backend: Backend) {
    let d = Daemon::start_on(backend, &[]);
    let id = "doomed";
    let s = session(&d, id).await;
    let bg = {
        let s = s.clone();
        tokio::spawn(async move { s.run(id, "sleep 120", None, None, None).await })
    };
    until("the run is in flight", Duration::from_secs(20), || async {
        let v = s.get(id).await.ok()?;
        (v.runs_in_flight > 0).then_some(())
    })
    .await;
    let started = Instant::now();
    d.admin().destroy(id).await.expect("destroy");
    let e = tokio::time::timeout(Duration::from_secs(20), bg)
        .await
        .expect("the run answers once its session is destroyed")
        .expect("task")
        .expect_err("the session is gone");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(api_code(&e), (410, "session_gone"));
    assert!(e.to_string().contains("the session is gone"), "{e}");
    // A run asked for afterwards finds no session.
    let again = s.run(id, "true", None, None, None).await.expect_err("gone");
    assert!(
        matches!(again, ClientError::NoSuchSession(_)) || api_code(&again).0 == 401,
        "{again}"
    );
}

// Runs are stopped by the run path, so both are proven on each: the resident agent and Docker
// exec.
on_both_backends! {
    #[tokio::test(flavor = "multi_thread")]
    a_cancelled_run_stops_its_process_tree,
    #[tokio::test(flavor = "multi_thread")]
    a_destroy_during_a_run_ends_it_with_session_gone,
}
