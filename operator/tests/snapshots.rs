//! SandboxSnapshots through the operator, against the stack of `make up` and its S3 server: a
//! snapshot of a session on one host becomes Ready with its size and chunks, owned by its
//! session; a session with `spec.from` opens from it on another host (launch `restored`) with
//! the files; a session of another namespace cannot name it, a snapshot of no session fails in
//! words, and deleting a snapshot deletes it from the store. See `common`.

mod common;

use std::time::Duration;

use common::{Host, Scope, phase};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, PostParams};
use sandboxd_crds::v1alpha1::session::{Launch, SessionPhase};
use sandboxd_crds::v1alpha1::{SandboxSession, SandboxSnapshot, SnapshotPhase};
use sandboxd_tests::poll::until;
use serde_json::json;

fn snapshot_doc(scope: &Scope, ns: &str, name: &str, session: &str) -> SandboxSnapshot {
    serde_json::from_value(json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSnapshot",
        "metadata": {"name": name, "namespace": ns, "labels": scope.labels()},
        "spec": {"session": session},
    }))
    .expect("a snapshot")
}

/// Waits until snapshot `name` is Ready or Failed; returns it.
async fn settled(api: &Api<SandboxSnapshot>, name: &str) -> SandboxSnapshot {
    until(
        &format!("snapshot {name} settles"),
        Duration::from_secs(90),
        async || {
            let s = api.get(name).await.map_err(|e| e.to_string())?;
            match s.status.as_ref().and_then(|st| st.phase) {
                Some(SnapshotPhase::Ready | SnapshotPhase::Failed) => Ok(s),
                _ => Err(format!("{:?}", s.status)),
            }
        },
    )
    .await
}

