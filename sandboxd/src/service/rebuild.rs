//! Rebuilding a session: its container recreated from its runtime's current image with the
//! limits asked, the workspace kept (and its disk grown when asked, never shrunk).
//!
//! One rebuild per session at a time, and never beside an open or wake of it: a rebuild takes
//! the session's [`OpeningSlot`](super::open) and marks the session rebuilding, which refuses
//! runs (409 `session_rebuilding`) until it is done. The row goes to `opening` while the
//! container is swapped, so a crash in the middle is found by the start-up reconcile like an
//! interrupted open: the containers are removed and the session is reclaimed, its workspace
//! intact; the next rebuild or wake gives it a container of the current image.
//!
//! Everything that can be refused is checked before anything changes: the runtime ready here
//! (its image present), the image the caller expects, the limits within the host's ceilings, a
//! workspace that would shrink, runs in flight when only an idle session may be rebuilt, and
//! last (so that a refusal leaves it as it was) a larger disk within the workspace budget. Only
//! a Docker failure after the old container is gone leaves the session without one
//! (reclaimed, [`ServiceError::RebuildFailed`] with Docker's words).

use super::*;

use tracing::{info, warn};

use crate::runtimes::RuntimeImage;
use crate::service::parse_bytes;
use crate::storage::audit::Op;
use crate::storage::store::{SessionRow, State};
use crate::workspace::disk::human;
pub use sandboxd_api::session::RebuildRequest;

/// What the new container is made with: its limits (and as the row stores them), and the
/// size its workspace disk grows to first, if it grows.
struct NextContainer {
    limits: Limits,
    json: String,
    grow_to: Option<u64>,
}

/// The session marked rebuilding while it is; unmarked when dropped (also on a panic).
struct Marked<'a> {
    core: &'a Core,
    id: String,
}

impl Drop for Marked<'_> {
    fn drop(&mut self) {
        if let Ok(mut m) = self.core.rebuilding.lock() {
            m.remove(&self.id);
        }
    }
}

impl Core {
    /// Grows the workspace disk of session `id` to `size` bytes, when a size is given.
    async fn grow(&self, id: &str, size: Option<u64>) -> Result<(), ServiceError> {
        let Some(size) = size else { return Ok(()) };
        let disks = self.disks.clone();
        let owned = id.to_owned();
        tokio::task::spawn_blocking(move || disks.grow(&owned, size))
            .await
            .map_err(|e| ServiceError::internal(format!("the disk task failed: {e}")))?
            .map_err(|e| ServiceError::disk(id, e))
    }

    /// Whether session `id` is being rebuilt now.
    pub(super) fn is_rebuilding(&self, id: &str) -> bool {
        self.rebuilding.lock().is_ok_and(|m| m.contains(id))
    }

    /// Rebuilds session `id` as `req` asks and records it in the audit log (the target is the
    /// image). A running session runs again on the new container; a stopped one is left
    /// without a container (reclaimed: it wakes on the new image); a reclaimed one keeps the
    /// limits for the container its next wake makes.
    pub async fn rebuild(
        &self,
        id: &str,
        req: RebuildRequest,
        actor: &Actor,
    ) -> Result<SessionView, ServiceError> {
        let started = std::time::Instant::now();
        let result = self.rebuild_unrecorded(id, req).await;
        let (target, outcome) = match &result {
            Ok(view) => (
                view.image.clone(),
                Outcome {
                    ok: true,
                    ..Outcome::default()
                },
            ),
            Err(e) => (
                String::new(),
                Outcome {
                    ok: false,
                    error: Some(e.to_string()),
                    ..Outcome::default()
                },
            ),
        };
        self.record(id, actor, Op::Rebuild, &target, outcome, started);
        result
    }

