//! The Docker engine (bollard): sandbox containers as siblings of sandboxd, with every
//! isolation setting, labelled with the sandboxd and session that own them. [`DockerEngine`]
//! does what the seam ([`super::Engine`]) asks of an engine, and lends its bollard client
//! ([`DockerEngine::client`]) to what only Docker does: Docker exec, image builds, the sandbox
//! network. It knows nothing of the operator bench's no-op engine beside it.

use std::collections::HashMap;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder, StatsOptionsBuilder, StopContainerOptionsBuilder,
};
use futures::StreamExt;
use futures::future::BoxFuture;

use super::{Containers, DockerError, Owned, Presence, SandboxSpec, Stats, WORKSPACE_MOUNT};

/// Label: which software manages the container.
pub const LABEL_MANAGED: &str = "sandboxd.dev/managed-by";
/// Label: which sandboxd instance owns the container.
pub const LABEL_INSTANCE: &str = "sandboxd.dev/instance";
/// Label: the session id.
pub const LABEL_SESSION: &str = "sandboxd.dev/session";
/// Label: the tenant.
pub const LABEL_TENANT: &str = "sandboxd.dev/tenant";
/// Label: the runtime whose warm pool started the container (it keeps it once a session took
/// it; its session label stays the pool's name for it).
pub const LABEL_POOL: &str = "sandboxd.dev/warm-pool";
/// Label on a container whose PID 1 is the agent: the newest protocol of the sandboxd that
/// made it.
pub const LABEL_AGENT: &str = "sandboxd.dev/agent";

/// The container's PID-2 process: waits forever and exits on TERM. POSIX sh, so any image works.
const KEEPALIVE: &str = "trap 'exit 0' TERM INT; while :; do sleep 86400 & wait $!; done";

/// The home folder a sandbox needs a writable mount at: the last `HOME` of `env`, unless it
/// is /tmp or in the workspace, which are writable already.
fn home_mount(env: &[String]) -> Option<String> {
    let home = env.iter().rev().find_map(|e| e.strip_prefix("HOME="))?;
    let home = home.trim_end_matches('/');
    let writable = home.is_empty()
        || home == "/tmp"
        || home.starts_with("/tmp/")
        || home == WORKSPACE_MOUNT
        || home.starts_with(&format!("{WORKSPACE_MOUNT}/"))
        || !home.starts_with('/');
    (!writable).then(|| home.to_owned())
}

fn err(action: impl Into<String>) -> impl FnOnce(bollard::errors::Error) -> DockerError {
    let action = action.into();
    move |source| DockerError { action, source }
}

/// Docker, through bollard: the production engine.
pub struct DockerEngine {
    docker: Docker,
    instance: String,
}

