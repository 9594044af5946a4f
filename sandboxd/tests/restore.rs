//! Snapshots of sessions through sandboxd, against the real S3 server (versitygw, `make up`)
//! and the real dockerd: a workspace an agent left (large files, many small ones, symlinks,
//! modes, empty folders) is snapshotted with its sandbox paused, and opens on another host
//! (a second sandboxd) byte for byte and mode for mode, owned by the sandbox user, as launch
//! `restored`; the two sessions then diverge. Another scope's key, a corrupted chunk and a
//! host without a store are refused in words, leaving no session, container, disk or folder.
//!
//! Every workspace is a loop-mounted disk of its own: the tests need root and loop devices.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use common::{Daemon, container_of, docker};
use sandboxd_api::client::{Client, ClientError};
use sandboxd_api::session::{Launch, OpenRequest};
use sandboxd_api::{ErrorCode, Limits};

fn need(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run `make up` and `eval \"$(make -s env)\"` (the S3 server)")
    })
}

/// A sandboxd with loop disks whose snapshots are kept under `prefix` of the test bucket.
fn start(prefix: &str) -> Daemon {
    need("SANDBOXD_S3_ENDPOINT");
    Daemon::start(&[
        ("SANDBOXD_WORKSPACE_QUOTA", "loop"),
        ("SANDBOXD_WORKSPACE_SIZE", "256m"),
        ("SANDBOXD_S3_PREFIX", prefix),
    ])
}

fn unique(what: &str) -> String {
    format!(
        "{what}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// Every entry below `root`: its kind, mode, owner, and bytes or target.
fn describe(root: &Path) -> BTreeMap<String, (String, u32, u32, Vec<u8>)> {
    use std::os::unix::fs::MetadataExt as _;
    let mut out = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for e in std::fs::read_dir(&dir).expect("read_dir") {
            let path = e.expect("entry").path();
            let rel = path
                .strip_prefix(root)
                .expect("below")
                .display()
                .to_string();
            let meta = std::fs::symlink_metadata(&path).expect("meta");
            let mode = meta.permissions().mode() & 0o7777;
            let described = if meta.is_dir() {
                pending.push(path.clone());
                ("dir".to_owned(), mode, meta.uid(), Vec::new())
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).expect("link");
                let target = target.display().to_string().into_bytes();
                ("link".to_owned(), 0, meta.uid(), target)
            } else {
                let bytes = std::fs::read(&path).expect("read");
                ("file".to_owned(), mode, meta.uid(), bytes)
            };
            out.insert(rel, described);
        }
    }
    out
}

/// The status, code and message of a refusal; any other error fails the test.
fn refusal<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, ErrorCode, String) {
    match r {
        Err(ClientError::Api {
            status,
            code,
            message,
        }) => (status, code, message),
        other => panic!("not a refusal: {other:?}"),
    }
}

async fn sh(c: &Client, id: &str, command: &str) -> String {
    let ran = c
        .run(id, command, Some(120), None, None)
        .await
        .expect("run");
    assert_eq!(ran.exit_code, 0, "{command}: {ran:?}");
    ran.stdout
}

/// What an agent leaves: a large file twice, 300 small ones, a script, a key, an empty file,
/// empty folders, a folder without write permission, a link inside and one out.
const WORKSPACE: &str = r#"set -e; cd /workspace
mkdir -p data src/pkg empty/nested locked
head -c 9000000 /dev/urandom > data/big.bin; cp data/big.bin data/copy.bin
for i in $(seq 1 300); do echo "x = $i" > src/pkg/m$i.py; done
printf '#!/bin/sh\necho hi\n' > run.sh; chmod 755 run.sh
echo k > secret.key; chmod 600 secret.key; : > empty.txt
echo in > locked/inside; chmod 555 locked
ln -s src/pkg/m1.py link.py; ln -s /etc/passwd outside"#;

fn open_from(name: &str, key: &str) -> OpenRequest {
    OpenRequest {
        name: name.to_owned(),
        tenant: "org".to_owned(),
        runtime: Some("base".to_owned()),
        limits: None,
        owner: None,
        egress: Vec::new(),
        from_snapshot: Some(key.to_owned()),
    }
}

