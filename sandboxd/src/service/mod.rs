//! The core below both HTTP surfaces: sessions, runs, files, caps and tokens, implemented once.
//!
//! [`Core`] and its settings are here; its work is split by what it acts on: opening a session
//! (`open`), a session after it opened (`sessions`), runs (`runs`), session tokens (`tokens`,
//! with the token arithmetic in [`auth`]), the reconcile at start (`reconcile`), the live
//! [`policy`], what a running sandbox uses (`usage`). What goes wrong is a [`ServiceError`], which says what happened and nothing of
//! HTTP: the surfaces give it a status and a code (`crate::http::error`).

pub mod auth;
pub mod credentials;
mod error;
mod health;
pub mod memory;
mod networks;
mod open;
mod pause;
pub mod policy;
pub mod pool;
mod ports;
mod rebuild;
mod reconcile;
mod runs;
mod sessions;
pub mod snapshots;
mod terminals;
mod tokens;
mod usage;
pub mod watches;
pub mod work;

pub use error::ServiceError;
pub use health::Counts;
use open::*;
pub use ports::PortRefusal;
pub use rebuild::RebuildRequest;
pub use reconcile::Reconciled;
use reconcile::*;
use runs::*;
pub use terminals::{SCROLLBACK_BYTES, TerminalLimits, terminal_view};
pub use usage::{USAGE_FRESH, cpu_percent};

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::container::Engine;
use crate::container::network::SandboxNetwork;
use crate::metrics::Metrics;
use crate::run::Runner;
use crate::runtimes::Runtimes;
use crate::service::policy::{Fixed, Policy, PolicyRules, PolicyView};
use crate::storage::audit::{Audit, NewOperation, Op};
use crate::storage::store::{Caps, Store};
use crate::workspace::Workspace;
use crate::workspace::disk::Disks;
use crate::workspace::trash::Trash;
use sandboxd_api::Limits;
pub use sandboxd_api::run::RunRequest;
pub use sandboxd_api::session::{Destroyed, OpenRequest, Opened, SessionView};

/// How long an open waits for a concurrent open of the same name to finish.
const OPEN_WAIT: Duration = Duration::from_secs(600);

/// Settings the core runs with (the parts of [`Config`](crate::config::Config) that matter
/// below HTTP).
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
    /// The bounds of terminals.
    pub terminals: TerminalLimits,
    /// How long a sandbox's port has to answer a request passed to it.
    pub port_answer_timeout: Duration,
    /// Folders one watch watches at most.
    pub watch_max_folders: u32,
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
    /// gVisor's OCI runtime in dockerd's configuration.
    pub gvisor_runtime: String,
    /// Keep closed containers.
    pub persist_containers: bool,
    /// Workspace size (default and ceiling), bytes; `None`: workspaces are not limited
    /// (SANDBOXD_WORKSPACE_QUOTA=off).
    pub workspace_size: Option<u64>,
    /// The bounds of file work.
    pub file_work: work::FileWorkLimits,
    /// The trust bundle and egress CA every sandbox is given, read-only (see
    /// [`crate::egress::ca`]); `None`: none (unit tests).
    pub egress_trust: Option<crate::egress::ca::Trust>,
    /// Where the resolv.conf files of gVisor sandboxes on a network are written
    /// (`<state>/resolv`).
    pub resolv_dir: PathBuf,
}

/// What dockerd's gVisor runtime arguments lack of what sandboxd needs, each with why:
/// `--host-uds=create` (the agent's socket reaches the host) and `--directfs=false` (a sandbox
/// that spends its files' descriptors cannot make itself unkillable).
fn missing_gvisor_args(args: &[String]) -> Vec<&'static str> {
    let has = |flag: &str| {
        args.iter()
            .any(|a| a.trim_start_matches('-') == flag.trim_start_matches('-'))
    };
    let mut missing = Vec::new();
    if !has("--host-uds=create") && !has("--host-uds=all") {
        missing.push("--host-uds=create: without it the agent's socket is not reached and every run goes through Docker exec");
    }
    if !has("--directfs=false") {
        missing.push("--directfs=false: without it a sandbox that walks 20,000 folders deep spends its kernel's descriptors and cannot be killed");
    }
    missing
}

