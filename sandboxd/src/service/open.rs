//! Opening a session: the caps claimed, the workspace and its disk made, the container created
//! and started; one open per name at a time, a concurrent open of the same name waits for it.

use super::*;

use tokio::sync::watch;
use tracing::{Instrument as _, info, warn};

use crate::container::SandboxSpec;
use crate::runtimes::RuntimeImage;
use crate::service::parse_bytes;
use crate::storage::store::{Claim, NewSession, SessionRow, State};
use sandboxd_catalog::egress::EgressMode;

/// The one open (or wake) in flight of a session in this process. It is taken before the row
/// goes to `opening` and dropped only once the row has left it (running, back to reclaimed, or
/// gone), so a concurrent open or wake that finds the row opening always has it to wait on and
/// never answers with a half-opened session. Dropping it (also on a panic) lets them go on.
pub(super) struct OpeningSlot<'a> {
    core: &'a Core,
    id: String,
    done: watch::Sender<bool>,
}

impl Drop for OpeningSlot<'_> {
    fn drop(&mut self) {
        if let Ok(mut m) = self.core.opening.lock()
            && m.get(&self.id)
                .is_some_and(|rx| rx.same_channel(&self.done.subscribe()))
        {
            m.remove(&self.id);
        }
        let _ = self.done.send(true);
    }
}

/// Whether this request got a session's [`OpeningSlot`], or another one holds it.
pub(super) enum Slot<'a> {
    Mine(OpeningSlot<'a>),
    Busy(watch::Receiver<bool>),
}

impl Core {
    /// The workspace size a new session gets: its own limit, else its runtime's, within the
    /// host's ceiling; `None` on a host that does not limit workspaces.
    pub(super) fn workspace_size_of(&self, runtime: &RuntimeImage, limits: &Limits) -> Option<u64> {
        let ceiling = self.settings.workspace_size?;
        let asked = limits
            .workspace_size
            .as_deref()
            .or(runtime.workspace_size.as_deref())
            .and_then(parse_bytes)
            .and_then(|b| u64::try_from(b).ok())
            .unwrap_or(ceiling);
        Some(asked.clamp(crate::workspace::disk::MIN_SIZE, ceiling))
    }

    pub(super) fn cap_error(&self, claim: &Claim, tenant: &str, asked: u64) -> ServiceError {
        let caps = self.caps();
        match claim {
            Claim::TenantWorkspaces { held } => ServiceError::TenantWorkspaces {
                tenant: tenant.to_owned(),
                held: *held,
                max: caps.max_workspaces_per_tenant,
            },
            Claim::Budget { held, workspaces } => ServiceError::WorkspaceBudget {
                budget: caps.workspace_budget.unwrap_or(u64::MAX),
                held: *held,
                workspaces: *workspaces,
                asked,
            },
            Claim::TenantCap { held } => ServiceError::TenantCap {
                tenant: tenant.to_owned(),
                held: *held,
                max: caps.max_per_tenant,
            },
            _ => {
                let held = if let Claim::HostCap { held } = claim {
                    *held
                } else {
                    caps.max_sessions
                };
                ServiceError::HostCap {
                    held,
                    max: caps.max_sessions,
                }
            }
        }
    }

