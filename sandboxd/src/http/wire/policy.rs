//! Policy: `GET` and `PUT /policy` in the protocol's shape.

use super::*;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::IntoResponse;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::http::AppState;
use crate::service::Core;

pub(super) fn size_text(bytes: i64) -> String {
    const G: i64 = 1 << 30;
    const M: i64 = 1 << 20;
    if bytes > 0 && bytes % G == 0 {
        format!("{}g", bytes / G)
    } else if bytes > 0 && bytes % M == 0 {
        format!("{}m", bytes / M)
    } else {
        bytes.to_string()
    }
}

/// `ServicePolicy`: the host's policy as the protocol shows it. The fields the protocol has
/// and this host does not (an open-session cap, idle eviction, TTLs, swap, CPU shares) are
/// `null`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ServicePolicy {
    /// The allowlisted runtimes, by alias.
    pub runtimes: Vec<RuntimePolicy>,
    /// The runtime of a session opened without one (the allowlist's first).
    pub default_runtime: String,
    /// Sessions this host holds at most.
    pub max_sessions: u32,
    /// Always `null`: no separate cap on open sessions.
    pub max_open_sessions: Option<u32>,
    /// Sessions one tenant holds at most.
    pub max_sessions_per_tenant: u32,
    /// Always `null`: idle sessions are not evicted here (the operator puts them to sleep).
    pub evict_idle_after: Option<u64>,
    /// Memory limit of a sandbox (`512m`, `2g` or bytes).
    pub mem_limit: String,
    /// Always `null`.
    pub memswap_limit: Option<String>,
    /// CPUs of a sandbox.
    pub cpus: f64,
    /// Always `null`.
    pub cpu_shares: Option<u32>,
    /// Processes of a sandbox at most.
    pub pids_limit: i64,
    /// Network of a sandbox whose runtime needs none.
    pub network_mode: String,
    /// The OCI runtime, if not the default.
    pub oci_runtime: Option<String>,
    /// The work directory inside every sandbox: `/workspace`.
    pub work_dir: String,
    /// Always 0: no idle timeout here.
    pub idle_timeout: u64,
    /// Longest run, seconds.
    pub execute_timeout: u64,
    /// Largest read (and native write), bytes.
    pub max_read_bytes: u64,
    /// Whether a closed session's container is stopped (kept) rather than removed.
    pub persist_containers: bool,
    /// The uid of the sandbox user.
    pub sandbox_uid: u32,
    /// Always `null`.
    pub workspace_ttl: Option<u64>,
    /// Always `null`.
    pub container_ttl: Option<u64>,
    /// Size of a sandbox's `/tmp`.
    pub tmpfs_size: String,
    /// Always `true`: images are built before a session needs them.
    pub prewarm: bool,
    /// Always `false`.
    pub buildkit: bool,
    /// Always `true`: the native file routes are served.
    pub native_files: bool,
    /// Always `true`: native writes are served.
    pub native_writes: bool,
    /// Always `true`: the native realpath is served.
    pub native_realpath: bool,
}

/// One runtime of [`ServicePolicy`].
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct RuntimePolicy {
    /// The alias a session names.
    pub alias: String,
    /// The image its sessions run (for a runtime still building, the image it builds from).
    pub image: String,
    /// What it is for.
    pub description: String,
    /// Whether it is built from a base image.
    pub builds: bool,
    /// Memory limit of its sandboxes.
    pub mem_limit: String,
    /// Always `null`.
    pub memswap_limit: Option<String>,
    /// CPUs of its sandboxes.
    pub cpus: f64,
    /// Always `null`.
    pub cpu_shares: Option<u32>,
    /// Processes of its sandboxes at most.
    pub pids_limit: i64,
    /// Its sandboxes' network.
    pub network_mode: String,
    /// The OCI runtime, if not the default.
    pub oci_runtime: Option<String>,
}

pub(super) fn service_policy(core: &Core) -> ServicePolicy {
    let view = core.policy_view();
    let s = core.settings();
    let listed = core.runtimes().list().runtimes;
    let default = listed.first().map(|r| r.alias.clone()).unwrap_or_default();
    let mut runtimes: Vec<RuntimePolicy> = listed
        .into_iter()
        .map(|r| {
            let builds = r.kind == crate::runtimes::RuntimeKind::Build;
            let image = if builds && r.state != sandboxd_api::BuildState::Ready {
                r.source_image
            } else {
                r.tag
            };
            let network = if r.needs_network {
                &s.runtime_network
            } else {
                &s.network_mode
            };
            RuntimePolicy {
                alias: r.alias,
                image,
                description: r.description,
                builds,
                mem_limit: r.mem_limit.unwrap_or_else(|| size_text(s.memory)),
                memswap_limit: None,
                cpus: s.cpus,
                cpu_shares: None,
                pids_limit: s.pids_limit,
                network_mode: network.clone(),
                oci_runtime: s.oci_runtime.clone(),
            }
        })
        .collect();
    runtimes.sort_by(|a, b| a.alias.cmp(&b.alias));
    ServicePolicy {
        runtimes,
        default_runtime: default,
        max_sessions: view.policy.max_sessions,
        max_open_sessions: None,
        max_sessions_per_tenant: view.policy.max_sessions_per_tenant,
        evict_idle_after: None,
        mem_limit: size_text(s.memory),
        memswap_limit: None,
        cpus: s.cpus,
        cpu_shares: None,
        pids_limit: s.pids_limit,
        network_mode: s.network_mode.clone(),
        oci_runtime: s.oci_runtime.clone(),
        work_dir: WORK_DIR.to_owned(),
        idle_timeout: 0,
        execute_timeout: view.policy.execute_timeout,
        max_read_bytes: view.policy.max_read_bytes,
        persist_containers: s.persist_containers,
        sandbox_uid: s.uid,
        workspace_ttl: None,
        container_ttl: None,
        tmpfs_size: s.tmpfs_size.clone(),
        prewarm: true,
        buildkit: false,
        native_files: true,
        native_writes: true,
        native_realpath: true,
    }
}

