//! What `make up` provides beyond the API server: the project's dockerd with the local base
//! image, and the operator's start-up check against the real CRDs.

use sandboxd_tests::{base_image, client, docker_host, install_crds};

#[tokio::test]
async fn dockerd_runs_the_local_base_image() {
    let out = tokio::process::Command::new("docker")
        .args([
            "--host",
            &docker_host(),
            "run",
            "--rm",
            "--network",
            "none",
            "--user",
            "10001",
            &base_image(),
        ])
        .args(["sh", "-c", "id -u && cat /etc/debian_version"])
        .output()
        .await
        .expect("the docker CLI runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "docker run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("10001"));
    assert!(
        lines.next().is_some_and(|v| v.starts_with("12.")),
        "not bookworm: {stdout}"
    );
}

#[tokio::test]
async fn operator_preflight_passes_once_the_crds_are_installed() {
    let client = client().await;
    install_crds(&client).await;
    sandboxd_operator::preflight::check_crds(&client)
        .await
        .expect("every CRD is installed and established");
}
