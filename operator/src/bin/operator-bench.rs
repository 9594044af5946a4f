//! Benchmarks the operator against the real API server: creates N SandboxSessions and reports
//! sessions opened per second, p50/p95 from create to Running, the operator's peak RSS, the time
//! to converge after an operator restart, and the API writes made for sessions that simply run
//! idle. The host is a stand-in sandboxd whose containers are a no-op (an in-memory map that
//! exists only for this bench), so the figures are the operator's and the API server's.
//!
//! Needs `make up` and `eval "$(make -s env)"`, and the release operator binary:
//! `cargo build --release -p sandboxd-operator --bins`
//! then `target/release/operator-bench --sessions 1000`.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use sandboxd_crds::v1alpha1::SandboxSession;
use sandboxd_crds::v1alpha1::session::SessionPhase;
use serde_json::{Value, json};

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
}

#[derive(Default)]
struct Fake {
    /// id -> (tenant, opened at)
    sessions: HashMap<String, (String, String)>,
}

type Shared = Arc<Mutex<Fake>>;

fn view(id: &str, tenant: &str, opened: &str) -> Value {
    // Activity is when it was opened: an idle session, as a real host would report it.
    json!({"id": id, "tenant": tenant, "runtime": "bench", "image": "noop", "state": "running",
           "created_at": opened, "last_activity_at": opened, "runs_in_flight": 0, "workspace_exists": true})
}

async fn stand_in() -> Result<String> {
    let shared: Shared = Arc::default();
    let routes: Vec<String> = sandboxd::api::ROUTES
        .iter()
        .map(|r| (*r).to_owned())
        .collect();
    let app = Router::new()
        .route("/", get(move || { let routes = routes.clone(); async move { Json(json!({"service": "sandboxd", "version": sandboxd::VERSION, "routes": routes})) } }))
        .route("/v1/policy", get(|| async {
            Json(json!({"max_sessions": 1_000_000, "max_sessions_per_tenant": 1_000_000, "execute_timeout": 300, "max_read_bytes": 8388608, "max_output_bytes": 1048576,
                "fixed": {"runtimes": ["bench"], "network_mode": "none", "runtime_network": "bridge", "oci_runtime": null, "sandbox_uid": 10001, "work_dir": "/workspace",
                          "workspace_root": "/noop", "persist_containers": false, "cpus": 2.0, "memory": 1073741824, "pids_limit": 512, "tmpfs_size": "64m"}}))
        }))
        .route("/v1/runtimes", get(runtimes).put(runtimes))
        .route("/v1/sessions", get(list).post(open))
        .route("/v1/sessions/{id}", get(show).delete(destroy))
        .route("/v1/sessions/{id}/token", post(|Path(id): Path<String>| async move { Json(json!({"id": id, "token": "sbx_bench"})) }))
        .with_state(shared);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(format!("http://{addr}"))
}

async fn runtimes() -> Json<Value> {
    Json(
        json!({"catalog": true, "runtimes": [{"alias": "bench", "description": "", "default": true, "kind": "image", "source_image": "noop", "tag": "noop",
        "state": "ready", "attempts": 0, "needs_network": false}]}),
    )
}

async fn list(State(s): State<Shared>) -> Json<Value> {
    let f = s.lock().unwrap_or_else(|p| p.into_inner());
    Json(
        json!({"sessions": f.sessions.iter().map(|(id, (t, at))| view(id, t, at)).collect::<Vec<_>>()}),
    )
}

async fn open(
    State(s): State<Shared>,
    Json(body): Json<Value>,
) -> (axum::http::StatusCode, Json<Value>) {
    let id = body["name"].as_str().unwrap_or_default().to_owned();
    let tenant = body["tenant"].as_str().unwrap_or_default().to_owned();
    let mut f = s.lock().unwrap_or_else(|p| p.into_inner());
    let created = !f.sessions.contains_key(&id);
    let at = f
        .sessions
        .entry(id.clone())
        .or_insert_with(|| {
            (
                tenant.clone(),
                k8s_openapi::jiff::Timestamp::now().to_string(),
            )
        })
        .1
        .clone();
    let mut v = view(&id, &tenant, &at);
    if created {
        v["token"] = json!("sbx_bench");
    }
    (
        if created {
            axum::http::StatusCode::CREATED
        } else {
            axum::http::StatusCode::OK
        },
        Json(v),
    )
}

async fn show(
    State(s): State<Shared>,
    Path(id): Path<String>,
) -> Result<Json<Value>, (axum::http::StatusCode, Json<Value>)> {
    let f = s.lock().unwrap_or_else(|p| p.into_inner());
    match f.sessions.get(&id) {
        Some((t, at)) => Ok(Json(view(&id, t, at))),
        None => Err((
            axum::http::StatusCode::NOT_FOUND,
            Json(
                json!({"code": "session_not_found", "message": format!("No such session '{id}'")}),
            ),
        )),
    }
}

async fn destroy(State(s): State<Shared>, Path(id): Path<String>) -> Json<Value> {
    let gone = s
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .sessions
        .remove(&id)
        .is_some();
    Json(json!({"id": id, "destroyed": gone, "message": "destroyed"}))
}