fn message(s: &SandboxSnapshot) -> String {
    s.status
        .as_ref()
        .and_then(|st| st.message.clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_is_taken_and_a_session_opens_from_it_on_another_host() {
    let mut scope = Scope::new("snap").await;
    let prefix = format!("op-{}", scope.scope);
    let env = [("SANDBOXD_S3_PREFIX", prefix.as_str())];
    let a = Host::start(&format!("snap-a-{}", scope.scope), &env);
    let b = Host::start(&format!("snap-b-{}", scope.scope), &env);
    scope.register(&a).await;
    scope.register(&b).await;
    scope.default_runtime().await;
    scope.start_operator(&[]);
    scope.kubectl_apply_session("src", json!({"host": a.name}));
    let src = scope
        .wait_session("src", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let id = scope.host_id("src");
    let ran = a
        .client()
        .run(
            &id,
            "mkdir -p /workspace/notes && echo kept > /workspace/notes/a.txt && chmod 640 /workspace/notes/a.txt && ln -s notes/a.txt /workspace/link",
            None,
            None,
            None,
        )
        .await
        .expect("write");
    assert_eq!(ran.exit_code, 0, "{ran:?}");

    let snapshots = Api::<SandboxSnapshot>::namespaced(scope.client.clone(), &scope.ns);
    snapshots
        .create(
            &PostParams::default(),
            &snapshot_doc(&scope, &scope.ns, "before", "src"),
        )
        .await
        .expect("created");
    let ready = settled(&snapshots, "before").await;
    let st = ready.status.clone().expect("status");
    assert_eq!(st.phase, Some(SnapshotPhase::Ready), "{}", message(&ready));
    assert_eq!(
        st.key.as_deref(),
        Some(format!("{}/before", scope.ns).as_str())
    );
    assert_eq!(st.host.as_deref(), Some(a.name.as_str()));
    assert_eq!((st.bytes, st.entries), (Some(5), Some(3)));
    assert_eq!(st.size.as_deref(), Some("5 B"));
    assert!(
        message(&ready).starts_with(&format!(
            "taken on host {}: 5 B in 3 entries, 1 chunks",
            a.name
        )),
        "{}",
        message(&ready)
    );
    assert!(
        ready
            .owner_references()
            .iter()
            .any(|o| Some(&o.uid) == src.metadata.uid.as_ref() && o.kind == "SandboxSession"),
        "owned by its session: {:?}",
        ready.owner_references()
    );
    assert!(
        ready
            .finalizers()
            .iter()
            .any(|f| f == "sandboxd.dev/snapshot")
    );
    // The store has it, under the namespace.
    assert_eq!(
        a.client()
            .snapshot(&scope.ns, "before")
            .await
            .expect("in the store")
            .bytes,
        5
    );

    // A session from it, on the other host: the files, as launch `restored`.
    scope.kubectl_apply_session(
        "copy",
        json!({"host": b.name, "from": {"snapshot": "before"}}),
    );
    let copy = scope
        .wait_session("copy", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    assert_eq!(
        copy.status.as_ref().and_then(|s| s.launch),
        Some(Launch::Restored)
    );
    let read = b
        .client()
        .run(
            &scope.host_id("copy"),
            "stat -c '%a %u' /workspace/notes/a.txt && cat /workspace/link",
            None,
            None,
            None,
        )
        .await
        .expect("read");
    assert_eq!(read.stdout, "640 10001\nkept\n");

    // Another namespace cannot name it: its session fails, saying where it looked.
    let other = sandboxd_tests::TestNamespace::create(&scope.client, "snap-other").await;
    let thief: SandboxSession = serde_json::from_value(json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession",
        "metadata": {"name": "thief", "namespace": other.name, "labels": scope.labels()},
        "spec": {"scope": "conversation", "tenant": "org-1", "subject": "thief", "from": {"snapshot": "before"}},
    }))
    .expect("a session");
    Api::<SandboxSession>::namespaced(scope.client.clone(), &other.name)
        .create(&PostParams::default(), &thief)
        .await
        .expect("created");
    let failed = scope
        .wait_session_in(&other.name, "thief", "Failed", 60, |s| {
            phase(s) == Some(SessionPhase::Failed)
        })
        .await;
    assert_eq!(
        failed.status.and_then(|s| s.message),
        Some(format!(
            "spec.from.snapshot names SandboxSnapshot before, which does not exist in namespace {} (a session opens only from a snapshot of its own namespace)",
            other.name
        ))
    );
    let _ = Api::<SandboxSession>::namespaced(scope.client.clone(), &other.name)
        .delete("thief", &DeleteParams::default())
        .await;

    // A snapshot of no session fails in words.
    snapshots
        .create(
            &PostParams::default(),
            &snapshot_doc(&scope, &scope.ns, "orphan", "nope"),
        )
        .await
        .expect("created");
    let orphan = settled(&snapshots, "orphan").await;
    assert_eq!(
        orphan.status.as_ref().and_then(|s| s.phase),
        Some(SnapshotPhase::Failed)
    );
    assert_eq!(
        message(&orphan),
        format!(
            "SandboxSession nope does not exist in namespace {}: a snapshot is of a session of its own namespace",
            scope.ns
        )
    );

    // Deleted: gone from the store too, then the object goes.
    snapshots
        .delete("before", &DeleteParams::default())
        .await
        .expect("delete");
    common::wait_gone(snapshots.clone(), "before", 60).await;
    let gone = a
        .client()
        .snapshot(&scope.ns, "before")
        .await
        .expect_err("gone from the store");
    assert!(
        gone.to_string().starts_with("snapshot_not_found (404)"),
        "{gone}"
    );
    other.delete().await;
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_names_its_newest_snapshot_and_a_restore_opens_it_on_another_host() {
    let mut scope = Scope::new("restore").await;
    let prefix = format!("op-{}", scope.scope);
    let env = [("SANDBOXD_S3_PREFIX", prefix.as_str())];
    let a = Host::start(&format!("rst-a-{}", scope.scope), &env);
    let b = Host::start(&format!("rst-b-{}", scope.scope), &env);
    scope.register(&a).await;
    scope.register(&b).await;
    scope.default_runtime().await;
    scope.start_operator(&[]);
    scope.kubectl_apply_session("doomed", json!({}));
    let running = scope
        .wait_session("doomed", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let first = running.status.and_then(|s| s.host).expect("placed");
    let (host, other) = if first == a.name { (&a, &b) } else { (&b, &a) };
    let id = scope.host_id("doomed");
    let write = |command: &'static str| {
        let client = host.client();
        let id = id.clone();
        async move {
            let ran = client
                .run(&id, command, None, None, None)
                .await
                .expect("run");
            assert_eq!(ran.exit_code, 0, "{ran:?}");
        }
    };
    write("echo before > /workspace/kept.txt").await;
    let snapshots = Api::<SandboxSnapshot>::namespaced(scope.client.clone(), &scope.ns);
    snapshots
        .create(
            &PostParams::default(),
            &snapshot_doc(&scope, &scope.ns, "checkpoint", "doomed"),
        )
        .await
        .expect("created");
    let ready = settled(&snapshots, "checkpoint").await;
    assert_eq!(
        ready.status.as_ref().and_then(|s| s.phase),
        Some(SnapshotPhase::Ready),
        "{}",
        message(&ready)
    );
    write("echo after > /workspace/later.txt").await;

    // Its host loses the workspace: Lost, naming the snapshot it can be restored from.
    std::fs::remove_dir_all(host.sandboxd.workspace_root.join(&id)).expect("delete on the host");
    let lost = scope
        .wait_session("doomed", "Lost with its newest snapshot", 60, |s| {
            phase(s) == Some(SessionPhase::Lost)
                && s.status
                    .as_ref()
                    .is_some_and(|st| st.newest_snapshot.is_some())
        })
        .await;
    let st = lost.status.clone().expect("status");
    assert_eq!(
        st.newest_snapshot.map(|n| n.name).as_deref(),
        Some("checkpoint")
    );
    let m = st.message.unwrap_or_default();
    assert!(
        m.contains("its newest snapshot is checkpoint, taken ")
            && m.ends_with(": kubectl sandbox restore doomed opens it from that on another host"),
        "{m}"
    );

    // A restore naming no snapshot of it changes nothing but the words.
    let sessions = scope.sessions();
    sessions
        .patch(
            "doomed",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"restore": {"snapshot": "nope"}}})),
        )
        .await
        .expect("patched");
    scope
        .wait_session("doomed", "Lost, saying the snapshot is not one", 30, |s| {
            s.status.as_ref().and_then(|st| st.message.clone()).is_some_and(|m| {
                m.starts_with("spec.restore names SandboxSnapshot nope, which is not a snapshot of this session")
            })
        })
        .await;

    // Restored: on the other host, with the snapshot's files (not what came after).
    sessions
        .patch(
            "doomed",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"restore": {"snapshot": "checkpoint"}}})),
        )
        .await
        .expect("patched");
    let back = scope
        .wait_session("doomed", "Running again", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let st = back.status.expect("status");
    assert_eq!(
        st.host.as_deref(),
        Some(other.name.as_str()),
        "another host"
    );
    assert_eq!(st.launch, Some(Launch::Restored));
    let from = st.restored_from.expect("restored from");
    assert_eq!(
        (from.name.as_str(), from.lost_host.as_deref()),
        ("checkpoint", Some(host.name.as_str()))
    );
    let read = other
        .client()
        .run(
            &id,
            "cat /workspace/kept.txt; ls /workspace",
            None,
            None,
            None,
        )
        .await
        .expect("read");
    assert_eq!(read.stdout, "before\nkept.txt\n");
    // The host that lost it holds nothing of it any more (its Tombstone destroyed it).
    let old = host.client();
    until(
        "the old copy destroyed",
        Duration::from_secs(60),
        async || match old.get(&id).await {
            Err(sandboxd_api::client::ClientError::NoSuchSession(_)) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    scope.delete().await;
}
