//! `kubectl sandbox shell` and `kubectl sandbox terminals` end to end: the real binary under a
//! real pseudo-terminal (`script`), against a real sandboxd on the project's dockerd, the real
//! operator and the API server from `make up`, as plugin.rs sets them up. Asserts what a person
//! sees: the terminal's output, the exit status, raw mode (Ctrl-C reaches the sandbox), a
//! terminal left running and found again with its scrollback, and one ended with --kill.

use std::io::{Read as _, Write as _};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use rand::Rng;
use sandboxd_crds::v1alpha1::{Runtime, SandboxHost, SandboxSession};
use sandboxd_tests::host::{Host, bin};
use sandboxd_tests::process::Operator;
use sandboxd_tests::{TestNamespace, base_image, client, install_crds};
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

/// Runs the plugin in the test's namespace with `input` on its stdin (a pipe, not a terminal).
fn plugin(ns: &str, args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(PLUGIN)
        .args(["-n", ns])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl-sandbox runs");
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input).expect("stdin written");
    }
    child.wait_with_output().expect("kubectl-sandbox ends")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn ok(ns: &str, args: &[&str]) -> String {
    let o = plugin(ns, args, b"");
    let (out, err) = text(&o);
    assert!(
        o.status.success(),
        "kubectl sandbox {args:?} failed ({:?}):\n{out}\n{err}",
        o.status
    );
    out
}

/// POSIX single-quoting for the line `script` runs.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// A running process whose stdout is gathered as it comes, with its stdin held open.
struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
}

