//! Benchmarks one open as a platform waits on it, as percentiles (p50/p90/p99) at each
//! `--concurrency` (1 and 10 by default), against baselines measured beside it in the same run:
//!
//! - **docker create+start**: a plain container create and start of the image on the project's
//!   dockerd (bollard against `DOCKER_HOST`; not hardened, nothing mounted), what every cold
//!   open pays at the least;
//! - **sandboxd open**: sandboxd's own open (`POST /v1/sessions` with the admin token, no
//!   operator), and open → the output of `echo hi` run with the session token it answered;
//! - **API floor**: a plain client creates a SandboxSession and a watcher sees a status write
//!   the client made itself (phase Running), no operator: the create and the status apply alone,
//!   and with the two writes the operator makes between them (the claim of finalizer and host,
//!   the token Secret);
//! - **operator**: SandboxSession create → phase Running, seen by a watch (not polled), and
//!   create → the first command's output (`echo hi` through the session's sandboxd with the
//!   token from the session's Secret, through the `sandboxd-api` client). The client keeps a
//!   watch of its token Secrets, as a platform's would: the operator writes the Secret before
//!   the status that says Running, so the token is mostly at hand when Running is seen; when
//!   the watch has not brought it yet it is read, and the run says how often that happened.
//!   After each first output the Secret is read once more, its own row: what a client that
//!   reads the token at Running instead (the SDK, whose Role may only `get` Secrets) adds.
//!
//! Each of sandboxd's and the operator's rows is measured cold (the runtime keeps no warm pool)
//! and warm: before a warm row the runtime's pool is set to the row's opens plus one (through
//! `PUT /v1/runtimes` for sandboxd's rows, `spec.warmPool.size` on the Runtime for the
//! operator's) and the bench waits until the host reports it full, so every open of the row can
//! take a pooled container; the launch column says how many did (`warm 30/30`). The pool is set
//! back to 0 after the row. A paced row (one open at a time) waits before each open until the
//! pool is full again: opens that come slower than the pool refills, where the warm rows' opens
//! come back to back and share the cores with the refill of the one before. Each row begins with one untimed open (connections, caches). With `--driver noop` (sandboxd's
//! engine of records, nothing runs) the docker and first-output rows are left out.
//!
//! The host is sandboxd itself, started in this process (`sandboxd::server::start_on`) and
//! registered as a SandboxHost whose admin token is in a Secret, with a default Runtime; the
//! operator is the release binary beside this one, started as a child on this run's labelled
//! objects. Between rows the sessions are deleted (through the operator for its rows), so the
//! container count on dockerd does not grow from row to row. At the end the bench destroys
//! whatever is left through sandboxd, fails if a container of its sandboxd is left, and
//! deletes its namespaces, SandboxHost and Runtime. It cleans up also when a step fails.
//!
//! Needs `make up`, `eval "$(make -s env)"`, the CRDs
//! (`kubectl apply --server-side -f charts/sandboxd/crds/`) and the release binaries:
//! `cargo build --release -p sandboxd-operator -p sandboxd-tests --bins`, then
//! `target/release/open-bench --runs 40`.
//!
//! Over 600 lines: every row of one benchmark, each beside the baseline it is read against.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use bollard::Docker;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::{self, ObjectRef, reflector};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, ResourceExt};
use sandboxd_crds::v1alpha1::{Runtime, SandboxSession};
use sandboxd_tests::bench::{
    Driver, Host, Objects, Operator, claim_and_secret, create_namespace, drop_finalizers,
    percentiles, running, session, setup, wait_until,
};
use sandboxd_tests::poll::poll;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

#[derive(Parser)]
struct Args {
    /// Opens per row (at least the row's concurrency).
    #[arg(long, default_value_t = 40)]
    runs: usize,
    /// Opens in flight at once: one row per value.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 10])]
    concurrency: Vec<usize>,
    /// The containers of the sessions; with `noop` the docker row is left out.
    #[arg(long, value_enum, default_value_t = Driver::Docker)]
    driver: Driver,
    /// The image the sessions run (the docker driver needs it on the project's dockerd).
    #[arg(long, env = "SANDBOXD_BASE_IMAGE")]
    image: Option<String>,
    /// Rows to leave out: any of docker, sandboxd, floor, operator, cold, warm, paced.
    #[arg(long, value_delimiter = ',')]
    skip: Vec<String>,
}

