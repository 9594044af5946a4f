//! Isolation per runtime, against the real dockerd that `make up` gives gVisor's runsc: a
//! runtime with `isolation: gvisor` runs its sandboxes on gVisor's own kernel, as the same
//! unprivileged, capped, network-less container with the resident agent; a host whose dockerd
//! lacks runsc says so and refuses such a runtime with the reason.

mod common;

use common::{Daemon, base_image};
use sandboxd_api::client::{Client, ClientError};

/// `base` on runc (the default) and `secure` on gVisor, the same image.
fn runtimes() -> String {
    let image = base_image();
    format!(
        r#"[{{"alias": "base", "image": "{image}"}}, {{"alias": "secure", "image": "{image}", "isolation": "gvisor"}}]"#
    )
}

async fn open(d: &Daemon, name: &str, runtime: &str) -> Client {
    let opened = d
        .admin()
        .open(name, "org-iso", Some(runtime), None)
        .await
        .unwrap_or_else(|e| panic!("open {name} on {runtime}: {e}"));
    d.client(opened.token.as_deref().expect("a token on create"))
}

async fn sh(c: &Client, session: &str, command: &str) -> (i64, String) {
    let out = c
        .run(session, command, Some(30), None, None)
        .await
        .unwrap_or_else(|e| panic!("run {command}: {e}"));
    (out.exit_code, out.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gvisor_runtime_runs_on_gvisors_kernel_and_is_the_same_sandbox_otherwise() {
    let runtimes = runtimes();
    let d = Daemon::start(&[("SANDBOXD_RUNTIMES", runtimes.as_str())]);
    let list = d.admin().runtimes().await.expect("runtimes");
    let offered: Vec<&str> = list.isolation.iter().map(|i| i.as_str()).collect();
    assert_eq!(
        offered,
        ["runc", "gvisor"],
        "the project's dockerd has runsc (make up)"
    );
    let secure = list
        .runtimes
        .iter()
        .find(|r| r.alias == "secure")
        .expect("secure is listed");
    assert_eq!(secure.isolation.as_str(), "gvisor");

    let g = open(&d, "g-1", "secure").await;
    let r = open(&d, "r-1", "base").await;
    // gVisor's kernel, not the node's.
    let (code, dmesg) = sh(&g, "g-1", "dmesg 2>&1 | head -n 3").await;
    assert_eq!(code, 0, "{dmesg}");
    assert!(dmesg.contains("gVisor"), "gVisor's kernel log: {dmesg}");
    let (_, node_dmesg) = sh(&r, "r-1", "dmesg 2>&1 | head -n 3").await;
    assert!(
        !node_dmesg.contains("gVisor"),
        "runc is the node's kernel: {node_dmesg}"
    );
    let container = common::container_of(&d, "g-1");
    let runtime = common::docker(&["inspect", "-f", "{{.HostConfig.Runtime}}", &container]);
    assert_eq!(runtime.trim(), "runsc");

    // The same sandbox otherwise: uid 10001, no capabilities, no network, the workspace.
    assert_eq!(
        sh(&g, "g-1", "id -u; id -g").await,
        (0, "10001\n10001\n".into())
    );
    let (_, caps) = sh(&g, "g-1", "grep -E '^CapEff:' /proc/self/status").await;
    assert_eq!(caps.trim(), "CapEff:\t0000000000000000");
    let (_, links) = sh(&g, "g-1", "cat /proc/net/dev").await;
    assert!(
        links.contains("lo:") && !links.contains("eth0"),
        "only the loopback interface: {links}"
    );
    assert_eq!(sh(&g, "g-1", "pwd").await, (0, "/workspace\n".into()));
    g.write("g-1", "in.txt", b"from the API".to_vec())
        .await
        .expect("a file written");
    assert_eq!(
        sh(&g, "g-1", "cat in.txt && echo made > out.txt").await,
        (0, "from the API".into())
    );
    let out = g.read("g-1", "out.txt", 0, None).await.expect("read");
    assert_eq!(out, b"made\n");
    // A run past its timeout is stopped there, as under runc.
    let timed = g
        .run("g-1", "sleep 30", Some(1), None, None)
        .await
        .expect("a run that times out");
    assert_eq!(timed.exit_code, 124, "{timed:?}");
    // Every run went through the resident agent, trusted: under gVisor its socket is made on
    // the host by the container's gofer.
    let metrics = reqwest::get(format!("{}/metrics", d.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("a body");
    assert!(
        metrics
            .lines()
            .any(|l| l == "sandboxd_agent_untrusted_total 0"),
        "no agent socket was refused: {metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l == "sandboxd_run_paths_total{path=\"exec_fallback\"} 0"),
        "no run fell back to docker exec: {metrics}"
    );
    // Writes to a file not opened for append still land where the next write expects.
    assert_eq!(
        sh(
            &g,
            "g-1",
            "for i in 1 2 3; do echo $i; done > n.txt; cat n.txt"
        )
        .await,
        (0, "1\n2\n3\n".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_without_gvisor_refuses_a_gvisor_runtime_with_the_reason() {
    let runtimes = runtimes();
    let d = Daemon::start(&[
        ("SANDBOXD_RUNTIMES", runtimes.as_str()),
        ("SANDBOXD_GVISOR_RUNTIME", "no-such-runtime"),
    ]);
    let list = d.admin().runtimes().await.expect("runtimes");
    let offered: Vec<&str> = list.isolation.iter().map(|i| i.as_str()).collect();
    assert_eq!(offered, ["runc"]);
    match d.admin().open("g-2", "org-iso", Some("secure"), None).await {
        Err(ClientError::Api {
            status,
            code,
            message,
        }) => {
            assert_eq!(status, 503);
            assert_eq!(code.as_str(), "isolation_unavailable");
            assert_eq!(
                message,
                "Runtime 'secure' has isolation gvisor, and this host's dockerd offers no OCI runtime 'no-such-runtime' (SANDBOXD_GVISOR_RUNTIME): give dockerd the runtime (its \"runtimes\" setting, runsc on the node) or open the session on a host that has it"
            );
        }
        other => panic!("a gvisor open on a host without it: {other:?}"),
    }
    assert!(
        d.containers().is_empty(),
        "no container is left: {:?}",
        d.containers()
    );
    // The runc runtime is served as before.
    let r = open(&d, "r-2", "base").await;
    assert_eq!(sh(&r, "r-2", "echo ok").await, (0, "ok\n".into()));
}
