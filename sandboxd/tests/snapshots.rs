//! Snapshots in a real S3 server (versitygw, from `make up`): a workspace of large files, many
//! small ones, symlinks, modes and empty folders is snapshotted and restored whole, byte for
//! byte and mode for mode; an unchanged second snapshot sends nothing; a corrupted or missing
//! chunk fails the restore with the file named and leaves nothing; a collection keeps every
//! chunk a snapshot needs, also one under way, and frees the rest.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::RngCore as _;
use sandboxd::snapshot::{CHUNK_BYTES, SnapshotError, Store, StoreConfig};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run `make up` and `eval \"$(make -s env)\"` (the S3 server)")
    })
}

/// The test server's store, under a prefix of this test's own.
fn store(prefix: &str) -> (Store, PathBuf) {
    let config = StoreConfig {
        endpoint: env("SANDBOXD_S3_ENDPOINT"),
        bucket: env("SANDBOXD_S3_BUCKET"),
        region: env("SANDBOXD_S3_REGION"),
        access_key_id: env("SANDBOXD_S3_ACCESS_KEY_ID"),
        secret_access_key: env("SANDBOXD_S3_SECRET_ACCESS_KEY"),
        prefix: prefix.to_owned(),
    };
    // versitygw's posix backend keeps each object as a file under its data folder.
    let data = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.dev/s3/data")
        .join(&config.bucket)
        .join(prefix);
    (Store::new(&config).expect("a store"), data)
}

fn unique(what: &str) -> String {
    format!("{what}-{}-{}", std::process::id(), rand::random::<u32>())
}

/// Every entry below `root`: its kind, mode, and bytes or target.
fn describe(root: &Path) -> BTreeMap<String, (String, u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for e in std::fs::read_dir(&dir).expect("read_dir") {
            let e = e.expect("entry");
            let path = e.path();
            let rel = path
                .strip_prefix(root)
                .expect("below")
                .display()
                .to_string();
            let meta = std::fs::symlink_metadata(&path).expect("meta");
            let mode = meta.permissions().mode() & 0o7777;
            let described = if meta.is_dir() {
                pending.push(path.clone());
                ("dir".to_owned(), mode, Vec::new())
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).expect("link");
                (
                    "link".to_owned(),
                    0,
                    target.display().to_string().into_bytes(),
                )
            } else {
                ("file".to_owned(), mode, std::fs::read(&path).expect("read"))
            };
            out.insert(rel, described);
        }
    }
    out
}

