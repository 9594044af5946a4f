//! Prometheus metrics of sandboxd.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use sandboxd_api::run::RunOutcome;
use sandboxd_api::session::Launch;

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

/// A label set with one `cap` label: which cap refused a connection.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CapLabel {
    /// total (SANDBOXD_MAX_CONNECTIONS) or per_source (SANDBOXD_MAX_CONNECTIONS_PER_SOURCE).
    pub cap: String,
}

/// A label set with one `launch` label: how an open started its sandbox.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaunchLabel {
    /// cold (a container created and started) or warm (one taken from a warm pool).
    pub launch: String,
}

/// A label set with one `from` label: what a wake found.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WakeLabel {
    /// stopped (its container started again) or reclaimed (a container created anew).
    pub from: String,
}

/// The labels of a checkpoint or restore of a gVisor sandbox: which, and how it went.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckpointLabels {
    /// checkpoint (a sleep with memory) or restore (its wake).
    pub op: String,
    /// ok or failed (a failed checkpoint slept without memory; a failed restore woke fresh).
    pub outcome: String,
}

/// The labels of an MCP tool call: which tool, and whether it answered an error.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct McpToolLabels {
    /// The tool (`run`, `read_file`, …).
    pub tool: String,
    /// ok, or error (the tool's answer was an error the agent reads).
    pub outcome: String,
}

/// A label set with one `op` label: a workspace operation as the audit log names it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    /// read, write, ls, mkdir, remove.
    pub op: String,
}

/// The labels of an egress verdict: the runtime and what was decided.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EgressLabels {
    /// The runtime alias.
    pub runtime: String,
    /// allowed or denied.
    pub verdict: String,
}

/// The labels of bytes carried by the egress proxy.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EgressBytesLabels {
    /// The runtime alias.
    pub runtime: String,
    /// out (sent by the sandbox) or in (received by it).
    pub direction: String,
}

/// The labels of a credential the egress proxy added to a request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EgressCredentialLabels {
    /// The runtime alias.
    pub runtime: String,
    /// Where the credential comes from, as its sender named it (never its value).
    pub source: String,
}

/// The labels of an HTTP request: method, route and status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// GET, PUT, POST, DELETE.
    pub method: String,
    /// The route as the router names it (`/v1/sessions/{id}/runs`).
    pub route: String,
    /// The status code of the answer.
    pub status: String,
}

/// Buckets of the HTTP request histogram: 1 ms to about 33 s, doubling.
fn request_latency() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Buckets of the latency histograms: 5 ms to about 160 s, doubling.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 16))
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
    /// Checkpoints and restores of gVisor sandboxes by outcome.
    pub checkpoints: Family<CheckpointLabels, Counter>,
    /// Terminal opens by outcome: opened, refused (the cap, a bad request), failed.
    pub terminal_opens: Family<Outcome, Counter>,
    /// Connections to sandboxes' ports by outcome: connected, not_open, closed (nothing
    /// answered), failed.
    pub port_connections: Family<Outcome, Counter>,
    /// MCP tool calls by tool and outcome.
    pub mcp_tool_calls: Family<McpToolLabels, Counter>,
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
    /// Docker stats calls made for sessions' `usage` (at most one per session per
    /// [`crate::service::USAGE_FRESH`], however often it is asked).
    pub usage_samples: Counter,
    /// Times the sandbox network's firewall was found changed (a chain flushed or removed, a
    /// jump gone or pushed down) and installed again.
    pub firewall_repairs: Counter,
    /// 1 while the sandbox network's firewall is whole (or no network is set up), 0 while it
    /// is missing and cannot be installed again.
    pub firewall_intact: Gauge,
    /// Connections closed at their accept, by the cap they were over.
    pub connections_refused: Family<CapLabel, Counter>,
    /// Connections open now.
    pub connections_open: Gauge,
    /// Wall time of opens that created a session, by launch.
    pub open_seconds: Family<LaunchLabel, Histogram>,
    /// Wall time of wakes of a session that was not running, by what they found.
    pub wake_seconds: Family<WakeLabel, Histogram>,
    /// Time from a run's start on its path until its program runs, by path.
    pub run_start_seconds: Family<PathLabel, Histogram>,
    /// Wall time of workspace operations, by operation.
    pub file_op_seconds: Family<OpLabel, Histogram>,
    /// Opens of a runtime that keeps a warm pool which found it empty and started cold.
    pub warm_pool_empty_opens: Family<RuntimeLabel, Counter>,
    /// The workspace budget (SANDBOXD_WORKSPACE_BUDGET or its default); 0 where there is none.
    pub workspace_budget: Gauge,
    /// The nominal bytes of the workspace disks held now, set at each scrape.
    pub workspace_held: Gauge,
    /// HTTP requests: time until the answer's head, by method, route and status.
    pub request_seconds: Family<RequestLabels, Histogram>,
    /// Audit rows waiting in the queue for the store, set at each scrape.
    pub audit_queue: Gauge,
    /// The audit queue's size (SANDBOXD_AUDIT_QUEUE).
    pub audit_queue_capacity: Gauge,
    /// Connections through the egress proxy, by runtime and verdict.
    pub egress_connections: Family<EgressLabels, Counter>,
    /// DNS queries to the egress resolver, by runtime and verdict.
    pub egress_queries: Family<EgressLabels, Counter>,
    /// Bytes the egress proxy carried, by runtime and direction.
    pub egress_bytes: Family<EgressBytesLabels, Counter>,
    /// Credentials the egress proxy added to requests, by runtime and source.
    pub egress_credentials_added: Family<EgressCredentialLabels, Counter>,
}