#[utoipa::path(
    get, path = "/policy", tag = "policy",
    responses((status = 200, description = "The host's policy", body = ServicePolicy))
)]
pub(crate) async fn get_policy(State(state): State<AppState>, _: Service) -> WireResult {
    Ok(Json(service_policy(&state.core)).into_response())
}

/// The fields `PolicyUpdate` has; anything else is 422 (`extra="forbid"`).
pub(crate) const POLICY_UPDATE_FIELDS: &[&str] = &[
    "default_runtime",
    "max_sessions",
    "max_open_sessions",
    "max_sessions_per_tenant",
    "evict_idle_after",
    "idle_timeout",
    "execute_timeout",
    "max_read_bytes",
    "workspace_ttl",
    "container_ttl",
    "mem_limit",
    "memswap_limit",
    "cpus",
    "cpu_shares",
    "pids_limit",
    "tmpfs_size",
    "runtimes",
];

/// The fields this host changes live, as the core names them.
pub(super) const POLICY_LIVE: &[&str] = &[
    "max_sessions",
    "max_sessions_per_tenant",
    "execute_timeout",
    "max_read_bytes",
];

/// A live value of a `PolicyUpdate` as the protocol validates it (`int`, `gt=0`), within this
/// host's bound ([`crate::service::policy::BOUNDS`]): 422 naming the field otherwise.
pub(super) fn check_live(key: &str, value: &Value) -> WireResult<()> {
    let loc = ["body", key];
    let max = crate::service::policy::upper_bound(key).map_or(u64::MAX, |(max, _)| max);
    match value.as_u64() {
        Some(0) => Err(WireError::invalid(
            &loc,
            "greater_than",
            "Input should be greater than 0",
        )),
        Some(n) if n <= max => Ok(()),
        Some(_) => Err(WireError::invalid(
            &loc,
            "less_than_equal",
            format!("Input should be less than or equal to {max}"),
        )),
        None if value.as_i64().is_some() => Err(WireError::invalid(
            &loc,
            "greater_than",
            "Input should be greater than 0",
        )),
        None if value.as_f64().is_some_and(|f| f > max as f64) => Err(WireError::invalid(
            &loc,
            "less_than_equal",
            format!("Input should be less than or equal to {max}"),
        )),
        None => Err(WireError::invalid(
            &loc,
            "int_type",
            "Input should be a valid integer",
        )),
    }
}

#[utoipa::path(
    put, path = "/policy", tag = "policy",
    request_body = crate::http::wire::openapi::PolicyUpdate,
    responses((status = 200, description = "Changed; the host's policy now", body = ServicePolicy))
)]
pub(crate) async fn put_policy(
    State(state): State<AppState>,
    _: Service,
    raw: Bytes,
) -> WireResult {
    let update: serde_json::Map<String, Value> = body(&raw)?;
    let mut live = serde_json::Map::new();
    let mut refused = Vec::new();
    for (key, value) in &update {
        if !POLICY_UPDATE_FIELDS.contains(&key.as_str()) {
            return Err(WireError::invalid(
                &["body", key],
                "extra_forbidden",
                "Extra inputs are not permitted",
            ));
        }
        if value.is_null() {
            continue;
        }
        if POLICY_LIVE.contains(&key.as_str()) {
            check_live(key, value)?;
            live.insert(key.clone(), value.clone());
        } else if key == "default_runtime"
            && value.as_str() == Some(service_policy(&state.core).default_runtime.as_str())
        {
        } else {
            refused.push(key.clone());
        }
    }
    if !refused.is_empty() {
        return Err(WireError::new(
            400,
            format!(
                "This sandboxd cannot change {} without a restart: per-sandbox limits and the default runtime are its configuration (SANDBOXD_* variables, PUT /v1/runtimes); nothing was changed",
                refused.join(", ")
            ),
        ));
    }
    if !live.is_empty() {
        state
            .core
            .set_policy(&Value::Object(live))
            .map_err(|e| WireError::new(400, e.to_string()))?;
    }
    Ok(Json(service_policy(&state.core)).into_response())
}
