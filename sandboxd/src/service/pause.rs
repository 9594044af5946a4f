//! Sleep with memory: a session of a gvisor runtime is checkpointed when it sleeps (its
//! processes and their memory, Docker's checkpoint of gVisor) and restored when it wakes, so a
//! background server, a shell's variables and what a process holds in memory are there again.
//! The agent first lets go of its host sockets (gVisor cannot save them, see
//! `sandbox_agent::pause`). A checkpoint that fails falls back to today's sleep (the container
//! stopped, its processes ended); a restore that fails starts the container fresh with its
//! files. Each is an audit row (ops `checkpoint` and `restore`, a failed one with its reason),
//! a line of the log and a count in `sandboxd_checkpoints_total`. A runc session sleeps as
//! before.

use sandboxd_api::audit::Op;
use sandboxd_api::session::{MemoryNote, MemoryOp};
use tracing::{info, warn};

use super::{Actor, Core, Outcome, ServiceError, SessionView, db};
use crate::container::checkpoint::SLEEP;
use crate::storage::store::{SessionRow, State};
use crate::workspace::disk::human;

/// How long Docker may take to report a checkpointed container stopped.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Core {
    /// Whether a session of `runtime` sleeps with its memory: its runtime is gvisor now (a
    /// container made before a change of isolation is found out by its agent, which then
    /// refuses the quiesce).
    fn keeps_memory(&self, runtime: &str) -> bool {
        self.runtimes
            .ready(runtime)
            .is_some_and(|r| r.isolation == sandboxd_catalog::Isolation::Gvisor)
    }

    /// Stops session `id`'s container `c` for a sleep: checkpointed with its memory when its
    /// runtime is gvisor and the checkpoint succeeds, else stopped. Whether it kept its memory.
    pub(super) async fn sleep_container(
        &self,
        id: &str,
        runtime: &str,
        c: &str,
    ) -> Result<bool, ServiceError> {
        if self.keeps_memory(runtime) && self.checkpoint_noted(id, c).await.is_ok() {
            return Ok(true);
        }
        self.engine.stop(c).await.map_err(ServiceError::Docker)?;
        Ok(false)
    }

    /// A checkpoint of session `id`'s container `c`, logged, counted and audited.
    async fn checkpoint_noted(&self, id: &str, c: &str) -> Result<(), String> {
        let started = std::time::Instant::now();
        let result = self.checkpoint(id, c).await;
        match &result {
            Ok(()) => {
                self.metrics.checkpoint("checkpoint", "ok");
                self.note(id, Op::Checkpoint, None, started).await;
                info!(
                    session = id,
                    ms = started.elapsed().as_millis(),
                    "checkpointed: the session sleeps with its memory"
                );
            }
            Err(why) => {
                self.metrics.checkpoint("checkpoint", "failed");
                self.note(id, Op::Checkpoint, Some(why), started).await;
                warn!(
                    session = id,
                    why, "the checkpoint failed: the session sleeps without its memory"
                );
            }
        }
        result
    }

    /// Pauses session `id` (`POST /v1/sessions/{id}/pause`): asleep with its processes and
    /// memory, or refused with what it was left with. One asleep already is shown as it is.
    pub async fn pause(&self, id: &str) -> Result<SessionView, ServiceError> {
        let row = self.row(id).await?;
        match row.state {
            State::Stopped | State::Reclaimed => {}
            State::Running => {
                let refused = |why: String| ServiceError::PauseRefused(why);
                if !self.keeps_memory(&row.runtime) {
                    return Err(refused(format!(
                        "session '{id}' runs on runtime '{}', whose isolation is not gvisor: only a gVisor sandbox is paused with its memory (stop sleeps it without)",
                        row.runtime
                    )));
                }
                if row.warm {
                    return Err(refused(format!(
                        "session '{id}' runs on a container of its runtime's warm pool, which is replaced at its next wake: it can be paused after that wake (stop sleeps it without its memory)"
                    )));
                }
                let Some(c) = row.container_id.clone() else {
                    return Err(refused(format!("session '{id}' has no container to pause")));
                };
                let checkpointed = self.checkpoint_noted(id, &c).await;
                // A checkpoint that failed half-way may have stopped the container, or not.
                if let Err(why) = &checkpointed
                    && self.engine.running(&c).await.ok().flatten() == Some(true)
                {
                    return Err(refused(format!(
                        "session '{id}' could not be paused: {why}; it runs on as it was"
                    )));
                }
                self.store
                    .transition(id, &[State::Running], State::Stopped)
                    .await
                    .map_err(db)?;
                if let Err(why) = checkpointed {
                    return Err(refused(format!(
                        "session '{id}' could not be paused: {why}; its container stopped, so it is asleep without its memory"
                    )));
                }
                info!(session = id, "session paused");
            }
            unsettled => return Err(ServiceError::unsettled(id, unsettled)),
        }
        self.get(id, false).await
    }

    /// The agent quiesced, then Docker's checkpoint (which stops the container).
    async fn checkpoint(&self, id: &str, c: &str) -> Result<(), String> {
        let docker = self.engine.docker().map_err(|e| e.to_string())?;
        self.runner.quiesce(id).await?;
        let result = match docker.checkpoint(c, SLEEP).await {
            // Docker answers before it has seen the container exit: the session is asleep
            // once Docker says so, or a wake could find it "running" and start it fresh.
            Ok(()) => match self.until_stopped(c).await {
                Ok(()) => self.hold_checkpoint(id, c, docker).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e.to_string()),
        };
        if result.is_err() {
            // Still running, the sandbox's agent binds its socket again; a checkpoint that
            // is not the sleep's is never restored.
            let _ = self.runner.allow_resume(id);
            let _ = docker.drop_checkpoint(c, SLEEP).await;
            self.release_checkpoint(id).await;
        }
        result
    }

    /// Counts session `id`'s new checkpoint against the workspace budget: its bytes on the
    /// node's disk, when they fit beside every workspace and checkpoint the host holds.
    async fn hold_checkpoint(
        &self,
        id: &str,
        c: &str,
        docker: &crate::container::docker::DockerEngine,
    ) -> Result<(), String> {
        let bytes = docker.checkpoint_bytes(c, SLEEP).await?;
        let budget = self.caps().workspace_budget;
        if self
            .store
            .hold_checkpoint(id, bytes, budget)
            .await
            .map_err(|e| format!("cannot count the checkpoint: {e}"))?
        {
            return Ok(());
        }
        let held = self.store.held("").await.map_err(|e| e.to_string())?;
        Err(format!(
            "its checkpoint of {} does not fit this host's workspace budget of {} (SANDBOXD_WORKSPACE_BUDGET): {} workspaces and their checkpoints hold {}",
            human(bytes),
            human(budget.unwrap_or(u64::MAX)),
            held.workspaces,
            human(held.workspace_bytes)
        ))
    }

    /// Waits (up to [`STOP_WAIT`]) until Docker reports container `c` not running.
    async fn until_stopped(&self, c: &str) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + STOP_WAIT;
        loop {
            match self.engine.running(c).await {
                Ok(Some(true)) => {}
                Ok(_) => return Ok(()),
                Err(e) => return Err(e.to_string()),
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "the container still runs {} s after its checkpoint",
                    STOP_WAIT.as_secs()
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Starts session `id`'s stopped container `c` from its sleep's checkpoint, when its
    /// runtime is gvisor and it has one. `None`: no checkpoint to restore; `Some(true)`:
    /// restored; `Some(false)`: the restore failed (said in the log), the container is to be
    /// started fresh. The checkpoint is removed either way: it is used once.
    pub(super) async fn wake_from_checkpoint(
        &self,
        id: &str,
        runtime: &str,
        c: &str,
    ) -> Option<bool> {
        if !self.keeps_memory(runtime) {
            return None;
        }
        let docker = self.engine.docker().ok()?;
        match docker.has_checkpoint(c, SLEEP).await {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => {
                warn!(session = id, error = %e, "cannot list the container's checkpoints: it starts fresh");
                return None;
            }
        }
        let started = std::time::Instant::now();
        let result = match self.runner.allow_resume(id) {
            Ok(()) => docker.restore(c, SLEEP).await.map_err(|e| e.to_string()),
            Err(e) => Err(format!("cannot let the agent bind again: {e}")),
        };
        let _ = docker.drop_checkpoint(c, SLEEP).await;
        self.release_checkpoint(id).await;
        match result {
            Ok(()) => {
                self.metrics.checkpoint("restore", "ok");
                self.note(id, Op::Restore, None, started).await;
                info!(
                    session = id,
                    ms = started.elapsed().as_millis(),
                    "restored: the session woke with its memory"
                );
                Some(true)
            }
            Err(why) => {
                self.metrics.checkpoint("restore", "failed");
                self.note(id, Op::Restore, Some(&why), started).await;
                warn!(
                    session = id,
                    why, "the restore failed: the session wakes fresh with its files"
                );
                Some(false)
            }
        }
    }

    /// A wake of session `row` that cannot restore it though its last note says it sleeps
    /// with its memory (its checkpoint went with its container): noted as a failed restore
    /// saying `why`, so neither its view nor its status claims the memory was kept.
    pub(super) async fn memory_gone(&self, row: &SessionRow, why: &str) {
        let slept_with_memory = row
            .memory
            .as_deref()
            .and_then(|json| serde_json::from_str::<MemoryNote>(json).ok())
            .is_some_and(|n| n.op == MemoryOp::Checkpoint && n.kept);
        // Only a kept checkpoint is held against the budget: nothing to do for the others
        // (every runc session's wake and reclaim).
        if slept_with_memory {
            self.release_checkpoint(&row.id).await;
            self.note(&row.id, Op::Restore, Some(why), std::time::Instant::now())
                .await;
        }
    }

    /// Session `id`'s checkpoint no longer counts against the budget (it is gone).
    pub(super) async fn release_checkpoint(&self, id: &str) {
        if let Err(e) = self.store.release_checkpoint(id).await {
            warn!(session = id, error = %e, "cannot release the checkpoint's bytes from the workspace budget");
        }
    }

    /// The audit row of a checkpoint or restore, and the session's note of it (its view's
    /// `memory`): what it left the session with, and why it failed.
    async fn note(&self, id: &str, op: Op, failed: Option<&str>, started: std::time::Instant) {
        let (memory_op, outcome) = match (op, failed) {
            (Op::Checkpoint, None) => (MemoryOp::Checkpoint, "asleep with its memory"),
            (Op::Checkpoint, Some(_)) => (MemoryOp::Checkpoint, "asleep without its memory"),
            (_, None) => (MemoryOp::Restore, "awake with its memory"),
            (_, Some(_)) => (MemoryOp::Restore, "awake fresh with its files"),
        };
        let note = MemoryNote {
            op: memory_op,
            kept: failed.is_none(),
            outcome: outcome.to_owned(),
            error: failed.map(str::to_owned),
            at: super::rfc3339(crate::storage::store::now_ms()),
        };
        match serde_json::to_string(&note) {
            Ok(json) => {
                if let Err(e) = self.store.set_memory(id, &json).await {
                    warn!(session = id, error = %e, "cannot record the session's memory note");
                }
            }
            Err(e) => warn!(session = id, error = %e, "cannot encode the session's memory note"),
        }
        let outcome = Outcome {
            ok: failed.is_none(),
            error: failed.map(str::to_owned),
            ..Outcome::default()
        };
        self.record(
            id,
            &Actor::default(),
            op,
            note.outcome.as_str(),
            outcome,
            started,
        );
    }
}
