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
        let mut op = Operator::new(
            PathBuf::from(env!("CARGO_BIN_EXE_sandbox-operator")),
            &self.ns,
            &format!("{SCOPE_LABEL}={}", self.scope),
        );
        op.kubeconfig = Some(kubeconfig.to_owned());
        op.log = "warn,sandboxd_operator=info".to_owned();
        op.lease_name = Some(format!("op-{}", self.scope));
        op.identity = Some(format!("op-{}-{}", self.scope, self.operators.len()));
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

    /// Registers `host` as a SandboxHost with its admin-token Secret.
    pub async fn register(&self, host: &Host) {
        self.register_on_node(host, None).await;
    }

    /// [`Scope::register`] with `spec.node` set to `node` (the operator then sends the token
    /// derived for that node).
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

    pub async fn register_endpoint(&self, name: &str, endpoint: &str, secret: &str) {
        self.register_endpoint_on_node(name, endpoint, secret, None)
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
            None => json!({}),
        };
        self.register_endpoint_with(name, endpoint, secret, extra)
            .await;
    }

    /// [`Scope::register_endpoint`] with more fields of the spec (`node`, `caSecret`).
    pub async fn register_endpoint_with(
        &self,
        name: &str,
        endpoint: &str,
        secret: &str,
        extra_spec: serde_json::Value,
    ) {
        let mut spec = json!({"endpoint": endpoint, "adminTokenSecret": {"namespace": self.ns, "name": secret, "key": "token"}});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra_spec.as_object()) {
            for (k, v) in e {
                s.insert(k.clone(), v.clone());
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
