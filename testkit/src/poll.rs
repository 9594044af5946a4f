//! The one polling helper of the test crates: asks again, with a deadline, for what cannot be
//! watched (a process's answer, a file, a CLI's view, a policy binding taking effect).

use std::fmt::Display;
use std::time::Duration;

/// How often [`until`] asks.
pub const EVERY: Duration = Duration::from_millis(250);

/// What an attempt of [`until`] returns: a value, or not yet (with what it saw instead).
pub trait Attempt {
    /// The value waited for.
    type Value;
    /// The value, or what was seen instead.
    fn outcome(self) -> Result<Self::Value, String>;
}

impl<T> Attempt for Option<T> {
    type Value = T;
    fn outcome(self) -> Result<T, String> {
        self.ok_or_else(|| "not yet".to_owned())
    }
}

impl<T, E: Display> Attempt for Result<T, E> {
    type Value = T;
    fn outcome(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

/// The outcome of an attempt that waits until nothing is left: `Ok` when `left` is empty, else
/// `what` and what is left.
pub fn nothing_left<T: std::fmt::Debug>(what: &str, left: &[T]) -> Result<(), String> {
    if left.is_empty() {
        Ok(())
    } else {
        Err(format!("{what}: {left:?}"))
    }
}

/// Runs `attempt`, then again `every` after each miss, until it gives a value (`Some`, `Ok`): that value, or once
/// `deadline` has passed, the last thing it saw instead. For waits that go on, or fail in their
/// own words, when the deadline passes; [`until`] fails the test.
pub async fn poll<A: Attempt>(
    deadline: Duration,
    every: Duration,
    mut attempt: impl AsyncFnMut() -> A,
) -> Result<A::Value, String> {
    let end = tokio::time::Instant::now() + deadline;
    loop {
        match attempt().await.outcome() {
            Ok(value) => return Ok(value),
            Err(last) if tokio::time::Instant::now() >= end => return Err(last),
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

/// Runs `attempt` every [`EVERY`] until it gives a value (`Some`, `Ok`), and fails the test
/// once `deadline` has passed, naming `what` it waited for and the last thing it saw.
pub async fn until<A: Attempt>(
    what: &str,
    deadline: Duration,
    attempt: impl AsyncFnMut() -> A,
) -> A::Value {
    until_every(what, deadline, EVERY, attempt).await
}

/// [`until`], asking every `every`.
pub async fn until_every<A: Attempt>(
    what: &str,
    deadline: Duration,
    every: Duration,
    attempt: impl AsyncFnMut() -> A,
) -> A::Value {
    poll(deadline, every, attempt)
        .await
        .unwrap_or_else(|last| panic!("{what}: not within {deadline:?}; last seen: {last}"))
}
