//! The wire protocol of pydantic-ai-backend's sandboxd, served beside `/v1` over the same core.
//!
//! The seed platform and every Pydantic AI agent reach a sandboxd through the client in the
//! Python package `pydantic-ai-backend` (`SandboxdWorkspaceBackend`, `WorkspaceArchive`). This
//! module speaks that protocol at the release pinned in `hack/versions.env`
//! (`PYDANTIC_AI_BACKEND_VERSION`, reported in the index), so such a client works against this
//! daemon by changing one URL. It is a thin surface: sessions, runs, files, caps, tokens, audit
//! and isolation are the [`Core`]'s, exactly as for `/v1`.
//!
//! The protocol's own conventions hold here, not `/v1`'s: the token travels in
//! `X-Sandbox-Token`, errors are `{"detail": ...}` (a sentence, or for a native file operation
//! `{"error": "<Python exception name>", "message": ...}`), an invalid request is 422 with a
//! list of `{type, loc, msg}`, and a native file route answers 409 for a path only the sandbox
//! can resolve (the client then takes its shell path for that one call).
//!
//! Where the protocol and this daemon's model differ, the model wins and the difference is
//! documented in `docs/sandboxd.md`: a path that leads out of the workspace is refused (400,
//! `ValueError`), file operations have the sandbox user's permissions (what it may not open is
//! handed back to the sandbox, 409, as the protocol's service does with a `PermissionError`), a
//! session closed without `purge` keeps its row and tokens (its container is reclaimed, its
//! files stay), and the caps are the core's.

pub mod openapi;

use std::collections::VecDeque;
use std::time::Instant;

use axum::Json;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};

use crate::http::v1::AppState;
use crate::service::error::{ApiError, ErrorCode};
use crate::service::{Actor, Core, OpenRequest, Outcome, RunRequest as CoreRun};
use crate::storage::audit::Op;
use crate::storage::store::{SessionRow, State as SessionState};
use crate::workspace::{Entry, EntryKind, FileError, MAX_LIST_ENTRIES, Workspace};

/// The Python package whose sandboxd protocol this module serves.
pub const PACKAGE: &str = "pydantic-ai-backend";

/// The one file of pins; `PYDANTIC_AI_BACKEND_VERSION` in it is the release served.
const VERSIONS_ENV: &str = include_str!("../../../../hack/versions.env");

/// The header carrying the service (admin) token or a session's own token.
pub const TOKEN_HEADER: &str = "x-sandbox-token";

/// Set (`true`) on a folder listing cut at [`MAX_LIST_ENTRIES`]: the protocol's listings are
/// bare JSON arrays, so the mark travels beside the body, where the client ignores it.
pub const TRUNCATED_HEADER: &str = "x-sandbox-listing-truncated";
/// The entry limit of a folder listing, beside [`TRUNCATED_HEADER`].
pub const MAX_ENTRIES_HEADER: &str = "x-sandbox-listing-max-entries";

/// A bare JSON array of a folder listing, with its truncation headers.
fn listing_response(rows: Vec<FileEntry>, truncated: bool) -> Response {
    (
        [
            (
                header::HeaderName::from_static(TRUNCATED_HEADER),
                truncated.to_string(),
            ),
            (
                header::HeaderName::from_static(MAX_ENTRIES_HEADER),
                MAX_LIST_ENTRIES.to_string(),
            ),
        ],
        Json(rows),
    )
        .into_response()
}

/// The work directory inside every sandbox, as the protocol's paths spell it.
const WORK_DIR: &str = "/workspace";

/// The protocol's session id pattern (`SESSION_ID_PATTERN`), also for tenants.
const ID_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$";

/// The tenant recorded for a session opened without one: a label the protocol's tenant
/// pattern cannot produce (`:`), one per session, so no per-tenant cap binds it (as the
/// protocol says for a session without a tenant) while the host cap still does.
const UNTENANTED: &str = "untenanted:";

/// How long an open waits for its runtime's image to be built (the protocol's open builds it).
const PREPARE_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// The routes of the protocol, as the index lists them (`GET /` and `GET /healthz` are shared
/// with `/v1` and listed there).
pub const ROUTES: &[&str] = &[
    "GET /policy",
    "PUT /policy",
    "GET /sessions",
    "POST /sessions",
    "GET /sessions/{session_id}",
    "DELETE /sessions/{session_id}",
    "POST /sessions/{session_id}/run",
    "POST /sessions/{session_id}/runs/{run_id}/stop",
    "POST /sessions/{session_id}/files/read",
    "POST /sessions/{session_id}/files/write",
    "POST /sessions/{session_id}/files/stat",
    "POST /sessions/{session_id}/files/realpath",
    "POST /sessions/{session_id}/files/list",
    "POST /sessions/{session_id}/files/mkdir",
    "POST /sessions/{session_id}/files/remove",
    "POST /workspaces/trees",
    "POST /workspaces/{session_id}/ls",
    "POST /workspaces/{session_id}/tree",
    "POST /workspaces/{session_id}/read",
    "POST /workspaces/{session_id}/read_bytes",
    "GET /wire/openapi.json",
];

/// The routes of the protocol anyone may call: its OpenAPI document (no body, nothing of a
/// session). The index and health are `/v1`'s ([`crate::http::v1::PUBLIC_ROUTES`]).
pub const PUBLIC_ROUTES: &[&str] = &["/wire/openapi.json"];

/// The pydantic-ai-backend release this surface serves, read from `hack/versions.env`.
pub fn release() -> &'static str {
    VERSIONS_ENV
        .lines()
        .find_map(|l| l.trim().strip_prefix("PYDANTIC_AI_BACKEND_VERSION="))
        .map_or("unknown", str::trim)
}

/// The router of the protocol's routes, merged into the `/v1` router (the index and health are
/// `/v1`'s, which carry the protocol's fields too).
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/policy", get(get_policy).put(put_policy))
        .route("/sessions", get(list_sessions).post(create_session))
        .route(
            "/sessions/{session_id}",
            get(get_session).delete(delete_session),
        )
        .route("/sessions/{session_id}/run", post(run))
        .route("/sessions/{session_id}/runs/{run_id}/stop", post(stop_run))
        .route("/sessions/{session_id}/files/read", post(file_read))
        .route("/sessions/{session_id}/files/write", post(file_write))
        .route("/sessions/{session_id}/files/stat", post(file_stat))
        .route("/sessions/{session_id}/files/realpath", post(file_realpath))
        .route("/sessions/{session_id}/files/list", post(file_list))
        .route("/sessions/{session_id}/files/mkdir", post(file_mkdir))
        .route("/sessions/{session_id}/files/remove", post(file_remove))
        .route("/workspaces/trees", post(archive_trees))
        .route("/workspaces/{session_id}/ls", post(archive_ls))
        .route("/workspaces/{session_id}/tree", post(archive_tree))
        .route("/workspaces/{session_id}/read", post(archive_read))
        .route(
            "/workspaces/{session_id}/read_bytes",
            post(archive_read_bytes),
        )
        .route(
            "/wire/openapi.json",
            get(crate::http::wire::openapi::openapi_json),
        )
}

// ---------------------------------------------------------------------------------------------
// Errors in the protocol's shape.

/// An error as the protocol answers it: a status and `{"detail": ...}`.
#[derive(Debug, Clone, PartialEq)]
pub struct WireError {
    status: u16,
    detail: Detail,
}

/// Every error's body: `{"detail": ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct WireErrorBody {
    /// What went wrong.
    pub detail: Detail,
}

/// The `detail` of an error: a sentence; for a native file operation, the Python exception the
/// client raises; for a request that failed validation (422), what did not validate.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum Detail {
    /// A sentence.
    Message(String),
    /// A native file operation's error.
    Exception(FileException),
    /// The problems of a request that failed validation (422).
    Invalid(Vec<Problem>),
}

impl std::fmt::Display for Detail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Message(m) => f.write_str(m),
            Self::Exception(e) => write!(f, "{}: {}", e.error, e.message),
            Self::Invalid(problems) => {
                let parts: Vec<String> = problems
                    .iter()
                    .map(|p| format!("{}: {}", p.loc.join("."), p.msg))
                    .collect();
                f.write_str(&parts.join("; "))
            }
        }
    }
}

/// A native file operation's error, by the Python exception the client raises for it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct FileException {
    /// The exception's name: `FileNotFoundError`, `IsADirectoryError`, `NotADirectoryError`,
    /// `FileExistsError`, `ValueError` or `OSError`.
    pub error: String,
    /// What happened.
    pub message: String,
}

