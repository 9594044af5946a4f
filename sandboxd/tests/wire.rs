//! The wire protocol of pydantic-ai-backend's sandboxd, proven with that library's own client:
//! a real sandboxd (real dockerd, the local base image) driven by `SandboxdWorkspaceBackend` and
//! `WorkspaceArchive` at the release pinned in `hack/versions.env`, installed from PyPI into a
//! virtualenv of the tests' own (`hack/wire-venv.sh`). The Python harness is
//! `sandboxd/tests/python/`; this test starts the daemon, runs pytest against it, and fails
//! (never skips) when pytest does or cannot run.

mod common;

use std::process::Command;

use common::{Daemon, hack_path, repo};

/// The pin of `hack/versions.env`.
fn pin() -> String {
    let text =
        std::fs::read_to_string(repo().join("hack/versions.env")).expect("hack/versions.env");
    text.lines()
        .find_map(|l| l.strip_prefix("PYDANTIC_AI_BACKEND_VERSION="))
        .expect("hack/versions.env pins PYDANTIC_AI_BACKEND_VERSION")
        .trim()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn pydantic_ai_backend_client_drives_sandboxd() {
    let python = hack_path("wire-venv.sh");
    let d = Daemon::start(&[]);
    let index: serde_json::Value = reqwest::get(format!("{}/", d.base))
        .await
        .expect("GET /")
        .json()
        .await
        .expect("the index is JSON");
    assert_eq!(
        index["wire"]["release"],
        serde_json::json!(pin()),
        "GET /: field wire.release is not the pin of hack/versions.env"
    );
    let out = Command::new(&python)
        .args(["-m", "pytest", "-p", "no:cacheprovider", "-ra", "-q"])
        .arg(repo().join("sandboxd/tests/python"))
        .env("SANDBOXD_URL", &d.base)
        .env("SANDBOXD_ADMIN_TOKEN", &d.token)
        .env("SANDBOXD_TEST_WORKSPACE_ROOT", d.workspace_root())
        .env("SANDBOXD_TEST_STATE_DIR", d.state_dir())
        .env("SANDBOXD_TEST_INSTANCE", &d.instance)
        .env("PYDANTIC_AI_BACKEND_VERSION", pin())
        .output()
        .expect("pytest runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "the pydantic-ai-backend client tests failed ({}); see the pytest output above",
        out.status
    );
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(
        summary.contains(" passed") && !summary.contains("skipped") && !summary.contains("failed"),
        "pytest summary: {summary}"
    );
}

/// The drop-in cases against the seed's own service (`python -m
/// pydantic_ai_backends.remote.server` from the pinned release, started by the script on the
/// project's dockerd) and against ours, side by side: the script prints both columns and fails
/// when ours misses a case or the two differ where no difference is documented.
#[tokio::test(flavor = "multi_thread")]
async fn seed_and_ours_side_by_side() {
    let python = hack_path("wire-venv.sh");
    let d = Daemon::start(&[]);
    let out = Command::new(&python)
        .arg(repo().join("sandboxd/tests/python/dropin_side_by_side.py"))
        .args(["--ours", &d.base, "--ours-token", &d.token])
        .args(["--image", &common::base_image()])
        .env("PYDANTIC_AI_BACKEND_VERSION", pin())
        .output()
        .expect("the side-by-side script runs");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "the side-by-side script found cases off ({}); see its table above",
        out.status
    );
}
