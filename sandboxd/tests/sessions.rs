//! Sessions against the real dockerd: open by name under concurrency and caps, the life cycle
//! (sleep, wake, reclaim, destroy, lost), auth, and convergence after `kill -9`.
//!
//! Over 600 lines: one test a scenario, sharing this file's fixtures.

mod common;

use sandboxd_api::ErrorCode;
use std::collections::HashSet;

use common::{Backend, Daemon, exists, raw, until};
use reqwest::Method;
use sandboxd_api::SessionState as State;
use sandboxd_api::client::ClientError;

async fn thirty_parallel_opens_of_one_name_make_one_container(backend: Backend) {
    let d = Daemon::start_on(backend, &[]);
    let admin = d.admin();
    let opens = (0..30).map(|_| {
        let admin = admin.clone();
        tokio::spawn(async move { admin.open("same-name", "org-a", None, None).await })
    });
    let results: Vec<_> = futures::future::join_all(opens)
        .await
        .into_iter()
        .map(|r| r.expect("task"))
        .collect();
    let created = results
        .iter()
        .filter(|r| r.as_ref().is_ok_and(|o| o.created && o.token.is_some()))
        .count();
    let found = results
        .iter()
        .filter(|r| r.as_ref().is_ok_and(|o| !o.created && o.token.is_none()))
        .count();
    assert_eq!((created, found), (1, 29), "{results:?}");
    assert!(
        results
            .iter()
            .all(|r| r.as_ref().is_ok_and(|o| o.session.state == State::Running))
    );
    let containers = d.containers();
    assert_eq!(containers.len(), 1, "{containers:?}");
    assert_eq!(containers[0].1, "same-name");
}

async fn thirty_parallel_opens_of_a_tenant_at_cap_ten_give_ten(backend: Backend) {
    let d = Daemon::start_on(backend, &[("SANDBOXD_MAX_SESSIONS", "40")]);
    let admin = d.admin();
    let opens = (0..30).map(|i| {
        let admin = admin.clone();
        tokio::spawn(async move {
            admin
                .open(&format!("cap-{i}"), "org-capped", None, None)
                .await
        })
    });
    let results: Vec<_> = futures::future::join_all(opens)
        .await
        .into_iter()
        .map(|r| r.expect("task"))
        .collect();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 10);
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        match r {
            ClientError::Api {
                status: 429,
                code,
                message,
            } => {
                assert_eq!(*code, ErrorCode::TenantCap);
                assert_eq!(
                    message,
                    "Tenant 'org-capped' already holds 10 of 10 sessions. Release an idle session before opening another."
                );
            }
            other => panic!("expected the tenant cap, got {other:?}"),
        }
    }
    assert_eq!(d.containers().len(), 10);
    // Another tenant still gets in.
    admin
        .open("other-tenant", "org-b", None, None)
        .await
        .expect("another tenant opens");
}