impl Args {
    fn runs(&self, concurrency: usize) -> usize {
        self.runs.max(concurrency)
    }

    fn wants(&self, row: &str) -> bool {
        !self.skip.iter().any(|s| s == row)
    }
}

/// One line of the table.
struct Row {
    path: &'static str,
    launch: String,
    concurrency: usize,
    samples: Vec<Duration>,
}

/// How a row's opens started its sandboxes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Launch {
    Cold,
    Warm,
    /// Warm, one open at a time, each once the pool is full again: opens that come slower than
    /// the pool refills, so no refill shares the cores with the open.
    Paced,
}

impl Launch {
    fn name(self) -> &'static str {
        match self {
            Launch::Cold => "cold",
            Launch::Warm => "warm",
            Launch::Paced => "paced",
        }
    }

    fn is_warm(self) -> bool {
        self != Launch::Cold
    }

    /// Whether a row of `concurrency` is measured with this launch (paced ones: one at a time).
    fn fits(self, concurrency: usize) -> bool {
        self != Launch::Paced || concurrency == 1
    }

    /// The launch column: a warm row says how many of its opens took a pooled container.
    fn column(self, warm: usize, opens: usize) -> String {
        match self {
            Launch::Cold => "cold".to_owned(),
            Launch::Warm => format!("warm {warm}/{opens}"),
            Launch::Paced => format!("warm {warm}/{opens}, paced"),
        }
    }
}

/// The names of this run's objects.
struct Names {
    /// The operator's namespace, host and Runtime.
    objects: Objects,
    /// The namespace of the API floor's sessions (no operator sees them).
    floor_ns: String,
}

/// What the command prints, and what the bench checks it printed.
const COMMAND: &str = "echo hi";

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.runs == 0 || args.concurrency.contains(&0) {
        bail!("--runs and every --concurrency must be at least 1");
    }
    let (client, bin, image) = setup(args.driver, args.image.as_deref()).await?;
    let scope = format!("o{}", std::process::id());
    let names = Names {
        floor_ns: format!("sbx-openfloor-{scope}"),
        objects: Objects {
            ns: format!("sbx-openbench-{scope}"),
            host: format!("host-{scope}"),
            runtime: format!("bench-{scope}"),
            scope,
        },
    };
    // Room for every row's sessions at once, should a row's deletes lag.
    let cap = args
        .concurrency
        .iter()
        .map(|c| args.runs(*c))
        .sum::<usize>()
        * 4;
    let host = Host::start(
        args.driver,
        cap,
        &format!("openbench-{}", names.objects.scope),
        &names.objects.runtime,
        &image,
    )
    .await?;
    println!(
        "open-bench: driver {}, image {image}, {} opens per row (at least the concurrency); load average {}",
        args.driver.name(),
        args.runs,
        load_average()
    );
    let mut rows = Vec::new();
    let measured = measure(&args, &client, &bin, &names, &host, &image, &mut rows).await;
    print_table(&rows);
    println!("load average at the end: {}", load_average());
    let cleaned = cleanup(&client, &names, host).await;
    if let (Err(_), Err(e)) = (&measured, &cleaned) {
        eprintln!("cleanup failed too: {e:#}");
    }
    measured.and(cleaned)
}

/// The machine's load averages (1, 5 and 15 minutes), as the figures depend on them.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

fn print_table(rows: &[Row]) {
    println!();
    println!("| path | launch | concurrent | opens | p50 | p90 | p99 |");
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        let mut samples = r.samples.clone();
        let [p50, p90, p99] = percentiles(&mut samples);
        println!(
            "| {} | {} | {} | {} | {p50} | {p90} | {p99} |",
            r.path,
            r.launch,
            r.concurrency,
            r.samples.len()
        );
    }
}

/// Runs `n` timed operations, `concurrency` at a time, after one untimed (index `n`) that
/// warms connections and caches; each returns what it measured.
async fn sample<F, Fut, T>(n: usize, concurrency: usize, op: F) -> Result<Vec<T>>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    op(n).await.context("the untimed first open of the row")?;
    futures::stream::iter(0..n)
        .map(op)
        .buffer_unordered(concurrency)
        .try_collect()
        .await
}

