//! A hostile client of sandboxd's HTTP surfaces, against a real sandboxd on the real dockerd:
//! anonymous uploads the size of the write cap, uploads over their caps, a slowloris client, a
//! body that stalls, a policy past its bounds, an audit store that hangs. Each test is the
//! attack, and asserts what the attacker and everyone else see: the exact refusal, sandboxd's
//! memory, another session still answering.
//!
//! Over 600 lines: one test an attack, sharing this file's fixtures.

mod common;

use std::time::{Duration, Instant};

use common::{Daemon, raw};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// sandboxd's resident memory stays under this during the uploads (it holds at most a few
/// MiB per request; four anonymous 256 MiB bodies buffered whole would be over 1 GiB).
const RSS_BOUND_KIB: u64 = 150 * 1024;
/// ...and grows by less than this (it measures about 1 MiB for eight refused uploads).
const RSS_GROWTH_KIB: u64 = 64 * 1024;

/// 256 MiB, the largest file write.
const BIG: u64 = 256 * 1024 * 1024;

fn addr(d: &Daemon) -> String {
    d.base
        .strip_prefix("http://")
        .expect("an http:// base")
        .to_owned()
}

/// VmRSS of the sandboxd process, KiB.
fn rss_kib(d: &Daemon) -> u64 {
    let pid = d.process.pid().expect("a running sandboxd");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

/// Samples sandboxd's RSS every 20 ms until `done` completes; returns the peak, KiB.
async fn peak_rss_during<T>(d: &Daemon, done: impl std::future::Future<Output = T>) -> (T, u64) {
    let mut done = std::pin::pin!(done);
    let mut peak = rss_kib(d);
    loop {
        tokio::select! {
            out = &mut done => return (out, peak.max(rss_kib(d))),
            () = tokio::time::sleep(Duration::from_millis(20)) => peak = peak.max(rss_kib(d)),
        }
    }
}

/// What a raw request got back.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// The status line and headers, lowercased.
    head: String,
    body: Value,
    /// Bytes of the body the client managed to send before sandboxd answered and closed.
    sent: u64,
}

/// Sends `head` (request line and headers, without the blank line) and then up to `total`
/// bytes of body (chunked when `chunked`), reading the answer meanwhile; sandboxd may answer
/// and close before the body is sent, as it should when it refuses one.
async fn upload(addr: &str, head: &str, total: u64, chunked: bool) -> Answer {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut rd, mut wr) = stream.into_split();
    let framing = if chunked {
        "Transfer-Encoding: chunked".to_owned()
    } else {
        format!("Content-Length: {total}")
    };
    let head = format!("{head}\r\nHost: sandboxd\r\n{framing}\r\n\r\n");
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = sent.clone();
    let writer = tokio::spawn(async move {
        if wr.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let block = vec![b'x'; 64 * 1024];
        let mut done = 0u64;
        while done < total {
            let n = (total - done).min(block.len() as u64) as usize;
            let wrote = if chunked {
                let mut chunk = format!("{n:x}\r\n").into_bytes();
                chunk.extend_from_slice(&block[..n]);
                chunk.extend_from_slice(b"\r\n");
                wr.write_all(&chunk).await
            } else {
                wr.write_all(&block[..n]).await
            };
            if wrote.is_err() {
                return;
            }
            done += n as u64;
            counted.store(done, std::sync::atomic::Ordering::Relaxed);
        }
        if chunked {
            let _ = wr.write_all(b"0\r\n\r\n").await;
        }
    });
    let mut response = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => response.extend_from_slice(&buf[..n]),
            }
            if complete(&response) {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer within 60 s");
    // The sender is done soon after the answer: an anonymous body is not read on (the
    // connection closes and the sender fails), an authenticated one is drained before the
    // answer (the sender got through whole).
    if tokio::time::timeout(Duration::from_secs(20), writer)
        .await
        .is_err()
    {
        panic!("the client was still sending 20 s after the answer");
    }
    let (status, body) = parse(&response);
    let head = String::from_utf8_lossy(&response)
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    Answer {
        status,
        head,
        body,
        sent: sent.load(std::sync::atomic::Ordering::Relaxed),
    }
}

/// Whether `r` holds a whole response with a Content-Length body.
fn complete(r: &[u8]) -> bool {
    let Some(end) = r.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&r[..end]).to_ascii_lowercase();
    head.lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .is_some_and(|n| r.len() >= end + 4 + n)
}

fn parse(r: &[u8]) -> (u16, Value) {
    let text = String::from_utf8_lossy(r);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"));
    let body = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()));
    (status, body)
}

