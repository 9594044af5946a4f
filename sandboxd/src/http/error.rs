//! The errors of the `/v1` API: every one is `{"code": "...", "message": "..."}` with a fitting
//! status.
//!
//! What went wrong below HTTP is said in the domain's own types: [`ServiceError`] (the core),
//! [`RuntimeError`] (the runtimes) and [`FileError`] (a workspace's files). Each is given its
//! status and code here, by one mapping (`status_and_code`), and keeps its message; the handlers
//! turn them into an [`ApiError`] with `?`. What only the HTTP edge refuses (no token, a body
//! that does not parse) is an [`ApiError`] from the start.
//!
//! Over 600 lines with its table tests: a row for every error of every room, with its status, code and message.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::run::RunError;
use crate::run::ports::PortError;
use crate::run::terminal::TermError;
use crate::runtimes::RuntimeError;
use crate::service::PortRefusal;
use crate::service::ServiceError;
use crate::snapshot::SnapshotError;
use crate::workspace::FileError;
pub use sandboxd_api::error::{ErrorBody, ErrorCode};

/// An error with its HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// The stable code.
    pub code: ErrorCode,
    /// The message.
    pub message: String,
}

impl ApiError {
    /// An error with status, code and message.
    pub fn new(status: u16, code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }
    /// 400 `bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, ErrorCode::BadRequest, message)
    }
    /// 401 `unauthorized`: missing or wrong token. Says nothing about what exists.
    pub fn unauthorized() -> Self {
        Self::new(
            401,
            ErrorCode::Unauthorized,
            "a valid token is required: send Authorization: Bearer <token>",
        )
    }
    /// 403 `forbidden`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, ErrorCode::Forbidden, message)
    }
    /// 500 `internal`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, ErrorCode::Internal, message)
    }
}

