//! The harness of `kubectl sandbox`'s end-to-end tests (plugin.rs, shell.rs, ports.rs): the
//! API server from `make up`, a real sandboxd on the project's dockerd registered as a
//! SandboxHost, the real operator, each test in its own scope (a label every object it makes
//! carries, and the operator's selector), and the plugin binary run as a person runs it.
#![allow(dead_code)] // not every test binary uses every helper

use std::io::{Read as _, Write as _};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, PostParams};
use rand::Rng;
use sandboxd_crds::v1alpha1::{Runtime, SandboxHost, SandboxSession, Tombstone};
use sandboxd_tests::host::{Host, bin};
use sandboxd_tests::process::Operator;
use sandboxd_tests::{TestNamespace, base_image, client, install_crds};
use serde_json::{Value, json};

/// The label that puts an object in a test's scope.
pub const SCOPE_LABEL: &str = "sandboxd.dev/test-scope";

/// The Secret of a scope's namespace that holds a host's admin token (key `token`).
pub const ADMIN_SECRET: &str = "host-admin";

/// How long one step may take before the test fails.
pub const STEP: Duration = Duration::from_secs(60);

/// The plugin binary under test.
pub const PLUGIN: &str = env!("CARGO_BIN_EXE_kubectl-sandbox");

/// One test's world on the API server: a namespace of its own and a scope (`<prefix>-<random>`)
/// that labels every object it makes and selects them for its operator.
pub struct TestScope {
    /// The client of the API server from `make up`.
    pub client: Client,
    /// The test's namespace.
    pub ns: String,
    /// The scope's value of [`SCOPE_LABEL`].
    pub scope: String,
    /// `SCOPE_LABEL=scope`: the operator's selector and the label of the sessions it opens.
    pub selector: String,
    namespace: TestNamespace,
}

impl TestScope {
    /// Installs the CRDs, creates namespace `sbx-test-<namespace_prefix>-…` and draws scope
    /// `<scope_prefix>-<8 hex digits>`.
    pub async fn new(namespace_prefix: &str, scope_prefix: &str) -> Self {
        let client = client().await;
        install_crds(&client).await;
        let namespace = TestNamespace::create(&client, namespace_prefix).await;
        let scope = format!("{scope_prefix}-{:08x}", rand::rng().random::<u32>());
        Self {
            client,
            ns: namespace.name.clone(),
            selector: format!("{SCOPE_LABEL}={scope}"),
            scope,
            namespace,
        }
    }

    /// The labels of every object the test makes.
    fn labels(&self) -> Value {
        json!({ SCOPE_LABEL: self.scope })
    }

    /// Creates Secret `name` in the test's namespace, holding `value` under `key`.
    pub async fn create_secret(&self, name: &str, key: &str, value: &str) {
        create(
            &Api::<Secret>::namespaced(self.client.clone(), &self.ns),
            json!({
                "metadata": {"name": name, "labels": self.labels()},
                "stringData": {key: value},
            }),
            "secret",
        )
        .await;
    }

