//! The chart as pods on the local node `make up` starts (hack/node.sh): `make images` loads the
//! images into the node, `helm install` with the node's values (hack/node-values.sh) brings up
//! the sandboxd DaemonSet pod and two operator replicas, one leads, the operator makes its CA
//! and signs the node's certificate, discovers the pod as a SandboxHost over https, a
//! SandboxSession applied with kubectl runs and `kubectl sandbox exec`
//! works through the pod's sandboxd, `kubectl logs` shows both components; deleting the leading
//! operator pod hands over to the other replica, deleting the sandboxd pod brings a new one
//! that finds the session and its files, `helm upgrade` that changes a Runtime runs the prepare
//! Job before the DaemonSet rolls and keeps the admin token, and `helm uninstall` removes the
//! pods and leaves the CRDs and the workspaces.
//!
//! One test in its own binary: the node has one sandboxd port and one SandboxHost, so it runs
//! alone (and removes `make demo`'s release first). It fails (never skips) when the node is not
//! there.
//!
//! Over 600 lines: one test a scenario on the real node, sharing this file's fixtures.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use sandboxd_crds::v1alpha1::{SandboxHost, SandboxSession};
use sandboxd_tests::{TestNamespace, client, install_crds, kubectl, repo_root};

const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The node hack/node.sh registers.
const NODE: &str = "127.0.0.1";
/// sandboxd's port on the node in this test (the demo's install uses 18490).
const PORT: u16 = 18491;
const RELEASE: &str = "sbxnode";
const FULL: &str = "sbxnode-sandboxd";
/// Pods starting, a runtime building: generous, the machine is shared.
const SLOW: Duration = Duration::from_secs(300);

/// The folder of the binaries `make test` built (next to this test's `deps/` folder).
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

fn helm() -> PathBuf {
    PathBuf::from(std::env::var("SANDBOXD_HELM").unwrap_or_else(|_| {
        panic!(
            "SANDBOXD_HELM is not set: run `make test`, or `make up` and `eval \"$(make -s env)\"`"
        )
    }))
}

fn output(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("{cmd:?} did not start: {e}"))
}

/// Runs `cmd`, failing the test with its output unless it succeeds; returns stdout and stderr.
fn ok(cmd: &mut Command) -> String {
    let out = output(cmd);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

/// kubectl with `kubectl-sandbox` on PATH.
fn kubectl_cmd(bins: &Path) -> Command {
    let mut c = Command::new(kubectl());
    let path = std::env::var("PATH").unwrap_or_default();
    c.env("PATH", format!("{}:{path}", bins.display()));
    c
}

/// This test's folders on the node (hostPath): workspaces and sandboxd's state.
fn test_dir() -> PathBuf {
    // A hostPath may not contain `..`.
    repo_root()
        .canonicalize()
        .expect("the repository root")
        .join(".dev/node-test")
}

/// Removes what an earlier run left: its namespace (the release's pods with it) and the
/// session containers of the node's sandboxd in the project's dockerd; and `make demo`'s
/// release: the node holds one sandboxd of the chart at a time (one SandboxHost per node).
async fn clean_earlier_runs(client: &kube::Client) {
    ok(Command::new(repo_root().join("hack/demo.sh")).arg("clean"));
    let namespaces = Api::<Namespace>::all(client.clone());
    let earlier = namespaces
        .list(&ListParams::default().labels("sandboxd.dev/node-test=true"))
        .await
        .expect("list namespaces");
    for ns in earlier {
        let name = ns.metadata.name.clone().unwrap_or_default();
        let _ = output(Command::new(helm()).args(["uninstall", RELEASE, "-n", &name, "--wait"]));
        forget_sessions(client, &name).await;
        let _ = namespaces.delete(&name, &DeleteParams::default()).await;
    }
    forget_host(client).await;
    remove_session_containers();
}

/// Drops the sessions' finalizers (their operator is gone) so their namespace can go.
async fn forget_sessions(client: &kube::Client, ns: &str) {
    let sessions = Api::<SandboxSession>::namespaced(client.clone(), ns);
    if let Ok(list) = sessions.list(&ListParams::default()).await {
        for s in list {
            let name = s.metadata.name.clone().unwrap_or_default();
            let _ = sessions
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
                )
                .await;
        }
    }
}

