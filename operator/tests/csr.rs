//! A serving certificate per node through the CertificateSigningRequest API, against the real
//! API server: `sandboxd enrol` under a pod-bound ServiceAccount token asks, the operator's
//! signer decides, and a real sandboxd serves the certificate. This cluster has no kubelet:
//! the test makes the Node objects (with their addresses) and a Pending pod bound to a node,
//! whose token the API server then tags with that node's name, as a kubelet-run pod's is.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Host, Scope};
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::{Node, Pod, Secret, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Client, ResourceExt};
use rand::Rng;
use sandboxd_crds::v1alpha1::SandboxHost;
use serde_json::json;

/// Removes the cluster-scoped objects a test made, however it ends.
struct ClusterObjects {
    role: String,
    nodes: Vec<String>,
    signers: Vec<String>,
    /// The namespace of the test's pods: no kubelet runs their nodes, so nothing would ever
    /// finish their graceful deletion (nor the namespace's); they are removed at once.
    pods_in: String,
}

impl Drop for ClusterObjects {
    fn drop(&mut self) {
        let _ = Command::new(sandboxd_tests::kubectl())
            .args(["delete", "pods", "--all", "-n", &self.pods_in])
            .args(["--grace-period=0", "--force", "--wait=false"])
            .output();
        let _ = Command::new(sandboxd_tests::kubectl())
            .args([
                "delete",
                "clusterrole,clusterrolebinding",
                &self.role,
                "--ignore-not-found",
                "--wait=false",
            ])
            .output();
        for node in &self.nodes {
            let _ = Command::new(sandboxd_tests::kubectl())
                .args(["delete", "node", node, "--ignore-not-found", "--wait=false"])
                .output();
        }
        for signer in &self.signers {
            let _ = Command::new(sandboxd_tests::kubectl())
                .args([
                    "delete",
                    "csr",
                    "--field-selector",
                    &format!("spec.signerName={signer}"),
                    "--wait=false",
                ])
                .output();
        }
    }
}

/// A Node with these addresses (through the status subresource, as a kubelet writes them).
async fn node(client: &Client, name: &str, ip: &str) {
    let nodes = Api::<Node>::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).expect("node");
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("the Node is created");
    let status = json!({"status": {"addresses": [
        {"type": "InternalIP", "address": ip},
        {"type": "Hostname", "address": name},
    ]}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("the Node's addresses are written");
}

/// A kubeconfig for the API server of the tests that authenticates with a token of
/// ServiceAccount `sa` bound to a Pending pod of it on `node_name`.
async fn pod_bound_kubeconfig(
    client: &Client,
    ns: &str,
    sa: &str,
    node_name: &str,
    dir: &Path,
) -> PathBuf {
    pod_bound_kubeconfig_labelled(client, ns, sa, node_name, dir, json!({})).await
}

/// [`pod_bound_kubeconfig`], the pod carrying `labels`; in the node's network, as the chart's
/// sandboxd pods are.
async fn pod_bound_kubeconfig_labelled(
    client: &Client,
    ns: &str,
    sa: &str,
    node_name: &str,
    dir: &Path,
    labels: serde_json::Value,
) -> PathBuf {
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), ns);
    if accounts.get_opt(sa).await.expect("get sa").is_none() {
        let account: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": sa}})).expect("sa");
        accounts
            .create(&PostParams::default(), &account)
            .await
            .expect("the ServiceAccount is created");
    }
    let pod_name = format!("{sa}-on-{node_name}");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": pod_name, "labels": labels},
        "spec": {
            "nodeName": node_name,
            "hostNetwork": true,
            "serviceAccountName": sa,
            "automountServiceAccountToken": false,
            "containers": [{"name": "sandboxd", "image": "sandboxd:never-started"}],
        },
    }))
    .expect("pod");
    let pod = Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .expect("the pod is created");
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": {
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.name_any(), "uid": pod.metadata.uid},
            "expirationSeconds": 600,
        },
    }))
    .expect("token request");
    let token = accounts
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .expect("a pod-bound token")
        .status
        .and_then(|s| s.token)
        .expect("the token");
    let raw = Command::new(sandboxd_tests::kubectl())
        .args(["config", "view", "--raw", "--flatten", "--minify"])
        .output()
        .expect("kubectl config view");
    let mut config: serde_yaml::Value = serde_yaml::from_slice(&raw.stdout).expect("a kubeconfig");
    for u in config["users"].as_sequence_mut().expect("users") {
        u["user"] = serde_yaml::from_str(&format!("token: {token}")).expect("user");
    }
    let path = dir.join(format!("kubeconfig-{sa}-{node_name}"));
    std::fs::write(&path, serde_yaml::to_string(&config).expect("YAML")).expect("write");
    path
}

