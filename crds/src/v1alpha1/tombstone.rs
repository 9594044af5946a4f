//! `Tombstone`: the promise that a deleted session's container and workspace are destroyed on
//! its host, kept until the host confirms it. Cluster-scoped, so it outlives a namespace.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A destroy still owed to a host for a deleted SandboxSession.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "sandboxd.dev",
    version = "v1alpha1",
    kind = "Tombstone",
    category = "sandboxd",
    status = "TombstoneStatus",
    doc = "A destroy still owed to a host for a deleted SandboxSession; removed when the host confirms it.",
    printcolumn(name = "Host", type_ = "string", json_path = ".spec.host"),
    printcolumn(name = "Session", type_ = "string", json_path = ".spec.sessionId"),
    printcolumn(name = "Tenant", type_ = "string", json_path = ".spec.tenant"),
    printcolumn(name = "Attempts", type_ = "integer", json_path = ".status.attempts"),
    printcolumn(
        name = "Next Attempt",
        type_ = "date",
        json_path = ".status.nextAttemptAt"
    ),
    printcolumn(
        name = "Last Error",
        type_ = "string",
        json_path = ".status.lastError",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TombstoneSpec {
    /// The SandboxHost that holds the container and workspace.
    #[schemars(length(min = 1))]
    pub host: String,
    /// The session id on that host.
    #[schemars(length(min = 1))]
    pub session_id: String,
    /// The tenant the session belonged to.
    pub tenant: String,
    /// The SandboxSession this came from.
    pub source: TombstoneSource,
}

/// Where a tombstone came from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TombstoneSource {
    /// Namespace of the deleted SandboxSession.
    pub namespace: String,
    /// Name (the session key) of the deleted SandboxSession.
    pub name: String,
    /// UID of the deleted SandboxSession.
    pub uid: String,
}

/// Progress of the destroy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TombstoneStatus {
    /// Destroys tried so far.
    #[serde(default)]
    pub attempts: i32,
    /// Why the last destroy failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the next destroy is tried (backoff from 2 minutes, doubling, at most 6 hours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<Time>,
}