impl Default for Metrics {
    /// Every metric, registered with its name and help, and every series whose labels are
    /// known beforehand created at 0. Over 150 lines: one flat list, a metric a few lines,
    /// which reads best whole (a split would only scatter the names a dashboard looks for).
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
        let checkpoints = Family::<CheckpointLabels, Counter>::default();
        registry.register(
            "checkpoints",
            "Checkpoints (sleeps with memory) and restores (their wakes) of gVisor sandboxes, by outcome",
            checkpoints.clone(),
        );
        let terminal_opens = Family::<Outcome, Counter>::default();
        registry.register(
            "terminal_opens",
            "Terminal opens by outcome (opened, refused: the cap or a bad request, failed)",
            terminal_opens.clone(),
        );
        let port_connections = Family::<Outcome, Counter>::default();
        registry.register(
            "port_connections",
            "Connections to sandboxes' ports through sandboxd by outcome (connected, not_open, closed, failed)",
            port_connections.clone(),
        );
        let mcp_tool_calls = Family::<McpToolLabels, Counter>::default();
        registry.register(
            "mcp_tool_calls",
            "Tool calls of sessions' MCP servers by tool and outcome (ok, error)",
            mcp_tool_calls.clone(),
        );
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
        let usage_samples = Counter::default();
        registry.register(
            "usage_samples",
            "Docker stats calls made for sessions' usage (each answer is kept for 2 s)",
            usage_samples.clone(),
        );
        let firewall_repairs = Counter::default();
        registry.register(
            "firewall_repairs",
            "Times the sandbox network's firewall was found changed (a chain flushed, a jump gone or no longer first) and installed again",
            firewall_repairs.clone(),
        );
        let firewall_intact = Gauge::default();
        firewall_intact.set(1);
        registry.register(
            "firewall_intact",
            "1 while the sandbox network's firewall is whole or no network is set up; 0 while it is missing and cannot be installed again",
            firewall_intact.clone(),
        );
        let connections_refused = Family::<CapLabel, Counter>::default();
        registry.register(
            "connections_refused",
            "Connections closed at their accept, by the cap they were over (total: SANDBOXD_MAX_CONNECTIONS, per_source: SANDBOXD_MAX_CONNECTIONS_PER_SOURCE)",
            connections_refused.clone(),
        );
        let connections_open = Gauge::default();
        registry.register(
            "connections_open",
            "HTTP connections open now",
            connections_open.clone(),
        );
        let open_seconds = Family::<LaunchLabel, Histogram>::new_with_constructor(latency);
        registry.register(
            "open_seconds",
            "Wall time of opens that created a session, by launch (cold: created and started; warm: taken from a warm pool; restored: created with its workspace restored from a snapshot)",
            open_seconds.clone(),
        );
        let wake_seconds = Family::<WakeLabel, Histogram>::new_with_constructor(latency);
        registry.register(
            "wake_seconds",
            "Wall time of wakes of a session that was not running, by what they found (stopped: started again; reclaimed: created anew)",
            wake_seconds.clone(),
        );
        let run_start_seconds =
            Family::<PathLabel, Histogram>::new_with_constructor(request_latency);
        registry.register(
            "run_start_seconds",
            "Time from a run's start on its path (agent: the sandbox's agent reached; exec: Docker exec created) until its program runs",
            run_start_seconds.clone(),
        );
        let file_op_seconds = Family::<OpLabel, Histogram>::new_with_constructor(latency);
        registry.register(
            "file_op_seconds",
            "Wall time of workspace operations (read, write, ls, mkdir, remove), refused and failed ones included",
            file_op_seconds.clone(),
        );
        let warm_pool_empty_opens = Family::<RuntimeLabel, Counter>::default();
        registry.register(
            "warm_pool_empty_opens",
            "Opens of a runtime that keeps a warm pool which found the pool empty and started cold",
            warm_pool_empty_opens.clone(),
        );
        let workspace_budget = Gauge::default();
        registry.register_with_unit(
            "workspace_budget",
            "The bytes of workspace disks this host holds at most (SANDBOXD_WORKSPACE_BUDGET); 0 without workspace disks (no budget)",
            prometheus_client::registry::Unit::Bytes,
            workspace_budget.clone(),
        );
        let workspace_held = Gauge::default();
        registry.register_with_unit(
            "workspace_held",
            "The nominal bytes of the workspace disks this host holds now (sleeping and reclaimed sessions' included)",
            prometheus_client::registry::Unit::Bytes,
            workspace_held.clone(),
        );
        let request_seconds =
            Family::<RequestLabels, Histogram>::new_with_constructor(request_latency);
        registry.register(
            "http_request_seconds",
            "HTTP requests of both surfaces: the time until the answer's head, by method, route and status",
            request_seconds.clone(),
        );
        let audit_queue = Gauge::default();
        registry.register_with_unit(
            "audit_queue",
            "Audit rows waiting in the queue for the audit store",
            prometheus_client::registry::Unit::Other("rows".to_owned()),
            audit_queue.clone(),
        );
        let audit_queue_capacity = Gauge::default();
        registry.register_with_unit(
            "audit_queue_capacity",
            "Audit rows the queue holds at most (SANDBOXD_AUDIT_QUEUE); a row recorded while it is full is dropped",
            prometheus_client::registry::Unit::Other("rows".to_owned()),
            audit_queue_capacity.clone(),
        );
        let egress_connections = Family::<EgressLabels, Counter>::default();
        registry.register(
            "egress_connections",
            "Connections of sandboxes of allowlist runtimes through the egress proxy, by runtime and verdict (allowed, denied)",
            egress_connections.clone(),
        );
        let egress_queries = Family::<EgressLabels, Counter>::default();
        registry.register(
            "egress_dns_queries",
            "DNS queries of sandboxes of allowlist runtimes to the egress resolver, by runtime and verdict (allowed, denied)",
            egress_queries.clone(),
        );
        let egress_bytes = Family::<EgressBytesLabels, Counter>::default();
        registry.register_with_unit(
            "egress",
            "Bytes the egress proxy carried for sandboxes of allowlist runtimes, by runtime and direction (out: sent by the sandbox)",
            prometheus_client::registry::Unit::Bytes,
            egress_bytes.clone(),
        );
        let egress_credentials_added = Family::<EgressCredentialLabels, Counter>::default();
        registry.register(
            "egress_credentials_added",
            "Credentials the egress proxy added to requests of sandboxes of allowlist runtimes, by runtime and source (where the credential comes from, never its value)",
            egress_credentials_added.clone(),
        );
        // Every label value known beforehand has its series from the start, at 0: a rate is
        // right from the first event on, and a dashboard or alert finds what it queries.
        for outcome in ["created", "found", "refused", "failed"] {
            let _ = opens.get_or_create(&Outcome::new(outcome));
        }
        for outcome in ["exited", "failed", "timed_out", "stopped"] {
            let _ = runs.get_or_create(&Outcome::new(outcome));
        }
        for outcome in ["opened", "refused", "failed"] {
            let _ = terminal_opens.get_or_create(&Outcome::new(outcome));
        }
        for outcome in ["connected", "not_open", "closed", "failed"] {
            let _ = port_connections.get_or_create(&Outcome::new(outcome));
        }
        for op in ["checkpoint", "restore"] {
            for outcome in ["ok", "failed"] {
                let _ = checkpoints.get_or_create(&CheckpointLabels {
                    op: op.to_owned(),
                    outcome: outcome.to_owned(),
                });
            }
        }
        for path in ["agent", "exec", "exec_fallback"] {
            let _ = run_paths.get_or_create(&PathLabel {
                path: path.to_owned(),
            });
        }
        for cap in ["total", "per_source"] {
            let _ = connections_refused.get_or_create(&CapLabel {
                cap: cap.to_owned(),
            });
        }
        for launch in ["cold", "warm"] {
            let _ = open_seconds.get_or_create(&LaunchLabel {
                launch: launch.to_owned(),
            });
        }
        for from in ["stopped", "reclaimed"] {
            let _ = wake_seconds.get_or_create(&WakeLabel {
                from: from.to_owned(),
            });
        }
        for op in ["read", "write", "ls", "mkdir", "remove"] {
            let _ = file_op_seconds.get_or_create(&OpLabel { op: op.to_owned() });
        }
        for path in ["agent", "exec"] {
            let _ = run_start_seconds.get_or_create(&PathLabel {
                path: path.to_owned(),
            });
        }
        Self {
            registry,
            request_seconds,
            audit_queue,
            audit_queue_capacity,
            egress_connections,
            egress_queries,
            egress_bytes,
            egress_credentials_added,
            open_seconds,
            wake_seconds,
            run_start_seconds,
            file_op_seconds,
            warm_pool_empty_opens,
            workspace_budget,
            workspace_held,
            usage_samples,
            connections_refused,
            connections_open,
            firewall_repairs,
            firewall_intact,
            warm_pool_size,
            warm_pool_ready,
            warm_pool_memory,
            opens,
            runs,
            run_seconds,
            sessions,
            run_paths,
            agent_deaths,
            checkpoints,
            terminal_opens,
            port_connections,
            mcp_tool_calls,
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

    /// Times a run's start on `path` (agent or exec), from `started` until its program runs.
    pub fn observe_run_start(&self, path: &str, started: std::time::Instant) {
        self.run_start_seconds
            .get_or_create(&PathLabel {
                path: path.to_owned(),
            })
            .observe(started.elapsed().as_secs_f64());
    }

    /// Counts a checkpoint or restore (`op`) of a gVisor sandbox by its outcome.
    pub fn checkpoint(&self, op: &str, outcome: &str) {
        self.checkpoints
            .get_or_create(&CheckpointLabels {
                op: op.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Counts a run by the path that carried it.
    pub fn run_path(&self, path: &str) {
        self.run_paths
            .get_or_create(&PathLabel {
                path: path.to_owned(),
            })
            .inc();
    }

    /// Times an open that created a session, launched `launch`, from `started`.
    pub fn observe_open(&self, launch: Launch, started: std::time::Instant) {
        let launch = match launch {
            Launch::Cold => "cold",
            Launch::Warm => "warm",
            Launch::Restored => "restored",
        };
        self.open_seconds
            .get_or_create(&LaunchLabel {
                launch: launch.to_owned(),
            })
            .observe(started.elapsed().as_secs_f64());
    }

    /// Times a wake of a session found `from` (stopped, reclaimed), from `started`.
    pub fn observe_wake(&self, from: &str, started: std::time::Instant) {
        self.wake_seconds
            .get_or_create(&WakeLabel {
                from: from.to_owned(),
            })
            .observe(started.elapsed().as_secs_f64());
    }

    /// Times an HTTP request answered `status`, from `started`.
    pub fn observe_request(
        &self,
        method: String,
        route: String,
        status: u16,
        started: std::time::Instant,
    ) {
        self.request_seconds
            .get_or_create(&RequestLabels {
                method,
                route,
                status: status.to_string(),
            })
            .observe(started.elapsed().as_secs_f64());
    }

    /// Times workspace operation `op`, from `started`.
    pub fn observe_file_op(&self, op: &str, started: std::time::Instant) {
        self.file_op_seconds
            .get_or_create(&OpLabel { op: op.to_owned() })
            .observe(started.elapsed().as_secs_f64());
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
