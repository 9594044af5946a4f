//! Benchmarks sandboxd against the same operations done directly with bollard, in one run:
//! a cold session open against a raw create+start, a warm open (a container of the runtime's
//! warm pool) and its first command's output, a trivial run (`true`) on the agent path and
//! on the Docker exec path against a raw `docker exec`, 1 MiB of run output on both paths, and
//! 8 MiB file reads and writes. Prints p50/p95 and the ratios.
//!
//! Needs the project's dockerd and base image: `eval "$(make -s env)"` after `make up`.
//! Usage: `sandboxd-bench [--runs N] [--opens N] [--warm N] [--files N]`

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bollard::exec::{CreateExecOptions, StartExecResults};
use clap::Parser;
use futures::StreamExt;
use sandboxd::config::Config;
use sandboxd::container::{Engine, SandboxSpec};
use sandboxd_api::client::Client;

#[derive(Parser)]
struct Args {
    /// Trivial runs per path.
    #[arg(long, default_value_t = 200)]
    runs: usize,
    /// Cold opens per path.
    #[arg(long, default_value_t = 15)]
    opens: usize,
    /// Warm opens (each waits for the pool to refill first, so each is warm).
    #[arg(long, default_value_t = 30)]
    warm: usize,
    /// 8 MiB reads and writes.
    #[arg(long, default_value_t = 20)]
    files: usize,
}

struct Stats {
    name: &'static str,
    samples: Vec<Duration>,
}

impl Stats {
    fn pct(&self, p: f64) -> Duration {
        let mut s = self.samples.clone();
        s.sort();
        s[((s.len() as f64 - 1.0) * p).round() as usize]
    }
    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1000.0
    }
}

