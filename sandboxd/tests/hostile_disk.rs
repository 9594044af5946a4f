//! A hostile sandbox against the node's disk, on the real dockerd: a sandbox that writes
//! without end fills its own workspace disk ("No space left on device" inside, 507 through
//! both HTTP surfaces) and nothing else; the image's root is read-only and its home and /tmp
//! are bounded; other sessions and sandboxd's own state keep working; destroy frees the disk.
//!
//! Every workspace here is a loop-mounted disk of its own (SANDBOXD_WORKSPACE_QUOTA=loop):
//! the tests need root and loop devices, and fail (never skip) without them.

mod common;

use std::path::Path;
use std::process::Command;

use common::{Daemon, base_image, raw, until};
use sandboxd::storage::audit::{Op, OperationQuery};
use sandboxd_api::Limits;

/// Bytes the files under `path` take on its own filesystem (not crossing into mounts): what
/// a session folder takes from the node's disk.
fn node_bytes(path: &Path) -> u64 {
    let out = Command::new("du")
        .args(["-x", "-s", "-B1"])
        .arg(path)
        .output()
        .expect("du runs");
    let used: u64 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("du {} answered {out:?}", path.display()));
    // Less a MiB for the folders themselves and the agent's socket folder.
    used.saturating_sub(1 << 20)
}

fn limits(size: &str) -> Limits {
    Limits {
        workspace_size: Some(size.to_owned()),
        ..Default::default()
    }
}

/// A /v1 write of `bytes` bytes: the status and the body.
async fn v1_write(d: &Daemon, token: &str, id: &str, path: &str, bytes: usize) -> (u16, String) {
    let resp = reqwest::Client::new()
        .put(format!("{}/v1/sessions/{id}/files/{path}", d.base))
        .bearer_auth(token)
        .body(vec![7u8; bytes])
        .send()
        .await
        .expect("sandboxd answers");
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap_or_default())
}

/// A write over the pydantic-ai-backend wire surface: the status and the body.
async fn wire_write(
    d: &Daemon,
    token: &str,
    id: &str,
    path: &str,
    bytes: usize,
) -> (u16, serde_json::Value) {
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/sessions/{id}/files/write?path={}",
            d.base,
            urlencoding::encode(path)
        ))
        .header("x-sandbox-token", token)
        .body(vec![7u8; bytes])
        .send()
        .await
        .expect("sandboxd answers");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