/// Reads until the server closes the connection; how long that took. Panics past `limit`.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> (Duration, Vec<u8>) {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => panic!("the connection was still open after {limit:?}"),
            Ok(Ok(0) | Err(_)) => return (started.elapsed(), got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

async fn open(d: &Daemon, name: &str) -> String {
    d.admin()
        .open(name, "org", None, None)
        .await
        .expect("open")
        .token
        .expect("a token")
}

fn unauthorized_v1() -> Value {
    json!({"code": "unauthorized", "message": "a valid token is required: send Authorization: Bearer <token>"})
}

fn unauthorized_wire() -> Value {
    json!({"detail": "Invalid or missing sandbox token"})
}

/// Eight anonymous (or wrongly tokened) 256 MiB uploads at once, four to the wire protocol's
/// `files/write` and four to `/v1`'s file write, declared and chunked: each is refused with 401
/// before its body is read, sandboxd's memory stays under the bound, nothing is written, and
/// the session goes on answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn anonymous_uploads_are_refused_before_their_bodies_are_read() {
    let d = Daemon::start(&[]);
    let token = open(&d, "victim").await;
    let a = addr(&d);
    let attacks = [
        (
            "POST /sessions/victim/files/write?path=big.bin HTTP/1.1",
            false,
            false,
        ),
        (
            "POST /sessions/victim/files/write?path=big.bin HTTP/1.1\r\nX-Sandbox-Token: sbx_guessed",
            false,
            false,
        ),
        (
            "POST /sessions/victim/files/write?path=big.bin HTTP/1.1",
            true,
            false,
        ),
        (
            "POST /sessions/victim/files/write?path=big.bin HTTP/1.1\r\nAuthorization: Bearer sbx_guessed",
            true,
            false,
        ),
        (
            "PUT /v1/sessions/victim/files/big.bin HTTP/1.1",
            false,
            true,
        ),
        (
            "PUT /v1/sessions/victim/files/big.bin HTTP/1.1\r\nAuthorization: Bearer sbx_guessed",
            false,
            true,
        ),
        ("PUT /v1/sessions/victim/files/big.bin HTTP/1.1", true, true),
        (
            "PUT /v1/sessions/victim/files/big.bin HTTP/1.1\r\nX-Sandbox-Token: sbx_guessed",
            true,
            true,
        ),
    ];
    let before = rss_kib(&d);
    let (answers, peak) = peak_rss_during(
        &d,
        futures::future::join_all(
            attacks
                .iter()
                .map(|(head, chunked, _)| upload(&a, head, BIG, *chunked)),
        ),
    )
    .await;
    for ((head, _, v1), answer) in attacks.iter().zip(&answers) {
        let expected = if *v1 {
            unauthorized_v1()
        } else {
            unauthorized_wire()
        };
        assert_eq!((answer.status, &answer.body), (401, &expected), "{head}");
        assert!(
            answer.sent < BIG,
            "{head}: sandboxd read the whole body ({} bytes)",
            answer.sent
        );
        // The body is left unread, so the connection ends with the answer, and says so.
        assert!(
            answer.head.contains("\r\nconnection: close"),
            "{head}: {}",
            answer.head
        );
    }
    assert!(
        peak < RSS_BOUND_KIB && peak.saturating_sub(before) < RSS_GROWTH_KIB,
        "sandboxd's RSS went from {before} KiB to {peak} KiB (bounds: {RSS_BOUND_KIB} KiB, {RSS_GROWTH_KIB} KiB more)"
    );
    assert!(!common::exists(&d.workspace("victim").join("big.bin")));
    // The session answers as before.
    let run = d
        .client(&token)
        .run("victim", "echo still here", None, None, None)
        .await
        .expect("a run");
    assert_eq!(run.stdout, "still here\n");
}

