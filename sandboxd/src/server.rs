//! Start-up: configuration checked, state opened, Docker connected and reconciled, HTTP served
//! until SIGTERM or Ctrl-C.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::config::{Config, RunBackend, WorkspaceQuota};
use crate::container::Engine;
use crate::container::network::SandboxNetwork;
use crate::http::{AppState, router};
use crate::metrics::Metrics;
use crate::run::ExecRunner;
use crate::run::agent::{self, AgentRunner};
use crate::runtimes::{self, Runtimes};
use crate::service::{Core, Settings};
use crate::storage::audit::{Audit, AuditStore};
use crate::storage::store::Store;
use crate::tls::Reloading;
use crate::workspace::disk::Disks;

/// Runs sandboxd with `config` until it is told to stop.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let scheme = if config.tls_cert_file.is_some() {
        "https"
    } else {
        "http"
    };
    raise_descriptor_limit(config.max_connections);
    let (addr, serve) = start(config).await?;
    // The first line on stdout says where it listens (tests and scripts read it with port 0).
    println!("sandboxd listening on {scheme}://{addr}");
    serve.await?;
    info!("sandboxd stopped");
    Ok(())
}

/// Raises the soft limit on open descriptors to the hard limit, as a server that holds up to
/// `SANDBOXD_MAX_CONNECTIONS` connections needs (a login shell's soft limit is often 1,024),
/// and warns when even the hard limit leaves less than that cap and some room for the rest.
fn raise_descriptor_limit(max_connections: usize) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    let now = if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                warn!(soft, hard, error = %e, "raising the limit on open descriptors failed");
                soft
            }
        }
    } else {
        soft
    };
    // Room for the state, Docker's connections, workspaces and the trash.
    let needed = max_connections as u64 + 256;
    if now < needed {
        warn!(
            limit = now,
            needed,
            "the limit on open descriptors is below SANDBOXD_MAX_CONNECTIONS and some room: \
             past it, connections wait in the kernel's queue (raise the limit or lower the cap)"
        );
    }
}

/// Checks the configuration, opens the state, connects to Docker, reconciles, and binds the
/// listener. Returns the address and the future that serves until SIGTERM or Ctrl-C.
pub async fn start(
    config: Config,
) -> anyhow::Result<(SocketAddr, impl Future<Output = std::io::Result<()>>)> {
    start_with(config, None, shutdown()).await
}

