//! Native file operations of a live session, off its host directory.

use super::*;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, header};
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::http::AppState;
use crate::http::audited::Coded;
use crate::workspace::{Entry, EntryKind, FileError, MAX_LIST_ENTRIES, Workspace};

/// `PathRequest`: a body naming one path.
#[derive(Debug, Deserialize, ToSchema)]
pub struct PathBody {
    /// The path: in the sandbox (`/workspace/…`, or relative to it) for a native route, in the
    /// stored workspace for a `/workspaces` route.
    pub(super) path: String,
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
pub(super) fn file_error(e: FileError, refuse_outside: bool) -> WireError {
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
        FileError::Stopped { .. } | FileError::Busy { .. } => WireError::new(503, message),
        FileError::Io { .. } => WireError::new(500, message),
    }
}

/// Whether `e` is a symlink loop.
pub(super) fn is_loop(e: &FileError) -> bool {
    matches!(e, FileError::InvalidPath { reason, .. } if reason.starts_with("too many levels of symbolic links"))
}

/// Whether an absolute `path` lies outside the work directory.
pub(super) fn outside_work_dir(path: &str) -> bool {
    path.starts_with('/') && path != WORK_DIR && !path.starts_with(&format!("{WORK_DIR}/"))
}

/// The workspace of session `id` for a native operation (never wakes the container).
pub(super) async fn files(state: &AppState, id: &str) -> WireResult<Workspace> {
    state
        .core
        .files(id)
        .await
        .map_err(|e| WireError::from_core(id, e))
}

/// The workspace of a native operation on session `id` and the path its body names; a path
/// that leads out of the work directory is refused.
pub(super) async fn native(
    state: &AppState,
    id: &str,
    raw: &Bytes,
) -> WireResult<(Workspace, String)> {
    let ws = files(state, id).await?;
    let req: PathBody = body(raw)?;
    refuse_outside(&req.path)?;
    Ok((ws, req.path))
}

pub(super) fn refuse_outside(path: &str) -> WireResult<()> {
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
    Path(id): Path<String>,
    _: WireSession,
    actor: Actor,
    raw: Bytes,
) -> WireResult {
    let (ws, path) = native(&state, &id, &raw).await?;
    let max = state.core.policy().max_read_bytes;
    let p = path.clone();
    let (read, held) = Audited::new(&state.core, &id, &actor, Op::Read, &path)
        .blocking_held(
            move || ws.read(&p, 0, None, max),
            |r| i64::try_from(r.data.len()).ok(),
            |e| file_error(e, true),
        )
        .await?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, read.data.len().to_string()),
        ],
        crate::http::audited::held_body(read.data, held),
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
    _: WireSession,
    actor: Actor,
    body: Body,
) -> WireResult {
    let ws = files(&state, &id).await?;
    let path = q
        .path
        .ok_or_else(|| WireError::invalid(&["query", "path"], "missing", "Field required"))?;
    refuse_outside(&path)?;
    let memory = state.core.file_work().memory();
    let (data, _held) = bounded_body(&headers, body, state.core.policy().max_read_bytes, |n| {
        memory
            .reserve(&id, n, false)
            .map_err(|why| WireError::new(503, why))
    })
    .await?;
    let p = path.clone();
    Audited::new(&state.core, &id, &actor, Op::Write, &path)
        .blocking(
            move || ws.write(&p, &data),
            |w| i64::try_from(w.size).ok(),
            |e| file_error(e, true),
        )
        .await?;
    Ok(no_content())
}

/// A request body of at most `limit` bytes, counted as it arrives (the protocol's
/// `_bounded_body`): a declared length over it is refused before a byte is read, and a body
/// that grows past it as soon as it does, never holding more than `limit`. Over it, the write
/// is the sandbox's (409), and the client writes it there. What it holds comes out of the
/// budget of bytes in flight (`reserve`, in steps of a MiB, or the declared length at once);
/// the reservations come back with the body, to be kept until it is written.
pub(super) async fn bounded_body<H>(
    headers: &HeaderMap,
    body: Body,
    limit: u64,
    reserve: impl Fn(u64) -> WireResult<H>,
) -> WireResult<(Vec<u8>, Vec<H>)> {
    const STEP: u64 = 1 << 20;
    use futures::StreamExt;
    let too_large = || WireError::not_native("larger than a native write");
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut held = Vec::new();
    let mut reserved = 0u64;
    if let Some(n) = declared.filter(|n| *n > 0) {
        held.push(reserve(n)?);
        reserved = n;
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
        let len = (data.len() + chunk.len()) as u64;
        if len > limit {
            return Err(too_large());
        }
        while len > reserved {
            let step = STEP.min(limit - reserved).max(len - reserved);
            held.push(reserve(step)?);
            reserved += step;
        }
        data.extend_from_slice(&chunk);
    }
    Ok((data, held))
}

