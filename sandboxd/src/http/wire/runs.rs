//! Runs: a command in a session, and stopping one.

use super::*;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::AppState;
use crate::service::RunRequest as CoreRun;

/// `RunRequest`: the body of `POST /sessions/{session_id}/run`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct WireRun {
    /// The program and its arguments, run as they are (no shell).
    #[schema(min_items = 1)]
    argv: Vec<String>,
    /// Environment variables added for this run.
    #[serde(default)]
    env: Option<std::collections::HashMap<String, String>>,
    /// Seconds the run may take (rounded up), at most the host's `execute_timeout`.
    #[serde(default)]
    #[schema(exclusive_minimum = 0.0)]
    timeout_seconds: Option<f64>,
    /// The caller's id of the run, which `POST /sessions/{session_id}/runs/{run_id}/stop` names.
    #[schema(pattern = "^[0-9a-f]{32}$")]
    run_id: String,
}

/// `RunResult`: how a run ended and what it wrote.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct RunResult {
    /// What it wrote to stdout (cut at the output limit).
    pub stdout: String,
    /// What it wrote to stderr (cut at the output limit).
    pub stderr: String,
    /// Its exit status; `null` when it timed out or its output was cut.
    pub exit_code: Option<i64>,
    /// Whether it ran out of time and was killed.
    pub timed_out: bool,
    /// Whether its output went over the limit and was cut.
    pub output_limited: bool,
    /// The limit, bytes per stream, when its output was cut.
    pub output_limit: Option<u64>,
}

/// Whether `s` is a run id of the protocol: 32 lowercase hex digits (a uuid4's hex).
pub(super) fn valid_run_id(s: &str) -> bool {
    s.len() == 32 && s.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
}

/// One word for POSIX `sh`, quoted unless it is plainly safe (as Python's `shlex.quote`).
pub fn sh_quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "@%+=:,./_-".contains(c))
    {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r#"'"'"'"#))
    }
}

/// The argv as one `sh` command line (as Python's `shlex.join`).
pub fn sh_join(argv: &[String]) -> String {
    argv.iter()
        .map(|w| sh_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

#[utoipa::path(
    post, path = "/sessions/{session_id}/run", tag = "runs", params(crate::http::wire::openapi::SessionIdParam),
    request_body = WireRun,
    responses((status = 200, description = "The run ended (exited, timed out or was stopped)", body = RunResult))
)]
pub(crate) async fn run(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: WireSession,
    actor: Actor,
    raw: Bytes,
) -> WireResult {
    let req: WireRun = body(&raw)?;
    if req.argv.is_empty() {
        return Err(WireError::invalid(
            &["body", "argv"],
            "too_short",
            "List should have at least 1 item after validation, not 0",
        ));
    }
    if !valid_run_id(&req.run_id) {
        return Err(WireError::invalid(
            &["body", "run_id"],
            "string_pattern_mismatch",
            "String should match pattern '^[0-9a-f]{32}$'",
        ));
    }
    let timeout = match req.timeout_seconds {
        None => None,
        Some(t) if t > 0.0 && t.is_finite() => Some(t.ceil() as u64),
        Some(_) => {
            return Err(WireError::invalid(
                &["body", "timeout_seconds"],
                "greater_than",
                "Input should be greater than 0",
            ));
        }
    };
    let target = sh_join(&req.argv);
    // The argv passed through literally: `exec` replaces the shell with the program, so a
    // missing one is the shell's 127 and the exit status is the program's own.
    let command = format!("exec {target}");
    let started = Instant::now();
    let result = state
        .core
        .run(
            &id,
            CoreRun {
                command,
                timeout_seconds: timeout,
                env: req.env,
                run_id: Some(req.run_id),
            },
            None,
            None,
        )
        .await;
    crate::http::audited::record_run(&state.core, &id, &actor, &target, &result, started);
    let o = result.map_err(|e| WireError::from_core(&id, e))?;
    let limited = o.truncated && !o.timed_out;
    let limit = state.core.policy().max_output_bytes;
    Ok(Json(RunResult {
        stdout: o.stdout,
        stderr: o.stderr,
        exit_code: if o.timed_out || limited {
            None
        } else {
            Some(o.exit_code)
        },
        timed_out: o.timed_out,
        output_limited: limited,
        output_limit: limited.then_some(limit),
    })
    .into_response())
}

#[utoipa::path(
    post, path = "/sessions/{session_id}/runs/{run_id}/stop", tag = "runs",
    params(crate::http::wire::openapi::SessionIdParam, crate::http::wire::openapi::RunIdParam),
    responses((status = 204, description = "Stopped, or nothing to stop (it ended, or never ran)"))
)]
pub(crate) async fn stop_run(
    State(state): State<AppState>,
    Path((id, run_id)): Path<(String, String)>,
    _: WireSession,
) -> WireResult {
    if !valid_run_id(&run_id) {
        return Err(WireError::invalid(
            &["path", "run_id"],
            "string_pattern_mismatch",
            "String should match pattern '^[0-9a-f]{32}$'",
        ));
    }
    // A run that already finished has nothing to stop: that is a success.
    let _ = state.core.stop_run(&id, &run_id);
    Ok(no_content())
}
