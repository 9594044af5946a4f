//! `SandboxSnapshot`: a consistent image of a session's workspace in the object store, made
//! by the session's host with its sandbox paused for the moment of the copy. A SandboxSession
//! whose `spec.from.snapshot` names it opens, on any host, with those files.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The finalizer that deletes a snapshot's manifest from the object store before the object
/// goes (its chunks no other snapshot needs are collected after).
pub const SNAPSHOT_FINALIZER: &str = "sandboxd.dev/snapshot";

/// A snapshot of a SandboxSession's workspace.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "sandboxd.dev",
    version = "v1alpha1",
    kind = "SandboxSnapshot",
    namespaced,
    shortname = "sbxsnap",
    category = "sandboxd",
    status = "SandboxSnapshotStatus",
    doc = "A snapshot of a SandboxSession's workspace in the object store: content-addressed, compressed, checksummed chunks and a manifest. Owned by its session; a SandboxSession with spec.from.snapshot opens from it on any host.",
    printcolumn(name = "Session", type_ = "string", json_path = ".spec.session"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Size", type_ = "string", json_path = ".status.size"),
    printcolumn(
        name = "Files",
        type_ = "integer",
        json_path = ".status.entries",
        priority = "1"
    ),
    printcolumn(
        name = "Chunks",
        type_ = "integer",
        json_path = ".status.chunkCount",
        priority = "1"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.message",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSnapshotSpec {
    /// The SandboxSession, in this namespace, whose workspace it holds. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.session is immutable: take a new SandboxSnapshot of another session"))]
    #[schemars(length(min = 1, max = 253))]
    pub session: String,
}

/// Where a snapshot is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SnapshotPhase {
    /// Not taken yet: its session is not open, or its host is being asked.
    Pending,
    /// In the object store, whole: a session may open from it.
    Ready,
    /// Not taken, and not tried again (the message says why); delete it and take another.
    Failed,
}

/// What the operator and the host report of a snapshot.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSnapshotStatus {
    /// Pending, Ready or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SnapshotPhase>,
    /// What happened last, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Its key in the object store: `<namespace>/<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The SandboxHost that took it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The bytes of its files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<i64>,
    /// The same, as people read it (`38.1 MiB`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// Its files, folders and symlinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<i64>,
    /// The distinct chunks it needs (shared with other snapshots where the bytes are equal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_count: Option<i64>,
    /// The chunks this snapshot sent (the rest were in the store already).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks_sent: Option<i64>,
    /// How long the sandbox was paused for the copy, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_milliseconds: Option<i64>,
    /// When it was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_at: Option<Time>,
}
