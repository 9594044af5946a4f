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
