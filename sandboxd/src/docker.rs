//! The Docker edge (bollard): sandbox containers as siblings of sandboxd, with every isolation
//! setting, labelled with the sandboxd and session that own them.

use std::collections::HashMap;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder, StatsOptionsBuilder, StopContainerOptionsBuilder,
};
use futures::StreamExt;

/// Label: which software manages the container.
pub const LABEL_MANAGED: &str = "sandboxd.dev/managed-by";
/// Label: which sandboxd instance owns the container.
pub const LABEL_INSTANCE: &str = "sandboxd.dev/instance";
/// Label: the session id.
pub const LABEL_SESSION: &str = "sandboxd.dev/session";
/// Label: the tenant.
pub const LABEL_TENANT: &str = "sandboxd.dev/tenant";

/// Where the workspace appears inside a sandbox.
pub const WORKSPACE_MOUNT: &str = "/workspace";

/// The container's PID-2 process: waits forever and exits on TERM. POSIX sh, so any image works.
const KEEPALIVE: &str = "trap 'exit 0' TERM INT; while :; do sleep 86400 & wait $!; done";

/// How a sandbox runs the resident agent as its PID 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentMount {
    /// Host folder holding the agent binary, mounted read-only.
    pub bin_dir: String,
    /// Host folder of the session's socket (outside the workspace), mounted read-write.
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
    /// OCI runtime, if not Docker's default.
    pub oci_runtime: Option<String>,
    /// Environment.
    pub env: Vec<String>,
    /// The resident agent as PID 1; `None`: Docker's init, and runs through Docker exec.
    pub agent: Option<AgentMount>,
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

fn err(action: impl Into<String>) -> impl FnOnce(bollard::errors::Error) -> DockerError {
    let action = action.into();
    move |source| DockerError { action, source }
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
}

/// The Docker client of one sandboxd instance.
#[derive(Clone)]
pub struct Engine {
    docker: Docker,
    instance: String,
}

impl Engine {
    /// Connects through `DOCKER_HOST` (or the default socket) and negotiates the API version
    /// (Debian's docker.io speaks 1.41).
    pub async fn connect(instance: &str) -> Result<Self, DockerError> {
        let docker = Docker::connect_with_defaults().map_err(err("connect"))?;
        let docker = docker
            .negotiate_version()
            .await
            .map_err(err("negotiate the API version"))?;
        Ok(Self {
            docker,
            instance: instance.to_owned(),
        })
    }

    /// The raw client, for the run path.
    pub fn client(&self) -> &Docker {
        &self.docker
    }

    /// The container name of a session.
    pub fn container_name(&self, session: &str) -> String {
        format!("sandboxd-{}-{session}", self.instance)
    }