/// One problem of a request that failed validation, as FastAPI lists it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Problem {
    /// The kind of problem (`missing`, `value_error`, `string_pattern_mismatch`, …).
    #[serde(rename = "type")]
    pub kind: String,
    /// Where: `body`, `path` or `query`, then the field.
    pub loc: Vec<String>,
    /// What is wrong.
    pub msg: String,
}

impl WireError {
    fn new(status: u16, detail: impl Into<String>) -> Self {
        Self {
            status,
            detail: Detail::Message(detail.into()),
        }
    }

    fn unauthorized() -> Self {
        Self::new(401, "Invalid or missing sandbox token")
    }

    fn no_such_session(id: &str) -> Self {
        Self::new(404, format!("No such session: {id}"))
    }

    fn gone(id: &str) -> Self {
        Self::new(
            410,
            format!("The sandbox of session {id} is gone, and its files with it"),
        )
    }

    /// A native file operation's error: the Python exception the client raises, by name.
    fn path(status: u16, error: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            detail: Detail::Exception(FileException {
                error: error.to_owned(),
                message: message.into(),
            }),
        }
    }

    /// A path only the sandbox can resolve: the client takes its shell path.
    fn not_native(message: impl Into<String>) -> Self {
        Self::new(409, message)
    }

    /// 422 with the list of problems, as a request failing validation.
    fn invalid(loc: &[&str], kind: &str, msg: impl Into<String>) -> Self {
        Self {
            status: 422,
            detail: Detail::Invalid(vec![Problem {
                kind: kind.to_owned(),
                loc: loc.iter().map(|l| (*l).to_owned()).collect(),
                msg: msg.into(),
            }]),
        }
    }

    /// A core error on session `id` in the protocol's words.
    fn from_core(id: &str, e: ApiError) -> Self {
        match (e.status, e.code) {
            (401, _) => Self::unauthorized(),
            (404, ErrorCode::SessionNotFound) => Self::no_such_session(id),
            (410, _) => Self::gone(id),
            (429, ErrorCode::HostCap) => {
                // The core's words carry the count; the protocol's name the ceiling.
                let max = e
                    .message
                    .split(" of ")
                    .nth(1)
                    .and_then(|s| s.split_whitespace().next())
                    .unwrap_or("?")
                    .to_owned();
                Self::new(
                    429,
                    format!(
                        "Session limit of {max} reached. Release an idle session before opening another."
                    ),
                )
            }
            (status, _) => Self::new(status, e.message),
        }
    }
}

impl IntoResponse for WireError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (
            status,
            Json(WireErrorBody {
                detail: self.detail,
            }),
        )
            .into_response()
    }
}

type WireResult<T = Response> = Result<T, WireError>;

fn no_content() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

/// A JSON body as `T`; 422 naming what did not fit.
fn body<T: DeserializeOwned>(bytes: &Bytes) -> WireResult<T> {
    if bytes.is_empty() {
        return Err(WireError::invalid(&["body"], "missing", "Field required"));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        let msg = e.to_string();
        // serde names the field in backticks: `argv`.
        let field = msg.split('`').nth(1).unwrap_or_default().to_owned();
        let loc: Vec<&str> = if field.is_empty() {
            vec!["body"]
        } else {
            vec!["body", field.as_str()]
        };
        WireError::invalid(&loc, "value_error", msg.clone())
    })
}

/// Whether `s` matches the protocol's id pattern (`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`).
pub fn valid_id(s: &str) -> bool {
    let mut chars = s.chars();
    (1..=64).contains(&s.len())
        && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn check_id(id: &str, loc: &[&str]) -> WireResult<()> {
    if valid_id(id) {
        Ok(())
    } else {
        Err(WireError::invalid(
            loc,
            "string_pattern_mismatch",
            format!("String should match pattern '{ID_PATTERN}'"),
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Tokens.

fn token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|t| !t.is_empty())
}

/// Whether the request carries a token this host knows (the service token or a session's),
/// checked before its body is read; what the token reaches is the route's to decide.
pub(crate) async fn authenticate(state: &AppState, headers: &HeaderMap) -> WireResult<()> {
    let t = token(headers).ok_or_else(WireError::unauthorized)?;
    if state.admin.matches(t) {
        return Ok(());
    }
    match state.core.session_of_token(t).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(WireError::unauthorized()),
        Err(e) => Err(WireError::new(e.status, e.message)),
    }
}

/// Only the service (admin) token.
fn service(state: &AppState, headers: &HeaderMap) -> WireResult<()> {
    match token(headers) {
        Some(t) if state.admin.matches(t) => Ok(()),
        _ => Err(WireError::unauthorized()),
    }
}

/// The service token or session `id`'s own; the token is checked before existence is told.
async fn for_session(state: &AppState, headers: &HeaderMap, id: &str) -> WireResult<SessionRow> {
    check_id(id, &["path", "session_id"])?;
    let t = token(headers).ok_or_else(WireError::unauthorized)?;
    let admin = state.admin.matches(t);
    if !admin {
        let own = state
            .core
            .session_of_token(t)
            .await
            .map_err(|e| WireError::from_core(id, e))?;
        if own.as_deref() != Some(id) {
            return Err(WireError::unauthorized());
        }
    }
    state
        .core
        .store()
        .get(id)
        .await
        .map_err(|e| WireError::new(500, format!("sandboxd's state store failed: {e}")))?
        .ok_or_else(|| WireError::no_such_session(id))
}

fn actor(headers: &HeaderMap) -> Actor {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    Actor {
        agent: get(crate::http::v1::AGENT_HEADER),
        run: get(crate::http::v1::RUN_HEADER),
    }
}

// ---------------------------------------------------------------------------------------------
// Index and health: fields the protocol's `ServiceIndex` and `ServiceHealth` carry.

/// `ServiceHealth`: liveness and capacity.
pub async fn health(core: &Core) -> Result<Value, ApiError> {
    let rows = core
        .store()
        .list()
        .await
        .map_err(|e| ApiError::internal(format!("state store: {e}")))?;
    let running = rows
        .iter()
        .filter(|r| r.state == SessionState::Running)
        .count();
    let mut runtimes = core.runtimes().aliases();
    runtimes.sort();
    Ok(json!({
        "status": "ok",
        "sessions": running,
        "limit": core.policy().max_sessions,
        "open_sessions": rows.len(),
        "open_limit": null,
        "runtimes": runtimes,
    }))
}

/// The protocol's index fields (`ServiceIndex`), added to the `/v1` index, plus which release
/// of the protocol this is.
pub async fn index_fields(core: &Core) -> Result<serde_json::Map<String, Value>, ApiError> {
    let mut endpoints: Vec<String> = ROUTES
        .iter()
        .chain(crate::http::v1::ROUTES.iter())
        .filter_map(|r| r.split_once(' ').map(|(_, path)| path.to_owned()))
        .filter(|p| p != "/")
        .collect();
    endpoints.sort();
    endpoints.dedup();
    let mut m = serde_json::Map::new();
    m.insert("health".into(), health(core).await?);
    m.insert("docs_url".into(), json!("/"));
    m.insert("openapi_url".into(), json!("/wire/openapi.json"));
    m.insert("ui_url".into(), Value::Null);
    m.insert("endpoints".into(), json!(endpoints));
    m.insert(
        "wire".into(),
        json!({"package": PACKAGE, "release": release(), "token_header": "X-Sandbox-Token"}),
    );
    Ok(m)
}

// ---------------------------------------------------------------------------------------------
// Policy.

fn size_text(bytes: i64) -> String {
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

fn service_policy(core: &Core) -> ServicePolicy {
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
pub(crate) async fn get_policy(State(state): State<AppState>, headers: HeaderMap) -> WireResult {
    service(&state, &headers)?;
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
const POLICY_LIVE: &[&str] = &[
    "max_sessions",
    "max_sessions_per_tenant",
    "execute_timeout",
    "max_read_bytes",
];

/// A live value of a `PolicyUpdate` as the protocol validates it (`int`, `gt=0`), within this
/// host's bound ([`crate::service::policy::BOUNDS`]): 422 naming the field otherwise.
fn check_live(key: &str, value: &Value) -> WireResult<()> {
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
    headers: HeaderMap,
    raw: Bytes,
) -> WireResult {
    service(&state, &headers)?;
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
            .map_err(|e| WireError::new(400, e.message))?;
    }
    Ok(Json(service_policy(&state.core)).into_response())
}

// ---------------------------------------------------------------------------------------------
// Sessions.

/// `CreateSession`: the body of `POST /sessions`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct CreateSession {
    /// The session's id; one is made (`s-` and 16 hex digits) when it is absent.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
    session_id: Option<String>,
    /// An allowlisted runtime alias; the default runtime when absent.
    #[serde(default)]
    runtime: Option<String>,
    /// The tenant whose per-tenant cap the session counts against.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
    tenant: Option<String>,
    /// Hand back the session if it exists (with a new token) instead of 409.
    #[serde(default)]
    reuse: bool,
    /// Only attach to an existing session (404 when there is none).
    #[serde(default)]
    attach: bool,
}

/// Where a session stands, as the protocol says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionPhase {
    /// Its sandbox is running (or opening).
    Running,
    /// Its sandbox is not running; its files are kept.
    Hibernated,
}

/// `SessionInfo`: one session.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SessionInfo {
    /// The session's id.
    pub session_id: String,
    /// Its runtime's alias.
    pub runtime: String,
    /// Its tenant, if it was opened with one.
    pub tenant: Option<String>,
    /// Whether its sandbox is running and its workspace there.
    pub alive: bool,
    /// `running` or `hibernated`.
    pub state: SessionPhase,
    /// When it was opened, seconds since the epoch.
    pub created_at: f64,
    /// Its last activity, seconds since the epoch.
    pub last_activity: f64,
    /// Seconds since its last activity.
    pub idle_seconds: f64,
    /// Always `null`: resource usage is not reported here.
    #[schema(value_type = Option<Object>)]
    pub usage: Option<Value>,
}

/// The answer of `POST /sessions`: the session and a token of its own.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Opened {
    /// The session.
    pub session: SessionInfo,
    /// A token for this session only (`X-Sandbox-Token`).
    pub token: String,
}

