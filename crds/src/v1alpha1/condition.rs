//! Condition types and reasons shared by the kinds, typed (a condition is set with a
//! [`ConditionType`] and a [`Reason`] of its kind, never two loose strings), as stackable's
//! operator-rs types its cluster conditions.

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// A condition's reason: one of the kind's reason enums.
pub trait Reason {
    /// The name the API shows.
    fn as_str(&self) -> &'static str;
}

/// The condition types of the kinds, one per question a status answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionType {
    /// `Ready`: the object is doing its job (a host takes sessions, a runtime is built, a session runs).
    Ready,
    /// `Reachable`: the host answered its last probe.
    Reachable,
    /// `VersionMismatch`: the host does not serve a route this operator needs.
    VersionMismatch,
    /// `Placed`: the session has a host.
    Placed,
    /// `RuntimeReady`: the session's runtime is built on its host.
    RuntimeReady,
    /// `Admitted`: the host accepted the session (not refused over a cap).
    Admitted,
    /// `DefaultConflict`: more than one Runtime claims to be the default.
    DefaultConflict,
    /// `HostUnreachable`: the session's host does not answer (the session is not lost).
    HostUnreachable,
    /// `Lost`: the session's workspace is gone.
    Lost,
    /// `RebuildNeeded`: the session's container is made from another image than its Runtime's
    /// current one, or with other limits than its spec asks.
    RebuildNeeded,
    /// `Rebuilt`: how the session's last rebuild went (False: it failed, and the message says why).
    Rebuilt,
    /// `EgressApplied`: whether the session's current egress policy (its `spec.egress` and its
    /// namespace's ceiling) is what its host enforces (False: a change was refused, the message
    /// says why, and the policy sent before stays in force).
    EgressApplied,
    /// `CredentialsApplied`: whether the host holds the session's current egress credentials
    /// (its Runtime's and its own `spec.egress.credentials`); False says why: one refused, a
    /// Secret missing, a host that does not support them.
    CredentialsApplied,
    /// `PortsOpen`: whether every port of the session's `spec.ports` is open on its host
    /// (False: the host refused one, the message says which and why; the others are open).
    PortsOpen,
    /// `MemoryKept`: whether the session's last sleep with memory (a checkpoint of a gvisor
    /// sandbox) or its wake from one (a restore) kept its processes and memory; False says
    /// what failed and what the session was left with. Only on sessions of gvisor runtimes.
    MemoryKept,
}

impl ConditionType {
    /// The name the API shows.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "Ready",
            Self::Reachable => "Reachable",
            Self::VersionMismatch => "VersionMismatch",
            Self::Placed => "Placed",
            Self::RuntimeReady => "RuntimeReady",
            Self::Admitted => "Admitted",
            Self::DefaultConflict => "DefaultConflict",
            Self::HostUnreachable => "HostUnreachable",
            Self::Lost => "Lost",
            Self::RebuildNeeded => "RebuildNeeded",
            Self::Rebuilt => "Rebuilt",
            Self::EgressApplied => "EgressApplied",
            Self::CredentialsApplied => "CredentialsApplied",
            Self::PortsOpen => "PortsOpen",
            Self::MemoryKept => "MemoryKept",
        }
    }
}