/// An authenticated client sends more than a route takes: a declared length over the cap is
/// refused at once (413 on `/v1`; on the wire protocol 409 "larger than a native write", the
/// answer its client takes to write through the sandbox instead); a chunked body is refused as
/// soon as it passes the cap; sandboxd's memory stays bounded and the file stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn authenticated_uploads_over_their_caps_are_refused_as_the_cap_is_passed() {
    let d = Daemon::start(&[("SANDBOXD_MAX_READ_BYTES", "1048576")]);
    let token = open(&d, "writer").await;
    let a = addr(&d);
    let v1_write =
        format!("PUT /v1/sessions/writer/files/big.bin HTTP/1.1\r\nAuthorization: Bearer {token}");
    let wire_write = format!(
        "POST /sessions/writer/files/write?path=big.bin HTTP/1.1\r\nX-Sandbox-Token: {token}"
    );
    let v1_run = format!("POST /v1/sessions/writer/runs HTTP/1.1\r\nAuthorization: Bearer {token}");
    let too_large_v1 =
        json!({"code": "too_large", "message": format!("a file write takes at most {BIG} bytes")});
    let not_native = json!({"detail": "larger than a native write"});
    let request_too_large =
        json!({"code": "too_large", "message": "a request body takes at most 2097152 bytes"});

    let before = rss_kib(&d);
    let (answers, peak) = peak_rss_during(&d, async {
        futures::future::join_all([
            upload(&a, &v1_write, BIG + 1, false),
            upload(&a, &wire_write, BIG, false),
            upload(&a, &wire_write, 3 * 1024 * 1024, true),
            upload(&a, &v1_run, BIG, false),
            upload(&a, &v1_run, 3 * 1024 * 1024, true),
            upload(&a, &v1_write, BIG + 64 * 1024 * 1024, true),
        ])
        .await
    })
    .await;
    let expected = [
        (413, &too_large_v1),
        (409, &not_native),
        (409, &not_native),
        (413, &request_too_large),
        (413, &request_too_large),
        (413, &too_large_v1),
    ];
    for (i, (answer, (status, body))) in answers.iter().zip(expected).enumerate() {
        assert_eq!((answer.status, &answer.body), (status, body), "upload {i}");
    }
    // Refused as the cap is passed (a declared length before a byte of the body), and what
    // is left of each body is then read and dropped, never kept (the lingering close): every
    // client sent its body whole and read the status, as one that reads only after sending
    // (Python's urllib) must.
    let totals = [
        BIG + 1,
        BIG,
        3 * 1024 * 1024,
        BIG,
        3 * 1024 * 1024,
        BIG + 64 * 1024 * 1024,
    ];
    for (i, (answer, total)) in answers.iter().zip(totals).enumerate() {
        assert_eq!(answer.sent, total, "upload {i}");
    }
    assert!(
        peak < RSS_BOUND_KIB && peak.saturating_sub(before) < RSS_GROWTH_KIB,
        "sandboxd's RSS went from {before} KiB to {peak} KiB"
    );
    assert!(!common::exists(&d.workspace("writer").join("big.bin")));
    let (status, _) = raw(
        Method::GET,
        &format!("{}/v1/sessions/writer/ls", d.base),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(status, 200);
}

/// Twenty slowloris connections (half a header, then nothing) are each disconnected within the
/// header timeout, while a session's requests keep answering promptly meanwhile; a connection
/// that sends nothing is closed after the idle timeout, and so is a kept-alive one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slowloris_client_is_disconnected_within_the_header_timeout() {
    let d = Daemon::start(&[
        ("SANDBOXD_HEADER_TIMEOUT", "2"),
        ("SANDBOXD_IDLE_TIMEOUT", "4"),
        ("SANDBOXD_BODY_TIMEOUT", "30"),
    ]);
    let token = open(&d, "bystander").await;
    let a = addr(&d);
    let mut slow = Vec::new();
    for i in 0..20 {
        let mut s = TcpStream::connect(&a).await.expect("connect");
        s.write_all(
            format!("GET /v1/sessions/bystander HTTP/1.1\r\nHost: sandboxd\r\nX-Slow-{i}: ")
                .as_bytes(),
        )
        .await
        .expect("half a header");
        slow.push(s);
    }
    let sent = Instant::now();
    let bystander = d.client(&token);
    let mut answered = 0;
    while sent.elapsed() < Duration::from_millis(1500) {
        let asked = Instant::now();
        bystander
            .get("bystander")
            .await
            .expect("the session answers");
        assert!(
            asked.elapsed() < Duration::from_secs(3),
            "took {:?}",
            asked.elapsed()
        );
        answered += 1;
    }
    assert!(answered > 3, "only {answered} answers in 1.5 s");
    for mut s in slow {
        let (_, got) = closed_within(
            &mut s,
            Duration::from_secs(5).saturating_sub(sent.elapsed()),
        )
        .await;
        assert!(
            got.is_empty(),
            "a slowloris connection got {:?}",
            String::from_utf8_lossy(&got)
        );
    }
    let cut = sent.elapsed();
    assert!(
        cut >= Duration::from_millis(1900),
        "cut after {cut:?}, before the header timeout"
    );

    // Nothing sent at all: the idle timeout, not the header timeout.
    let mut silent = TcpStream::connect(&a).await.expect("connect");
    let (took, _) = closed_within(&mut silent, Duration::from_secs(7)).await;
    assert!(
        took >= Duration::from_millis(3800),
        "a silent connection was cut after {took:?}"
    );

    // One request answered, then the connection is kept alive until the idle timeout.
    let mut kept = TcpStream::connect(&a).await.expect("connect");
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: sandboxd\r\n\r\n")
        .await
        .expect("a request");
    let (took, got) = closed_within(&mut kept, Duration::from_secs(7)).await;
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    assert!(
        took >= Duration::from_millis(3800),
        "a kept-alive connection was cut after {took:?}"
    );
}

