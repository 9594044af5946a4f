//! Rebuilds against the real dockerd: a session moves to its runtime's new image and to new
//! limits with its workspace kept (the disk grown in place, never shrunk), runs in flight are
//! stopped with words, an image that is not there changes nothing, and a `kill -9` in the
//! middle of a rebuild leaves the workspace intact and the session rebuildable.
//!
//! Every workspace here is a loop-mounted disk of its own (SANDBOXD_WORKSPACE_QUOTA=loop): the
//! tests need root and loop devices, and fail (never skip) without them.

mod common;

use std::time::Duration;

use common::{Daemon, base_image, container_of, docker, until};
use sandboxd_api::client::ClientError;
use sandboxd_api::session::RebuildRequest;
use sandboxd_api::{ErrorCode, Limits, SessionState};
use sandboxd_catalog::CatalogEntry;

fn start() -> Daemon {
    Daemon::start(&[
        ("SANDBOXD_WORKSPACE_QUOTA", "loop"),
        ("SANDBOXD_WORKSPACE_SIZE", "256m"),
        ("SANDBOXD_MEM_LIMIT", "1g"),
    ])
}

/// A new local tag of the base image: a "new image" of the runtime without a build.
fn new_tag(name: &str) -> String {
    let tag = format!("sandboxd-rebuild-test:{name}-{}", std::process::id());
    docker(&["tag", &base_image(), &tag]);
    tag
}

/// The allowlist with runtime `base` at `image`.
async fn runtime_at(d: &Daemon, image: &str) {
    let entries: Vec<CatalogEntry> = serde_json::from_value(serde_json::json!([
        {"alias": "base", "image": image},
        {"alias": "alt", "image": base_image()},
    ]))
    .expect("entries");
    d.admin()
        .put_runtimes(&entries)
        .await
        .expect("put runtimes");
}

fn inspect(container: &str, format: &str) -> String {
    docker(&["inspect", "--format", format, container])
}