impl std::fmt::Display for ConditionType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The reasons of a SandboxSession's conditions, by condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionReason {
    /// `Placed=True`: the session has its host.
    Placed,
    /// `Placed=False`: no host can take the session.
    NoHost,
    /// `RuntimeReady=False`: the session names a Runtime that does not exist.
    RuntimeNotFound,
    /// `RuntimeReady=False`: the host is building the runtime's image.
    Preparing,
    /// `RuntimeReady=False`: the image was still not built after the prepare timeout.
    PrepareTimedOut,
    /// `RuntimeReady=False`: the host could not build the runtime's image.
    BuildFailed,
    /// `RuntimeReady=True`: the image is on the host.
    RuntimeReady,
    /// `Admitted=True`: the host opened the session.
    Opened,
    /// `Admitted=False`: the tenant's cap of sessions is reached on the host.
    TenantCap,
    /// `Admitted=False`: the host's cap of sessions is reached.
    HostCap,
    /// `Admitted=False`: the host holds the session's id for another object.
    OwnerConflict,
    /// `Admitted=False`: the host holds the session's id for a session of another tenant.
    NameTaken,
    /// `Admitted=False`: the host refuses what the session asks (its `spec.resources` over the
    /// host's ceilings); the session is Failed until its spec changes.
    Refused,
    /// `Admitted=False`: the SandboxSnapshot of `spec.from` is not Ready yet; the session
    /// opens once it is.
    WaitingForSnapshot,
    /// `Admitted=False`: the SandboxSnapshot of `spec.from` does not exist in the session's
    /// namespace, Failed, or cannot be restored (a chunk missing or corrupt, named); the
    /// session is Failed.
    SnapshotUnusable,
    /// `Admitted=False`: the session's or its Runtime's egress policy is not valid; the
    /// session is Failed until it is fixed.
    EgressInvalid,
    /// `Admitted=False`: the session's `spec.egress` is wider than its Runtime's policy; the
    /// session is Failed (a session may only narrow it).
    EgressWidened,
    /// `Admitted=False`: the session's egress policy is wider than its namespace's ceiling
    /// (annotation `sandboxd.dev/egress-ceiling`), or that annotation is not a valid policy;
    /// the session is Failed until one of them changes.
    EgressCeiling,
    /// `EgressApplied=True`: the host enforces the session's current egress policy.
    EgressApplied,
    /// `CredentialsApplied=True`: the host holds the session's egress credentials, each with
    /// its value.
    CredentialsApplied,
    /// `CredentialsApplied=False`: a credential is refused (its host not allowed on one of its
    /// ports by a policy the session is bound by, too many); the host keeps those it held.
    CredentialInvalid,
    /// `CredentialsApplied=False`: a credential's Secret (or its key) is missing or not usable:
    /// the host holds the others, and requests to its host are answered 502 naming the Secret.
    CredentialSecretMissing,
    /// `CredentialsApplied=False`: the session's host does not serve the credentials route (an
    /// older sandboxd), or this operator runs without egress credentials.
    CredentialsUnsupported,
    /// `PortsOpen=True`: every port of the session's `spec.ports` is open on its host.
    PortsOpened,
    /// `PortsOpen=False`: the host refused to open (or close) a port of `spec.ports` (its cap
    /// of open ports reached, a port it does not take); the others are applied and the
    /// session is otherwise untouched. Tried again at each reconcile.
    PortsRefused,
    /// `PortsOpen=False`: the session's host does not serve the ports routes (an older
    /// sandboxd).
    PortsUnsupported,
    /// `Admitted=False`: the open failed on the host (its disk is full, Docker failed, …); it is
    /// tried again with backoff.
    OpenFailed,
    /// `Admitted=False`: the API server refused to write the session's token Secret (a Secret
    /// of its name that is not a session token Secret, which the chart's policy keeps); tried
    /// again with backoff.
    TokenSecretNotWritten,
    /// `RuntimeReady=False`: the host does not have the session's runtime in its allowlist yet.
    NotOnHost,
    /// `Admitted=False`: a deleted object of the same name still owes its destroy.
    WaitingForTombstone,
    /// `HostUnreachable=True`: the SandboxHost the session is placed on does not exist.
    HostMissing,
    /// `HostUnreachable=True`: the host does not answer, or serves another version.
    Unreachable,
    /// `Ready=True`: the sandbox runs.
    Running,
    /// `Ready=False`: idle, the container is stopped.
    Sleeping,
    /// `Ready=False`: the container was removed, the workspace stays.
    Reclaimed,
    /// `Ready=False`: the workspace is gone.
    Lost,
    /// `Lost=True`: the workspace vanished on the host.
    WorkspaceVanished,
    /// `Lost=True`: the host no longer has the session (destroyed there, not through this
    /// object).
    SessionGone,
    /// `Lost=True`: the workspace was removed after its TTL without activity.
    WorkspaceExpired,
    /// `RebuildNeeded=True`: the Runtime names another image than the container's.
    ImageChanged,
    /// `RebuildNeeded=True`: spec.resources asks other limits than the container's.
    ResourcesChanged,
    /// `Rebuilt=True`: the container was recreated; the workspace kept.
    Rebuilt,
    /// `Rebuilt=False`: the rebuild failed; the session is Failed until a rebuild or a wake
    /// succeeds.
    RebuildFailed,
    /// `Rebuilt=False`: the host refused the rebuild as asked (a workspace that would shrink,
    /// limits over its ceilings); the session is Failed until the spec changes.
    RebuildRefused,
    /// `MemoryKept=True`: the sleep checkpointed the sandbox; it is asleep with its memory.
    Checkpointed,
    /// `MemoryKept=True`: the wake restored the sandbox from its checkpoint.
    Restored,
    /// `MemoryKept=False`: the checkpoint failed; the session sleeps without its memory.
    CheckpointFailed,
    /// `MemoryKept=False`: the restore failed; the session woke fresh with its files.
    RestoreFailed,
}

