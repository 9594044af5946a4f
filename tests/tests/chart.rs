//! The Helm chart against the real API server: it lints, its versions move with the workspace,
//! its rendering is accepted by a server-side dry run, `helm install` creates what it should,
//! `helm upgrade` keeps the admin token, `helm uninstall` leaves the CRDs, a namespace bound to
//! a tenant creates sessions of that tenant only, and a render without the cluster refuses to
//! make up an admin token.
//!
//! Over 600 lines: one test a scenario of the installed chart, sharing this file's fixtures.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use rand::Rng;
use sandboxd_crds::v1alpha1::{Runtime, SandboxSession};
use sandboxd_tests::{
    DEADLINE, TestNamespace, client, helm, install_crds, ok, repo_root, run, until,
};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn chart() -> PathBuf {
    repo_root().join("charts/sandboxd")
}

/// The admin token of the offline renders: without the cluster, the chart renders only with a
/// token given (see `a_render_without_the_cluster_refuses_to_make_up_an_admin_token`).
const RENDER_TOKEN: &str = "render-only-admin-token-0123456789abcdef";

/// `helm template` (no cluster access) with an admin token given; `args` come after it.
fn template(args: &[&str]) -> String {
    ok(Command::new(helm())
        .arg("template")
        .arg("rel")
        .arg(chart())
        .args(["--kube-version", "1.37.2", "--set"])
        .arg(format!("adminToken.value={RENDER_TOKEN}"))
        .args(args))
}

/// The documents of a rendering.
fn documents(rendered: &str) -> Vec<serde_yaml::Value> {
    serde_yaml::Deserializer::from_str(rendered)
        .map(|d| serde::Deserialize::deserialize(d).expect("YAML"))
        .filter(|d: &serde_yaml::Value| !d.is_null())
        .collect()
}

/// The one document of `kind` in a rendering.
fn of_kind<'a>(docs: &'a [serde_yaml::Value], kind: &str) -> &'a serde_yaml::Value {
    let mut found = docs.iter().filter(|d| d["kind"] == kind);
    let doc = found.next().unwrap_or_else(|| panic!("no {kind} rendered"));
    assert!(found.next().is_none(), "more than one {kind} rendered");
    doc
}

#[test]
fn helm_lint_passes() {
    let out = ok(Command::new(helm()).arg("lint").arg(chart()));
    assert!(
        out.contains("1 chart(s) linted, 0 chart(s) failed"),
        "{out}"
    );
}

#[test]
fn chart_versions_and_image_tags_move_with_the_workspace() {
    let path = chart().join("Chart.yaml");
    let text = std::fs::read_to_string(&path).expect("Chart.yaml");
    let chart: serde_yaml::Value = serde_yaml::from_str(&text).expect("Chart.yaml is YAML");
    for key in ["version", "appVersion"] {
        assert_eq!(
            chart[key].as_str(),
            Some(VERSION),
            "charts/sandboxd/Chart.yaml: {key} must be the workspace version {VERSION} (Cargo.toml [workspace.package] version); change them together"
        );
    }
    let rendered = template(&[]);
    let images: Vec<&str> = rendered
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
        .collect();
    assert!(images.len() >= 3, "{images:?}");
    for image in images {
        assert!(
            image.ends_with(&format!(":{VERSION}")),
            "charts/sandboxd/values.yaml: image {image} is not tagged with the workspace version {VERSION}; leave the tags empty (they default to appVersion)"
        );
    }
}

#[test]
fn a_wrong_value_fails_with_a_message_naming_it() {
    let out = run(Command::new(helm())
        .arg("template")
        .arg("rel")
        .arg(chart())
        .args([
            "--kube-version",
            "1.37.2",
            "--set",
            "sandboxd.memLimit=lots",
        ]));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("at '/sandboxd/memLimit': 'lots' does not match pattern"),
        "{err}"
    );
    let out = run(Command::new(helm())
        .arg("template")
        .arg("rel")
        .arg(chart())
        .args([
            "--kube-version",
            "1.37.2",
            "--set",
            "adminToken.value=short",
        ]));
    assert!(!out.status.success(), "a short token must be refused");
    let out = run(Command::new(helm())
        .arg("template")
        .arg("rel")
        .arg(chart())
        .args([
            "--kube-version",
            "1.37.2",
            "--set",
            "tenantBinding.mode=strict",
        ]));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("at '/tenantBinding/mode': value must be one of 'labelled', 'required'"),
        "{err}"
    );
}

/// `kubectl args…` with `input` on its stdin, whatever its outcome.
fn kubectl_with_stdin(args: &[&str], input: &str) -> Output {
    let mut child = Command::new(sandboxd_tests::kubectl())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    std::io::Write::write_all(child.stdin.as_mut().expect("stdin"), input.as_bytes())
        .expect("write");
    drop(child.stdin.take());
    child.wait_with_output().expect("kubectl")
}

fn kubectl_stdin(args: &[&str], input: &str) -> String {
    let out = kubectl_with_stdin(args, input);
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn helm_template_is_accepted_by_the_api_server() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "chart-dry").await;
    for extra in [
        vec![],
        vec![
            "--set",
            "networkPolicy.platformNamespaces={platform,agents}",
            "--set",
            "operator.workspaceTtlSeconds=604800",
            "--set",
            "sandboxd.auditDatabaseSecret=audit-db",
            "--set",
            "tenantBinding.mode=required",
            "--set",
            "tenantBinding.namespaceSelector.matchLabels.team=agents",
            "--set",
            "sandboxd.workspaceQuota=off",
        ],
        vec!["--set", "tls.enabled=false"],
        vec!["--set", "tls.existingSecret=sandboxd-tls"],
        vec!["--set", "tls.issuer.caSecret=node-ca"],
    ] {
        let mut args = vec!["-n", ns.name.as_str()];
        args.extend(extra);
        let rendered = template(&args);
        // Server-side apply: one request per object, so the catalog's cluster-wide Runtimes,
        // which the install test creates and removes meanwhile, may come and go.
        let out = kubectl_stdin(
            &[
                "apply",
                "--dry-run=server",
                "--server-side",
                "--force-conflicts",
                "--field-manager",
                sandboxd_tests::FIELD_MANAGER,
                "-n",
                &ns.name,
                "-f",
                "-",
            ],
            &rendered,
        );
        for kind in [
            "deployment.apps/rel-sandboxd-operator",
            "daemonset.apps/rel-sandboxd-sandboxd",
            "networkpolicy.networking.k8s.io/rel-sandboxd-sandboxd",
            "job.batch/rel-sandboxd-prepare",
            "clusterrole.rbac.authorization.k8s.io/rel-sandboxd-operator",
            "validatingadmissionpolicy.admissionregistration.k8s.io/rel-sandboxd-tenant-binding",
            "validatingadmissionpolicybinding.admissionregistration.k8s.io/rel-sandboxd-tenant-binding",
        ] {
            let line = format!("{kind} serverside-applied (server dry run)");
            assert!(out.contains(&line), "{line} missing in:\n{out}");
        }
    }
    ns.delete().await;
}

fn token(secret: &Secret) -> String {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get("token"))
        .map(|b| b.0.clone())
        .expect("a token");
    String::from_utf8(bytes).expect("utf-8")
}

