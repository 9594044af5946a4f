//! Benchmarks snapshots (issue 32) against `tar | zstd` to the same S3 store in the same run,
//! both ends on this machine (the versitygw of `make up`):
//!
//! - large files (`--mib` MiB of random bytes in four files): a snapshot and a restore, in MB/s,
//!   against `tar -cf - | zstd -3` put as one object, and that object got and unpacked with
//!   `zstd -d | tar -xf -`;
//! - many small files (`--files` files of 1 to 4 KiB in 50 folders): the same, in files/s;
//! - a second snapshot of the unchanged large files (every chunk is in the store: nothing is
//!   sent), in seconds;
//! - fork to Running through sandboxd: a session from a snapshot of a `--fork-mib` MiB
//!   workspace, from the open request until it answers with the session running, against a
//!   cold open of an empty session on the same sandboxd.
//!
//! Needs the S3 server and the tools image: `eval "$(make -s env)"` after `make up`. Usage:
//! `snapshot-bench [--mib N] [--files N] [--fork-mib N]`

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use object_store::ObjectStoreExt as _;
use object_store::aws::AmazonS3Builder;
use rand::RngCore as _;
use sandboxd::config::Config;
use sandboxd::snapshot::{Store, StoreConfig};
use sandboxd_api::client::Client;
use sandboxd_api::session::OpenRequest;

#[derive(Parser)]
struct Args {
    /// MiB of large files.
    #[arg(long, default_value_t = 1024)]
    mib: usize,
    /// Small files.
    #[arg(long, default_value_t = 5000)]
    files: usize,
    /// MiB of the workspace forked.
    #[arg(long, default_value_t = 100)]
    fork_mib: usize,
}

fn env(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set: eval \"$(make -s env)\""))
}

/// Runs `script` under `sh -c` with `input` on its stdin; its stdout.
fn sh(script: &str, input: &[u8]) -> Result<Vec<u8>> {
    let mut child = Command::new("sh")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("sh -c {script}"))?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let input = input.to_vec();
    let feeder = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output()?;
    feeder
        .join()
        .map_err(|_| anyhow::anyhow!("the stdin feeder panicked"))??;
    if !out.status.success() {
        bail!("{script} failed: {}", out.status);
    }
    Ok(out.stdout)
}

/// The baseline of one folder: `tar | zstd` put as one object, then got and unpacked into a
/// new folder: (seconds to put, seconds to restore).
async fn baseline(
    raw: &dyn object_store::ObjectStore,
    key: &str,
    dir: &Path,
    out: &Path,
) -> Result<(f64, f64)> {
    let t = Instant::now();
    let packed = sh(
        &format!("tar -C '{}' -cf - . | zstd -3 -q -c", dir.display()),
        &[],
    )?;
    let key = object_store::path::Path::from(key);
    raw.put(&key, packed.into()).await?;
    let put = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let got = raw.get(&key).await?.bytes().await?;
    std::fs::create_dir_all(out)?;
    sh(
        &format!("zstd -d -q -c | tar -C '{}' -xf -", out.display()),
        &got,
    )?;
    let restored = t.elapsed().as_secs_f64();
    raw.delete(&key).await?;
    Ok((put, restored))
}

fn large(dir: &Path, mib: usize) -> Result<u64> {
    std::fs::create_dir_all(dir)?;
    let mut rng = rand::rng();
    let mut block = vec![0u8; 1 << 20];
    for f in 0..4 {
        let mut file = std::fs::File::create(dir.join(format!("part{f}.bin")))?;
        for _ in 0..mib / 4 {
            rng.fill_bytes(&mut block);
            file.write_all(&block)?;
        }
    }
    Ok((mib / 4 * 4) as u64 * (1 << 20))
}

