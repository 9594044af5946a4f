//! The operator's replicas and its crashes: only the leader acts and another takes over when
//! it dies; a `kill -9` of the operator mid-open and mid-delete leaks and duplicates nothing.
//! Against the stack of `make up` (see `common`).

mod common;

use std::time::Duration;

use common::{Host, Scope, phase, token_of, wait_gone};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams};
use kube::runtime::wait::await_condition;
use sandboxd_crds::v1alpha1::Tombstone;
use sandboxd_crds::v1alpha1::session::SessionPhase;
use sandboxd_tests::poll::until_every;

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
