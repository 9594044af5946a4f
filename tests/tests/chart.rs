//! The Helm chart against the real API server: it lints, its versions move with the workspace,
//! its rendering is accepted by a server-side dry run, `helm install` creates what it should,
//! `helm upgrade` keeps the admin token, and `helm uninstall` leaves the CRDs.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use rand::Rng;
use sandboxd_crds::v1alpha1::Runtime;
use sandboxd_tests::{TestNamespace, client, install_crds, repo_root};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn chart() -> PathBuf {
    repo_root().join("charts/sandboxd")
}

fn helm() -> PathBuf {
    match std::env::var("SANDBOXD_HELM") {
        Ok(p) => PathBuf::from(p),
        Err(_) => panic!(
            "SANDBOXD_HELM is not set: run `make test`, or `make up` and `eval \"$(make -s env)\"`"
        ),
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("{cmd:?} did not start: {e}"))
}

fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn template(args: &[&str]) -> String {
    ok(Command::new(helm())
        .arg("template")
        .arg("rel")
        .arg(chart())
        .args(["--kube-version", "1.37.2"])
        .args(args))
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
}

fn kubectl_stdin(args: &[&str], input: &str) -> String {
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
    let out = child.wait_with_output().expect("kubectl");
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
        ],
    ] {
        let mut args = vec!["-n", ns.name.as_str()];
        args.extend(extra);
        let rendered = template(&args);
        let out = kubectl_stdin(
            &["apply", "--dry-run=server", "-n", &ns.name, "-f", "-"],
            &rendered,
        );
        for kind in [
            "deployment.apps/rel-sandboxd-operator created (server dry run)",
            "daemonset.apps/rel-sandboxd-sandboxd created (server dry run)",
            "networkpolicy.networking.k8s.io/rel-sandboxd-sandboxd created (server dry run)",
            "job.batch/rel-sandboxd-prepare created (server dry run)",
            "clusterrole.rbac.authorization.k8s.io/rel-sandboxd-operator created (server dry run)",
        ] {
            assert!(out.contains(kind), "{kind} missing in:\n{out}");
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
    assert_eq!(mount("docker-socket"), host_path("docker-socket"));
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
    let out = template(&["--show-only", "templates/prepare-hook.yaml"]);
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&out)
        .map(|d| serde::Deserialize::deserialize(d).expect("YAML"))
        .collect();
    let job = docs.iter().find(|d| d["kind"] == "Job").expect("a Job");
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
        ["CHOWN", "DAC_OVERRIDE", "FOWNER", "NET_ADMIN", "NET_RAW"]
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
