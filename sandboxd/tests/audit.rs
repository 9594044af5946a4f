//! The audit log end to end, the same suite on SQLite (the default, in the state folder) and on
//! a real PostgreSQL (`make up` starts one): a row per read, write, ls, mkdir, remove and
//! execute with agent and run from the headers; a secret written and printed appears nowhere in
//! the store; filters and keyset paging; a session token sees only its session; rows survive a
//! clean shutdown; the retention sweep removes rows older than 30 days. And the live policy.

mod common;

use sandboxd_api::ErrorCode;
use std::time::Duration;

use common::{Daemon, postgres_database, raw};
use rand::Rng;
use reqwest::Method;
use sandboxd::storage::audit::{AuditStore, NewOperation, Op, OperationQuery};
use sandboxd_api::client::{Client, ClientError};
use serde_json::json;
use sqlx::{AssertSqlSafe, Row};

const DAY_MS: i64 = 24 * 60 * 60 * 1000;

/// What a test compares of a row: op, target, ok, exit code, error, bytes.
type Seen<'a> = (Op, &'a str, bool, Option<i64>, Option<&'a str>, Option<i64>);

async fn all(client: &Client, q: OperationQuery) -> Vec<sandboxd::storage::audit::Operation> {
    client.operations(&q).await.expect("operations").operations
}

