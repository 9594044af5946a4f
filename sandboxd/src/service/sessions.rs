//! A session after it opened: shown, woken, stopped, reclaimed and destroyed.

use super::*;

use tracing::{info, warn};

use crate::container::Presence;
use crate::runtimes::{RuntimeError, RuntimeImage};
use crate::service::parse_bytes;
use crate::storage::store::{Claim, SessionRow, State};
use crate::workspace::Workspace;
use crate::workspace::disk::{Disks, human};

impl Core {
    /// Moves a session's folder into the trash, where the sweeper deletes it in the
    /// background; returns whether there was one.
    pub(super) fn discard_folder(&self, id: &str) -> Result<bool, ServiceError> {
        let folder = self.settings.workspace_root.join(id);
        // The workspace disk goes first: unmounted, its image is one file in the folder.
        self.disks
            .unmount(id)
            .map_err(|e| ServiceError::disk(id, e))?;
        self.trash.discard(&folder, id).map_err(|e| {
            ServiceError::internal(format!(
                "could not move {} into the trash {}: {e}",
                folder.display(),
                self.trash.dir().display()
            ))
        })
    }

    pub(super) async fn view(&self, row: &SessionRow, with_cpu: bool) -> SessionView {
        let workspace_exists = self.workspace(&row.id).exists();
        // The figures the idle decision takes are ones the sandbox cannot forge: CPU time from
        // the container's cgroup as Docker reports it, runs in flight from this process's own
        // table (never what anything inside the sandbox says).
        // A container Docker no longer runs (stopped or removed behind our back) is shown as
        // such: the row changes on the next use, which starts or recreates it.
        let presence = match (&row.container_id, with_cpu && row.state == State::Running) {
            (Some(c), true) => self.engine.presence(c).await.ok(),
            _ => None,
        };
        let cpu_ns = match presence {
            Some(Presence::Running(ns)) => ns,
            _ => None,
        };
        SessionView {
            id: row.id.clone(),
            tenant: row.tenant.clone(),
            runtime: row.runtime.clone(),
            image: row.image.clone(),
            state: shown_state(row.state, workspace_exists, presence).into(),
            created_at: rfc3339(row.created_at),
            last_activity_at: rfc3339(row.last_activity_at),
            runs_in_flight: self.runs_in_flight(&row.id),
            cpu_ns,
            workspace_exists,
            owner: row.owner.clone(),
            launch: if row.warm {
                sandboxd_api::session::Launch::Warm
            } else if row.restored {
                sandboxd_api::session::Launch::Restored
            } else {
                sandboxd_api::session::Launch::Cold
            },
            usage: None,
            credentials_version: self.egress.as_ref().and_then(|e| {
                e.gate
                    .credentials_of(&row.id)
                    .map(|set| set.version.clone())
            }),
            runtime_image: self.runtimes.current_image(&row.runtime),
            limits: Self::limits_of(row),
            memory: row
                .memory
                .as_deref()
                .and_then(|json| serde_json::from_str(json).ok()),
        }
    }

    pub(super) async fn row(&self, id: &str) -> Result<SessionRow, ServiceError> {
        let row = self
            .store
            .get(id)
            .await
            .map_err(db)?
            .ok_or_else(|| ServiceError::NoSuchSession { id: id.to_owned() })?;
        if let Ok(mut t) = self.tenants.lock()
            && t.get(id).is_none_or(|(tenant, incarnation)| {
                *tenant != row.tenant || *incarnation != row.incarnation
            })
        {
            t.insert(id.to_owned(), (row.tenant.clone(), row.incarnation.clone()));
        }
        Ok(row)
    }

    /// One session, with its usage when `usage` (see [`Core::usage`]); no side effects
    /// (never wakes, never marks anything).
    pub async fn get(&self, id: &str, usage: bool) -> Result<SessionView, ServiceError> {
        let row = self.row(id).await?;
        let mut view = self.view(&row, true).await;
        if usage {
            view.usage = self.usage(&row).await;
        }
        Ok(view)
    }

    /// Every session.
    pub async fn list(&self) -> Result<Vec<SessionView>, ServiceError> {
        let rows = self.store.list().await.map_err(db)?;
        // Side by side: each running session's usage may cost a Docker call.
        Ok(futures::future::join_all(rows.iter().map(|row| async move {
            let mut view = self.view(row, false).await;
            view.usage = self.usage(row).await;
            view
        }))
        .await)
    }

    pub(super) fn runtime(&self, alias: Option<&str>) -> Result<RuntimeImage, RuntimeError> {
        self.runtimes.resolve(alias)
    }

