//! Prometheus metrics of sandboxd.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use sandboxd_api::run::RunOutcome;

/// A label set with one `outcome` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    /// created, found, refused, failed; or exited, failed, timed_out, stopped.
    pub outcome: String,
}

impl Outcome {
    /// A label set.
    pub fn new(outcome: &str) -> Self {
        Self {
            outcome: outcome.to_owned(),
        }
    }
}

/// A label set with one `state` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// The session state.
    pub state: String,
}

/// A label set with one `path` label: how a run reached its sandbox.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabel {
    /// agent, exec (the configured backend) or exec_fallback (no usable agent).
    pub path: String,
}

/// A label set with one `runtime` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuntimeLabel {
    /// The runtime alias.
    pub runtime: String,
}

/// The metrics.
pub struct Metrics {
    registry: Registry,
    /// Session opens by outcome.
    pub opens: Family<Outcome, Counter>,
    /// Runs by outcome.
    pub runs: Family<Outcome, Counter>,
    /// Run wall time in seconds.
    pub run_seconds: Histogram,
    /// Sessions by state, set at each scrape.
    pub sessions: Family<StateLabel, Gauge>,
    /// Runs by the path that carried them.
    pub run_paths: Family<PathLabel, Counter>,
    /// Sandbox agents found dead (their container stopped under a running session).
    pub agent_deaths: Counter,
    /// Sockets of a session's agent refused as not the agent's (not PID 1 of the container,
    /// or a run folder or socket that is not sandboxd's alone).
    pub agent_untrusted: Counter,
    /// Looks at Docker the run path made for a container's PID 1 (once per container start; a
    /// session that took a warm container makes none: the claim's own look tells it).
    pub agent_pid_lookups: Counter,
    /// Audit rows dropped: the queue full (the store slow or down) or the store failing.
    pub audit_rows_dropped: Counter,
    /// Containers each runtime's warm pool keeps ready (its size).
    pub warm_pool_size: Family<RuntimeLabel, Gauge>,
    /// Containers ready in each runtime's warm pool now.
    pub warm_pool_ready: Family<RuntimeLabel, Gauge>,
    /// Memory of each runtime's warm pool: the sum of its ready containers' memory limits.
    pub warm_pool_memory: Family<RuntimeLabel, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("sandboxd");
        let opens = Family::<Outcome, Counter>::default();
        let runs = Family::<Outcome, Counter>::default();
        let run_seconds = Histogram::new(exponential_buckets(0.005, 2.0, 16));
        let sessions = Family::<StateLabel, Gauge>::default();
        registry.register("session_opens", "Session opens by outcome", opens.clone());
        registry.register("runs", "Runs by outcome", runs.clone());
        registry.register("run_seconds", "Wall time of runs", run_seconds.clone());
        registry.register("sessions", "Sessions by state", sessions.clone());
        let run_paths = Family::<PathLabel, Counter>::default();
        let agent_deaths = Counter::default();
        let agent_untrusted = Counter::default();
        registry.register(
            "run_paths",
            "Runs by the path that carried them (agent, exec, exec_fallback)",
            run_paths.clone(),
        );
        registry.register(
            "agent_deaths",
            "Sandbox agents found dead; their containers were started again",
            agent_deaths.clone(),
        );
        registry.register(
            "agent_untrusted",
            "Agent sockets refused as not served by the container's PID 1 (runs went to exec)",
            agent_untrusted.clone(),
        );
        let agent_pid_lookups = Counter::default();
        registry.register(
            "agent_pid_lookups",
            "Docker inspects the run path made to learn a container's PID 1 (none for a session that took a warm container)",
            agent_pid_lookups.clone(),
        );
        let audit_rows_dropped = Counter::default();
        registry.register(
            "audit_rows_dropped",
            "Audit rows dropped because the audit queue was full (SANDBOXD_AUDIT_QUEUE) or the audit store failed",
            audit_rows_dropped.clone(),
        );
        let warm_pool_size = Family::<RuntimeLabel, Gauge>::default();
        let warm_pool_ready = Family::<RuntimeLabel, Gauge>::default();
        let warm_pool_memory = Family::<RuntimeLabel, Gauge>::default();
        registry.register(
            "warm_pool_size",
            "Started containers each runtime's warm pool keeps ready",
            warm_pool_size.clone(),
        );
        registry.register(
            "warm_pool_ready",
            "Started containers ready in each runtime's warm pool",
            warm_pool_ready.clone(),
        );
        registry.register_with_unit(
            "warm_pool_memory",
            "Memory limits of the containers ready in each runtime's warm pool",
            prometheus_client::registry::Unit::Bytes,
            warm_pool_memory.clone(),
        );
        Self {
            registry,
            warm_pool_size,
            warm_pool_ready,
            warm_pool_memory,
            opens,
            runs,
            run_seconds,
            sessions,
            run_paths,
            agent_deaths,
            agent_untrusted,
            agent_pid_lookups,
            audit_rows_dropped,
        }
    }
}

impl Metrics {
    /// Counts a finished run.
    pub fn observe_run(&self, run: &RunOutcome) {
        let outcome = if run.timed_out {
            "timed_out"
        } else if run.stopped {
            "stopped"
        } else if run.exit_code == 0 {
            "exited"
        } else {
            "failed"
        };
        self.runs.get_or_create(&Outcome::new(outcome)).inc();
        self.run_seconds.observe(run.duration_ms as f64 / 1000.0);
    }

    /// Counts a run by the path that carried it.
    pub fn run_path(&self, path: &str) {
        self.run_paths
            .get_or_create(&PathLabel {
                path: path.to_owned(),
            })
            .inc();
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
