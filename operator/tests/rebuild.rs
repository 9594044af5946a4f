//! Rebuilds: a Runtime's new image and new resources show on its sessions, and a rebuild moves
//! a session with its files; rolling rebuilds take the idle sessions, leave a busy one until
//! its run ends, and wake a sleeping one on the new image. Against the stack of `make up` (see
//! `common`).

mod common;

use std::time::Duration;

use common::{Host, Scope, inspect, phase};
use kube::api::{Api, Patch, PatchParams};
use sandboxd_crds::v1alpha1::Runtime;
use sandboxd_crds::v1alpha1::session::SessionPhase;
use sandboxd_tests::poll::until_every;

fn rebuild_needed(s: &sandboxd_crds::v1alpha1::SandboxSession) -> Option<(String, String)> {
    s.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "RebuildNeeded")
        .map(|c| (c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtimes_new_image_and_new_resources_show_and_a_rebuild_moves_the_session_with_its_files()
 {
    let mut scope = Scope::new("rebuild").await;
    let host = Host::start(&format!("rebuild-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    scope.start_operator(&[]);
    scope.kubectl_apply_session(
        "xc-rebuild",
        serde_json::json!({"resources": {"memLimit": "128m"}}),
    );
    scope
        .wait_session("xc-rebuild", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let id = scope.host_id("xc-rebuild");
    let admin = host.client();
    admin
        .run(&id, "echo kept > /workspace/keep.txt", None, None, None)
        .await
        .expect("write");
    let old = inspect(&host, &id, "{{.Id}}");

    // The Runtime moves to a new tag of the image: the session says it runs the old one.
    let tag = format!("sandboxd-rebuild-e2e:{}", scope.scope);
    let base = sandboxd_tests::base_image();
    let tagged = std::process::Command::new("docker")
        .args(["tag", &base, &tag])
        .status()
        .expect("docker tag");
    assert!(tagged.success());
    let runtimes = Api::<Runtime>::all(scope.client.clone());
    runtimes
        .patch(
            &format!("base-{}", scope.scope),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"image": tag, "rebuildPolicy": "Manual"}})),
        )
        .await
        .expect("the Runtime's image changed");
    let drifted = scope
        .wait_session("xc-rebuild", "RebuildNeeded", 60, |s| {
            rebuild_needed(s).is_some()
        })
        .await;
    assert_eq!(
        rebuild_needed(&drifted),
        Some((
            "ImageChanged".to_owned(),
            format!(
                "the container runs image {base}; its Runtime is now {tag} on host {}; a rebuild (kubectl sandbox rebuild) moves it, the workspace kept",
                host.name
            )
        ))
    );
    assert_eq!(
        phase(&drifted),
        Some(SessionPhase::Running),
        "Manual: nothing moves by itself"
    );

    // More memory asked too; then a rebuild by hand.
    let sessions = scope.sessions();
    sessions
        .patch(
            "xc-rebuild",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"resources": {"memLimit": "192m"}, "rebuildGeneration": 1}})),
        )
        .await
        .expect("spec.resources may change on an open session");
    let rebuilt = scope
        .wait_session("xc-rebuild", "rebuilt and Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
                && s.status.as_ref().and_then(|st| st.rebuild_generation) == Some(1)
        })
        .await;
    assert_eq!(rebuild_needed(&rebuilt), None, "the condition is gone");
    let st = rebuilt.status.expect("status");
    assert_eq!(st.image.as_deref(), Some(tag.as_str()));
    assert!(st.rebuilt_at.is_some());
    assert_ne!(inspect(&host, &id, "{{.Id}}"), old, "a new container");
    assert_eq!(inspect(&host, &id, "{{.Config.Image}}"), tag);
    assert_eq!(
        inspect(&host, &id, "{{.HostConfig.Memory}}"),
        (192u64 << 20).to_string()
    );
    let cat = admin
        .run(&id, "cat /workspace/keep.txt", None, None, None)
        .await
        .expect("run");
    assert_eq!(cat.stdout, "kept\n");

    // An image that is not there (a registry on a closed loopback port: the pull fails
    // without leaving the machine): the rebuild fails with words and keeps the files.
    runtimes
        .patch(
            &format!("base-{}", scope.scope),
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"spec": {"image": "127.0.0.1:1/sandboxd-rebuild-e2e:never-built"}}),
            ),
        )
        .await
        .expect("the Runtime's image changed");
    // Asked for in the same breath as the Runtime's change, the rebuild waits until the host
    // has the Runtime's new definition: it goes to the new image (and fails there), never to
    // the one the host had a moment before.
    sessions
        .patch(
            "xc-rebuild",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"rebuildGeneration": 2}})),
        )
        .await
        .expect("rebuild asked");
    let failed = scope
        .wait_session("xc-rebuild", "Failed with the host's words", 180, |s| {
            phase(s) == Some(SessionPhase::Failed)
        })
        .await;
    let m = failed.status.and_then(|st| st.message).unwrap_or_default();
    assert!(
        m.starts_with(&format!(
            "the rebuild on host {} failed: Runtime 'base-{}' could not be built after",
            host.name, scope.scope
        )),
        "{m}"
    );
    assert!(m.ends_with("The workspace is kept; try again with `kubectl sandbox rebuild xc-rebuild` once that is fixed, or wake the session"), "{m}");
    assert!(host.workspace(&id).join("keep.txt").exists());
    let _ = std::process::Command::new("docker")
        .args(["rmi", "--force", &tag])
        .status();
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_rebuilds_idle_sessions_leaves_a_busy_one_until_its_run_ends_and_a_sleeping_one_wakes_on_the_new_image()
 {
    let mut scope = Scope::new("rolling").await;
    let host = Host::start(&format!("rolling-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.default_runtime().await;
    scope.start_operator(&[]);
    let names = ["xc-idle-1", "xc-idle-2", "xc-busy", "xc-asleep"];
    for name in names {
        scope.kubectl_apply_session(name, serde_json::json!({}));
    }
    for name in names {
        scope
            .wait_session(name, "Running", 90, |s| {
                phase(s) == Some(SessionPhase::Running)
            })
            .await;
    }
    let admin = host.client();
    for name in names {
        admin
            .run(
                &scope.host_id(name),
                "echo kept > /workspace/keep.txt",
                None,
                None,
                None,
            )
            .await
            .expect("write");
    }
    admin
        .stop(&scope.host_id("xc-asleep"))
        .await
        .expect("put to sleep");
    let busy_id = scope.host_id("xc-busy");
    let runner = admin.clone();
    let busy_run = {
        let id = busy_id.clone();
        tokio::spawn(async move {
            runner
                .run(&id, "sleep 25; echo done", Some(120), None, None)
                .await
        })
    };
    until_every(
        "the busy session's run is in flight",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            let v = admin.get(&busy_id).await.map_err(|e| e.to_string())?;
            (v.runs_in_flight == 1)
                .then_some(())
                .ok_or(format!("{v:?}"))
        },
    )
    .await;

    let tag = format!("sandboxd-rolling-e2e:{}", scope.scope);
    let tagged = std::process::Command::new("docker")
        .args(["tag", &sandboxd_tests::base_image(), &tag])
        .status()
        .expect("docker tag");
    assert!(tagged.success());
    Api::<Runtime>::all(scope.client.clone())
        .patch(
            &format!("base-{}", scope.scope),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"image": tag, "rebuildPolicy": "Rolling", "maxUnavailable": 1}})),
        )
        .await
        .expect("the Runtime's image changed");
    let on_new = |s: &sandboxd_crds::v1alpha1::SandboxSession| {
        s.status.as_ref().and_then(|st| st.image.as_deref()) == Some(tag.as_str())
            && rebuild_needed(s).is_none()
    };
    for name in ["xc-idle-1", "xc-idle-2"] {
        let s = scope
            .wait_session(
                name,
                "rebuilt on the new image by the rolling policy",
                60,
                |s| on_new(s) && phase(s) == Some(SessionPhase::Running),
            )
            .await;
        assert_eq!(
            inspect(&host, &scope.host_id(name), "{{.Config.Image}}"),
            tag
        );
        assert!(s.status.and_then(|st| st.rebuilt_at).is_some());
    }
    // OnWake: the sleeping one lost its old container while asleep, and wakes on the new image.
    scope
        .wait_session("xc-asleep", "rebuilt while asleep", 60, |s| on_new(s))
        .await;
    let woke = admin
        .run(
            &scope.host_id("xc-asleep"),
            "cat /workspace/keep.txt",
            None,
            None,
            None,
        )
        .await
        .expect("a run wakes it");
    assert_eq!(woke.stdout, "kept\n");
    assert_eq!(
        inspect(&host, &scope.host_id("xc-asleep"), "{{.Config.Image}}"),
        tag
    );
    // The busy one: still on the old image while its run goes on.
    let busy = scope.sessions().get("xc-busy").await.expect("get");
    assert_eq!(
        rebuild_needed(&busy).map(|(reason, _)| reason).as_deref(),
        Some("ImageChanged"),
        "{:?}",
        busy.status
    );
    let ran = busy_run
        .await
        .expect("task")
        .expect("the run in flight is not stopped");
    assert_eq!(ran.stdout, "done\n");
    scope
        .wait_session("xc-busy", "rebuilt once its run ended", 90, |s| {
            on_new(s) && phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let cat = admin
        .run(&busy_id, "cat /workspace/keep.txt", None, None, None)
        .await
        .expect("run");
    assert_eq!(cat.stdout, "kept\n");
    let _ = std::process::Command::new("docker")
        .args(["rmi", "--force", &tag])
        .status();
    scope.delete().await;
}
