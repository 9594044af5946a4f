//! The audit log as `GET /v1/operations` shows it: the operation kinds, a row, the filters and
//! one page.

use serde::{Deserialize, Serialize};

/// Rows per page when the query names no limit.
pub const DEFAULT_PAGE: u32 = 100;

/// The page-size ceiling.
pub const MAX_PAGE: u32 = 1000;

/// An operation kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// A file read.
    Read,
    /// A file write.
    Write,
    /// A folder listing (one folder, or a tree).
    Ls,
    /// A folder made.
    Mkdir,
    /// A file or folder removed.
    Remove,
    /// A command run.
    Execute,
}

impl Op {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Ls => "ls",
            Op::Mkdir => "mkdir",
            Op::Remove => "remove",
            Op::Execute => "execute",
        }
    }

    /// The kind of a stored name.
    pub fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "read" => Op::Read,
            "write" => Op::Write,
            "ls" => Op::Ls,
            "mkdir" => Op::Mkdir,
            "remove" => Op::Remove,
            "execute" => Op::Execute,
            _ => return None,
        })
    }
}

/// A stored row, as `GET /v1/operations` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Operation {
    /// The row id (ascending in time of writing).
    pub id: i64,
    /// RFC 3339.
    pub at: String,
    /// The session.
    pub session: String,
    /// Its tenant.
    pub tenant: String,
    /// The agent id, if the request named one.
    #[serde(default)]
    pub agent: Option<String>,
    /// The run id, if the request named one.
    #[serde(default)]
    pub run: Option<String>,
    /// read, write, ls, mkdir, remove or execute.
    pub op: Op,
    /// The path or the command.
    pub target: String,
    /// Whether it succeeded.
    pub ok: bool,
    /// A command's exit status.
    #[serde(default)]
    pub exit_code: Option<i64>,
    /// Our error code when it failed: `exit 2` for a command that exited 2.
    #[serde(default)]
    pub error: Option<String>,
    /// Bytes of a read or write.
    #[serde(default)]
    pub bytes: Option<i64>,
    /// How long it took, in milliseconds.
    pub duration_ms: i64,
}

/// The filters of `GET /v1/operations` (all optional; query parameters of the same names).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OperationQuery {
    /// Only this session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Only this tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Only this agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Only this run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// Only this operation kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<Op>,
    /// Only failed operations.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub failed: bool,
    /// Only targets containing this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q: Option<String>,
    /// The page after this cursor (the `next_cursor` of the page before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// Rows per page: 1 to [`MAX_PAGE`], [`DEFAULT_PAGE`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// One page of operations, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OperationPage {
    /// The rows.
    pub operations: Vec<Operation>,
    /// The cursor of the next (older) page; absent on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}
