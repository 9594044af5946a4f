//! Runs: a command in a session's container through the [`crate::run::Runner`], capped per
//! session, stopped on request, on timeout and when the session goes.

use super::*;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::run::{RunError, RunEvent, RunOutcome, RunSpec, RunStatus};
use crate::storage::store::State;

pub(super) struct RunEntry {
    pub(super) session: String,
    cancel: CancellationToken,
    /// Set when the run is stopped because its session is being rebuilt.
    for_rebuild: Arc<AtomicBool>,
}

/// A run in flight: when it ends, or its caller goes away, it is cancelled and forgotten.
pub(super) struct InFlight<'a> {
    runs: &'a Mutex<HashMap<String, RunEntry>>,
    run_id: String,
    cancel: CancellationToken,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        // Harmless once the run ended; stops it when the caller left before.
        self.cancel.cancel();
        if let Ok(mut runs) = self.runs.lock() {
            runs.remove(&self.run_id);
        }
    }
}

/// A run refused because its session is being destroyed: the session is gone.
pub(super) fn gone_if_destroying(id: &str, e: ServiceError) -> ServiceError {
    match e {
        ServiceError::Destroying { .. } => ServiceError::Gone { id: id.to_owned() },
        e => e,
    }
}

impl Core {
    pub(super) fn runs_in_flight(&self, id: &str) -> usize {
        self.runs
            .lock()
            .map(|r| r.values().filter(|e| e.session == id).count())
            .unwrap_or(0)
    }

    /// [`ServiceError::RunCap`] when session `id` already has `held` runs in flight, the most
    /// `SANDBOXD_MAX_RUNS_PER_SESSION` allows. The count is sandboxd's own run table, never
    /// what the sandbox says.
    pub(super) fn check_run_cap(&self, id: &str, held: usize) -> Result<(), ServiceError> {
        let max = self.settings.max_runs_per_session;
        if held < max {
            return Ok(());
        }
        Err(ServiceError::RunCap {
            id: id.to_owned(),
            held,
            max,
        })
    }

    pub(super) fn cancel_runs(&self, id: &str) {
        if let Ok(runs) = self.runs.lock() {
            for e in runs.values().filter(|e| e.session == id) {
                e.cancel.cancel();
            }
        }
    }

    /// Stops the runs in flight of a session being rebuilt; each answers
    /// [`ServiceError::StoppedForRebuild`].
    pub(super) fn stop_runs_for_rebuild(&self, id: &str) {
        if let Ok(runs) = self.runs.lock() {
            for e in runs.values().filter(|e| e.session == id) {
                e.for_rebuild.store(true, Ordering::SeqCst);
                e.cancel.cancel();
            }
        }
    }

