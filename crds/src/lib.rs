//! The API of sandboxd: the `sandboxd.dev/v1alpha1` custom resources, the session key that names
//! a `SandboxSession`, the runtime catalog that `Runtime` objects are generated from, the read
//! of the CA a `SandboxHost` names (`ca`), and what a running operator publishes on its Lease
//! (`lease`).
//!
//! Of this workspace it depends only on `sandboxd-catalog` (the kube-free catalog format); the
//! operator and the tests build on it.

// kube's `printcolumn(...)` repeats `type_ = ...` by design; clippy reads it as a duplicate.
#![allow(clippy::duplicated_attributes)]

pub mod ca;
pub mod catalog;
pub mod generate;
pub mod key;
pub mod lease;
pub mod v1alpha1;

pub use sandboxd_catalog::memory;

/// The API group of every custom resource here.
pub const GROUP: &str = "sandboxd.dev";
/// The one served version.
pub const VERSION: &str = "v1alpha1";
/// The version of this workspace; every crate, chart and image carries it.
pub const CRATE_VERSION: &str = env!("CARGO_PKG_VERSION");
