//! sandboxd, the node daemon: sandbox sessions in sibling containers with persistent host
//! workspaces. It knows Docker and the node's disk, and nothing of Kubernetes.
//!
//! - [`core`]: sessions, runs, files, caps and tokens, implemented once below the HTTP surfaces;
//! - [`api`]: the `/v1` HTTP API, described by [`openapi`], whose types, error codes, routes and
//!   typed client ([`client`]) are the `sandboxd-api` crate's; [`wire`]: the wire protocol of
//!   pydantic-ai-backend's sandboxd, a second surface over the same core;
//! - [`network`]: the network of sessions whose runtime needs one, fenced in by iptables;
//! - [`docker`]: the Docker edge; [`runner`]: the run path seam; [`agent_runner`]: runs through
//!   the resident in-sandbox agent (the `sandbox-agent` crate); [`files`]: confined file access;
//! - [`store`]: state in SQLite with guarded transitions; [`server`]: start-up;
//! - [`trash`]: folders moved aside and deleted in the background, iteratively;
//!   [`connections`]: the HTTP connections and their header, body and idle timeouts;
//!   [`tls`]: HTTPS on sandboxd's port (certificate reloaded on change), and its clients' trust;
//! - [`runtimes`]: the allowlist in the catalog format and its image builds (prewarm);
//!   [`pool`]: each runtime's warm pool of started containers an open takes;
//! - [`audit`]: the audit log of workspace operations, in SQLite or PostgreSQL.

pub mod agent_runner;
pub mod api;
pub mod audit;
pub mod auth;
pub mod client;
pub mod config;
pub mod connections;
pub mod core;
pub mod disk;
pub mod docker;
pub mod enrol;
pub mod error;
pub mod files;
pub mod identity;
pub mod metrics;
pub mod network;
pub mod openapi;
pub mod policy;
pub mod pool;
pub mod runner;
pub mod runtimes;
pub mod server;
pub mod store;
pub mod tls;
pub mod trash;
pub mod view;
pub mod wire;
pub mod wire_openapi;

/// The service name sandboxd reports in its index.
pub const SERVICE: &str = "sandboxd";
/// The version of this workspace, reported in the index and checked by the operator.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
