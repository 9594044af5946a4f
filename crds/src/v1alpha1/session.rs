//! `SandboxSession`: one sandbox (a container and its persistent workspace) for a conversation,
//! user, agent, channel or run. Its name is the session key ([`crate::key`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::egress::Egress;

/// What a session is shared by: the runs that get the same container and workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// One run alone.
    Run,
    /// Every run of one conversation (the usual choice).
    Conversation,
    /// Every run in one channel.
    Channel,
    /// Every run of one signed-in person; a run acting for someone else has none.
    User,
    /// Every run of one agent.
    Agent,
}

impl Scope {
    /// Every scope, in the order the API lists them.
    pub const ALL: [Scope; 5] = [
        Scope::Run,
        Scope::Conversation,
        Scope::Channel,
        Scope::User,
        Scope::Agent,
    ];

    /// The lowercase name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Run => "run",
            Scope::Conversation => "conversation",
            Scope::Channel => "channel",
            Scope::User => "user",
            Scope::Agent => "agent",
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A sandbox session: a container and a persistent workspace on one host, opened by name.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "sandboxd.dev",
    version = "v1alpha1",
    kind = "SandboxSession",
    namespaced,
    shortname = "sbx",
    category = "sandboxd",
    status = "SandboxSessionStatus",
    doc = "A sandbox: a container and its persistent workspace on one host. The name is the session key.",
    // What the operator decides once, refused rather than silently not done: the host a placed
    // session is on. (Its resources may change: a rebuild gives the sandbox the new ones.)
    validation = Rule::new("!has(oldSelf.spec.rebuildGeneration) || (has(self.spec.rebuildGeneration) && self.spec.rebuildGeneration >= oldSelf.spec.rebuildGeneration)").message("spec.rebuildGeneration only grows: raise it by one (kubectl sandbox rebuild) to ask for another rebuild"),
    validation = Rule::new("!has(oldSelf.status) || !has(oldSelf.status.host) || (has(self.spec.host) ? (has(oldSelf.spec.host) && self.spec.host == oldSelf.spec.host) : !has(oldSelf.spec.host))").message("spec.host is fixed once the session is placed (status.host is set): a session never moves to another host"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Tenant", type_ = "string", json_path = ".spec.tenant"),
    printcolumn(name = "Scope", type_ = "string", json_path = ".spec.scope"),
    printcolumn(name = "Runtime", type_ = "string", json_path = ".status.runtime"),
    printcolumn(name = "Host", type_ = "string", json_path = ".status.host"),
    printcolumn(
        name = "Rebuild",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"RebuildNeeded\")].reason"
    ),
    printcolumn(
        name = "Last Activity",
        type_ = "date",
        json_path = ".status.lastActivityAt"
    ),
    printcolumn(
        name = "Sleeps At",
        // A point in the future: kubectl shows a `date` column as an age, and a future one
        // as "<invalid>", so the time itself is shown.
        type_ = "string",
        json_path = ".status.sleepsAt",
        priority = "1"
    ),
    printcolumn(
        name = "Launch",
        type_ = "string",
        json_path = ".status.launch",
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
pub struct SandboxSessionSpec {
    /// Who shares this sandbox: one of run, conversation, channel, user or agent. Runs of the
    /// same scope, tenant and subject share one container and one workspace. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.scope is immutable: create a new SandboxSession for another scope"))]
    pub scope: Scope,

    /// The organization (tenant) id the session belongs to; counted against the host's
    /// per-tenant cap. Must not be empty. Immutable.
    #[x_kube(validation = Rule::new("self != ''").message("spec.tenant must not be empty: set it to the organization id"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.tenant is immutable: a session never moves to another tenant"))]
    pub tenant: String,

    /// What the scope is about: the conversation, channel, user, agent or run id. Immutable.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.subject is immutable: create a new SandboxSession for another subject"))]
    pub subject: String,

    /// The Runtime (by alias) the sandbox runs; empty means the default Runtime. Immutable.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.runtime is immutable: create a new SandboxSession for another runtime"))]
    pub runtime: String,

    /// Pins the session to this SandboxHost by name; empty lets the operator place it.
    /// A session never moves: fixed once the session is placed (status.host is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,

    /// Resource overrides, within the ceilings of the host; unset fields take the runtime's or
    /// the host's defaults. A change on an open session shows as the RebuildNeeded condition
    /// (reason ResourcesChanged) and reaches the sandbox with its next rebuild; the workspace
    /// size only grows (a smaller one is refused, naming the current size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<SessionResources>,

    /// Raise it (by one: `kubectl sandbox rebuild NAME`) to rebuild the session: its container
    /// is recreated from its Runtime's current image with spec.resources, the workspace kept.
    /// Runs in flight are stopped first. status.rebuildGeneration says which one was done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub rebuild_generation: Option<i64>,

    /// Seconds without a run, activity or CPU use after which the container is stopped (the
    /// files stay). Defaults to the operator's idle timeout (1800 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60))]
    pub idle_timeout_seconds: Option<i64>,

    /// Narrows where the sandbox may connect: within its Runtime's egress policy (and its
    /// namespace's ceiling, annotation sandboxd.dev/egress-ceiling), never wider; a wider one
    /// is refused (the session is Failed, saying which entry widens it). Unset: the Runtime's.
    /// May be changed while the session runs: the operator sends the new policy to its host,
    /// where it counts from the next connection, without a restart; a change that would widen
    /// is refused (condition EgressApplied False) and the policy sent before stays in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Egress>,

    /// Ports of the sandbox's loopback reachable through its host's sandboxd (HTTP under
    /// /v1/sessions/{id}/ports/{port}/, a TCP stream with kubectl sandbox port-forward): the
    /// operator opens each on the host once the session is open, and closes one it opened
    /// when it leaves this list; a port opened through the API directly is left alone. At most
    /// 16 (sandboxd's cap of open ports per session), each 1 to 65535; a port listed twice
    /// counts once. May be changed while the session runs; a port the host refuses (its cap
    /// reached by ports opened otherwise) shows as condition PortsOpen False, the session
    /// otherwise untouched. Unset: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    // An integer of the API's own format (the server warns about uint16), bounded to a port;
    // 16 is sandboxd's `sandboxd_api::ports::MAX_PORTS` (the operator's tests hold them equal).
    #[schemars(
        with = "Vec<i32>",
        length(max = 16),
        inner(range(min = 1, max = 65535))
    )]
    pub ports: Vec<u16>,

    /// What a new session's workspace starts from: `snapshot` names a Ready SandboxSnapshot
    /// in this namespace, whose files the session opens with on whatever host it is placed
    /// (its launch `restored`). Unset: an empty workspace. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.from is immutable: a session starts from its snapshot once"))]
    pub from: Option<SessionFrom>,

    /// Set on a Lost session (`kubectl sandbox restore NAME`) to open it again from a Ready
    /// SandboxSnapshot of its own namespace, on another host than the one that lost it (whose
    /// copy a Tombstone destroys once that host answers). Its workspace is the snapshot's; what
    /// was written after the snapshot is gone. Changing the snapshot named restores again once
    /// the session is Lost again. Ignored while the session is not Lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<SessionFrom>,
}

/// A SandboxSnapshot as a session's status names it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRef {
    /// The SandboxSnapshot, in the session's namespace.
    pub name: String,
    /// When it was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_at: Option<Time>,
    /// The host that had lost the session (for a restore).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_host: Option<String>,
}

