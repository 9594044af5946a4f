//! The body of every error response and its code.

use serde::{Deserialize, Serialize};

/// The body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// A stable, snake_case code a client can branch on.
    #[schema(value_type = String)]
    pub code: ErrorCode,
    /// A sentence for a person: what went wrong and what to do.
    pub message: String,
}

/// The stable code of an error, as the `code` of its body: snake_case on the wire, matched on
/// by callers. A code this version does not know (from a newer server) is kept as it came.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// A request that cannot be read or is malformed (400).
    BadRequest,
    /// A missing or wrong token (401).
    Unauthorized,
    /// A token that may not reach this route or session (403).
    Forbidden,
    /// The server's own "no such session" (404).
    SessionNotFound,
    /// A route this server does not serve (404): another version.
    RouteNotFound,
    /// An open of the session is still in flight (409).
    SessionOpening,
    /// The session is being destroyed (409).
    SessionDestroying,
    /// The session changed under the request (409).
    SessionChanged,
    /// The session is being rebuilt: runs and other rebuilds wait until it is done (409).
    SessionRebuilding,
    /// A rebuild refused as asked: the runtime names another image on this host, or the
    /// session has runs in flight and the rebuild asked for an idle one (409).
    RebuildRefused,
    /// A pause refused: the session's runtime is not gvisor, its container is a warm pool's,
    /// or the checkpoint failed (the message says what the session was left with) (409).
    PauseRefused,
    /// A rebuild that failed after the old container was removed: the workspace is kept and
    /// the session has no container until it is rebuilt again or woken (502).
    RebuildFailed,
    /// The workspace vanished (410).
    SessionLost,
    /// The session was destroyed while a command ran (410).
    SessionGone,
    /// The session belongs to another owner (409).
    OwnerMismatch,
    /// The name is held by a session of another tenant or runtime (409).
    NameTaken,
    /// The runtime is not allowlisted (400).
    UnknownRuntime,
    /// The runtime's image is still being built (409).
    RuntimePreparing,
    /// The runtime's image could not be built (503).
    RuntimeFailed,
    /// The runtime's isolation (gvisor) is not offered by this host's dockerd (503).
    IsolationUnavailable,
    /// The tenant's cap of sessions is reached (429).
    TenantCap,
    /// The host's cap of sessions is reached (429).
    HostCap,
    /// The tenant's cap of workspaces on the host is reached, sleeping and reclaimed ones
    /// included (429).
    TenantWorkspaces,
    /// The host's workspace budget has no room for the workspace asked for (429).
    WorkspaceBudget,
    /// The host's disk is too full to open a session (507).
    HostDiskFull,
    /// The container could not be created or started (502).
    OpenFailed,
    /// The sessions' network cannot be set up (503).
    NetworkUnavailable,
    /// Docker failed (502).
    DockerError,
    /// A reclaim on a host that keeps containers (409).
    ContainersPersist,
    /// No such run (404).
    RunNotFound,
    /// A run with this id is in flight (409).
    RunExists,
    /// The session's cap of runs in flight is reached (429).
    RunCap,
    /// The sandbox is at its process limit and its running runs hold every process (429).
    ProcessLimit,
    /// No such terminal (404).
    TerminalNotFound,
    /// The session's cap of running terminals is reached (429).
    TerminalLimit,
    /// The session's sandbox cannot hold terminals: its run path is Docker exec, or its agent
    /// predates them until the session is rebuilt (409).
    TerminalsUnavailable,
    /// The port is not open on the session (404).
    PortNotOpen,
    /// Nothing in the sandbox answers on the port (502).
    PortClosed,
    /// The port accepted the connection but did not answer in time (504).
    PortTimeout,
    /// The session has as many ports open as it may (429).
    PortLimit,
    /// A preview link that is malformed, not signed for its session and port, or whose session
    /// is gone or has a new token (403).
    PreviewInvalid,
    /// A preview link past its expiry (403).
    PreviewExpired,
    /// No snapshot of that name in the object store (404).
    SnapshotNotFound,
    /// A snapshot whose chunks are missing or corrupt, or whose manifest is bad (422).
    SnapshotCorrupt,
    /// This host has no object store for snapshots, or the store failed (503).
    SnapshotsUnavailable,
    /// The session has as many file watches open as it may (429).
    WatchLimit,
    /// The run was cancelled before it started.
    RunCancelled,
    /// A policy change was refused (422).
    PolicyRefused,
    /// A malformed allowlist (422).
    InvalidCatalog,
    /// A body or file over its limit (413).
    TooLarge,
    /// Something failed inside sandboxd (500).
    Internal,
    /// A path that is not a workspace path (400).
    InvalidPath,
    /// A path that leads out of the workspace (403).
    OutsideWorkspace,
    /// No such file or folder (404).
    NotFound,
    /// A folder where a file was expected (409).
    IsADirectory,
    /// A file where a folder was expected (409).
    NotADirectory,
    /// A folder that is not empty, removed without `recursive` (409).
    DirectoryNotEmpty,
    /// The workspace is over its size (507).
    WorkspaceFull,
    /// The file may not be read or written (403).
    PermissionDenied,
    /// Not a regular file (409).
    NotARegularFile,
    /// A file operation ran past its deadline or lost its client, and was stopped (503).
    FileWorkStopped,
    /// The session's share of file work, or the host's, is taken: retry shortly (503).
    FileWorkBusy,
    /// sandboxd's budget of bytes in flight (the host's or the session's) is full: retry
    /// shortly (503).
    MemoryBusy,
    /// The file operation failed on the host (500).
    IoError,
    /// An answer without a body of this API (made by the client, never sent by sandboxd).
    HttpError,
    /// A code this version does not know.
    Other(String),
}