    /// Opens a session by name: creates it, or finds it (waiting for a concurrent open of the
    /// same name). Concurrent opens make exactly one container.
    pub async fn open(&self, req: OpenRequest) -> Result<Opened, ServiceError> {
        let started = std::time::Instant::now();
        check_open(&req)?;
        let runtime = match self.runtime(req.runtime.as_deref()) {
            Ok(r) => r,
            Err(e) => {
                // Opening a session that exists is finding it, whatever its runtime does now.
                if let Some(row) = self.store.get(&req.name).await.map_err(db)?
                    && row.tenant == req.tenant
                    && row.state != State::Opening
                {
                    let row = self.owned_by(row, req.owner.as_deref()).await?;
                    return Ok(Opened {
                        created: false,
                        session: self.view(&row, false).await,
                        token: None,
                    });
                }
                return Err(e.into());
            }
        };
        let mut limits: Limits = req.limits.clone().unwrap_or_default();
        self.check_limits(&limits)?;
        // The row records the workspace size the session gets (its disk's size): a session
        // with one whose disk is gone is lost, never given a new empty disk.
        limits.workspace_size = self
            .workspace_size_of(&runtime, &limits)
            .map(|b| b.to_string());
        let token = auth::new_session_token();
        let hash = auth::hash(&token);
        let limits_json =
            serde_json::to_string(&limits).map_err(|e| ServiceError::internal(e.to_string()))?;
        let new = NewSession {
            id: &req.name,
            tenant: &req.tenant,
            runtime: &runtime.alias,
            image: &runtime.image,
            token_hash: &hash,
            limits: &limits_json,
            owner: req.owner.as_deref(),
            disk_bytes: limits
                .workspace_size
                .as_deref()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
        };
        // Take the session's slot before claiming, so a concurrent open that finds the row in
        // state opening always has something to wait on; one in flight is waited for first.
        let deadline = tokio::time::Instant::now() + OPEN_WAIT;
        let slot = loop {
            match self.take_slot(&req.name)? {
                Slot::Mine(slot) => break slot,
                Slot::Busy(rx) => {
                    Self::wait_done(rx, deadline, &req.name).await?;
                    if self.store.get(&req.name).await.map_err(db)?.is_none() {
                        return Err(Self::open_failed(&req.name));
                    }
                }
            }
        };
        let claim = self
            .store
            .claim(&new, self.caps())
            .instrument(tracing::info_span!("claim"))
            .await
            .map_err(db)?;
        if matches!(claim, Claim::Inserted) {
            // Before its container starts: its first connection already finds its policies.
            self.note_egress(&req.name, &runtime.alias, &req.egress)
                .await?;
        }
        match claim {
            Claim::Inserted => {
                let session = self.launch(&req, &runtime, &limits, started, slot).await?;
                // A warm container was made on its runtime's network; a session that narrows
                // to another mode is moved to its own.
                if !req.egress.is_empty() {
                    self.follow_egress_modes().await;
                }
                Ok(Opened {
                    created: true,
                    session,
                    token: Some(token),
                })
            }
            Claim::Exists(row) => {
                drop(slot);
                let row = *row;
                if row.tenant != req.tenant {
                    return Err(ServiceError::NameTaken { name: req.name });
                }
                // Never attach to (nor hand a token of) a session another object owns.
                let row = self.owned_by(row, req.owner.as_deref()).await?;
                let row = if row.state == State::Opening {
                    self.wait_opened(&req.name).await?
                } else {
                    row
                };
                // An open of a session that exists and names policies brings them up to date
                // (the operator opens again when a session's or its namespace's policy
                // changes); one that names none leaves them as they were.
                if !req.egress.is_empty() {
                    self.note_egress(&row.id, &row.runtime, &req.egress).await?;
                    // Narrowed to another mode (or widened back): its sandbox moves.
                    self.follow_egress_modes().await;
                }
                self.metrics
                    .opens
                    .get_or_create(&crate::metrics::Outcome::new("found"))
                    .inc();
                Ok(Opened {
                    created: false,
                    session: self.view(&row, false).await,
                    token: None,
                })
            }
            refused => {
                self.metrics
                    .opens
                    .get_or_create(&crate::metrics::Outcome::new("refused"))
                    .inc();
                Err(self.cap_error(&refused, &req.tenant, new.disk_bytes))
            }
        }
    }

