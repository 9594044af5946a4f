//! The request headers that name who acts, recorded in the audit log.

/// The header naming the agent behind a request; recorded in the audit log.
pub const AGENT_HEADER: &str = "x-sandbox-agent";

/// The header naming the (agent) run behind a request; recorded in the audit log.
pub const RUN_HEADER: &str = "x-sandbox-run";