impl ErrorCode {
    /// Every code this version knows.
    pub const ALL: [ErrorCode; 65] = [
        Self::BadRequest,
        Self::Unauthorized,
        Self::Forbidden,
        Self::SessionNotFound,
        Self::RouteNotFound,
        Self::SessionOpening,
        Self::SessionDestroying,
        Self::SessionChanged,
        Self::SessionRebuilding,
        Self::RebuildRefused,
        Self::PauseRefused,
        Self::RebuildFailed,
        Self::SessionLost,
        Self::SessionGone,
        Self::OwnerMismatch,
        Self::NameTaken,
        Self::UnknownRuntime,
        Self::RuntimePreparing,
        Self::RuntimeFailed,
        Self::IsolationUnavailable,
        Self::TenantCap,
        Self::HostCap,
        Self::TenantWorkspaces,
        Self::WorkspaceBudget,
        Self::HostDiskFull,
        Self::OpenFailed,
        Self::NetworkUnavailable,
        Self::DockerError,
        Self::ContainersPersist,
        Self::RunNotFound,
        Self::RunExists,
        Self::RunCap,
        Self::TerminalNotFound,
        Self::TerminalLimit,
        Self::TerminalsUnavailable,
        Self::PortNotOpen,
        Self::PortClosed,
        Self::PortTimeout,
        Self::PortLimit,
        Self::PreviewInvalid,
        Self::PreviewExpired,
        Self::SnapshotNotFound,
        Self::SnapshotCorrupt,
        Self::SnapshotsUnavailable,
        Self::WatchLimit,
        Self::ProcessLimit,
        Self::RunCancelled,
        Self::PolicyRefused,
        Self::InvalidCatalog,
        Self::TooLarge,
        Self::Internal,
        Self::InvalidPath,
        Self::OutsideWorkspace,
        Self::NotFound,
        Self::IsADirectory,
        Self::NotADirectory,
        Self::DirectoryNotEmpty,
        Self::WorkspaceFull,
        Self::PermissionDenied,
        Self::NotARegularFile,
        Self::FileWorkStopped,
        Self::FileWorkBusy,
        Self::MemoryBusy,
        Self::IoError,
        Self::HttpError,
    ];

