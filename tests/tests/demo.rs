//! `make demo` from a clean state: it builds what is missing, starts everything, installs the
//! chart on the local node (the sandboxd pod and two operator replicas Ready, the pod discovered
//! as the node's SandboxHost), opens a session with `kubectl sandbox`, runs a command, writes
//! and reads back a file, shows `kubectl get sbx` and the pods, and says what to try next. Its own test binary (one test), so it runs alone; the demo's
//! objects carry their own label and its operator handles only those, so other tests' objects
//! are never touched. It ends with `hack/demo.sh clean` (a demo left running is removed too).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use sandboxd_tests::repo_root;

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir")
        .to_path_buf();
    for b in ["sandboxd", "sandbox-operator", "kubectl-sandbox"] {
        assert!(
            dir.join(b).exists(),
            "{} is missing: build it with `cargo build --workspace --bins` (make test does)",
            dir.join(b).display()
        );
    }
    dir
}

async fn run(program: &str, args: &[&str], limit: Duration) -> (bool, String) {
    let child = tokio::process::Command::new(program)
        .args(args)
        .current_dir(repo_root())
        .env("SANDBOXD_BIN_DIR", bin_dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{program} did not start: {e}"));
    let out = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{program} {args:?} took longer than {limit:?}"))
        .expect("output");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn make_demo_shows_a_session_working_from_a_clean_state() {
    let demo = repo_root().join("hack/demo.sh");
    let demo = demo.to_str().expect("utf-8 path");
    let (ok, out) = run(demo, &["clean"], Duration::from_secs(60)).await;
    assert!(ok, "hack/demo.sh clean failed:\n{out}");

    let (ok, out) = run("make", &["demo"], Duration::from_secs(900)).await;
    assert!(ok, "make demo failed:\n{out}");
    for expected in [
        "created SandboxSession demo-session in namespace sandboxd-demo (tenant demo-org, scope conversation)",
        "sandbox demo-session is running on host node-127.0.0.1 (runtime demo)",
        "hello from ",
        " as uid 10001\njq-1.",
        "copied 21 B to demo-session:notes/hello.txt",
        "$ kubectl sandbox cp demo-session:notes/hello.txt - -n sandboxd-demo\nwritten by make demo\n",
        "kubectl sandbox exec demo-session -n sandboxd-demo -- ls -la",
        "kubectl logs -n sandboxd-demo daemonset/sandboxd-sandboxd",
        "make down           # stops the demo and everything make up started",
        // The chart's default: HTTPS, the node's certificate from the operator's own CA.
        "(sandboxd on https://127.0.0.1:18490 with a certificate from the operator's CA, two\noperator replicas)",
    ] {
        assert!(out.contains(expected), "`{expected}` missing in:\n{out}");
    }
    let table = out
        .split("$ kubectl get sbx -n sandboxd-demo\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no kubectl get sbx in:\n{out}"));
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(&header[..3], ["NAME", "PHASE", "TENANT"], "{table}");
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[..6],
        [
            "demo-session",
            "Running",
            "demo-org",
            "conversation",
            "demo",
            "node-127.0.0.1"
        ],
        "{table}"
    );

    let pods = out
        .split("$ kubectl get pods -n sandboxd-demo\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no kubectl get pods in:\n{out}"));
    let running = |prefix: &str| {
        pods.lines()
            .filter(|l| l.starts_with(prefix) && l.contains(" 1/1 ") && l.contains(" Running "))
            .count()
    };
    assert_eq!(running("sandboxd-operator-"), 2, "{pods}");
    assert_eq!(running("sandboxd-sandboxd-"), 1, "{pods}");

    // A second run finds what the first one started.
    let (ok, again) = run("make", &["demo"], Duration::from_secs(300)).await;
    assert!(ok, "make demo (again) failed:\n{again}");
    assert!(
        again.contains("demo: the chart is installed already (release sandboxd in sandboxd-demo)"),
        "{again}"
    );
    assert!(
        again.contains("found SandboxSession demo-session in namespace sandboxd-demo (Running)"),
        "{again}"
    );

    let (ok, out) = run(demo, &["clean"], Duration::from_secs(60)).await;
    assert!(ok, "hack/demo.sh clean failed:\n{out}");
}