    /// The rebuild itself: every refusal checked, the session marked, then its container
    /// swapped (or, reclaimed, its next one set).
    async fn rebuild_unrecorded(
        &self,
        id: &str,
        req: RebuildRequest,
    ) -> Result<SessionView, ServiceError> {
        let row = self.row(id).await?;
        self.check_workspace(&row).await?;
        self.rebuildable(id, row.state)?;
        let runtime = self.rebuild_target(&row, req.image.as_deref()).await?;
        let next = self.rebuild_limits(id, &row, req.limits).await?;

        // One rebuild (or open, or wake) of the session at a time.
        let slot = match self.take_slot(id)? {
            Slot::Mine(slot) => slot,
            Slot::Busy(_) => {
                return Err(if self.is_rebuilding(id) {
                    ServiceError::Rebuilding { id: id.to_owned() }
                } else {
                    ServiceError::Opening { id: id.to_owned() }
                });
            }
        };
        let _marked = self.mark_rebuilding(id, req.idle_only)?;
        self.count_growth(id, &row, next.grow_to).await?;
        // The row as it is now: another request may have moved it since it was read.
        let row = self.row(id).await?;
        self.swap_container(id, &row, &runtime, &next).await?;
        drop(slot);
        info!(session = id, image = %runtime.image, "session rebuilt; workspace kept");
        self.get(id, false).await
    }

    /// Refuses a rebuild of a session in `state` with the words of that state.
    fn rebuildable(&self, id: &str, state: State) -> Result<(), ServiceError> {
        let id = id.to_owned();
        match state {
            State::Running | State::Stopped | State::Reclaimed => Ok(()),
            State::Opening if self.is_rebuilding(&id) => Err(ServiceError::Rebuilding { id }),
            unsettled => Err(ServiceError::unsettled(&id, unsettled)),
        }
    }

    /// The runtime image the session moves to: its runtime's current one, refused when the
    /// caller expects another or when it is not on this host (a rebuild never removes a
    /// container for an image it cannot start).
    async fn rebuild_target(
        &self,
        row: &SessionRow,
        expected: Option<&str>,
    ) -> Result<RuntimeImage, ServiceError> {
        let runtime = self.runtime(Some(&row.runtime))?;
        if let Some(expected) = expected
            && expected != runtime.image
        {
            return Err(ServiceError::RebuildRefused(format!(
                "runtime '{}' is at image {} on this host, not {expected}: the session was not rebuilt",
                runtime.alias, runtime.image
            )));
        }
        if !self
            .engine
            .has_image(&runtime.image)
            .await
            .map_err(ServiceError::Docker)?
        {
            return Err(ServiceError::RebuildRefused(format!(
                "the image {} of runtime '{}' is not on this host: the session was not rebuilt",
                runtime.image, runtime.alias
            )));
        }
        Ok(runtime)
    }

    /// The limits of the new container (`asked`, whole, or the session's), checked against
    /// the host's ceilings; a workspace that would shrink or has no disk to grow is refused.
    async fn rebuild_limits(
        &self,
        id: &str,
        row: &SessionRow,
        asked: Option<Limits>,
    ) -> Result<NextContainer, ServiceError> {
        let old = Self::limits_of(row);
        let mut limits = match asked {
            Some(l) => l,
            None => old.clone(),
        };
        self.check_limits(&limits)?;
        // The workspace keeps its size unless a larger one is asked; it never shrinks.
        let current = self.disks.size(id);
        let grow_to = match (limits.workspace_size.as_deref(), current) {
            (None, _) => None,
            (Some(asked), Some(size)) => {
                let bytes = parse_bytes(asked)
                    .and_then(|b| u64::try_from(b).ok())
                    .unwrap_or(0);
                if bytes < size {
                    return Err(ServiceError::invalid(format!(
                        "limits.workspace_size '{asked}' is smaller than the workspace of session '{id}', which is {} now: a workspace grows but never shrinks",
                        human(size)
                    )));
                }
                (bytes > size).then_some(bytes)
            }
            (Some(asked), None) => {
                return Err(ServiceError::invalid(format!(
                    "limits.workspace_size '{asked}' cannot be given to session '{id}': its workspace has no disk of its own (it was opened without a size limit)"
                )));
            }
        };
        limits.workspace_size = match (grow_to, current) {
            (Some(b), _) | (None, Some(b)) => Some(b.to_string()),
            (None, None) => old.workspace_size.clone(),
        };
        let json =
            serde_json::to_string(&limits).map_err(|e| ServiceError::internal(e.to_string()))?;
        Ok(NextContainer {
            limits,
            json,
            grow_to,
        })
    }