#[tokio::test]
async fn a_rebuild_moves_a_running_session_to_the_new_image_and_limits_and_keeps_its_files() {
    let d = start();
    let admin = d.admin();
    let limits = Limits {
        mem_limit: Some("256m".to_owned()),
        workspace_size: Some("32m".to_owned()),
        ..Default::default()
    };
    admin
        .open("s1", "org", Some("base"), Some(&limits))
        .await
        .expect("open");
    let before = container_of(&d, "s1");
    let ran = admin
        .run("s1", "echo kept > /workspace/keep.txt", None, None, None)
        .await
        .expect("write");
    assert_eq!(ran.exit_code, 0, "{ran:?}");

    // The runtime moves to a new tag: the session shows it runs an old image.
    let tag = new_tag("a");
    runtime_at(&d, &tag).await;
    let view = admin.get("s1").await.expect("get");
    assert_eq!(view.image, base_image());
    assert_eq!(view.runtime_image.as_deref(), Some(tag.as_str()));
    assert_eq!(view.limits.mem_limit.as_deref(), Some("256m"));

    // A run in flight when the rebuild starts is stopped, and says why.
    let runner = admin.clone();
    let in_flight =
        tokio::spawn(async move { runner.run("s1", "sleep 60", Some(120), None, None).await });
    until("the run is in flight", Duration::from_secs(20), || async {
        let v = admin.get("s1").await.map_err(|e| e.to_string())?;
        (v.runs_in_flight == 1)
            .then_some(())
            .ok_or(format!("{v:?}"))
    })
    .await;
    let grown = Limits {
        mem_limit: Some("512m".to_owned()),
        workspace_size: Some("64m".to_owned()),
        ..Default::default()
    };
    let rebuilt = admin
        .rebuild(
            "s1",
            &RebuildRequest {
                image: Some(tag.clone()),
                limits: Some(grown.clone()),
                idle_only: false,
            },
        )
        .await
        .expect("rebuild");
    assert_eq!(rebuilt.state, SessionState::Running);
    assert_eq!(rebuilt.image, tag);
    assert_eq!(rebuilt.runtime_image.as_deref(), Some(tag.as_str()));
    assert_eq!(rebuilt.limits.mem_limit.as_deref(), Some("512m"));
    assert_eq!(
        rebuilt.limits.workspace_size.as_deref(),
        Some((64u64 << 20).to_string().as_str())
    );
    match in_flight.await.expect("the run's task") {
        Err(ClientError::Api {
            status: 409,
            code: ErrorCode::SessionRebuilding,
            message,
        }) => assert_eq!(
            message,
            "The run was stopped: session 's1' is being rebuilt (its container is recreated from its runtime's current image; the workspace stays); run it again once the session runs"
        ),
        other => panic!("the run in flight should be stopped for the rebuild: {other:?}"),
    }

    // A new container, of the new image, with the new memory limit.
    let after = container_of(&d, "s1");
    assert_ne!(after, before, "a new container");
    assert_eq!(inspect(&after, "{{.Config.Image}}"), tag);
    assert_eq!(
        inspect(&after, "{{.HostConfig.Memory}}"),
        (512u64 << 20).to_string()
    );
    assert!(
        std::process::Command::new("docker")
            .args(["inspect", &before])
            .output()
            .is_ok_and(|o| !o.status.success()),
        "the old container is gone"
    );

    // The files are there, and the workspace holds more than its old size.
    let cat = admin
        .run(
            "s1",
            "cat /workspace/keep.txt && dd if=/dev/zero of=/workspace/big bs=1M count=48 2>&1 && echo wrote",
            Some(60),
            None,
            None,
        )
        .await
        .expect("run on the new container");
    assert_eq!(cat.exit_code, 0, "{cat:?}");
    assert!(cat.stdout.starts_with("kept\n"), "{cat:?}");
    assert!(cat.stdout.ends_with("wrote\n"), "{cat:?}");
    assert_eq!(
        d.workspace_root()
            .join("s1/workspace.img")
            .metadata()
            .expect("image")
            .len(),
        64 << 20
    );

    // It never shrinks: refused, naming the size it has.
    let shrink = admin
        .rebuild(
            "s1",
            &RebuildRequest {
                limits: Some(Limits {
                    workspace_size: Some("32m".to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .expect_err("a smaller workspace is refused");
    assert_eq!(
        shrink.to_string(),
        "bad_request (400): limits.workspace_size '32m' is smaller than the workspace of session 's1', which is 64 MiB now: a workspace grows but never shrinks"
    );
    assert_eq!(container_of(&d, "s1"), after, "a refusal changes nothing");

    // An image the caller did not expect is refused before anything changes.
    let wrong = admin
        .rebuild(
            "s1",
            &RebuildRequest {
                image: Some(base_image()),
                ..Default::default()
            },
        )
        .await
        .expect_err("another image is refused");
    assert_eq!(
        wrong.to_string(),
        format!(
            "rebuild_refused (409): runtime 'base' is at image {tag} on this host, not {}: the session was not rebuilt",
            base_image()
        )
    );

    // A larger disk asked of a busy session that may only be rebuilt idle is refused, and the
    // host's workspace budget still counts the disk it has (a refusal takes none of it).
    let held = || async {
        let text = reqwest::get(format!("{}/metrics", d.base))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        text.lines()
            .find_map(|l| l.strip_prefix("sandboxd_workspace_held_bytes "))
            .map(str::to_owned)
            .expect("sandboxd_workspace_held_bytes")
    };
    let held_before = held().await;
    let runner = admin.clone();
    let busy_run = tokio::spawn(async move { runner.run("s1", "sleep 3", None, None, None).await });
    common::until(
        "the run in flight",
        Duration::from_secs(10),
        async || match admin.get("s1").await {
            Ok(v) if v.runs_in_flight == 1 => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    let busy = admin
        .rebuild(
            "s1",
            &RebuildRequest {
                limits: Some(Limits {
                    workspace_size: Some("128m".to_owned()),
                    ..Default::default()
                }),
                idle_only: true,
                ..Default::default()
            },
        )
        .await
        .expect_err("a busy session is not rebuilt when only an idle one may be");
    assert_eq!(
        busy.to_string(),
        "rebuild_refused (409): session 's1' has 1 run(s) in flight and the rebuild asked for an idle session: it was not rebuilt"
    );
    assert_eq!(held().await, held_before, "the refusal took no budget");
    let ran = busy_run.await.expect("the run's task").expect("the run");
    assert_eq!(ran.exit_code, 0, "{ran:?}");

    // The audit log has the rebuild, its target the image.
    let rows = admin
        .operations(&sandboxd_api::audit::OperationQuery {
            session: Some("s1".to_owned()),
            op: Some(sandboxd_api::audit::Op::Rebuild),
            ..Default::default()
        })
        .await
        .expect("operations");
    assert!(
        rows.operations.iter().any(|o| o.ok && o.target == tag),
        "{rows:?}"
    );
    docker(&["rmi", &tag]);
}

#[tokio::test]
async fn a_stopped_session_is_rebuilt_without_a_container_and_wakes_on_the_new_image() {
    let d = start();
    let admin = d.admin();
    admin
        .open("s2", "org", Some("base"), None)
        .await
        .expect("open");
    admin
        .run("s2", "echo kept > /workspace/keep.txt", None, None, None)
        .await
        .expect("write");
    admin.stop("s2").await.expect("stop");
    let tag = new_tag("b");
    runtime_at(&d, &tag).await;
    let rebuilt = admin
        .rebuild("s2", &RebuildRequest::default())
        .await
        .expect("rebuild");
    assert_eq!(rebuilt.state, SessionState::Reclaimed);
    assert_eq!(rebuilt.image, tag);
    assert!(
        d.containers().iter().all(|c| c.1 != "s2"),
        "no container while asleep"
    );
    let cat = admin
        .run("s2", "cat /workspace/keep.txt", None, None, None)
        .await
        .expect("the run wakes it");
    assert_eq!(cat.stdout, "kept\n");
    assert_eq!(inspect(&container_of(&d, "s2"), "{{.Config.Image}}"), tag);
    docker(&["rmi", "--force", &tag]);
}

#[tokio::test]
async fn a_rebuild_to_an_image_that_is_not_there_changes_nothing() {
    let d = start();
    let admin = d.admin();
    admin
        .open("s3", "org", Some("base"), None)
        .await
        .expect("open");
    admin
        .run("s3", "echo kept > /workspace/keep.txt", None, None, None)
        .await
        .expect("write");
    let before = container_of(&d, "s3");
    // A registry on a closed loopback port: the pull fails without leaving the machine.
    runtime_at(&d, "127.0.0.1:1/sandboxd-rebuild-test:never-built").await;
    let refused = until(
        "the rebuild is refused",
        Duration::from_secs(120),
        || async {
            match admin.rebuild("s3", &RebuildRequest::default()).await {
                Err(ClientError::Api {
                    code: ErrorCode::RuntimeFailed,
                    message,
                    ..
                }) => Ok(message),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert!(
        refused.starts_with("Runtime 'base' could not be built after"),
        "{refused}"
    );
    assert_eq!(container_of(&d, "s3"), before, "the old container stays");
    let cat = admin
        .run("s3", "cat /workspace/keep.txt", None, None, None)
        .await
        .expect("still runs");
    assert_eq!(cat.stdout, "kept\n");
}

#[tokio::test]
async fn kill_9_in_the_middle_of_a_rebuild_keeps_the_workspace_and_the_session_converges() {
    let mut d = start();
    let admin = d.admin();
    admin
        .open("s4", "org", Some("base"), None)
        .await
        .expect("open");
    admin
        .run("s4", "echo kept > /workspace/keep.txt", None, None, None)
        .await
        .expect("write");
    let tag = new_tag("c");
    runtime_at(&d, &tag).await;
    let rebuilding = admin.clone();
    let call =
        tokio::spawn(async move { rebuilding.rebuild("s4", &RebuildRequest::default()).await });
    // Cut somewhere in the rebuild (its Docker work takes a second or more).
    tokio::time::sleep(Duration::from_millis(300)).await;
    d.process.kill9();
    let _ = call.await;
    d.spawn();
    runtime_at(&d, &tag).await;
    let admin = d.admin();
    let after = admin.get("s4").await.expect("get");
    assert!(
        matches!(after.state, SessionState::Running | SessionState::Reclaimed),
        "{after:?}"
    );
    assert!(after.workspace_exists, "{after:?}");
    // Rebuilt again (or woken), it runs on the new image with its files.
    let rebuilt = admin
        .rebuild("s4", &RebuildRequest::default())
        .await
        .expect("rebuild after the restart");
    assert_eq!(rebuilt.image, tag);
    let cat = admin
        .run("s4", "cat /workspace/keep.txt", None, None, None)
        .await
        .expect("run");
    assert_eq!(cat.stdout, "kept\n");
    assert_eq!(inspect(&container_of(&d, "s4"), "{{.Config.Image}}"), tag);
    docker(&["rmi", "--force", &tag]);
}
