//! Host discovery: the sandboxd pods of the DaemonSet become SandboxHosts, and the metrics tell
//! the story; a labelled pod not of the DaemonSet, or not in its node's network, becomes no
//! host. Against the stack of `make up` (see `common`).

mod common;

use std::time::Duration;

use common::{Host, Scope, phase};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use sandboxd_crds::v1alpha1::SandboxHost;
use sandboxd_crds::v1alpha1::session::SessionPhase;
use sandboxd_tests::poll::{nothing_left, until_every};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxd_pods_become_hosts_and_metrics_tell_the_story() {
    let mut scope = Scope::new("disc").await;
    let node = format!("worker-{}", scope.scope);
    // As the chart runs it: told its node, given no token, only the folder where the operator's
    // ConfigMap of node token hashes is mounted; it takes only that node's own admin token.
    let mounted = tempfile::tempdir().expect("temp dir");
    let host = Host::start(
        &format!("disc-{}", scope.scope),
        &[
            ("SANDBOXD_TOKEN", ""),
            (
                "SANDBOXD_NODE_TOKEN_HASHES",
                mounted.path().to_str().expect("a UTF-8 path"),
            ),
            ("SANDBOXD_NODE_NAME", node.as_str()),
        ],
    );
    // The master (the harness's token, which this sandboxd is not given) and one of its pods (no kubelet runs it: its status is set
    // by hand, with the loopback address of the real sandboxd this test started).
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "sandboxd-admin-token", "labels": scope.labels()},
        "stringData": {"token": host.sandboxd.token},
    }))
    .expect("secret");
    Api::<Secret>::namespaced(scope.client.clone(), &scope.ns)
        .create(&Default::default(), &secret)
        .await
        .expect("secret");
    let app = format!("sandboxd-{}", scope.scope);
    // A pod of the DaemonSet (adopted by it), in the node's network, as the chart's are.
    let _nodes = common::TestNodes::create(
        &scope.client,
        &scope.scope,
        std::slice::from_ref(&node),
        &scope.ns,
    )
    .await;
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "sandboxd-x1", "labels": {"app": app, "ds": "sandboxd"}},
        "spec": {"nodeName": node, "hostNetwork": true, "containers": [{"name": "sandboxd", "image": "sandboxd:test"}]},
    }))
    .expect("pod");
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(scope.client.clone(), &scope.ns);
    pods.create(&Default::default(), &pod).await.expect("pod");
    let ds_uid = common::daemonset(&scope.client, &scope.ns, "sandboxd", &scope.scope).await;
    common::adopted(&scope.client, &scope.ns, "sandboxd-x1", &ds_uid).await;
    let status = serde_json::json!({"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}], "phase": "Running"}});
    pods.patch_status(
        "sandboxd-x1",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&status),
    )
    .await
    .expect("pod status");
    scope.default_runtime().await;
    let ns = scope.ns.clone();
    scope.start_operator(&[
        "--host-pod-selector",
        &format!("app={app}"),
        "--host-pod-namespace",
        &ns,
        "--host-daemonset",
        "sandboxd",
        "--host-port",
        &host.sandboxd.port.to_string(),
        "--host-token-secret",
        &format!("{ns}/sandboxd-admin-token"),
        "--node-token-hashes",
        "sandboxd-node-token-hashes",
    ]);
    // The discovered node's hash is written (the ConfigMap made, as no chart rendered it), and
    // the test plays the kubelet that copies it into the pod's volume.
    let hashes =
        common::node_token_hashes(&scope.client, &ns, "sandboxd-node-token-hashes", &node).await;
    assert_eq!(
        hashes,
        std::collections::BTreeMap::from([(
            node.clone(),
            sandboxd_api::auth::hash(&sandboxd_api::auth::node_token(&host.sandboxd.token, &node))
        )])
    );
    common::mount_config_map(mounted.path(), &hashes);
    let hosts = Api::<SandboxHost>::all(scope.client.clone());
    let host_name = format!("node-{node}");
    let ready = tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(hosts.clone(), &host_name, |h: Option<&SandboxHost>| {
            h.and_then(|h| h.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        }),
    )
    .await;
    let found = match ready {
        Ok(Ok(Some(h))) => h,
        _ => panic!(
            "no ready host for the pod: {:?}",
            hosts.get_opt(&host_name).await
        ),
    };
    assert_eq!(found.spec.endpoint, host.endpoint());
    assert_eq!(found.spec.node.as_deref(), Some(node.as_str()));
    assert_eq!(
        found
            .status
            .as_ref()
            .and_then(|s| s.version.clone())
            .as_deref(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    // Labelled with the operator's scope, so its own cleanup finds it.
    assert_eq!(found.labels().get(common::SCOPE_LABEL), Some(&scope.scope));

    scope.kubectl_apply_session("xc-disc", serde_json::json!({}));
    scope
        .wait_session("xc-disc", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    // The reconcile that wrote Running is counted when it returns, a moment after the write.
    let wants = [
        "sandbox_operator_leader 1",
        "sandbox_operator_sessions{phase=\"Running\"} 1",
        "sandbox_operator_reconciles_total{controller=\"sandboxsession\"}",
        "sandbox_operator_reconciles_total{controller=\"discovery\"}",
        "sandbox_operator_reconcile_duration_seconds_count{controller=\"sandboxhost\"}",
        "sandbox_operator_tombstones_pending 0",
    ];
    until_every(
        "the operator's metrics",
        Duration::from_secs(10),
        Duration::from_millis(200),
        async || {
            let metrics = reqwest::get(format!("{}/metrics", scope.health_url(0)))
                .await
                .expect("metrics")
                .text()
                .await
                .expect("text");
            // A counter named without its value must have counted something: every
            // controller's series are there from the start, at 0.
            let missing: Vec<&str> = wants
                .iter()
                .copied()
                .filter(|w| {
                    if w.ends_with('}') {
                        !metrics.lines().any(|l| {
                            l.strip_prefix(w)
                                .is_some_and(|v| v.trim().parse::<f64>().is_ok_and(|n| n > 0.0))
                        })
                    } else {
                        !metrics.contains(w)
                    }
                })
                .collect();
            nothing_left("missing", &missing).map_err(|e| format!("{e}, from:\n{metrics}"))
        },
    )
    .await;
    for path in ["healthz", "readyz"] {
        let resp = reqwest::get(format!("{}/{path}", scope.health_url(0)))
            .await
            .expect("health");
        assert_eq!(resp.status().as_u16(), 200, "{path}");
    }
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_labelled_pod_not_of_the_daemonset_or_not_in_the_nodes_network_becomes_no_host() {
    let mut scope = Scope::new("podtrap").await;
    let ns = scope.ns.clone();
    let app = format!("sandboxd-{}", scope.scope);
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(scope.client.clone(), &ns);
    // Whoever may create pods here can label one: on its own, in a pod network, or both.
    let suffix = scope.scope.clone();
    let node = move |n: &str| format!("{n}-{suffix}");
    let names = ["sandboxd-real", "impostor", "pod-network"];
    // Nodes for the DaemonSet's two pods (the impostor's node need not exist).
    let _nodes = common::TestNodes::create(
        &scope.client,
        &scope.scope,
        &[node(names[0]), node(names[2])],
        &ns,
    )
    .await;
    for (name, labels, host_network) in [
        (
            names[0],
            serde_json::json!({"app": app, "ds": "sandboxd"}),
            true,
        ),
        (names[1], serde_json::json!({"app": app}), true),
        (
            names[2],
            serde_json::json!({"app": app, "ds": "sandboxd"}),
            false,
        ),
    ] {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node(name), "hostNetwork": host_network,
                     "containers": [{"name": "sandboxd", "image": "sandboxd:test"}]},
        }))
        .expect("pod");
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("pod");
        let status = serde_json::json!({"status": {"podIP": "127.0.0.9", "hostIP": "127.0.0.9", "phase": "Running"}});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("pod status");
    }
    // The DaemonSet adopts the two pods its selector matches (the impostor lacks its label).
    let ds_uid = common::daemonset(&scope.client, &ns, "sandboxd", &scope.scope).await;
    for name in [names[0], names[2]] {
        common::adopted(&scope.client, &ns, name, &ds_uid).await;
    }
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "sandboxd-admin-token", "labels": scope.labels()},
        "stringData": {"token": "master-of-the-test"},
    }))
    .expect("secret");
    Api::<Secret>::namespaced(scope.client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
    scope.start_operator(&[
        "--host-pod-selector",
        &format!("app={app}"),
        "--host-pod-namespace",
        &ns,
        "--host-daemonset",
        "sandboxd",
        "--host-token-secret",
        &format!("{ns}/sandboxd-admin-token"),
    ]);

    // The DaemonSet's pod in the node's network becomes a host (not Ready: nothing serves).
    let hosts = Api::<SandboxHost>::all(scope.client.clone());
    let real = format!("node-{}", node("sandboxd-real"));
    let made = tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(hosts.clone(), &real, |h: Option<&SandboxHost>| h.is_some()),
    )
    .await;
    assert!(
        matches!(made, Ok(Ok(Some(_)))),
        "no host for the DaemonSet's pod"
    );
    // The two others: no host, a Warning event on each saying why.
    let wants = [
        (
            "impostor",
            format!(
                "pod {ns}/impostor carries the sandboxd pods' labels but is not a pod of DaemonSet {ns}/sandboxd (it has no controller): it is not made a host"
            ),
        ),
        (
            "pod-network",
            format!(
                "pod {ns}/pod-network of DaemonSet {ns}/sandboxd does not run in the node's network (spec.hostNetwork is not true), so its IP is not its node's: it is not made a host"
            ),
        ),
    ];
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(scope.client.clone(), &ns);
    until_every(
        "a NotAHost event on each pod that is not a host",
        Duration::from_secs(30),
        Duration::from_millis(300),
        async || {
            let list = events.list(&Default::default()).await.expect("events");
            let missing: Vec<&str> = wants
                .iter()
                .filter(|(pod, note)| {
                    !list.items.iter().any(|e| {
                        e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(*pod)
                            && e.reason.as_deref() == Some("NotAHost")
                            && e.type_.as_deref() == Some("Warning")
                            && e.note.as_deref() == Some(note.as_str())
                    })
                })
                .map(|(pod, _)| *pod)
                .collect();
            nothing_left("no NotAHost event on", &missing)
        },
    )
    .await;
    for pod in ["impostor", "pod-network"] {
        let name = format!("node-{}", node(pod));
        assert!(
            hosts.get_opt(&name).await.expect("get host").is_none(),
            "a host was made for pod {pod}"
        );
    }
    // No kubelet runs their nodes, so nothing would finish their graceful deletion.
    let _ = std::process::Command::new(sandboxd_tests::kubectl())
        .args([
            "delete",
            "pods",
            "--all",
            "-n",
            &ns,
            "--grace-period=0",
            "--force",
        ])
        .output();
    scope.delete().await;
}