impl SessionReason {
    /// The name the API shows.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Placed => "Placed",
            Self::NoHost => "NoHost",
            Self::RuntimeNotFound => "RuntimeNotFound",
            Self::Preparing => "Preparing",
            Self::PrepareTimedOut => "PrepareTimedOut",
            Self::BuildFailed => "BuildFailed",
            Self::RuntimeReady => "Ready",
            Self::Opened => "Opened",
            Self::TenantCap => "TenantCap",
            Self::HostCap => "HostCap",
            Self::OwnerConflict => "OwnerConflict",
            Self::NameTaken => "NameTaken",
            Self::Refused => "Refused",
            Self::WaitingForSnapshot => "WaitingForSnapshot",
            Self::SnapshotUnusable => "SnapshotUnusable",
            Self::EgressInvalid => "EgressInvalid",
            Self::EgressWidened => "EgressWidened",
            Self::EgressCeiling => "EgressCeiling",
            Self::EgressApplied => "EgressApplied",
            Self::CredentialsApplied => "CredentialsApplied",
            Self::CredentialInvalid => "CredentialInvalid",
            Self::CredentialSecretMissing => "CredentialSecretMissing",
            Self::CredentialsUnsupported => "CredentialsUnsupported",
            Self::PortsOpened => "PortsOpened",
            Self::PortsRefused => "PortsRefused",
            Self::PortsUnsupported => "PortsUnsupported",
            Self::OpenFailed => "OpenFailed",
            Self::TokenSecretNotWritten => "TokenSecretNotWritten",
            Self::NotOnHost => "NotOnHost",
            Self::WaitingForTombstone => "WaitingForTombstone",
            Self::HostMissing => "HostMissing",
            Self::Unreachable => "Unreachable",
            Self::Running => "Running",
            Self::Sleeping => "Sleeping",
            Self::Reclaimed => "Reclaimed",
            Self::Lost => "Lost",
            Self::WorkspaceVanished => "WorkspaceVanished",
            Self::SessionGone => "SessionGone",
            Self::WorkspaceExpired => "WorkspaceExpired",
            Self::ImageChanged => "ImageChanged",
            Self::ResourcesChanged => "ResourcesChanged",
            Self::Rebuilt => "Rebuilt",
            Self::RebuildFailed => "RebuildFailed",
            Self::RebuildRefused => "RebuildRefused",
            Self::Checkpointed => "Checkpointed",
            Self::Restored => "Restored",
            Self::CheckpointFailed => "CheckpointFailed",
            Self::RestoreFailed => "RestoreFailed",
        }
    }
}

impl Reason for SessionReason {
    fn as_str(&self) -> &'static str {
        SessionReason::as_str(*self)
    }
}

/// The reasons of a SandboxHost's conditions, by condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HostReason {
    /// `Reachable=True`: the host answered its index.
    Answered,
    /// `Reachable=False`, `Ready=False`: the host does not answer.
    Unreachable,
    /// `Reachable=False`, `Ready=False`: its certificate failed verification.
    CertificateUntrusted,
    /// `VersionMismatch=False`: it serves every route the operator needs.
    RoutesPresent,
    /// `VersionMismatch=True`: it lacks a route the operator needs.
    RoutesMissing,
    /// `Ready=False`: it lacks a route the operator needs.
    VersionMismatch,
    /// `Ready=True`: it takes sessions.
    Ready,
    /// `Ready=True`: ready, but `spec.disabled`: it takes no new sessions.
    Disabled,
    /// `Ready=False`: its capacity could not be read.
    ProbeFailed,
    /// `Ready=False`: it refused the admin token the operator sent.
    TokenRefused,
    /// `Ready=False`: the host's admin-token Secret could not be read.
    TokenUnreadable,
    /// `Ready=False`: its admin-token Secret is outside the operator's namespace (refused unread).
    TokenSecretRefused,
    /// `Ready=False`: it names no node, so it is sent no token.
    NodeUnset,
    /// `Ready=False`: the CA to verify it with could not be read.
    CaUnusable,
}

impl HostReason {
    /// The name the API shows.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Answered => "Answered",
            Self::Unreachable => "Unreachable",
            Self::CertificateUntrusted => "CertificateUntrusted",
            Self::RoutesPresent => "RoutesPresent",
            Self::RoutesMissing => "RoutesMissing",
            Self::VersionMismatch => "VersionMismatch",
            Self::Ready => "Ready",
            Self::Disabled => "Disabled",
            Self::ProbeFailed => "ProbeFailed",
            Self::TokenRefused => "TokenRefused",
            Self::TokenUnreadable => "TokenUnreadable",
            Self::TokenSecretRefused => "TokenSecretRefused",
            Self::NodeUnset => "NodeUnset",
            Self::CaUnusable => "CaUnusable",
        }
    }
}

impl Reason for HostReason {
    fn as_str(&self) -> &'static str {
        HostReason::as_str(*self)
    }
}

/// The reasons of a Runtime's conditions, by condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuntimeReason {
    /// `Ready=True`: built on every ready host.
    Built,
    /// `Ready=False`: not (yet) built on some host; the message says where it stands.
    NotBuilt,
    /// `DefaultConflict=True`: more than one Runtime is marked default.
    SeveralDefaults,
}

impl RuntimeReason {
    /// The name the API shows.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Built => "Built",
            Self::NotBuilt => "NotBuilt",
            Self::SeveralDefaults => "SeveralDefaults",
        }
    }
}

impl Reason for RuntimeReason {
    fn as_str(&self) -> &'static str {
        RuntimeReason::as_str(*self)
    }
}
