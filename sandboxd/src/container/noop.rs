//! The no-op engine of the operator bench: an in-memory record per container (id, name,
//! session, running) that create, start, stop, remove, `running`, `presence` and `owned` keep
//! consistent, answering as Docker would (404 for a container it does not have, 409 for a name
//! in use); every image is present. Nothing runs: it has no Docker client, so a run, the
//! in-sandbox agent and an image build fail with a message that says so instead of waiting.
//!
//! It exists only for the operator bench (`operator-bench --driver noop`): it is one of the
//! two engines behind the seam's `Containers` trait, chosen only by [`super::Engine::noop`],
//! and knows nothing of the Docker engine beside it.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use futures::future::BoxFuture;

use super::{Containers, DockerError, Owned, Presence, SandboxSpec};

/// What the no-op engine answers where a real container or Docker itself is needed.
const NOOP_REFUSAL: &str = "this sandboxd runs on the no-op engine of the operator bench: it has no Docker, and nothing runs in its containers (no runs, no agent, no image builds)";

/// The containers of the no-op engine: container id to its record, shared by every clone of
/// the engine.
#[derive(Debug, Default)]
pub(super) struct NoopEngine {
    containers: Mutex<HashMap<String, NoopContainer>>,
}

/// What the no-op engine keeps of a container: nothing runs.
#[derive(Debug, Clone)]
struct NoopContainer {
    name: String,
    session: String,
    running: bool,
}

/// An error as Docker answers it, from the no-op engine.
fn answer(action: String, status_code: u16, message: String) -> DockerError {
    DockerError {
        action,
        source: bollard::errors::Error::DockerResponseServerError {
            status_code,
            message,
        },
    }
}

/// The id of the no-op container `id_or_name` names (Docker takes either).
fn find(map: &HashMap<String, NoopContainer>, id_or_name: &str) -> Option<String> {
    if map.contains_key(id_or_name) {
        return Some(id_or_name.to_owned());
    }
    map.iter()
        .find(|(_, c)| c.name == id_or_name)
        .map(|(id, _)| id.clone())
}

impl NoopEngine {
    /// The answer where the Docker engine is asked for ([`super::Engine::docker`]): there is
    /// none.
    pub(super) fn no_client() -> DockerError {
        DockerError {
            action: "be reached".to_owned(),
            source: bollard::errors::Error::IOError {
                err: std::io::Error::new(std::io::ErrorKind::Unsupported, NOOP_REFUSAL),
            },
        }
    }

    /// A container named `name` of `session`, running; 409 when the name is in use.
    pub(super) fn create(&self, name: String, session: &str) -> Result<String, DockerError> {
        let mut map = self
            .containers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if map.values().any(|c| c.name == name) {
            return Err(answer(
                format!("create container {name}"),
                409,
                format!("Conflict. The container name \"/{name}\" is already in use"),
            ));
        }
        let id = hex::encode(rand::random::<[u8; 32]>());
        map.insert(
            id.clone(),
            NoopContainer {
                name,
                session: session.to_owned(),
                running: true,
            },
        );
        Ok(id)
    }

    /// Marks a container running or not; 404 when there is no such container.
    pub(super) fn set_running(
        &self,
        id: &str,
        running: bool,
        action: String,
    ) -> Result<(), DockerError> {
        let mut map = self
            .containers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match find(&map, id).and_then(|k| map.get_mut(&k)) {
            Some(c) => {
                c.running = running;
                Ok(())
            }
            None => Err(answer(action, 404, format!("No such container: {id}"))),
        }
    }

    /// Renames a container; 404 when there is no such container, 409 when the name is in use.
    pub(super) fn rename(&self, id: &str, name: &str) -> Result<(), DockerError> {
        let mut map = self
            .containers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let action = format!("rename container {id} to {name}");
        if map.values().any(|c| c.name == name) {
            return Err(answer(
                action,
                409,
                format!("Conflict. The container name \"/{name}\" is already in use"),
            ));
        }
        match find(&map, id).and_then(|k| map.get_mut(&k)) {
            Some(c) => {
                c.name = name.to_owned();
                Ok(())
            }
            None => Err(answer(action, 404, format!("No such container: {id}"))),
        }
    }

    /// Forgets a container; one already gone is fine.
    pub(super) fn remove(&self, id: &str) {
        let mut map = self
            .containers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(key) = find(&map, id) {
            map.remove(&key);
        }
    }

    /// Whether a container exists and runs: `None` when it does not exist.
    pub(super) fn running(&self, id: &str) -> Option<bool> {
        let map = self
            .containers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        find(&map, id).and_then(|k| map.get(&k)).map(|c| c.running)
    }

    /// The container now. Nothing runs, so a running container has used no CPU time.
    pub(super) fn presence(&self, id: &str) -> Presence {
        match self.running(id) {
            None => Presence::Gone,
            Some(false) => Presence::Stopped,
            Some(true) => Presence::Running(Some(0)),
        }
    }

