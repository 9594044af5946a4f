//! The harness of the operator's end-to-end tests: the real API server from `make up`, real
//! sandboxd processes on the project's dockerd, and the real operator binary, each test in its
//! own scope (a label every object it makes carries, and the operator's `--selector`), so tests
//! run in parallel without seeing each other's objects.
#![allow(dead_code, missing_docs)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Client, ResourceExt};
use rand::Rng;
use sandboxd_crds::v1alpha1::{Runtime, SandboxHost, SandboxSession};
use serde_json::json;

#[allow(unused_imports)] // not every test binary uses every part
pub use sandboxd_tests::host::{Host, bin, free_port};
use sandboxd_tests::process::Operator;
pub use sandboxd_tests::{TestNamespace, base_image, client, install_crds};

pub const SCOPE_LABEL: &str = "sandboxd.dev/test-scope";

/// One test's world: a namespace, a scope label, and the operators it runs.
pub struct Scope {
    pub client: Client,
    pub ns: String,
    pub scope: String,
    namespace: Option<TestNamespace>,
    operators: Vec<Operator>,
}

impl Scope {
    pub async fn new(prefix: &str) -> Self {
        let client = client().await;
        install_crds(&client).await;
        let namespace = TestNamespace::create(&client, prefix).await;
        let scope = format!("{prefix}-{:08x}", rand::rng().random::<u32>());
        Self {
            client,
            ns: namespace.name.clone(),
            scope,
            namespace: Some(namespace),
            operators: vec![],
        }
    }

    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(SCOPE_LABEL.to_owned(), self.scope.clone())])
    }

    /// Starts an operator for this scope, in this scope's namespace (`POD_NAMESPACE`, where the
    /// admin-token Secrets are); returns its index.
    pub fn start_operator(&mut self, extra: &[&str]) -> usize {
        let kubeconfig = std::env::var("KUBECONFIG").expect("KUBECONFIG");
        self.start_operator_with(&kubeconfig, extra)
    }

    /// Starts an operator for this scope that talks to the API server through `kubeconfig`
    /// (one that impersonates a ServiceAccount runs it with that account's RBAC).
    pub fn start_operator_with(&mut self, kubeconfig: &str, extra: &[&str]) -> usize {
        self.start_operator_env(kubeconfig, extra, &[])
    }

    /// [`Scope::start_operator_with`] with more environment variables.
    pub fn start_operator_env(
        &mut self,
        kubeconfig: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> usize {
        let mut op = Operator::new(
            PathBuf::from(env!("CARGO_BIN_EXE_sandbox-operator")),
            &self.ns,
            &format!("{SCOPE_LABEL}={}", self.scope),
        );
        op.kubeconfig = Some(kubeconfig.to_owned());
        op.log = "warn,sandboxd_operator=info".to_owned();
        op.lease_name = Some(format!("op-{}", self.scope));
        op.identity = Some(format!("op-{}-{}", self.scope, self.operators.len()));
        op.env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        op.with_args(extra).launch().expect("the operator starts");
        self.operators.push(op);
        self.operators.len() - 1
    }

    /// The health/metrics base URL of operator `i`.
    pub fn health_url(&self, i: usize) -> String {
        self.operators[i].health.clone()
    }

    pub fn kill9_operator(&mut self, i: usize) {
        self.operators[i].process.kill9();
    }

    /// Registers `host` as a SandboxHost on its node with its admin-token Secret (the master:
    /// the operator sends the token derived for the node).
    pub async fn register(&self, host: &Host) {
        self.register_on_node(host, Some(&host.node)).await;
    }

    /// [`Scope::register`] with `spec.node` set to `node`, or unset (the operator then sends
    /// the host nothing).
    pub async fn register_on_node(&self, host: &Host, node: Option<&str>) {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": format!("{}-admin", host.name), "labels": self.labels()},
            "stringData": {"token": host.sandboxd.token},
        }))
        .expect("secret");
        Api::<Secret>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &secret)
            .await
            .expect("secret created");
        self.register_endpoint_on_node(
            &host.name,
            &host.endpoint(),
            &format!("{}-admin", host.name),
            node,
        )
        .await;
    }

    /// Registers a SandboxHost `name` at `endpoint` on node `name`, its admin token (the master)
    /// in Secret `secret`.
    pub async fn register_endpoint(&self, name: &str, endpoint: &str, secret: &str) {
        self.register_endpoint_on_node(name, endpoint, secret, Some(name))
            .await;
    }

    pub async fn register_endpoint_on_node(
        &self,
        name: &str,
        endpoint: &str,
        secret: &str,
        node: Option<&str>,
    ) {
        let extra = match node {
            Some(node) => json!({"node": node}),
            None => json!({"node": null}),
        };
        self.register_endpoint_with(name, endpoint, secret, extra)
            .await;
    }

    /// [`Scope::register_endpoint`] with more fields of the spec (`node`, `caSecret`); a
    /// `node` of null leaves it unset.
    pub async fn register_endpoint_with(
        &self,
        name: &str,
        endpoint: &str,
        secret: &str,
        extra_spec: serde_json::Value,
    ) {
        let mut spec = json!({"endpoint": endpoint, "node": name, "adminTokenSecret": {"namespace": self.ns, "name": secret, "key": "token"}});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra_spec.as_object()) {
            for (k, v) in e {
                if v.is_null() {
                    s.remove(k);
                } else {
                    s.insert(k.clone(), v.clone());
                }
            }
        }
        let sbh: SandboxHost = serde_json::from_value(json!({
            "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxHost",
            "metadata": {"name": name, "labels": self.labels()},
            "spec": spec,
        }))
        .expect("host");
        Api::<SandboxHost>::all(self.client.clone())
            .create(&PostParams::default(), &sbh)
            .await
            .expect("host created");
    }

    /// A default image Runtime named `base` (what the hosts run) for this scope.
    pub async fn default_runtime(&self) {
        let rt: Runtime = serde_json::from_value(json!({
            "apiVersion": "sandboxd.dev/v1alpha1", "kind": "Runtime",
            "metadata": {"name": format!("base-{}", self.scope), "labels": self.labels()},
            "spec": {"description": "the local base image", "image": base_image(), "default": true},
        }))
        .expect("runtime");
        Api::<Runtime>::all(self.client.clone())
            .create(&PostParams::default(), &rt)
            .await
            .expect("runtime created");
    }

    /// The id a session of this namespace has on its host.
    pub fn host_id(&self, name: &str) -> String {
        sandboxd_crds::key::host_session_id(&self.ns, name)
    }

    pub fn sessions(&self) -> Api<SandboxSession> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Applies a session with `kubectl apply`, as a platform would.
    pub fn kubectl_apply_session(&self, name: &str, extra_spec: serde_json::Value) {
        let mut spec = json!({"scope": "conversation", "tenant": "org-1", "subject": name});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra_spec.as_object()) {
            for (k, v) in e {
                s.insert(k.clone(), v.clone());
            }
        }
        let doc = json!({
            "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession",
            "metadata": {"name": name, "namespace": self.ns, "labels": self.labels()},
            "spec": spec,
        });
        let mut child = Command::new(sandboxd_tests::kubectl())
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("kubectl runs");
        std::io::Write::write_all(
            child.stdin.as_mut().expect("stdin"),
            doc.to_string().as_bytes(),
        )
        .expect("write");
        drop(child.stdin.take());
        assert!(
            child.wait().expect("kubectl").success(),
            "kubectl apply failed"
        );
    }

    /// Waits (watching, with a deadline) until the session satisfies `cond`.
    pub async fn wait_session(
        &self,
        name: &str,
        what: &str,
        secs: u64,
        cond: impl Fn(&SandboxSession) -> bool,
    ) -> SandboxSession {
        self.wait_session_in(&self.ns, name, what, secs, cond).await
    }

    /// [`Scope::wait_session`] for a session of namespace `ns`.
    pub async fn wait_session_in(
        &self,
        ns: &str,
        name: &str,
        what: &str,
        secs: u64,
        cond: impl Fn(&SandboxSession) -> bool,
    ) -> SandboxSession {
        let api = Api::<SandboxSession>::namespaced(self.client.clone(), ns);
        let found = tokio::time::timeout(
            Duration::from_secs(secs),
            await_condition(api.clone(), name, move |s: Option<&SandboxSession>| {
                s.is_some_and(&cond)
            }),
        )
        .await;
        match found {
            Ok(Ok(Some(s))) => s,
            _ => {
                let now = api.get_opt(name).await.ok().flatten();
                panic!(
                    "session {name} did not become {what} within {secs} s; it is {:#?}",
                    now.map(|s| s.status)
                )
            }
        }
    }

    pub async fn delete(mut self) {
        self.operators.clear();
        let client = self.client.clone();
        let labels = format!("{SCOPE_LABEL}={}", self.scope);
        let lp = kube::api::ListParams::default().labels(&labels);
        let dp = kube::api::DeleteParams::default();
        // Objects outlive their operator here; drop finalizers so the API server can remove them.
        strip_and_delete(
            Api::<SandboxSession>::namespaced(client.clone(), &self.ns),
            &lp,
            &dp,
        )
        .await;
        strip_and_delete(
            Api::<sandboxd_crds::v1alpha1::SandboxSnapshot>::namespaced(client.clone(), &self.ns),
            &lp,
            &dp,
        )
        .await;
        strip_and_delete(Api::<SandboxHost>::all(client.clone()), &lp, &dp).await;
        strip_and_delete(Api::<Runtime>::all(client.clone()), &lp, &dp).await;
        strip_and_delete(
            Api::<sandboxd_crds::v1alpha1::Tombstone>::all(client.clone()),
            &lp,
            &dp,
        )
        .await;
        if let Some(ns) = self.namespace.take() {
            ns.delete().await;
        }
    }
}

