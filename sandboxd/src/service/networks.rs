//! Sandboxes follow their runtime's egress mode without a restart: after the allowlist
//! changes (`PUT /v1/runtimes`, the operator's hand-out) and at start, every container of this
//! instance whose runtime now wants another network — none, the egress network of an
//! `allowlist` runtime, the open sandbox network — is moved there with Docker's network
//! disconnect and connect, the old network first, so a sandbox is never on two at once. Its
//! processes, workspace and agent go on; connections it had through the old network end.

use std::collections::HashMap;

use bollard::models::NetworkConnectRequest;
use bollard::query_parameters::ListContainersOptionsBuilder;
use sandboxd_catalog::egress::EgressMode;
use tracing::{info, warn};

use super::*;
use crate::container::docker::{LABEL_INSTANCE, LABEL_POOL, LABEL_SESSION};

/// Docker's network of a container without network.
const NONE: &str = "none";

/// One container on the wrong network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Move {
    /// The container.
    pub id: String,
    /// What it is (its session, or its warm pool's name).
    pub name: String,
    /// The networks it is on.
    pub from: Vec<String>,
    /// The network its runtime wants.
    pub to: String,
}

/// What has to move: each container whose networks are not exactly the one `wanted` names
/// for it (`None`: leave it, its runtime is gone or unknown).
pub(crate) fn moves(
    containers: &[(String, String, Vec<String>)],
    wanted: impl Fn(&str) -> Option<String>,
) -> Vec<Move> {
    containers
        .iter()
        .filter_map(|(id, name, on)| {
            let to = wanted(name)?;
            (on.as_slice() != std::slice::from_ref(&to)).then(|| Move {
                id: id.clone(),
                name: name.clone(),
                from: on.clone(),
                to,
            })
        })
        .collect()
}

/// The narrowest of two modes: none, then allowlist, then open.
pub(crate) fn narrowest(a: EgressMode, b: EgressMode) -> EgressMode {
    let rank = |m: EgressMode| match m {
        EgressMode::None => 0,
        EgressMode::Allowlist => 1,
        EgressMode::Open => 2,
    };
    if rank(a) <= rank(b) { a } else { b }
}

impl Core {
    /// The mode a sandbox of a runtime of `runtime_mode` runs in: the narrowest of its
    /// runtime's and of every further policy session `session`'s open named. A session of an
    /// `open` runtime that narrows to an allowlist is put on the egress network, where its
    /// policies are enforced.
    pub(crate) fn mode_of(&self, runtime_mode: EgressMode, session: &str) -> EgressMode {
        let extra = self
            .egress
            .as_ref()
            .and_then(|e| e.gate.extra_of(session))
            .unwrap_or_default();
        extra.iter().fold(runtime_mode, |m, p| narrowest(m, p.mode))
    }

    /// The network a sandbox of `runtime` (session or warm container `name`) belongs on now
    /// (made when it is not yet); `None` when the runtime is not allowlisted.
    async fn network_for(&self, runtime: &str, name: &str) -> Option<Result<String, ServiceError>> {
        let mode = self.mode_of(self.runtimes.egress_of(runtime)?.mode, name);
        let unavailable = |source| ServiceError::NetworkUnavailable {
            runtime: runtime.to_owned(),
            source,
        };
        Some(match mode {
            EgressMode::None => Ok(NONE.to_owned()),
            EgressMode::Allowlist => match &self.egress {
                Some(e) => e.ensure().await.map_err(unavailable),
                None => return None,
            },
            EgressMode::Open => match &self.network {
                Some(n) => n.ensure().await.map_err(unavailable),
                None => return None,
            },
        })
    }