/// The last component of a path as Python's `PurePosixPath(path).name`.
pub(super) fn base_name(path: &str) -> String {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A `FileEntry` of a native route: `path` as the caller spelled it.
pub(super) fn native_entry(name: String, path: String, e: &Entry) -> FileEntry {
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
    Path(id): Path<String>,
    _: WireSession,
    raw: Bytes,
) -> WireResult {
    let (ws, path) = native(&state, &id, &raw).await?;
    let p = path.clone();
    let entry = blocking(
        &state.core,
        &id,
        move || ws.stat_followed(&p),
        |e| file_error(e, true),
    )
    .await?;
    if !matches!(entry.kind, EntryKind::Dir | EntryKind::File) {
        return Err(WireError::not_native(format!(
            "{} is not a regular file",
            path
        )));
    }
    Ok(Json(native_entry(base_name(&path), path, &entry)).into_response())
}

#[utoipa::path(
    post, path = "/sessions/{session_id}/files/realpath", tag = "files", params(crate::http::wire::openapi::SessionIdParam),
    request_body = PathBody,
    responses((status = 200, description = "Where the path leads", body = RealPath))
)]
pub(crate) async fn file_realpath(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: WireSession,
    raw: Bytes,
) -> WireResult {
    let ws = files(&state, &id).await?;
    let req: PathBody = body(&raw)?;
    if outside_work_dir(&req.path) {
        // Where a path outside the workspace leads is the sandbox's view, not the host's.
        return Err(WireError::not_native(format!(
            "{} is outside the work directory",
            req.path
        )));
    }
    let p = req.path.clone();
    let rel = blocking(
        &state.core,
        &id,
        move || ws.realpath(&p),
        |e| file_error(e, false),
    )
    .await?;
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
    Path(id): Path<String>,
    _: WireSession,
    actor: Actor,
    raw: Bytes,
) -> WireResult {
    let (ws, path) = native(&state, &id, &raw).await?;
    let p = path.clone();
    // The directory itself leading out is refused; a link out inside it makes the listing the
    // sandbox's to describe (409), as only the sandbox sees where it leads.
    let (listed, truncated) = Audited::new(&state.core, &id, &actor, Op::Ls, &path)
        .blocking(
            move || {
                let listing = ws
                    .list_all(&p, MAX_LIST_ENTRIES)
                    .map_err(|e| ListFailure(e, true))?;
                let mut out = Vec::with_capacity(listing.entries.len());
                for e in listing.entries {
                    if e.kind == EntryKind::Symlink {
                        // Each link can cost many lookups: the listing stops at its deadline.
                        if let Some(stop) = crate::workspace::deadline::stopped() {
                            return Err(ListFailure(
                                FileError::Stopped {
                                    path: p.clone(),
                                    stop,
                                },
                                true,
                            ));
                        }
                        match ws.stat_followed(&e.path) {
                            Ok(target) => out.push((e.name, target)),
                            // Dangling, a loop, or not the sandbox user's to follow: an entry
                            // of its own that is no directory, as `test -d` in the sandbox says.
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
                            Err(other) => return Err(ListFailure(other, false)),
                        }
                    } else {
                        out.push((e.name.clone(), e));
                    }
                }
                Ok((out, listing.truncated))
            },
            |_| None,
            |ListFailure(e, refuse)| file_error(e, refuse),
        )
        .await?;
    let base = if path.len() > 1 {
        path.trim_end_matches('/')
    } else {
        path.as_str()
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

/// A native listing's failure, and whether a path out of the workspace is refused (the
/// directory's own) or the sandbox's to describe (an entry's link).
pub(super) struct ListFailure(FileError, bool);

impl Coded for ListFailure {
    fn code(&self) -> String {
        Coded::code(&self.0)
    }
}

#[utoipa::path(
    post, path = "/sessions/{session_id}/files/mkdir", tag = "files", params(crate::http::wire::openapi::SessionIdParam),
    request_body = PathBody,
    responses((status = 204, description = "Made (with its parents), or there already"))
)]
pub(crate) async fn file_mkdir(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: WireSession,
    actor: Actor,
    raw: Bytes,
) -> WireResult {
    let (ws, path) = native(&state, &id, &raw).await?;
    let p = path.clone();
    Audited::new(&state.core, &id, &actor, Op::Mkdir, &path)
        .blocking(
            move || match ws.mkdir(&p) {
                // A file where the new directory goes is "exists"; one on the way "not a
                // directory".
                Err(FileError::NotADirectory { path }) => match ws.stat(&p) {
                    Ok(e) if e.kind != EntryKind::Dir => Err(FileError::Io {
                        path,
                        source: std::io::ErrorKind::AlreadyExists.into(),
                    }),
                    _ => Err(FileError::NotADirectory { path }),
                },
                other => other,
            },
            |_| None,
            |e| match e {
                FileError::Io { path, source }
                    if source.kind() == std::io::ErrorKind::AlreadyExists =>
                {
                    WireError::path(
                        400,
                        "FileExistsError",
                        format!("'{path}' exists and is not a directory"),
                    )
                }
                e => file_error(e, true),
            },
        )
        .await?;
    Ok(no_content())
}

#[utoipa::path(
    post, path = "/sessions/{session_id}/files/remove", tag = "files", params(crate::http::wire::openapi::SessionIdParam),
    request_body = PathBody,
    responses((status = 204, description = "Removed (a directory with what it holds)"))
)]
pub(crate) async fn file_remove(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: WireSession,
    actor: Actor,
    raw: Bytes,
) -> WireResult {
    let (ws, path) = native(&state, &id, &raw).await?;
    let p = path.clone();
    Audited::new(&state.core, &id, &actor, Op::Remove, &path)
        .blocking(
            move || ws.remove(&p, true),
            |_| None,
            |e| file_error(e, true),
        )
        .await?;
    Ok(no_content())
}