impl ServiceError {
    /// The status and code the API answers this error with.
    pub fn status_and_code(&self) -> (u16, ErrorCode) {
        match self {
            Self::InvalidRequest(_) => (400, ErrorCode::BadRequest),
            Self::NoSuchSession { .. } => (404, ErrorCode::SessionNotFound),
            Self::Opening { .. } => (409, ErrorCode::SessionOpening),
            Self::Destroying { .. } => (409, ErrorCode::SessionDestroying),
            Self::ChangedWhileOpening { .. } | Self::Changed { .. } => {
                (409, ErrorCode::SessionChanged)
            }
            Self::Rebuilding { .. } | Self::StoppedForRebuild { .. } => {
                (409, ErrorCode::SessionRebuilding)
            }
            Self::RebuildRefused(_) => (409, ErrorCode::RebuildRefused),
            Self::PauseRefused(_) => (409, ErrorCode::PauseRefused),
            Self::RebuildFailed { .. } => (502, ErrorCode::RebuildFailed),
            Self::Lost { .. } => (410, ErrorCode::SessionLost),
            Self::Gone { .. } => (410, ErrorCode::SessionGone),
            Self::OwnerMismatch { .. } => (409, ErrorCode::OwnerMismatch),
            Self::NameTaken { .. } => (409, ErrorCode::NameTaken),
            Self::OpenFailed { .. } => (502, ErrorCode::OpenFailed),
            Self::TenantCap { .. } => (429, ErrorCode::TenantCap),
            Self::HostCap { .. } => (429, ErrorCode::HostCap),
            Self::TenantWorkspaces { .. } => (429, ErrorCode::TenantWorkspaces),
            Self::WorkspaceBudget { .. } => (429, ErrorCode::WorkspaceBudget),
            Self::RunCap { .. } => (429, ErrorCode::RunCap),
            Self::MemoryBusy(_) => (503, ErrorCode::MemoryBusy),
            Self::FileWorkBusy(_) => (503, ErrorCode::FileWorkBusy),
            Self::RunExists { .. } => (409, ErrorCode::RunExists),
            Self::RunNotRunning { .. } | Self::RunUnknown { .. } => (404, ErrorCode::RunNotFound),
            // nginx's "client closed request": nobody is left to read it.
            Self::RunCancelled => (499, ErrorCode::RunCancelled),
            Self::WatchLimit { .. } => (429, ErrorCode::WatchLimit),
            Self::Port(e) => match e {
                PortRefusal::NotOpen { .. } => (404, ErrorCode::PortNotOpen),
                PortRefusal::Limit { .. } => (429, ErrorCode::PortLimit),
                PortRefusal::Timeout { .. } => (504, ErrorCode::PortTimeout),
                PortRefusal::PreviewInvalid => (403, ErrorCode::PreviewInvalid),
                PortRefusal::PreviewExpired { .. } => (403, ErrorCode::PreviewExpired),
                PortRefusal::Connect(PortError::Closed(_)) => (502, ErrorCode::PortClosed),
                PortRefusal::Connect(PortError::Unavailable(_)) => {
                    (409, ErrorCode::TerminalsUnavailable)
                }
                PortRefusal::Connect(PortError::Failed(_)) => (502, ErrorCode::DockerError),
            },
            Self::Terminal(e) => match e {
                TermError::Unavailable(_) => (409, ErrorCode::TerminalsUnavailable),
                TermError::Limit(_) => (429, ErrorCode::TerminalLimit),
                TermError::NotFound(_) => (404, ErrorCode::TerminalNotFound),
                TermError::Exists(_) => (409, ErrorCode::RunExists),
                TermError::Failed(_) => (502, ErrorCode::DockerError),
            },
            Self::ContainersPersist => (409, ErrorCode::ContainersPersist),
            Self::NetworkUnavailable { .. } => (503, ErrorCode::NetworkUnavailable),
            Self::PolicyRefused(_) => (422, ErrorCode::PolicyRefused),
            Self::Runtime(e) => e.status_and_code(),
            Self::File(e) => e.status_and_code(),
            Self::HostDiskFull(_) => (507, ErrorCode::HostDiskFull),
            Self::NoSnapshotStore => (503, ErrorCode::SnapshotsUnavailable),
            Self::Snapshot(e) => match e {
                SnapshotError::NotFound(_) => (404, ErrorCode::SnapshotNotFound),
                SnapshotError::Corrupt { .. } | SnapshotError::BadManifest { .. } => {
                    (422, ErrorCode::SnapshotCorrupt)
                }
                SnapshotError::BadName(_) => (400, ErrorCode::BadRequest),
                SnapshotError::Store(_) => (503, ErrorCode::SnapshotsUnavailable),
                SnapshotError::Io { .. }
                | SnapshotError::DestinationExists(_)
                | SnapshotError::NotEmpty(_) => (500, ErrorCode::Internal),
            },
            Self::Run(RunError::ProcessLimit(_)) => (429, ErrorCode::ProcessLimit),
            Self::Docker(_) | Self::Run(_) => (502, ErrorCode::DockerError),
            Self::Disk { .. } | Self::Store(_) | Self::Internal(_) => (500, ErrorCode::Internal),
        }
    }
}

impl RuntimeError {
    /// The status and code the API answers this error with.
    pub fn status_and_code(&self) -> (u16, ErrorCode) {
        match self {
            Self::Unknown { .. } => (400, ErrorCode::UnknownRuntime),
            Self::Preparing { .. } => (409, ErrorCode::RuntimePreparing),
            Self::Failed { .. } => (503, ErrorCode::RuntimeFailed),
            Self::IsolationUnavailable { .. } => (503, ErrorCode::IsolationUnavailable),
            Self::InvalidCatalog(_) => (422, ErrorCode::InvalidCatalog),
            Self::NoneAllowlisted | Self::NoState { .. } => (500, ErrorCode::Internal),
        }
    }
}

impl FileError {
    /// The status and code the API answers this error with.
    pub fn status_and_code(&self) -> (u16, ErrorCode) {
        match self {
            Self::InvalidPath { .. } => (400, ErrorCode::InvalidPath),
            Self::OutsideWorkspace { .. } => (403, ErrorCode::OutsideWorkspace),
            Self::NotFound { .. } => (404, ErrorCode::NotFound),
            Self::IsADirectory { .. } => (409, ErrorCode::IsADirectory),
            Self::NotADirectory { .. } => (409, ErrorCode::NotADirectory),
            Self::DirectoryNotEmpty { .. } => (409, ErrorCode::DirectoryNotEmpty),
            Self::TooLarge { .. } => (413, ErrorCode::TooLarge),
            Self::NoSpace { .. } => (507, ErrorCode::WorkspaceFull),
            Self::WorkspaceMissing => (410, ErrorCode::SessionLost),
            Self::PermissionDenied { .. } => (403, ErrorCode::PermissionDenied),
            Self::NotRegularFile { .. } => (409, ErrorCode::NotARegularFile),
            Self::Stopped { .. } => (503, ErrorCode::FileWorkStopped),
            Self::Busy { .. } => (503, ErrorCode::MemoryBusy),
            Self::Io { .. } => (500, ErrorCode::IoError),
        }
    }

