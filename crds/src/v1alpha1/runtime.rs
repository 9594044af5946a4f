//! `Runtime`: one entry of the runtime catalog, the environment a session's container runs.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::egress::Egress;

/// A runtime a session may run: either a ready image used as is, or a base image the hosts
/// build once (setup commands, then pip packages) and cache under a tag derived from the
/// definition. The object's name is the alias a SandboxSession names.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "sandboxd.dev",
    version = "v1alpha1",
    kind = "Runtime",
    shortname = "rt",
    category = "sandboxd",
    status = "RuntimeStatus",
    scale(
        spec_replicas_path = ".spec.warmPool.size",
        status_replicas_path = ".status.warmPool.ready"
    ),
    doc = "A runtime a sandbox may run: a ready image, or a base image the hosts build from setup commands and packages.",
    validation = Rule::new("self.metadata.name.matches('^[a-z][a-z0-9-]*$')").message("metadata.name is the runtime alias: it must match [a-z][a-z0-9-]* (a lowercase letter, then lowercase letters, digits or '-')"),
    printcolumn(name = "Default", type_ = "boolean", json_path = ".spec.default"),
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.image"),
    printcolumn(name = "Base Image", type_ = "string", json_path = ".spec.baseImage"),
    printcolumn(name = "Network", type_ = "boolean", json_path = ".spec.needsNetwork"),
    printcolumn(name = "Egress", type_ = "string", json_path = ".spec.egress.mode", priority = "1"),
    printcolumn(name = "Isolation", type_ = "string", json_path = ".spec.isolation", priority = "1"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("has(self.image) != has(self.baseImage)").message("exactly one of spec.image and spec.baseImage must be set: image for a ready image used as is, baseImage for one the hosts build"))]
#[x_kube(validation = Rule::new("has(self.baseImage) || size(self.packages) == 0").message("spec.packages is allowed only with spec.baseImage: a ready image (spec.image) installs nothing"))]
#[x_kube(validation = Rule::new("has(self.baseImage) || size(self.setupCommands) == 0").message("spec.setupCommands is allowed only with spec.baseImage: a ready image (spec.image) installs nothing"))]
#[serde(rename_all = "camelCase")]
pub struct RuntimeSpec {
    /// What the runtime is for, in a sentence a person choosing one reads.
    #[serde(default)]
    pub description: String,

    /// A ready image, used as is; nothing is installed. Exclusive with baseImage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self != ''").message("spec.image must not be empty when set"))]
    pub image: Option<String>,

    /// The image the hosts build on (once, then cached). Exclusive with image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self != ''").message("spec.baseImage must not be empty when set"))]
    pub base_image: Option<String>,

    /// Shell commands run at build time, before the packages: an apt layer, an installer.
    /// Only with baseImage.
    #[serde(default)]
    pub setup_commands: Vec<String>,

    /// pip packages installed at build time into a virtualenv the sandbox user owns.
    /// Only with baseImage.
    #[serde(default)]
    pub packages: Vec<String>,

    /// Environment variables set in every container of this runtime.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env_vars: BTreeMap<String, String>,

    /// Sentences told to the model that cannot be derived from the fields above.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub briefing: Vec<String>,

    /// Memory limit of a container in Docker's syntax (for example 2g); unset takes the host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+(\\\\.[0-9]+)?[bkmgtpBKMGTP]?$')").message("spec.memLimit must be a number with an optional unit b, k, m, g, t or p in Docker's syntax (for example 512m or 2g)"))]
    pub mem_limit: Option<String>,

    /// Workspace size of a session in Docker's syntax (for example 2g); at most the host's
    /// SANDBOXD_WORKSPACE_SIZE; unset takes the host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+(\\\\.[0-9]+)?[bkmgtpBKMGTP]?$')").message("spec.workspaceSize must be a number with an optional unit b, k, m, g, t or p in Docker's syntax (for example 512m or 2g)"))]
    pub workspace_size: Option<String>,

    /// Whether a session on this runtime gets a network (an open one). A build always has one.
    /// spec.egress, when set, wins over it.
    #[serde(default)]
    pub needs_network: bool,