fn small(dir: &Path, files: usize) -> Result<()> {
    let mut rng = rand::rng();
    for i in 0..files {
        let folder = dir.join(format!("pkg{:02}", i % 50));
        std::fs::create_dir_all(&folder)?;
        let n = 1024 + (rng.next_u32() as usize % 3072);
        let text: String = (0..n)
            .map(|j| char::from(b'a' + ((i + j) % 26) as u8))
            .collect();
        std::fs::write(folder.join(format!("m{i:05}.py")), text)?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let prefix = format!("bench-{}-{:08x}", std::process::id(), rand::random::<u32>());
    let config = StoreConfig {
        endpoint: env("SANDBOXD_S3_ENDPOINT")?,
        bucket: env("SANDBOXD_S3_BUCKET")?,
        region: env("SANDBOXD_S3_REGION")?,
        access_key_id: env("SANDBOXD_S3_ACCESS_KEY_ID")?,
        secret_access_key: env("SANDBOXD_S3_SECRET_ACCESS_KEY")?,
        prefix: prefix.clone(),
    };
    let store = Store::new(&config)?;
    let raw = AmazonS3Builder::new()
        .with_endpoint(&config.endpoint)
        .with_allow_http(true)
        .with_bucket_name(&config.bucket)
        .with_region(&config.region)
        .with_access_key_id(&config.access_key_id)
        .with_secret_access_key(&config.secret_access_key)
        .build()?;
    let dir = tempfile::Builder::new()
        .prefix("snapshot-bench-")
        .tempdir()?;
    let result = measure(&args, &store, &raw, &prefix, dir.path(), &config).await;
    for name in ["large", "large-again", "small"] {
        let _ = store.delete(name).await;
    }
    let _ = store.collect(Duration::ZERO).await;
    result
}

async fn measure(
    args: &Args,
    store: &Store,
    raw: &dyn object_store::ObjectStore,
    prefix: &str,
    dir: &Path,
    config: &StoreConfig,
) -> Result<()> {
    let mb = |bytes: u64, secs: f64| bytes as f64 / 1e6 / secs;

    let big = dir.join("large");
    let bytes = large(&big, args.mib)?;
    let (tar_put, tar_get) = baseline(
        raw,
        &format!("{prefix}/baseline/large.tar.zst"),
        &big,
        &dir.join("large-tar"),
    )
    .await?;
    let t = Instant::now();
    store.snapshot("large", &big).await?;
    let snap = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let again = store.snapshot("large-again", &big).await?;
    let second = t.elapsed().as_secs_f64();
    let t = Instant::now();
    store
        .restore("large", &dir.join("large-restored"), (0, 0))
        .await?;
    let restore = t.elapsed().as_secs_f64();

    let many = dir.join("small");
    small(&many, args.files)?;
    let (stp, stg) = baseline(
        raw,
        &format!("{prefix}/baseline/small.tar.zst"),
        &many,
        &dir.join("small-tar"),
    )
    .await?;
    let t = Instant::now();
    store.snapshot("small", &many).await?;
    let ssnap = t.elapsed().as_secs_f64();
    let t = Instant::now();
    store
        .restore("small", &dir.join("small-restored"), (0, 0))
        .await?;
    let srestore = t.elapsed().as_secs_f64();
    let files = args.files as f64;

    let (cold, fork, taken) = fork_to_running(args, dir, config).await?;

    println!("| measure | baseline | ours | baseline | ratio |");
    println!("|---|---|---|---|---|");
    println!(
        "| snapshot of {} MiB of large files (MB/s) | tar \\| zstd -3, put as one object | {:.0} | {:.0} | {:.2} |",
        args.mib,
        mb(bytes, snap),
        mb(bytes, tar_put),
        tar_put / snap
    );
    println!(
        "| restore of them (MB/s) | get, zstd -d \\| tar -x | {:.0} | {:.0} | {:.2} |",
        mb(bytes, restore),
        mb(bytes, tar_get),
        tar_get / restore
    );
    println!(
        "| snapshot of {} small files (files/s) | tar \\| zstd -3, put as one object | {:.0} | {:.0} | {:.2} |",
        args.files,
        files / ssnap,
        files / stp,
        stp / ssnap
    );
    println!(
        "| restore of them (files/s) | get, zstd -d \\| tar -x | {:.0} | {:.0} | {:.2} |",
        files / srestore,
        files / stg,
        stg / srestore
    );
    println!(
        "| second snapshot of the unchanged {} MiB (s) | the first snapshot | {:.2} | {:.2} | {:.2} |",
        args.mib,
        second,
        snap,
        second / snap
    );
    println!(
        "| fork of a {} MiB workspace to Running (s) | a cold open of an empty session | {:.2} | {:.2} | {:.2} |",
        args.fork_mib,
        fork,
        cold,
        fork / cold
    );
    println!();
    println!(
        "second snapshot sent {} chunks; the fork's snapshot took {taken:.2} s (the sandbox paused for it) (goals: >= 200 MB/s and >= 2,000 files/s both ways, a second snapshot of 1 GiB < 2 s, fork to Running <= 2 s)",
        again.chunks_sent
    );
    Ok(())
}

/// A session from a snapshot of a `fork_mib` MiB workspace through sandboxd: (seconds of a
/// cold open of an empty session, seconds of the open from the snapshot, seconds the
/// snapshot took).
async fn fork_to_running(args: &Args, dir: &Path, store: &StoreConfig) -> Result<(f64, f64, f64)> {
    let image = env("SANDBOXD_TOOLS_IMAGE")?;
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
        &format!("sbench{}", std::process::id()),
        "--workspace-root",
        &dir.join("ws").display().to_string(),
        "--state-dir",
        &dir.join("state").display().to_string(),
        "--workspace-quota",
        "off",
        "--s3-endpoint",
        &store.endpoint,
        "--s3-bucket",
        &store.bucket,
        "--s3-region",
        &store.region,
        "--s3-access-key-id",
        &store.access_key_id,
        "--s3-secret-access-key",
        &store.secret_access_key,
        "--s3-prefix",
        &store.prefix,
    ])?;
    let (addr, serve) = sandboxd::server::start(config).await?;
    tokio::spawn(serve);
    let admin = Client::new(&format!("http://{addr}"), admin_token);
    admin.open("src", "bench", None, None).await?;
    let ran = admin
        .run(
            "src",
            &format!(
                "head -c {}M /dev/urandom > /workspace/data.bin && mkdir -p /workspace/src && for i in $(seq 1 200); do echo $i > /workspace/src/f$i.py; done",
                args.fork_mib
            ),
            Some(120),
            None,
            None,
        )
        .await?;
    if ran.exit_code != 0 {
        bail!("writing the workspace failed: {}", ran.stderr);
    }
    let t = Instant::now();
    admin.take_snapshot("src", "bench", "fork").await?;
    let taken = t.elapsed().as_secs_f64();
    let t = Instant::now();
    admin.open("plain", "bench", None, None).await?;
    let cold = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let forked = admin
        .open_request(&OpenRequest {
            name: "forked".to_owned(),
            tenant: "bench".to_owned(),
            runtime: None,
            limits: None,
            owner: None,
            egress: Vec::new(),
            from_snapshot: Some("bench/fork".to_owned()),
        })
        .await?;
    let fork = t.elapsed().as_secs_f64();
    if forked.session.state != sandboxd_api::SessionState::Running {
        bail!("the fork is {:?}, not running", forked.session.state);
    }
    for s in ["src", "plain", "forked"] {
        let _ = admin.destroy(s).await;
    }
    let _ = admin.delete_snapshot("bench", "fork").await;
    Ok((cold, fork, taken))
}
