//! Files of a session's workspace: read, write (streamed to the disk), remove, mkdir, ls, tree.

use super::*;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::openapi::{FilePath, SessionId};
use crate::http::audited::{Unfinished as _, blocking, held_body};
use crate::http::error::{ApiError, ErrorCode};
use crate::http::openapi::Binary;
use crate::storage::audit::Op;
use crate::workspace::{MAX_LIST_ENTRIES, TreeLimits};

/// What part of a file a read returns.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ReadQuery {
    /// The first byte (past the end: nothing, at the end).
    #[serde(default)]
    offset: u64,
    /// Bytes at most (and at most the policy's `max_read_bytes`).
    #[serde(default)]
    limit: Option<u64>,
}

/// Whether a remove takes a folder with what it holds.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct RemoveQuery {
    /// Remove a non-empty folder with its contents.
    #[serde(default)]
    recursive: bool,
}

#[utoipa::path(
    get, path = "/v1/sessions/{id}/files/{path}", tag = "files", params(SessionId, FilePath, ReadQuery),
    responses((status = 200, description = "The bytes `[offset, offset + limit)` of the file; `x-file-size` is the whole file's size, `x-file-offset` where the bytes start",
        body = Binary, content_type = "application/octet-stream",
        headers(("x-file-size" = u64, description = "The size of the whole file"), ("x-file-offset" = u64, description = "Where the bytes start"))))
)]
pub(crate) async fn read_file(
    State(state): State<AppState>,
    Path((id, path)): Path<(String, String)>,
    Query(q): Query<ReadQuery>,
    _: ForSession,
    actor: Actor,
) -> Result<Response, ApiError> {
    let audited = Audited::new(&state.core, &id, &actor, Op::Read, &path);
    let ws = state.core.files(&id).await?;
    let max = state.core.policy().max_read_bytes;
    let p = path.clone();
    let (read, held) = audited
        .blocking_held(
            move || ws.read(&p, q.offset, q.limit, max),
            |r| i64::try_from(r.data.len()).ok(),
            ApiError::from,
        )
        .await?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, read.data.len().to_string()),
            (
                header::HeaderName::from_static("x-file-size"),
                read.size.to_string(),
            ),
            (
                header::HeaderName::from_static("x-file-offset"),
                read.offset.to_string(),
            ),
        ],
        held_body(read.data, held),
    )
        .into_response())
}

/// How much of a write's body is gathered before it goes to the disk.
pub(super) const WRITE_BATCH: usize = 1024 * 1024;

/// Writes the body as it arrives (no buffering of the whole of it): every MiB received goes to
/// the temporary file on a blocking thread while the next is received (no thread waits on a
/// slow client), and the file is put in place once the body is complete. A body that breaks
/// off or passes [`MAX_WRITE_BYTES`] leaves the file as it was.
#[utoipa::path(
    put, path = "/v1/sessions/{id}/files/{path}", tag = "files", params(SessionId, FilePath),
    request_body(content = Binary, content_type = "application/octet-stream", description = "The file's new content (at most 256 MiB)"),
    responses((status = 200, description = "Written: the file was replaced whole", body = Written))
)]
pub(crate) async fn write_file(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, path)): Path<(String, String)>,
    _: ForSession,
    actor: Actor,
    body: Body,
) -> Result<Response, ApiError> {
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_WRITE_BYTES as u64) {
        return Err(write_too_large());
    }
    let audited = Audited::new(&state.core, &id, &actor, Op::Write, &path);
    let ws = state.core.files(&id).await?;
    // A write holds at most a batch being received and one being written.
    let _held = state
        .core
        .file_work()
        .memory()
        .reserve(&id, 2 * WRITE_BATCH as u64, false)
        .map_err(|why| ApiError::new(503, ErrorCode::MemoryBusy, why))?;
    let p = path.clone();
    let written = match blocking(&state.core, &id, move || ws.begin_write(&p), ApiError::from).await
    {
        Ok(pending) => stream_to(&state.core, &id, pending, body).await,
        Err(e) => Err(e),
    };
    audited.record(&written, |w| i64::try_from(w.size).ok());
    let written = written?;
    Ok(Json(Written {
        path,
        size: written.size,
    })
    .into_response())
}

pub(super) fn write_too_large() -> ApiError {
    ApiError::new(
        413,
        ErrorCode::TooLarge,
        format!("a file write takes at most {MAX_WRITE_BYTES} bytes"),
    )
}