async fn host_cap_and_refusals_carry_their_code_and_message(backend: Backend) {
    let d = Daemon::start_on(backend, &[("SANDBOXD_MAX_SESSIONS", "2")]);
    let admin = d.admin();
    let first = admin.open("h-1", "t1", None, None).await.expect("open");
    admin.open("h-2", "t2", None, None).await.expect("open");
    match admin.open("h-3", "t3", None, None).await {
        Err(ClientError::Api {
            status: 429,
            code,
            message,
        }) => {
            assert_eq!(code, ErrorCode::HostCap);
            assert_eq!(
                message,
                "This host already holds 2 of 2 sessions. Release an idle session before opening another."
            );
        }
        other => panic!("expected the host cap, got {other:?}"),
    }
    // A failed open uses no capacity: after destroying one, a new one fits.
    admin.destroy("h-2").await.expect("destroy");
    admin
        .open("h-3", "t3", None, None)
        .await
        .expect("room again");

    match admin.open("h-4", "t1", Some("nope"), None).await {
        Err(ClientError::Api {
            status: 400,
            code,
            message,
        }) => {
            assert_eq!(code, ErrorCode::UnknownRuntime);
            assert_eq!(
                message,
                "Runtime 'nope' is not allowed on this host; allowed: base, alt"
            );
        }
        other => panic!("expected unknown runtime, got {other:?}"),
    }
    match admin.open("../etc", "t1", None, None).await {
        Err(ClientError::Api {
            status: 400, code, ..
        }) => assert_eq!(code, ErrorCode::BadRequest),
        other => panic!("expected a bad name refusal, got {other:?}"),
    }
    match admin.open("h-1", "someone-else", None, None).await {
        Err(ClientError::Api {
            status: 409, code, ..
        }) => assert_eq!(code, ErrorCode::NameTaken),
        other => panic!("expected name_taken, got {other:?}"),
    }

    // Auth: 401 before any lookup, identical for sessions that exist and that do not.
    let (s1, b1) = raw(
        Method::GET,
        &format!("{}/v1/sessions/h-1", d.base),
        Some("wrong"),
        None,
    )
    .await;
    let (s2, b2) = raw(
        Method::GET,
        &format!("{}/v1/sessions/no-such", d.base),
        Some("wrong"),
        None,
    )
    .await;
    let (s3, b3) = raw(
        Method::GET,
        &format!("{}/v1/sessions/h-1", d.base),
        None,
        None,
    )
    .await;
    assert_eq!((s1, s2, s3), (401, 401, 401));
    assert_eq!(b1, b2);
    assert_eq!(b1, b3);
    assert_eq!(b1["code"], "unauthorized");
    // A session token reaches only its own session, and cannot open sessions.
    let own = d.client(first.token.as_deref().expect("token"));
    own.get("h-1").await.expect("own session");
    match own.get("h-3").await {
        Err(ClientError::Api {
            status: 403, code, ..
        }) => assert_eq!(code, ErrorCode::Forbidden),
        other => panic!("expected forbidden, got {other:?}"),
    }
    assert!(matches!(
        own.open("h-9", "t1", None, None).await,
        Err(ClientError::Api { status: 403, .. })
    ));
    // The index needs no token.
    let (status, index) = raw(Method::GET, &format!("{}/", d.base), None, None).await;
    assert_eq!(status, 200);
    assert_eq!(index["service"], "sandboxd");
    assert!(
        index["routes"]
            .as_array()
            .is_some_and(|r| r.iter().any(|x| x == "POST /v1/sessions/{id}/runs"))
    );
    // No such session vs. no such route.
    assert!(
        matches!(admin.get("no-such").await, Err(ClientError::NoSuchSession(id)) if id == "no-such")
    );
    let (status, body) = raw(
        Method::GET,
        &format!("{}/v1/nothing-here", d.base),
        Some(&d.token),
        None,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("route_not_found"))
    );
}

async fn sleep_wake_reclaim_destroy_and_lost(backend: Backend) {
    let d = Daemon::start_on(backend, &[]);
    let admin = d.admin();
    let opened = admin.open("life", "org-l", None, None).await.expect("open");
    assert!(opened.created);
    let s = d.client(opened.token.as_deref().expect("token"));
    s.write("life", "notes/todo.txt", "remember the milk")
        .await
        .expect("write");
    assert!(exists(&d.workspace("life").join("notes/todo.txt")));

    // Sleep: container stopped, files stay; file routes work without waking it.
    let slept = s.stop("life").await.expect("stop");
    assert_eq!(slept.state, State::Stopped);
    assert_eq!(
        d.containers().iter().map(|c| c.2).collect::<Vec<_>>(),
        [false]
    );
    assert_eq!(
        s.read("life", "notes/todo.txt", 0, None)
            .await
            .expect("read while asleep"),
        b"remember the milk"
    );
    assert_eq!(
        s.get("life").await.expect("get").state,
        State::Stopped,
        "reading never wakes"
    );
    // A run wakes it.
    let cat = s
        .run("life", "cat notes/todo.txt", None, None, None)
        .await
        .expect("run wakes");
    assert_eq!(cat.stdout, "remember the milk");
    assert_eq!(s.get("life").await.expect("get").state, State::Running);

    // Reclaim: container removed, files kept; a run recreates the container.
    assert_eq!(
        s.reclaim("life").await.expect("reclaim").state,
        State::Reclaimed
    );
    assert!(d.containers().is_empty());
    assert!(exists(&d.workspace("life").join("notes/todo.txt")));
    let cat = s
        .run("life", "cat notes/todo.txt && id -u", None, None, None)
        .await
        .expect("run after reclaim");
    assert_eq!(cat.stdout, "remember the milk10001\n");
    assert_eq!(d.containers().len(), 1);

    // Destroy: both gone; again: succeeds and says so.
    let gone = admin.destroy("life").await.expect("destroy");
    assert!(gone.destroyed);
    assert!(d.containers().is_empty());
    assert!(!exists(&d.workspace_root().join("life")));
    let again = admin.destroy("life").await.expect("destroy again");
    assert_eq!(
        (again.destroyed, again.message.as_str()),
        (false, "Session 'life' was already gone")
    );

    // Lost: the workspace vanishes on the host; reported, never recreated empty.
    let opened = admin
        .open("vanish", "org-l", None, None)
        .await
        .expect("open");
    let v = d.client(opened.token.as_deref().expect("token"));
    v.write("vanish", "a.txt", "x").await.expect("write");
    std::fs::remove_dir_all(d.workspace_root().join("vanish")).expect("delete on the host");
    let view = admin.get("vanish").await.expect("get");
    assert_eq!((view.state, view.workspace_exists), (State::Lost, false));
    for result in [
        v.run("vanish", "ls", None, None, None).await.map(|_| ()),
        v.read("vanish", "a.txt", 0, None).await.map(|_| ()),
    ] {
        match result {
            Err(ClientError::Api {
                status: 410, code, ..
            }) => assert_eq!(code, ErrorCode::SessionLost),
            other => panic!("expected session_lost, got {other:?}"),
        }
    }
    assert!(
        !exists(&d.workspace("vanish")),
        "a lost workspace is never recreated"
    );
    assert!(
        d.containers().is_empty(),
        "a lost session's container is removed"
    );
}

