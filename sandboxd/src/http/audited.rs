//! What every workspace operation of both HTTP surfaces does around the operation itself: it
//! takes a place in its session's share of the file workers ([`crate::service::work`]), runs
//! off the async runtime under its deadline (stopped, and answered 503, past it or when its
//! client goes away), is timed, leaves its row in the audit log (outcome, bytes, duration) and
//! fails with the surface's own error. The surfaces keep what differs between them: which
//! token reaches a session ([`crate::http::extract`]) and the shape of an error.

use std::sync::Arc;

use futures::StreamExt;
use std::time::{Duration, Instant};

use tokio::task::JoinError;

use crate::http::error::{ApiError, ErrorCode};
use crate::service::work::Busy;
use crate::service::{Actor, Core, Outcome, ServiceError};
use crate::storage::audit::Op;
use crate::workspace::FileError;
use crate::workspace::deadline::{self, Held, Stop, Ticket};

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

/// A surface's error for an operation that did not finish: its task panicked (a 500), it got
/// no worker (503), or it ran past its deadline without stopping by itself (503).
pub(crate) trait Unfinished {
    /// The error for `e`.
    fn unfinished(e: JoinError) -> Self;
    /// The error of an operation that got no place among the file workers.
    fn busy(e: Busy) -> Self;
    /// The error of an operation stopped from outside.
    fn overdue(stop: Stop) -> Self;
}

impl Unfinished for ApiError {
    fn unfinished(e: JoinError) -> Self {
        ApiError::internal(e.to_string())
    }

    fn busy(e: Busy) -> Self {
        ApiError::new(503, ErrorCode::FileWorkBusy, e.to_string())
    }

    fn overdue(stop: Stop) -> Self {
        ApiError::new(
            503,
            ErrorCode::FileWorkStopped,
            format!("the file operation was stopped: {stop}"),
        )
    }
}

/// Cancels an operation's ticket when the request waiting for it goes away (its client hung
/// up), unless the operation was seen to the end.
struct CancelOnDrop(Option<Arc<Ticket>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.cancel();
        }
    }
}

/// How long past its deadline an operation that does not stop by itself (one long system
/// call) is waited for before its request is answered anyway; its worker stays taken until
/// its thread is free.
const GRACE: Duration = Duration::from_secs(1);

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

/// Runs `op` on a blocking thread in a place of session `id`'s share of the file workers, its
/// failure answered as `map` says; a task that did not finish is answered as [`Unfinished`]
/// says. For an operation the audit log does not record (see [`Audited::blocking`] for one it
/// does).
pub(crate) async fn blocking<T, E, R>(
    core: &Core,
    id: &str,
    op: impl FnOnce() -> Result<T, E> + Send + 'static,
    map: impl FnOnce(E) -> R,
) -> Result<T, R>
where
    T: Send + 'static,
    E: Send + 'static,
    R: Unfinished,
{
    finished(core, id, op)
        .await
        .map_err(NotDone::into_surface)?
        .0
        .map_err(map)
}

/// Why an operation did not finish.
enum NotDone {
    Panicked(JoinError),
    Busy(Busy),
    Overdue(Stop),
}

impl NotDone {
    fn into_surface<R: Unfinished>(self) -> R {
        match self {
            NotDone::Panicked(e) => R::unfinished(e),
            NotDone::Busy(e) => R::busy(e),
            NotDone::Overdue(stop) => R::overdue(stop),
        }
    }
}

impl Coded for NotDone {
    fn code(&self) -> String {
        match self {
            NotDone::Panicked(_) => ErrorCode::Internal,
            NotDone::Busy(_) => ErrorCode::FileWorkBusy,
            NotDone::Overdue(_) => ErrorCode::FileWorkStopped,
        }
        .to_string()
    }
}

