//! Sessions: the open request and its answer, a session as the API shows it, its state and
//! limits, and what a destroy did.

use serde::{Deserialize, Serialize};

/// Where a session is in its life on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = State)]
pub enum SessionState {
    /// The container is being created and started.
    Opening,
    /// The container runs.
    Running,
    /// Asleep: the container is stopped, the files stay.
    Stopped,
    /// The container was removed; the workspace stays.
    Reclaimed,
    /// The workspace vanished; reported, never recreated empty.
    Lost,
    /// Being destroyed.
    Destroying,
}

/// How a session's container was started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Launch {
    /// Created and started for this session.
    #[default]
    Cold,
    /// Taken from its runtime's warm pool: started before the open asked for it.
    Warm,
    /// Created for this session with its workspace restored from a snapshot first.
    Restored,
}

/// Per-session resource limits, within the host's ceilings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Memory in Docker's syntax.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_limit: Option<String>,
    /// Processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<i64>,
    /// Workspace size in Docker's syntax: writing past it fails with "No space left on device".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_size: Option<String>,
}

/// A request to open a session by name.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenRequest {
    /// The session name (its id on this host).
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    pub name: String,
    /// The tenant, counted against the per-tenant cap.
    pub tenant: String,
    /// The runtime alias; the first allowlisted one when absent.
    #[serde(default)]
    pub runtime: Option<String>,
    /// Resource limits.
    #[serde(default)]
    pub limits: Option<Limits>,
    /// The object the session belongs to (the operator sends its SandboxSession's uid). An
    /// open naming another owner than the session's is refused (409 `owner_mismatch`); a
    /// session without one is adopted. Absent: no owner is checked or recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[!-~]{1,128}$")]
    pub owner: Option<String>,
    /// Further policies the session's connections must also satisfy (the session's own
    /// narrowing and its namespace's ceiling); sandboxd allows a connection only when its
    /// runtime's policy and every one of these allow it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<sandboxd_catalog::egress::Egress>,
    /// The snapshot a new session's workspace is restored from (`<scope>/<name>`, the key
    /// `POST /v1/sessions/{id}/snapshots` answered with): every file is written and checked before
    /// the container starts, and the session's launch is `restored`. A snapshot that is not
    /// in the store, or whose chunks are missing or corrupt, fails the open and leaves
    /// nothing behind. An open that finds the session already there restores nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$")]
    pub from_snapshot: Option<String>,
}

/// `POST /v1/sessions/{id}/snapshots`: what to call the snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// Its name, a DNS subdomain (a SandboxSnapshot's name); a snapshot of the same scope
    /// and name is replaced.
    pub name: String,
    /// The scope it is kept under, a DNS label (the operator sends the session's namespace):
    /// its key is `<scope>/<name>`, what a restore names.
    pub scope: String,
}

/// A snapshot in the object store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SnapshotView {
    /// `<scope>/<name>`: what an open's `from_snapshot` names.
    pub key: String,
    /// When it was taken (RFC 3339).
    pub created_at: String,
    /// The bytes of its files.
    pub bytes: u64,
    /// Its files, folders and symlinks.
    pub entries: u64,
    /// The distinct chunks it needs.
    pub chunk_count: u64,
    /// Chunks this snapshot sent (the others were in the store already); 0 when shown later.
    #[serde(default)]
    pub chunks_sent: u64,
    /// Compressed bytes this snapshot sent; 0 when shown later.
    #[serde(default)]
    pub bytes_sent: u64,
    /// How long the sandbox was paused for it, in milliseconds; 0 when shown later.
    #[serde(default)]
    pub paused_ms: u64,
}