    /// Runs a command, waking the session first; output also goes to `events` as it comes.
    /// `under_way` hears once the run is in the session's table (from then on a stop of its
    /// id reaches it); it is dropped unheard when the run ends before that.
    pub async fn run(
        &self,
        id: &str,
        req: RunRequest,
        events: Option<mpsc::Sender<RunEvent>>,
        under_way: Option<oneshot::Sender<()>>,
    ) -> Result<RunOutcome, ServiceError> {
        let env = run_env(&req)?;
        // Refused before anything is woken or asked of Docker; checked again, atomically, as
        // the run is entered in the table below.
        if self.is_rebuilding(id) {
            return Err(ServiceError::Rebuilding { id: id.to_owned() });
        }
        self.check_run_cap(id, self.runs_in_flight(id))?;
        // A running session goes straight to a run path that finds a stopped container by
        // itself (the agent's handshake fails, and `NotRunning` below starts it again): no
        // Docker round trip per run. Anything else is woken first.
        let row = match self.row(id).await? {
            row if row.state == State::Running
                && row.container_id.is_some()
                && self.runner.finds_stopped_containers()
                && self.workspace(id).exists() =>
            {
                row
            }
            _ => self.wake(id).await.map_err(|e| gone_if_destroying(id, e))?,
        };
        let mut container = row.container_id.clone().ok_or_else(|| {
            ServiceError::internal(format!("session '{id}' runs without a container"))
        })?;
        let run_id = req
            .run_id
            .clone()
            .unwrap_or_else(|| format!("run-{}", &auth::new_session_token()[4..20]));
        let (cancel, for_rebuild) = self.enter_run(id, &run_id)?;
        // The run's output buffers (two streams, each up to the output cap) come out of the
        // budget of bytes in flight for as long as the run goes; taken once the run holds its
        // place under the run cap, so a flood of runs is refused by the cap first.
        let output_bytes = self.policy().max_output_bytes.saturating_mul(2);
        let _output = match self.file_work.memory().reserve(id, output_bytes, false) {
            Ok(held) => held,
            Err(why) => {
                if let Ok(mut runs) = self.runs.lock() {
                    runs.remove(&run_id);
                }
                return Err(ServiceError::MemoryBusy(why));
            }
        };
        if let Some(under_way) = under_way {
            let _ = under_way.send(());
        }
        // A caller that goes away mid-run (its request dropped) stops the run: the guard
        // cancels it and forgets it, and the run itself goes on in a task of its own
        // (`spawn_run`) just long enough to stop the command's process tree.
        let _in_flight = InFlight {
            runs: &self.runs,
            run_id: run_id.clone(),
            cancel: cancel.clone(),
        };
        // The activity time, as the run starts and as it ends. A row touched within the last
        // second (a burst of runs) needs no write: the time it holds is at most that stale, and
        // a run in flight keeps the session awake by itself.
        let mut touched_at = row.last_activity_at;
        if crate::storage::store::now_ms().saturating_sub(touched_at) > ACTIVITY_RESOLUTION_MS {
            let _ = self.store.touch(id).await;
            touched_at = crate::storage::store::now_ms();
        }
        let policy = self.policy();
        let max_timeout = Duration::from_secs(policy.execute_timeout);
        let timeout = req
            .timeout_seconds
            .map_or(max_timeout, |t| Duration::from_secs(t).min(max_timeout));
        let mut spec = RunSpec {
            run_id: run_id.clone(),
            session: id.to_owned(),
            container: container.clone(),
            command: req.command,
            env,
            uid: self.settings.uid,
            timeout,
            max_output_bytes: usize::try_from(policy.max_output_bytes).unwrap_or(usize::MAX),
        };
        let mut result = self
            .spawn_run(spec.clone(), events.clone(), cancel.clone())
            .await;
        if matches!(result, Err(RunError::NotRunning)) && !for_rebuild.load(Ordering::SeqCst) {
            // The container died under the session (its init was OOM-killed, Docker restarted):
            // start it again, files intact, and run once more.
            warn!(
                session = id,
                "container was not running; starting it again for the run"
            );
            let _ = self
                .store
                .transition(id, &[State::Running], State::Stopped)
                .await;
            match self.wake(id).await {
                Ok(row) => {
                    container = row.container_id.unwrap_or(container);
                    spec.container = container;
                    result = self.spawn_run(spec, events, cancel).await;
                }
                Err(e) => {
                    if let Ok(mut runs) = self.runs.lock() {
                        runs.remove(&run_id);
                    }
                    return Err(gone_if_destroying(id, e));
                }
            }
        }
        if let Ok(mut runs) = self.runs.lock() {
            runs.remove(&run_id);
        }
        self.pool().ran(id);
        // A run cut short because its session was destroyed meanwhile ended with the
        // environment, not with the command: the caller must be able to tell.
        if (result.is_err() || result.as_ref().is_ok_and(|o| o.stopped))
            && self.destroyed_or_destroying(id).await
        {
            return Err(ServiceError::Gone { id: id.to_owned() });
        }
        if for_rebuild.load(Ordering::SeqCst) {
            return Err(ServiceError::StoppedForRebuild { id: id.to_owned() });
        }
        if crate::storage::store::now_ms().saturating_sub(touched_at) > ACTIVITY_RESOLUTION_MS {
            let _ = self.store.touch(id).await;
        }
        let outcome = result?;
        self.metrics.observe_run(&outcome);
        Ok(outcome)
    }

    /// Enters run `run_id` of session `id` in the run table (refused when the id is taken,
    /// the session is being rebuilt or its runs are at their cap, all under the table's lock):
    /// the token that stops it and the flag a rebuild raises when it does.
    fn enter_run(
        &self,
        id: &str,
        run_id: &str,
    ) -> Result<(CancellationToken, Arc<AtomicBool>), ServiceError> {
        let cancel = CancellationToken::new();
        let for_rebuild = Arc::new(AtomicBool::new(false));
        let mut runs = self
            .runs
            .lock()
            .map_err(|_| ServiceError::internal("run registry poisoned"))?;
        if runs.contains_key(run_id) {
            return Err(ServiceError::RunExists {
                run_id: run_id.to_owned(),
            });
        }
        // A rebuild marks its session under this lock: one that began since the first check
        // refuses the run here.
        if self.is_rebuilding(id) {
            return Err(ServiceError::Rebuilding { id: id.to_owned() });
        }
        self.check_run_cap(id, runs.values().filter(|e| e.session == id).count())?;
        runs.insert(
            run_id.to_owned(),
            RunEntry {
                session: id.to_owned(),
                cancel: cancel.clone(),
                for_rebuild: for_rebuild.clone(),
            },
        );
        Ok((cancel, for_rebuild))
    }