#[tokio::test]
async fn helm_install_upgrade_and_uninstall_against_the_api_server() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "chart").await;
    let release = format!("sbx{:06x}", rand::rng().random::<u32>() & 0xff_ffff);
    let full = format!("{release}-sandboxd");
    let helm_in_ns = |verb: &str| {
        let mut c = Command::new(helm());
        c.arg(verb).args(["-n", &ns.name]);
        c
    };
    // The catalog's Runtimes are cluster-wide; another install may have left them.
    let out = ok(helm_in_ns("install")
        .arg(&release)
        .arg(chart())
        .arg("--take-ownership"));
    assert!(out.contains("STATUS: deployed"), "{out}");
    // TLS is on without anything given: the install notes say so, naming the CA Secret the
    // operator makes.
    assert!(
        out.contains(&format!(
            "sandboxd serves HTTPS on port 8080 of every node it runs on.\nEach node's certificate is signed by the operator's CA, the Secret {full}-node-ca in\n{} (made by the operator at its first start, kept on upgrade and uninstall).",
            ns.name
        )),
        "{out}"
    );
    assert!(!out.contains("WARNING"), "{out}");
    // Plain HTTP only when asked for, and then the notes warn (a dry run; the catalog's
    // cluster-wide Runtimes belong to the release above).
    let plain = ok(helm_in_ns("install")
        .arg(format!("{release}p"))
        .arg(chart())
        .args(["--dry-run=server", "--set", "tls.enabled=false"])
        .args(["--set", "runtimes.install=false"]));
    assert!(
        plain.contains("WARNING: TLS IS OFF (tls.enabled=false). sandboxd serves plain HTTP: the admin token, the\nsession tokens and every file and command cross the network unencrypted."),
        "{plain}"
    );

    let deploy = Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .get(&format!("{full}-operator"))
        .await
        .expect("the operator Deployment");
    let spec = deploy.spec;
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.expect("pod spec");
    assert_eq!(
        pod.containers[0].image.as_deref(),
        Some(format!("sandbox-operator:{VERSION}").as_str())
    );
    let env: Vec<(String, String)> = pod.containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    assert!(
        env.contains(&(
            "SANDBOX_OPERATOR_HOST_TOKEN_SECRET".into(),
            format!("{}/{full}-admin-token", ns.name)
        )),
        "{env:?}"
    );
    assert!(
        env.contains(&("SANDBOX_OPERATOR_LEASE_NAMESPACE".into(), ns.name.clone())),
        "{env:?}"
    );
    // Its own namespace, the only one it reads Secrets in, from the downward API.
    let pod_namespace = pod.containers[0]
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "POD_NAMESPACE")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.clone());
    assert_eq!(pod_namespace.as_deref(), Some("metadata.namespace"));

    let ds = Api::<DaemonSet>::namespaced(client.clone(), &ns.name)
        .get(&format!("{full}-sandboxd"))
        .await
        .expect("the sandboxd DaemonSet");
    let pod = ds.spec.template.spec.expect("pod spec");
    let c = &pod.containers[0];
    assert_eq!(
        c.image.as_deref(),
        Some(format!("sandboxd:{VERSION}").as_str())
    );
    // The workspace root is mounted at the same path as on the host; the Docker socket too.
    let volumes = pod.volumes.unwrap_or_default();
    let host_path = |name: &str| {
        volumes
            .iter()
            .find(|v| v.name == name)
            .and_then(|v| v.host_path.as_ref())
            .map(|h| h.path.clone())
    };
    let mount = |name: &str| {
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == name)
            .map(|m| m.mount_path.clone())
    };
    assert_eq!(
        host_path("workspaces").as_deref(),
        Some("/var/lib/sandboxd/workspaces")
    );
    assert_eq!(mount("workspaces"), host_path("workspaces"));
    // The Docker socket's folder, read-only, not the socket file: a dockerd restart makes a new
    // socket there, which a mount of the old file would never show.
    assert_eq!(host_path("docker-socket").as_deref(), Some("/var/run"));
    assert_eq!(
        volumes
            .iter()
            .find(|v| v.name == "docker-socket")
            .and_then(|v| v.host_path.as_ref())
            .and_then(|h| h.type_.as_deref()),
        Some("Directory")
    );
    assert_eq!(
        mount("docker-socket").as_deref(),
        Some("/var/run/sandboxd-docker")
    );
    assert_eq!(
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "docker-socket")
            .and_then(|m| m.read_only),
        Some(true)
    );
    let env = |name: &str| c.env.iter().flatten().find(|e| e.name == name).cloned();
    assert_eq!(
        env("DOCKER_HOST").and_then(|e| e.value).as_deref(),
        Some("unix:///var/run/sandboxd-docker/docker.sock")
    );
    // It listens on the node's address (the one the operator dials), not on every interface.
    assert_eq!(
        env("SANDBOXD_HOST")
            .and_then(|e| e.value_from)
            .and_then(|v| v.field_ref)
            .map(|f| f.field_path),
        Some("status.hostIP".to_owned())
    );
    // Workspace disks (workspaceQuota: loop, the default) are loop mounts: privileged, the
    // node's /dev, and the workspace root shared back to the host where dockerd sees it.
    assert_eq!(
        c.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
    assert_eq!(host_path("dev").as_deref(), Some("/dev"));
    assert_eq!(
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "workspaces")
            .and_then(|m| m.mount_propagation.as_deref()),
        Some("Bidirectional")
    );
    assert_eq!(pod.automount_service_account_token, Some(false));
    // Each sandboxd is told its node, so it takes only that node's own admin token.
    assert_eq!(
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == "SANDBOXD_NODE_NAME")
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("spec.nodeName")
    );
    // In the node's network namespace, with what the sandbox network's iptables rules need
    // (NET_ADMIN, NET_RAW, the node's xtables lock) and no other capability added.
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
    // Privileged (loop disks): no capability list of its own; the unprivileged variant
    // (workspaceQuota: off) is checked in `without_workspace_disks_sandboxd_is_not_privileged`.
    assert!(
        c.security_context
            .as_ref()
            .and_then(|s| s.capabilities.as_ref())
            .is_none(),
        "a privileged sandboxd needs no capability list"
    );
    assert_eq!(
        host_path("xtables-lock").as_deref(),
        Some("/run/xtables.lock")
    );
    assert_eq!(mount("xtables-lock"), host_path("xtables-lock"));

    let secrets = Api::<Secret>::namespaced(client.clone(), &ns.name);
    let secret_name = format!("{full}-admin-token");
    let first = token(&secrets.get(&secret_name).await.expect("the admin token"));
    assert_eq!(first.len(), 48);
    Api::<NetworkPolicy>::namespaced(client.clone(), &ns.name)
        .get(&format!("{full}-sandboxd"))
        .await
        .expect("the NetworkPolicy");
    let role = Api::<ClusterRole>::all(client.clone())
        .get(&format!("{full}-operator"))
        .await
        .expect("the operator's ClusterRole");
    assert!(
        role.rules
            .iter()
            .flatten()
            .all(|r| !r.verbs.iter().any(|v| v == "*")),
        "no wildcard verbs"
    );
    let workbench = Api::<Runtime>::all(client.clone())
        .get("workbench")
        .await
        .expect("the catalog's Runtime");
    assert!(workbench.spec.default, "workbench is the default Runtime");

    // Upgrade (the prepare hook needs a kubelet to run, so hooks are tested by rendering):
    // the token stays.
    ok(helm_in_ns("upgrade").arg(&release).arg(chart()).args([
        "--no-hooks",
        "--set",
        "operator.replicas=3",
    ]));
    let again = token(&secrets.get(&secret_name).await.expect("the admin token"));
    assert_eq!(again, first, "helm upgrade must keep the admin token");
    let deploy = Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .get(&format!("{full}-operator"))
        .await
        .expect("the operator Deployment");
    assert_eq!(deploy.spec.replicas, Some(3));
    // A supplied token is used as given.
    let supplied = "supplied-admin-token-0123456789abcdef0123";
    ok(helm_in_ns("upgrade")
        .arg(&release)
        .arg(chart())
        .args(["--no-hooks", "--reuse-values", "--set"])
        .arg(format!("adminToken.value={supplied}")));
    let given = token(&secrets.get(&secret_name).await.expect("the admin token"));
    assert_eq!(given, supplied);

    // Uninstall: the CRDs stay (Helm never deletes crds/), and so does the admin token.
    ok(helm_in_ns("uninstall").arg(&release));
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    for name in [
        "sandboxsessions.sandboxd.dev",
        "runtimes.sandboxd.dev",
        "sandboxhosts.sandboxd.dev",
        "tombstones.sandboxd.dev",
        "sandboxsnapshots.sandboxd.dev",
    ] {
        crds.get(name)
            .await
            .unwrap_or_else(|e| panic!("CRD {name} was removed by helm uninstall: {e}"));
    }
    assert!(
        secrets.get_opt(&secret_name).await.expect("get").is_some(),
        "the admin token Secret is kept (helm.sh/resource-policy: keep)"
    );
    assert!(
        Api::<Deployment>::namespaced(client.clone(), &ns.name)
            .get_opt(&format!("{full}-operator"))
            .await
            .expect("get")
            .is_none()
    );
    ns.delete().await;
}

#[test]
fn the_prepare_hook_runs_sandboxd_prepare_with_the_new_image_before_an_upgrade() {
    let docs = documents(&template(&["--show-only", "templates/prepare-hook.yaml"]));
    let job = of_kind(&docs, "Job");
    assert_eq!(
        job["metadata"]["annotations"]["helm.sh/hook"].as_str(),
        Some("pre-upgrade")
    );
    let c = &job["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["args"][0].as_str(), Some("prepare"));
    assert_eq!(
        c["image"].as_str(),
        Some(format!("sandboxd:{VERSION}").as_str())
    );
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .expect("the new catalog");
    let catalog =
        std::fs::read_to_string(repo_root().join("catalog/runtimes.json")).expect("the catalog");
    assert_eq!(cm["data"]["runtimes.json"].as_str(), Some(catalog.as_str()));
}

#[test]
fn without_workspace_disks_sandboxd_is_not_privileged() {
    let out = template(&[
        "--show-only",
        "templates/sandboxd-daemonset.yaml",
        "--set",
        "sandboxd.workspaceQuota=off",
    ]);
    let ds: serde_yaml::Value = serde_yaml::Deserializer::from_str(&out)
        .map(|d| serde::Deserialize::deserialize(d).expect("YAML"))
        .find(|d: &serde_yaml::Value| d["kind"] == "DaemonSet")
        .expect("the DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let sc = &pod["containers"][0]["securityContext"];
    assert_eq!(sc["privileged"].as_bool(), Some(false));
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true));
    let add: Vec<&str> = sc["capabilities"]["add"]
        .as_sequence()
        .expect("capabilities added")
        .iter()
        .filter_map(serde_yaml::Value::as_str)
        .collect();
    assert_eq!(
        add,
        [
            "CHOWN",
            "DAC_OVERRIDE",
            "FOWNER",
            "SETUID",
            "SETGID",
            "NET_ADMIN",
            "NET_RAW"
        ]
    );
    assert_eq!(
        sc["capabilities"]["drop"][0].as_str(),
        Some("ALL"),
        "every other capability dropped"
    );
    // No loop devices without loop disks.
    let volumes = pod["volumes"].as_sequence().expect("volumes");
    assert!(volumes.iter().all(|v| v["name"].as_str() != Some("dev")));
    assert_eq!(pod["hostNetwork"].as_bool(), Some(true));
    assert_eq!(pod["hostPID"].as_bool(), Some(true));
}

