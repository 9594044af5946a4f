//! Benchmarks a runtime on gVisor against the same runtime on runc, side by side in one run of
//! one sandboxd (issue 34): a cold open, a warm open (a container of the runtime's warm pool),
//! a trivial run (`true`) through the resident agent, 8 MiB file writes and reads, and a sleep
//! and wake of a sandbox holding 100 MiB in a process's memory (gVisor: a checkpoint and a
//! restore, the process kept; runc: a stop and a start, the process gone and started again).
//! Prints p50/p95 and the gVisor/runc ratios.
//!
//! Needs the project's dockerd with runsc and the tools image (python3): `eval "$(make -s
//! env)"` after `make up`. Usage: `isolation-bench [--opens N] [--warm N] [--runs N]
//! [--files N] [--sleeps N]`

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use sandboxd::config::Config;
use sandboxd_api::client::Client;

#[derive(Parser)]
struct Args {
    /// Cold opens per isolation.
    #[arg(long, default_value_t = 10)]
    opens: usize,
    /// Warm opens per isolation (each waits for the pool to refill first).
    #[arg(long, default_value_t = 10)]
    warm: usize,
    /// Trivial runs per isolation.
    #[arg(long, default_value_t = 200)]
    runs: usize,
    /// 8 MiB writes and reads per isolation.
    #[arg(long, default_value_t = 20)]
    files: usize,
    /// Sleeps and wakes per isolation.
    #[arg(long, default_value_t = 5)]
    sleeps: usize,
}

/// Samples of one measure.
#[derive(Default)]
struct Samples(Vec<Duration>);

impl Samples {
    fn pct(&self, p: f64) -> f64 {
        let mut s = self.0.clone();
        s.sort();
        s.get(((s.len() as f64 - 1.0) * p).round() as usize)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
    }
}

/// What is measured, per isolation.
#[derive(Default)]
struct Measures {
    cold: Samples,
    warm: Samples,
    run: Samples,
    write: Samples,
    read: Samples,
    sleep: Samples,
    wake: Samples,
}