/// That `host` has nothing of session `id`: no row, container, disk or folder.
async fn nothing_of(host: &Daemon, id: &str) {
    assert!(
        matches!(
            host.admin().get(id).await,
            Err(ClientError::NoSuchSession(_))
        ),
        "no session {id}"
    );
    assert!(
        host.containers().iter().all(|(_, s, _)| s != id),
        "no container of {id}"
    );
    assert_eq!(host.mounts(), Vec::<std::path::PathBuf>::new(), "no disk");
    assert!(
        !host.workspace_root().join(id).exists(),
        "no folder of {id}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_opens_on_another_host_whole_and_the_two_diverge() {
    let prefix = unique("restore");
    let (a, b) = (start(&prefix), start(&prefix));
    let (ca, cb) = (a.admin(), b.admin());
    ca.open("src", "org", Some("base"), None)
        .await
        .expect("open");
    sh(&ca, "src", WORKSPACE).await;
    let before = describe(&a.workspace("src"));
    assert_eq!(before.len(), 314, "{:?}", before.keys().collect::<Vec<_>>());

    let taken = ca
        .take_snapshot("src", "team-a", "first")
        .await
        .expect("a snapshot");
    assert_eq!(taken.key, "team-a/first");
    assert_eq!(taken.entries, 314);
    // Two big files, 300 of `x = N`, the script, the key and `inside` (links count 0).
    assert_eq!(
        taken.bytes,
        2 * 9_000_000 + (9 * 6 + 90 * 7 + 201 * 8) + 18 + 2 + 3
    );
    // The big file and its copy are the same three chunks, stored once.
    assert!(taken.chunk_count < 314, "{taken:?}");
    assert!(taken.paused_ms > 0, "the sandbox was paused: {taken:?}");
    // It runs again (not left paused).
    let container = container_of(&a, "src");
    assert_eq!(
        docker(&["inspect", "--format", "{{.State.Status}}", &container]).trim(),
        "running"
    );
    assert_eq!(sh(&ca, "src", "echo awake").await, "awake\n");

    // The source changes after the snapshot; the restore has the files as they were.
    sh(
        &ca,
        "src",
        "cd /workspace && echo changed > src/pkg/m1.py && rm data/copy.bin",
    )
    .await;
    let opened = cb
        .open_request(&open_from("copy", "team-a/first"))
        .await
        .expect("open from the snapshot");
    assert_eq!(opened.session.launch, Launch::Restored);
    assert!(opened.token.is_some());
    assert_eq!(describe(&b.workspace("copy")), before);
    assert_eq!(
        sh(
            &cb,
            "copy",
            "cd /workspace && stat -c '%u %a %n' secret.key locked run.sh && cat link.py && ./run.sh && id -u"
        )
        .await,
        "10001 600 secret.key\n10001 555 locked\n10001 755 run.sh\nx = 1\nhi\n10001\n"
    );

    // Forked: each goes its own way.
    sh(&cb, "copy", "echo fork > /workspace/src/pkg/m1.py").await;
    assert_eq!(
        sh(&ca, "src", "cat /workspace/src/pkg/m1.py").await,
        "changed\n"
    );
    assert_eq!(
        sh(&cb, "copy", "cat /workspace/src/pkg/m1.py").await,
        "fork\n"
    );
    assert!(!a.workspace("src").join("data/copy.bin").exists());
    assert!(b.workspace("copy").join("data/copy.bin").exists());

    // An open that finds the session restores nothing over it.
    let again = cb
        .open_request(&open_from("copy", "team-a/first"))
        .await
        .expect("found");
    assert!(again.token.is_none());
    assert_eq!(
        sh(&cb, "copy", "cat /workspace/src/pkg/m1.py").await,
        "fork\n"
    );

    // Another scope's key names no snapshot: refused, nothing made.
    assert_eq!(
        refusal(cb.open_request(&open_from("other", "team-b/first")).await),
        (
            404,
            ErrorCode::SnapshotNotFound,
            "no snapshot 'team-b/first' in the store".to_owned()
        )
    );
    assert!(matches!(
        cb.get("other").await,
        Err(ClientError::NoSuchSession(_))
    ));

    // Shown, then deleted: the key is gone for every host.
    assert_eq!(
        cb.snapshot("team-a", "first").await.expect("shown").bytes,
        taken.bytes
    );
    ca.delete_snapshot("team-a", "first")
        .await
        .expect("deleted");
    ca.delete_snapshot("team-a", "first")
        .await
        .expect("deleted twice is fine");
    let gone = cb.snapshot("team-a", "first").await.expect_err("gone");
    assert!(
        matches!(
            gone,
            ClientError::Api {
                status: 404,
                code: ErrorCode::SnapshotNotFound,
                ..
            }
        ),
        "{gone:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_chunk_a_small_workspace_and_no_store_are_refused_leaving_nothing() {
    let prefix = unique("restore-bad");
    let (a, b) = (start(&prefix), start(&prefix));
    let (ca, cb) = (a.admin(), b.admin());
    ca.open("src", "org", Some("base"), None)
        .await
        .expect("open");
    sh(
        &ca,
        "src",
        "mkdir -p /workspace/notes && echo alpha > /workspace/notes/a.txt && echo bravo > /workspace/notes/b.txt && head -c 40000000 /dev/urandom > /workspace/big.bin",
    )
    .await;
    ca.take_snapshot("src", "team-a", "c")
        .await
        .expect("a snapshot");

    // A session whose workspace is smaller than the snapshot's files is refused first.
    let small = OpenRequest {
        limits: Some(Limits {
            workspace_size: Some("32m".to_owned()),
            ..Default::default()
        }),
        ..open_from("small", "team-a/c")
    };
    assert_eq!(
        refusal(cb.open_request(&small).await),
        (
            400,
            ErrorCode::BadRequest,
            "snapshot 'team-a/c' holds 38.1 MiB of files, more than the session's workspace of 32 MiB: open it with a larger workspace_size".to_owned()
        )
    );
    nothing_of(&b, "small").await;

    // Garbage in place of b.txt's chunk: the open names the file and leaves nothing.
    let chunk = sandboxd::snapshot::chunk_name(b"bravo\n");
    let stored = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.dev/s3/data")
        .join(need("SANDBOXD_S3_BUCKET"))
        .join(&prefix)
        .join("chunks")
        .join(&chunk[..2])
        .join(&chunk);
    std::fs::write(&stored, b"not zstd").expect("corrupt the chunk");
    let (status, code, message) = refusal(cb.open_request(&open_from("broken", "team-a/c")).await);
    assert_eq!((status, code), (422, ErrorCode::SnapshotCorrupt));
    assert!(
        message.starts_with(&format!(
            "snapshot 'team-a/c' cannot be restored: file 'notes/b.txt' needs chunk {chunk}, which does not decompress"
        )),
        "{message}"
    );
    nothing_of(&b, "broken").await;

    // A host without an object store says so.
    let bare = Daemon::start(&[("SANDBOXD_S3_ENDPOINT", "")]);
    bare.admin()
        .open("s", "org", Some("base"), None)
        .await
        .expect("open");
    assert_eq!(
        refusal(bare.admin().take_snapshot("s", "team-a", "x").await),
        (
            503,
            ErrorCode::SnapshotsUnavailable,
            "this host keeps no snapshots: sandboxd has no object store (set SANDBOXD_S3_ENDPOINT and SANDBOXD_S3_BUCKET, the chart's snapshots.store)".to_owned()
        )
    );
    // A key that is not one is refused before anything is read.
    let (status, code, _) = refusal(ca.take_snapshot("src", "Team_A", "x").await);
    assert_eq!((status, code), (400, ErrorCode::BadRequest));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_during_a_snapshot_leaves_no_half_snapshot_and_no_frozen_sandbox() {
    let prefix = unique("restore-kill");
    let mut a = start(&prefix);
    let ca = a.admin();
    ca.open("src", "org", Some("base"), None)
        .await
        .expect("open");
    sh(
        &ca,
        "src",
        "head -c 200000000 /dev/urandom > /workspace/big.bin && echo small > /workspace/small.txt",
    )
    .await;
    let container = container_of(&a, "src");
    let taking = tokio::spawn({
        let ca = ca.clone();
        async move { ca.take_snapshot("src", "team-a", "cut").await }
    });
    // Killed while the sandbox is paused for the copy.
    common::until(
        "the sandbox paused for the snapshot",
        std::time::Duration::from_secs(30),
        async || {
            (docker(&["inspect", "--format", "{{.State.Paused}}", &container]).trim() == "true")
                .then_some(())
        },
    )
    .await;
    a.process.kill9();
    assert!(
        taking.await.expect("joined").is_err(),
        "the snapshot was cut off"
    );
    a.spawn();
    let ca = a.admin();
    // The sandbox goes on: not left frozen.
    assert_eq!(
        docker(&["inspect", "--format", "{{.State.Status}}", &container]).trim(),
        "running"
    );
    assert_eq!(sh(&ca, "src", "cat /workspace/small.txt").await, "small\n");
    // No manifest: the snapshot does not exist (its chunks go with a collection).
    let (status, code, _) = refusal(ca.snapshot("team-a", "cut").await);
    assert_eq!((status, code), (404, ErrorCode::SnapshotNotFound));
    // Taken again, whole.
    let taken = ca
        .take_snapshot("src", "team-a", "cut")
        .await
        .expect("a snapshot");
    assert_eq!(taken.bytes, 200_000_000 + 6);
    let opened = ca
        .open_request(&open_from("again", "team-a/cut"))
        .await
        .expect("restored");
    assert_eq!(opened.session.launch, Launch::Restored);
    assert_eq!(
        sh(&ca, "again", "wc -c < /workspace/big.bin").await.trim(),
        "200000000"
    );
}