    /// Where the sessions of this runtime may connect: mode none (no network), allowlist (only
    /// the names and IPv4 networks allow lists, each on its ports, 443 and 80 unless it lists
    /// others) or open. Unset: needsNetwork says open (true) or none (false). A session may
    /// narrow it (its spec.egress), never widen it, and a namespace may cap it (annotation
    /// sandboxd.dev/egress-ceiling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Egress>,

    /// What stands between its sandboxes and the node's kernel: runc (unset: the node's
    /// kernel, with namespaces, cgroups and seccomp) or gvisor (gVisor's runsc: a kernel of its
    /// own in user space). A gvisor session is placed only on a host whose dockerd offers
    /// runsc (its SandboxHost's status.isolation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,

    /// Whether this is the runtime of a session that names none. Exactly one Runtime should be.
    #[serde(default)]
    pub default: bool,

    /// When a session whose container is made from an older image of this runtime (or with
    /// other limits than its spec asks) is rebuilt: Manual (only by `kubectl sandbox rebuild`),
    /// OnWake (the default: a sleeping or reclaimed session is rebuilt before it wakes, so no
    /// process is lost that sleep would not lose anyway) or Rolling (OnWake, and running
    /// sessions with no run in flight too, at most maxUnavailable at a time per host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuild_policy: Option<RebuildPolicy>,

    /// With rebuildPolicy Rolling: how many sessions of this runtime each host rebuilds at
    /// once while they run. Defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_unavailable: Option<i32>,

    /// Started containers of this runtime kept ready on each host, so an open takes one instead
    /// of starting a container (the session's status says `launch: warm`). Absent: no pool. The
    /// scale subresource sets its size (`kubectl scale rt/NAME --replicas=N`), so an autoscaler
    /// can too. Each pooled container counts against its host's session capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_pool: Option<WarmPool>,
}

/// What stands between a runtime's sandboxes and the node's kernel.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// The node's kernel, with namespaces, cgroups and seccomp (runc).
    #[default]
    Runc,
    /// gVisor's own kernel in user space (runsc).
    Gvisor,
}

impl From<sandboxd_catalog::Isolation> for Isolation {
    fn from(i: sandboxd_catalog::Isolation) -> Self {
        match i {
            sandboxd_catalog::Isolation::Runc => Self::Runc,
            sandboxd_catalog::Isolation::Gvisor => Self::Gvisor,
        }
    }
}

impl From<Isolation> for sandboxd_catalog::Isolation {
    fn from(i: Isolation) -> Self {
        match i {
            Isolation::Runc => Self::Runc,
            Isolation::Gvisor => Self::Gvisor,
        }
    }
}

/// When the sessions of a runtime are rebuilt onto its current image.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum RebuildPolicy {
    /// Only when asked (`kubectl sandbox rebuild NAME`).
    Manual,
    /// A sleeping or reclaimed session is rebuilt before it wakes.
    #[default]
    OnWake,
    /// OnWake, and running sessions without a run in flight too, maxUnavailable at a time
    /// per host.
    Rolling,
}

/// The warm pool of a runtime.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmPool {
    /// Containers kept ready per host; 0 keeps none.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 1000").message("spec.warmPool.size must be between 0 and 1000 containers per host"))]
    pub size: i32,
}

/// The warm pool of a runtime as the hosts report it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmPoolStatus {
    /// The fewest ready pooled containers on any ready host: equal to `spec.warmPool.size` once
    /// every host's pool is full.
    #[serde(default)]
    pub ready: i32,
}

/// The build state of a runtime on one host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
pub enum BuildState {
    /// Not yet handed to the host.
    #[default]
    Pending,
    /// The host is building it.
    Building,
    /// Built (or a ready image present); sessions can open.
    Ready,
    /// The build failed; see lastError. Retried with backoff.
    Failed,
}

/// The runtime on one host.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeHostStatus {
    /// The SandboxHost name.
    pub host: String,
    /// Pending, Building, Ready or Failed.
    pub state: BuildState,
    /// The image tag the host built (derived from the definition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_tag: Option<String>,
    /// Build attempts so far.
    #[serde(default)]
    pub attempts: i32,
    /// The last build error and the tail of its log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the state last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

/// What the operator last saw of a runtime across the hosts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStatus {
    /// One entry per ready host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<RuntimeHostStatus>,
    /// Ready (built on every ready host) and DefaultConflict.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The warm pool: what `kubectl scale` reads as the current replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_pool: Option<WarmPoolStatus>,
}