    /// Creates `K` (a cluster-wide kind of sandboxd.dev: SandboxHost, Runtime) `name` of the
    /// scope with `spec`; `what` names it in a failure.
    async fn create_cluster_object<K>(&self, name: &str, spec: Value, what: &str)
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        create(
            &Api::<K>::all(self.client.clone()),
            json!({
                "apiVersion": K::api_version(&()), "kind": K::kind(&()),
                "metadata": {"name": name, "labels": self.labels()},
                "spec": spec,
            }),
            what,
        )
        .await;
    }

    /// Creates Secret [`ADMIN_SECRET`] with `host`'s master token.
    pub async fn create_admin_secret(&self, host: &Host) {
        self.create_secret(ADMIN_SECRET, "token", &host.sandboxd.token)
            .await;
    }

    /// Creates SandboxHost `name` at `endpoint` for node `node` (a host names its node, or the
    /// operator sends it no token), with the admin token of Secret [`ADMIN_SECRET`] and, when
    /// given, the CA of Secret `ca_secret`, both in the test's namespace.
    pub async fn create_host(
        &self,
        name: &str,
        endpoint: &str,
        node: &str,
        ca_secret: Option<&str>,
    ) {
        let mut spec = json!({
            "endpoint": endpoint,
            "node": node,
            "adminTokenSecret": {"namespace": self.ns, "name": ADMIN_SECRET},
        });
        if let Some(ca) = ca_secret {
            spec["caSecret"] = json!({"namespace": self.ns, "name": ca});
        }
        self.create_cluster_object::<SandboxHost>(name, spec, "host")
            .await;
    }

    /// Registers a running sandboxd: Secret [`ADMIN_SECRET`] with its master token, then
    /// SandboxHost `host.name` at its endpoint for its node.
    pub async fn register_host(&self, host: &Host) {
        self.create_admin_secret(host).await;
        self.create_host(&host.name, &host.endpoint(), &host.node, None)
            .await;
    }

    /// Creates Runtime `name` with `spec`.
    pub async fn create_runtime(&self, name: &str, spec: Value) {
        self.create_cluster_object::<Runtime>(name, spec, "runtime")
            .await;
    }

    /// The name of the scope's Runtime of the local base image, `base-<scope>`.
    pub fn base_runtime(&self) -> String {
        format!("base-{}", self.scope)
    }

    /// Creates [`TestScope::base_runtime`]: the local base image, the default.
    pub async fn create_base_runtime(&self) {
        self.create_runtime(
            &self.base_runtime(),
            json!({"description": "the local base image", "image": base_image(), "default": true}),
        )
        .await;
    }

    /// The operator of this scope (its selector, identity the scope) in the test's namespace,
    /// started; killed when dropped.
    pub fn operator(&self) -> Operator {
        let mut op = Operator::new(bin("sandbox-operator"), &self.ns, &self.selector);
        op.identity = Some(self.scope.clone());
        op.launch().expect("the operator starts");
        op
    }

    /// `kubectl sandbox open <session> --tenant org-1 --label <selector> --timeout 120`, which
    /// must succeed: its stdout and stderr.
    pub fn open(&self, session: &str) -> (String, String) {
        ok(
            &self.ns,
            &[
                "open",
                session,
                "--tenant",
                "org-1",
                "--label",
                &self.selector,
                "--timeout",
                "120",
            ],
        )
    }

    /// The SandboxSessions of the test's namespace.
    pub fn sessions(&self) -> Api<SandboxSession> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Removes the Tombstones of the scope (finalizers dropped).
    pub async fn delete_tombstones(&self) {
        let tombstones = Api::<Tombstone>::all(self.client.clone());
        if let Ok(list) = tombstones
            .list(&kube::api::ListParams::default().labels(&self.selector))
            .await
        {
            for t in list.items {
                strip_and_delete(&tombstones, &kube::ResourceExt::name_any(&t)).await;
            }
        }
    }

    /// Deletes the test's namespace.
    pub async fn delete_namespace(self) {
        self.namespace.delete().await;
    }

    /// The end of a test, once its operator is stopped (so nothing removes finalizers): the
    /// SandboxHosts `hosts`, Runtimes `runtimes`, sessions `sessions` and every other session
    /// and SandboxSnapshot of the namespace with their finalizers dropped, the scope's
    /// Tombstones, then the namespace.
    pub async fn clean_up(self, hosts: &[&str], runtimes: &[&str], sessions: &[&str]) {
        let host_api = Api::<SandboxHost>::all(self.client.clone());
        for name in hosts {
            strip_and_delete(&host_api, name).await;
        }
        let runtime_api = Api::<Runtime>::all(self.client.clone());
        for name in runtimes {
            strip_and_delete(&runtime_api, name).await;
        }
        let session_api = self.sessions();
        for name in sessions {
            strip_and_delete(&session_api, name).await;
        }
        // What the test made besides (a fork, snapshots): every one of the namespace.
        if let Ok(left) = session_api.list(&Default::default()).await {
            for s in left.items {
                strip_and_delete(&session_api, &kube::ResourceExt::name_any(&s)).await;
            }
        }
        let snapshots = Api::<sandboxd_crds::v1alpha1::SandboxSnapshot>::namespaced(
            self.client.clone(),
            &self.namespace.name,
        );
        if let Ok(left) = snapshots.list(&Default::default()).await {
            for s in left.items {
                strip_and_delete(&snapshots, &kube::ResourceExt::name_any(&s)).await;
            }
        }
        self.delete_tombstones().await;
        self.delete_namespace().await;
    }
}

/// Creates the `K` that `object` describes through `api`; `what` names it in a failure.
async fn create<K>(api: &Api<K>, object: Value, what: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object).unwrap_or_else(|e| panic!("{what}: {e:?}"));
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("{what} created: {e:?}"));
}

