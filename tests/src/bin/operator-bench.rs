//! Benchmarks the operator against the real API server and a real sandboxd: creates N
//! SandboxSessions and reports sessions opened per second, p50/p95 from create to Running, the
//! operator's peak RSS, the API writes made for sessions that simply run idle, and the time to
//! converge after an operator restart (kill -9).
//!
//! Opens per second are set against a baseline measured first in the same run: the API
//! server's floor, the five writes an open needs at the least (create, claim, token Secret,
//! status apply, Event) made for N sessions by a plain client with the same concurrency and no
//! operator, each open counted, as the operator's are, when the platform's watch of the sessions
//! sees it Running. The ratio is how close the operator comes to what the API server allows
//! here.
//!
//! The host is sandboxd itself, started in this process through `sandboxd::server::start_on`
//! on 127.0.0.1 with a port of its choosing: its HTTP API, admin and session tokens, SQLite
//! state and audit log, workspace folders in a temporary folder, and caps of at least N
//! sessions (per tenant too). It is registered as a SandboxHost whose admin token is in a
//! Secret, as a cluster registers one. `--driver` chooses its containers:
//! - `docker` (the default): the project's dockerd (`DOCKER_HOST`), one real container of the
//!   base image (`SANDBOXD_BASE_IMAGE`) per session;
//! - `noop`: `sandboxd::container::Engine::noop`, containers that are in-memory records only
//!   (nothing runs), so the figures are the operator's, the API server's and sandboxd's.
//!
//! At the end the operator is stopped and the bench destroys every session through sandboxd
//! directly (container and workspace; no Tombstone round trip and its retry backoff), removes
//! whatever container of its sandboxd instance the engine still holds, fails if any is left,
//! and deletes its namespace, SandboxHost and Runtime. It cleans up also when a step fails.
//!
//! Needs `make up`, `eval "$(make -s env)"`, the CRDs
//! (`kubectl apply --server-side -f charts/sandboxd/crds/`) and the release binaries:
//! `cargo build --release -p sandboxd-operator -p sandboxd-tests --bins` (this bench lives in
//! the test crate, which may depend on the daemon; the operator does not)
//! then `target/release/operator-bench --sessions 1000 [--driver noop]`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use sandboxd_crds::v1alpha1::SandboxSession;
use sandboxd_tests::bench::{
    Driver, Host, Objects, Operator, claim_and_secret, create_namespace, drop_finalizers, running,
    session, setup, wait_until,
};
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Sessions to create.
    #[arg(long, default_value_t = 100)]
    sessions: usize,
    /// Creates in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Seconds to watch for writes to idle running sessions.
    #[arg(long, default_value_t = 20)]
    idle_watch: u64,
    /// The containers of the sessions.
    #[arg(long, value_enum, default_value_t = Driver::Docker)]
    driver: Driver,
    /// The image the sessions run (the docker driver needs it on the project's dockerd).
    #[arg(long, env = "SANDBOXD_BASE_IMAGE")]
    image: Option<String>,
    /// Skip the API server's ceiling (the same writes by a plain client, before the operator runs).
    #[arg(long)]
    no_floor: bool,
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.sessions == 0 {
        bail!("--sessions must be at least 1");
    }
    let (client, bin, image) = setup(args.driver, args.image.as_deref()).await?;
    let scope = format!("b{}", std::process::id());
    let names = Objects {
        ns: format!("sbx-bench-{scope}"),
        host: format!("host-{scope}"),
        runtime: format!("bench-{scope}"),
        scope,
    };
    let host = Host::start(
        args.driver,
        args.sessions,
        &format!("opbench-{}", names.scope),
        &names.runtime,
        &image,
    )
    .await?;
    let measured = measure(&args, &client, &bin, &names, &host, &image).await;
    let cleaned = cleanup(&args, &client, &names, host).await;
    if let (Err(_), Err(e)) = (&measured, &cleaned) {
        eprintln!("cleanup failed too: {e:#}");
    }
    measured.and(cleaned)
}

