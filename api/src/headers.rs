//! The request headers that name who acts, recorded in the audit log, and the one that carries
//! the trace a request belongs to.

/// The header naming the agent behind a request; recorded in the audit log.
pub const AGENT_HEADER: &str = "x-sandbox-agent";

/// The header naming the (agent) run behind a request; recorded in the audit log.
pub const RUN_HEADER: &str = "x-sandbox-run";

/// The W3C trace context of a request (`00-<trace id>-<span id>-<flags>`): sandboxd's spans of
/// it join that trace when tracing is on.
pub const TRACEPARENT_HEADER: &str = "traceparent";
