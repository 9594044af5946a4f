//! The operator and `kubectl sandbox` are clients of sandboxd: they build on this crate and not
//! on the daemon, so none of the daemon's server, Docker or database crates comes into them.
//! `kubectl sandbox` builds on neither the operator: a kubectl plugin carries no controller's
//! metrics, certificate signer, log setup or trace exporter.

use std::process::Command;

/// What no client of sandboxd may depend on (normal dependencies, any depth).
const DAEMON_ONLY: [&str; 4] = ["sandboxd", "axum", "bollard", "sqlx"];

/// What `kubectl sandbox` may not depend on besides: the operator and what only it needs.
const OPERATOR_ONLY: [&str; 7] = [
    "sandboxd-operator",
    "prometheus-client",
    "rcgen",
    "x509-parser",
    "tracing-subscriber",
    "sandboxd-telemetry",
    "opentelemetry_sdk",
];

/// The packages `cargo tree -e normal -p package` lists.
fn normal_dependencies(package: &str) -> Vec<String> {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "--locked",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args([
            "--format",
            "{p}",
            "--manifest-path",
            manifest,
            "-p",
            package,
        ])
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_operator_and_the_cli_do_not_depend_on_the_daemon() {
    for package in ["sandboxd-operator", "kubectl-sandbox"] {
        let deps = normal_dependencies(package);
        assert!(
            deps.iter().any(|d| d == "sandboxd-api"),
            "{package} reaches sandboxd through sandboxd-api: {deps:?}"
        );
        let found: Vec<&String> = deps
            .iter()
            .filter(|d| DAEMON_ONLY.contains(&d.as_str()))
            .collect();
        assert!(
            found.is_empty(),
            "{package} depends on {found:?}; it must reach sandboxd only through sandboxd-api \
             (see `cargo tree -e normal -p {package} -i <crate>`)"
        );
    }
}

#[test]
fn the_cli_does_not_depend_on_the_operator() {
    let deps = normal_dependencies("kubectl-sandbox");
    let found: Vec<&String> = deps
        .iter()
        .filter(|d| OPERATOR_ONLY.contains(&d.as_str()))
        .collect();
    assert!(
        found.is_empty(),
        "kubectl-sandbox depends on {found:?}; what it shares with the operator lives in \
         sandboxd-api or sandboxd-crds (see `cargo tree -e normal -p kubectl-sandbox -i <crate>`)"
    );
}

#[test]
fn the_api_crate_carries_no_server() {
    let deps = normal_dependencies("sandboxd-api");
    for banned in DAEMON_ONLY {
        assert!(
            !deps.iter().any(|d| d == banned),
            "sandboxd-api depends on {banned}"
        );
    }
}
