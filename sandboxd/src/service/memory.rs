//! The budget of bytes in flight: what reads (and the bodies of writes) hold in sandboxd's
//! memory at once, host-wide (`SANDBOXD_MEMORY_BUDGET`) and per session
//! (`SANDBOXD_SESSION_MEMORY_BUDGET`). A read reserves its bytes before it reads them and gives
//! them back once its answer is sent (or its client is gone); a request that finds the budget
//! full waits briefly and is then refused with words (503), so a tenant with many slow readers
//! cannot grow sandboxd's memory past the budget, and with it the node's.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::workspace::deadline::{Held, Memory};
use crate::workspace::disk::human;

/// The host's and every session's bytes in flight.
#[derive(Debug)]
pub struct MemoryBudget {
    host: u64,
    per_session: u64,
    wait: Duration,
    used: Mutex<Used>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct Used {
    host: u64,
    sessions: HashMap<String, u64>,
}

/// Bytes reserved for one session; given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<MemoryBudget>,
    id: String,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut used = self.budget.lock();
        used.host = used.host.saturating_sub(self.bytes);
        if let Some(s) = used.sessions.get_mut(&self.id) {
            *s = s.saturating_sub(self.bytes);
            if *s == 0 {
                used.sessions.remove(&self.id);
            }
        }
        drop(used);
        self.budget.freed.notify_all();
    }
}

impl MemoryBudget {
    /// A budget of `host` bytes in all, `per_session` for one session; a reservation waits at
    /// most `wait` for room.
    pub fn new(host: u64, per_session: u64, wait: Duration) -> Arc<Self> {
        Arc::new(Self {
            host,
            per_session: per_session.min(host),
            wait,
            used: Mutex::default(),
            freed: Condvar::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Used> {
        self.used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Bytes reserved now, host-wide.
    pub fn in_flight(&self) -> u64 {
        self.lock().host
    }

    /// Reserves `bytes` for session `id`, waiting (this thread blocks) up to the budget's wait
    /// when `wait`; the error says which budget is full.
    pub fn reserve(
        self: &Arc<Self>,
        id: &str,
        bytes: u64,
        wait: bool,
    ) -> Result<Reservation, String> {
        if bytes > self.per_session {
            return Err(format!(
                "{} would be held at once, more than a session may hold in flight ({}, SANDBOXD_SESSION_MEMORY_BUDGET); ask for less at a time",
                human(bytes),
                human(self.per_session)
            ));
        }
        let until = Instant::now() + if wait { self.wait } else { Duration::ZERO };
        let mut used = self.lock();
        loop {
            let session = used.sessions.get(id).copied().unwrap_or(0);
            let host_room = used.host + bytes <= self.host;
            let session_room = session + bytes <= self.per_session;
            if host_room && session_room {
                used.host += bytes;
                *used.sessions.entry(id.to_owned()).or_default() += bytes;
                return Ok(Reservation {
                    budget: self.clone(),
                    id: id.to_owned(),
                    bytes,
                });
            }
            let now = Instant::now();
            if now >= until {
                return Err(if session_room {
                    format!(
                        "sandboxd holds {} of reads and writes in flight on this host, its budget (SANDBOXD_MEMORY_BUDGET), and {} more did not fit within {} s; retry shortly",
                        human(used.host),
                        human(bytes),
                        self.wait.as_secs_f64()
                    )
                } else {
                    format!(
                        "session '{id}' holds {} of reads and writes in flight, its budget (SANDBOXD_SESSION_MEMORY_BUDGET), and {} more did not fit within {} s; read what was asked before asking for more",
                        human(session),
                        human(bytes),
                        self.wait.as_secs_f64()
                    )
                });
            }
            used = self
                .freed
                .wait_timeout(used, until - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}

/// A session's view of the budget, for the ticket of one of its file operations.
pub struct SessionMemory {
    /// The budget.
    pub budget: Arc<MemoryBudget>,
    /// The session.
    pub id: String,
}

impl Memory for SessionMemory {
    fn reserve(&self, bytes: u64) -> Result<Held, String> {
        self.budget
            .reserve(&self.id, bytes, true)
            .map(|r| Box::new(r) as Held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_held_until_dropped_and_full_budgets_say_which() {
        let b = MemoryBudget::new(10 << 20, 6 << 20, Duration::from_millis(50));
        let a1 = b.reserve("a", 4 << 20, true).expect("a's first");
        let e = b.reserve("a", 4 << 20, true).expect_err("over a's share");
        assert_eq!(
            e,
            "session 'a' holds 4 MiB of reads and writes in flight, its budget (SANDBOXD_SESSION_MEMORY_BUDGET), and 4 MiB more did not fit within 0.05 s; read what was asked before asking for more"
        );
        let b1 = b.reserve("b", 6 << 20, false).expect("b's");
        let e = b.reserve("c", 1 << 20, false).expect_err("over the host's");
        assert!(
            e.starts_with("sandboxd holds 10 MiB of reads and writes in flight on this host"),
            "{e}"
        );
        assert_eq!(b.in_flight(), 10 << 20);
        drop(a1);
        assert_eq!(b.in_flight(), 6 << 20);
        let c = b.reserve("c", 1 << 20, false).expect("room again");
        drop((b1, c));
        assert_eq!(b.in_flight(), 0);
        let e = b.reserve("a", 7 << 20, true).expect_err("never fits");
        assert!(e.starts_with("7 MiB would be held at once"), "{e}");
    }

    #[test]
    fn a_waiting_reservation_gets_the_room_another_gives_back() {
        let b = MemoryBudget::new(4 << 20, 4 << 20, Duration::from_secs(5));
        let held = b.reserve("a", 4 << 20, true).expect("all of it");
        let waiter = std::thread::spawn({
            let b = b.clone();
            move || b.reserve("a", 1 << 20, true).map(|_| ())
        });
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
        assert_eq!(waiter.join().expect("joined"), Ok(()));
    }
}