/// A client that sends its headers and part of a body, then stalls: the read fails after the
/// body timeout, the client gets a 400 saying so, the connection is closed, and nothing is
/// written. On both surfaces, for a file write and for a JSON request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_body_is_cut_after_the_body_timeout() {
    let d = Daemon::start(&[
        ("SANDBOXD_BODY_TIMEOUT", "2"),
        ("SANDBOXD_HEADER_TIMEOUT", "30"),
        ("SANDBOXD_IDLE_TIMEOUT", "30"),
    ]);
    let token = open(&d, "staller").await;
    let a = addr(&d);
    let stalled = "no byte of the request body arrived for 2 s (SANDBOXD_BODY_TIMEOUT); the connection is closed";
    let cases = [
        (
            format!(
                "PUT /v1/sessions/staller/files/half.txt HTTP/1.1\r\nAuthorization: Bearer {token}"
            ),
            "v1 write",
        ),
        (
            format!(
                "POST /sessions/staller/files/write?path=half.txt HTTP/1.1\r\nX-Sandbox-Token: {token}"
            ),
            "wire write",
        ),
        (
            format!("POST /v1/sessions/staller/runs HTTP/1.1\r\nAuthorization: Bearer {token}"),
            "v1 run",
        ),
    ];
    let mut tasks = Vec::new();
    for (head, what) in cases {
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(&a).await.expect("connect");
            s.write_all(
                format!("{head}\r\nHost: sandboxd\r\nContent-Length: 1000\r\n\r\n{{\"comm")
                    .as_bytes(),
            )
            .await
            .expect("headers and a bit");
            let (took, got) = closed_within(&mut s, Duration::from_secs(6)).await;
            (what, took, parse(&got))
        }));
    }
    for t in tasks {
        let (what, took, (status, body)) = t.await.expect("the task");
        assert!(
            took >= Duration::from_millis(1900),
            "{what}: cut after {took:?}"
        );
        let expected = match what {
            "v1 write" => {
                json!({"code": "bad_request", "message": format!("the body broke off after 6 bytes: {stalled}")})
            }
            "wire write" => {
                json!({"detail": format!("the body broke off after 6 bytes: {stalled}")})
            }
            _ => {
                json!({"code": "bad_request", "message": format!("the request body could not be read: {stalled}")})
            }
        };
        assert_eq!((status, body), (400, expected), "{what}");
    }
    assert!(!common::exists(&d.workspace("staller").join("half.txt")));
    d.client(&token)
        .get("staller")
        .await
        .expect("the session answers");
}

/// A request in progress is not idle: a run that waits for its command longer than every
/// timeout, and a streamed run whose output comes slower than them, both complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runs_longer_than_the_timeouts_keep_their_connections() {
    let d = Daemon::start(&[
        ("SANDBOXD_HEADER_TIMEOUT", "1"),
        ("SANDBOXD_BODY_TIMEOUT", "1"),
        ("SANDBOXD_IDLE_TIMEOUT", "1"),
    ]);
    let token = open(&d, "patient").await;
    let c = d.client(&token);
    let quiet = c
        .run("patient", "sleep 3; echo done", None, None, None)
        .await
        .expect("a quiet run of 3 s");
    assert_eq!((quiet.exit_code, quiet.stdout.as_str()), (0, "done\n"));

    let resp = reqwest::Client::new()
        .post(format!("{}/v1/sessions/patient/runs?stream=true", d.base))
        .bearer_auth(&token)
        .json(&json!({"command": "for i in 1 2 3; do echo $i; sleep 1.5; done"}))
        .send()
        .await
        .expect("a streamed run");
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.expect("the whole stream");
    let last: Value = serde_json::from_str(text.lines().last().expect("lines")).expect("json");
    assert_eq!(
        (last["type"].as_str(), last["exit_code"].as_i64()),
        (Some("exit"), Some(0)),
        "{text}"
    );
    assert!(text.contains("\"3\\n\""), "{text}");
}