/// Runs `sandboxd enrol`; its exit and stderr.
fn enrol(kubeconfig: &Path, node: &str, ip: &str, dir: &Path, signer: &str) -> (bool, String) {
    let out = Command::new(common::bin("sandboxd"))
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("RUST_LOG", "warn")
        .args([
            "enrol",
            "--node",
            node,
            "--node-ip",
            ip,
            "--signer-name",
            signer,
            "--wait-seconds",
            "60",
        ])
        .arg("--dir")
        .arg(dir)
        .output()
        .expect("sandboxd enrol runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A CA (PKCS#8 key), as cert-manager's CA Secret holds one.
fn ca() -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("CA key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "sandboxd test signer");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).expect("CA");
    (cert.pem(), key.serialize_pem())
}

async fn get_csr_with_signer(client: &Client, signer: &str) -> Vec<CertificateSigningRequest> {
    Api::<CertificateSigningRequest>::all(client.clone())
        .list(&kube::api::ListParams::default().fields(&format!("spec.signerName={signer}")))
        .await
        .expect("list CSRs")
        .items
}

fn condition(csr: &CertificateSigningRequest, type_: &str) -> Option<(String, String)> {
    csr.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| {
            (
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_gets_a_certificate_for_itself_only_sandboxd_serves_it_and_the_operator_trusts_it() {
    sandboxd_api::tls::install_provider();
    let mut scope = Scope::new("csr").await;
    let client = scope.client.clone();
    let ns = scope.ns.clone();
    let suffix = format!("{:08x}", rand::rng().random::<u32>());
    let (node_a, node_b) = (format!("csr-a-{suffix}"), format!("csr-b-{suffix}"));
    let signer = format!("sandboxd.dev/test-{suffix}");
    let elsewhere = format!("example.com/elsewhere-{suffix}");
    let _cleanup = ClusterObjects {
        role: format!("csr-test-{suffix}"),
        nodes: vec![node_a.clone(), node_b.clone()],
        signers: vec![signer.clone(), elsewhere.clone()],
        pods_in: ns.clone(),
    };
    // What the chart grants sandboxd's ServiceAccount (here to both accounts of the test, so
    // the signer is what refuses the other one).
    let rbac = format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: csr-test-{suffix}}}
rules:
  - {{apiGroups: [certificates.k8s.io], resources: [certificatesigningrequests], verbs: [create, get]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: csr-test-{suffix}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: csr-test-{suffix}}}
subjects:
  - {{kind: ServiceAccount, name: sandboxd, namespace: {ns}}}
  - {{kind: ServiceAccount, name: other, namespace: {ns}}}
"
    );
    let mut apply = Command::new(sandboxd_tests::kubectl())
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl apply");
    std::io::Write::write_all(&mut apply.stdin.take().expect("stdin"), rbac.as_bytes())
        .expect("write");
    assert!(apply.wait().expect("kubectl apply").success());
    node(&client, &node_a, "127.0.0.1").await;
    node(&client, &node_b, "127.0.0.2").await;
    let (ca_pem, ca_key) = ca();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "signer-ca"},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": ca_pem, "tls.key": ca_key},
    }))
    .expect("secret");
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("the CA Secret");

    // A request of another signer, there before the operator starts: never touched.
    let (_, other_pem) = sandboxd::enrol::key_and_request(&node_a, None).expect("request");
    let other = CertificateSigningRequest {
        metadata: kube::api::ObjectMeta {
            generate_name: Some("elsewhere-".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(other_pem.into_bytes()),
            signer_name: elsewhere.clone(),
            usages: Some(
                sandboxd::enrol::USAGES
                    .iter()
                    .map(|u| (*u).to_owned())
                    .collect(),
            ),
            ..Default::default()
        },
        status: None,
    };
    let other = Api::<CertificateSigningRequest>::all(client.clone())
        .create(&PostParams::default(), &other)
        .await
        .expect("a request of another signer");

    let requester = format!("system:serviceaccount:{ns}:sandboxd");
    scope.start_operator(&[
        "--csr-ca-secret",
        "signer-ca",
        "--csr-signer-name",
        &signer,
        "--csr-requester",
        &requester,
    ]);
    let dir = tempfile::tempdir().expect("temp dir");
    // The pod is also what discovery finds (below): labelled as the chart's sandboxd pods are,
    // and a pod of their DaemonSet (which runs on node A and adopts it).
    let app = format!("sandboxd-{suffix}");
    let as_a = pod_bound_kubeconfig_labelled(
        &client,
        &ns,
        "sandboxd",
        &node_a,
        dir.path(),
        json!({"app": app, "ds": "sandboxd"}),
    )
    .await;
    Api::<Node>::all(client.clone())
        .patch(
            &node_a,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {common::TEST_NODE_LABEL: suffix}}})),
        )
        .await
        .expect("node A labelled for the DaemonSet");
    let ds_uid = common::daemonset(&client, &ns, "sandboxd", &suffix).await;
    common::adopted(&client, &ns, &format!("sandboxd-on-{node_a}"), &ds_uid).await;
    // Its status as node A's kubelet writes it: the node's address in status.hostIP.
    Api::<Pod>::namespaced(client.clone(), &ns)
        .patch_status(
            &format!("sandboxd-on-{node_a}"),
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"status": {"hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}]}}),
            ),
        )
        .await
        .expect("the pod's hostIP (as a kubelet would write it)");

    // Node A's pod asks for node A's name and IP: signed.
    let tls = dir.path().join("tls");
    let (ok, stderr) = enrol(&as_a, &node_a, "127.0.0.1", &tls, &signer);
    assert!(ok, "enrol failed: {stderr}");
    let granted = get_csr_with_signer(&client, &signer).await;
    assert_eq!(granted.len(), 1, "{granted:?}");
    let (reason, message) = condition(&granted[0], "Approved").expect("approved");
    assert_eq!(reason, "SandboxdNodeCertificate");
    assert_eq!(
        message,
        format!("the certificate of node {node_a} for its sandboxd, asked by its pod")
    );
    let key_mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(tls.join("tls.key"))
            .expect("tls.key")
            .permissions(),
    );
    assert_eq!(key_mode & 0o777, 0o600);
    let ca_written = std::fs::read_to_string(tls.join("ca.crt")).expect("ca.crt");
    assert_eq!(ca_written, ca_pem);

    // sandboxd serves it; a client trusting only the CA connects by node A's IP and name, and
    // by no other name.
    let host = Host::start(
        "csr",
        &[
            ("SANDBOXD_NODE_NAME", node_a.as_str()),
            (
                "SANDBOXD_TLS_CERT_FILE",
                tls.join("tls.crt").to_str().expect("path"),
            ),
            (
                "SANDBOXD_TLS_KEY_FILE",
                tls.join("tls.key").to_str().expect("path"),
            ),
        ],
    );
    let https = |name: &str| {
        reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(ca_pem.as_bytes()).expect("CA")])
            .resolve(name, ([127, 0, 0, 1], host.sandboxd.port).into())
            .timeout(Duration::from_secs(10))
            .build()
            .expect("client")
    };
    for name in ["127.0.0.1", node_a.as_str()] {
        let url = format!("https://{name}:{}/healthz", host.sandboxd.port);
        let resp = https(name).get(&url).send().await;
        assert!(
            resp.as_ref().is_ok_and(|r| r.status().is_success()),
            "{url}: {resp:?}"
        );
    }
    let wrong = https("localhost")
        .get(format!("https://localhost:{}/healthz", host.sandboxd.port))
        .send()
        .await;
    assert!(
        wrong.is_err(),
        "a name not in the certificate was accepted: {wrong:?}"
    );

    // Node A's kubelet, compromised, lists node B's IP among node A's addresses; node A's pod
    // then asks for node B's IP, and for node B's name: denied, saying why.
    let claimed = json!({"status": {"addresses": [
        {"type": "InternalIP", "address": "127.0.0.1"},
        {"type": "InternalIP", "address": "127.0.0.2"},
        {"type": "Hostname", "address": node_a},
    ]}});
    Api::<Node>::all(client.clone())
        .patch_status(&node_a, &PatchParams::default(), &Patch::Merge(&claimed))
        .await
        .expect("node A's addresses, rewritten");
    let refused = dir.path().join("refused");
    let (ok, stderr) = enrol(&as_a, &node_a, "127.0.0.2", &refused, &signer);
    assert!(!ok);
    assert!(
        stderr.contains(&format!("was denied by the signer: NotThisNodesCertificate: the IP 127.0.0.2 is not the address of node {node_a} that the requesting pod {ns}/sandboxd-on-{node_a} shows in status.hostIP (127.0.0.1)")),
        "{stderr}"
    );
    let (ok, stderr) = enrol(&as_a, &node_b, "127.0.0.2", &refused, &signer);
    assert!(!ok);
    assert!(
        stderr.contains(&format!("was denied by the signer: NotThisNodesCertificate: the DNS name {node_b} is not the name of the requesting pod's node {node_a}")),
        "{stderr}"
    );
    assert!(
        !refused.join("tls.key").exists(),
        "nothing is written for a denied request"
    );

    // Another ServiceAccount's pod on node A, for node A: denied.
    let as_other = pod_bound_kubeconfig(&client, &ns, "other", &node_a, dir.path()).await;
    let (ok, stderr) = enrol(&as_other, &node_a, "127.0.0.1", &refused, &signer);
    assert!(!ok);
    assert!(
        stderr.contains(&format!("was denied by the signer: NotThisNodesCertificate: the requester \"system:serviceaccount:{ns}:other\" is not the sandboxd ServiceAccount \"{requester}\"")),
        "{stderr}"
    );
    let all = get_csr_with_signer(&client, &signer).await;
    let denied = all
        .iter()
        .filter(|c| condition(c, "Denied").is_some())
        .count();
    assert_eq!((all.len(), denied), (4, 3));

    // The other signer's request: no condition, no certificate, long after the operator
    // handled the later ones.
    let other = Api::<CertificateSigningRequest>::all(client.clone())
        .get(&other.name_any())
        .await
        .expect("the other request");
    assert!(
        other
            .status
            .as_ref()
            .is_none_or(|s| s.conditions.is_none() && s.certificate.is_none()),
        "{:?}",
        other.status
    );
    // Discovery: the operator keeps a host for node A's sandboxd pod, https:// at its IP, with
    // the signer's CA as the host's CA; it verifies the certificate with it and is Ready.
    let master = host.sandboxd.token.clone();
    let admin: Secret = serde_json::from_value(json!({
        "metadata": {"name": "admin"},
        "stringData": {"token": master},
    }))
    .expect("secret");
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &admin)
        .await
        .expect("the admin token");
    let pod_status = json!({"status": {"podIP": "127.0.0.1", "hostIP": "127.0.0.1"}});
    Api::<Pod>::namespaced(client.clone(), &ns)
        .patch_status(
            &format!("sandboxd-on-{node_a}"),
            &PatchParams::default(),
            &Patch::Merge(&pod_status),
        )
        .await
        .expect("the pod's IP (as a kubelet would write it)");
    scope.kill9_operator(0);
    scope.start_operator(&[
        "--csr-ca-secret",
        "signer-ca",
        "--csr-signer-name",
        &signer,
        "--csr-requester",
        &requester,
        "--host-pod-selector",
        &format!("app={app}"),
        "--host-pod-namespace",
        &ns,
        "--host-daemonset",
        "sandboxd",
        "--host-port",
        &host.sandboxd.port.to_string(),
        "--host-token-secret",
        &format!("{ns}/admin"),
    ]);
    let host_name = format!("node-{node_a}");
    let hosts = Api::<SandboxHost>::all(client.clone());
    let ready = |h: &SandboxHost| {
        h.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True")
    };
    let found = tokio::time::timeout(
        Duration::from_secs(60),
        await_condition(hosts.clone(), &host_name, move |h: Option<&SandboxHost>| {
            h.is_some_and(ready)
        }),
    )
    .await;
    let discovered = hosts.get_opt(&host_name).await.expect("get host");
    assert!(
        matches!(found, Ok(Ok(Some(_)))),
        "host {host_name} is not Ready: {:?}",
        discovered.as_ref().map(|h| (&h.spec, &h.status))
    );
    let discovered = discovered.expect("the discovered host");
    assert_eq!(
        discovered.spec.endpoint,
        format!("https://127.0.0.1:{}", host.sandboxd.port)
    );
    let ca_ref = discovered.spec.ca_secret.expect("spec.caSecret");
    assert_eq!(
        (
            ca_ref.namespace.as_str(),
            ca_ref.name.as_str(),
            ca_ref.key.as_str()
        ),
        (ns.as_str(), "signer-ca", "tls.crt")
    );

    drop(host);
    drop(_cleanup);
    scope.delete().await;
}

