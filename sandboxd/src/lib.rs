//! sandboxd, the node daemon: sandbox sessions in sibling containers with persistent host
//! workspaces. It knows Docker and the node's disk, and nothing of Kubernetes.
//!
//! The crate is laid out in rooms, each a folder that names a part of the architecture:
//!
//! - [`service`]: the core below both HTTP surfaces: sessions, runs, caps, tokens and policy,
//!   implemented once; what goes wrong there is a [`service::ServiceError`], which knows
//!   nothing of HTTP;
//! - [`http`]: the `/v1` API ([`http::v1`]) and the wire protocol of pydantic-ai-backend's
//!   sandboxd ([`http::wire`]), two surfaces that translate to and from the service, the
//!   API's errors and the status and code of every domain error ([`http::error`]), their
//!   OpenAPI documents and the connections they are served on;
//! - [`workspace`]: confined file access to a session's workspace, its disk, and the trash;
//! - [`container`]: the Docker engine and the network of sessions that need one;
//! - [`run`]: the run path seam, with Docker exec and the resident in-sandbox agent behind it;
//! - [`runtimes`]: the allowlist in the catalog format and its image builds (prewarm);
//!   [`service::pool`] keeps each runtime's warm pool of started containers an open takes;
//! - [`storage`]: sandboxd's state in SQLite, and the audit log in SQLite or PostgreSQL.
//!
//! Beside the rooms: [`config`] (flags and variables), [`server`] (start-up), [`tls`] (HTTPS
//! and its clients' trust), [`enrol`] (`sandboxd enrol`) and [`metrics`]. The typed client of
//! the `/v1` API is `sandboxd_api::client`; every type has one name.

#[cfg(test)]
mod client;
pub mod config;
pub mod container;
pub mod egress;
pub mod enrol;
pub mod http;
pub mod metrics;
pub mod run;
pub mod runtimes;
pub mod server;
pub mod service;
pub mod snapshot;
pub mod storage;
pub mod tls;
pub mod workspace;

/// The service name sandboxd reports in its index.
pub const SERVICE: &str = "sandboxd";
/// The version of this workspace, reported in the index and checked by the operator.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
