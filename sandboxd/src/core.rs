//! The core below both HTTP surfaces: sessions, runs, files, caps and tokens, implemented once.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::audit::{Audit, NewOperation, Op};
use crate::auth;
use crate::config::{Config, RuntimeImage, parse_bytes};
use crate::disk::{DiskError, Disks, human};
use crate::docker::{Engine, Presence, SandboxSpec};
use crate::error::{ApiError, ErrorCode};
use crate::files::Workspace;
use crate::metrics::Metrics;
use crate::network::SandboxNetwork;
use crate::policy::{Fixed, Policy, PolicyRules, PolicyView};
use crate::runner::{RunError, RunEvent, RunOutcome, RunSpec, RunStatus, Runner};
use crate::runtimes::Runtimes;
use crate::store::{Caps, Claim, NewSession, SessionRow, State, Store};
use crate::trash::Trash;
pub use sandboxd_api::run::RunRequest;
pub use sandboxd_api::session::{Destroyed, OpenRequest, Opened, SessionView};

/// How long an open waits for a concurrent open of the same name to finish.
const OPEN_WAIT: Duration = Duration::from_secs(600);

/// Settings the core runs with (the parts of [`Config`] that matter below HTTP).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Host folder of the workspaces.
    pub workspace_root: PathBuf,
    /// Caps.
    pub caps: Caps,
    /// Longest run.
    pub execute_timeout: Duration,
    /// Largest read.
    pub max_read_bytes: u64,
    /// Bytes kept per output stream.
    pub max_output_bytes: usize,
    /// Runs one session may have in flight at once.
    pub max_runs_per_session: usize,
    /// Sandbox uid and gid.
    pub uid: u32,
    /// Network of sessions whose runtime needs none.
    pub network_mode: String,
    /// Network of sessions whose runtime needs one.
    pub runtime_network: String,
    /// CPUs per sandbox (ceiling).
    pub cpus: f64,
    /// Memory per sandbox (default and ceiling), bytes.
    pub memory: i64,
    /// Processes per sandbox (ceiling).
    pub pids_limit: i64,
    /// tmpfs size at /tmp.
    pub tmpfs_size: String,
    /// tmpfs size at a home in the image.
    pub home_size: String,
    /// OCI runtime.
    pub oci_runtime: Option<String>,
    /// Keep closed containers.
    pub persist_containers: bool,
    /// Workspace size (default and ceiling), bytes; `None`: workspaces are not limited
    /// (SANDBOXD_WORKSPACE_QUOTA=off).
    pub workspace_size: Option<u64>,
}

impl Settings {
    /// The settings of a validated config.
    pub fn from_config(c: &Config) -> Self {
        Self {
            workspace_root: c.workspace_root.clone(),
            caps: Caps {
                max_sessions: c.max_sessions,
                max_per_tenant: c.max_sessions_per_tenant,
            },
            execute_timeout: Duration::from_secs(c.execute_timeout),
            max_read_bytes: c.max_read_bytes,
            max_output_bytes: c.max_output_bytes,
            max_runs_per_session: usize::try_from(c.max_runs_per_session).unwrap_or(usize::MAX),
            uid: c.sandbox_uid,
            network_mode: c.network_mode.clone(),
            runtime_network: c
                .network_plan()
                .map_or_else(|_| c.runtime_network.clone(), |p| p.network),
            cpus: c.cpus,
            memory: parse_bytes(&c.mem_limit).unwrap_or(1 << 30),
            pids_limit: c.pids_limit,
            tmpfs_size: c.tmpfs_size.clone(),
            home_size: c.home_size.clone(),
            oci_runtime: c.oci_runtime.clone(),
            persist_containers: c.persist_containers,
            workspace_size: match c.workspace_quota {
                crate::config::WorkspaceQuota::Loop => Some(
                    parse_bytes(&c.workspace_size)
                        .and_then(|b| u64::try_from(b).ok())
                        .unwrap_or(10 << 30),
                ),
                crate::config::WorkspaceQuota::Off => None,
            },
        }
    }
}

/// Per-session resource limits, within the host's ceilings, as the core checks and stores them
/// (JSON in the session row); [`sandboxd_api::Limits`] is what the API takes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Memory in Docker's syntax.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_limit: Option<String>,
    /// Processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<i64>,
    /// Workspace size in Docker's syntax: writing past it fails with "No space left on device".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_size: Option<String>,
}

impl From<sandboxd_api::Limits> for Limits {
    fn from(l: sandboxd_api::Limits) -> Self {
        let sandboxd_api::Limits {
            cpus,
            mem_limit,
            pids_limit,
            workspace_size,
        } = l;
        Self {
            cpus,
            mem_limit,
            pids_limit,
            workspace_size,
        }
    }
}

struct RunEntry {
    session: String,
    cancel: CancellationToken,
}

/// A run in flight: when it ends, or its caller goes away, it is cancelled and forgotten.
struct InFlight<'a> {
    runs: &'a Mutex<HashMap<String, RunEntry>>,
    run_id: String,
    cancel: CancellationToken,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        // Harmless once the run ended; stops it when the caller left before.
        self.cancel.cancel();
        if let Ok(mut runs) = self.runs.lock() {
            runs.remove(&self.run_id);
        }
    }
}

/// A run refused because its session is being destroyed: the session is gone.
fn gone_if_destroying(id: &str, e: ApiError) -> ApiError {
    if e.code == ErrorCode::SessionDestroying {
        ApiError::session_gone(id)
    } else {
        e
    }
}

/// How stale a session's activity time may be: a run within this many milliseconds of the
/// last recorded activity does not write it again.
const ACTIVITY_RESOLUTION_MS: i64 = 1000;

/// The core.
pub struct Core {
    settings: Settings,
    store: Store,
    engine: Engine,
    runner: Arc<dyn Runner>,
    runtimes: Arc<Runtimes>,
    policy: RwLock<Policy>,
    audit: Audit,
    tenants: Mutex<HashMap<String, String>>,
    /// Session tokens already looked up: token hash to session id. An entry is forgotten
    /// whenever a session's tokens change or its row goes (rotate, destroy, a failed open),
    /// so the cache never answers for a token the store would refuse.
    /// The generation counts forgets: a lookup that raced one does not cache its answer.
    token_cache: Mutex<(u64, HashMap<String, String>)>,
    /// The open or wake in flight per session (see [`OpeningSlot`]).
    opening: Mutex<HashMap<String, watch::Receiver<bool>>>,
    runs: Mutex<HashMap<String, RunEntry>>,
    metrics: Arc<Metrics>,
    /// The network of sessions whose runtime needs one; `None`: such a session gets
    /// `settings.runtime_network` as it is (unit tests only).
    network: Option<Arc<SandboxNetwork>>,
    trash: Trash,
    disks: Disks,
    /// The warm pools of the runtimes (see [`crate::pool`]).
    pool: crate::pool::Pool,
}

/// The one open (or wake) in flight of a session in this process. It is taken before the row
/// goes to `opening` and dropped only once the row has left it (running, back to reclaimed, or
/// gone), so a concurrent open or wake that finds the row opening always has it to wait on and
/// never answers with a half-opened session. Dropping it (also on a panic) lets them go on.
struct OpeningSlot<'a> {
    core: &'a Core,
    id: String,
    done: watch::Sender<bool>,
}

impl Drop for OpeningSlot<'_> {
    fn drop(&mut self) {
        if let Ok(mut m) = self.core.opening.lock()
            && m.get(&self.id)
                .is_some_and(|rx| rx.same_channel(&self.done.subscribe()))
        {
            m.remove(&self.id);
        }
        let _ = self.done.send(true);
    }
}

/// Whether this request got a session's [`OpeningSlot`], or another one holds it.
enum Slot<'a> {
    Mine(OpeningSlot<'a>),
    Busy(watch::Receiver<bool>),
}

