//! Prometheus metrics of the operator.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `controller` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    /// sandboxhost, runtime, sandboxsession or tombstone.
    pub controller: String,
}

/// `controller` and `error` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabel {
    /// The controller.
    pub controller: String,
    /// The error's stable label.
    pub error: String,
}

/// `phase` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// The session phase.
    pub phase: String,
}

/// The metrics.
pub struct Metrics {
    registry: Registry,
    /// Reconciles by controller.
    pub reconciles: Family<ControllerLabel, Counter>,
    /// Failed reconciles by controller and error.
    pub failures: Family<FailureLabel, Counter>,
    /// Reconcile durations by controller.
    pub duration: Family<ControllerLabel, Histogram>,
    /// Sessions by phase.
    pub sessions: Family<PhaseLabel, Gauge>,
    /// Tombstones waiting for their destroy.
    pub tombstones_pending: Gauge,
    /// Whether this replica leads (1) or waits (0).
    pub leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("sandbox_operator");
        let reconciles = Family::<ControllerLabel, Counter>::default();
        let failures = Family::<FailureLabel, Counter>::default();
        let duration = Family::<ControllerLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 16))
        });
        let sessions = Family::<PhaseLabel, Gauge>::default();
        let tombstones_pending = Gauge::default();
        let leader = Gauge::default();
        registry.register("reconciles", "Reconciles by controller", reconciles.clone());
        registry.register(
            "reconcile_failures",
            "Failed reconciles by controller and error",
            failures.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Reconcile durations",
            duration.clone(),
        );
        registry.register("sessions", "SandboxSessions by phase", sessions.clone());
        registry.register(
            "tombstones_pending",
            "Tombstones waiting for their destroy",
            tombstones_pending.clone(),
        );
        registry.register(
            "leader",
            "Whether this replica holds the lease",
            leader.clone(),
        );
        Self {
            registry,
            reconciles,
            failures,
            duration,
            sessions,
            tombstones_pending,
            leader,
        }
    }
}

impl Metrics {
    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_by_phase_are_exposed() {
        let m = Metrics::default();
        m.sessions.clear();
        m.sessions
            .get_or_create(&PhaseLabel {
                phase: "Running".into(),
            })
            .inc();
        let text = m.encode();
        assert!(
            text.contains("sandbox_operator_sessions{phase=\"Running\"} 1"),
            "{text}"
        );
    }
}