/// The process that holds 100 MiB (touched, so it is resident) until it is killed.
const HOLDER: &str = "(nohup python3 -c 'import time; b = bytearray(100 << 20); b[::4096] = b\"x\" * len(b[::4096]); time.sleep(10**9)' >/dev/null 2>&1 & echo $!)";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let image = std::env::var("SANDBOXD_TOOLS_IMAGE")
        .context("SANDBOXD_TOOLS_IMAGE is not set: eval \"$(make -s env)\" after make up")?;
    std::env::var("DOCKER_HOST")
        .context("DOCKER_HOST is not set: eval \"$(make -s env)\" after make up")?;
    let dir = tempfile::Builder::new()
        .prefix("isolation-bench-")
        .tempdir()?;
    let admin_token = "bench-admin-token";
    let runtimes = serde_json::json!([
        {"alias": "runc", "image": image},
        {"alias": "gvisor", "image": image, "isolation": "gvisor"},
        {"alias": "runc-warm", "image": image, "warm_pool": 1},
        {"alias": "gvisor-warm", "image": image, "isolation": "gvisor", "warm_pool": 1},
    ])
    .to_string();
    let config = Config::try_parse_from([
        "sandboxd",
        "--token",
        admin_token,
        "--port",
        "0",
        "--runtimes",
        &runtimes,
        "--instance",
        &format!("isobench{}", std::process::id()),
        "--workspace-root",
        &dir.path().join("ws").display().to_string(),
        "--state-dir",
        &dir.path().join("state").display().to_string(),
        "--workspace-quota",
        "off",
        "--max-sessions",
        "100",
        "--max-sessions-per-tenant",
        "100",
    ])?;
    let (addr, serve) = sandboxd::server::start(config).await?;
    tokio::spawn(serve);
    let admin = Client::new(&format!("http://{addr}"), admin_token);
    let offered = admin.runtimes().await?.isolation;
    if !offered.iter().any(|i| i.as_str() == "gvisor") {
        bail!("this dockerd offers no gvisor (make up gives the project's dockerd runsc)");
    }

    let mut all = vec![];
    for iso in ["runc", "gvisor"] {
        let mut m = Measures::default();
        // The two take turns where they can; here one after the other, each with the same
        // sandboxd, image and counts.
        for i in 0..args.opens {
            let name = format!("{iso}-cold-{i}");
            let t = Instant::now();
            admin.open(&name, "bench", Some(iso), None).await?;
            m.cold.0.push(t.elapsed());
            admin.destroy(&name).await?;
        }
        let warm_rt = format!("{iso}-warm");
        for i in 0..args.warm {
            wait_pool(&admin, &warm_rt).await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let name = format!("{iso}-warm-{i}");
            let t = Instant::now();
            let opened = admin.open(&name, "bench", Some(&warm_rt), None).await?;
            m.warm.0.push(t.elapsed());
            if opened.session.launch != sandboxd_api::session::Launch::Warm {
                bail!("warm open {i} of {iso} was not warm");
            }
            admin.destroy(&name).await?;
        }
        let name = format!("{iso}-work");
        let opened = admin.open(&name, "bench", Some(iso), None).await?;
        let s = admin.with_token(opened.token.as_deref().context("no token")?);
        for _ in 0..5 {
            s.run(&name, "true", None, None, None).await?;
        }
        for _ in 0..args.runs {
            let t = Instant::now();
            let out = s.run(&name, "true", None, None, None).await?;
            m.run.0.push(t.elapsed());
            if out.exit_code != 0 {
                bail!("`true` exited {} on {iso}", out.exit_code);
            }
        }
        let body = bytes::Bytes::from(vec![7u8; 8 << 20]);
        for _ in 0..args.files {
            let t = Instant::now();
            s.write(&name, "eight.bin", body.clone()).await?;
            m.write.0.push(t.elapsed());
            let t = Instant::now();
            let back = s.read(&name, "eight.bin", 0, None).await?;
            m.read.0.push(t.elapsed());
            if back.len() != body.len() {
                bail!("read {} bytes of 8 MiB on {iso}", back.len());
            }
        }
        // Sleep and wake with 100 MiB in a process's memory.
        let mut holder = start_holder(&s, &name).await?;
        for i in 0..args.sleeps {
            let t = Instant::now();
            admin.stop(&name).await?;
            m.sleep.0.push(t.elapsed());
            let t = Instant::now();
            let out = s
                .run(
                    &name,
                    &format!("kill -0 {holder} 2>/dev/null && echo kept || echo gone"),
                    None,
                    None,
                    None,
                )
                .await?;
            m.wake.0.push(t.elapsed());
            match (iso, out.stdout.trim()) {
                ("gvisor", "kept") | ("runc", "gone") => {}
                (_, what) => bail!("after sleep {i} on {iso} the holder is {what}"),
            }
            if iso == "runc" {
                holder = start_holder(&s, &name).await?;
            }
        }
        admin.destroy(&name).await?;
        all.push((iso, m));
    }

    let [(_, runc), (_, gvisor)] = all.as_slice() else {
        bail!("two isolations measured");
    };
    println!(
        "| measure | runc p50 ms | runc p95 ms | gvisor p50 ms | gvisor p95 ms | gvisor/runc p50 |"
    );
    println!("|---|---|---|---|---|---|");
    let rows: [(&str, &Samples, &Samples); 7] = [
        ("cold open", &runc.cold, &gvisor.cold),
        ("warm open (pooled container)", &runc.warm, &gvisor.warm),
        ("run `true` (agent)", &runc.run, &gvisor.run),
        ("8 MiB write", &runc.write, &gvisor.write),
        ("8 MiB read", &runc.read, &gvisor.read),
        (
            "sleep, 100 MiB held (runc: stop; gvisor: checkpoint)",
            &runc.sleep,
            &gvisor.sleep,
        ),
        (
            "wake + first run (runc: start; gvisor: restore)",
            &runc.wake,
            &gvisor.wake,
        ),
    ];
    for (what, r, g) in rows {
        println!(
            "| {what} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r.pct(0.5),
            r.pct(0.95),
            g.pct(0.5),
            g.pct(0.95),
            g.pct(0.5) / r.pct(0.5)
        );
    }
    println!();
    println!(
        "run `true` gvisor/runc p50: {:.2} (goal <= 2); wake with 100 MiB kept p50: {:.0} ms (goal: resume <= 300 ms)",
        gvisor.run.pct(0.5) / runc.run.pct(0.5),
        gvisor.wake.pct(0.5)
    );
    Ok(())
}

/// Waits until the warm pool of `runtime` has a ready container.
async fn wait_pool(admin: &Client, runtime: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let list = admin.runtimes().await?;
        if list
            .runtimes
            .iter()
            .any(|r| r.alias == runtime && r.warm_pool.ready >= 1)
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the warm pool of {runtime} did not refill within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Starts the 100 MiB holder in `session`; its pid.
async fn start_holder(s: &Client, session: &str) -> Result<String> {
    let out = s.run(session, HOLDER, None, None, None).await?;
    let pid = out.stdout.trim().to_owned();
    if out.exit_code != 0 || pid.is_empty() {
        bail!("the holder did not start: {} {}", out.stdout, out.stderr);
    }
    // Until its 100 MiB are touched.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Ok(pid)
}
