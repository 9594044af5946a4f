//! File watch against the real dockerd: the changes a run makes come as Server-Sent Events
//! (created, modified, renamed, deleted, with paths from the workspace root); the bound of
//! folders is reported, the bound of watches refused; a watch outlives the session's sleep,
//! saying so; a tree of 20,000 files is watched within its bound while sandboxd serves others.

mod common;

use std::time::Duration;

use common::{Backend, Daemon, raw, until};
use futures::StreamExt as _;
use reqwest::Method;
use sandboxd_api::client::Client;
use serde_json::Value;

async fn session(d: &Daemon, name: &str) -> (Client, String) {
    let opened = d
        .admin()
        .open(name, "org-watch", None, None)
        .await
        .expect("open");
    let token = opened.token.expect("a token on create");
    (d.client(&token), token)
}

/// A watch's event stream, read as a client would.
struct Events {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<axum::body::Bytes>> + Send>>,
    buf: String,
}

impl Events {
    async fn open(d: &Daemon, token: &str, query: &str) -> Self {
        let url = format!("{}/v1/sessions/{query}", d.base);
        let resp = reqwest::Client::new()
            .get(&url)
            .bearer_auth(token)
            .send()
            .await
            .expect("the watch answers");
        assert_eq!(resp.status(), 200, "{url}");
        assert_eq!(
            resp.headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("text/event-stream")
        );
        Self {
            body: Box::pin(resp.bytes_stream()),
            buf: String::new(),
        }
    }