/// Where a session's workspace starts from.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SessionFrom {
    /// A SandboxSnapshot in the session's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub snapshot: String,
}

/// Resource overrides for one session.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SessionResources {
    /// Memory limit in Docker's syntax, for example 512m or 2g.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+(\\\\.[0-9]+)?[bkmgtpBKMGTP]?$')").message("spec.resources.memLimit must be a number with an optional unit b, k, m, g, t or p in Docker's syntax (for example 512m or 2g)"))]
    pub mem_limit: Option<String>,

    /// CPUs the container may use, in thousandths of a CPU (2000 = two CPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 100))]
    pub milli_cpus: Option<i64>,

    /// Most processes the container may hold at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16))]
    pub pids_limit: Option<i64>,

    /// Workspace size in Docker's syntax, for example 2g: writing past it fails with "No space
    /// left on device". At most the host's; unset takes the runtime's, else the host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+(\\\\.[0-9]+)?[bkmgtpBKMGTP]?$')").message("spec.resources.workspaceSize must be a number with an optional unit b, k, m, g, t or p in Docker's syntax (for example 512m or 2g)"))]
    pub workspace_size: Option<String>,
}

/// How a session's container was started.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Launch {
    /// Taken from its Runtime's warm pool: started before the session asked.
    Warm,
    /// Created and started for the session.
    Cold,
    /// Created for the session, its workspace restored from a SandboxSnapshot first.
    Restored,
}

