//! Snapshots of a session's workspace in the object store (see [`crate::snapshot`]): taken
//! with the sandbox frozen (Docker's pause) for the moment of the copy, so that no process
//! writes a file while it is read; restored into a new session's empty workspace before its
//! container starts (its launch `restored`); deleted, with a collection of the chunks no
//! snapshot names any more.
//!
//! A snapshot holds the workspace only: a sandbox's root is its image, read-only, and what it
//! writes outside the workspace (`/tmp`, a home on tmpfs) is gone with every new container
//! anyway, so there is no writable layer to keep.

use std::time::{Duration, Instant};

use sandboxd_api::session::{Launch, Limits, SnapshotRequest, SnapshotView};
use tracing::{info, warn};

use super::open::Slot;
use super::{Core, ServiceError, db};
use crate::runtimes::RuntimeImage;
use crate::snapshot::{Manifest, SnapshotError, Store, valid_name};
use crate::storage::store::State;

/// The object store of a host's snapshots, and how long an unnamed chunk is kept.
pub struct Snapshots {
    /// The store.
    pub store: Store,
    /// A chunk no manifest names is deleted by a collection only when older than this.
    pub grace: Duration,
}

/// The key of snapshot `name` in `scope` (`scope/name`), checked.
pub fn key_of(scope: &str, name: &str) -> Result<String, ServiceError> {
    let key = format!("{scope}/{name}");
    if scope.contains('/') || name.contains('/') {
        return Err(SnapshotError::BadName(key).into());
    }
    if valid_name(&key) {
        Ok(key)
    } else {
        Err(SnapshotError::BadName(key).into())
    }
}

fn view(m: &Manifest) -> SnapshotView {
    SnapshotView {
        key: m.name.clone(),
        created_at: m.created_at.clone(),
        bytes: m.bytes,
        entries: m.entries.len() as u64,
        chunk_count: m.chunk_count as u64,
        chunks_sent: 0,
        bytes_sent: 0,
        paused_ms: 0,
    }
}

impl Core {
    /// The core with an object store for snapshots.
    pub fn with_snapshots(mut self, snapshots: Snapshots) -> Self {
        self.snapshots = Some(snapshots);
        self
    }

    fn snapshot_store(&self) -> Result<&Snapshots, ServiceError> {
        self.snapshots.as_ref().ok_or(ServiceError::NoSnapshotStore)
    }

    /// Takes a snapshot of session `id`'s workspace as `req` names it. A running sandbox is
    /// frozen while its files are read and goes on after, also when the snapshot fails; no
    /// open or wake of the session runs meanwhile.
    pub async fn take_snapshot(
        &self,
        id: &str,
        req: &SnapshotRequest,
    ) -> Result<SnapshotView, ServiceError> {
        let store = self.snapshot_store()?.store.clone();
        let key = key_of(&req.scope, &req.name)?;
        let row = self.row(id).await?;
        if matches!(row.state, State::Opening | State::Lost | State::Destroying) {
            return Err(ServiceError::unsettled(id, row.state));
        }
        let _slot = match self.take_slot(id)? {
            Slot::Mine(slot) => slot,
            Slot::Busy(_) => return Err(ServiceError::Opening { id: id.to_owned() }),
        };
        let disks = self.disks.clone();
        let mounted = tokio::task::spawn_blocking({
            let id = id.to_owned();
            move || disks.mount(&id)
        })
        .await
        .map_err(|e| ServiceError::internal(format!("the disk task failed: {e}")))?;
        mounted.map_err(|e| ServiceError::disk(id, e))?;
        let workspace = self.workspace(id);
        if !workspace.dir().is_dir() {
            return Err(ServiceError::Lost { id: id.to_owned() });
        }
        let frozen = match (&row.state, &row.container_id) {
            (State::Running, Some(c)) if !self.engine.is_noop() => {
                let docker = self.engine.docker().map_err(ServiceError::Docker)?;
                match docker.freeze(c).await {
                    Ok(()) => Some(c.clone()),
                    // A container that stopped meanwhile has nothing to freeze.
                    Err(_) if self.engine.running(c).await.ok().flatten() != Some(true) => None,
                    Err(e) => return Err(ServiceError::Docker(e)),
                }
            }
            _ => None,
        };
        let started = Instant::now();
        let taken = store.snapshot(&key, workspace.dir()).await;
        let paused_ms = if let Some(c) = &frozen {
            if let Ok(docker) = self.engine.docker()
                && let Err(e) = docker.thaw(c).await
            {
                warn!(session = id, error = %e, "cannot unpause the sandbox after its snapshot");
            }
            u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
        } else {
            0
        };
        let taken = taken.inspect_err(|e| {
            warn!(session = id, snapshot = %key, error = %e, "snapshot failed");
        })?;
        info!(
            session = id,
            snapshot = %key,
            bytes = taken.manifest.bytes,
            chunks_sent = taken.chunks_sent,
            ms = started.elapsed().as_millis(),
            paused_ms,
            "snapshot taken"
        );
        Ok(SnapshotView {
            chunks_sent: taken.chunks_sent as u64,
            bytes_sent: taken.bytes_sent,
            paused_ms,
            ..view(&taken.manifest)
        })
    }

