//! The wire protocol of pydantic-ai-backend's sandboxd, served beside `/v1` over the same core.
//!
//! The seed platform and every Pydantic AI agent reach a sandboxd through the client in the
//! Python package `pydantic-ai-backend` (`SandboxdWorkspaceBackend`, `WorkspaceArchive`). This
//! module speaks that protocol at the release pinned in `hack/versions.env`
//! (`PYDANTIC_AI_BACKEND_VERSION`, reported in the index), so such a client works against this
//! daemon by changing one URL. It is a thin surface: sessions, runs, files, caps, tokens, audit
//! and isolation are the [`Core`](crate::service::Core)'s, exactly as for `/v1`.
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

mod errors;
mod files;
mod index;
pub mod openapi;
mod policy;
mod runs;
mod sessions;
mod tokens;
mod workspaces;

pub use errors::*;
pub use files::*;
pub use index::*;
pub use policy::*;
pub use runs::*;
pub use sessions::*;
pub(crate) use tokens::*;
pub use workspaces::*;

use axum::Json;
use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use serde::de::DeserializeOwned;

use crate::http::AppState;
use crate::http::audited::{Audited, blocking};
use crate::service::Actor;
use crate::storage::audit::Op;
use crate::workspace::MAX_LIST_ENTRIES;

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
/// with `/v1` and listed there); a test holds them to the router ([`paths`]).
pub const ROUTES: &[&str] = &[
    "GET /policy",
    "PUT /policy",
    "GET /sessions",
    "POST /sessions",
    "GET /sessions/{session_id}",
    "DELETE /sessions/{session_id}",
    "GET /sessions/{session_id}/events",
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
/// session). The index and health are the service's ([`sandboxd_api::routes::PUBLIC_ROUTES`]).
pub const PUBLIC_ROUTES: &[&str] = &["/wire/openapi.json"];

/// The pydantic-ai-backend release this surface serves, read from `hack/versions.env`.
pub fn release() -> &'static str {
    VERSIONS_ENV
        .lines()
        .find_map(|l| l.trim().strip_prefix("PYDANTIC_AI_BACKEND_VERSION="))
        .map_or("unknown", str::trim)
}

/// Every path of the protocol and what serves it, from which [`crate::http::router`] builds
/// the protocol's routes beside `/v1`'s (the index and health are `/v1`'s, which carry the
/// protocol's fields too). A test sends every method of every path of it through that router
/// to check that it serves exactly [`ROUTES`].
pub(crate) fn paths() -> Vec<(&'static str, MethodRouter<AppState>)> {
    vec![
        ("/policy", get(get_policy).put(put_policy)),
        ("/sessions", get(list_sessions).post(create_session)),
        (
            "/sessions/{session_id}",
            get(get_session).delete(delete_session),
        ),
        ("/sessions/{session_id}/events", get(session_events)),
        ("/sessions/{session_id}/run", post(run)),
        ("/sessions/{session_id}/runs/{run_id}/stop", post(stop_run)),
        ("/sessions/{session_id}/files/read", post(file_read)),
        ("/sessions/{session_id}/files/write", post(file_write)),
        ("/sessions/{session_id}/files/stat", post(file_stat)),
        ("/sessions/{session_id}/files/realpath", post(file_realpath)),
        ("/sessions/{session_id}/files/list", post(file_list)),
        ("/sessions/{session_id}/files/mkdir", post(file_mkdir)),
        ("/sessions/{session_id}/files/remove", post(file_remove)),
        ("/workspaces/trees", post(archive_trees)),
        ("/workspaces/{session_id}/ls", post(archive_ls)),
        ("/workspaces/{session_id}/tree", post(archive_tree)),
        ("/workspaces/{session_id}/read", post(archive_read)),
        (
            "/workspaces/{session_id}/read_bytes",
            post(archive_read_bytes),
        ),
        (
            "/wire/openapi.json",
            get(crate::http::wire::openapi::openapi_json),
        ),
    ]
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::ServiceError;
    use serde_json::json;

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
        let e = WireError::from_core("x", ServiceError::HostCap { held: 20, max: 20 });
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
