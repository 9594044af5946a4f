//! Benchmarks the interactive sandbox (issue 31) against baselines from the same run, on one
//! sandboxd and one sandbox of the tools image with no network:
//!
//! - a keystroke's echo on a terminal (a byte typed on an attached WebSocket until the
//!   terminal's echo of it comes back), against sandboxd's own floor: `GET /healthz` on a
//!   kept-alive connection;
//! - a small HTTP request through the ports route (a new connection to the port each time),
//!   against the same request made inside the sandbox by a client there (also a new
//!   connection each time), so the difference is what the way through sandboxd adds;
//! - one raw TCP stream through the port route (a WebSocket) reading 512 MiB, against the same
//!   read inside the sandbox over its own loopback;
//! - a file watch: a file written through the files API until its event reaches a watcher
//!   (Server-Sent Events), against the same write with no watch waiting for it.
//!
//! Needs the project's dockerd and the tools image (python3): `eval "$(make -s env)"` after
//! `make up`. Usage: `interactive-bench [--keys N] [--requests N] [--mib N]`

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use sandboxd::config::Config;
use sandboxd_api::client::Client;
use sandboxd_api::terminal::TerminalRequest;
use sandboxd_api::ws::TerminalEvent;

#[derive(Parser)]
struct Args {
    /// Keystrokes timed.
    #[arg(long, default_value_t = 500)]
    keys: usize,
    /// Small HTTP requests timed, each way.
    #[arg(long, default_value_t = 300)]
    requests: usize,
    /// MiB read through one stream, each way.
    #[arg(long, default_value_t = 512)]
    mib: usize,
    /// Files written and watched.
    #[arg(long, default_value_t = 200)]
    watched: usize,
}

/// p-th percentile of `samples`, milliseconds.
fn pct(samples: &[Duration], p: f64) -> f64 {
    let mut s = samples.to_vec();
    s.sort();
    s.get(((s.len() as f64 - 1.0) * p).round() as usize)
        .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
}

/// A server on port 3000 of the sandbox: `/small` answers 64 bytes; any other path streams
/// `?mib=N` MiB of zeros. One thread per connection, HTTP/1.0.
const SERVER: &str = r#"
import socket, threading
def serve(c):
    req = b''
    while b'\r\n\r\n' not in req:
        b = c.recv(4096)
        if not b: return
        req += b
    path = req.split(b' ')[1]
    if path == b'/small':
        c.sendall(b'HTTP/1.0 200 OK\r\nContent-Length: 64\r\n\r\n' + b'x' * 64)
    else:
        n = int(path.split(b'mib=')[1]) << 20
        c.sendall(b'HTTP/1.0 200 OK\r\n\r\n')
        chunk = b'\0' * (1 << 20)
        while n > 0:
            c.sendall(chunk); n -= len(chunk)
    c.close()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', 3000)); s.listen(128)
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Times `n` small requests and a read of `mib` MiB, inside the sandbox (the baseline): p50
/// of the requests in ms, and MB/s.
const INSIDE: &str = r#"
import socket, sys, time
n, mib = int(sys.argv[1]), int(sys.argv[2])
t = []
for _ in range(n):
    a = time.perf_counter()
    c = socket.create_connection(('127.0.0.1', 3000)); c.sendall(b'GET /small HTTP/1.0\r\n\r\n')
    while c.recv(65536): pass
    c.close(); t.append(time.perf_counter() - a)
t.sort()
a = time.perf_counter(); got = 0
c = socket.create_connection(('127.0.0.1', 3000)); c.sendall(b'GET /big?mib=%d HTTP/1.0\r\n\r\n' % mib)
while True:
    b = c.recv(1 << 20)
    if not b: break
    got += len(b)