async fn strip_and_delete<K>(api: Api<K>, lp: &kube::api::ListParams, dp: &kube::api::DeleteParams)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    if let Ok(list) = api.list(lp).await {
        for o in list.items {
            let name = o.name_any();
            let patch = json!({"metadata": {"finalizers": null}});
            let _ = api
                .patch(
                    &name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await;
            let _ = api.delete(&name, dp).await;
        }
    }
}

pub fn phase(s: &SandboxSession) -> Option<sandboxd_crds::v1alpha1::session::SessionPhase> {
    s.status.as_ref().and_then(|st| st.phase)
}

/// The `token` of a session's token Secret.
pub fn token_of(secret: &Secret) -> String {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get("token"))
        .map(|b| b.0.clone())
        .expect("a token in the Secret");
    String::from_utf8(bytes).expect("utf-8 token")
}

/// Waits (watching, with a deadline) until `name` is gone.
pub async fn wait_gone<K>(api: Api<K>, name: &str, secs: u64)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let done = tokio::time::timeout(
        Duration::from_secs(secs),
        await_condition(api.clone(), name, |o: Option<&K>| o.is_none()),
    )
    .await;
    assert!(
        matches!(done, Ok(Ok(_))),
        "{name} was not removed within {secs} s: {:?}",
        api.get_opt(name).await
    );
}