    /// Gives the session `req` just claimed its container (a warm pool's, or a new one);
    /// a failure releases what this open made (disk, folder, row, tokens) and its `slot`.
    async fn launch(
        &self,
        req: &OpenRequest,
        runtime: &RuntimeImage,
        limits: &Limits,
        started: std::time::Instant,
        slot: OpeningSlot<'_>,
    ) -> Result<SessionView, ServiceError> {
        // A folder (or disk) this open makes is removed again if it fails, so that no
        // later open of the same name (by another tenant) inherits it.
        let folder = self.settings.workspace_root.join(&req.name);
        let had_folder = std::fs::symlink_metadata(&folder).is_ok();
        let had_disk = self.disks.size(&req.name).is_some();
        // A new folder can take a warm pool's container; one already there opens cold.
        let result = if let Some(key) = &req.from_snapshot {
            self.restore_and_create(&req.name, &req.tenant, runtime, limits, key)
                .instrument(tracing::info_span!("restore"))
                .await
        } else if had_folder || had_disk {
            self.create_container(&req.name, &req.tenant, runtime, limits)
                .await
                .map(|()| sandboxd_api::session::Launch::Cold)
        } else {
            crate::service::pool::open(self, &req.name, &req.tenant, runtime, limits)
                .instrument(tracing::info_span!("launch"))
                .await
        };
        match result {
            Ok(launch) => {
                self.metrics
                    .opens
                    .get_or_create(&crate::metrics::Outcome::new("created"))
                    .inc();
                self.metrics.observe_open(launch, started);
                let row = self.row(&req.name).await?;
                Ok(self.view(&row, false).await)
            }
            Err(e) => {
                // A failed open uses no capacity, nor the disk or folder it made.
                if !had_disk && let Err(err) = self.disks.release(&req.name) {
                    warn!(session = %req.name, error = %err, "cannot release the disk of a failed open");
                }
                if !had_folder && let Err(left) = self.discard_folder(&req.name) {
                    warn!(session = %req.name, error = %left, "a failed open could not remove the folder it made");
                }
                let _ = self.store.delete(&req.name).await;
                self.forget_tokens(&req.name);
                drop(slot);
                self.metrics
                    .opens
                    .get_or_create(&crate::metrics::Outcome::new("failed"))
                    .inc();
                Err(e)
            }
        }
    }

    /// `row` if `owner` may act on it: it has no owner (then `owner` adopts it) or the same
    /// one; [`ServiceError::OwnerMismatch`] when another owner holds it. `None` checks nothing.
    pub(super) async fn owned_by(
        &self,
        row: SessionRow,
        owner: Option<&str>,
    ) -> Result<SessionRow, ServiceError> {
        let Some(mine) = owner else {
            return Ok(row);
        };
        let row = if row.owner.is_none() {
            let id = row.id.clone();
            let adopted = self.store.adopt(&id, mine).await.map_err(db)?;
            let row = adopted.ok_or_else(|| ServiceError::NoSuchSession { id: id.clone() })?;
            if row.owner.as_deref() == Some(mine) {
                info!(session = %id, owner = mine, "session without an owner adopted");
            }
            row
        } else {
            row
        };
        match row.owner.as_deref() {
            Some(theirs) if theirs != mine => Err(owner_mismatch(&row.id, mine)),
            _ => Ok(row),
        }
    }

