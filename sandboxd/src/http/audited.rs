//! What every workspace operation of both HTTP surfaces does around the operation itself: it
//! runs off the async runtime, is timed, leaves its row in the audit log (outcome, bytes,
//! duration) and fails with the surface's own error. The surfaces keep what differs between
//! them: which token reaches a session ([`crate::http::extract`]) and the shape of an error.

use std::time::Instant;

use tokio::task::JoinError;

use crate::http::error::ApiError;
use crate::service::{Actor, Core, Outcome};
use crate::storage::audit::Op;
use crate::workspace::FileError;

/// A failure as the audit log records it: by its code.
pub(crate) trait Coded {
    /// The code of the audit row.
    fn code(&self) -> String;
}

impl Coded for FileError {
    fn code(&self) -> String {
        FileError::code(self).to_string()
    }
}

impl Coded for ApiError {
    fn code(&self) -> String {
        self.code.to_string()
    }
}

/// A surface's error for an operation whose task did not finish (it panicked): a 500.
pub(crate) trait Unfinished {
    /// The error for `e`.
    fn unfinished(e: JoinError) -> Self;
}

impl Unfinished for ApiError {
    fn unfinished(e: JoinError) -> Self {
        ApiError::internal(e.to_string())
    }
}

/// The audit outcome of an operation: ok with `bytes` of it, or the code it failed with.
pub(crate) fn outcome<T, E: Coded>(
    result: &Result<T, E>,
    bytes: impl Fn(&T) -> Option<i64>,
) -> Outcome {
    match result {
        Ok(v) => Outcome {
            ok: true,
            bytes: bytes(v),
            ..Outcome::default()
        },
        Err(e) => Outcome {
            ok: false,
            error: Some(e.code()),
            ..Outcome::default()
        },
    }
}

/// Runs `op` on a blocking thread, its failure answered as `map` says; a task that did not
/// finish (it panicked) is answered 500. For an operation the audit log does not record (see
/// [`Audited::blocking`] for one it does).
pub(crate) async fn blocking<T, E, R>(
    op: impl FnOnce() -> Result<T, E> + Send + 'static,
    map: impl FnOnce(E) -> R,
) -> Result<T, R>
where
    T: Send + 'static,
    E: Send + 'static,
    R: Unfinished,
{
    finished(op).await?.map_err(map)
}

/// What `op` returned on a blocking thread, or the surface's 500 when it did not finish.
async fn finished<T: Send + 'static, R: Unfinished>(
    op: impl FnOnce() -> T + Send + 'static,
) -> Result<T, R> {
    tokio::task::spawn_blocking(op).await.map_err(R::unfinished)
}

/// One audited operation: `op` on `target` in session `id` by `actor`, timed from its making.
pub(crate) struct Audited<'a> {
    core: &'a Core,
    id: &'a str,
    actor: &'a Actor,
    op: Op,
    target: &'a str,
    started: Instant,
    recorded: bool,
}

impl<'a> Audited<'a> {
    /// `op` on `target` (as the request named it) in session `id`, by `actor`; timed from now.
    pub(crate) fn new(
        core: &'a Core,
        id: &'a str,
        actor: &'a Actor,
        op: Op,
        target: &'a str,
    ) -> Self {
        Self {
            core,
            id,
            actor,
            op,
            target,
            started: Instant::now(),
            recorded: true,
        }
    }

    /// The same operation, recorded only when `known` (a stored workspace without a session
    /// row has no tenant to record it under).
    pub(crate) fn recorded_if(mut self, known: bool) -> Self {
        self.recorded = known;
        self
    }

    /// Records how the operation ended, with `bytes` of a success.
    pub(crate) fn record<T, E: Coded>(
        &self,
        result: &Result<T, E>,
        bytes: impl Fn(&T) -> Option<i64>,
    ) {
        if self.recorded {
            self.core.record(
                self.id,
                self.actor,
                self.op,
                self.target,
                outcome(result, bytes),
                self.started,
            );
        }
    }

    /// Runs `op` on a blocking thread, records its outcome (with `bytes` of a success) and
    /// answers its failure as `map` says. A task that did not finish (it panicked) is recorded
    /// nowhere and answered 500.
    pub(crate) async fn blocking<T, E, R>(
        self,
        op: impl FnOnce() -> Result<T, E> + Send + 'static,
        bytes: impl Fn(&T) -> Option<i64>,
        map: impl FnOnce(E) -> R,
    ) -> Result<T, R>
    where
        T: Send + 'static,
        E: Coded + Send + 'static,
        R: Unfinished,
    {
        let done = finished(op).await?;
        self.record(&done, bytes);
        done.map_err(map)
    }
}