/// Removes the node's SandboxHost (its operator is gone, so its finalizer is dropped first).
async fn forget_host(client: &kube::Client) {
    let hosts = Api::<SandboxHost>::all(client.clone());
    let name = format!("node-{NODE}");
    let _ = hosts
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await;
    let _ = hosts.delete(&name, &DeleteParams::default()).await;
}

fn remove_session_containers() {
    let docker = |args: &[&str]| {
        output(
            Command::new("docker")
                .args(["--host", &sandboxd_tests::docker_host()])
                .args(args),
        )
    };
    let ids = docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=sandboxd.dev/instance={NODE}"),
    ]);
    let ids = String::from_utf8_lossy(&ids.stdout).into_owned();
    let ids: Vec<&str> = ids.split_whitespace().collect();
    if !ids.is_empty() {
        let mut args = vec!["rm", "-f"];
        args.extend(ids);
        docker(&args);
    }
}

async fn pods(client: &kube::Client, ns: &str, component: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
        )))
        .await
        .expect("list pods")
        .items
}

fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

/// Waits until `count` pods of `component` are Ready (and no other is left); returns their names.
async fn ready_pods(client: &kube::Client, ns: &str, component: &str, count: usize) -> Vec<String> {
    within("the component's pods Ready", || async {
        let all = pods(client, ns, component).await;
        let ready: Vec<String> = all.iter().filter(|p| is_ready(p)).map(name).collect();
        if ready.len() == count && all.len() == count {
            Ok(ready)
        } else {
            let seen: Vec<String> = all
                .iter()
                .map(|p| {
                    let phase = p
                        .status
                        .as_ref()
                        .and_then(|s| s.phase.clone())
                        .unwrap_or_default();
                    format!("{} {phase} ready={}", name(p), is_ready(p))
                })
                .collect();
            Err(format!("{component} pods: {seen:?}"))
        }
    })
    .await
}

async fn leader(client: &kube::Client, ns: &str) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt(&format!("{FULL}-operator"))
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

fn admin_token(secret: &Secret) -> Vec<u8> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get("token"))
        .map(|b| b.0.clone())
        .expect("the admin token Secret has a token")
}

/// The node's values (hack/node-values.sh) with this test's port.
fn values_file(dir: &Path) -> PathBuf {
    let values = ok(Command::new(repo_root().join("hack/node-values.sh"))
        .env("SANDBOXD_NODE_PORT", PORT.to_string()));
    let file = dir.join("values.yaml");
    std::fs::write(&file, values).expect("write the values");
    file
}

/// `kubectl sandbox exec` in the session; returns its output.
fn exec(bins: &Path, ns: &str, session: &str, command: &str) -> String {
    ok(kubectl_cmd(bins).args(["sandbox", "exec", session, "-n", ns, "--", command]))
}

