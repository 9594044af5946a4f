//! The audit log as `GET /v1/operations` shows it: the operation kinds, a row, the filters and
//! one page; and a session's activity feed (`GET /v1/sessions/{id}/events` and the wire
//! protocol's `GET /sessions/{session_id}/events`), the same rows in the wire protocol's shape.

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
    /// The session's container recreated from its runtime's current image (the workspace
    /// kept); the target is the image.
    Rebuild,
    /// The session's egress credentials replaced (`PUT /v1/sessions/{id}/credentials`); the
    /// target names the set's version and each credential's host, ports, header and source,
    /// never a value.
    Credentials,
    /// A sleep of a gvisor session written as a checkpoint of its processes and memory; failed:
    /// it slept without them (the reason in `target`).
    Checkpoint,
    /// A wake of a gvisor session from its checkpoint; failed: it woke fresh with its files
    /// (the reason in `target`).
    Restore,
    /// A terminal opened (the target: its id and program) or ended (its id, how it ended and
    /// the bytes typed and printed; `bytes` their sum, `exit_code` its program's).
    Terminal,
    /// A connection to an open port of the sandbox (the target: the port and the route it
    /// came through).
    Port,
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
            Op::Rebuild => "rebuild",
            Op::Credentials => "credentials",
            Op::Checkpoint => "checkpoint",
            Op::Restore => "restore",
            Op::Terminal => "terminal",
            Op::Port => "port",
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
            "rebuild" => Op::Rebuild,
            "credentials" => Op::Credentials,
            "checkpoint" => Op::Checkpoint,
            "restore" => Op::Restore,
            "terminal" => Op::Terminal,
            "port" => Op::Port,
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
    /// read, write, ls, mkdir, remove, execute, rebuild or credentials.
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
    /// The incarnation of the session the row belongs to: made anew each time a session of
    /// this id is opened from nothing, so rows of an earlier holder of the id are told apart.
    /// Absent for rows written before incarnations were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<String>,
    /// Whether a field was cut at its cap (target, agent, run or error; see `docs/sandboxd.md`).
    #[serde(default)]
    pub truncated: bool,
    /// Whether `agent` and `run` are labels the caller supplied (`X-Sandbox-Agent`,
    /// `X-Sandbox-Run`): sandboxd records them as said and checks nothing about them.
    #[serde(default)]
    pub caller_labels: bool,
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
    /// Only this incarnation of the session (admin token; a session token always sees only
    /// its own incarnation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<String>,
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

/// Events one feed answer holds at most: the newest of those after `after` (the wire
/// protocol's service keeps this many per session).
pub const EVENTS_PAGE: u32 = 200;

/// The longest target an event shows, in characters; a longer one is cut and marked with `…`
/// (as the wire protocol's service cuts it).
pub const EVENT_TARGET_CHARS: usize = 200;

/// One entry of a session's activity feed: what was done and how it went, never file contents
/// or command output (the wire protocol's `SessionEvent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionEvent {
    /// Sequence number, monotonic per session (per incarnation), from 1: pass the highest
    /// seen back as `after`.
    pub seq: i64,
    /// When it ended, seconds since the epoch.
    pub at: f64,
    /// `run` (a command), `read`, `write`, `ls`, `mkdir` or `remove`.
    pub op: String,
    /// The command or path, cut at [`EVENT_TARGET_CHARS`] characters and marked with `…`.
    pub target: String,
    /// Whether it succeeded (a command: exit status 0).
    pub ok: bool,
    /// A short outcome: `exit 0`, `timed out`, `not found`, or empty for a file operation
    /// that succeeded.
    #[serde(default)]
    pub detail: String,
    /// How long it took, in milliseconds.
    #[serde(default)]
    pub duration_ms: f64,
}

/// A slice of a session's activity feed, newest last (the wire protocol's `SessionEvents`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionEvents {
    /// The events after `after`, oldest first: the newest [`EVENTS_PAGE`] of them at most.
    #[serde(default)]
    pub events: Vec<SessionEvent>,
    /// The highest sequence number the session has; pass it back as `after`.
    #[serde(default)]
    pub latest_seq: i64,
}

/// The name of an operation in the feed: the wire protocol calls a command `run`.
pub fn event_op(op: Op) -> &'static str {
    match op {
        Op::Execute => "run",
        other => other.as_str(),
    }
}

/// The `detail` of an event, as the wire protocol's service words it, from what a row holds:
/// `exit N` (or `timed out`) for a command; for a file operation nothing when it succeeded,
/// else `not found`, the Python exception the protocol names (`IsADirectoryError`, …), `via
/// the sandbox` for what the protocol hands back to the sandbox, or the row's error code.
pub fn event_detail(op: Op, ok: bool, exit_code: Option<i64>, error: Option<&str>) -> String {
    if op == Op::Execute {
        return match (error, exit_code) {
            (Some("timed_out"), _) => "timed out".to_owned(),
            (Some("session_gone" | "session_lost"), _) => "sandbox gone".to_owned(),
            (_, Some(code)) => format!("exit {code}"),
            (Some(e), None) => e.to_owned(),
            (None, None) => String::new(),
        };
    }
    if ok {
        return String::new();
    }
    match error.unwrap_or_default() {
        "not_found" => "not found",
        "is_a_directory" => "IsADirectoryError",
        "not_a_directory" => "NotADirectoryError",
        "invalid_path" | "directory_not_empty" | "outside_workspace" => "ValueError",
        "permission_denied" | "not_a_regular_file" | "too_large" => "via the sandbox",
        other => other,
    }
    .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_read_as_the_wire_protocol_words_them() {
        assert_eq!(event_detail(Op::Execute, true, Some(0), None), "exit 0");
        assert_eq!(
            event_detail(Op::Execute, false, Some(3), Some("exit 3")),
            "exit 3"
        );
        assert_eq!(
            event_detail(Op::Execute, false, Some(124), Some("timed_out")),
            "timed out"
        );
        assert_eq!(event_detail(Op::Write, true, None, None), "");
        assert_eq!(
            event_detail(Op::Read, false, None, Some("not_found")),
            "not found"
        );
        assert_eq!(
            event_detail(Op::Read, false, None, Some("is_a_directory")),
            "IsADirectoryError"
        );
        assert_eq!(
            event_detail(Op::Write, false, None, Some("workspace_full")),
            "workspace_full"
        );
        assert_eq!(event_op(Op::Execute), "run");
        assert_eq!(event_op(Op::Ls), "ls");
    }
}

/// The query of `GET /v1/operations/stream`: where to resume.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    /// The `id` of the last row received: the stream goes on with the rows after it. Without
    /// it, the stream starts at the oldest row kept.
    pub after: Option<String>,
}
