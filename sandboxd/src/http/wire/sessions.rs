//! Sessions: create (or attach), list, get and delete, in the protocol's shape.

use super::*;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use sandboxd_api::session::SessionUsage;

use crate::http::AppState;
use crate::runtimes::RuntimeError;
use crate::service::{Core, OpenRequest, ServiceError};
use crate::storage::store::{SessionRow, State as SessionState};

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
    /// What its sandbox uses now (sampled at most every 2 s); `null` when it is not running,
    /// or when asked not to (`usage=false`).
    pub usage: Option<SessionUsage>,
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

pub(super) fn secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

/// `SessionInfo` of a row, with `usage` sampled or not.
pub(super) fn info(core: &Core, row: &SessionRow, usage: Option<SessionUsage>) -> SessionInfo {
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
        usage,
    }
}

pub(super) async fn row_of(core: &Core, id: &str) -> WireResult<Option<SessionRow>> {
    core.store()
        .get(id)
        .await
        .map_err(|e| WireError::new(500, format!("sandboxd's state store failed: {e}")))
}

/// Hands an existing session to a caller that may attach to it, with a token of its own.
pub(super) async fn attach(
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
            session: info(core, row, None),
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
    _: Service,
    raw: Bytes,
) -> WireResult {
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
        egress: Vec::new(),
        from_snapshot: None,
    };
    // The protocol's open builds the runtime's image inside the request; the core answers
    // `runtime_preparing` meanwhile, so the open waits for the build here, with a deadline.
    let deadline = Instant::now() + PREPARE_WAIT;
    let opened = loop {
        let (c, o) = (core.clone(), open.clone());
        match crate::service::detached(async move { c.open(o).await }).await {
            Err(ServiceError::Runtime(RuntimeError::Preparing { .. }))
                if Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(ServiceError::NameTaken { .. }) => {
                return Err(WireError::new(409, format!("Session exists: {id}")));
            }
            Err(e) if matches!(e.status_and_code().0, 500 | 502) => {
                return Err(WireError::new(502, format!("Could not start sandbox: {e}")));
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
            session: info(core, &row, None),
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

/// The query of `GET /sessions` and `GET /sessions/{session_id}`.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// Whether to fill `usage` (a boolean as FastAPI reads one). Unlike the protocol's own
    /// service, this host fills it unless told `false`: a sample is kept for 2 s, so polling
    /// costs Docker one call per session per 2 s at most.
    #[serde(default)]
    #[param(value_type = Option<bool>)]
    usage: Option<String>,
}

fn wants_usage(q: &UsageQuery) -> WireResult<bool> {
    Ok(q.usage.is_none() || query_bool(q.usage.as_deref(), "usage")?)
}

#[utoipa::path(
    get, path = "/sessions", tag = "sessions", params(UsageQuery),
    responses((status = 200, description = "The sessions of this host", body = SessionList))
)]
pub(crate) async fn list_sessions(
    State(state): State<AppState>,
    Query(q): Query<UsageQuery>,
    _: Service,
) -> WireResult {
    let usage = wants_usage(&q)?;
    let rows = state
        .core
        .store()
        .list()
        .await
        .map_err(|e| WireError::new(500, format!("sandboxd's state store failed: {e}")))?;
    let policy = state.core.policy();
    let core = &state.core;
    let sessions: Vec<SessionInfo> = futures::future::join_all(
        rows.iter()
            .filter(|r| !matches!(r.state, SessionState::Destroying | SessionState::Lost))
            .map(|r| async move {
                let sample = if usage { core.usage(r).await } else { None };
                info(core, r, sample)
            }),
    )
    .await;
    Ok(Json(SessionList {
        sessions,
        limit: policy.max_sessions,
        open_limit: None,
        tenant_limit: policy.max_sessions_per_tenant,
    })
    .into_response())
}

#[utoipa::path(
    get, path = "/sessions/{session_id}", tag = "sessions", params(crate::http::wire::openapi::SessionIdParam, UsageQuery),
    responses((status = 200, description = "The session", body = SessionInfo))
)]
pub(crate) async fn get_session(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<UsageQuery>,
    WireSession(row): WireSession,
) -> WireResult {
    let usage = wants_usage(&q)?;
    if row.state == SessionState::Lost || !state.core.workspace(&id).exists() {
        return Err(WireError::gone(&id));
    }
    let sample = if usage {
        state.core.usage(&row).await
    } else {
        None
    };
    Ok(Json(info(&state.core, &row, sample)).into_response())
}

/// The query of `GET /sessions/{session_id}/events`.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only entries newer than this sequence number (0, the default: from the start), so a
    /// watcher polls without reading the whole log again: pass the `latest_seq` of the answer
    /// before.
    #[serde(default)]
    #[param(value_type = Option<i64>, minimum = 0)]
    after: Option<String>,
}

/// What has been done in this session, newest entries last: its audit rows (of this
/// incarnation of the session, kept across restarts of sandboxd) in the protocol's shape.
#[utoipa::path(
    get, path = "/sessions/{session_id}/events", tag = "sessions", params(crate::http::wire::openapi::SessionIdParam, EventsQuery),
    responses((status = 200, description = "The entries after `after` (the newest 200 at most), oldest first, and the latest sequence number", body = sandboxd_api::audit::SessionEvents))
)]
pub(crate) async fn session_events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
    _: WireSession,
) -> WireResult {
    let after = match q.after.as_deref() {
        None => 0,
        Some(text) => text.trim().parse::<i64>().map_err(|_| {
            WireError::invalid(
                &["query", "after"],
                "int_parsing",
                "Input should be a valid integer, unable to parse string as an integer",
            )
        })?,
    };
    if after < 0 {
        return Err(WireError::invalid(
            &["query", "after"],
            "greater_than_equal",
            "Input should be greater than or equal to 0",
        ));
    }
    let events = state
        .core
        .events(&id, after)
        .await
        .map_err(|e| WireError::from_core(&id, e))?;
    Ok(Json(events).into_response())
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
pub(super) fn query_bool(v: Option<&str>, name: &str) -> WireResult<bool> {
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
    Path(id): Path<String>,
    Query(q): Query<PurgeQuery>,
    _: WireSession,
) -> WireResult {
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
        Err(e) if e.is_gone() => Ok(no_content()),
        Err(e) => Err(WireError::from_core(&id, e)),
    }
}