/// Waits (watching, with a deadline of 30 s) until ConfigMap `map` of `ns` holds an entry for
/// `node`, and returns its data: the node token hashes the operator writes.
pub async fn node_token_hashes(
    client: &Client,
    ns: &str,
    map: &str,
    node: &str,
) -> BTreeMap<String, String> {
    let maps = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns);
    let key = node.to_owned();
    let written = tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(
            maps.clone(),
            map,
            move |m: Option<&k8s_openapi::api::core::v1::ConfigMap>| {
                m.and_then(|m| m.data.as_ref())
                    .is_some_and(|d| d.contains_key(&key))
            },
        ),
    )
    .await;
    match written {
        Ok(Ok(Some(m))) => m.data.unwrap_or_default(),
        _ => panic!(
            "the operator did not write node {node}'s hash into {ns}/{map} within 30 s: {:?}",
            maps.get_opt(map).await.map(|m| m.and_then(|m| m.data))
        ),
    }
}

/// Plays the kubelet's part for a ConfigMap volume: every entry of `data` becomes a file of
/// that name in `dir`.
pub fn mount_config_map(dir: &std::path::Path, data: &BTreeMap<String, String>) {
    for (name, value) in data {
        std::fs::write(dir.join(name), value).expect("write the mounted file");
    }
}

