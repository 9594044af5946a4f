//! File work, bounded and fair: every file operation of both surfaces takes a place in its
//! session's share (`SANDBOXD_FILE_WORKERS_PER_SESSION`) and then one of the host's workers
//! (`SANDBOXD_FILE_WORKERS`) before it runs on a blocking thread, and runs under a deadline
//! (`SANDBOXD_FILE_DEADLINE`, see [`crate::workspace::deadline`]). A session that floods
//! removes or listings holds its own share and waits behind itself; at most
//! `SANDBOXD_FILE_QUEUE_PER_SESSION` of its operations wait, the next is refused at once (503
//! with words), so neither the blocking pool nor memory grows with what one tenant sends,
//! and other sessions keep their workers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::service::memory::{MemoryBudget, SessionMemory};
use crate::workspace::deadline::Ticket;

/// The bounds of file work.
#[derive(Debug, Clone, Copy)]
pub struct FileWorkLimits {
    /// Operations running at once on the host.
    pub workers: usize,
    /// Operations of one session running at once.
    pub per_session: usize,
    /// Operations of one session waiting for a place at once.
    pub queue_per_session: usize,
    /// How long one operation may take, its wait included.
    pub deadline: Duration,
    /// Bytes in flight host-wide.
    pub memory: u64,
    /// Bytes in flight per session.
    pub memory_per_session: u64,
}

impl Default for FileWorkLimits {
    fn default() -> Self {
        Self {
            workers: 16,
            per_session: 4,
            queue_per_session: 64,
            deadline: Duration::from_secs(30),
            memory: 256 << 20,
            memory_per_session: 64 << 20,
        }
    }
}

/// Why an operation got no place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Busy {
    /// Its session already has as many operations waiting as it may.
    #[error(
        "session '{id}' already has {waiting} file operations waiting for its {per_session} workers (SANDBOXD_FILE_QUEUE_PER_SESSION); retry when some have finished"
    )]
    SessionQueue {
        /// The session.
        id: String,
        /// Operations waiting.
        waiting: usize,
        /// Its share of workers.
        per_session: usize,
    },
    /// No place came free before the operation's deadline.
    #[error(
        "no file worker came free for session '{id}' within {} s (its share is {per_session} of the host's {workers}: SANDBOXD_FILE_WORKERS_PER_SESSION, SANDBOXD_FILE_WORKERS); retry shortly",
        .waited.as_secs_f64()
    )]
    NoWorker {
        /// The session.
        id: String,
        /// How long it waited.
        waited: Duration,
        /// Its share of workers.
        per_session: usize,
        /// The host's workers.
        workers: usize,
    },
}

/// One session's share: its workers and how many wait for them.
struct Share {
    workers: Arc<Semaphore>,
    waiting: AtomicUsize,
}

/// The host's file workers and every session's share of them.
pub struct FileWork {
    limits: FileWorkLimits,
    memory: Arc<MemoryBudget>,
    host: Arc<Semaphore>,
    shares: Mutex<HashMap<String, Arc<Share>>>,
}

/// A place to run one operation: the session's and the host's permits, and the operation's
/// ticket. Held by the thread that does the work until it is done, so an operation stopped
/// late (or a request that went away) keeps its place until its thread is free again.
pub struct Place {
    _session: OwnedSemaphorePermit,
    _host: OwnedSemaphorePermit,
    /// The operation's deadline and cancel flag.
    pub ticket: Arc<Ticket>,
}

impl FileWork {
    /// File work within `limits`.
    pub fn new(limits: FileWorkLimits) -> Self {
        Self {
            memory: MemoryBudget::new(
                limits.memory,
                limits.memory_per_session,
                Duration::from_millis(500),
            ),
            host: Arc::new(Semaphore::new(limits.workers.max(1))),
            shares: Mutex::default(),
            limits,
        }
    }

    /// The bounds.
    pub fn limits(&self) -> FileWorkLimits {
        self.limits
    }

    /// The budget of bytes in flight.
    pub fn memory(&self) -> &Arc<MemoryBudget> {
        &self.memory
    }

