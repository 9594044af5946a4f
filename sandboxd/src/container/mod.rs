//! The container engine: sandbox containers as siblings of sandboxd ([`docker`]; the operator
//! bench's no-op engine beside it in `noop`, out of the Docker code), and the
//! network of sessions whose runtime needs one ([`network`]).

pub mod docker;
pub mod network;
mod noop;
