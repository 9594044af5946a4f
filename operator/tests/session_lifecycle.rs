//! The session controller end to end, from open to loss: a session runs, sleeps, wakes, is
//! reclaimed and lost; an open its host refuses says why and opens once the cause is gone; a
//! sandbox destroyed or removed under its session is reported within the probe period; the
//! token read as a session turns Running keeps working; sessions far over their tenant's cap
//! wait without hammering the host; a session whose sandbox and token Secret are gone is lost,
//! never opened empty. The real API server and controller-manager from `make up`, real
//! sandboxd processes on the local dockerd, the real operator binary (see `common`); lifetimes
//! are shortened through configuration, never by faking time.
//!
//! Over 600 lines: one test a scenario of a session's life, each read whole.

mod common;

use std::time::Duration;

use common::{
    Host, Scope, assert_sleeps_at_shown, assert_waits_for_another_owner, credentials, phase,
    token_of,
};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use sandboxd_crds::v1alpha1::session::SessionPhase;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_destroyed_on_its_host_whose_token_secret_is_deleted_is_lost_not_opened_empty() {
    let mut scope = Scope::new("reopen").await;
    let host = Host::start(&format!("reopen-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    // The Secret is looked for at every reconcile, and no probe comes before the poke below
    // (a session that runs is looked at again only after an hour): the token path alone acts.
    scope.start_operator(&["--token-check-seconds", "0", "--follow-seconds", "3600"]);
    let ns = scope.ns.clone();
    let secrets = Api::<Secret>::namespaced(scope.client.clone(), &ns);
    let mut opened = Vec::new();
    for name in ["xc-gone", "xc-kept"] {
        scope.kubectl_apply_session(name, serde_json::json!({"tenant": format!("org-{name}")}));
        let s = scope
            .wait_session(name, "Running", 90, |s| {
                phase(s) == Some(SessionPhase::Running)
            })
            .await;
        let (id, token) = credentials(&scope.client, &s).await;
        let session = sandboxd_api::client::Client::new(&host.endpoint(), &token);
        session
            .run(&id, "echo mine > note.txt", None, None, None)
            .await
            .expect("a run with the Secret's token");
        opened.push((id, token));
    }
    let poke = |name: &str| {
        let sessions = scope.sessions();
        let name = name.to_owned();
        async move {
            let patch =
                serde_json::json!({"metadata": {"annotations": {"test.sandboxd.dev/poke": "1"}}});
            sessions
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("annotate the session");
        }
    };

    // Destroyed on its host by an admin, then its token Secret deleted, before any probe: the
    // next reconcile finds the session gone and reports it Lost; nothing is opened again.
    let (gone, _) = &opened[0];
    host.client()
        .destroy(gone)
        .await
        .expect("the admin's DELETE");
    secrets
        .delete("xc-gone-token", &DeleteParams::default())
        .await
        .expect("delete the token Secret");
    poke("xc-gone").await;
    let lost = scope
        .wait_session("xc-gone", "Lost", 30, |s| {
            phase(s) == Some(SessionPhase::Lost)
        })
        .await;
    let status = lost.status.expect("status");
    assert_eq!(
        status.message.as_deref(),
        Some(
            format!(
                "host {h} no longer has this session: it was destroyed there, workspace included, not through this object; it is not replaced with an empty one. Delete it (kubectl delete sbx xc-gone -n {ns}) and create it again for a new, empty workspace",
                h = host.name
            )
            .as_str()
        )
    );
    let lost_condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Lost")
        .expect("a Lost condition");
    assert_eq!(
        (
            lost_condition.status.as_str(),
            lost_condition.reason.as_str()
        ),
        ("True", "SessionGone")
    );
    match host.client().get(gone).await {
        Err(sandboxd_api::client::ClientError::NoSuchSession(_)) => {}
        other => panic!("the destroyed session is on its host again: {other:?}"),
    }
    assert!(
        host.container_ids(gone).is_empty(),
        "{:?}",
        host.containers()
    );
    assert!(!host.workspace(gone).exists());
    assert!(
        secrets
            .get_opt("xc-gone-token")
            .await
            .expect("get")
            .is_none(),
        "a token Secret was issued for a session that is gone"
    );

    // Still on its host, its token Secret deleted: a new token in a new Secret, the old one
    // refused, the workspace as it was.
    let (kept, old_token) = &opened[1];
    secrets
        .delete("xc-kept-token", &DeleteParams::default())
        .await
        .expect("delete the token Secret");
    poke("xc-kept").await;
    let again = tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(secrets.clone(), "xc-kept-token", |s: Option<&Secret>| {
            s.is_some()
        }),
    )
    .await;
    let again = match again {
        Ok(Ok(Some(s))) => s,
        other => panic!("the token Secret of xc-kept was not issued again: {other:?}"),
    };
    let new_token = token_of(&again);
    assert_ne!(&new_token, old_token);
    let refused = sandboxd_api::client::Client::new(&host.endpoint(), old_token)
        .run(kept, "true", None, None, None)
        .await;
    assert!(refused.is_err(), "the old token still works: {refused:?}");
    let run = sandboxd_api::client::Client::new(&host.endpoint(), &new_token)
        .run(kept, "cat note.txt", None, None, None)
        .await
        .expect("a run with the new token");
    assert_eq!(run.stdout, "mine\n");
    let s = scope
        .wait_session("xc-kept", "Running", 10, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    assert_eq!(
        s.status.and_then(|s| s.credentials_secret).as_deref(),
        Some("xc-kept-token")
    );
    scope.delete().await;
}
