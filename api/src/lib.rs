//! The contract of sandboxd's `/v1` API: what crosses the wire and nothing of the daemon.
//!
//! - [`session`], [`run`], [`terminal`], [`files`], [`runtimes`], [`policy`], [`audit`]: the request and
//!   response types, which sandboxd serves and its OpenAPI document describes;
//! - [`error`]: the body of every error and its typed [`ErrorCode`];
//! - [`routes`]: the routes sandboxd serves (its router is checked against them) and the index;
//! - [`headers`]: the headers that name the agent and run behind a request;
//! - [`auth`]: the admin token derived for one node;
//! - [`client`]: the typed client the operator, the CLI and the tests use, [`tls`], what it
//!   needs of TLS, and [`ws`], the client end of a terminal's WebSocket.
//!
//! The operator and `kubectl sandbox` depend on this crate and not on the daemon: no HTTP
//! server, Docker client or database comes with it.

pub mod audit;
pub mod auth;
pub mod client;
pub mod egress;
pub mod enrol;
pub mod error;
pub mod files;
pub mod headers;
pub mod policy;
pub mod port_socket;
pub mod ports;
pub mod routes;
pub mod run;
pub mod runtimes;
pub mod session;
pub mod terminal;
pub mod tls;
pub mod ws;

pub use client::{Client, ClientError, Trust};
pub use error::{ErrorBody, ErrorCode};
pub use runtimes::BuildState;
pub use session::{Launch, Limits, SessionState};

/// The version of this API: the workspace's, which sandboxd reports in its index and a client
/// expects.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