    fn share(&self, id: &str) -> Arc<Share> {
        let mut shares = self
            .shares
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Shares nobody holds or waits for go, so the map stays as small as the work in flight.
        if shares.len() > 1024 {
            shares.retain(|_, s| Arc::strong_count(s) > 1);
        }
        shares
            .entry(id.to_owned())
            .or_insert_with(|| {
                Arc::new(Share {
                    workers: Arc::new(Semaphore::new(self.limits.per_session.max(1))),
                    waiting: AtomicUsize::new(0),
                })
            })
            .clone()
    }

    /// A place for one operation of session `id`: its share's first, then the host's. The
    /// deadline counts from now, the wait included.
    pub async fn enter(&self, id: &str) -> Result<Place, Busy> {
        let ticket = Ticket::with_memory(
            self.limits.deadline,
            Some(Arc::new(SessionMemory {
                budget: self.memory.clone(),
                id: id.to_owned(),
            })),
        );
        let share = self.share(id);
        let waiting = share.waiting.fetch_add(1, Ordering::SeqCst);
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _waiting = Waiting(&share.waiting);
        if waiting >= self.limits.queue_per_session {
            return Err(Busy::SessionQueue {
                id: id.to_owned(),
                waiting,
                per_session: self.limits.per_session,
            });
        }
        let no_worker = || Busy::NoWorker {
            id: id.to_owned(),
            waited: self.limits.deadline,
            per_session: self.limits.per_session,
            workers: self.limits.workers,
        };
        let permits = async {
            let session = share.workers.clone().acquire_owned().await;
            let host = self.host.clone().acquire_owned().await;
            (session, host)
        };
        match tokio::time::timeout(self.limits.deadline, permits).await {
            Ok((Ok(session), Ok(host))) => Ok(Place {
                _session: session,
                _host: host,
                ticket,
            }),
            _ => Err(no_worker()),
        }
    }

    /// The refusal a new operation of session `id` would get at once (its queue is full), asked
    /// before anything else is done for it: a flood is turned away before it costs a lookup.
    pub fn refuses(&self, id: &str) -> Option<Busy> {
        let shares = self
            .shares
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let waiting = shares.get(id)?.waiting.load(Ordering::SeqCst);
        (waiting >= self.limits.queue_per_session).then(|| Busy::SessionQueue {
            id: id.to_owned(),
            waiting,
            per_session: self.limits.per_session,
        })
    }

    /// Operations running now, host-wide.
    pub fn running(&self) -> usize {
        self.limits.workers.max(1) - self.host.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_session_waits_behind_itself_and_the_others_keep_their_workers() {
        let work = FileWork::new(FileWorkLimits {
            workers: 3,
            per_session: 2,
            queue_per_session: 1,
            deadline: Duration::from_millis(200),
            ..FileWorkLimits::default()
        });
        let a1 = work.enter("a").await.expect("a's first");
        let a2 = work.enter("a").await.expect("a's second");
        // a's third waits for a's own share, and its fourth finds the queue full.
        let waiting = work.enter("a");
        tokio::pin!(waiting);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), &mut waiting)
                .await
                .is_err()
        );
        // Meanwhile b gets the host's last worker at once.
        let b = tokio::time::timeout(Duration::from_millis(20), work.enter("b"))
            .await
            .expect("b is not kept waiting")
            .expect("b's place");
        assert_eq!(work.running(), 3);
        drop(b);
        // The third of a's, still waiting, ends at the deadline with words.
        let late = waiting.await.err().expect("no worker within the deadline");
        assert!(
            late.to_string()
                .starts_with("no file worker came free for session 'a' within 0.2 s"),
            "{late}"
        );
        drop((a1, a2));
        assert_eq!(work.running(), 0);
    }

    #[tokio::test]
    async fn a_full_queue_is_refused_at_once() {
        let work = FileWork::new(FileWorkLimits {
            workers: 8,
            per_session: 1,
            queue_per_session: 1,
            deadline: Duration::from_secs(5),
            ..FileWorkLimits::default()
        });
        let _held = work.enter("a").await.expect("a's place");
        let waiting = work.enter("a");
        tokio::pin!(waiting);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), &mut waiting)
                .await
                .is_err()
        );
        let refused = work.enter("a").await.err().expect("refused");
        assert_eq!(
            refused.to_string(),
            "session 'a' already has 1 file operations waiting for its 1 workers (SANDBOXD_FILE_QUEUE_PER_SESSION); retry when some have finished"
        );
        // Another session is not refused for it.
        assert!(work.enter("b").await.is_ok());
    }
}
