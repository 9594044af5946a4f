//! Terminals of a session: a login shell (or a command) on a pseudo-terminal in its sandbox,
//! held by the sandbox's agent so it outlives every connection to it. Opening or attaching
//! wakes a sleeping session; typing and output keep it awake; a cap per session and an idle
//! time bound them (see [`TerminalLimits`]).

use super::*;
use std::time::Instant;

use sandbox_agent::proto::{TermExit, TermInfo, TermRequest};
use sandboxd_api::terminal::{Terminal, TerminalRequest, check_size};

use crate::run::terminal::{TermAttach, TermError};
use crate::storage::store::{State, now_ms};

/// Output a terminal keeps for a re-attach: the newest 1 MiB.
pub const SCROLLBACK_BYTES: u64 = 1 << 20;

/// The bounds of terminals (`SANDBOXD_MAX_TERMINALS_PER_SESSION`,
/// `SANDBOXD_TERMINAL_IDLE_TIMEOUT`).
#[derive(Debug, Clone, Copy)]
pub struct TerminalLimits {
    /// Terminals one session may have running.
    pub max_per_session: u32,
    /// How long a terminal may go with no input, no output and nobody attached; zero: for ever.
    pub idle_timeout: Duration,
}

/// A terminal as the API shows it.
pub fn terminal_view(t: TermInfo) -> Terminal {
    Terminal {
        id: t.term_id,
        pid: t.pid,
        argv: t.argv,
        rows: t.rows,
        cols: t.cols,
        running: t.running,
        exit_code: t.exit.as_ref().map(|e| e.exit_code),
        reason: t.exit.map(|e| e.reason),
        attached: t.attached,
        input_bytes: t.input_bytes,
        output_bytes: t.output_bytes,
        idle_seconds: t.idle_ms / 1000,
        age_seconds: t.age_ms / 1000,
    }
}

/// Whether a terminal id is one sandboxd could have made (`term-` and 12 of `[a-z0-9]`): others
/// are unknown without asking the sandbox.
fn plausible_id(term_id: &str) -> bool {
    term_id.strip_prefix("term-").is_some_and(|rest| {
        !rest.is_empty()
            && rest.len() <= 32
            && rest
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    })
}

impl Core {
    /// The words of a terminal refusal, for session `id`.
    fn terminal_error(&self, id: &str, term_id: &str, e: TermError) -> ServiceError {
        ServiceError::Terminal(match e {
            TermError::Limit(_) => TermError::Limit(format!(
                "Session '{id}' already has {} terminals running (SANDBOXD_MAX_TERMINALS_PER_SESSION). Close one (DELETE /v1/sessions/{id}/terminals/{{terminal_id}}) or wait for one to end.",
                self.settings.terminals.max_per_session
            )),
            TermError::NotFound(_) => {
                TermError::NotFound(format!("No terminal '{term_id}' in session '{id}'"))
            }
            e => e,
        })
    }

    /// Marks the session active now, unless it was within the last second.
    pub async fn terminal_activity(&self, id: &str, last: &mut i64) {
        if now_ms().saturating_sub(*last) > ACTIVITY_RESOLUTION_MS {
            let _ = self.store.touch(id).await;
            *last = now_ms();
        }
    }

    /// Opens a terminal in session `id`, waking it first.
    pub async fn open_terminal(
        &self,
        id: &str,
        who: &Actor,
        req: TerminalRequest,
    ) -> Result<Terminal, ServiceError> {
        let started = Instant::now();
        check_size(req.rows, req.cols).map_err(ServiceError::invalid)?;
        let argv = match &req.command {
            None => Vec::new(),
            Some(c) if c.trim().is_empty() => {
                return Err(ServiceError::invalid(
                    "command must not be empty (leave it out for a login shell)",
                ));
            }
            Some(c) if c.contains('\0') => {
                return Err(ServiceError::invalid("command must not hold a NUL byte"));
            }
            Some(c) => vec!["/bin/sh".to_owned(), "-c".to_owned(), c.clone()],
        };
        let env = env_pairs(Some(&req.env))?;
        if self.is_rebuilding(id) {
            return Err(ServiceError::Rebuilding { id: id.to_owned() });
        }
        let row = self.wake(id).await.map_err(|e| gone_if_destroying(id, e))?;
        let container = row.container_id.clone().ok_or_else(|| {
            ServiceError::internal(format!("session '{id}' runs without a container"))
        })?;
        let term_id = format!("term-{}", &auth::new_session_token()[4..16]).to_ascii_lowercase();
        let limits = self.settings.terminals;
        let request = TermRequest {
            term_id: term_id.clone(),
            argv,
            env,
            cwd: None,
            rows: req.rows,
            cols: req.cols,
            max_terminals: limits.max_per_session,
            idle_timeout_ms: u64::try_from(limits.idle_timeout.as_millis()).unwrap_or(u64::MAX),
            scrollback_bytes: SCROLLBACK_BYTES,
        };
        let _ = self.store.touch(id).await;
        let opened = self.runner.terminal_open(id, &container, request).await;
        let (target, outcome) = match &opened {
            Ok(t) => (
                format!(
                    "open {term_id}: {}",
                    shown_argv(req.command.is_none(), &t.argv)
                ),
                Outcome {
                    ok: true,
                    ..Outcome::default()
                },
            ),
            Err(e) => (
                format!("open {term_id}"),
                Outcome {
                    ok: false,
                    error: Some(e.to_string()),
                    ..Outcome::default()
                },
            ),
        };
        self.record(id, who, Op::Terminal, &target, outcome, started);
        let counted = match &opened {
            Ok(_) => "opened",
            Err(TermError::Limit(_) | TermError::Unavailable(_)) => "refused",
            Err(_) => "failed",
        };
        self.metrics
            .terminal_opens
            .get_or_create(&crate::metrics::Outcome::new(counted))
            .inc();
        opened
            .map(terminal_view)
            .map_err(|e| self.terminal_error(id, &term_id, e))
    }