    /// The code as the wire carries it.
    pub fn as_str(&self) -> &str {
        match self {
            Self::BadRequest => "bad_request",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::SessionNotFound => "session_not_found",
            Self::RouteNotFound => "route_not_found",
            Self::SessionOpening => "session_opening",
            Self::SessionDestroying => "session_destroying",
            Self::SessionChanged => "session_changed",
            Self::SessionRebuilding => "session_rebuilding",
            Self::RebuildRefused => "rebuild_refused",
            Self::PauseRefused => "pause_refused",
            Self::RebuildFailed => "rebuild_failed",
            Self::SessionLost => "session_lost",
            Self::SessionGone => "session_gone",
            Self::OwnerMismatch => "owner_mismatch",
            Self::NameTaken => "name_taken",
            Self::UnknownRuntime => "unknown_runtime",
            Self::RuntimePreparing => "runtime_preparing",
            Self::RuntimeFailed => "runtime_failed",
            Self::IsolationUnavailable => "isolation_unavailable",
            Self::TenantCap => "tenant_cap",
            Self::HostCap => "host_cap",
            Self::TenantWorkspaces => "tenant_workspaces",
            Self::WorkspaceBudget => "workspace_budget",
            Self::HostDiskFull => "host_disk_full",
            Self::OpenFailed => "open_failed",
            Self::NetworkUnavailable => "network_unavailable",
            Self::DockerError => "docker_error",
            Self::ContainersPersist => "containers_persist",
            Self::RunNotFound => "run_not_found",
            Self::RunExists => "run_exists",
            Self::RunCap => "run_cap",
            Self::TerminalNotFound => "terminal_not_found",
            Self::TerminalLimit => "terminal_limit",
            Self::TerminalsUnavailable => "terminals_unavailable",
            Self::PortNotOpen => "port_not_open",
            Self::PortClosed => "port_closed",
            Self::PortTimeout => "port_timeout",
            Self::PortLimit => "port_limit",
            Self::PreviewInvalid => "preview_invalid",
            Self::PreviewExpired => "preview_expired",
            Self::SnapshotNotFound => "snapshot_not_found",
            Self::SnapshotCorrupt => "snapshot_corrupt",
            Self::SnapshotsUnavailable => "snapshots_unavailable",
            Self::WatchLimit => "watch_limit",
            Self::ProcessLimit => "process_limit",
            Self::RunCancelled => "run_cancelled",
            Self::PolicyRefused => "policy_refused",
            Self::InvalidCatalog => "invalid_catalog",
            Self::TooLarge => "too_large",
            Self::Internal => "internal",
            Self::InvalidPath => "invalid_path",
            Self::OutsideWorkspace => "outside_workspace",
            Self::NotFound => "not_found",
            Self::IsADirectory => "is_a_directory",
            Self::NotADirectory => "not_a_directory",
            Self::DirectoryNotEmpty => "directory_not_empty",
            Self::WorkspaceFull => "workspace_full",
            Self::PermissionDenied => "permission_denied",
            Self::NotARegularFile => "not_a_regular_file",
            Self::FileWorkStopped => "file_work_stopped",
            Self::FileWorkBusy => "file_work_busy",
            Self::MemoryBusy => "memory_busy",
            Self::IoError => "io_error",
            Self::HttpError => "http_error",
            Self::Other(code) => code,
        }
    }
}