    /// The next event (kind, data), or a failure after `within`.
    async fn next(&mut self, within: Duration) -> (String, Value) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut kind = String::new();
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(k) = line.strip_prefix("event: ") {
                        kind = k.to_owned();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    }
                }
                if kind.is_empty() {
                    continue; // a keep-alive comment
                }
                return (kind, serde_json::from_str(&data).unwrap_or(Value::Null));
            }
            let chunk = tokio::time::timeout_at(deadline, self.body.next())
                .await
                .expect("an event in time")
                .expect("the stream goes on")
                .expect("bytes");
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// Events until one of `kind` about `path` came; all of them.
    async fn until(&mut self, kind: &str, path: &str) -> Vec<(String, Value)> {
        let mut seen = Vec::new();
        loop {
            let (k, v) = self.next(Duration::from_secs(20)).await;
            let hit = k == kind && v["path"] == path;
            seen.push((k, v));
            if hit {
                return seen;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_sees_a_runs_changes_survives_a_sleep_and_is_bounded() {
    let d = Daemon::start_on(Backend::Agent, &[("SANDBOXD_WATCH_MAX_FOLDERS", "5")]);
    let (s, token) = session(&d, "w").await;
    s.run("w", "mkdir -p src", None, None, None)
        .await
        .expect("run");

    let mut events = Events::open(&d, &token, "w/watch?path=src&recursive=true").await;
    let (kind, head) = events.next(Duration::from_secs(20)).await;
    assert_eq!(kind, "watching");
    assert_eq!(head["path"], "src");
    assert_eq!(head["watched"], 1);

    s.run(
        "w",
        "echo one > src/a.txt && mv src/a.txt src/b.txt && mkdir src/lib && echo two > src/lib/c.txt && rm src/b.txt",
        None,
        None,
        None,
    )
    .await
    .expect("run");
    let seen = events.until("deleted", "src/b.txt").await;
    let kinds: Vec<(String, String)> = seen
        .iter()
        .filter(|(k, _)| k != "modified")
        .map(|(k, v)| (k.clone(), v["path"].as_str().unwrap_or_default().to_owned()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("created", "src/a.txt"),
            ("renamed", "src/a.txt"),
            ("created", "src/lib"),
            ("created", "src/lib/c.txt"),
            ("deleted", "src/b.txt"),
        ]
        .map(|(k, p)| (k.to_owned(), p.to_owned())),
        "{seen:?}"
    );
    let renamed = seen.iter().find(|(k, _)| k == "renamed").expect("renamed");
    assert_eq!(renamed.1["to"], "src/b.txt");
    assert!(
        seen.iter()
            .any(|(k, v)| k == "created" && v["path"] == "src/lib" && v["dir"] == true)
    );

    // Asleep: the stream says so; woken by a run, it resumes and goes on.
    d.admin().stop("w").await.expect("stop");
    let (kind, _) = events.next(Duration::from_secs(20)).await;
    assert_eq!(kind, "sleeping");
    s.run("w", "true", None, None, None)
        .await
        .expect("a run wakes it");
    let (kind, again) = events.next(Duration::from_secs(20)).await;
    assert_eq!(kind, "resumed");
    assert_eq!(again["path"], "src");
    s.run("w", "echo three > src/d.txt", None, None, None)
        .await
        .expect("run");
    events.until("created", "src/d.txt").await;

    // The bound of folders: 5 per watch here; the sixth is named once.
    s.run(
        "w",
        "mkdir -p deep/1 deep/2 deep/3 deep/4 deep/5 deep/6",
        None,
        None,
        None,
    )
    .await
    .expect("run");
    let mut bounded = Events::open(&d, &token, "w/watch?path=deep&recursive=true").await;
    let (kind, head) = bounded.next(Duration::from_secs(20)).await;
    let (first, second) = if kind == "watching" {
        let next = bounded.next(Duration::from_secs(20)).await;
        ((kind, head), next)
    } else {
        let next = bounded.next(Duration::from_secs(20)).await;
        (next, (kind, head))
    };
    assert_eq!(first.0, "watching");
    assert_eq!(first.1["watched"], 5);
    assert_eq!(second.0, "limit", "{second:?}");

    // Refused in words: a file, a path out of the workspace.
    let (status, body) = raw(
        Method::GET,
        &format!("{}/v1/sessions/w/watch?path=src/d.txt", d.base),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("not_a_directory")),
        "{body}"
    );
    let (status, body) = raw(
        Method::GET,
        &format!("{}/v1/sessions/w/watch?path=../etc", d.base),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("outside_workspace")),
        "{body}"
    );

    // The bound of watches: 8 per session (two are open).
    let mut open = Vec::new();
    for _ in 0..6 {
        open.push(Events::open(&d, &token, "w/watch").await);
    }
    let (status, body) = raw(
        Method::GET,
        &format!("{}/v1/sessions/w/watch", d.base),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(
        body["message"],
        "Session 'w' already has 8 watches open, the most a session may have: close one first"
    );
    // Closing one makes room (once sandboxd finds the stream gone, at its next write at the
    // latest: a keep-alive comment every 15 s).
    drop(open.pop());
    until(
        "a watch's place is given back",
        Duration::from_secs(40),
        async || {
            // Only the answer's head: a watch's body goes on for as long as it is read.
            let status = reqwest::Client::new()
                .get(format!("{}/v1/sessions/w/watch?path=src", d.base))
                .bearer_auth(&token)
                .send()
                .await
                .ok()?
                .status();
            (status == 200).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_of_a_tree_of_20000_files_is_bounded_and_sandboxd_serves_others() {
    let d = Daemon::start_on(Backend::Agent, &[("SANDBOXD_WATCH_MAX_FOLDERS", "1000")]);
    let (s, token) = session(&d, "big").await;
    let (other, _) = session(&d, "other").await;
    let made = s
        .run(
            "big",
            "perl -e 'mkdir \"t\"; for $i (1..2000) { mkdir \"t/$i\"; for $j (1..10) { open F, \">t/$i/$j\"; close F } }' && find t -type f | wc -l",
            Some(300),
            None,
            None,
        )
        .await
        .expect("the tree");
    assert_eq!(made.stdout.trim(), "20000", "{made:?}");
    let mut events = Events::open(&d, &token, "big/watch?path=t&recursive=true").await;
    let mut head = None;
    let mut limits = 0;
    while head.is_none() || limits == 0 {
        let (kind, v) = events.next(Duration::from_secs(60)).await;
        match kind.as_str() {
            "watching" => head = Some(v),
            "limit" => limits += 1,
            other => panic!("unexpected {other}: {v}"),
        }
    }
    assert_eq!(head.expect("watching")["watched"], 1000);
    assert_eq!(limits, 1, "the bound is said once");
    let r = other
        .run("other", "echo served", None, None, None)
        .await
        .expect("served");
    assert_eq!(r.stdout, "served\n");
    // A change in a watched folder still comes.
    s.run("big", "echo x > t/new.txt", None, None, None)
        .await
        .expect("run");
    events.until("created", "t/new.txt").await;
}