async fn restart_after_kill_9_during_open_converges(backend: Backend) {
    let mut d = Daemon::start_on(backend, &[]);
    let admin = d.admin();
    admin
        .open("steady", "org-k", None, None)
        .await
        .expect("open");
    // Kill sandboxd while opens are in flight: the moment Docker reports the first of their
    // containers created, watched through `docker events`.
    let mut events = std::process::Command::new("docker")
        .args([
            "events",
            "--filter",
            &format!("label=sandboxd.dev/instance={}", d.instance),
            "--filter",
            "event=create",
        ])
        .args(["--format", "{{.Actor.Attributes.name}}"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("docker events");
    // Lines are read on a thread into a channel, so every wait below has a deadline.
    let stdout = events.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let wait_for = |what: &str, within: std::time::Duration| -> bool {
        let deadline = std::time::Instant::now() + within;
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match tokio::task::block_in_place(|| rx.recv_timeout(left)) {
                Ok(line) if line.contains(what) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
        false
    };
    // Prove the subscription is live with probe containers of the same label: the first ones
    // may be created before `docker events` subscribed.
    let mut live = false;
    for attempt in 0..20 {
        let probe = format!("probe-{}-{attempt}", d.instance);
        let made = std::process::Command::new("docker")
            .args([
                "create",
                "--label",
                &format!("sandboxd.dev/instance={}", d.instance),
                "--name",
                &probe,
                &common::base_image(),
                "true",
            ])
            .output()
            .expect("docker create");
        assert!(made.status.success());
        live = wait_for(&probe, std::time::Duration::from_secs(1));
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &probe])
            .output();
        if live {
            break;
        }
    }
    assert!(live, "docker events never reported a probe container");
    let inflight: Vec<_> = (0..4)
        .map(|i| {
            let admin = admin.clone();
            tokio::spawn(
                async move { admin.open(&format!("crash-{i}"), "org-k", None, None).await },
            )
        })
        .collect();
    assert!(
        wait_for("crash-", std::time::Duration::from_secs(60)),
        "no crash- container was created"
    );
    d.process.kill9();
    let _ = events.kill();
    let _ = events.wait();
    for t in inflight {
        let _ = t.await;
    }
    d.spawn();
    let admin = d.admin();
    let sessions = admin.list().await.expect("list after restart");
    let ids: HashSet<_> = sessions.iter().map(|s| s.id.clone()).collect();
    assert!(ids.contains("steady"));
    for s in &sessions {
        assert_ne!(
            s.state,
            State::Opening,
            "no session is stuck opening: {s:?}"
        );
    }
    // Every container belongs to a session the daemon knows, and runs.
    for (_, session, running) in d.containers() {
        assert!(ids.contains(&session), "orphaned container of {session}");
        assert!(running);
    }
    // Every session works again by name, with its workspace.
    for id in &ids {
        let reopened = admin
            .open(id, "org-k", None, None)
            .await
            .expect("reopen by name");
        assert!(!reopened.created);
        let token = admin.rotate_token(id).await.expect("a new token");
        let run = d
            .client(&token)
            .run(id, "echo ok", None, None, None)
            .await
            .expect("runs after restart");
        assert_eq!(run.stdout, "ok\n");
    }
}

async fn oci_runtime_metrics_health_and_persisted_containers(backend: Backend) {
    // runc-alt is a second OCI runtime name the project's dockerd registers (hack/dockerd.sh);
    // crun refuses this machine's hybrid cgroup hierarchy.
    let d = Daemon::start_on(
        backend,
        &[
            ("SANDBOXD_OCI_RUNTIME", "runc-alt"),
            ("SANDBOXD_PERSIST_CONTAINERS", "true"),
        ],
    );
    let admin = d.admin();
    let opened = admin
        .open("crun-1", "org-m", Some("alt"), None)
        .await
        .expect("open on the second runtime");
    assert_eq!(opened.session.runtime, "alt");
    let (container, _, _) = d.containers().into_iter().next().expect("a container");
    let inspect = std::process::Command::new("docker")
        .args(["inspect", "--format", "{{.HostConfig.Runtime}} {{.HostConfig.Init}} {{.HostConfig.NetworkMode}} {{.Config.User}}", &container])
        .output()
        .expect("docker inspect");
    assert_eq!(
        String::from_utf8_lossy(&inspect.stdout).trim(),
        // Docker's init is PID 1 on the exec path; on the agent path the agent is, started as
        // root to bind its socket and the sandbox uid for good before anything runs.
        format!(
            "runc-alt {} none {}",
            backend == Backend::Exec,
            match backend {
                Backend::Exec => "10001:10001",
                Backend::Agent => "0:0",
            }
        )
    );
    let s = d.client(opened.token.as_deref().expect("token"));
    assert_eq!(
        s.run("crun-1", "id -u", None, None, None)
            .await
            .expect("run on the second runtime")
            .stdout,
        "10001\n"
    );
    match s.reclaim("crun-1").await {
        Err(ClientError::Api {
            status: 409, code, ..
        }) => assert_eq!(code, ErrorCode::ContainersPersist),
        other => panic!("expected containers_persist, got {other:?}"),
    }
    let (status, health) = raw(Method::GET, &format!("{}/healthz", d.base), None, None).await;
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));
    let metrics = reqwest::get(format!("{}/metrics", d.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("sandboxd_session_opens_total{outcome=\"created\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("sandboxd_runs_total{outcome=\"exited\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("sandboxd_sessions{state=\"running\"} 1"),
        "{metrics}"
    );
    // Each request is timed by its route as the router names it, not the path asked for; the
    // refused reclaim by its status.
    for line in [
        "sandboxd_http_request_seconds_count{method=\"POST\",route=\"/v1/sessions\",status=\"201\"} 1\n",
        "sandboxd_http_request_seconds_count{method=\"POST\",route=\"/v1/sessions/{id}/reclaim\",status=\"409\"} 1\n",
        "sandboxd_http_request_seconds_count{method=\"GET\",route=\"/healthz\",status=\"200\"} ",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
}

on_both_backends! {
    #[tokio::test]
    thirty_parallel_opens_of_one_name_make_one_container,
    #[tokio::test]
    thirty_parallel_opens_of_a_tenant_at_cap_ten_give_ten,
    #[tokio::test]
    host_cap_and_refusals_carry_their_code_and_message,
    #[tokio::test]
    sleep_wake_reclaim_destroy_and_lost,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    restart_after_kill_9_during_open_converges,
    #[tokio::test]
    oci_runtime_metrics_health_and_persisted_containers,
}

#[tokio::test]
async fn an_open_whose_client_goes_away_still_completes() {
    let d = Daemon::start(&[]);
    // A caller that gives up after a few milliseconds, long before the container exists. Under
    // load it may give up before its request was even read (then nothing was asked of the
    // server): it tries again, with a little more patience each time, until the server has
    // started the open.
    let admin = d.admin();
    let mut patience = std::time::Duration::from_millis(5);
    loop {
        let impatient = reqwest::Client::builder()
            .timeout(patience)
            .build()
            .expect("client");
        let gave_up = impatient
            .post(format!("{}/v1/sessions", d.base))
            .bearer_auth(&d.token)
            .json(&serde_json::json!({"name": "left", "tenant": "org-gone"}))
            .send()
            .await;
        if admin.get("left").await.is_ok() {
            break;
        }
        assert!(
            gave_up.is_err(),
            "the open answered but the session is not there: {gave_up:?}"
        );
        assert!(
            patience < std::time::Duration::from_secs(5),
            "the server never started the open"
        );
        patience *= 2;
    }
    // The open completes on the server anyway: never stuck opening, exactly one container.
    let view = until(
        "the open completed",
        std::time::Duration::from_secs(30),
        || async {
            match admin.get("left").await {
                Ok(v) if v.state != State::Opening => Ok(v),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(view.state, State::Running);
    assert_eq!(d.containers().len(), 1);
    let again = admin
        .open("left", "org-gone", None, None)
        .await
        .expect("open by name");
    assert!(!again.created);
}

/// Asserts `r` is the host's 409 `owner_mismatch` naming session `id`.
fn assert_owner_mismatch<T: std::fmt::Debug>(r: Result<T, ClientError>, id: &str, mine: &str) {
    match r {
        Err(ClientError::Api {
            status: 409,
            code,
            message,
        }) => {
            assert_eq!(code, ErrorCode::OwnerMismatch);
            assert_eq!(
                message,
                format!(
                    "Session '{id}' belongs to another owner than '{mine}': it was not opened, given a token or destroyed for this one"
                )
            );
        }
        other => panic!("expected 409 owner_mismatch, got {other:?}"),
    }
}

#[tokio::test]
async fn an_open_or_rotation_for_another_owner_is_refused_and_the_token_stays() {
    let d = Daemon::start(&[]);
    let admin = d.admin();
    let victim = admin
        .open_as("shared", "org-a", Some("uid-victim"), None, None)
        .await
        .expect("the victim's open");
    assert!(victim.created);
    assert_eq!(victim.session.owner.as_deref(), Some("uid-victim"));
    let token = victim.token.expect("a token on create");
    let own = d.client(&token);
    own.write("shared", "notes/hello.txt", "victim's file")
        .await
        .expect("write");

    // Same name, same tenant, another owner: no attach, no token.
    assert_owner_mismatch(
        admin
            .open_as("shared", "org-a", Some("uid-attacker"), None, None)
            .await,
        "shared",
        "uid-attacker",
    );
    assert_owner_mismatch(
        admin.rotate_token_as("shared", Some("uid-attacker")).await,
        "shared",
        "uid-attacker",
    );
    // The victim's token still works, on the same session.
    assert_eq!(
        own.read("shared", "notes/hello.txt", 0, None)
            .await
            .expect("the victim still reads its file"),
        b"victim's file"
    );
    // Its own owner attaches (found, no token) and may rotate.
    let again = admin
        .open_as("shared", "org-a", Some("uid-victim"), None, None)
        .await
        .expect("the owner's open finds it");
    assert!(!again.created && again.token.is_none());
    let rotated = admin
        .rotate_token_as("shared", Some("uid-victim"))
        .await
        .expect("the owner rotates");
    assert!(
        d.client(&rotated)
            .read("shared", "notes/hello.txt", 0, None)
            .await
            .is_ok()
    );
    assert_eq!(d.containers().len(), 1);
}

#[tokio::test]
async fn a_destroy_for_another_owner_is_refused_and_the_session_still_answers() {
    let d = Daemon::start(&[]);
    let admin = d.admin();
    let opened = admin
        .open_as("kept", "org-a", Some("uid-new"), None, None)
        .await
        .expect("open");
    let token = opened.token.expect("token");
    let own = d.client(&token);
    own.write("kept", "f.txt", "still here")
        .await
        .expect("write");

    // A destroy owed for an older object of the same id leaves the newer one alone.
    assert_owner_mismatch(
        admin.destroy_as("kept", Some("uid-old")).await,
        "kept",
        "uid-old",
    );
    let view = own.get("kept").await.expect("the session still answers");
    assert_eq!(view.state, State::Running);
    assert_eq!(
        own.read("kept", "f.txt", 0, None).await.expect("read"),
        b"still here"
    );
    assert!(exists(&d.workspace("kept")));
    assert_eq!(d.containers().len(), 1);

    // Its own owner destroys it; a second destroy finds it gone.
    let done = admin
        .destroy_as("kept", Some("uid-new"))
        .await
        .expect("the owner destroys");
    assert!(done.destroyed);
    let gone = admin
        .destroy_as("kept", Some("uid-old"))
        .await
        .expect("already gone");
    assert!(!gone.destroyed);
    assert!(d.containers().is_empty());
}

#[tokio::test]
async fn a_session_without_an_owner_is_adopted_by_the_first_owner_that_opens_it() {
    let d = Daemon::start(&[]);
    let admin = d.admin();
    // As before owners existed: an open without one.
    let legacy = admin
        .open("legacy", "org-a", None, None)
        .await
        .expect("open");
    assert_eq!(legacy.session.owner, None);
    let token = legacy.token.expect("token");
    let adopted = admin
        .open_as("legacy", "org-a", Some("uid-first"), None, None)
        .await
        .expect("adopted");
    assert_eq!(adopted.session.owner.as_deref(), Some("uid-first"));
    // The token it had keeps working; a later owner is refused.
    assert!(d.client(&token).get("legacy").await.is_ok());
    assert_owner_mismatch(
        admin
            .open_as("legacy", "org-a", Some("uid-second"), None, None)
            .await,
        "legacy",
        "uid-second",
    );
    // A bad owner is a 400 naming it.
    match admin
        .open_as("legacy", "org-a", Some("has space"), None, None)
        .await
    {
        Err(ClientError::Api {
            status: 400,
            message,
            ..
        }) => {
            assert!(
                message.contains("owner 'has space' is not an owner"),
                "{message}"
            )
        }
        other => panic!("expected 400, got {other:?}"),
    }
}

#[tokio::test]
async fn concurrent_opens_of_one_name_by_two_owners_give_one_sandbox_to_one_of_them() {
    let d = Daemon::start(&[]);
    let admin = d.admin();
    let opens = (0..20).map(|i| {
        let admin = admin.clone();
        let owner = if i % 2 == 0 { "uid-even" } else { "uid-odd" };
        tokio::spawn(async move {
            (
                owner,
                admin
                    .open_as("contested", "org-a", Some(owner), None, None)
                    .await,
            )
        })
    });
    let results: Vec<_> = futures::future::join_all(opens)
        .await
        .into_iter()
        .map(|r| r.expect("task"))
        .collect();
    let created: Vec<_> = results
        .iter()
        .filter(|(_, r)| r.as_ref().is_ok_and(|o| o.created))
        .collect();
    assert_eq!(created.len(), 1, "{results:?}");
    let winner = created[0].0;
    for (owner, r) in &results {
        if *owner == winner {
            let o = r.as_ref().expect("the winner's opens all find it");
            assert_eq!(o.session.owner.as_deref(), Some(winner));
            assert_eq!(o.token.is_some(), o.created);
        } else {
            match r {
                Err(ClientError::Api {
                    status: 409, code, ..
                }) => {
                    assert_eq!(*code, ErrorCode::OwnerMismatch)
                }
                other => panic!("the other owner must be refused, got {other:?}"),
            }
        }
    }
    assert_eq!(d.containers().len(), 1);
}

#[tokio::test]
async fn get_shows_a_container_docker_stopped_or_removed_and_the_next_use_brings_it_back() {
    let d = Daemon::start(&[]);
    let admin = d.admin();
    let opened = admin
        .open("outside", "org-o", None, None)
        .await
        .expect("open");
    let s = d.client(opened.token.as_deref().expect("token"));
    s.write("outside", "kept.txt", "still here")
        .await
        .expect("write");

    // Stopped behind sandboxd's back: shown stopped, and a run starts it again.
    common::docker(&["stop", "-t", "0", &common::container_of(&d, "outside")]);
    assert_eq!(s.get("outside").await.expect("get").state, State::Stopped);
    let back = s
        .run("outside", "cat kept.txt", None, None, None)
        .await
        .expect("a run after docker stop");
    assert_eq!(back.stdout, "still here");
    assert_eq!(s.get("outside").await.expect("get").state, State::Running);

    // Removed behind its back: shown reclaimed, and a run recreates it, files intact.
    common::docker(&["rm", "-f", &common::container_of(&d, "outside")]);
    let seen = s.get("outside").await.expect("get");
    assert_eq!(
        (seen.state, seen.workspace_exists),
        (State::Reclaimed, true)
    );
    let back = s
        .run("outside", "cat kept.txt", None, None, None)
        .await
        .expect("a run after docker rm -f");
    assert_eq!(back.stdout, "still here");
    assert_eq!(s.get("outside").await.expect("get").state, State::Running);
    assert_eq!(d.containers().len(), 1);
}
