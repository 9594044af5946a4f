//! The container engine: sandbox containers as siblings of sandboxd ([`docker`]), and the
//! network of sessions whose runtime needs one ([`network`]).

pub mod docker;
pub mod network;
