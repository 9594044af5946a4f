//! A session's activity feed and what its sandbox uses, end to end against real dockerd: the
//! wire protocol's `GET /sessions/{session_id}/events` (and `/v1`'s twin) lists a run, a write
//! and a read in order as the protocol's own service words them, `after` returns only what is
//! new, a restart of sandboxd keeps the numbering and the entries, another session's token is
//! refused; a session opened again under the same id (a namespace made again) sees none of the
//! earlier holder's rows or events while the admin sees both, on SQLite and on PostgreSQL;
//! oversize fields are cut and flagged; `usage` shows a sandbox holding 100 MiB, and null asleep.

mod common;

use std::time::{Duration, Instant};

use common::{Daemon, postgres_database};
use reqwest::Method;
use sandboxd::storage::audit::{MAX_ID_CHARS, MAX_TARGET_CHARS, OperationQuery};
use sandboxd_api::ErrorCode;
use sandboxd_api::client::ClientError;
use serde_json::{Value, json};

/// A wire request with `X-Sandbox-Token`: its status and JSON body (or text).
async fn wire(
    d: &Daemon,
    method: Method,
    path: &str,
    token: &str,
    body: Option<Vec<u8>>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{}{path}", d.base))
        .header("x-sandbox-token", token);
    if let Some(b) = body {
        let kind = if serde_json::from_slice::<Value>(&b).is_ok() {
            "application/json"
        } else {
            "application/octet-stream"
        };
        req = req.header("content-type", kind).body(b);
    }
    let resp = req.send().await.expect("sandboxd answers");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Opens a session over the wire; its own token.
async fn wire_open(d: &Daemon, id: &str) -> String {
    let (status, body) = wire(
        d,
        Method::POST,
        "/sessions",
        &d.token,
        Some(
            json!({"session_id": id, "tenant": "org-feed"})
                .to_string()
                .into_bytes(),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["token"].as_str().expect("a token").to_owned()
}

/// (seq, op, target, ok, detail) of each event.
fn seen(feed: &Value) -> Vec<(i64, String, String, bool, String)> {
    feed["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| {
            (
                e["seq"].as_i64().expect("seq"),
                e["op"].as_str().expect("op").to_owned(),
                e["target"].as_str().expect("target").to_owned(),
                e["ok"].as_bool().expect("ok"),
                e["detail"].as_str().expect("detail").to_owned(),
            )
        })
        .collect()
}

fn ev(
    seq: i64,
    op: &str,
    target: &str,
    ok: bool,
    detail: &str,
) -> (i64, String, String, bool, String) {
    (seq, op.into(), target.into(), ok, detail.into())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_feed_lists_a_run_a_write_and_a_read_and_outlives_a_restart() {
    let mut d = Daemon::start(&[]);
    let token = wire_open(&d, "feed-1").await;
    let (status, ran) = wire(
        &d,
        Method::POST,
        "/sessions/feed-1/run",
        &token,
        Some(
            json!({"argv": ["sh", "-c", "echo secret-output"], "run_id": format!("{:032x}", 7)})
                .to_string()
                .into_bytes(),
        ),
    )
    .await;
    assert_eq!(
        (status, ran["stdout"].clone()),
        (200, json!("secret-output\n"))
    );
    let (status, _) = wire(
        &d,
        Method::POST,
        "/sessions/feed-1/files/write?path=/workspace/notes.txt",
        &token,
        Some(b"secret-content".to_vec()),
    )
    .await;
    assert_eq!(status, 204);
    let read = |path: &str| json!({ "path": path }).to_string().into_bytes();
    let (status, _) = wire(
        &d,
        Method::POST,
        "/sessions/feed-1/files/read",
        &token,
        Some(read("/workspace/notes.txt")),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = wire(
        &d,
        Method::POST,
        "/sessions/feed-1/files/read",
        &token,
        Some(read("missing.txt")),
    )
    .await;
    assert_eq!(status, 404);

    let (status, feed) = wire(&d, Method::GET, "/sessions/feed-1/events", &token, None).await;
    assert_eq!(status, 200, "{feed}");
    let expected = vec![
        ev(1, "run", "sh -c 'echo secret-output'", true, "exit 0"),
        ev(2, "write", "/workspace/notes.txt", true, ""),
        ev(3, "read", "/workspace/notes.txt", true, ""),
        ev(4, "read", "missing.txt", false, "not found"),
    ];
    assert_eq!(seen(&feed), expected);
    assert_eq!(feed["latest_seq"], json!(4));
    // The protocol's fields and types, and never contents or output.
    let first = feed["events"][0].as_object().expect("an event");
    let mut keys: Vec<&str> = first.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["at", "detail", "duration_ms", "ok", "op", "seq", "target"]
    );
    assert!(
        first["at"].is_f64() && first["duration_ms"].is_f64(),
        "{feed}"
    );
    let text = feed.to_string();
    assert!(
        !text.contains("secret-content") && !text.contains("secret-output\\n"),
        "{text}"
    );

    // after=latest_seq: nothing new; a malformed after as FastAPI answers it.
    let (_, later) = wire(
        &d,
        Method::GET,
        "/sessions/feed-1/events?after=4",
        &token,
        None,
    )
    .await;
    assert_eq!(later, json!({"events": [], "latest_seq": 4}));
    let (_, two) = wire(
        &d,
        Method::GET,
        "/sessions/feed-1/events?after=2",
        &token,
        None,
    )
    .await;
    assert_eq!(seen(&two), expected[2..].to_vec());
    let (status, bad) = wire(
        &d,
        Method::GET,
        "/sessions/feed-1/events?after=-1",
        &token,
        None,
    )
    .await;
    assert_eq!(
        (status, bad),
        (
            422,
            json!({"detail": [{"type": "greater_than_equal", "loc": ["query", "after"], "msg": "Input should be greater than or equal to 0"}]})
        )
    );

    // Another session's token is refused, on both surfaces.
    let other = wire_open(&d, "feed-2").await;
    let (status, refused) = wire(&d, Method::GET, "/sessions/feed-1/events", &other, None).await;
    assert_eq!(status, 401, "{refused}");
    match d.client(&other).events("feed-1", 0).await {
        Err(ClientError::Api { status, code, .. }) => {
            assert_eq!((status, code), (403, ErrorCode::Forbidden));
        }
        other => panic!("another session's token read the feed: {other:?}"),
    }
    // The session's own token on /v1: the same feed.
    let v1 = d.client(&token).events("feed-1", 0).await.expect("v1 feed");
    assert_eq!(serde_json::to_value(&v1).expect("JSON"), feed);

    // A restart keeps the entries and their numbers; the next one goes on from there.
    d.terminate();
    d.spawn();
    let (_, again) = wire(&d, Method::GET, "/sessions/feed-1/events", &token, None).await;
    assert_eq!(again, feed);
    let (status, _) = wire(
        &d,
        Method::POST,
        "/sessions/feed-1/files/list",
        &token,
        Some(read("/workspace")),
    )
    .await;
    assert_eq!(status, 200);
    let (_, next) = wire(
        &d,
        Method::GET,
        "/sessions/feed-1/events?after=4",
        &token,
        None,
    )
    .await;
    assert_eq!(seen(&next), vec![ev(5, "ls", "/workspace", true, "")]);
    assert_eq!(next["latest_seq"], json!(5));
}

/// The attack of a namespace made again: a session is opened, works, is destroyed, and the same
/// id is opened again (for another tenant): its token sees none of the earlier rows or events;
/// the admin sees both incarnations. Oversize fields are cut and flagged, caller labels marked.
async fn incarnations(postgres: Option<String>) {
    let mut env = vec![];
    if let Some(url) = &postgres {
        env.push(("SANDBOXD_AUDIT_DATABASE_URL", url.as_str()));
    }
    let d = Daemon::start(&env);
    let admin = d.admin();
    let first = admin
        .open("inc-1", "org-a", None, None)
        .await
        .expect("open");
    let t1 = d.client(&first.token.expect("token"));
    t1.write("inc-1", "private/plan.txt", "p")
        .await
        .expect("write");
    t1.run("inc-1", "cat private/plan.txt", None, None, None)
        .await
        .expect("run");
    let before = t1
        .operations(&OperationQuery::default())
        .await
        .expect("own rows")
        .operations;
    assert_eq!(before.len(), 2);
    let old_incarnation = before[0].incarnation.clone().expect("an incarnation");
    admin.destroy("inc-1").await.expect("destroy");

    let second = admin
        .open("inc-1", "org-b", None, None)
        .await
        .expect("open again");
    let t2 = d.client(&second.token.expect("token"));
    let mine = t2
        .operations(&OperationQuery::default())
        .await
        .expect("rows");
    assert_eq!(mine.operations, vec![], "the new holder read the old rows");
    let asked = t2
        .operations(&OperationQuery {
            session: Some("inc-1".into()),
            incarnation: Some(old_incarnation.clone()),
            ..Default::default()
        })
        .await;
    match asked {
        Err(ClientError::Api {
            status, message, ..
        }) => assert_eq!(
            (status, message.as_str()),
            (
                403,
                "a session token sees only its own incarnation's operations"
            )
        ),
        other => panic!("the old incarnation's rows were handed out: {other:?}"),
    }
    let feed = t2.events("inc-1", 0).await.expect("feed");
    assert_eq!((feed.events.len(), feed.latest_seq), (0, 0));

    // Oversize fields, and labels the caller made up.
    let long = format!("echo {}", "x".repeat(3000));
    let agent = "a".repeat(500);
    t2.with_actor(Some(&agent), Some("run-1"))
        .run("inc-1", &long, None, None, None)
        .await
        .expect("run");
    let rows = t2
        .operations(&OperationQuery::default())
        .await
        .expect("rows")
        .operations;
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(
        (
            r.target.chars().count(),
            r.target.ends_with('…'),
            r.agent.as_deref().map(|a| a.chars().count()),
            r.run.as_deref(),
            r.truncated,
            r.caller_labels,
        ),
        (
            MAX_TARGET_CHARS + 1,
            true,
            Some(MAX_ID_CHARS + 1),
            Some("run-1"),
            true,
            true
        )
    );
    assert_ne!(r.incarnation.as_deref(), Some(old_incarnation.as_str()));
    let feed = t2.events("inc-1", 0).await.expect("feed");
    assert_eq!(feed.latest_seq, 1);
    assert_eq!(feed.events[0].target, format!("echo {}…", "x".repeat(195)));

    // The admin sees every incarnation.
    let all = admin
        .operations(&OperationQuery {
            session: Some("inc-1".into()),
            ..Default::default()
        })
        .await
        .expect("admin rows")
        .operations;
    assert_eq!(all.len(), 3);
    assert_eq!(
        all.iter()
            .filter(|o| o.incarnation.as_deref() == Some(old_incarnation.as_str()))
            .count(),
        2
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_opened_again_sees_nothing_of_the_one_before_in_sqlite() {
    incarnations(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_opened_again_sees_nothing_of_the_one_before_in_postgres() {
    incarnations(Some(postgres_database().await)).await;
}

/// `sandboxd_usage_samples_total` from `/metrics`.
async fn samples(d: &Daemon) -> u64 {
    let text = reqwest::get(format!("{}/metrics", d.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    text.lines()
        .find_map(|l| l.strip_prefix("sandboxd_usage_samples_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sandboxd_usage_samples_total in {text}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_shows_a_sandbox_holding_100_mib_and_nothing_asleep() {
    let d = Daemon::start(&[]);
    let admin = d.admin();
    let opened = admin
        .open("use-1", "org-use", None, None)
        .await
        .expect("open");
    let s = d.client(&opened.token.expect("token"));
    // A shell holding 110 MB in a variable, then sleeping (a second process).
    let holder = {
        let s = s.clone();
        tokio::spawn(async move {
            s.run(
                "use-1",
                "x=$(head -c 110000000 /dev/zero | tr '\\0' a); echo held > held.txt; sleep 120; echo ${#x}",
                Some(180),
                None,
                None,
            )
            .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.read("use-1", "held.txt", 0, None).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the memory was not held within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let usage = s
        .get("use-1")
        .await
        .expect("get")
        .usage
        .expect("usage of a running sandbox");
    let memory = usage.memory_bytes.expect("memory_bytes");
    assert!(
        memory > 100 << 20,
        "memory_bytes {memory} is not above 100 MiB"
    );
    assert!(usage.memory_limit_bytes.expect("memory_limit_bytes") >= memory);
    assert!(usage.pids.expect("pids") >= 2, "{usage:?}");
    assert!(usage.cpu_percent.is_some(), "{usage:?}");
    // The wire surface: the same figures (from the same sample), in the protocol's shape.
    let (status, info) = wire(&d, Method::GET, "/sessions/use-1", &d.token, None).await;
    assert_eq!(status, 200, "{info}");
    let mut keys: Vec<&str> = info["usage"]
        .as_object()
        .expect("usage")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["cpu_percent", "memory_bytes", "memory_limit_bytes", "pids"]
    );
    assert!(info["usage"]["memory_bytes"].as_u64().expect("memory") > 100 << 20);
    let (_, unasked) = wire(
        &d,
        Method::GET,
        "/sessions/use-1?usage=false",
        &d.token,
        None,
    )
    .await;
    assert_eq!(unasked["usage"], Value::Null);
    // Polling costs no Docker call per request: 20 asks within the 2 s a sample is kept.
    let before = samples(&d).await;
    let started = Instant::now();
    for _ in 0..20 {
        s.get("use-1").await.expect("get");
    }
    let took = started.elapsed();
    let made = samples(&d).await - before;
    assert!(
        made <= 1 + took.as_secs(),
        "{made} Docker stats calls for 20 asks in {took:?}"
    );
    // In the list too.
    let listed = admin.list().await.expect("list");
    assert!(
        listed[0]
            .usage
            .as_ref()
            .and_then(|u| u.memory_bytes)
            .is_some()
    );

    admin.stop("use-1").await.expect("stop");
    let _ = holder.await;
    assert_eq!(s.get("use-1").await.expect("get").usage, None);
    let (_, info) = wire(&d, Method::GET, "/sessions/use-1", &d.token, None).await;
    assert_eq!(info["usage"], Value::Null);
}