impl DockerEngine {
    /// Connects through `DOCKER_HOST` (or the default socket) and negotiates the API version
    /// (Debian's docker.io speaks 1.41).
    pub(super) async fn connect(instance: &str) -> Result<Self, DockerError> {
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

    /// The bollard client, for what only Docker does: Docker exec (the run path), image
    /// builds, the sandbox network, a container's labels and PID 1.
    pub fn client(&self) -> &Docker {
        &self.docker
    }

    /// Freezes every process of running container `id` (Docker's pause: the cgroup freezer,
    /// or gVisor's own), so that its files hold still while they are read.
    pub async fn freeze(&self, id: &str) -> Result<(), DockerError> {
        self.docker
            .pause_container(id)
            .await
            .map_err(|source| DockerError {
                action: format!("pause container {id}"),
                source,
            })
    }

    /// Lets the processes of container `id` go on after [`DockerEngine::freeze`].
    pub async fn thaw(&self, id: &str) -> Result<(), DockerError> {
        self.docker
            .unpause_container(id)
            .await
            .map_err(|source| DockerError {
                action: format!("unpause container {id}"),
                source,
            })
    }
}

impl Containers for DockerEngine {
    fn ping(&self, timeout: std::time::Duration) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            match tokio::time::timeout(timeout, self.docker.ping()).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!(
                    "no answer to a ping within {} s",
                    timeout.as_secs()
                )),
            }
        })
    }

    fn has_image<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<bool, DockerError>> {
        Box::pin(async move {
            let docker = &self.docker;
            match docker.inspect_image(image).await {
                Ok(_) => Ok(true),
                Err(e) => {
                    let e = DockerError {
                        action: format!("inspect image {image}"),
                        source: e,
                    };
                    if e.is_not_found() { Ok(false) } else { Err(e) }
                }
            }
        })
    }

    fn rename<'a>(&'a self, id: &'a str, name: &'a str) -> BoxFuture<'a, Result<(), DockerError>> {
        Box::pin(async move {
            let docker = &self.docker;
            let options = bollard::query_parameters::RenameContainerOptionsBuilder::default()
                .name(name)
                .build();
            docker
                .rename_container(id, options)
                .await
                .map_err(err(format!("rename container {id} to {name}")))
        })
    }

    fn create<'a>(
        &'a self,
        name: String,
        spec: &'a SandboxSpec,
        pool: Option<&'a str>,
    ) -> BoxFuture<'a, Result<String, DockerError>> {
        Box::pin(async move {
            let docker = &self.docker;
            let mut labels = HashMap::from([
                (LABEL_MANAGED.to_owned(), "sandboxd".to_owned()),
                (LABEL_INSTANCE.to_owned(), self.instance.clone()),
                (LABEL_SESSION.to_owned(), spec.session.clone()),
                (LABEL_TENANT.to_owned(), spec.tenant.clone()),
            ]);
            if let Some(pool) = pool {
                labels.insert(LABEL_POOL.to_owned(), pool.to_owned());
            }
            let mut binds = vec![format!("{}:{WORKSPACE_MOUNT}:rw", spec.workspace)];
            // With the agent, it is PID 1 (it reaps and forwards signals, Docker's init's job) and
            // the entrypoint, whatever the image says; its binary comes read-only from the host.
            let (entrypoint, cmd) = match &spec.agent {
                Some(agent) => {
                    use sandbox_agent::proto::{BIN_DIR, BINARY_NAME, RUN_DIR, SOCKET_NAME};
                    labels.insert(LABEL_AGENT.to_owned(), agent.protocol.to_string());
                    binds.push(format!("{}:{BIN_DIR}:ro", agent.bin_dir));
                    binds.push(format!("{}:{RUN_DIR}:rw", agent.run_dir));
                    (
                        Some(vec![format!("{BIN_DIR}/{BINARY_NAME}")]),
                        vec![
                            "--session".to_owned(),
                            spec.session.clone(),
                            "--socket".to_owned(),
                            format!("{RUN_DIR}/{SOCKET_NAME}"),
                            "--user".to_owned(),
                            format!("{0}:{0}", spec.uid),
                        ],
                    )
                }
                None => (None, vec!["/bin/sh".into(), "-c".into(), KEEPALIVE.into()]),
            };
            // The agent starts as root, with only what it needs to bind its socket in the
            // root-owned run folder and drop to the sandbox uid for good (it empties the bounding
            // set first): nothing of the sandbox runs as the sandbox's code with root or a
            // capability. A gVisor sandbox's agent keeps one helper as uid 0 with no capability,
            // which only binds the socket again after a restore (`sandbox_agent::pause`).
            let (user, cap_add) = match &spec.agent {
                Some(_) => (
                    "0:0".to_owned(),
                    Some(vec![
                        "SETUID".to_owned(),
                        "SETGID".to_owned(),
                        "SETPCAP".to_owned(),
                    ]),
                ),
                None => (format!("{0}:{0}", spec.uid), None),
            };
            // The image's root is read-only: a sandbox writes only to its workspace (a disk of its
            // own size), /tmp and its home (tmpfs of SANDBOXD_TMPFS_SIZE and SANDBOXD_HOME_SIZE,
            // in its memory), so it cannot fill the node's disk through the container's writable
            // layer.
            let mut env = vec!["HOME=/tmp".to_owned()];
            env.extend(spec.env.iter().cloned());
            // The node's egress CA and the trust bundle holding it, read-only; the key stays
            // with sandboxd.
            if let Some(trust) = &spec.trust {
                binds.extend(trust.binds());
            }
            if let Some(resolv) = &spec.resolv_conf {
                binds.push(format!("{resolv}:/etc/resolv.conf:ro"));
            }
            let mut tmpfs = HashMap::from([(
                "/tmp".to_owned(),
                format!("rw,nosuid,nodev,size={},mode=1777", spec.tmpfs_size),
            )]);
            if let Some(home) = home_mount(&env) {
                tmpfs.insert(
                    home,
                    format!(
                        "rw,nosuid,nodev,size={},mode=0700,uid={1},gid={1}",
                        spec.home_size, spec.uid
                    ),
                );
            }
            let host = HostConfig {
                binds: Some(binds),
                readonly_rootfs: Some(true),
                // What PID 1 prints goes to the node's disk too: bounded.
                log_config: Some(HostConfigLogConfig {
                    typ: Some("json-file".to_owned()),
                    config: Some(HashMap::from([
                        ("max-size".to_owned(), "1m".to_owned()),
                        ("max-file".to_owned(), "1".to_owned()),
                    ])),
                }),
                init: Some(spec.agent.is_none()),
                privileged: Some(false),
                cap_drop: Some(vec!["ALL".to_owned()]),
                cap_add,
                security_opt: Some(vec!["no-new-privileges:true".to_owned()]),
                nano_cpus: Some((spec.cpus * 1e9) as i64),
                memory: Some(spec.memory),
                memory_swap: Some(spec.memory),
                pids_limit: Some(spec.pids_limit),
                tmpfs: Some(tmpfs),
                network_mode: Some(spec.network_mode.clone()),
                runtime: spec.oci_runtime.clone(),
                ..Default::default()
            };
            let body = ContainerCreateBody {
                image: Some(spec.image.clone()),
                entrypoint,
                cmd: Some(cmd),
                user: Some(user),
                working_dir: Some(WORKSPACE_MOUNT.to_owned()),
                env: Some(env),
                labels: Some(labels),
                host_config: Some(host),
                ..Default::default()
            };
            let options = CreateContainerOptionsBuilder::default().name(&name).build();
            let created = docker
                .create_container(Some(options), body)
                .await
                .map_err(err(format!("create container {name}")))?;
            if let Err(e) = self.start(&created.id).await {
                let _ = self.remove(&created.id).await;
                return Err(e);
            }
            Ok(created.id)
        })
    }

    fn start<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), DockerError>> {
        Box::pin(async move {
            let docker = &self.docker;
            docker
                .start_container(id, None)
                .await
                .map_err(err(format!("start container {id}")))
        })
    }

    fn stop<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), DockerError>> {
        Box::pin(async move {
            let docker = &self.docker;
            let options = StopContainerOptionsBuilder::default().t(5).build();
            match docker.stop_container(id, Some(options)).await {
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
        })
    }

    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), DockerError>> {
        Box::pin(async move {
            let docker = &self.docker;
            let options = RemoveContainerOptionsBuilder::default()
                .force(true)
                .v(true)
                .build();
            match docker.remove_container(id, Some(options)).await {
                Ok(()) => Ok(()),
                Err(e) => {
                    let e = DockerError {
                        action: format!("remove container {id}"),
                        source: e,
                    };
                    if e.is_not_found() { Ok(()) } else { Err(e) }
                }
            }
        })
    }

    fn running<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<bool>, DockerError>> {
        Box::pin(async move {
            let docker = &self.docker;
            match docker
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
        })
    }

    fn presence<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Presence, DockerError>> {
        Box::pin(async move {
            let docker = &self.docker;
            // The container's cgroup read off the node's cgroup filesystem (a few microseconds);
            // Docker's one-shot stats wait for its next sample (up to a second) once any stats
            // subscriber is active, so they are only the fallback (a sandboxd in a cgroup
            // namespace of its own, where the node's cgroup filesystem is not in view).
            let state = match docker
                .inspect_container(id, None::<InspectContainerOptions>)
                .await
            {
                Ok(c) => c.state,
                Err(e) => {
                    let e = DockerError {
                        action: format!("inspect container {id}"),
                        source: e,
                    };
                    return if e.is_not_found() {
                        Ok(Presence::Gone)
                    } else {
                        Err(e)
                    };
                }
            };
            if !state.as_ref().and_then(|s| s.running).unwrap_or(false) {
                return Ok(Presence::Stopped);
            }
            let pid = state.and_then(|s| s.pid).filter(|p| *p > 0);
            if let Some(ns) = pid.and_then(cgroup_cpu_ns) {
                return Ok(Presence::Running(Some(ns)));
            }
            let options = StatsOptionsBuilder::default()
                .stream(false)
                .one_shot(true)
                .build();
            let mut stream = docker.stats(id, Some(options));
            match stream.next().await {
                Some(Ok(stats)) => Ok(Presence::Running(
                    stats
                        .cpu_stats
                        .and_then(|c| c.cpu_usage)
                        .and_then(|u| u.total_usage),
                )),
                Some(Err(e)) => {
                    let e = DockerError {
                        action: format!("read stats of {id}"),
                        source: e,
                    };
                    if e.is_not_found() {
                        Ok(Presence::Gone)
                    } else {
                        Err(e)
                    }
                }
                None => Ok(Presence::Running(None)),
            }
        })
    }

    fn stats<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Stats>, DockerError>> {
        Box::pin(async move {
            let options = StatsOptionsBuilder::default()
                .stream(false)
                .one_shot(true)
                .build();
            let mut stream = self.docker.stats(id, Some(options));
            match stream.next().await {
                Some(Ok(s)) => {
                    let cpu = s.cpu_stats.as_ref();
                    let memory = s.memory_stats.as_ref();
                    // A stopped container answers with empty stats: no PID 1, no processes.
                    let pids = s.pids_stats.as_ref().and_then(|p| p.current);
                    if pids.unwrap_or(0) == 0 && memory.and_then(|m| m.usage).unwrap_or(0) == 0 {
                        return Ok(None);
                    }
                    Ok(Some(Stats {
                        cpu_total_ns: cpu
                            .and_then(|c| c.cpu_usage.as_ref())
                            .and_then(|u| u.total_usage),
                        system_ns: cpu.and_then(|c| c.system_cpu_usage),
                        online_cpus: cpu.and_then(|c| c.online_cpus),
                        memory_bytes: memory.and_then(|m| m.usage),
                        memory_limit_bytes: memory.and_then(|m| m.limit),
                        pids,
                    }))
                }
                Some(Err(e)) => {
                    let e = DockerError {
                        action: format!("read stats of {id}"),
                        source: e,
                    };
                    if e.is_not_found() { Ok(None) } else { Err(e) }
                }
                None => Ok(None),
            }
        })
    }

    fn owned(&self) -> BoxFuture<'_, Result<Vec<Owned>, DockerError>> {
        Box::pin(async move {
            let docker = &self.docker;
            let filters = HashMap::from([(
                "label".to_owned(),
                vec![format!("{LABEL_INSTANCE}={}", self.instance)],
            )]);
            let options = ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build();
            let list = docker
                .list_containers(Some(options))
                .await
                .map_err(err("list containers"))?;
            Ok(list
                .into_iter()
                .filter_map(|c| {
                    let session = c.labels.as_ref()?.get(LABEL_SESSION)?.clone();
                    let state = c.state.map(|s| s.to_string()).unwrap_or_default();
                    Some(Owned {
                        id: c.id?,
                        session,
                        running: state == "running",
                        paused: state == "paused",
                    })
                })
                .collect())
        })
    }
}