/// Parses Docker's memory syntax (`64m`, `2g`) into bytes.
pub fn parse_bytes(text: &str) -> Option<i64> {
    let text = text.trim();
    let (number, shift) = match text.chars().last()?.to_ascii_lowercase() {
        'b' => (&text[..text.len() - 1], 0),
        'k' => (&text[..text.len() - 1], 10),
        'm' => (&text[..text.len() - 1], 20),
        'g' => (&text[..text.len() - 1], 30),
        't' => (&text[..text.len() - 1], 40),
        c if c.is_ascii_digit() => (text, 0),
        _ => return None,
    };
    let value: f64 = number
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v > 0.0)?;
    Some((value * (1u64 << shift) as f64) as i64)
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
    /// The tenant and incarnation of each session looked up, for its audit rows.
    tenants: Mutex<HashMap<String, (String, String)>>,
    /// Session tokens already looked up: token hash to session id. An entry is forgotten
    /// whenever a session's tokens change or its row goes (rotate, destroy, a failed open),
    /// so the cache never answers for a token the store would refuse.
    /// The generation counts forgets: a lookup that raced one does not cache its answer.
    token_cache: Mutex<(u64, HashMap<String, String>)>,
    /// The open or wake in flight per session (see [`OpeningSlot`]).
    opening: Mutex<HashMap<String, watch::Receiver<bool>>>,
    runs: Mutex<HashMap<String, RunEntry>>,
    /// The sessions being rebuilt now: their runs are refused (see [`rebuild`]).
    rebuilding: Mutex<HashSet<String>>,
    /// Watches open, by session (see [`watches`]).
    watches: Mutex<HashMap<String, usize>>,
    /// Held while a session's open ports change (one read-modify-write at a time).
    port_changes: tokio::sync::Mutex<()>,
    metrics: Arc<Metrics>,
    /// The network of sessions whose runtime needs one; `None`: such a session gets
    /// `settings.runtime_network` as it is (unit tests only).
    network: Option<Arc<SandboxNetwork>>,
    /// The egress network of `allowlist` runtimes, with its proxy and resolver; `None`: such a
    /// runtime's sessions cannot open (unit tests only).
    egress: Option<Arc<crate::egress::EgressNetwork>>,
    /// The isolation levels this host's dockerd offers, as it last said.
    isolation: RwLock<Vec<sandboxd_catalog::Isolation>>,
    trash: Trash,
    disks: Disks,
    /// The warm pools of the runtimes (see [`pool`]).
    pool: pool::Pool,
    /// The last usage reading and answer per session (see `usage`).
    usage: usage::UsageCache,
    /// What `/healthz` and `/metrics` reuse (see [`health`]).
    looks: health::Looks,
    /// The file workers and every session's share of them (see [`work`]).
    file_work: work::FileWork,
    /// The object store of snapshots; `None`: this host keeps none (see [`snapshots`]).
    snapshots: Option<snapshots::Snapshots>,
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
    change: impl std::future::Future<Output = Result<T, ServiceError>> + Send + 'static,
) -> Result<T, ServiceError> {
    // The task keeps the request's span: its spans are the request's children.
    tokio::spawn(tracing::Instrument::in_current_span(change))
        .await
        .map_err(|e| ServiceError::internal(format!("the operation's task failed: {e}")))?
}

/// Whether `owner` may name a session's owner: an object uid (or any id of at most 128 visible
/// ASCII characters).
pub fn valid_owner(owner: &str) -> bool {
    (1..=128).contains(&owner.len()) && owner.bytes().all(|b| b.is_ascii_graphic())
}

