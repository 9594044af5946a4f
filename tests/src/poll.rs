//! The one polling helper of the test crates: asks again, with a deadline, for what cannot be
//! watched (a process's answer, a file, a CLI's view, a policy binding taking effect). Shared
//! as a file by sandboxd's tests, which do not depend on this crate, like `pki.rs`.

use std::fmt::Display;
use std::future::Future;
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

/// Runs `attempt` every [`EVERY`] until it gives a value (`Some`, `Ok`), and fails the test
/// once `deadline` has passed, naming `what` it waited for and the last thing it saw.
pub async fn until<A, F, Fut>(what: &str, deadline: Duration, mut attempt: F) -> A::Value
where
    A: Attempt,
    F: FnMut() -> Fut,
    Fut: Future<Output = A>,
{
    let end = tokio::time::Instant::now() + deadline;
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tick.tick().await;
        match attempt().await.outcome() {
            Ok(value) => return value,
            Err(last) if tokio::time::Instant::now() >= end => {
                panic!("{what}: not within {deadline:?}; last seen: {last}")
            }
            Err(_) => {}
        }
    }
}
