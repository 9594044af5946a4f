//! `SandboxHost`: one sandboxd the operator may place sessions on.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One sandboxd (usually one per node) that the operator may place sessions on.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "sandboxd.dev",
    version = "v1alpha1",
    kind = "SandboxHost",
    shortname = "sbh",
    category = "sandboxd",
    status = "SandboxHostStatus",
    doc = "One sandboxd the operator may place sessions on.",
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".spec.endpoint"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.version"),
    printcolumn(name = "Sessions", type_ = "integer", json_path = ".status.sessions"),
    printcolumn(
        name = "Max",
        type_ = "integer",
        json_path = ".status.capacity.maxSessions"
    ),
    printcolumn(name = "Disabled", type_ = "boolean", json_path = ".spec.disabled"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxHostSpec {
    /// Base URL of the host's sandboxd, for example http://10.0.3.7:8080.
    #[x_kube(validation = Rule::new("self.startsWith('http://') || self.startsWith('https://')").message("spec.endpoint must be an http:// or https:// URL of the host's sandboxd"))]
    pub endpoint: String,
    /// The Secret holding the master admin token the host's sandboxd was started with
    /// (SANDBOXD_TOKEN); the operator never sends the master itself, only the token derived from it for spec.node. It
    /// must live in the operator's namespace: one named elsewhere is refused unread
    /// (Ready=False, TokenSecretRefused) and the host takes no sessions.
    pub admin_token_secret: SecretKeyRef,
    /// The node the host's sandboxd runs on, as its SANDBOXD_NODE_NAME. When set, the operator
    /// sends the admin token derived for this node from the master (`sandboxd admin-token
    /// --node NAME`), which opens this node's sandboxd and no other; when unset, nothing (NodeUnset).
    /// Discovery sets it from the pod's spec.nodeName.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self != ''").message("spec.node must not be empty when set: it names the node as sandboxd's SANDBOXD_NODE_NAME does"))]
    pub node: Option<String>,
    /// Stops new placements on this host; its sessions and pending destroys go on.
    #[serde(default)]
    pub disabled: bool,
    /// The Secret key holding the CA certificate (PEM) that signed this host's TLS
    /// certificate: an https:// endpoint is verified against it alone, its DNS or IP SAN
    /// included. Like adminTokenSecret, it must live in the operator's namespace. Unset: the
    /// operator's --host-ca-file, or else the system's CA roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret: Option<CaSecretRef>,
}

/// A key in a Secret holding a CA certificate.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaSecretRef {
    /// Namespace of the Secret.
    pub namespace: String,
    /// Name of the Secret.
    pub name: String,
    /// Key within the Secret; defaults to ca.crt.
    #[serde(default = "default_ca_key")]
    pub key: String,
}

fn default_ca_key() -> String {
    "ca.crt".to_owned()
}

/// A key in a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Namespace of the Secret.
    pub namespace: String,
    /// Name of the Secret.
    pub name: String,
    /// Key within the Secret; defaults to token.
    #[serde(default = "default_token_key")]
    pub key: String,
}

fn default_token_key() -> String {
    "token".to_owned()
}

/// The host's limits.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostCapacity {
    /// Sessions the host holds at most (SANDBOXD_MAX_SESSIONS).
    pub max_sessions: i32,
    /// Sessions one tenant holds at most on this host (SANDBOXD_MAX_SESSIONS_PER_TENANT).
    pub max_sessions_per_tenant: i32,
    /// Bytes of workspace disks the host holds at most, sleeping and reclaimed workspaces
    /// included (SANDBOXD_WORKSPACE_BUDGET); absent when its workspaces are not limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_budget: Option<i64>,
    /// The size a new workspace gets there unless it asks for less (SANDBOXD_WORKSPACE_SIZE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_size: Option<i64>,
}

/// What the operator last saw of a host.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxHostStatus {
    /// The version sandboxd reports in its index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The routes sandboxd reports in its index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<String>,
    /// The host's limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<HostCapacity>,
    /// Sessions the host holds now, opening ones included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<i32>,
    /// Bytes of the workspace budget its workspaces hold now (every workspace not yet
    /// destroyed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_bytes: Option<i64>,
    /// Runtime aliases built and ready on the host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runtimes_ready: Vec<String>,
    /// The isolation levels the host's dockerd offers (runc, and gvisor where it has runsc): a
    /// session of a gvisor runtime is placed only where this lists gvisor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub isolation: Vec<String>,
    /// When the host was last probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_at: Option<Time>,
    /// Ready, Reachable and VersionMismatch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
