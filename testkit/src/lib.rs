//! The parts of the test harness that every test crate shares, and that need nothing of
//! Kubernetes or of sandboxd's code: a CA and certificates made in the test ([`pki`]), asking
//! again with a deadline for what cannot be watched ([`poll`]), and the processes of the tests,
//! sandboxd and the operator started from the workspace's binaries ([`process`]).
//!
//! sandboxd's own tests take them from here as a dev-dependency; the end-to-end crate
//! (`sandboxd-tests`) re-exports them under its own name. This crate must not depend on
//! `sandboxd` or `sandboxd-tests`: sandboxd dev-depends on it.

pub mod pki;
pub mod poll;
pub mod process;

pub use poll::until;
