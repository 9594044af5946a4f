//! Warm pools against the real dockerd and the local base image: a pooled container serves
//! exactly one session and the pool refills; a runtime without a pool, or limits the pool's
//! containers do not have, open cold; a runtime change drains the old pool; a pool never takes
//! the host past its capacity; after a restart the pool's containers are removed, never leaked;
//! a warm session's files are on disk in its own folder, and survive a sleep and a wake; on a
//! host of workspace disks, the pool's containers come with disks of the sessions' size.
//!
//! Over 600 lines: one test a promise of the pool, sharing this file's fixtures.

mod common;

use std::collections::HashSet;
use std::process::Command;
use std::time::Duration;

use common::{Backend, Daemon, base_image, docker, until};
use sandboxd_api::ErrorCode;
use sandboxd_api::client::ClientError;
use sandboxd_api::session::{Launch, Limits};
use sandboxd_catalog::CatalogEntry;
use serde_json::json;

/// A pool fills one container at a time; a few seconds each at worst on a busy host.
const FILL: Duration = Duration::from_secs(120);

/// The allowlist: `base` with a pool of `size`, `alt` without one.
fn catalog(size: u32) -> String {
    json!([
        {"alias": "base", "image": base_image(), "warm_pool": size},
        {"alias": "alt", "image": base_image()},
    ])
    .to_string()
}

fn start(backend: Backend, size: u32, env: &[(&str, &str)]) -> Daemon {
    let catalog = catalog(size);
    let mut all = vec![("SANDBOXD_RUNTIMES", catalog.as_str())];
    all.extend_from_slice(env);
    Daemon::start_on(backend, &all)
}

/// `(size, ready)` of a runtime's pool as `GET /v1/runtimes` shows it.
async fn pool_of(d: &Daemon, alias: &str) -> (u32, u32) {
    let list = d.admin().runtimes().await.expect("runtimes");
    let rt = list
        .runtimes
        .iter()
        .find(|r| r.alias == alias)
        .unwrap_or_else(|| panic!("runtime {alias} is listed"));
    (rt.warm_pool.size, rt.warm_pool.ready)
}

async fn ready(d: &Daemon, alias: &str, want: u32) {
    until(
        &format!("the pool of {alias} holds {want}"),
        FILL,
        || async {
            let (_, ready) = pool_of(d, alias).await;
            (ready == want)
                .then_some(())
                .ok_or(format!("{ready} ready"))
        },
    )
    .await;
}

/// Containers of `d` started for a warm pool, as Docker lists them: (id, name).
fn pooled(d: &Daemon) -> Vec<(String, String)> {
    let out = docker(&[
        "ps",
        "-a",
        "--no-trunc",
        "--filter",
        &format!("label=sandboxd.dev/instance={}", d.instance),
        "--filter",
        "label=sandboxd.dev/warm-pool",
        "--format",
        "{{.ID}} {{.Names}}",
    ]);
    out.lines()
        .filter_map(|l| {
            let (id, name) = l.split_once(' ')?;
            Some((id.to_owned(), name.to_owned()))
        })
        .collect()
}

/// Pooled containers no session holds yet (they keep the pool's name).
fn waiting(d: &Daemon) -> HashSet<String> {
    pooled(d)
        .into_iter()
        .filter(|(_, name)| name.starts_with(&format!("sandboxd-{}-warm-", d.instance)))
        .map(|(id, _)| id)
        .collect()
}

/// The id of the container Docker has under session `id`'s name (a warm container takes it
/// just after the open answered).
async fn container(d: &Daemon, id: &str) -> String {
    let name = format!("sandboxd-{}-{id}", d.instance);
    until(
        &format!("a container named {name}"),
        Duration::from_secs(30),
        || async {
            let out = Command::new("docker")
                .args(["inspect", "--format", "{{.Id}}", &name])
                .output()
                .expect("docker");
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        },
    )
    .await
}

fn exists(id: &str) -> bool {
    Command::new("docker")
        .args(["inspect", id])
        .output()
        .expect("docker")
        .status
        .success()
}

