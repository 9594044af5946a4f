//! The container seam: [`Engine`], the one face of whatever keeps sandboxd's containers, and
//! the types that cross it ([`SandboxSpec`], [`AgentMount`], [`Presence`], [`Stats`],
//! [`Owned`], [`DockerError`]). What an engine must do is the `Containers` trait of this
//! module; [`Engine`] dispatches to one of two: Docker ([`docker`], the production engine) or
//! the operator bench's no-op engine (`noop`), which know nothing of each other. Beside the
//! seam, the network of sessions whose runtime needs one ([`network`]).

pub mod checkpoint;
pub mod docker;
pub mod network;
mod noop;

use std::sync::Arc;

use futures::future::BoxFuture;

use docker::DockerEngine;
use noop::NoopEngine;

/// Where the workspace appears inside a sandbox.
pub const WORKSPACE_MOUNT: &str = "/workspace";

/// How a sandbox runs the resident agent as its PID 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentMount {
    /// Host folder holding the agent binary, mounted read-only.
    pub bin_dir: String,
    /// Host folder of the session's socket (outside the workspace, owned by root, `0700`),
    /// mounted read-write: only the agent, while it is still root, writes there.
    pub run_dir: String,
    /// The newest agent protocol of this sandboxd, written on the container's label.
    pub protocol: u32,
}

/// Everything a sandbox container is created with.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// The session id.
    pub session: String,
    /// The tenant.
    pub tenant: String,
    /// The image.
    pub image: String,
    /// Host path of the workspace folder.
    pub workspace: String,
    /// uid and gid it runs as.
    pub uid: u32,
    /// Docker network mode (`none` unless the runtime needs one).
    pub network_mode: String,
    /// CPUs.
    pub cpus: f64,
    /// Memory limit in bytes.
    pub memory: i64,
    /// Process limit.
    pub pids_limit: i64,
    /// tmpfs size at /tmp, in Docker's syntax.
    pub tmpfs_size: String,
    /// tmpfs size at HOME when it is a folder of the image, in Docker's syntax.
    pub home_size: String,
    /// OCI runtime, if not Docker's default.
    pub oci_runtime: Option<String>,
    /// Environment.
    pub env: Vec<String>,
    /// The resident agent as PID 1; `None`: Docker's init, and runs through Docker exec.
    pub agent: Option<AgentMount>,
    /// The trust bundle and the node's egress CA, mounted read-only at
    /// [`crate::egress::ca::BUNDLE_IN_SANDBOX`] and [`crate::egress::ca::CA_IN_SANDBOX`].
    pub trust: Option<crate::egress::ca::Trust>,
    /// A resolv.conf (host path) mounted read-only at `/etc/resolv.conf`: a gVisor sandbox's on
    /// a network, whose stack does not reach Docker's embedded resolver.
    pub resolv_conf: Option<String>,
}

/// A Docker failure, with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("docker could not {action}: {source}")]
pub struct DockerError {
    /// What was being done.
    pub action: String,
    /// Docker's error.
    #[source]
    pub source: bollard::errors::Error,
}

impl DockerError {
    /// Whether Docker said the name is in use.
    pub fn is_conflict(&self) -> bool {
        matches!(
            self.source,
            bollard::errors::Error::DockerResponseServerError {
                status_code: 409,
                ..
            }
        )
    }

    /// Whether Docker said the thing does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self.source,
            bollard::errors::Error::DockerResponseServerError {
                status_code: 404,
                ..
            }
        )
    }
}

/// A session's container as Docker has it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Docker has no such container (removed behind sandboxd's back, `docker rm -f`).
    Gone,
    /// It exists and does not run.
    Stopped,
    /// It runs; its CPU time in nanoseconds, when it could be read.
    Running(Option<u64>),
}

/// One reading of a running container's stats, as Docker reports them (one-shot: no second
/// sample is waited for, so the CPU rate is worked out against the reading before).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    /// CPU time the container used, nanoseconds.
    pub cpu_total_ns: Option<u64>,
    /// CPU time the whole machine used, nanoseconds (Docker's `system_cpu_usage`).
    pub system_ns: Option<u64>,
    /// CPUs online.
    pub online_cpus: Option<u32>,
    /// Memory the container's cgroup holds, bytes.
    pub memory_bytes: Option<u64>,
    /// Its memory limit, bytes.
    pub memory_limit_bytes: Option<u64>,
    /// Processes and threads in it.
    pub pids: Option<u64>,
}

