//! sandboxd, the node daemon: sandbox sessions in sibling containers with persistent host
//! workspaces. It knows Docker and the node's disk, and nothing of Kubernetes.
//!
//! The service itself arrives with the sandboxd core work; this crate fixes its name and version.

/// The service name sandboxd reports in its index.
pub const SERVICE: &str = "sandboxd";
/// The version of this workspace, reported in the index and checked by the operator.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
