//! Deleting a session, and making one again under its name: a delete destroys the sandbox
//! through a Tombstone, even across a host outage; a deleted namespace takes every container
//! with it; an object of the same name in another namespace neither takes over nor destroys
//! the sandbox; a session deleted and made again under its name ends alive, waits for the
//! pending Tombstone of the deleted one, and never gets a workspace its host holds for another
//! owner. Against the stack of `make up` (see `common`).
//!
//! Over 600 lines: one test a scenario of a name's deletion and reuse, each read whole.

mod common;

use std::time::Duration;

use common::{
    Host, Scope, assert_sleeps_at_shown, assert_waits_for_another_owner, credentials, phase,
    wait_gone,
};
use kube::api::{Api, DeleteParams};
use kube::runtime::wait::await_condition;
use sandboxd_crds::v1alpha1::Tombstone;
use sandboxd_crds::v1alpha1::session::SessionPhase;
use sandboxd_tests::poll::{nothing_left, until_every};

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
    // Prometheus sees it: the host unreachable, one Tombstone owed since it was made.
    let created = tombstones
        .get(&tomb)
        .await
        .expect("the tombstone")
        .metadata
        .creation_timestamp
        .expect("made")
        .0
        .as_second();
    let host_name = host.name.clone();
    let metrics_of = |wants: Vec<String>| {
        let url = format!("{}/metrics", scope.health_url(0));
        async move {
            until_every(
                "the operator's metrics",
                Duration::from_secs(15),
                Duration::from_millis(200),
                async || {
                    let metrics = reqwest::get(&url)
                        .await
                        .map_err(|e| e.to_string())?
                        .text()
                        .await
                        .map_err(|e| e.to_string())?;
                    let missing: Vec<&str> = wants
                        .iter()
                        .map(String::as_str)
                        .filter(|w| !metrics.contains(&format!("{w}\n")))
                        .collect();
                    nothing_left("missing", &missing).map_err(|e| format!("{e}, from:\n{metrics}"))
                },
            )
            .await
        }
    };
    metrics_of(vec![
        "sandbox_operator_tombstones_pending 1".to_owned(),
        format!("sandbox_operator_tombstones_oldest_timestamp_seconds {created}"),
        format!("sandbox_operator_host_reachable{{host=\"{host_name}\"}} 0"),
        format!("sandbox_operator_host_ready{{host=\"{host_name}\"}} 0"),
    ])
    .await;
    host.spawn();
    wait_gone(tombstones.clone(), &tomb, 30).await;
    metrics_of(vec![
        "sandbox_operator_tombstones_pending 0".to_owned(),
        "sandbox_operator_tombstones_oldest_timestamp_seconds 0".to_owned(),
        format!("sandbox_operator_host_reachable{{host=\"{host_name}\"}} 1"),
        format!("sandbox_operator_host_ready{{host=\"{host_name}\"}} 1"),
    ])
    .await;
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