impl Running {
    fn start(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the process starts");
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
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            out,
            err,
        }
    }

    /// The plugin with `args` under a pseudo-terminal of its own (`script`): stdin and stdout
    /// are a terminal; this test types into `script`'s stdin and reads its stdout.
    fn under_pty(ns: &str, args: &str) -> Self {
        let line = format!("{} -n {ns} {args}", quote(PLUGIN));
        let mut cmd = Command::new("script");
        cmd.args(["-qefc", &line, "/dev/null"]);
        Self::start(cmd)
    }

    fn output(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().expect("the buffer")).into_owned()
    }

    fn errors(&self) -> String {
        String::from_utf8_lossy(&self.err.lock().expect("the buffer")).into_owned()
    }

    /// Waits until stdout shows `needle`.
    fn wait_for(&self, needle: &str) {
        let start = Instant::now();
        while !self.output().contains(needle) {
            assert!(
                start.elapsed() < STEP,
                "no {needle:?} within {STEP:?}; stdout: {:?}, stderr: {:?}",
                self.output(),
                self.errors()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn type_in(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin.write_all(bytes).expect("typed");
        stdin.flush().expect("flushed");
    }

    /// Waits for the exit (stdin still open) and returns its status with stdout and stderr.
    fn wait(mut self) -> (i32, String, String) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("the process can be waited on") {
                // The readers finish with the pipes.
                std::thread::sleep(Duration::from_millis(200));
                drop(self.stdin.take());
                let code = status.code().unwrap_or(-1);
                return (code, self.output(), self.errors());
            }
            if start.elapsed() > STEP {
                let _ = self.child.kill();
                panic!(
                    "still running after {STEP:?}; stdout: {:?}, stderr: {:?}",
                    self.output(),
                    self.errors()
                );
            }
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

/// The terminal id a message names after `--attach `.
fn attach_id(message: &str) -> String {
    message
        .split("--attach ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no --attach TID in {message:?}"))
        .to_owned()
}

/// The row of `tid` in `kubectl sandbox terminals`' table.
fn row<'a>(table: &'a str, tid: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.starts_with(&format!("{tid} ")))
        .unwrap_or_else(|| panic!("no row of {tid} in:\n{table}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_works_in_a_terminal_leaves_it_running_and_comes_back_to_it() {
    let client = client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "shell").await;
    let ns = namespace.name.clone();
    let scope = format!("shell-{:08x}", rand::rng().random::<u32>());
    let labels = json!({ SCOPE_LABEL: scope });
    let selector = format!("{SCOPE_LABEL}={scope}");
    let host_name = format!("shell-host-{scope}");

    // One sandboxd, registered as a SandboxHost with its admin token, a default Runtime and
    // the operator; then the session.
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
        "metadata": {"name": format!("base-{scope}"), "labels": labels},
        "spec": {"description": "the local base image", "image": base_image(), "default": true},
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

    // A command on a terminal: its output, then its status as the plugin's.
    let (code, out, err) = Running::under_pty(&ns, "shell s1 -- 'echo $((6*7)); exit 7'").wait();
    assert_eq!(code, 7, "{out:?} {err:?}");
    assert!(out.contains("42\r\n"), "{out:?}");
    // The size asked for is the terminal's.
    let (code, out, _) =
        Running::under_pty(&ns, "shell s1 --rows 30 --cols 100 -- 'stty size'").wait();
    assert_eq!(code, 0, "{out:?}");
    assert!(out.contains("30 100\r\n"), "{out:?}");

    // Raw mode: Ctrl-C goes to the sandbox (its program ends by SIGINT, 128 + 2), not to the
    // plugin.
    let mut interrupted = Running::under_pty(&ns, "shell s1 -- 'echo ready; sleep 600'");
    interrupted.wait_for("ready");
    interrupted.type_in(b"\x03");
    let (code, out, err) = interrupted.wait();
    assert_eq!(code, 130, "{out:?} {err:?}");
    assert!(!out.contains("stopped by"), "{out:?}");

    // Piped input: a login shell reads it, then the end of input.
    let piped = plugin(&ns, &["shell", "s1"], b"echo piped-$((2+3)); exit 4\n");
    let (out, err) = text(&piped);
    assert_eq!(piped.status.code(), Some(4), "{out:?} {err:?}");
    assert!(out.contains("piped-5"), "{out:?}");

    // Left running: the plugin stopped by a signal says how to come back; the terminal is
    // listed as running.
    let mut cmd = Command::new(PLUGIN);
    cmd.args([
        "-n",
        &ns,
        "shell",
        "s1",
        "--",
        "echo marker-$((40+2)); sleep 600",
    ]);
    let left = Running::start(cmd);
    left.wait_for("marker-42");
    let stopped = Command::new("kill")
        .args(["-TERM", &left.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(stopped.success());
    let (code, _, err) = left.wait();
    assert_eq!(code, 1, "{err:?}");
    let tid = attach_id(&err);
    assert_eq!(
        err,
        format!(
            "kubectl sandbox: stopped by SIGTERM; terminal {tid} of session s1 runs on: kubectl sandbox shell s1 --attach {tid}\n"
        )
    );
    let table = ok(&ns, &["terminals", "s1"]);
    assert!(
        table.starts_with("ID  ") && table.contains("STATE"),
        "{table}"
    );
    let listed = row(&table, &tid);
    assert!(listed.contains(" running "), "{listed}");
    assert!(listed.contains("sleep 600"), "{listed}");

    // Attached again: its scrollback first; killed from another command, the attached plugin
    // exits with the status the kill gave it (128 + the signal).
    let back = Running::under_pty(&ns, &format!("shell s1 --attach {tid}"));
    back.wait_for("marker-42");
    let killed = ok(&ns, &["terminals", "s1", "--kill", &tid]);
    assert_eq!(
        killed,
        format!("killed terminal {tid} of session s1: its program and everything it started\n")
    );
    let (code, out, err) = back.wait();
    assert!(code > 128, "{code} {out:?} {err:?}");
    let table = ok(&ns, &["terminals", "s1"]);
    assert!(
        row(&table, &tid).contains(&format!(" killed {code} ")),
        "{table}"
    );

    // A terminal the session does not have: sandboxd's words and where to look.
    let missing = plugin(&ns, &["shell", "s1", "--attach", "term-nope"], b"");
    let (_, err) = text(&missing);
    assert_eq!(missing.status.code(), Some(1), "{err}");
    assert!(err.contains("terminal_not_found (404)"), "{err}");
    assert!(
        err.ends_with("List the terminals of session s1 with `kubectl sandbox terminals s1`\n"),
        "{err}"
    );

    // Clean up: the operator is stopped first, so drop finalizers.
    drop(operator);
    drop(sandboxd_host);
    strip_and_delete(&hosts, &host_name).await;
    strip_and_delete(&runtimes, &format!("base-{scope}")).await;
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
