//! Placement, the session controller's first step: sessions spread over the hosts and a pin to
//! a host holds; a host of another version gets none and says so in a condition, and a
//! tenant's cap on a host becomes an Admitted condition in the host's words. Against the stack
//! of `make up` (see `common`).

mod common;

use std::time::Duration;

use common::{Host, Scope, phase};
use kube::api::Api;
use kube::runtime::wait::await_condition;
use sandboxd_crds::v1alpha1::SandboxHost;
use sandboxd_crds::v1alpha1::session::SessionPhase;

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
