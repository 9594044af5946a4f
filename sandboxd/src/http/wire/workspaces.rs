//! Stored workspaces, read without a container (service token only): ls, tree, trees, read and
//! read_bytes.

use super::*;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::IntoResponse;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::AppState;
use crate::workspace::{
    Entry, EntryKind, FileError, ListRules, MAX_LIST_ENTRIES, TreeLimits, TreeOptions, Workspace,
};

/// A path of an archive request relative to the workspace: `/workspace/x` is `x`, any other
/// absolute path is read inside the workspace (`/etc/passwd` is `etc/passwd`), and a `..`
/// that climbs out is refused.
pub(super) fn archive_path(path: &str) -> WireResult<String> {
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
pub(super) async fn stored(state: &AppState, id: &str) -> WireResult<(Workspace, bool)> {
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

pub(super) fn archive_error(e: FileError, path: &str, what: &str) -> WireError {
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
pub(super) fn archive_entry(e: &Entry) -> FileEntry {
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

pub(super) fn dot() -> String {
    ".".into()
}
pub(super) fn six() -> i64 {
    6
}
pub(super) fn two_thousand() -> i64 {
    2000
}

pub(super) fn tree_bounds(max_depth: i64, max_entries: i64) -> WireResult<TreeLimits> {
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
    Ok(TreeLimits {
        max_depth: max_depth as usize,
        max_entries: max_entries as usize,
    })
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
    Path(id): Path<String>,
    _: Service,
    actor: Actor,
    raw: Bytes,
) -> WireResult {
    let (ws, known) = stored(&state, &id).await?;
    let req: PathBody = body(&raw)?;
    let rel = archive_path(&req.path)?;
    let listed = Audited::new(&state.core, &id, &actor, Op::Ls, &req.path)
        .recorded_if(known)
        .blocking(
            move || ws.list_as(&rel, MAX_LIST_ENTRIES, ListRules::ARCHIVE),
            |_| None,
            |e| archive_error(e, &req.path, "directory"),
        )
        .await?;
    Ok(listing_response(
        listed.entries.iter().map(archive_entry).collect(),
        listed.truncated,
    ))
}

/// The walk of session `id`'s stored workspace from `path`, as the protocol's `tree` answers it.
pub(super) async fn tree_of(
    state: &AppState,
    actor: &Actor,
    id: &str,
    path: &str,
    limits: TreeLimits,
) -> WireResult<Tree> {
    let (ws, known) = stored(state, id).await?;
    let rel = archive_path(path)?;
    let walked = Audited::new(&state.core, id, actor, Op::Ls, path)
        .recorded_if(known)
        .blocking(
            move || ws.tree_as(&rel, TreeOptions::archive(limits)),
            |_| None,
            |e| archive_error(e, path, "directory"),
        )
        .await?;
    Ok(Tree {
        entries: walked.entries.iter().map(archive_entry).collect(),
        truncated: walked.incomplete,
    })
}

#[utoipa::path(
    post, path = "/workspaces/{session_id}/tree", tag = "workspaces", params(crate::http::wire::openapi::SessionIdParam),
    request_body = TreeBody,
    responses((status = 200, description = "The walk", body = Tree))
)]
pub(crate) async fn archive_tree(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: Service,
    actor: Actor,
    raw: Bytes,
) -> WireResult {
    let req: TreeBody = body(&raw)?;
    let limits = tree_bounds(req.max_depth, req.max_entries)?;
    Ok(Json(tree_of(&state, &actor, &id, &req.path, limits).await?).into_response())
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
    _: Service,
    actor: Actor,
    raw: Bytes,
) -> WireResult {
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
    let limits = tree_bounds(req.max_depth, req.max_entries)?;
    let mut results = Vec::with_capacity(req.sessions.len());
    for id in &req.sessions {
        results.push(match tree_of(&state, &actor, id, &req.path, limits).await {
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
        });
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

/// The whole of the file at `path` of session `id`'s stored workspace.
pub(super) async fn read_stored(
    state: &AppState,
    actor: &Actor,
    id: &str,
    path: &str,
) -> WireResult<Vec<u8>> {
    let (ws, known) = stored(state, id).await?;
    let rel = archive_path(path)?;
    let max = state.core.policy().max_read_bytes;
    Audited::new(&state.core, id, actor, Op::Read, path)
        .recorded_if(known)
        .blocking(
            // The whole file or nothing: its size, not a slice, is held against the limit.
            move || ws.read(&rel, 0, None, max).map(|r| r.data),
            |d| i64::try_from(d.len()).ok(),
            |e| archive_error(e, path, "file"),
        )
        .await
}

#[utoipa::path(
    post, path = "/workspaces/{session_id}/read", tag = "workspaces", params(crate::http::wire::openapi::SessionIdParam),
    request_body = ReadBody,
    responses((status = 200, description = "Lines of the file", body = Content))
)]
pub(crate) async fn archive_read(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: Service,
    actor: Actor,
    raw: Bytes,
) -> WireResult {
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
    let data = read_stored(&state, &actor, &id, &req.path).await?;
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
    Path(id): Path<String>,
    _: Service,
    actor: Actor,
    raw: Bytes,
) -> WireResult {
    let req: PathBody = body(&raw)?;
    let data = read_stored(&state, &actor, &id, &req.path).await?;
    let encoded = base64::engine::general_purpose::STANDARD.encode(data);
    Ok(Json(ContentB64 {
        content_b64: encoded,
    })
    .into_response())
}
