//! Condition types and reasons shared by the kinds, as typed constants.

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// `Ready`: the object is doing its job (a host takes sessions, a runtime is built, a session runs).
pub const READY: &str = "Ready";
/// `Reachable`: the host answered its last probe.
pub const REACHABLE: &str = "Reachable";
/// `VersionMismatch`: the host does not serve a route this operator needs.
pub const VERSION_MISMATCH: &str = "VersionMismatch";
/// `Placed`: the session has a host.
pub const PLACED: &str = "Placed";
/// `RuntimeReady`: the session's runtime is built on its host.
pub const RUNTIME_READY: &str = "RuntimeReady";
/// `Admitted`: the host accepted the session (not refused over a cap).
pub const ADMITTED: &str = "Admitted";
/// `DefaultConflict`: more than one Runtime claims to be the default.
pub const DEFAULT_CONFLICT: &str = "DefaultConflict";
/// `HostUnreachable`: the session's host does not answer (the session is not lost).
pub const HOST_UNREACHABLE: &str = "HostUnreachable";
/// `Lost`: the session's workspace is gone.
pub const LOST: &str = "Lost";
/// `RebuildNeeded`: the session's container is made from another image than its Runtime's
/// current one, or with other limits than its spec asks.
pub const REBUILD_NEEDED: &str = "RebuildNeeded";
/// `Rebuilt`: how the session's last rebuild went (False: it failed, and the message says why).
pub const REBUILT: &str = "Rebuilt";

/// The reasons of a SandboxSession's conditions, by condition.
pub mod session_reason {
    /// `Placed=True`: the session has its host.
    pub const PLACED: &str = "Placed";
    /// `Placed=False`: no host can take the session.
    pub const NO_HOST: &str = "NoHost";
    /// `RuntimeReady=False`: the session names a Runtime that does not exist.
    pub const RUNTIME_NOT_FOUND: &str = "RuntimeNotFound";
    /// `RuntimeReady=False`: the host is building the runtime's image.
    pub const PREPARING: &str = "Preparing";
    /// `RuntimeReady=False`: the image was still not built after the prepare timeout.
    pub const PREPARE_TIMED_OUT: &str = "PrepareTimedOut";
    /// `RuntimeReady=False`: the host could not build the runtime's image.
    pub const BUILD_FAILED: &str = "BuildFailed";
    /// `RuntimeReady=True`: the image is on the host.
    pub const RUNTIME_READY: &str = "Ready";
    /// `Admitted=True`: the host opened the session.
    pub const OPENED: &str = "Opened";
    /// `Admitted=False`: the tenant's cap of sessions is reached on the host.
    pub const TENANT_CAP: &str = "TenantCap";
    /// `Admitted=False`: the host's cap of sessions is reached.
    pub const HOST_CAP: &str = "HostCap";
    /// `Admitted=False`: the host holds the session's id for another object.
    pub const OWNER_CONFLICT: &str = "OwnerConflict";
    /// `Admitted=False`: the host holds the session's id for a session of another tenant.
    pub const NAME_TAKEN: &str = "NameTaken";
    /// `Admitted=False`: the host refuses what the session asks (its `spec.resources` over the
    /// host's ceilings); the session is Failed until its spec changes.
    pub const REFUSED: &str = "Refused";
    /// `Admitted=False`: the open failed on the host (its disk is full, Docker failed, …); it is
    /// tried again with backoff.
    pub const OPEN_FAILED: &str = "OpenFailed";
    /// `Admitted=False`: the API server refused to write the session's token Secret (a Secret
    /// of its name that is not a session token Secret, which the chart's policy keeps); tried
    /// again with backoff.
    pub const TOKEN_SECRET_NOT_WRITTEN: &str = "TokenSecretNotWritten";
    /// `RuntimeReady=False`: the host does not have the session's runtime in its allowlist yet.
    pub const NOT_ON_HOST: &str = "NotOnHost";
    /// `Admitted=False`: a deleted object of the same name still owes its destroy.
    pub const WAITING_FOR_TOMBSTONE: &str = "WaitingForTombstone";
    /// `HostUnreachable=True`: the SandboxHost the session is placed on does not exist.
    pub const HOST_MISSING: &str = "HostMissing";
    /// `HostUnreachable=True`: the host does not answer, or serves another version.
    pub const UNREACHABLE: &str = "Unreachable";
    /// `Ready=True`: the sandbox runs.
    pub const RUNNING: &str = "Running";
    /// `Ready=False`: idle, the container is stopped.
    pub const SLEEPING: &str = "Sleeping";
    /// `Ready=False`: the container was removed, the workspace stays.
    pub const RECLAIMED: &str = "Reclaimed";
    /// `Ready=False`: the workspace is gone.
    pub const LOST: &str = "Lost";
    /// `Lost=True`: the workspace vanished on the host.
    pub const WORKSPACE_VANISHED: &str = "WorkspaceVanished";
    /// `Lost=True`: the host no longer has the session (destroyed there, not through this
    /// object).
    pub const SESSION_GONE: &str = "SessionGone";
    /// `Lost=True`: the workspace was removed after its TTL without activity.
    pub const WORKSPACE_EXPIRED: &str = "WorkspaceExpired";
    /// `RebuildNeeded=True`: the Runtime names another image than the container's.
    pub const IMAGE_CHANGED: &str = "ImageChanged";
    /// `RebuildNeeded=True`: spec.resources asks other limits than the container's.
    pub const RESOURCES_CHANGED: &str = "ResourcesChanged";
    /// `Rebuilt=True`: the container was recreated; the workspace kept.
    pub const REBUILT: &str = "Rebuilt";
    /// `Rebuilt=False`: the rebuild failed; the session is Failed until a rebuild or a wake
    /// succeeds.
    pub const REBUILD_FAILED: &str = "RebuildFailed";
    /// `Rebuilt=False`: the host refused the rebuild as asked (a workspace that would shrink,
    /// limits over its ceilings); the session is Failed until the spec changes.
    pub const REBUILD_REFUSED: &str = "RebuildRefused";
}