/// The label of the test's Node objects that its DaemonSet ([`daemonset`]) runs on.
pub const TEST_NODE_LABEL: &str = "sandboxd.dev/test-node";

/// Node objects a test makes (no kubelet runs them), labelled `TEST_NODE_LABEL=<label>`;
/// deleted, with the pods of `pods_in` (nothing would finish their graceful deletion), when
/// dropped.
pub struct TestNodes {
    pub names: Vec<String>,
    pub pods_in: String,
}

impl TestNodes {
    pub async fn create(client: &Client, label: &str, names: &[String], pods_in: &str) -> Self {
        let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone());
        for name in names {
            let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(
                json!({"metadata": {"name": name, "labels": {TEST_NODE_LABEL: label}}}),
            )
            .expect("node");
            nodes
                .create(&PostParams::default(), &node)
                .await
                .expect("the Node is created");
        }
        Self {
            names: names.to_vec(),
            pods_in: pods_in.to_owned(),
        }
    }
}

impl Drop for TestNodes {
    fn drop(&mut self) {
        let _ = Command::new(sandboxd_tests::kubectl())
            .args(["delete", "pods", "--all", "-n", &self.pods_in])
            .args(["--grace-period=0", "--force", "--wait=false"])
            .output();
        for node in &self.names {
            let _ = Command::new(sandboxd_tests::kubectl())
                .args(["delete", "node", node, "--ignore-not-found", "--wait=false"])
                .output();
        }
    }
}

/// A DaemonSet `name` in `ns` that selects pods labelled `ds=<name>` and runs on the Nodes
/// labelled `TEST_NODE_LABEL=<node_label>`, replacing none of its pods by itself (`OnDelete`):
/// the controller-manager keeps the test's pods, on those Nodes and owned by it, as its pods
/// (it deletes a pod it owns on a node it does not run on). Returns its uid: what a pod's
/// owner reference to it carries.
pub async fn daemonset(client: &Client, ns: &str, name: &str, node_label: &str) -> String {
    let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"ds": name}},
            "updateStrategy": {"type": "OnDelete"},
            "template": {
                "metadata": {"labels": {"ds": name}},
                "spec": {
                    "hostNetwork": true,
                    "nodeSelector": {TEST_NODE_LABEL: node_label},
                    "containers": [{"name": "sandboxd", "image": "sandboxd:never-started"}],
                },
            },
        },
    }))
    .expect("daemonset");
    Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &ds)
        .await
        .expect("the DaemonSet is created")
        .metadata
        .uid
        .expect("its uid")
}

/// Waits (watching, 30 s at most) until DaemonSet `uid` has adopted pod `name` of `ns` (its
/// controller owner reference), as the controller-manager does with a pod its selector matches.
pub async fn adopted(client: &Client, ns: &str, name: &str, uid: &str) {
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns);
    let uid = uid.to_owned();
    let done = tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(
            pods.clone(),
            name,
            move |p: Option<&k8s_openapi::api::core::v1::Pod>| {
                p.is_some_and(|p| {
                    p.owner_references()
                        .iter()
                        .any(|o| o.controller == Some(true) && o.uid == uid)
                })
            },
        ),
    )
    .await;
    assert!(
        matches!(done, Ok(Ok(Some(_)))),
        "the DaemonSet did not adopt pod {name} within 30 s: {:?}",
        pods.get_opt(name).await.map(|p| p.map(|p| p.metadata))
    );
}

// What the tests of more than one file look at: a session's credentials and the words of its
// status, a host's conditions, a container as Docker has it.

/// The session's id on its host and the token in its Secret.
pub async fn credentials(
    client: &kube::Client,
    s: &sandboxd_crds::v1alpha1::SandboxSession,
) -> (String, String) {
    let status = s.status.clone().expect("status");
    let secret = Api::<Secret>::namespaced(client.clone(), &s.namespace().expect("namespace"))
        .get(&status.credentials_secret.expect("credentials secret"))
        .await
        .expect("the token Secret");
    (status.session_id.expect("session id"), token_of(&secret))
}

