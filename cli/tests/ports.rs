//! `kubectl sandbox ports` and `kubectl sandbox port-forward` end to end: the real binary
//! against a real sandboxd on the project's dockerd, the real operator and the API server from
//! `make up`, as shell.rs sets them up, with a session of the tools image (python3) and no
//! network. A `python3 -m http.server` on the sandbox's loopback is reached from a local port
//! once its port is open, by plain TCP clients; a port not open is refused before listening,
//! naming the command that opens it; a connection to a port nothing answers on is refused in
//! sandboxd's words and the forward goes on; SIGTERM ends it with status 0.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use rand::Rng;
use sandboxd_crds::v1alpha1::{Runtime, SandboxHost, SandboxSession};
use sandboxd_tests::host::{Host, bin};
use sandboxd_tests::process::Operator;
use sandboxd_tests::{TestNamespace, client, install_crds};
use serde_json::json;

const SCOPE_LABEL: &str = "sandboxd.dev/test-scope";

/// How long one step may take before the test fails.
const STEP: Duration = Duration::from_secs(60);

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubectl-sandbox");

/// The operator of this test's scope (`selector`) in namespace `ns`, started; killed when
/// dropped.
fn operator(ns: &str, selector: &str, identity: &str) -> Operator {
    let mut op = Operator::new(bin("sandbox-operator"), ns, selector);
    op.identity = Some(identity.to_owned());
    op.launch().expect("the operator starts");
    op
}

