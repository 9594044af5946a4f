//! What went wrong in the core, in its own words: a [`ServiceError`] says what happened (no such
//! session, a session still opening, a cap reached, Docker failed, ...), never how a surface
//! answers it. The `/v1` API gives each one its status and code in one place
//! ([`crate::http::error`]); the wire protocol words them its own way. The message of an error
//! is its `Display`, the same on every surface.

use crate::container::DockerError;
use crate::container::network::NetworkError;
use crate::run::RunError;
use crate::runtimes::RuntimeError;
use crate::storage::store::State;
use crate::workspace::FileError;
use crate::workspace::disk::{DiskError, human};

/// Why the core refused or failed an operation.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The request cannot be carried out as it is (a name, tenant, owner, limit, command or
    /// policy body that is not valid); the message says what to change.
    #[error("{0}")]
    InvalidRequest(String),
    /// No session has this id.
    #[error("No such session '{id}'")]
    NoSuchSession {
        /// The session.
        id: String,
    },
    /// An open or wake of the session is still in flight.
    #[error("Session '{id}' is still opening")]
    Opening {
        /// The session.
        id: String,
    },
    /// The session is being destroyed.
    #[error("Session '{id}' is being destroyed")]
    Destroying {
        /// The session.
        id: String,
    },
    /// The session changed while it was opening (it was destroyed or reclaimed meanwhile).
    #[error("Session '{id}' changed while it was opening")]
    ChangedWhileOpening {
        /// The session.
        id: String,
    },
    /// The session changed under the request.
    #[error("Session '{id}' changed; try again")]
    Changed {
        /// The session.
        id: String,
    },
    /// The session is being rebuilt: a run, or another rebuild, waits until it is done.
    #[error(
        "Session '{id}' is being rebuilt (its container is recreated from its runtime's current image; the workspace stays); run the command again once it is done"
    )]
    Rebuilding {
        /// The session.
        id: String,
    },
    /// A run stopped because its session is being rebuilt.
    #[error(
        "The run was stopped: session '{id}' is being rebuilt (its container is recreated from its runtime's current image; the workspace stays); run it again once the session runs"
    )]
    StoppedForRebuild {
        /// The session.
        id: String,
    },
    /// A rebuild refused as asked (the runtime names another image here, runs in flight
    /// when an idle one was asked for); the message says why.
    #[error("{0}")]
    RebuildRefused(String),
    /// A pause refused (the runtime is not gvisor, the container is a warm pool's, the
    /// checkpoint failed); the message says why and what the session was left with.
    #[error("{0}")]
    PauseRefused(String),
    /// A rebuild that failed after the old container was removed.
    #[error(
        "The rebuild of session '{id}' onto image {image} failed: {message}. The workspace is kept; the session has no container until it is rebuilt again or woken"
    )]
    RebuildFailed {
        /// The session.
        id: String,
        /// The image it was to run.
        image: String,
        /// What failed.
        message: String,
    },
    /// The session's workspace vanished: the session is lost, never given an empty one.
    #[error(
        "The workspace of session '{id}' is gone (deleted on the host, expired, or the host was rebuilt); it is not replaced with an empty one. Open a new session"
    )]
    Lost {
        /// The session.
        id: String,
    },
    /// The session was destroyed while a command ran (or as it started): the environment is
    /// gone, the command did not fail by itself.
    #[error("Session '{id}' was destroyed while the command ran: the session is gone")]
    Gone {
        /// The session.
        id: String,
    },
    /// The session belongs to another owner than the one the request names.
    #[error(
        "Session '{id}' belongs to another owner than '{owner}': it was not opened, given a token or destroyed for this one"
    )]
    OwnerMismatch {
        /// The session.
        id: String,
        /// The owner the request named.
        owner: String,
    },
    /// The name is held by a session of another tenant.
    #[error("Session name '{name}' is taken by another tenant")]
    NameTaken {
        /// The session name.
        name: String,
    },
    /// A concurrent open of the session, which this one waited for, failed.
    #[error("A concurrent open of session '{id}' failed; open it again")]
    OpenFailed {
        /// The session.
        id: String,
    },
    /// The tenant holds as many sessions as it may.
    #[error(
        "Tenant '{tenant}' already holds {held} of {max} sessions. Release an idle session before opening another."
    )]
    TenantCap {
        /// The tenant.
        tenant: String,
        /// Sessions it holds.
        held: u32,
        /// Sessions it may hold.
        max: u32,
    },
    /// The host holds as many sessions as it may.
    #[error(
        "This host already holds {held} of {max} sessions. Release an idle session before opening another."
    )]
    HostCap {
        /// Sessions the host holds.
        held: u32,
        /// Sessions it may hold.
        max: u32,
    },
    /// The tenant holds as many workspaces as it may, asleep and reclaimed ones included.
    #[error(
        "Tenant '{tenant}' already holds {held} of {max} workspaces on this host (SANDBOXD_MAX_WORKSPACES_PER_TENANT; sleeping and reclaimed sessions count until they are destroyed). Destroy a session before opening another."
    )]
    TenantWorkspaces {
        /// The tenant.
        tenant: String,
        /// Workspaces it holds.
        held: u32,
        /// Workspaces it may hold.
        max: u32,
    },
    /// The host's workspace budget has no room for another workspace disk.
    #[error(
        "This host's workspace budget of {} (SANDBOXD_WORKSPACE_BUDGET) has no room for a workspace of {}: {workspaces} workspaces hold {} (sleeping and reclaimed sessions count until they are destroyed). Destroy a session or open it on another host.",
        human(*.budget), human(*.asked), human(*.held)
    )]
    WorkspaceBudget {
        /// The budget, bytes.
        budget: u64,
        /// Bytes the host's workspaces hold.
        held: u64,
        /// How many workspaces hold them.
        workspaces: u32,
        /// The size of the workspace asked for.
        asked: u64,
    },
    /// The session's file operations waiting for a worker are as many as may wait.
    #[error("{0}")]
    FileWorkBusy(String),
    /// The budget of bytes in flight (the host's or the session's) has no room for a run's
    /// output buffers; the text says which.
    #[error("{0}")]
    MemoryBusy(String),
    /// The session has as many runs in flight as it may.
    #[error(
        "Session '{id}' already has {held} of {max} runs in flight (SANDBOXD_MAX_RUNS_PER_SESSION). Wait for one to finish or stop one."
    )]
    RunCap {
        /// The session.
        id: String,
        /// Runs in flight.
        held: usize,
        /// Runs it may have in flight.
        max: usize,
    },
    /// A run with this id is in flight.
    #[error("Run '{run_id}' is already running")]
    RunExists {
        /// The run.
        run_id: String,
    },
    /// No run of this id is running in the session (to stop).
    #[error("No run '{run_id}' is running in session '{id}'")]
    RunNotRunning {
        /// The session.
        id: String,
        /// The run.
        run_id: String,
    },
    /// No run of this id is known in the session, in flight or finished.
    #[error("No run '{run_id}' is known in session '{id}'")]
    RunUnknown {
        /// The session.
        id: String,
        /// The run.
        run_id: String,
    },
    /// The session has as many watches open as it may.
    #[error(
        "Session '{id}' already has {max} watches open, the most a session may have: close one first",
        max = super::watches::MAX_WATCHES_PER_SESSION
    )]
    WatchLimit {
        /// The session.
        id: String,
    },
    /// A port not open, over the cap, or not reached; the text says which.
    #[error("{0}")]
    Port(super::PortRefusal),
    /// A terminal the session cannot have, or does not have; the text says which.
    #[error("{0}")]
    Terminal(crate::run::terminal::TermError),
    /// The caller of a run went away before it ended: the run was stopped.
    #[error("the caller went away; the run was stopped")]
    RunCancelled,
    /// A reclaim on a host that keeps the containers of its sessions.
    #[error(
        "This host keeps the containers of its sessions (SANDBOXD_PERSIST_CONTAINERS=true), so reclaiming is off; stop the session to let it sleep"
    )]
    ContainersPersist,
    /// The runtime needs a network and the sessions' network cannot be set up.
    #[error(
        "Runtime '{runtime}' needs a network, and this host cannot give it one safely: {source}"
    )]
    NetworkUnavailable {
        /// The runtime.
        runtime: String,
        /// Why the network cannot be set up.
        #[source]
        source: NetworkError,
    },
    /// A policy change was refused (nothing was applied); the text lists every refused field.
    #[error("The policy was not changed: {0}")]
    PolicyRefused(String),
    /// The runtime asked for cannot be used (not allowlisted, its image not built).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A file operation on the workspace failed.
    #[error(transparent)]
    File(#[from] FileError),
    /// The node has no room for a session's workspace disk ([`DiskError::NoRoom`]).
    #[error(transparent)]
    HostDiskFull(DiskError),
    /// A session's workspace disk could not be made, mounted or released.
    #[error("the workspace disk of session '{id}': {source}")]
    Disk {
        /// The session.
        id: String,
        /// What failed.
        #[source]
        source: DiskError,
    },
    /// This host has no object store for snapshots (SANDBOXD_S3_ENDPOINT unset).
    #[error(
        "this host keeps no snapshots: sandboxd has no object store (set SANDBOXD_S3_ENDPOINT and SANDBOXD_S3_BUCKET, the chart's snapshots.store)"
    )]
    NoSnapshotStore,
    /// A snapshot could not be taken, restored, shown or deleted.
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::SnapshotError),
    /// Docker failed.
    #[error(transparent)]
    Docker(#[from] DockerError),
    /// The run path could not carry out a run, or reach the session's agent.
    #[error(transparent)]
    Run(#[from] RunError),
    /// sandboxd's state store failed.
    #[error("sandboxd's state store failed: {0}")]
    Store(#[from] sqlx::Error),
    /// Something else failed inside sandboxd.
    #[error("{0}")]
    Internal(String),
}

impl ServiceError {
    /// The refusal of an act on session `id` in `state`, for the states that take none now:
    /// opening (or waking, or being rebuilt), lost, being destroyed. A state that does take
    /// acts was left behind by a concurrent request: `Changed`.
    pub(crate) fn unsettled(id: &str, state: State) -> Self {
        let id = id.to_owned();
        match state {
            State::Opening => Self::Opening { id },
            State::Lost => Self::Lost { id },
            State::Destroying => Self::Destroying { id },
            State::Running | State::Stopped | State::Reclaimed => Self::Changed { id },
        }
    }

    /// A request the core refuses as it is, with what to change.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::InvalidRequest(message.into())
    }

    /// A failure inside sandboxd.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::Internal(message.into())
    }

    /// A disk failure of session `id`: a full node, or anything else.
    pub fn disk(id: &str, e: DiskError) -> Self {
        match e {
            DiskError::NoRoom { .. } => Self::HostDiskFull(e),
            source => Self::Disk {
                id: id.to_owned(),
                source,
            },
        }
    }

    /// Whether the session, or its workspace, is gone: lost, destroyed under a run, or its
    /// workspace directory vanished under a file operation.
    pub fn is_gone(&self) -> bool {
        matches!(
            self,
            Self::Lost { .. } | Self::Gone { .. } | Self::File(FileError::WorkspaceMissing)
        )
    }
}