fn disk_daemon(extra: &[(&str, &str)]) -> Daemon {
    let mut env = vec![
        ("SANDBOXD_WORKSPACE_QUOTA", "loop"),
        ("SANDBOXD_WORKSPACE_SIZE", "256m"),
    ];
    env.extend_from_slice(extra);
    Daemon::start(&env)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dd_fills_only_its_own_workspace() {
    let mut d = disk_daemon(&[]);
    let admin = d.admin();
    let big = admin
        .open("disk-big", "org-disk", None, Some(&limits("64m")))
        .await
        .expect("open the attacker");
    let big_token = big.token.expect("token");
    let other = admin
        .open("disk-other", "org-disk", None, None)
        .await
        .expect("open the bystander");
    let other_token = other.token.expect("token");
    let b = d.client(&big_token);
    let o = d.client(&other_token);

    // Both disks have their full size from the open (sparse: the node gives them what they
    // write, and the workspace budget counts their full size).
    let image = d.workspace_root().join("disk-big/workspace.img");
    assert_eq!(
        std::fs::metadata(&image).expect("the disk image").len(),
        64 << 20
    );

    // The attack.
    let dd = common::write_past_its_disk(
        &b,
        "disk-big",
        200,
        "df -B1 --output=size /workspace | tail -1",
    )
    .await;
    let size_inside: u64 = dd
        .stdout
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("df inside: {dd:?}"));
    assert!(
        size_inside <= 64 << 20,
        "the sandbox sees its disk's size: {size_inside}"
    );
    // What the session takes from the node's disk is its disk, and not a byte more (the
    // machine's free space is no measure: other builds share it).
    let taken = node_bytes(&d.workspace_root().join("disk-big"));
    assert!(
        taken <= 64 << 20,
        "the session takes {taken} bytes of the node's disk"
    );

    // Through the API: 507 and what to do.
    let (status, body) = v1_write(&d, &big_token, "disk-big", "more.bin", 4 << 20).await;
    assert_eq!(status, 507, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).expect("a JSON error");
    assert_eq!(body["code"], "workspace_full");
    assert_eq!(
        body["message"],
        "No space left on device: the workspace is full (it holds at most 64 MiB); 'more.bin' was not written. Remove files to make room"
    );
    let (status, body) =
        wire_write(&d, &big_token, "disk-big", "/workspace/wire.bin", 4 << 20).await;
    assert_eq!(status, 507, "{body}");
    assert_eq!(body["detail"]["error"], "OSError");
    assert!(
        body["detail"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with(
                "No space left on device: the workspace is full (it holds at most 64 MiB)"
            )),
        "{body}"
    );
    // A failed write leaves no temporary file behind.
    let left = b.ls("disk-big", "").await.expect("ls");
    assert_eq!(
        left.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
        ["x"]
    );

    // The bystander writes and runs; sandboxd's state and audit keep working.
    let (status, body) = v1_write(&d, &other_token, "disk-other", "fine.bin", 4 << 20).await;
    assert_eq!(status, 200, "{body}");
    let ok = o
        .run(
            "disk-other",
            "echo ok > /workspace/o && cat /workspace/o",
            Some(30),
            None,
            None,
        )
        .await
        .expect("the bystander runs");
    assert_eq!((ok.exit_code, ok.stdout.as_str()), (0, "ok\n"));
    let third = admin
        .open("disk-third", "org-disk", None, Some(&limits("32m")))
        .await
        .expect("a new session opens");
    assert!(third.created);
    let page = until(
        "the failed writes reach the audit log",
        std::time::Duration::from_secs(30),
        || async {
            let page = admin
                .operations(&OperationQuery {
                    session: Some("disk-big".into()),
                    op: Some(Op::Write),
                    failed: true,
                    ..Default::default()
                })
                .await
                .expect("the audit answers");
            (page.operations.len() >= 2).then_some(page)
        },
    )
    .await;
    assert!(
        page.operations
            .iter()
            .all(|r| r.error.as_deref() == Some("workspace_full")),
        "{:?}",
        page.operations
    );

    // Room again once the file is gone.
    let rm = b
        .run("disk-big", "rm /workspace/x", Some(30), None, None)
        .await
        .expect("rm");
    assert_eq!(rm.exit_code, 0, "{rm:?}");
    let (status, body) = v1_write(&d, &big_token, "disk-big", "more.bin", 4 << 20).await;
    assert_eq!(status, 200, "{body}");

    // The disk outlives sandboxd and the mount (a node restart): mounted again at start,
    // files intact, never an empty folder in its place.
    d.process.kill9();
    let mount = d.workspace_root().join("disk-big/workspace");
    let status = Command::new("umount").arg(&mount).status().expect("umount");
    assert!(status.success());
    d.spawn();
    let back = d
        .client(&big_token)
        .read("disk-big", "more.bin", 0, None)
        .await
        .expect("the file is back");
    assert_eq!(back.len(), 4 << 20);

    // A disk whose image is gone is a lost session, never an empty disk in its place.
    let third_token = third.token.as_deref().expect("token");
    let mount = d.workspace_root().join("disk-third/workspace");
    assert!(
        Command::new("umount")
            .arg(&mount)
            .status()
            .expect("umount")
            .success()
    );
    std::fs::remove_file(d.workspace_root().join("disk-third/workspace.img"))
        .expect("rm the image");
    let (status, body) = v1_write(&d, third_token, "disk-third", "a.txt", 10).await;
    assert_eq!(status, 410, "{body}");
    assert!(body.contains("session_lost"), "{body}");
    assert_eq!(
        d.admin().get("disk-third").await.expect("get").state,
        sandboxd_api::SessionState::Lost
    );

    // Destroy frees the disk: no mount, no image.
    let admin = d.admin();
    for id in ["disk-big", "disk-other", "disk-third"] {
        assert!(admin.destroy(id).await.expect("destroy").destroyed);
        assert!(!d.workspace_root().join(id).exists(), "{id} left files");
    }
    assert_eq!(d.mounts(), Vec::<std::path::PathBuf>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_root_is_read_only_and_home_is_bounded() {
    // A runtime whose image says HOME is a folder of the image, as the built runtimes do.
    let catalog = serde_json::json!([
        {"alias": "base", "image": base_image()},
        {"alias": "homed", "image": base_image(), "env_vars": {"HOME": "/home/sandbox"}},
    ])
    .to_string();
    let d = disk_daemon(&[("SANDBOXD_RUNTIMES", &catalog)]);
    let opened = d
        .admin()
        .open("disk-root", "org-disk", Some("homed"), Some(&limits("32m")))
        .await
        .expect("open");
    let c = d.client(opened.token.as_deref().expect("token"));
    let container = d
        .containers()
        .into_iter()
        .find(|(_, s, _)| s == "disk-root")
        .expect("the container")
        .0;

    // /var/tmp is world-writable in the image: without a read-only root it fills the node.
    for target in ["/x", "/var/tmp/x", "/usr/x"] {
        let out = c
            .run(
                "disk-root",
                &format!("dd if=/dev/zero of={target} bs=1M count=100 conv=notrunc"),
                Some(60),
                None,
                None,
            )
            .await
            .expect("the run answers");
        assert_ne!(out.exit_code, 0, "{target}: {out:?}");
        // gVisor checks the folder's permission before the mount's read-only flag (Linux the
        // other way round): a folder the sandbox's uid may not write is refused for that
        // there; the world-writable /var/tmp only by the read-only root, on both.
        let refused_there = common::on_gvisor()
            && target != "/var/tmp/x"
            && out.stderr.contains("Permission denied");
        assert!(
            out.stderr.contains("Read-only file system") || refused_there,
            "{target} must be read-only: {out:?}"
        );
    }
    // Docker's own files in the container are root's, and mounted read-only too.
    let hosts = c
        .run("disk-root", "echo x >> /etc/hosts", Some(30), None, None)
        .await
        .expect("the run answers");
    assert_ne!(hosts.exit_code, 0, "{hosts:?}");
    for target in ["$HOME/x", "/tmp/x", "/dev/shm/x"] {
        let out = c
            .run(
                "disk-root",
                &format!("echo \"home=$HOME\"; dd if=/dev/zero of={target} bs=1M count=300; echo \"dd exit $?\"; rm -f {target}"),
                Some(60),
                None,
                None,
            )
            .await
            .expect("the run answers");
        assert!(out.stdout.contains("home=/home/sandbox"), "{out:?}");
        assert!(
            out.stderr.contains("No space left on device") && !out.stdout.contains("dd exit 0"),
            "{target} must be bounded: {out:?}"
        );
    }
    let home = c
        .run(
            "disk-root",
            "cd && touch kept && ls -ld . && ls",
            Some(30),
            None,
            None,
        )
        .await
        .expect("home is writable");
    assert_eq!(home.exit_code, 0, "{home:?}");
    assert!(home.stdout.contains("kept"), "{home:?}");

    // Nothing reached the container's writable layer, and the node's disk is as it was.
    let size_rw = Command::new("docker")
        .args(["inspect", "--size", "-f", "{{.SizeRw}}", &container])
        .output()
        .expect("docker inspect");
    let size_rw: u64 = String::from_utf8_lossy(&size_rw.stdout)
        .trim()
        .parse()
        .expect("SizeRw");
    assert!(
        size_rw < 1 << 20,
        "the writable layer grew to {size_rw} bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_are_checked_and_an_unlimited_host_says_so() {
    let d = disk_daemon(&[]);
    for (size, want) in [
        (
            "1g",
            "limits.workspace_size '1g' must be between 16 MiB and 256 MiB (this host's ceiling)",
        ),
        (
            "lots",
            "limits.workspace_size 'lots' is not a size in Docker's syntax (for example 512m or 2g)",
        ),
    ] {
        let e = d
            .admin()
            .open("disk-size", "org-disk", None, Some(&limits(size)))
            .await
            .expect_err("refused");
        assert_eq!(e.to_string(), format!("bad_request (400): {want}"));
    }
    let policy = d.admin().policy().await.expect("policy");
    assert_eq!(policy.fixed.workspace_size, Some(256 << 20));
    let (status, _) = raw(
        reqwest::Method::GET,
        &format!("{}/v1/policy", d.base),
        Some(&d.token),
        None,
    )
    .await;
    assert_eq!(status, 200);

    // A host without disks (SANDBOXD_WORKSPACE_QUOTA=off) refuses a size it cannot hold.
    let off = Daemon::start(&[("SANDBOXD_WORKSPACE_QUOTA", "off")]);
    let e = off
        .admin()
        .open("disk-size", "org-disk", None, Some(&limits("64m")))
        .await
        .expect_err("refused");
    assert_eq!(
        e.to_string(),
        "bad_request (400): limits.workspace_size '64m' cannot be held: this host does not limit workspaces (SANDBOXD_WORKSPACE_QUOTA=off)"
    );
    assert_eq!(
        off.admin()
            .policy()
            .await
            .expect("policy")
            .fixed
            .workspace_size,
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_open_leaves_no_disk_behind() {
    // Docker refuses to create the container (no such OCI runtime): the open fails after its
    // disk was made, and the disk goes with it.
    let d = disk_daemon(&[("SANDBOXD_OCI_RUNTIME", "no-such-runtime")]);
    let e = d
        .admin()
        .open("disk-failed", "org-disk", None, None)
        .await
        .expect_err("the open fails");
    assert!(e.to_string().contains("no-such-runtime"), "{e}");
    assert!(
        !d.workspace_root()
            .join("disk-failed/workspace.img")
            .exists(),
        "the failed open's disk image is left"
    );
    assert_eq!(d.mounts(), Vec::<std::path::PathBuf>::new());
    assert!(d.admin().list().await.expect("list").is_empty());
}

/// The reclaim loop: a tenant opens a session, reads its token, reclaims it (a session token
/// may) and opens the next. Reclaimed workspaces keep their disks, so they count: the tenant
/// is stopped at its own cap of workspaces, another tenant still opens, and the host's budget
/// refuses what would not fit, with the numbers, until a destroy gives its bytes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reclaim_loop_is_refused_at_the_budget_while_another_tenant_opens() {
    let d = disk_daemon(&[
        ("SANDBOXD_WORKSPACE_SIZE", "64m"),
        ("SANDBOXD_WORKSPACE_BUDGET", "320m"),
        ("SANDBOXD_MAX_WORKSPACES_PER_TENANT", "3"),
    ]);
    let admin = d.admin();
    let policy = admin.policy().await.expect("policy");
    assert_eq!(policy.fixed.workspace_budget, Some(320 << 20));
    assert_eq!(policy.fixed.max_workspaces_per_tenant, Some(3));
    // The loop, as the attacker runs it: open, read the token, reclaim.
    let mut refused = None;
    for i in 0..10 {
        let id = format!("loop-{i}");
        match admin.open(&id, "org-loop", None, None).await {
            Ok(opened) => {
                let token = opened.token.expect("token");
                let reclaimed = d.client(&token).reclaim(&id).await.expect("reclaim");
                assert_eq!(reclaimed.state, sandboxd_api::SessionState::Reclaimed);
            }
            Err(e) => {
                refused = Some((i, e.to_string()));
                break;
            }
        }
    }
    assert_eq!(
        refused,
        Some((
            3,
            "tenant_workspaces (429): Tenant 'org-loop' already holds 3 of 3 workspaces on this host (SANDBOXD_MAX_WORKSPACES_PER_TENANT; sleeping and reclaimed sessions count until they are destroyed). Destroy a session before opening another.".to_owned()
        ))
    );
    // The reclaimed disks are still there, each at its size, and each takes little of the
    // node's disk (sparse).
    for i in 0..3 {
        let folder = d.workspace_root().join(format!("loop-{i}"));
        assert_eq!(
            std::fs::metadata(folder.join("workspace.img"))
                .expect("the disk")
                .len(),
            64 << 20
        );
        let taken = node_bytes(&folder);
        assert!(taken < 16 << 20, "a new 64 MiB disk takes {taken} bytes");
    }
    // Another tenant still opens.
    let other = admin
        .open("bystander", "org-other", None, None)
        .await
        .expect("another tenant opens");
    assert_eq!(other.session.state, sandboxd_api::SessionState::Running);
    // A third tenant takes what is left of the budget, and is then refused with the numbers.
    admin
        .open("third-1", "org-third", None, None)
        .await
        .expect("the budget's last 64 MiB");
    let e = admin
        .open("third-2", "org-third", None, None)
        .await
        .expect_err("over the budget");
    assert_eq!(
        e.to_string(),
        "workspace_budget (429): This host's workspace budget of 320 MiB (SANDBOXD_WORKSPACE_BUDGET) has no room for a workspace of 64 MiB: 5 workspaces hold 320 MiB (sleeping and reclaimed sessions count until they are destroyed). Destroy a session or open it on another host."
    );
    // A smaller workspace than the default does not fit either; nothing was left of the
    // refused opens.
    assert!(!d.workspace_root().join("third-2").exists());
    let use_now = admin.policy().await.expect("policy").workspaces;
    assert_eq!(
        use_now,
        Some(sandboxd_api::policy::WorkspaceUse {
            workspaces: 5,
            bytes: 320 << 20
        })
    );
    // Prometheus is told the same: the budget and what is held of it (the chart's alert on a
    // budget past 85% is built on these two), and the refusals.
    let metrics = reqwest::get(format!("{}/metrics", d.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    for line in [
        format!("sandboxd_workspace_budget_bytes {}", 320 << 20),
        format!("sandboxd_workspace_held_bytes {}", 320 << 20),
        "sandboxd_session_opens_total{outcome=\"refused\"} 2".to_owned(),
    ] {
        assert!(
            metrics.contains(&format!("{line}\n")),
            "{line} missing:\n{metrics}"
        );
    }
    // A destroy gives the bytes back, and the attacker's own cap a place.
    admin.destroy("loop-0").await.expect("destroy");
    admin
        .open("third-2", "org-third", None, None)
        .await
        .expect("room again after a destroy");
    let e = admin
        .open("loop-9", "org-loop", None, None)
        .await
        .expect_err("the budget is full again");
    assert!(e.to_string().starts_with("workspace_budget (429)"), "{e}");
}