    /// The code alone (an audit row's error).
    pub fn code(&self) -> ErrorCode {
        self.status_and_code().1
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        let (status, code) = e.status_and_code();
        Self::new(status, code, e.to_string())
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> Self {
        let (status, code) = e.status_and_code();
        Self::new(status, code, e.to_string())
    }
}

impl From<FileError> for ApiError {
    fn from(e: FileError) -> Self {
        let (status, code) = e.status_and_code();
        Self::new(status, code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (
            status,
            Json(ErrorBody {
                code: self.code,
                message: self.message,
            }),
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::DockerError;
    use crate::container::network::NetworkError;
    use crate::workspace::disk::DiskError;

    fn id() -> String {
        "s-1".to_owned()
    }

    fn docker() -> DockerError {
        DockerError {
            action: "start s-1".to_owned(),
            source: bollard::errors::Error::DockerResponseServerError {
                status_code: 500,
                message: "boom".to_owned(),
            },
        }
    }

    fn failed_build() -> RuntimeError {
        RuntimeError::Failed {
            alias: "python".to_owned(),
            attempts: 3,
            error: "pip failed".to_owned(),
            log_tail: "a\nb".to_owned(),
        }
    }

    /// Every runtime error: its status, its code and its message on the wire.
    fn runtime_errors() -> Vec<(RuntimeError, u16, ErrorCode, String)> {
        let catalog = sandboxd_catalog::CatalogErrors(vec![]);
        let catalog_message = catalog.to_string();
        vec![
            (
                RuntimeError::NoneAllowlisted,
                500,
                ErrorCode::Internal,
                "no runtime is allowlisted".to_owned(),
            ),
            (
                RuntimeError::Unknown {
                    alias: "ruby".to_owned(),
                    allowed: vec!["python".to_owned(), "node".to_owned()],
                },
                400,
                ErrorCode::UnknownRuntime,
                "Runtime 'ruby' is not allowed on this host; allowed: python, node".to_owned(),
            ),
            (
                RuntimeError::NoState {
                    alias: "python".to_owned(),
                },
                500,
                ErrorCode::Internal,
                "runtime 'python' has no state".to_owned(),
            ),
            (
                RuntimeError::Preparing {
                    alias: "python".to_owned(),
                    tag: "sandboxd-runtime:abc".to_owned(),
                    attempt: 2,
                },
                409,
                ErrorCode::RuntimePreparing,
                "Runtime 'python' is being prepared (its image sandboxd-runtime:abc is being built, attempt 2); try again shortly - a first build can take minutes".to_owned(),
            ),
            (
                failed_build(),
                503,
                ErrorCode::RuntimeFailed,
                "Runtime 'python' could not be built after 3 attempts: pip failed\nLast lines of the build log:\na\nb".to_owned(),
            ),
            (
                RuntimeError::IsolationUnavailable {
                    alias: "secure".to_owned(),
                    oci_runtime: "runsc".to_owned(),
                },
                503,
                ErrorCode::IsolationUnavailable,
                "Runtime 'secure' has isolation gvisor, and this host's dockerd offers no OCI runtime 'runsc' (SANDBOXD_GVISOR_RUNTIME): give dockerd the runtime (its \"runtimes\" setting, runsc on the node) or open the session on a host that has it".to_owned(),
            ),
            (
                RuntimeError::InvalidCatalog(catalog),
                422,
                ErrorCode::InvalidCatalog,
                catalog_message,
            ),
        ]
    }

    /// Every service error: its status, its code and its message on the wire. Over 150 lines
    /// because it is that table, one row per error.
    fn service_errors() -> Vec<(ServiceError, u16, ErrorCode, String)> {
        let no_room = DiskError::NoRoom {
            size: 1 << 30,
            root: "/var/lib/sandboxd".to_owned(),
        };
        let no_room_message = no_room.to_string();
        let docker_message = docker().to_string();
        let not_found = FileError::NotFound {
            path: "a.txt".to_owned(),
        };
        let not_found_message = not_found.to_string();
        let store = sqlx::Error::PoolTimedOut;
        let store_message = format!("sandboxd's state store failed: {store}");
        vec![
            (
                ServiceError::invalid("command must not be empty"),
                400,
                ErrorCode::BadRequest,
                "command must not be empty".to_owned(),
            ),
            (
                ServiceError::NoSuchSession { id: id() },
                404,
                ErrorCode::SessionNotFound,
                "No such session 's-1'".to_owned(),
            ),
            (
                ServiceError::Opening { id: id() },
                409,
                ErrorCode::SessionOpening,
                "Session 's-1' is still opening".to_owned(),
            ),
            (
                ServiceError::Destroying { id: id() },
                409,
                ErrorCode::SessionDestroying,
                "Session 's-1' is being destroyed".to_owned(),
            ),
            (
                ServiceError::ChangedWhileOpening { id: id() },
                409,
                ErrorCode::SessionChanged,
                "Session 's-1' changed while it was opening".to_owned(),
            ),
            (
                ServiceError::Changed { id: id() },
                409,
                ErrorCode::SessionChanged,
                "Session 's-1' changed; try again".to_owned(),
            ),
            (
                ServiceError::Rebuilding { id: id() },
                409,
                ErrorCode::SessionRebuilding,
                "Session 's-1' is being rebuilt (its container is recreated from its runtime's current image; the workspace stays); run the command again once it is done".to_owned(),
            ),
            (
                ServiceError::StoppedForRebuild { id: id() },
                409,
                ErrorCode::SessionRebuilding,
                "The run was stopped: session 's-1' is being rebuilt (its container is recreated from its runtime's current image; the workspace stays); run it again once the session runs".to_owned(),
            ),
            (
                ServiceError::RebuildRefused("runtime 'base' is at image b:2 on this host, not b:1: the session was not rebuilt".to_owned()),
                409,
                ErrorCode::RebuildRefused,
                "runtime 'base' is at image b:2 on this host, not b:1: the session was not rebuilt".to_owned(),
            ),
            (
                ServiceError::PauseRefused("session 's-1' runs on runtime 'base', whose isolation is runc".to_owned()),
                409,
                ErrorCode::PauseRefused,
                "session 's-1' runs on runtime 'base', whose isolation is runc".to_owned(),
            ),
            (
                ServiceError::RebuildFailed { id: id(), image: "b:2".to_owned(), message: "Docker said no".to_owned() },
                502,
                ErrorCode::RebuildFailed,
                "The rebuild of session 's-1' onto image b:2 failed: Docker said no. The workspace is kept; the session has no container until it is rebuilt again or woken".to_owned(),
            ),
            (
                ServiceError::Lost { id: id() },
                410,
                ErrorCode::SessionLost,
                "The workspace of session 's-1' is gone (deleted on the host, expired, or the host was rebuilt); it is not replaced with an empty one. Open a new session".to_owned(),
            ),
            (
                ServiceError::Gone { id: id() },
                410,
                ErrorCode::SessionGone,
                "Session 's-1' was destroyed while the command ran: the session is gone".to_owned(),
            ),
            (
                ServiceError::OwnerMismatch {
                    id: id(),
                    owner: "uid-2".to_owned(),
                },
                409,
                ErrorCode::OwnerMismatch,
                "Session 's-1' belongs to another owner than 'uid-2': it was not opened, given a token or destroyed for this one".to_owned(),
            ),
            (
                ServiceError::NameTaken { name: id() },
                409,
                ErrorCode::NameTaken,
                "Session name 's-1' is taken by another tenant".to_owned(),
            ),
            (
                ServiceError::OpenFailed { id: id() },
                502,
                ErrorCode::OpenFailed,
                "A concurrent open of session 's-1' failed; open it again".to_owned(),
            ),
            (
                ServiceError::TenantCap {
                    tenant: "acme".to_owned(),
                    held: 3,
                    max: 3,
                },
                429,
                ErrorCode::TenantCap,
                "Tenant 'acme' already holds 3 of 3 sessions. Release an idle session before opening another.".to_owned(),
            ),
            (
                ServiceError::HostCap { held: 20, max: 20 },
                429,
                ErrorCode::HostCap,
                "This host already holds 20 of 20 sessions. Release an idle session before opening another.".to_owned(),
            ),
            (
                ServiceError::TenantWorkspaces {
                    tenant: "acme".to_owned(),
                    held: 20,
                    max: 20,
                },
                429,
                ErrorCode::TenantWorkspaces,
                "Tenant 'acme' already holds 20 of 20 workspaces on this host (SANDBOXD_MAX_WORKSPACES_PER_TENANT; sleeping and reclaimed sessions count until they are destroyed). Destroy a session before opening another.".to_owned(),
            ),
            (
                ServiceError::WorkspaceBudget {
                    budget: 95 << 30,
                    held: 92 << 30,
                    workspaces: 23,
                    asked: 4 << 30,
                },
                429,
                ErrorCode::WorkspaceBudget,
                "This host's workspace budget of 95 GiB (SANDBOXD_WORKSPACE_BUDGET) has no room for a workspace of 4 GiB: 23 workspaces hold 92 GiB (sleeping and reclaimed sessions count until they are destroyed). Destroy a session or open it on another host.".to_owned(),
            ),
            (
                ServiceError::FileWorkBusy("session 's-1' waits".to_owned()),
                503,
                ErrorCode::FileWorkBusy,
                "session 's-1' waits".to_owned(),
            ),
            (
                ServiceError::MemoryBusy("session 's-1' holds 64 MiB".to_owned()),
                503,
                ErrorCode::MemoryBusy,
                "session 's-1' holds 64 MiB".to_owned(),
            ),
            (
                ServiceError::RunCap {
                    id: id(),
                    held: 8,
                    max: 8,
                },
                429,
                ErrorCode::RunCap,
                "Session 's-1' already has 8 of 8 runs in flight (SANDBOXD_MAX_RUNS_PER_SESSION). Wait for one to finish or stop one.".to_owned(),
            ),
            (
                ServiceError::WatchLimit { id: id() },
                429,
                ErrorCode::WatchLimit,
                "Session 's-1' already has 8 watches open, the most a session may have: close one first".to_owned(),
            ),
            (
                ServiceError::Port(PortRefusal::NotOpen {
                    id: id(),
                    port: 3000,
                }),
                404,
                ErrorCode::PortNotOpen,
                "Port 3000 of session 's-1' is not open: open it with POST /v1/sessions/s-1/ports {\"port\": 3000} (or the SandboxSession's spec.ports)".to_owned(),
            ),
            (
                ServiceError::Terminal(TermError::Limit(
                    "Session 's-1' already has 8 terminals running".to_owned(),
                )),
                429,
                ErrorCode::TerminalLimit,
                "Session 's-1' already has 8 terminals running".to_owned(),
            ),
            (
                ServiceError::RunExists {
                    run_id: "r-1".to_owned(),
                },
                409,
                ErrorCode::RunExists,
                "Run 'r-1' is already running".to_owned(),
            ),
            (
                ServiceError::RunNotRunning {
                    id: id(),
                    run_id: "r-1".to_owned(),
                },
                404,
                ErrorCode::RunNotFound,
                "No run 'r-1' is running in session 's-1'".to_owned(),
            ),
            (
                ServiceError::RunUnknown {
                    id: id(),
                    run_id: "r-1".to_owned(),
                },
                404,
                ErrorCode::RunNotFound,
                "No run 'r-1' is known in session 's-1'".to_owned(),
            ),
            (
                ServiceError::RunCancelled,
                499,
                ErrorCode::RunCancelled,
                "the caller went away; the run was stopped".to_owned(),
            ),
            (
                ServiceError::ContainersPersist,
                409,
                ErrorCode::ContainersPersist,
                "This host keeps the containers of its sessions (SANDBOXD_PERSIST_CONTAINERS=true), so reclaiming is off; stop the session to let it sleep".to_owned(),
            ),
            (
                ServiceError::NetworkUnavailable {
                    runtime: "web".to_owned(),
                    source: NetworkError::Invalid("no iptables".to_owned()),
                },
                503,
                ErrorCode::NetworkUnavailable,
                "Runtime 'web' needs a network, and this host cannot give it one safely: no iptables".to_owned(),
            ),
            (
                ServiceError::PolicyRefused("colour is not a policy field".to_owned()),
                422,
                ErrorCode::PolicyRefused,
                "The policy was not changed: colour is not a policy field".to_owned(),
            ),
            (
                ServiceError::Runtime(failed_build()),
                503,
                ErrorCode::RuntimeFailed,
                failed_build().to_string(),
            ),
            (
                ServiceError::File(not_found),
                404,
                ErrorCode::NotFound,
                not_found_message,
            ),
            (
                ServiceError::disk("s-1", no_room),
                507,
                ErrorCode::HostDiskFull,
                no_room_message,
            ),
            (
                ServiceError::disk(
                    "s-1",
                    DiskError::Tool {
                        what: "mkfs.ext4".to_owned(),
                        message: "no".to_owned(),
                    },
                ),
                500,
                ErrorCode::Internal,
                "the workspace disk of session 's-1': mkfs.ext4 failed: no".to_owned(),
            ),
            (
                ServiceError::NoSnapshotStore,
                503,
                ErrorCode::SnapshotsUnavailable,
                "this host keeps no snapshots: sandboxd has no object store (set SANDBOXD_S3_ENDPOINT and SANDBOXD_S3_BUCKET, the chart's snapshots.store)".to_owned(),
            ),
            (
                ServiceError::Snapshot(SnapshotError::Corrupt {
                    snapshot: "team-a/before".to_owned(),
                    file: "src/main.py".to_owned(),
                    chunk: "ab12".to_owned(),
                    why: "is missing from the store".to_owned(),
                }),
                422,
                ErrorCode::SnapshotCorrupt,
                "snapshot 'team-a/before' cannot be restored: file 'src/main.py' needs chunk ab12, which is missing from the store".to_owned(),
            ),
            (
                ServiceError::Docker(docker()),
                502,
                ErrorCode::DockerError,
                docker_message,
            ),
            (
                ServiceError::Run(RunError::ProcessLimit(
                    "cannot start /bin/sh: the sandbox is at its limit of 512 processes and its \
                     running runs hold them all; stop one to make room"
                        .to_owned(),
                )),
                429,
                ErrorCode::ProcessLimit,
                "the run could not start: cannot start /bin/sh: the sandbox is at its limit of \
                 512 processes and its running runs hold them all; stop one to make room"
                    .to_owned(),
            ),
            (
                ServiceError::Run(RunError::Start("no such container".to_owned())),
                502,
                ErrorCode::DockerError,
                "the run could not start: no such container".to_owned(),
            ),
            (
                ServiceError::Store(store),
                500,
                ErrorCode::Internal,
                store_message,
            ),
            (
                ServiceError::internal("run registry poisoned"),
                500,
                ErrorCode::Internal,
                "run registry poisoned".to_owned(),
            ),
        ]
    }

    /// Whether the table lists `e`'s variant. No wildcard: a new variant does not compile until
    /// it is given its status and code there too.
    fn listed(e: &ServiceError) -> bool {
        match e {
            ServiceError::InvalidRequest(_)
            | ServiceError::NoSuchSession { .. }
            | ServiceError::Opening { .. }
            | ServiceError::Destroying { .. }
            | ServiceError::ChangedWhileOpening { .. }
            | ServiceError::Changed { .. }
            | ServiceError::Rebuilding { .. }
            | ServiceError::StoppedForRebuild { .. }
            | ServiceError::RebuildRefused(_)
            | ServiceError::PauseRefused(_)
            | ServiceError::RebuildFailed { .. }
            | ServiceError::Lost { .. }
            | ServiceError::Gone { .. }
            | ServiceError::OwnerMismatch { .. }
            | ServiceError::NameTaken { .. }
            | ServiceError::OpenFailed { .. }
            | ServiceError::TenantCap { .. }
            | ServiceError::HostCap { .. }
            | ServiceError::TenantWorkspaces { .. }
            | ServiceError::WorkspaceBudget { .. }
            | ServiceError::RunCap { .. }
            | ServiceError::MemoryBusy(_)
            | ServiceError::FileWorkBusy(_)
            | ServiceError::RunExists { .. }
            | ServiceError::RunNotRunning { .. }
            | ServiceError::RunUnknown { .. }
            | ServiceError::RunCancelled
            | ServiceError::Terminal(_)
            | ServiceError::Port(_)
            | ServiceError::WatchLimit { .. }
            | ServiceError::ContainersPersist
            | ServiceError::NetworkUnavailable { .. }
            | ServiceError::PolicyRefused(_)
            | ServiceError::Runtime(_)
            | ServiceError::File(_)
            | ServiceError::HostDiskFull(_)
            | ServiceError::NoSnapshotStore
            | ServiceError::Snapshot(_)
            | ServiceError::Disk { .. }
            | ServiceError::Docker(_)
            | ServiceError::Run(_)
            | ServiceError::Store(_)
            | ServiceError::Internal(_) => true,
        }
    }

    #[test]
    fn every_service_error_has_its_status_code_and_message() {
        let table = service_errors();
        let variants: std::collections::HashSet<_> = table
            .iter()
            .map(|(e, ..)| std::mem::discriminant(e))
            .collect();
        assert_eq!(variants.len(), 43, "one row per variant of ServiceError");
        for (e, status, code, message) in table {
            assert!(listed(&e));
            let what = format!("{e:?}");
            assert_eq!(
                ApiError::from(e),
                ApiError::new(status, code, message),
                "{what}"
            );
        }
    }

    #[test]
    fn every_runtime_error_has_its_status_code_and_message() {
        for (e, status, code, message) in runtime_errors() {
            let what = format!("{e:?}");
            assert_eq!(
                ApiError::from(e.clone()),
                ApiError::new(status, code.clone(), message.clone()),
                "{what}"
            );
            // Through the service, a runtime error keeps its status, code and message.
            assert_eq!(
                ApiError::from(ServiceError::Runtime(e)),
                ApiError::new(status, code, message),
                "{what}"
            );
        }
    }

    #[test]
    fn every_file_error_has_its_status_and_code() {
        let p = || "p".to_owned();
        let cases = [
            (
                FileError::InvalidPath {
                    path: p(),
                    reason: "r".to_owned(),
                },
                400,
                ErrorCode::InvalidPath,
            ),
            (
                FileError::OutsideWorkspace { path: p() },
                403,
                ErrorCode::OutsideWorkspace,
            ),
            (FileError::NotFound { path: p() }, 404, ErrorCode::NotFound),
            (
                FileError::IsADirectory { path: p() },
                409,
                ErrorCode::IsADirectory,
            ),
            (
                FileError::NotADirectory { path: p() },
                409,
                ErrorCode::NotADirectory,
            ),
            (
                FileError::DirectoryNotEmpty { path: p() },
                409,
                ErrorCode::DirectoryNotEmpty,
            ),
            (
                FileError::TooLarge { size: 2, limit: 1 },
                413,
                ErrorCode::TooLarge,
            ),
            (
                FileError::NoSpace {
                    path: p(),
                    limit: None,
                },
                507,
                ErrorCode::WorkspaceFull,
            ),
            (FileError::WorkspaceMissing, 410, ErrorCode::SessionLost),
            (
                FileError::PermissionDenied { path: p() },
                403,
                ErrorCode::PermissionDenied,
            ),
            (
                FileError::NotRegularFile { path: p() },
                409,
                ErrorCode::NotARegularFile,
            ),
            (
                FileError::Stopped {
                    path: p(),
                    stop: crate::workspace::deadline::Stop::Cancelled,
                },
                503,
                ErrorCode::FileWorkStopped,
            ),
            (
                FileError::Busy {
                    path: p(),
                    why: "w".to_owned(),
                },
                503,
                ErrorCode::MemoryBusy,
            ),
            (
                FileError::Io {
                    path: p(),
                    source: std::io::Error::other("x"),
                },
                500,
                ErrorCode::IoError,
            ),
        ];
        let variants: std::collections::HashSet<_> = cases
            .iter()
            .map(|(e, ..)| std::mem::discriminant(e))
            .collect();
        assert_eq!(variants.len(), 14, "one row per variant of FileError");
        for (e, status, code) in cases {
            let message = e.to_string();
            assert_eq!(ApiError::from(e), ApiError::new(status, code, message));
        }
    }

    #[test]
    fn an_answer_carries_the_status_and_the_body() {
        let response = ApiError::from(ServiceError::NoSuchSession { id: id() }).into_response();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let cancelled = ApiError::from(ServiceError::RunCancelled).into_response();
        assert_eq!(cancelled.status().as_u16(), 499);
    }
}
