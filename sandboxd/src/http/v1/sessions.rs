//! Sessions: list, open, show, destroy, stop, start, reclaim, rebuild and the rotation of a
//! session's token.

use super::*;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::openapi::SessionId;
use crate::http::error::ApiError;
use crate::service::{Actor, Destroyed, OpenRequest, Opened, RebuildRequest, SessionView};

#[utoipa::path(
    get, path = "/v1/sessions", tag = "sessions",
    responses((status = 200, description = "Every session of this host", body = SessionList))
)]
pub(crate) async fn list(State(state): State<AppState>, _: Admin) -> Result<Response, ApiError> {
    Ok(Json(SessionList {
        sessions: state.core.list().await?,
    })
    .into_response())
}

#[utoipa::path(
    post, path = "/v1/sessions", tag = "sessions",
    request_body = OpenRequest,
    responses(
        (status = 201, description = "Created; the body carries the session token (only here)", body = Opened),
        (status = 200, description = "It existed already (opened again, woken if it slept)", body = Opened),
    )
)]
pub(crate) async fn open(
    State(state): State<AppState>,
    _: Admin,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: OpenRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid open request: {e}")))?;
    let core = state.core.clone();
    let opened = crate::service::detached(async move { core.open(req).await }).await?;
    let status = if opened.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(opened)).into_response())
}

#[utoipa::path(
    get, path = "/v1/sessions/{id}", tag = "sessions", params(SessionId, UsageQuery),
    responses((status = 200, description = "The session", body = SessionView))
)]
pub(crate) async fn show(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<UsageQuery>,
    _: ForSession,
) -> Result<Response, ApiError> {
    Ok(Json(state.core.get(&id, q.usage.unwrap_or(true)).await?).into_response())
}

/// `?usage=` of `GET /v1/sessions/{id}`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct UsageQuery {
    /// Whether to fill `usage` (default true); `false` asks Docker nothing for it (the
    /// operator's look at a session).
    #[serde(default)]
    usage: Option<bool>,
}

/// `?after=` of `GET /v1/sessions/{id}/events`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct AfterQuery {
    /// Only events after this sequence number (0, the default: from the start); pass the
    /// `latest_seq` of the answer before.
    #[serde(default)]
    after: Option<i64>,
}

/// The session's activity feed: its audit rows (of this incarnation of the session) after
/// `after`, newest last, in the wire protocol's shape.
#[utoipa::path(
    get, path = "/v1/sessions/{id}/events", tag = "operations", params(SessionId, AfterQuery),
    responses((status = 200, description = "The events after `after` (the newest 200 at most), oldest first, and the latest sequence number", body = crate::storage::audit::SessionEvents))
)]
pub(crate) async fn events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<AfterQuery>,
    _: ForSession,
) -> Result<Response, ApiError> {
    let after = q.after.unwrap_or(0);
    if after < 0 {
        return Err(ApiError::bad_request(
            "after must be 0 or more: the latest_seq of the answer before",
        ));
    }
    Ok(Json(state.core.events(&id, after).await?).into_response())
}

/// `?minutes=` of `GET /v1/sessions/{id}/egress`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct MinutesQuery {
    /// The minutes back to show, 1 to 1440 (default 60).
    #[serde(default)]
    minutes: Option<u32>,
}

/// What the session's sandbox reached through the egress proxy and resolver and what was
/// refused, one row per name, port, verdict and minute (a runtime of egress mode
/// `allowlist`; others have no rows).
#[utoipa::path(
    get, path = "/v1/sessions/{id}/egress", tag = "operations", params(SessionId, MinutesQuery),
    responses((status = 200, description = "The session's egress rows of the last `minutes` minutes, oldest first", body = sandboxd_api::egress::EgressLog))
)]
pub(crate) async fn egress(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<MinutesQuery>,
    _: ForSession,
) -> Result<Response, ApiError> {
    let minutes = q.minutes.unwrap_or(60);
    if !(1..=1440).contains(&minutes) {
        return Err(ApiError::bad_request("minutes must be 1 to 1440"));
    }
    Ok(Json(state.core.egress_log(&id, minutes).await?).into_response())
}

/// Replaces the session's egress credentials (admin token): the headers the egress proxy sets
/// on its sandbox's requests to the hosts they name, kept in sandboxd's memory only. Checked
/// whole first (400 naming what is wrong, never a value): the session's egress policy must
/// allow every host and port. The answer is the session, its `credentials_version` the set's.
#[utoipa::path(
    put, path = "/v1/sessions/{id}/credentials", tag = "sessions", params(SessionId),
    request_body = sandboxd_api::egress::CredentialSet,
    responses((status = 200, description = "The session, holding the credentials (`credentials_version`)", body = SessionView))
)]
pub(crate) async fn put_credentials(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: Admin,
    who: Actor,
    body: Bytes,
) -> Result<Response, ApiError> {
    // serde's words name a field and a position, never a value of the body.
    let set: sandboxd_api::egress::CredentialSet = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "invalid credential set: {} at line {} column {}",
            match e.classify() {
                serde_json::error::Category::Data => "a field is missing or of the wrong type",
                serde_json::error::Category::Syntax | serde_json::error::Category::Eof =>
                    "not JSON",
                serde_json::error::Category::Io => "unreadable",
            },
            e.line(),
            e.column()
        ))
    })?;
    Ok(Json(state.core.put_credentials(&id, set, &who).await?).into_response())
}