    /// Runs `spec` on a task of its own and waits for it: if the caller stops waiting, the task
    /// still sees `cancel` fire and stops the command, instead of being dropped with the
    /// command left running in the sandbox.
    pub(super) async fn spawn_run(
        &self,
        spec: RunSpec,
        events: Option<mpsc::Sender<RunEvent>>,
        cancel: CancellationToken,
    ) -> Result<RunOutcome, RunError> {
        let runner = self.runner.clone();
        tokio::spawn(async move { runner.run(spec, events, cancel).await })
            .await
            .unwrap_or_else(|e| Err(RunError::Stream(format!("the run's task failed: {e}"))))
    }

    /// Whether session `id` is gone or being destroyed.
    pub(super) async fn destroyed_or_destroying(&self, id: &str) -> bool {
        match self.store.get(id).await {
            Ok(None) => true,
            Ok(Some(row)) => row.state == State::Destroying,
            Err(_) => false,
        }
    }

    /// Stops a running run of a session.
    pub fn stop_run(&self, id: &str, run_id: &str) -> Result<(), ServiceError> {
        let runs = self
            .runs
            .lock()
            .map_err(|_| ServiceError::internal("run registry poisoned"))?;
        match runs.get(run_id) {
            Some(e) if e.session == id => {
                e.cancel.cancel();
                Ok(())
            }
            _ => Err(ServiceError::RunNotRunning {
                id: id.to_owned(),
                run_id: run_id.to_owned(),
            }),
        }
    }

    /// Stops a run of a session: one this process runs, else one the session's agent still
    /// runs whose request was lost when sandboxd restarted.
    pub async fn stop_run_or_detached(&self, id: &str, run_id: &str) -> Result<(), ServiceError> {
        match self.stop_run(id, run_id) {
            Err(e @ ServiceError::RunNotRunning { .. }) => {
                self.row(id).await?;
                match self.runner.stop_detached(id, run_id).await {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(e),
                    Err(err) => Err(ServiceError::Run(err)),
                }
            }
            other => other,
        }
    }

    /// The state of a run, in flight or finished, as the session's agent knows it (runs of
    /// the exec path are known only while in flight).
    pub async fn run_status(&self, id: &str, run_id: &str) -> Result<RunStatus, ServiceError> {
        let row = self.row(id).await?;
        if row.state == State::Running
            && let Some(status) = self
                .runner
                .status(id, run_id)
                .await
                .map_err(ServiceError::Run)?
        {
            return Ok(status);
        }
        let local = self
            .runs
            .lock()
            .map(|r| r.get(run_id).is_some_and(|e| e.session == id))
            .unwrap_or(false);
        if local {
            return Ok(RunStatus {
                run_id: run_id.to_owned(),
                running: true,
                exit_code: None,
                timed_out: false,
                stopped: false,
                truncated: false,
                cpu_ns: None,
                duration_ms: None,
                stdout: String::new(),
                stderr: String::new(),
            });
        }
        Err(ServiceError::RunUnknown {
            id: id.to_owned(),
            run_id: run_id.to_owned(),
        })
    }
}

/// A request's extra environment, checked: variable names as a shell takes them, no NUL in a
/// value (a run's and a terminal's alike).
pub(super) fn env_pairs(
    env: Option<&HashMap<String, String>>,
) -> Result<Vec<(String, String)>, ServiceError> {
    let mut pairs = Vec::new();
    for (k, v) in env.into_iter().flatten() {
        let valid = k
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid || v.contains('\0') {
            return Err(ServiceError::invalid(format!(
                "env: '{k}' is not a variable name ([A-Za-z_][A-Za-z0-9_]*) or its value holds a NUL byte"
            )));
        }
        pairs.push((k.clone(), v.clone()));
    }
    Ok(pairs)
}

/// The environment of a run as `KEY=value` lines, once its request is checked: a command
/// that is not empty and holds no NUL, a timeout of at least 1 s, variable names as a shell
/// takes them; with tracing on, `TRACEPARENT` continues the run's trace (unless set).
fn run_env(req: &RunRequest) -> Result<Vec<String>, ServiceError> {
    if req.command.trim().is_empty() {
        return Err(ServiceError::invalid("command must not be empty"));
    }
    // No process takes a NUL in its arguments; refused here rather than failing to start.
    if req.command.contains('\0') {
        return Err(ServiceError::invalid("command must not hold a NUL byte"));
    }
    if let Some(t) = req.timeout_seconds
        && t == 0
    {
        return Err(ServiceError::invalid("timeout_seconds must be at least 1"));
    }
    let mut env: Vec<String> = env_pairs(req.env.as_ref())?
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    // With tracing on, the program may continue the trace of its run (the W3C variable);
    // one the caller set is kept.
    if let Some(tp) = sandboxd_telemetry::traceparent()
        && !env.iter().any(|e| e.starts_with("TRACEPARENT="))
    {
        env.push(format!("TRACEPARENT={tp}"));
    }
    Ok(env)
}
