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
use tracing::{info, warn};

use super::{Actor, Core, Outcome, ServiceError};
use crate::container::checkpoint::SLEEP;

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
        if self.keeps_memory(runtime) {
            let started = std::time::Instant::now();
            match self.checkpoint(id, c).await {
                Ok(()) => {
                    self.metrics.checkpoint("checkpoint", "ok");
                    self.note(id, Op::Checkpoint, None, started);
                    info!(
                        session = id,
                        ms = started.elapsed().as_millis(),
                        "checkpointed: the session sleeps with its memory"
                    );
                    return Ok(true);
                }
                Err(why) => {
                    self.metrics.checkpoint("checkpoint", "failed");
                    self.note(id, Op::Checkpoint, Some(&why), started);
                    warn!(
                        session = id,
                        why, "the checkpoint failed: the session sleeps without its memory"
                    );
                }
            }
        }
        self.engine.stop(c).await.map_err(ServiceError::Docker)?;
        Ok(false)
    }

    /// The agent quiesced, then Docker's checkpoint (which stops the container).
    async fn checkpoint(&self, id: &str, c: &str) -> Result<(), String> {
        let docker = self.engine.docker().map_err(|e| e.to_string())?;
        self.runner.quiesce(id).await?;
        match docker.checkpoint(c, SLEEP).await {
            Ok(()) => Ok(()),
            Err(e) => {
                // Still running, the sandbox's agent binds its socket again.
                let _ = self.runner.allow_resume(id);
                let _ = docker.drop_checkpoint(c, SLEEP).await;
                Err(e.to_string())
            }
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
        match result {
            Ok(()) => {
                self.metrics.checkpoint("restore", "ok");
                self.note(id, Op::Restore, None, started);
                info!(
                    session = id,
                    ms = started.elapsed().as_millis(),
                    "restored: the session woke with its memory"
                );
                Some(true)
            }
            Err(why) => {
                self.metrics.checkpoint("restore", "failed");
                self.note(id, Op::Restore, Some(&why), started);
                warn!(
                    session = id,
                    why, "the restore failed: the session wakes fresh with its files"
                );
                Some(false)
            }
        }
    }

    /// The audit row of a checkpoint or restore: what it left the session with, and why it
    /// failed.
    fn note(&self, id: &str, op: Op, failed: Option<&str>, started: std::time::Instant) {
        let target = match (op, failed) {
            (Op::Checkpoint, None) => "asleep with its memory",
            (Op::Checkpoint, Some(_)) => "asleep without its memory",
            (_, None) => "awake with its memory",
            (_, Some(_)) => "awake fresh with its files",
        };
        let outcome = Outcome {
            ok: failed.is_none(),
            error: failed.map(str::to_owned),
            ..Outcome::default()
        };
        self.record(id, &Actor::default(), op, target, outcome, started);
    }
}