/// The API server's own ceiling for opening sessions, measured in the same run: the five writes
/// an open needs at the least (the platform's create, the claim of finalizer and host, the
/// token Secret, the status by server-side apply, the Event), made by a plain client with the
/// same concurrency and no operator, and the watch that sees them Running (the same watch that
/// times the operator's opens: without it the floor would leave out what the platform's side
/// costs the API server there). Objects carry no bench label, so the operator never sees
/// them; their namespace is deleted afterwards.
async fn api_floor(client: &Client, scope: &str, n: usize, concurrency: usize) -> Result<f64> {
    let ns = format!("sbx-floor-{scope}");
    let nsapi = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
    create_namespace(client, &ns).await?;
    let sessions = Api::<SandboxSession>::namespaced(client.clone(), &ns);
    let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns);
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns);
    let briefing = "b".repeat(900);
    let created_at: Created = Arc::default();
    let seen = watch_running(sessions.clone(), n, created_at.clone());
    let started = Instant::now();
    let result = futures::stream::iter(0..n)
        .map(|i| {
            let (sessions, secrets, events) = (sessions.clone(), secrets.clone(), events.clone());
            let (ns, briefing, created_at) = (ns.clone(), briefing.clone(), created_at.clone());
            async move {
                let name = format!("xc-floor-{i:05}");
                let s = session(&name, i, json!({}))?;
                created_at
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(name.clone(), Instant::now());
                let s = sessions.create(&PostParams::default(), &s).await?;
                claim_and_secret(&sessions, &secrets, &s).await?;
                let now = k8s_openapi::jiff::Timestamp::now();
                let at = k8s_openapi::jiff::Timestamp::from_second(now.as_second())?.to_string();
                let cond = |t: &str, r: &str| json!({"type": t, "status": "True", "reason": r, "message": format!("{t} on host floor"), "lastTransitionTime": at, "observedGeneration": 1});
                let status = json!({"apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession", "status": {
                    "phase": "Running", "message": "running on host floor", "host": "floor", "endpoint": "http://127.0.0.1:1",
                    "sessionId": name, "runtime": "bench", "credentialsSecret": format!("{name}-token"), "briefing": briefing,
                    "lastActivityAt": at, "sleepsAt": at, "observedGeneration": 1,
                    "conditions": [cond("Placed", "Placed"), cond("Admitted", "Opened"), cond("RuntimeReady", "Ready"), cond("Ready", "Running")]}});
                sessions
                    .patch_status(&name, &PatchParams::apply("operator-bench/floor").force(), &Patch::Apply(&status))
                    .await?;
                events
                    .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": format!("{name}.{:x}", now.as_nanosecond())},
                        "eventTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now), "reportingController": "operator-bench",
                        "reportingInstance": "floor", "action": "Reconcile", "reason": "Running", "type": "Normal", "note": "running on host floor",
                        "regarding": {"apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession", "name": name, "namespace": ns, "uid": s.uid()}}))?)
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<_>>()
        .await;
    // Opened when the platform's watch has seen every session Running, as the operator's are.
    let watched = match &result {
        Ok(_) => tokio::time::timeout(Duration::from_secs(600), seen)
            .await
            .context("the floor's sessions were not all seen Running within 600 s")?
            .map(|_| ())
            .context("the floor's watch"),
        Err(_) => {
            seen.abort();
            Ok(())
        }
    };
    let rate = n as f64 / started.elapsed().as_secs_f64();
    drop_finalizers(&sessions).await?;
    let _ = nsapi.delete(&ns, &DeleteParams::default()).await;
    // The namespace controller's deletes would otherwise load the API server while the
    // operator is measured.
    let late = format!("namespace {ns} was not deleted within 600 s");
    wait_until(
        Duration::from_secs(600),
        Duration::from_millis(500),
        &late,
        async || Ok(nsapi.get_opt(&ns).await?.is_none().then_some(())),
    )
    .await?;
    result?;
    watched?;
    Ok(rate)
}

/// When each session was created, by name.
type Created = Arc<Mutex<HashMap<String, Instant>>>;

/// Watches the sessions of `api` until `n` have been seen Running: how long each took from its
/// create (as `created` recorded it).
fn watch_running(
    api: Api<SandboxSession>,
    n: usize,
    created: Created,
) -> tokio::task::JoinHandle<Vec<Duration>> {
    tokio::spawn(async move {
        let mut latencies = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Ok(Some(ev)) = stream.try_next().await {
            if let Event::Apply(s) | Event::InitApply(s) = ev
                && running(&s)
                && seen.insert(s.name_any())
                && let Some(t) = created
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&s.name_any())
            {
                latencies.push(t.elapsed());
            }
            if seen.len() >= n {
                break;
            }
        }
        latencies
    })
}

