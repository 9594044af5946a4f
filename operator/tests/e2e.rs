//! The operator end to end: the real API server and controller-manager from `make up`, real
//! sandboxd processes on the local dockerd, the real operator binary. Lifetimes are shortened
//! through configuration, never by faking time.
//!
//! Over 600 lines: one test a scenario, sharing this file's fixtures.

mod common;

use std::time::Duration;

use common::{Host, Scope, phase, token_of, wait_gone};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use sandboxd_crds::v1alpha1::session::{Launch, SessionPhase};
use sandboxd_crds::v1alpha1::{Runtime, SandboxHost, Tombstone};
use sandboxd_tests::poll::{nothing_left, until_every};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_runs_sleeps_wakes_is_reclaimed_and_lost() {
    let mut scope = Scope::new("life").await;
    let host = Host::start(&format!("life-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    scope.start_operator(&[
        "--idle-timeout-seconds",
        "3",
        "--cpu-window-seconds",
        "1",
        "--container-ttl-seconds",
        "4",
    ]);

    scope.kubectl_apply_session("xc-life", serde_json::json!({}));
    let running = scope
        .wait_session("xc-life", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    // The claim made before the open: the finalizer and the host, in the object itself.
    assert!(
        running
            .finalizers()
            .iter()
            .any(|f| f == "sandboxd.dev/session")
    );
    assert_eq!(
        running.annotations().get("sandboxd.dev/host"),
        Some(&host.name)
    );
    let status = running.status.expect("status");
    assert_eq!(status.host.as_deref(), Some(host.name.as_str()));
    assert_eq!(status.endpoint.as_deref(), Some(host.endpoint().as_str()));
    assert!(
        status
            .briefing
            .as_deref()
            .is_some_and(|b| b.contains("/bin/sh")),
        "{:?}",
        status.briefing
    );
    let secret_name = status.credentials_secret.expect("credentials secret");
    let secret = Api::<Secret>::namespaced(scope.client.clone(), &scope.ns)
        .get(&secret_name)
        .await
        .expect("the token Secret");
    assert_eq!(
        secret
            .metadata
            .owner_references
            .as_ref()
            .map(|o| o[0].name.as_str()),
        Some("xc-life")
    );
    let life = scope.host_id("xc-life");
    assert_eq!(status.session_id.as_deref(), Some(life.as_str()));
    let session = sandboxd_api::client::Client::new(&host.endpoint(), &token_of(&secret));
    let run = session
        .run(
            &life,
            "echo hello > note.txt && cat note.txt && id -u",
            None,
            None,
            None,
        )
        .await
        .expect("run with the Secret's token");
    assert_eq!(run.stdout, "hello\n10001\n");

    // Idle past the timeout: the container stops, files stay.
    scope
        .wait_session("xc-life", "Sleeping", 60, |s| {
            phase(s) == Some(SessionPhase::Sleeping)
        })
        .await;
    assert_eq!(host.containers(), vec![(life.clone(), false)]);
    assert!(host.workspace(&life).join("note.txt").exists());
    // A workspace operation wakes it, and the operator follows.
    let again = session
        .run(&life, "cat note.txt", None, None, None)
        .await
        .expect("a run wakes it");
    assert_eq!(again.stdout, "hello\n");
    scope
        .wait_session("xc-life", "Running again", 30, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    // Idle again, then stopped past the container TTL: reclaimed, files kept.
    scope
        .wait_session("xc-life", "Reclaimed", 90, |s| {
            phase(s) == Some(SessionPhase::Reclaimed)
        })
        .await;
    assert!(host.containers().is_empty(), "{:?}", host.containers());
    assert!(host.workspace(&life).join("note.txt").exists());
    // The workspace deleted on the host: Lost, never recreated.
    std::fs::remove_dir_all(host.sandboxd.workspace_root.join(&life)).expect("delete on the host");
    let lost = scope
        .wait_session("xc-life", "Lost", 30, |s| {
            phase(s) == Some(SessionPhase::Lost)
        })
        .await;
    assert!(
        lost.status
            .and_then(|s| s.message)
            .is_some_and(|m| m.contains("vanished"))
    );
    assert!(!host.workspace(&life).exists());
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_session_destroys_it_through_a_tombstone_even_across_a_host_outage() {
    let mut scope = Scope::new("tomb").await;
    let mut host = Host::start(&format!("tomb-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    scope.start_operator(&[]);
    let sessions = scope.sessions();
    let tombstones = Api::<Tombstone>::all(scope.client.clone());

    // A plain delete: tombstone, destroy, tombstone gone.
    scope.kubectl_apply_session("xc-one", serde_json::json!({}));
    let s = scope
        .wait_session("xc-one", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let uid = s.metadata.uid.clone().expect("uid");
    sessions
        .delete("xc-one", &DeleteParams::default())
        .await
        .expect("delete");
    wait_gone(sessions.clone(), "xc-one", 30).await;
    wait_gone(tombstones.clone(), &format!("sbx-{uid}"), 30).await;
    assert!(host.containers().is_empty());
    assert!(
        !host
            .sandboxd
            .workspace_root
            .join(scope.host_id("xc-one"))
            .exists()
    );

    // With the host down: the tombstone stays and backs off, and completes when it returns.
    scope.kubectl_apply_session("xc-two", serde_json::json!({}));
    let s = scope
        .wait_session("xc-two", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let tomb = format!("sbx-{}", s.metadata.uid.clone().expect("uid"));
    host.kill9();
    sessions
        .delete("xc-two", &DeleteParams::default())
        .await
        .expect("delete");
    wait_gone(sessions.clone(), "xc-two", 30).await;
    let backing_off = tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(tombstones.clone(), &tomb, |t: Option<&Tombstone>| {
            t.and_then(|t| t.status.as_ref()).is_some_and(|st| {
                st.attempts >= 3 && st.last_error.is_some() && st.next_attempt_at.is_some()
            })
        }),
    )
    .await;
    assert!(
        matches!(backing_off, Ok(Ok(Some(_)))),
        "the tombstone did not back off: {:?}",
        tombstones.get_opt(&tomb).await
    );
    assert_eq!(
        host.containers().len(),
        1,
        "the container waits for its destroy"
    );
    host.spawn();
    wait_gone(tombstones.clone(), &tomb, 30).await;
    assert!(host.containers().is_empty());
    assert!(
        !host
            .sandboxd
            .workspace_root
            .join(scope.host_id("xc-two"))
            .exists()
    );
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_spread_pins_hold_and_mismatched_hosts_get_none() {
    let mut scope = Scope::new("place").await;
    let a = Host::start(
        &format!("a-{}", scope.scope),
        &[("SANDBOXD_MAX_SESSIONS_PER_TENANT", "3")],
    );
    let b = Host::start(
        &format!("b-{}", scope.scope),
        &[("SANDBOXD_MAX_SESSIONS_PER_TENANT", "3")],
    );
    scope.register(&a).await;
    scope.register(&b).await;
    // A stand-in of an older sandboxd: its index lacks the routes the operator needs.
    let old = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let old_addr = old.local_addr().expect("addr");
    tokio::spawn(async move {
        let app = axum::Router::new().route(
            "/",
            axum::routing::get(|| async { axum::Json(serde_json::json!({"service": "sandboxd", "version": "0.0.9", "routes": ["GET /", "POST /v1/sessions"]})) }),
        );
        let _ = axum::serve(old, app).await;
    });
    let old_name = format!("old-{}", scope.scope);
    scope
        .register_endpoint(
            &old_name,
            &format!("http://{old_addr}"),
            &format!("{}-admin", a.name),
        )
        .await;
    scope.default_runtime().await;
    scope.start_operator(&[]);

    let hosts = Api::<SandboxHost>::all(scope.client.clone());
    let mismatch = tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(hosts.clone(), &old_name, |h: Option<&SandboxHost>| {
            h.and_then(|h| h.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "VersionMismatch" && c.status == "True")
            })
        }),
    )
    .await;
    let old_host = match mismatch {
        Ok(Ok(Some(h))) => h,
        _ => panic!(
            "the old host was not marked VersionMismatch: {:?}",
            hosts.get_opt(&old_name).await
        ),
    };
    let message = old_host
        .status
        .expect("status")
        .conditions
        .into_iter()
        .find(|c| c.type_ == "VersionMismatch")
        .expect("condition")
        .message;
    assert!(message.starts_with("The sandbox service does not serve GET /v1/sessions, GET /v1/sessions/{id}, DELETE /v1/sessions/{id}"), "{message}");
    assert!(message.ends_with(&format!("- its version does not match this platform (expected {v}). Run sandboxd:{v} and redeploy it", v = env!("CARGO_PKG_VERSION"))), "{message}");

    for i in 0..4 {
        scope.kubectl_apply_session(
            &format!("xc-spread-{i}"),
            serde_json::json!({"tenant": format!("org-{i}")}),
        );
    }
    let mut placed = Vec::new();
    for i in 0..4 {
        let s = scope
            .wait_session(&format!("xc-spread-{i}"), "Running", 90, |s| {
                phase(s) == Some(SessionPhase::Running)
            })
            .await;
        placed.push(s.status.and_then(|st| st.host).expect("a host"));
    }
    assert!(placed.iter().all(|h| *h != old_name), "{placed:?}");
    assert!(
        placed.contains(&a.name) && placed.contains(&b.name),
        "sessions did not spread: {placed:?}"
    );
    scope.kubectl_apply_session(
        "xc-pinned",
        serde_json::json!({"host": b.name, "tenant": "org-p"}),
    );
    let pinned = scope
        .wait_session("xc-pinned", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    assert_eq!(pinned.status.and_then(|s| s.host), Some(b.name.clone()));

    // Tenant cap: the host's refusal becomes a condition carrying its words.
    for i in 0..4 {
        scope.kubectl_apply_session(
            &format!("xc-cap-{i}"),
            serde_json::json!({"host": a.name, "tenant": "org-cap"}),
        );
    }
    let mut refused = None;
    for i in 0..4 {
        let name = format!("xc-cap-{i}");
        let s = scope
            .wait_session(&name, "Running or refused", 90, |s| {
                phase(s) == Some(SessionPhase::Running)
                    || s.status.as_ref().is_some_and(|st| {
                        st.conditions
                            .iter()
                            .any(|c| c.type_ == "Admitted" && c.status == "False")
                    })
            })
            .await;
        if phase(&s) != Some(SessionPhase::Running) {
            refused = Some(s);
        }
    }
    let refused = refused.expect("one of four sessions of a tenant capped at 3 is refused");
    let cond = refused
        .status
        .expect("status")
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Admitted")
        .expect("Admitted");
    assert_eq!(cond.reason, "TenantCap");
    assert_eq!(
        cond.message,
        "Tenant 'org-cap' already holds 3 of 3 sessions. Release an idle session before opening another."
    );
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_acts_and_another_takes_over_when_it_dies() {
    let mut scope = Scope::new("lead").await;
    let host = Host::start(&format!("lead-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    let first = scope.start_operator(&[]);
    let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        scope.client.clone(),
        &scope.ns,
    );
    let lease_name = format!("op-{}", scope.scope);
    let held_by = |who: String| {
        let leases = leases.clone();
        let lease_name = lease_name.clone();
        async move {
            let wanted = who.clone();
            let ok = tokio::time::timeout(
                Duration::from_secs(30),
                await_condition(
                    leases,
                    &lease_name,
                    move |l: Option<&k8s_openapi::api::coordination::v1::Lease>| {
                        l.and_then(|l| l.spec.as_ref())
                            .and_then(|s| s.holder_identity.as_deref())
                            == Some(wanted.as_str())
                    },
                ),
            )
            .await;
            assert!(
                matches!(ok, Ok(Ok(Some(_)))),
                "the lease was not taken by {who}"
            );
        }
    };
    held_by(format!("op-{}-0", scope.scope)).await;
    let second = scope.start_operator(&[]);
    scope.kubectl_apply_session("xc-lead-1", serde_json::json!({}));
    let s = scope
        .wait_session("xc-lead-1", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    // Only the leader wrote: every status field manager is the operator's, and the follower
    // still waits for the lease.
    assert!(
        s.metadata
            .managed_fields
            .unwrap_or_default()
            .iter()
            .any(|m| m.manager.as_deref() == Some("sandbox-operator/sandboxsession"))
    );
    let lease = leases.get(&lease_name).await.expect("lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity),
        Some(format!("op-{}-0", scope.scope))
    );
    let _ = second;
    scope.kill9_operator(first);
    held_by(format!("op-{}-1", scope.scope)).await;
    scope.kubectl_apply_session("xc-lead-2", serde_json::json!({}));
    scope
        .wait_session("xc-lead-2", "Running under the new leader", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let containers = host.containers();
    assert_eq!(
        containers.len(),
        2,
        "no duplicate container: {containers:?}"
    );
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_namespace_destroys_every_container() {
    let mut scope = Scope::new("nsdel").await;
    let host = Host::start(&format!("ns-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    scope.start_operator(&[]);
    // Sessions live in a namespace of their own, deleted whole.
    let victims = sandboxd_tests::TestNamespace::create(&scope.client, "victims").await;
    let api = Api::<sandboxd_crds::v1alpha1::SandboxSession>::namespaced(
        scope.client.clone(),
        &victims.name,
    );
    for i in 0..3 {
        let s: sandboxd_crds::v1alpha1::SandboxSession = serde_json::from_value(serde_json::json!({
            "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession",
            "metadata": {"name": format!("xc-ns-{i}"), "labels": scope.labels()},
            "spec": {"scope": "agent", "tenant": format!("org-{i}"), "subject": format!("a-{i}")},
        }))
        .expect("session");
        api.create(&Default::default(), &s).await.expect("create");
    }
    for i in 0..3 {
        let name = format!("xc-ns-{i}");
        let ok = tokio::time::timeout(
            Duration::from_secs(90),
            await_condition(
                api.clone(),
                &name,
                |s: Option<&sandboxd_crds::v1alpha1::SandboxSession>| {
                    s.is_some_and(|s| phase(s) == Some(SessionPhase::Running))
                },
            ),
        )
        .await;
        assert!(matches!(ok, Ok(Ok(Some(_)))), "{name} never ran");
    }
    assert_eq!(host.containers().len(), 3);
    let ns_name = victims.name.clone();
    victims.delete().await;
    wait_gone(
        Api::<k8s_openapi::api::core::v1::Namespace>::all(scope.client.clone()),
        &ns_name,
        120,
    )
    .await;
    until_every(
        "no container left",
        Duration::from_secs(60),
        Duration::from_millis(500),
        async || nothing_left("containers left", &host.containers()),
    )
    .await;
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_operator_mid_open_and_mid_delete_leaks_and_duplicates_nothing() {
    let mut scope = Scope::new("crash").await;
    let host = Host::start(&format!("crash-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    let first = scope.start_operator(&[]);
    for i in 0..3 {
        scope.kubectl_apply_session(
            &format!("xc-crash-{i}"),
            serde_json::json!({"tenant": format!("org-{i}")}),
        );
    }
    // Kill it the moment the first container exists on the host: the other opens are in flight.
    until_every(
        "a container on the host",
        Duration::from_secs(60),
        Duration::from_millis(20),
        async || (!host.containers().is_empty()).then_some(()),
    )
    .await;
    scope.kill9_operator(first);
    scope.start_operator(&[]);
    for i in 0..3 {
        scope
            .wait_session(
                &format!("xc-crash-{i}"),
                "Running after the restart",
                90,
                |s| phase(s) == Some(SessionPhase::Running),
            )
            .await;
    }
    let mut sessions: Vec<String> = host.containers().into_iter().map(|(s, _)| s).collect();
    sessions.sort();
    assert_eq!(
        sessions,
        (0..3)
            .map(|i| scope.host_id(&format!("xc-crash-{i}")))
            .collect::<Vec<_>>(),
        "one container per session, none duplicated"
    );
    // Each Secret's token works (a token lost in the crash was replaced).
    for i in 0..3 {
        let name = format!("xc-crash-{i}");
        let secret = Api::<Secret>::namespaced(scope.client.clone(), &scope.ns)
            .get(&format!("{name}-token"))
            .await
            .expect("secret");
        let run = sandboxd_api::client::Client::new(&host.endpoint(), &token_of(&secret))
            .run(&scope.host_id(&name), "echo ok", None, None, None)
            .await
            .expect("run");
        assert_eq!(run.stdout, "ok\n");
    }

    // Mid-delete: delete all three and kill the operator at once; the next one finishes.
    let api = scope.sessions();
    for i in 0..3 {
        api.delete(&format!("xc-crash-{i}"), &DeleteParams::default())
            .await
            .expect("delete");
    }
    scope.kill9_operator(1);
    scope.start_operator(&[]);
    for i in 0..3 {
        wait_gone(api.clone(), &format!("xc-crash-{i}"), 60).await;
    }
    let tombstones = Api::<Tombstone>::all(scope.client.clone());
    let labels = format!("{}={}", common::SCOPE_LABEL, scope.scope);
    until_every(
        "no tombstone and no container left",
        Duration::from_secs(60),
        Duration::from_millis(20),
        async || {
            let left = tombstones
                .list(&kube::api::ListParams::default().labels(&labels))
                .await
                .expect("list");
            let containers = host.containers();
            if left.items.is_empty() && containers.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "left behind: {} tombstones, containers {containers:?}",
                    left.items.len()
                ))
            }
        },
    )
    .await;
    scope.delete().await;
}

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
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "sandboxd-x1", "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "sandboxd", "image": "sandboxd:test"}]},
    }))
    .expect("pod");
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(scope.client.clone(), &scope.ns);
    pods.create(&Default::default(), &pod).await.expect("pod");
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
            let missing: Vec<&str> = wants
                .iter()
                .copied()
                .filter(|w| !metrics.contains(w))
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
async fn runtimes_reach_every_host_and_two_defaults_are_a_condition_on_both() {
    let mut scope = Scope::new("rt").await;
    let host = Host::start(&format!("rt-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    let second: sandboxd_crds::v1alpha1::Runtime = serde_json::from_value(serde_json::json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": format!("second-{}", scope.scope), "labels": scope.labels()},
        "spec": {"description": "another", "image": common::base_image(), "default": true},
    }))
    .expect("runtime");
    let runtimes = Api::<sandboxd_crds::v1alpha1::Runtime>::all(scope.client.clone());
    runtimes
        .create(&Default::default(), &second)
        .await
        .expect("second runtime");
    scope.start_operator(&[]);
    for name in [
        format!("base-{}", scope.scope),
        format!("second-{}", scope.scope),
    ] {
        let host_name = host.name.clone();
        let settled = tokio::time::timeout(
            Duration::from_secs(60),
            await_condition(
                runtimes.clone(),
                &name,
                move |r: Option<&sandboxd_crds::v1alpha1::Runtime>| {
                    r.and_then(|r| r.status.as_ref()).is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|c| c.type_ == "DefaultConflict" && c.status == "True")
                            && s.conditions
                                .iter()
                                .any(|c| c.type_ == "Ready" && c.status == "True")
                            && s.hosts
                                .iter()
                                .any(|h| h.host == host_name && h.image_tag.is_some())
                    })
                },
            ),
        )
        .await;
        let rt = match settled {
            Ok(Ok(Some(rt))) => rt,
            _ => panic!(
                "{name} did not settle: {:?}",
                runtimes
                    .get_opt(&name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|r| r.status)
            ),
        };
        let conflict = rt
            .status
            .expect("status")
            .conditions
            .into_iter()
            .find(|c| c.type_ == "DefaultConflict")
            .expect("condition");
        assert_eq!(
            conflict.message,
            format!(
                "more than one Runtime is marked default (base-{s}, second-{s}); mark exactly one",
                s = scope.scope
            )
        );
    }
    // The host was handed the whole list, the default first.
    let listed = host.client().runtimes().await.expect("the host's runtimes");
    let aliases: Vec<String> = listed.runtimes.into_iter().map(|r| r.alias).collect();
    assert_eq!(
        aliases,
        [
            format!("base-{}", scope.scope),
            format!("second-{}", scope.scope)
        ]
    );
    scope.delete().await;
}

/// Waits (watching, with a deadline) until the session `name` in `api` satisfies `cond`.
async fn wait_in(
    api: &Api<sandboxd_crds::v1alpha1::SandboxSession>,
    name: &str,
    what: &str,
    cond: impl Fn(&sandboxd_crds::v1alpha1::SandboxSession) -> bool + Send + 'static,
) -> sandboxd_crds::v1alpha1::SandboxSession {
    let found = tokio::time::timeout(
        Duration::from_secs(90),
        await_condition(
            api.clone(),
            name,
            move |s: Option<&sandboxd_crds::v1alpha1::SandboxSession>| s.is_some_and(&cond),
        ),
    )
    .await;
    match found {
        Ok(Ok(Some(s))) => s,
        _ => panic!(
            "session {name} did not become {what} within 90 s; it is {:#?}",
            api.get_opt(name).await.ok().flatten().map(|s| s.status)
        ),
    }
}

/// The session's id on its host and the token in its Secret.
async fn credentials(
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_namespace_can_neither_take_over_nor_destroy_a_sandbox_of_the_same_name() {
    let mut scope = Scope::new("victim").await;
    let host = Host::start(&format!("tenancy-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    scope.start_operator(&[]);

    // The victim's session, with a file in it.
    scope.kubectl_apply_session("demo-session", serde_json::json!({}));
    let victim = scope
        .wait_session("demo-session", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let (victim_id, victim_token) = credentials(&scope.client, &victim).await;
    assert_eq!(victim_id, scope.host_id("demo-session"));
    let victim_client = sandboxd_api::client::Client::new(&host.endpoint(), &victim_token);
    victim_client
        .write(&victim_id, "notes/hello.txt", "the victim's notes")
        .await
        .expect("the victim writes");

    // Attack 1: the same name and tenant (and subject) in another namespace.
    let attacker_ns = sandboxd_tests::TestNamespace::create(&scope.client, "attacker").await;
    let attacker_api = Api::<sandboxd_crds::v1alpha1::SandboxSession>::namespaced(
        scope.client.clone(),
        &attacker_ns.name,
    );
    let twin: sandboxd_crds::v1alpha1::SandboxSession = serde_json::from_value(serde_json::json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession",
        "metadata": {"name": "demo-session", "labels": scope.labels()},
        "spec": {"scope": "conversation", "tenant": "org-1", "subject": "demo-session"},
    }))
    .expect("session");
    attacker_api
        .create(&Default::default(), &twin)
        .await
        .expect("the attacker's create");
    let attacker = wait_in(&attacker_api, "demo-session", "Running", |s| {
        phase(s) == Some(SessionPhase::Running)
    })
    .await;
    let (attacker_id, attacker_token) = credentials(&scope.client, &attacker).await;
    // A sandbox of its own, not the victim's.
    assert_eq!(
        attacker_id,
        sandboxd_crds::key::host_session_id(&attacker_ns.name, "demo-session")
    );
    assert_ne!(attacker_id, victim_id);
    let attacker_client = sandboxd_api::client::Client::new(&host.endpoint(), &attacker_token);
    match attacker_client
        .read(&attacker_id, "notes/hello.txt", 0, None)
        .await
    {
        Err(sandboxd_api::client::ClientError::Api { status: 404, .. }) => {}
        other => panic!("the attacker's own workspace must be empty, got {other:?}"),
    }
    let stolen = attacker_client
        .read(&victim_id, "notes/hello.txt", 0, None)
        .await;
    assert!(
        stolen.is_err(),
        "the attacker's token read the victim's file"
    );
    // The victim's own token still works.
    assert_eq!(
        victim_client
            .read(&victim_id, "notes/hello.txt", 0, None)
            .await
            .expect("the victim still reads its file with its own token"),
        b"the victim's notes"
    );
    let mut ids: Vec<String> = host.containers().into_iter().map(|(s, _)| s).collect();
    ids.sort();
    let mut want = vec![attacker_id.clone(), victim_id.clone()];
    want.sort();
    assert_eq!(ids, want, "two sandboxes, one per object");

    // Attack 2: deleting the attacker's object destroys its sandbox only.
    let attacker_uid = attacker.metadata.uid.clone().expect("uid");
    attacker_api
        .delete("demo-session", &DeleteParams::default())
        .await
        .expect("delete");
    wait_gone(attacker_api.clone(), "demo-session", 30).await;
    let tombstones = Api::<Tombstone>::all(scope.client.clone());
    wait_gone(tombstones.clone(), &format!("sbx-{attacker_uid}"), 30).await;
    assert_eq!(host.containers(), vec![(victim_id.clone(), true)]);
    assert!(host.workspace(&victim_id).join("notes/hello.txt").exists());
    assert!(!host.sandboxd.workspace_root.join(&attacker_id).exists());
    assert_eq!(
        victim_client
            .read(&victim_id, "notes/hello.txt", 0, None)
            .await
            .expect("the victim still reads its file after the attacker's delete"),
        b"the victim's notes"
    );
    let still = scope.sessions().get("demo-session").await.expect("victim");
    assert_eq!(phase(&still), Some(SessionPhase::Running));
    attacker_ns.delete().await;
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_deleted_and_recreated_under_its_name_ends_alive() {
    let mut scope = Scope::new("again").await;
    let host = Host::start(&format!("again-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    scope.start_operator(&[]);
    let sessions = scope.sessions();
    let tombstones = Api::<Tombstone>::all(scope.client.clone());

    scope.kubectl_apply_session("xc-again", serde_json::json!({}));
    let old = scope
        .wait_session("xc-again", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let old_uid = old.metadata.uid.clone().expect("uid");
    let (id, old_token) = credentials(&scope.client, &old).await;
    sandboxd_api::client::Client::new(&host.endpoint(), &old_token)
        .write(&id, "old.txt", "from the deleted object")
        .await
        .expect("write");

    // Delete and at once recreate under the same name: one id on the host, two objects.
    sessions
        .delete("xc-again", &DeleteParams::default())
        .await
        .expect("delete");
    wait_gone(sessions.clone(), "xc-again", 30).await;
    scope.kubectl_apply_session("xc-again", serde_json::json!({}));
    let new = scope
        .wait_session("xc-again", "Running as the new object", 90, move |s| {
            s.metadata.uid.as_deref() != Some(old_uid.as_str())
                && phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let old_uid = old.metadata.uid.clone().expect("uid");
    wait_gone(tombstones.clone(), &format!("sbx-{old_uid}"), 60).await;
    let (new_id, new_token) = credentials(&scope.client, &new).await;
    assert_eq!(new_id, id);
    let fresh = sandboxd_api::client::Client::new(&host.endpoint(), &new_token);
    fresh
        .write(&id, "new.txt", "from the new object")
        .await
        .expect("the new object writes");
    assert!(
        fresh.read(&id, "old.txt", 0, None).await.is_err(),
        "the new object got the deleted one's workspace"
    );

    // A Tombstone of the deleted object arriving late (its destroy retried after the new
    // object opened): done, and the new sandbox is left alone.
    let late = Tombstone {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("sbx-{old_uid}")),
            labels: Some(scope.labels()),
            ..Default::default()
        },
        spec: sandboxd_crds::v1alpha1::TombstoneSpec {
            host: host.name.clone(),
            session_id: id.clone(),
            tenant: "org-1".to_owned(),
            source: sandboxd_crds::v1alpha1::tombstone::TombstoneSource {
                namespace: scope.ns.clone(),
                name: "xc-again".to_owned(),
                uid: old_uid.clone(),
            },
        },
        status: None,
    };
    tombstones
        .create(&Default::default(), &late)
        .await
        .expect("the late tombstone");
    wait_gone(tombstones.clone(), &format!("sbx-{old_uid}"), 30).await;
    assert_eq!(
        fresh
            .read(&id, "new.txt", 0, None)
            .await
            .expect("the new sandbox survives the old tombstone"),
        b"from the new object"
    );
    assert_eq!(host.containers(), vec![(id.clone(), true)]);
    let now = sessions.get("xc-again").await.expect("the new object");
    assert_eq!(phase(&now), Some(SessionPhase::Running));
    scope.delete().await;
}

/// The Ready condition of host `name` once it satisfies `cond`, watched with a deadline.
async fn wait_host_ready_condition(
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_admin_token_is_in_another_namespace_is_refused_unread() {
    let mut scope = Scope::new("foreign").await;
    let host = Host::start(&format!("foreign-host-{}", scope.scope), &[]);
    // The host's real admin token, in a namespace other than the operator's: were it read, the
    // host would answer and become Ready.
    let other = sandboxd_tests::TestNamespace::create(&scope.client, "foreign-secret").await;
    let labels = scope.labels();
    let secret = |name: &str| -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels},
            "stringData": {"token": host.sandboxd.token},
        }))
        .expect("secret")
    };
    Api::<Secret>::namespaced(scope.client.clone(), &other.name)
        .create(&PostParams::default(), &secret("stolen-admin"))
        .await
        .expect("the Secret in the other namespace");
    let sbh: SandboxHost = serde_json::from_value(serde_json::json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxHost",
        "metadata": {"name": host.name, "labels": scope.labels()},
        "spec": {"endpoint": host.endpoint(), "adminTokenSecret": {"namespace": other.name, "name": "stolen-admin", "key": "token"}},
    }))
    .expect("host");
    let hosts = Api::<SandboxHost>::all(scope.client.clone());
    hosts
        .create(&PostParams::default(), &sbh)
        .await
        .expect("host created");
    scope.default_runtime().await;
    scope.start_operator(&[]);

    let refused =
        wait_host_ready_condition(&hosts, &host.name, 30, |c| c.reason == "TokenSecretRefused")
            .await;
    assert_eq!(refused.status, "False");
    assert_eq!(
        refused.message,
        format!(
            "the admin-token Secret {}/stolen-admin is not read: it must live in the operator's namespace {}, the only namespace the operator reads Secrets in",
            other.name, scope.ns
        )
    );

    // No session is placed on it, chosen or pinned.
    scope.kubectl_apply_session("xc-foreign", serde_json::json!({}));
    scope.kubectl_apply_session("xc-foreign-pin", serde_json::json!({"host": host.name}));
    let placed_condition = |s: &sandboxd_crds::v1alpha1::SandboxSession| {
        s.status
            .as_ref()
            .and_then(|st| st.conditions.iter().find(|c| c.type_ == "Placed"))
            .map(|c| (c.status.clone(), c.message.clone()))
    };
    let free = scope
        .wait_session("xc-foreign", "refused a host", 30, |s| {
            placed_condition(s).is_some()
        })
        .await;
    assert_eq!(
        placed_condition(&free),
        Some((
            "False".to_owned(),
            format!(
                "no host can take the session: {}: it is not ready",
                host.name
            )
        ))
    );
    let pinned = scope
        .wait_session("xc-foreign-pin", "refused its pinned host", 30, |s| {
            placed_condition(s).is_some()
        })
        .await;
    assert_eq!(
        placed_condition(&pinned),
        Some((
            "False".to_owned(),
            format!(
                "the pinned host '{}' cannot take sessions now: it is not ready",
                host.name
            )
        ))
    );
    for s in [&free, &pinned] {
        assert_eq!(phase(s), Some(SessionPhase::Pending));
        assert_eq!(s.annotations().get("sandboxd.dev/host"), None);
        assert_eq!(s.status.as_ref().and_then(|st| st.host.clone()), None);
    }
    assert!(
        host.client()
            .list()
            .await
            .expect("the host's sessions")
            .is_empty(),
        "nothing was opened on the refused host"
    );
    assert!(host.containers().is_empty(), "{:?}", host.containers());

    // The same token in the operator's namespace: the host is taken, and the session runs.
    Api::<Secret>::namespaced(scope.client.clone(), &scope.ns)
        .create(&PostParams::default(), &secret("admin"))
        .await
        .expect("the Secret in the operator's namespace");
    hosts
        .patch(
            &host.name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"adminTokenSecret": {"namespace": scope.ns, "name": "admin"}}})),
        )
        .await
        .expect("host moved to the operator's namespace");
    let ready = wait_host_ready_condition(&hosts, &host.name, 30, |c| c.status == "True").await;
    assert_eq!(ready.reason, "Ready");
    let running = scope
        .wait_session("xc-foreign", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    assert_eq!(running.status.and_then(|s| s.host), Some(host.name.clone()));
    other.delete().await;
    scope.delete().await;
}

/// What a person sees of `status.sleepsAt`: absent unless the session runs, and then a valid
/// RFC 3339 time (never empty, never unparsable); `kubectl get -o wide` never shows
/// `<invalid>`. Read from the raw object, so a value the typed client could not even parse
/// fails here with what it was.
async fn assert_sleeps_at_shown(scope: &Scope, name: &str) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_session_waits_for_the_pending_tombstone_of_the_deleted_one() {
    let mut scope = Scope::new("owed").await;
    let mut host = Host::start(&format!("owed-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    // Destroys retried every 15 s: once the host is back, the old sandbox stays owed long
    // enough for the new object to be seen waiting for it.
    scope.start_operator(&[
        "--tombstone-backoff-seconds",
        "15",
        "--tombstone-backoff-cap-seconds",
        "15",
    ]);
    let sessions = scope.sessions();
    let tombstones = Api::<Tombstone>::all(scope.client.clone());

    scope.kubectl_apply_session("xc-owed", serde_json::json!({}));
    let old = scope
        .wait_session("xc-owed", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    assert_sleeps_at_shown(&scope, "xc-owed").await;
    let old_uid = old.metadata.uid.clone().expect("uid");
    let (id, old_token) = credentials(&scope.client, &old).await;
    sandboxd_api::client::Client::new(&host.endpoint(), &old_token)
        .write(&id, "old.txt", "from the deleted object")
        .await
        .expect("write");
    let old_containers = host.container_ids(&id);
    assert_eq!(old_containers.len(), 1, "{old_containers:?}");

    // Deleted while its host is down: the Tombstone cannot destroy and stays.
    host.kill9();
    sessions
        .delete("xc-owed", &DeleteParams::default())
        .await
        .expect("delete");
    wait_gone(sessions.clone(), "xc-owed", 30).await;
    let tomb = format!("sbx-{old_uid}");
    let failed = tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(tombstones.clone(), &tomb, |t: Option<&Tombstone>| {
            t.and_then(|t| t.status.as_ref())
                .is_some_and(|st| st.attempts >= 1)
        }),
    )
    .await;
    assert!(
        matches!(failed, Ok(Ok(Some(_)))),
        "the tombstone never tried: {:?}",
        tombstones.get_opt(&tomb).await
    );

    // The same name again, and the host back: the new object waits for the old destroy.
    scope.kubectl_apply_session("xc-owed", serde_json::json!({}));
    host.spawn();
    let waiting_uid = old_uid.clone();
    let waiting = scope
        .wait_session("xc-owed", "waiting for the tombstone", 30, move |s| {
            s.metadata.uid.as_deref() != Some(waiting_uid.as_str())
                && phase(s) == Some(SessionPhase::Pending)
                && s.status.as_ref().is_some_and(|st| {
                    st.conditions.iter().any(|c| {
                        c.type_ == "Admitted"
                            && c.status == "False"
                            && c.reason == "WaitingForTombstone"
                    })
                })
        })
        .await;
    assert_sleeps_at_shown(&scope, "xc-owed").await;
    let status = waiting.status.expect("status");
    let message = status.message.expect("a message");
    let prefix = format!(
        "waiting for Tombstone {tomb}: the sandbox '{id}' of the deleted SandboxSession {ns}/xc-owed is still to be destroyed on host {host} (attempt ",
        ns = scope.ns,
        host = host.name
    );
    assert!(message.starts_with(&prefix), "{message}");
    assert!(
        message.ends_with("; this session opens once it is, so it never gets the old workspace"),
        "{message}"
    );
    let cond = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Admitted")
        .expect("Admitted");
    assert_eq!(cond.message, message);
    // Nothing was opened for it meanwhile: the old container is the only one.
    assert_eq!(host.container_ids(&id), old_containers);

    // The Tombstone done, the new object opens: a new sandbox, the old one destroyed.
    wait_gone(tombstones.clone(), &tomb, 60).await;
    let new_uid = waiting.metadata.uid.clone().expect("uid");
    let new = scope
        .wait_session("xc-owed", "Running as the new object", 30, move |s| {
            s.metadata.uid.as_deref() == Some(new_uid.as_str())
                && phase(s) == Some(SessionPhase::Running)
        })
        .await;
    assert_sleeps_at_shown(&scope, "xc-owed").await;
    let (new_id, new_token) = credentials(&scope.client, &new).await;
    assert_eq!(new_id, id);
    let fresh = sandboxd_api::client::Client::new(&host.endpoint(), &new_token);
    let run = fresh
        .run(
            &id,
            "ls -A; echo new > new.txt; cat new.txt",
            None,
            None,
            None,
        )
        .await
        .expect("exec in the new sandbox");
    assert_eq!(run.stdout, "new\n", "the workspace was not empty");
    assert!(!host.workspace(&id).join("old.txt").exists());
    let now = host.container_ids(&id);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now, old_containers, "the old container was not destroyed");
    assert_eq!(host.containers(), vec![(id.clone(), true)]);
    scope.delete().await;
}

/// The look for a Tombstone is made in the operator's cache, which may lag one written a moment
/// before. What then keeps a new object from a deleted one's sandbox is its host: the id is held
/// for another owner (the deleted object's uid), so the open is refused and the session waits,
/// saying why, until that sandbox is gone; then it opens on an empty workspace. The deleted
/// object is played here by a sandbox opened on the host for another owner, with no Tombstone
/// anywhere: exactly what the operator meets when its cache has not yet seen the Tombstone.
/// A session told it waits for a sandbox its host holds for another object or tenant: its
/// message starts with `said`, and nothing of that sandbox (its id, a token) was handed to it.
fn assert_waits_for_another_owner(waiting: &sandboxd_crds::v1alpha1::SandboxSession, said: &str) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_id_its_host_holds_for_another_owner_waits_and_never_gets_that_workspace() {
    let mut scope = Scope::new("ownerwait").await;
    let host = Host::start(&format!("ow-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    scope.start_operator(&[]);
    let id = sandboxd_crds::key::host_session_id(&scope.ns, "xc-held");
    let admin = host.client();
    let held = admin
        .open_as(&id, "org-1", Some("uid-of-a-deleted-object"), None, None)
        .await
        .expect("the host opens the other owner's session");
    let other = sandboxd_api::client::Client::new(
        &host.endpoint(),
        &held.token.expect("the other owner's token"),
    );
    other
        .write(&id, "old.txt", "the other owner's")
        .await
        .expect("write");

    scope.kubectl_apply_session("xc-held", serde_json::json!({}));
    let waiting = scope
        .wait_session(
            "xc-held",
            "waiting for the other owner's sandbox",
            60,
            |s| {
                phase(s) == Some(SessionPhase::Pending)
                    && s.status.as_ref().is_some_and(|st| {
                        st.conditions.iter().any(|c| {
                            c.type_ == "Admitted"
                                && c.status == "False"
                                && c.reason == "OwnerConflict"
                        })
                    })
            },
        )
        .await;
    assert_waits_for_another_owner(
        &waiting,
        &format!(
            "host {} holds session '{id}' for another SandboxSession (one deleted whose destroy is still owed); waiting for it to be destroyed: ",
            host.name
        ),
    );
    let old_containers = host.container_ids(&id);
    assert_eq!(old_containers.len(), 1, "{old_containers:?}");

    // The other owner's destroy done, the session opens on an empty workspace.
    assert!(
        admin
            .destroy_as(&id, Some("uid-of-a-deleted-object"))
            .await
            .expect("destroy")
            .destroyed
    );
    let new = scope
        .wait_session("xc-held", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let (new_id, token) = credentials(&scope.client, &new).await;
    assert_eq!(new_id, id);
    let run = sandboxd_api::client::Client::new(&host.endpoint(), &token)
        .run(&id, "ls -A", None, None, None)
        .await
        .expect("exec");
    assert_eq!(run.stdout, "", "the workspace was not empty");
    assert_ne!(host.container_ids(&id), old_containers);
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_the_host_refuses_says_why_and_opens_once_the_cause_is_gone() {
    let mut scope = Scope::new("refused").await;
    let host = Host::start(&format!("ref-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    scope.start_operator(&[]);
    let admitted = |s: &sandboxd_crds::v1alpha1::SandboxSession| {
        s.status
            .as_ref()
            .and_then(|st| st.conditions.iter().find(|c| c.type_ == "Admitted"))
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };

    // More CPUs than the host's ceiling: no retry can help, so the session fails with the
    // host's words, and opens once its spec asks for what the host allows.
    scope.kubectl_apply_session(
        "xc-greedy",
        serde_json::json!({"resources": {"milliCpus": 64000}}),
    );
    let failed = scope
        .wait_session("xc-greedy", "Failed with the host's refusal", 30, |s| {
            phase(s) == Some(SessionPhase::Failed)
        })
        .await;
    let message = failed
        .status
        .as_ref()
        .and_then(|st| st.message.clone())
        .expect("a message");
    assert!(
        message.starts_with(&format!(
            "host {} refused spec.resources (milliCpus 64000): limits.cpus must be above 0 and at most ",
            host.name
        )) && message.ends_with("; change spec.resources and the session opens"),
        "{message}"
    );
    let (status, reason, said) = admitted(&failed).expect("an Admitted condition");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "Refused"));
    assert_eq!(said, message);
    assert!(
        host.container_ids(&scope.host_id("xc-greedy")).is_empty(),
        "nothing was started for a refused open"
    );
    scope.kubectl_apply_session(
        "xc-greedy",
        serde_json::json!({"resources": {"milliCpus": 500}}),
    );
    let running = scope
        .wait_session("xc-greedy", "Running with what the host allows", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    assert_eq!(
        admitted(&running).map(|(s, r, _)| (s, r)),
        Some(("True".to_owned(), "Opened".to_owned()))
    );

    // Its id held on the host by another tenant's session (opened there directly): the
    // session waits with reason NameTaken, gets nothing of it, and opens once it is gone.
    let id = sandboxd_crds::key::host_session_id(&scope.ns, "xc-taken");
    let admin = host.client();
    admin
        .open_as(
            &id,
            "org-2",
            Some("uid-of-another-tenants-object"),
            None,
            None,
        )
        .await
        .expect("the host opens the other tenant's session");
    scope.kubectl_apply_session("xc-taken", serde_json::json!({}));
    let waiting = scope
        .wait_session("xc-taken", "waiting: its name is taken", 30, |s| {
            admitted(s).is_some_and(|(_, r, _)| r == "NameTaken")
        })
        .await;
    assert_eq!(phase(&waiting), Some(SessionPhase::Pending));
    assert_waits_for_another_owner(
        &waiting,
        &format!(
            "host {} holds session '{id}' for another tenant; this session opens once that one is destroyed: ",
            host.name
        ),
    );
    assert!(
        admin
            .destroy_as(&id, Some("uid-of-another-tenants-object"))
            .await
            .expect("destroy")
            .destroyed
    );
    scope
        .wait_session("xc-taken", "Running once the name is free", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_gets_its_own_nodes_token_and_another_nodes_name_is_refused() {
    let mut scope = Scope::new("nodetok").await;
    let node = format!("worker-{}", scope.scope);
    let host = Host::start(
        &format!("nt-{}", scope.scope),
        &[("SANDBOXD_NODE_NAME", node.as_str())],
    );
    // The Secret holds the master; spec.node names the node sandboxd was told.
    scope.register_on_node(&host, Some(&node)).await;
    let secret = format!("{}-admin", host.name);
    // The same sandboxd registered twice more: under another node's name, and without a node
    // (the master itself is sent). sandboxd refuses both tokens.
    let other = format!("other-{}", scope.scope);
    scope
        .register_endpoint_on_node(&other, &host.endpoint(), &secret, Some("another-node"))
        .await;
    let bare = format!("bare-{}", scope.scope);
    scope
        .register_endpoint_on_node(&bare, &host.endpoint(), &secret, None)
        .await;
    scope.default_runtime().await;
    scope.start_operator(&[]);

    let hosts = Api::<SandboxHost>::all(scope.client.clone());
    wait_host_ready_condition(&hosts, &host.name, 30, |c| c.status == "True").await;
    let refused = wait_host_ready_condition(&hosts, &other, 30, |c| {
        c.status == "False" && c.reason == "TokenRefused"
    })
    .await;
    assert_eq!(
        refused.message,
        format!(
            "sandboxd at {} refused the admin token (401): the operator sent the token derived for node 'another-node' (spec.node) from the master in Secret {}/{secret} key token. The node name in spec.node must match sandboxd's SANDBOXD_NODE_NAME, and the Secret must hold the master sandboxd was started with (SANDBOXD_TOKEN) or whose node token's hash it reads (SANDBOXD_NODE_TOKEN_HASHES, written by the operator with --node-token-hashes)",
            host.endpoint(),
            scope.ns
        )
    );
    let master_refused = wait_host_ready_condition(&hosts, &bare, 30, |c| {
        c.status == "False" && c.reason == "TokenRefused"
    })
    .await;
    assert_eq!(
        master_refused.message,
        format!(
            "sandboxd at {} refused the admin token (401): spec.node is unset, so the operator sent the master from Secret {}/{secret} key token, which a sandboxd with SANDBOXD_NODE_NAME set refuses. Set spec.node to the node name in sandboxd's SANDBOXD_NODE_NAME, or make the Secret hold the token sandboxd was started with (SANDBOXD_TOKEN)",
            host.endpoint(),
            scope.ns
        )
    );

    // A session lands on the host whose token is taken, and runs there.
    scope.kubectl_apply_session("xc-node", serde_json::json!({}));
    let running = scope
        .wait_session("xc-node", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    assert_eq!(
        running.status.and_then(|s| s.host).as_deref(),
        Some(host.name.as_str())
    );
    assert_eq!(host.containers(), vec![(scope.host_id("xc-node"), true)]);
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_destroyed_or_removed_under_its_session_is_reported_within_the_probe_period() {
    const PERIOD: u64 = 2;
    let mut scope = Scope::new("gone").await;
    let host = Host::start(&format!("gone-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    // The default idle timeout (30 minutes): only the probe period brings these news in time.
    scope.start_operator(&["--follow-seconds", &PERIOD.to_string()]);
    let names = ["xc-deleted", "xc-removed", "xc-wiped"];
    for name in names {
        scope.kubectl_apply_session(name, serde_json::json!({"tenant": format!("org-{name}")}));
    }
    let mut tokens = Vec::new();
    for name in names {
        let s = scope
            .wait_session(name, "Running", 90, |s| {
                phase(s) == Some(SessionPhase::Running)
            })
            .await;
        assert_sleeps_at_shown(&scope, name).await;
        tokens.push(credentials(&scope.client, &s).await);
    }
    let within = 5 * PERIOD;
    let ns = scope.ns.clone();
    let message_is = |want: String| {
        move |s: &sandboxd_crds::v1alpha1::SandboxSession| {
            s.status.as_ref().and_then(|st| st.message.as_deref()) == Some(want.as_str())
        }
    };

    // An admin destroys the session on sandboxd directly: Lost, final.
    let (deleted, _) = &tokens[0];
    host.client()
        .destroy(deleted)
        .await
        .expect("the admin's DELETE");
    let lost = scope
        .wait_session(
            "xc-deleted",
            "Lost",
            within,
            message_is(format!(
                "host {h} no longer has this session: it was destroyed there, workspace included, not through this object; it is not replaced with an empty one. Delete it (kubectl delete sbx xc-deleted -n {ns}) and create it again for a new, empty workspace",
                h = host.name
            )),
        )
        .await;
    assert_eq!(phase(&lost), Some(SessionPhase::Lost));
    assert_sleeps_at_shown(&scope, "xc-deleted").await;

    // Its container removed behind sandboxd's back: Reclaimed, and the next use recreates it.
    let (removed, removed_token) = &tokens[1];
    let ids = host.container_ids(removed);
    assert_eq!(ids.len(), 1, "{ids:?}");
    let rm = std::process::Command::new("docker")
        .args(["rm", "-f", &ids[0]])
        .output()
        .expect("docker rm");
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );
    let reclaimed = scope
        .wait_session(
            "xc-removed",
            "Reclaimed",
            within,
            message_is(format!(
                "the container was removed on host {} while the session ran; the workspace is kept, and the next workspace operation recreates the container",
                host.name
            )),
        )
        .await;
    assert_eq!(phase(&reclaimed), Some(SessionPhase::Reclaimed));
    assert_sleeps_at_shown(&scope, "xc-removed").await;
    let run = sandboxd_api::client::Client::new(&host.endpoint(), removed_token)
        .run(removed, "echo back", None, None, None)
        .await
        .expect("a run recreates the container");
    assert_eq!(run.stdout, "back\n");
    scope
        .wait_session("xc-removed", "Running again", within, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    assert_sleeps_at_shown(&scope, "xc-removed").await;

    // Its workspace deleted on the host: Lost, never replaced with an empty one.
    let (wiped, wiped_token) = &tokens[2];
    std::fs::remove_dir_all(host.sandboxd.workspace_root.join(wiped)).expect("delete on the host");
    let lost = scope
        .wait_session(
            "xc-wiped",
            "Lost",
            within,
            message_is(format!(
                "the workspace of this session vanished on host {h}; it is not replaced with an empty one. Delete it (kubectl delete sbx xc-wiped -n {ns}) and create it again for a new, empty workspace",
                h = host.name
            )),
        )
        .await;
    assert_eq!(phase(&lost), Some(SessionPhase::Lost));
    assert_sleeps_at_shown(&scope, "xc-wiped").await;
    let refused = sandboxd_api::client::Client::new(&host.endpoint(), wiped_token)
        .run(wiped, "true", None, None, None)
        .await;
    assert!(refused.is_err(), "a lost session ran: {refused:?}");
    assert!(!host.workspace(wiped).exists());
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_naming_a_missing_runtime_says_so_and_opens_when_it_is_created() {
    let mut scope = Scope::new("nort").await;
    let host = Host::start(&format!("nort-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    scope.start_operator(&[]);
    let runtime = format!("no-such-rt-{}", scope.scope);

    scope.kubectl_apply_session("xc-nort", serde_json::json!({"runtime": runtime}));
    let expected = sandboxd_operator::session::missing_runtime_message(&runtime);
    assert!(
        expected.starts_with(&format!("Runtime '{runtime}' does not exist")),
        "{expected}"
    );
    let waiting = scope
        .wait_session("xc-nort", "told its Runtime does not exist", 15, |s| {
            s.status
                .as_ref()
                .and_then(|st| st.message.as_deref())
                .is_some_and(|m| m == expected)
        })
        .await;
    assert_eq!(phase(&waiting), Some(SessionPhase::Pending));
    let condition = waiting
        .status
        .as_ref()
        .and_then(|st| st.conditions.iter().find(|c| c.type_ == "RuntimeReady"))
        .cloned()
        .expect("a RuntimeReady condition");
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "RuntimeNotFound")
    );
    assert_eq!(condition.message, expected);
    assert!(host.containers().is_empty(), "nothing opened on the host");

    // Creating the Runtime is all it takes: the session opens by itself.
    let rt: sandboxd_crds::v1alpha1::Runtime = serde_json::from_value(serde_json::json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": runtime, "labels": scope.labels()},
        "spec": {"description": "created after the session", "image": sandboxd_tests::base_image()},
    }))
    .expect("runtime");
    Api::<sandboxd_crds::v1alpha1::Runtime>::all(scope.client.clone())
        .create(&PostParams::default(), &rt)
        .await
        .expect("runtime created");
    let running = scope
        .wait_session("xc-nort", "Running once its Runtime exists", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let st = running.status.expect("status");
    assert!(
        !st.conditions.iter().any(|c| c.reason == "RuntimeNotFound"),
        "a stale RuntimeNotFound: {:?}",
        st.conditions
    );
    assert_eq!(host.containers(), vec![(scope.host_id("xc-nort"), true)]);
    scope.delete().await;
}

/// Waits (watching, with a deadline) until host `name` satisfies `cond`.
async fn wait_host(
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

fn condition<'a>(
    h: &'a SandboxHost,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    h.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_host_is_trusted_through_its_ca_secret_and_refused_with_another_ca() {
    let mut scope = Scope::new("tls").await;
    let pki = tempfile::tempdir().expect("a temp dir");
    let ca = sandboxd_tests::pki::Ca::new("sandboxd e2e CA");
    let leaf = ca.leaf(&["127.0.0.1"], pki.path(), "tls");
    let host = Host::start(
        &format!("tls-host-{}", scope.scope),
        &[
            ("SANDBOXD_TLS_CERT_FILE", &leaf.cert.display().to_string()),
            ("SANDBOXD_TLS_KEY_FILE", &leaf.key.display().to_string()),
        ],
    );
    assert!(host.endpoint().starts_with("https://"));
    let secrets = Api::<Secret>::namespaced(scope.client.clone(), &scope.ns);
    let other = sandboxd_tests::pki::Ca::new("not the CA that signed sandboxd's certificate");
    for (name, pem) in [("tls-ca", &ca.pem), ("wrong-ca", &other.pem)] {
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": scope.labels()},
            "stringData": {"ca.crt": pem},
        }))
        .expect("secret");
        secrets
            .create(&Default::default(), &secret)
            .await
            .expect("CA Secret created");
    }
    // The right CA (key ca.crt by default), and, for the same sandboxd, another CA.
    scope.register(&host).await;
    let hosts = Api::<SandboxHost>::all(scope.client.clone());
    let good = host.name.clone();
    hosts
        .patch(
            &good,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({
                "spec": {"caSecret": {"namespace": scope.ns, "name": "tls-ca"}}
            })),
        )
        .await
        .expect("caSecret set");
    let bad = format!("{}-wrong-ca", host.name);
    scope
        .register_endpoint_with(
            &bad,
            &host.endpoint(),
            &format!("{}-admin", host.name),
            serde_json::json!({"caSecret": {"namespace": scope.ns, "name": "wrong-ca", "key": "ca.crt"}}),
        )
        .await;
    // A CA Secret outside the operator's namespace is refused unread, as an admin token is.
    let foreign = format!("{}-foreign-ca", host.name);
    scope
        .register_endpoint_with(
            &foreign,
            &host.endpoint(),
            &format!("{}-admin", host.name),
            serde_json::json!({"caSecret": {"namespace": "kube-system", "name": "extension-apiserver-authentication", "key": "client-ca-file"}}),
        )
        .await;
    assert_eq!(
        hosts
            .get(&good)
            .await
            .expect("the host")
            .spec
            .ca_secret
            .map(|r| (r.name, r.key)),
        Some(("tls-ca".to_owned(), "ca.crt".to_owned())),
        "the API server kept spec.caSecret with its default key"
    );
    scope.default_runtime().await;
    scope.start_operator(&[]);

    let ready = wait_host(&scope.client, &good, "Ready over TLS", |h| {
        condition(h, "Ready").is_some_and(|c| c.status == "True")
    })
    .await;
    assert_eq!(ready.spec.endpoint, host.endpoint());
    let refused = wait_host(&scope.client, &bad, "refused for its certificate", |h| {
        condition(h, "Ready").is_some_and(|c| c.reason == "CertificateUntrusted")
    })
    .await;
    let message = |type_| {
        condition(&refused, type_)
            .map(|c| (c.status.clone(), c.message.clone()))
            .expect("the condition")
    };
    let untrusted = format!(
        "sandboxd at {} could not be reached: its TLS certificate is not trusted (invalid peer certificate: UnknownIssuer); this client trusts only the CA it was given",
        host.endpoint()
    );
    assert_eq!(
        message("Reachable"),
        ("False".to_owned(), untrusted.clone())
    );
    assert_eq!(
        message("Ready"),
        (
            "False".to_owned(),
            format!(
                "{untrusted}. Put the CA that signed sandboxd's certificate in the host's spec.caSecret (or the operator's --host-ca-file); the certificate must name the endpoint's address"
            )
        )
    );

    let refused_ca = wait_host(&scope.client, &foreign, "refused for its CA Secret", |h| {
        condition(h, "Ready").is_some_and(|c| c.reason == "CaUnusable")
    })
    .await;
    assert_eq!(
        condition(&refused_ca, "Ready").map(|c| c.message.clone()),
        Some(format!(
            "the CA of host {foreign} could not be used: spec.caSecret kube-system/extension-apiserver-authentication is not read: it must live in the operator's namespace {}, the only namespace the operator reads Secrets in",
            scope.ns
        ))
    );

    // A session reaches Running over TLS, on the host that trusts the right CA only.
    scope.kubectl_apply_session("xc-tls", serde_json::json!({}));
    let running = scope
        .wait_session("xc-tls", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let status = running.status.clone().expect("status");
    assert_eq!(status.host.as_deref(), Some(good.as_str()));
    // The platform's Secret carries what it needs to talk to the host over https.
    let secret = secrets
        .get(
            status
                .credentials_secret
                .as_deref()
                .expect("a credentials Secret"),
        )
        .await
        .expect("the token Secret");
    let data = secret.data.clone().expect("data");
    let field = |k: &str| {
        String::from_utf8(data.get(k).map(|b| b.0.clone()).unwrap_or_default()).expect("utf-8")
    };
    assert_eq!(field("endpoint"), host.endpoint());
    assert_eq!(field("ca.crt"), ca.pem);
    let trust = sandboxd_api::client::Trust::ca(Some(field("ca.crt").as_bytes()), "ca.crt")
        .expect("the Secret's CA is usable");
    let platform =
        sandboxd_api::client::Client::with_trust(&field("endpoint"), &token_of(&secret), &trust);
    let ran = platform
        .run(
            status.session_id.as_deref().expect("a session id"),
            "echo platform-over-tls",
            None,
            None,
            None,
        )
        .await
        .expect("the platform runs a command over https with the Secret's token and CA");
    assert_eq!(ran.stdout.trim(), "platform-over-tls");

    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_hangs_is_unreachable_like_a_dead_one_and_holds_nothing_up() {
    let mut scope = Scope::new("hang").await;
    let hung = Host::start(&format!("hung-{}", scope.scope), &[]);
    let healthy = Host::start(&format!("healthy-{}", scope.scope), &[]);
    scope.register(&hung).await;
    scope.register(&healthy).await;
    scope.default_runtime().await;
    scope.start_operator(&["--host-request-seconds", "2"]);
    let sessions = scope.sessions();
    let tombstones = Api::<Tombstone>::all(scope.client.clone());
    let hosts = Api::<SandboxHost>::all(scope.client.clone());

    scope.kubectl_apply_session("xc-hung", serde_json::json!({"host": hung.name}));
    let s = scope
        .wait_session("xc-hung", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let tomb = format!("sbx-{}", s.metadata.uid.clone().expect("uid"));

    // The host stops answering (SIGSTOP: connections are still accepted, nothing is said).
    hung.signal("STOP");
    let down = wait_host_ready_condition(&hosts, &hung.name, 30, |c| c.status == "False").await;
    assert_eq!(
        (down.reason.as_str(), down.message.clone()),
        (
            "Unreachable",
            format!("sandboxd at {} does not answer", hung.endpoint())
        )
    );
    let reachable = hosts
        .get(&hung.name)
        .await
        .expect("the host")
        .status
        .and_then(|st| st.conditions.into_iter().find(|c| c.type_ == "Reachable"))
        .expect("a Reachable condition");
    assert!(
        reachable.message.contains("no answer within 2 s"),
        "the host's Reachable condition does not say it hangs: {reachable:?}"
    );
    // A destroy on it fails within the deadline and is retried with backoff, not hung.
    sessions
        .delete("xc-hung", &DeleteParams::default())
        .await
        .expect("delete");
    wait_gone(sessions.clone(), "xc-hung", 30).await;
    let backing_off = tokio::time::timeout(
        Duration::from_secs(45),
        await_condition(tombstones.clone(), &tomb, |t: Option<&Tombstone>| {
            t.and_then(|t| t.status.as_ref()).is_some_and(|st| {
                st.attempts >= 3
                    && st
                        .last_error
                        .as_deref()
                        .is_some_and(|e| e.contains("no answer within 2 s"))
            })
        }),
    )
    .await;
    assert!(
        matches!(backing_off, Ok(Ok(Some(_)))),
        "the tombstone's attempts did not grow while the host hung: {:?}",
        tombstones.get_opt(&tomb).await
    );
    // Meanwhile sessions on the other host open as usual.
    scope.kubectl_apply_session("xc-fine", serde_json::json!({"host": healthy.name}));
    scope
        .wait_session("xc-fine", "Running beside a hung host", 60, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;

    // The host comes back: the destroy completes.
    hung.signal("CONT");
    wait_gone(tombstones.clone(), &tomb, 60).await;
    assert!(
        hung.containers().is_empty(),
        "the hung host's sandbox stayed"
    );
    scope.delete().await;
}

/// Waits (watching) until Runtime `name` reports `ready` pooled containers on every host.
async fn pool_ready(scope: &Scope, name: &str, ready: i32, secs: u64) {
    let api = Api::<Runtime>::all(scope.client.clone());
    let found = tokio::time::timeout(
        Duration::from_secs(secs),
        await_condition(api.clone(), name, move |r: Option<&Runtime>| {
            r.and_then(|r| r.status.as_ref())
                .and_then(|s| s.warm_pool.as_ref())
                .is_some_and(|p| p.ready == ready)
        }),
    )
    .await;
    if !matches!(found, Ok(Ok(Some(_)))) {
        panic!(
            "Runtime {name} did not report {ready} pooled containers within {secs} s: {:?}",
            api.get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|r| r.status)
        );
    }
}

/// `kubectl scale` of a Runtime fills a warm pool on its host; a session opens on a pooled
/// container (`launch: warm`, shown by `kubectl get sbx -o wide`) with its files in its own
/// workspace, the pool refills; scaled to 0 the pool drains, and the next session opens cold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scaled_runtime_keeps_a_warm_pool_its_sessions_open_on() {
    let mut scope = Scope::new("pool").await;
    let host = Host::start(&format!("pool-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    scope.start_operator(&[]);
    let runtime = format!("base-{}", scope.scope);
    let scale = |n: u32| {
        let out = std::process::Command::new(sandboxd_tests::kubectl())
            .args([
                "scale",
                &format!("rt/{runtime}"),
                &format!("--replicas={n}"),
            ])
            .output()
            .expect("kubectl runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    scale(2);
    pool_ready(&scope, &runtime, 2, 90).await;
    let pooled = host.containers();
    assert_eq!(pooled.len(), 2, "{pooled:?}");

    scope.kubectl_apply_session("xc-warm", serde_json::json!({}));
    let running = scope
        .wait_session("xc-warm", "Running", 60, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let status = running.status.expect("status");
    assert_eq!(status.launch, Some(Launch::Warm));
    let id = status.session_id.expect("session id");
    let secret = Api::<Secret>::namespaced(scope.client.clone(), &scope.ns)
        .get(&status.credentials_secret.expect("credentials secret"))
        .await
        .expect("the token Secret");
    let run = sandboxd_api::client::Client::new(&host.endpoint(), &token_of(&secret))
        .run(
            &id,
            "echo warm > note.txt && cat note.txt",
            None,
            None,
            None,
        )
        .await
        .expect("a run in the warm session");
    assert_eq!(run.stdout, "warm\n");
    assert_eq!(
        std::fs::read_to_string(host.workspace(&id).join("note.txt")).expect("the file on disk"),
        "warm\n"
    );
    let wide = std::process::Command::new(sandboxd_tests::kubectl())
        .args(["get", "sbx", "xc-warm", "-n", &scope.ns, "-o", "wide"])
        .output()
        .expect("kubectl runs");
    let wide = String::from_utf8_lossy(&wide.stdout);
    assert!(wide.contains("LAUNCH") && wide.contains("warm"), "{wide}");
    // The pool refills beside the session.
    pool_ready(&scope, &runtime, 2, 60).await;

    // Scaled to 0: drained, and the next session opens cold.
    scale(0);
    pool_ready(&scope, &runtime, 0, 60).await;
    // The pool empties at once; its containers are removed just after.
    sandboxd_tests::until(
        "only the session's container left",
        Duration::from_secs(30),
        || async {
            let left = host.containers();
            if left.len() == 1 {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    )
    .await;
    scope.kubectl_apply_session("xc-cold", serde_json::json!({}));
    let cold = scope
        .wait_session("xc-cold", "Running", 60, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    assert_eq!(cold.status.and_then(|s| s.launch), Some(Launch::Cold));

    for name in ["xc-warm", "xc-cold"] {
        scope
            .sessions()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete the session");
        wait_gone(scope.sessions(), name, 30).await;
    }
    scope.delete().await;
}

/// A platform reads the token Secret the moment its session is Running and runs at once: the
/// token it read keeps working, and is not rotated behind its back by a reconcile handed the
/// copy of the session from before the operator's own open (one queued while the open wrote
/// its status).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_read_as_a_session_turns_running_keeps_working() {
    let mut scope = Scope::new("tokrace").await;
    let host = Host::start(&format!("tokrace-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    scope.start_operator(&[]);
    let secrets = Api::<Secret>::namespaced(scope.client.clone(), &scope.ns);
    let mut read = Vec::new();
    for i in 0..20 {
        let name = format!("xc-tok-{i}");
        let session: sandboxd_crds::v1alpha1::SandboxSession =
            serde_json::from_value(serde_json::json!({
                "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession",
                "metadata": {"name": name, "labels": scope.labels()},
                // A tenant each: a tenant holds at most 10 sessions on a host (20 in all).
                "spec": {"scope": "conversation", "tenant": format!("org-{i}"), "subject": name},
            }))
            .expect("a session");
        scope
            .sessions()
            .create(&PostParams::default(), &session)
            .await
            .expect("create the session");
        let running = scope
            .wait_session(&name, "Running", 60, |s| {
                phase(s) == Some(SessionPhase::Running)
            })
            .await;
        let secret_name = running
            .status
            .and_then(|s| s.credentials_secret)
            .expect("the token Secret's name");
        let token = token_of(&secrets.get(&secret_name).await.expect("the token Secret"));
        let id = scope.host_id(&name);
        let run = sandboxd_api::client::Client::new(&host.endpoint(), &token)
            .run(&id, "echo hi", None, None, None)
            .await
            .unwrap_or_else(|e| panic!("{name}: a run with the token read at Running: {e}"));
        assert_eq!(run.stdout, "hi\n");
        read.push((name, secret_name, token, id));
    }
    // Later, each Secret still holds the token read at Running, and it still works.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (name, secret_name, token, id) in &read {
        let now = token_of(&secrets.get(secret_name).await.expect("the token Secret"));
        assert!(&now == token, "{name}: its token was rotated after Running");
        sandboxd_api::client::Client::new(&host.endpoint(), token)
            .run(id, "true", None, None, None)
            .await
            .unwrap_or_else(|e| panic!("{name}: the token read at Running stopped working: {e}"));
    }
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_host_is_probed_on_its_timer_not_after_each_of_its_own_writes() {
    let mut scope = Scope::new("quiet").await;
    let host = Host::start(&format!("quiet-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.start_operator(&["--probe-seconds", "30"]);
    let ready = wait_host(&scope.client, &host.name, "Ready", |h| {
        condition(h, "Ready").is_some_and(|c| c.status == "True")
    })
    .await;
    let probed = ready
        .status
        .as_ref()
        .and_then(|s| s.last_probe_at.clone())
        .expect("lastProbeAt");
    // Each probe writes the status; were a write to bring the next probe, the host would be
    // probed and written about once a second. Its next probe is 30 s away: 3 s see no write.
    let hosts = Api::<SandboxHost>::all(scope.client.clone());
    let mut events = kube::runtime::watcher(
        hosts.clone(),
        kube::runtime::watcher::Config::default().fields(&format!("metadata.name={}", host.name)),
    )
    .boxed();
    let mut writes = Vec::new();
    let window = tokio::time::sleep(Duration::from_secs(3));
    tokio::pin!(window);
    loop {
        tokio::select! {
            () = &mut window => break,
            e = events.next() => match e {
                Some(Ok(kube::runtime::watcher::Event::Apply(h))) => writes.push(h.resource_version()),
                Some(Ok(_)) => {}
                Some(Err(e)) => panic!("watch: {e}"),
                None => break,
            },
        }
    }
    assert!(
        writes.is_empty(),
        "the idle host was written {} times in 3 s: {writes:?}",
        writes.len()
    );
    let now = hosts.get(&host.name).await.expect("host");
    assert_eq!(
        now.status.and_then(|s| s.last_probe_at),
        Some(probed),
        "probed again before its timer"
    );
    // Two reconciles in all: the one that added the finalizer and the probe. The probe's own
    // write brought a third (a second probe) before.
    let metrics = reqwest::get(format!("{}/metrics", scope.health_url(0)))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let reconciles: u64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("sandbox_operator_reconciles_total{controller=\"sandboxhost\"} ")
        })
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sandboxhost reconciles in:\n{metrics}"));
    assert_eq!(reconciles, 2, "the host's reconciles (finalizer, probe)");
    scope.delete().await;
}

/// sandboxd's count of cap refusals of opens.
async fn refused_opens(host: &Host) -> u64 {
    let metrics = reqwest::get(format!("{}/metrics", host.endpoint()))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("sandboxd_session_opens_total{outcome=\"refused\"} "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_far_over_their_tenants_cap_wait_without_hammering_the_host() {
    let mut scope = Scope::new("overcap").await;
    let host = Host::start(
        &format!("oc-host-{}", scope.scope),
        &[("SANDBOXD_MAX_SESSIONS_PER_TENANT", "1")],
    );
    scope.register(&host).await;
    scope.default_runtime().await;
    // The production probe period: what spaces the tries is the operator's own backoff.
    scope.start_operator(&["--follow-seconds", "60"]);
    scope.kubectl_apply_session("xc-oc-0", serde_json::json!({}));
    scope
        .wait_session("xc-oc-0", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let over: Vec<String> = (1..=5).map(|i| format!("xc-oc-{i}")).collect();
    for name in &over {
        scope.kubectl_apply_session(name, serde_json::json!({}));
    }
    for name in &over {
        let waiting = scope
            .wait_session(name, "Pending over the tenant's cap", 30, |s| {
                s.status.as_ref().is_some_and(|st| {
                    st.conditions
                        .iter()
                        .any(|c| c.type_ == "Admitted" && c.reason == "TenantCap")
                })
            })
            .await;
        assert_eq!(phase(&waiting), Some(SessionPhase::Pending));
    }
    // Tried again after 1 s, 2 s, 4 s…: at most three or four tries each in 6 s. A try every
    // second, as before, made 30.
    let before = refused_opens(&host).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let tries = refused_opens(&host).await - before;
    assert!(
        tries <= 20,
        "5 sessions over the cap were refused {tries} times in 6 s"
    );
    assert_eq!(
        host.containers().len(),
        1,
        "only the session within the cap runs"
    );
    scope.delete().await;
}