/// What `op` returned on a blocking thread, under its place's deadline, or the surface's error
/// when it did not finish.
/// The memory reservations the operation made come with what it returned: they are to be kept
/// until the bytes they stand for are sent.
async fn finished<T: Send + 'static>(
    core: &Core,
    id: &str,
    op: impl FnOnce() -> T + Send + 'static,
) -> Result<(T, Vec<Held>), NotDone> {
    let place = core.file_work().enter(id).await.map_err(NotDone::Busy)?;
    let ticket = place.ticket.clone();
    let mut cancel = CancelOnDrop(Some(ticket.clone()));
    let running = ticket.clone();
    let task = tokio::task::spawn_blocking(move || {
        let _place = place;
        deadline::under(running, op)
    });
    match tokio::time::timeout(ticket.limit() + GRACE, task).await {
        Ok(done) => {
            cancel.0 = None;
            let held = ticket.take_held();
            done.map(|d| (d, held)).map_err(NotDone::Panicked)
        }
        Err(_) => Err(NotDone::Overdue(Stop::Deadline(ticket.limit()))),
    }
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
        self.core
            .metrics()
            .observe_file_op(self.op.as_str(), self.started);
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
    /// nowhere and answered 500; one refused a worker or stopped from outside is recorded with
    /// its code and answered 503.
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
        self.blocking_held(op, bytes, map)
            .await
            .map(|(done, _)| done)
    }

    /// [`Audited::blocking`] for an operation that holds bytes in flight (a read): the
    /// reservations it made come back with its result, to be kept by the answer that sends
    /// them ([`held_body`]).
    pub(crate) async fn blocking_held<T, E, R>(
        self,
        op: impl FnOnce() -> Result<T, E> + Send + 'static,
        bytes: impl Fn(&T) -> Option<i64>,
        map: impl FnOnce(E) -> R,
    ) -> Result<(T, Vec<Held>), R>
    where
        T: Send + 'static,
        E: Coded + Send + 'static,
        R: Unfinished,
    {
        let (done, held) = match finished(self.core, self.id, op).await {
            Ok(done) => done,
            Err(not_done) => {
                self.core
                    .metrics()
                    .observe_file_op(self.op.as_str(), self.started);
                // A panicked task is recorded nowhere, as before; a refused or stopped one is.
                if self.recorded && !matches!(not_done, NotDone::Panicked(_)) {
                    let failed = Outcome {
                        ok: false,
                        error: Some(not_done.code()),
                        ..Outcome::default()
                    };
                    self.core.record(
                        self.id,
                        self.actor,
                        self.op,
                        self.target,
                        failed,
                        self.started,
                    );
                }
                return Err(not_done.into_surface());
            }
        };
        self.record(&done, bytes);
        done.map(|d| (d, held)).map_err(map)
    }
}

/// The body of an answer that sends `data`, keeping `held` (its bytes' reservations) until the
/// last of it is handed to the connection or the client is gone. It goes out in slices of the
/// one buffer, so the reservation stands for all that is still to send.
pub(crate) fn held_body(data: Vec<u8>, held: Vec<Held>) -> axum::body::Body {
    const SLICE: usize = 64 * 1024;
    let data = axum::body::Bytes::from(data);
    let slices = (0..data.len())
        .step_by(SLICE)
        .map(move |at| {
            Ok::<_, std::convert::Infallible>(data.slice(at..(at + SLICE).min(data.len())))
        })
        .collect::<Vec<_>>();
    let mut held = Some(held);
    let stream = futures::stream::iter(slices).chain(futures::stream::poll_fn(move |_| {
        // The end of the stream: everything was handed over, the reservation goes.
        drop(held.take());
        std::task::Poll::Ready(None)
    }));
    axum::body::Body::from_stream(stream)
}

/// The audit row of a run (both surfaces): the command, never its output; a failed command
/// with its exit status.
pub(crate) fn record_run(
    core: &Core,
    id: &str,
    who: &Actor,
    command: &str,
    result: &Result<crate::run::RunOutcome, ServiceError>,
    started: Instant,
) {
    let outcome = match result {
        Ok(o) => Outcome {
            ok: o.exit_code == 0 && !o.timed_out && !o.stopped,
            exit_code: Some(o.exit_code),
            error: if o.timed_out {
                Some("timed_out".into())
            } else if o.stopped {
                Some("stopped".into())
            } else if o.exit_code != 0 {
                Some(format!("exit {}", o.exit_code))
            } else {
                None
            },
            bytes: None,
        },
        Err(e) => Outcome {
            ok: false,
            error: Some(e.status_and_code().1.to_string()),
            ..Outcome::default()
        },
    };
    core.record(id, who, Op::Execute, command, outcome, started);
}
