//! The sandboxd operator: controllers for `SandboxHost`, `Runtime`, `SandboxSession` and
//! `Tombstone`. It talks to the API server and to sandboxd's client, never to Docker.
//!
//! So far it holds the start-up check every controller relies on: the CRDs are installed.
//! The operator never installs them itself.

pub mod preflight;
