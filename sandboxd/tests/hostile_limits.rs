//! A hostile sandbox (or a hostile holder of its token) against sandboxd's own limits, each
//! test written as the attack on the real dockerd: a flood of runs in one session, a folder of
//! a million entries, a streaming client that stops reading. What a user sees is asserted:
//! the exact refusal, sandboxd still up, another session still answering, the sandbox's
//! processes gone.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Backend, Daemon, until};
use futures::StreamExt;
use sandboxd_api::client::Client;
use serde_json::{Value, json};

async fn session(d: &Daemon, name: &str) -> (Client, String) {
    let opened = d
        .admin()
        .open(name, "org-hostile", None, None)
        .await
        .expect("open");
    let token = opened
        .token
        .expect("a token for the session that was created");
    (d.client(&token), token)
}

/// The resident set and its peak of a process, in bytes (`VmRSS`, `VmHWM`).
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn pid(d: &Daemon) -> u32 {
    d.process.pid().expect("sandboxd runs")
}

/// A run of `command` over `/v1`, answered as (status, body).
async fn v1_run(
    http: &reqwest::Client,
    d: &Daemon,
    id: &str,
    token: &str,
    command: &str,
) -> (u16, Value) {
    let resp = http
        .post(format!("{}/v1/sessions/{id}/runs", d.base))
        .bearer_auth(token)
        .json(&json!({"command": command}))
        .send()
        .await
        .expect("sandboxd answers");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// 500 runs of one session at once: exactly `SANDBOXD_MAX_RUNS_PER_SESSION` (16) run, every
/// other one is refused at once with 429 naming the limit, on both surfaces; sandboxd and
/// another session answer meanwhile, and once the 16 are over, runs work again.
async fn a_flood_of_runs_in_one_session_is_capped(backend: Backend) {
    let d = Daemon::start_on(backend, &[]);
    let (_, token) = session(&d, "flood").await;
    let (other, _) = session(&d, "bystander").await;
    // Woken and warm: the flood meets a running sandbox.
    other
        .run("bystander", "true", None, None, None)
        .await
        .expect("run");
    d.client(&token)
        .run("flood", "true", None, None, None)
        .await
        .expect("run");

    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("http client");
    let started = Instant::now();
    let flood = futures::future::join_all((0..500).map(|_| {
        let (http, d, token) = (&http, &d, &token);
        async move {
            let (status, body) = v1_run(http, d, "flood", token, "sleep 8").await;
            (status, body, started.elapsed())
        }
    }));
    let watch = async {
        // While the flood is in flight: sandboxd counts 16, another session answers promptly,
        // and the wire surface refuses the 17th the same way.
        let admin = d.admin();
        let view = until("16 runs in flight", Duration::from_secs(20), || async {
            let v = admin.get("flood").await.ok()?;
            (v.runs_in_flight == 16).then_some(v)
        })
        .await;
        assert_eq!(view.runs_in_flight, 16);
        let asked = Instant::now();
        let echo = other
            .run("bystander", "echo still here", None, None, None)
            .await
            .expect("another session runs");
        assert_eq!(echo.stdout, "still here\n");
        assert!(
            asked.elapsed() < Duration::from_secs(3),
            "another session answered in {:?}",
            asked.elapsed()
        );
        let wire = reqwest::Client::new()
            .post(format!("{}/sessions/flood/run", d.base))
            .header("x-sandbox-token", &token)
            .json(&json!({"argv": ["true"], "run_id": "0123456789abcdef0123456789abcdef"}))
            .send()
            .await
            .expect("the wire surface answers");
        assert_eq!(
            wire.status().as_u16(),
            429,
            "POST /sessions/{{id}}/run over the cap"
        );
        let body: Value = wire.json().await.expect("a JSON error");
        assert_eq!(
            body,
            json!({"detail": "Session 'flood' already has 16 of 16 runs in flight (SANDBOXD_MAX_RUNS_PER_SESSION). Wait for one to finish or stop one."})
        );
        let index = reqwest::get(format!("{}/healthz", d.base))
            .await
            .expect("healthz");
        assert_eq!(index.status().as_u16(), 200);
    };
    let (results, ()) = tokio::join!(flood, watch);

    let accepted: Vec<_> = results.iter().filter(|(s, _, _)| *s == 200).collect();
    let refused: Vec<_> = results.iter().filter(|(s, _, _)| *s == 429).collect();
    let other_statuses: Vec<_> = results
        .iter()
        .filter(|(s, _, _)| *s != 200 && *s != 429)
        .map(|(s, b, _)| (s, b))
        .collect();
    assert!(
        other_statuses.is_empty(),
        "unexpected answers: {other_statuses:?}"
    );
    assert_eq!(accepted.len(), 16, "runs accepted out of 500");
    assert_eq!(refused.len(), 484, "runs refused out of 500");
    for (_, body, _) in &accepted {
        assert_eq!(body["exit_code"], 0, "{body}");
    }
    for (_, body, at) in &refused {
        assert_eq!(
            body,
            &json!({
                "code": "run_cap",
                "message": "Session 'flood' already has 16 of 16 runs in flight (SANDBOXD_MAX_RUNS_PER_SESSION). Wait for one to finish or stop one."
            })
        );
        // Refused at once, not after waiting for a run to end.
        assert!(*at < Duration::from_secs(8), "a refusal came after {at:?}");
    }

    // The 16 are over: the session runs again, as many at once as the cap allows.
    let again = futures::future::join_all((0..16).map(|i| {
        v1_run(
            &http,
            &d,
            "flood",
            &token,
            if i == 0 { "echo again" } else { "true" },
        )
    }))
    .await;
    assert!(again.iter().all(|(s, _)| *s == 200), "{again:?}");
    assert_eq!(again[0].1["stdout"], "again\n");
    assert_eq!(d.admin().get("flood").await.expect("get").runs_in_flight, 0);
}

/// A folder of a million entries, made by the sandbox: listed on both surfaces promptly, each
/// listing capped at 10,000 and marked truncated, and sandboxd's memory stays bounded.
#[tokio::test(flavor = "multi_thread")]
async fn a_folder_of_a_million_entries_is_listed_in_part_promptly() {
    // On a disk of this project's CI machines a million files take minutes to make and as
    // long to remove; on a tmpfs, seconds. What is listed is the same. The sandbox pays for
    // the million inodes in its own memory.
    let d = Daemon::start_on_tmpfs(
        &[
            ("SANDBOXD_EXECUTE_TIMEOUT", "600"),
            ("SANDBOXD_MEM_LIMIT", "3g"),
        ],
        "size=512m,nr_inodes=1100000,mode=0755",
    );
    let (s, token) = session(&d, "million").await;
    let made = Instant::now();
    let make = "mkdir big && cd big && seq 1 1000000 | xargs touch && ls -f | wc -l";
    if common::on_gvisor() {
        // Under gVisor each file is a round trip to the sandbox's gofer, and a million take
        // many minutes: they are made on the host, as the sandbox's uid, and it counts them.
        let host = Command::new("setpriv")
            .args([
                "--reuid=10001",
                "--regid=10001",
                "--clear-groups",
                "sh",
                "-c",
                make,
            ])
            .current_dir(d.workspace("million"))
            .output()
            .expect("setpriv runs");
        assert_eq!(
            String::from_utf8_lossy(&host.stdout).trim(),
            "1000002",
            "{}",
            String::from_utf8_lossy(&host.stderr)
        );
    }
    let out = s
        .run(
            "million",
            if common::on_gvisor() {
                "ls -f big | wc -l"
            } else {
                make
            },
            None,
            None,
            None,
        )
        .await
        .expect("run");
    assert_eq!(
        (out.exit_code, out.stdout.trim()),
        (0, "1000002"),
        "{out:?}"
    );
    println!("a million files made in {:?}", made.elapsed());
    let (rss_before, _) = memory(pid(&d));

    // /v1
    let asked = Instant::now();
    let listing = s.listing("million", "big").await.expect("ls");
    let took = asked.elapsed();
    assert_eq!(listing.entries.len(), 10_000);
    assert!(listing.truncated);
    assert!(listing.entries.windows(2).all(|w| w[0].name < w[1].name));
    assert!(
        took < Duration::from_secs(5),
        "GET /v1/sessions/{{id}}/ls took {took:?}"
    );
    let raw: Value = reqwest::Client::new()
        .get(format!("{}/v1/sessions/million/ls?path=big", d.base))
        .bearer_auth(&token)
        .send()
        .await
        .expect("ls")
        .json()
        .await
        .expect("JSON");
    assert_eq!(
        (raw["truncated"].clone(), raw["max_entries"].clone()),
        (json!(true), json!(10_000))
    );
    let tree = s.tree("million", "").await.expect("tree");
    assert_eq!(tree.entries.len(), 2000);
    assert!(tree.entry_limit_reached && tree.incomplete);

    // The wire surface: the live session's native listing and the stored workspace's.
    let http = reqwest::Client::new();
    for (route, url, tok, body) in [
        (
            "POST /sessions/{id}/files/list",
            format!("{}/sessions/million/files/list", d.base),
            token.as_str(),
            json!({"path": "/workspace/big"}),
        ),
        (
            "POST /workspaces/{id}/ls",
            format!("{}/workspaces/million/ls", d.base),
            d.token.as_str(),
            json!({"path": "big"}),
        ),
    ] {
        let asked = Instant::now();
        let resp = http
            .post(&url)
            .header("x-sandbox-token", tok)
            .json(&body)
            .send()
            .await
            .expect("the wire surface answers");
        assert_eq!(resp.status().as_u16(), 200, "{route}");
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        assert_eq!(
            header("x-sandbox-listing-truncated").as_deref(),
            Some("true"),
            "{route}"
        );
        assert_eq!(
            header("x-sandbox-listing-max-entries").as_deref(),
            Some("10000"),
            "{route}"
        );
        let rows: Vec<Value> = resp.json().await.expect("a JSON array");
        let took = asked.elapsed();
        assert_eq!(rows.len(), 10_000, "{route}");
        assert!(took < Duration::from_secs(5), "{route} took {took:?}");
    }
    let small = http
        .post(format!("{}/sessions/million/files/list", d.base))
        .header("x-sandbox-token", &token)
        .json(&json!({"path": "/workspace"}))
        .send()
        .await
        .expect("list");
    assert_eq!(
        small
            .headers()
            .get("x-sandbox-listing-truncated")
            .and_then(|v| v.to_str().ok()),
        Some("false")
    );

    // Nothing of the million stayed in sandboxd: its peak memory grew by far less than a
    // listing of a million entries would take (hundreds of MiB).
    let (_, peak) = memory(pid(&d));
    println!(
        "sandboxd RSS before the listings {} MiB, peak {} MiB",
        rss_before >> 20,
        peak >> 20
    );
    assert!(
        peak < rss_before + 64 * 1024 * 1024,
        "sandboxd's peak RSS went from {} MiB to {} MiB while listing",
        rss_before >> 20,
        peak >> 20
    );
    // And it still answers.
    assert_eq!(
        s.run("million", "echo ok", None, None, None)
            .await
            .expect("run")
            .stdout,
        "ok\n"
    );
}

/// Starts a streamed run of `command` and reads nothing of it.
async fn stalled_stream(
    d: &Daemon,
    id: &str,
    token: &str,
    run_id: &str,
    command: &str,
    timeout: Option<u64>,
) -> reqwest::Response {
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/sessions/{id}/runs?stream=true", d.base))
        .bearer_auth(token)
        .json(&json!({"command": command, "run_id": run_id, "timeout_seconds": timeout}))
        .send()
        .await
        .expect("the stream starts");
    assert_eq!(resp.status().as_u16(), 200);
    resp
}

/// Reads a stream to its end (with a deadline) and returns its last line.
async fn last_line(resp: reqwest::Response, what: &str) -> Value {
    let read = async {
        let mut body = resp.bytes_stream();
        let mut tail: Vec<u8> = Vec::new();
        let mut total = 0usize;
        while let Some(chunk) = body.next().await {
            let Ok(chunk) = chunk else { break };
            total += chunk.len();
            tail.extend_from_slice(&chunk);
            if tail.len() > 1 << 20 {
                let keep = tail.len() - 4096;
                tail.drain(..keep);
            }
        }
        let text = String::from_utf8_lossy(&tail);
        let line = text
            .trim_end()
            .rsplit('\n')
            .next()
            .unwrap_or_default()
            .to_owned();
        (
            total,
            serde_json::from_str::<Value>(&line).unwrap_or(Value::String(line)),
        )
    };
    let (total, last) = tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .unwrap_or_else(|_| panic!("{what}: the stream did not end within 30 s"));
    println!("{what}: {total} bytes streamed");
    last
}

/// How many processes running `yes` a session's sandbox holds.
async fn yes_processes(s: &Client, id: &str) -> String {
    s.run(
        id,
        "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < \"$f\" 2>/dev/null; echo; done | grep -c '^yes' || true",
        None,
        None,
        None,
    )
    .await
    .expect("run")
    .stdout
    .trim()
    .to_owned()
}

/// A streaming client that stops reading while its run floods output: the run still ends
/// promptly when stopped, when it times out and when its session is destroyed, its processes
/// are gone, and sandboxd answers another session meanwhile.
async fn a_stalled_stream_client_cannot_keep_its_run_alive(backend: Backend) {
    // Far more output kept than the socket buffers hold, so the client's stall reaches sandboxd.
    let d = Daemon::start_on(backend, &[("SANDBOXD_MAX_OUTPUT_BYTES", "16777216")]);
    let (s, token) = session(&d, "stall").await;
    let (other, _) = session(&d, "bystander").await;
    assert_eq!(yes_processes(&s, "stall").await, "0");

    // Stopped. The client's socket buffers and the stream's queue hold some 10 MiB of the
    // output: once sandboxd holds 12 MiB more than before (most of the 16 MiB it keeps), the
    // client's stall has reached it (and the run still reads on).
    let (rss_before, _) = memory(pid(&d));
    let stopped = stalled_stream(&d, "stall", &token, "run-stalled-stop", "yes", None).await;
    until(
        "sandboxd keeps reading the run the client stalled",
        Duration::from_secs(90),
        || async { (memory(pid(&d)).0 > rss_before + (12 << 20)).then_some(()) },
    )
    .await;
    assert_eq!(yes_processes(&s, "stall").await, "1");
    let asked = Instant::now();
    s.stop_run("stall", "run-stalled-stop").await.expect("stop");
    until("the stopped run ends", Duration::from_secs(30), || async {
        (d.admin().get("stall").await.ok()?.runs_in_flight == 0).then_some(())
    })
    .await;
    println!("stopped in {:?}", asked.elapsed());
    assert_eq!(
        yes_processes(&s, "stall").await,
        "0",
        "the stopped run left `yes` running"
    );
    let asked = Instant::now();
    assert_eq!(
        other
            .run("bystander", "echo ok", None, None, None)
            .await
            .expect("run")
            .stdout,
        "ok\n"
    );
    assert!(asked.elapsed() < Duration::from_secs(3));
    let last = last_line(stopped, "stopped").await;
    assert_eq!(
        (
            last["type"].clone(),
            last["stopped"].clone(),
            last["exit_code"].clone()
        ),
        (json!("exit"), json!(true), json!(137)),
        "{last}"
    );

    // Timed out.
    let started = Instant::now();
    let timed = stalled_stream(&d, "stall", &token, "run-stalled-timeout", "yes", Some(3)).await;
    until(
        "the timed-out run ends",
        Duration::from_secs(30),
        || async {
            let v = d.admin().get("stall").await.ok()?;
            (started.elapsed() > Duration::from_secs(3) && v.runs_in_flight == 0).then_some(())
        },
    )
    .await;
    // Its 3 s, and the time to read what the sandbox kept of its output (64 MiB) on a
    // loaded machine.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "timed out after {:?}",
        started.elapsed()
    );
    println!("timed out and ended in {:?}", started.elapsed());
    assert_eq!(
        yes_processes(&s, "stall").await,
        "0",
        "the timed-out run left `yes` running"
    );
    let last = last_line(timed, "timed out").await;
    assert_eq!(
        (
            last["type"].clone(),
            last["timed_out"].clone(),
            last["exit_code"].clone()
        ),
        (json!("exit"), json!(true), json!(124)),
        "{last}"
    );

    // Destroyed under it.
    let doomed = stalled_stream(&d, "stall", &token, "run-stalled-destroy", "yes", None).await;
    until("yes running", Duration::from_secs(20), || async {
        (yes_processes(&s, "stall").await == "1").then_some(())
    })
    .await;
    let asked = Instant::now();
    let destroyed = d.admin().destroy("stall").await.expect("destroy");
    assert!(destroyed.destroyed);
    assert!(
        asked.elapsed() < Duration::from_secs(15),
        "destroy took {:?}",
        asked.elapsed()
    );
    assert!(
        d.containers()
            .iter()
            .all(|(_, session, _)| session != "stall"),
        "the destroyed session's container is still there"
    );
    let last = last_line(doomed, "destroyed").await;
    assert!(
        last["type"] == "error" || last["stopped"] == true,
        "the destroyed run's stream ended with {last}"
    );
    assert_eq!(
        other
            .run("bystander", "echo ok", None, None, None)
            .await
            .expect("run")
            .stdout,
        "ok\n"
    );
}

on_both_backends! {
    #[tokio::test(flavor = "multi_thread")]
    a_flood_of_runs_in_one_session_is_capped,
    #[tokio::test(flavor = "multi_thread")]
    a_stalled_stream_client_cannot_keep_its_run_alive,
}