    /// Whether an image is present locally.
    pub async fn has_image(&self, image: &str) -> Result<bool, DockerError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(e) => {
                let e = DockerError {
                    action: format!("inspect image {image}"),
                    source: e,
                };
                if e.is_not_found() { Ok(false) } else { Err(e) }
            }
        }
    }

    /// Creates and starts a sandbox container; returns its id. A failed start removes it.
    pub async fn create(&self, spec: &SandboxSpec) -> Result<String, DockerError> {
        let mut labels = HashMap::from([
            (LABEL_MANAGED.to_owned(), "sandboxd".to_owned()),
            (LABEL_INSTANCE.to_owned(), self.instance.clone()),
            (LABEL_SESSION.to_owned(), spec.session.clone()),
            (LABEL_TENANT.to_owned(), spec.tenant.clone()),
        ]);
        let mut binds = vec![format!("{}:{WORKSPACE_MOUNT}:rw", spec.workspace)];
        // With the agent, it is PID 1 (it reaps and forwards signals, Docker's init's job) and
        // the entrypoint, whatever the image says; its binary comes read-only from the host.
        let (entrypoint, cmd) = match &spec.agent {
            Some(agent) => {
                use sandbox_agent::proto::{BIN_DIR, BINARY_NAME, RUN_DIR, SOCKET_NAME};
                labels.insert(
                    crate::agent_runner::LABEL_AGENT.to_owned(),
                    agent.protocol.to_string(),
                );
                binds.push(format!("{}:{BIN_DIR}:ro", agent.bin_dir));
                binds.push(format!("{}:{RUN_DIR}:rw", agent.run_dir));
                (
                    Some(vec![format!("{BIN_DIR}/{BINARY_NAME}")]),
                    vec![
                        "--session".to_owned(),
                        spec.session.clone(),
                        "--socket".to_owned(),
                        format!("{RUN_DIR}/{SOCKET_NAME}"),
                    ],
                )
            }
            None => (None, vec!["/bin/sh".into(), "-c".into(), KEEPALIVE.into()]),
        };
        let host = HostConfig {
            binds: Some(binds),
            init: Some(spec.agent.is_none()),
            privileged: Some(false),
            cap_drop: Some(vec!["ALL".to_owned()]),
            security_opt: Some(vec!["no-new-privileges:true".to_owned()]),
            nano_cpus: Some((spec.cpus * 1e9) as i64),
            memory: Some(spec.memory),
            memory_swap: Some(spec.memory),
            pids_limit: Some(spec.pids_limit),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_owned(),
                format!("rw,nosuid,nodev,size={},mode=1777", spec.tmpfs_size),
            )])),
            network_mode: Some(spec.network_mode.clone()),
            runtime: spec.oci_runtime.clone(),
            ..Default::default()
        };
        let mut env = vec!["HOME=/tmp".to_owned()];
        env.extend(spec.env.iter().cloned());
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            entrypoint,
            cmd: Some(cmd),
            user: Some(format!("{0}:{0}", spec.uid)),
            working_dir: Some(WORKSPACE_MOUNT.to_owned()),
            env: Some(env),
            labels: Some(labels),
            network_disabled: Some(spec.network_mode == "none"),
            host_config: Some(host),
            ..Default::default()
        };
        let name = self.container_name(&spec.session);
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        let created = self
            .docker
            .create_container(Some(options), body)
            .await
            .map_err(err(format!("create container {name}")))?;
        if let Err(e) = self.start(&created.id).await {
            let _ = self.remove(&created.id).await;
            return Err(e);
        }
        Ok(created.id)
    }

    /// Starts a stopped container.
    pub async fn start(&self, id: &str) -> Result<(), DockerError> {
        self.docker
            .start_container(id, None)
            .await
            .map_err(err(format!("start container {id}")))
    }

    /// Stops a container (SIGTERM, then SIGKILL after 5 s).
    pub async fn stop(&self, id: &str) -> Result<(), DockerError> {
        let options = StopContainerOptionsBuilder::default().t(5).build();
        match self.docker.stop_container(id, Some(options)).await {
            Ok(()) => Ok(()),
            // 304: already stopped.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 304, ..
            }) => Ok(()),
            Err(e) => Err(DockerError {
                action: format!("stop container {id}"),
                source: e,
            }),
        }
    }

    /// Removes a container, running or not; a container already gone is fine.
    pub async fn remove(&self, id: &str) -> Result<(), DockerError> {
        let options = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match self.docker.remove_container(id, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) => {
                let e = DockerError {
                    action: format!("remove container {id}"),
                    source: e,
                };
                if e.is_not_found() { Ok(()) } else { Err(e) }
            }
        }
    }

    /// Whether a container exists and runs: `None` when it does not exist.
    pub async fn running(&self, id: &str) -> Result<Option<bool>, DockerError> {
        match self
            .docker
            .inspect_container(id, None::<InspectContainerOptions>)
            .await
        {
            Ok(c) => Ok(Some(c.state.and_then(|s| s.running).unwrap_or(false))),
            Err(e) => {
                let e = DockerError {
                    action: format!("inspect container {id}"),
                    source: e,
                };
                if e.is_not_found() { Ok(None) } else { Err(e) }
            }
        }
    }

    /// CPU time the container has used, in nanoseconds, when it runs.
    pub async fn cpu_ns(&self, id: &str) -> Result<Option<u64>, DockerError> {
        let options = StatsOptionsBuilder::default()
            .stream(false)
            .one_shot(true)
            .build();
        let mut stream = self.docker.stats(id, Some(options));
        match stream.next().await {
            Some(Ok(stats)) => Ok(stats
                .cpu_stats
                .and_then(|c| c.cpu_usage)
                .and_then(|u| u.total_usage)),
            Some(Err(e)) => {
                let e = DockerError {
                    action: format!("read stats of {id}"),
                    source: e,
                };
                if e.is_not_found() { Ok(None) } else { Err(e) }
            }
            None => Ok(None),
        }
    }

    /// Every container this instance owns.
    pub async fn owned(&self) -> Result<Vec<Owned>, DockerError> {
        let filters = HashMap::from([(
            "label".to_owned(),
            vec![format!("{LABEL_INSTANCE}={}", self.instance)],
        )]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let list = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(err("list containers"))?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                let session = c.labels.as_ref()?.get(LABEL_SESSION)?.clone();
                let running = c.state.map(|s| s.to_string() == "running").unwrap_or(false);
                Some(Owned {
                    id: c.id?,
                    session,
                    running,
                })
            })
            .collect())
    }
}