/// The answer of `GET /sessions`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SessionList {
    /// Every session but those being closed or lost.
    pub sessions: Vec<SessionInfo>,
    /// Sessions this host holds at most.
    pub limit: u32,
    /// Always `null`: no separate cap on open sessions.
    pub open_limit: Option<u32>,
    /// Sessions one tenant holds at most.
    pub tenant_limit: u32,
}

fn secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

/// `SessionInfo` of a row.
fn info(core: &Core, row: &SessionRow) -> SessionInfo {
    let now = crate::storage::store::now_ms();
    let alive = row.state == SessionState::Running && core.workspace(&row.id).exists();
    let tenant = (!row.tenant.starts_with(UNTENANTED)).then(|| row.tenant.clone());
    SessionInfo {
        session_id: row.id.clone(),
        runtime: row.runtime.clone(),
        tenant,
        alive,
        state: if matches!(row.state, SessionState::Running | SessionState::Opening) {
            SessionPhase::Running
        } else {
            SessionPhase::Hibernated
        },
        created_at: secs(row.created_at),
        last_activity: secs(row.last_activity_at),
        idle_seconds: secs((now - row.last_activity_at).max(0)),
        usage: None,
    }
}

async fn row_of(core: &Core, id: &str) -> WireResult<Option<SessionRow>> {
    core.store()
        .get(id)
        .await
        .map_err(|e| WireError::new(500, format!("sandboxd's state store failed: {e}")))
}

/// Hands an existing session to a caller that may attach to it, with a token of its own.
async fn attach(
    core: &Core,
    row: &SessionRow,
    runtime: Option<&str>,
) -> WireResult<(StatusCode, Opened)> {
    let id = row.id.as_str();
    if let Some(r) = runtime
        && r != row.runtime
    {
        return Err(WireError::new(
            409,
            format!(
                "Session {id} is open on runtime '{}', not '{r}'. Close it before changing runtime.",
                row.runtime
            ),
        ));
    }
    if row.state == SessionState::Lost || !core.workspace(id).exists() {
        return Err(WireError::gone(id));
    }
    let token = core
        .grant_token(id)
        .await
        .map_err(|e| WireError::from_core(id, e))?;
    Ok((
        StatusCode::OK,
        Opened {
            session: info(core, row),
            token,
        },
    ))
}

#[utoipa::path(
    post, path = "/sessions", tag = "sessions",
    request_body = CreateSession,
    responses((status = 200, description = "Opened (or, with `reuse` or `attach`, handed back), with a token of its own", body = Opened))
)]
pub(crate) async fn create_session(
    State(state): State<AppState>,
    headers: HeaderMap,
    raw: Bytes,
) -> WireResult {
    service(&state, &headers)?;
    let req: CreateSession = body(&raw)?;
    if let Some(id) = &req.session_id {
        check_id(id, &["body", "session_id"])?;
    }
    if let Some(t) = &req.tenant {
        check_id(t, &["body", "tenant"])?;
    }
    let core = &state.core;
    let aliases = core.runtimes().aliases();
    if let Some(r) = &req.runtime
        && !aliases.contains(r)
    {
        let mut allowed = aliases.clone();
        allowed.sort();
        return Err(WireError::new(
            400,
            format!("Unknown runtime '{r}'. Allowed: {}", allowed.join(", ")),
        ));
    }
    if req.attach && req.session_id.is_none() {
        return Err(WireError::new(
            400,
            "attach needs the session_id to attach to",
        ));
    }
    let id = req.session_id.clone().unwrap_or_else(|| {
        format!(
            "s-{}",
            &crate::service::auth::new_session_token()
                [crate::service::auth::SESSION_TOKEN_PREFIX.len()..][..16]
        )
    });
    if let Some(row) = row_of(core, &id).await? {
        if row.state == SessionState::Opening {
            return Err(WireError::new(409, format!("Session is opening: {id}")));
        }
        if row.state == SessionState::Destroying {
            return Err(WireError::new(409, format!("Session is closing: {id}")));
        }
        if !(req.reuse || req.attach) {
            return Err(WireError::new(409, format!("Session exists: {id}")));
        }
        let (status, v) = attach(core, &row, req.runtime.as_deref()).await?;
        return Ok((status, Json(v)).into_response());
    }
    if req.attach {
        return Err(WireError::new(404, format!("Nothing to attach to: {id}")));
    }
    let tenant = req
        .tenant
        .clone()
        .unwrap_or_else(|| format!("{UNTENANTED}{id}"));
    let open = OpenRequest {
        name: id.clone(),
        tenant,
        runtime: req.runtime.clone(),
        limits: None,
        owner: None,
    };
    // The protocol's open builds the runtime's image inside the request; the core answers
    // `runtime_preparing` meanwhile, so the open waits for the build here, with a deadline.
    let deadline = Instant::now() + PREPARE_WAIT;
    let opened = loop {
        let (c, o) = (core.clone(), open.clone());
        match crate::service::detached(async move { c.open(o).await }).await {
            Err(e) if e.code == ErrorCode::RuntimePreparing && Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(e) if e.code == ErrorCode::NameTaken => {
                return Err(WireError::new(409, format!("Session exists: {id}")));
            }
            Err(e) if e.status == 502 || e.status == 500 => {
                return Err(WireError::new(
                    502,
                    format!("Could not start sandbox: {}", e.message),
                ));
            }
            Err(e) => return Err(WireError::from_core(&id, e)),
            Ok(opened) => break opened,
        }
    };
    let row = row_of(core, &id)
        .await?
        .ok_or_else(|| WireError::gone(&id))?;
    match opened.token {
        Some(token) if opened.created => Ok(Json(Opened {
            session: info(core, &row),
            token,
        })
        .into_response()),
        // Another request opened the name first and this one waited for it.
        _ if req.reuse => {
            let (status, v) = attach(core, &row, req.runtime.as_deref()).await?;
            Ok((status, Json(v)).into_response())
        }
        _ => Err(WireError::new(409, format!("Session exists: {id}"))),
    }
}

#[utoipa::path(
    get, path = "/sessions", tag = "sessions",
    responses((status = 200, description = "The sessions of this host", body = SessionList))
)]
pub(crate) async fn list_sessions(State(state): State<AppState>, headers: HeaderMap) -> WireResult {
    service(&state, &headers)?;
    let rows = state
        .core
        .store()
        .list()
        .await
        .map_err(|e| WireError::new(500, format!("sandboxd's state store failed: {e}")))?;
    let policy = state.core.policy();
    let sessions: Vec<SessionInfo> = rows
        .iter()
        .filter(|r| !matches!(r.state, SessionState::Destroying | SessionState::Lost))
        .map(|r| info(&state.core, r))
        .collect();
    Ok(Json(SessionList {
        sessions,
        limit: policy.max_sessions,
        open_limit: None,
        tenant_limit: policy.max_sessions_per_tenant,
    })
    .into_response())
}