async fn raw_exec(engine: &Engine, container: &str) -> Result<()> {
    let docker = engine.docker()?.client();
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                cmd: Some(vec!["true"]),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await?;
    if let StartExecResults::Attached { mut output, .. } = docker.start_exec(&exec.id, None).await?
    {
        while output.next().await.is_some() {}
    }
    let code = docker.inspect_exec(&exec.id).await?.exit_code;
    if code != Some(0) {
        bail!("raw exec exited {code:?}");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let image = std::env::var("SANDBOXD_BASE_IMAGE")
        .context("SANDBOXD_BASE_IMAGE is not set: eval \"$(make -s env)\" after make up")?;
    std::env::var("DOCKER_HOST")
        .context("DOCKER_HOST is not set: eval \"$(make -s env)\" after make up")?;
    let dir = tempfile::Builder::new()
        .prefix("sandboxd-bench-")
        .tempdir()?;
    let instance = format!("bench{}", std::process::id());
    let admin_token = "bench-admin-token";
    // Sandboxds in this process: the default (the resident agent) and the Docker exec path.
    // The agent's sandboxd gives every workspace its disk (the default, SANDBOXD_WORKSPACE_QUOTA
    // =loop, 10g); a third one without disks shows what they cost an open.
    let config_with = |tag: &str, backend: &str, quota: &str, runtimes: &str| {
        let name = format!("{tag}-{quota}");
        Config::try_parse_from([
            "sandboxd",
            "--token",
            admin_token,
            "--port",
            "0",
            "--runtimes",
            runtimes,
            "--instance",
            &format!("{instance}{}", if quota == "off" { tag } else { &name }),
            "--workspace-root",
            &dir.path().join(format!("ws-{name}")).display().to_string(),
            "--state-dir",
            &dir.path()
                .join(format!("state-{name}"))
                .display()
                .to_string(),
            "--workspace-quota",
            quota,
            "--max-sessions",
            "100",
            "--max-sessions-per-tenant",
            "100",
            "--run-backend",
            backend,
        ])
    };
    let config_for =
        |backend: &str, quota: &str| config_with(backend, backend, quota, &format!("base={image}"));
    let config = config_for("agent", "off")?;
    let settings = sandboxd::service::Settings::from_config(&config);
    let (addr, serve) = sandboxd::server::start(config).await?;
    tokio::spawn(serve);
    let (exec_addr, exec_serve) = sandboxd::server::start(config_for("exec", "off")?).await?;
    tokio::spawn(exec_serve);
    let (disk_addr, disk_serve) = sandboxd::server::start(config_for("agent", "loop")?).await?;
    tokio::spawn(disk_serve);
    let admin = Client::new(&format!("http://{addr}"), admin_token);
    let disk_admin = Client::new(&format!("http://{disk_addr}"), admin_token);
    let exec_admin = Client::new(&format!("http://{exec_addr}"), admin_token);
    let engine = Engine::connect(&format!("{instance}raw")).await?;
    // A fourth, like the first, whose runtime keeps a warm pool of one.
    let pooled = serde_json::json!([{"alias": "base", "image": image, "warm_pool": 1}]).to_string();
    let (warm_addr, warm_serve) =
        sandboxd::server::start(config_with("warm", "agent", "off", &pooled)?).await?;
    tokio::spawn(warm_serve);
    let warm_admin = Client::new(&format!("http://{warm_addr}"), admin_token);

    // Cold opens: sandboxd (HTTP, state, workspace, create+start) vs raw create+start.
    let mut open_raw = Stats {
        name: "cold open: raw bollard create+start",
        samples: vec![],
    };
    let mut open_sbx = Stats {
        name: "cold open: sandboxd POST /v1/sessions",
        samples: vec![],
    };
    let mut open_disk = Stats {
        name: "cold open: sandboxd POST /v1/sessions, 10 GiB workspace disk",
        samples: vec![],
    };
    for i in 0..args.opens {
        let ws = dir.path().join(format!("raw-{i}"));
        std::fs::create_dir_all(&ws)?;
        let spec = SandboxSpec {
            session: format!("raw-{i}"),
            tenant: "bench".into(),
            image: image.clone(),
            workspace: ws.display().to_string(),
            uid: settings.uid,
            network_mode: "none".into(),
            cpus: settings.cpus,
            memory: settings.memory,
            pids_limit: settings.pids_limit,
            tmpfs_size: settings.tmpfs_size.clone(),
            home_size: settings.home_size.clone(),
            oci_runtime: None,
            env: vec![],
            agent: None,
            trust: None,
            resolv_conf: None,
        };
        let t = Instant::now();
        let id = engine.create(&spec).await?;
        open_raw.samples.push(t.elapsed());
        engine.remove(&id).await?;
        let t = Instant::now();
        admin
            .open(&format!("open-{i}"), "bench", None, None)
            .await?;
        open_sbx.samples.push(t.elapsed());
        admin.destroy(&format!("open-{i}")).await?;
        let t = Instant::now();
        disk_admin
            .open(&format!("open-{i}"), "bench", None, None)
            .await?;
        open_disk.samples.push(t.elapsed());
        disk_admin.destroy(&format!("open-{i}")).await?;
    }

    // Warm opens: the pool refilled (its one container started), then an open takes it; and
    // the first command's output on it, from the open's start.
    let mut open_warm = Stats {
        name: "warm open: sandboxd POST /v1/sessions, pooled container",
        samples: vec![],
    };
    let mut first_output = Stats {
        name: "warm open + first run `echo` output",
        samples: vec![],
    };
    for i in 0..args.warm {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let list = warm_admin.runtimes().await?;
            if list
                .runtimes
                .first()
                .is_some_and(|r| r.warm_pool.ready >= 1)
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("the warm pool did not refill within 120 s");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // What the refill left on the cores settles first, as it would between two opens.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let name = format!("warm-{i}");
        let t = Instant::now();
        let opened = warm_admin.open(&name, "bench", None, None).await?;
        open_warm.samples.push(t.elapsed());
        if opened.session.launch != sandboxd_api::session::Launch::Warm {
            bail!("open {i} was not warm");
        }
        let out = warm_admin.run(&name, "echo hi", None, None, None).await?;
        first_output.samples.push(t.elapsed());
        if out.stdout != "hi\n" {
            bail!("the first run printed {:?}", out.stdout);
        }
        warm_admin.destroy(&name).await?;
    }

    // Trivial runs on warm sessions, interleaved: sandboxd on the agent path and on the Docker
    // exec path (each with its session token) vs raw exec in the exec path's container.
    let opened = admin.open("runs", "bench", None, None).await?;
    let session = admin.with_token(opened.token.as_deref().context("no token")?);
    let opened = exec_admin.open("runs", "bench", None, None).await?;
    let exec_session = exec_admin.with_token(opened.token.as_deref().context("no token")?);
    let container = engine_container(&format!("{instance}exec"), "runs");
    let mut run_raw = Stats {
        name: "run `true`: raw bollard exec",
        samples: vec![],
    };
    let mut run_exec = Stats {
        name: "run `true`: sandboxd POST /runs, exec path",
        samples: vec![],
    };
    let mut run_sbx = Stats {
        name: "run `true`: sandboxd POST /runs, agent path",
        samples: vec![],
    };
    for _ in 0..5 {
        raw_exec(&engine, &container).await?;
        session.run("runs", "true", None, None, None).await?;
        exec_session.run("runs", "true", None, None, None).await?;
    }
    // The three take turns in a rotating order, so that each follows each of the others
    // equally often (what runs just before, a Docker exec above all, leaves work on the cores).
    for i in 0..args.runs {
        for k in 0..3 {
            match (i + k) % 3 {
                0 => {
                    let t = Instant::now();
                    raw_exec(&engine, &container).await?;
                    run_raw.samples.push(t.elapsed());
                }
                1 => {
                    let t = Instant::now();
                    let out = exec_session.run("runs", "true", None, None, None).await?;
                    run_exec.samples.push(t.elapsed());
                    if out.exit_code != 0 {
                        bail!("run exited {}", out.exit_code);
                    }
                }
                _ => {
                    let t = Instant::now();
                    let out = session.run("runs", "true", None, None, None).await?;
                    run_sbx.samples.push(t.elapsed());
                    if out.exit_code != 0 {
                        bail!("run exited {}", out.exit_code);
                    }
                }
            }
        }
    }

    // The agent path again, back to back: in the loop above two of its three runs follow a
    // Docker exec, whose clean-up (dockerd, containerd-shim, runc) still holds the cores.
    let mut run_sbx_alone = Stats {
        name: "run `true`: sandboxd POST /runs, agent path, back to back",
        samples: vec![],
    };
    for _ in 0..args.runs {
        let t = Instant::now();
        let out = session.run("runs", "true", None, None, None).await?;
        run_sbx_alone.samples.push(t.elapsed());
        if out.exit_code != 0 {
            bail!("run exited {}", out.exit_code);
        }
    }

    // 1 MiB of output (a file in the workspace, `cat`), whole through POST /runs.
    let mib = vec![b'x'; 1024 * 1024];
    session.write("runs", "mib.txt", mib.clone()).await?;
    exec_session.write("runs", "mib.txt", mib).await?;
    let mut out_sbx = Stats {
        name: "1 MiB output: POST /runs `cat`, agent path",
        samples: vec![],
    };
    let mut out_exec = Stats {
        name: "1 MiB output: POST /runs `cat`, exec path",
        samples: vec![],
    };
    for _ in 0..args.files {
        for (client, stats) in [(&session, &mut out_sbx), (&exec_session, &mut out_exec)] {
            let t = Instant::now();
            let out = client.run("runs", "cat mib.txt", None, None, None).await?;
            stats.samples.push(t.elapsed());
            if out.stdout.len() != 1024 * 1024 || out.truncated {
                bail!("1 MiB run returned {} bytes", out.stdout.len());
            }
        }
    }
    // The same 1 MiB streamed (`?stream=true`): first output byte to the outcome.
    let mut stream_sbx = Stats {
        name: "1 MiB output streamed: first byte to exit, agent path",
        samples: vec![],
    };
    let mut stream_exec = Stats {
        name: "1 MiB output streamed: first byte to exit, exec path",
        samples: vec![],
    };
    for _ in 0..args.files {
        for (client, stats) in [
            (&session, &mut stream_sbx),
            (&exec_session, &mut stream_exec),
        ] {
            let mut first = None;
            let mut bytes = 0usize;
            let outcome = client
                .run_streaming("runs", "cat mib.txt", None, |e| {
                    first.get_or_insert_with(Instant::now);
                    if let sandboxd::run::RunEvent::Stdout { data } = e {
                        bytes += data.len();
                    }
                })
                .await?;
            let first = first.context("no output streamed")?;
            stats.samples.push(first.elapsed());
            if bytes != 1024 * 1024 || outcome.stdout.len() != bytes {
                bail!(
                    "streamed {bytes} bytes, the outcome holds {}",
                    outcome.stdout.len()
                );
            }
        }
    }
    exec_admin.destroy("runs").await?;

    // 8 MiB files through the API, against the same done directly on this disk in the same
    // loop (a new file written in 1 MiB pieces and renamed into place; the file read back):
    // the floor.
    let payload = bytes::Bytes::from(vec![0x5au8; 8 * 1024 * 1024]);
    let mut write_raw = Stats {
        name: "write 8 MiB: local file write + rename",
        samples: vec![],
    };
    let mut write = Stats {
        name: "write 8 MiB: PUT /files",
        samples: vec![],
    };
    let mut read_raw = Stats {
        name: "read 8 MiB: local file read",
        samples: vec![],
    };
    let mut read = Stats {
        name: "read 8 MiB: GET /files",
        samples: vec![],
    };
    let raw_dir = dir.path().join("raw-files");
    std::fs::create_dir_all(&raw_dir)?;
    for i in 0..args.files {
        let t = Instant::now();
        let tmp = raw_dir.join(format!(".big-{i}.tmp"));
        {
            // In 1 MiB pieces, as sandboxd writes (one 8 MiB write() waits for writeback).
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            for piece in payload.chunks(1024 * 1024) {
                f.write_all(piece)?;
            }
        }
        std::fs::rename(&tmp, raw_dir.join(format!("big-{i}.bin")))?;
        write_raw.samples.push(t.elapsed());
        let t = Instant::now();
        session
            .write("runs", &format!("big-{i}.bin"), payload.clone())
            .await?;
        write.samples.push(t.elapsed());
        let t = Instant::now();
        let back = std::fs::read(raw_dir.join(format!("big-{i}.bin")))?;
        read_raw.samples.push(t.elapsed());
        if back.len() != payload.len() {
            bail!("read {} bytes back", back.len());
        }
        drop(back);
        let t = Instant::now();
        let back = session
            .read("runs", &format!("big-{i}.bin"), 0, None)
            .await?;
        read.samples.push(t.elapsed());
        if back.len() != payload.len() {
            bail!("read {} bytes back", back.len());
        }
    }
    admin.destroy("runs").await?;

    println!("| measurement | n | p50 ms | p95 ms |");
    println!("|---|---|---|---|");
    for s in [
        &open_raw,
        &open_sbx,
        &open_disk,
        &open_warm,
        &first_output,
        &run_raw,
        &run_exec,
        &run_sbx,
        &run_sbx_alone,
        &out_exec,
        &out_sbx,
        &stream_exec,
        &stream_sbx,
        &write_raw,
        &write,
        &read_raw,
        &read,
    ] {
        println!(
            "| {} | {} | {:.2} | {:.2} |",
            s.name,
            s.samples.len(),
            Stats::ms(s.pct(0.5)),
            Stats::ms(s.pct(0.95))
        );
    }
    let ratio = |a: &Stats, b: &Stats| Stats::ms(a.pct(0.5)) / Stats::ms(b.pct(0.5));
    println!();
    println!(
        "run `true` p50 ratio sandboxd exec path / raw exec: {:.3} (target <= 1.2)",
        ratio(&run_exec, &run_raw)
    );
    println!(
        "run `true` p50 agent path: {:.2} ms, {:.1}x faster than raw exec, {:.1}x than the exec path (target <= 5 ms, >= 10x)",
        Stats::ms(run_sbx.pct(0.5)),
        ratio(&run_raw, &run_sbx),
        ratio(&run_exec, &run_sbx)
    );
    println!(
        "run `true` p50 agent path back to back: {:.2} ms, {:.1}x faster than raw exec",
        Stats::ms(run_sbx_alone.pct(0.5)),
        ratio(&run_raw, &run_sbx_alone)
    );
    let mib_s = |s: &Stats| 1024.0 * 1024.0 / s.pct(0.5).as_secs_f64() / 1e6;
    println!(
        "1 MiB output, whole run p50: agent path {:.0} MB/s, exec path {:.0} MB/s",
        mib_s(&out_sbx),
        mib_s(&out_exec)
    );
    println!(
        "1 MiB output streamed p50: agent path {:.0} MB/s, exec path {:.0} MB/s (target >= 200 MB/s)",
        mib_s(&stream_sbx),
        mib_s(&stream_exec)
    );
    println!(
        "cold open p50: sandboxd - raw = {:+.1} ms (target <= +100 ms)",
        Stats::ms(open_sbx.pct(0.5)) - Stats::ms(open_raw.pct(0.5))
    );
    println!(
        "warm open p50: {:.2} ms (target <= 15 ms); first output {:.2} ms after the open answered",
        Stats::ms(open_warm.pct(0.5)),
        Stats::ms(first_output.pct(0.5)) - Stats::ms(open_warm.pct(0.5))
    );
    println!(
        "cold open p50 with a 10 GiB workspace disk: {:+.1} ms over one without",
        Stats::ms(open_disk.pct(0.5)) - Stats::ms(open_sbx.pct(0.5))
    );
    let mbps = |s: &Stats| 8.0 * 1024.0 * 1024.0 / s.pct(0.5).as_secs_f64() / 1e9;
    println!(
        "8 MiB write p50: {:.2} GB/s (local write {:.2} GB/s, ratio {:.2}), read p50: {:.2} GB/s (local read {:.2} GB/s, ratio {:.2}) (target >= 1 GB/s)",
        mbps(&write),
        mbps(&write_raw),
        ratio(&write, &write_raw),
        mbps(&read),
        mbps(&read_raw),
        ratio(&read, &read_raw)
    );
    Ok(())
}

fn engine_container(instance: &str, session: &str) -> String {
    format!("sandboxd-{instance}-{session}")
}