    pub(super) fn check_limits(&self, limits: &Limits) -> Result<(), ServiceError> {
        let s = &self.settings;
        if let Some(c) = limits.cpus
            && (c.is_nan() || c <= 0.0 || c > s.cpus)
        {
            return Err(ServiceError::invalid(format!(
                "limits.cpus must be above 0 and at most {} (this host's ceiling)",
                s.cpus
            )));
        }
        if let Some(m) = &limits.mem_limit {
            match parse_bytes(m) {
                Some(b) if b <= s.memory => {}
                Some(_) => {
                    return Err(ServiceError::invalid(format!(
                        "limits.mem_limit '{m}' is above this host's ceiling of {} bytes",
                        s.memory
                    )));
                }
                None => {
                    return Err(ServiceError::invalid(format!(
                        "limits.mem_limit '{m}' is not a size in Docker's syntax (for example 512m or 2g)"
                    )));
                }
            }
        }
        if let Some(p) = limits.pids_limit
            && !(16..=s.pids_limit).contains(&p)
        {
            return Err(ServiceError::invalid(format!(
                "limits.pids_limit must be between 16 and {} (this host's ceiling)",
                s.pids_limit
            )));
        }
        if let Some(w) = &limits.workspace_size {
            let Some(ceiling) = s.workspace_size else {
                return Err(ServiceError::invalid(format!(
                    "limits.workspace_size '{w}' cannot be held: this host does not limit workspaces (SANDBOXD_WORKSPACE_QUOTA=off)"
                )));
            };
            match parse_bytes(w).and_then(|b| u64::try_from(b).ok()) {
                Some(b) if (crate::workspace::disk::MIN_SIZE..=ceiling).contains(&b) => {}
                Some(_) => {
                    return Err(ServiceError::invalid(format!(
                        "limits.workspace_size '{w}' must be between {} and {} (this host's ceiling)",
                        human(crate::workspace::disk::MIN_SIZE),
                        human(ceiling)
                    )));
                }
                None => {
                    return Err(ServiceError::invalid(format!(
                        "limits.workspace_size '{w}' is not a size in Docker's syntax (for example 512m or 2g)"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The disks of the sessions.
    pub fn disks(&self) -> &Disks {
        &self.disks
    }

    /// Wakes stopped session `id` on a new container, its workspace kept: its container `c`
    /// (if still there) removed, the session reclaimed, then woken.
    async fn wake_anew(&self, id: &str, c: Option<&str>) -> Result<SessionRow, ServiceError> {
        if let Some(c) = c {
            self.engine.remove(c).await.map_err(ServiceError::Docker)?;
        }
        self.store.set_container(id, None).await.map_err(db)?;
        self.release_checkpoint(id).await;
        self.store
            .transition(id, &[State::Stopped], State::Reclaimed)
            .await
            .map_err(db)?;
        Box::pin(self.wake(id)).await
    }

    /// Wakes a session so a command can run: starts a stopped container, recreates a reclaimed
    /// one (within the caps), waits for one still opening. Returns the running row.
    pub async fn wake(&self, id: &str) -> Result<SessionRow, ServiceError> {
        let row = self.row(id).await?;
        self.check_workspace(&row).await?;
        match row.state {
            State::Running => {
                // Docker may have stopped it behind our back (OOM of the keepalive, a restart).
                if let Some(c) = &row.container_id
                    && self.engine.running(c).await.map_err(ServiceError::Docker)? == Some(true)
                {
                    return Ok(row);
                }
                if let Some(c) = &row.container_id {
                    // The run path says why (an agent that died is reported).
                    self.runner.container_stopped(id, c).await;
                }
                self.store
                    .transition(id, &[State::Running], State::Stopped)
                    .await
                    .map_err(db)?;
                Box::pin(self.wake(id)).await
            }
            State::Opening => {
                // Whatever the open in flight ends in, this wake starts over from there.
                self.wait_opened(id).await?;
                Box::pin(self.wake(id)).await
            }
            State::Stopped => {
                let started = std::time::Instant::now();
                let Some(c) = row.container_id.clone() else {
                    self.store
                        .transition(id, &[State::Stopped], State::Reclaimed)
                        .await
                        .map_err(db)?;
                    return Box::pin(self.wake(id)).await;
                };
                // A container taken from a warm pool binds the workspace by the pool folder's
                // old path: started again, Docker would bind that path, not the session's
                // folder. It is replaced instead; the workspace stays.
                if row.warm {
                    info!(session = id, "warm container replaced on wake");
                    return self.wake_anew(id, Some(&c)).await;
                }
                let restored = self.wake_from_checkpoint(id, &row.runtime, &c).await;
                if restored.is_none() {
                    self.memory_gone(&row, "its checkpoint is gone").await;
                }
                let started_fresh = match restored {
                    Some(true) => Ok(()),
                    _ => self.engine.start(&c).await,
                };
                match started_fresh {
                    Ok(()) => {}
                    // A restore that failed may leave a container Docker cannot start again:
                    // it is made anew, the workspace kept.
                    Err(e) if restored == Some(false) => {
                        warn!(session = id, error = %e, "the container does not start after a failed restore: it is made anew");
                        return self.wake_anew(id, Some(&c)).await;
                    }
                    Err(e) if e.is_not_found() => return self.wake_anew(id, None).await,
                    Err(e) => return Err(ServiceError::Docker(e)),
                }
                self.store
                    .transition(id, &[State::Stopped], State::Running)
                    .await
                    .map_err(db)?;
                info!(session = id, "session woken");
                self.metrics.observe_wake("stopped", started);
                self.row(id).await
            }
            State::Reclaimed => {
                let started = std::time::Instant::now();
                let slot = match self.take_slot(id)? {
                    Slot::Mine(slot) => slot,
                    Slot::Busy(rx) => {
                        Self::wait_done(rx, tokio::time::Instant::now() + OPEN_WAIT, id).await?;
                        return Box::pin(self.wake(id)).await;
                    }
                };
                match self
                    .store
                    .reclaim_to_opening(id, &row.tenant, self.caps())
                    .await
                    .map_err(db)?
                {
                    Some(Claim::Inserted) => {
                        self.memory_gone(
                            &row,
                            "its container was removed while it slept, and its checkpoint with it",
                        )
                        .await;
                    }
                    Some(refused) => return Err(self.cap_error(&refused, &row.tenant, 0)),
                    None => {
                        drop(slot);
                        return Box::pin(self.wake(id)).await;
                    }
                }
                let runtime = self.runtimes.ready(&row.runtime).unwrap_or_else(|| {
                    let mut env = std::collections::BTreeMap::new();
                    if row.image.starts_with(crate::runtimes::REPOSITORY) {
                        env.insert("HOME".to_owned(), crate::runtimes::HOME.to_owned());
                    }
                    RuntimeImage {
                        alias: row.runtime.clone(),
                        image: row.image.clone(),
                        needs_network: false,
                        egress: sandboxd_catalog::egress::Egress::none(),
                        isolation: sandboxd_catalog::Isolation::Runc,
                        mem_limit: None,
                        workspace_size: None,
                        env,
                    }
                });
                let result = self
                    .create_container(id, &row.tenant, &runtime, &Self::limits_of(&row))
                    .await;
                if let Err(e) = result {
                    self.store
                        .transition(id, &[State::Opening], State::Reclaimed)
                        .await
                        .map_err(db)?;
                    return Err(e);
                }
                self.metrics.observe_wake("reclaimed", started);
                let woken = self.row(id).await;
                drop(slot);
                woken
            }
            State::Lost => Err(ServiceError::Lost { id: id.to_owned() }),
            State::Destroying => Err(ServiceError::Destroying { id: id.to_owned() }),
        }
    }

    /// Puts a session to sleep: the container stops, the files stay.
    pub async fn stop(&self, id: &str) -> Result<SessionView, ServiceError> {
        let row = self.row(id).await?;
        match row.state {
            State::Stopped | State::Reclaimed => {}
            State::Running => {
                let kept = match &row.container_id {
                    // A container taken from a warm pool is replaced at its wake (it binds the
                    // pool folder's path), so a checkpoint of it could never be restored.
                    Some(c) if row.warm => {
                        self.engine.stop(c).await.map_err(ServiceError::Docker)?;
                        false
                    }
                    Some(c) => self.sleep_container(id, &row.runtime, c).await?,
                    None => false,
                };
                self.store
                    .transition(id, &[State::Running], State::Stopped)
                    .await
                    .map_err(db)?;
                info!(session = id, memory = kept, "session asleep");
            }
            unsettled => return Err(ServiceError::unsettled(id, unsettled)),
        }
        self.get(id, false).await
    }

    /// Removes a session's container; the workspace stays. A host that keeps containers
    /// (SANDBOXD_PERSIST_CONTAINERS) refuses.
    pub async fn reclaim(&self, id: &str) -> Result<SessionView, ServiceError> {
        let row = self.row(id).await?;
        if self.settings.persist_containers {
            return Err(ServiceError::ContainersPersist);
        }
        match row.state {
            State::Reclaimed => {}
            State::Running | State::Stopped => {
                if !self
                    .store
                    .transition(id, &[State::Running, State::Stopped], State::Reclaimed)
                    .await
                    .map_err(db)?
                {
                    return Err(ServiceError::Changed { id: id.to_owned() });
                }
                if let Some(c) = &row.container_id {
                    self.engine.remove(c).await.map_err(ServiceError::Docker)?;
                }
                self.store.set_container(id, None).await.map_err(db)?;
                self.memory_gone(
                    &row,
                    "its container was removed while it slept, and its checkpoint with it",
                )
                .await;
                info!(session = id, "container reclaimed; workspace kept");
            }
            unsettled => return Err(ServiceError::unsettled(id, unsettled)),
        }
        self.get(id, false).await
    }

    /// Removes the container and the workspace. Destroying what is already gone succeeds.
    /// The session's folder is moved into the trash (one rename, whatever it holds) and
    /// deleted there in the background, so a destroy answers at once.
    pub async fn destroy(&self, id: &str) -> Result<Destroyed, ServiceError> {
        self.destroy_as(id, None).await
    }

    /// [`Core::destroy`] for `owner`: a session another owner holds is left alone
    /// ([`ServiceError::OwnerMismatch`]), so a destroy owed for an object that is gone never removes the
    /// session a newer object opened under the same id. `None` destroys whoever owns it.
    pub async fn destroy_as(
        &self,
        id: &str,
        owner: Option<&str>,
    ) -> Result<Destroyed, ServiceError> {
        let Some(row) = self.store.get(id).await.map_err(db)? else {
            let had_files = valid_session_id(id) && self.discard_folder(id)?;
            return Ok(Destroyed {
                id: id.to_owned(),
                destroyed: had_files,
                message: format!("Session '{id}' was already gone"),
            });
        };
        if let Some(theirs) = &row.owner
            && let Some(mine) = owner
            && theirs != mine
        {
            return Err(owner_mismatch(id, mine));
        }
        if row.state == State::Opening {
            let _ = self.wait_opened(id).await;
        }
        let every = [
            State::Opening,
            State::Running,
            State::Stopped,
            State::Reclaimed,
            State::Lost,
            State::Destroying,
        ];
        if let Some(mine) = owner {
            // Guarded on the owner too: a session another owner opened under this id since the
            // row was read is never marked for destruction.
            if !self
                .store
                .transition_owned(id, &every, State::Destroying, mine)
                .await
                .map_err(db)?
            {
                return match self.store.get(id).await.map_err(db)? {
                    None => Ok(Destroyed {
                        id: id.to_owned(),
                        destroyed: false,
                        message: format!("Session '{id}' was already gone"),
                    }),
                    Some(_) => Err(owner_mismatch(id, mine)),
                };
            }
        } else {
            self.store
                .transition(id, &every, State::Destroying)
                .await
                .map_err(db)?;
        }
        self.cancel_runs(id);
        if let Some(c) = &row.container_id {
            self.engine.remove(c).await.map_err(ServiceError::Docker)?;
        }
        let _ = self.engine.remove(&self.engine.container_name(id)).await;
        self.discard_folder(id)?;
        self.store.delete(id).await.map_err(db)?;
        self.forget_tokens(id);
        if let Ok(mut t) = self.tenants.lock() {
            t.remove(id);
        }
        self.usage.forget(id);
        if let Some(egress) = &self.egress {
            egress.gate.forget(id);
        }
        info!(session = id, "session destroyed");
        Ok(Destroyed {
            id: id.to_owned(),
            destroyed: true,
            message: format!("Session '{id}' destroyed: container and workspace removed"),
        })
    }

    /// The workspace of a session for a file operation: never wakes it; a vanished workspace
    /// makes it lost.
    pub async fn files(&self, id: &str) -> Result<Workspace, ServiceError> {
        if let Some(busy) = self.file_work.refuses(id) {
            return Err(ServiceError::FileWorkBusy(busy.to_string()));
        }
        let row = self.row(id).await?;
        if row.state == State::Destroying {
            return Err(ServiceError::Destroying { id: id.to_owned() });
        }
        self.check_workspace(&row).await?;
        // A row touched within the last second needs no write: a flood of file operations
        // would otherwise queue every session's behind its writes.
        if crate::storage::store::now_ms().saturating_sub(row.last_activity_at)
            > ACTIVITY_RESOLUTION_MS
        {
            let _ = self.store.touch(id).await;
        }
        Ok(self.workspace(id).with_size_limit(self.disks.size(id)))
    }
}
