//! Snapshots of sessions' workspaces in the object store: taken of a session, shown and
//! deleted by key (`{scope}/{name}`); restored by an open's `from_snapshot`. Admin only: a
//! snapshot's scope is the namespace the operator keeps it under, which no session token may
//! choose.

use super::*;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::openapi::SessionId;
use crate::http::error::ApiError;
use crate::service::snapshots::key_of;
use sandboxd_api::session::{SnapshotRequest, SnapshotView};

#[utoipa::path(
    post, path = "/v1/sessions/{id}/snapshots", tag = "snapshots", params(SessionId),
    request_body = SnapshotRequest,
    responses((status = 201, description = "The snapshot, written whole (its manifest last): a running sandbox was paused while its files were read", body = SnapshotView))
)]
pub(crate) async fn take_snapshot(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: Admin,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: SnapshotRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid snapshot request: {e}")))?;
    let core = state.core.clone();
    let taken =
        crate::service::detached(async move { core.take_snapshot(&id, &req).await }).await?;
    Ok((StatusCode::CREATED, Json(taken)).into_response())
}

/// The scope and name of a snapshot in a path.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct SnapshotKey {
    /// Its scope (the operator: the namespace).
    scope: String,
    /// Its name.
    name: String,
}

#[utoipa::path(
    get, path = "/v1/snapshots/{scope}/{name}", tag = "snapshots", params(SnapshotKey),
    responses((status = 200, description = "The snapshot as the store holds it", body = SnapshotView))
)]
pub(crate) async fn show_snapshot(
    State(state): State<AppState>,
    Path(k): Path<SnapshotKey>,
    _: Admin,
) -> Result<Response, ApiError> {
    let key = key_of(&k.scope, &k.name)?;
    Ok(Json(state.core.show_snapshot(&key).await?).into_response())
}

#[utoipa::path(
    delete, path = "/v1/snapshots/{scope}/{name}", tag = "snapshots", params(SnapshotKey),
    responses((status = 204, description = "Deleted (or there was none); the chunks no other snapshot needs are collected after the grace"))
)]
pub(crate) async fn delete_snapshot(
    State(state): State<AppState>,
    Path(k): Path<SnapshotKey>,
    _: Admin,
) -> Result<Response, ApiError> {
    let key = key_of(&k.scope, &k.name)?;
    let core = state.core.clone();
    crate::service::detached(async move { core.delete_snapshot(&key).await }).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