#[tokio::test]
async fn the_chart_runs_as_pods_on_the_local_node() {
    let started = std::time::Instant::now();
    let client = client().await;
    let node = Api::<Node>::all(client.clone())
        .get_opt(NODE)
        .await
        .expect("read nodes")
        .unwrap_or_else(|| {
            panic!("no node {NODE}: `make up` starts the local node (hack/node.sh)")
        });
    let node_ready = node
        .status
        .and_then(|s| s.conditions)
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    assert!(
        node_ready,
        "the node {NODE} is not Ready: see .dev/node/logs/kubelet.log, or `make down && make up`"
    );
    let bins = bin_dir();

    // `make images` builds the images with the project's dockerd and loads them into the node.
    let out = ok(Command::new(repo_root().join("hack/images.sh")).env("SANDBOXD_BIN_DIR", &bins));
    for image in ["sandboxd", "sandbox-operator"] {
        assert!(
            out.contains(&format!("node: loaded {image}:{VERSION}")),
            "{out}"
        );
    }

    clean_earlier_runs(&client).await;
    let dir = test_dir();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the test's folder");
    let crds = install_crds(&client).await;
    let ns = TestNamespace::create(&client, "node").await;
    let n = ns.name.clone();
    Api::<Namespace>::all(client.clone())
        .patch(
            &n,
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"metadata": {"labels": {"sandboxd.dev/node-test": "true"}}}),
            ),
        )
        .await
        .expect("label the namespace");
    let values = values_file(&dir);
    let helm_in_ns = |verb: &str| {
        let mut c = Command::new(helm());
        c.arg(verb).args(["-n", &n]);
        c
    };

    // Install: one sandboxd pod, two operator replicas, Ready.
    let out = ok(helm_in_ns("install")
        .args([
            RELEASE,
            &repo_root().join("charts/sandboxd").display().to_string(),
        ])
        .args([
            "--set",
            &format!("sandboxd.workspaceRoot={}/workspaces", dir.display()),
            "--set",
            &format!("sandboxd.stateDir={}/state", dir.display()),
            "-f",
            &values.display().to_string(),
            "--take-ownership",
            "--wait",
            "--timeout",
            "5m",
        ]));
    assert!(out.contains("STATUS: deployed"), "{out}");
    let sandboxd_pod = ready_pods(&client, &n, "sandboxd", 1).await.remove(0);
    let operators = ready_pods(&client, &n, "operator", 2).await;

    // One leads: the Lease names one of the two pods.
    let first_leader = within("a leader among the operator replicas", || async {
        match leader(&client, &n).await {
            Some(holder) if operators.contains(&holder) => Ok(holder),
            other => Err(format!("lease holder {other:?}, replicas {operators:?}")),
        }
    })
    .await;

    // TLS by default: the operator made its CA, the sandboxd pod's init container got the node's
    // certificate from it, and discovery makes the pod the SandboxHost of its node, Ready, on
    // the node's loopback over https, trusting that CA.
    let hosts = Api::<SandboxHost>::all(client.clone());
    let host_name = format!("node-{NODE}");
    within(
        "the sandboxd pod discovered as a Ready SandboxHost",
        || async {
            let host = hosts.get_opt(&host_name).await.map_err(|e| e.to_string())?;
            let host = host.ok_or("no host yet")?;
            let ready = host.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
            let ca = host
                .spec
                .ca_secret
                .as_ref()
                .map(|r| (r.name.as_str(), r.key.as_str()));
            if host.spec.endpoint == format!("https://{NODE}:{PORT}")
                && ca == Some((format!("{FULL}-node-ca").as_str(), "tls.crt"))
                && ready
            {
                Ok(())
            } else {
                Err(format!("{:?} {:?}", host.spec, host.status))
            }
        },
    )
    .await;

    // A session applied with kubectl runs; a command runs through the pod's sandboxd.
    let manifest = format!(
        "apiVersion: sandboxd.dev/v1alpha1\nkind: SandboxSession\nmetadata:\n  name: s1\n  namespace: {n}\nspec:\n  scope: conversation\n  tenant: node-org\n  subject: c1\n"
    );
    let mut apply = kubectl_cmd(&bins);
    apply.args(["apply", "-f", "-"]);
    let out = pipe(apply, &manifest);
    assert!(
        out.contains("sandboxsession.sandboxd.dev/s1 created"),
        "{out}"
    );
    let sessions = Api::<SandboxSession>::namespaced(client.clone(), &n);
    within("the session Running", || async {
        let s = sessions.get("s1").await.map_err(|e| e.to_string())?;
        let status = s.status.unwrap_or_default();
        match status.phase {
            Some(sandboxd_crds::v1alpha1::session::SessionPhase::Running) => Ok(()),
            other => Err(format!("phase {other:?}: {:?}", status.message)),
        }
    })
    .await;
    let out = exec(
        &bins,
        &n,
        "s1",
        "echo kept-by-the-node > notes.txt && cat notes.txt && id -u",
    );
    assert!(out.contains("kept-by-the-node"), "{out}");
    // File operations run as the sandbox user in sandboxd (setfsuid): they work from the pod.
    let mut cp = kubectl_cmd(&bins);
    cp.args(["sandbox", "cp", "-", "s1:notes/cp.txt", "-n", &n]);
    let out = pipe(cp, "copied through the pod\n");
    assert!(out.contains("copied 23 B to s1:notes/cp.txt"), "{out}");

    // kubectl logs shows both components.
    let logs = ok(kubectl_cmd(&bins).args(["logs", "-n", &n, &sandboxd_pod]));
    assert!(
        logs.contains("serving HTTPS only"),
        "sandboxd's log: {logs}"
    );
    assert!(
        !logs.contains("SERVING PLAIN HTTP"),
        "sandboxd's log: {logs}"
    );
    let secrets = Api::<Secret>::namespaced(client.clone(), &n);
    let ca = secrets
        .get(&format!("{FULL}-node-ca"))
        .await
        .expect("the CA Secret the operator made");
    assert_eq!(ca.type_.as_deref(), Some("kubernetes.io/tls"));
    let logs = ok(kubectl_cmd(&bins).args(["logs", "-n", &n, &first_leader]));
    assert!(logs.contains("leading"), "the leader's log: {logs}");

    // Deleting the leading operator pod hands over: to the other replica, or to the pod that
    // replaces the deleted one, whichever asks first once the Lease is free.
    ok(kubectl_cmd(&bins).args(["delete", "pod", "-n", &n, &first_leader, "--wait=false"]));
    within("another operator pod leading", || async {
        match leader(&client, &n).await {
            Some(holder) if holder != first_leader => {
                let live = pods(&client, &n, "operator").await;
                if live.iter().any(|p| name(p) == holder) {
                    Ok(())
                } else {
                    Err(format!("lease holder {holder} is no operator pod"))
                }
            }
            holder => Err(format!(
                "lease holder {holder:?}, the deleted {first_leader}"
            )),
        }
    })
    .await;
    ready_pods(&client, &n, "operator", 2).await;

    // Deleting the sandboxd pod: a new one finds its session and the session's files.
    ok(kubectl_cmd(&bins).args(["delete", "pod", "-n", &n, &sandboxd_pod]));
    let new_pod = ready_pods(&client, &n, "sandboxd", 1).await.remove(0);
    assert_ne!(new_pod, sandboxd_pod);
    let out = within("the command's output through the pod", || async {
        let out = output(kubectl_cmd(&bins).args([
            "sandbox",
            "exec",
            "s1",
            "-n",
            &n,
            "--",
            "cat notes.txt",
        ]));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr)))
        }
    })
    .await;
    assert!(out.contains("kept-by-the-node"), "{out}");

    // helm upgrade that changes a Runtime: the prepare Job builds it before the DaemonSet rolls,
    // and the admin token stays.
    let secrets = Api::<Secret>::namespaced(client.clone(), &n);
    let token_before = admin_token(
        &secrets
            .get(&format!("{FULL}-admin-token"))
            .await
            .expect("the admin token"),
    );
    let upgrade_started = k8s_openapi::jiff::Timestamp::now().as_second();
    let changed = r#"runtimes.extra=[{"name":"local","spec":{"description":"The local Debian base image, upgraded.","baseImage":"BASE","setupCommands":["echo upgraded > /etc/node-test-runtime"],"default":true}}]"#
        .replace("BASE", &sandboxd_tests::base_image());
    ok(helm_in_ns("upgrade")
        .args([
            RELEASE,
            &repo_root().join("charts/sandboxd").display().to_string(),
        ])
        .args([
            "--reuse-values",
            "--set-json",
            &changed,
            "--wait",
            "--timeout",
            "10m",
        ]));
    let events = Api::<Event>::namespaced(client.clone(), &n)
        .list(&ListParams::default())
        .await
        .expect("events");
    let completed = events
        .items
        .iter()
        .find(|e| {
            e.involved_object.name.as_deref() == Some(&format!("{FULL}-prepare"))
                && e.reason.as_deref() == Some("Completed")
        })
        .unwrap_or_else(|| {
            panic!(
                "no Completed event of the prepare Job: {:?}",
                events
                    .items
                    .iter()
                    .map(|e| (&e.involved_object.name, &e.reason))
                    .collect::<Vec<_>>()
            )
        });
    let completed_at = completed
        .last_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
        .or_else(|| completed.event_time.as_ref().map(|t| t.0.as_second()))
        .expect("the event's time");
    // Event times have whole seconds.
    assert!(
        completed_at >= upgrade_started - 1,
        "the prepare Job completed before this upgrade"
    );
    let rolled = ready_pods(&client, &n, "sandboxd", 1).await.remove(0);
    assert_ne!(rolled, new_pod, "the DaemonSet rolled");
    let rolled_pod = Api::<Pod>::namespaced(client.clone(), &n)
        .get(&rolled)
        .await
        .expect("the new pod");
    let created = rolled_pod
        .metadata
        .creation_timestamp
        .expect("created")
        .0
        .as_second();
    assert!(
        completed_at <= created,
        "the prepare Job completed at {completed_at}, after the DaemonSet's new pod was made at {created}"
    );
    let token_after = admin_token(
        &secrets
            .get(&format!("{FULL}-admin-token"))
            .await
            .expect("the admin token"),
    );
    assert_eq!(
        token_after, token_before,
        "helm upgrade must keep the admin token"
    );

    // helm uninstall removes the pods, and leaves the CRDs and the session's workspace.
    ok(helm_in_ns("uninstall").args([RELEASE, "--wait"]));
    within(
        "the sessions back after the sandboxd pod's restart",
        || async {
            let left: Vec<String> = Api::<Pod>::namespaced(client.clone(), &n)
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .iter()
                .map(name)
                .collect();
            sandboxd_tests::poll::nothing_left("pods left", &left)
        },
    )
    .await;
    let crd_api = Api::<CustomResourceDefinition>::all(client.clone());
    for crd in &crds {
        assert!(
            crd_api.get_opt(crd).await.expect("read CRDs").is_some(),
            "helm uninstall removed the CRD {crd}"
        );
    }
    let kept = find_file(&dir.join("workspaces"), "notes.txt").unwrap_or_else(|| {
        panic!(
            "no notes.txt left under {}",
            dir.join("workspaces").display()
        )
    });
    assert_eq!(
        std::fs::read_to_string(&kept).expect("read notes.txt"),
        "kept-by-the-node\n"
    );

    forget_sessions(&client, &n).await;
    ns.delete().await;
    forget_host(&client).await;
    remove_session_containers();
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("the chart on the local node: {:?}", started.elapsed());
}

/// Runs `cmd` with `input` on stdin; fails the test unless it succeeds.
fn pipe(mut cmd: Command, input: &str) -> String {
    use std::io::Write as _;
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?} did not start: {e}"));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

/// The first file named `file` under `dir`.
fn find_file(dir: &Path, file: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_file(&path, file) {
                return Some(found);
            }
        } else if entry.file_name() == file {
            return Some(path);
        }
    }
    None
}

/// Waits (at most [`SLOW`]) until `attempt` gives a value, naming `what` if it does not.
async fn within<T>(what: &str, attempt: impl AsyncFnMut() -> Result<T, String>) -> T {
    sandboxd_tests::poll::until(what, SLOW, attempt).await
}