async fn measure(
    args: &Args,
    client: &Client,
    bin: &Path,
    names: &Names,
    host: &Host,
    image: &str,
    rows: &mut Vec<Row>,
) -> Result<()> {
    if args.driver == Driver::Docker && args.wants("docker") {
        let docker = Docker::connect_with_defaults()?.negotiate_version().await?;
        for &c in &args.concurrency {
            let samples =
                docker_create_start(&docker, &names.objects.scope, image, args.runs(c), c).await?;
            rows.push(Row {
                path: "docker create+start",
                launch: "cold".to_owned(),
                concurrency: c,
                samples,
            });
        }
    }
    // The no-op engine runs nothing: no first output to time.
    let runs_commands = args.driver == Driver::Docker;
    if args.wants("sandboxd") {
        for launch in launches(args) {
            for &c in args.concurrency.iter().filter(|c| launch.fits(**c)) {
                sandboxd_row(args, host, names, image, launch, c, rows).await?;
            }
        }
    }
    if args.wants("floor") {
        api_floor(args, client, names, rows).await?;
    }
    if args.wants("operator") {
        let opened = Opened {
            host,
            image,
            runs_commands,
        };
        through_operator(args, client, bin, names, &opened, rows).await?;
    }
    Ok(())
}

/// The launches the rows are measured with.
fn launches(args: &Args) -> Vec<Launch> {
    [Launch::Cold, Launch::Warm, Launch::Paced]
        .into_iter()
        .filter(|l| args.wants(l.name()))
        .collect()
}

/// sandboxd's own open at `concurrency`, `launch`: open and open → first output.
async fn sandboxd_row(
    args: &Args,
    host: &Host,
    names: &Names,
    image: &str,
    launch: Launch,
    c: usize,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let admin = host.admin();
    let runs_commands = args.driver == Driver::Docker;
    let n = args.runs(c);
    if launch.is_warm() {
        set_host_pool(host, &names.objects.runtime, image, n + 1).await?;
    }
    let timed = sample(n, c, |i| {
        let admin = admin.clone();
        let runtime = names.objects.runtime.clone();
        async move {
            if launch == Launch::Paced {
                pool_filled(host, &runtime, n + 1).await?;
            }
            let started = Instant::now();
            let id = format!("direct-{}-{c}-{i}", launch.name());
            let opened = admin
                .open(&id, &format!("org-{}", i % 50), Some(&runtime), None)
                .await
                .with_context(|| format!("opening {id} on sandboxd"))?;
            let open = started.elapsed();
            if runs_commands {
                let token = opened.token.context("the open answered without a token")?;
                let session =
                    sandboxd_api::client::Client::with_trust(&host.endpoint, &token, &TRUST);
                first_output(&session, &opened.session.id).await?;
            }
            let warm = opened.session.launch == sandboxd_api::session::Launch::Warm;
            anyhow::Ok((open, started.elapsed(), warm))
        }
    })
    .await;
    host.destroy_sessions(c).await?;
    if launch.is_warm() {
        set_host_pool(host, &names.objects.runtime, image, 0).await?;
    }
    let timed = timed?;
    let warm = timed.iter().filter(|t| t.2).count();
    let (open, output): (Vec<_>, Vec<_>) = timed.into_iter().map(|t| (t.0, t.1)).unzip();
    let with_output = runs_commands.then_some(("sandboxd open → first output", output));
    push_rows(rows, launch, warm, c, ("sandboxd open", open), with_output);
    Ok(())
}

