//! What the benches (`src/bin/*-bench.rs`) share: a real sandboxd served in the bench's own
//! process and registered as a host, a child operator, and percentiles.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use futures::StreamExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use sandboxd::docker::Engine;
use sandboxd_crds::v1alpha1::SandboxSession;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// What the sandboxd of a bench runs its sessions' containers on.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    /// The project's dockerd (`DOCKER_HOST`): real containers.
    Docker,
    /// sandboxd's no-op engine: containers are records, nothing runs.
    Noop,
}

impl Driver {
    /// The driver's name, as the figures print it.
    pub fn name(self) -> &'static str {
        match self {
            Driver::Docker => "docker",
            Driver::Noop => "noop",
        }
    }
}

/// The sandboxd of a bench, serving in the bench's process.
pub struct Host {
    /// Its base URL.
    pub endpoint: String,
    /// Its admin token.
    pub admin_token: String,
    /// Its instance name (the label on its containers).
    pub instance: String,
    engine: Engine,
    stop: oneshot::Sender<()>,
    served: JoinHandle<std::io::Result<()>>,
    dir: PathBuf,
}

impl Host {
    /// Starts sandboxd as instance `instance` on `driver` with its state and workspaces under a
    /// new temporary folder, runtime `alias` = `image`, and caps of at least `cap` sessions.
    pub async fn start(
        driver: Driver,
        cap: usize,
        instance: &str,
        alias: &str,
        image: &str,
    ) -> Result<Self> {
        let engine = match driver {
            Driver::Docker => {
                std::env::var("DOCKER_HOST")
                    .context("DOCKER_HOST is not set: eval \"$(make -s env)\" after make up")?;
                let engine = Engine::connect(instance)
                    .await
                    .context("cannot reach the project's dockerd (DOCKER_HOST)")?;
                if !engine.has_image(image).await? {
                    bail!("the image {image} is not on the project's dockerd: make up builds it");
                }
                engine
            }
            Driver::Noop => Engine::noop(instance),
        };
        let dir = std::env::temp_dir().join(instance);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let admin_token = sandboxd::auth::new_session_token();
        let cap = cap.max(1).to_string();
        let path = |p: &str| dir.join(p).display().to_string();
        let mut config = sandboxd::config::Config::try_parse_from([
            "sandboxd",
            "--token",
            &admin_token,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--runtimes",
            &format!("{alias}={image}"),
            "--instance",
            instance,
            "--workspace-root",
            &path("workspaces"),
            "--state-dir",
            &path("state"),
            "--max-sessions",
            &cap,
            "--max-sessions-per-tenant",
            &cap,
            // The no-op engine's workspaces are empty folders: no disks to make.
            "--workspace-quota",
            "off",
        ])?;
        // What the environment might set for a sandboxd of its own stays out of the bench's.
        config.runtimes_file = None;
        config.audit_database_url = None;
        config.persist_containers = false;
        let (stop, stopped) = oneshot::channel();
        let (addr, serve) = match sandboxd::server::start_on(config, engine.clone(), async {
            let _ = stopped.await;
        })
        .await
        {
            Ok(started) => started,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e.context("sandboxd did not start"));
            }
        };
        Ok(Self {
            endpoint: format!("http://{addr}"),
            admin_token,
            instance: instance.to_owned(),
            engine,
            stop,
            served: tokio::spawn(serve),
            dir,
        })
    }

    /// A client of this sandboxd with its admin token.
    pub fn admin(&self) -> sandboxd::client::Client {
        sandboxd::client::Client::new(&self.endpoint, &self.admin_token)
    }

    /// Destroys every session through sandboxd, `concurrency` at a time. Returns how many.
    pub async fn destroy_sessions(&self, concurrency: usize) -> Result<usize> {
        let admin = self.admin();
        let sessions = admin.list().await.context("listing the sessions")?;
        let failed: Vec<String> = futures::stream::iter(sessions.iter())
            .map(|s| {
                let admin = admin.clone();
                async move {
                    admin
                        .destroy(&s.id)
                        .await
                        .err()
                        .map(|e| format!("{}: {e}", s.id))
                }
            })
            .buffer_unordered(concurrency.clamp(1, 16))
            .filter_map(futures::future::ready)
            .collect()
            .await;
        if !failed.is_empty() {
            bail!(
                "{} sessions were not destroyed: {}",
                failed.len(),
                failed.join("; ")
            );
        }
        Ok(sessions.len())
    }

    /// Destroys every session through sandboxd, removes any container of this instance the
    /// engine still holds, and stops sandboxd. Returns the sessions destroyed and the
    /// containers the sweep had to remove.
    pub async fn destroy_all(self, concurrency: usize) -> Result<(usize, usize)> {
        let destroyed = self.destroy_sessions(concurrency).await;
        let mut swept = 0;
        for c in self.engine.owned().await? {
            self.engine.remove(&c.id).await?;
            swept += 1;
        }
        let left = self.engine.owned().await?.len();
        let _ = self.stop.send(());
        let served = self.served.await;
        let _ = std::fs::remove_dir_all(&self.dir);
        let destroyed = destroyed?;
        if left > 0 {
            bail!(
                "{left} containers of sandboxd instance {} are left",
                self.instance
            );
        }
        served
            .context("sandboxd's task")?
            .context("sandboxd stopped serving")?;
        Ok((destroyed, swept))
    }
}