/// CPU time in nanoseconds of the cgroup that process `pid` (a host pid: a container's PID 1)
/// is in, read off the node's cgroup filesystem: `cpuacct.usage` on cgroup v1, `usage_usec` of
/// `cpu.stat` on v2. `None` when it is not in view (another cgroup namespace, no such files).
fn cgroup_cpu_ns(pid: i64) -> Option<u64> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let entries: Vec<(&str, &str)> = cgroups
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            // A path of another cgroup namespace's view cannot be found from here.
            (path.starts_with('/') && !path.contains("..")).then_some((controllers, path))
        })
        .collect();
    if let Some((controllers, path)) = entries
        .iter()
        .find(|(c, _)| c.split(',').any(|c| c == "cpuacct"))
    {
        return [*controllers, "cpuacct", "cpu,cpuacct"]
            .iter()
            .find_map(|mount| {
                std::fs::read_to_string(format!("/sys/fs/cgroup/{mount}{path}/cpuacct.usage")).ok()
            })
            .and_then(|v| v.trim().parse().ok());
    }
    let (_, path) = entries.iter().find(|(c, _)| c.is_empty())?;
    let stat = std::fs::read_to_string(format!("/sys/fs/cgroup{path}/cpu.stat")).ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|usec| usec.saturating_mul(1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_home_outside_tmp_and_the_workspace_gets_a_mount() {
        let env = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(home_mount(&env(&["HOME=/tmp"])), None);
        assert_eq!(
            home_mount(&env(&["HOME=/tmp", "HOME=/home/sandbox/"])),
            Some("/home/sandbox".to_owned())
        );
        assert_eq!(home_mount(&env(&["HOME=/workspace/me"])), None);
        assert_eq!(home_mount(&env(&["HOME=/"])), None);
        assert_eq!(home_mount(&env(&["PATH=/bin"])), None);
    }
}
