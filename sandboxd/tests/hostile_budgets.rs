//! A hostile tenant against sandboxd's own resources, on the real dockerd: file work that
//! never ends (a recursive remove of a folder the sandbox keeps refilling, hundreds of them at
//! once) and memory held by slow readers. Each test is the attack, and asserts what the other
//! tenants see: their `ls` and `read` still answer promptly, sandboxd's memory stays within its
//! budget, and the attacker gets 503s with words instead of taking the node. Refused writes
//! reach ordinary clients (`urllib`, `requests`, `httpx`) as their status, not a broken pipe.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Daemon, hack_path};
use sandboxd_api::Limits;

/// sandboxd's resident memory, bytes.
fn rss(d: &Daemon) -> u64 {
    let pid = d.process.pid().expect("sandboxd runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

/// A request by hand: the status line's code and the body, read whole.
async fn request(d: &Daemon, method: reqwest::Method, path: &str, token: &str) -> (u16, String) {
    let resp = reqwest::Client::new()
        .request(method, format!("{}{path}", d.base))
        .bearer_auth(token)
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("sandboxd answers");
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap_or_default())
}

/// 600 recursive removes of a folder the sandbox keeps refilling, on a workspace disk (where a
/// remove cannot be moved into the trash and is deleted in place): each ends by its deadline
/// or is refused at once with words, and meanwhile another session's `ls` and `read` answer
/// within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refilled_folder_and_600_removes_leave_another_session_answering() {
    let d = Daemon::start(&[
        ("SANDBOXD_WORKSPACE_QUOTA", "loop"),
        ("SANDBOXD_WORKSPACE_SIZE", "256m"),
        ("SANDBOXD_FILE_DEADLINE", "3"),
        ("SANDBOXD_EXECUTE_TIMEOUT", "120"),
        // A sandbox's share of a node's cores; this machine has two in all.
        ("SANDBOXD_CPUS", "0.5"),
        // The flood's 600 connections come from one address.
        ("SANDBOXD_MAX_CONNECTIONS_PER_SOURCE", "1000"),
    ]);
    let admin = d.admin();
    let a = admin
        .open("refill", "org-attack", None, None)
        .await
        .expect("the attacker's session");
    let a_token = a.token.expect("token");
    let b = admin
        .open("bystander", "org-other", None, None)
        .await
        .expect("another tenant's session");
    let b_token = b.token.expect("token");
    let bc = d.client(&b_token);
    bc.write("bystander", "notes.txt", b"still here".to_vec())
        .await
        .expect("write");

    // The sandbox refills the folder for as long as the test runs.
    let refiller = {
        let client = d.client(&a_token);
        tokio::spawn(async move {
            client
                .run(
                    "refill",
                    "for w in 1 2 3; do perl -e 'for (;;) { mkdir \"/workspace/d\"; \
                     for $i (1..300) { open(F, \">/workspace/d/f$ARGV[0]-$i\"); close F; \
                     mkdir \"/workspace/d/a$ARGV[0]\"; mkdir \"/workspace/d/a$ARGV[0]/b$i\"; } }' $w & \
                     done; wait",
                    Some(100),
                    None,
                    None,
                )
                .await
        })
    };
    common::until(
        "the sandbox refills d",
        Duration::from_secs(30),
        async || {
            let (status, body) = request(
                &d,
                reqwest::Method::GET,
                "/v1/sessions/refill/ls?path=d",
                &a_token,
            )
            .await;
            (status == 200 && body.contains("\"a1\""))
                .then_some(())
                .ok_or(body)
        },
    )
    .await;

    // One remove alone ends within its deadline: stopped at it with words, or done when a
    // pass found the folder empty (the refillers make it again at once); never left running.
    let started = Instant::now();
    let (status, body) = request(
        &d,
        reqwest::Method::DELETE,
        "/v1/sessions/refill/files/d?recursive=true",
        &a_token,
    )
    .await;
    let took = started.elapsed();
    let body: serde_json::Value = serde_json::from_str(&body).expect("a JSON answer");
    match status {
        503 => {
            assert_eq!(body["code"], "file_work_stopped");
            assert_eq!(
                body["message"],
                "'d': it ran past its deadline of 3 s (SANDBOXD_FILE_DEADLINE) and was stopped; what it had done stays done. Retry it, or do it in smaller parts"
            );
        }
        200 => assert_eq!(body["removed"], true),
        other => panic!("the remove answered {other}: {body}"),
    }
    assert!(took < Duration::from_secs(5), "the remove took {took:?}");

    // The flood: 600 removes at once.
    // One client for all of them: making a client reads the system's CA store, which would
    // keep the test's own threads busy.
    let http = reqwest::Client::new();
    let flood: Vec<_> = (0..600)
        .map(|_| {
            let (base, token, http) = (d.base.clone(), a_token.clone(), http.clone());
            tokio::spawn(async move {
                let sent = Instant::now();
                let resp = http
                    .delete(format!("{base}/v1/sessions/refill/files/d?recursive=true"))
                    .bearer_auth(token)
                    .timeout(Duration::from_secs(60))
                    .send()
                    .await;
                match resp {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        (status, r.text().await.unwrap_or_default(), sent.elapsed())
                    }
                    Err(e) => (0, e.to_string(), sent.elapsed()),
                }
            })
        })
        .collect();
    // Once the flood is in (its connections made: most refused at once, the rest waiting or
    // running), the other tenant's ls and read answer within a second, every time.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let asked = Instant::now();
        let listed = bc.ls("bystander", "").await.expect("ls");
        assert!(listed.iter().any(|e| e.name == "notes.txt"));
        let read = bc
            .read("bystander", "notes.txt", 0, None)
            .await
            .expect("read");
        assert_eq!(read, b"still here");
        println!("the other session's ls and read: {:?}", asked.elapsed());
        slowest = slowest.max(asked.elapsed());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        slowest < Duration::from_secs(1),
        "another session waited {slowest:?} behind the flood"
    );
    let mut by_code = std::collections::BTreeMap::<String, usize>::new();
    let mut longest = Duration::ZERO;
    for answer in flood {
        let (status, body, took) = answer.await.expect("joined");
        longest = longest.max(took);
        let code = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["code"].as_str().map(str::to_owned))
            .unwrap_or_else(|| format!("{status}"));
        *by_code.entry(code).or_default() += 1;
    }
    println!("the flood's answers: {by_code:?}, the longest in {longest:?}");
    // Most were refused at once (the session's queue is full), the rest stopped by their
    // deadline, refused a worker within it, or (when a pass found the folder empty) done;
    // none was left running past its deadline.
    // Under gVisor the sandbox refills the folder far more slowly (each folder a round trip
    // to its gofer), so most removes find it gone and answer at once instead.
    let at_once = if common::on_gvisor() {
        ["file_work_busy", "not_found", "200"]
            .iter()
            .map(|c| by_code.get(*c).copied().unwrap_or(0))
            .sum()
    } else {
        by_code.get("file_work_busy").copied().unwrap_or(0)
    };
    assert!(at_once >= 400, "{by_code:?}");
    assert!(
        by_code.keys().all(|c| matches!(
            c.as_str(),
            "file_work_busy" | "file_work_stopped" | "200" | "not_found"
        )),
        "{by_code:?}"
    );
    assert!(
        longest < Duration::from_secs(8),
        "a remove answered after {longest:?}"
    );
    refiller.abort();
    let _ = admin.destroy("refill").await;
}