/// A child operator, killed (SIGKILL) and reaped when dropped.
pub struct Operator(Child);

impl Operator {
    /// Starts `bin` on the objects labelled `bench=<scope>`, leading through a Lease in `ns`
    /// (where the host's admin-token Secret is too). Its log level is `OPERATOR_BENCH_LOG`
    /// (error by default).
    pub fn start(bin: &Path, ns: &str, scope: &str) -> Result<Self> {
        Ok(Self(
            Command::new(bin)
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
                // The host's admin-token Secret is in the bench's namespace.
                .env("POD_NAMESPACE", ns)
                .env(
                    "RUST_LOG",
                    std::env::var("OPERATOR_BENCH_LOG").unwrap_or_else(|_| "error".into()),
                )
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()?,
        ))
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The release operator binary beside the running bench.
pub fn operator_bin() -> Result<PathBuf> {
    let bin = std::env::current_exe()?.with_file_name("sandbox-operator");
    if !bin.exists() {
        bail!(
            "{} is missing: cargo build --release -p sandboxd-operator --bins",
            bin.display()
        );
    }
    Ok(bin)
}

/// Creates namespace `ns`.
pub async fn create_namespace(client: &Client, ns: &str) -> Result<()> {
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    Ok(())
}

/// Releases every session of `api` from its finalizer (no operator is left to do it), so its
/// namespace can go.
pub async fn drop_finalizers(api: &Api<SandboxSession>) -> Result<()> {
    for s in api.list(&ListParams::default()).await?.items {
        let _ = api
            .patch(
                &s.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
    }
    Ok(())
}

/// The `p` quantile (0 to 1, nearest rank) of `sorted`, which is sorted and not empty.
pub fn quantile(sorted: &[Duration], p: f64) -> Duration {
    let last = sorted.len().saturating_sub(1);
    sorted[((last as f64) * p).round() as usize]
}

/// p50, p90 and p99 of `samples` in milliseconds, as table cells (`—` when there are none).
pub fn percentiles(samples: &mut [Duration]) -> [String; 3] {
    if samples.is_empty() {
        return ["—".into(), "—".into(), "—".into()];
    }
    samples.sort();
    [0.5, 0.9, 0.99].map(|p| format!("{:.0} ms", quantile(samples, p).as_secs_f64() * 1000.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_in_milliseconds() {
        let mut samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(percentiles(&mut samples), ["51 ms", "90 ms", "99 ms"]);
        let mut one = vec![Duration::from_millis(7)];
        assert_eq!(percentiles(&mut one), ["7 ms", "7 ms", "7 ms"]);
        assert_eq!(percentiles(&mut []), ["—", "—", "—"]);
    }
}