/// Where a session is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
pub enum SessionPhase {
    /// Not yet opened on a host: waiting for a host, below a cap, or for the destroy a deleted
    /// object of the same name still owes (see the conditions).
    #[default]
    Pending,
    /// Placed; waiting for its runtime to be built on the host.
    Preparing,
    /// The container runs.
    Running,
    /// Idle: the container is stopped and the files stay; a workspace operation wakes it.
    Sleeping,
    /// The container was removed (stopped past its TTL, or removed on the host); the workspace
    /// stays and the next workspace operation recreates the container.
    Reclaimed,
    /// The workspace vanished, or the session was destroyed on the host; reported, never
    /// replaced with an empty one. Final: delete the object and create it again to start over.
    Lost,
    /// Its container is being recreated from its Runtime's current image (the workspace
    /// stays); runs wait until it is Running again.
    Rebuilding,
    /// Opening failed for a reason retries cannot fix, or the last rebuild failed (see the
    /// conditions: Rebuilt says why and how to try again).
    Failed,
    /// Being destroyed.
    Terminating,
}

/// What the operator last saw of a session.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSessionStatus {
    /// Where the session is in its life: Pending, Preparing, Running, Sleeping, Reclaimed,
    /// Rebuilding, Lost, Failed or Terminating.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SessionPhase>,
    /// One line for a person on why the session is in this phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The SandboxHost the session is placed on; it never changes once set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The Runtime alias the session was opened with (the default resolved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// The session id on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The image the session's container is made from, as its host says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The spec.rebuildGeneration whose rebuild was last carried out (or failed: see the
    /// Rebuilt condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuild_generation: Option<i64>,
    /// When the session's container was last rebuilt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuilt_at: Option<Time>,
    /// The base URL of the host's sandboxd that serves this session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The Secret (in this namespace, owned by this session) holding the session token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
    /// When the session last ran a command or touched a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_activity_at: Option<Time>,
    /// When the session goes to sleep if nothing happens before (RFC 3339); set only while
    /// Running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sleeps_at: Option<Time>,
    /// How the session's current container was started, as its host says: `warm` (taken from
    /// its Runtime's warm pool, already started), `cold` (created and started for it) or
    /// `restored` (created for it, its workspace from a snapshot first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<Launch>,
    /// The newest Ready SandboxSnapshot of this session, as shown while it is Lost: what
    /// `kubectl sandbox restore NAME` opens it from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newest_snapshot: Option<SnapshotRef>,
    /// The SandboxSnapshot the session was last restored from after it was Lost
    /// (spec.restore), and the host that had lost it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<SnapshotRef>,
    /// The paragraph appended to an agent's instructions: what this runtime holds and how to work in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub briefing: Option<String>,
    /// The egress policies last sent to the host with the session's open, beyond its Runtime's
    /// own: what its host enforces now. Set once the session is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<SessionEgress>,
    /// The egress credentials handed to the host (its Runtime's, then its own): where each
    /// comes from and whether it has a value; never a value. Empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<CredentialStatus>,
    /// The ports of spec.ports the operator opened on the host and has not closed since,
    /// ascending: what it last applied there, so the host is called only when spec.ports
    /// differs. Ports opened through the API directly are not in it. Empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<i32>", inner(range(min = 1, max = 65535)))]
    pub ports: Vec<u16>,
    /// The latest observations: Placed, RuntimeReady, Admitted, Ready, RebuildNeeded, Rebuilt,
    /// EgressApplied, CredentialsApplied, PortsOpen, MemoryKept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One egress credential as handed to the session's host (`status.credentials[]`): never its
/// value.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialStatus {
    /// The host the header is set for.
    pub host: String,
    /// The ports it is set on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<i32>")]
    pub ports: Vec<u16>,
    /// The header set.
    pub header: String,
    /// Where the value comes from: `Secret <namespace>/<name>, key <key>`.
    pub source: String,
    /// Whether the host holds a value for it (false: its requests are answered 502, see
    /// message).
    pub ready: bool,
    /// Why it has no value, or how it stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The egress policies a session's host was last sent (`status.egress`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionEgress {
    /// The further policies the host was sent, each of which a connection must also satisfy
    /// besides its Runtime's policy: the session's spec.egress, then its namespace's ceiling
    /// (annotation sandboxd.dev/egress-ceiling), each when there is one. `open` alone once a
    /// narrowing was lifted (it narrows nothing). Empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    // Written by the operator alone, from policies it validated: the schema keeps their
    // shape without the spec's CEL rules, whose cost the API server would count again.
    #[schemars(schema_with = "sent_policies")]
    pub policies: Vec<Egress>,
    /// When the host acknowledged them (the open that carried them returned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<Time>,
    /// The metadata.generation of the session whose spec.egress they carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The schema of `status.egress.policies`: a list of egress policies (objects whose fields the
/// operator wrote), without validation rules.
fn sent_policies(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true,
        },
    })
}