/// A row of opens (`open`) and, when the sessions ran a command, its row of first outputs; the
/// launch column says how many of them were `warm`.
fn push_rows(
    rows: &mut Vec<Row>,
    launch: Launch,
    warm: usize,
    c: usize,
    open: (&'static str, Vec<Duration>),
    output: Option<(&'static str, Vec<Duration>)>,
) {
    for (path, samples) in std::iter::once(open).chain(output) {
        rows.push(Row {
            path,
            launch: launch.column(warm, samples.len()),
            concurrency: c,
            samples,
        });
    }
}

/// Sets runtime `alias`'s warm pool on the host to `size` through `PUT /v1/runtimes` and waits
/// until the host reports that many ready.
async fn set_host_pool(host: &Host, alias: &str, image: &str, size: usize) -> Result<()> {
    let entry: sandboxd_catalog::CatalogEntry =
        serde_json::from_value(json!({"alias": alias, "image": image, "warm_pool": size}))?;
    host.admin()
        .put_runtimes(&[entry])
        .await
        .context("setting the warm pool")?;
    pool_filled(host, alias, size).await
}

/// Waits until the host reports `size` pooled containers of `alias` ready.
async fn pool_filled(host: &Host, alias: &str, size: usize) -> Result<()> {
    let mut ready = 0;
    poll(
        Duration::from_secs(600),
        Duration::from_millis(100),
        async || match host.admin().runtimes().await {
            Ok(list) => {
                ready = list
                    .runtimes
                    .iter()
                    .find(|r| r.alias == alias)
                    .map_or(0, |r| r.warm_pool.ready as usize);
                (ready == size).then_some(Ok(()))
            }
            Err(e) => Some(Err(e)),
        },
    )
    .await
    .map_err(|_| anyhow!("the warm pool of {alias} holds {ready}, not {size}, after 600 s"))??;
    Ok(())
}

/// Plain create+start of `image`, `n` times, `concurrency` at a time; the containers are
/// removed after the row, untimed.
async fn docker_create_start(
    docker: &Docker,
    scope: &str,
    image: &str,
    n: usize,
    concurrency: usize,
) -> Result<Vec<Duration>> {
    let made: Arc<Mutex<Vec<String>>> = Arc::default();
    let timed = sample(n, concurrency, |i| {
        let made = made.clone();
        async move {
            let name = format!("openbench-{scope}-raw-{concurrency}-{i}");
            let body = ContainerCreateBody {
                image: Some(image.to_owned()),
                cmd: Some(vec!["/bin/sh".into(), "-c".into(), "sleep 86400".into()]),
                labels: Some(HashMap::from([("sandboxd.dev/bench".into(), scope.into())])),
                ..Default::default()
            };
            let started = Instant::now();
            let created = docker
                .create_container(
                    Some(CreateContainerOptionsBuilder::new().name(&name).build()),
                    body,
                )
                .await
                .with_context(|| format!("creating container {name}"))?;
            made.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(created.id.clone());
            docker
                .start_container(&created.id, None)
                .await
                .with_context(|| format!("starting container {name}"))?;
            anyhow::Ok(started.elapsed())
        }
    })
    .await;
    let ids = std::mem::take(&mut *made.lock().unwrap_or_else(|p| p.into_inner()));
    let removed: Vec<Result<(), bollard::errors::Error>> = futures::stream::iter(ids)
        .map(|id| async move {
            docker
                .remove_container(
                    &id,
                    Some(RemoveContainerOptionsBuilder::new().force(true).build()),
                )
                .await
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let samples = timed?;
    for r in removed {
        r.context("removing a bench container")?;
    }
    Ok(samples)
}

/// Runs [`COMMAND`] in session `id` and checks its output.
async fn first_output(session: &sandboxd_api::client::Client, id: &str) -> Result<()> {
    let out = session
        .run(id, COMMAND, Some(30), None, None)
        .await
        .with_context(|| format!("running `{COMMAND}` in {id}"))?;
    if out.stdout != "hi\n" || out.exit_code != 0 {
        bail!(
            "`{COMMAND}` in {id} exited {} with stdout {:?} and stderr {:?}",
            out.exit_code,
            out.stdout,
            out.stderr
        );
    }
    Ok(())
}

/// The trust (and the HTTP client with its connections) every session's client shares, as a
/// platform's does: built once, not per session (a build reads the system's CA roots).
static TRUST: std::sync::LazyLock<sandboxd_api::client::Trust> =
    std::sync::LazyLock::new(sandboxd_api::client::Trust::system);

/// Who waits for which session to be Running: the watch sends the instant it saw it.
type Waiters = Arc<Mutex<HashMap<String, oneshot::Sender<Instant>>>>;

/// Watches the sessions of `api` and tells each waiter when its session is first seen Running;
/// returns once the watch has listed what is there.
async fn watch_running(api: Api<SandboxSession>) -> Result<(Waiters, JoinHandle<()>)> {
    let waiters: Waiters = Arc::default();
    let (ready, listed) = oneshot::channel();
    let told = waiters.clone();
    let task = tokio::spawn(async move {
        let mut ready = Some(ready);
        let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(Event::InitDone) => {
                    if let Some(r) = ready.take() {
                        let _ = r.send(());
                    }
                }
                Ok(Event::Apply(s) | Event::InitApply(s)) if running(&s) => {
                    let waiter = told
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&s.name_any());
                    if let Some(w) = waiter {
                        let _ = w.send(Instant::now());
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    eprintln!("the watch of the sessions failed ({e}); watching again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(30), listed)
        .await
        .context("the watch of the sessions did not list within 30 s")??;
    Ok((waiters, task))
}

/// Registers a wait for session `name` to be Running.
fn wait_for(waiters: &Waiters, name: &str) -> oneshot::Receiver<Instant> {
    let (tx, rx) = oneshot::channel();
    waiters
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(name.to_owned(), tx);
    rx
}

async fn until_running(rx: oneshot::Receiver<Instant>, name: &str) -> Result<Instant> {
    tokio::time::timeout(Duration::from_secs(120), rx)
        .await
        .with_context(|| format!("session {name} was not seen Running within 120 s"))?
        .context("the watch of the sessions ended")
}

/// The status the floor's client writes, as the operator writes a Running session's.
fn running_status(name: &str) -> Result<serde_json::Value> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let at = k8s_openapi::jiff::Timestamp::from_second(now.as_second())?.to_string();
    let cond = |t: &str, r: &str| json!({"type": t, "status": "True", "reason": r, "message": format!("{t} on host floor"), "lastTransitionTime": at, "observedGeneration": 1});
    Ok(
        json!({"apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession", "status": {
        "phase": "Running", "message": "running on host floor", "host": "floor", "endpoint": "http://127.0.0.1:1",
        "sessionId": name, "runtime": "bench", "credentialsSecret": format!("{name}-token"),
        "lastActivityAt": at, "sleepsAt": at, "observedGeneration": 1,
        "conditions": [cond("Placed", "Placed"), cond("Admitted", "Opened"), cond("RuntimeReady", "Ready"), cond("Ready", "Running")]}}),
    )
}

/// The API server's floor for one open, no operator: a plain client creates a SandboxSession
/// and writes its status (server-side apply), and a watch sees it Running; then the same with
/// the claim (finalizer and host, one JSON patch) and the token Secret between the two, the
/// writes the operator makes before the status. The sessions carry no bench label, so the
/// operator never sees them.
async fn api_floor(args: &Args, client: &Client, names: &Names, rows: &mut Vec<Row>) -> Result<()> {
    let ns = &names.floor_ns;
    create_namespace(client, ns).await?;
    let sessions = Api::<SandboxSession>::namespaced(client.clone(), ns);
    let secrets = Api::<Secret>::namespaced(client.clone(), ns);
    let (waiters, watch) = watch_running(sessions.clone()).await?;
    let result = async {
        for (path, full) in [
            ("API floor: create, status", false),
            ("API floor: create, claim, Secret, status", true),
        ] {
            for &c in &args.concurrency {
                let timed = sample(args.runs(c), c, |i| {
                    let (sessions, secrets, waiters) =
                        (sessions.clone(), secrets.clone(), waiters.clone());
                    async move {
                        let name = format!("floor-{}-{c}-{i}", u8::from(full));
                        let s = session(&name, i, json!({}))?;
                        let seen = wait_for(&waiters, &name);
                        let started = Instant::now();
                        let s = sessions.create(&PostParams::default(), &s).await?;
                        if full {
                            claim_and_secret(&sessions, &secrets, &s).await?;
                        }
                        sessions
                            .patch_status(
                                &name,
                                &PatchParams::apply("open-bench/floor").force(),
                                &Patch::Apply(&running_status(&name)?),
                            )
                            .await?;
                        let at = until_running(seen, &name).await?;
                        anyhow::Ok(at.duration_since(started))
                    }
                })
                .await?;
                rows.push(Row {
                    path,
                    launch: "—".to_owned(),
                    concurrency: c,
                    samples: timed,
                });
                drop_finalizers(&sessions).await?;
                sessions
                    .delete_collection(&DeleteParams::default(), &ListParams::default())
                    .await?;
            }
        }
        anyhow::Ok(())
    }
    .await;
    watch.abort();
    result
}

/// Watches the token Secrets of this run (they carry their session's labels) into a store, as
/// a platform's client keeps its sessions' tokens at hand; returns once the watch has listed.
async fn watch_tokens(
    api: Api<Secret>,
    scope: &str,
) -> Result<(reflector::Store<Secret>, JoinHandle<()>)> {
    let (store, writer) = reflector::store();
    let config = watcher::Config::default().labels(&format!("bench={scope}"));
    let task = tokio::spawn(
        reflector(writer, watcher(api, config).default_backoff())
            .for_each(|_| futures::future::ready(())),
    );
    tokio::time::timeout(Duration::from_secs(30), store.wait_until_ready())
        .await
        .context("the watch of the token Secrets did not list within 30 s")?
        .context("the watch of the token Secrets ended")?;
    Ok((store, task))
}

/// The host the operator opens on, and what its sessions run.
struct Opened<'a> {
    host: &'a Host,
    image: &'a str,
    /// Whether the sessions run commands (not on the no-op engine).
    runs_commands: bool,
}

/// Opens through the operator: create → Running (seen by the watch) and create → the output
/// of the first command, run with the token from the session's Secret.
async fn through_operator(
    args: &Args,
    client: &Client,
    bin: &Path,
    names: &Names,
    opened: &Opened<'_>,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let Opened {
        host,
        image,
        runs_commands,
    } = *opened;
    let objects = &names.objects;
    let Objects {
        scope, ns, runtime, ..
    } = objects;
    let labels = objects.labels();
    objects.create(client, host, image).await?;
    let _operator = Operator::start(bin, ns, scope)?;
    // The clock starts once the operator leads and has found the host ready.
    objects.host_ready(client).await?;
    let sessions = Api::<SandboxSession>::namespaced(client.clone(), ns);
    let secrets = Api::<Secret>::namespaced(client.clone(), ns);
    let (waiters, watch) = watch_running(sessions.clone()).await?;
    let (tokens, token_watch) = watch_tokens(secrets.clone(), scope).await?;
    let fetched = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let runtimes = Api::<Runtime>::all(client.clone());
    let result = async {
        for (launch, &c) in launches(args)
            .into_iter()
            .flat_map(|l| args.concurrency.iter().map(move |c| (l, c)))
            .filter(|(l, c)| l.fits(**c))
        {
            if launch.is_warm() {
                set_runtime_pool(&runtimes, host, runtime, args.runs(c) + 1).await?;
            }
            let timed = sample(args.runs(c), c, |i| {
                let (sessions, secrets, waiters, labels, tokens, fetched) = (
                    sessions.clone(),
                    secrets.clone(),
                    waiters.clone(),
                    labels.clone(),
                    tokens.clone(),
                    fetched.clone(),
                );
                async move {
                    if launch == Launch::Paced {
                        pool_filled(host, runtime, args.runs(c) + 1).await?;
                    }
                    let name = format!("op-{}-{c}-{i}", launch.name());
                    let s = session(&name, i, labels)?;
                    let seen = wait_for(&waiters, &name);
                    let started = Instant::now();
                    sessions.create(&PostParams::default(), &s).await?;
                    let at = until_running(seen, &name).await?;
                    if !runs_commands {
                        return anyhow::Ok((
                            at.duration_since(started),
                            started.elapsed(),
                            Duration::ZERO,
                        ));
                    }
                    // The token as a platform's client holds it: from its watch of the
                    // namespace's token Secrets (written before the status said Running), read
                    // only when the watch has not brought it yet.
                    let secret_name = format!("{name}-token");
                    let secret = match tokens.get(&ObjectRef::new(&secret_name).within(ns)) {
                        Some(s) => s,
                        None => {
                            fetched.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            Arc::new(secrets.get(&secret_name).await?)
                        }
                    };
                    let field = |k: &str| {
                        secret
                            .data
                            .as_ref()
                            .and_then(|d| d.get(k))
                            .and_then(|b| String::from_utf8(b.0.clone()).ok())
                            .with_context(|| format!("the token Secret of {name} has no {k}"))
                    };
                    let session = sandboxd_api::client::Client::with_trust(
                        &field("endpoint")?,
                        &field("token")?,
                        &TRUST,
                    );
                    first_output(&session, &field("session")?).await?;
                    let output = started.elapsed();
                    // What a client without the watch adds: one read of the Secret (untimed
                    // for the rows above).
                    let read = Instant::now();
                    secrets.get(&secret_name).await?;
                    anyhow::Ok((at.duration_since(started), output, read.elapsed()))
                }
            })
            .await;
            // How each session's sandbox was started, as its status says.
            let warm = sessions
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|s| {
                    s.status.as_ref().and_then(|st| st.launch)
                        == Some(sandboxd_crds::v1alpha1::session::Launch::Warm)
                })
                .count()
                .min(args.runs(c));
            let deleted = delete_sessions(&sessions).await;
            if launch.is_warm() {
                set_runtime_pool(&runtimes, host, runtime, 0).await?;
            }
            let timed = timed?;
            let running: Vec<_> = timed.iter().map(|t| t.0).collect();
            let output: Vec<_> = timed.iter().map(|t| t.1).collect();
            let reads: Vec<_> = timed.iter().map(|t| t.2).collect();
            deleted?;
            // What a client waits after it saw Running: the run (the token came with its watch).
            let after: Vec<Duration> = running
                .iter()
                .zip(&output)
                .map(|(r, o)| o.saturating_sub(*r))
                .collect();
            let with_output = runs_commands.then_some(("operator: create → first output", output));
            push_rows(
                rows,
                launch,
                warm,
                c,
                ("operator: create → Running", running),
                with_output,
            );
            if runs_commands {
                rows.push(Row {
                    path: "operator: Running → first output",
                    launch: launch.column(warm, after.len()),
                    concurrency: c,
                    samples: after,
                });
                rows.push(Row {
                    path: "token Secret read (a client that does not watch them adds it)",
                    launch: launch.column(warm, reads.len()),
                    concurrency: c,
                    samples: reads,
                });
            }
        }
        anyhow::Ok(())
    }
    .await;
    watch.abort();
    token_watch.abort();
    if runs_commands {
        println!(
            "operator rows: {} of the tokens were read from the API server at Running (the rest came with the watch of the token Secrets)",
            fetched.load(std::sync::atomic::Ordering::Relaxed)
        );
    }
    result
}

/// Sets the Runtime's `spec.warmPool.size` to `size`, as `kubectl scale` would, and waits until
/// the host reports that many ready (the operator carries the size to it).
async fn set_runtime_pool(
    runtimes: &Api<Runtime>,
    host: &Host,
    runtime: &str,
    size: usize,
) -> Result<()> {
    runtimes
        .patch(
            runtime,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"warmPool": {"size": size}}})),
        )
        .await
        .context("setting the Runtime's warm pool")?;
    pool_filled(host, runtime, size).await
}

/// Deletes the sessions of `api` as a platform does and waits until the operator has let them
/// go (their sandboxes destroyed through Tombstones).
async fn delete_sessions(api: &Api<SandboxSession>) -> Result<()> {
    api.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    wait_until(
        Duration::from_secs(300),
        Duration::from_millis(250),
        "the sessions were not deleted within 300 s",
        async || {
            let left = api.list(&ListParams::default()).await?.items;
            Ok(left.is_empty().then_some(()))
        },
    )
    .await
}

/// Destroys the sessions through sandboxd and deletes this run's objects. Runs whatever
/// happened before, so nothing outlives a failed run.
async fn cleanup(client: &Client, names: &Names, host: Host) -> Result<()> {
    let destroyed = host.destroy_all(16).await;
    names.objects.delete(client, &[&names.floor_ns]).await;
    let (sessions, swept) = destroyed?;
    println!(
        "cleanup: {sessions} sessions destroyed through sandboxd, {swept} stray containers swept, none left"
    );
    Ok(())
}
