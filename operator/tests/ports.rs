//! A session's `spec.ports` through the operator: opened on its host once the session runs,
//! changed while it runs (the dropped port closed, a port opened through the API directly left
//! alone), a port the host refuses over its cap reported with condition `PortsOpen` False and
//! the host's words while the session runs on, and a spec over sandboxd's cap or naming port 0
//! refused by the API server naming the field. What reaching an open port does is sandboxd's
//! (sandboxd/tests/ports.rs). Against the stack of `make up` (see `common`).

mod common;

use common::{Host, Scope, phase};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use sandboxd_crds::v1alpha1::SandboxSession;
use sandboxd_crds::v1alpha1::session::SessionPhase;
use serde_json::json;

/// The session's condition of `type_`: (status, reason, message).
fn condition(s: &SandboxSession, type_: &str) -> Option<(String, String, String)> {
    s.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// What the operator last applied on the host (`status.ports`).
fn applied(s: &SandboxSession) -> Vec<u16> {
    s.status
        .as_ref()
        .map(|st| st.ports.clone())
        .unwrap_or_default()
}

/// Replaces the session's spec.ports (`null` drops it).
async fn set_ports(scope: &Scope, name: &str, ports: serde_json::Value) {
    let patch = json!({"spec": {"ports": ports}});
    scope
        .sessions()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("spec.ports changed");
}

/// The ports the session has open on `host`, as its sandboxd says (admin client).
async fn open_on_host(host: &Host, id: &str) -> Vec<u16> {
    host.client()
        .ports(id)
        .await
        .unwrap_or_else(|e| panic!("the ports of {id}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_ports_are_opened_on_the_host_and_follow_changes_of_the_spec() {
    let mut scope = Scope::new("ports-live").await;
    let host = Host::start(&format!("pt-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    scope.start_operator(&[]);
    scope.kubectl_apply_session("xc-ports", json!({"ports": [3000]}));
    let id = scope.host_id("xc-ports");
    let s = scope
        .wait_session("xc-ports", "Running with its port open", 90, |s| {
            phase(s) == Some(SessionPhase::Running) && applied(s) == [3000]
        })
        .await;
    assert_eq!(
        condition(&s, "PortsOpen"),
        Some((
            "True".into(),
            "PortsOpened".into(),
            format!("host {} has spec.ports open: 3000", host.name)
        ))
    );
    assert_eq!(open_on_host(&host, &id).await, [3000]);

    // A port opened through the API directly is the caller's: no change of the spec closes it.
    assert_eq!(
        host.client().open_port(&id, 9000).await.expect("opened"),
        [3000, 9000]
    );

    // Changed while it runs: 3000 closed, 3001 opened.
    set_ports(&scope, "xc-ports", json!([3001])).await;
    let s = scope
        .wait_session("xc-ports", "applied 3001", 10, |s| applied(s) == [3001])
        .await;
    assert_eq!(open_on_host(&host, &id).await, [3001, 9000]);
    assert_eq!(
        condition(&s, "PortsOpen").map(|c| (c.0, c.2)),
        Some((
            "True".into(),
            format!("host {} has spec.ports open: 3001", host.name)
        ))
    );
    assert_eq!(phase(&s), Some(SessionPhase::Running));

    // Dropped: what the operator opened is closed, the condition goes, 9000 stays.
    set_ports(&scope, "xc-ports", json!(null)).await;
    let s = scope
        .wait_session("xc-ports", "closed its ports", 10, |s| {
            applied(s).is_empty() && condition(s, "PortsOpen").is_none()
        })
        .await;
    assert_eq!(open_on_host(&host, &id).await, [9000]);
    assert_eq!(phase(&s), Some(SessionPhase::Running));
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_over_the_hosts_cap_is_reported_and_opened_once_there_is_room() {
    let mut scope = Scope::new("ports-cap").await;
    let host = Host::start(&format!("pc-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    // Looked at every 2 s, so the retry after room is made comes soon.
    scope.start_operator(&["--follow-seconds", "2"]);
    scope.kubectl_apply_session("xc-cap", json!({}));
    let id = scope.host_id("xc-cap");
    scope
        .wait_session("xc-cap", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    // The host's cap filled through the API directly.
    let cap = u16::try_from(sandboxd_api::ports::MAX_PORTS).expect("a small number");
    for port in 9000..9000 + cap {
        host.client().open_port(&id, port).await.expect("opened");
    }

    set_ports(&scope, "xc-cap", json!([3000])).await;
    let s = scope
        .wait_session("xc-cap", "told the port is refused", 10, |s| {
            condition(s, "PortsOpen").is_some_and(|c| c.0 == "False")
        })
        .await;
    let (_, reason, message) = condition(&s, "PortsOpen").expect("condition");
    assert_eq!(reason, "PortsRefused");
    let refused = format!(
        "host {} refused to open port 3000: port_limit (429): Session '{id}' already has 16 ports open, the most a session may have",
        host.name
    );
    assert!(message.starts_with(&refused), "{message}");
    assert!(
        message.ends_with(&format!(
            "; spec.ports open on host {}: none; tried again at the next reconcile",
            host.name
        )),
        "{message}"
    );
    assert!(applied(&s).is_empty());
    assert_eq!(phase(&s), Some(SessionPhase::Running));
    // Said once as a Warning event with the reason.
    let events = Api::<Event>::namespaced(scope.client.clone(), &scope.ns)
        .list(&ListParams::default())
        .await
        .expect("events");
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("PortsRefused")
                && e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("xc-cap")),
        "no PortsRefused event among {:?}",
        events
            .items
            .iter()
            .map(|e| (e.reason.clone(), e.note.clone()))
            .collect::<Vec<_>>()
    );

    // Room made on the host: the port is opened at a following reconcile.
    host.client().close_port(&id, 9000).await.expect("closed");
    let s = scope
        .wait_session("xc-cap", "opened the port", 15, |s| {
            applied(s) == [3000] && condition(s, "PortsOpen").is_some_and(|c| c.0 == "True")
        })
        .await;
    assert!(open_on_host(&host, &id).await.contains(&3000));
    assert_eq!(phase(&s), Some(SessionPhase::Running));
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_over_the_cap_or_naming_port_0_is_refused_naming_the_field() {
    let scope = Scope::new("ports-valid").await;
    let refusal = |ports: serde_json::Value| {
        let api = scope.sessions();
        let labels = scope.labels();
        async move {
            let s: SandboxSession = serde_json::from_value(json!({
                "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession",
                "metadata": {"name": "xc-bad", "labels": labels},
                "spec": {"scope": "conversation", "tenant": "org-1", "subject": "c-1", "ports": ports},
            }))
            .expect("a session");
            let pp = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            match api.create(&pp, &s).await {
                Err(kube::Error::Api(e)) => e.message.clone(),
                other => panic!("spec.ports {ports} was not refused: {other:?}"),
            }
        }
    };
    let seventeen: Vec<u16> = (3000..3017).collect();
    let m = refusal(json!(seventeen)).await;
    assert!(
        m.contains("spec.ports") && m.contains("must have at most 16 items"),
        "{m}"
    );
    let m = refusal(json!([3000, 0])).await;
    assert!(
        m.contains("spec.ports[1]") && m.contains("should be greater than or equal to 1"),
        "{m}"
    );
    // Sixteen, one of them twice, is taken.
    let mut sixteen: Vec<u16> = (3000..3015).collect();
    sixteen.push(3000);
    let s: SandboxSession = serde_json::from_value(json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession",
        "metadata": {"name": "xc-ok", "labels": scope.labels()},
        "spec": {"scope": "conversation", "tenant": "org-1", "subject": "c-2", "ports": sixteen},
    }))
    .expect("a session");
    let pp = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    scope
        .sessions()
        .create(&pp, &s)
        .await
        .expect("sixteen ports are taken");
    scope.delete().await;
}