/// [`start`] for a program that runs sandboxd in its own process: on `engine` (Docker through
/// [`Engine::connect`], or the operator bench's [`Engine::noop`]) instead of a connection made
/// here, and serving until `stop` completes instead of until a signal (the program keeps its
/// own Ctrl-C). The `sandboxd` binary never calls it.
pub async fn start_on(
    config: Config,
    engine: Engine,
    stop: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(SocketAddr, impl Future<Output = std::io::Result<()>>)> {
    start_with(config, Some(engine), stop).await
}

async fn start_with(
    config: Config,
    engine: Option<Engine>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(SocketAddr, impl Future<Output = std::io::Result<()>>)> {
    let (admin, runtimes) = config.validate()?;
    say_trust(&config)?;
    let tls = tls(&config)?;
    workspace_root(&config)?;
    let store = Store::open(&config.state_dir).await.with_context(|| {
        format!(
            "cannot open the state database in {}",
            config.state_dir.display()
        )
    })?;
    let engine = match engine {
        Some(engine) => engine,
        None => Engine::connect(&config.instance)
            .await
            .context("cannot reach Docker (DOCKER_HOST)")?,
    };
    if engine.is_noop() {
        warn!(
            instance = %config.instance,
            "sandboxd runs on the no-op engine: its containers are records, nothing runs in them"
        );
    }
    let backoff = std::time::Duration::from_secs(config.build_backoff);
    let runtimes =
        Runtimes::start(engine.clone(), config.build_settings()?, backoff, runtimes).await;
    for rt in runtimes.list().runtimes {
        info!(runtime = %rt.alias, tag = %rt.tag, state = ?rt.state, "runtime allowlisted");
    }
    let metrics = Arc::new(Metrics::default());
    let audit = audit(&config, &metrics).await?;
    audit.spawn_sweeper(config.operation_retention_days);
    let runner = runner(&config, &engine, &metrics)?;
    let needs_network = runtimes.list().runtimes.iter().any(|r| r.needs_network);
    let network = Arc::new(SandboxNetwork::new(engine.clone(), config.network_plan()?));
    let ca = Arc::new(
        crate::egress::ca::EgressCa::load(&config.egress_ca()?).context("the node's egress CA")?,
    );
    let egress = egress(&config, &engine, &runtimes, &metrics, &audit, ca.clone())?;
    let allowlist_runtime = runtimes.any_allowlist();
    let mut settings = Settings::from_config(&config);
    settings.egress_trust = Some(ca.trust().clone());
    if allowlist_runtime && ca.trust().bundle.is_none() {
        tracing::warn!(
            "no system roots (SANDBOXD_EGRESS_SYSTEM_ROOTS): sandboxes of allowlist runtimes keep their image's roots and get the egress CA at /etc/sandboxd/egress-ca.crt alone, so only Node trusts a credential's interception by itself; install ca-certificates on the node or point SANDBOXD_EGRESS_SYSTEM_ROOTS at a PEM bundle"
        );
    }
    let snapshots = match config.snapshot_store()? {
        Some(store) => {
            info!(endpoint = %store.endpoint, bucket = %store.bucket, prefix = %store.prefix, "snapshots are kept in the object store");
            Some(crate::service::snapshots::Snapshots {
                store: crate::snapshot::Store::new(&store)
                    .context("the object store of snapshots (SANDBOXD_S3_*)")?,
                grace: std::time::Duration::from_secs(config.snapshot_grace),
            })
        }
        None => None,
    };
    let mut core = Core::new(
        settings,
        store,
        engine,
        runner,
        runtimes,
        audit.clone(),
        metrics.clone(),
    )
    .with_network(network.clone())
    .with_egress(egress.clone());
    if let Some(snapshots) = snapshots {
        core = core.with_snapshots(snapshots);
    }
    let core = Arc::new(core);
    // What an earlier run left in the trash is deleted in the background from now on; nothing
    // here waits for it.
    core.trash().spawn_sweeper();
    let trash = core.trash().clone();
    let offered = core.detect_isolation().await;
    info!(isolation = ?offered, "isolation levels this host's dockerd offers");
    let reconciled = core
        .reconcile()
        .await
        .map_err(|e| anyhow::anyhow!("reconcile with docker failed: {e}"))?;
    // The warm pools fill in the background from now on (what an earlier run left is gone).
    crate::service::pool::spawn(&core);
    let served_metrics = metrics.clone();
    let state = AppState {
        core: core.clone(),
        admin,
        metrics,
    };
    let listener = TcpListener::bind((config.host, config.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", config.host, config.port))?;
    let addr = listener.local_addr()?;
    // Sandboxes with network never reach this port; the network and its firewall are there
    // before the first request, or sandboxd does not start.
    network.set_ports(vec![addr.port()]);
    bring_up(&network, needs_network).await?;
    if allowlist_runtime || egress.network.exists().await? {
        egress
            .ensure()
            .await
            .context("a runtime of the allowlist has the egress mode allowlist")?;
    }
    // A runtime whose egress mode changed while sandboxd was away takes its sandboxes along
    // (after the networks' firewalls know sandboxd's port).
    core.follow_egress_modes().await;
    let egress_flusher = egress.gate.log.spawn_flusher();
    let egress_guard = crate::container::network::spawn_guard(
        egress.network.clone(),
        std::time::Duration::from_secs(config.firewall_check),
        served_metrics.firewall_repairs.clone(),
        served_metrics.firewall_intact.clone(),
    );
    // From now on the firewall is checked on its timer and after Docker's network events.
    let guard = crate::container::network::spawn_guard(
        network.clone(),
        std::time::Duration::from_secs(config.firewall_check),
        served_metrics.firewall_repairs.clone(),
        served_metrics.firewall_intact.clone(),
    );
    info!(%addr, version = crate::VERSION, containers_removed = reconciled.containers_removed, sessions_fixed = reconciled.sessions_fixed, sessions_failed = reconciled.sessions_failed, "sandboxd listening");
    let watcher = tls.as_ref().map(Reloading::spawn_watcher);
    let serve = crate::http::connections::serve(
        listener,
        router(state),
        config.timeouts(),
        config.connection_caps(),
        served_metrics,
        tls,
        stop,
    );
    Ok((addr, async move {
        let served = serve.await;
        if let Some(w) = watcher {
            w.abort();
        }
        guard.abort();
        egress_guard.abort();
        egress_flusher.abort();
        egress.gate.log.flush().await;
        // A deletion under way stops within one entry and goes on at the next start, so that
        // stopping never waits for a deep tree to go.
        trash.stop();
        // Every row recorded by the requests that finished is written before the process ends.
        audit.flush().await;
        served
    }))
}

/// Says in the log whose token opens this sandboxd (warning when the master itself does).
fn say_trust(config: &Config) -> anyhow::Result<()> {
    match config.node()? {
        Some(node) if config.node_token_hashes.is_some() => info!(
            node,
            "the admin token is this node's own, known only by its hash (SANDBOXD_NODE_TOKEN_HASHES); this node holds neither the master nor any token"
        ),
        Some(node) if config.node_token.is_some() => info!(
            node,
            "the admin token is this node's own (SANDBOXD_NODE_TOKEN); the master never reaches this node"
        ),
        Some(node) => info!(
            node,
            "the admin token is this node's own, derived from the master (SANDBOXD_NODE_NAME); the master and other nodes' tokens are refused"
        ),
        None => warn!(
            "SANDBOXD_NODE_NAME is unset: the master admin token itself opens this sandboxd, so every sandboxd sharing SANDBOXD_TOKEN is one trust domain (a token taken from one opens them all); set SANDBOXD_NODE_NAME to accept only this node's own token"
        ),
    }
    Ok(())
}

/// The certificate to serve HTTPS with, read again when it changes; `None` (with a warning
/// in capitals) serves plain HTTP.
fn tls(config: &Config) -> anyhow::Result<Option<Reloading>> {
    Ok(match config.tls_files()? {
        Some(files) => {
            let tls = Reloading::new(files.clone())?;
            info!(cert = %files.cert.display(), key = %files.key.display(), "serving HTTPS only; the certificate is read again when its files change and on SIGHUP");
            Some(tls)
        }
        None => {
            warn!(
                "SERVING PLAIN HTTP: the admin token, the session tokens and every file and command cross the network unencrypted. Set SANDBOXD_TLS_CERT_FILE and SANDBOXD_TLS_KEY_FILE (PEM) to serve HTTPS (the Helm chart does, unless tls.enabled=false)"
            );
            None
        }
    })
}

/// Creates the workspace root, and checks that a host with per-workspace disks
/// (`SANDBOXD_WORKSPACE_QUOTA=loop`) can make them.
fn workspace_root(config: &Config) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.workspace_root).with_context(|| {
        format!(
            "cannot create SANDBOXD_WORKSPACE_ROOT {}",
            config.workspace_root.display()
        )
    })?;
    match config.workspace_quota {
        WorkspaceQuota::Loop => {
            if let Err(missing) = Disks::new(&config.workspace_root, config.sandbox_uid).check() {
                anyhow::bail!(
                    "SANDBOXD_WORKSPACE_QUOTA=loop gives every workspace a disk of its own of SANDBOXD_WORKSPACE_SIZE ({}), and this host lacks what that needs: {missing}. Provide it, or run with SANDBOXD_WORKSPACE_QUOTA=off to let sandboxes write without a limit (one can then fill the node's disk)",
                    config.workspace_size
                );
            }
            info!(workspace_size = %config.workspace_size, "every workspace is a loop-mounted disk of its own size");
        }
        WorkspaceQuota::Off => warn!(
            workspace_root = %config.workspace_root.display(),
            "WORKSPACE SIZES ARE NOT LIMITED (SANDBOXD_WORKSPACE_QUOTA=off): a sandbox can fill the disk under the workspace root, and with it the node's; sessions asking for limits.workspace_size are refused"
        ),
    }
    Ok(())
}

/// The audit log: its store (PostgreSQL or SQLite) behind a bounded queue, or none when
/// `SANDBOXD_AUDIT` is off.
async fn audit(config: &Config, metrics: &Metrics) -> anyhow::Result<Audit> {
    Ok(if config.audit {
        let store = AuditStore::open(config.audit_database_url.as_deref(), &config.state_dir)
            .await
            .context("cannot open the audit store (SANDBOXD_AUDIT_DATABASE_URL, or audit.db in SANDBOXD_STATE_DIR)")?;
        info!(
            backend = if store.is_postgres() {
                "postgres"
            } else {
                "sqlite"
            },
            "audit log open"
        );
        Audit::with_queue(
            Some(store),
            config.audit_queue,
            metrics.audit_rows_dropped.clone(),
        )
    } else {
        Audit::start(None)
    })
}

/// What runs commands in sandboxes: the resident agent (installed into the workspace root
/// here), or `docker exec`.
fn runner(
    config: &Config,
    engine: &Engine,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Arc<dyn crate::run::Runner>> {
    Ok(match config.run_backend {
        RunBackend::Agent => Arc::new(
            AgentRunner::new(engine.clone(), &config.workspace_root, metrics.clone())
                .with_context(|| {
                    format!(
                        "cannot install the sandbox agent into {}",
                        config.workspace_root.join(agent::BIN_FOLDER).display()
                    )
                })?,
        ),
        RunBackend::Exec => Arc::new(ExecRunner::counted(engine.clone(), metrics.clone())),
    })
}

/// The egress network of `allowlist` runtimes: its gate, its upstream resolver, its log in
/// the audit store. Nothing is made until a runtime needs it.
fn egress(
    config: &Config,
    engine: &Engine,
    runtimes: &Arc<Runtimes>,
    metrics: &Arc<Metrics>,
    audit: &crate::storage::audit::Audit,
    ca: Arc<crate::egress::ca::EgressCa>,
) -> anyhow::Result<Arc<crate::egress::EgressNetwork>> {
    use crate::container::network::Redirect;
    use crate::egress::{EgressNetwork, Gate, log::EgressLog, resolve::Upstream};
    let network = Arc::new(SandboxNetwork::new(engine.clone(), config.egress_plan()?));
    let upstream = match config.egress_upstream() {
        Ok(addr) => addr,
        Err(e) if runtimes.any_allowlist() => return Err(e.into()),
        // Asked again of a runtime handed over later: its opens fail with the reason.
        Err(_) => std::net::SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 53)),
    };
    let gate = Arc::new(
        Gate::new(
            engine.clone(),
            runtimes.clone(),
            metrics.clone(),
            &network.plan().network,
            &config.instance,
            EgressLog::new(audit.store().cloned()),
        )
        .with_max_connections(config.egress_max_connections)
        .with_ca(ca),
    );
    Ok(Arc::new(EgressNetwork::new(
        network,
        gate,
        Arc::new(Upstream::new(upstream)),
        Redirect {
            proxy: config.egress_proxy_port,
            dns: config.egress_dns_port,
        },
    )))
}

/// Makes the sandbox network and its firewall when a runtime needs it, or repairs one an
/// earlier run left (a node's reboot took its rules): before the first request is served.
async fn bring_up(network: &SandboxNetwork, needs_network: bool) -> anyhow::Result<()> {
    if needs_network {
        network
            .ensure()
            .await
            .context("a runtime of the allowlist needs a network")?;
    } else if network.exists().await? {
        // Sandboxes of an earlier allowlist may still be on it (a node's reboot took the rules).
        network
            .ensure()
            .await
            .context("the sandbox network of an earlier run is there")?;
    }
    Ok(())
}

async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// `sandboxd prepare`: builds every runtime of the allowlist, [`runtimes::PREPARE_ATTEMPTS`]
/// attempts each, and says which failed. Returns the failed aliases.
pub async fn prepare(config: &Config) -> anyhow::Result<Vec<String>> {
    let allowlist = config.allowlist()?;
    let engine = Engine::connect(&config.instance)
        .await
        .context("cannot reach Docker (DOCKER_HOST)")?;
    let backoff = std::time::Duration::from_secs(config.build_backoff);
    let failed = runtimes::prepare(
        &engine,
        &allowlist,
        &config.build_settings()?,
        runtimes::PREPARE_ATTEMPTS,
        backoff,
    )
    .await;
    for entry in &allowlist.entries {
        match failed.iter().find(|(a, _)| *a == entry.alias) {
            None => println!(
                "ready {} {}",
                entry.alias,
                runtimes::tag(entry, &config.build_settings()?)
            ),
            Some((_, e)) => {
                eprintln!(
                    "failed {} after {} attempts: {}\n{}",
                    entry.alias,
                    runtimes::PREPARE_ATTEMPTS,
                    e.message,
                    e.log_tail
                );
            }
        }
    }
    Ok(failed.into_iter().map(|(a, _)| a).collect())
}

/// `sandboxd remove-network`: removes this instance's sandbox network and its firewall.
pub async fn remove_network(config: &Config) -> anyhow::Result<()> {
    let plan = config.network_plan()?;
    let engine = Engine::connect(&config.instance)
        .await
        .context("cannot reach Docker (DOCKER_HOST)")?;
    SandboxNetwork::new(engine.clone(), plan).remove().await?;
    SandboxNetwork::new(engine, config.egress_plan()?)
        .remove()
        .await?;
    Ok(())
}

/// A sandboxd on the no-op engine for unit tests: its folders in a temporary folder, the admin
/// token `admin`, a port of its own.
#[cfg(test)]
pub(crate) mod noop {
    use std::os::unix::fs::MetadataExt as _;
    use std::path::Path;

    use clap::Parser as _;

    use crate::config::Config;
    use crate::container::Engine;
    use sandboxd_api::client::Client;

    /// A running sandboxd and its admin client.
    pub(crate) struct Noop {
        pub admin: Client,
        stop: tokio::sync::oneshot::Sender<()>,
        served: tokio::task::JoinHandle<std::io::Result<()>>,
    }

    impl Noop {
        /// Starts sandboxd instance `instance` with the allowlist `runtimes` on the workspace
        /// and state folders under `dir` (kept across starts on the same `dir`).
        pub(crate) async fn start(dir: &Path, instance: &str, runtimes: &str) -> Self {
            // Root makes the workspaces the default sandbox uid's; anyone else keeps them.
            let uid = match dir.metadata().expect("the temp dir").uid() {
                0 => 10001,
                uid => uid,
            };
            let path = |p: &str| dir.join(p).display().to_string();
            let config = Config::try_parse_from([
                "sandboxd",
                "--token",
                "admin",
                "--port",
                "0",
                "--runtimes",
                runtimes,
                "--instance",
                instance,
                "--workspace-root",
                &path("workspaces"),
                "--state-dir",
                &path("state"),
                "--sandbox-uid",
                &uid.to_string(),
                "--workspace-quota",
                "off",
            ])
            .expect("a config");
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let (addr, serve) = super::start_on(config, Engine::noop(instance), async {
                let _ = stopped.await;
            })
            .await
            .expect("sandboxd starts");
            Self {
                admin: Client::new(&format!("http://{addr}"), "admin"),
                stop,
                served: tokio::spawn(serve),
            }
        }

        /// Stops it and waits until it stopped serving.
        pub(crate) async fn stop(self) {
            let _ = self.stop.send(());
            self.served
                .await
                .expect("the serving task")
                .expect("served until told to stop");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use sandboxd_api::SessionState as State;
    use sandboxd_api::client::ClientError;

    async fn prompt<T>(what: &str, f: impl Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(5), f)
            .await
            .unwrap_or_else(|_| panic!("{what} took more than 5 s"))
    }

    /// What the operator bench does with a sandboxd on the no-op engine works, promptly; a
    /// run, which needs a real container, fails at once with a message that says why.
    #[tokio::test]
    async fn the_noop_engine_serves_sessions_and_refuses_runs() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let sandboxd = noop::Noop::start(dir.path(), "noop-test", "base=never-pulled:1").await;
        let admin = sandboxd.admin.clone();

        let opened = prompt("the open", admin.open("s1", "org", None, None))
            .await
            .expect("open");
        assert!(opened.created);
        assert_eq!(opened.session.state, State::Running);
        let token = opened.token.expect("a token on create");
        assert!(dir.path().join("workspaces/s1/workspace").is_dir());
        let found = admin
            .open("s1", "org", None, None)
            .await
            .expect("open again");
        assert!(!found.created && found.token.is_none());

        let view = prompt("the get", admin.get("s1")).await.expect("get");
        assert_eq!((view.state, view.cpu_ns), (State::Running, Some(0)));
        assert_eq!(admin.list().await.expect("list").len(), 1);

        let rotated = admin.rotate_token("s1").await.expect("rotate");
        assert_ne!(rotated, token);
        assert!(admin.with_token(&token).get("s1").await.is_err());
        admin
            .with_token(&rotated)
            .get("s1")
            .await
            .expect("the new token works");

        let run = prompt("the run", admin.run("s1", "true", None, None, None))
            .await
            .expect_err("nothing runs on the no-op engine");
        assert!(run.to_string().contains("no-op engine"), "{run}");

        assert_eq!(admin.stop("s1").await.expect("stop").state, State::Stopped);
        assert_eq!(
            admin.start("s1").await.expect("start").state,
            State::Running
        );
        assert!(admin.destroy("s1").await.expect("destroy").destroyed);
        assert!(matches!(
            admin.get("s1").await,
            Err(ClientError::NoSuchSession(_))
        ));
        assert!(!dir.path().join("workspaces/s1").exists());
        sandboxd.stop().await;
    }
}