#[utoipa::path(
    get, path = "/sessions/{session_id}", tag = "sessions", params(crate::http::wire::openapi::SessionIdParam),
    responses((status = 200, description = "The session", body = SessionInfo))
)]
pub(crate) async fn get_session(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> WireResult {
    let row = for_session(&state, &headers, &id).await?;
    if row.state == SessionState::Lost || !state.core.workspace(&id).exists() {
        return Err(WireError::gone(&id));
    }
    Ok(Json(info(&state.core, &row)).into_response())
}

/// The query of `DELETE /sessions/{session_id}`.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PurgeQuery {
    /// Whether the session goes with its files and tokens (a boolean as FastAPI reads one:
    /// `true`, `1`, `yes`, `on`, … or `false`, `0`, `no`, `off`, …). Without it, only the
    /// sandbox goes; the files and the session stay for a later attach.
    #[serde(default)]
    #[param(value_type = Option<bool>)]
    purge: Option<String>,
}

/// FastAPI's reading of a boolean query parameter.
fn query_bool(v: Option<&str>, name: &str) -> WireResult<bool> {
    match v.map(str::to_ascii_lowercase).as_deref() {
        None => Ok(false),
        Some("true" | "1" | "yes" | "on" | "t" | "y") => Ok(true),
        Some("false" | "0" | "no" | "off" | "f" | "n") => Ok(false),
        Some(_) => Err(WireError::invalid(
            &["query", name],
            "bool_parsing",
            "Input should be a valid boolean, unable to interpret input",
        )),
    }
}

#[utoipa::path(
    delete, path = "/sessions/{session_id}", tag = "sessions", params(crate::http::wire::openapi::SessionIdParam, PurgeQuery),
    responses((status = 204, description = "Closed (its sandbox gone), or with `purge` gone with its files"))
)]
pub(crate) async fn delete_session(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<PurgeQuery>,
) -> WireResult {
    for_session(&state, &headers, &id).await?;
    let purge = query_bool(q.purge.as_deref(), "purge")?;
    let core = &state.core;
    if purge {
        let (c, i) = (core.clone(), id.clone());
        crate::service::detached(async move { c.destroy(&i).await })
            .await
            .map_err(|e| WireError::from_core(&id, e))?;
        return Ok(no_content());
    }
    // Closed without purge: the container goes, the files (and the session) stay for a later
    // attach. A host that keeps its containers stops it instead.
    let (c, i) = (core.clone(), id.clone());
    let closed = crate::service::detached(async move {
        if c.settings().persist_containers {
            c.stop(&i).await
        } else {
            c.reclaim(&i).await
        }
    })
    .await;
    match closed {
        Ok(_) => Ok(no_content()),
        Err(e) if e.status == 410 => Ok(no_content()),
        Err(e) => Err(WireError::from_core(&id, e)),
    }
}

// ---------------------------------------------------------------------------------------------
// Runs.

/// `RunRequest`: the body of `POST /sessions/{session_id}/run`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct WireRun {
    /// The program and its arguments, run as they are (no shell).
    #[schema(min_items = 1)]
    argv: Vec<String>,
    /// Environment variables added for this run.
    #[serde(default)]
    env: Option<std::collections::HashMap<String, String>>,
    /// Seconds the run may take (rounded up), at most the host's `execute_timeout`.
    #[serde(default)]
    #[schema(exclusive_minimum = 0.0)]
    timeout_seconds: Option<f64>,
    /// The caller's id of the run, which `POST /sessions/{session_id}/runs/{run_id}/stop` names.
    #[schema(pattern = "^[0-9a-f]{32}$")]
    run_id: String,
}

/// `RunResult`: how a run ended and what it wrote.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct RunResult {
    /// What it wrote to stdout (cut at the output limit).
    pub stdout: String,
    /// What it wrote to stderr (cut at the output limit).
    pub stderr: String,
    /// Its exit status; `null` when it timed out or its output was cut.
    pub exit_code: Option<i64>,
    /// Whether it ran out of time and was killed.
    pub timed_out: bool,
    /// Whether its output went over the limit and was cut.
    pub output_limited: bool,
    /// The limit, bytes per stream, when its output was cut.
    pub output_limit: Option<u64>,
}

/// Whether `s` is a run id of the protocol: 32 lowercase hex digits (a uuid4's hex).
fn valid_run_id(s: &str) -> bool {
    s.len() == 32 && s.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
}

/// One word for POSIX `sh`, quoted unless it is plainly safe (as Python's `shlex.quote`).
pub fn sh_quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "@%+=:,./_-".contains(c))
    {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r#"'"'"'"#))
    }
}

/// The argv as one `sh` command line (as Python's `shlex.join`).
pub fn sh_join(argv: &[String]) -> String {
    argv.iter()
        .map(|w| sh_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

#[utoipa::path(
    post, path = "/sessions/{session_id}/run", tag = "runs", params(crate::http::wire::openapi::SessionIdParam),
    request_body = WireRun,
    responses((status = 200, description = "The run ended (exited, timed out or was stopped)", body = RunResult))
)]
pub(crate) async fn run(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    raw: Bytes,
) -> WireResult {
    for_session(&state, &headers, &id).await?;
    let req: WireRun = body(&raw)?;
    if req.argv.is_empty() {
        return Err(WireError::invalid(
            &["body", "argv"],
            "too_short",
            "List should have at least 1 item after validation, not 0",
        ));
    }
    if !valid_run_id(&req.run_id) {
        return Err(WireError::invalid(
            &["body", "run_id"],
            "string_pattern_mismatch",
            "String should match pattern '^[0-9a-f]{32}$'",
        ));
    }
    let timeout = match req.timeout_seconds {
        None => None,
        Some(t) if t > 0.0 && t.is_finite() => Some(t.ceil() as u64),
        Some(_) => {
            return Err(WireError::invalid(
                &["body", "timeout_seconds"],
                "greater_than",
                "Input should be greater than 0",
            ));
        }
    };
    let target = sh_join(&req.argv);
    // The argv passed through literally: `exec` replaces the shell with the program, so a
    // missing one is the shell's 127 and the exit status is the program's own.
    let command = format!("exec {target}");
    let started = Instant::now();
    let result = state
        .core
        .run(
            &id,
            CoreRun {
                command,
                timeout_seconds: timeout,
                env: req.env,
                run_id: Some(req.run_id),
            },
            None,
        )
        .await;
    crate::http::v1::record_run(
        &state.core,
        &id,
        &actor(&headers),
        &target,
        &result,
        started,
    );
    let o = result.map_err(|e| WireError::from_core(&id, e))?;
    let limited = o.truncated && !o.timed_out;
    let limit = state.core.policy().max_output_bytes;
    Ok(Json(RunResult {
        stdout: o.stdout,
        stderr: o.stderr,
        exit_code: if o.timed_out || limited {
            None
        } else {
            Some(o.exit_code)
        },
        timed_out: o.timed_out,
        output_limited: limited,
        output_limit: limited.then_some(limit),
    })
    .into_response())
}

#[utoipa::path(
    post, path = "/sessions/{session_id}/runs/{run_id}/stop", tag = "runs",
    params(crate::http::wire::openapi::SessionIdParam, crate::http::wire::openapi::RunIdParam),
    responses((status = 204, description = "Stopped, or nothing to stop (it ended, or never ran)"))
)]
pub(crate) async fn stop_run(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, run_id)): Path<(String, String)>,
) -> WireResult {
    for_session(&state, &headers, &id).await?;
    if !valid_run_id(&run_id) {
        return Err(WireError::invalid(
            &["path", "run_id"],
            "string_pattern_mismatch",
            "String should match pattern '^[0-9a-f]{32}$'",
        ));
    }
    // A run that already finished has nothing to stop: that is a success.
    let _ = state.core.stop_run(&id, &run_id);
    Ok(no_content())
}

// ---------------------------------------------------------------------------------------------
// Native file operations of a live session, off its host directory.

/// `PathRequest`: a body naming one path.
#[derive(Debug, Deserialize, ToSchema)]
pub struct PathBody {
    /// The path: in the sandbox (`/workspace/…`, or relative to it) for a native route, in the
    /// stored workspace for a `/workspaces` route.
    path: String,
}

/// `FileEntry` (`FileInfo` of a stored workspace): one file or directory.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct FileEntry {
    /// Its last component.
    pub name: String,
    /// Its path: as the caller spelled it on a native route, relative to the workspace on a
    /// `/workspaces` route.
    pub path: String,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Its size in bytes; `null` for a directory (and an entry that is neither).
    pub size: Option<u64>,
    /// When a file was last modified, ISO 8601 UTC (on `/workspaces` routes; `null` on native
    /// ones and for directories).
    pub modified_at: Option<String>,
}

/// The answer of a native realpath.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct RealPath {
    /// The path with every symlink resolved, absolute in the sandbox (`/workspace/…`).
    pub path: String,
}

