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

/// The controllers, as the `controller` label names them.
pub const CONTROLLERS: [&str; 6] = [
    "sandboxhost",
    "runtime",
    "sandboxsession",
    "tombstone",
    "discovery",
    "signer",
];

/// The phases of a SandboxSession, as the `phase` label names them.
pub const PHASES: [&str; 9] = [
    "Pending",
    "Preparing",
    "Running",
    "Sleeping",
    "Reclaimed",
    "Lost",
    "Rebuilding",
    "Failed",
    "Terminating",
];

/// `host` label: a SandboxHost's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostLabel {
    /// The SandboxHost.
    pub host: String,
}

/// `runtime` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuntimeLabel {
    /// The Runtime.
    pub runtime: String,
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
    /// Sessions whose container runs an older image than their Runtime's, by Runtime.
    pub outdated: Family<RuntimeLabel, Gauge>,
    /// Tombstones waiting for their destroy.
    pub tombstones_pending: Gauge,
    /// Creation time (Unix seconds) of the oldest Tombstone waiting for its destroy; 0 when
    /// none waits.
    pub tombstones_oldest: Gauge,
    /// Whether this replica leads (1) or waits (0).
    pub leader: Gauge,
    /// Per SandboxHost: 1 while its Ready condition is True.
    pub host_ready: Family<HostLabel, Gauge>,
    /// Per SandboxHost: 1 while its Reachable condition is True.
    pub host_reachable: Family<HostLabel, Gauge>,
    /// Per SandboxHost: 1 while it is disabled (`spec.disabled`: no new sessions, on purpose).
    pub host_disabled: Family<HostLabel, Gauge>,
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
        let outdated = Family::<RuntimeLabel, Gauge>::default();
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
            "sessions_outdated",
            "SandboxSessions whose container runs an older image than their Runtime's, by Runtime",
            outdated.clone(),
        );
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
        let tombstones_oldest = Gauge::default();
        registry.register(
            "tombstones_oldest_timestamp_seconds",
            "Creation time (Unix seconds) of the oldest Tombstone waiting for its destroy; 0 when none waits",
            tombstones_oldest.clone(),
        );
        let host_ready = Family::<HostLabel, Gauge>::default();
        let host_reachable = Family::<HostLabel, Gauge>::default();
        let host_disabled = Family::<HostLabel, Gauge>::default();
        registry.register(
            "host_ready",
            "Per SandboxHost: 1 while its Ready condition is True (sessions are placed on it)",
            host_ready.clone(),
        );
        registry.register(
            "host_reachable",
            "Per SandboxHost: 1 while its Reachable condition is True (its sandboxd answered the last probe)",
            host_reachable.clone(),
        );
        registry.register(
            "host_disabled",
            "Per SandboxHost: 1 while it is disabled (spec.disabled)",
            host_disabled.clone(),
        );
        // Every label value known beforehand has its series from the start, at 0: a rate is
        // right from the first event on, and a dashboard or alert finds what it queries.
        for controller in CONTROLLERS {
            let label = ControllerLabel {
                controller: controller.to_owned(),
            };
            let _ = reconciles.get_or_create(&label);
            let _ = duration.get_or_create(&label);
            for error in crate::error::Error::LABELS {
                let _ = failures.get_or_create(&FailureLabel {
                    controller: controller.to_owned(),
                    error: error.to_owned(),
                });
            }
        }
        for phase in PHASES {
            let _ = sessions.get_or_create(&PhaseLabel {
                phase: phase.to_owned(),
            });
        }
        Self {
            tombstones_oldest,
            host_ready,
            host_reachable,
            host_disabled,
            registry,
            reconciles,
            failures,
            duration,
            sessions,
            outdated,
            tombstones_pending,
            leader,
        }
    }
}

impl Metrics {
    /// Sets the gauges of SandboxHost `host`, or drops them when it is gone (`None`).
    pub fn set_host(&self, host: &str, state: Option<HostState>) {
        let label = HostLabel {
            host: host.to_owned(),
        };
        match state {
            Some(s) => {
                self.host_ready
                    .get_or_create(&label)
                    .set(i64::from(s.ready));
                self.host_reachable
                    .get_or_create(&label)
                    .set(i64::from(s.reachable));
                self.host_disabled
                    .get_or_create(&label)
                    .set(i64::from(s.disabled));
            }
            None => {
                self.host_ready.remove(&label);
                self.host_reachable.remove(&label);
                self.host_disabled.remove(&label);
            }
        }
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// What the host gauges say of one SandboxHost.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostState {
    /// Its Ready condition is True.
    pub ready: bool,
    /// Its Reachable condition is True.
    pub reachable: bool,
    /// It is disabled.
    pub disabled: bool,
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

    #[test]
    fn every_phase_and_controller_has_its_series_from_the_start() {
        // PHASES are the phases the CRD allows, all of them.
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(sandboxd_crds::v1alpha1::SandboxSession::crd())
            .expect("the CRD as JSON");
        let phase = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
            ["properties"]["phase"];
        let variants: Vec<&str> = phase["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("no enum in {phase}"))
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert_eq!(variants, PHASES);
        let text = Metrics::default().encode();
        for line in [
            "sandbox_operator_sessions{phase=\"Sleeping\"} 0",
            "sandbox_operator_reconciles_total{controller=\"tombstone\"} 0",
            "sandbox_operator_reconcile_failures_total{controller=\"sandboxhost\",error=\"HostError\"} 0",
            "sandbox_operator_reconcile_duration_seconds_count{controller=\"sandboxsession\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
    }

    #[test]
    fn a_host_has_gauges_until_it_is_gone() {
        let m = Metrics::default();
        m.set_host(
            "node-a",
            Some(HostState {
                ready: false,
                reachable: true,
                disabled: false,
            }),
        );
        let text = m.encode();
        for line in [
            "sandbox_operator_host_ready{host=\"node-a\"} 0",
            "sandbox_operator_host_reachable{host=\"node-a\"} 1",
            "sandbox_operator_host_disabled{host=\"node-a\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
        m.set_host("node-a", None);
        assert!(!m.encode().contains("node-a"), "{}", m.encode());
    }
}