/// 200 slow readers of 8 MiB files (40 in each of five sessions): sandboxd holds at most its
/// budget of bytes in flight (the rest are refused with words), its memory stays under 512
/// MiB, and readers slower than the minimum rate are cut off, which gives the budget back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_slow_readers_do_not_take_sandboxds_memory() {
    let d = Daemon::start(&[("SANDBOXD_BODY_TIMEOUT", "4")]);
    let admin = d.admin();
    let mut sessions = Vec::new();
    for i in 0..5 {
        let id = format!("reader-{i}");
        let opened = admin
            .open(&id, &format!("org-{i}"), None, None)
            .await
            .expect("open");
        let token = opened.token.expect("token");
        d.client(&token)
            .write(&id, "big.bin", vec![b'x'; 8 << 20])
            .await
            .expect("an 8 MiB file");
        sessions.push((id, token));
    }
    let before = rss(&d);
    let port = d.base.rsplit(':').next().expect("a port").to_owned();
    // Each reader sends its request and then reads a few bytes a second.
    let readers: Vec<_> = (0..200)
        .map(|n| {
            let (id, token) = sessions[n % 5].clone();
            let port = port.clone();
            std::thread::spawn(move || -> (String, bool) {
                let mut s = TcpStream::connect(format!("127.0.0.1:{port}")).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
                write!(
                    s,
                    "GET /v1/sessions/{id}/files/big.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n"
                )
                .expect("request");
                let mut head = [0u8; 12];
                if s.read_exact(&mut head).is_err() {
                    return ("no answer".to_owned(), false);
                }
                let status = String::from_utf8_lossy(&head[9..12]).into_owned();
                if status != "200" {
                    return (status, false);
                }
                // Slow: 100 bytes a second for 12 s (sandboxd cuts the connection meanwhile:
                // what its socket had sent stays in ours), then the rest as fast as it comes.
                let mut got = 12usize;
                let mut buf = vec![0u8; 64 * 1024];
                let began = Instant::now();
                while began.elapsed() < Duration::from_secs(12) {
                    match s.read(&mut buf[..100]) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got += n,
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
                s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got += n,
                    }
                }
                // Cut: the answer ended before its 8 MiB body did.
                (status, got < 8 << 20)
            })
        })
        .collect();
    // While they all hang on, sandboxd holds no more than its budget.
    let mut peak = 0;
    let watching = Instant::now();
    while watching.elapsed() < Duration::from_secs(6) {
        peak = peak.max(rss(&d));
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for r in readers {
        let (status, cut) = r.join().expect("joined");
        *outcomes.entry(format!("{status} cut={cut}")).or_default() += 1;
    }
    println!(
        "rss before {} MiB, peak {} MiB; readers: {outcomes:?}",
        before >> 20,
        peak >> 20
    );
    assert!(
        peak < 512 << 20,
        "sandboxd's memory reached {} MiB",
        peak >> 20
    );
    // Some were served and then cut for reading too slowly; the others were refused (503).
    let served_and_cut = outcomes.get("200 cut=true").copied().unwrap_or(0);
    let refused = outcomes.get("503 cut=false").copied().unwrap_or(0);
    assert!(served_and_cut >= 20, "{outcomes:?}");
    assert_eq!(served_and_cut + refused, 200, "{outcomes:?}");
    // The budget is free again: a read answers whole.
    let (id, token) = &sessions[0];
    let read = d
        .client(token)
        .read(id, "big.bin", 0, None)
        .await
        .expect("a read");
    assert_eq!(read.len(), 8 << 20);
}