fn operator(bin: &std::path::Path, ns: &str, scope: &str) -> Result<Child> {
    Ok(Command::new(bin)
        .args([
            "--selector",
            &format!("bench={scope}"),
            "--lease-namespace",
            ns,
            "--lease-name",
            "bench",
            "--lease-seconds",
            "5",
        ])
        .args(["--http-addr", "127.0.0.1:0", "--probe-seconds", "5"])
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?)
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

fn running(s: &SandboxSession) -> bool {
    s.status.as_ref().and_then(|st| st.phase) == Some(SessionPhase::Running)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let client = Client::try_default()
        .await
        .context("KUBECONFIG: run make up and eval \"$(make -s env)\"")?;
    let bin = std::env::current_exe()?.with_file_name("sandbox-operator");
    if !bin.exists() {
        bail!(
            "{} is missing: cargo build --release -p sandboxd-operator --bins",
            bin.display()
        );
    }
    let endpoint = stand_in().await?;
    let scope = format!("b{}", std::process::id());
    let ns = format!("sbx-bench-{scope}");
    let labels = json!({"bench": scope});
    let nsapi = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
    nsapi
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "admin", "labels": labels}, "stringData": {"token": "t"}}))?)
        .await?;
    Api::<sandboxd_crds::v1alpha1::SandboxHost>::all(client.clone())
        .create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxHost",
            "metadata": {"name": format!("host-{scope}"), "labels": labels},
            "spec": {"endpoint": endpoint, "adminTokenSecret": {"namespace": ns, "name": "admin", "key": "token"}}}))?)
        .await?;
    Api::<sandboxd_crds::v1alpha1::Runtime>::all(client.clone())
        .create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "sandboxd.dev/v1alpha1", "kind": "Runtime",
            "metadata": {"name": "bench", "labels": labels}, "spec": {"image": "noop", "default": true}}))?)
        .await
        .ok();
    let mut op = operator(&bin, &ns, &scope)?;
    let api = Api::<SandboxSession>::namespaced(client.clone(), &ns);

    // Watch for Running while creating.
    let created_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watch_created = created_at.clone();
    let n = args.sessions;
    let watch_api = api.clone();
    let watcher_task = tokio::spawn(async move {
        let mut latencies = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut stream = watcher::watcher(watch_api, watcher::Config::default()).boxed();
        while let Ok(Some(ev)) = stream.try_next().await {
            if let Event::Apply(s) | Event::InitApply(s) = ev
                && running(&s)
                && seen.insert(s.name_any())
                && let Some(t) = watch_created
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
    });
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let created_at = created_at.clone();
            let labels = labels.clone();
            async move {
                let name = format!("xc-bench-{i:05}");
                let s: SandboxSession = serde_json::from_value(json!({"apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession",
                    "metadata": {"name": name, "labels": labels}, "spec": {"scope": "conversation", "tenant": format!("org-{}", i % 50), "subject": name}}))?;
                created_at.lock().unwrap_or_else(|p| p.into_inner()).insert(name, Instant::now());
                api.create(&PostParams::default(), &s).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<Vec<_>>()
        .await?;
    let mut latencies = tokio::time::timeout(Duration::from_secs(1800), watcher_task).await??;
    let all_running = started.elapsed();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p).round() as usize];
    let rss = peak_rss_kib(op.id());
    println!("| sessions | opened/s | create->Running p50 | p95 | operator peak RSS |");
    println!("|---|---|---|---|---|");
    println!(
        "| {n} | {:.0} | {:.0} ms | {:.0} ms | {:.1} MiB |",
        n as f64 / all_running.as_secs_f64(),
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
    let _ = op.kill();
    let _ = op.wait();
    let restarted = Instant::now();
    op = operator(&bin, &ns, &scope)?;
    let mut health = None;
    while health.is_none() && restarted.elapsed() < Duration::from_secs(120) {
        health = find_health(op.id());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let health = health.context("the restarted operator's metrics address")?;
    let want = format!("sandbox_operator_sessions{{phase=\"Running\"}} {n}");
    loop {
        let text = reqwest::get(format!("{health}/metrics"))
            .await?
            .text()
            .await?;
        if text.contains(&want) {
            break;
        }
        if restarted.elapsed() > Duration::from_secs(300) {
            bail!("the restarted operator did not converge within 300 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "converged after an operator restart (kill -9) in {:.1} s; peak RSS then {:.1} MiB",
        restarted.elapsed().as_secs_f64(),
        peak_rss_kib(op.id()) as f64 / 1024.0
    );

    let _ = op.kill();
    let _ = op.wait();
    for o in api.list(&ListParams::default()).await?.items {
        let _ = api
            .patch(
                &o.name_any(),
                &Default::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
    }
    let _ = nsapi.delete(&ns, &DeleteParams::default()).await;
    let _ = Api::<sandboxd_crds::v1alpha1::SandboxHost>::all(client.clone())
        .delete(&format!("host-{scope}"), &DeleteParams::default())
        .await;
    Ok(())
}

/// The metrics address a child operator listens on, read from its open sockets (it printed it
/// to a stdout this bench does not keep).
fn find_health(pid: u32) -> Option<String> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            l.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_owned)
        })
        .collect();
    let tcp = std::fs::read_to_string("/proc/net/tcp").ok()?;
    tcp.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // state 0A is LISTEN
        if f.get(3) == Some(&"0A") && f.get(9).is_some_and(|i| inodes.iter().any(|x| x == i)) {
            let port = u16::from_str_radix(f[1].split(':').nth(1)?, 16).ok()?;
            Some(format!("http://127.0.0.1:{port}"))
        } else {
            None
        }
    })
}
