//! Builds the resident agent (`agent/`, package `sandbox-agent`) as a static binary and hands
//! its path to `sandboxd::run::agent`, which embeds it: sandboxd then always ships the agent
//! of its own build and copies it into the host folder at start, and `cargo test` / `make test`
//! work on a fresh clone with nothing built beforehand.
//!
//! The agent is built by a nested `cargo build` with `-C target-feature=+crt-static` for
//! `x86_64-unknown-linux-gnu` (static glibc; the agent uses no name service) into its own
//! target folder next to the outer one, so it never contends for the outer build's lock and
//! only rebuilds when the agent's sources change. `SANDBOXD_AGENT_BINARY` (at build time)
//! names a prebuilt static agent instead, for packagers.

use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "x86_64-unknown-linux-gnu";

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let agent_dir = manifest.join("../agent");
    println!("cargo:rerun-if-env-changed=SANDBOXD_AGENT_BINARY");
    println!("cargo:rerun-if-changed={}", agent_dir.join("src").display());
    println!(
        "cargo:rerun-if-changed={}",
        agent_dir.join("Cargo.toml").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        manifest.join("../Cargo.lock").display()
    );
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
    let binary = match std::env::var_os("SANDBOXD_AGENT_BINARY") {
        Some(prebuilt) => PathBuf::from(prebuilt),
        None => build(&manifest, &out),
    };
    println!(
        "cargo:rustc-env=SANDBOXD_AGENT_BINARY_PATH={}",
        binary.display()
    );
}

/// The outer target folder (`<target>/<profile>/build/<pkg>/out` is OUT_DIR), so the agent's
/// build is shared by every profile and by check, clippy and test.
fn target_dir(out: &Path) -> PathBuf {
    out.ancestors()
        .nth(4)
        .map(|t| t.join("sandbox-agent"))
        .unwrap_or_else(|| out.join("sandbox-agent"))
}

fn build(manifest: &Path, out: &Path) -> PathBuf {
    let target_dir = target_dir(out);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(manifest.join(".."))
        .args([
            "build",
            "-p",
            "sandbox-agent",
            "--bin",
            "sandbox-agent",
            "--release",
        ])
        .args(["--target", TARGET])
        .arg("--target-dir")
        .arg(&target_dir)
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            ["-C", "target-feature=+crt-static", "-C", "strip=symbols"].join("\x1f"),
        )
        // What the outer build set for itself (clippy's driver, its flags) is not the agent's.
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_RUSTFLAGS");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build the sandbox agent: {e}"));
    assert!(
        status.success(),
        "building the static sandbox agent failed (cargo build -p sandbox-agent --target {TARGET} with +crt-static); set SANDBOXD_AGENT_BINARY to a prebuilt one"
    );
    target_dir
        .join(TARGET)
        .join("release")
        .join("sandbox-agent")
}