/// The `securityContext.seccompProfile.type` of a rendered pod spec or container.
fn seccomp(doc: &serde_yaml::Value) -> Option<&str> {
    doc["securityContext"]["seccompProfile"]["type"].as_str()
}

#[test]
fn every_pod_states_the_seccomp_profile_it_runs_with() {
    // Unprivileged sandboxd (workspaceQuota: off): the runtime's default profile.
    let docs = documents(&template(&[
        "--show-only",
        "templates/sandboxd-daemonset.yaml",
        "--set",
        "sandboxd.workspaceQuota=off",
    ]));
    let c = &of_kind(&docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["securityContext"]["privileged"].as_bool(), Some(false));
    assert_eq!(seccomp(c), Some("RuntimeDefault"));
    // Privileged sandboxd (workspaceQuota: loop, the default): a privileged container always
    // runs Unconfined, and the chart says so instead of naming a profile that is not applied.
    let docs = documents(&template(&[
        "--show-only",
        "templates/sandboxd-daemonset.yaml",
    ]));
    let c = &of_kind(&docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["securityContext"]["privileged"].as_bool(), Some(true));
    assert_eq!(seccomp(c), Some("Unconfined"));
    // The operator and the prepare Job: the runtime's default profile for the whole pod.
    let docs = documents(&template(&[
        "--show-only",
        "templates/operator-deployment.yaml",
    ]));
    let pod = &of_kind(&docs, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(seccomp(pod), Some("RuntimeDefault"));
    let docs = documents(&template(&["--show-only", "templates/prepare-hook.yaml"]));
    let pod = &of_kind(&docs, "Job")["spec"]["template"]["spec"];
    assert_eq!(seccomp(pod), Some("RuntimeDefault"));
    assert!(
        seccomp(&pod["containers"][0]).is_none(),
        "the container inherits the pod's profile"
    );
}

#[test]
fn the_prepare_job_requests_little_and_is_bounded() {
    let docs = documents(&template(&["--show-only", "templates/prepare-hook.yaml"]));
    let resources =
        &of_kind(&docs, "Job")["spec"]["template"]["spec"]["containers"][0]["resources"];
    assert_eq!(resources["requests"]["cpu"].as_str(), Some("10m"));
    assert_eq!(resources["requests"]["memory"].as_str(), Some("32Mi"));
    assert_eq!(resources["limits"]["memory"].as_str(), Some("128Mi"));
    // A platform's own numbers replace them.
    let docs = documents(&template(&[
        "--show-only",
        "templates/prepare-hook.yaml",
        "--set",
        "prepareHook.resources.limits.memory=256Mi",
        "--set",
        "prepareHook.resources.limits.cpu=500m",
    ]));
    let resources =
        &of_kind(&docs, "Job")["spec"]["template"]["spec"]["containers"][0]["resources"];
    assert_eq!(resources["limits"]["memory"].as_str(), Some("256Mi"));
    assert_eq!(resources["limits"]["cpu"].as_str(), Some("500m"));
    assert_eq!(resources["requests"]["memory"].as_str(), Some("32Mi"));
}

#[test]
fn a_render_without_the_cluster_refuses_to_make_up_an_admin_token() {
    // `helm template` (Argo CD renders the same way): `lookup` cannot find the token made at
    // install, so a new one would be made on every render.
    let out = run(Command::new(helm())
        .arg("template")
        .arg("rel")
        .arg(chart())
        .args(["--kube-version", "1.37.2"]));
    assert!(
        !out.status.success(),
        "an offline render must not make up a token"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("adminToken: rendering without access to the cluster (helm template, a client-side dry run, a GitOps tool such as Argo CD), the chart cannot find the admin token it generated before and would make a new one on every render, orphaning every workspace; set adminToken.existingSecret to a Secret you manage (key `token`), or adminToken.value"),
        "{err}"
    );

    // With a Secret of one's own: no Secret rendered, every workload reads the named one.
    let docs = documents(&ok(Command::new(helm())
        .arg("template")
        .arg("rel")
        .arg(chart())
        .args([
            "--kube-version",
            "1.37.2",
            "-n",
            "sandboxd",
            "--set",
            "adminToken.existingSecret=platform-sandboxd-admin",
        ])));
    assert!(
        docs.iter().all(|d| d["kind"] != "Secret"),
        "no Secret of the chart's own"
    );
    // The operator reads the named Secret; sandboxd never sees it (only its node's hash).
    let ds = of_kind(&docs, "DaemonSet");
    assert!(
        !serde_yaml::to_string(ds)
            .expect("YAML")
            .contains("platform-sandboxd-admin"),
        "the DaemonSet names the admin-token Secret"
    );
    let operator = of_kind(&docs, "Deployment");
    let secret = operator["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .find(|e| e["name"] == "SANDBOX_OPERATOR_HOST_TOKEN_SECRET")
        .expect("SANDBOX_OPERATOR_HOST_TOKEN_SECRET");
    assert_eq!(
        secret["value"].as_str(),
        Some("sandboxd/platform-sandboxd-admin")
    );
}

#[test]
fn a_render_that_reaches_the_cluster_makes_the_admin_token() {
    // `helm template --dry-run=server` looks the cluster up as `helm install` does: the token
    // is made (or found) there, so the render goes through.
    let out = ok(Command::new(helm())
        .arg("template")
        .arg("rel")
        .arg(chart())
        .args([
            "--dry-run=server",
            "--kube-version",
            "1.37.2",
            "--show-only",
            "templates/admin-token-secret.yaml",
        ]));
    let docs = documents(&out);
    let secret = of_kind(&docs, "Secret");
    let token = secret["data"]["token"].as_str().expect("a token");
    // 48 characters, base64: 64.
    assert_eq!(token.len(), 64, "{token}");
}

/// A SandboxSession of `tenant`, as a person writes it.
fn session(name: &str, tenant: &str) -> String {
    format!(
        "apiVersion: sandboxd.dev/v1alpha1\nkind: SandboxSession\nmetadata:\n  name: {name}\nspec:\n  scope: conversation\n  tenant: {tenant}\n  subject: c-1\n"
    )
}

/// `kubectl apply -n ns -f -` of `manifest` (with `extra` flags), whatever its outcome.
fn apply(ns: &str, manifest: &str, extra: &[&str]) -> Output {
    let mut args = vec!["apply", "-n", ns, "-f", "-"];
    args.extend(extra);
    kubectl_with_stdin(&args, manifest)
}

/// Waits until the API server refuses `manifest` in `ns` with `message` (a policy binding takes
/// effect a moment after it is created), trying with server-side dry runs that create nothing.
async fn until_refused(ns: &str, manifest: &str, message: &str) {
    until(
        "the API server to refuse the manifest",
        DEADLINE,
        || async move {
            let out = apply(ns, manifest, &["--dry-run=server"]);
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            if out.status.success() {
                Err(format!(
                    "accepted: {}",
                    String::from_utf8_lossy(&out.stdout).trim()
                ))
            } else if err.contains(message) {
                Ok(())
            } else {
                Err(err)
            }
        },
    )
    .await;
}

/// Waits until the API server would accept `manifest` in `ns` (the namespace labels admission
/// sees lag a moment behind a change), trying with server-side dry runs that create nothing.
async fn until_accepted(ns: &str, manifest: &str) {
    until(
        "the API server to accept the manifest",
        DEADLINE,
        || async move {
            let out = apply(ns, manifest, &["--dry-run=server"]);
            if out.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        },
    )
    .await;
}

/// Applies `manifest` in `ns` and returns kubectl's stderr, failing the test if it was accepted.
fn refused(ns: &str, manifest: &str) -> String {
    let out = apply(ns, manifest, &[]);
    assert!(
        !out.status.success(),
        "accepted: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Applies `manifest` in `ns` and returns kubectl's stdout, failing the test if it was refused.
fn accepted(ns: &str, manifest: &str) -> String {
    let out = apply(ns, manifest, &[]);
    assert!(
        out.status.success(),
        "refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn label_tenant(client: &kube::Client, ns: &str, tenant: &str) {
    Api::<Namespace>::all(client.clone())
        .patch(
            ns,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": {"labels": {"sandboxd.dev/tenant": tenant}}
            })),
        )
        .await
        .unwrap_or_else(|e| panic!("cannot label namespace {ns}: {e}"));
}

#[tokio::test]
async fn a_namespace_bound_to_a_tenant_creates_sessions_of_that_tenant_only() {
    let client = client().await;
    install_crds(&client).await;
    let release_ns = TestNamespace::create(&client, "chart-tenancy").await;
    // Bound to acme by its label.
    let acme = TestNamespace::create(&client, "chart-acme").await;
    label_tenant(&client, &acme.name, "acme").await;
    // Not labelled.
    let free = TestNamespace::create(&client, "chart-free").await;
    let release = format!("sbx{:06x}", rand::rng().random::<u32>() & 0xff_ffff);
    let policy = format!("{release}-sandboxd-tenant-binding");
    let helm_in_ns = |verb: &str| {
        let mut c = Command::new(helm());
        c.arg(verb).args(["-n", &release_ns.name]);
        c
    };
    // The default mode binds labelled namespaces only: the policy is cluster-wide and other
    // tests open sessions in unlabelled namespaces meanwhile. The catalog's Runtimes belong to
    // the install test.
    ok(helm_in_ns("install")
        .arg(&release)
        .arg(chart())
        .args(["--set", "runtimes.install=false"]));
    // A cluster-wide policy outlives a failed test unless uninstalled: removed however it ends.
    let _uninstall = Uninstall {
        release: release.clone(),
        namespace: release_ns.name.clone(),
    };
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .get(&policy)
        .await
        .expect("the tenant binding's policy");
    let binding = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .get(&policy)
        .await
        .expect("the tenant binding's policy binding");
    assert_eq!(binding.spec.validation_actions, ["Deny"]);

    let refusal = format!(
        "namespace {} belongs to tenant acme: it may not create a SandboxSession of tenant globex",
        acme.name
    );
    until_refused(&acme.name, &session("s-globex", "globex"), &refusal).await;
    // The namespace's own tenant: created.
    let out = accepted(&acme.name, &session("s-acme", "acme"));
    assert_eq!(
        out.trim(),
        "sandboxsession.sandboxd.dev/s-acme created",
        "{out}"
    );
    // Another organization's tenant: refused with the policy's message, and nothing created.
    let err = refused(&acme.name, &session("s-globex", "globex"));
    assert!(err.contains(&refusal), "{err}");
    let sessions = Api::<SandboxSession>::namespaced(client.clone(), &acme.name);
    assert!(
        sessions.get_opt("s-globex").await.expect("get").is_none(),
        "a refused session must not exist"
    );
    // Moving a session to another tenant is refused too (the CRD's immutability rule answers
    // before admission policies run; the policy would refuse it as well).
    let err = refused(&acme.name, &session("s-acme", "globex"));
    assert!(
        err.contains("spec.tenant is immutable: a session never moves to another tenant"),
        "{err}"
    );
    let kept = sessions.get("s-acme").await.expect("the session");
    assert_eq!(kept.spec.tenant, "acme");
    // An unlabelled namespace is not bound in this mode.
    accepted(&free.name, &session("s-free", "globex"));

    // `required`: an unlabelled namespace may create no session. Limited here to this test's
    // namespaces, so that the tests running meanwhile are not bound.
    ok(helm_in_ns("upgrade")
        .arg(&release)
        .arg(chart())
        .args([
            "--no-hooks",
            "--reuse-values",
            "--set",
            "tenantBinding.mode=required",
            "--set-json",
        ])
        .arg(format!(
            r#"tenantBinding.namespaceSelector={{"matchExpressions":[{{"key":"kubernetes.io/metadata.name","operator":"In","values":["{}","{}"]}}]}}"#,
            acme.name, free.name
        )));
    let unbound = format!(
        "namespace {ns} is bound to no tenant, so it may create no SandboxSession: label it with the organization id it serves (kubectl label namespace {ns} sandboxd.dev/tenant=<organization id>)",
        ns = free.name
    );
    until_refused(&free.name, &session("s-free-2", "globex"), &unbound).await;
    let err = refused(&free.name, &session("s-free-2", "globex"));
    assert!(err.contains(&unbound), "{err}");
    // A session made before the namespace was bound is still updated (the operator's
    // finalizers): only a change of tenant is checked on update.
    ok(Command::new(sandboxd_tests::kubectl()).args([
        "label",
        "-n",
        &free.name,
        "sandboxsession/s-free",
        "checked=yes",
    ]));
    // Labelled as the message says: bound, and the tenant's sessions go through.
    label_tenant(&client, &free.name, "globex").await;
    until_accepted(&free.name, &session("s-free-2", "globex")).await;
    accepted(&free.name, &session("s-free-2", "globex"));
    let err = refused(&free.name, &session("s-free-3", "acme"));
    assert!(
        err.contains(&format!(
            "namespace {} belongs to tenant globex: it may not create a SandboxSession of tenant acme",
            free.name
        )),
        "{err}"
    );
    // The bound namespace keeps its binding in this mode.
    let err = refused(&acme.name, &session("s-globex", "globex"));
    assert!(err.contains(&refusal), "{err}");

    // Uninstall removes the policy and its binding.
    ok(helm_in_ns("uninstall").arg(&release));
    assert!(
        Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .get_opt(&policy)
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .get_opt(&policy)
            .await
            .expect("get")
            .is_none()
    );
    acme.delete().await;
    free.delete().await;
    release_ns.delete().await;
}

/// `helm uninstall` of a release when dropped, so that what it made cluster-wide (an admission
/// policy) does not outlive a test that failed.
struct Uninstall {
    release: String,
    namespace: String,
}

impl Drop for Uninstall {
    fn drop(&mut self) {
        let _ = Command::new(helm())
            .args([
                "uninstall",
                &self.release,
                "-n",
                &self.namespace,
                "--ignore-not-found",
            ])
            .output();
    }
}

#[test]
fn the_tenant_binding_binds_labelled_namespaces_unless_turned_off() {
    let docs = documents(&template(&["--show-only", "templates/tenant-binding.yaml"]));
    let binding = of_kind(&docs, "ValidatingAdmissionPolicyBinding");
    // No namespaceSelector by default: with one, the API server looks up the namespace of
    // every session written and refuses the write when it is gone, so a session left in a
    // deleted namespace could never lose its finalizer (found by the fault harness).
    assert_eq!(
        binding["spec"]["matchResources"],
        serde_yaml::from_str::<serde_yaml::Value>("{}").expect("YAML"),
        "the default binding selects no namespaces by label"
    );
    let policy = of_kind(&docs, "ValidatingAdmissionPolicy");
    assert_eq!(
        policy["spec"]["validations"][0]["expression"],
        "variables.bound == '' || object.spec.tenant == variables.bound",
        "the default binds only the namespaces carrying the label"
    );
    let out = template(&["--set", "tenantBinding.enabled=false"]);
    assert!(
        documents(&out).iter().all(|d| !d["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.ends_with("-tenant-binding"))),
        "no tenant binding policy when turned off"
    );
}

#[test]
fn the_secret_watch_of_egress_credentials_is_granted_only_when_enabled() {
    let secret_reads = |args: &[&str]| -> Vec<serde_yaml::Value> {
        let mut all = vec!["--show-only", "templates/operator-rbac.yaml"];
        all.extend_from_slice(args);
        let docs = documents(&template(&all));
        of_kind(&docs, "ClusterRole")["rules"]
            .as_sequence()
            .expect("rules")
            .iter()
            .filter(|r| r["resources"][0] == "secrets")
            .map(|r| r["verbs"].clone())
            .collect()
    };
    let env = |args: &[&str]| -> Option<String> {
        let mut all = vec!["--show-only", "templates/operator-deployment.yaml"];
        all.extend_from_slice(args);
        let docs = documents(&template(&all));
        of_kind(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_sequence()
            .expect("env")
            .iter()
            .find(|e| e["name"] == "SANDBOX_OPERATOR_EGRESS_CREDENTIALS")
            .and_then(|e| e["value"].as_str().map(str::to_owned))
    };
    let verbs = |v: &[&str]| serde_yaml::to_value(v).expect("YAML");
    // The default: the label-selected watch of egress credentials' Secrets, cluster-wide.
    assert_eq!(
        secret_reads(&[]),
        [
            verbs(&["create", "update"]),
            verbs(&["get", "list", "watch"])
        ]
    );
    assert_eq!(env(&[]).as_deref(), Some("true"));
    // Off: no Secret is listed, watched or read cluster-wide, and the operator is told.
    let off = ["--set", "operator.egressCredentials.enabled=false"];
    assert_eq!(secret_reads(&off), [verbs(&["create", "update"])]);
    assert_eq!(env(&off).as_deref(), Some("false"));
}

/// Whether ServiceAccount `user` may `verb` (approve, sign) for `signer`: a SubjectAccessReview,
/// as the API server asks when a request is approved or signed (`kubectl auth can-i` does not
/// know the group of the `signers` resource, which has no API of its own).
async fn on_signer(client: &kube::Client, user: &str, verb: &str, signer: &str) -> bool {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let namespace = user.split(':').nth(2).unwrap_or("");
    let review: SubjectAccessReview = serde_json::from_value(serde_json::json!({
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{namespace}"), "system:authenticated"],
            "resourceAttributes": {"group": "certificates.k8s.io", "resource": "signers", "name": signer, "verb": verb},
        },
    }))
    .expect("review");
    kube::Api::<SubjectAccessReview>::all(client.clone())
        .create(&kube::api::PostParams::default(), &review)
        .await
        .expect("the API server reviews")
        .status
        .is_some_and(|s| s.allowed)
}

/// What `user` may do, as `kubectl auth can-i … --as user` answers.
fn can_i(user: &str, args: &[&str]) -> bool {
    let out = run(Command::new(sandboxd_tests::kubectl())
        .args(["auth", "can-i"])
        .args(args)
        .args(["--as", user]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.split_whitespace().next() {
        Some("yes") => true,
        Some("no") => false,
        _ => panic!(
            "kubectl auth can-i {args:?} --as {user} answered neither yes nor no: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

#[tokio::test]
async fn the_service_accounts_may_do_only_what_they_need() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "chart-rbac").await;
    let other = TestNamespace::create(&client, "chart-rbac-other").await;
    let release = format!("sbx{:06x}", rand::rng().random::<u32>() & 0xff_ffff);
    let full = format!("{release}-sandboxd");
    // The catalog's Runtimes are left out: they are cluster-wide, and another test installs them.
    // Plain HTTP first, where sandboxd's ServiceAccount may do nothing at all; TLS below.
    let out = ok(Command::new(helm())
        .args(["install", &release])
        .arg(chart())
        .args(["-n", &ns.name, "--set", "runtimes.install=false"])
        .args(["--set", "operator.adminTokenSecrets={gpu-box-admin}"])
        // Egress credentials off: their label-selected Secret watch needs get, list and watch
        // on Secrets cluster-wide (see the_secret_watch_of_egress_credentials_is_granted_only_when_enabled).
        .args(["--set", "operator.egressCredentials.enabled=false"])
        .args(["--set", "tls.enabled=false"]));
    assert!(out.contains("STATUS: deployed"), "{out}");
    let sa = |name: &str| format!("system:serviceaccount:{}:{full}-{name}", ns.name);
    let operator = sa("operator");
    let sandboxd = sa("sandboxd");
    let admin_token = format!("secrets/{full}-admin-token");
    let no = |user: &str, args: &[&str]| {
        assert!(!can_i(user, args), "{user} may {args:?}");
    };
    let yes = |user: &str, args: &[&str]| {
        assert!(can_i(user, args), "{user} may not {args:?}");
    };

    // The operator: no Secret of the cluster listed, watched or read; in its own namespace only
    // the admin tokens, by name.
    for verb in ["list", "watch", "get", "patch", "delete"] {
        no(&operator, &[verb, "secrets", "--all-namespaces"]);
        no(&operator, &[verb, "secrets", "-n", &other.name]);
    }
    no(&operator, &["get", "secrets/anything", "-n", &other.name]);
    no(&operator, &["list", "secrets", "-n", &ns.name]);
    no(&operator, &["watch", "secrets", "-n", &ns.name]);
    no(
        &operator,
        &["get", "secrets/not-an-admin-token", "-n", &ns.name],
    );
    yes(&operator, &["get", &admin_token, "-n", &ns.name]);
    yes(&operator, &["get", "secrets/gpu-box-admin", "-n", &ns.name]);
    // Session token Secrets in the platform's namespaces: made, and replaced on a rotation.
    yes(&operator, &["create", "secrets", "-n", &other.name]);
    yes(&operator, &["update", "secrets", "-n", &other.name]);
    // What its controllers need, still there.
    yes(&operator, &["watch", "sandboxsessions.sandboxd.dev", "-A"]);
    yes(
        &operator,
        &["patch", "sandboxsessions.sandboxd.dev/status", "-A"],
    );
    yes(&operator, &["create", "tombstones.sandboxd.dev"]);
    // Snapshots: watched, their finalizer and owner written, their status applied.
    yes(&operator, &["watch", "sandboxsnapshots.sandboxd.dev", "-A"]);
    yes(&operator, &["patch", "sandboxsnapshots.sandboxd.dev", "-A"]);
    yes(
        &operator,
        &["patch", "sandboxsnapshots.sandboxd.dev/status", "-A"],
    );
    // Sessions a namespace left behind: namespaces watched, such a session deleted; namespaces
    // themselves never changed.
    yes(&operator, &["watch", "namespaces"]);
    yes(&operator, &["delete", "sandboxsessions.sandboxd.dev", "-A"]);
    no(&operator, &["delete", "namespaces"]);
    no(&operator, &["create", "namespaces"]);
    yes(
        &operator,
        &["update", "leases.coordination.k8s.io", "-n", &ns.name],
    );
    no(
        &operator,
        &["update", "leases.coordination.k8s.io", "-n", &other.name],
    );
    yes(&operator, &["list", "pods", "-n", &ns.name]);
    no(&operator, &["list", "pods", "-A"]);
    // The node token hashes: that one ConfigMap patched, by name; no other ConfigMap, none
    // created, none read.
    let hashes = format!("configmaps/{full}-node-token-hashes");
    yes(&operator, &["patch", &hashes, "-n", &ns.name]);
    no(&operator, &["patch", &hashes, "-n", &other.name]);
    no(&operator, &["patch", "configmaps/other", "-n", &ns.name]);
    for verb in ["create", "list", "watch", "delete"] {
        no(&operator, &[verb, "configmaps", "-n", &ns.name]);
    }
    no(&operator, &["get", "configmaps/other", "-n", &ns.name]);

    // sandboxd: nothing at all beyond what every ServiceAccount may.
    for resource in [
        "secrets",
        "pods",
        "configmaps",
        "sandboxsessions.sandboxd.dev",
        "sandboxhosts.sandboxd.dev",
        "leases.coordination.k8s.io",
    ] {
        for verb in [
            "get", "list", "watch", "create", "update", "patch", "delete",
        ] {
            no(&sandboxd, &[verb, resource, "--all-namespaces"]);
        }
    }
    let rules = |user: &str| {
        ok(Command::new(sandboxd_tests::kubectl())
            .args(["auth", "can-i", "--list", "-n", &ns.name, "--as", user]))
    };
    let nobody = rules(&format!("system:serviceaccount:{}:nobody", ns.name));
    assert_eq!(
        rules(&sandboxd),
        nobody,
        "sandboxd's ServiceAccount may do more than one nobody bound"
    );

    // A certificate per node (tls.issuer.caSecret): sandboxd may ask (create) and read its
    // request back (get), nothing more; the operator may approve and sign for its own signer
    // name only, and read that one CA Secret.
    ok(Command::new(helm())
        .args(["upgrade", "-n", &ns.name])
        .arg(&release)
        .arg(chart())
        .args([
            "--no-hooks",
            "--reuse-values",
            "--set",
            "tls.enabled=true",
            "--set",
            "tls.issuer.caSecret=node-ca",
        ]));
    let csrs = "certificatesigningrequests.certificates.k8s.io";
    yes(&sandboxd, &["create", csrs]);
    yes(&sandboxd, &["get", csrs]);
    for verb in ["list", "watch", "update", "patch", "delete"] {
        no(&sandboxd, &[verb, csrs]);
    }
    no(&sandboxd, &["update", csrs, "--subresource", "approval"]);
    no(&sandboxd, &["update", csrs, "--subresource", "status"]);
    for verb in ["approve", "sign"] {
        assert!(!on_signer(&client, &sandboxd, verb, "sandboxd.dev/host").await);
    }
    no(&sandboxd, &["get", "secrets/node-ca", "-n", &ns.name]);
    no(&sandboxd, &["get", "nodes"]);
    // The table's columns are as wide as its longest name: compared word by word.
    let words = |table: &str| -> Vec<String> {
        table
            .lines()
            .filter(|l| !l.starts_with(csrs))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect()
    };
    assert_eq!(
        words(&rules(&sandboxd)),
        words(&nobody),
        "sandboxd's ServiceAccount may do more than ask for certificates"
    );
    for verb in ["get", "list", "watch"] {
        yes(&operator, &[verb, csrs]);
    }
    yes(&operator, &["update", csrs, "--subresource", "approval"]);
    yes(&operator, &["update", csrs, "--subresource", "status"]);
    no(&operator, &["create", csrs]);
    no(&operator, &["delete", csrs]);
    for verb in ["approve", "sign"] {
        assert!(on_signer(&client, &operator, verb, "sandboxd.dev/host").await);
        for signer in [
            "kubernetes.io/kubelet-serving",
            "kubernetes.io/kube-apiserver-client",
            "example.com/other",
            "sandboxd.dev/*",
        ] {
            assert!(
                !on_signer(&client, &operator, verb, signer).await,
                "the operator may {verb} for {signer}"
            );
        }
    }
    // The requesting pod's hostIP, never a Node's addresses.
    no(&operator, &["get", "nodes"]);
    yes(&operator, &["get", "pods", "-n", &ns.name]);
    yes(&operator, &["get", "secrets/node-ca", "-n", &ns.name]);
    no(&operator, &["get", "secrets/node-ca", "-n", &other.name]);
    no(&operator, &["list", "secrets", "-n", &ns.name]);

    // The default: the operator's own CA, which it may make (create cannot be limited by name)
    // and read back by name; sandboxd may not read it.
    ok(Command::new(helm())
        .args(["upgrade", "-n", &ns.name])
        .arg(&release)
        .arg(chart())
        .args([
            "--no-hooks",
            "--reuse-values",
            "--set",
            "tls.issuer.caSecret=",
        ]));
    let own_ca = format!("secrets/{full}-node-ca");
    yes(&operator, &["get", &own_ca, "-n", &ns.name]);
    yes(&operator, &["create", "secrets", "-n", &ns.name]);
    no(&operator, &["get", "secrets/node-ca", "-n", &ns.name]);
    no(&sandboxd, &["get", &own_ca, "-n", &ns.name]);
    yes(&sandboxd, &["create", csrs]);

    ok(Command::new(helm()).args(["uninstall", &release, "-n", &ns.name]));
    other.delete().await;
    ns.delete().await;
}

#[test]
fn sandboxd_pods_are_given_no_master_and_no_token_only_their_nodes_hash() {
    for tls in [false, true] {
        let mut args = vec!["-n", "sandboxd"];
        if tls {
            args.extend(["--set", "tls.existingSecret=sbx-tls"]);
        } else {
            args.extend(["--set", "tls.enabled=false"]);
        }
        let docs = documents(&template(&args));
        let ds = of_kind(&docs, "DaemonSet");
        let pod = &ds["spec"]["template"]["spec"];
        // Nothing of the admin-token Secret: no env from it, no volume of it, not its name.
        assert!(
            !serde_yaml::to_string(ds)
                .expect("YAML")
                .contains("admin-token"),
            "the DaemonSet names the admin-token Secret"
        );
        let sandboxd = &pod["containers"][0];
        for env in sandboxd["env"].as_sequence().expect("env") {
            assert!(
                env["valueFrom"]["secretKeyRef"].is_null(),
                "sandboxd takes {:?} from a Secret",
                env["name"]
            );
            for name in ["SANDBOXD_TOKEN", "SANDBOXD_NODE_TOKEN"] {
                assert_ne!(env["name"].as_str(), Some(name), "sandboxd is given {name}");
            }
        }
        // The only Secret a sandboxd pod mounts is its TLS certificate, when TLS is on.
        let secrets: Vec<&str> = pod["volumes"]
            .as_sequence()
            .expect("volumes")
            .iter()
            .filter_map(|v| v["secret"]["secretName"].as_str())
            .collect();
        assert_eq!(secrets, if tls { vec!["sbx-tls"] } else { vec![] });
        // Its node's hash: the operator's ConfigMap, mounted where SANDBOXD_NODE_TOKEN_HASHES
        // says, the file picked by SANDBOXD_NODE_NAME (the pod's node).
        assert_eq!(
            env_of(sandboxd, "SANDBOXD_NODE_TOKEN_HASHES"),
            Some("/etc/sandboxd-node-tokens")
        );
        let volume = pod["volumes"]
            .as_sequence()
            .expect("volumes")
            .iter()
            .find(|v| v["name"] == "node-token-hashes")
            .expect("the node-token-hashes volume");
        assert_eq!(
            volume["configMap"]["name"].as_str(),
            Some("rel-sandboxd-node-token-hashes")
        );
        let mount = sandboxd["volumeMounts"]
            .as_sequence()
            .expect("mounts")
            .iter()
            .find(|m| m["name"] == "node-token-hashes")
            .expect("the node-token-hashes mount");
        assert_eq!(
            mount["mountPath"].as_str(),
            Some("/etc/sandboxd-node-tokens")
        );
        assert_eq!(mount["readOnly"].as_bool(), Some(true));
        // The ConfigMap is rendered without data (an upgrade keeps what the operator wrote),
        // and the operator is told to write it.
        let map = docs
            .iter()
            .find(|d| {
                d["kind"] == "ConfigMap"
                    && d["metadata"]["name"] == "rel-sandboxd-node-token-hashes"
            })
            .expect("the node-token-hashes ConfigMap");
        assert!(map["data"].is_null(), "{map:?}");
        let operator = &of_kind(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            env_of(operator, "SANDBOX_OPERATOR_NODE_TOKEN_HASHES"),
            Some("rel-sandboxd-node-token-hashes")
        );
        assert_eq!(
            env_of(operator, "SANDBOX_OPERATOR_HOST_TOKEN_SECRET"),
            Some("sandboxd/rel-sandboxd-admin-token")
        );
    }
}

/// The value of `name` in a container's env, if set.
fn env_of<'a>(container: &'a serde_yaml::Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_sequence()?
        .iter()
        .find(|e| e["name"].as_str() == Some(name))
        .and_then(|e| e["value"].as_str())
}

#[test]
fn plain_http_only_with_tls_enabled_false_and_then_no_certificate_is_asked_for() {
    let rendered = template(&["--set", "tls.enabled=false"]);
    assert!(!rendered.contains("certificates.k8s.io"), "{rendered}");
    assert!(!rendered.contains("SANDBOX_OPERATOR_CSR"), "{rendered}");
    let docs = documents(&rendered);
    assert!(
        of_kind(&docs, "DaemonSet")["spec"]["template"]["spec"]["initContainers"].is_null(),
        "no enrol init container without TLS"
    );
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("the DaemonSet");
    let sandboxd = &ds["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(env_of(sandboxd, "SANDBOXD_TLS_CERT_FILE"), None);
    assert!(sandboxd["livenessProbe"]["httpGet"]["scheme"].is_null());
    let op = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the operator");
    let operator = &op["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(env_of(operator, "SANDBOX_OPERATOR_HOST_CA_FILE"), None);
    assert!(op["spec"]["template"]["spec"]["volumes"].is_null());
}

#[test]
fn tls_from_an_existing_secret_gives_sandboxd_its_certificate_and_the_operator_only_the_ca() {
    let docs = documents(&template(&[
        "--set",
        "tls.existingSecret=sandboxd-tls",
        "--set",
        "serviceMonitor.enabled=true",
    ]));
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("the DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let sandboxd = &pod["containers"][0];
    assert_eq!(
        env_of(sandboxd, "SANDBOXD_TLS_CERT_FILE"),
        Some("/etc/sandboxd-tls/tls.crt")
    );
    assert_eq!(
        env_of(sandboxd, "SANDBOXD_TLS_KEY_FILE"),
        Some("/etc/sandboxd-tls/tls.key")
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(
            sandboxd[probe]["httpGet"]["scheme"].as_str(),
            Some("HTTPS"),
            "{probe}"
        );
    }
    let mount = sandboxd["volumeMounts"]
        .as_sequence()
        .expect("mounts")
        .iter()
        .find(|m| m["name"] == "tls")
        .expect("the TLS mount");
    assert_eq!(mount["mountPath"].as_str(), Some("/etc/sandboxd-tls"));
    assert_eq!(mount["readOnly"].as_bool(), Some(true));
    let volume = pod["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "tls")
        .expect("the TLS volume");
    assert_eq!(
        volume["secret"]["secretName"].as_str(),
        Some("sandboxd-tls")
    );

    // The operator: the CA alone (never the key), and discovery writes https:// with it.
    let op = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the operator");
    let operator = &op["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        env_of(operator, "SANDBOX_OPERATOR_HOST_CA_FILE"),
        Some("/etc/sandboxd-host-ca/ca.crt")
    );
    let volume = &op["spec"]["template"]["spec"]["volumes"][0];
    assert_eq!(volume["name"].as_str(), Some("host-ca"));
    assert_eq!(
        volume["secret"]["secretName"].as_str(),
        Some("sandboxd-tls")
    );
    let items: Vec<&str> = volume["secret"]["items"]
        .as_sequence()
        .expect("items")
        .iter()
        .filter_map(|i| i["key"].as_str())
        .collect();
    assert_eq!(items, ["ca.crt"]);

    // Prometheus scrapes sandboxd over https with the same CA, and the operator (which
    // serves plain HTTP) as before.
    let sm = service_monitor(&docs, "rel-sandboxd");
    assert_eq!(
        sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"].as_str(),
        Some("sandboxd")
    );
    let endpoint = &sm["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"].as_str(), Some("https"));
    assert_eq!(
        endpoint["tlsConfig"]["ca"]["secret"]["key"].as_str(),
        Some("ca.crt")
    );
    let sm = service_monitor(&docs, "rel-sandboxd-operator");
    assert_eq!(
        sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"].as_str(),
        Some("operator")
    );
    let endpoint = &sm["spec"]["endpoints"][0];
    assert!(endpoint["scheme"].is_null(), "{endpoint:?}");
    assert!(endpoint["tlsConfig"].is_null(), "{endpoint:?}");
}

/// The ServiceMonitor named `name` of a rendering.
fn service_monitor<'a>(docs: &'a [serde_yaml::Value], name: &str) -> &'a serde_yaml::Value {
    docs.iter()
        .find(|d| d["kind"] == "ServiceMonitor" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no ServiceMonitor {name} rendered"))
}

#[test]
fn a_certificate_per_node_is_asked_for_by_an_init_container_unless_an_existing_secret_is_given() {
    let issuer = [
        "--set",
        "tls.issuer.caSecret=node-ca",
        "--set",
        "serviceMonitor.enabled=true",
    ];
    for on in [false, true] {
        let args: &[&str] = if on {
            &issuer
        } else {
            &["--set", "tls.existingSecret=sandboxd-tls"]
        };
        let rendered = template(args);
        let docs = documents(&rendered);
        let ds = of_kind(&docs, "DaemonSet");
        let pod = &ds["spec"]["template"]["spec"];
        let volume = |name: &str| {
            pod["volumes"]
                .as_sequence()
                .expect("volumes")
                .iter()
                .find(|v| v["name"] == name)
                .cloned()
        };
        let tls = volume("tls").expect("the TLS volume");
        let roles: Vec<String> = docs
            .iter()
            .filter(|d| d["kind"] == "ClusterRole")
            .map(|d| d["metadata"]["name"].as_str().unwrap_or("").to_owned())
            .collect();
        let operator_role = docs
            .iter()
            .find(|d| {
                d["kind"] == "ClusterRole" && d["metadata"]["name"] == "rel-sandboxd-operator"
            })
            .expect("the operator's ClusterRole");
        let op_rules = serde_yaml::to_string(&operator_role["rules"]).expect("YAML");
        let op = of_kind(&docs, "Deployment");
        let operator = &op["spec"]["template"]["spec"]["containers"][0];
        if !on {
            assert!(
                pod["initContainers"].is_null(),
                "{:?}",
                pod["initContainers"]
            );
            assert_eq!(tls["secret"]["secretName"].as_str(), Some("sandboxd-tls"));
            assert!(volume("enrol-token").is_none());
            assert_eq!(roles, ["rel-sandboxd-operator"]);
            assert!(
                !op_rules.contains("certificatesigningrequests"),
                "{op_rules}"
            );
            assert!(env_of(operator, "SANDBOX_OPERATOR_CSR_CA_SECRET").is_none());
            assert!(!rendered.contains("certificates.k8s.io"));
            continue;
        }
        // sandboxd reads what the init container wrote, in memory; the CA's key is mounted
        // nowhere in the DaemonSet.
        assert_eq!(
            tls["emptyDir"]["medium"].as_str(),
            Some("Memory"),
            "{tls:?}"
        );
        assert!(
            !serde_yaml::to_string(ds).expect("YAML").contains("node-ca"),
            "the DaemonSet names the CA Secret"
        );
        let init = &pod["initContainers"][0];
        assert_eq!(init["name"].as_str(), Some("enrol"));
        assert_eq!(init["args"][0].as_str(), Some("enrol"));
        assert_eq!(seccomp(init), Some("RuntimeDefault"));
        assert_eq!(
            init["securityContext"]["runAsNonRoot"].as_bool(),
            Some(true)
        );
        assert_eq!(
            init["securityContext"]["allowPrivilegeEscalation"].as_bool(),
            Some(false)
        );
        assert_eq!(
            env_of(init, "SANDBOXD_ENROL_DIR"),
            Some("/etc/sandboxd-tls")
        );
        assert_eq!(
            env_of(init, "SANDBOXD_SIGNER_NAME"),
            Some("sandboxd.dev/host")
        );
        let field = |name: &str| {
            init["env"]
                .as_sequence()
                .expect("env")
                .iter()
                .find(|e| e["name"] == name)
                .and_then(|e| e["valueFrom"]["fieldRef"]["fieldPath"].as_str())
                .map(str::to_owned)
        };
        assert_eq!(
            field("SANDBOXD_NODE_NAME").as_deref(),
            Some("spec.nodeName")
        );
        assert_eq!(field("SANDBOXD_NODE_IP").as_deref(), Some("status.hostIP"));
        let mounts = serde_yaml::to_string(&init["volumeMounts"]).expect("YAML");
        assert!(mounts.contains("mountPath: /etc/sandboxd-tls"), "{mounts}");
        assert!(
            mounts.contains("/var/run/secrets/kubernetes.io/serviceaccount"),
            "{mounts}"
        );
        // The token: the init container's alone, bound to the pod, short-lived.
        assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(false));
        let sandboxd_mounts =
            serde_yaml::to_string(&pod["containers"][0]["volumeMounts"]).expect("YAML");
        assert!(
            !sandboxd_mounts.contains("enrol-token"),
            "{sandboxd_mounts}"
        );
        let token = volume("enrol-token").expect("the token volume");
        assert_eq!(
            token["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"].as_u64(),
            Some(600)
        );
        // RBAC: sandboxd may create and get requests; the operator approves and signs its
        // signer's only, and reads the CA Secret by name.
        let sandboxd_role = docs
            .iter()
            .find(|d| {
                d["kind"] == "ClusterRole" && d["metadata"]["name"] == "rel-sandboxd-sandboxd"
            })
            .expect("sandboxd's ClusterRole");
        assert_eq!(
            serde_yaml::to_string(&sandboxd_role["rules"]).expect("YAML"),
            "- apiGroups:\n  - certificates.k8s.io\n  resources:\n  - certificatesigningrequests\n  verbs:\n  - create\n  - get\n"
        );
        assert!(
            docs.iter().any(|d| d["kind"] == "ClusterRoleBinding"
                && d["roleRef"]["name"] == "rel-sandboxd-sandboxd"
                && d["subjects"][0]["name"] == "rel-sandboxd-sandboxd"),
            "sandboxd's role is bound to its ServiceAccount"
        );
        let signers = operator_role["rules"]
            .as_sequence()
            .expect("rules")
            .iter()
            .find(|r| r["resources"][0] == "signers")
            .expect("the signers rule");
        assert_eq!(
            serde_yaml::to_string(signers).expect("YAML"),
            "apiGroups:\n- certificates.k8s.io\nresources:\n- signers\nresourceNames:\n- sandboxd.dev/host\nverbs:\n- approve\n- sign\n"
        );
        let role = docs
            .iter()
            .find(|d| d["kind"] == "Role" && d["metadata"]["name"] == "rel-sandboxd-operator")
            .expect("the operator's Role");
        let secrets = role["rules"]
            .as_sequence()
            .expect("rules")
            .iter()
            .find(|r| r["resources"][0] == "secrets")
            .expect("the secrets rule");
        assert!(
            secrets["resourceNames"]
                .as_sequence()
                .expect("names")
                .iter()
                .any(|n| n == "node-ca"),
            "{secrets:?}"
        );
        // The operator signs for the chart's sandboxd ServiceAccount, and holds no CA file.
        assert_eq!(
            env_of(operator, "SANDBOX_OPERATOR_CSR_CA_SECRET"),
            Some("node-ca")
        );
        // A CA of the installer's: the operator waits for it, never makes it.
        assert!(env_of(operator, "SANDBOX_OPERATOR_CSR_CA_GENERATE").is_none());
        assert_eq!(
            env_of(operator, "SANDBOX_OPERATOR_CSR_REQUESTER"),
            Some("system:serviceaccount:default:rel-sandboxd-sandboxd")
        );
        assert!(env_of(operator, "SANDBOX_OPERATOR_HOST_CA_FILE").is_none());
        assert!(op["spec"]["template"]["spec"]["volumes"].is_null());
        let sm = service_monitor(&docs, "rel-sandboxd");
        assert_eq!(
            sm["spec"]["endpoints"][0]["tlsConfig"]["ca"]["secret"]["key"].as_str(),
            Some("tls.crt")
        );
    }
    // Without TLS the issuer means nothing: refused, saying so.
    let out = run(Command::new(helm())
        .arg("template")
        .arg("rel")
        .arg(chart())
        .args(["--kube-version", "1.37.2", "--set"])
        .arg(format!("adminToken.value={RENDER_TOKEN}"))
        .args([
            "--set",
            "tls.issuer.caSecret=node-ca",
            "--set",
            "tls.enabled=false",
        ]));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tls.issuer.caSecret needs tls.enabled=true"),
        "{err}"
    );
}

#[test]
fn by_default_each_node_gets_a_certificate_from_a_ca_the_operator_makes() {
    let docs = documents(&template(&[]));
    let ds = of_kind(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    // sandboxd serves HTTPS with what its init container got for the node.
    let sandboxd = &pod["containers"][0];
    assert_eq!(
        env_of(sandboxd, "SANDBOXD_TLS_CERT_FILE"),
        Some("/etc/sandboxd-tls/tls.crt")
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(
            sandboxd[probe]["httpGet"]["scheme"].as_str(),
            Some("HTTPS"),
            "{probe}"
        );
    }
    assert_eq!(pod["initContainers"][0]["args"][0].as_str(), Some("enrol"));
    // The operator signs with the CA Secret it makes when it is missing, and trusts it.
    let operator = &of_kind(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        env_of(operator, "SANDBOX_OPERATOR_CSR_CA_SECRET"),
        Some("rel-sandboxd-node-ca")
    );
    assert_eq!(
        env_of(operator, "SANDBOX_OPERATOR_CSR_CA_GENERATE"),
        Some("true")
    );
    assert!(env_of(operator, "SANDBOX_OPERATOR_HOST_CA_FILE").is_none());
    let role = docs
        .iter()
        .find(|d| d["kind"] == "Role" && d["metadata"]["name"] == "rel-sandboxd-operator")
        .expect("the operator's Role");
    let names = serde_yaml::to_string(&role["rules"]).expect("YAML");
    assert!(names.contains("- rel-sandboxd-node-ca\n"), "{names}");
    // Nothing in the chart makes or names a key: the CA is the operator's alone.
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "Secret" && d["metadata"]["name"] == "rel-sandboxd-node-ca"),
        "the chart renders the CA Secret"
    );
    // Where no `kubernetes` Service reaches the API server (the local node), the init
    // container that asks is told where it is.
    let docs = documents(&template(&[
        "--set-json",
        r#"tls.issuer.extraEnv=[{"name":"KUBERNETES_SERVICE_HOST","value":"127.0.0.1"}]"#,
    ]));
    let init = &of_kind(&docs, "DaemonSet")["spec"]["template"]["spec"]["initContainers"][0];
    assert_eq!(env_of(init, "KUBERNETES_SERVICE_HOST"), Some("127.0.0.1"));
    // Two sources of certificates at once are refused, saying which.
    let out = run(Command::new(helm())
        .arg("template")
        .arg("rel")
        .arg(chart())
        .args(["--kube-version", "1.37.2", "--set"])
        .arg(format!("adminToken.value={RENDER_TOKEN}"))
        .args([
            "--set",
            "tls.issuer.caSecret=a",
            "--set",
            "tls.existingSecret=b",
        ]));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tls.existingSecret and tls.issuer.caSecret are two sources of sandboxd's certificates: set one"),
        "{err}"
    );
}

/// The platform's opt-in Role (`platform.serviceAccounts`): what the Python SDK needs in the
/// namespaces it opens sandboxes in (docs/sdk.md), nothing elsewhere, and no Secret listed.
#[tokio::test]
async fn the_platform_service_accounts_may_do_only_what_the_sdk_needs() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "chart-platform").await;
    let agents = TestNamespace::create(&client, "chart-platform-agents").await;
    let platform = TestNamespace::create(&client, "chart-platform-api").await;
    let release = format!("sbx{:06x}", rand::rng().random::<u32>() & 0xff_ffff);
    let full = format!("{release}-sandboxd");
    // Off by default: no Role for anyone.
    let docs = documents(&template(&[]));
    assert!(
        docs.iter()
            .all(|d| d["metadata"]["name"].as_str() != Some("rel-sandboxd-platform")),
        "a platform Role without platform.serviceAccounts"
    );
    let out = ok(Command::new(helm())
        .args(["install", &release])
        .arg(chart())
        .args(["-n", &ns.name, "--set", "runtimes.install=false"])
        .args(["--set", "platform.serviceAccounts[0].name=api"])
        .arg(format!(
            "--set=platform.serviceAccounts[0].namespace={}",
            platform.name
        ))
        .arg(format!(
            "--set=platform.sessionNamespaces={{{}}}",
            agents.name
        )));
    assert!(out.contains("STATUS: deployed"), "{out}");
    let api = format!("system:serviceaccount:{}:api", platform.name);
    let other = format!("system:serviceaccount:{}:other", platform.name);
    let yes = |args: &[&str]| assert!(can_i(&api, args), "{api} may not {args:?}");
    let no = |args: &[&str]| assert!(!can_i(&api, args), "{api} may {args:?}");

    // In the sessions' namespace: the SandboxSessions, and a token Secret by name.
    for verb in ["create", "get", "list", "watch", "delete"] {
        yes(&[verb, "sandboxsessions.sandboxd.dev", "-n", &agents.name]);
        yes(&[verb, "sandboxsnapshots.sandboxd.dev", "-n", &agents.name]);
    }
    yes(&[
        "get",
        "secrets/xc-a81e9bd7-853e3610-c-1-token",
        "-n",
        &agents.name,
    ]);
    // Nothing more there: no Secret listed, watched or written, no status, no session changed.
    for verb in ["list", "watch", "create", "update", "patch", "delete"] {
        no(&[verb, "secrets", "-n", &agents.name]);
    }
    for verb in ["update", "patch"] {
        no(&[verb, "sandboxsessions.sandboxd.dev", "-n", &agents.name]);
        no(&[
            verb,
            "sandboxsessions.sandboxd.dev/status",
            "-n",
            &agents.name,
        ]);
    }
    no(&["get", "pods", "-n", &agents.name]);
    // Nowhere else: not the release's namespace (its admin token), not cluster-wide kinds.
    no(&[
        "get",
        &format!("secrets/{full}-admin-token"),
        "-n",
        &ns.name,
    ]);
    no(&["create", "sandboxsessions.sandboxd.dev", "-n", &ns.name]);
    no(&["get", "secrets/anything", "-n", &platform.name]);
    no(&["list", "sandboxsessions.sandboxd.dev", "--all-namespaces"]);
    for resource in [
        "sandboxhosts.sandboxd.dev",
        "runtimes.sandboxd.dev",
        "tombstones.sandboxd.dev",
    ] {
        no(&["get", resource]);
        no(&["create", resource]);
    }
    // Only the ServiceAccounts named.
    assert!(
        !can_i(
            &other,
            &["create", "sandboxsessions.sandboxd.dev", "-n", &agents.name]
        ),
        "an account not named got the Role"
    );
    // Its get reaches every Secret of the sessions' namespace (RBAC cannot narrow it to a type
    // or label), so that namespace holds none but the operator's token Secrets: any other is
    // refused, even to an administrator.
    let other_secret = "apiVersion: v1\nkind: Secret\nmetadata: {name: db-password}\nstringData: {password: hunter2}\n";
    until_refused(
        &agents.name,
        other_secret,
        &format!(
            "namespace {} holds session token Secrets only, written by the sandbox operator (the platform may read every Secret in it): Secret db-password is refused; keep it in another namespace",
            agents.name
        ),
    )
    .await;
    let forged = "apiVersion: v1\nkind: Secret\nmetadata: {name: xc-forged-token}\ntype: sandboxd.dev/session-token\nstringData: {token: forged}\n";
    until_refused(&agents.name, forged, "holds session token Secrets only").await;
    until_accepted(&platform.name, other_secret).await;
    // The release's namespace (the master admin token) is never a session namespace, and one
    // must be named.
    let refused = run(Command::new(helm())
        .args(["template", "rel"])
        .arg(chart())
        .args(["-n", "sandboxd", "--kube-version", "1.37.2", "--set"])
        .arg(format!("adminToken.value={RENDER_TOKEN}"))
        .args(["--set", "platform.serviceAccounts[0].name=api"])
        .args(["--set", "platform.sessionNamespaces={agents,sandboxd}"]));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("platform.sessionNamespaces may not include the release's namespace sandboxd: it holds the master admin token, and the platform's Role may get Secrets in its session namespaces"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let unnamed = run(Command::new(helm())
        .args(["template", "rel"])
        .arg(chart())
        .args(["-n", "sandboxd", "--kube-version", "1.37.2", "--set"])
        .arg(format!("adminToken.value={RENDER_TOKEN}"))
        .args(["--set", "platform.serviceAccounts[0].name=api"]));
    assert!(
        String::from_utf8_lossy(&unnamed.stderr)
            .contains("platform.sessionNamespaces is required with platform.serviceAccounts"),
        "{}",
        String::from_utf8_lossy(&unnamed.stderr)
    );

    ok(Command::new(helm()).args(["uninstall", &release, "-n", &ns.name]));
    platform.delete().await;
    agents.delete().await;
    ns.delete().await;
}

/// `tracing.otlpEndpoint` gives the operator and sandboxd the OTLP endpoint and sampler; unset,
/// neither has them (no spans are made); an endpoint that is not a URL is refused by the schema.
#[test]
fn tracing_reaches_both_components_only_when_an_endpoint_is_set() {
    let containers = |args: &[&str]| {
        let docs = documents(&template(args));
        let op = of_kind(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0].clone();
        let sd = of_kind(&docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0].clone();
        [op, sd]
    };
    for c in containers(&["--set", "tracing.otlpEndpoint=http://collector.obs:4318"]) {
        assert_eq!(
            env_of(&c, "OTEL_EXPORTER_OTLP_ENDPOINT"),
            Some("http://collector.obs:4318")
        );
        assert_eq!(
            env_of(&c, "OTEL_TRACES_SAMPLER"),
            Some("parentbased_always_on")
        );
    }
    for c in containers(&[]) {
        assert_eq!(env_of(&c, "OTEL_EXPORTER_OTLP_ENDPOINT"), None);
        assert_eq!(env_of(&c, "OTEL_TRACES_SAMPLER"), None);
    }
    let refused = Command::new(helm())
        .arg("template")
        .arg("rel")
        .arg(chart())
        .args(["--kube-version", "1.37.2", "--set"])
        .arg(format!("adminToken.value={RENDER_TOKEN}"))
        .args(["--set", "tracing.otlpEndpoint=collector:4318"])
        .output()
        .expect("helm runs");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("/tracing/otlpEndpoint"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}