/// A container sandboxd owns, as Docker reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owned {
    /// Container id.
    pub id: String,
    /// The session label.
    pub session: String,
    /// Whether it runs.
    pub running: bool,
    /// Whether it is paused (frozen for a snapshot when its sandboxd stopped).
    pub paused: bool,
}

/// The container engine of one sandboxd instance: Docker ([`Engine::connect`]), or the no-op
/// engine of the operator bench ([`Engine::noop`]).
#[derive(Clone)]
pub struct Engine {
    backend: Arc<Backend>,
    instance: String,
}

/// The engine behind an [`Engine`], shared by its clones.
enum Backend {
    /// Docker, through bollard.
    Docker(DockerEngine),
    /// The operator bench's no-op engine.
    Noop(NoopEngine),
}

/// What sandboxd asks of whatever keeps its containers: Docker ([`DockerEngine`]) or the
/// operator bench's no-op engine (`noop`). [`Engine`] is the one face of both.
trait Containers: Send + Sync {
    /// Whether the engine answers within `timeout`.
    fn ping(&self, timeout: std::time::Duration) -> BoxFuture<'_, Result<(), String>>;
    /// Whether an image is present locally.
    fn has_image<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<bool, DockerError>>;
    /// Creates container `name` of `spec` (labelled for warm pool `pool`, if any) and starts
    /// it; a failed start removes it.
    fn create<'a>(
        &'a self,
        name: String,
        spec: &'a SandboxSpec,
        pool: Option<&'a str>,
    ) -> BoxFuture<'a, Result<String, DockerError>>;
    /// Renames a container.
    fn rename<'a>(&'a self, id: &'a str, name: &'a str) -> BoxFuture<'a, Result<(), DockerError>>;
    /// Starts a stopped container.
    fn start<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), DockerError>>;
    /// Stops a container.
    fn stop<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), DockerError>>;
    /// Removes a container; one already gone is fine.
    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), DockerError>>;
    /// Whether a container exists and runs: `None` when it does not exist.
    fn running<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<bool>, DockerError>>;
    /// The container as the engine has it now.
    fn presence<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Presence, DockerError>>;
    /// Every container of this instance.
    fn owned(&self) -> BoxFuture<'_, Result<Vec<Owned>, DockerError>>;
    /// One reading of a running container's stats; `None` for one that does not run (or an
    /// engine with nothing to report).
    fn stats<'a>(&'a self, _id: &'a str) -> BoxFuture<'a, Result<Option<Stats>, DockerError>> {
        Box::pin(async { Ok(None) })
    }
}

impl Engine {
    /// Connects through `DOCKER_HOST` (or the default socket) and negotiates the API version
    /// (Debian's docker.io speaks 1.41).
    pub async fn connect(instance: &str) -> Result<Self, DockerError> {
        Ok(Self {
            backend: Arc::new(Backend::Docker(DockerEngine::connect(instance).await?)),
            instance: instance.to_owned(),
        })
    }

    /// An engine whose containers are a no-op: an in-memory record per container (id, name,
    /// session, running) that create, start, stop, remove, `running`, `cpu_ns` and `owned`
    /// keep consistent, answering as Docker would (404 for a container it does not have, 409
    /// for a name in use); every image is present. Nothing runs: [`Engine::docker`] is an
    /// error, so a run, the in-sandbox agent and an image build fail with a message that says
    /// so instead of waiting.
    ///
    /// It exists only for the operator bench (`operator-bench --driver noop`), which runs a
    /// real sandboxd in its own process through `sandboxd::server::start_on` to measure the
    /// operator without the cost of containers. No flag, environment variable or other
    /// setting of sandboxd selects it: only Rust code calling this constructor does.
    pub fn noop(instance: &str) -> Self {
        Self {
            backend: Arc::new(Backend::Noop(NoopEngine::default())),
            instance: instance.to_owned(),
        }
    }