/// The Secret `name` once it exists (watching, with a deadline).
async fn secret_made(client: &Client, ns: &str, name: &str, secs: u64) -> Secret {
    let secrets = Api::<Secret>::namespaced(client.clone(), ns);
    let found = tokio::time::timeout(
        Duration::from_secs(secs),
        await_condition(secrets.clone(), name, |s: Option<&Secret>| s.is_some()),
    )
    .await;
    match found {
        Ok(Ok(Some(secret))) => secret,
        other => panic!("Secret {ns}/{name} was not made within {secs} s: {other:?}"),
    }
}

fn field(secret: &Secret, key: &str) -> String {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .unwrap_or_else(|| panic!("Secret {} has no {key}", secret.name_any()));
    String::from_utf8(bytes).expect("utf-8")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operator_makes_its_ca_once_keeps_it_across_restarts_and_a_session_opens_over_tls() {
    sandboxd_api::tls::install_provider();
    let mut scope = Scope::new("csrca").await;
    let client = scope.client.clone();
    let ns = scope.ns.clone();
    let suffix = format!("{:08x}", rand::rng().random::<u32>());
    let node_name = format!("csrca-{suffix}");
    let signer = format!("sandboxd.dev/test-{suffix}");
    let _cleanup = ClusterObjects {
        role: format!("csrca-test-{suffix}"),
        nodes: vec![node_name.clone()],
        signers: vec![signer.clone()],
        pods_in: ns.clone(),
    };
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);

    // Makers racing for one Secret: the API server lets one create it, the others find it;
    // all go on with the same CA, a usable one with a PKCS#8 key.
    let raced = futures::future::join_all(
        (0..4).map(|_| sandboxd_operator::signer::ensure_ca(&client, &ns, "raced-ca")),
    )
    .await;
    let raced: Vec<_> = raced
        .into_iter()
        .map(|r| r.expect("the CA Secret is made or found"))
        .collect();
    let created = raced
        .iter()
        .filter(|(_, how)| *how == sandboxd_operator::signer::CaSecret::Created)
        .count();
    assert_eq!(created, 1, "exactly one maker creates the Secret");
    let certs: std::collections::BTreeSet<String> =
        raced.iter().map(|(s, _)| field(s, "tls.crt")).collect();
    assert_eq!(certs.len(), 1, "the makers got different CAs: {certs:?}");
    // A Secret that is there is never changed, whatever it holds.
    let foreign: Secret = serde_json::from_value(json!({
        "metadata": {"name": "someone-elses-ca"},
        "stringData": {"tls.crt": "not ours", "tls.key": "not ours"},
    }))
    .expect("secret");
    secrets
        .create(&PostParams::default(), &foreign)
        .await
        .expect("a Secret of someone else");
    let (kept, how) = sandboxd_operator::signer::ensure_ca(&client, &ns, "someone-elses-ca")
        .await
        .expect("found");
    assert_eq!(how, sandboxd_operator::signer::CaSecret::Found);
    assert_eq!(field(&kept, "tls.crt"), "not ours");

    // What the chart grants sandboxd's ServiceAccount.
    let rbac = format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: csrca-test-{suffix}}}
