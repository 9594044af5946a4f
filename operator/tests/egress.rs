//! Egress policies through the operator (#29): a session whose spec.egress widens its Runtime's
//! policy, or whose policy is wider than its namespace's ceiling annotation, is Failed with the
//! exact message; an open session's spec.egress, and its namespace's ceiling, changed while it
//! runs reach its host within 5 s without restarting it, and a change that would widen is
//! refused with a condition while the old policy stays. What the sandbox then may reach is
//! sandboxd's to enforce (sandboxd/tests/egress.rs). Against the stack of `make up` (see
//! `common`).

mod common;

use std::time::{Duration, Instant};

use common::{Host, Scope, phase};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams, PostParams};
use sandboxd_crds::v1alpha1::session::SessionPhase;
use sandboxd_crds::v1alpha1::{Runtime, SandboxSession};
use serde_json::json;

/// Creates Runtime `name` of this scope with the base image and `spec`'s further fields.
async fn runtime(scope: &Scope, name: &str, spec: serde_json::Value) {
    let mut full = json!({"description": "egress test", "image": common::base_image()});
    if let (Some(f), Some(s)) = (full.as_object_mut(), spec.as_object()) {
        f.extend(s.clone());
    }
    let rt: Runtime = serde_json::from_value(json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": name, "labels": scope.labels()},
        "spec": full,
    }))
    .expect("runtime");
    Api::<Runtime>::all(scope.client.clone())
        .create(&PostParams::default(), &rt)
        .await
        .expect("runtime created");
}