/// A file error as the native routes answer it. `refuse_outside`: a path that leads out of
/// the workspace is refused (400 `ValueError`); otherwise it is the sandbox's to resolve (409).
/// What the seed's service hands back to the sandbox is answered the same way (409): a path
/// the sandbox user may not open (the client's shell path then raises `PermissionError`, as
/// the sandbox's own tools see it), a FIFO, socket or device (`OSError` "not a regular
/// file"), a symlink loop (the shell's answer for it).
fn file_error(e: FileError, refuse_outside: bool) -> WireError {
    let message = e.to_string();
    if is_loop(&e) {
        return WireError::not_native(message);
    }
    match e {
        FileError::NotFound { .. } => WireError::path(404, "FileNotFoundError", message),
        FileError::IsADirectory { .. } => WireError::path(400, "IsADirectoryError", message),
        FileError::NotADirectory { .. } => WireError::path(400, "NotADirectoryError", message),
        FileError::OutsideWorkspace { .. } if refuse_outside => {
            WireError::path(400, "ValueError", message)
        }
        FileError::OutsideWorkspace { .. } => WireError::not_native(message),
        FileError::InvalidPath { .. } | FileError::DirectoryNotEmpty { .. } => {
            WireError::path(400, "ValueError", message)
        }
        FileError::TooLarge { .. } => WireError::not_native(message),
        FileError::NoSpace { .. } => WireError::path(507, "OSError", message),
        FileError::WorkspaceMissing => WireError::new(410, message),
        FileError::PermissionDenied { .. } | FileError::NotRegularFile { .. } => {
            WireError::not_native(message)
        }
        FileError::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
            WireError::not_native(message)
        }
        FileError::Io { .. } => WireError::new(500, message),
    }
}

/// Whether `e` is a symlink loop.
fn is_loop(e: &FileError) -> bool {
    matches!(e, FileError::InvalidPath { reason, .. } if reason.starts_with("too many levels of symbolic links"))
}

/// Whether an absolute `path` lies outside the work directory.
fn outside_work_dir(path: &str) -> bool {
    path.starts_with('/') && path != WORK_DIR && !path.starts_with(&format!("{WORK_DIR}/"))
}

/// The session's workspace for a native operation (never wakes the container).
async fn workspace_for(state: &AppState, headers: &HeaderMap, id: &str) -> WireResult<Workspace> {
    for_session(state, headers, id).await?;
    state
        .core
        .files(id)
        .await
        .map_err(|e| WireError::from_core(id, e))
}

/// Runs a blocking file operation off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, FileError> + Send + 'static,
) -> WireResult<Result<T, FileError>> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| WireError::new(500, e.to_string()))
}

fn file_outcome<T>(r: &Result<T, FileError>, bytes: impl Fn(&T) -> Option<i64>) -> Outcome {
    match r {
        Ok(v) => Outcome {
            ok: true,
            bytes: bytes(v),
            ..Outcome::default()
        },
        Err(e) => Outcome {
            ok: false,
            error: Some(e.code().to_string()),
            ..Outcome::default()
        },
    }
}

fn refuse_outside(path: &str) -> WireResult<()> {
    if outside_work_dir(path) {
        return Err(WireError::path(
            400,
            "ValueError",
            format!("'{path}' leads outside the workspace"),
        ));
    }
    Ok(())
}

#[utoipa::path(
    post, path = "/sessions/{session_id}/files/read", tag = "files", params(crate::http::wire::openapi::SessionIdParam),
    request_body = PathBody,
    responses((status = 200, description = "The whole file", body = crate::http::openapi::Binary, content_type = "application/octet-stream"))
)]
pub(crate) async fn file_read(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    raw: Bytes,
) -> WireResult {
    let ws = workspace_for(&state, &headers, &id).await?;
    let req: PathBody = body(&raw)?;
    refuse_outside(&req.path)?;
    let started = Instant::now();
    let max = state.core.policy().max_read_bytes;
    let p = req.path.clone();
    let read = blocking(move || ws.read(&p, 0, None, max)).await?;
    state.core.record(
        &id,
        &actor(&headers),
        Op::Read,
        &req.path,
        file_outcome(&read, |r| i64::try_from(r.data.len()).ok()),
        started,
    );
    let read = read.map_err(|e| file_error(e, true))?;
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        read.data,
    )
        .into_response())
}

/// The query of a native write.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WriteQuery {
    /// The file to write (made, or replaced whole), as the sandbox names it.
    #[param(required = true)]
    path: Option<String>,
}

#[utoipa::path(
    post, path = "/sessions/{session_id}/files/write", tag = "files", params(crate::http::wire::openapi::SessionIdParam, WriteQuery),
    request_body(content = crate::http::openapi::Binary, content_type = "application/octet-stream", description = "The file's new content, at most the host's `max_read_bytes`"),
    responses((status = 204, description = "Written"))
)]
pub(crate) async fn file_write(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<WriteQuery>,
    body: Body,
) -> WireResult {
    let ws = workspace_for(&state, &headers, &id).await?;
    let path = q
        .path
        .ok_or_else(|| WireError::invalid(&["query", "path"], "missing", "Field required"))?;
    refuse_outside(&path)?;
    let data = bounded_body(&headers, body, state.core.policy().max_read_bytes).await?;
    let started = Instant::now();
    let p = path.clone();
    let written = blocking(move || ws.write(&p, &data)).await?;
    state.core.record(
        &id,
        &actor(&headers),
        Op::Write,
        &path,
        file_outcome(&written, |w| i64::try_from(w.size).ok()),
        started,
    );
    written.map_err(|e| file_error(e, true))?;
    Ok(no_content())
}

/// A request body of at most `limit` bytes, counted as it arrives (the protocol's
/// `_bounded_body`): a declared length over it is refused before a byte is read, and a body
/// that grows past it as soon as it does, never holding more than `limit`. Over it, the write
/// is the sandbox's (409), and the client writes it there.
async fn bounded_body(headers: &HeaderMap, body: Body, limit: u64) -> WireResult<Vec<u8>> {
    use futures::StreamExt;
    let too_large = || WireError::not_native("larger than a native write");
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut data = Vec::with_capacity(declared.and_then(|n| usize::try_from(n).ok()).unwrap_or(0));
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            WireError::new(
                400,
                format!("the body broke off after {} bytes: {e}", data.len()),
            )
        })?;
        if (data.len() + chunk.len()) as u64 > limit {
            return Err(too_large());
        }
        data.extend_from_slice(&chunk);
    }
    Ok(data)
}

/// The last component of a path as Python's `PurePosixPath(path).name`.
fn base_name(path: &str) -> String {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A `FileEntry` of a native route: `path` as the caller spelled it.
fn native_entry(name: String, path: String, e: &Entry) -> FileEntry {
    let is_dir = e.kind == EntryKind::Dir;
    FileEntry {
        name,
        path,
        is_dir,
        size: if is_dir { None } else { Some(e.size) },
        modified_at: None,
    }
}

#[utoipa::path(
    post, path = "/sessions/{session_id}/files/stat", tag = "files", params(crate::http::wire::openapi::SessionIdParam),
    request_body = PathBody,
    responses((status = 200, description = "The file or directory (a symlink followed)", body = FileEntry))
)]
pub(crate) async fn file_stat(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    raw: Bytes,
) -> WireResult {
    let ws = workspace_for(&state, &headers, &id).await?;
    let req: PathBody = body(&raw)?;
    refuse_outside(&req.path)?;
    let p = req.path.clone();
    let entry = blocking(move || ws.stat_followed(&p))
        .await?
        .map_err(|e| file_error(e, true))?;
    if !matches!(entry.kind, EntryKind::Dir | EntryKind::File) {
        return Err(WireError::not_native(format!(
            "{} is not a regular file",
            req.path
        )));
    }
    Ok(Json(native_entry(base_name(&req.path), req.path.clone(), &entry)).into_response())
}

#[utoipa::path(
    post, path = "/sessions/{session_id}/files/realpath", tag = "files", params(crate::http::wire::openapi::SessionIdParam),
    request_body = PathBody,
    responses((status = 200, description = "Where the path leads", body = RealPath))
)]
pub(crate) async fn file_realpath(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    raw: Bytes,
) -> WireResult {
    let ws = workspace_for(&state, &headers, &id).await?;
    let req: PathBody = body(&raw)?;
    if outside_work_dir(&req.path) {
        // Where a path outside the workspace leads is the sandbox's view, not the host's.
        return Err(WireError::not_native(format!(
            "{} is outside the work directory",
            req.path
        )));
    }
    let p = req.path.clone();
    let rel = blocking(move || ws.realpath(&p))
        .await?
        .map_err(|e| file_error(e, false))?;
    let path = if rel.is_empty() {
        WORK_DIR.to_owned()
    } else {
        format!("{WORK_DIR}/{rel}")
    };
    Ok(Json(RealPath { path }).into_response())
}

