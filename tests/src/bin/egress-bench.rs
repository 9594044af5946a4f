//! Benchmarks what the egress proxy (#29) costs a sandbox's connections, against the same
//! connections made directly, both measured in the same run from real sandboxes of one sandboxd:
//!
//! - **time to first byte**: a Python script in the sandbox (`http.client`) makes `--requests`
//!   sequential GETs of `http://allowed.test/`, each on a new connection, and times each from
//!   before the connect to its response's status line and headers (connect, request, first
//!   response bytes). The name is resolved once up front, so DNS is not in the loop (through the
//!   proxy the proxy resolves it again at each connection, from its cache). The same over HTTPS
//!   (the TLS handshake in the loop) unless `--no-https`. The requests are made in `--rounds`
//!   blocks taking turns between the two sandboxes, after `--warmup` untimed ones in each;
//! - **throughput through one connection**: `curl -o /dev/null` of `/bytes/<--bytes>` (1 GiB of
//!   zeros by default, over HTTP) in each sandbox, `--downloads` times taking turns, the best of
//!   each; with the CPU time curl (the run's `cpu_ns`), sandboxd (where the proxy runs) and the
//!   test internet's server spent on the best download.
//!
//! A third sandbox, runtime `intercepted` (the same policy as `proxied`), holds a credential
//! for `allowed.test` (`PUT /v1/sessions/{id}/credentials`, #30): its HTTPS GETs are
//! terminated by the proxy with the node's egress CA, the header set, and carried over a TLS
//! connection of the proxy's own to the server. Its HTTPS time to first byte is printed beside
//! the pass-through one of `proxied`, measured in the same rounds, with their ratio.
//!
//! The two sandboxes: runtime `direct` (`needs_network: true`, the plain NATed sandbox network:
//! the baseline) and runtime `proxied` (`egress: allowlist` of `allowed.test`: every TCP
//! connection is redirected to sandboxd's egress proxy, which reads the Host or SNI, resolves the
//! name through `SANDBOXD_EGRESS_RESOLVER` and splices). The server is a test internet of the
//! bench's own ([`Internet`]: a network namespace with DNS, HTTP and HTTPS servers on the
//! documentation ranges); the `direct` sandbox cannot resolve `.test` names (Docker's resolver
//! does not know them), so it is handed the address, which the `proxied` one looks up through
//! sandboxd's resolver. Nothing but the test internet and loopback is dialled.
//!
//! sandboxd is the workspace's binary beside this one (`target/release/sandboxd` for a release
//! bench), started as a child with the tools image (`SANDBOXD_TOOLS_IMAGE`: curl, python3) as
//! both runtimes' image; the test internet is `test-internet` beside it too. Needs root
//! (namespaces, veths), `make up` and `eval "$(make -s env)"`; then
//! `cargo build --release -p sandboxd --bin sandboxd -p sandboxd-testkit --bin test-internet`
//! and `cargo run --release -p sandboxd-tests --bin egress-bench`. The targets of #29 are
//! printed with the figures: at most 1 ms added to the p50 time to first byte, at least 1 GB/s
//! through one connection. Dropping the harness (also on a failure or at the `--deadline`)
//! kills sandboxd, removes its containers, networks and firewall chains, and the test internet.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use sandboxd_api::client::Client;
use sandboxd_testkit::internet::{Internet, Range, Spec};
use sandboxd_tests::bench::quantile;
use sandboxd_tests::process::{Sandboxd, bin};
use serde::Deserialize;

#[derive(Parser)]
struct Args {
    /// Timed GETs per target and scheme, each on a new connection.
    #[arg(long, default_value_t = 300)]
    requests: usize,
    /// Blocks the requests are made in, taking turns between the two sandboxes.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Untimed GETs before each block (connections, caches, the proxy's resolver).
    #[arg(long, default_value_t = 10)]
    warmup: usize,
    /// Leave out the HTTPS time to first byte.
    #[arg(long)]
    no_https: bool,
    /// The size of each download, bytes.
    #[arg(long, default_value_t = 1 << 30)]
    bytes: u64,
    /// Downloads per target, taking turns; the best counts.
    #[arg(long, default_value_t = 3)]
    downloads: usize,
    /// `SANDBOXD_CPUS` of the sandboxes (sandboxd's default when not given: 2).
    #[arg(long)]
    cpus: Option<f64>,
    /// The image of both runtimes: curl and python3 (hack/tools-image.sh).
    #[arg(long, env = "SANDBOXD_TOOLS_IMAGE")]
    image: Option<String>,
    /// The whole run's limit, seconds: past it the bench fails (and cleans up).
    #[arg(long, default_value_t = 900)]
    deadline: u64,
}