/// A workspace as an agent leaves one.
fn workspace(root: &Path) {
    let mut rng = rand::rng();
    let mut big = vec![0u8; 2 * CHUNK_BYTES + 12345];
    rng.fill_bytes(&mut big);
    std::fs::create_dir_all(root.join("data")).expect("dirs");
    std::fs::write(root.join("data/big.bin"), &big).expect("big");
    // The same bytes again under another name: stored once.
    std::fs::write(root.join("data/copy.bin"), &big).expect("copy");
    std::fs::create_dir_all(root.join("src/pkg")).expect("dirs");
    for i in 0..300 {
        std::fs::write(
            root.join(format!("src/pkg/m{i:03}.py")),
            format!("x = {i}\n"),
        )
        .expect("small");
    }
    std::fs::write(root.join("empty.txt"), "").expect("empty");
    std::fs::write(root.join("run.sh"), "#!/bin/sh\necho hi\n").expect("script");
    std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o755))
        .expect("mode");
    std::fs::write(root.join("secret.key"), "k").expect("key");
    std::fs::set_permissions(
        root.join("secret.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .expect("mode");
    std::fs::create_dir_all(root.join("empty/nested")).expect("empty folders");
    std::fs::create_dir(root.join("locked")).expect("dir");
    std::fs::write(root.join("locked/inside"), "in").expect("file");
    std::fs::set_permissions(root.join("locked"), std::fs::Permissions::from_mode(0o555))
        .expect("mode");
    std::os::unix::fs::symlink("src/pkg/m001.py", root.join("link.py")).expect("link");
    std::os::unix::fs::symlink("/etc/passwd", root.join("outside")).expect("link out");
    std::os::unix::fs::symlink("missing", root.join("dangling")).expect("dangling");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_is_restored_whole_and_an_unchanged_one_sends_nothing() {
    let prefix = unique("snapshots-test");
    let (store, _) = store(&prefix);
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = dir.path().join("ws");
    workspace(&ws);
    let before = describe(&ws);

    let first = store.snapshot("first", &ws).await.expect("a snapshot");
    // Two big files of the same bytes: 3 chunks each, stored once; 300 small files of 300
    // contents; the empty file has none; three short ones.
    assert_eq!(
        first.manifest.chunk_count,
        3 + 300 + 3,
        "{:?}",
        first.manifest.chunk_count
    );
    assert_eq!(first.chunks_sent, first.manifest.chunk_count);
    assert_eq!(first.manifest.entries.len(), before.len());

    // Unchanged: nothing is sent again.
    let second = store
        .snapshot("second", &ws)
        .await
        .expect("a second snapshot");
    assert_eq!((second.chunks_sent, second.bytes_sent), (0, 0));

    // Changed after the snapshot; the restore is the workspace as it was.
    std::fs::write(ws.join("src/pkg/m000.py"), "changed\n").expect("change");
    let restored = dir.path().join("restored");
    store
        .restore(
            "first",
            &restored,
            (
                nix::unistd::getuid().as_raw(),
                nix::unistd::getgid().as_raw(),
            ),
        )
        .await
        .expect("a restore");
    assert_eq!(
        describe(&restored),
        before,
        "every byte, mode and link as snapshotted"
    );
    let again = store.restore("first", &restored, (0, 0)).await;
    assert!(
        matches!(again, Err(SnapshotError::DestinationExists(_))),
        "{again:?}"
    );
    let missing = store
        .restore("never-taken", &dir.path().join("x"), (0, 0))
        .await;
    assert!(
        matches!(missing, Err(SnapshotError::NotFound(_))),
        "{missing:?}"
    );
    assert_eq!(
        store.snapshot("Bad/Name", &ws).await.err().map(|e| e.to_string()),
        Some("'Bad/Name' is not a snapshot name: 1 to 253 characters of a-z, 0-9, '-' and '.', starting and ending with a letter or digit, after its scope and a '/' when it has one (a DNS label)".to_owned())
    );
    let mut listed = store.list_snapshots().await.expect("list");
    listed.sort();
    assert_eq!(listed, ["first", "second"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_or_missing_chunk_fails_the_restore_naming_the_file() {
    let prefix = unique("snapshots-corrupt");
    let (store, data) = store(&prefix);
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("notes")).expect("dirs");
    std::fs::write(ws.join("notes/a.txt"), "alpha\n").expect("a");
    std::fs::write(ws.join("notes/b.txt"), "bravo\n").expect("b");
    let taken = store.snapshot("s", &ws).await.expect("snapshot");
    let chunk_of = |file: &str| {
        taken
            .manifest
            .entries
            .iter()
            .find(|e| e.path == file)
            .and_then(|e| e.chunks.first().cloned())
            .expect("a chunk")
    };
    let (a, b) = (chunk_of("notes/a.txt"), chunk_of("notes/b.txt"));

    // A chunk whose bytes are another chunk's (a valid zstd frame): caught by its checksum.
    let path_of = |c: &str| data.join("chunks").join(&c[..2]).join(c);
    std::fs::copy(path_of(&a), path_of(&b)).expect("swap a chunk's bytes");
    let dest = dir.path().join("restored");
    let err = store
        .restore("s", &dest, (0, 0))
        .await
        .expect_err("refused");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("snapshot 's' cannot be restored: file 'notes/b.txt' needs chunk {b}, which holds other bytes")),
        "{text}"
    );
    assert!(
        !dest.exists() && !dir.path().join(".restored.restoring").exists(),
        "nothing is left"
    );

    // Garbage in place of a chunk, then none at all.
    std::fs::write(path_of(&b), b"not zstd").expect("garbage");
    let text = store
        .restore("s", &dest, (0, 0))
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        text.contains("file 'notes/b.txt'") && text.contains("does not decompress"),
        "{text}"
    );
    std::fs::remove_file(path_of(&b)).expect("remove");
    let text = store
        .restore("s", &dest, (0, 0))
        .await
        .expect_err("refused")
        .to_string();
    assert_eq!(
        text,
        format!(
            "snapshot 's' cannot be restored: file 'notes/b.txt' needs chunk {b}, which is missing from the store"
        )
    );
    assert!(!dest.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_frees_only_chunks_no_snapshot_needs() {
    let prefix = unique("snapshots-gc");
    let (store, data) = store(&prefix);
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).expect("dir");
    std::fs::write(ws.join("kept.txt"), "kept by both\n").expect("kept");
    std::fs::write(ws.join("old.txt"), "only the first\n").expect("old");
    store.snapshot("one", &ws).await.expect("one");
    std::fs::remove_file(ws.join("old.txt")).expect("rm");
    std::fs::write(ws.join("new.txt"), "only the second\n").expect("new");
    store.snapshot("two", &ws).await.expect("two");
    let chunks = || walkdir(&data.join("chunks"));
    assert_eq!(chunks().len(), 3);

    // A chunk sent by a snapshot under way (no manifest yet) is younger than the grace: kept.
    store.delete("one").await.expect("delete");
    assert_eq!(
        store
            .collect(Duration::from_secs(600))
            .await
            .expect("collect"),
        0
    );
    assert_eq!(chunks().len(), 3, "nothing older than the grace");
    // Past the grace: the chunk only `one` needed goes, the others stay, and `two` restores.
    assert_eq!(store.collect(Duration::ZERO).await.expect("collect"), 1);
    assert_eq!(chunks().len(), 2);
    let restored = dir.path().join("restored");
    store
        .restore("two", &restored, (0, 0))
        .await
        .expect("two restores");
    assert_eq!(
        std::fs::read_to_string(restored.join("kept.txt")).expect("kept"),
        "kept by both\n"
    );
    assert_eq!(
        std::fs::read_to_string(restored.join("new.txt")).expect("new"),
        "only the second\n"
    );
}

/// The files below `dir`.
fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                pending.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}