/// A refused read names the budget that is full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_over_the_session_budget_is_refused_with_words() {
    let d = Daemon::start(&[
        ("SANDBOXD_SESSION_MEMORY_BUDGET", "8m"),
        ("SANDBOXD_MAX_READ_BYTES", "8388608"),
        ("SANDBOXD_BODY_TIMEOUT", "30"),
    ]);
    let opened = d
        .admin()
        .open("one", "org", None, None)
        .await
        .expect("open");
    let token = opened.token.expect("token");
    let c = d.client(&token);
    c.write("one", "big.bin", vec![b'x'; 6 << 20])
        .await
        .expect("write");
    // A reader that does not read holds its 6 MiB...
    let port = d.base.rsplit(':').next().expect("a port").to_owned();
    let mut held = TcpStream::connect(format!("127.0.0.1:{port}")).expect("connect");
    write!(
        held,
        "GET /v1/sessions/one/files/big.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n"
    )
    .expect("request");
    let mut head = [0u8; 12];
    held.read_exact(&mut head).expect("an answer");
    assert_eq!(&head[9..12], b"200");
    // ...so the next read of 6 MiB of the same session does not fit its 8 MiB.
    let (status, body) = request(
        &d,
        reqwest::Method::GET,
        "/v1/sessions/one/files/big.bin",
        &token,
    )
    .await;
    assert_eq!(status, 503, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(body["code"], "memory_busy");
    assert_eq!(
        body["message"],
        "'big.bin': session 'one' holds 6 MiB of reads and writes in flight, its budget (SANDBOXD_SESSION_MEMORY_BUDGET), and 6 MiB more did not fit within 0.5 s; read what was asked before asking for more"
    );
    drop(held);
    common::until(
        "the budget is given back",
        Duration::from_secs(10),
        async || match c.read("one", "big.bin", 0, None).await {
            Ok(data) if data.len() == 6 << 20 => Ok(()),
            other => Err(format!("{other:?}").chars().take(200).collect::<String>()),
        },
    )
    .await;
}

/// Python's clients send a whole body before they read the answer: a write refused mid-body
/// (507, the workspace full) or before it (413, over the cap) reaches them as the status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_writes_reach_urllib_requests_and_httpx_as_their_status() {
    let d = Daemon::start(&[
        ("SANDBOXD_WORKSPACE_QUOTA", "loop"),
        ("SANDBOXD_WORKSPACE_SIZE", "64m"),
    ]);
    let opened = d
        .admin()
        .open(
            "full",
            "org",
            None,
            Some(&Limits {
                workspace_size: Some("32m".to_owned()),
                ..Default::default()
            }),
        )
        .await
        .expect("open");
    let token = opened.token.expect("token");
    let python = hack_path("sdk-venv.sh");
    let script = r#"
import os, sys, urllib.request, urllib.error
import requests, httpx
url, token = os.environ["URL"], os.environ["TOKEN"]
headers = {"Authorization": "Bearer " + token, "Content-Type": "application/octet-stream"}
for size, name in ((64 << 20, "full.bin"), ((256 << 20) + 1, "huge.bin")):
    body = b"x" * size
    target = url + "/v1/sessions/full/files/" + name
    req = urllib.request.Request(target, data=body, method="PUT", headers=headers)
    try:
        urllib.request.urlopen(req, timeout=60)
        print("urllib", name, "200")
    except urllib.error.HTTPError as e:
        print("urllib", name, e.code)
    except Exception as e:
        print("urllib", name, type(e).__name__)
    try:
        print("requests", name, requests.put(target, data=body, headers=headers, timeout=60).status_code)
    except Exception as e:
        print("requests", name, type(e).__name__)
    try:
        print("httpx", name, httpx.put(target, content=body, headers=headers, timeout=60).status_code)
    except Exception as e:
        print("httpx", name, type(e).__name__)
"#;
    let out = Command::new(&python)
        .args(["-c", script])
        .env("URL", &d.base)
        .env("TOKEN", &token)
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "urllib full.bin 507",
            "requests full.bin 507",
            "httpx full.bin 507",
            "urllib huge.bin 413",
            "requests huge.bin 413",
            "httpx huge.bin 413",
        ]
    );
}