/// The test internet's host the sandboxes reach.
const HOST: &str = "allowed.test";
/// The runtimes' catalog: `{image}` is the tools image.
const CATALOG: &str = r#"[
  {"alias": "direct", "image": "{image}", "needs_network": true},
  {"alias": "proxied", "image": "{image}", "egress": {"mode": "allowlist", "allow": [{"domain": "allowed.test"}]}},
  {"alias": "intercepted", "image": "{image}", "egress": {"mode": "allowlist", "allow": [{"domain": "allowed.test"}]}}
]"#;

/// The time-to-first-byte script, run with python3 in the sandbox:
/// `ttfb.py NAME ADDR|- PORT http|https COUNT WARMUP`. It prints one JSON object: the address
/// used, how it was found, and each timed GET's time to first byte in microseconds.
const TTFB_PY: &str = r#"
import http.client, json, socket, ssl, sys, time
name, addr, port, scheme, count, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
how = "given"
if addr == "-":
    addr, how = socket.gethostbyname(name), "resolved"
ctx = ssl.create_default_context(cafile="/workspace/ca.pem") if scheme == "https" else None
def get():
    t0 = time.perf_counter()
    sock = socket.create_connection((addr, port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if ctx is not None:
        sock = ctx.wrap_socket(sock, server_hostname=name)
        conn = http.client.HTTPSConnection(name, port, context=ctx, timeout=10)
    else:
        conn = http.client.HTTPConnection(name, port, timeout=10)
    conn.sock = sock
    conn.request("GET", "/")
    resp = conn.getresponse()
    t1 = time.perf_counter()
    body = resp.read()
    conn.close()
    if resp.status != 200 or not body.startswith(b"hello from " + name.encode()):
        raise SystemExit("GET %s://%s/: %d %r" % (scheme, name, resp.status, body[:200]))
    return t1 - t0
for _ in range(warmup):
    get()
samples = sorted(round(get() * 1e6) for _ in range(count))
q = lambda p: samples[round((len(samples) - 1) * p)] / 1000
print(json.dumps({"addr": addr, "how": how, "p50_ms": q(0.5), "p90_ms": q(0.9), "p99_ms": q(0.99), "us": samples}))
"#;

/// What the script printed.
#[derive(Deserialize)]
struct Ttfb {
    addr: String,
    how: String,
    us: Vec<u64>,
}

/// One of the two sandboxes.
struct Target {
    /// `direct` or `proxied` (the runtime and the session's name).
    name: &'static str,
    /// The session's client.
    client: Client,
    /// The address handed to the script (`-`: look the name up).
    addr: String,
    /// curl's `--resolve`, when the sandbox cannot resolve the name.
    resolve: String,
    /// Measured over HTTPS only (the intercepted target: its HTTP is `proxied`'s).
    https_only: bool,
}

/// The time to first byte of one target and scheme, gathered over the rounds.
#[derive(Default)]
struct Samples {
    all: Vec<Duration>,
    how: String,
}

/// A download's figures.
#[derive(Clone, Copy, Default)]
struct Download {
    /// curl's `speed_download`, bytes per second.
    speed: f64,
    /// curl's own CPU time (the run's), seconds.
    curl_cpu: f64,
    /// sandboxd's CPU time over the run, seconds.
    sandboxd_cpu: f64,
    /// test-internet's CPU time over the run, seconds.
    server_cpu: f64,
    /// The run's wall time, seconds.
    wall: f64,
}

/// sandboxd and the test internet of a run; dropping it kills sandboxd, removes its
/// containers (the [`Sandboxd`]'s own drop), its networks and firewall chains
/// (`sandboxd remove-network`), its folder, and the test internet.
struct Harness {
    sandboxd: Sandboxd,
    internet: Internet,
    dir: Option<tempfile::TempDir>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.sandboxd.process.kill9();
        self.sandboxd.remove_containers();
        if !self.sandboxd.list_networks().unwrap_or_default().is_empty() {
            match self.sandboxd.remove_network() {
                Ok(out) if out.status.success() => {}
                Ok(out) => eprintln!(
                    "egress-bench: sandboxd remove-network failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                Err(e) => eprintln!("egress-bench: sandboxd remove-network: {e}"),
            }
        }
        if let Some(dir) = self.dir.take()
            && let Err(e) = dir.close()
        {
            eprintln!("egress-bench: removing the bench's folder: {e}");
        }
        // Then the fields' own drops: the internet's removes its namespace, veth and routes.
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.requests == 0 || args.rounds == 0 || args.downloads == 0 {
        bail!("--requests, --rounds and --downloads must be at least 1");
    }
    let Some(image) = args.image.clone() else {
        bail!(
            "SANDBOXD_TOOLS_IMAGE is not set: make up builds the tools image, eval \"$(make -s env)\" names it"
        );
    };
    std::env::var("DOCKER_HOST").context("DOCKER_HOST is not set: eval \"$(make -s env)\"")?;
    // The API client's reqwest finds the crypto provider sandboxd's clients use.
    sandboxd::tls::install_provider();
    let deadline = Duration::from_secs(args.deadline);
    match tokio::time::timeout(deadline, run(&args, &image)).await {
        Ok(result) => result,
        Err(_) => bail!("the bench did not finish within --deadline {deadline:?}"),
    }
}

/// Starts the harness, measures and prints; the harness is dropped (cleaned up) at its end,
/// whatever happened.
async fn run(args: &Args, image: &str) -> Result<()> {
    let harness = start(args, image)?;
    let sandboxd_bin = harness.sandboxd.binary.display().to_string();
    println!(
        "egress-bench: sandboxd {sandboxd_bin}, image {image}, SANDBOXD_CPUS {}, {} GETs per target and scheme in {} rounds, {} downloads of {} bytes; {} cores, load average {}",
        args.cpus
            .map_or("2 (default)".to_owned(), |c| c.to_string()),
        args.requests,
        args.rounds,
        args.downloads,
        args.bytes,
        std::thread::available_parallelism().map_or(0, usize::from),
        load_average()
    );
    let measured = measure(args, &harness).await;
    println!("load average at the end: {}", load_average());
    drop(harness);
    measured
}

/// The test internet (allowed.test) and a sandboxd with the two runtimes, resolving through it.
fn start(args: &Args, image: &str) -> Result<Harness> {
    let internet = Internet::start(Spec::new().host(HOST, Range::TestNet2)).context(
        "the test internet did not start (it needs root, iproute2 and test-internet beside this binary: cargo build --release -p sandboxd-testkit --bin test-internet)",
    )?;
    let binary: PathBuf =
        bin("sandboxd").context("cargo build --release -p sandboxd --bin sandboxd")?;
    let dir = tempfile::Builder::new()
        .prefix("sandboxd-egress-bench-")
        .tempdir()?;
    let mut sandboxd = Sandboxd::new(binary, dir.path(), "egbench", image);
    sandboxd.runtimes = CATALOG.replace("{image}", image);
    let resolver = internet.dns().to_string();
    let upstream = internet.ca_file().display().to_string();
    sandboxd.with_env(&[
        ("SANDBOXD_EGRESS_RESOLVER", &resolver),
        ("SANDBOXD_EGRESS_UPSTREAM_CA", &upstream),
    ]);
    if let Some(cpus) = args.cpus {
        sandboxd.with_env(&[("SANDBOXD_CPUS", &cpus.to_string())]);
    }
    let mut harness = Harness {
        sandboxd,
        internet,
        dir: Some(dir),
    };
    harness
        .sandboxd
        .launch()
        .context("sandboxd did not start")?;
    Ok(harness)
}

async fn measure(args: &Args, h: &Harness) -> Result<()> {
    let admin = Client::new(&h.sandboxd.base, &h.sandboxd.token);
    let addr = h
        .internet
        .addr(HOST)
        .context("the test internet has no allowed.test")?;
    let mut targets = Vec::new();
    for (name, handed) in [
        ("direct", addr.to_string()),
        ("proxied", "-".to_owned()),
        ("intercepted", "-".to_owned()),
    ] {
        let opened = admin
            .open(name, "bench", Some(name), None)
            .await
            .with_context(|| format!("opening a session of runtime {name}"))?;
        let token = opened
            .token
            .with_context(|| format!("the open of {name} answered no token"))?;
        let client = Client::new(&h.sandboxd.base, &token);
        client
            .write(name, "ttfb.py", TTFB_PY.as_bytes().to_vec())
            .await
            .context("the script into the workspace")?;
        let intercepted = name == "intercepted";
        // The intercepted sandbox verifies the proxy's leaf: the node's egress CA.
        let ca = if intercepted {
            let set = sandboxd_api::egress::CredentialSet {
                version: "bench".to_owned(),
                credentials: vec![sandboxd_api::egress::CredentialValue {
                    host: HOST.to_owned(),
                    ports: vec![],
                    header: "X-Bench-Credential".to_owned(),
                    source: "egress-bench".to_owned(),
                    value: Some("bench".to_owned()),
                    missing: None,
                }],
            };
            admin
                .put_credentials(name, &set)
                .await
                .context("the credential of the intercepted sandbox")?;
            std::fs::read(h.sandboxd.state_dir.join("egress-ca").join("ca.crt"))
                .context("the node's egress CA")?
        } else {
            h.internet.ca_pem().as_bytes().to_vec()
        };
        client
            .write(name, "ca.pem", ca)
            .await
            .context("the CA into the workspace")?;
        let resolve = if handed == "-" {
            String::new()
        } else {
            format!("--resolve {HOST}:80:{handed} --resolve {HOST}:443:{handed}")
        };
        targets.push(Target {
            name,
            client,
            addr: handed,
            resolve,
            https_only: intercepted,
        });
    }

    let schemes: &[(&str, u16)] = if args.no_https {
        &[("http", 80)]
    } else {
        &[("http", 80), ("https", 443)]
    };
    // [scheme][target]
    let mut ttfb: Vec<Vec<Samples>> = schemes
        .iter()
        .map(|_| targets.iter().map(|_| Samples::default()).collect())
        .collect();
    for round in 0..args.rounds {
        let count = args.requests / args.rounds + usize::from(round < args.requests % args.rounds);
        for (s, (scheme, port)) in schemes.iter().enumerate() {
            // Each round starts with the other target, so neither is always first.
            for k in 0..targets.len() {
                let t = (k + round) % targets.len();
                let target = &targets[t];
                if target.https_only && *scheme != "https" {
                    continue;
                }
                let command = format!(
                    "python3 /workspace/ttfb.py {HOST} {} {port} {scheme} {count} {}",
                    target.addr, args.warmup
                );
                let got: Ttfb = run_json(target, &command, 300).await?;
                if target.addr != "-" && got.addr != target.addr {
                    bail!(
                        "{}: the script used {} not {}",
                        target.name,
                        got.addr,
                        target.addr
                    );
                }
                if got.addr != addr.to_string() {
                    bail!(
                        "{}: {HOST} is {} in the sandbox, {addr} in the test internet",
                        target.name,
                        got.addr
                    );
                }
                let samples = &mut ttfb[s][t];
                samples.how = got.how;
                samples
                    .all
                    .extend(got.us.iter().map(|us| Duration::from_micros(*us)));
            }
        }
    }

    let mut downloads: Vec<Vec<Download>> = targets.iter().map(|_| Vec::new()).collect();
    let server_pid = h.internet.pid();
    let sandboxd_pid = h.sandboxd.process.pid();
    for round in 0..args.downloads {
        for k in 0..targets.len() {
            let t = (k + round) % targets.len();
            let target = &targets[t];
            if target.https_only {
                continue;
            }
            let command = format!(
                "curl -sS --fail --max-time 120 {} -o /dev/null -w '%{{speed_download}} %{{size_download}}' http://{HOST}/bytes/{}",
                target.resolve, args.bytes
            );
            let (before_sandboxd, before_server) = (cpu(sandboxd_pid), cpu(server_pid));
            let out = target
                .client
                .run(target.name, &command, Some(180), None, None)
                .await
                .with_context(|| format!("{}: {command}", target.name))?;
            let (after_sandboxd, after_server) = (cpu(sandboxd_pid), cpu(server_pid));
            if out.exit_code != 0 {
                bail!(
                    "{}: {command}: exit {}: {}{}",
                    target.name,
                    out.exit_code,
                    out.stdout,
                    out.stderr
                );
            }
            let mut fields = out.stdout.split_whitespace();
            let speed: f64 = fields
                .next()
                .and_then(|f| f.parse().ok())
                .with_context(|| format!("{}: curl printed {:?}", target.name, out.stdout))?;
            let size: u64 = fields
                .next()
                .and_then(|f| f.parse().ok())
                .with_context(|| format!("{}: curl printed {:?}", target.name, out.stdout))?;
            if size != args.bytes {
                bail!("{}: curl got {size} bytes of {}", target.name, args.bytes);
            }
            downloads[t].push(Download {
                speed,
                curl_cpu: out.cpu_ns.unwrap_or_default() as f64 / 1e9,
                sandboxd_cpu: after_sandboxd - before_sandboxd,
                server_cpu: after_server - before_server,
                wall: out.duration_ms as f64 / 1000.0,
            });
        }
    }

    print_figures(args, &targets, schemes, &mut ttfb, &downloads);
    Ok(())
}

/// Runs `command` in `target`'s sandbox and parses its stdout as JSON.
async fn run_json<T: for<'de> Deserialize<'de>>(
    target: &Target,
    command: &str,
    timeout: u64,
) -> Result<T> {
    let out = target
        .client
        .run(target.name, command, Some(timeout), None, None)
        .await
        .with_context(|| format!("{}: {command}", target.name))?;
    if out.exit_code != 0 {
        bail!(
            "{}: {command}: exit {}: {}{}",
            target.name,
            out.exit_code,
            out.stdout,
            out.stderr
        );
    }
    serde_json::from_str(out.stdout.trim())
        .with_context(|| format!("{}: {command} printed {:?}", target.name, out.stdout))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn print_figures(
    args: &Args,
    targets: &[Target],
    schemes: &[(&str, u16)],
    ttfb: &mut [Vec<Samples>],
    downloads: &[Vec<Download>],
) {
    println!();
    println!(
        "Time to first byte, a new connection per GET (connect, request, status line and headers):"
    );
    println!();
    println!("| scheme | target | name found | GETs | p50 ms | p90 ms | p99 ms |");
    println!("|---|---|---|---|---|---|---|");
    let mut added = Vec::new();
    for (s, (scheme, _)) in schemes.iter().enumerate() {
        let mut p50s = Vec::new();
        for (t, target) in targets.iter().enumerate() {
            let samples = &mut ttfb[s][t];
            if samples.all.is_empty() {
                continue;
            }
            samples.all.sort();
            let [p50, p90, p99] = [0.5, 0.9, 0.99].map(|p| ms(quantile(&samples.all, p)));
            p50s.push(p50);
            println!(
                "| {scheme} | {} | {} | {} | {p50:.3} | {p90:.3} | {p99:.3} |",
                target.name,
                samples.how,
                samples.all.len()
            );
        }
        if let [direct, proxied, ..] = p50s[..] {
            added.push((*scheme, direct, proxied, p50s.get(2).copied()));
        }
    }
    println!();
    println!(
        "Throughput through one connection, curl of {} bytes over HTTP, best of {} (CPU seconds of that download):",
        args.bytes, args.downloads
    );
    println!();
    println!(
        "| target | best GB/s | all GB/s | curl CPU s | sandboxd CPU s | server CPU s | wall s |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut best = Vec::new();
    for (t, target) in targets.iter().enumerate() {
        if downloads[t].is_empty() {
            continue;
        }
        let all: Vec<String> = downloads[t]
            .iter()
            .map(|d| format!("{:.2}", d.speed / 1e9))
            .collect();
        let b = downloads[t]
            .iter()
            .copied()
            .fold(
                Download::default(),
                |a, d| if d.speed > a.speed { d } else { a },
            );
        best.push(b.speed);
        println!(
            "| {} | {:.2} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            target.name,
            b.speed / 1e9,
            all.join(", "),
            b.curl_cpu,
            b.sandboxd_cpu,
            b.server_cpu,
            b.wall
        );
    }
    println!();
    println!("| target (#29) | result |");
    println!("|---|---|");
    for (scheme, direct, proxied, intercepted) in &added {
        let plus = proxied - direct;
        let verdict = if plus <= 1.0 { "met" } else { "NOT met" };
        println!(
            "| added p50 time to first byte at most 1 ms ({scheme}) | {verdict}: {plus:+.3} ms ({proxied:.3} ms proxied, {direct:.3} ms direct, {:.2}x) |",
            proxied / direct
        );
        if let Some(intercepted) = intercepted {
            println!(
                "| p50 time to first byte with a credential added, TLS intercepted ({scheme}, #30) | {intercepted:.3} ms, {:+.3} ms and {:.2}x the pass-through {proxied:.3} ms |",
                intercepted - proxied,
                intercepted / proxied
            );
        }
    }
    if let [direct, proxied, ..] = best[..] {
        let verdict = if proxied >= 1e9 { "met" } else { "NOT met" };
        println!(
            "| at least 1 GB/s through one connection | {verdict}: {:.2} GB/s proxied, {:.2} GB/s direct ({:.2}x direct) |",
            proxied / 1e9,
            direct / 1e9,
            proxied / direct
        );
    }
}

/// The CPU time (user and system, seconds) process `pid` and the children it waited for have
/// spent so far, from /proc (0 when unknown).
fn cpu(pid: Option<u32>) -> f64 {
    let Some(pid) = pid else { return 0.0 };
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The fields after the command's closing parenthesis: the 3rd of the line is the first.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime, stime (14, 15) and cutime, cstime (16, 17), in USER_HZ (100 a second on Linux).
    [11, 12, 13, 14]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
        .sum::<f64>()
        / 100.0
}

/// The machine's load averages (1, 5 and 15 minutes), as the figures depend on them.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}
