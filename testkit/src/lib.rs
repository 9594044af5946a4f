//! The parts of the test harness that every test crate shares, and that need nothing of
//! Kubernetes or of sandboxd's code: a CA and certificates made in the test ([`pki`]), asking
//! again with a deadline for what cannot be watched ([`poll`]), the processes of the tests,
//! sandboxd and the operator started from the workspace's binaries ([`process`]), and a fake
//! internet on this machine only for the tests of egress policy ([`internet`]).
//!
//! sandboxd's own tests take them from here as a dev-dependency; the end-to-end crate
//! (`sandboxd-tests`) re-exports them under its own name. This crate must not depend on
//! `sandboxd` or `sandboxd-tests`: sandboxd dev-depends on it.

pub mod internet;
pub mod pki;
pub mod poll;
pub mod process;

pub use poll::until;

/// The tests' tools image (`SANDBOXD_TOOLS_IMAGE`): the local base image with curl, dig,
/// python3 and ca-certificates (hack/tools-image.sh), for clients of the test internet in a
/// sandbox. Panics (fails the test) when it is not set.
pub fn tools_image() -> String {
    std::env::var("SANDBOXD_TOOLS_IMAGE").unwrap_or_else(|_| {
        panic!("SANDBOXD_TOOLS_IMAGE is not set: build it with `make up` and `eval \"$(make -s env)\"`, or run `make test`")
    })
}