print(t[len(t) // 2] * 1000, got / (time.perf_counter() - a) / 1e6)
"#;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let image = std::env::var("SANDBOXD_TOOLS_IMAGE")
        .context("SANDBOXD_TOOLS_IMAGE is not set: eval \"$(make -s env)\" after make up")?;
    let dir = tempfile::Builder::new()
        .prefix("interactive-bench-")
        .tempdir()?;
    let admin_token = "bench-admin-token";
    let config = Config::try_parse_from([
        "sandboxd",
        "--token",
        admin_token,
        "--port",
        "0",
        "--runtimes",
        &format!("tools={image}"),
        "--instance",
        &format!("ibench{}", std::process::id()),
        "--workspace-root",
        &dir.path().join("ws").display().to_string(),
        "--state-dir",
        &dir.path().join("state").display().to_string(),
        "--workspace-quota",
        "off",
    ])?;
    let (addr, serve) = sandboxd::server::start(config).await?;
    tokio::spawn(serve);
    let base = format!("http://{addr}");
    let admin = Client::new(&base, admin_token);
    let opened = admin.open("ibench", "bench", None, None).await?;
    let token = opened.token.context("a token")?;
    let s = Client::new(&base, &token);
    let result = measure(&args, &base, &s, &token).await;
    let _ = admin.destroy("ibench").await;
    result
}

async fn measure(args: &Args, base: &str, s: &Client, token: &str) -> Result<()> {
    // The floor: one request to sandboxd on a kept-alive connection.
    let http = reqwest::Client::new();
    let mut floor = Vec::with_capacity(args.keys);
    for i in 0..args.keys + 20 {
        let t = Instant::now();
        http.get(format!("{base}/healthz"))
            .send()
            .await?
            .bytes()
            .await?;
        if i >= 20 {
            floor.push(t.elapsed());
        }
    }

    // Keystrokes: `cat` on a raw-mode terminal echoes nothing of its own; the terminal's line
    // discipline echoes each byte as it is typed.
    let t = s
        .open_terminal(
            "ibench",
            &TerminalRequest {
                command: Some("stty -icanon; exec cat >/dev/null".to_owned()),
                ..TerminalRequest::default()
            },
        )
        .await?;
    let mut sock = s.attach_terminal("ibench", &t.id).await?;
    let mut keys = Vec::with_capacity(args.keys);
    // Until the terminal answers at all (the shell's stty ran).
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..args.keys + 20 {
        let key = [b'a' + (i % 26) as u8];
        let started = Instant::now();
        sock.send_input(&key).await?;
        loop {
            match tokio::time::timeout(Duration::from_secs(5), sock.next()).await {
                Ok(Some(TerminalEvent::Output(b))) if b.contains(&key[0]) => break,
                Ok(Some(TerminalEvent::Output(_) | TerminalEvent::Attached { .. })) => {}
                other => bail!("the terminal stopped echoing: {other:?}"),
            }
        }
        if i >= 20 {
            keys.push(started.elapsed());
        }
    }
    drop(sock);

    // The port's server, and the baseline from inside the sandbox.
    s.write("ibench", "server.py", SERVER.as_bytes().to_vec())
        .await?;
    s.write("ibench", "inside.py", INSIDE.as_bytes().to_vec())
        .await?;
    s.run(
        "ibench",
        "(nohup python3 server.py >/tmp/server.log 2>&1 &); sleep 0.5",
        None,
        None,
        None,
    )
    .await?;
    s.open_port("ibench", 3000).await?;
    let inside = s
        .run(
            "ibench",
            &format!("python3 inside.py {} {}", args.requests, args.mib),
            Some(300),
            None,
            None,
        )
        .await?;
    let mut figures = inside.stdout.split_whitespace();
    let (inside_p50, inside_mbs): (f64, f64) = match (
        figures.next().and_then(|v| v.parse().ok()),
        figures.next().and_then(|v| v.parse().ok()),
    ) {
        (Some(p), Some(m)) => (p, m),
        _ => bail!(
            "the inside baseline printed {:?} {:?}",
            inside.stdout,
            inside.stderr
        ),
    };

    // Small requests through sandboxd (a new connection to the port each).
    let url = format!("{base}/v1/sessions/ibench/ports/3000/small");
    let mut small = Vec::with_capacity(args.requests);
    for i in 0..args.requests + 20 {
        let t = Instant::now();
        let body = http
            .get(&url)
            .bearer_auth(token)
            .send()
            .await?
            .bytes()
            .await?;
        if body.len() != 64 {
            bail!("the port answered {} bytes, not 64", body.len());
        }
        if i >= 20 {
            small.push(t.elapsed());
        }
    }

    // One stream through the port route.
    let mut stream = s.connect_port("ibench", 3000).await?;
    stream
        .send(format!("GET /big?mib={} HTTP/1.0\r\n\r\n", args.mib).as_bytes())
        .await?;
    let started = Instant::now();
    let mut got = 0usize;
    while let Some(bytes) = stream.recv().await {
        got += bytes?.len();
    }
    let through_mbs = got as f64 / started.elapsed().as_secs_f64() / 1e6;
    if got < args.mib << 20 {
        bail!("the stream carried {got} bytes, not {} MiB", args.mib);
    }

    // A watch: each write through the files API until its event comes, against the writes
    // alone (the same API, nothing waiting on them).
    s.mkdir("ibench", "w").await?;
    let mut alone = Vec::with_capacity(args.watched);
    for i in 0..args.watched + 5 {
        let t = Instant::now();
        s.write("ibench", &format!("w/alone-{i}.txt"), b"x".to_vec())
            .await?;
        if i >= 5 {
            alone.push(t.elapsed());
        }
    }
    let mut watch = http
        .get(format!("{base}/v1/sessions/ibench/watch?path=w"))
        .bearer_auth(token)
        .send()
        .await?;
    let mut seen = String::new();
    let mut next_chunk = async |seen: &mut String| -> Result<()> {
        match tokio::time::timeout(Duration::from_secs(5), watch.chunk()).await {
            Ok(Ok(Some(b))) => {
                seen.push_str(&String::from_utf8_lossy(&b));
                Ok(())
            }
            other => bail!("the watch stopped: {other:?}"),
        }
    };
    while !seen.contains("event: watching") {
        next_chunk(&mut seen).await?;
    }
    seen.clear();
    let mut events = Vec::with_capacity(args.watched);
    for i in 0..args.watched + 5 {
        let name = format!("w/watched-{i}.txt");
        let t = Instant::now();
        s.write("ibench", &name, b"x".to_vec()).await?;
        let quoted = format!("\"{name}\"");
        while !seen.contains(&quoted) {
            next_chunk(&mut seen).await?;
        }
        if i >= 5 {
            events.push(t.elapsed());
        }
        seen.clear();
    }

    println!("| measure | baseline | p50 ms (or MB/s) | baseline p50 ms (or MB/s) | ratio |");
    println!("|---|---|---|---|---|");
    println!(
        "| keystroke echo on a terminal | GET /healthz, kept alive | {:.2} | {:.2} | {:.2} |",
        pct(&keys, 0.5),
        pct(&floor, 0.5),
        pct(&keys, 0.5) / pct(&floor, 0.5)
    );
    println!(
        "| small HTTP request through the ports route | the same request inside the sandbox | {:.2} | {:.2} | {:.2} |",
        pct(&small, 0.5),
        inside_p50,
        pct(&small, 0.5) / inside_p50
    );
    println!(
        "| {} MiB through one port stream (MB/s) | the same read inside the sandbox | {:.0} | {:.0} | {:.2} |",
        args.mib,
        through_mbs,
        inside_mbs,
        through_mbs / inside_mbs
    );
    println!(
        "| a write through the files API until its watch event arrives | the write alone | {:.2} | {:.2} | {:.2} |",
        pct(&events, 0.5),
        pct(&alone, 0.5),
        pct(&events, 0.5) / pct(&alone, 0.5)
    );
    println!();
    println!(
        "watch event p95 {:.2} ms, after the write's own p50 {:.2} ms (goal: event <= 20 ms p50 after the write)",
        pct(&events, 0.95),
        pct(&events, 0.5) - pct(&alone, 0.5)
    );
    println!(
        "keystroke echo p95 {:.2} ms; small request p95 {:.2} ms, added p50 {:.2} ms (goals: echo p50 <= 2 ms, added <= 0.5 ms, stream >= 500 MB/s)",
        pct(&keys, 0.95),
        pct(&small, 0.95),
        pct(&small, 0.5) - inside_p50
    );
    Ok(())
}
