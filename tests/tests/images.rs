//! `make images`: the operator and sandboxd images build with the local dockerd from the local
//! base image, are tagged with the workspace version, and `--version` in each prints it.

use std::path::PathBuf;
use std::process::Command;

use sandboxd_tests::{docker_host, repo_root};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The folder of the binaries `make test` built (next to this test's `deps/` folder).
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir")
        .to_path_buf();
    for b in ["sandboxd", "sandbox-operator"] {
        assert!(
            dir.join(b).exists(),
            "{} is missing: build it with `cargo build --workspace --bins` (make test does)",
            dir.join(b).display()
        );
    }
    dir
}

fn docker(args: &[&str]) -> (bool, String, String) {
    let out = Command::new("docker")
        .args(["--host", &docker_host()])
        .args(args)
        .output()
        .expect("the docker CLI runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn images_build_and_print_the_workspace_version() {
    // The binaries make test built (the debug profile); `make images` builds release ones.
    let out = Command::new(repo_root().join("hack/images.sh"))
        .env("SANDBOXD_BIN_DIR", bin_dir())
        .output()
        .expect("hack/images.sh runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "make images failed:\n{err}");
    for image in ["sandboxd", "sandbox-operator"] {
        assert!(
            err.contains(&format!("images: built {image}:{VERSION} (")),
            "{err}"
        );
        let (ok, stdout, stderr) = docker(&[
            "run",
            "--rm",
            "--network",
            "none",
            &format!("{image}:{VERSION}"),
            "--version",
        ]);
        assert!(ok, "{image} --version failed: {stderr}");
        assert_eq!(stdout, format!("{image} {VERSION}\n"));
    }
    // sandboxd fences in the sandbox network with iptables (and ip6tables), from the image.
    for command in ["iptables", "ip6tables", "iptables-restore"] {
        let (ok, stdout, stderr) = docker(&[
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            command,
            &format!("sandboxd:{VERSION}"),
            "-V",
        ]);
        assert!(ok, "{command} -V in the sandboxd image failed: {stderr}");
        assert!(stdout.contains(" v1.8."), "{command} -V: {stdout}");
    }
    let (_, user, _) = docker(&[
        "image",
        "inspect",
        "-f",
        "{{.Config.User}}",
        &format!("sandbox-operator:{VERSION}"),
    ]);
    assert_eq!(user.trim(), "65532:65532", "the operator runs as non-root");
    let (_, label, _) = docker(&[
        "image",
        "inspect",
        "-f",
        "{{index .Config.Labels \"org.opencontainers.image.version\"}}",
        &format!("sandboxd:{VERSION}"),
    ]);
    assert_eq!(label.trim(), VERSION);
}