    /// Counts a disk that grows to `grow_to` against the host's workspace budget, or refuses
    /// the rebuild when it would go over: taken only once nothing else can refuse it, so a
    /// refused rebuild leaves the budget as it was.
    async fn count_growth(
        &self,
        id: &str,
        row: &SessionRow,
        grow_to: Option<u64>,
    ) -> Result<(), ServiceError> {
        if let Some(bytes) = grow_to {
            let budget = self.caps().workspace_budget;
            if !self
                .store
                .grow_disk_bytes(id, bytes, budget)
                .await
                .map_err(db)?
            {
                let held = self.store.held(&row.tenant).await.map_err(db)?;
                return Err(ServiceError::WorkspaceBudget {
                    budget: budget.unwrap_or(u64::MAX),
                    held: held.workspace_bytes,
                    workspaces: held.workspaces,
                    asked: bytes,
                });
            }
        }
        Ok(())
    }

    /// Marks session `id` rebuilding, under the run table's lock: a run is either in it now
    /// (and counted, or stopped later) or finds the session marked and is refused. With
    /// `idle_only`, a session with runs in flight is refused instead.
    fn mark_rebuilding(&self, id: &str, idle_only: bool) -> Result<Marked<'_>, ServiceError> {
        let runs = self
            .runs
            .lock()
            .map_err(|_| ServiceError::internal("run registry poisoned"))?;
        let in_flight = runs.values().filter(|e| e.session == id).count();
        if idle_only && in_flight > 0 {
            return Err(ServiceError::RebuildRefused(format!(
                "session '{id}' has {in_flight} run(s) in flight and the rebuild asked for an idle session: it was not rebuilt"
            )));
        }
        self.rebuilding
            .lock()
            .map_err(|_| ServiceError::internal("rebuild registry poisoned"))?
            .insert(id.to_owned());
        Ok(Marked {
            core: self,
            id: id.to_owned(),
        })
    }

    /// Gives session `id` (as `row` shows it now) its next container: reclaimed, only the
    /// image and limits its next wake uses; running or asleep, the old container removed
    /// (runs in flight told why), the disk grown, and a running one a new container. Should
    /// Docker fail once the old container is gone, the session is left reclaimed.
    async fn swap_container(
        &self,
        id: &str,
        row: &SessionRow,
        runtime: &RuntimeImage,
        next: &NextContainer,
    ) -> Result<(), ServiceError> {
        let failed = |message: String| ServiceError::RebuildFailed {
            id: id.to_owned(),
            image: runtime.image.clone(),
            message,
        };
        match row.state {
            State::Reclaimed => {
                self.grow(id, next.grow_to).await?;
                self.store
                    .set_image(id, &runtime.image, Some(&next.json))
                    .await
                    .map_err(db)?;
            }
            State::Running | State::Stopped => {
                if !self
                    .store
                    .transition(id, &[row.state], State::Opening)
                    .await
                    .map_err(db)?
                {
                    return Err(ServiceError::Changed { id: id.to_owned() });
                }
                // Runs in flight end first, each told why (`StoppedForRebuild`).
                self.stop_runs_for_rebuild(id);
                if let Some(c) = &row.container_id
                    && let Err(e) = self.engine.remove(c).await
                {
                    // The old container is still there: the session is as it was.
                    let _ = self
                        .store
                        .transition(id, &[State::Opening], row.state)
                        .await;
                    return Err(ServiceError::Docker(e));
                }
                self.store.set_container(id, None).await.map_err(db)?;
                self.memory_gone(
                    row,
                    "it was rebuilt while it slept, and its checkpoint went with the old container",
                )
                .await;
                // Grown with no container binding it, so an offline resize can unmount it.
                if let Err(e) = self.grow(id, next.grow_to).await {
                    let _ = self
                        .store
                        .transition(id, &[State::Opening], State::Reclaimed)
                        .await;
                    return Err(failed(e.to_string()));
                }
                self.store
                    .set_image(id, &runtime.image, Some(&next.json))
                    .await
                    .map_err(db)?;
                if row.state == State::Running {
                    if let Err(e) = self
                        .create_container(id, &row.tenant, runtime, &next.limits)
                        .await
                    {
                        warn!(session = id, error = %e, "the rebuilt container could not be made; the session is reclaimed");
                        let _ = self
                            .store
                            .transition(id, &[State::Opening], State::Reclaimed)
                            .await;
                        return Err(failed(e.to_string()));
                    }
                } else {
                    self.store
                        .transition(id, &[State::Opening], State::Reclaimed)
                        .await
                        .map_err(db)?;
                }
            }
            State::Opening | State::Lost | State::Destroying => {
                self.rebuildable(id, row.state)?;
            }
        }
        Ok(())
    }
}
