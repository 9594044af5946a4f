//! The operator under the chart's RBAC alone: its ServiceAccount's ClusterRole and Role, as
//! `helm template` renders them, applied to the real API server, and the real operator binary
//! talking through a kubeconfig that impersonates that ServiceAccount. It may not list, watch or
//! read a Secret outside its namespace, yet a session runs with its token Secret (replacing one
//! of that name left over), a deleted token Secret is issued again, and a deleted session is
//! destroyed through its Tombstone. A sandboxd given only the hash of its node's token takes the
//! token once the operator, under the same RBAC, has written that hash into the chart's ConfigMap.
//!
//! Over 600 lines: one test a scenario, sharing this file's fixtures.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{
    Host, Scope, mount_config_map, node_token_hashes, phase, token_of, wait_gone,
    wait_host_ready_condition,
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::await_condition;
use kube::{Client, Config, ResourceExt};
use rand::Rng;
use sandboxd_api::auth::{hash, node_token};
use sandboxd_crds::v1alpha1::session::SessionPhase;
use sandboxd_crds::v1alpha1::{SandboxHost, SandboxSession, Tombstone};

fn helm() -> PathBuf {
    PathBuf::from(std::env::var("SANDBOXD_HELM").expect(
        "SANDBOXD_HELM is not set: run `make test`, or `make up` and `eval \"$(make -s env)\"`",
    ))
}

fn output(cmd: &mut Command, input: Option<&str>) -> String {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?} did not start: {e}"));
    let mut stdin = child.stdin.take().expect("stdin");
    if let Some(input) = input {
        std::io::Write::write_all(&mut stdin, input.as_bytes()).expect("write");
    }
    drop(stdin);
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The chart's operator RBAC (and the ConfigMap of node token hashes it may patch) for release
/// `release` in `ns`, applied; its cluster-wide objects
/// are deleted when this is dropped (the namespaced ones go with the namespace).
struct ChartRbac {
    /// The ServiceAccount's and the roles' name.
    name: String,
}

impl ChartRbac {
    fn apply(release: &str, ns: &str) -> Self {
        let chart = sandboxd_tests::repo_root().join("charts/sandboxd");
        let rendered = output(
            Command::new(helm())
                .args(["template", release])
                .arg(chart)
                .args(["-n", ns, "--kube-version", "1.37.2"])
                // Offline, the chart renders only with an admin token given; this test uses
                // none of it (only the RBAC is applied).
                .args([
                    "--set",
                    "adminToken.value=render-only-admin-token-0123456789abcdef",
                ])
                // Without egress credentials: their label-selected Secret watch needs list and
                // watch on Secrets cluster-wide, and this test holds the operator to none
                // (operator/tests/credentials.rs runs it with them).
                .args(["--set", "operator.egressCredentials.enabled=false"])
                .args(["--show-only", "templates/operator-rbac.yaml"])
                .args(["--show-only", "templates/secret-policy.yaml"])
                .args(["--show-only", "templates/node-token-hashes.yaml"]),
            None,
        );
        output(
            Command::new(sandboxd_tests::kubectl()).args(["apply", "-n", ns, "-f", "-"]),
            Some(&rendered),
        );
        Self {
            name: format!("{release}-sandboxd-operator"),
        }
    }
}

/// Whether the chart's policy on the operator's Secret writes is in force: a dry-run create,
/// as the operator, of a Secret that is not a session token Secret is refused.
async fn secret_policy_in_force(operator: &Client, ns: &str) -> bool {
    let probe: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "not-a-token"}, "stringData": {"k": "v"},
    }))
    .expect("secret");
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    forbidden(
        Api::<Secret>::namespaced(operator.clone(), ns)
            .create(&dry_run, &probe)
            .await,
    )
}

