//! The Runtime controller: Runtimes reach every host and two defaults are a condition on both;
//! a session naming a missing runtime says so and opens once it is created; a scaled Runtime
//! keeps a warm pool its sessions open on. Against the stack of `make up` (see `common`).

mod common;

use std::time::Duration;

use common::{Host, Scope, phase, token_of, wait_gone};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::wait::await_condition;
use sandboxd_crds::v1alpha1::Runtime;
use sandboxd_crds::v1alpha1::session::{Launch, SessionPhase};

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