    /// Takes the session's [`OpeningSlot`], or says who holds it.
    pub(super) fn take_slot(&self, id: &str) -> Result<Slot<'_>, ServiceError> {
        let mut m = self
            .opening
            .lock()
            .map_err(|_| ServiceError::internal("open registry poisoned"))?;
        if let Some(rx) = m.get(id) {
            return Ok(Slot::Busy(rx.clone()));
        }
        let (done, rx) = watch::channel(false);
        m.insert(id.to_owned(), rx);
        Ok(Slot::Mine(OpeningSlot {
            core: self,
            id: id.to_owned(),
            done,
        }))
    }

    /// Waits, until `deadline`, for the open or wake in flight whose slot `rx` watches.
    pub(super) async fn wait_done(
        mut rx: watch::Receiver<bool>,
        deadline: tokio::time::Instant,
        id: &str,
    ) -> Result<(), ServiceError> {
        match tokio::time::timeout_at(deadline, rx.wait_for(|done| *done)).await {
            // Done, or its slot dropped: either way it is over.
            Ok(_) => Ok(()),
            Err(_) => Err(ServiceError::Opening { id: id.to_owned() }),
        }
    }

    pub(super) fn open_failed(id: &str) -> ServiceError {
        ServiceError::OpenFailed { id: id.to_owned() }
    }

    /// Waits for the open or wake in flight of a session and returns its row once it has left
    /// `opening` (running, reclaimed after a failed wake); [`ServiceError::OpenFailed`] when the
    /// open failed (the row is gone), [`ServiceError::Opening`] when it does not finish in time.
    pub(super) async fn wait_opened(&self, id: &str) -> Result<SessionRow, ServiceError> {
        let deadline = tokio::time::Instant::now() + OPEN_WAIT;
        let mut unattended = 0;
        loop {
            let rx = self.opening.lock().ok().and_then(|m| m.get(id).cloned());
            let waited = rx.is_some();
            if let Some(rx) = rx {
                Self::wait_done(rx, deadline, id).await?;
            }
            let row = self
                .store
                .get(id)
                .await
                .map_err(db)?
                .ok_or_else(|| Self::open_failed(id))?;
            if row.state != State::Opening {
                return Ok(row);
            }
            // Opening with no slot: one was taken just after the look (the next look sees
            // it), or the row was left so by a crash (the start-up reconcile fixes it).
            if !waited {
                unattended += 1;
                if unattended >= 3 {
                    return Err(ServiceError::Opening { id: id.to_owned() });
                }
                tokio::task::yield_now().await;
            }
        }
    }

    /// Makes (or mounts) session `id`'s workspace disk, on a host that limits workspaces.
    pub(super) async fn make_disk(
        &self,
        id: &str,
        runtime: &RuntimeImage,
        limits: &Limits,
    ) -> Result<(), ServiceError> {
        let Some(size) = self.workspace_size_of(runtime, limits) else {
            return Ok(());
        };
        let disks = self.disks.clone();
        let made = tokio::task::spawn_blocking({
            let id = id.to_owned();
            move || disks.create(&id, size)
        })
        .instrument(tracing::info_span!("disk", bytes = size))
        .await
        .map_err(|e| ServiceError::internal(format!("the disk task failed: {e}")))?;
        made.map_err(|e| ServiceError::disk(id, e))
    }

    pub(crate) async fn create_container(
        &self,
        id: &str,
        tenant: &str,
        runtime: &RuntimeImage,
        limits: &Limits,
    ) -> Result<(), ServiceError> {
        self.make_disk(id, runtime, limits).await?;
        let workspace = self.workspace(id);
        workspace.prepare()?;
        let spec = self
            .sandbox_spec(id, id, tenant, runtime, limits, &workspace)
            .await?;
        // A container left by an earlier crash under the same name is removed first.
        let _ = self.engine.remove(&self.engine.container_name(id)).await;
        let container = self
            .engine
            .create(&spec)
            .instrument(tracing::info_span!("container create"))
            .await
            .map_err(ServiceError::Docker)?;
        self.store
            .set_container(id, Some(&container))
            .await
            .map_err(db)?;
        // A wake after the runtime changed makes the container from its current image.
        self.store
            .set_image(id, &runtime.image, None)
            .await
            .map_err(db)?;
        if !self
            .store
            .transition(id, &[State::Opening], State::Running)
            .await
            .map_err(db)?
        {
            let _ = self.engine.remove(&container).await;
            return Err(ServiceError::ChangedWhileOpening { id: id.to_owned() });
        }
        info!(session = id, tenant, runtime = %runtime.alias, "session opened");
        Ok(())
    }

    /// What a sandbox of `runtime` with `limits` is created with, every session's and every
    /// warm pool container's alike: named `name` (its session, or the pool's name for it),
    /// its workspace `workspace`, its agent's run folder in the folder `folder` of the
    /// workspace root.
    pub(crate) async fn sandbox_spec(
        &self,
        name: &str,
        folder: &str,
        tenant: &str,
        runtime: &RuntimeImage,
        limits: &Limits,
        workspace: &Workspace,
    ) -> Result<SandboxSpec, ServiceError> {
        let s = &self.settings;
        let mode = self.mode_of(runtime.egress.mode, name);
        // Only a sandbox whose traffic goes through the egress proxy is given its CA: the
        // others keep their image's roots untouched.
        let trust = s
            .egress_trust
            .as_ref()
            .filter(|_| mode == EgressMode::Allowlist);
        let network_mode = match (&self.network, mode) {
            (_, EgressMode::None) => s.network_mode.clone(),
            (_, EgressMode::Allowlist) => {
                match &self.egress {
                    Some(egress) => egress.ensure().await.map_err(|source| {
                        ServiceError::NetworkUnavailable {
                            runtime: runtime.alias.clone(),
                            source,
                        }
                    })?,
                    None => {
                        return Err(ServiceError::internal(format!(
                            "runtime '{}' has the egress mode allowlist, and this sandboxd has no egress network",
                            runtime.alias
                        )));
                    }
                }
            }
            (None, EgressMode::Open) => s.runtime_network.clone(),
            (Some(network), EgressMode::Open) => {
                network
                    .ensure()
                    .await
                    .map_err(|source| ServiceError::NetworkUnavailable {
                        runtime: runtime.alias.clone(),
                        source,
                    })?
            }
        };
        let (cpus, memory, pids_limit) = self.shape(runtime, limits);
        let oci_runtime = self.oci_runtime_of(runtime).await?;
        let resolv_conf = self.gvisor_resolver(oci_runtime.as_deref(), mode).await;
        Ok(SandboxSpec {
            session: name.to_owned(),
            tenant: tenant.to_owned(),
            image: runtime.image.clone(),
            workspace: workspace.dir().display().to_string(),
            uid: s.uid,
            network_mode,
            cpus,
            memory,
            pids_limit,
            tmpfs_size: s.tmpfs_size.clone(),
            home_size: s.home_size.clone(),
            oci_runtime,
            resolv_conf,
            // The runtime's environment, then what points clients at the trust bundle (last:
            // it holds the system roots too, and the egress CA that credentials need).
            env: runtime
                .env
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .chain(trust.iter().flat_map(|t| t.env()))
                // A gVisor sandbox sleeps with its memory: its agent can bind its socket again
                // after a restore.
                .chain(
                    (runtime.isolation == sandboxd_catalog::Isolation::Gvisor)
                        .then(|| format!("{}=1", sandbox_agent::pause::RESUMABLE_ENV)),
                )
                .collect(),
            trust: trust.cloned(),
            agent: self.runner.agent_mount(folder).map_err(|e| {
                ServiceError::internal(format!("cannot prepare the agent folder of '{name}': {e}"))
            })?,
        })
    }

    /// The resolv.conf of a gVisor sandbox on a network. gVisor's network stack keeps the
    /// sandbox's loopback to itself, so Docker's embedded resolver (127.0.0.11, served in the
    /// container's namespace outside gVisor) is out of its reach; the sandbox is given a
    /// resolver it reaches instead: on the egress network the bridge's address (its port 53 is
    /// redirected to the egress resolver, as every sandbox's DNS there is), on the open network
    /// the upstream the egress resolver asks (SANDBOXD_EGRESS_RESOLVER or the node's). `None`:
    /// not gVisor, no network, or no upstream a resolv.conf can name (on loopback, or on
    /// another port than 53: said in the log; names do not resolve then).
    async fn gvisor_resolver(&self, oci: Option<&str>, mode: EgressMode) -> Option<String> {
        if oci != Some(self.settings.gvisor_runtime.as_str()) || mode == EgressMode::None {
            return None;
        }
        let egress = self.egress.as_ref()?;
        let server = match mode {
            EgressMode::Allowlist => std::net::IpAddr::V4(egress.gateway().await?),
            _ => {
                let upstream = egress.upstream();
                if upstream.port() != 53
                    || upstream.ip().is_loopback()
                    || upstream.ip().is_unspecified()
                {
                    warn!(
                        upstream = %upstream,
                        "a gVisor sandbox on the open network cannot name the resolver {upstream} in its resolv.conf (it must be off loopback, on port 53): names will not resolve in it"
                    );
                    return None;
                }
                upstream.ip()
            }
        };
        let path = self
            .settings
            .resolv_dir
            .join(format!("nameserver-{server}.conf"));
        if !path.exists() {
            let written = std::fs::create_dir_all(&self.settings.resolv_dir).and_then(|()| {
                let staged = path.with_extension("tmp");
                std::fs::write(&staged, format!("nameserver {server}\noptions ndots:0\n"))?;
                std::fs::rename(&staged, &path)
            });
            if let Err(e) = written {
                warn!(path = %path.display(), error = %e, "cannot write a gVisor sandbox's resolv.conf: names will not resolve in it");
                return None;
            }
        }
        Some(path.display().to_string())
    }

    /// The CPUs, memory (bytes) and processes a sandbox of `runtime` with `limits` gets.
    pub(crate) fn shape(&self, runtime: &RuntimeImage, limits: &Limits) -> (f64, i64, i64) {
        let s = &self.settings;
        let memory = limits
            .mem_limit
            .as_deref()
            .or(runtime.mem_limit.as_deref())
            .and_then(parse_bytes)
            .unwrap_or(s.memory);
        (
            limits.cpus.unwrap_or(s.cpus),
            memory,
            limits.pids_limit.unwrap_or(s.pids_limit),
        )
    }

    pub(super) fn limits_of(row: &SessionRow) -> Limits {
        serde_json::from_str(&row.limits).unwrap_or_default()
    }

    /// Marks a session lost when its workspace vanished; returns [`ServiceError::Lost`] then.
    pub(super) async fn check_workspace(&self, row: &SessionRow) -> Result<(), ServiceError> {
        if row.state == State::Lost {
            return Err(ServiceError::Lost { id: row.id.clone() });
        }
        let has_disk = self.disks.size(&row.id).is_some();
        if !has_disk && row.state != State::Opening && Self::limits_of(row).workspace_size.is_some()
        {
            warn!(session = %row.id, "the workspace's disk image vanished");
            return self.mark_lost(row).await;
        }
        // A session's disk that is not mounted (the node restarted) is mounted first: its
        // empty mount point must never pass for the workspace.
        if self.disks.size(&row.id).is_some() && !self.disks.is_mounted(&row.id) {
            let disks = self.disks.clone();
            let id = row.id.clone();
            tokio::task::spawn_blocking(move || disks.mount(&id))
                .await
                .map_err(|e| ServiceError::internal(format!("the disk task failed: {e}")))?
                .map_err(|e| ServiceError::disk(&row.id, e))?;
        }
        if self.workspace(&row.id).exists() {
            return Ok(());
        }
        warn!(session = %row.id, "workspace vanished; session is lost");
        self.mark_lost(row).await
    }

    /// Makes a session lost (its container removed); returns [`ServiceError::Lost`].
    pub(super) async fn mark_lost(&self, row: &SessionRow) -> Result<(), ServiceError> {
        if self
            .store
            .transition(
                &row.id,
                &[
                    State::Opening,
                    State::Running,
                    State::Stopped,
                    State::Reclaimed,
                ],
                State::Lost,
            )
            .await
            .map_err(db)?
            && let Some(c) = &row.container_id
        {
            let _ = self.engine.remove(c).await;
            let _ = self.store.set_container(&row.id, None).await;
        }
        Err(ServiceError::Lost { id: row.id.clone() })
    }
}

/// Refuses an open whose name, tenant or owner is not one, with the rule it broke.
fn check_open(req: &OpenRequest) -> Result<(), ServiceError> {
    if !valid_session_id(&req.name) {
        return Err(ServiceError::invalid(format!(
            "name '{}' is not a session name: 1 to 128 characters, letters, digits, '-', '_' or '.', starting with a letter or digit",
            req.name
        )));
    }
    if req.tenant.trim().is_empty() {
        return Err(ServiceError::invalid(
            "tenant must not be empty: send the organization id",
        ));
    }
    if let Some(owner) = &req.owner
        && !valid_owner(owner)
    {
        return Err(ServiceError::invalid(format!(
            "owner '{owner}' is not an owner: 1 to 128 visible ASCII characters (send the object's uid)"
        )));
    }
    if let Some(key) = &req.from_snapshot
        && !(key.contains('/') && crate::snapshot::valid_name(key))
    {
        return Err(crate::snapshot::SnapshotError::BadName(key.clone()).into());
    }
    Ok(())
}
