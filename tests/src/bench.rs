//! What the benches (`src/bin/*-bench.rs`) share: a real sandboxd served in the bench's own
//! process and registered as a host, a child operator, and percentiles.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use futures::StreamExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use sandboxd::container::Engine;
use sandboxd_crds::v1alpha1::session::SessionPhase;
use sandboxd_crds::v1alpha1::{Runtime, SandboxHost, SandboxSession, Tombstone};
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
    /// Its master admin token (what the host's Secret holds).
    pub admin_token: String,
    /// Its node (the SandboxHost's `spec.node`): it takes the token derived for it.
    pub node: String,
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
        let admin_token = sandboxd::service::auth::new_session_token();
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
            "--max-workspaces-per-tenant",
            &cap,
            // The no-op engine's workspaces are empty folders: no disks to make.
            "--workspace-quota",
            "off",
            "--node-name",
            instance,
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
            node: instance.to_owned(),
            instance: instance.to_owned(),
            engine,
            stop,
            served: tokio::spawn(serve),
            dir,
        })
    }

    /// A client of this sandboxd with its admin token.
    pub fn admin(&self) -> sandboxd_api::client::Client {
        sandboxd_api::client::Client::new(
            &self.endpoint,
            &sandboxd_api::auth::node_token(&self.admin_token, &self.node),
        )
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
            match self.engine.remove(&c.id).await {
                Ok(()) => swept += 1,
                // Being removed already: sandboxd drains a pool set back to 0 in the background.
                Err(e) if e.is_conflict() => {}
                Err(e) => return Err(e.into()),
            }
        }
        // What sandboxd was still removing is gone within the minute, or counted as left.
        let engine = &self.engine;
        let left = match wait_until(
            Duration::from_secs(60),
            Duration::from_millis(100),
            "",
            async || {
                let n = engine.owned().await?.len();
                Ok((n == 0).then_some(0))
            },
        )
        .await
        {
            Ok(n) => n,
            Err(_) => self.engine.owned().await?.len(),
        };
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
pub struct Operator(crate::process::Operator);

impl Operator {
    /// Starts `bin` on the objects labelled `bench=<scope>`, leading through a Lease in `ns`
    /// (where the host's admin-token Secret is too), and waits until it serves health. Its log
    /// level is `OPERATOR_BENCH_LOG` (error by default); its periods are the operator's own
    /// but for the Lease's and the probe's.
    pub fn start(bin: &Path, ns: &str, scope: &str) -> Result<Self> {
        let mut op = crate::process::Operator::new(bin.to_owned(), ns, &format!("bench={scope}"));
        op.lease_name = Some("bench".to_owned());
        op.log = std::env::var("OPERATOR_BENCH_LOG").unwrap_or_else(|_| "error".into());
        op.test_periods = false;
        op.with_args(&["--lease-seconds", "5", "--probe-seconds", "5"])
            .launch()?;
        Ok(Self(op))
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.0.process.pid().unwrap_or_default()
    }