/// Session `id` belongs to another owner than `mine`.
fn owner_mismatch(id: &str, mine: &str) -> ServiceError {
    ServiceError::OwnerMismatch {
        id: id.to_owned(),
        owner: mine.to_owned(),
    }
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

fn db(e: sqlx::Error) -> ServiceError {
    ServiceError::Store(e)
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
            pool: pool::Pool::new(&settings.workspace_root),
            usage: usage::UsageCache::default(),
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
            rebuilding: Mutex::default(),
            port_changes: tokio::sync::Mutex::default(),
            watches: Mutex::default(),
            metrics,
            network: None,
            egress: None,
            isolation: RwLock::new(vec![sandboxd_catalog::Isolation::Runc]),
            trash: Trash::new(&settings.workspace_root),
            looks: health::Looks::default(),
            file_work: work::FileWork::new(settings.file_work),
            snapshots: None,
            settings,
        }
    }

    /// The core with the sandbox network: a session whose runtime needs a network is put on
    /// it, and the network is made and fenced in first when it is not yet.
    pub fn with_network(mut self, network: Arc<SandboxNetwork>) -> Self {
        self.network = Some(network);
        self
    }

    /// The core with the egress network: a session of an `allowlist` runtime is put on it.
    pub fn with_egress(mut self, egress: Arc<crate::egress::EgressNetwork>) -> Self {
        self.egress = Some(egress);
        self
    }

    /// The isolation levels this host's dockerd offers: runc always, gvisor when `docker info`
    /// lists the OCI runtime SANDBOXD_GVISOR_RUNTIME names. Asked again each time (at start,
    /// and by an open of a gvisor runtime that found it missing).
    pub async fn detect_isolation(&self) -> Vec<sandboxd_catalog::Isolation> {
        use sandboxd_catalog::Isolation;
        let mut offered = vec![Isolation::Runc];
        if let Ok(docker) = self.engine.docker() {
            match docker.client().info().await {
                Ok(info) => {
                    let runtimes = info.runtimes.unwrap_or_default();
                    if let Some(gvisor) = runtimes.get(&self.settings.gvisor_runtime) {
                        offered.push(Isolation::Gvisor);
                        let args = gvisor.runtime_args.clone().unwrap_or_default();
                        for missing in missing_gvisor_args(&args) {
                            warn!(
                                runtime = %self.settings.gvisor_runtime,
                                missing,
                                "dockerd's gVisor runtime lacks an argument sandboxd needs (docs/sandboxd.md, Isolation)"
                            );
                        }
                    }
                }
                Err(e) => warn!(error = %e, "cannot ask dockerd which OCI runtimes it offers"),
            }
        }
        *self
            .isolation
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = offered.clone();
        offered
    }

    /// The isolation levels this host offers, as last detected.
    pub fn isolation(&self) -> Vec<sandboxd_catalog::Isolation> {
        self.isolation
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The OCI runtime a sandbox of `runtime` runs on: SANDBOXD_OCI_RUNTIME's for runc, gVisor's
    /// for gvisor, refused when this host's dockerd does not offer it.
    pub(crate) async fn oci_runtime_of(
        &self,
        runtime: &crate::runtimes::RuntimeImage,
    ) -> Result<Option<String>, ServiceError> {
        use sandboxd_catalog::Isolation;
        match runtime.isolation {
            Isolation::Runc => Ok(self.settings.oci_runtime.clone()),
            Isolation::Gvisor => {
                if !self.isolation().contains(&Isolation::Gvisor)
                    && !self.detect_isolation().await.contains(&Isolation::Gvisor)
                {
                    return Err(crate::runtimes::RuntimeError::IsolationUnavailable {
                        alias: runtime.alias.clone(),
                        oci_runtime: self.settings.gvisor_runtime.clone(),
                    }
                    .into());
                }
                Ok(Some(self.settings.gvisor_runtime.clone()))
            }
        }
    }

    /// Tells the egress gate a session's runtime and the further policies its open named,
    /// and keeps them in its row, so a restart narrows it the same.
    pub(crate) async fn note_egress(
        &self,
        id: &str,
        runtime: &str,
        extra: &[sandboxd_catalog::egress::Egress],
    ) -> Result<(), ServiceError> {
        let Some(egress) = &self.egress else {
            return Ok(());
        };
        let json =
            serde_json::to_string(extra).map_err(|e| ServiceError::internal(e.to_string()))?;
        self.store.set_egress(id, &json).await.map_err(db)?;
        egress.gate.register(id, runtime, extra.to_vec());
        Ok(())
    }

    /// Tells the egress gate every session the store holds (at start).
    pub(crate) async fn note_all_egress(&self) -> Result<(), ServiceError> {
        let Some(egress) = &self.egress else {
            return Ok(());
        };
        for (id, runtime, json) in self.store.egress_all().await.map_err(db)? {
            // A row whose policies do not read allows nothing rather than more.
            let extra = serde_json::from_str(&json)
                .unwrap_or_else(|_| vec![sandboxd_catalog::egress::Egress::none()]);
            egress.gate.register(&id, &runtime, extra);
        }
        Ok(())
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The file workers.
    pub fn file_work(&self) -> &work::FileWork {
        &self.file_work
    }

    /// The warm pools.
    pub fn pool(&self) -> &pool::Pool {
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
            ..self.settings.caps
        }
    }

    /// The policy with what cannot change at runtime, and what the host's workspaces hold now.
    pub async fn policy_view_with_use(&self) -> PolicyView {
        let mut view = self.policy_view();
        match self.store.held("").await {
            Ok(held) => {
                view.workspaces = Some(sandboxd_api::policy::WorkspaceUse {
                    workspaces: held.workspaces,
                    bytes: held.workspace_bytes,
                });
            }
            Err(e) => warn!(error = %e, "cannot count the workspaces for the policy"),
        }
        view
    }

    /// The policy with what cannot change at runtime.
    pub fn policy_view(&self) -> PolicyView {
        let s = &self.settings;
        PolicyView {
            policy: self.policy(),
            workspaces: None,
            fixed: Fixed {
                runtimes: self.runtimes.aliases(),
                network_mode: s.network_mode.clone(),
                runtime_network: s.runtime_network.clone(),
                oci_runtime: s.oci_runtime.clone(),
                sandbox_uid: s.uid,
                work_dir: crate::container::WORKSPACE_MOUNT.to_owned(),
                workspace_root: s.workspace_root.display().to_string(),
                persist_containers: s.persist_containers,
                cpus: s.cpus,
                memory: s.memory,
                pids_limit: s.pids_limit,
                tmpfs_size: s.tmpfs_size.clone(),
                workspace_size: s.workspace_size,
                workspace_budget: s.caps.workspace_budget,
                max_workspaces_per_tenant: Some(s.caps.max_workspaces_per_tenant),
            },
        }
    }

    /// Changes caps and lifetimes live; refuses everything else
    /// ([`ServiceError::PolicyRefused`] naming the field).
    pub fn set_policy(&self, body: &serde_json::Value) -> Result<PolicyView, ServiceError> {
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
        let known = self.tenants.lock().ok().and_then(|t| t.get(id).cloned());
        let Some((tenant, incarnation)) = known else {
            return;
        };
        self.audit.record(NewOperation {
            at_ms: crate::storage::store::now_ms(),
            session: id.to_owned(),
            incarnation,
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

    /// The activity feed of session `id` (its incarnation's audit rows in the wire protocol's
    /// shape) after sequence number `after`.
    pub async fn events(
        &self,
        id: &str,
        after: i64,
    ) -> Result<crate::storage::audit::SessionEvents, ServiceError> {
        let row = self.row(id).await?;
        self.audit
            .events(id, &row.incarnation, after)
            .await
            .map_err(|e| ServiceError::internal(e.to_string()))
    }

    /// What session `id`'s sandbox reached and was refused through the egress network in the
    /// last `minutes` minutes.
    pub async fn egress_log(
        &self,
        id: &str,
        minutes: u32,
    ) -> Result<sandboxd_api::egress::EgressLog, ServiceError> {
        self.row(id).await?;
        let records = match &self.egress {
            Some(egress) => egress
                .gate
                .log
                .rows(id, minutes)
                .await
                .map_err(|e| ServiceError::internal(e.to_string()))?,
            None => Vec::new(),
        };
        Ok(sandboxd_api::egress::EgressLog {
            session: id.to_owned(),
            records,
        })
    }

    /// The incarnation of session `id` (for whose audit rows a session token may see).
    pub async fn incarnation(&self, id: &str) -> Result<String, ServiceError> {
        Ok(self.row(id).await?.incarnation)
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
}

#[cfg(test)]
mod gvisor_args_tests {
    use super::missing_gvisor_args;

    #[test]
    fn the_gvisor_runtimes_arguments_are_checked() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(
            missing_gvisor_args(&args(&[
                "--platform=systrap",
                "--host-uds=create",
                "--directfs=false"
            ]))
            .is_empty()
        );
        let missing = missing_gvisor_args(&args(&["--platform=systrap"]));
        assert_eq!(missing.len(), 2);
        assert!(missing[0].starts_with("--host-uds=create: "));
        assert!(missing[1].starts_with("--directfs=false: "));
    }
}