/// Who asked for a workspace operation, as the request says (`X-Sandbox-Agent`,
/// `X-Sandbox-Run`); recorded in the audit log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Actor {
    /// The agent id.
    pub agent: Option<String>,
    /// The run id.
    pub run: Option<String>,
}

/// The outcome of an operation, for its audit row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Whether it succeeded.
    pub ok: bool,
    /// A command's exit status.
    pub exit_code: Option<i64>,
    /// Our error code when it failed.
    pub error: Option<String>,
    /// Bytes read or written.
    pub bytes: Option<i64>,
}

/// Runs a state change on a task of its own, so a client that goes away mid-request cannot
/// cancel it halfway (an open left `opening`, a destroy that removed the container but not
/// the row): the change completes, and only the answer is lost.
pub async fn detached<T: Send + 'static>(
    change: impl std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::spawn(change)
        .await
        .map_err(|e| ApiError::internal(format!("the operation's task failed: {e}")))?
}

/// Whether `owner` may name a session's owner: an object uid (or any id of at most 128 visible
/// ASCII characters).
pub fn valid_owner(owner: &str) -> bool {
    (1..=128).contains(&owner.len()) && owner.bytes().all(|b| b.is_ascii_graphic())
}

/// 409 `owner_mismatch`: session `id` belongs to another owner than `mine`.
fn owner_mismatch(id: &str, mine: &str) -> ApiError {
    ApiError::conflict(
        ErrorCode::OwnerMismatch,
        format!(
            "Session '{id}' belongs to another owner than '{mine}': it was not opened, given a token or destroyed for this one"
        ),
    )
}

