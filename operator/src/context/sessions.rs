//! The context's memory of each session between its reconciles: its phase (for the gauge), CPU
//! samples, the waits of a refused open, whether this replica opened it, when its token
//! Secret was last seen, its rebuilds and the rolling rebuilds per host, and the Tombstones
//! owed. Forgotten when the session goes.

use super::*;

/// A rebuild of a running session under way on a host ([`Context::rolling_slot`]).
pub struct RollingSlot {
    rolling: Arc<Mutex<HashMap<String, usize>>>,
    host: String,
}

impl Drop for RollingSlot {
    fn drop(&mut self) {
        let mut m = self.rolling.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.host) {
            *n = n.saturating_sub(1);
        }
    }
}

impl Context {
    /// CPU use of a session since its previous sample, in percent of one core; None on the
    /// first sample or a sample too close to the previous one.
    pub fn cpu_percent(&self, key: &str, cpu_ns: u64) -> Option<f64> {
        let now = Instant::now();
        let mut map = self.cpu.lock().unwrap_or_else(|p| p.into_inner());
        let previous = map.insert(key.to_owned(), (cpu_ns, now));
        let (ns, at) = previous?;
        let wall = now.duration_since(at).as_nanos() as f64;
        (wall >= 1e9).then(|| cpu_ns.saturating_sub(ns) as f64 / wall * 100.0)
    }

    /// Records the phase of a session (None when it is gone) and moves it between the gauge's
    /// phases: a constant cost per reconcile, however many sessions there are.
    pub fn set_phase(&self, key: &str, phase: Option<String>) {
        let mut phases = self.phases.lock().unwrap_or_else(|p| p.into_inner());
        let old = match &phase {
            Some(p) => phases.insert(key.to_owned(), p.clone()),
            None => phases.remove(key),
        };
        if old == phase {
            return;
        }
        if let Some(old) = old {
            self.metrics
                .sessions
                .get_or_create(&crate::metrics::PhaseLabel { phase: old })
                .dec();
        }
        if let Some(new) = phase {
            self.metrics
                .sessions
                .get_or_create(&crate::metrics::PhaseLabel { phase: new })
                .inc();
        }
    }

    /// Records whether a session runs an older image than its Runtime's (`Some(runtime)`) or
    /// not (`None`, also when it is gone) and moves it in the gauge of outdated sessions.
    pub fn set_outdated(&self, key: &str, runtime: Option<String>) {
        let mut outdated = self.outdated.lock().unwrap_or_else(|p| p.into_inner());
        let old = match &runtime {
            Some(r) => outdated.insert(key.to_owned(), r.clone()),
            None => outdated.remove(key),
        };
        if old == runtime {
            return;
        }
        if let Some(old) = old {
            self.metrics
                .outdated
                .get_or_create(&crate::metrics::RuntimeLabel { runtime: old })
                .dec();
        }
        if let Some(new) = runtime {
            self.metrics
                .outdated
                .get_or_create(&crate::metrics::RuntimeLabel { runtime: new })
                .inc();
        }
    }

    /// Records that the rebuild of `spec.rebuildGeneration` `generation` of a session was
    /// carried out (or failed) here.
    pub fn rebuilt(&self, key: &str, generation: i64) {
        self.rebuilt
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_owned(), generation);
    }

    /// The `spec.rebuildGeneration` of a session whose rebuild was last carried out here.
    pub fn rebuilt_generation(&self, key: &str) -> Option<i64> {
        self.rebuilt
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .copied()
    }

    /// One of the `max` rebuilds of running sessions that `host` may have under way at once,
    /// held until the guard is dropped; `None` when all are taken.
    pub fn rolling_slot(&self, host: &str, max: usize) -> Option<RollingSlot> {
        let mut m = self.rolling.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(host.to_owned()).or_default();
        if *n >= max.max(1) {
            return None;
        }
        *n += 1;
        Some(RollingSlot {
            rolling: self.rolling.clone(),
            host: host.to_owned(),
        })
    }

    /// Records whether a tombstone still waits for its destroy (`Some` of its creation time, in
    /// Unix seconds) or not (`None`), and refreshes the gauges of the count and the oldest.
    pub fn set_tombstone_pending(&self, key: &str, created: Option<i64>) {
        let mut map = self
            .pending_tombstones
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match created {
            Some(at) => {
                map.insert(key.to_owned(), at);
            }
            None => {
                map.remove(key);
            }
        }
        self.metrics
            .tombstones_pending
            .set(i64::try_from(map.len()).unwrap_or(i64::MAX));
        self.metrics
            .tombstones_oldest
            .set(map.values().copied().min().unwrap_or(0));
    }

    /// Records that the token Secret of session `key` was found (or made) now.
    pub fn token_seen(&self, key: &str) {
        self.token_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_owned(), Instant::now());
    }

    /// Whether the token Secret of session `key` was found within `--token-check-seconds`.
    pub fn token_seen_recently(&self, key: &str) -> bool {
        let period = Duration::from_secs(self.config.token_check_seconds);
        self.token_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .is_some_and(|at| at.elapsed() < period)
    }

    /// Forgets when the token Secret of a session was found, and this replica's last write of it.
    pub fn forget_token(&self, key: &str) {
        self.token_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        self.written_unseen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// The open of session `key` was refused once more (a cap, no host, a conflict): how long
    /// until it is tried again ([`crate::backoff::wait_delay`]).
    pub fn wait_again(&self, key: &str) -> Duration {
        crate::backoff::wait_delay(bump(&self.waits, key))
    }

    /// Forgets the refusals of session `key` (it opened, or is gone).
    pub fn forget_waits(&self, key: &str) {
        self.waits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// Records that this replica wrote session `key` (object `uid`), making `resource_version`.
    pub fn wrote(&self, key: &str, uid: &str, resource_version: &str) {
        self.written_unseen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                key.to_owned(),
                (uid.to_owned(), resource_version.to_owned(), Instant::now()),
            );
    }

    /// Whether the copy of session `key` (object `uid`, at `resource_version`) a reconcile was
    /// handed is older than this replica's last write of it: the watch has not brought that
    /// write yet, and acting on the copy would undo it (a status written from it drops what the
    /// write added, an open is made twice). A copy as new as the write, or newer (someone else
    /// wrote since), ends the wait, and so does [`CACHE_CATCH_UP_LIMIT`].
    pub fn behind_own_write(&self, key: &str, uid: &str, resource_version: &str) -> bool {
        let mut unseen = self
            .written_unseen
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let waiting = unseen.get(key).is_some_and(|(u, written, at)| {
            u == uid && at.elapsed() < CACHE_CATCH_UP_LIMIT && older(resource_version, written)
        });
        if !waiting {
            unseen.remove(key);
        }
        waiting
    }

    /// Forgets the CPU sample of a session.
    pub fn forget_cpu(&self, key: &str) {
        self.cpu
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

/// Whether resourceVersion `a` is older than `b`. The API server's resourceVersions are etcd
/// revisions, decimal and increasing (comparable since Kubernetes 1.34, KEP-5504); two that are
/// not numbers are taken as equal, so nothing waits on them.
fn older(a: &str, b: &str) -> bool {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) => a < b,
        _ => false,
    }
}

#[cfg(test)]
mod read_your_writes {
    use super::older;

    #[test]
    fn a_copy_is_behind_only_when_its_version_is_lower() {
        assert!(older("99", "100"));
        assert!(!older("100", "100"));
        assert!(!older("101", "100"));
        assert!(!older("", "100"));
        assert!(!older("abc", "100"));
    }
}