    /// Every container of the engine.
    pub(super) fn owned(&self) -> Vec<Owned> {
        let map = self
            .containers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.iter()
            .map(|(id, c)| Owned {
                id: id.clone(),
                session: c.session.clone(),
                running: c.running,
                paused: false,
            })
            .collect()
    }
}

impl Containers for NoopEngine {
    fn ping(&self, _timeout: std::time::Duration) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }

    fn has_image<'a>(&'a self, _image: &'a str) -> BoxFuture<'a, Result<bool, DockerError>> {
        Box::pin(async { Ok(true) })
    }

    fn create<'a>(
        &'a self,
        name: String,
        spec: &'a SandboxSpec,
        _pool: Option<&'a str>,
    ) -> BoxFuture<'a, Result<String, DockerError>> {
        Box::pin(async move { NoopEngine::create(self, name, &spec.session) })
    }

    fn rename<'a>(&'a self, id: &'a str, name: &'a str) -> BoxFuture<'a, Result<(), DockerError>> {
        Box::pin(async move { NoopEngine::rename(self, id, name) })
    }

    fn start<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), DockerError>> {
        Box::pin(async move { self.set_running(id, true, format!("start container {id}")) })
    }

    fn stop<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), DockerError>> {
        Box::pin(async move { self.set_running(id, false, format!("stop container {id}")) })
    }

    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), DockerError>> {
        Box::pin(async move {
            NoopEngine::remove(self, id);
            Ok(())
        })
    }

    fn running<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<bool>, DockerError>> {
        Box::pin(async move { Ok(NoopEngine::running(self, id)) })
    }

    fn presence<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Presence, DockerError>> {
        Box::pin(async move { Ok(NoopEngine::presence(self, id)) })
    }

    fn owned(&self) -> BoxFuture<'_, Result<Vec<Owned>, DockerError>> {
        Box::pin(async move { Ok(NoopEngine::owned(self)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::{Engine, SandboxSpec};

    fn spec(session: &str) -> SandboxSpec {
        SandboxSpec {
            session: session.to_owned(),
            tenant: "org".to_owned(),
            image: "any".to_owned(),
            workspace: "/nowhere".to_owned(),
            uid: 10001,
            network_mode: "none".to_owned(),
            cpus: 1.0,
            memory: 1 << 30,
            pids_limit: 512,
            tmpfs_size: "64m".to_owned(),
            home_size: "256m".to_owned(),
            oci_runtime: None,
            env: vec![],
            agent: None,
            trust: None,
            resolv_conf: None,
        }
    }

    #[tokio::test]
    async fn the_noop_engine_keeps_its_containers_consistent() {
        let engine = Engine::noop("bench");
        assert!(engine.is_noop());
        assert!(engine.has_image("never-pulled:1").await.expect("has_image"));

        // Created as Docker's create+start: it runs.
        let id = engine.create(&spec("s1")).await.expect("create");
        assert_eq!(engine.running(&id).await.expect("running"), Some(true));
        assert_eq!(engine.cpu_ns(&id).await.expect("cpu"), Some(0));
        let clash = engine
            .create(&spec("s1"))
            .await
            .expect_err("the name is taken");
        assert!(clash.to_string().contains("is already in use"), "{clash}");

        engine.stop(&id).await.expect("stop");
        assert_eq!(engine.running(&id).await.expect("running"), Some(false));
        assert_eq!(engine.cpu_ns(&id).await.expect("cpu"), None);
        assert_eq!(
            engine.presence(&id).await.expect("presence"),
            Presence::Stopped
        );
        engine
            .stop(&id)
            .await
            .expect("stopping a stopped container is fine");
        // By name, as the core starts and removes a session's container.
        engine
            .start(&engine.container_name("s1"))
            .await
            .expect("start by name");
        assert_eq!(engine.running(&id).await.expect("running"), Some(true));
        assert_eq!(
            engine.owned().await.expect("owned"),
            [Owned {
                id: id.clone(),
                session: "s1".to_owned(),
                running: true,
                paused: false,
            }]
        );

        // Every clone sees the same containers.
        let clone = engine.clone();
        clone.remove(&id).await.expect("remove");
        assert_eq!(engine.running(&id).await.expect("running"), None);
        assert_eq!(
            engine.presence(&id).await.expect("presence"),
            Presence::Gone
        );
        assert!(engine.owned().await.expect("owned").is_empty());
        for e in [
            engine
                .start(&id)
                .await
                .expect_err("start of a removed container"),
            engine
                .stop(&id)
                .await
                .expect_err("stop of a removed container"),
        ] {
            assert!(e.is_not_found(), "{e}");
        }
        engine
            .remove(&id)
            .await
            .expect("removing what is gone is fine");
    }

    #[test]
    fn the_noop_engine_has_no_docker_and_says_so() {
        let e = Engine::noop("bench")
            .docker()
            .map(|_| ())
            .expect_err("no Docker client");
        assert_eq!(
            e.to_string(),
            format!("docker could not be reached: {NOOP_REFUSAL}")
        );
        assert!(!e.is_not_found());
    }
}