    /// Snapshot `key` as the store holds it.
    pub async fn show_snapshot(&self, key: &str) -> Result<SnapshotView, ServiceError> {
        let store = &self.snapshot_store()?.store;
        Ok(view(&store.manifest(key).await?))
    }

    /// Deletes snapshot `key` (one already gone is fine), then collects, in the background,
    /// the chunks no snapshot names that are older than the grace.
    pub async fn delete_snapshot(&self, key: &str) -> Result<(), ServiceError> {
        let snapshots = self.snapshot_store()?;
        snapshots.store.delete(key).await?;
        info!(snapshot = %key, "snapshot deleted");
        let (store, grace) = (snapshots.store.clone(), snapshots.grace);
        tokio::spawn(async move {
            match store.collect(grace).await {
                Ok(n) => info!(chunks = n, "snapshot chunks collected"),
                Err(e) => warn!(error = %e, "the collection of snapshot chunks failed"),
            }
        });
        Ok(())
    }

    /// Gives the session `id` just claimed a workspace restored from snapshot `key` and a
    /// container on it. What this makes is released by the caller when it fails.
    pub(super) async fn restore_and_create(
        &self,
        id: &str,
        tenant: &str,
        runtime: &RuntimeImage,
        limits: &Limits,
        key: &str,
    ) -> Result<Launch, ServiceError> {
        let store = self.snapshot_store()?.store.clone();
        // The manifest first: a snapshot that is not there, or does not fit, makes no disk.
        let manifest = store.manifest(key).await?;
        if let Some(size) = self.workspace_size_of(runtime, limits)
            && manifest.bytes > size
        {
            return Err(ServiceError::invalid(format!(
                "snapshot '{key}' holds {} of files, more than the session's workspace of {}: open it with a larger workspace_size",
                crate::workspace::disk::human(manifest.bytes),
                crate::workspace::disk::human(size)
            )));
        }
        self.make_disk(id, runtime, limits).await?;
        let workspace = self.workspace(id);
        workspace.prepare()?;
        let started = Instant::now();
        let restored = store
            .restore_in(key, workspace.dir(), (self.settings.uid, self.settings.uid))
            .await?;
        info!(
            session = id,
            snapshot = %key,
            bytes = restored.bytes,
            entries = restored.entries.len(),
            ms = started.elapsed().as_millis(),
            "workspace restored"
        );
        self.create_container(id, tenant, runtime, limits).await?;
        self.store.set_restored(id).await.map_err(db)?;
        Ok(Launch::Restored)
    }
}