/// Every text value of every table of the store, for a search.
async fn every_value(store: &AuditStore, state_dir: &std::path::Path) -> Vec<String> {
    let mut values = Vec::new();
    let pool = store.pool();
    let tables: Vec<String> = if store.is_postgres() {
        sqlx::query("SELECT table_name::text AS name FROM information_schema.tables WHERE table_schema = 'public'")
    } else {
        sqlx::query("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    .fetch_all(pool)
    .await
    .expect("tables")
    .iter()
    .map(|r| r.try_get::<String, _>("name").expect("name"))
    .collect();
    assert!(tables.iter().any(|t| t == "operations"), "{tables:?}");
    for t in tables {
        let cast = if store.is_postgres() {
            format!("SELECT CAST(t AS TEXT) AS v FROM \"{t}\" t")
        } else {
            String::new()
        };
        if store.is_postgres() {
            for r in sqlx::query(AssertSqlSafe(cast))
                .fetch_all(pool)
                .await
                .expect("rows")
            {
                values.push(r.try_get::<String, _>("v").expect("row text"));
            }
        }
    }
    // SQLite: the raw bytes of every database file in the state folder (state, audit, WAL);
    // its folders (the egress CA's) hold no database.
    for entry in std::fs::read_dir(state_dir).expect("state dir") {
        let path = entry.expect("entry").path();
        if !path.is_file() {
            continue;
        }
        values.push(String::from_utf8_lossy(&std::fs::read(&path).expect("read")).into_owned());
    }
    values
}

async fn suite(postgres: Option<String>) {
    let mut env = vec![];
    if let Some(url) = &postgres {
        env.push(("SANDBOXD_AUDIT_DATABASE_URL", url.as_str()));
    }
    let mut d = Daemon::start(&env);
    let admin = d.admin();
    let tenant = format!("org-audit-{:08x}", rand::rng().random::<u32>());
    let opened = admin
        .open("aud-1", &tenant, None, None)
        .await
        .expect("open");
    let token = opened.token.clone().expect("token");
    let s = d.client(&token).with_actor(Some("agent-7"), Some("run-42"));
    let secret = format!("s3cret-{:016x}", rand::rng().random::<u64>());

    s.write("aud-1", "notes/secret.txt", secret.clone())
        .await
        .expect("write");
    assert_eq!(
        s.read("aud-1", "notes/secret.txt", 0, None)
            .await
            .expect("read"),
        secret.as_bytes()
    );
    s.ls("aud-1", "notes").await.expect("ls");
    s.mkdir("aud-1", "out").await.expect("mkdir");
    let cat = s
        .run("aud-1", "cat notes/secret.txt", None, None, None)
        .await
        .expect("cat");
    assert_eq!(cat.stdout, secret);
    let failed = s
        .run("aud-1", "ls /no/such/dir", None, None, None)
        .await
        .expect("ls fails");
    assert_eq!(failed.exit_code, 2);
    match s.read("aud-1", "missing.txt", 0, None).await {
        Err(ClientError::Api { code, .. }) => assert_eq!(code, ErrorCode::NotFound),
        other => panic!("expected a refusal, got {other:?}"),
    }
    s.remove("aud-1", "notes/secret.txt", false)
        .await
        .expect("remove");
    // A second session and an admin call with no actor headers.
    let other = admin
        .open("aud-2", &tenant, None, None)
        .await
        .expect("open 2");
    let other_token = other.token.clone().expect("token 2");
    admin
        .run("aud-2", "true", None, None, None)
        .await
        .expect("run 2");

    let rows = all(
        &admin,
        OperationQuery {
            session: Some("aud-1".into()),
            ..Default::default()
        },
    )
    .await;
    let seen: Vec<Seen> = rows
        .iter()
        .rev()
        .map(|o| {
            (
                o.op,
                o.target.as_str(),
                o.ok,
                o.exit_code,
                o.error.as_deref(),
                o.bytes,
            )
        })
        .collect();
    let len = secret.len() as i64;
    assert_eq!(
        seen,
        [
            (Op::Write, "notes/secret.txt", true, None, None, Some(len)),
            (Op::Read, "notes/secret.txt", true, None, None, Some(len)),
            (Op::Ls, "notes", true, None, None, None),
            (Op::Mkdir, "out", true, None, None, None),
            (
                Op::Execute,
                "cat notes/secret.txt",
                true,
                Some(0),
                None,
                None
            ),
            (
                Op::Execute,
                "ls /no/such/dir",
                false,
                Some(2),
                Some("exit 2"),
                None
            ),
            (
                Op::Read,
                "missing.txt",
                false,
                None,
                Some("not_found"),
                None
            ),
            (Op::Remove, "notes/secret.txt", true, None, None, None),
        ]
    );
    assert!(rows.iter().all(|o| o.tenant == tenant
        && o.agent.as_deref() == Some("agent-7")
        && o.run.as_deref() == Some("run-42")
        && o.duration_ms >= 0));

    // Filters.
    let by_tenant = all(
        &admin,
        OperationQuery {
            tenant: Some(tenant.clone()),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(by_tenant.len(), 9);
    assert_eq!(by_tenant[0].session, "aud-2");
    assert_eq!(
        (by_tenant[0].agent.as_deref(), by_tenant[0].run.as_deref()),
        (None, None)
    );
    let failed_only = all(
        &admin,
        OperationQuery {
            tenant: Some(tenant.clone()),
            failed: true,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        failed_only
            .iter()
            .map(|o| o.target.as_str())
            .collect::<Vec<_>>(),
        ["missing.txt", "ls /no/such/dir"]
    );
    let executes = all(
        &admin,
        OperationQuery {
            tenant: Some(tenant.clone()),
            op: Some(Op::Execute),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(executes.len(), 3);
    let search = all(
        &admin,
        OperationQuery {
            tenant: Some(tenant.clone()),
            q: Some("SECRET.txt".into()),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(search.len(), 4, "write, read, cat and remove name it");
    assert_eq!(
        all(
            &admin,
            OperationQuery {
                agent: Some("agent-7".into()),
                tenant: Some(tenant.clone()),
                ..Default::default()
            }
        )
        .await
        .len(),
        8
    );

    // Keyset paging: pages of 3, newest first, nothing twice, nothing left out.
    let mut ids = Vec::new();
    let mut cursor = None;
    let mut pages = 0;
    loop {
        let page = admin
            .operations(&OperationQuery {
                tenant: Some(tenant.clone()),
                limit: Some(3),
                cursor: cursor.clone(),
                ..Default::default()
            })
            .await
            .expect("page");
        pages += 1;
        ids.extend(page.operations.iter().map(|o| o.id));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!((ids.len(), pages), (9, 3));
    assert!(ids.windows(2).all(|w| w[0] > w[1]));
    let (code, body) = raw(
        Method::GET,
        &format!("{}/v1/operations?limit=5000", d.base),
        Some(&d.token),
        None,
    )
    .await;
    assert_eq!(
        (code, body),
        (
            400,
            json!({"code": "bad_request", "message": "limit must be between 1 and 1000"})
        )
    );
    let (code, body) = raw(
        Method::GET,
        &format!("{}/v1/operations?colour=red", d.base),
        Some(&d.token),
        None,
    )
    .await;
    assert_eq!((code, body["code"].as_str()), (400, Some("bad_request")));

    // A session token sees only its own session's rows.
    let own = all(&d.client(&other_token), OperationQuery::default()).await;
    assert_eq!(
        own.iter()
            .map(|o| (o.session.as_str(), o.target.as_str()))
            .collect::<Vec<_>>(),
        [("aud-2", "true")]
    );
    match d
        .client(&other_token)
        .operations(&OperationQuery {
            session: Some("aud-1".into()),
            ..Default::default()
        })
        .await
    {
        Err(ClientError::Api {
            status: 403, code, ..
        }) => assert_eq!(code, ErrorCode::Forbidden),
        other => panic!("expected 403, got {other:?}"),
    }
    let (code, _) = raw(
        Method::GET,
        &format!("{}/v1/operations", d.base),
        None,
        None,
    )
    .await;
    assert_eq!(code, 401);

    // Rows recorded just before a clean shutdown are written.
    for i in 0..50 {
        s.mkdir("aud-1", &format!("burst/{i}"))
            .await
            .expect("mkdir");
    }
    let status = d.terminate();
    assert!(status.success(), "{status:?}");
    let store = AuditStore::open(postgres.as_deref(), &d.state_dir())
        .await
        .expect("the store");
    let burst = store
        .query(&OperationQuery {
            tenant: Some(tenant.clone()),
            q: Some("burst/".into()),
            limit: Some(1000),
            ..Default::default()
        })
        .await
        .expect("query");
    assert_eq!(
        burst.operations.len(),
        50,
        "no row lost on a clean shutdown"
    );

    // The secret appears nowhere in the store: not in any table, column or database file.
    for value in every_value(&store, &d.state_dir()).await {
        assert!(!value.contains(&secret), "the secret was stored");
    }

    // Retention: rows older than 30 days are swept at start (and daily); files stay.
    let now = sandboxd::storage::store::now_ms();
    let old = |days: i64, target: &str| NewOperation {
        at_ms: now - days * DAY_MS,
        session: "aud-1".into(),
        incarnation: String::new(),
        tenant: tenant.clone(),
        agent: None,
        run: None,
        op: Op::Write,
        target: target.into(),
        ok: true,
        exit_code: None,
        error: None,
        bytes: None,
        duration_ms: 1,
    };
    store
        .insert(&[old(31, "swept.txt"), old(29, "kept.txt")])
        .await
        .expect("insert old rows");
    d.spawn();
    let admin = d.admin();
    let swept = common::until("the start-up sweep", Duration::from_secs(30), || async {
        let rows = all(
            &admin,
            OperationQuery {
                tenant: Some(tenant.clone()),
                q: Some(".txt".into()),
                op: Some(Op::Write),
                ..Default::default()
            },
        )
        .await;
        (!rows.iter().any(|o| o.target == "swept.txt")).then_some(rows)
    })
    .await;
    assert_eq!(
        swept.iter().map(|o| o.target.as_str()).collect::<Vec<_>>(),
        ["kept.txt", "notes/secret.txt"]
    );
    assert!(
        d.workspace("aud-1").join("out").is_dir(),
        "the sweep never touches files"
    );
}

#[tokio::test]
async fn audit_log_in_sqlite() {
    suite(None).await;
}

#[tokio::test]
async fn audit_log_in_postgres() {
    suite(Some(postgres_database().await)).await;
}

/// Reads the audit stream of `d` after `after` until `want` rows came; then waits `quiet` for
/// one more, which must not come. Returns the rows' (id, target).
async fn stream_rows(
    d: &Daemon,
    after: Option<i64>,
    want: usize,
    quiet: Duration,
) -> Vec<(i64, String)> {
    use futures::StreamExt;
    let url = match after {
        Some(a) => format!("{}/v1/operations/stream?after={a}", d.base),
        None => format!("{}/v1/operations/stream", d.base),
    };
    let response = reqwest::Client::new()
        .get(&url)
        .bearer_auth(&d.token)
        .send()
        .await
        .expect("the stream answers");
    assert_eq!(response.status().as_u16(), 200, "{url}");
    assert_eq!(
        response.headers()["content-type"].to_str().ok(),
        Some("application/x-ndjson")
    );
    let mut body = response.bytes_stream();
    let mut text = Vec::new();
    let mut rows = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let wait = if rows.len() < want {
            deadline.saturating_duration_since(tokio::time::Instant::now())
        } else {
            quiet
        };
        let chunk = match tokio::time::timeout(wait, body.next()).await {
            Ok(Some(chunk)) => chunk.expect("the stream's bytes"),
            Ok(None) => panic!("the stream ended after {rows:?}"),
            Err(_) if rows.len() >= want => return rows,
            Err(_) => panic!("{} of {want} rows in 30 s: {rows:?}", rows.len()),
        };
        text.extend_from_slice(&chunk);
        while let Some(end) = text.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = text.drain(..=end).collect();
            let row: sandboxd::storage::audit::Operation =
                serde_json::from_slice(&line).expect("each line is a row");
            rows.push((row.id, row.target));
        }
        assert!(rows.len() <= want, "more rows than happened: {rows:?}");
    }
}

/// A SIEM follows the audit log as JSON lines: the rows so far, then each new one; cut off, it
/// resumes from the id of the last line it read, also across a restart of sandboxd, and gets
/// every row after it once, in order.
async fn the_audit_stream_resumes_from_its_cursor_after_a_restart(postgres: Option<String>) {
    let mut env = vec![];
    if let Some(url) = &postgres {
        env.push(("SANDBOXD_AUDIT_DATABASE_URL", url.as_str()));
    }
    let mut d = Daemon::start(&env);
    let tenant = format!("org-stream-{:08x}", rand::rng().random::<u32>());
    d.admin()
        .open("stream-1", &tenant, None, None)
        .await
        .expect("open");
    for i in 0..5 {
        d.admin()
            .mkdir("stream-1", &format!("a/{i}"))
            .await
            .expect("mkdir");
    }
    let first = stream_rows(&d, None, 5, Duration::from_secs(2)).await;
    assert_eq!(
        first.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>(),
        ["a/0", "a/1", "a/2", "a/3", "a/4"]
    );
    let cursor = first.last().map(|(id, _)| *id);

    // The reader is gone; rows go on, sandboxd restarts (a clean stop writes what it queued),
    // and more rows come after it.
    for i in 0..3 {
        d.admin()
            .mkdir("stream-1", &format!("b/{i}"))
            .await
            .expect("mkdir");
    }
    let status = d.terminate();
    assert!(status.success(), "{status:?}");
    d.launch().expect("sandboxd starts again");
    for i in 0..3 {
        d.admin()
            .mkdir("stream-1", &format!("c/{i}"))
            .await
            .expect("mkdir after the restart");
    }
    let resumed = stream_rows(&d, cursor, 6, Duration::from_secs(2)).await;
    assert_eq!(
        resumed.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>(),
        ["b/0", "b/1", "b/2", "c/0", "c/1", "c/2"],
        "every row after the cursor, once, in order"
    );
    assert!(
        resumed.windows(2).all(|w| w[0].0 < w[1].0) && resumed[0].0 > cursor.unwrap_or(0),
        "{resumed:?}"
    );
    // A row written while the stream is open comes down it.
    let follower = tokio::spawn({
        let base = d.base.clone();
        let token = d.token.clone();
        let after = resumed.last().map(|(id, _)| *id);
        async move {
            let client = Client::new(&base, &token);
            tokio::time::sleep(Duration::from_millis(500)).await;
            client.mkdir("stream-1", "d/live").await.expect("mkdir");
            after
        }
    });
    let after = resumed.last().map(|(id, _)| *id);
    let live = stream_rows(&d, after, 1, Duration::from_secs(1)).await;
    assert_eq!(live[0].1, "d/live");
    follower.await.expect("the writer");

    // Only the admin reads it; a cursor this server never gave out is refused, saying why.
    let session_token = d
        .admin()
        .open("stream-2", &tenant, None, None)
        .await
        .expect("open")
        .token
        .expect("token");
    let (code, _) = raw(
        Method::GET,
        &format!("{}/v1/operations/stream", d.base),
        Some(&session_token),
        None,
    )
    .await;
    assert_eq!(code, 403);
    let (code, body) = raw(
        Method::GET,
        &format!("{}/v1/operations/stream?after=yesterday", d.base),
        Some(&d.token),
        None,
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(
        body["message"],
        "after 'yesterday' is not a row id; pass the id of the last row received"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_stream_in_sqlite() {
    the_audit_stream_resumes_from_its_cursor_after_a_restart(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_stream_in_postgres() {
    the_audit_stream_resumes_from_its_cursor_after_a_restart(Some(postgres_database().await)).await;
}

#[tokio::test]
async fn audit_off_records_nothing() {
    let d = Daemon::start(&[("SANDBOXD_AUDIT", "false")]);
    let admin = d.admin();
    admin
        .open("off-1", "org-off", None, None)
        .await
        .expect("open");
    admin
        .run("off-1", "true", None, None, None)
        .await
        .expect("run");
    assert!(all(&admin, OperationQuery::default()).await.is_empty());
    assert!(!d.state_dir().join("audit.db").exists());
}

#[tokio::test]
async fn policy_caps_and_lifetimes_change_live_isolation_is_refused() {
    let d = Daemon::start(&[]);
    let admin = d.admin();
    let before = admin.policy().await.expect("policy");
    assert_eq!(
        (
            before.policy.max_sessions,
            before.policy.max_sessions_per_tenant,
            before.policy.execute_timeout
        ),
        (20, 10, 300)
    );
    assert_eq!(
        (
            before.fixed.network_mode.as_str(),
            before.fixed.sandbox_uid,
            before.fixed.work_dir.as_str()
        ),
        ("none", 10001, "/workspace")
    );
    assert_eq!(before.fixed.runtimes, ["base", "alt"]);

    let after = admin
        .put_policy(&json!({"max_sessions_per_tenant": 1, "execute_timeout": 1}))
        .await
        .expect("changed");
    assert_eq!(
        (
            after.policy.max_sessions_per_tenant,
            after.policy.execute_timeout
        ),
        (1, 1)
    );
    let opened = admin
        .open("pol-1", "org-pol", None, None)
        .await
        .expect("open");
    match admin.open("pol-2", "org-pol", None, None).await {
        Err(ClientError::Api {
            status: 429,
            code,
            message,
        }) => {
            assert_eq!(code, ErrorCode::TenantCap);
            assert_eq!(
                message,
                "Tenant 'org-pol' already holds 1 of 1 sessions. Release an idle session before opening another."
            );
        }
        other => panic!("expected the new cap, got {other:?}"),
    }
    let slow = admin
        .run("pol-1", "sleep 5", Some(60), None, None)
        .await
        .expect("run");
    assert!(slow.timed_out, "the new lifetime applies: {slow:?}");

    for (field, variable) in [
        ("network_mode", "SANDBOXD_NETWORK_MODE"),
        ("oci_runtime", "SANDBOXD_OCI_RUNTIME"),
        ("sandbox_uid", "SANDBOXD_SANDBOX_UID"),
        ("work_dir", "the image (it is always /workspace)"),
        ("persist_containers", "SANDBOXD_PERSIST_CONTAINERS"),
        ("runtimes", "PUT /v1/runtimes or SANDBOXD_RUNTIMES"),
    ] {
        let (code, body) = raw(
            Method::PUT,
            &format!("{}/v1/policy", d.base),
            Some(&d.token),
            Some(&json!({field: "x", "max_sessions": 3}).to_string()),
        )
        .await;
        assert_eq!(
            (code, body),
            (
                422,
                json!({"code": "policy_refused", "message": format!("The policy was not changed: {field} cannot change at runtime (it is an isolation decision); restart sandboxd with {variable}")})
            ),
        );
    }
    assert_eq!(
        admin.policy().await.expect("policy").policy.max_sessions,
        20,
        "a refused change applies nothing"
    );
    let session = d.client(opened.token.as_deref().expect("token"));
    match session.put_policy(&json!({"max_sessions": 1})).await {
        Err(ClientError::Api {
            status: 403, code, ..
        }) => assert_eq!(code, ErrorCode::Forbidden),
        other => panic!("expected 403, got {other:?}"),
    }
}