impl Drop for ChartRbac {
    fn drop(&mut self) {
        let _ = Command::new(sandboxd_tests::kubectl())
            .args(["delete", "--ignore-not-found", "--wait=false"])
            .arg(format!("clusterrole/{}", self.name))
            .arg(format!("clusterrolebinding/{}", self.name))
            .arg(format!("validatingadmissionpolicy/{}-secrets", self.name))
            .arg(format!(
                "validatingadmissionpolicybinding/{}-secrets",
                self.name
            ))
            .output();
    }
}

/// A copy of the test's kubeconfig whose users act as `user` (kube-rs and kubectl honour `as`).
fn impersonating(user: &str, dir: &Path) -> PathBuf {
    let raw = output(
        Command::new(sandboxd_tests::kubectl()).args(["config", "view", "--raw", "--flatten"]),
        None,
    );
    let mut config: serde_yaml::Value = serde_yaml::from_str(&raw).expect("a kubeconfig");
    for u in config["users"].as_sequence_mut().expect("users") {
        u["user"]["as"] = serde_yaml::Value::from(user);
    }
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&config).expect("YAML")).expect("write");
    path
}

async fn client_of(kubeconfig: &Path) -> Client {
    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig).expect("the impersonating kubeconfig"),
        &KubeConfigOptions::default(),
    )
    .await
    .expect("a config");
    Client::try_from(config).expect("a client")
}

fn forbidden<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> bool {
    matches!(r, Err(kube::Error::Api(e)) if e.code == 403)
}

