//! The errors of the API: every one is `{"code": "...", "message": "..."}` with a fitting status.
//!
//! The service answers with these too (it has no error type of its own yet), and so does the
//! runtimes allowlist; at the crate root so that neither room depends on the other for it.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::workspace::FileError;
pub use sandboxd_api::error::{ErrorBody, ErrorCode};

/// An error with its HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// The stable code.
    pub code: ErrorCode,
    /// The message.
    pub message: String,
}

impl ApiError {
    /// An error with status, code and message.
    pub fn new(status: u16, code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }
    /// 400 `bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, ErrorCode::BadRequest, message)
    }
    /// 401 `unauthorized`: missing or wrong token. Says nothing about what exists.
    pub fn unauthorized() -> Self {
        Self::new(
            401,
            ErrorCode::Unauthorized,
            "a valid token is required: send Authorization: Bearer <token>",
        )
    }
    /// 403 `forbidden`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, ErrorCode::Forbidden, message)
    }
    /// 404 `session_not_found`: the server's own "no such session".
    pub fn no_such_session(id: &str) -> Self {
        Self::new(
            404,
            ErrorCode::SessionNotFound,
            format!("No such session '{id}'"),
        )
    }
    /// 409 `conflict`.
    pub fn conflict(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::new(409, code, message)
    }
    /// 409 `session_opening`: an open of the session is still in flight.
    pub fn opening(id: &str) -> Self {
        Self::conflict(
            ErrorCode::SessionOpening,
            format!("Session '{id}' is still opening"),
        )
    }
    /// 409 `session_destroying`: the session is being destroyed.
    pub fn destroying(id: &str) -> Self {
        Self::conflict(
            ErrorCode::SessionDestroying,
            format!("Session '{id}' is being destroyed"),
        )
    }
    /// 410 `session_lost`: the workspace vanished.
    pub fn lost(id: &str) -> Self {
        Self::new(
            410,
            ErrorCode::SessionLost,
            format!(
                "The workspace of session '{id}' is gone (deleted on the host, expired, or the host was rebuilt); it is not replaced with an empty one. Open a new session"
            ),
        )
    }
    /// 410 `session_gone`: the session was destroyed while a command ran (or as it started):
    /// the environment is gone, the command did not fail by itself.
    pub fn session_gone(id: &str) -> Self {
        Self::new(
            410,
            ErrorCode::SessionGone,
            format!("Session '{id}' was destroyed while the command ran: the session is gone"),
        )
    }
    /// 500 `internal`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, ErrorCode::Internal, message)
    }
    /// 502 `docker_error`.
    pub fn docker(message: impl Into<String>) -> Self {
        Self::new(502, ErrorCode::DockerError, message)
    }
}

impl From<FileError> for ApiError {
    fn from(e: FileError) -> Self {
        Self::new(e.status(), e.code(), e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (
            status,
            Json(ErrorBody {
                code: self.code,
                message: self.message,
            }),
        )
            .into_response()
    }
}