    /// Its health and metrics base URL.
    pub fn health(&self) -> &str {
        &self.0.health
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

/// What every bench starts with: sandboxd's crypto provider, logs on stderr (`RUST_LOG`,
/// errors only by default), a client of the cluster, the release operator binary beside the
/// bench, and the image the sessions run (`noop` on the no-op engine).
pub async fn setup(driver: Driver, image: Option<&str>) -> Result<(Client, PathBuf, String)> {
    // reqwest finds the one crypto provider (ring) sandboxd's clients use.
    sandboxd::tls::install_provider();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let client = Client::try_default()
        .await
        .context("KUBECONFIG: run make up and eval \"$(make -s env)\"")?;
    let bin = operator_bin()?;
    let image = match (driver, image) {
        (_, Some(image)) => image.to_owned(),
        (Driver::Noop, None) => "noop".to_owned(),
        (Driver::Docker, None) => bail!(
            "the docker driver needs an image: SANDBOXD_BASE_IMAGE (eval \"$(make -s env)\") or --image"
        ),
    };
    Ok((client, bin, image))
}

/// The cluster objects of one bench run, all labelled `bench=<scope>`.
pub struct Objects {
    /// The run's label value, and the operator's selector.
    pub scope: String,
    /// The namespace of the sessions, the host's admin-token Secret and the operator's Lease.
    pub ns: String,
    /// The SandboxHost's name.
    pub host: String,
    /// The default Runtime's name (the host's runtime alias).
    pub runtime: String,
}

impl Objects {
    /// The label every object of the run carries.
    pub fn labels(&self) -> serde_json::Value {
        json!({"bench": self.scope})
    }

    /// Creates the namespace, the admin-token Secret of `host`, the SandboxHost and the default
    /// Runtime of `image`.
    pub async fn create(&self, client: &Client, host: &Host, image: &str) -> Result<()> {
        let labels = self.labels();
        create_namespace(client, &self.ns).await?;
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &self.ns)
            .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "admin", "labels": labels}, "stringData": {"token": host.admin_token}}))?)
            .await?;
        Api::<SandboxHost>::all(client.clone())
            .create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxHost",
                "metadata": {"name": self.host, "labels": labels},
                "spec": {"endpoint": host.endpoint, "node": host.node, "adminTokenSecret": {"namespace": self.ns, "name": "admin", "key": "token"}}}))?)
            .await?;
        Api::<Runtime>::all(client.clone())
            .create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "sandboxd.dev/v1alpha1", "kind": "Runtime",
                "metadata": {"name": self.runtime, "labels": labels}, "spec": {"image": image, "default": true}}))?)
            .await?;
        Ok(())
    }

    /// Waits (60 s at most) until the operator has found the SandboxHost Ready: a bench's clock
    /// starts then, so its figures are of opening, not of starting up.
    pub async fn host_ready(&self, client: &Client) -> Result<()> {
        let late = format!("SandboxHost {} was not Ready within 60 s", self.host);
        wait_until(
            Duration::from_secs(60),
            Duration::from_millis(100),
            &late,
            async || {
                let host = Api::<SandboxHost>::all(client.clone())
                    .get(&self.host)
                    .await?;
                let ready = host.status.as_ref().is_some_and(|st| {
                    st.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                });
                Ok(ready.then_some(()))
            },
        )
        .await
    }

    /// Deletes the run's objects, and the namespaces in `also`, releasing their sessions from
    /// their finalizers first (the operator is stopped by then). Best effort: it runs after a
    /// failed run too.
    pub async fn delete(&self, client: &Client, also: &[&str]) {
        for ns in std::iter::once(self.ns.as_str()).chain(also.iter().copied()) {
            let _ = drop_finalizers(&Api::<SandboxSession>::namespaced(client.clone(), ns)).await;
            let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
                .delete(ns, &DeleteParams::default())
                .await;
        }
        let _ = Api::<SandboxHost>::all(client.clone())
            .delete(&self.host, &DeleteParams::default())
            .await;
        let _ = Api::<Runtime>::all(client.clone())
            .delete(&self.runtime, &DeleteParams::default())
            .await;
        let _ = Api::<Tombstone>::all(client.clone())
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&format!("bench={}", self.scope)),
            )
            .await;
    }
}

/// Asks `attempt` again every `every` until it gives a value (`Ok(Some)`) or fails (`Err`, which
/// ends the wait at once), for `deadline` at the most: then the error says `late`.
pub async fn wait_until<T>(
    deadline: Duration,
    every: Duration,
    late: &str,
    mut attempt: impl AsyncFnMut() -> Result<Option<T>>,
) -> Result<T> {
    crate::poll::poll(deadline, every, async || attempt().await.transpose())
        .await
        .map_err(|_| anyhow::anyhow!("{late}"))?
}

/// The SandboxSession a bench creates as its session `i` (one of 50 tenants), labelled with
/// `labels`.
pub fn session(name: &str, i: usize, labels: serde_json::Value) -> Result<SandboxSession> {
    Ok(serde_json::from_value(
        json!({"apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession",
            "metadata": {"name": name, "labels": labels},
            "spec": {"scope": "conversation", "tenant": format!("org-{}", i % 50), "subject": name}}),
    )?)
}

/// The two writes the API floor makes between a session's create and its status, as the
/// operator makes them: the claim (finalizer and host annotation, one JSON patch tested against
/// the created object's resourceVersion) and the token Secret owned by the session.
pub async fn claim_and_secret(
    sessions: &Api<SandboxSession>,
    secrets: &Api<k8s_openapi::api::core::v1::Secret>,
    s: &SandboxSession,
) -> Result<()> {
    let name = s.name_any();
    let claim: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": s.resource_version()},
        {"op": "add", "path": "/metadata/finalizers", "value": ["sandboxd.dev/session"]},
        {"op": "add", "path": "/metadata/annotations", "value": {"sandboxd.dev/host": "floor"}},
    ]))?;
    sessions
        .patch(&name, &PatchParams::default(), &Patch::<()>::Json(claim))
        .await?;
    secrets
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": format!("{name}-token"),
            "ownerReferences": [{"apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession", "name": name, "uid": s.uid(), "controller": true}]},
            "type": "sandboxd.dev/session-token", "stringData": {"token": "sbx_floor", "endpoint": "http://127.0.0.1:1", "session": name}}))?)
        .await?;
    Ok(())
}

/// Whether the session's status says Running.
pub fn running(s: &SandboxSession) -> bool {
    s.status.as_ref().and_then(|st| st.phase) == Some(SessionPhase::Running)
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