/// A policy past its bounds (`u64::MAX`, and each live field one over its bound) is refused
/// with 422 naming the field and the bound, on `/v1` and on the wire protocol, and the policy
/// stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_past_its_bounds_is_refused_and_nothing_changes() {
    let d = Daemon::start(&[]);
    let admin = d.admin();
    let before = admin.policy().await.expect("the policy");
    let url = format!("{}/v1/policy", d.base);
    for (field, _, max, unit) in sandboxd::service::policy::BOUNDS {
        for value in [json!(u64::MAX), json!(max + 1)] {
            let (status, body) = raw(
                Method::PUT,
                &url,
                Some(&d.token),
                Some(&json!({ field: value }).to_string()),
            )
            .await;
            assert_eq!(
                (status, body),
                (
                    422,
                    json!({"code": "policy_refused", "message": format!("The policy was not changed: {field} must be at most {max} {unit}")})
                )
            );
        }
    }
    let (status, body) = raw(
        Method::PUT,
        &url,
        Some(&d.token),
        Some(&json!({"execute_timeout": u64::MAX, "max_sessions": 3}).to_string()),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(admin.policy().await.expect("the policy"), before);

    // The wire protocol's PUT /policy: a validation error in its shape.
    let resp = reqwest::Client::new()
        .put(format!("{}/policy", d.base))
        .header("X-Sandbox-Token", &d.token)
        .json(&json!({"execute_timeout": u64::MAX}))
        .send()
        .await
        .expect("an answer");
    assert_eq!(resp.status(), 422);
    assert_eq!(
        resp.json::<Value>().await.expect("json"),
        json!({"detail": [{"type": "less_than_equal", "loc": ["body", "execute_timeout"], "msg": "Input should be less than or equal to 86400"}]})
    );
    assert_eq!(admin.policy().await.expect("the policy"), before);
    // At the bound it is taken.
    let at = admin
        .put_policy(&json!({"execute_timeout": 86_400}))
        .await
        .expect("the bound itself");
    assert_eq!(at.policy.execute_timeout, 86_400);
}

/// `sandboxd_audit_rows_dropped_total` as `/metrics` shows it.
async fn rows_dropped(d: &Daemon) -> u64 {
    let text = reqwest::get(format!("{}/metrics", d.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix("sandboxd_audit_rows_dropped_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sandboxd_audit_rows_dropped_total in {text}"))
}

/// The audit store stops answering (its table locked by another transaction on the real
/// PostgreSQL): writes go on answering promptly, the audit queue holds what it can
/// (`SANDBOXD_AUDIT_QUEUE=4`), the rest is dropped and counted in
/// `sandboxd_audit_rows_dropped_total`; once the store answers again, rows are written again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_audit_store_drops_rows_and_counts_them_without_stalling_requests() {
    let url = common::postgres_database().await;
    let d = Daemon::start(&[
        ("SANDBOXD_AUDIT_DATABASE_URL", url.as_str()),
        ("SANDBOXD_AUDIT_QUEUE", "4"),
    ]);
    let token = open(&d, "audited").await;
    let c = d.client(&token);
    assert_eq!(rows_dropped(&d).await, 0);

    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("the audit database");
    let mut lock = pool.begin().await.expect("a transaction");
    sqlx::query("LOCK TABLE operations IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .expect("lock the audit table");
    for i in 0..50 {
        let asked = Instant::now();
        c.write("audited", &format!("f{i}.txt"), "x")
            .await
            .expect("a write while the audit store hangs");
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "write {i} took {:?}",
            asked.elapsed()
        );
    }
    // The writer holds the rows it took (waiting on the lock; one, unless it was slow to start)
    // and the queue four: the rest are dropped.
    let dropped = rows_dropped(&d).await;
    assert!((40..=46).contains(&dropped), "{dropped} rows dropped");

    lock.rollback().await.expect("unlock");
    let query = sandboxd::storage::audit::OperationQuery {
        session: Some("audited".into()),
        ..Default::default()
    };
    // A query waits for the queue to be written; a row recorded after that is kept again.
    let page = d.admin().operations(&query).await.expect("the audit log");
    assert_eq!(page.operations.len() as u64, 50 - dropped);
    c.write("audited", "after.txt", "x").await.expect("a write");
    let page = d.admin().operations(&query).await.expect("the audit log");
    let targets: Vec<&str> = page.operations.iter().map(|o| o.target.as_str()).collect();
    assert_eq!(targets.first(), Some(&"after.txt"), "{targets:?}");
    assert_eq!(targets.len() as u64, 51 - dropped, "{targets:?}");
    assert_eq!(rows_dropped(&d).await, dropped);
}
