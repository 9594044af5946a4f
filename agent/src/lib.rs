//! The resident in-container agent of sandboxd. sandboxd mounts this static binary read-only
//! into every sandbox as its PID 1: it reaps zombies, forwards signals, and serves runs to
//! sandboxd over a Unix socket in the session's run folder (see [`proto`]): runs, terminals,
//! connections to the sandbox's own ports and watches of its files. It dials nothing but the
//! sandbox's loopback, and uses no name service and no dynamic library, so it runs in any
//! image, a busybox one included.
//!
//! sandboxd embeds the binary of its own build and copies it into the host folder at start, so
//! a session always runs the agent of the sandboxd that drives it.

#[cfg(target_os = "linux")]
pub mod pause;
#[cfg(target_os = "linux")]
mod ports;
pub mod proto;
#[cfg(target_os = "linux")]
pub mod server;
#[cfg(target_os = "linux")]
pub mod terminal;
#[cfg(target_os = "linux")]
mod watch;