/// Drops the finalizers of object `name`, then deletes it; errors (it is gone) are ignored.
pub async fn strip_and_delete<K>(api: &Api<K>, name: &str)
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

/// The plugin with `args` in namespace `ns`, not started.
pub fn plugin_command(ns: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(PLUGIN);
    cmd.args(["-n", ns]).args(args);
    cmd
}

/// Runs the plugin in namespace `ns` to its end, with no stdin (`/dev/null`).
pub fn plugin(ns: &str, args: &[&str]) -> Output {
    plugin_command(ns, args)
        .stdin(Stdio::null())
        .output()
        .expect("kubectl-sandbox runs")
}

/// Runs the plugin in namespace `ns` with `input` on its stdin (a pipe, not a terminal).
pub fn plugin_with_input(ns: &str, args: &[&str], input: &[u8]) -> Output {
    let mut child = plugin_command(ns, args)
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

/// A run's stdout and stderr as text.
pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Runs the plugin ([`plugin`]), which must succeed: its stdout and stderr.
pub fn ok(ns: &str, args: &[&str]) -> (String, String) {
    let o = plugin(ns, args);
    let (out, err) = text(&o);
    assert!(
        o.status.success(),
        "kubectl sandbox {args:?} failed ({:?}):\n{out}\n{err}",
        o.status
    );
    (out, err)
}

/// [`ok`]'s stdout alone.
pub fn ok_stdout(ns: &str, args: &[&str]) -> String {
    ok(ns, args).0
}

/// A running process whose stdout and stderr are gathered as they come; killed when dropped.
pub struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
}

impl Running {
    /// Starts `cmd` with its stdin a pipe held open (see [`Running::type_in`]).
    pub fn start(cmd: Command) -> Self {
        Self::spawn(cmd, Stdio::piped())
    }

    /// Starts the plugin with `args` in namespace `ns`, with no stdin (`/dev/null`).
    pub fn plugin(ns: &str, args: &[&str]) -> Self {
        Self::spawn(plugin_command(ns, args), Stdio::null())
    }

    fn spawn(mut cmd: Command, stdin: Stdio) -> Self {
        let mut child = cmd
            .stdin(stdin)
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

    /// Its stdout so far.
    pub fn output(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().expect("the buffer")).into_owned()
    }

    /// Its stderr so far.
    pub fn errors(&self) -> String {
        String::from_utf8_lossy(&self.err.lock().expect("the buffer")).into_owned()
    }

    /// Waits until `found` finds something in (stdout, stderr), for at most [`STEP`]; `what`
    /// names it in the failure.
    pub fn wait_for<T>(&self, what: &str, found: impl Fn(&str, &str) -> Option<T>) -> T {
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

    /// Waits until stdout shows `needle`.
    pub fn wait_for_output(&self, needle: &str) {
        self.wait_for(&format!("{needle:?}"), |out, _| {
            out.contains(needle).then_some(())
        });
    }

    /// Types `bytes` into its stdin.
    pub fn type_in(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin.write_all(bytes).expect("typed");
        stdin.flush().expect("flushed");
    }

    /// Sends it SIGTERM.
    pub fn send_sigterm(&self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success());
    }

    /// Its status with stdout and stderr once it exits (stdin still open), or `None` while it
    /// still runs after [`STEP`].
    fn exit_within_step(&mut self) -> Option<(i32, String, String)> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("the process can be waited on") {
                // The readers finish with the pipes.
                std::thread::sleep(Duration::from_millis(200));
                drop(self.stdin.take());
                return Some((status.code().unwrap_or(-1), self.output(), self.errors()));
            }
            if start.elapsed() >= STEP {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the exit (stdin still open) and returns its status with stdout and stderr;
    /// kills it and fails the test after [`STEP`].
    pub fn wait(mut self) -> (i32, String, String) {
        match self.exit_within_step() {
            Some(exit) => exit,
            None => {
                let _ = self.child.kill();
                panic!(
                    "still running after {STEP:?}; stdout: {:?}, stderr: {:?}",
                    self.output(),
                    self.errors()
                );
            }
        }
    }

    /// Sends SIGTERM and waits for the exit; returns its status with stdout and stderr.
    pub fn terminate(mut self) -> (i32, String, String) {
        self.send_sigterm();
        self.exit_within_step()
            .unwrap_or_else(|| panic!("still running {STEP:?} after SIGTERM"))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