#[utoipa::path(
    post, path = "/sessions/{session_id}/files/list", tag = "files", params(crate::http::wire::openapi::SessionIdParam),
    request_body = PathBody,
    responses((status = 200, description = "The directory's entries (symlinks followed), at most `x-sandbox-listing-max-entries`", body = Vec<FileEntry>,
        headers(
            ("x-sandbox-listing-truncated" = String, description = "`true` when the listing was cut at its limit"),
            ("x-sandbox-listing-max-entries" = String, description = "The entry limit of a listing"),
        )))
)]
pub(crate) async fn file_list(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    raw: Bytes,
) -> WireResult {
    let ws = workspace_for(&state, &headers, &id).await?;
    let req: PathBody = body(&raw)?;
    refuse_outside(&req.path)?;
    let started = Instant::now();
    let p = req.path.clone();
    // The directory itself leading out is refused; a link out inside it makes the listing the
    // sandbox's to describe (409), as only the sandbox sees where it leads.
    let listed = tokio::task::spawn_blocking(move || {
        let listing = ws.list_all(&p, MAX_LIST_ENTRIES).map_err(|e| (e, true))?;
        let mut out = Vec::with_capacity(listing.entries.len());
        for e in listing.entries {
            if e.kind == EntryKind::Symlink {
                match ws.stat_followed(&e.path) {
                    Ok(target) => out.push((e.name, target)),
                    // Dangling, a loop, or not the sandbox user's to follow: an entry of its
                    // own that is no directory, as `test -d` in the sandbox says.
                    Err(
                        FileError::NotFound { .. }
                        | FileError::PermissionDenied { .. }
                        | FileError::NotADirectory { .. },
                    ) => out.push((
                        e.name.clone(),
                        Entry {
                            kind: EntryKind::Other,
                            ..e
                        },
                    )),
                    Err(other) if is_loop(&other) => out.push((
                        e.name.clone(),
                        Entry {
                            kind: EntryKind::Other,
                            ..e
                        },
                    )),
                    Err(other) => return Err((other, false)),
                }
            } else {
                out.push((e.name.clone(), e));
            }
        }
        Ok((out, listing.truncated))
    })
    .await
    .map_err(|e| WireError::new(500, e.to_string()))?;
    let outcome = match &listed {
        Ok(_) => Outcome {
            ok: true,
            ..Outcome::default()
        },
        Err((e, _)) => Outcome {
            ok: false,
            error: Some(e.code().to_string()),
            ..Outcome::default()
        },
    };
    state
        .core
        .record(&id, &actor(&headers), Op::Ls, &req.path, outcome, started);
    let (listed, truncated) = listed.map_err(|(e, refuse)| file_error(e, refuse))?;
    let base = if req.path.len() > 1 {
        req.path.trim_end_matches('/')
    } else {
        req.path.as_str()
    };
    let rows: Vec<FileEntry> = listed
        .into_iter()
        .map(|(name, e)| {
            let path = if base.ends_with('/') {
                format!("{base}{name}")
            } else {
                format!("{base}/{name}")
            };
            if e.kind == EntryKind::Other {
                FileEntry {
                    name,
                    path,
                    is_dir: false,
                    size: None,
                    modified_at: None,
                }
            } else {
                native_entry(name, path, &e)
            }
        })
        .collect();
    Ok(listing_response(rows, truncated))
}

#[utoipa::path(
    post, path = "/sessions/{session_id}/files/mkdir", tag = "files", params(crate::http::wire::openapi::SessionIdParam),
    request_body = PathBody,
    responses((status = 204, description = "Made (with its parents), or there already"))
)]
pub(crate) async fn file_mkdir(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    raw: Bytes,
) -> WireResult {
    let ws = workspace_for(&state, &headers, &id).await?;
    let req: PathBody = body(&raw)?;
    refuse_outside(&req.path)?;
    let started = Instant::now();
    let p = req.path.clone();
    let made = blocking(move || match ws.mkdir(&p) {
        // A file where the new directory goes is "exists"; one on the way "not a directory".
        Err(FileError::NotADirectory { path }) => match ws.stat(&p) {
            Ok(e) if e.kind != EntryKind::Dir => Err(FileError::Io {
                path,
                source: std::io::ErrorKind::AlreadyExists.into(),
            }),
            _ => Err(FileError::NotADirectory { path }),
        },
        other => other,
    })
    .await?;
    state.core.record(
        &id,
        &actor(&headers),
        Op::Mkdir,
        &req.path,
        file_outcome(&made, |_| None),
        started,
    );
    match made {
        Ok(()) => Ok(no_content()),
        Err(FileError::Io { path, source })
            if source.kind() == std::io::ErrorKind::AlreadyExists =>
        {
            Err(WireError::path(
                400,
                "FileExistsError",
                format!("'{path}' exists and is not a directory"),
            ))
        }
        Err(e) => Err(file_error(e, true)),
    }
}

#[utoipa::path(
    post, path = "/sessions/{session_id}/files/remove", tag = "files", params(crate::http::wire::openapi::SessionIdParam),
    request_body = PathBody,
    responses((status = 204, description = "Removed (a directory with what it holds)"))
)]
pub(crate) async fn file_remove(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    raw: Bytes,
) -> WireResult {
    let ws = workspace_for(&state, &headers, &id).await?;
    let req: PathBody = body(&raw)?;
    refuse_outside(&req.path)?;
    let started = Instant::now();
    let p = req.path.clone();
    let removed = blocking(move || ws.remove(&p, true)).await?;
    state.core.record(
        &id,
        &actor(&headers),
        Op::Remove,
        &req.path,
        file_outcome(&removed, |_| None),
        started,
    );
    removed.map_err(|e| file_error(e, true))?;
    Ok(no_content())
}

// ---------------------------------------------------------------------------------------------
// Stored workspaces, read without a container (service token only).

/// A path of an archive request relative to the workspace: `/workspace/x` is `x`, any other
/// absolute path is read inside the workspace (`/etc/passwd` is `etc/passwd`), and a `..`
/// that climbs out is refused.
fn archive_path(path: &str) -> WireResult<String> {
    let rel = path
        .strip_prefix(WORK_DIR)
        .filter(|r| r.is_empty() || r.starts_with('/'))
        .unwrap_or(path)
        .trim_start_matches('/');
    let mut depth: i32 = 0;
    for part in rel.split('/') {
        match part {
            "" | "." => {}
            ".." => depth -= 1,
            _ => depth += 1,
        }
        if depth < 0 || part == ".." {
            return Err(WireError::new(
                400,
                format!("Path '{path}' is outside the workspace"),
            ));
        }
    }
    Ok(rel.to_owned())
}

/// The stored workspace of session `id`, and whether a session row exists for the audit log.
async fn stored(state: &AppState, headers: &HeaderMap, id: &str) -> WireResult<(Workspace, bool)> {
    service(state, headers)?;
    check_id(id, &["path", "session_id"])?;
    // A session the core knows is read through it (its row names the tenant for the audit
    // log); a workspace without one is read as it is on disk.
    let (ws, known) = match state.core.files(id).await {
        Ok(ws) => (ws, true),
        Err(_) => (state.core.workspace(id), false),
    };
    if !ws.exists() {
        return Err(WireError::new(
            404,
            format!("No workspace for session: {id}"),
        ));
    }
    Ok((ws, known))
}

fn archive_error(e: FileError, path: &str, what: &str) -> WireError {
    match e {
        FileError::OutsideWorkspace { .. } => {
            WireError::new(400, format!("Path '{path}' is outside the workspace"))
        }
        FileError::NotFound { .. }
        | FileError::NotADirectory { .. }
        | FileError::IsADirectory { .. } => WireError::new(404, format!("No such {what}: {path}")),
        FileError::TooLarge { size, limit } => WireError::new(
            400,
            format!("File is {size} bytes, over the {limit}-byte read limit"),
        ),
        other => WireError::new(400, other.to_string()),
    }
}

/// `FileInfo` of an archive listing: relative path, mtime of files in ISO 8601 UTC.
fn archive_entry(e: &Entry) -> FileEntry {
    let is_dir = e.kind == EntryKind::Dir;
    FileEntry {
        name: e.name.clone(),
        path: e.path.clone(),
        is_dir,
        size: if is_dir { None } else { Some(e.size) },
        modified_at: if is_dir {
            None
        } else {
            e.modified
                .map(|m| m.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, false))
        },
    }
}

