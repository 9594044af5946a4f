//! `sandboxd.dev/v1alpha1`: one module per kind.

pub mod condition;
pub mod egress;
pub mod host;
pub mod runtime;
pub mod session;
pub mod snapshot;
pub mod tombstone;

pub use host::{SandboxHost, SandboxHostSpec, SandboxHostStatus};
pub use runtime::{Runtime, RuntimeSpec, RuntimeStatus};
pub use session::{SandboxSession, SandboxSessionSpec, SandboxSessionStatus, Scope};
pub use snapshot::{SandboxSnapshot, SandboxSnapshotSpec, SandboxSnapshotStatus, SnapshotPhase};
pub use tombstone::{Tombstone, TombstoneSpec, TombstoneStatus};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::CustomResourceExt;

/// Every CRD of this version, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        SandboxSession::crd(),
        Runtime::crd(),
        Tombstone::crd(),
        SandboxHost::crd(),
        SandboxSnapshot::crd(),
    ]
}
