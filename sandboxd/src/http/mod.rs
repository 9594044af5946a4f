//! The HTTP edge: the `/v1` API ([`v1`]) and the wire protocol of pydantic-ai-backend's sandboxd
//! ([`wire`]), two surfaces over the one [`crate::service::Core`] that only translate and never
//! import each other; what they share below them: the state and the caller ([`state`]), the
//! one router and the middleware every request goes through ([`router`]), the service's own
//! routes (index, health, metrics: [`service`]), the OpenAPI helpers of their two documents
//! ([`openapi`]; the documents are [`v1::openapi`] and [`wire::openapi`]); and the connections
//! they are served on ([`connections`]). What a handler of either surface asks of a request (the caller's token,
//! the actor) is in one place, [`extract`], and what every workspace operation of both does
//! around the operation (the blocking thread, the timer, the audit row, the error) in another,
//! `audited`. The `/v1` API's errors, and the status and code of every error of the service,
//! the runtimes and the workspace, are [`error`]'s.

mod audited;
pub mod connections;
pub mod error;
pub(crate) mod extract;
pub mod mcp;
pub mod openapi;
pub mod router;
pub mod service;
pub mod state;
#[cfg(test)]
mod tests;
pub mod v1;
pub mod wire;

pub use router::router;
pub use state::{AppState, Caller};