/// Whether `id` may name a session: it is a folder name on the host and a container name part.
pub fn valid_session_id(id: &str) -> bool {
    let mut chars = id.chars();
    (1..=128).contains(&id.len())
        && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// A disk failure of session `id` as the API answers it: 507 when the node has no room.
fn disk_error(id: &str, e: DiskError) -> ApiError {
    match e {
        DiskError::NoRoom { .. } => ApiError::new(507, ErrorCode::HostDiskFull, e.to_string()),
        other => ApiError::internal(format!("the workspace disk of session '{id}': {other}")),
    }
}

fn db(e: sqlx::Error) -> ApiError {
    ApiError::internal(format!("sandboxd's state store failed: {e}"))
}

impl Core {
    /// A core over its parts.
    pub fn new(
        settings: Settings,
        store: Store,
        engine: Engine,
        runner: Arc<dyn Runner>,
        runtimes: Arc<Runtimes>,
        audit: Audit,
        metrics: Arc<Metrics>,
    ) -> Self {
        let policy = Policy {
            max_sessions: settings.caps.max_sessions,
            max_sessions_per_tenant: settings.caps.max_per_tenant,
            execute_timeout: settings.execute_timeout.as_secs(),
            max_read_bytes: settings.max_read_bytes,
            max_output_bytes: settings.max_output_bytes as u64,
        };
        let disks = Disks::new(&settings.workspace_root, settings.uid);
        Self {
            pool: crate::pool::Pool::new(&settings.workspace_root),
            disks,
            store,
            engine,
            runner,
            runtimes,
            policy: RwLock::new(policy),
            audit,
            tenants: Mutex::default(),
            token_cache: Mutex::default(),
            opening: Mutex::default(),
            runs: Mutex::default(),
            metrics,
            network: None,
            trash: Trash::new(&settings.workspace_root),
            settings,
        }
    }

    /// The core with the sandbox network: a session whose runtime needs a network is put on
    /// it, and the network is made and fenced in first when it is not yet.
    pub fn with_network(mut self, network: Arc<SandboxNetwork>) -> Self {
        self.network = Some(network);
        self
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The warm pools.
    pub fn pool(&self) -> &crate::pool::Pool {
        &self.pool
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub(crate) fn runner(&self) -> &Arc<dyn Runner> {
        &self.runner
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The allowlisted runtimes and their build state.
    pub fn runtimes(&self) -> &Arc<Runtimes> {
        &self.runtimes
    }

    /// The audit log.
    pub fn audit(&self) -> &Audit {
        &self.audit
    }

    /// The trash of the workspace root: folders moved aside, deleted in the background.
    pub fn trash(&self) -> &Trash {
        &self.trash
    }

    /// The live policy (caps and lifetimes).
    pub fn policy(&self) -> Policy {
        *self
            .policy
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn caps(&self) -> Caps {
        let p = self.policy();
        Caps {
            max_sessions: p.max_sessions,
            max_per_tenant: p.max_sessions_per_tenant,
        }
    }

    /// The policy with what cannot change at runtime.
    pub fn policy_view(&self) -> PolicyView {
        let s = &self.settings;
        PolicyView {
            policy: self.policy(),
            fixed: Fixed {
                runtimes: self.runtimes.aliases(),
                network_mode: s.network_mode.clone(),
                runtime_network: s.runtime_network.clone(),
                oci_runtime: s.oci_runtime.clone(),
                sandbox_uid: s.uid,
                work_dir: crate::docker::WORKSPACE_MOUNT.to_owned(),
                workspace_root: s.workspace_root.display().to_string(),
                persist_containers: s.persist_containers,
                cpus: s.cpus,
                memory: s.memory,
                pids_limit: s.pids_limit,
                tmpfs_size: s.tmpfs_size.clone(),
                workspace_size: s.workspace_size,
            },
        }
    }

    /// Changes caps and lifetimes live; refuses (422 naming the field) everything else.
    pub fn set_policy(&self, body: &serde_json::Value) -> Result<PolicyView, ApiError> {
        {
            let mut p = self
                .policy
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let next = p.apply(body)?;
            info!(
                max_sessions = next.max_sessions,
                max_sessions_per_tenant = next.max_sessions_per_tenant,
                execute_timeout = next.execute_timeout,
                "policy changed"
            );
            *p = next;
        }
        Ok(self.policy_view())
    }

    /// Records a workspace operation on session `id` in the audit log, off the request path.
    /// Only an operation that reached a session (one this core has looked up) is recorded.
    pub fn record(
        &self,
        id: &str,
        actor: &Actor,
        op: Op,
        target: &str,
        outcome: Outcome,
        started: std::time::Instant,
    ) {
        let tenant = self.tenants.lock().ok().and_then(|t| t.get(id).cloned());
        let Some(tenant) = tenant else { return };
        self.audit.record(NewOperation {
            at_ms: crate::store::now_ms(),
            session: id.to_owned(),
            tenant,
            agent: actor.agent.clone(),
            run: actor.run.clone(),
            op,
            target: target.to_owned(),
            ok: outcome.ok,
            exit_code: outcome.exit_code,
            error: outcome.error,
            bytes: outcome.bytes,
            duration_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
        });
    }

    /// The workspace of a session.
    pub fn workspace(&self, id: &str) -> Workspace {
        Workspace::new(
            self.settings.workspace_root.join(id).join("workspace"),
            self.settings.uid,
            self.settings.uid,
        )
        .with_trash(self.trash.clone())
    }

    /// Moves a session's folder into the trash, where the sweeper deletes it in the
    /// background; returns whether there was one.
    fn discard_folder(&self, id: &str) -> Result<bool, ApiError> {
        let folder = self.settings.workspace_root.join(id);
        // The workspace disk goes first: unmounted, its image is one file in the folder.
        self.disks.unmount(id).map_err(|e| disk_error(id, e))?;
        self.trash.discard(&folder, id).map_err(|e| {
            ApiError::internal(format!(
                "could not move {} into the trash {}: {e}",
                folder.display(),
                self.trash.dir().display()
            ))
        })
    }

    fn runs_in_flight(&self, id: &str) -> usize {
        self.runs
            .lock()
            .map(|r| r.values().filter(|e| e.session == id).count())
            .unwrap_or(0)
    }

    /// 429 `run_cap` when session `id` already has `held` runs in flight, the most
    /// `SANDBOXD_MAX_RUNS_PER_SESSION` allows. The count is sandboxd's own run table, never
    /// what the sandbox says.
    fn check_run_cap(&self, id: &str, held: usize) -> Result<(), ApiError> {
        let max = self.settings.max_runs_per_session;
        if held < max {
            return Ok(());
        }
        Err(ApiError::new(
            429,
            ErrorCode::RunCap,
            format!(
                "Session '{id}' already has {held} of {max} runs in flight (SANDBOXD_MAX_RUNS_PER_SESSION). Wait for one to finish or stop one."
            ),
        ))
    }

    async fn view(&self, row: &SessionRow, with_cpu: bool) -> SessionView {
        let workspace_exists = self.workspace(&row.id).exists();
        // The figures the idle decision takes are ones the sandbox cannot forge: CPU time from
        // the container's cgroup as Docker reports it, runs in flight from this process's own
        // table (never what anything inside the sandbox says).
        // A container Docker no longer runs (stopped or removed behind our back) is shown as
        // such: the row changes on the next use, which starts or recreates it.
        let presence = match (&row.container_id, with_cpu && row.state == State::Running) {
            (Some(c), true) => self.engine.presence(c).await.ok(),
            _ => None,
        };
        let cpu_ns = match presence {
            Some(Presence::Running(ns)) => ns,
            _ => None,
        };
        SessionView {
            id: row.id.clone(),
            tenant: row.tenant.clone(),
            runtime: row.runtime.clone(),
            image: row.image.clone(),
            state: shown_state(row.state, workspace_exists, presence).into(),
            created_at: rfc3339(row.created_at),
            last_activity_at: rfc3339(row.last_activity_at),
            runs_in_flight: self.runs_in_flight(&row.id),
            cpu_ns,
            workspace_exists,
            owner: row.owner.clone(),
            launch: if row.warm {
                sandboxd_api::session::Launch::Warm
            } else {
                sandboxd_api::session::Launch::Cold
            },
        }
    }

    async fn row(&self, id: &str) -> Result<SessionRow, ApiError> {
        let row = self
            .store
            .get(id)
            .await
            .map_err(db)?
            .ok_or_else(|| ApiError::no_such_session(id))?;
        if let Ok(mut t) = self.tenants.lock()
            && t.get(id) != Some(&row.tenant)
        {
            t.insert(id.to_owned(), row.tenant.clone());
        }
        Ok(row)
    }

    /// The session a token belongs to, if any.
    pub async fn session_of_token(&self, token: &str) -> Result<Option<String>, ApiError> {
        let hash = auth::hash(token);
        let generation = {
            let c = self
                .token_cache
                .lock()
                .map_err(|_| ApiError::internal("token cache poisoned"))?;
            if let Some(id) = c.1.get(&hash) {
                return Ok(Some(id.clone()));
            }
            c.0
        };
        let id = self
            .store
            .by_token_hash(&hash)
            .await
            .map_err(db)?
            .map(|r| r.id);
        if let (Some(id), Ok(mut c)) = (&id, self.token_cache.lock())
            && c.0 == generation
        {
            c.1.insert(hash, id.clone());
        }
        Ok(id)
    }

    /// Forgets the cached tokens of a session (before its tokens change or its row goes).
    fn forget_tokens(&self, id: &str) {
        if let Ok(mut c) = self.token_cache.lock() {
            c.0 += 1;
            c.1.retain(|_, session| session != id);
        }
    }

    /// One session; no side effects (never wakes, never marks anything).
    pub async fn get(&self, id: &str) -> Result<SessionView, ApiError> {
        let row = self.row(id).await?;
        Ok(self.view(&row, true).await)
    }

    /// Every session.
    pub async fn list(&self) -> Result<Vec<SessionView>, ApiError> {
        let rows = self.store.list().await.map_err(db)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            out.push(self.view(row, false).await);
        }
        Ok(out)
    }

    fn runtime(&self, alias: Option<&str>) -> Result<RuntimeImage, ApiError> {
        self.runtimes.resolve(alias)
    }

    fn check_limits(&self, limits: &Limits) -> Result<(), ApiError> {
        let s = &self.settings;
        if let Some(c) = limits.cpus
            && (c.is_nan() || c <= 0.0 || c > s.cpus)
        {
            return Err(ApiError::bad_request(format!(
                "limits.cpus must be above 0 and at most {} (this host's ceiling)",
                s.cpus
            )));
        }
        if let Some(m) = &limits.mem_limit {
            match parse_bytes(m) {
                Some(b) if b <= s.memory => {}
                Some(_) => {
                    return Err(ApiError::bad_request(format!(
                        "limits.mem_limit '{m}' is above this host's ceiling of {} bytes",
                        s.memory
                    )));
                }
                None => {
                    return Err(ApiError::bad_request(format!(
                        "limits.mem_limit '{m}' is not a size in Docker's syntax (for example 512m or 2g)"
                    )));
                }
            }
        }
        if let Some(p) = limits.pids_limit
            && !(16..=s.pids_limit).contains(&p)
        {
            return Err(ApiError::bad_request(format!(
                "limits.pids_limit must be between 16 and {} (this host's ceiling)",
                s.pids_limit
            )));
        }
        if let Some(w) = &limits.workspace_size {
            let Some(ceiling) = s.workspace_size else {
                return Err(ApiError::bad_request(format!(
                    "limits.workspace_size '{w}' cannot be held: this host does not limit workspaces (SANDBOXD_WORKSPACE_QUOTA=off)"
                )));
            };
            match parse_bytes(w).and_then(|b| u64::try_from(b).ok()) {
                Some(b) if (crate::disk::MIN_SIZE..=ceiling).contains(&b) => {}
                Some(_) => {
                    return Err(ApiError::bad_request(format!(
                        "limits.workspace_size '{w}' must be between {} and {} (this host's ceiling)",
                        human(crate::disk::MIN_SIZE),
                        human(ceiling)
                    )));
                }
                None => {
                    return Err(ApiError::bad_request(format!(
                        "limits.workspace_size '{w}' is not a size in Docker's syntax (for example 512m or 2g)"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The workspace size a new session gets: its own limit, else its runtime's, within the
    /// host's ceiling; `None` on a host that does not limit workspaces.
    fn workspace_size_of(&self, runtime: &RuntimeImage, limits: &Limits) -> Option<u64> {
        let ceiling = self.settings.workspace_size?;
        let asked = limits
            .workspace_size
            .as_deref()
            .or(runtime.workspace_size.as_deref())
            .and_then(parse_bytes)
            .and_then(|b| u64::try_from(b).ok())
            .unwrap_or(ceiling);
        Some(asked.clamp(crate::disk::MIN_SIZE, ceiling))
    }

    /// The disks of the sessions.
    pub fn disks(&self) -> &Disks {
        &self.disks
    }

    fn cap_error(&self, claim: &Claim, tenant: &str) -> ApiError {
        let caps = self.caps();
        match claim {
            Claim::TenantCap { held } => ApiError::new(
                429,
                ErrorCode::TenantCap,
                format!(
                    "Tenant '{tenant}' already holds {held} of {} sessions. Release an idle session before opening another.",
                    caps.max_per_tenant
                ),
            ),
            _ => {
                let held = if let Claim::HostCap { held } = claim {
                    *held
                } else {
                    caps.max_sessions
                };
                ApiError::new(
                    429,
                    ErrorCode::HostCap,
                    format!(
                        "This host already holds {held} of {} sessions. Release an idle session before opening another.",
                        caps.max_sessions
                    ),
                )
            }
        }
    }

    /// Opens a session by name: creates it, or finds it (waiting for a concurrent open of the
    /// same name). Concurrent opens make exactly one container.
    pub async fn open(&self, req: OpenRequest) -> Result<Opened, ApiError> {
        if !valid_session_id(&req.name) {
            return Err(ApiError::bad_request(format!(
                "name '{}' is not a session name: 1 to 128 characters, letters, digits, '-', '_' or '.', starting with a letter or digit",
                req.name
            )));
        }
        if req.tenant.trim().is_empty() {
            return Err(ApiError::bad_request(
                "tenant must not be empty: send the organization id",
            ));
        }
        if let Some(owner) = &req.owner
            && !valid_owner(owner)
        {
            return Err(ApiError::bad_request(format!(
                "owner '{owner}' is not an owner: 1 to 128 visible ASCII characters (send the object's uid)"
            )));
        }
        let runtime = match self.runtime(req.runtime.as_deref()) {
            Ok(r) => r,
            Err(e) => {
                // Opening a session that exists is finding it, whatever its runtime does now.
                if let Some(row) = self.store.get(&req.name).await.map_err(db)?
                    && row.tenant == req.tenant
                    && row.state != State::Opening
                {
                    let row = self.owned_by(row, req.owner.as_deref()).await?;
                    return Ok(Opened {
                        created: false,
                        session: self.view(&row, false).await,
                        token: None,
                    });
                }
                return Err(e);
            }
        };
        let mut limits: Limits = req.limits.clone().map(Limits::from).unwrap_or_default();
        self.check_limits(&limits)?;
        // The row records the workspace size the session gets (its disk's size): a session
        // with one whose disk is gone is lost, never given a new empty disk.
        limits.workspace_size = self
            .workspace_size_of(&runtime, &limits)
            .map(|b| b.to_string());
        let token = auth::new_session_token();
        let hash = auth::hash(&token);
        let limits_json =
            serde_json::to_string(&limits).map_err(|e| ApiError::internal(e.to_string()))?;
        let new = NewSession {
            id: &req.name,
            tenant: &req.tenant,
            runtime: &runtime.alias,
            image: &runtime.image,
            token_hash: &hash,
            limits: &limits_json,
            owner: req.owner.as_deref(),
        };
        // Take the session's slot before claiming, so a concurrent open that finds the row in
        // state opening always has something to wait on; one in flight is waited for first.
        let deadline = tokio::time::Instant::now() + OPEN_WAIT;
        let slot = loop {
            match self.take_slot(&req.name)? {
                Slot::Mine(slot) => break slot,
                Slot::Busy(rx) => {
                    Self::wait_done(rx, deadline, &req.name).await?;
                    if self.store.get(&req.name).await.map_err(db)?.is_none() {
                        return Err(Self::open_failed(&req.name));
                    }
                }
            }
        };
        let claim = self.store.claim(&new, self.caps()).await.map_err(db)?;
        match claim {
            Claim::Inserted => {
                // A folder (or disk) this open makes is removed again if it fails, so that no
                // later open of the same name (by another tenant) inherits it.
                let folder = self.settings.workspace_root.join(&req.name);
                let had_folder = std::fs::symlink_metadata(&folder).is_ok();
                let had_disk = self.disks.size(&req.name).is_some();
                // A new folder can take a warm pool's container; one already there opens cold.
                let result = if had_folder || had_disk {
                    self.create_container(&req.name, &req.tenant, &runtime, &limits)
                        .await
                } else {
                    crate::pool::open(self, &req.name, &req.tenant, &runtime, &limits).await
                };
                match result {
                    Ok(()) => {
                        self.metrics
                            .opens
                            .get_or_create(&crate::metrics::Outcome::new("created"))
                            .inc();
                        let row = self.row(&req.name).await?;
                        Ok(Opened {
                            created: true,
                            session: self.view(&row, false).await,
                            token: Some(token),
                        })
                    }
                    Err(e) => {
                        // A failed open uses no capacity, nor the disk or folder it made.
                        if !had_disk && let Err(err) = self.disks.release(&req.name) {
                            warn!(session = %req.name, error = %err, "cannot release the disk of a failed open");
                        }
                        if !had_folder && let Err(left) = self.discard_folder(&req.name) {
                            warn!(session = %req.name, error = %left.message, "a failed open could not remove the folder it made");
                        }
                        let _ = self.store.delete(&req.name).await;
                        self.forget_tokens(&req.name);
                        drop(slot);
                        self.metrics
                            .opens
                            .get_or_create(&crate::metrics::Outcome::new("failed"))
                            .inc();
                        Err(e)
                    }
                }
            }
            Claim::Exists(row) => {
                drop(slot);
                let row = *row;
                if row.tenant != req.tenant {
                    return Err(ApiError::conflict(
                        ErrorCode::NameTaken,
                        format!("Session name '{}' is taken by another tenant", req.name),
                    ));
                }
                // Never attach to (nor hand a token of) a session another object owns.
                let row = self.owned_by(row, req.owner.as_deref()).await?;
                let row = if row.state == State::Opening {
                    self.wait_opened(&req.name).await?
                } else {
                    row
                };
                self.metrics
                    .opens
                    .get_or_create(&crate::metrics::Outcome::new("found"))
                    .inc();
                Ok(Opened {
                    created: false,
                    session: self.view(&row, false).await,
                    token: None,
                })
            }
            refused => {
                self.metrics
                    .opens
                    .get_or_create(&crate::metrics::Outcome::new("refused"))
                    .inc();
                Err(self.cap_error(&refused, &req.tenant))
            }
        }
    }

    /// `row` if `owner` may act on it: it has no owner (then `owner` adopts it) or the same
    /// one; 409 `owner_mismatch` when another owner holds it. `None` checks nothing.
    async fn owned_by(&self, row: SessionRow, owner: Option<&str>) -> Result<SessionRow, ApiError> {
        let Some(mine) = owner else {
            return Ok(row);
        };
        let row = if row.owner.is_none() {
            let id = row.id.clone();
            let adopted = self.store.adopt(&id, mine).await.map_err(db)?;
            let row = adopted.ok_or_else(|| ApiError::no_such_session(&id))?;
            if row.owner.as_deref() == Some(mine) {
                info!(session = %id, owner = mine, "session without an owner adopted");
            }
            row
        } else {
            row
        };
        match row.owner.as_deref() {
            Some(theirs) if theirs != mine => Err(owner_mismatch(&row.id, mine)),
            _ => Ok(row),
        }
    }

    /// Takes the session's [`OpeningSlot`], or says who holds it.
    fn take_slot(&self, id: &str) -> Result<Slot<'_>, ApiError> {
        let mut m = self
            .opening
            .lock()
            .map_err(|_| ApiError::internal("open registry poisoned"))?;
        if let Some(rx) = m.get(id) {
            return Ok(Slot::Busy(rx.clone()));
        }
        let (done, rx) = watch::channel(false);
        m.insert(id.to_owned(), rx);
        Ok(Slot::Mine(OpeningSlot {
            core: self,
            id: id.to_owned(),
            done,
        }))
    }

    /// Waits, until `deadline`, for the open or wake in flight whose slot `rx` watches.
    async fn wait_done(
        mut rx: watch::Receiver<bool>,
        deadline: tokio::time::Instant,
        id: &str,
    ) -> Result<(), ApiError> {
        match tokio::time::timeout_at(deadline, rx.wait_for(|done| *done)).await {
            // Done, or its slot dropped: either way it is over.
            Ok(_) => Ok(()),
            Err(_) => Err(ApiError::opening(id)),
        }
    }

    fn open_failed(id: &str) -> ApiError {
        ApiError::new(
            502,
            ErrorCode::OpenFailed,
            format!("A concurrent open of session '{id}' failed; open it again"),
        )
    }

    /// Waits for the open or wake in flight of a session and returns its row once it has left
    /// `opening` (running, reclaimed after a failed wake); 502 `open_failed` when the open
    /// failed (the row is gone), 409 `session_opening` when it does not finish in time.
    async fn wait_opened(&self, id: &str) -> Result<SessionRow, ApiError> {
        let deadline = tokio::time::Instant::now() + OPEN_WAIT;
        let mut unattended = 0;
        loop {
            let rx = self.opening.lock().ok().and_then(|m| m.get(id).cloned());
            let waited = rx.is_some();
            if let Some(rx) = rx {
                Self::wait_done(rx, deadline, id).await?;
            }
            let row = self
                .store
                .get(id)
                .await
                .map_err(db)?
                .ok_or_else(|| Self::open_failed(id))?;
            if row.state != State::Opening {
                return Ok(row);
            }
            // Opening with no slot: one was taken just after the look (the next look sees
            // it), or the row was left so by a crash (the start-up reconcile fixes it).
            if !waited {
                unattended += 1;
                if unattended >= 3 {
                    return Err(ApiError::opening(id));
                }
                tokio::task::yield_now().await;
            }
        }
    }

    pub(crate) async fn create_container(
        &self,
        id: &str,
        tenant: &str,
        runtime: &RuntimeImage,
        limits: &Limits,
    ) -> Result<(), ApiError> {
        let workspace = self.workspace(id);
        if let Some(size) = self.workspace_size_of(runtime, limits) {
            let disks = self.disks.clone();
            let made = tokio::task::spawn_blocking({
                let id = id.to_owned();
                move || disks.create(&id, size)
            })
            .await
            .map_err(|e| ApiError::internal(format!("the disk task failed: {e}")))?;
            made.map_err(|e| disk_error(id, e))?;
        }
        workspace.prepare()?;
        let spec = self
            .sandbox_spec(id, id, tenant, runtime, limits, &workspace)
            .await?;
        // A container left by an earlier crash under the same name is removed first.
        let _ = self.engine.remove(&self.engine.container_name(id)).await;
        let container = self
            .engine
            .create(&spec)
            .await
            .map_err(|e| ApiError::docker(e.to_string()))?;
        self.store
            .set_container(id, Some(&container))
            .await
            .map_err(db)?;
        if !self
            .store
            .transition(id, &[State::Opening], State::Running)
            .await
            .map_err(db)?
        {
            let _ = self.engine.remove(&container).await;
            return Err(ApiError::conflict(
                ErrorCode::SessionChanged,
                format!("Session '{id}' changed while it was opening"),
            ));
        }
        info!(session = id, tenant, runtime = %runtime.alias, "session opened");
        Ok(())
    }

    /// What a sandbox of `runtime` with `limits` is created with, every session's and every
    /// warm pool container's alike: named `name` (its session, or the pool's name for it),
    /// its workspace `workspace`, its agent's run folder in the folder `folder` of the
    /// workspace root.
    pub(crate) async fn sandbox_spec(
        &self,
        name: &str,
        folder: &str,
        tenant: &str,
        runtime: &RuntimeImage,
        limits: &Limits,
        workspace: &Workspace,
    ) -> Result<SandboxSpec, ApiError> {
        let s = &self.settings;
        let network_mode = match (&self.network, runtime.needs_network) {
            (_, false) => s.network_mode.clone(),
            (None, true) => s.runtime_network.clone(),
            (Some(network), true) => network.ensure().await.map_err(|e| {
                ApiError::new(
                    503,
                    ErrorCode::NetworkUnavailable,
                    format!(
                        "Runtime '{}' needs a network, and this host cannot give it one safely: {e}",
                        runtime.alias
                    ),
                )
            })?,
        };
        let (cpus, memory, pids_limit) = self.shape(runtime, limits);
        Ok(SandboxSpec {
            session: name.to_owned(),
            tenant: tenant.to_owned(),
            image: runtime.image.clone(),
            workspace: workspace.dir().display().to_string(),
            uid: s.uid,
            network_mode,
            cpus,
            memory,
            pids_limit,
            tmpfs_size: s.tmpfs_size.clone(),
            home_size: s.home_size.clone(),
            oci_runtime: s.oci_runtime.clone(),
            env: runtime
                .env
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
            agent: self.runner.agent_mount(folder).map_err(|e| {
                ApiError::internal(format!("cannot prepare the agent folder of '{name}': {e}"))
            })?,
        })
    }

    /// The CPUs, memory (bytes) and processes a sandbox of `runtime` with `limits` gets.
    pub(crate) fn shape(&self, runtime: &RuntimeImage, limits: &Limits) -> (f64, i64, i64) {
        let s = &self.settings;
        let memory = limits
            .mem_limit
            .as_deref()
            .or(runtime.mem_limit.as_deref())
            .and_then(parse_bytes)
            .unwrap_or(s.memory);
        (
            limits.cpus.unwrap_or(s.cpus),
            memory,
            limits.pids_limit.unwrap_or(s.pids_limit),
        )
    }

    fn limits_of(row: &SessionRow) -> Limits {
        serde_json::from_str(&row.limits).unwrap_or_default()
    }

    /// Marks a session lost when its workspace vanished; returns the 410 to answer with.
    async fn check_workspace(&self, row: &SessionRow) -> Result<(), ApiError> {
        if row.state == State::Lost {
            return Err(ApiError::lost(&row.id));
        }
        let has_disk = self.disks.size(&row.id).is_some();
        if !has_disk && row.state != State::Opening && Self::limits_of(row).workspace_size.is_some()
        {
            warn!(session = %row.id, "the workspace's disk image vanished");
            return self.mark_lost(row).await;
        }
        // A session's disk that is not mounted (the node restarted) is mounted first: its
        // empty mount point must never pass for the workspace.
        if self.disks.size(&row.id).is_some() && !self.disks.is_mounted(&row.id) {
            let disks = self.disks.clone();
            let id = row.id.clone();
            tokio::task::spawn_blocking(move || disks.mount(&id))
                .await
                .map_err(|e| ApiError::internal(format!("the disk task failed: {e}")))?
                .map_err(|e| disk_error(&row.id, e))?;
        }
        if self.workspace(&row.id).exists() {
            return Ok(());
        }
        warn!(session = %row.id, "workspace vanished; session is lost");
        self.mark_lost(row).await
    }

    /// Makes a session lost (its container removed); returns the 410 to answer with.
    async fn mark_lost(&self, row: &SessionRow) -> Result<(), ApiError> {
        if self
            .store
            .transition(
                &row.id,
                &[
                    State::Opening,
                    State::Running,
                    State::Stopped,
                    State::Reclaimed,
                ],
                State::Lost,
            )
            .await
            .map_err(db)?
            && let Some(c) = &row.container_id
        {
            let _ = self.engine.remove(c).await;
            let _ = self.store.set_container(&row.id, None).await;
        }
        Err(ApiError::lost(&row.id))
    }

    /// Wakes a session so a command can run: starts a stopped container, recreates a reclaimed
    /// one (within the caps), waits for one still opening. Returns the running row.
    pub async fn wake(&self, id: &str) -> Result<SessionRow, ApiError> {
        let row = self.row(id).await?;
        self.check_workspace(&row).await?;
        match row.state {
            State::Running => {
                // Docker may have stopped it behind our back (OOM of the keepalive, a restart).
                if let Some(c) = &row.container_id
                    && self
                        .engine
                        .running(c)
                        .await
                        .map_err(|e| ApiError::docker(e.to_string()))?
                        == Some(true)
                {
                    return Ok(row);
                }
                if let Some(c) = &row.container_id {
                    // The run path says why (an agent that died is reported).
                    self.runner.container_stopped(id, c).await;
                }
                self.store
                    .transition(id, &[State::Running], State::Stopped)
                    .await
                    .map_err(db)?;
                Box::pin(self.wake(id)).await
            }
            State::Opening => {
                // Whatever the open in flight ends in, this wake starts over from there.
                self.wait_opened(id).await?;
                Box::pin(self.wake(id)).await
            }
            State::Stopped => {
                let Some(c) = row.container_id.clone() else {
                    self.store
                        .transition(id, &[State::Stopped], State::Reclaimed)
                        .await
                        .map_err(db)?;
                    return Box::pin(self.wake(id)).await;
                };
                // A container taken from a warm pool binds the workspace by the pool folder's
                // old path: started again, Docker would bind that path, not the session's
                // folder. It is replaced instead; the workspace stays.
                if row.warm {
                    self.engine
                        .remove(&c)
                        .await
                        .map_err(|e| ApiError::docker(e.to_string()))?;
                    self.store.set_container(id, None).await.map_err(db)?;
                    self.store
                        .transition(id, &[State::Stopped], State::Reclaimed)
                        .await
                        .map_err(db)?;
                    info!(session = id, "warm container replaced on wake");
                    return Box::pin(self.wake(id)).await;
                }
                match self.engine.start(&c).await {
                    Ok(()) => {}
                    Err(e) if e.is_not_found() => {
                        self.store.set_container(id, None).await.map_err(db)?;
                        self.store
                            .transition(id, &[State::Stopped], State::Reclaimed)
                            .await
                            .map_err(db)?;
                        return Box::pin(self.wake(id)).await;
                    }
                    Err(e) => return Err(ApiError::docker(e.to_string())),
                }
                self.store
                    .transition(id, &[State::Stopped], State::Running)
                    .await
                    .map_err(db)?;
                info!(session = id, "session woken");
                self.row(id).await
            }
            State::Reclaimed => {
                let slot = match self.take_slot(id)? {
                    Slot::Mine(slot) => slot,
                    Slot::Busy(rx) => {
                        Self::wait_done(rx, tokio::time::Instant::now() + OPEN_WAIT, id).await?;
                        return Box::pin(self.wake(id)).await;
                    }
                };
                match self
                    .store
                    .reclaim_to_opening(id, &row.tenant, self.caps())
                    .await
                    .map_err(db)?
                {
                    Some(Claim::Inserted) => {}
                    Some(refused) => return Err(self.cap_error(&refused, &row.tenant)),
                    None => {
                        drop(slot);
                        return Box::pin(self.wake(id)).await;
                    }
                }
                let runtime = self.runtimes.ready(&row.runtime).unwrap_or_else(|| {
                    let mut env = std::collections::BTreeMap::new();
                    if row.image.starts_with(crate::runtimes::REPOSITORY) {
                        env.insert("HOME".to_owned(), crate::runtimes::HOME.to_owned());
                    }
                    RuntimeImage {
                        alias: row.runtime.clone(),
                        image: row.image.clone(),
                        needs_network: false,
                        mem_limit: None,
                        workspace_size: None,
                        env,
                    }
                });
                let result = self
                    .create_container(id, &row.tenant, &runtime, &Self::limits_of(&row))
                    .await;
                if let Err(e) = result {
                    self.store
                        .transition(id, &[State::Opening], State::Reclaimed)
                        .await
                        .map_err(db)?;
                    return Err(e);
                }
                let woken = self.row(id).await;
                drop(slot);
                woken
            }
            State::Lost => Err(ApiError::lost(id)),
            State::Destroying => Err(ApiError::destroying(id)),
        }
    }

    /// Puts a session to sleep: the container stops, the files stay.
    pub async fn stop(&self, id: &str) -> Result<SessionView, ApiError> {
        let row = self.row(id).await?;
        match row.state {
            State::Stopped | State::Reclaimed => {}
            State::Running => {
                if let Some(c) = &row.container_id {
                    self.engine
                        .stop(c)
                        .await
                        .map_err(|e| ApiError::docker(e.to_string()))?;
                }
                self.store
                    .transition(id, &[State::Running], State::Stopped)
                    .await
                    .map_err(db)?;
                info!(session = id, "session asleep");
            }
            State::Opening => {
                return Err(ApiError::opening(id));
            }
            State::Lost => return Err(ApiError::lost(id)),
            State::Destroying => {
                return Err(ApiError::destroying(id));
            }
        }
        self.get(id).await
    }

    /// Removes a session's container; the workspace stays. A host that keeps containers
    /// (SANDBOXD_PERSIST_CONTAINERS) refuses.
    pub async fn reclaim(&self, id: &str) -> Result<SessionView, ApiError> {
        let row = self.row(id).await?;
        if self.settings.persist_containers {
            return Err(ApiError::conflict(
                ErrorCode::ContainersPersist,
                "This host keeps the containers of its sessions (SANDBOXD_PERSIST_CONTAINERS=true), so reclaiming is off; stop the session to let it sleep",
            ));
        }
        match row.state {
            State::Reclaimed => {}
            State::Running | State::Stopped => {
                if !self
                    .store
                    .transition(id, &[State::Running, State::Stopped], State::Reclaimed)
                    .await
                    .map_err(db)?
                {
                    return Err(ApiError::conflict(
                        ErrorCode::SessionChanged,
                        format!("Session '{id}' changed; try again"),
                    ));
                }
                if let Some(c) = &row.container_id {
                    self.engine
                        .remove(c)
                        .await
                        .map_err(|e| ApiError::docker(e.to_string()))?;
                }
                self.store.set_container(id, None).await.map_err(db)?;
                info!(session = id, "container reclaimed; workspace kept");
            }
            State::Opening => {
                return Err(ApiError::opening(id));
            }
            State::Lost => return Err(ApiError::lost(id)),
            State::Destroying => {
                return Err(ApiError::destroying(id));
            }
        }
        self.get(id).await
    }

    /// Removes the container and the workspace. Destroying what is already gone succeeds.
    /// The session's folder is moved into the trash (one rename, whatever it holds) and
    /// deleted there in the background, so a destroy answers at once.
    pub async fn destroy(&self, id: &str) -> Result<Destroyed, ApiError> {
        self.destroy_as(id, None).await
    }

    /// [`Core::destroy`] for `owner`: a session another owner holds is left alone (409
    /// `owner_mismatch`), so a destroy owed for an object that is gone never removes the
    /// session a newer object opened under the same id. `None` destroys whoever owns it.
    pub async fn destroy_as(&self, id: &str, owner: Option<&str>) -> Result<Destroyed, ApiError> {
        let Some(row) = self.store.get(id).await.map_err(db)? else {
            let had_files = valid_session_id(id) && self.discard_folder(id)?;
            return Ok(Destroyed {
                id: id.to_owned(),
                destroyed: had_files,
                message: format!("Session '{id}' was already gone"),
            });
        };
        if let Some(theirs) = &row.owner
            && let Some(mine) = owner
            && theirs != mine
        {
            return Err(owner_mismatch(id, mine));
        }
        if row.state == State::Opening {
            let _ = self.wait_opened(id).await;
        }
        let every = [
            State::Opening,
            State::Running,
            State::Stopped,
            State::Reclaimed,
            State::Lost,
            State::Destroying,
        ];
        if let Some(mine) = owner {
            // Guarded on the owner too: a session another owner opened under this id since the
            // row was read is never marked for destruction.
            if !self
                .store
                .transition_owned(id, &every, State::Destroying, mine)
                .await
                .map_err(db)?
            {
                return match self.store.get(id).await.map_err(db)? {
                    None => Ok(Destroyed {
                        id: id.to_owned(),
                        destroyed: false,
                        message: format!("Session '{id}' was already gone"),
                    }),
                    Some(_) => Err(owner_mismatch(id, mine)),
                };
            }
        } else {
            self.store
                .transition(id, &every, State::Destroying)
                .await
                .map_err(db)?;
        }
        self.cancel_runs(id);
        if let Some(c) = &row.container_id {
            self.engine
                .remove(c)
                .await
                .map_err(|e| ApiError::docker(e.to_string()))?;
        }
        let _ = self.engine.remove(&self.engine.container_name(id)).await;
        self.discard_folder(id)?;
        self.store.delete(id).await.map_err(db)?;
        self.forget_tokens(id);
        if let Ok(mut t) = self.tenants.lock() {
            t.remove(id);
        }
        info!(session = id, "session destroyed");
        Ok(Destroyed {
            id: id.to_owned(),
            destroyed: true,
            message: format!("Session '{id}' destroyed: container and workspace removed"),
        })
    }

    /// Gives a session a new token (the old one stops working) and returns it.
    pub async fn rotate_token(&self, id: &str) -> Result<String, ApiError> {
        self.rotate_token_as(id, None).await
    }

    /// [`Core::rotate_token`] for `owner`: a session another owner holds keeps its token (409
    /// `owner_mismatch`); one without an owner is adopted. `None` rotates whoever owns it.
    pub async fn rotate_token_as(&self, id: &str, owner: Option<&str>) -> Result<String, ApiError> {
        if let Some(owner) = owner
            && !valid_owner(owner)
        {
            return Err(ApiError::bad_request(format!(
                "owner '{owner}' is not an owner: 1 to 128 visible ASCII characters (send the object's uid)"
            )));
        }
        let row = self.row(id).await?;
        self.owned_by(row, owner).await?;
        let token = auth::new_session_token();
        let set = self.store.set_token_hash(id, &auth::hash(&token)).await;
        // After the change (a lookup racing it does not cache: the generation moved on).
        self.forget_tokens(id);
        set.map_err(db)?;
        Ok(token)
    }

    /// Gives a session one more token beside the ones it has (those keep working) and returns
    /// it; only its hash is kept. The wire surface hands one to every caller that attaches.
    pub async fn grant_token(&self, id: &str) -> Result<String, ApiError> {
        let token = auth::new_session_token();
        if !self
            .store
            .add_token_hash(id, &auth::hash(&token))
            .await
            .map_err(db)?
        {
            return Err(ApiError::no_such_session(id));
        }
        Ok(token)
    }

    fn cancel_runs(&self, id: &str) {
        if let Ok(runs) = self.runs.lock() {
            for e in runs.values().filter(|e| e.session == id) {
                e.cancel.cancel();
            }
        }
    }

    /// Runs a command, waking the session first; output also goes to `events` as it comes.
    pub async fn run(
        &self,
        id: &str,
        req: RunRequest,
        events: Option<mpsc::Sender<RunEvent>>,
    ) -> Result<RunOutcome, ApiError> {
        if req.command.trim().is_empty() {
            return Err(ApiError::bad_request("command must not be empty"));
        }
        // No process takes a NUL in its arguments; refused here rather than failing to start.
        if req.command.contains('\0') {
            return Err(ApiError::bad_request("command must not hold a NUL byte"));
        }
        if let Some(t) = req.timeout_seconds
            && t == 0
        {
            return Err(ApiError::bad_request("timeout_seconds must be at least 1"));
        }
        let mut env = Vec::new();
        for (k, v) in req.env.clone().unwrap_or_default() {
            let valid = k
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid || v.contains('\0') {
                return Err(ApiError::bad_request(format!(
                    "env: '{k}' is not a variable name ([A-Za-z_][A-Za-z0-9_]*) or its value holds a NUL byte"
                )));
            }
            env.push(format!("{k}={v}"));
        }
        // Refused before anything is woken or asked of Docker; checked again, atomically, as
        // the run is entered in the table below.
        self.check_run_cap(id, self.runs_in_flight(id))?;
        // A running session goes straight to a run path that finds a stopped container by
        // itself (the agent's handshake fails, and `NotRunning` below starts it again): no
        // Docker round trip per run. Anything else is woken first.
        let row = match self.row(id).await? {
            row if row.state == State::Running
                && row.container_id.is_some()
                && self.runner.finds_stopped_containers()
                && self.workspace(id).exists() =>
            {
                row
            }
            _ => self.wake(id).await.map_err(|e| gone_if_destroying(id, e))?,
        };
        let mut container = row.container_id.clone().ok_or_else(|| {
            ApiError::internal(format!("session '{id}' runs without a container"))
        })?;
        let run_id = req
            .run_id
            .clone()
            .unwrap_or_else(|| format!("run-{}", &auth::new_session_token()[4..20]));
        let cancel = CancellationToken::new();
        {
            let mut runs = self
                .runs
                .lock()
                .map_err(|_| ApiError::internal("run registry poisoned"))?;
            if runs.contains_key(&run_id) {
                return Err(ApiError::conflict(
                    ErrorCode::RunExists,
                    format!("Run '{run_id}' is already running"),
                ));
            }
            self.check_run_cap(id, runs.values().filter(|e| e.session == id).count())?;
            runs.insert(
                run_id.clone(),
                RunEntry {
                    session: id.to_owned(),
                    cancel: cancel.clone(),
                },
            );
        }
        // A caller that goes away mid-run (its request dropped) stops the run: the guard
        // cancels it and forgets it, and the run itself goes on in a task of its own
        // (`spawn_run`) just long enough to stop the command's process tree.
        let _in_flight = InFlight {
            runs: &self.runs,
            run_id: run_id.clone(),
            cancel: cancel.clone(),
        };
        // The activity time, as the run starts and as it ends. A row touched within the last
        // second (a burst of runs) needs no write: the time it holds is at most that stale, and
        // a run in flight keeps the session awake by itself.
        let mut touched_at = row.last_activity_at;
        if crate::store::now_ms().saturating_sub(touched_at) > ACTIVITY_RESOLUTION_MS {
            let _ = self.store.touch(id).await;
            touched_at = crate::store::now_ms();
        }
        let policy = self.policy();
        let max_timeout = Duration::from_secs(policy.execute_timeout);
        let timeout = req
            .timeout_seconds
            .map_or(max_timeout, |t| Duration::from_secs(t).min(max_timeout));
        let mut spec = RunSpec {
            run_id: run_id.clone(),
            session: id.to_owned(),
            container: container.clone(),
            command: req.command,
            env,
            uid: self.settings.uid,
            timeout,
            max_output_bytes: usize::try_from(policy.max_output_bytes).unwrap_or(usize::MAX),
        };
        let mut result = self
            .spawn_run(spec.clone(), events.clone(), cancel.clone())
            .await;
        if matches!(result, Err(RunError::NotRunning)) {
            // The container died under the session (its init was OOM-killed, Docker restarted):
            // start it again, files intact, and run once more.
            warn!(
                session = id,
                "container was not running; starting it again for the run"
            );
            let _ = self
                .store
                .transition(id, &[State::Running], State::Stopped)
                .await;
            match self.wake(id).await {
                Ok(row) => {
                    container = row.container_id.unwrap_or(container);
                    spec.container = container;
                    result = self.spawn_run(spec, events, cancel).await;
                }
                Err(e) => {
                    if let Ok(mut runs) = self.runs.lock() {
                        runs.remove(&run_id);
                    }
                    return Err(gone_if_destroying(id, e));
                }
            }
        }
        if let Ok(mut runs) = self.runs.lock() {
            runs.remove(&run_id);
        }
        // A run cut short because its session was destroyed meanwhile ended with the
        // environment, not with the command: the caller must be able to tell.
        if (result.is_err() || result.as_ref().is_ok_and(|o| o.stopped))
            && self.destroyed_or_destroying(id).await
        {
            return Err(ApiError::session_gone(id));
        }
        if crate::store::now_ms().saturating_sub(touched_at) > ACTIVITY_RESOLUTION_MS {
            let _ = self.store.touch(id).await;
        }
        let outcome = result.map_err(|e| ApiError::docker(e.to_string()))?;
        self.metrics.observe_run(&outcome);
        Ok(outcome)
    }

    /// Runs `spec` on a task of its own and waits for it: if the caller stops waiting, the task
    /// still sees `cancel` fire and stops the command, instead of being dropped with the
    /// command left running in the sandbox.
    async fn spawn_run(
        &self,
        spec: RunSpec,
        events: Option<mpsc::Sender<RunEvent>>,
        cancel: CancellationToken,
    ) -> Result<RunOutcome, RunError> {
        let runner = self.runner.clone();
        tokio::spawn(async move { runner.run(spec, events, cancel).await })
            .await
            .unwrap_or_else(|e| Err(RunError::Stream(format!("the run's task failed: {e}"))))
    }

    /// Whether session `id` is gone or being destroyed.
    async fn destroyed_or_destroying(&self, id: &str) -> bool {
        match self.store.get(id).await {
            Ok(None) => true,
            Ok(Some(row)) => row.state == State::Destroying,
            Err(_) => false,
        }
    }

    /// Stops a running run of a session.
    pub fn stop_run(&self, id: &str, run_id: &str) -> Result<(), ApiError> {
        let runs = self
            .runs
            .lock()
            .map_err(|_| ApiError::internal("run registry poisoned"))?;
        match runs.get(run_id) {
            Some(e) if e.session == id => {
                e.cancel.cancel();
                Ok(())
            }
            _ => Err(ApiError::new(
                404,
                ErrorCode::RunNotFound,
                format!("No run '{run_id}' is running in session '{id}'"),
            )),
        }
    }

    /// Stops a run of a session: one this process runs, else one the session's agent still
    /// runs whose request was lost when sandboxd restarted.
    pub async fn stop_run_or_detached(&self, id: &str, run_id: &str) -> Result<(), ApiError> {
        match self.stop_run(id, run_id) {
            Err(e) if e.code == ErrorCode::RunNotFound => {
                self.row(id).await?;
                match self.runner.stop_detached(id, run_id).await {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(e),
                    Err(err) => Err(ApiError::docker(err.to_string())),
                }
            }
            other => other,
        }
    }

    /// The state of a run, in flight or finished, as the session's agent knows it (runs of
    /// the exec path are known only while in flight).
    pub async fn run_status(&self, id: &str, run_id: &str) -> Result<RunStatus, ApiError> {
        let row = self.row(id).await?;
        if row.state == State::Running
            && let Some(status) = self
                .runner
                .status(id, run_id)
                .await
                .map_err(|e| ApiError::docker(e.to_string()))?
        {
            return Ok(status);
        }
        let local = self
            .runs
            .lock()
            .map(|r| r.get(run_id).is_some_and(|e| e.session == id))
            .unwrap_or(false);
        if local {
            return Ok(RunStatus {
                run_id: run_id.to_owned(),
                running: true,
                exit_code: None,
                timed_out: false,
                stopped: false,
                truncated: false,
                cpu_ns: None,
                duration_ms: None,
                stdout: String::new(),
                stderr: String::new(),
            });
        }
        Err(ApiError::new(
            404,
            ErrorCode::RunNotFound,
            format!("No run '{run_id}' is known in session '{id}'"),
        ))
    }

    /// The workspace of a session for a file operation: never wakes it; a vanished workspace
    /// makes it lost.
    pub async fn files(&self, id: &str) -> Result<Workspace, ApiError> {
        let row = self.row(id).await?;
        if row.state == State::Destroying {
            return Err(ApiError::destroying(id));
        }
        self.check_workspace(&row).await?;
        let _ = self.store.touch(id).await;
        Ok(self.workspace(id).with_size_limit(self.disks.size(id)))
    }

    /// Brings the rows in line with what Docker reports, after a crash at any point: no
    /// orphaned container, no lost workspace, no stuck session.
    pub async fn reconcile(&self) -> Result<Reconciled, ApiError> {
        let mut done = Reconciled::default();
        let owned = self
            .engine
            .owned()
            .await
            .map_err(|e| ApiError::docker(e.to_string()))?;
        let rows = self.store.list().await.map_err(db)?;
        for row in &rows {
            if row.state != State::Destroying
                && let Err(e) = self.disks.mount(&row.id)
            {
                warn!(session = %row.id, error = %e, "cannot mount the workspace disk");
            }
        }
        for c in &owned {
            // By container id: a container a session took from a warm pool is labelled with
            // the pool's name for it, not the session's.
            let row = rows
                .iter()
                .find(|r| r.container_id.as_deref() == Some(c.id.as_str()));
            let keep = row.is_some_and(|r| {
                matches!(r.state, State::Running | State::Stopped)
                    && r.container_id.as_deref() == Some(c.id.as_str())
            });
            if !keep {
                let _ = self.engine.remove(&c.id).await;
                done.containers_removed += 1;
            }
        }
        for row in &rows {
            let container = owned
                .iter()
                .find(|c| Some(c.id.as_str()) == row.container_id.as_deref());
            // A row that cannot be fixed now is reported and left for the next start; it never
            // keeps the others (or sandboxd) from going on.
            match self.reconcile_row(row, container).await {
                Ok(true) => done.sessions_fixed += 1,
                Ok(false) => {}
                Err(e) => {
                    warn!(
                        session = %row.id,
                        state = ?row.state,
                        error = %e.message,
                        "reconcile could not fix this session; it is left as it is"
                    );
                    done.sessions_failed += 1;
                }
            }
        }
        info!(
            containers_removed = done.containers_removed,
            sessions_fixed = done.sessions_fixed,
            sessions_failed = done.sessions_failed,
            "reconciled with docker"
        );
        Ok(done)
    }

    /// Brings one row in line with its container (if Docker has it); returns whether it
    /// changed anything that counts as a fix.
    async fn reconcile_row(
        &self,
        row: &SessionRow,
        container: Option<&crate::docker::Owned>,
    ) -> Result<bool, ApiError> {
        match (row.state, container) {
            (State::Opening, _) => {
                // Interrupted open: whatever it made is gone (above); the workspace stays.
                self.store.set_container(&row.id, None).await.map_err(db)?;
                self.store
                    .transition(&row.id, &[State::Opening], State::Reclaimed)
                    .await
                    .map_err(db)?;
                Ok(true)
            }
            (State::Destroying, _) => {
                self.destroy(&row.id).await?;
                Ok(true)
            }
            (State::Running | State::Stopped, None) => {
                self.store.set_container(&row.id, None).await.map_err(db)?;
                self.store
                    .transition(&row.id, &[State::Running, State::Stopped], State::Reclaimed)
                    .await
                    .map_err(db)?;
                Ok(true)
            }
            (State::Running, Some(c)) if !c.running => {
                self.store
                    .transition(&row.id, &[State::Running], State::Stopped)
                    .await
                    .map_err(db)?;
                Ok(true)
            }
            (State::Stopped, Some(c)) if c.running => {
                self.store
                    .transition(&row.id, &[State::Stopped], State::Running)
                    .await
                    .map_err(db)?;
                Ok(true)
            }
            (State::Reclaimed | State::Lost, Some(_)) => {
                self.store.set_container(&row.id, None).await.map_err(db)?;
                Ok(false)
            }
            _ => Ok(false),
        }
    }
}

/// What a reconcile changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Reconciled {
    /// Containers removed because no session owns them.
    pub containers_removed: usize,
    /// Sessions whose state was corrected.
    pub sessions_fixed: usize,
    /// Sessions that could not be brought in line (each logged with why); they stay as they
    /// were until the next start.
    pub sessions_failed: usize,
}

/// The state a session is shown in: its row's, except that a vanished workspace is `lost` and a
/// running row whose container Docker has stopped or removed is `stopped` or `reclaimed`, which
/// is what the next use finds (it starts or recreates the container).
fn shown_state(row: State, workspace_exists: bool, container: Option<Presence>) -> State {
    if !workspace_exists && row != State::Destroying {
        return State::Lost;
    }
    match (row, container) {
        (State::Running, Some(Presence::Gone)) => State::Reclaimed,
        (State::Running, Some(Presence::Stopped)) => State::Stopped,
        _ => row,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_shown_as_docker_and_the_disk_have_it() {
        let gone = Some(Presence::Gone);
        assert_eq!(shown_state(State::Running, true, gone), State::Reclaimed);
        assert_eq!(
            shown_state(State::Running, true, Some(Presence::Stopped)),
            State::Stopped
        );
        assert_eq!(
            shown_state(State::Running, true, Some(Presence::Running(Some(7)))),
            State::Running
        );
        // Docker could not be asked: the row is all there is.
        assert_eq!(shown_state(State::Running, true, None), State::Running);
        // A stopped or reclaimed row is never second-guessed.
        assert_eq!(shown_state(State::Stopped, true, gone), State::Stopped);
        // A vanished workspace wins over everything but a destroy in progress.
        assert_eq!(shown_state(State::Running, false, gone), State::Lost);
        assert_eq!(shown_state(State::Reclaimed, false, None), State::Lost);
        assert_eq!(
            shown_state(State::Destroying, false, None),
            State::Destroying
        );
    }
}
