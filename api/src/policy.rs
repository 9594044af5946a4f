//! The policy of a host as `GET /v1/policy` shows it: what changes live and what needs a
//! restart.

use serde::{Deserialize, Serialize};

/// The settings that change live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Policy {
    /// Sessions this host holds at most (`SANDBOXD_MAX_SESSIONS`).
    pub max_sessions: u32,
    /// Sessions one tenant holds at most (`SANDBOXD_MAX_SESSIONS_PER_TENANT`).
    pub max_sessions_per_tenant: u32,
    /// Longest run, seconds (`SANDBOXD_EXECUTE_TIMEOUT`).
    pub execute_timeout: u64,
    /// Largest read, bytes (`SANDBOXD_MAX_READ_BYTES`).
    pub max_read_bytes: u64,
    /// Output kept per stream of a run, bytes (`SANDBOXD_MAX_OUTPUT_BYTES`).
    pub max_output_bytes: u64,
}

/// What cannot change at runtime, shown so a caller sees the whole picture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Fixed {
    /// The allowlisted runtime aliases (changed through `PUT /v1/runtimes`, never the policy).
    pub runtimes: Vec<String>,
    /// Network of sessions whose runtime needs none.
    pub network_mode: String,
    /// Network of sessions whose runtime needs one.
    pub runtime_network: String,
    /// OCI runtime of sandboxes.
    pub oci_runtime: Option<String>,
    /// uid of every sandbox.
    pub sandbox_uid: u32,
    /// The work dir inside a sandbox.
    pub work_dir: String,
    /// The host folder of the workspaces.
    pub workspace_root: String,
    /// Whether closed containers are kept.
    pub persist_containers: bool,
    /// CPUs per sandbox.
    pub cpus: f64,
    /// Memory per sandbox, bytes.
    pub memory: i64,
    /// Processes per sandbox.
    pub pids_limit: i64,
    /// Size of the tmpfs at /tmp.
    pub tmpfs_size: String,
    /// Workspace size per sandbox (default and ceiling), bytes; absent when workspaces are not
    /// limited (SANDBOXD_WORKSPACE_QUOTA=off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_size: Option<u64>,
    /// The bytes of workspace disks the host holds at most, their nominal sizes, sleeping and
    /// reclaimed workspaces included (`SANDBOXD_WORKSPACE_BUDGET`); absent when workspaces are
    /// not limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_budget: Option<u64>,
    /// Workspaces one tenant holds at most on the host, in any state until destroyed
    /// (`SANDBOXD_MAX_WORKSPACES_PER_TENANT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_workspaces_per_tenant: Option<u32>,
}

/// The workspaces a host holds: every one not yet destroyed (sleeping and reclaimed included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorkspaceUse {
    /// How many.
    pub workspaces: u32,
    /// Their nominal sizes added up, with the checkpoints of gvisor sessions asleep with their
    /// memory (what each takes on the node's disk), bytes.
    pub bytes: u64,
}

/// The body of `GET /v1/policy` and of a successful `PUT /v1/policy`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PolicyView {
    /// The live settings.
    #[serde(flatten)]
    pub policy: Policy,
    /// What needs a restart.
    pub fixed: Fixed,
    /// What the host's workspaces hold now, against `fixed.workspace_budget`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspaces: Option<WorkspaceUse>,
}
