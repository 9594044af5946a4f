//! Sessions: list, open, show, destroy, stop, start, reclaim and the rotation of a session's
//! token.

use super::*;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::http::error::ApiError;
use crate::http::openapi::SessionId;
use crate::service::{Destroyed, OpenRequest, Opened, SessionView};

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
    get, path = "/v1/sessions/{id}", tag = "sessions", params(SessionId),
    responses((status = 200, description = "The session", body = SessionView))
)]
pub(crate) async fn show(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: ForSession,
) -> Result<Response, ApiError> {
    Ok(Json(state.core.get(&id).await?).into_response())
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
    Ok(Json(state.core.get(&id).await?).into_response())
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