/// What an open did.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Opened {
    /// Whether this request created the session.
    #[serde(skip)]
    pub created: bool,
    /// The session.
    #[serde(flatten)]
    pub session: SessionView,
    /// The session token: only in the response that created it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// A session as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionView {
    /// The id.
    pub id: String,
    /// The tenant.
    pub tenant: String,
    /// The runtime alias.
    pub runtime: String,
    /// The image.
    pub image: String,
    /// opening, running, stopped, reclaimed, lost or destroying.
    pub state: SessionState,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339 of the last run or file operation.
    pub last_activity_at: String,
    /// Runs in flight now.
    pub runs_in_flight: usize,
    /// CPU time the container used, in nanoseconds (when it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ns: Option<u64>,
    /// Whether the workspace folder still exists on the host.
    pub workspace_exists: bool,
    /// The object the session belongs to, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// How its container was last started: `warm` (taken from its runtime's warm pool) or
    /// `cold` (created for it) or `restored` (created for it, its workspace restored from a
    /// snapshot first).
    #[serde(default)]
    pub launch: Launch,
    /// The image its runtime names on this host now; another than `image` means the session
    /// runs an old image until it is rebuilt. Absent when the runtime left the allowlist (or
    /// from a host before rebuilds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_image: Option<String>,
    /// The limits its container was made with (the workspace size in bytes); the next
    /// container it gets has them too.
    #[serde(default)]
    pub limits: Limits,
    /// What its sandbox uses now, as Docker reports the container's cgroup (sampled at most
    /// every 2 s); `null` when it is not running (asleep, reclaimed, opening).
    #[serde(default)]
    pub usage: Option<SessionUsage>,
    /// The `version` of the egress credentials this host holds for the session (`PUT
    /// /v1/sessions/{id}/credentials`); absent when it holds none (never handed, or sandboxd
    /// restarted: they live in its memory only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_version: Option<String>,
    /// What its last sleep with memory (a checkpoint) or wake from one (a restore) did: only
    /// sessions of gvisor runtimes have one. A failed one says why and what the session was
    /// left with (asleep without its memory, awake fresh with its files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryNote>,
}

/// A checkpoint or a restore of a session's memory, as the session's view reports the last
/// one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MemoryNote {
    /// `checkpoint` (a sleep with memory) or `restore` (the wake from it).
    pub op: MemoryOp,
    /// Whether the memory was kept (false: it failed, see `error`).
    pub kept: bool,
    /// What it left the session with: `asleep with its memory`, `asleep without its memory`,
    /// `awake with its memory` or `awake fresh with its files`.
    pub outcome: String,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When, RFC 3339.
    pub at: String,
}

/// What a [`MemoryNote`] is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MemoryOp {
    /// A sleep that checkpointed the sandbox.
    Checkpoint,
    /// A wake that restored it.
    Restore,
}

impl MemoryNote {
    /// One line for a person: the outcome, and why a failed one failed.
    pub fn line(&self) -> String {
        match (&self.error, self.op) {
            (None, _) => self.outcome.clone(),
            (Some(e), MemoryOp::Checkpoint) => {
                format!("{}: the checkpoint failed: {e}", self.outcome)
            }
            (Some(e), MemoryOp::Restore) => format!("{}: the restore failed: {e}", self.outcome),
        }
    }
}

/// What a running sandbox uses at one moment (the wire protocol's `SessionUsage`). Each figure
/// is `null` when Docker did not report it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionUsage {
    /// Memory the container's cgroup holds, bytes (as Docker's stats report it, page cache
    /// included).
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// The container's memory limit, bytes.
    #[serde(default)]
    pub memory_limit_bytes: Option<u64>,
    /// CPU use since the previous sample, in percent of one core (200 is two cores busy).
    #[serde(default)]
    pub cpu_percent: Option<f64>,
    /// Processes (and threads) in the container, its PID 1 included.
    #[serde(default)]
    pub pids: Option<u64>,
}

/// A request to rebuild a session: its container recreated from its runtime's current image
/// with these limits, the workspace kept.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RebuildRequest {
    /// The image the rebuild must land on: refused (409 `rebuild_refused`) when the session's
    /// runtime names another on this host. Absent: whatever it names now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The limits of the new container, whole (as an open takes them); absent keeps the
    /// session's. A workspace size grows the disk in place and never shrinks it (400 naming
    /// the current size); absent keeps the size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// Only while no run is in flight: refused (409 `rebuild_refused`) when one is, instead
    /// of stopping it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idle_only: bool,
}

/// What a destroy did.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct Destroyed {
    /// The id.
    pub id: String,
    /// False when there was nothing left to destroy.
    pub destroyed: bool,
    /// In words.
    pub message: String,
}