fn pool_folders(d: &Daemon) -> Vec<String> {
    match std::fs::read_dir(d.workspace_root().join(".pool")) {
        Ok(dir) => dir
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => vec![],
    }
}

async fn a_pooled_container_serves_exactly_one_session_and_the_pool_refills(backend: Backend) {
    let d = start(backend, 2, &[]);
    ready(&d, "base", 2).await;
    assert_eq!(pool_of(&d, "base").await, (2, 2));
    let before = waiting(&d);
    assert_eq!(before.len(), 2, "{before:?}");
    assert_eq!(
        pool_folders(&d).len(),
        2,
        "each pooled container has its folder"
    );

    // Three opens at once on a pool of two: none shares a container.
    let opens: Vec<_> = (0..3)
        .map(|i| {
            let admin = d.admin();
            tokio::spawn(async move { admin.open(&format!("w-{i}"), "org", None, None).await })
        })
        .collect();
    let mut launches = vec![];
    for o in opens {
        let opened = o.await.expect("the open's task").expect("open");
        assert!(opened.created);
        launches.push((opened.session.id.clone(), opened.session.launch));
    }
    let mut containers: Vec<String> = vec![];
    for (id, _) in &launches {
        containers.push(container(&d, id).await);
    }
    assert_eq!(
        containers.iter().collect::<HashSet<_>>().len(),
        3,
        "three sessions, three containers: {containers:?}"
    );
    let warm: Vec<&String> = launches
        .iter()
        .zip(&containers)
        .filter(|((_, l), _)| *l == Launch::Warm)
        .map(|(_, c)| c)
        .collect();
    assert!(
        warm.len() >= 2,
        "both pooled containers were taken: {launches:?}"
    );
    for c in &warm {
        assert!(
            pooled(&d).iter().any(|(id, _)| id == *c),
            "a warm session runs a pooled container"
        );
    }
    for ((id, launch), c) in launches.iter().zip(&containers) {
        if *launch == Launch::Cold {
            assert!(
                !before.contains(c),
                "{id} opened cold on a container of its own"
            );
        }
    }

    // Each session sees only its own workspace, and its files are in its own folder.
    let admin = d.admin();
    for (id, _) in &launches {
        let out = admin
            .run(
                id,
                &format!("ls -A /workspace; echo {id} > mine.txt; id -u"),
                None,
                None,
                None,
            )
            .await
            .expect("run");
        assert_eq!(out.exit_code, 0, "{out:?}");
        assert_eq!(out.stdout, "10001\n", "an empty workspace, the sandbox uid");
        assert_eq!(
            std::fs::read_to_string(d.workspace(id).join("mine.txt")).expect("the file on disk"),
            format!("{id}\n")
        );
    }
    for (id, _) in &launches {
        let listed = admin.ls(id, "").await.expect("ls");
        assert_eq!(
            listed.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
            ["mine.txt"]
        );
    }
    let shown = admin.get("w-0").await.expect("get");
    assert_eq!(shown.launch, launches[0].1);

    // The pool refills to its size with new containers.
    ready(&d, "base", 2).await;
    let after = waiting(&d);
    assert_eq!(after.len(), 2);
    assert!(after.is_disjoint(&before), "{after:?} {before:?}");
    let metrics = reqwest::get(format!("{}/metrics", d.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    if backend == Backend::Agent {
        // A warm container's agent serves the session that took it.
        assert!(
            metrics.contains("sandboxd_run_paths_total{path=\"exec_fallback\"} 0\n"),
            "{metrics}"
        );
        assert!(
            metrics.contains("sandboxd_run_paths_total{path=\"agent\"}"),
            "{metrics}"
        );
        // A warm session's first run asked Docker nothing about its agent: the claim's look at
        // the container told the run path its PID 1. Only a cold session's first run looks.
        let cold = launches.iter().filter(|(_, l)| *l == Launch::Cold).count();
        assert!(
            metrics.contains(&format!("sandboxd_agent_pid_lookups_total {cold}\n")),
            "{cold} cold sessions: {metrics}"
        );
    } else {
        // Docker exec, as configured: every run counted on its path.
        assert!(
            metrics.contains("sandboxd_run_paths_total{path=\"exec\"} 3\n"),
            "{metrics}"
        );
    }
    assert!(
        metrics.contains("sandboxd_warm_pool_ready{runtime=\"base\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("sandboxd_warm_pool_size{runtime=\"base\"} 2"),
        "{metrics}"
    );
    // Each open is timed by its launch; each that started cold found the pool empty; each
    // listing is timed.
    let cold = launches.iter().filter(|(_, l)| *l == Launch::Cold).count();
    for line in [
        format!(
            "sandboxd_open_seconds_count{{launch=\"warm\"}} {}",
            3 - cold
        ),
        format!("sandboxd_warm_pool_empty_opens_total{{runtime=\"base\"}} {cold}"),
        "sandboxd_file_op_seconds_count{op=\"ls\"} 3".to_owned(),
    ] {
        assert!(
            metrics.contains(&format!("{line}\n")),
            "{line} missing:\n{metrics}"
        );
    }
    if cold > 0 {
        let line = format!("sandboxd_open_seconds_count{{launch=\"cold\"}} {cold}\n");
        assert!(metrics.contains(&line), "{line} missing:\n{metrics}");
    }
    assert!(
        metrics.contains(&format!(
            "sandboxd_warm_pool_memory_bytes{{runtime=\"base\"}} {}",
            2 * 512 * 1024 * 1024
        )),
        "{metrics}"
    );
}

async fn a_runtime_without_a_pool_or_other_limits_opens_cold(backend: Backend) {
    let d = start(backend, 1, &[]);
    ready(&d, "base", 1).await;
    let admin = d.admin();
    assert_eq!(pool_of(&d, "alt").await, (0, 0));
    let alt = admin
        .open("c-alt", "org", Some("alt"), None)
        .await
        .expect("open");
    assert_eq!(alt.session.launch, Launch::Cold, "alt has no pool");
    let cpus = Limits {
        cpus: Some(0.5),
        ..Default::default()
    };
    let other = admin
        .open("c-cpus", "org", Some("base"), Some(&cpus))
        .await
        .expect("open");
    assert_eq!(
        other.session.launch,
        Launch::Cold,
        "the pool's sandboxes have all CPUs"
    );
    let pids = Limits {
        pids_limit: Some(64),
        ..Default::default()
    };
    let other = admin
        .open("c-pids", "org", Some("base"), Some(&pids))
        .await
        .expect("open");
    assert_eq!(other.session.launch, Launch::Cold);
    assert_eq!(
        pool_of(&d, "base").await,
        (1, 1),
        "the pool was not touched"
    );
    assert_eq!(
        docker(&[
            "inspect",
            "--format",
            "{{.HostConfig.NanoCpus}}",
            &container(&d, "c-cpus").await
        ]),
        "500000000"
    );
    // Limits that come to the pool's (the host's memory default) take a pooled container.
    let same = Limits {
        mem_limit: Some("512m".to_owned()),
        ..Default::default()
    };
    let warm = admin
        .open("c-same", "org", Some("base"), Some(&same))
        .await
        .expect("open");
    assert_eq!(warm.session.launch, Launch::Warm);
    // Opens that did not fit the pool, or of a runtime without one, never found a pool empty.
    let metrics = reqwest::get(format!("{}/metrics", d.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("sandboxd_warm_pool_empty_opens_total{runtime=\"base\"} 0\n"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("sandboxd_warm_pool_empty_opens_total{runtime=\"alt\"}"),
        "{metrics}"
    );
    for line in [
        "sandboxd_open_seconds_count{launch=\"cold\"} 3",
        "sandboxd_open_seconds_count{launch=\"warm\"} 1",
    ] {
        assert!(
            metrics.contains(&format!("{line}\n")),
            "{line} missing:\n{metrics}"
        );
    }
}

#[tokio::test]
async fn a_runtime_change_drains_the_old_pool() {
    let d = start(Backend::Agent, 2, &[]);
    ready(&d, "base", 2).await;
    let old = waiting(&d);
    let old_folders = pool_folders(&d);
    let admin = d.admin();
    let mut entries: Vec<CatalogEntry> = serde_json::from_str(&catalog(2)).expect("catalog");
    entries[0]
        .env_vars
        .insert("CHANGED".to_owned(), "yes".to_owned());
    let listed = admin.put_runtimes(&entries).await.expect("put");
    assert_eq!(listed.runtimes[0].warm_pool.size, 2);
    until("the old pool is drained", FILL, || async {
        let left: Vec<_> = old.iter().filter(|c| exists(c)).collect();
        left.is_empty().then_some(()).ok_or(format!("{left:?}"))
    })
    .await;
    ready(&d, "base", 2).await;
    let new = waiting(&d);
    assert!(new.is_disjoint(&old));
    let folders = pool_folders(&d);
    assert!(
        old_folders.iter().all(|f| !folders.contains(f)),
        "{old_folders:?} {folders:?}"
    );
    let opened = admin.open("after", "org", None, None).await.expect("open");
    assert_eq!(opened.session.launch, Launch::Warm);
    let out = admin
        .run("after", "echo $CHANGED", None, None, None)
        .await
        .expect("run");
    assert_eq!(out.stdout, "yes\n", "the new definition's container");

    // A runtime that leaves the allowlist, or whose pool goes to 0, keeps nothing.
    let entries: Vec<CatalogEntry> = serde_json::from_str(
        &json!([{"alias": "alt", "image": base_image(), "warm_pool": 0}]).to_string(),
    )
    .expect("catalog");
    admin.put_runtimes(&entries).await.expect("put");
    until("every pooled container is gone", FILL, || async {
        let left = waiting(&d);
        left.is_empty().then_some(()).ok_or(format!("{left:?}"))
    })
    .await;
    until("the pool folders are gone", FILL, || async {
        let left = pool_folders(&d);
        left.is_empty().then_some(()).ok_or(format!("{left:?}"))
    })
    .await;
    // The session that took one keeps it.
    assert!(exists(&container(&d, "after").await));
}

/// A pooled container removed behind sandboxd's back is not handed out: the open starts cold,
/// in the session's own folder, and the pool fills again.
#[tokio::test]
async fn a_pooled_container_that_vanished_opens_cold() {
    let d = start(Backend::Agent, 1, &[]);
    ready(&d, "base", 1).await;
    let gone: Vec<String> = waiting(&d).into_iter().collect();
    docker(&["rm", "-f", &gone[0]]);
    let admin = d.admin();
    let opened = admin.open("v-1", "org", None, None).await.expect("open");
    assert_eq!(opened.session.launch, Launch::Cold);
    let out = admin
        .run("v-1", "ls -A; echo x > f.txt", None, None, None)
        .await
        .expect("run");
    assert_eq!((out.exit_code, out.stdout.as_str()), (0, ""));
    assert!(d.workspace("v-1").join("f.txt").is_file());
    ready(&d, "base", 1).await;
    assert!(!waiting(&d).contains(&gone[0]));
    let warm = admin.open("v-2", "org", None, None).await.expect("open");
    assert_eq!(warm.session.launch, Launch::Warm);
}

#[tokio::test]
async fn a_pool_never_takes_the_host_past_its_capacity() {
    let d = start(Backend::Agent, 3, &[("SANDBOXD_MAX_SESSIONS", "2")]);
    ready(&d, "base", 2).await;
    assert_eq!(
        pool_of(&d, "base").await,
        (3, 2),
        "two of three: the host holds two"
    );
    assert_eq!(d.containers().len(), 2);
    let admin = d.admin();
    let first = admin.open("cap-1", "org", None, None).await.expect("open");
    assert_eq!(first.session.launch, Launch::Warm);
    assert!(d.containers().len() <= 2);
    // A session and one pooled container fill the host.
    ready(&d, "base", 1).await;
    assert_eq!(d.containers().len(), 2);
    // A cold open removes the pooled container to make room for itself.
    let cpus = Limits {
        cpus: Some(0.5),
        ..Default::default()
    };
    let second = admin
        .open("cap-2", "org", None, Some(&cpus))
        .await
        .expect("open");
    assert_eq!(second.session.launch, Launch::Cold);
    assert_eq!(d.containers().len(), 2, "{:?}", d.containers());
    assert_eq!(pool_of(&d, "base").await, (3, 0));
    match admin.open("cap-3", "org", None, None).await {
        Err(ClientError::Api { status, code, .. }) => {
            assert_eq!((status, code), (429, ErrorCode::HostCap));
        }
        other => panic!("expected the host cap, got {other:?}"),
    }
    // Room again: the pool fills into it.
    admin.destroy("cap-1").await.expect("destroy");
    ready(&d, "base", 1).await;
    assert_eq!(d.containers().len(), 2);
}

#[tokio::test]
async fn after_a_restart_the_pools_containers_are_removed_never_leaked() {
    let mut d = start(Backend::Agent, 2, &[]);
    ready(&d, "base", 2).await;
    let admin = d.admin();
    let opened = admin.open("kept", "org", None, None).await.expect("open");
    assert_eq!(opened.session.launch, Launch::Warm);
    admin
        .run("kept", "echo before > f.txt", None, None, None)
        .await
        .expect("run");
    let kept = container(&d, "kept").await;
    ready(&d, "base", 2).await;
    let unclaimed = waiting(&d);
    let folders = pool_folders(&d);
    assert_eq!((unclaimed.len(), folders.len()), (2, 2));

    d.process.kill9();
    d.spawn();
    // The start-up reconcile removed them before it listened.
    for c in &unclaimed {
        assert!(!exists(c), "the pooled container {c} was left behind");
    }
    // The session's warm container is its own: kept, and it still serves.
    assert_eq!(container(&d, "kept").await, kept);
    let admin = d.admin();
    let out = admin
        .run("kept", "cat f.txt", None, None, None)
        .await
        .expect("run");
    assert_eq!(out.stdout, "before\n");
    ready(&d, "base", 2).await;
    let now = pool_folders(&d);
    assert!(
        folders.iter().all(|f| !now.contains(f)),
        "{folders:?} {now:?}"
    );
    assert!(waiting(&d).is_disjoint(&unclaimed));
}

/// On a host whose workspaces are disks of their own (`SANDBOXD_WORKSPACE_QUOTA=loop`, the
/// chart's default), pooled containers come with theirs: a warm session's workspace is a disk
/// of its runtime's size that its sandbox cannot write past, a session asking for another
/// size opens cold on a disk of that size, a destroy unmounts the warm disk, and a restart
/// unmounts the unclaimed pool's disks before their folders go.
#[tokio::test]
async fn a_pool_on_a_host_of_workspace_disks_hands_out_disks_of_the_sessions_size() {
    let mut d = start(
        Backend::Agent,
        1,
        &[
            ("SANDBOXD_WORKSPACE_QUOTA", "loop"),
            ("SANDBOXD_WORKSPACE_SIZE", "64m"),
        ],
    );
    ready(&d, "base", 1).await;
    let pool_root = d.workspace_root().join(".pool");
    let pooled_disk = |d: &Daemon| -> Vec<std::path::PathBuf> {
        d.mounts()
            .into_iter()
            .filter(|m| m.starts_with(&pool_root))
            .collect()
    };
    assert_eq!(
        pooled_disk(&d).len(),
        1,
        "the pooled container's workspace is a disk: {:?}",
        d.mounts()
    );

    let admin = d.admin();
    let warm = admin
        .open("disk-warm", "org", None, None)
        .await
        .expect("open");
    assert_eq!(warm.session.launch, Launch::Warm);
    // The disk came along with the folder: mounted at the session's path, its image there.
    assert!(
        d.mounts().contains(&d.workspace("disk-warm")),
        "{:?}",
        d.mounts()
    );
    assert_eq!(
        std::fs::metadata(d.workspace_root().join("disk-warm/workspace.img"))
            .expect("the disk image")
            .len(),
        64 << 20
    );
    common::write_past_its_disk(&admin, "disk-warm", 100, "true").await;
    assert!(
        std::fs::metadata(d.workspace("disk-warm").join("x"))
            .expect("what dd wrote")
            .len()
            <= 64 << 20
    );

    // Another size is another disk: cold, of that size.
    let small = Limits {
        workspace_size: Some("32m".to_owned()),
        ..Default::default()
    };
    ready(&d, "base", 1).await;
    let cold = admin
        .open("disk-cold", "org", None, Some(&small))
        .await
        .expect("open");
    assert_eq!(
        cold.session.launch,
        Launch::Cold,
        "the pool's disks are 64m"
    );
    assert_eq!(
        std::fs::metadata(d.workspace_root().join("disk-cold/workspace.img"))
            .expect("the disk image")
            .len(),
        32 << 20
    );
    assert_eq!(
        pool_of(&d, "base").await,
        (1, 1),
        "the pool was not touched"
    );

    assert!(admin.destroy("disk-warm").await.expect("destroy").destroyed);
    assert!(
        !d.mounts().contains(&d.workspace("disk-warm")),
        "the warm disk is unmounted with its session: {:?}",
        d.mounts()
    );

    // A restart removes the unclaimed pool: its disks unmounted, never left behind.
    let before = pooled_disk(&d);
    assert_eq!(before.len(), 1);
    d.process.kill9();
    d.spawn();
    ready(&d, "base", 1).await;
    let after = pooled_disk(&d);
    assert_eq!(after.len(), 1, "one disk for the refilled pool: {after:?}");
    assert!(
        before.iter().all(|m| !after.contains(m)),
        "the earlier run's pooled disk was unmounted: {before:?} {after:?}"
    );
    assert!(
        d.mounts().contains(&d.workspace("disk-cold")),
        "the cold session keeps its disk"
    );
}

async fn a_warm_session_that_sleeps_and_wakes_keeps_its_files(backend: Backend) {
    let d = start(backend, 1, &[]);
    ready(&d, "base", 1).await;
    let admin = d.admin();
    let opened = admin.open("sleepy", "org", None, None).await.expect("open");
    assert_eq!(opened.session.launch, Launch::Warm);
    let warm = container(&d, "sleepy").await;
    admin
        .run(
            "sleepy",
            "mkdir -p d && echo kept > d/f.txt",
            None,
            None,
            None,
        )
        .await
        .expect("run");
    assert!(d.workspace("sleepy").join("d/f.txt").is_file());
    admin.stop("sleepy").await.expect("stop");
    // The wake gives it a container of its own, bound to its own folder.
    let out = admin
        .run("sleepy", "cat d/f.txt; echo more > g.txt", None, None, None)
        .await
        .expect("run");
    assert_eq!((out.exit_code, out.stdout.as_str()), (0, "kept\n"));
    assert_eq!(
        std::fs::read_to_string(d.workspace("sleepy").join("g.txt")).expect("on disk"),
        "more\n"
    );
    let now = container(&d, "sleepy").await;
    assert_ne!(now, warm, "the warm container is never started again");
    assert!(!exists(&warm));
    let source = docker(&[
        "inspect",
        "--format",
        "{{range .Mounts}}{{if eq .Destination \"/workspace\"}}{{.Source}}{{end}}{{end}}",
        &now,
    ]);
    assert_eq!(source, d.workspace("sleepy").display().to_string());
    assert_eq!(admin.get("sleepy").await.expect("get").launch, Launch::Cold);
    // The wake made a container anew: timed as a wake from reclaimed.
    let metrics = reqwest::get(format!("{}/metrics", d.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let line = "sandboxd_wake_seconds_count{from=\"reclaimed\"} 1\n";
    assert!(metrics.contains(line), "{line} missing:\n{metrics}");
}

on_both_backends! {
    #[tokio::test] a_pooled_container_serves_exactly_one_session_and_the_pool_refills,
    #[tokio::test] a_runtime_without_a_pool_or_other_limits_opens_cold,
    #[tokio::test] a_warm_session_that_sleeps_and_wakes_keeps_its_files,
}
