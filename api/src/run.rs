//! Runs: the request, the events streamed, the outcome and the state of a run.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// One piece of a run's life, as streamed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RunEvent {
    /// Bytes on stdout (lossy UTF-8).
    Stdout {
        /// The text.
        data: String,
    },
    /// Bytes on stderr (lossy UTF-8).
    Stderr {
        /// The text.
        data: String,
    },
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunOutcome {
    /// The run id.
    pub run_id: String,
    /// Exit status; 124 after a timeout and 137 after a stop, like `timeout(1)` and SIGKILL.
    pub exit_code: i64,
    /// What the command wrote on stdout (capped). A streamed run's outcome leaves it out (its
    /// events carried it).
    #[serde(default)]
    pub stdout: String,
    /// What the command wrote on stderr (capped); left out like `stdout` when streamed.
    #[serde(default)]
    pub stderr: String,
    /// Whether output was cut at the cap.
    pub truncated: bool,
    /// Whether the timeout ended it.
    pub timed_out: bool,
    /// Whether a stop request ended it.
    pub stopped: bool,
    /// Wall time.
    pub duration_ms: u64,
    /// CPU time of the command and the children it waited for, nanoseconds (agent path only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ns: Option<u64>,
}

/// A run as the sandbox's agent knows it: one in flight, or one that finished (also one whose
/// request was lost when sandboxd restarted).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunStatus {
    /// The run id.
    pub run_id: String,
    /// Whether it still runs.
    pub running: bool,
    /// Exit status, once finished.
    pub exit_code: Option<i64>,
    /// Whether the timeout ended it.
    pub timed_out: bool,
    /// Whether a stop ended it.
    pub stopped: bool,
    /// Whether output was cut at the cap.
    pub truncated: bool,
    /// CPU time, nanoseconds, once finished.
    pub cpu_ns: Option<u64>,
    /// Wall time, once finished.
    pub duration_ms: Option<u64>,
    /// Output so far (capped).
    pub stdout: String,
    /// Errors so far (capped).
    pub stderr: String,
}

/// A run request.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// The command, run under POSIX `/bin/sh -c` in /workspace.
    pub command: String,
    /// Timeout in seconds; capped at SANDBOXD_EXECUTE_TIMEOUT.
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    /// Extra environment.
    #[serde(default)]
    pub env: Option<HashMap<String, String>>,
    /// A run id of the caller's; one is made when absent.
    #[serde(default)]
    pub run_id: Option<String>,
}