/// Starts a host and registers it as a cluster under the chart's RBAC does: its admin token in
/// a Secret of the chart's name for `release`, in the operator's namespace (the Role lets it
/// read that one Secret there), and a default Runtime.
async fn chart_host(scope: &Scope, release: &str, name: &str) -> Host {
    let host = Host::start(&format!("{name}-{}", scope.scope), &[]);
    let admin_secret = format!("{release}-sandboxd-admin-token");
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": admin_secret, "labels": scope.labels()},
        "stringData": {"token": host.sandboxd.token},
    }))
    .expect("secret");
    Api::<Secret>::namespaced(scope.client.clone(), &scope.ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("the admin-token Secret");
    scope
        .register_endpoint_on_node(
            &host.name,
            &host.endpoint(),
            &admin_secret,
            Some(&host.node),
        )
        .await;
    scope.default_runtime().await;
    host
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_runs_sessions_with_the_charts_rbac_alone() {
    let mut scope = Scope::new("rbac").await;
    let release = format!("r{:06x}", rand::rng().random::<u32>() & 0xff_ffff);
    let rbac = ChartRbac::apply(&release, &scope.ns);
    let service_account = format!("system:serviceaccount:{}:{}", scope.ns, rbac.name);
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = impersonating(&service_account, dir.path());

    // It really is the ServiceAccount: no Secret of the cluster is listed, and none of the
    // session namespaces' Secrets is read.
    let operator_client = client_of(&kubeconfig).await;
    assert!(forbidden(
        Api::<Secret>::all(operator_client.clone())
            .list(&ListParams::default())
            .await
    ));
    assert!(forbidden(
        Api::<Secret>::namespaced(operator_client.clone(), "default")
            .list(&ListParams::default())
            .await
    ));

    // The host's admin token under the chart's name, in the operator's namespace.
    let host = chart_host(&scope, &release, "rbac-host").await;
    // Token Secrets asked after at every reconcile (by default a found one is taken as there
    // for 300 s), so the one deleted below is missed at the next.
    scope.start_operator_with(
        kubeconfig.to_str().expect("a UTF-8 path"),
        &[
            "--token-check-seconds",
            "0",
            "--egress-credentials",
            "false",
        ],
    );

    // A Secret of the token's name is there already (left by an earlier session of that name):
    // the create meets it, and it is replaced whole, without being read.
    let secrets = Api::<Secret>::namespaced(scope.client.clone(), &scope.ns);
    let left: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "xc-rbac-token", "labels": {"app.kubernetes.io/managed-by": "sandbox-operator"}},
        "type": "sandboxd.dev/session-token",
        "stringData": {"token": "a-token-of-long-ago", "left": "over"},
    }))
    .expect("secret");
    secrets
        .create(&PostParams::default(), &left)
        .await
        .expect("the Secret left over");

    // A session runs, with a token Secret whose token reaches it.
    scope.kubectl_apply_session("xc-rbac", serde_json::json!({}));
    let running = scope
        .wait_session("xc-rbac", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let status = running.status.clone().expect("status");
    let id = status.session_id.clone().expect("session id");
    let secret_name = status
        .credentials_secret
        .clone()
        .expect("credentials secret");
    assert_eq!(secret_name, "xc-rbac-token");
    let stored = secrets.get(&secret_name).await.expect("the token Secret");
    let keys: Vec<&str> = stored
        .data
        .iter()
        .flat_map(|d| d.keys())
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["endpoint", "session", "token"], "replaced whole");
    assert_eq!(
        stored
            .metadata
            .owner_references
            .as_ref()
            .map(|o| o[0].name.as_str()),
        Some("xc-rbac")
    );
    let first = token_of(&stored);
    assert_ne!(first, "a-token-of-long-ago");
    let session = sandboxd_api::client::Client::new(&host.endpoint(), &first);
    let run = session
        .run(
            &id,
            "echo kept > note.txt && cat note.txt",
            None,
            None,
            None,
        )
        .await
        .expect("a run with the Secret's token");
    assert_eq!(run.stdout, "kept\n");
    // The operator made it, yet may not read it.
    assert!(forbidden(
        Api::<Secret>::namespaced(operator_client.clone(), &scope.ns)
            .get(&secret_name)
            .await
    ));

    // A session named so that its token Secret's name is a Secret of the same type that the
    // operator did not make (a platform's copy of a token): it is not replaced (the chart's
    // policy refuses the write), and the session says why.
    // An admission policy is in force once the API server has loaded it: seconds after it is
    // applied, longer on a busy machine.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !secret_policy_in_force(&operator_client, &scope.ns).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the chart's policy on the operator's Secrets is not in force 60 s after it was applied"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let own: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "xc-taken-token"},
        "type": "sandboxd.dev/session-token",
        "stringData": {"password": "the platform's own"},
    }))
    .expect("secret");
    secrets
        .create(&PostParams::default(), &own)
        .await
        .expect("the platform's Secret");
    scope.kubectl_apply_session("xc-taken", serde_json::json!({"tenant": "org-taken"}));
    let refused = scope
        .wait_session("xc-taken", "refused its token Secret", 60, |s| {
            s.status.as_ref().is_some_and(|st| {
                st.conditions.iter().any(|c| {
                    c.type_ == "Admitted"
                        && c.status == "False"
                        && c.reason == "TokenSecretNotWritten"
                })
            })
        })
        .await;
    let message = refused.status.and_then(|s| s.message).expect("a message");
    assert!(
        message.starts_with("the token Secret xc-taken-token could not be written, so the session's token is not handed out: ")
            && message.contains(&format!(
                "Secret {}/xc-taken-token exists and is not a session token Secret of the sandbox operator: it is not replaced",
                scope.ns
            )),
        "{message}"
    );
    let untouched = secrets
        .get("xc-taken-token")
        .await
        .expect("the platform's Secret");
    assert!(untouched.metadata.labels.is_none());
    assert_eq!(
        untouched
            .data
            .as_ref()
            .and_then(|d| d.get("password"))
            .map(|b| b.0.as_slice()),
        Some(b"the platform's own".as_slice())
    );
    assert!(untouched.metadata.owner_references.is_none());

    // Deleted by someone: issued again at the session's next reconcile (here, a change to it),
    // with a new token; the old one stops working, the files stay.
    secrets
        .delete(&secret_name, &DeleteParams::default())
        .await
        .expect("delete the token Secret");
    wait_gone(secrets.clone(), &secret_name, 30).await;
    scope
        .sessions()
        .patch(
            "xc-rbac",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"metadata": {"annotations": {"example.com/touched": "1"}}}),
            ),
        )
        .await
        .expect("annotate the session");
    let old = first.clone();
    let reissued = tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(secrets.clone(), &secret_name, move |s: Option<&Secret>| {
            s.is_some_and(|s| token_of(s) != old)
        }),
    )
    .await;
    let reissued = match reissued {
        Ok(Ok(Some(s))) => s,
        _ => panic!(
            "the token Secret was not issued again within 30 s: {:?}",
            secrets.get_opt(&secret_name).await.map(|s| s.is_some())
        ),
    };
    assert_eq!(
        reissued
            .metadata
            .owner_references
            .as_ref()
            .map(|o| o[0].name.as_str()),
        Some("xc-rbac")
    );
    let again = sandboxd_api::client::Client::new(&host.endpoint(), &token_of(&reissued))
        .run(&id, "cat note.txt", None, None, None)
        .await
        .expect("a run with the new token");
    assert_eq!(again.stdout, "kept\n");
    assert!(
        session.run(&id, "true", None, None, None).await.is_err(),
        "the old token was rotated away"
    );

    // Deleted: a Tombstone, the destroy, the Tombstone gone.
    let uid = running.uid().expect("uid");
    scope
        .sessions()
        .delete("xc-rbac", &DeleteParams::default())
        .await
        .expect("delete the session");
    wait_gone(scope.sessions(), "xc-rbac", 30).await;
    wait_gone(
        Api::<Tombstone>::all(scope.client.clone()),
        &format!("sbx-{uid}"),
        30,
    )
    .await;
    assert!(
        host.container_ids(&id).is_empty(),
        "{:?}",
        host.containers()
    );
    scope.delete().await;
    drop(rbac);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_given_only_its_hash_takes_its_token_once_the_operator_writes_it() {
    let mut scope = Scope::new("nodehash").await;
    let release = format!("r{:06x}", rand::rng().random::<u32>() & 0xff_ffff);
    let rbac = ChartRbac::apply(&release, &scope.ns);
    let service_account = format!("system:serviceaccount:{}:{}", scope.ns, rbac.name);
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = impersonating(&service_account, dir.path());

    // The node's sandboxd as the chart runs it: told its node, given the folder the ConfigMap
    // is mounted at, and no token at all. It starts before its hash exists.
    let master = format!("master-{:016x}", rand::rng().random::<u64>());
    let node = format!("worker-{}", scope.scope);
    let mounted = tempfile::tempdir().expect("temp dir");
    let host = Host::start(
        &format!("hash-host-{}", scope.scope),
        &[
            ("SANDBOXD_TOKEN", ""),
            (
                "SANDBOXD_NODE_TOKEN_HASHES",
                mounted.path().to_str().expect("a UTF-8 path"),
            ),
            ("SANDBOXD_NODE_NAME", node.as_str()),
        ],
    );
    let admin_secret = format!("{release}-sandboxd-admin-token");
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": admin_secret, "labels": scope.labels()},
        "stringData": {"token": master},
    }))
    .expect("secret");
    Api::<Secret>::namespaced(scope.client.clone(), &scope.ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("the master's Secret");
    scope
        .register_endpoint_on_node(&host.name, &host.endpoint(), &admin_secret, Some(&node))
        .await;
    scope.default_runtime().await;
    let map_name = format!("{release}-sandboxd-node-token-hashes");
    scope.start_operator_with(
        kubeconfig.to_str().expect("a UTF-8 path"),
        &[
            "--egress-credentials",
            "false",
            "--host-token-secret",
            &format!("{}/{admin_secret}", scope.ns),
            "--node-token-hashes",
            &map_name,
        ],
    );

    // The operator writes the hash of the node's token under the node's name: neither the
    // token nor the master is in it.
    let data = node_token_hashes(&scope.client, &scope.ns, &map_name, &node).await;
    let token = node_token(&master, &node);
    assert_eq!(
        data,
        std::collections::BTreeMap::from([(node.clone(), hash(&token))])
    );

    // Not yet in the sandboxd's folder (the kubelet has not copied it): the token is refused.
    let hosts = Api::<SandboxHost>::all(scope.client.clone());
    let refused = wait_host_ready_condition(&hosts, &host.name, 30, |c| {
        c.status == "False" && c.reason == "TokenRefused"
    })
    .await;
    assert!(
        refused.message.contains("SANDBOXD_NODE_TOKEN_HASHES"),
        "{}",
        refused.message
    );

    // The test plays the kubelet: the ConfigMap's data, file by file, into the mounted folder.
    mount_config_map(mounted.path(), &data);
    wait_host_ready_condition(&hosts, &host.name, 30, |c| c.status == "True").await;

    // A session runs there, through the node's token.
    scope.kubectl_apply_session("xc-hash", serde_json::json!({}));
    let running = scope
        .wait_session("xc-hash", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    assert_eq!(
        running.status.and_then(|s| s.host).as_deref(),
        Some(host.name.as_str())
    );
    assert_eq!(host.containers(), vec![(scope.host_id("xc-hash"), true)]);
    // The master opens nothing on the node; its token does.
    assert!(
        sandboxd_api::Client::new(&host.endpoint(), &master)
            .list()
            .await
            .is_err()
    );
    let sessions = sandboxd_api::Client::new(&host.endpoint(), &token)
        .list()
        .await
        .expect("the node's token lists");
    assert_eq!(sessions.len(), 1);
    scope.delete().await;
    drop(rbac);
}

#[test]
fn without_its_namespace_the_operator_does_not_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_sandbox-operator"))
        .env_remove("POD_NAMESPACE")
        .args(["--http-addr", "127.0.0.1:0"])
        .output()
        .expect("the operator runs");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim_end(),
        "sandbox-operator: POD_NAMESPACE is not set: the operator reads Secrets (the SandboxHosts' admin tokens) only in its own namespace, and POD_NAMESPACE (or --namespace) names it; the chart sets it from the pod's namespace, set it yourself when you run the operator by hand"
    );
    assert!(out.stdout.is_empty(), "it serves nothing");
}

