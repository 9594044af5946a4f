//! The HTTP edge: the `/v1` API ([`v1`]) and the wire protocol of pydantic-ai-backend's sandboxd
//! ([`wire`]), two surfaces over the one [`crate::service::Core`] that only translate; their
//! OpenAPI documents ([`openapi`], [`wire::openapi`]); and the connections they are served on
//! ([`connections`]). What every file operation of both surfaces does around the operation
//! (the actor, the blocking thread, the audit row) is in one place, `audited`.
//! The `/v1` API's errors, and the status and code of every error of the service, the
//! runtimes and the workspace, are [`error`]'s.

mod audited;
pub mod connections;
pub mod error;
pub mod openapi;
pub mod v1;
pub mod wire;