/// Appends `body` to a pending write, one batch on the disk while the next arrives, and puts
/// the file in place. On any failure the pending write is dropped, and its temporary file
/// with it.
pub(super) async fn stream_to(
    core: &crate::service::Core,
    id: &str,
    pending: crate::workspace::PendingWrite,
    body: Body,
) -> Result<crate::workspace::WriteResult, ApiError> {
    type Writing = tokio::task::JoinHandle<Result<crate::workspace::PendingWrite, ApiError>>;
    fn write(mut pending: crate::workspace::PendingWrite, batch: Vec<Bytes>) -> Writing {
        tokio::task::spawn_blocking(move || {
            for b in &batch {
                pending.write_all(b)?;
            }
            Ok(pending)
        })
    }
    async fn finished(writing: Writing) -> Result<crate::workspace::PendingWrite, ApiError> {
        writing.await.map_err(ApiError::unfinished)?
    }
    let mut writing = write(pending, Vec::new());
    let mut batch = Vec::new();
    let (mut batched, mut received) = (0usize, 0usize);
    let mut body = body.into_data_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::bad_request(format!("the body broke off after {received} bytes: {e}"))
        })?;
        received += chunk.len();
        if received > MAX_WRITE_BYTES {
            return Err(write_too_large());
        }
        batched += chunk.len();
        batch.push(chunk);
        if batched >= WRITE_BATCH {
            let pending = finished(writing).await?;
            writing = write(pending, std::mem::take(&mut batch));
            batched = 0;
        }
    }
    let pending = finished(writing).await?;
    blocking(
        core,
        id,
        move || {
            let mut pending = pending;
            for b in &batch {
                pending.write_all(b)?;
            }
            pending.commit()
        },
        ApiError::from,
    )
    .await
}

#[utoipa::path(
    delete, path = "/v1/sessions/{id}/files/{path}", tag = "files", params(SessionId, FilePath, RemoveQuery),
    responses((status = 200, description = "Removed", body = Removed))
)]
pub(crate) async fn remove_file(
    State(state): State<AppState>,
    Path((id, path)): Path<(String, String)>,
    Query(q): Query<RemoveQuery>,
    _: ForSession,
    actor: Actor,
) -> Result<Response, ApiError> {
    let audited = Audited::new(&state.core, &id, &actor, Op::Remove, &path);
    let ws = state.core.files(&id).await?;
    let p = path.clone();
    audited
        .blocking(move || ws.remove(&p, q.recursive), |_| None, ApiError::from)
        .await?;
    Ok(Json(Removed {
        path,
        removed: true,
    })
    .into_response())
}

/// The body of a mkdir.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct MkdirRequest {
    /// The folder, relative to the workspace; its parents are made too.
    path: String,
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/mkdir", tag = "files", params(SessionId),
    request_body = MkdirRequest,
    responses((status = 201, description = "The folder exists (made with its parents)", body = Made))
)]
pub(crate) async fn mkdir(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: ForSession,
    actor: Actor,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: MkdirRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid mkdir request: {e}")))?;
    let audited = Audited::new(&state.core, &id, &actor, Op::Mkdir, &req.path);
    let ws = state.core.files(&id).await?;
    let p = req.path.clone();
    audited
        .blocking(move || ws.mkdir(&p), |_| None, ApiError::from)
        .await?;
    Ok((StatusCode::CREATED, Json(Made { path: req.path })).into_response())
}

/// `?path=`: a folder of the workspace.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct PathQuery {
    /// The folder, relative to the workspace root (empty: the root).
    #[serde(default)]
    path: String,
}

#[utoipa::path(
    get, path = "/v1/sessions/{id}/ls", tag = "files", params(SessionId, PathQuery),
    responses((status = 200, description = "One folder's entries", body = LsResponse))
)]
pub(crate) async fn ls(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    _: ForSession,
    actor: Actor,
) -> Result<Response, ApiError> {
    let audited = Audited::new(&state.core, &id, &actor, Op::Ls, &q.path);
    let ws = state.core.files(&id).await?;
    let p = q.path.clone();
    let listed = audited
        .blocking(
            move || ws.list(&p, MAX_LIST_ENTRIES),
            |_| None,
            ApiError::from,
        )
        .await?;
    Ok(Json(LsResponse {
        path: q.path,
        entries: listed.entries,
        truncated: listed.truncated,
        max_entries: MAX_LIST_ENTRIES,
    })
    .into_response())
}

#[utoipa::path(
    get, path = "/v1/sessions/{id}/tree", tag = "files", params(SessionId, PathQuery),
    responses((status = 200, description = "The tree below a folder, breadth-first, bounded", body = crate::workspace::Tree))
)]
pub(crate) async fn tree(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    _: ForSession,
    actor: Actor,
) -> Result<Response, ApiError> {
    let audited = Audited::new(&state.core, &id, &actor, Op::Ls, &q.path);
    let ws = state.core.files(&id).await?;
    let p = q.path.clone();
    let tree = audited
        .blocking(
            move || ws.tree(&p, TreeLimits::default()),
            |_| None,
            ApiError::from,
        )
        .await?;
    Ok(Json(tree).into_response())
}

/// The body of a file write.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Written {
    /// The path, as requested.
    path: String,
    /// The size of the file written.
    size: u64,
}

/// The body of a file remove.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Removed {
    /// The path, as requested.
    path: String,
    /// Always true.
    removed: bool,
}

/// The body of a mkdir.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Made {
    /// The folder, as requested.
    path: String,
}

/// The body of `GET /v1/sessions/{id}/ls`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct LsResponse {
    /// The folder, as requested.
    path: String,
    /// Its entries, sorted by name.
    entries: Vec<crate::workspace::Entry>,
    /// It holds more entries than `max_entries`.
    truncated: bool,
    /// The most entries listed.
    max_entries: usize,
}