/// What a person sees of `status.sleepsAt`: absent unless the session runs, and then a valid
/// RFC 3339 time (never empty, never unparsable); `kubectl get -o wide` never shows
/// `<invalid>`. Read from the raw object, so a value the typed client could not even parse
/// fails here with what it was.
pub async fn assert_sleeps_at_shown(scope: &Scope, name: &str) {
    let kubectl = |args: &[&str]| {
        let out = std::process::Command::new(sandboxd_tests::kubectl())
            .args(["get", "sbx", name, "-n", &scope.ns])
            .args(args)
            .output()
            .expect("kubectl runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let raw: serde_json::Value =
        serde_json::from_str(&kubectl(&["-o", "json"])).expect("kubectl prints JSON");
    let phase = raw["status"]["phase"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    match raw["status"].get("sleepsAt") {
        None => assert_ne!(phase, "Running", "a running session says when it sleeps"),
        Some(v) => {
            assert_eq!(phase, "Running", "only a running session sleeps: {v}");
            let text = v.as_str().unwrap_or_default();
            assert!(
                text.parse::<k8s_openapi::jiff::Timestamp>().is_ok() && text.ends_with('Z'),
                "sleepsAt {v} is not an RFC 3339 time"
            );
        }
    }
    let wide = kubectl(&["-o", "wide"]);
    assert!(!wide.contains("<invalid>"), "{wide}");
}

/// A session told it waits for a sandbox its host holds for another object or tenant: its
/// message starts with `said`, and nothing of that sandbox (its id, a token) was handed to it.
pub fn assert_waits_for_another_owner(
    waiting: &sandboxd_crds::v1alpha1::SandboxSession,
    said: &str,
) {
    let message = waiting
        .status
        .as_ref()
        .and_then(|st| st.message.clone())
        .expect("a message");
    assert!(message.starts_with(said), "{message}");
    assert!(
        waiting
            .status
            .as_ref()
            .is_some_and(|st| st.credentials_secret.is_none() && st.session_id.is_none()),
        "nothing of the held session was handed out: {:?}",
        waiting.status
    );
}

/// Waits (watching, with a deadline) until host `name` satisfies `cond`.
pub async fn wait_host(
    client: &kube::Client,
    name: &str,
    what: &str,
    cond: impl Fn(&SandboxHost) -> bool + Send + 'static,
) -> SandboxHost {
    let hosts = Api::<SandboxHost>::all(client.clone());
    let found = tokio::time::timeout(
        Duration::from_secs(60),
        await_condition(hosts.clone(), name, move |h: Option<&SandboxHost>| {
            h.is_some_and(&cond)
        }),
    )
    .await;
    match found {
        Ok(Ok(Some(h))) => h,
        _ => panic!(
            "host {name} did not become {what} within 60 s; it is {:#?}",
            hosts.get_opt(name).await.ok().flatten().map(|h| h.status)
        ),
    }
}

/// The Ready condition of host `name` once it satisfies `cond`, watched with a deadline.
pub async fn wait_host_ready_condition(
    hosts: &Api<SandboxHost>,
    name: &str,
    secs: u64,
    cond: impl Fn(&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition) -> bool,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    let ready = |h: &SandboxHost| {
        h.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .cloned()
    };
    let found = tokio::time::timeout(
        Duration::from_secs(secs),
        await_condition(hosts.clone(), name, |h: Option<&SandboxHost>| {
            h.and_then(ready).is_some_and(|c| cond(&c))
        }),
    )
    .await;
    match found {
        Ok(Ok(Some(h))) => ready(&h).expect("the Ready condition"),
        _ => panic!(
            "host {name} did not get the expected Ready condition within {secs} s: {:#?}",
            hosts
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|h| h.status)
        ),
    }
}

/// The condition of type `type_` of host `h`, if it has one.
pub fn condition<'a>(
    h: &'a SandboxHost,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    h.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
}

/// What `docker inspect` says of the container of `session` on `host`.
pub fn inspect(host: &Host, session: &str, format: &str) -> String {
    let ids = host.container_ids(session);
    let id = ids
        .first()
        .unwrap_or_else(|| panic!("no container of {session}: {:?}", host.containers()));
    let out = std::process::Command::new("docker")
        .args(["inspect", "--format", format, id])
        .output()
        .expect("docker runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