    /// The engine behind this one, as what every engine does.
    fn containers(&self) -> &dyn Containers {
        match &*self.backend {
            Backend::Docker(docker) => docker,
            Backend::Noop(noop) => noop,
        }
    }

    /// The Docker engine behind this one, for what only Docker does (Docker exec, image
    /// builds, the sandbox network, a container's labels and PID 1). The no-op engine has
    /// none: it answers with an error that says so.
    pub fn docker(&self) -> Result<&DockerEngine, DockerError> {
        match &*self.backend {
            Backend::Docker(docker) => Ok(docker),
            Backend::Noop(_) => Err(NoopEngine::no_client()),
        }
    }

    /// Whether this is the no-op engine of [`Engine::noop`]. Kept beside [`Engine::docker`]
    /// for the places that skip, rather than fail, what needs a real container: start-up's
    /// warning, the sandbox network, and the agent runner's look for a container's PID 1.
    pub fn is_noop(&self) -> bool {
        matches!(*self.backend, Backend::Noop(_))
    }

    /// Whether Docker answers a ping within `timeout` (the no-op engine always does). Each
    /// call opens a connection of its own when the last one broke, so after a Docker restart
    /// the first ping that answers is the reconnection.
    pub async fn ping(&self, timeout: std::time::Duration) -> Result<(), String> {
        self.containers().ping(timeout).await
    }

    /// The instance it belongs to.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The container name of a session.
    pub fn container_name(&self, session: &str) -> String {
        format!("sandboxd-{}-{session}", self.instance)
    }

    /// Whether an image is present locally.
    pub async fn has_image(&self, image: &str) -> Result<bool, DockerError> {
        self.containers().has_image(image).await
    }

    /// Creates and starts a sandbox container; returns its id. A failed start removes it.
    pub async fn create(&self, spec: &SandboxSpec) -> Result<String, DockerError> {
        self.create_labelled(spec, None).await
    }

    /// [`Engine::create`] for the warm pool of runtime `pool`: the same container, labelled
    /// with [`docker::LABEL_POOL`].
    pub async fn create_pooled(
        &self,
        spec: &SandboxSpec,
        pool: &str,
    ) -> Result<String, DockerError> {
        self.create_labelled(spec, Some(pool)).await
    }

    /// Renames a container (a pooled one, to the name of the session that took it).
    pub async fn rename(&self, id: &str, name: &str) -> Result<(), DockerError> {
        self.containers().rename(id, name).await
    }

    async fn create_labelled(
        &self,
        spec: &SandboxSpec,
        pool: Option<&str>,
    ) -> Result<String, DockerError> {
        self.containers()
            .create(self.container_name(&spec.session), spec, pool)
            .await
    }

    /// Starts a stopped container.
    pub async fn start(&self, id: &str) -> Result<(), DockerError> {
        self.containers().start(id).await
    }

    /// Stops a container (SIGTERM, then SIGKILL after 5 s).
    pub async fn stop(&self, id: &str) -> Result<(), DockerError> {
        self.containers().stop(id).await
    }

    /// Removes a container, running or not; a container already gone is fine.
    pub async fn remove(&self, id: &str) -> Result<(), DockerError> {
        self.containers().remove(id).await
    }

    /// Whether a container exists and runs: `None` when it does not exist.
    pub async fn running(&self, id: &str) -> Result<Option<bool>, DockerError> {
        self.containers().running(id).await
    }

    /// CPU time the container has used, in nanoseconds, when it runs.
    pub async fn cpu_ns(&self, id: &str) -> Result<Option<u64>, DockerError> {
        Ok(match self.presence(id).await? {
            Presence::Running(ns) => ns,
            Presence::Stopped | Presence::Gone => None,
        })
    }

    /// The container as Docker has it now: gone, stopped, or running with its CPU time.
    pub async fn presence(&self, id: &str) -> Result<Presence, DockerError> {
        self.containers().presence(id).await
    }

    /// Every container this instance owns.
    pub async fn owned(&self) -> Result<Vec<Owned>, DockerError> {
        self.containers().owned().await
    }

    /// One reading of a running container's stats (Docker's one-shot stats); `None` when it
    /// does not run.
    pub async fn stats(&self, id: &str) -> Result<Option<Stats>, DockerError> {
        self.containers().stats(id).await
    }
}
