//! The sandboxd operator: controllers for `SandboxHost`, `Runtime`, `SandboxSession` and
//! `Tombstone`. It talks to the API server and to sandboxd's client, never to Docker.
//!
//! Every loop is a kube-runtime `Controller` whose reconcile returns the next deadline that
//! matters (`Action::requeue`); nothing polls in a thread or sleeps in a reconcile. Only the
//! replica holding the Lease runs the controllers.

pub mod backoff;
pub mod conditions;
pub mod config;
pub mod context;
pub mod credentials;
pub mod discovery;
pub mod egress;
pub mod error;
pub mod host;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod placement;
pub mod preflight;
pub mod run;
pub mod runtime;
pub mod session;
pub mod signer;
pub mod snapshot;
pub mod tombstone;
pub mod trust;

pub use context::Context;
pub use error::Error;