    /// Moves every container of this instance to the network its runtime wants now; returns
    /// how many moved. A container that cannot move is logged and left (its next rebuild or
    /// reclaim makes it on the right one).
    pub async fn follow_egress_modes(&self) -> usize {
        let Ok(docker) = self.engine.docker() else {
            return 0;
        };
        let docker = docker.client();
        let filters = HashMap::from([(
            "label".to_owned(),
            vec![format!("{LABEL_INSTANCE}={}", self.engine.instance())],
        )]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let list = match docker.list_containers(Some(options)).await {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %e, "cannot list the sandboxes to move them to their runtime's network");
                return 0;
            }
        };
        let mut runtime_of = HashMap::new();
        let mut containers = Vec::new();
        for c in list {
            let labels = c.labels.unwrap_or_default();
            let (Some(id), Some(name)) = (c.id, labels.get(LABEL_SESSION).cloned()) else {
                continue;
            };
            let runtime = match labels.get(LABEL_POOL) {
                Some(pool) => Some(pool.clone()),
                None => self
                    .store
                    .get(&name)
                    .await
                    .ok()
                    .flatten()
                    .map(|r| r.runtime),
            };
            let Some(runtime) = runtime else { continue };
            let on: Vec<String> = c
                .network_settings
                .and_then(|n| n.networks)
                .map(|n| n.into_keys().collect())
                .unwrap_or_default();
            runtime_of.insert(name.clone(), runtime);
            containers.push((id, name, on));
        }
        let mut wanted = HashMap::new();
        for (name, runtime) in &runtime_of {
            match self.network_for(runtime, name).await {
                Some(Ok(net)) => {
                    wanted.insert(name.clone(), net);
                }
                Some(Err(e)) => {
                    warn!(%runtime, sandbox = %name, error = %e, "the network of the sandbox's egress mode cannot be set up; it stays where it is")
                }
                None => {}
            }
        }
        let moves = moves(&containers, |name| wanted.get(name).cloned());
        let mut moved = 0;
        for m in moves {
            let mut done = true;
            for from in &m.from {
                if let Err(e) = docker
                    .disconnect_network(
                        from,
                        bollard::models::NetworkDisconnectRequest {
                            container: m.id.clone(),
                            force: Some(true),
                        },
                    )
                    .await
                {
                    warn!(sandbox = %m.name, network = %from, error = %e, "cannot take the sandbox off its network");
                    done = false;
                }
            }
            if !done {
                continue;
            }
            let connect = NetworkConnectRequest {
                container: m.id.clone(),
                ..Default::default()
            };
            match docker.connect_network(&m.to, connect).await {
                Ok(()) => {
                    info!(sandbox = %m.name, from = ?m.from, to = %m.to, "sandbox moved to its runtime's network");
                    moved += 1;
                }
                Err(e) => {
                    warn!(sandbox = %m.name, network = %m.to, error = %e, "cannot put the sandbox on its runtime's network; it has none until it is rebuilt or reclaimed")
                }
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_moves_only_when_it_is_not_exactly_on_its_runtimes_network() {
        let c = |id: &str, name: &str, on: &[&str]| {
            (
                id.to_owned(),
                name.to_owned(),
                on.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(),
            )
        };
        let containers = [
            c("1", "stays", &["sandboxd-x-egress"]),
            c("2", "to-none", &["sandboxd-x-egress"]),
            c("3", "to-egress", &["none"]),
            c("4", "unknown", &["none"]),
            c("5", "two", &["none", "sandboxd-x-net"]),
        ];
        let wanted = |name: &str| match name {
            "stays" | "to-egress" => Some("sandboxd-x-egress".to_owned()),
            "to-none" => Some("none".to_owned()),
            "two" => Some("sandboxd-x-net".to_owned()),
            _ => None,
        };
        let found = moves(&containers, wanted);
        let names: Vec<(&str, &str)> = found
            .iter()
            .map(|m| (m.name.as_str(), m.to.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("to-none", "none"),
                ("to-egress", "sandboxd-x-egress"),
                ("two", "sandboxd-x-net")
            ]
        );
        assert_eq!(
            found[2].from,
            ["none", "sandboxd-x-net"],
            "every network it is on is left"
        );
    }
}