rules:
  - {{apiGroups: [certificates.k8s.io], resources: [certificatesigningrequests], verbs: [create, get]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: csrca-test-{suffix}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: csrca-test-{suffix}}}
subjects:
  - {{kind: ServiceAccount, name: sandboxd, namespace: {ns}}}
"
    );
    let mut apply = Command::new(sandboxd_tests::kubectl())
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl apply");
    std::io::Write::write_all(&mut apply.stdin.take().expect("stdin"), rbac.as_bytes())
        .expect("write");
    assert!(apply.wait().expect("kubectl apply").success());
    node(&client, &node_name, "127.0.0.1").await;

    // The operator as the chart runs it by default: no CA given, `--csr-ca-generate`.
    let requester = format!("system:serviceaccount:{ns}:sandboxd");
    let app = format!("sandboxd-{suffix}");
    let port = sandboxd_tests::host::free_port();
    let operator_args = [
        "--csr-ca-secret",
        "node-ca",
        "--csr-ca-generate",
        "--csr-signer-name",
        &signer,
        "--csr-requester",
        &requester,
        "--host-pod-selector",
        &format!("app={app}"),
        "--host-pod-namespace",
        &ns,
        "--host-daemonset",
        "sandboxd",
        "--host-port",
        &port.to_string(),
        "--host-token-secret",
        &format!("{ns}/admin"),
    ];
    scope.default_runtime().await;
    scope.start_operator(&operator_args);
    let made = secret_made(&client, &ns, "node-ca", 60).await;
    assert_eq!(made.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(
        made.labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("sandbox-operator")
    );
    let ca_pem = field(&made, "tls.crt");
    // What the signer reads: a PKCS#8 key and the certificate as an issuer (that it is a CA
    // shows below, where a client that trusts only it verifies sandboxd's certificate).
    let key = rcgen::KeyPair::from_pem(&field(&made, "tls.key")).expect("a PKCS#8 key");
    rcgen::Issuer::from_ca_cert_pem(&ca_pem, key).expect("a CA certificate the signer uses");

    // The node's sandboxd pod (of the DaemonSet, in the node's network) gets its certificate.
    let dir = tempfile::tempdir().expect("temp dir");
    let as_pod = pod_bound_kubeconfig_labelled(
        &client,
        &ns,
        "sandboxd",
        &node_name,
        dir.path(),
        json!({"app": app, "ds": "sandboxd"}),
    )
    .await;
    Api::<Node>::all(client.clone())
        .patch(
            &node_name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {common::TEST_NODE_LABEL: suffix}}})),
        )
        .await
        .expect("the node labelled for the DaemonSet");
    let ds_uid = common::daemonset(&client, &ns, "sandboxd", &suffix).await;
    let pod_name = format!("sandboxd-on-{node_name}");
    common::adopted(&client, &ns, &pod_name, &ds_uid).await;
    Api::<Pod>::namespaced(client.clone(), &ns)
        .patch_status(
            &pod_name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"podIP": "127.0.0.1", "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}]}})),
        )
        .await
        .expect("the pod's addresses (as a kubelet would write them)");
    let tls = dir.path().join("tls");
    let (ok, stderr) = enrol(&as_pod, &node_name, "127.0.0.1", &tls, &signer);
    assert!(ok, "enrol failed: {stderr}");
    assert_eq!(
        std::fs::read_to_string(tls.join("ca.crt")).expect("ca.crt"),
        ca_pem
    );

    // The operator restarts (another replica takes over): the CA is the same Secret, untouched,
    // and what it signs now chains to it.
    scope.kill9_operator(0);
    scope.start_operator(&operator_args);
    let again = dir.path().join("again");
    let (ok, stderr) = enrol(&as_pod, &node_name, "127.0.0.1", &again, &signer);
    assert!(ok, "enrol after the restart failed: {stderr}");
    assert_eq!(
        std::fs::read_to_string(again.join("ca.crt")).expect("ca.crt"),
        ca_pem
    );
    let now = secrets.get("node-ca").await.expect("the CA Secret");
    assert_eq!(
        now.metadata.resource_version, made.metadata.resource_version,
        "the CA Secret was changed"
    );

    // sandboxd serves the node's certificate on the discovered host's port; the operator
    // reaches it over https trusting the CA it made, and a session opens through it.
    let mut host = Host::new("csrca", &sandboxd_tests::base_image()).expect("a sandboxd host");
    host.node = node_name.clone();
    host.sandboxd.port = port;
    host.sandboxd.with_env(&[
        ("SANDBOXD_NODE_NAME", node_name.as_str()),
        (
            "SANDBOXD_TLS_CERT_FILE",
            tls.join("tls.crt").to_str().expect("path"),
        ),
        (
            "SANDBOXD_TLS_KEY_FILE",
            tls.join("tls.key").to_str().expect("path"),
        ),
    ]);
    host.spawn();
    let admin: Secret = serde_json::from_value(json!({
        "metadata": {"name": "admin"},
        "stringData": {"token": host.sandboxd.token},
    }))
    .expect("secret");
    secrets
        .create(&PostParams::default(), &admin)
        .await
        .expect("the admin token");
    let host_name = format!("node-{node_name}");
    let hosts = Api::<SandboxHost>::all(client.clone());
    let ready = |h: &SandboxHost| {
        h.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True")
    };
    let found = tokio::time::timeout(
        Duration::from_secs(120),
        await_condition(hosts.clone(), &host_name, move |h: Option<&SandboxHost>| {
            h.is_some_and(ready)
        }),
    )
    .await;
    let discovered = hosts.get_opt(&host_name).await.expect("get host");
    assert!(
        matches!(found, Ok(Ok(Some(_)))),
        "host {host_name} is not Ready: {:?}",
        discovered.as_ref().map(|h| (&h.spec, &h.status))
    );
    let discovered = discovered.expect("the discovered host");
    assert_eq!(
        discovered.spec.endpoint,
        format!("https://127.0.0.1:{port}")
    );
    assert_eq!(
        discovered.spec.ca_secret.map(|r| (r.name, r.key)),
        Some(("node-ca".to_owned(), "tls.crt".to_owned()))
    );

    scope.kubectl_apply_session("over-tls", json!({}));
    let running = scope
        .wait_session("over-tls", "Running", 120, |s| {
            common::phase(s) == Some(sandboxd_crds::v1alpha1::session::SessionPhase::Running)
        })
        .await;
    let status = running.status.clone().expect("status");
    assert_eq!(status.host.as_deref(), Some(host_name.as_str()));
    let token_secret = secrets
        .get(
            status
                .credentials_secret
                .as_deref()
                .expect("a credentials Secret"),
        )
        .await
        .expect("the token Secret");
    assert_eq!(field(&token_secret, "ca.crt"), ca_pem);
    let trust =
        sandboxd_api::client::Trust::ca(Some(field(&token_secret, "ca.crt").as_bytes()), "ca.crt")
            .expect("the Secret's CA is usable");
    let platform = sandboxd_api::client::Client::with_trust(
        &field(&token_secret, "endpoint"),
        &common::token_of(&token_secret),
        &trust,
    );
    let ran = platform
        .run(
            status.session_id.as_deref().expect("a session id"),
            "echo over-the-operators-ca",
            None,
            None,
            None,
        )
        .await
        .expect("a command runs over https with the Secret's token and CA");
    assert_eq!(ran.stdout.trim(), "over-the-operators-ca");

    drop(host);
    drop(_cleanup);
    scope.delete().await;
}
