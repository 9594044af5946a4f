//! sandboxd answers only as many connections as it can: a flood of idle connections from one
//! source address holds at most that source's share, the rest are closed at their accept and
//! counted, and another source is still answered at once. The unauthenticated routes answer
//! from counts, not from a walk over every session.
//!
//! Everything dials loopback only: the flood from 127.0.0.1, the other client from
//! 127.0.0.2 (both this machine's).

mod common;

use std::io::{ErrorKind, Read};
use std::net::{IpAddr, TcpStream};
use std::time::{Duration, Instant};

use common::Daemon;
use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// The per-source cap of the test's sandboxd (the default is 512).
const PER_SOURCE: usize = 100;
/// Connections the flood opens.
const FLOOD: usize = 2_000;

fn metric(metrics: &str, line_prefix: &str) -> Option<i64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(line_prefix))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_from_one_source_leaves_another_source_served() {
    // The flood's 2,000 descriptors live in this process: a soft limit of 1,024 would refuse
    // them here, not in sandboxd.
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("the descriptor limit");
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("the descriptor limit raised");
    }
    assert!(
        hard >= FLOOD as u64 + 256,
        "this test opens {FLOOD} connections; the hard limit on descriptors is {hard}"
    );
    let per_source = PER_SOURCE.to_string();
    // The flood's admitted connections stay open for the whole test (a slow machine must not
    // see them cut by the header timeout, which is not what is tested here).
    let d = Daemon::start(&[
        ("SANDBOXD_MAX_CONNECTIONS_PER_SOURCE", per_source.as_str()),
        ("SANDBOXD_HEADER_TIMEOUT", "3600"),
    ]);
    let admin = d.admin();
    for i in 0..3 {
        admin
            .open(&format!("s{i}"), "org-a", None, None)
            .await
            .expect("open");
    }
    // The admin's client goes, with the connection it kept: the flood's source holds nothing.
    drop(admin);
    let other: IpAddr = "127.0.0.2".parse().expect("an address");
    let client = reqwest::Client::builder()
        .local_address(other)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a client");
    common::until(
        "only the other source's connection open",
        Duration::from_secs(10),
        async || {
            let text = client
                .get(format!("{}/metrics", d.base))
                .send()
                .await
                .map_err(|e| e.to_string())?
                .text()
                .await
                .map_err(|e| e.to_string())?;
            match metric(&text, "sandboxd_connections_open ") {
                Some(1) => Ok(()),
                other => Err(format!("open: {other:?}")),
            }
        },
    )
    .await;
    let addr: std::net::SocketAddr = d
        .base
        .trim_start_matches("http://")
        .parse()
        .expect("sandboxd's address");

    // The flood: 2,000 connections from 127.0.0.1 that never send a byte. One that sandboxd
    // accepts and resets before the connecting thread is back from `connect` (a loaded
    // machine) fails there with the reset: it is one of the refused, kept out of the list.
    let flood = tokio::task::spawn_blocking(move || {
        (0..FLOOD)
            .filter_map(|_| match TcpStream::connect(addr) {
                Ok(c) => Some(c),
                Err(e) if e.kind() == ErrorKind::ConnectionReset => None,
                Err(e) => panic!("a flood connection: {e}"),
            })
            .collect::<Vec<_>>()
    })
    .await
    .expect("the flood");
    assert!(flood.len() >= PER_SOURCE, "{} connected", flood.len());

    // Another source, the client bound to 127.0.0.2, is answered at once while the flood
    // holds its connections.
    // (An admin route that asks Docker nothing: the list of sessions samples their usage.)
    for path in ["/healthz", "/", "/v1/policy"] {
        let asked = Instant::now();
        let answer = client
            .get(format!("{}{path}", d.base))
            .bearer_auth(&d.token)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path} from 127.0.0.2 during the flood: {e}"));
        let took = asked.elapsed();
        assert_eq!(answer.status().as_u16(), 200, "{path}");
        assert!(
            took < Duration::from_secs(2),
            "{path} from another source took {took:?} during the flood"
        );
        // Read whole, so the connection goes back to the client's pool (a body left unread
        // closes it, and the next request would open another).
        let body: serde_json::Value = answer.json().await.expect("JSON");
        if path == "/healthz" {
            assert_eq!(body["status"], "ok");
            assert_eq!(body["sessions"], 3);
            assert_eq!(body["open_sessions"], 3);
        }
    }

    // Every connection past the source's cap was refused and counted; the metrics say so.
    let metrics = common::until(
        "every refusal counted, the flood's share and this client's open",
        Duration::from_secs(10),
        async || {
            let text = client
                .get(format!("{}/metrics", d.base))
                .send()
                .await
                .map_err(|e| e.to_string())?
                .text()
                .await
                .map_err(|e| e.to_string())?;
            let refused = metric(
                &text,
                "sandboxd_connections_refused_total{cap=\"per_source\"} ",
            );
            // A connection the server has yet to see closed still counts as open a moment.
            let open = metric(&text, "sandboxd_connections_open ");
            if refused == Some((FLOOD - PER_SOURCE) as i64) && open == Some(PER_SOURCE as i64 + 1) {
                Ok(text)
            } else {
                Err(format!("refused so far: {refused:?}, open: {open:?}"))
            }
        },
    )
    .await;
    assert_eq!(
        metric(
            &metrics,
            "sandboxd_connections_refused_total{cap=\"total\"} "
        ),
        Some(0),
        "no refusal for the total cap"
    );
    let open = metric(&metrics, "sandboxd_connections_open ").expect("the open connections");
    assert_eq!(
        open,
        PER_SOURCE as i64 + 1,
        "the flood's share and this client's"
    );
    assert_eq!(
        metric(&metrics, "sandboxd_sessions{state=\"running\"} "),
        Some(3)
    );

    // The refused connections were closed at once (a reset, or the end of the stream);
    // exactly the source's share is still open.
    let mut still_open = 0;
    for mut c in flood {
        c.set_nonblocking(true).expect("nonblocking");
        let mut byte = [0u8; 1];
        match c.read(&mut byte) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => still_open += 1,
            Ok(0) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
                ) => {}
            other => panic!("a flood connection: {other:?}"),
        }
    }
    assert_eq!(still_open, PER_SOURCE);

    // With the flood gone, 127.0.0.1 is served again.
    common::until(
        "127.0.0.1 served again",
        Duration::from_secs(5),
        async || {
            let answer = reqwest::get(format!("{}/healthz", d.base))
                .await
                .map_err(|e| e.to_string())?;
            match answer.status().as_u16() {
                200 => Ok(()),
                other => Err(format!("status {other}")),
            }
        },
    )
    .await;
}