/// Makes namespace `name` go while its objects stay stored, as it happens when Kubernetes'
/// namespace controller cannot discover a kind at that moment (just after an API server
/// restart): its finalizer is taken away first, so the namespace controller has nothing to do
/// and the second delete removes it at once.
async fn lose_namespace_keeping_its_objects(client: &Client, name: &str) {
    let namespaces = Api::<Namespace>::all(client.clone());
    let mut ns = namespaces.get(name).await.expect("the namespace");
    if let Some(spec) = ns.spec.as_mut() {
        spec.finalizers = Some(vec![]);
    }
    namespaces
        .replace_subresource("finalize", name, &PostParams::default(), &ns)
        .await
        .expect("the namespace's finalizers taken away");
    for _ in 0..2 {
        match namespaces.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => panic!("cannot delete namespace {name}: {e}"),
        }
    }
    wait_gone(namespaces, name, 30).await;
}

/// A session its namespace left behind (the namespace gone, or gone and made again under the
/// same name) is deleted by the operator, under the chart's RBAC, and its sandbox destroyed
/// through its Tombstone; the new owner of the remade namespace opens an empty workspace under
/// the same session name, never the previous owner's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_their_namespace_left_behind_are_destroyed_and_a_remade_namespace_starts_empty() {
    let mut scope = Scope::new("orphan").await;
    let release = format!("r{:06x}", rand::rng().random::<u32>() & 0xff_ffff);
    let rbac = ChartRbac::apply(&release, &scope.ns);
    let service_account = format!("system:serviceaccount:{}:{}", scope.ns, rbac.name);
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = impersonating(&service_account, dir.path());
    let host = chart_host(&scope, &release, "orphan-host").await;
    let first = scope.start_operator_with(
        kubeconfig.to_str().expect("a UTF-8 path"),
        &["--egress-credentials", "false"],
    );

    // One session in each of two namespaces, running, with a file in its workspace.
    let namespaces = Api::<Namespace>::all(scope.client.clone());
    let labels = scope.labels();
    let session_doc = |ns: &str| -> SandboxSession {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession",
            "metadata": {"name": "left", "namespace": ns, "labels": labels},
            "spec": {"scope": "conversation", "tenant": "org-1", "subject": "c-1"},
        }))
        .expect("a session")
    };
    let mut left = vec![];
    for which in ["gone", "remade"] {
        let name = format!("{}-{which}", scope.ns);
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"sandboxd.dev/test": "true"}},
        }))
        .expect("a namespace");
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .expect("the namespace");
        let sessions = Api::<SandboxSession>::namespaced(scope.client.clone(), &name);
        sessions
            .create(&PostParams::default(), &session_doc(&name))
            .await
            .expect("the session");
        let running = scope
            .wait_session_in(&name, "left", "Running", 90, |s| {
                phase(s) == Some(SessionPhase::Running)
            })
            .await;
        let id = running
            .status
            .as_ref()
            .and_then(|s| s.session_id.clone())
            .expect("a session id");
        let token = Api::<Secret>::namespaced(scope.client.clone(), &name)
            .get("left-token")
            .await
            .expect("the token Secret");
        sandboxd_api::client::Client::new(&host.endpoint(), &token_of(&token))
            .run(&id, "echo mine > notes.txt", None, None, None)
            .await
            .expect("a file written");
        assert!(host.workspace(&id).join("notes.txt").exists());
        left.push((name, id, running.uid().expect("a uid")));
    }

    // With the operator down, both namespaces go without their sessions; one is made again.
    scope.kill9_operator(first);
    for (name, _, _) in &left {
        lose_namespace_keeping_its_objects(&scope.client, name).await;
        assert!(
            Api::<SandboxSession>::namespaced(scope.client.clone(), name)
                .get_opt("left")
                .await
                .expect("a read of the session")
                .is_some(),
            "the session outlived its namespace {name}"
        );
    }
    let remade = left[1].0.clone();
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": remade, "labels": {"sandboxd.dev/test": "true"}},
    }))
    .expect("a namespace");
    // Made at least a second after the session, as any namespace made again is.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("the namespace made again");

    // The operator deletes both sessions; their Tombstones destroy container and workspace.
    scope.start_operator_with(
        kubeconfig.to_str().expect("a UTF-8 path"),
        &["--egress-credentials", "false"],
    );
    for (name, id, uid) in &left {
        wait_gone(
            Api::<SandboxSession>::namespaced(scope.client.clone(), name),
            "left",
            60,
        )
        .await;
        wait_gone(
            Api::<Tombstone>::all(scope.client.clone()),
            &format!("sbx-{uid}"),
            60,
        )
        .await;
        assert!(
            !host.workspace(id).exists(),
            "the workspace of {name}/left was destroyed"
        );
    }
    assert!(host.containers().is_empty(), "{:?}", host.containers());

    // The remade namespace's owner opens the same name: a new, empty workspace.
    let sessions = Api::<SandboxSession>::namespaced(scope.client.clone(), &remade);
    sessions
        .create(&PostParams::default(), &session_doc(&remade))
        .await
        .expect("the session made again");
    let running = scope
        .wait_session_in(&remade, "left", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    assert_ne!(running.uid(), Some(left[1].2.clone()));
    let token = Api::<Secret>::namespaced(scope.client.clone(), &remade)
        .get("left-token")
        .await
        .expect("the token Secret");
    let id = running
        .status
        .as_ref()
        .and_then(|s| s.session_id.clone())
        .expect("a session id");
    let run = sandboxd_api::client::Client::new(&host.endpoint(), &token_of(&token))
        .run(&id, "ls -A", None, None, None)
        .await
        .expect("a run");
    assert_eq!(run.stdout, "", "the new workspace is empty");
    sessions
        .delete("left", &DeleteParams::default())
        .await
        .expect("delete the session");
    wait_gone(sessions, "left", 30).await;
    let _ = namespaces.delete(&remade, &DeleteParams::default()).await;
    scope.delete().await;
    drop(rbac);
}