/// Runs the plugin in the test's namespace to its end.
fn plugin(ns: &str, args: &[&str]) -> Output {
    Command::new(PLUGIN)
        .args(["-n", ns])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("kubectl-sandbox runs")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn ok(ns: &str, args: &[&str]) -> String {
    let o = plugin(ns, args);
    let (out, err) = text(&o);
    assert!(
        o.status.success(),
        "kubectl sandbox {args:?} failed ({:?}):\n{out}\n{err}",
        o.status
    );
    out
}

/// A running plugin whose stdout and stderr are gathered as they come.
struct Running {
    child: Child,
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
}

impl Running {
    fn start(ns: &str, args: &[&str]) -> Self {
        let mut child = Command::new(PLUGIN)
            .args(["-n", ns])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the plugin starts");
        let gather = |mut from: Box<dyn std::io::Read + Send>| {
            let into = Arc::new(Mutex::new(Vec::new()));
            let sink = into.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = from.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    sink.lock()
                        .expect("the buffer")
                        .extend_from_slice(&buf[..n]);
                }
            });
            into
        };
        let out = gather(Box::new(child.stdout.take().expect("stdout")));
        let err = gather(Box::new(child.stderr.take().expect("stderr")));
        Self { child, out, err }
    }

    fn output(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().expect("the buffer")).into_owned()
    }

    fn errors(&self) -> String {
        String::from_utf8_lossy(&self.err.lock().expect("the buffer")).into_owned()
    }

    /// Waits until `found` finds something in (stdout, stderr).
    fn wait_for<T>(&self, what: &str, found: impl Fn(&str, &str) -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            if let Some(t) = found(&self.output(), &self.errors()) {
                return t;
            }
            assert!(
                start.elapsed() < STEP,
                "no {what} within {STEP:?}; stdout: {:?}, stderr: {:?}",
                self.output(),
                self.errors()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends SIGTERM and waits for the exit; returns its status with stdout and stderr.
    fn terminate(mut self) -> (i32, String, String) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success());
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("the process can be waited on") {
                std::thread::sleep(Duration::from_millis(200));
                return (status.code().unwrap_or(-1), self.output(), self.errors());
            }
            assert!(
                start.elapsed() < STEP,
                "still running {STEP:?} after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The local port of `Forwarding from 127.0.0.1:PORT -> remote` in `out`.
fn forwarded_port(out: &str, remote: u16) -> Option<u16> {
    let tail = format!(" -> {remote}");
    out.lines().find_map(|l| {
        l.strip_prefix("Forwarding from 127.0.0.1:")?
            .strip_suffix(&tail)?
            .parse()
            .ok()
    })
}

/// Sends `request` to 127.0.0.1:`port` and reads the answer until the connection closes.
fn exchange(port: u16, request: &str) -> String {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("the local port takes it");
    conn.set_read_timeout(Some(STEP)).expect("a read timeout");
    conn.write_all(request.as_bytes()).expect("request sent");
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer)
        .expect("the answer, then the end of the connection");
    String::from_utf8_lossy(&answer).into_owned()
}

/// A GET of `path` from the server behind local `port` (HTTP/1.0: it closes when it answered).
fn get(port: u16, path: &str) -> String {
    exchange(
        port,
        &format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_in_a_sandbox_without_network_is_reached_through_a_local_port() {
    let tools = std::env::var("SANDBOXD_TOOLS_IMAGE")
        .expect("SANDBOXD_TOOLS_IMAGE is not set: run `make up` and `eval \"$(hack/env.sh)\"`");
    let client = client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "ports").await;
    let ns = namespace.name.clone();
    let scope = format!("ports-{:08x}", rand::rng().random::<u32>());
    let labels = json!({ SCOPE_LABEL: scope });
    let selector = format!("{SCOPE_LABEL}={scope}");
    let host_name = format!("ports-host-{scope}");

    // One sandboxd, registered as a SandboxHost with its admin token, a default Runtime of the
    // tools image without network and the operator; then the session.
    let sandboxd_host = Host::start(&host_name, &[]);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "host-admin", "labels": labels},
        "stringData": {"token": sandboxd_host.sandboxd.token},
    }))
    .expect("secret");
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret created");
    let host: SandboxHost = serde_json::from_value(json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxHost",
        "metadata": {"name": host_name, "labels": labels},
        "spec": {
            "endpoint": sandboxd_host.endpoint(),
            "node": sandboxd_host.node,
            "adminTokenSecret": {"namespace": ns, "name": "host-admin"},
        },
    }))
    .expect("host");
    let hosts = Api::<SandboxHost>::all(client.clone());
    hosts
        .create(&PostParams::default(), &host)
        .await
        .expect("host created");
    let runtime: Runtime = serde_json::from_value(json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": format!("tools-{scope}"), "labels": labels},
        "spec": {"description": "the tools image, no network", "image": tools, "default": true},
    }))
    .expect("runtime");
    let runtimes = Api::<Runtime>::all(client.clone());
    runtimes
        .create(&PostParams::default(), &runtime)
        .await
        .expect("runtime created");
    let operator = operator(&ns, &selector, &scope);
    let label = format!("{SCOPE_LABEL}={scope}");
    ok(
        &ns,
        &[
            "open",
            "s1",
            "--tenant",
            "org-1",
            "--label",
            &label,
            "--timeout",
            "120",
        ],
    );

    // No network at all, and a web server on the sandbox's loopback, started in the
    // background by one exec.
    assert_eq!(ok(&ns, &["exec", "s1", "--", "ls /sys/class/net"]), "lo\n");
    ok(
        &ns,
        &[
            "exec",
            "s1",
            "--",
            "cd /workspace && mkdir -p site && echo hello > site/hello.txt && (cd site && nohup python3 -m http.server 3000 --bind 127.0.0.1 >/dev/null 2>&1 &) && sleep 1",
        ],
    );

    // Not open: refused before listening, naming the command that opens it.
    assert_eq!(ok(&ns, &["ports", "s1"]), "no port of session s1 is open\n");
    let refused = plugin(&ns, &["port-forward", "s1", ":3000"]);
    let (out, err) = text(&refused);
    assert_eq!(refused.status.code(), Some(1), "{out:?} {err:?}");
    assert_eq!(out, "");
    assert_eq!(
        err,
        "kubectl sandbox: port 3000 of session s1 is not open: open it with `kubectl sandbox ports s1 --open 3000`\n"
    );

    // Opened (and 3999, where nothing answers), then forwarded from free local ports.
    assert_eq!(ok(&ns, &["ports", "s1", "--open", "3000"]), "3000\n");
    assert_eq!(ok(&ns, &["ports", "s1", "--open", "3999"]), "3000\n3999\n");
    let forward = Running::start(&ns, &["port-forward", "s1", ":3000", ":3999"]);
    let (web, nothing) = forward.wait_for("two Forwarding lines", |out, _| {
        Some((forwarded_port(out, 3000)?, forwarded_port(out, 3999)?))
    });
    assert_ne!(web, 3000, "a free local port, not the remote one");

    // Two connections, each answered.
    for _ in 0..2 {
        let answer = get(web, "/hello.txt");
        assert!(answer.starts_with("HTTP/1.0 200 OK\r\n"), "{answer:?}");
        assert!(answer.ends_with("\r\n\r\nhello\n"), "{answer:?}");
    }
    let handled = format!("Handling connection for {web}\n");
    forward.wait_for("two connections handled", |out, _| {
        (out.matches(&handled).count() == 2).then_some(())
    });

    // Nothing answers on 3999: that connection (which sends nothing, so its close is a FIN,
    // not a reset) is closed, refused in sandboxd's words on stderr, and the forward goes on.
    assert_eq!(exchange(nothing, ""), "");
    let refusal = forward.wait_for("the refusal", |_, err| {
        err.lines()
            .find(|l| l.contains(&format!("connection for {nothing} to port 3999")))
            .map(str::to_owned)
    });
    assert!(
        refusal.starts_with(&format!(
            "kubectl sandbox: connection for {nothing} to port 3999 of session s1 refused: port_closed (502): nothing in the sandbox answers on port 3999"
        )),
        "{refusal}"
    );
    assert!(get(web, "/hello.txt").ends_with("\r\n\r\nhello\n"));

    // SIGTERM: the forward ends with status 0.
    let (code, out, err) = forward.terminate();
    assert_eq!(code, 0, "{out:?} {err:?}");
    assert_eq!(out.matches("Handling connection for").count(), 4, "{out}");

    // Closed: listed no more, and refused again before listening.
    assert_eq!(ok(&ns, &["ports", "s1", "--close", "3999"]), "3000\n");
    let refused = plugin(&ns, &["port-forward", "s1", "8080:3999", "3000"]);
    let (_, err) = text(&refused);
    assert_eq!(refused.status.code(), Some(1), "{err:?}");
    assert!(
        err.contains("open it with `kubectl sandbox ports s1 --open 3999`"),
        "{err}"
    );

    // Clean up: the operator is stopped first, so drop finalizers.
    drop(operator);
    drop(sandboxd_host);
    strip_and_delete(&hosts, &host_name).await;
    strip_and_delete(&runtimes, &format!("tools-{scope}")).await;
    strip_and_delete(
        &Api::<SandboxSession>::namespaced(client.clone(), &ns),
        "s1",
    )
    .await;
    let tombstones = Api::<sandboxd_crds::v1alpha1::Tombstone>::all(client.clone());
    if let Ok(list) = tombstones
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
    {
        for t in list.items {
            strip_and_delete(&tombstones, &kube::ResourceExt::name_any(&t)).await;
        }
    }
    namespace.delete().await;
}

async fn strip_and_delete<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = json!({"metadata": {"finalizers": null}});
    let _ = api
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await;
    let _ = api.delete(name, &kube::api::DeleteParams::default()).await;
}
