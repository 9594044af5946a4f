//! What the unauthenticated `/`, `/healthz` and `/metrics` say of the host, at a cost that
//! does not grow with it: the sessions counted by state and the bytes of their workspace disks
//! (one count query each, reused for a second, however many ask), whether Docker answers (one ping, reused for a second), and
//! whether the sandbox network's firewall is whole (from memory: the guard keeps it).

use super::*;

use std::time::Instant;

use crate::storage::store::State;

/// How long a count of the sessions, or Docker's answer to a ping, is reused.
const FRESH: Duration = Duration::from_secs(1);
/// How long Docker has to answer a ping.
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// The sessions of the host by state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts(Vec<(State, u64)>);

impl Counts {
    /// Sessions in `state`.
    pub fn get(&self, state: State) -> u64 {
        self.0
            .iter()
            .find(|(s, _)| *s == state)
            .map_or(0, |(_, n)| *n)
    }

    /// Every session.
    pub fn total(&self) -> u64 {
        self.0.iter().map(|(_, n)| n).sum()
    }

    /// Each state that has sessions, with how many.
    pub fn iter(&self) -> impl Iterator<Item = (State, u64)> + '_ {
        self.0.iter().copied()
    }
}

/// The answers [`Core::session_counts`] and [`Core::problems`] reuse.
#[derive(Default)]
pub(super) struct Looks {
    counts: tokio::sync::Mutex<Option<(Instant, Counts)>>,
    workspace_bytes: tokio::sync::Mutex<Option<(Instant, u64)>>,
    docker: tokio::sync::Mutex<Option<(Instant, Option<String>)>>,
}

impl Core {
    /// The sessions by state: one count query at most once a second; every caller in between
    /// gets the same answer.
    pub async fn session_counts(&self) -> Result<Counts, ServiceError> {
        let mut cached = self.looks.counts.lock().await;
        if let Some((at, counts)) = cached.as_ref()
            && at.elapsed() < FRESH
        {
            return Ok(counts.clone());
        }
        let counts = Counts(self.store.counts().await.map_err(db)?);
        *cached = Some((Instant::now(), counts.clone()));
        Ok(counts)
    }

    /// The nominal bytes of the workspace disks the host holds (what `GET /v1/policy` reports
    /// as `workspaces.bytes`): one query at most once a second; every caller in between gets the
    /// same answer.
    pub async fn workspace_bytes(&self) -> Result<u64, ServiceError> {
        let mut cached = self.looks.workspace_bytes.lock().await;
        if let Some((at, bytes)) = cached.as_ref()
            && at.elapsed() < FRESH
        {
            return Ok(*bytes);
        }
        let bytes = self.store.held("").await.map_err(db)?.workspace_bytes;
        *cached = Some((Instant::now(), bytes));
        Ok(bytes)
    }

    /// What keeps this host from serving, one sentence each: Docker not answering, the
    /// sandbox network's firewall not whole. Empty when nothing does.
    pub async fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(docker) = self.docker_problem().await {
            problems.push(docker);
        }
        if let Some(firewall) = self.network.as_ref().and_then(|n| n.problem()) {
            problems.push(format!(
                "the sandbox network's firewall is not whole, so no sandbox with network is safe: {firewall}"
            ));
        }
        problems
    }

    /// Why Docker does not answer, asked at most once a second.
    async fn docker_problem(&self) -> Option<String> {
        let mut cached = self.looks.docker.lock().await;
        if let Some((at, problem)) = cached.as_ref()
            && at.elapsed() < FRESH
        {
            return problem.clone();
        }
        let problem = self.engine.ping(PING_TIMEOUT).await.err().map(|e| {
            let host = std::env::var("DOCKER_HOST")
                .unwrap_or_else(|_| "unix:///var/run/docker.sock".to_owned());
            format!("cannot reach Docker at {host} ({e}); sessions cannot be opened, woken or run until it answers again")
        });
        *cached = Some((Instant::now(), problem.clone()));
        problem
    }
}