/// `?owner=`: the object a destroy or token rotation acts for.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct OwnerQuery {
    /// The object the session belongs to; another owner than the session's is refused
    /// (409 `owner_mismatch`).
    #[serde(default)]
    owner: Option<String>,
}

#[utoipa::path(
    delete, path = "/v1/sessions/{id}", tag = "sessions", params(SessionId, OwnerQuery),
    responses((status = 200, description = "What the destroy did (`destroyed: false` when nothing was left)", body = Destroyed))
)]
pub(crate) async fn destroy(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<OwnerQuery>,
    _: ForSession,
) -> Result<Response, ApiError> {
    let core = state.core.clone();
    let destroyed =
        crate::service::detached(async move { core.destroy_as(&id, q.owner.as_deref()).await })
            .await?;
    Ok(Json(destroyed).into_response())
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/stop", tag = "sessions", params(SessionId),
    responses((status = 200, description = "The session, stopped", body = SessionView))
)]
pub(crate) async fn stop(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: ForSession,
) -> Result<Response, ApiError> {
    let core = state.core.clone();
    let stopped = crate::service::detached(async move { core.stop(&id).await }).await?;
    Ok(Json(stopped).into_response())
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/start", tag = "sessions", params(SessionId),
    responses((status = 200, description = "The session, running", body = SessionView))
)]
pub(crate) async fn start(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: ForSession,
) -> Result<Response, ApiError> {
    let core = state.core.clone();
    let woken = id.clone();
    crate::service::detached(async move { core.wake(&woken).await }).await?;
    Ok(Json(state.core.get(&id, false).await?).into_response())
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/pause", tag = "sessions", params(SessionId),
    responses((status = 200, description = "The session, asleep with its processes and memory (a checkpoint of its gVisor sandbox); one already asleep is shown as it is. Refused (409 `pause_refused`) when its runtime's isolation is not gvisor, its container is a warm pool's, or the checkpoint failed: the message says what the session was left with", body = SessionView))
)]
pub(crate) async fn pause(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: ForSession,
) -> Result<Response, ApiError> {
    let core = state.core.clone();
    let paused = crate::service::detached(async move { core.pause(&id).await }).await?;
    Ok(Json(paused).into_response())
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/resume", tag = "sessions", params(SessionId),
    responses((status = 200, description = "The session, running: restored with its memory when its sleep kept it, else started with its files (as `start`)", body = SessionView))
)]
pub(crate) async fn resume(
    state: State<AppState>,
    id: Path<String>,
    caller: ForSession,
) -> Result<Response, ApiError> {
    start(state, id, caller).await
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/reclaim", tag = "sessions", params(SessionId),
    responses((status = 200, description = "The session, its container removed (the workspace kept)", body = SessionView))
)]
pub(crate) async fn reclaim(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: ForSession,
) -> Result<Response, ApiError> {
    let core = state.core.clone();
    let reclaimed = crate::service::detached(async move { core.reclaim(&id).await }).await?;
    Ok(Json(reclaimed).into_response())
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/rebuild", tag = "sessions", params(SessionId),
    request_body = RebuildRequest,
    responses((status = 200, description = "The session rebuilt: running on a new container of its runtime's current image if it ran, else without a container (its next wake makes one); the workspace kept", body = SessionView))
)]
pub(crate) async fn rebuild(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: Admin,
    who: Actor,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: RebuildRequest = if body.is_empty() {
        RebuildRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("invalid rebuild request: {e}")))?
    };
    let core = state.core.clone();
    let rebuilt =
        crate::service::detached(async move { core.rebuild(&id, req, &who).await }).await?;
    Ok(Json(rebuilt).into_response())
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/token", tag = "sessions", params(SessionId, OwnerQuery),
    responses((status = 200, description = "A new session token; the old one no longer works", body = TokenRotated))
)]
pub(crate) async fn rotate_token(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<OwnerQuery>,
    _: Admin,
) -> Result<Response, ApiError> {
    let token = state.core.rotate_token_as(&id, q.owner.as_deref()).await?;
    Ok(Json(TokenRotated { id, token }).into_response())
}

/// The body of `GET /v1/sessions`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct SessionList {
    /// Every session of this host.
    sessions: Vec<crate::service::SessionView>,
}

/// The body of `POST /v1/sessions/{id}/token`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct TokenRotated {
    /// The session.
    id: String,
    /// Its new token.
    token: String,
}