impl From<&str> for ErrorCode {
    fn from(code: &str) -> Self {
        match code {
            "bad_request" => Self::BadRequest,
            "unauthorized" => Self::Unauthorized,
            "forbidden" => Self::Forbidden,
            "session_not_found" => Self::SessionNotFound,
            "route_not_found" => Self::RouteNotFound,
            "session_opening" => Self::SessionOpening,
            "session_destroying" => Self::SessionDestroying,
            "session_changed" => Self::SessionChanged,
            "session_rebuilding" => Self::SessionRebuilding,
            "rebuild_refused" => Self::RebuildRefused,
            "pause_refused" => Self::PauseRefused,
            "rebuild_failed" => Self::RebuildFailed,
            "session_lost" => Self::SessionLost,
            "session_gone" => Self::SessionGone,
            "owner_mismatch" => Self::OwnerMismatch,
            "name_taken" => Self::NameTaken,
            "unknown_runtime" => Self::UnknownRuntime,
            "runtime_preparing" => Self::RuntimePreparing,
            "runtime_failed" => Self::RuntimeFailed,
            "isolation_unavailable" => Self::IsolationUnavailable,
            "tenant_cap" => Self::TenantCap,
            "host_cap" => Self::HostCap,
            "tenant_workspaces" => Self::TenantWorkspaces,
            "workspace_budget" => Self::WorkspaceBudget,
            "host_disk_full" => Self::HostDiskFull,
            "open_failed" => Self::OpenFailed,
            "network_unavailable" => Self::NetworkUnavailable,
            "docker_error" => Self::DockerError,
            "containers_persist" => Self::ContainersPersist,
            "run_not_found" => Self::RunNotFound,
            "run_exists" => Self::RunExists,
            "run_cap" => Self::RunCap,
            "terminal_not_found" => Self::TerminalNotFound,
            "terminal_limit" => Self::TerminalLimit,
            "terminals_unavailable" => Self::TerminalsUnavailable,
            "port_not_open" => Self::PortNotOpen,
            "port_closed" => Self::PortClosed,
            "port_timeout" => Self::PortTimeout,
            "port_limit" => Self::PortLimit,
            "preview_invalid" => Self::PreviewInvalid,
            "preview_expired" => Self::PreviewExpired,
            "snapshot_not_found" => Self::SnapshotNotFound,
            "snapshot_corrupt" => Self::SnapshotCorrupt,
            "snapshots_unavailable" => Self::SnapshotsUnavailable,
            "watch_limit" => Self::WatchLimit,
            "process_limit" => Self::ProcessLimit,
            "run_cancelled" => Self::RunCancelled,
            "policy_refused" => Self::PolicyRefused,
            "invalid_catalog" => Self::InvalidCatalog,
            "too_large" => Self::TooLarge,
            "internal" => Self::Internal,
            "invalid_path" => Self::InvalidPath,
            "outside_workspace" => Self::OutsideWorkspace,
            "not_found" => Self::NotFound,
            "is_a_directory" => Self::IsADirectory,
            "not_a_directory" => Self::NotADirectory,
            "directory_not_empty" => Self::DirectoryNotEmpty,
            "workspace_full" => Self::WorkspaceFull,
            "permission_denied" => Self::PermissionDenied,
            "not_a_regular_file" => Self::NotARegularFile,
            "file_work_stopped" => Self::FileWorkStopped,
            "file_work_busy" => Self::FileWorkBusy,
            "memory_busy" => Self::MemoryBusy,
            "io_error" => Self::IoError,
            "http_error" => Self::HttpError,
            other => Self::Other(other.to_owned()),
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let code = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Ok(Self::from(code.as_ref()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_reads_back_as_itself() {
        for code in ErrorCode::ALL {
            let wire = serde_json::to_string(&code).expect("serialize");
            assert_eq!(wire, format!("\"{}\"", code.as_str()));
            let back: ErrorCode = serde_json::from_str(&wire).expect("deserialize");
            assert_eq!(back, code);
            assert!(!matches!(
                ErrorCode::from(code.as_str()),
                ErrorCode::Other(_)
            ));
        }
    }

    #[test]
    fn an_unknown_code_is_kept_as_it_came() {
        let code: ErrorCode = serde_json::from_str("\"quota_exhausted\"").expect("deserialize");
        assert_eq!(code, ErrorCode::Other("quota_exhausted".to_owned()));
        assert_eq!(
            serde_json::to_string(&code).expect("serialize"),
            "\"quota_exhausted\""
        );
    }
}
