//! Errors in the protocol's shape: `{"detail": …}`, a sentence, a list of problems (422), or
//! for a native file operation the Python exception the client raises.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::service::ServiceError;

/// An error as the protocol answers it: a status and `{"detail": ...}`.
#[derive(Debug, Clone, PartialEq)]
pub struct WireError {
    pub(super) status: u16,
    pub(super) detail: Detail,
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
    pub(crate) fn new(status: u16, detail: impl Into<String>) -> Self {
        Self {
            status,
            detail: Detail::Message(detail.into()),
        }
    }

    pub(super) fn unauthorized() -> Self {
        Self::new(401, "Invalid or missing sandbox token")
    }

    pub(super) fn no_such_session(id: &str) -> Self {
        Self::new(404, format!("No such session: {id}"))
    }

    pub(super) fn gone(id: &str) -> Self {
        Self::new(
            410,
            format!("The sandbox of session {id} is gone, and its files with it"),
        )
    }

    /// A native file operation's error: the Python exception the client raises, by name.
    pub(super) fn path(status: u16, error: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            detail: Detail::Exception(FileException {
                error: error.to_owned(),
                message: message.into(),
            }),
        }
    }

    /// A path only the sandbox can resolve: the client takes its shell path.
    pub(super) fn not_native(message: impl Into<String>) -> Self {
        Self::new(409, message)
    }

    /// 422 with the list of problems, as a request failing validation.
    pub(super) fn invalid(loc: &[&str], kind: &str, msg: impl Into<String>) -> Self {
        Self {
            status: 422,
            detail: Detail::Invalid(vec![Problem {
                kind: kind.to_owned(),
                loc: loc.iter().map(|l| (*l).to_owned()).collect(),
                msg: msg.into(),
            }]),
        }
    }

    /// A core error on session `id` in the protocol's words; any other keeps the `/v1` API's
    /// status and its message.
    pub(super) fn from_core(id: &str, e: ServiceError) -> Self {
        match e {
            ServiceError::NoSuchSession { .. } => Self::no_such_session(id),
            e if e.is_gone() => Self::gone(id),
            // The core's words carry the count; the protocol's name the ceiling.
            ServiceError::HostCap { max, .. } => Self::new(
                429,
                format!(
                    "Session limit of {max} reached. Release an idle session before opening another."
                ),
            ),
            e => Self::new(e.status_and_code().0, e.to_string()),
        }
    }
}

impl crate::http::audited::Unfinished for WireError {
    fn unfinished(e: tokio::task::JoinError) -> Self {
        Self::new(500, e.to_string())
    }

    fn busy(e: crate::service::work::Busy) -> Self {
        Self::new(503, e.to_string())
    }

    fn overdue(stop: crate::workspace::deadline::Stop) -> Self {
        Self::new(503, format!("the file operation was stopped: {stop}"))
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

pub(super) type WireResult<T = Response> = Result<T, WireError>;