async fn measure(
    args: &Args,
    client: &Client,
    bin: &Path,
    names: &Objects,
    host: &Host,
    image: &str,
) -> Result<()> {
    let Objects { scope, ns, .. } = names;
    let floor = if args.no_floor {
        None
    } else {
        Some(api_floor(client, scope, args.sessions, args.concurrency).await?)
    };
    let labels = names.labels();
    names.create(client, host, image).await?;
    let mut op = Operator::start(bin, ns, scope)?;
    let api = Api::<SandboxSession>::namespaced(client.clone(), ns);
    // The clock starts once the operator leads and has found the host ready: opens per second
    // is the rate of opening, not of starting up.
    names.host_ready(client).await?;

    // Watch for Running while creating.
    let created_at: Created = Arc::default();
    let n = args.sessions;
    let watcher_task = watch_running(api.clone(), n, created_at.clone());
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let created_at = created_at.clone();
            let labels = labels.clone();
            async move {
                let name = format!("xc-bench-{i:05}");
                let s = session(&name, i, labels)?;
                created_at
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(name, Instant::now());
                api.create(&PostParams::default(), &s).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<Vec<_>>()
        .await?;
    let mut latencies = tokio::time::timeout(Duration::from_secs(1800), watcher_task)
        .await
        .context("not every session was Running within 1800 s")??;
    let all_running = started.elapsed();
    if latencies.is_empty() {
        bail!("no session was seen going from created to Running");
    }
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p).round() as usize];
    let rss = peak_rss_kib(op.id());
    let opened = n as f64 / all_running.as_secs_f64();
    let (floor_cell, ratio_cell) = match floor {
        Some(f) => (format!("{f:.0}"), format!("{:.2}", opened / f)),
        None => ("-".to_owned(), "-".to_owned()),
    };
    println!(
        "| driver | sessions | opened/s | API floor/s | ratio | create->Running p50 | p95 | operator peak RSS |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {n} | {opened:.0} | {floor_cell} | {ratio_cell} | {:.0} ms | {:.0} ms | {:.1} MiB |",
        args.driver.name(),
        pct(0.5).as_secs_f64() * 1000.0,
        pct(0.95).as_secs_f64() * 1000.0,
        rss as f64 / 1024.0
    );

    // Idle: no writes to sessions that simply run between their deadlines.
    let before = api
        .list(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    tokio::time::sleep(Duration::from_secs(args.idle_watch)).await;
    let wp = kube::api::WatchParams::default().timeout(1);
    let mut writes = 0usize;
    let mut events = api.watch(&wp, &before).await?.boxed();
    while let Some(ev) = events.next().await {
        if matches!(ev, Ok(kube::api::WatchEvent::Modified(_))) {
            writes += 1;
        }
    }
    println!(
        "writes to {n} idle running sessions in {} s: {writes}",
        args.idle_watch
    );

    // Restart: kill -9, start again, until every session was reconciled by the new leader.
    drop(op);
    let restarted = Instant::now();
    op = Operator::start(bin, ns, scope)?;
    let metrics = format!("{}/metrics", op.health());
    let want = format!("sandbox_operator_sessions{{phase=\"Running\"}} {n}");
    wait_until(
        Duration::from_secs(300).saturating_sub(restarted.elapsed()),
        Duration::from_millis(200),
        "the restarted operator did not converge within 300 s",
        async || {
            let text = reqwest::get(&metrics).await?.text().await?;
            Ok(text.contains(&want).then_some(()))
        },
    )
    .await?;
    println!(
        "converged after an operator restart (kill -9) in {:.1} s; peak RSS then {:.1} MiB",
        restarted.elapsed().as_secs_f64(),
        peak_rss_kib(op.id()) as f64 / 1024.0
    );
    Ok(())
}

/// Destroys the sessions through sandboxd (the operator is stopped by then) and deletes this
/// run's objects. Runs whatever happened before, so nothing outlives a failed run.
async fn cleanup(args: &Args, client: &Client, names: &Objects, host: Host) -> Result<()> {
    let started = Instant::now();
    let destroyed = host.destroy_all(args.concurrency).await;
    names.delete(client, &[]).await;
    let (sessions, swept) = destroyed?;
    println!(
        "cleanup: {sessions} sessions destroyed through sandboxd in {:.1} s, {swept} stray containers swept; {} containers of the bench left: 0",
        started.elapsed().as_secs_f64(),
        args.driver.name()
    );
    Ok(())
}