/// One directory of a stored workspace, at most `max` of its entries read: links left out,
/// directories first, then by name; and whether it held more.
fn scan(ws: &Workspace, rel: &str, max: usize) -> Result<(Vec<Entry>, bool), FileError> {
    let listing = ws.list_all(rel, max)?;
    let mut entries: Vec<Entry> = listing
        .entries
        .into_iter()
        .filter(|e| matches!(e.kind, EntryKind::Dir | EntryKind::File))
        .collect();
    entries.sort_by(|a, b| {
        (a.kind != EntryKind::Dir, &a.name).cmp(&(b.kind != EntryKind::Dir, &b.name))
    });
    Ok((entries, listing.truncated))
}

/// A breadth-first walk as the protocol's `tree`: entries, and whether anything was left out.
fn walk(
    ws: &Workspace,
    rel: &str,
    max_depth: u32,
    max_entries: usize,
) -> Result<(Vec<Entry>, bool), FileError> {
    let mut found = Vec::new();
    let mut truncated = false;
    let mut queue: VecDeque<(String, u32)> = VecDeque::from([(rel.to_owned(), 1)]);
    while let Some((dir, depth)) = queue.pop_front() {
        // Read only as far as the entries still to list, and one more.
        let budget = max_entries.saturating_sub(found.len()).saturating_add(1);
        let entries = match scan(ws, &dir, budget) {
            Ok((entries, more)) => {
                truncated |= more;
                entries
            }
            Err(e) if depth == 1 => return Err(e),
            Err(_) => {
                truncated = true;
                continue;
            }
        };
        for e in entries {
            if found.len() == max_entries {
                return Ok((found, true));
            }
            if e.kind == EntryKind::Dir {
                if depth < max_depth {
                    queue.push_back((e.path.clone(), depth + 1));
                } else {
                    truncated = true;
                }
            }
            found.push(e);
        }
    }
    Ok((found, truncated))
}

/// `TreeRequest`: the body of `POST /workspaces/{session_id}/tree`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct TreeBody {
    /// The directory to walk, in the stored workspace.
    #[serde(default = "dot")]
    #[schema(default = ".")]
    path: String,
    /// Levels walked at most.
    #[serde(default = "six")]
    #[schema(default = 6, minimum = 1, maximum = 64)]
    max_depth: i64,
    /// Entries listed at most.
    #[serde(default = "two_thousand")]
    #[schema(default = 2000, minimum = 1, maximum = 100000)]
    max_entries: i64,
}

/// `WorkspaceTree`: the entries of a walk, breadth first.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Tree {
    /// The entries (links left out), each directory's listed directories first, then by name.
    pub entries: Vec<FileEntry>,
    /// Whether anything was left out (a bound reached, a directory unreadable).
    pub truncated: bool,
}

/// One workspace's walk of `POST /workspaces/trees`: its tree, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TreeResult {
    /// The session whose workspace this is.
    pub session_id: String,
    /// Its tree; `null` on an error.
    pub tree: Option<Tree>,
    /// Why there is no tree.
    pub error: Option<String>,
    /// The status the single-workspace route would have answered.
    pub status_code: Option<u16>,
}

/// The answer of `POST /workspaces/trees`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Trees {
    /// One result per session asked for, in order.
    pub results: Vec<TreeResult>,
}

/// `{"content": …}`: text of a stored file.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Content {
    /// The lines asked for, and a note of what is left (`[... N more lines. …]`, or
    /// `[End of file]`).
    pub content: String,
}

/// `{"content_b64": …}`: bytes of a stored file.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ContentB64 {
    /// The whole file, base64 (standard alphabet, padded).
    pub content_b64: String,
}

fn dot() -> String {
    ".".into()
}
fn six() -> i64 {
    6
}
fn two_thousand() -> i64 {
    2000
}

fn tree_bounds(max_depth: i64, max_entries: i64) -> WireResult<(u32, usize)> {
    if !(1..=64).contains(&max_depth) {
        return Err(WireError::invalid(
            &["body", "max_depth"],
            "value_error",
            "max_depth must be between 1 and 64",
        ));
    }
    if !(1..=100_000).contains(&max_entries) {
        return Err(WireError::invalid(
            &["body", "max_entries"],
            "value_error",
            "max_entries must be between 1 and 100000",
        ));
    }
    Ok((max_depth as u32, max_entries as usize))
}

#[utoipa::path(
    post, path = "/workspaces/{session_id}/ls", tag = "workspaces", params(crate::http::wire::openapi::SessionIdParam),
    request_body = PathBody,
    responses((status = 200, description = "The directory's files and directories (links left out), at most `x-sandbox-listing-max-entries`", body = Vec<FileEntry>,
        headers(
            ("x-sandbox-listing-truncated" = String, description = "`true` when the listing was cut at its limit"),
            ("x-sandbox-listing-max-entries" = String, description = "The entry limit of a listing"),
        )))
)]
pub(crate) async fn archive_ls(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    raw: Bytes,
) -> WireResult {
    let (ws, known) = stored(&state, &headers, &id).await?;
    let req: PathBody = body(&raw)?;
    let rel = archive_path(&req.path)?;
    let started = Instant::now();
    let r = rel.clone();
    let listed = blocking(move || scan(&ws, &r, MAX_LIST_ENTRIES)).await?;
    if known {
        state.core.record(
            &id,
            &actor(&headers),
            Op::Ls,
            &req.path,
            file_outcome(&listed, |_| None),
            started,
        );
    }
    let (listed, truncated) = listed.map_err(|e| archive_error(e, &req.path, "directory"))?;
    Ok(listing_response(
        listed.iter().map(archive_entry).collect(),
        truncated,
    ))
}

async fn tree_of(
    state: &AppState,
    headers: &HeaderMap,
    id: &str,
    path: &str,
    bounds: (u32, usize),
) -> WireResult<Tree> {
    let (ws, known) = stored(state, headers, id).await?;
    let rel = archive_path(path)?;
    let started = Instant::now();
    let walked = blocking(move || walk(&ws, &rel, bounds.0, bounds.1)).await?;
    if known {
        state.core.record(
            id,
            &actor(headers),
            Op::Ls,
            path,
            file_outcome(&walked, |_| None),
            started,
        );
    }
    let (entries, truncated) = walked.map_err(|e| archive_error(e, path, "directory"))?;
    Ok(Tree {
        entries: entries.iter().map(archive_entry).collect(),
        truncated,
    })
}

#[utoipa::path(
    post, path = "/workspaces/{session_id}/tree", tag = "workspaces", params(crate::http::wire::openapi::SessionIdParam),
    request_body = TreeBody,
    responses((status = 200, description = "The walk", body = Tree))
)]
pub(crate) async fn archive_tree(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    raw: Bytes,
) -> WireResult {
    service(&state, &headers)?;
    let req: TreeBody = body(&raw)?;
    let bounds = tree_bounds(req.max_depth, req.max_entries)?;
    Ok(Json(tree_of(&state, &headers, &id, &req.path, bounds).await?).into_response())
}

/// `TreesRequest`: the body of `POST /workspaces/trees`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct TreesBody {
    /// The sessions whose stored workspaces to walk.
    #[schema(min_items = 1, max_items = 100)]
    sessions: Vec<String>,
    /// The directory to walk in each.
    #[serde(default = "dot")]
    #[schema(default = ".")]
    path: String,
    /// Levels walked at most.
    #[serde(default = "six")]
    #[schema(default = 6, minimum = 1, maximum = 64)]
    max_depth: i64,
    /// Entries listed at most, per workspace.
    #[serde(default = "two_thousand")]
    #[schema(default = 2000, minimum = 1, maximum = 100000)]
    max_entries: i64,
}

#[utoipa::path(
    post, path = "/workspaces/trees", tag = "workspaces",
    request_body = TreesBody,
    responses((status = 200, description = "One walk per session asked for", body = Trees))
)]
pub(crate) async fn archive_trees(
    State(state): State<AppState>,
    headers: HeaderMap,
    raw: Bytes,
) -> WireResult {
    service(&state, &headers)?;
    let req: TreesBody = body(&raw)?;
    if req.sessions.is_empty() || req.sessions.len() > 100 {
        return Err(WireError::invalid(
            &["body", "sessions"],
            "value_error",
            "sessions must name 1 to 100 workspaces",
        ));
    }
    for (i, s) in req.sessions.iter().enumerate() {
        let index = i.to_string();
        check_id(s, &["body", "sessions", &index])?;
    }
    let bounds = tree_bounds(req.max_depth, req.max_entries)?;
    let mut results = Vec::with_capacity(req.sessions.len());
    for id in &req.sessions {
        results.push(
            match tree_of(&state, &headers, id, &req.path, bounds).await {
                Ok(tree) => TreeResult {
                    session_id: id.clone(),
                    tree: Some(tree),
                    error: None,
                    status_code: None,
                },
                Err(e) => TreeResult {
                    session_id: id.clone(),
                    tree: None,
                    error: Some(e.detail.to_string()),
                    status_code: Some(e.status),
                },
            },
        );
    }
    Ok(Json(Trees { results }).into_response())
}