    /// The terminals of session `id`: none for a session whose container does not run (its
    /// terminals ended with it); a sleeping session is not woken to be asked.
    pub async fn terminals(&self, id: &str) -> Result<Vec<Terminal>, ServiceError> {
        let row = self.row(id).await?;
        if row.state != State::Running || row.container_id.is_none() {
            return Ok(Vec::new());
        }
        let terms = self
            .runner
            .terminal_list(id)
            .await
            .map_err(|e| self.terminal_error(id, "", e))?;
        Ok(terms.into_iter().map(terminal_view).collect())
    }

    /// Ends terminal `term_id` of session `id` and everything it started.
    pub async fn kill_terminal(
        &self,
        id: &str,
        who: &Actor,
        term_id: &str,
    ) -> Result<(), ServiceError> {
        let started = Instant::now();
        let row = self.row(id).await?;
        let not_found = || self.terminal_error(id, term_id, TermError::NotFound(String::new()));
        if row.state != State::Running || !plausible_id(term_id) {
            return Err(not_found());
        }
        let found = self
            .runner
            .terminal_kill(id, term_id)
            .await
            .map_err(|e| self.terminal_error(id, term_id, e))?;
        if !found {
            return Err(not_found());
        }
        self.record(
            id,
            who,
            Op::Terminal,
            &format!("kill {term_id}"),
            Outcome {
                ok: true,
                ..Outcome::default()
            },
            started,
        );
        Ok(())
    }

    /// Attaches to terminal `term_id` of session `id`, waking a sleeping session (whose
    /// terminals ended when it slept: the attach then finds none).
    pub async fn attach_terminal(
        &self,
        id: &str,
        term_id: &str,
    ) -> Result<TermAttach, ServiceError> {
        if !plausible_id(term_id) {
            return Err(self.terminal_error(id, term_id, TermError::NotFound(String::new())));
        }
        if self.is_rebuilding(id) {
            return Err(ServiceError::Rebuilding { id: id.to_owned() });
        }
        self.wake(id).await.map_err(|e| gone_if_destroying(id, e))?;
        let _ = self.store.touch(id).await;
        self.runner
            .terminal_attach(id, term_id)
            .await
            .map_err(|e| self.terminal_error(id, term_id, e))
    }

    /// Records the end of a terminal an attach saw: how, and the bytes typed and printed.
    pub fn terminal_ended(&self, id: &str, who: &Actor, term: &TermInfo, exit: &TermExit) {
        self.record(
            id,
            who,
            Op::Terminal,
            &format!(
                "end {}: {} ({} bytes typed, {} printed)",
                term.term_id, exit.reason, term.input_bytes, term.output_bytes
            ),
            Outcome {
                ok: exit.exit_code == 0,
                exit_code: Some(exit.exit_code),
                error: None,
                bytes: i64::try_from(term.input_bytes.saturating_add(term.output_bytes)).ok(),
            },
            Instant::now(),
        );
    }
}

/// A terminal's program as the audit log names it: `login shell (/bin/bash -l)`, or the
/// command's argv.
fn shown_argv(login: bool, argv: &[String]) -> String {
    if login {
        format!("login shell ({})", argv.join(" "))
    } else {
        argv.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ids_sandboxd_makes_reach_the_sandbox() {
        assert!(plausible_id("term-0a1b2c3d4e5f"));
        for id in [
            "",
            "term-",
            "run-1",
            "term-../x",
            "term-ABC",
            &format!("term-{}", "a".repeat(40)),
        ] {
            assert!(!plausible_id(id), "{id}");
        }
    }
}
