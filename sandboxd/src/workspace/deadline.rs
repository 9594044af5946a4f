//! The ticket of the file operation running on this thread: its deadline, its cancellation
//! and the memory it may hold. A file operation runs on a blocking thread, which cannot be
//! killed: the loops of the operations that can take long (a recursive remove, a tree walk, a
//! listing that follows links) ask [`check`] between steps and stop with
//! [`FileError::Stopped`](super::FileError::Stopped) once the operation's deadline has passed
//! or its client went away. What was done stays done (removed entries stay removed); nothing is
//! left half-written, since a write is put in place only when it is whole. An operation that
//! is about to hold many bytes (a read) asks [`reserve`] first: the bytes come out of the
//! host's and the session's budget of bytes in flight, and the reservation stays with the
//! ticket until the answer that carries them is sent ([`Ticket::take_held`]).

use std::cell::RefCell;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Why an operation was stopped before it was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// It ran past its deadline.
    Deadline(Duration),
    /// Its client went away.
    Cancelled,
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Deadline(limit) => write!(
                f,
                "it ran past its deadline of {} s (SANDBOXD_FILE_DEADLINE) and was stopped; what it had done stays done. Retry it, or do it in smaller parts",
                limit.as_secs_f64()
            ),
            Stop::Cancelled => write!(f, "its client went away, and it was stopped"),
        }
    }
}

/// Where the bytes an operation holds come from: a budget that says yes (a reservation,
/// released when it is dropped) or no (in words).
pub trait Memory: Send + Sync {
    /// Reserves `bytes`, waiting briefly for room; the error says which budget is full.
    fn reserve(&self, bytes: u64) -> Result<Held, String>;
}

/// Bytes reserved from a [`Memory`]; given back when dropped.
pub type Held = Box<dyn Send + Sync>;

/// One operation's deadline, its cancel flag and the memory it holds, shared by the thread
/// doing it and the request waiting for it.
pub struct Ticket {
    started: Instant,
    limit: Duration,
    cancelled: AtomicBool,
    memory: Option<Arc<dyn Memory>>,
    held: std::sync::Mutex<Vec<Held>>,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("limit", &self.limit)
            .field("cancelled", &self.cancelled)
            .finish_non_exhaustive()
    }
}

impl Ticket {
    /// A ticket whose deadline is `limit` from now, without a memory budget.
    pub fn new(limit: Duration) -> Arc<Self> {
        Self::with_memory(limit, None)
    }

    /// A ticket whose deadline is `limit` from now and whose reservations come from `memory`.
    pub fn with_memory(limit: Duration, memory: Option<Arc<dyn Memory>>) -> Arc<Self> {
        Arc::new(Self {
            started: Instant::now(),
            limit,
            cancelled: AtomicBool::new(false),
            memory,
            held: std::sync::Mutex::default(),
        })
    }

    /// The reservations the operation made, to be kept until what they hold is sent.
    pub fn take_held(&self) -> Vec<Held> {
        std::mem::take(
            &mut *self
                .held
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Marks the operation cancelled: its next [`check`] stops it.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// The deadline, measured from the ticket's making.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// Why the operation must stop now, if it must.
    pub fn stop(&self) -> Option<Stop> {
        if self.cancelled.load(Ordering::Relaxed) {
            Some(Stop::Cancelled)
        } else if self.started.elapsed() >= self.limit {
            Some(Stop::Deadline(self.limit))
        } else {
            None
        }
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Ticket>>> = const { RefCell::new(None) };
}

/// Runs `f` on this thread under `ticket`: the [`check`]s inside it answer for that ticket.
pub fn under<T>(ticket: Arc<Ticket>, f: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            CURRENT.with(|c| c.borrow_mut().take());
        }
    }
    CURRENT.with(|c| *c.borrow_mut() = Some(ticket));
    let _reset = Reset;
    f()
}

/// The ticket of the operation on this thread, to hand to a thread that does part of it.
pub fn current() -> Option<Arc<Ticket>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Why the operation on this thread must stop now, if it must (never outside [`under`]).
pub fn stopped() -> Option<Stop> {
    CURRENT.with(|c| c.borrow().as_ref().and_then(|t| t.stop()))
}

/// The error a stopped operation's loop returns: an I/O error of kind `TimedOut` that carries
/// the [`Stop`], so every caller's error mapping turns it into `FileError::Stopped`.
pub fn check() -> io::Result<()> {
    match stopped() {
        None => Ok(()),
        Some(stop) => Err(io::Error::new(io::ErrorKind::TimedOut, StopError(stop))),
    }
}

/// Reserves `bytes` for the operation on this thread from its ticket's budget (nothing to do
/// outside [`under`] or without a budget). A budget that stays full is an I/O error of kind
/// `OutOfMemory` carrying the words, which the error mapping turns into `FileError::Busy`.
pub fn reserve(bytes: u64) -> io::Result<()> {
    let ticket = CURRENT.with(|c| c.borrow().clone());
    let Some(ticket) = ticket else {
        return Ok(());
    };
    let Some(memory) = &ticket.memory else {
        return Ok(());
    };
    match memory.reserve(bytes) {
        Ok(held) => {
            ticket
                .held
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(held);
            Ok(())
        }
        Err(words) => Err(io::Error::new(io::ErrorKind::OutOfMemory, BusyError(words))),
    }
}

/// A full budget's words inside an `io::Error`.
#[derive(Debug)]
pub struct BusyError(pub String);

impl std::fmt::Display for BusyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BusyError {}

/// The words of a full budget an I/O error carries, when it is one of [`reserve`]'s.
pub fn busy_of(e: &io::Error) -> Option<String> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<BusyError>())
        .map(|b| b.0.clone())
}

/// A [`Stop`] inside an `io::Error`.
#[derive(Debug)]
pub struct StopError(pub Stop);

impl std::fmt::Display for StopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for StopError {}

/// The [`Stop`] an I/O error carries, when it is one of [`check`]'s.
pub fn stop_of(e: &io::Error) -> Option<Stop> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<StopError>())
        .map(|s| s.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_answers_for_the_ticket_of_its_thread() {
        assert!(check().is_ok(), "no ticket: never stopped");
        let ticket = Ticket::new(Duration::from_secs(60));
        under(ticket.clone(), || {
            assert!(check().is_ok());
            ticket.cancel();
            let e = check().expect_err("cancelled");
            assert_eq!(stop_of(&e), Some(Stop::Cancelled));
        });
        assert!(check().is_ok(), "the ticket is gone with its operation");
        let late = Ticket::new(Duration::ZERO);
        under(late, || {
            let e = check().expect_err("past its deadline");
            assert_eq!(stop_of(&e), Some(Stop::Deadline(Duration::ZERO)));
            assert!(e.to_string().starts_with("it ran past its deadline of 0 s"));
        });
    }
}