/// `ReadRequest`: the body of `POST /workspaces/{session_id}/read`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ReadBody {
    /// The file, in the stored workspace.
    path: String,
    /// The first line to read (0-based).
    #[serde(default)]
    #[schema(default = 0, minimum = 0)]
    offset: i64,
    /// Lines to read at most.
    #[serde(default = "two_thousand")]
    #[schema(default = 2000, minimum = 1)]
    limit: i64,
}

/// A slice of lines as the protocol's `read` answers it.
pub fn text_slice(text: &str, offset: usize, limit: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if offset >= lines.len() {
        return "[End of file]".to_owned();
    }
    let end = offset.saturating_add(limit);
    let chunk = lines[offset..end.min(lines.len())].join("\n");
    if end >= lines.len() {
        return chunk;
    }
    let remaining = lines.len() - end;
    format!("{chunk}\n\n[... {remaining} more lines. Use offset={end} to read more.]")
}

async fn read_stored(
    state: &AppState,
    headers: &HeaderMap,
    id: &str,
    path: &str,
) -> WireResult<Vec<u8>> {
    let (ws, known) = stored(state, headers, id).await?;
    let rel = archive_path(path)?;
    let max = state.core.policy().max_read_bytes;
    let started = Instant::now();
    let read = blocking(move || {
        // The whole file or nothing: its size, not a slice, is held against the limit.
        let r = ws.read(&rel, 0, None, max)?;
        Ok(r.data)
    })
    .await?;
    if known {
        state.core.record(
            id,
            &actor(headers),
            Op::Read,
            path,
            file_outcome(&read, |d| i64::try_from(d.len()).ok()),
            started,
        );
    }
    read.map_err(|e| archive_error(e, path, "file"))
}

#[utoipa::path(
    post, path = "/workspaces/{session_id}/read", tag = "workspaces", params(crate::http::wire::openapi::SessionIdParam),
    request_body = ReadBody,
    responses((status = 200, description = "Lines of the file", body = Content))
)]
pub(crate) async fn archive_read(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    raw: Bytes,
) -> WireResult {
    service(&state, &headers)?;
    let req: ReadBody = body(&raw)?;
    if req.offset < 0 {
        return Err(WireError::invalid(
            &["body", "offset"],
            "greater_than_equal",
            "Input should be greater than or equal to 0",
        ));
    }
    if req.limit < 1 {
        return Err(WireError::invalid(
            &["body", "limit"],
            "greater_than_equal",
            "Input should be greater than or equal to 1",
        ));
    }
    let data = read_stored(&state, &headers, &id, &req.path).await?;
    let text = String::from_utf8(data).map_err(|_| {
        WireError::new(
            400,
            format!(
                "File is not readable as text: {}; read it with read_bytes",
                req.path
            ),
        )
    })?;
    let content = text_slice(&text, req.offset as usize, req.limit as usize);
    Ok(Json(Content { content }).into_response())
}

#[utoipa::path(
    post, path = "/workspaces/{session_id}/read_bytes", tag = "workspaces", params(crate::http::wire::openapi::SessionIdParam),
    request_body = PathBody,
    responses((status = 200, description = "The whole file", body = ContentB64))
)]
pub(crate) async fn archive_read_bytes(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    raw: Bytes,
) -> WireResult {
    service(&state, &headers)?;
    let req: PathBody = body(&raw)?;
    let data = read_stored(&state, &headers, &id, &req.path).await?;
    let encoded = base64::engine::general_purpose::STANDARD.encode(data);
    Ok(Json(ContentB64 {
        content_b64: encoded,
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_is_the_pin_in_versions_env() {
        let pinned = VERSIONS_ENV
            .lines()
            .find(|l| l.starts_with("PYDANTIC_AI_BACKEND_VERSION="))
            .expect("hack/versions.env pins PYDANTIC_AI_BACKEND_VERSION");
        assert_eq!(format!("PYDANTIC_AI_BACKEND_VERSION={}", release()), pinned);
        assert_ne!(release(), "unknown");
    }

    #[test]
    fn quoting_matches_shlex() {
        assert_eq!(sh_quote("ls"), "ls");
        assert_eq!(sh_quote("/bin/sh"), "/bin/sh");
        assert_eq!(sh_quote(""), "''");
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r#"'it'"'"'s'"#);
        assert_eq!(
            sh_join(&["sh".into(), "-c".into(), "echo $HOME; exit 3".into()]),
            "sh -c 'echo $HOME; exit 3'"
        );
    }

    #[test]
    fn ids_follow_the_protocol_pattern() {
        assert!(valid_id("s-0123456789abcdef"));
        assert!(valid_id("A.b_c-1"));
        assert!(!valid_id(""));
        assert!(!valid_id("-x"));
        assert!(!valid_id("a/b"));
        assert!(!valid_id("../x"));
        assert!(!valid_id(&"a".repeat(65)));
        assert!(valid_run_id("0123456789abcdef0123456789abcdef"));
        assert!(!valid_run_id("0123456789ABCDEF0123456789abcdef"));
    }

    #[test]
    fn archive_paths_stay_inside() {
        assert_eq!(archive_path("/workspace/a/b").ok(), Some("a/b".into()));
        assert_eq!(archive_path("/workspace").ok(), Some(String::new()));
        assert_eq!(archive_path("/etc/passwd").ok(), Some("etc/passwd".into()));
        assert_eq!(archive_path(".").ok(), Some(".".into()));
        assert_eq!(archive_path("/workspacex").ok(), Some("workspacex".into()));
        assert_eq!(
            archive_path("a/../../etc").err().map(|e| e.status),
            Some(400)
        );
        assert_eq!(archive_path("..").err().map(|e| e.status), Some(400));
    }

    #[test]
    fn text_slices_say_what_is_left() {
        assert_eq!(text_slice("", 0, 10), "[End of file]");
        assert_eq!(text_slice("a\nb\nc\n", 0, 10), "a\nb\nc");
        assert_eq!(
            text_slice("a\nb\nc\n", 0, 2),
            "a\nb\n\n[... 1 more lines. Use offset=2 to read more.]"
        );
        assert_eq!(text_slice("a\nb\nc\n", 2, 2), "c");
        assert_eq!(text_slice("a\n", 5, 2), "[End of file]");
    }

    /// The typed error bodies serialize as the protocol's: a sentence, a Python exception, or
    /// FastAPI's list of problems, each under `detail`.
    #[test]
    fn error_bodies_keep_the_protocol_shape() {
        let body = |e: WireError| {
            serde_json::to_value(WireErrorBody { detail: e.detail }).expect("serializes")
        };
        assert_eq!(
            body(WireError::no_such_session("x")),
            json!({"detail": "No such session: x"})
        );
        assert_eq!(
            body(WireError::path(404, "FileNotFoundError", "no a.txt")),
            json!({"detail": {"error": "FileNotFoundError", "message": "no a.txt"}})
        );
        assert_eq!(
            body(WireError::invalid(
                &["body", "argv"],
                "missing",
                "Field required"
            )),
            json!({"detail": [{"type": "missing", "loc": ["body", "argv"], "msg": "Field required"}]})
        );
    }

    /// The typed answers carry every field the protocol's models have, `null` where this host
    /// has no value (never left out).
    #[test]
    fn answers_keep_their_null_fields() {
        let run = serde_json::to_value(RunResult {
            stdout: "out".into(),
            stderr: String::new(),
            exit_code: None,
            timed_out: true,
            output_limited: false,
            output_limit: None,
        })
        .expect("serializes");
        assert_eq!(
            run,
            json!({"stdout": "out", "stderr": "", "exit_code": null, "timed_out": true,
                   "output_limited": false, "output_limit": null})
        );
        let entry = serde_json::to_value(FileEntry {
            name: "d".into(),
            path: "/workspace/d".into(),
            is_dir: true,
            size: None,
            modified_at: None,
        })
        .expect("serializes");
        assert_eq!(
            entry,
            json!({"name": "d", "path": "/workspace/d", "is_dir": true, "size": null, "modified_at": null})
        );
    }

    #[test]
    fn host_cap_message_names_the_ceiling() {
        let e = WireError::from_core(
            "x",
            ApiError::new(
                429,
                ErrorCode::HostCap,
                "This host already holds 20 of 20 sessions. Release an idle session before opening another.",
            ),
        );
        assert_eq!(e.status, 429);
        assert_eq!(
            e.detail,
            Detail::Message(
                "Session limit of 20 reached. Release an idle session before opening another."
                    .into()
            )
        );
    }
}