/// Sets (or removes, with `null`) the namespace's egress ceiling annotation.
async fn set_ceiling(scope: &Scope, ceiling: serde_json::Value) {
    let patch = json!({"metadata": {"annotations": {"sandboxd.dev/egress-ceiling": ceiling}}});
    Api::<Namespace>::all(scope.client.clone())
        .patch(&scope.ns, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("namespace annotated");
}

/// Replaces the session's spec.egress (`null` drops it).
async fn set_egress(scope: &Scope, name: &str, egress: serde_json::Value) {
    let patch = json!({"spec": {"egress": egress}});
    scope
        .sessions()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("spec.egress changed");
}

/// The session's condition of `type_`: (status, reason, message).
fn condition(s: &SandboxSession, type_: &str) -> Option<(String, String, String)> {
    s.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The policies its host was last sent (`status.egress.policies`), as JSON.
fn sent(s: &SandboxSession) -> Option<serde_json::Value> {
    let e = s.status.as_ref()?.egress.as_ref()?;
    Some(serde_json::to_value(&e.policies).expect("serialises"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_widening_session_and_one_over_the_ceiling_are_refused_with_the_reason() {
    let mut scope = Scope::new("egress-refuse").await;
    let narrow = format!("narrow-{}", scope.scope);
    let open = format!("open-{}", scope.scope);
    runtime(
        &scope,
        &narrow,
        json!({"egress": {"mode": "allowlist", "allow": [{"domain": "allowed.test"}]}}),
    )
    .await;
    runtime(&scope, &open, json!({"needsNetwork": true})).await;
    set_ceiling(
        &scope,
        json!(r#"{"mode": "allowlist", "allow": [{"domain": "allowed.test"}]}"#),
    )
    .await;
    scope.start_operator(&[]);

    // (a) Wider than its Runtime: Failed, the entry named.
    scope.kubectl_apply_session(
        "xc-widen",
        json!({"runtime": narrow, "egress": {"mode": "allowlist", "allow": [{"domain": "other.test"}]}}),
    );
    let widened = format!(
        "spec.egress widens the runtime's policy (Runtime '{narrow}', allowlist: allowed.test): allow[0] (domain other.test, ports 443, 80) is not within the wider policy; a session may only narrow it"
    );
    let s = scope
        .wait_session("xc-widen", "Failed over its egress", 30, |s| {
            phase(s) == Some(SessionPhase::Failed)
        })
        .await;
    assert_eq!(
        s.status.as_ref().and_then(|st| st.message.clone()),
        Some(widened.clone())
    );
    assert_eq!(
        condition(&s, "Admitted"),
        Some(("False".into(), "EgressWidened".into(), widened))
    );
    assert_eq!(s.status.as_ref().and_then(|st| st.host.clone()), None);

    // (b) An open Runtime over the namespace's ceiling: Failed, the annotation named.
    scope.kubectl_apply_session("xc-ceiling", json!({"runtime": open}));
    let over = format!(
        "the policy of Runtime '{open}' is wider than the ceiling in the annotation sandboxd.dev/egress-ceiling of namespace '{}' (allowlist: allowed.test): mode open is wider than allowlist; narrow it with spec.egress or raise the ceiling",
        scope.ns
    );
    let s = scope
        .wait_session("xc-ceiling", "Failed over the ceiling", 30, |s| {
            phase(s) == Some(SessionPhase::Failed)
        })
        .await;
    assert_eq!(
        condition(&s, "Admitted"),
        Some(("False".into(), "EgressCeiling".into(), over))
    );

    // spec.egress may change: narrowed, the session is no longer refused over it (it waits
    // for a host, of which this scope has none).
    set_egress(
        &scope,
        "xc-widen",
        json!({"mode": "allowlist", "allow": [{"domain": "allowed.test"}]}),
    )
    .await;
    let s = scope
        .wait_session("xc-widen", "waiting for a host", 30, |s| {
            phase(s) == Some(SessionPhase::Pending)
        })
        .await;
    assert_eq!(
        condition(&s, "Placed").map(|c| (c.0, c.1)),
        Some(("False".into(), "NoHost".into()))
    );
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_changes_reach_a_running_session_within_five_seconds() {
    let mut scope = Scope::new("egress-live").await;
    let host = Host::start(&format!("eg-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    scope.start_operator(&[]);
    scope.kubectl_apply_session("xc-live", json!({"egress": {"mode": "none"}}));
    let s = scope
        .wait_session("xc-live", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    assert_eq!(sent(&s), Some(json!([{"mode": "none"}])));
    let started = common::inspect(&host, &scope.host_id("xc-live"), "{{.State.StartedAt}}");

    // Another narrowing (an empty allowlist, within the base runtime's none): sent within 5 s.
    let t = Instant::now();
    set_egress(&scope, "xc-live", json!({"mode": "allowlist"})).await;
    let s = scope
        .wait_session("xc-live", "sent the new policy", 5, |s| {
            sent(s) == Some(json!([{"mode": "allowlist"}]))
        })
        .await;
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(
        condition(&s, "EgressApplied"),
        Some((
            "True".into(),
            "EgressApplied".into(),
            format!(
                "host {} enforces the Runtime's egress policy narrowed to allowlist: nothing",
                host.name
            )
        ))
    );
    assert_eq!(phase(&s), Some(SessionPhase::Running));

    // A widening: refused, the policy sent before stays, the session keeps running.
    set_egress(
        &scope,
        "xc-live",
        json!({"mode": "allowlist", "allow": [{"domain": "allowed.test"}]}),
    )
    .await;
    let s = scope
        .wait_session("xc-live", "told the change is refused", 5, |s| {
            condition(s, "EgressApplied").is_some_and(|c| c.0 == "False")
        })
        .await;
    let (_, reason, message) = condition(&s, "EgressApplied").expect("condition");
    assert_eq!(reason, "EgressWidened");
    assert_eq!(
        message,
        format!(
            "spec.egress widens the runtime's policy (Runtime 'base-{}', none): allow[0] (domain allowed.test, ports 443, 80) is not within the wider policy (mode none allows nothing); a session may only narrow it; the policy sent before stays in force (host {} enforces the Runtime's egress policy narrowed to allowlist: nothing)",
            scope.scope, host.name
        )
    );
    assert_eq!(sent(&s), Some(json!([{"mode": "allowlist"}])));
    assert_eq!(phase(&s), Some(SessionPhase::Running));

    // A ceiling put on the namespace: sent after the session's own, within 5 s.
    set_egress(&scope, "xc-live", json!(null)).await;
    let t = Instant::now();
    set_ceiling(&scope, json!(r#"{"mode": "none"}"#)).await;
    scope
        .wait_session("xc-live", "sent the ceiling", 5, |s| {
            sent(s) == Some(json!([{"mode": "none"}]))
                && condition(s, "EgressApplied").is_some_and(|c| c.0 == "True")
        })
        .await;
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());

    // The ceiling lifted, no narrowing of its own: `open` replaces what the host had.
    set_ceiling(&scope, json!(null)).await;
    let s = scope
        .wait_session("xc-live", "the narrowing lifted", 5, |s| {
            sent(s) == Some(json!([{"mode": "open"}]))
        })
        .await;
    assert_eq!(phase(&s), Some(SessionPhase::Running));
    // The sandbox was never restarted for any of it.
    assert_eq!(
        common::inspect(&host, &scope.host_id("xc-live"), "{{.State.StartedAt}}"),
        started
    );
    scope.delete().await;
}
