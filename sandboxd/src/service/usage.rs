//! What a running sandbox uses (memory and its limit, CPU, processes), from Docker's stats of
//! its container, kept for [`USAGE_FRESH`] so that a dashboard polling every second, or a list
//! of every session, costs at most one Docker call per session per period. Concurrent askers of
//! one session wait for the one call under way instead of making their own.
//!
//! Docker's one-shot stats carry no previous reading, so the CPU rate is worked out against
//! the reading kept from before (Docker's own formula: container CPU time over the machine's,
//! times the CPUs online); a session with no reading younger than [`CPU_BASELINE_MAX_AGE`] takes
//! two, [`CPU_WINDOW`] apart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandboxd_api::session::SessionUsage;

use crate::container::Stats;
use crate::storage::store::{SessionRow, State};

use super::Core;

/// How long one answer is served before Docker is asked again.
pub const USAGE_FRESH: Duration = Duration::from_secs(2);
/// The oldest reading a CPU rate is worked out against.
pub const CPU_BASELINE_MAX_AGE: Duration = Duration::from_secs(60);
/// The window of the two readings taken when there is no baseline.
pub const CPU_WINDOW: Duration = Duration::from_millis(200);

/// The last reading and answer of one session's container.
#[derive(Default)]
struct Slot {
    container: String,
    reading: Option<(Instant, Stats)>,
    answer: Option<(Instant, Option<SessionUsage>)>,
}

/// Per session, the last reading and answer.
#[derive(Default)]
pub struct UsageCache {
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Slot>>>>,
}

impl UsageCache {
    fn slot(&self, id: &str) -> Arc<tokio::sync::Mutex<Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(id.to_owned())
            .or_default()
            .clone()
    }

    /// Forgets a session (destroyed).
    pub fn forget(&self, id: &str) {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(id);
    }
}

/// CPU use between two readings, in percent of one core: Docker's formula when both carry the
/// machine's CPU time, else the container's CPU time over the wall time between them.
pub fn cpu_percent(before: (Instant, &Stats), after: (Instant, &Stats)) -> Option<f64> {
    let used = after.1.cpu_total_ns?.checked_sub(before.1.cpu_total_ns?)? as f64;
    if let (Some(s0), Some(s1), Some(cpus)) =
        (before.1.system_ns, after.1.system_ns, after.1.online_cpus)
        && s1 > s0
    {
        return Some(used / (s1 - s0) as f64 * f64::from(cpus) * 100.0);
    }
    let wall = after.0.checked_duration_since(before.0)?.as_nanos() as f64;
    (wall > 0.0).then(|| used / wall * 100.0)
}

impl Core {
    /// What session `row`'s sandbox uses now: `None` unless it runs. Served from the answer
    /// kept for [`USAGE_FRESH`]; a Docker failure is no figure, never an error.
    pub async fn usage(&self, row: &SessionRow) -> Option<SessionUsage> {
        if row.state != State::Running {
            return None;
        }
        let container = row.container_id.as_deref()?;
        let slot = self.usage.slot(&row.id);
        let mut slot = slot.lock().await;
        if slot.container != container {
            *slot = Slot {
                container: container.to_owned(),
                ..Slot::default()
            };
        }
        if let Some((at, answer)) = &slot.answer
            && at.elapsed() < USAGE_FRESH
        {
            return answer.clone();
        }
        let answer = self.sample(container, &mut slot).await;
        slot.answer = Some((Instant::now(), answer.clone()));
        answer
    }

    async fn sample(&self, container: &str, slot: &mut Slot) -> Option<SessionUsage> {
        let read = || async move {
            self.metrics.usage_samples.inc();
            let stats = self.engine.stats(container).await.ok().flatten();
            stats.map(|s| (Instant::now(), s))
        };
        let mut baseline = slot
            .reading
            .take()
            .filter(|(at, _)| at.elapsed() < CPU_BASELINE_MAX_AGE);
        if baseline.is_none() {
            baseline = read().await;
            tokio::time::sleep(CPU_WINDOW).await;
        }
        let (at, now) = read().await?;
        slot.reading = Some((at, now));
        Some(SessionUsage {
            memory_bytes: now.memory_bytes,
            memory_limit_bytes: now.memory_limit_bytes,
            cpu_percent: baseline
                .and_then(|(t0, before)| cpu_percent((t0, &before), (at, &now)))
                .map(|p| (p * 10.0).round() / 10.0),
            pids: now.pids,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_follows_dockers_formula_else_wall_time() {
        let t0 = Instant::now();
        let reading = |cpu, system| Stats {
            cpu_total_ns: Some(cpu),
            system_ns: system,
            online_cpus: Some(4),
            ..Stats::default()
        };
        // Half of the machine's CPU time on four CPUs: two cores busy.
        let (a, b) = (reading(1_000, Some(10_000)), reading(3_000, Some(14_000)));
        assert_eq!(cpu_percent((t0, &a), (t0, &b)), Some(200.0));
        // Without the machine's figure: one core busy for the whole second.
        let (a, b) = (reading(0, None), reading(1_000_000_000, None));
        assert_eq!(
            cpu_percent((t0, &a), (t0 + Duration::from_secs(1), &b)),
            Some(100.0)
        );
        // A counter that went back (a restarted container) is no figure.
        assert_eq!(cpu_percent((t0, &b), (t0, &a)), None);
    }
}
