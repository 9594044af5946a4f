//! The unit tests of the workspace, over 600 lines: one fixture serves every operation.

use super::writes::open_created_dir;
use super::*;
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::fd::AsFd as _;

use cap_std::fs::Dir;
use chrono::DateTime;
use std::os::unix::fs::{MetadataExt, symlink};

const UID: u32 = 10001;
const GID: u32 = 10001;

/// A workspace in a temporary directory, with a sentinel file outside it.
struct Fixture {
    _temp: tempfile::TempDir,
    base: PathBuf,
    dir: PathBuf,
    ws: Workspace,
}

const SENTINEL: &[u8] = b"outside, never to be touched";

fn fixture() -> Fixture {
    let temp = tempfile::tempdir().expect("tempdir");
    let base = temp.path().to_path_buf();
    let dir = base.join("sessions").join("s1").join("workspace");
    let ws = Workspace::new(&dir, UID, GID);
    ws.prepare().expect("prepare");
    fs::write(base.join("secret"), SENTINEL).expect("sentinel");
    fs::create_dir(base.join("outside")).expect("outside dir");
    fs::write(base.join("outside").join("sentinel"), SENTINEL).expect("sentinel");
    Fixture {
        _temp: temp,
        base,
        dir,
        ws,
    }
}

impl Fixture {
    /// A file the agent made: owned by the sandbox user, as are the directories made for it.
    fn file(&self, rel: &str, data: &[u8]) {
        let path = self.dir.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("parents");
        }
        fs::write(path, data).expect("write fixture file");
        self.own(rel);
    }

    /// A link the agent made.
    fn link(&self, rel: &str, target: impl AsRef<Path>) {
        symlink(target, self.dir.join(rel)).expect("symlink");
        self.own(rel);
    }

    /// Gives `rel` and the directories above it (below the workspace) to the sandbox user.
    fn own(&self, rel: &str) {
        let mut path = self.dir.join(rel);
        while path != self.dir {
            std::os::unix::fs::lchown(&path, Some(UID), Some(GID)).expect("lchown");
            path.pop();
        }
    }

    fn sentinels_intact(&self) {
        assert_eq!(
            fs::read(self.base.join("secret")).expect("secret"),
            SENTINEL
        );
        assert_eq!(
            fs::read(self.base.join("outside").join("sentinel")).expect("sentinel"),
            SENTINEL
        );
        let names: Vec<_> = fs::read_dir(&self.base)
            .expect("base")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
            .collect();
        let mut names = names;
        names.sort();
        assert_eq!(names, ["outside", "secret", "sessions"]);
        let outside: Vec<_> = fs::read_dir(self.base.join("outside"))
            .expect("outside")
            .collect();
        assert_eq!(outside.len(), 1);
    }
}

fn names(entries: &[Entry]) -> Vec<&str> {
    entries.iter().map(|e| e.path.as_str()).collect()
}

#[test]
fn traversal_corpus_is_refused_everywhere() {
    let f = fixture();
    let passwd_before = fs::read("/etc/passwd").ok();
    f.link("link", "/etc");
    f.link("elink", f.base.join("outside"));
    f.link("up", "../..");
    f.link("loop_a", "loop_b");
    f.link("loop_b", "loop_a");
    f.link("pw", "/etc/passwd");
    f.link("sec", "../../../secret");
    let corpus: &[(&str, &str)] = &[
        ("../x", "outside_workspace"),
        ("a/../../x", "outside_workspace"),
        ("../secret", "outside_workspace"),
        ("/etc/passwd", "invalid_path"),
        ("/workspace/../etc/passwd", "outside_workspace"),
        ("/workspacex/y", "invalid_path"),
        ("a\0b", "invalid_path"),
        ("link/passwd", "outside_workspace"),
        ("elink/sentinel", "outside_workspace"),
        ("up/secret", "outside_workspace"),
        ("up/outside/sentinel", "outside_workspace"),
        ("loop_a/x", "invalid_path"),
    ];
    for (path, code) in corpus {
        let results: Vec<(&str, Result<(), FileError>)> = vec![
            ("read", f.ws.read(path, 0, None, 1 << 20).map(drop)),
            ("write", f.ws.write(path, b"pwned").map(drop)),
            ("mkdir", f.ws.mkdir(path)),
            ("remove", f.ws.remove(path, true).map(drop)),
            (
                "list",
                f.ws.list(path, MAX_LIST_ENTRIES)
                    .map(|l| l.entries)
                    .map(drop),
            ),
            ("stat", f.ws.stat(path).map(drop)),
            ("tree", f.ws.tree(path, TreeLimits::default()).map(drop)),
        ];
        for (op, result) in results {
            match result {
                Ok(()) => panic!("{op} {path:?} was allowed"),
                Err(e) => assert_eq!(e.code().as_str(), *code, "{op} {path:?}: {e}"),
            }
        }
        f.sentinels_intact();
    }
    // Symlinked files leading out: never read, never written through.
    for path in ["pw", "sec", "loop_a"] {
        let read = f.ws.read(path, 0, None, 1 << 20);
        assert!(read.is_err(), "read {path}");
        let write = f.ws.write(path, b"pwned");
        assert!(write.is_err(), "write {path}");
    }
    assert!(matches!(
        f.ws.read("pw", 0, None, 1 << 20),
        Err(FileError::OutsideWorkspace { .. })
    ));
    assert!(matches!(
        f.ws.write("sec", b"pwned"),
        Err(FileError::OutsideWorkspace { .. })
    ));
    assert!(matches!(
        f.ws.read("loop_a", 0, None, 1 << 20),
        Err(FileError::InvalidPath { .. })
    ));
    assert!(matches!(
        f.ws.write("loop_a", b"x"),
        Err(FileError::InvalidPath { .. })
    ));
    // Listing a link leading out is refused; a stat of the link itself is fine.
    assert!(matches!(
        f.ws.list("link", MAX_LIST_ENTRIES).map(|l| l.entries),
        Err(FileError::OutsideWorkspace { .. })
    ));
    assert!(matches!(
        f.ws.list("up", MAX_LIST_ENTRIES).map(|l| l.entries),
        Err(FileError::OutsideWorkspace { .. })
    ));
    assert_eq!(f.ws.stat("pw").expect("stat pw").kind, EntryKind::Symlink);
    // Removing the links removes the links only.
    for path in ["pw", "link", "up", "sec", "elink", "loop_a"] {
        let removed = f.ws.remove(path, true).expect("remove link");
        assert_eq!(removed.kind, EntryKind::Symlink);
        assert!(fs::symlink_metadata(f.dir.join(path)).is_err());
    }
    f.sentinels_intact();
    assert_eq!(fs::read("/etc/passwd").ok(), passwd_before);
    assert!(Path::new("/etc").is_dir());
}

#[test]
fn error_messages_name_the_path() {
    let f = fixture();
    let e =
        f.ws.read("../etc/passwd", 0, None, 10)
            .expect_err("refused");
    assert_eq!(e.to_string(), "'../etc/passwd' leads outside the workspace");
    assert!(matches!(e, FileError::OutsideWorkspace { .. }), "{e}");
    let e = f.ws.read("a\0b", 0, None, 10).expect_err("refused");
    assert!(e.to_string().contains("a\\0b"), "{e}");
}

#[test]
fn a_full_disk_is_named_with_the_workspace_size() {
    let e = map_io("big.bin", io::Error::from_raw_os_error(28)).within(Some(64 << 20));
    assert!(matches!(e, FileError::NoSpace { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "No space left on device: the workspace is full (it holds at most 64 MiB); 'big.bin' was not written. Remove files to make room"
    );
    let e = map_io("q", io::Error::from_raw_os_error(122));
    assert_eq!(
        e.to_string(),
        "No space left on device: the workspace is full; 'q' was not written. Remove files to make room"
    );
}

#[test]
fn write_creates_owned_parents_atomically() {
    let f = fixture();
    let written = f.ws.write("a/b/c.txt", b"hello").expect("write");
    assert_eq!(written.size, 5);
    assert_eq!(fs::read(f.dir.join("a/b/c.txt")).expect("read"), b"hello");
    for (rel, mode) in [("a", 0o755), ("a/b", 0o755), ("a/b/c.txt", 0o644)] {
        let meta = fs::symlink_metadata(f.dir.join(rel)).expect("meta");
        assert_eq!((meta.uid(), meta.gid()), (UID, GID), "{rel}");
        assert_eq!(meta.mode() & 0o7777, mode, "{rel}");
    }
    // Overwrite: replaced, and no temporary file left behind.
    f.ws.write("a/b/c.txt", b"bye").expect("overwrite");
    assert_eq!(fs::read(f.dir.join("a/b/c.txt")).expect("read"), b"bye");
    let left: Vec<_> = fs::read_dir(f.dir.join("a/b"))
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(left, ["c.txt"]);
    let root_left: Vec<_> = fs::read_dir(&f.dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(root_left, ["a"]);
}

#[test]
fn write_keeps_the_mode_of_a_replaced_file() {
    let f = fixture();
    f.file("run.sh", b"#!/bin/sh\n");
    fs::set_permissions(f.dir.join("run.sh"), fs::Permissions::from_mode(0o750)).expect("chmod");
    f.ws.write("run.sh", b"#!/bin/sh\necho hi\n")
        .expect("write");
    let meta = fs::metadata(f.dir.join("run.sh")).expect("meta");
    assert_eq!(meta.mode() & 0o7777, 0o750);
    assert_eq!(meta.uid(), UID);
}

#[test]
fn write_refuses_directories_and_the_root() {
    let f = fixture();
    fs::create_dir(f.dir.join("d")).expect("mkdir");
    assert!(matches!(
        f.ws.write("d", b"x"),
        Err(FileError::IsADirectory { .. })
    ));
    for path in ["", ".", "/workspace", "/workspace/", "a/.."] {
        assert!(
            matches!(f.ws.write(path, b"x"), Err(FileError::InvalidPath { .. })),
            "{path:?}"
        );
    }
    f.file("plain", b"x");
    assert!(matches!(
        f.ws.write("plain/child", b"x"),
        Err(FileError::NotADirectory { .. })
    ));
}

#[test]
fn write_through_a_symlink_inside_writes_the_target() {
    let f = fixture();
    f.file("real.txt", b"old");
    f.link("cur", "real.txt");
    f.ws.write("cur", b"new").expect("write through link");
    assert_eq!(fs::read(f.dir.join("real.txt")).expect("read"), b"new");
    assert!(
        fs::symlink_metadata(f.dir.join("cur"))
            .expect("meta")
            .file_type()
            .is_symlink()
    );
    // A link in a symlinked directory, with `..` in its target.
    f.file("x/y/target.txt", b"old");
    f.link("dy", "x/y");
    f.link("x/y/rel", "../y/target.txt");
    f.ws.write("dy/rel", b"via dy").expect("write");
    assert_eq!(
        fs::read(f.dir.join("x/y/target.txt")).expect("read"),
        b"via dy"
    );
    // A dangling link inside creates its target.
    f.link("dangling", "made/by/link.txt");
    f.ws.write("dangling", b"made").expect("write");
    assert_eq!(
        fs::read(f.dir.join("made/by/link.txt")).expect("read"),
        b"made"
    );
    assert_eq!(fs::metadata(f.dir.join("made")).expect("meta").uid(), UID);
    // A link to a directory is a directory.
    assert!(matches!(
        f.ws.write("dy", b"x"),
        Err(FileError::IsADirectory { .. })
    ));
}

#[test]
fn workspace_prefix_is_stripped() {
    let f = fixture();
    f.ws.write("/workspace/notes.txt", b"notes").expect("write");
    assert_eq!(fs::read(f.dir.join("notes.txt")).expect("read"), b"notes");
    let read = f.ws.read("notes.txt", 0, None, 100).expect("read");
    assert_eq!(read.data, b"notes");
    let stat = f.ws.stat("/workspace/notes.txt").expect("stat");
    assert_eq!(
        (stat.name.as_str(), stat.path.as_str()),
        ("notes.txt", "notes.txt")
    );
    assert_eq!(stat.kind, EntryKind::File);
    assert_eq!(
        names(
            &f.ws
                .list("/workspace", MAX_LIST_ENTRIES)
                .map(|l| l.entries)
                .expect("list")
        ),
        ["notes.txt"]
    );
    // An odd file name, not a traversal.
    f.ws.write("%2e%2e/x", b"odd").expect("odd name");
    assert_eq!(fs::read(f.dir.join("%2e%2e/x")).expect("read"), b"odd");
}

#[test]
fn read_offset_limit_and_errors() {
    let f = fixture();
    f.file("f.txt", b"0123456789");
    let read = |offset, limit| f.ws.read("f.txt", offset, limit, 100).expect("read");
    assert_eq!(read(0, None).data, b"0123456789");
    let part = read(3, Some(4));
    assert_eq!(
        (part.data.as_slice(), part.size, part.offset),
        (&b"3456"[..], 10, 3)
    );
    assert_eq!(read(8, Some(10)).data, b"89");
    assert_eq!(read(4, None).data, b"456789");
    let past = read(20, Some(5));
    assert_eq!((past.data.len(), past.size, past.offset), (0, 10, 10));
    assert!(matches!(
        f.ws.read("missing", 0, None, 100),
        Err(FileError::NotFound { .. })
    ));
    fs::create_dir(f.dir.join("d")).expect("mkdir");
    for path in ["d", "", "/workspace"] {
        assert!(
            matches!(
                f.ws.read(path, 0, None, 100),
                Err(FileError::IsADirectory { .. })
            ),
            "{path:?}"
        );
    }
    // A symlink inside is followed.
    f.link("alias", "f.txt");
    assert_eq!(
        f.ws.read("alias", 0, Some(2), 100).expect("read").data,
        b"01"
    );
    // Limits apply to the bytes returned.
    assert!(f.ws.read("f.txt", 0, Some(4), 4).is_ok());
    assert!(matches!(
        f.ws.read("f.txt", 0, None, 4),
        Err(FileError::TooLarge { size: 10, limit: 4 })
    ));
}

#[test]
fn read_refuses_a_fifo_without_blocking() {
    let f = fixture();
    let status = std::process::Command::new("mkfifo")
        .arg(f.dir.join("pipe"))
        .status();
    if !status.is_ok_and(|s| s.success()) {
        return; // no mkfifo here
    }
    let e = f.ws.read("pipe", 0, None, 100).expect_err("a FIFO");
    assert!(matches!(e, FileError::NotRegularFile { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "'pipe' is not a regular file (a FIFO, socket or device)"
    );
    // Through a link, and when written over, the same.
    f.link("to-pipe", "/workspace/pipe");
    assert!(matches!(
        f.ws.read("to-pipe", 0, None, 100),
        Err(FileError::NotRegularFile { .. })
    ));
    assert!(matches!(
        f.ws.write("pipe", b"x"),
        Err(FileError::NotRegularFile { .. })
    ));
    assert_eq!(f.ws.stat("pipe").expect("stat").kind, EntryKind::Other);
}

#[test]
fn too_large_message_names_the_limit() {
    let f = fixture();
    f.file("big.bin", &vec![7u8; 9_437_184]);
    let e =
        f.ws.read("big.bin", 0, None, 8_388_608)
            .expect_err("too large");
    assert!(matches!(
        e,
        FileError::TooLarge {
            size: 9_437_184,
            limit: 8_388_608
        }
    ));
    assert_eq!(
        e.to_string(),
        "reading 9437184 bytes is over the read limit of 8388608 bytes \
         (SANDBOXD_MAX_READ_BYTES); read it in parts with offset and limit"
    );
    let part =
        f.ws.read("big.bin", 8_388_608, None, 8_388_608)
            .expect("rest");
    assert_eq!(part.data.len(), 1_048_576);
}

#[test]
fn remove_files_links_and_trees() {
    let f = fixture();
    for path in ["", ".", "/workspace", "/workspace/", "a/.."] {
        assert!(
            matches!(f.ws.remove(path, true), Err(FileError::InvalidPath { .. })),
            "{path:?}"
        );
    }
    assert!(f.dir.is_dir());
    assert!(matches!(
        f.ws.remove("missing", false),
        Err(FileError::NotFound { .. })
    ));
    f.file("f.txt", b"x");
    let removed = f.ws.remove("f.txt", false).expect("remove file");
    assert_eq!(
        removed,
        RemoveResult {
            path: "f.txt".to_owned(),
            kind: EntryKind::File
        }
    );
    assert!(!f.dir.join("f.txt").exists());

    f.file("t/a/b.txt", b"x");
    f.link("t/a/out", f.base.join("outside"));
    f.link("t/a/up", "../../..");
    assert!(matches!(
        f.ws.remove("t", false),
        Err(FileError::DirectoryNotEmpty { .. })
    ));
    fs::create_dir(f.dir.join("empty")).expect("mkdir");
    assert_eq!(
        f.ws.remove("empty", false).expect("remove empty").kind,
        EntryKind::Dir
    );
    assert_eq!(
        f.ws.remove("t", true).expect("remove tree").kind,
        EntryKind::Dir
    );
    assert!(!f.dir.join("t").exists());
    f.sentinels_intact();

    // A link to a directory inside: the link goes, the directory stays.
    f.file("keep/k.txt", b"k");
    f.link("keeplink", "keep");
    f.ws.remove("keeplink", true).expect("remove link");
    assert_eq!(fs::read(f.dir.join("keep/k.txt")).expect("kept"), b"k");
    // Through a link inside is fine.
    f.link("keeplink", "keep");
    f.ws.remove("keeplink/k.txt", false)
        .expect("remove through link");
    assert!(!f.dir.join("keep/k.txt").exists());
}

/// Makes `rel/d/d/…` `depth` folders deep below the workspace, with a link out at the
/// bottom, one descriptor at a time (such a path is far beyond PATH_MAX).
fn dig(f: &Fixture, rel: &str, depth: usize) {
    fs::create_dir(f.dir.join(rel)).expect("mkdir");
    std::os::unix::fs::chown(f.dir.join(rel), Some(UID), Some(GID)).expect("chown");
    let mut dir = fs::File::open(f.dir.join(rel)).expect("open");
    for _ in 0..depth {
        rustix::fs::mkdirat(&dir, "d", rustix::fs::Mode::RWXU).expect("mkdir");
        // The sandbox user's, as a sandbox digging it would make it.
        rustix::fs::chownat(
            &dir,
            "d",
            Some(rustix::fs::Uid::from_raw(UID)),
            Some(rustix::fs::Gid::from_raw(GID)),
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .expect("chown");
        dir = crate::workspace::trash::open_dir_nofollow(dir.as_fd(), OsStr::new("d"))
            .expect("open")
            .into();
    }
    rustix::fs::symlinkat(f.base.join("outside"), &dir, "out").expect("link");
}

#[test]
fn a_recursive_remove_of_a_deep_tree_is_bounded() {
    let f = fixture();
    // Without a trash: deleted in place, on a 256 KiB stack (a recursion per level would
    // need more for 5,000 levels).
    dig(&f, "deep", 5_000);
    let ws = f.ws.clone();
    let removed = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || ws.remove("deep", true))
        .expect("a thread")
        .join()
        .expect("no stack overflow");
    assert_eq!(removed.expect("removed").kind, EntryKind::Dir);
    assert!(!f.dir.join("deep").exists());
    f.sentinels_intact();

    // With a trash: moved there at once, deleted by its sweep.
    let trash = Trash::new(&f.base.join("sessions"));
    let ws = f.ws.clone().with_trash(trash.clone());
    dig(&f, "deep", 5_000);
    assert_eq!(
        ws.remove("/workspace/deep", true).expect("removed").kind,
        EntryKind::Dir
    );
    assert!(!f.dir.join("deep").exists());
    assert_eq!(fs::read_dir(trash.dir()).expect("trash").count(), 1);
    let swept = trash.sweep();
    assert_eq!((swept.removed, swept.failed.len()), (1, 0));
    assert_eq!(fs::read_dir(trash.dir()).expect("trash").count(), 0);
    f.sentinels_intact();
    assert!(matches!(
        ws.remove("deep", true),
        Err(FileError::NotFound { .. })
    ));
}

#[test]
fn a_fifo_or_link_swapped_in_for_a_new_directory_is_refused_at_once() {
    let f = fixture();
    let root = f.ws.open_root().expect("root");
    rustix::fs::mkfifoat(
        &root,
        "fifo",
        rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
    )
    .expect("fifo");
    fs::create_dir(f.dir.join("real")).expect("mkdir");
    symlink("real", f.dir.join("link")).expect("link");
    symlink(f.base.join("outside"), f.dir.join("out")).expect("link");
    f.file("file", b"x");
    // On a thread of its own, so that an open that blocked on the FIFO fails the test
    // instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let kinds: Vec<_> = ["fifo", "link", "out", "file"]
            .into_iter()
            .map(|name| {
                open_created_dir(&root, name)
                    .map(|_| ())
                    .map_err(|e| e.kind())
            })
            .collect();
        let _ = tx.send(kinds);
    });
    let kinds = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the opens answered at once");
    assert_eq!(kinds, vec![Err(io::ErrorKind::NotADirectory); 4]);
    f.sentinels_intact();
}

#[test]
fn mkdir_is_mkdir_p_and_owned() {
    let f = fixture();
    f.ws.mkdir("/workspace/p/q/r").expect("mkdir");
    for rel in ["p", "p/q", "p/q/r"] {
        let meta = fs::symlink_metadata(f.dir.join(rel)).expect("meta");
        assert!(meta.is_dir());
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (UID, GID, 0o755)
        );
    }
    f.ws.mkdir("p/q").expect("existing is fine");
    f.ws.mkdir("").expect("root exists");
    f.file("file", b"x");
    assert!(matches!(
        f.ws.mkdir("file"),
        Err(FileError::NotADirectory { .. })
    ));
    assert!(matches!(
        f.ws.mkdir("file/sub"),
        Err(FileError::NotADirectory { .. })
    ));
    f.link("dang", "nowhere");
    assert!(matches!(
        f.ws.mkdir("dang/sub"),
        Err(FileError::NotFound { .. })
    ));
}

#[test]
fn stat_and_list_do_not_follow_symlinks() {
    let f = fixture();
    f.file("b.txt", b"12345");
    f.file("a/inner.txt", b"x");
    f.link("c", "a");
    f.link("d", "/etc");
    let list =
        f.ws.list("", MAX_LIST_ENTRIES)
            .map(|l| l.entries)
            .expect("list");
    let kinds: Vec<_> = list.iter().map(|e| (e.name.as_str(), e.kind)).collect();
    assert_eq!(
        kinds,
        [
            ("a", EntryKind::Dir),
            ("b.txt", EntryKind::File),
            ("c", EntryKind::Symlink),
            ("d", EntryKind::Symlink),
        ]
    );
    assert_eq!(list[1].size, 5);
    assert!(list[1].modified.is_some());
    // Listing through a link inside lists its target, under the path as asked.
    assert_eq!(
        names(
            &f.ws
                .list("c", MAX_LIST_ENTRIES)
                .map(|l| l.entries)
                .expect("list c")
        ),
        ["c/inner.txt"]
    );
    let stat = f.ws.stat("").expect("stat root");
    assert_eq!((stat.kind, stat.path.as_str()), (EntryKind::Dir, ""));
    assert!(matches!(
        f.ws.list("b.txt", MAX_LIST_ENTRIES).map(|l| l.entries),
        Err(FileError::NotADirectory { .. })
    ));
    assert!(matches!(f.ws.stat("nope"), Err(FileError::NotFound { .. })));
    let json = serde_json::to_value(&list[2]).expect("json");
    assert_eq!(json["kind"], "symlink");
    assert_eq!(json["path"], "c");
    let modified = json["modified"].as_str().expect("modified");
    assert!(DateTime::parse_from_rfc3339(modified).is_ok(), "{modified}");
}

#[test]
fn realpath_stat_followed_and_list_all_stay_inside() {
    let f = fixture();
    f.file("a/b.txt", b"12345");
    f.file(".git/HEAD", b"ref");
    f.link("link", "a/b.txt");
    f.link("dirlink", "a");
    f.link("a/up", "..");
    f.link("abs", "/etc");
    f.link("climb", "../../..");
    f.link("loop1", "loop2");
    f.link("loop2", "loop1");
    assert_eq!(f.ws.realpath("").expect("root"), "");
    assert_eq!(f.ws.realpath("/workspace/link").expect("link"), "a/b.txt");
    assert_eq!(f.ws.realpath("dirlink/b.txt").expect("dirlink"), "a/b.txt");
    assert_eq!(f.ws.realpath("dirlink/up/link").expect("up"), "a/b.txt");
    assert_eq!(f.ws.realpath("new/x/../y").expect("missing"), "new/y");
    assert_eq!(
        f.ws.realpath("a/b.txt/below").expect("below"),
        "a/b.txt/below"
    );
    for out in ["abs", "abs/passwd", "climb", "climb/secret"] {
        assert!(
            matches!(f.ws.realpath(out), Err(FileError::OutsideWorkspace { .. })),
            "{out}"
        );
        assert!(
            matches!(
                f.ws.stat_followed(out),
                Err(FileError::OutsideWorkspace { .. })
            ),
            "{out}"
        );
    }
    assert!(matches!(
        f.ws.realpath("loop1"),
        Err(FileError::InvalidPath { .. })
    ));
    let e = f.ws.stat_followed("dirlink").expect("stat dirlink");
    assert_eq!((e.kind, e.path.as_str()), (EntryKind::Dir, "dirlink"));
    let e = f.ws.stat_followed("link").expect("stat link");
    assert_eq!((e.kind, e.size), (EntryKind::File, 5));
    assert!(matches!(
        f.ws.stat_followed("nope"),
        Err(FileError::NotFound { .. })
    ));
    // Nothing is left out of list_all: toolchain folders and links are listed as themselves.
    let all: Vec<_> =
        f.ws.list_all("", MAX_LIST_ENTRIES)
            .map(|l| l.entries)
            .expect("list_all")
            .into_iter()
            .map(|e| (e.name, e.kind))
            .collect();
    assert!(
        all.contains(&(".git".to_owned(), EntryKind::Dir)),
        "{all:?}"
    );
    assert!(
        all.contains(&("abs".to_owned(), EntryKind::Symlink)),
        "{all:?}"
    );
    assert!(matches!(
        f.ws.list_all("abs", MAX_LIST_ENTRIES).map(|l| l.entries),
        Err(FileError::OutsideWorkspace { .. })
    ));
    f.sentinels_intact();
}

#[test]
fn exclusions_in_list_and_tree() {
    let f = fixture();
    for rel in [
        "node_modules/x.js",
        "src/node_modules/y.js",
        "src/main.rs",
        "src/__pycache__/m.pyc",
        ".git/HEAD",
        "skills/s.md",
        ".spill/out.txt",
        ".agenticos/conf",
        "skillsfoo/k.md",
        "src/skills/z.md",
    ] {
        f.file(rel, b"x");
    }
    assert_eq!(
        names(
            &f.ws
                .list("", MAX_LIST_ENTRIES)
                .map(|l| l.entries)
                .expect("list")
        ),
        ["skillsfoo", "src"]
    );
    let tree = f.ws.tree("", TreeLimits::default()).expect("tree");
    assert_eq!(
        names(&tree.entries),
        [
            "skillsfoo",
            "src",
            "skillsfoo/k.md",
            "src/main.rs",
            "src/skills",
            "src/skills/z.md"
        ]
    );
    assert!(!tree.incomplete);
    // Counts: with room for exactly the listed entries, no limit is reached.
    let exact =
        f.ws.tree(
            "",
            TreeLimits {
                max_depth: 6,
                max_entries: 6,
            },
        )
        .expect("tree");
    assert!(!exact.entry_limit_reached && !exact.incomplete);
    // Asked for explicitly, an excluded directory is listed.
    assert_eq!(
        names(
            &f.ws
                .list("skills", MAX_LIST_ENTRIES)
                .map(|l| l.entries)
                .expect("list")
        ),
        ["skills/s.md"]
    );
    assert_eq!(
        names(
            &f.ws
                .list("node_modules", MAX_LIST_ENTRIES)
                .map(|l| l.entries)
                .expect("list")
        ),
        ["node_modules/x.js"]
    );
}

#[test]
fn tree_depth_limit() {
    let f = fixture();
    let chain = "d1/d2/d3/d4/d5/d6/d7/d8/d9/d10";
    fs::create_dir_all(f.dir.join(chain)).expect("chain");
    let tree = f.ws.tree("", TreeLimits::default()).expect("tree");
    assert_eq!(
        names(&tree.entries),
        [
            "d1",
            "d1/d2",
            "d1/d2/d3",
            "d1/d2/d3/d4",
            "d1/d2/d3/d4/d5",
            "d1/d2/d3/d4/d5/d6"
        ]
    );
    assert!(tree.depth_limit_reached && !tree.entry_limit_reached && tree.incomplete);
    assert_eq!((tree.max_depth, tree.max_entries), (6, 2000));
    // Starting deeper, with the chain ending within the limit.
    let tree =
        f.ws.tree("d1/d2/d3/d4/d5", TreeLimits::default())
            .expect("tree");
    assert_eq!(tree.root, "d1/d2/d3/d4/d5");
    assert_eq!(tree.entries.len(), 5);
    assert!(!tree.depth_limit_reached && !tree.incomplete);
    // An empty directory at the last level is not a reached limit.
    let tree =
        f.ws.tree(
            "d1/d2/d3/d4/d5/d6/d7/d8",
            TreeLimits {
                max_depth: 2,
                max_entries: 10,
            },
        )
        .expect("tree");
    assert_eq!(tree.entries.len(), 2);
    assert!(!tree.depth_limit_reached);
    // No levels at all.
    let tree =
        f.ws.tree(
            "",
            TreeLimits {
                max_depth: 0,
                max_entries: 10,
            },
        )
        .expect("tree");
    assert!(tree.entries.is_empty() && tree.depth_limit_reached && tree.incomplete);
}

#[test]
fn tree_entry_limit() {
    let f = fixture();
    for i in 0..2100 {
        f.file(&format!("f{i:04}"), b"");
    }
    let tree =
        f.ws.tree("/workspace", TreeLimits::default())
            .expect("tree");
    assert_eq!(tree.entries.len(), 2000);
    assert!(tree.entry_limit_reached && tree.incomplete && !tree.depth_limit_reached);
    // The first entries the folder yields (it is read no further), sorted by name.
    assert!(tree.entries.windows(2).all(|w| w[0].name < w[1].name));
}

#[test]
fn listings_stop_at_their_limit() {
    let f = fixture();
    for i in 0..50 {
        f.file(&format!("f{i:02}"), b"");
    }
    f.file("node_modules/x.js", b"");
    let listed = f.ws.list("", 10).expect("list");
    assert_eq!(listed.entries.len(), 10);
    assert!(listed.truncated);
    assert!(listed.entries.windows(2).all(|w| w[0].name < w[1].name));
    assert!(listed.entries.iter().all(|e| e.name != "node_modules"));
    // Exactly at the limit is complete: excluded names do not count.
    let exact = f.ws.list("", 50).expect("list");
    assert_eq!((exact.entries.len(), exact.truncated), (50, false));
    let all = f.ws.list_all("", 50).expect("list_all");
    assert_eq!((all.entries.len(), all.truncated), (50, true));
    let all = f.ws.list_all("", 51).expect("list_all");
    assert_eq!((all.entries.len(), all.truncated), (51, false));
    let none = f.ws.list("", 0).expect("list");
    assert!(none.entries.is_empty() && none.truncated);
}

/// Opens a subdirectory as a walk does, but the one at `at` is unreadable.
fn unreadable(at: &'static str) -> impl Fn(&Dir, &str) -> io::Result<Dir> {
    move |root, rel| {
        if rel == at {
            Err(io::Error::from(io::ErrorKind::PermissionDenied))
        } else {
            root.open_dir(rel)
        }
    }
}

#[test]
fn tree_skips_an_unreadable_subdirectory() {
    let f = fixture();
    f.file("a/1.txt", b"");
    f.file("b/2.txt", b"");
    f.file("b/deep/3.txt", b"");
    f.file("c/4.txt", b"");
    let tree =
        f.ws.tree_with(
            "",
            TreeOptions::excluding(TreeLimits::default()),
            &unreadable("b"),
        )
        .expect("tree");
    assert_eq!(names(&tree.entries), ["a", "b", "c", "a/1.txt", "c/4.txt"]);
    assert_eq!(tree.skipped, ["b"]);
    assert!(tree.incomplete && !tree.depth_limit_reached && !tree.entry_limit_reached);
    // A directory removed mid-walk is skipped the same way.
    let removing = |root: &Dir, rel: &str| {
        if rel == "c" {
            fs::remove_dir_all(f.dir.join("c"))?;
        }
        root.open_dir(rel)
    };
    let tree =
        f.ws.tree_with("", TreeOptions::excluding(TreeLimits::default()), &removing)
            .expect("tree");
    assert_eq!(tree.skipped, ["c"]);
    // Only the starting directory is an error.
    assert!(matches!(
        f.ws.tree("a/1.txt", TreeLimits::default()),
        Err(FileError::NotADirectory { .. })
    ));
    assert!(matches!(
        f.ws.tree("nope", TreeLimits::default()),
        Err(FileError::NotFound { .. })
    ));
}

#[test]
fn tree_does_not_descend_into_symlinks() {
    let f = fixture();
    f.file("real/r.txt", b"");
    f.link("alias", "real");
    f.link("out", f.base.join("outside"));
    let tree = f.ws.tree("", TreeLimits::default()).expect("tree");
    assert_eq!(names(&tree.entries), ["alias", "out", "real", "real/r.txt"]);
    assert!(!tree.incomplete);
    let json = serde_json::to_value(&tree).expect("json");
    assert_eq!(json["entries"][0]["kind"], "symlink");
    assert_eq!(json["incomplete"], false);
}

/// The walk of a stored workspace ([`TreeOptions::archive`], the wire protocol's `tree`): links
/// left out, each folder's directories first, nothing excluded, any directory at the depth limit
/// and any listing cut at its budget making the walk incomplete, and only the starting directory
/// an error.
#[test]
fn archive_tree_keeps_the_archive_rules() {
    let f = fixture();
    f.file("b.txt", b"");
    f.file("a/1.txt", b"");
    f.file("node_modules/x.js", b"");
    f.link("alias", "a");
    fs::create_dir_all(f.dir.join("only/empty")).expect("mkdir");
    f.own("only/empty");
    let archive = |max_depth, max_entries| {
        TreeOptions::archive(TreeLimits {
            max_depth,
            max_entries,
        })
    };
    let tree = f.ws.tree_as("", archive(6, 100)).expect("tree");
    assert_eq!(
        names(&tree.entries),
        [
            "a",
            "node_modules",
            "only",
            "b.txt",
            "a/1.txt",
            "node_modules/x.js",
            "only/empty"
        ]
    );
    assert!(!tree.incomplete);
    // An empty directory at the depth limit is cut off too (not so for `/v1`'s tree).
    let tree = f.ws.tree_as("only", archive(1, 100)).expect("tree");
    assert_eq!(names(&tree.entries), ["only/empty"]);
    assert!(tree.incomplete && tree.depth_limit_reached);
    let tree = f.ws.tree(
        "only",
        TreeLimits {
            max_depth: 1,
            max_entries: 100,
        },
    );
    assert!(!tree.expect("tree").incomplete);
    // A listing cut at its budget is incomplete even when the links it read are left out.
    f.file("links/f.txt", b"");
    for i in 0..3 {
        f.link(&format!("links/l{i}"), "../a");
    }
    let tree = f.ws.tree_as("links", archive(6, 2)).expect("tree");
    assert!(tree.incomplete && !tree.entry_limit_reached);
    let listed = f.ws.list_as("links", 10, ListRules::ARCHIVE).expect("list");
    assert_eq!(
        (names(&listed.entries), listed.truncated),
        (vec!["links/f.txt"], false)
    );
    // Below the start, an unreadable directory is left out; the start itself is an error.
    let tree =
        f.ws.tree_with("", archive(6, 100), &unreadable("a"))
            .expect("tree");
    assert_eq!(tree.skipped, ["a"]);
    assert!(tree.incomplete);
    assert!(matches!(
        f.ws.tree_as("nope", archive(6, 100)),
        Err(FileError::NotFound { .. })
    ));
}

#[test]
fn missing_workspace_is_session_lost() {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = temp.path().join("s2").join("workspace");
    let ws = Workspace::new(&dir, UID, GID);
    assert!(!ws.exists());
    let e = ws.read("x", 0, None, 10).expect_err("lost");
    assert!(matches!(e, FileError::WorkspaceMissing));
    assert!(matches!(
        ws.write("x", b"x"),
        Err(FileError::WorkspaceMissing)
    ));
    assert!(matches!(
        ws.list("", MAX_LIST_ENTRIES).map(|l| l.entries),
        Err(FileError::WorkspaceMissing)
    ));
    ws.prepare().expect("prepare");
    assert!(ws.exists());
    let meta = fs::metadata(&dir).expect("meta");
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (UID, GID, 0o755)
    );
    ws.prepare().expect("prepare again");
    assert_eq!(ws.dir(), dir);
}

#[test]
fn links_are_resolved_as_the_container_sees_them() {
    let f = fixture();
    f.file("notes/a.txt", b"a");
    f.link("abs", "/workspace/notes/a.txt");
    f.link("absdir", "/workspace/notes");
    f.link("latest", "/workspace/build/v3");
    f.link("out", "/etc/passwd");
    f.link("around", "/workspace/../etc");
    // Read, stat, realpath and list through a link whose target is the container's path.
    assert_eq!(f.ws.read("abs", 0, None, 100).expect("read").data, b"a");
    assert_eq!(
        f.ws.read("/workspace/absdir/a.txt", 0, None, 100)
            .expect("read")
            .data,
        b"a"
    );
    let e = f.ws.stat_followed("abs").expect("stat");
    assert_eq!(
        (e.kind, e.size, e.path.as_str()),
        (EntryKind::File, 1, "abs")
    );
    assert_eq!(f.ws.stat("abs").expect("lstat").kind, EntryKind::Symlink);
    assert_eq!(f.ws.realpath("abs").expect("realpath"), "notes/a.txt");
    assert_eq!(f.ws.realpath("absdir/../new").expect("realpath"), "new");
    assert_eq!(
        names(&f.ws.list("absdir", MAX_LIST_ENTRIES).expect("list").entries),
        ["absdir/a.txt"]
    );
    // A write goes through the link to its target, which stays a link.
    f.ws.write("abs", b"new").expect("write through");
    assert_eq!(fs::read(f.dir.join("notes/a.txt")).expect("read"), b"new");
    assert!(
        fs::symlink_metadata(f.dir.join("abs"))
            .expect("meta")
            .file_type()
            .is_symlink()
    );
    // Through a dangling one, its target is made, owned by the sandbox user.
    f.ws.write("latest/out.txt", b"v3")
        .expect_err("missing dir behind a link on the way");
    f.ws.mkdir("build/v3").expect("mkdir");
    f.ws.write("latest/out.txt", b"v3").expect("write");
    let meta = fs::metadata(f.dir.join("build/v3/out.txt")).expect("meta");
    assert_eq!((meta.uid(), meta.gid()), (UID, GID));
    // Links that lead out are still refused, whatever the spelling.
    for path in ["out", "around", "around/passwd"] {
        for e in [
            f.ws.read(path, 0, None, 100).map(drop),
            f.ws.write(path, b"pwned").map(drop),
            f.ws.stat_followed(path).map(drop),
            f.ws.realpath(path).map(drop),
        ] {
            assert!(
                matches!(e, Err(FileError::OutsideWorkspace { .. })),
                "{path}: {e:?}"
            );
        }
    }
    f.sentinels_intact();
}

#[test]
fn a_symlink_loop_is_an_entry_of_its_own() {
    let f = fixture();
    f.file("d/a.txt", b"a");
    f.link("d/loop1", "loop2");
    f.link("d/loop2", "/workspace/d/loop1");
    let listed: Vec<_> =
        f.ws.list("d", MAX_LIST_ENTRIES)
            .expect("list")
            .entries
            .into_iter()
            .map(|e| (e.name, e.kind))
            .collect();
    assert_eq!(
        listed,
        [
            ("a.txt".to_owned(), EntryKind::File),
            ("loop1".to_owned(), EntryKind::Symlink),
            ("loop2".to_owned(), EntryKind::Symlink),
        ]
    );
    assert_eq!(
        f.ws.list_all("d", MAX_LIST_ENTRIES)
            .expect("list_all")
            .entries
            .len(),
        3
    );
    let tree = f.ws.tree("", TreeLimits::default()).expect("tree");
    assert_eq!(tree.entries.len(), 4);
    let e = f.ws.read("d/loop1", 0, None, 100).expect_err("a loop");
    assert!(
        e.to_string().contains("too many levels of symbolic links"),
        "{e}"
    );
}

#[test]
fn permissions_are_the_sandbox_users() {
    let f = fixture();
    let chmod = |rel: &str, mode: u32| {
        fs::set_permissions(f.dir.join(rel), fs::Permissions::from_mode(mode)).expect("chmod");
    };
    // A file the agent made unreadable.
    f.file("locked.txt", b"secret");
    chmod("locked.txt", 0o000);
    let e =
        f.ws.read("locked.txt", 0, None, 100)
            .expect_err("unreadable");
    assert!(matches!(e, FileError::PermissionDenied { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "'locked.txt': permission denied for the sandbox user"
    );
    assert!(matches!(
        f.ws.write("locked.txt", b"x"),
        Err(FileError::PermissionDenied { .. })
    ));
    chmod("locked.txt", 0o600);
    assert_eq!(fs::read(f.dir.join("locked.txt")).expect("kept"), b"secret");
    // A read-only directory: nothing made, replaced or removed in it.
    f.file("ro/in.txt", b"in");
    chmod("ro", 0o555);
    for e in [
        f.ws.write("ro/new.txt", b"x").map(drop),
        f.ws.write("ro/in.txt", b"x").map(drop),
        f.ws.mkdir("ro/sub"),
        f.ws.remove("ro/in.txt", false).map(drop),
    ] {
        assert!(
            matches!(e, Err(FileError::PermissionDenied { .. })),
            "{e:?}"
        );
    }
    assert_eq!(fs::read(f.dir.join("ro/in.txt")).expect("kept"), b"in");
    // Searchable, not listable: read through it, not list it.
    f.file("xonly/f.txt", b"f");
    chmod("xonly", 0o111);
    assert_eq!(
        f.ws.read("xonly/f.txt", 0, None, 100).expect("read").data,
        b"f"
    );
    assert!(matches!(
        f.ws.list("xonly", MAX_LIST_ENTRIES),
        Err(FileError::PermissionDenied { .. })
    ));
    // A file of root's (not the agent's), private to root.
    fs::write(f.dir.join("roots.txt"), b"root").expect("write");
    chmod("roots.txt", 0o600);
    assert!(matches!(
        f.ws.read("roots.txt", 0, None, 100),
        Err(FileError::PermissionDenied { .. })
    ));
    // What the sandbox user may do still works, and makes the user's files.
    f.ws.write("mine/ok.txt", b"ok").expect("write");
    let meta = fs::metadata(f.dir.join("mine/ok.txt")).expect("meta");
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o777),
        (UID, GID, 0o644)
    );
    chmod("ro", 0o755);
    chmod("xonly", 0o755);
}

#[test]
fn a_link_swapped_while_it_is_followed_never_leads_out() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let f = fixture();
    f.file("in/sentinel", b"inside");
    f.file("real/sentinel", b"inside");
    // `d` is a real folder before the swapper starts (moving it there while the swapper
    // already plays with `d` would meet its link).
    fs::rename(f.dir.join("real"), f.dir.join("d")).expect("d");
    // The agent swaps `sw` between a link inside and links out, and the directory `d`
    // between a real folder and a link out, as fast as it can.
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (dir, base, stop) = (f.dir.clone(), f.base.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let targets = [
                PathBuf::from("in"),
                PathBuf::from("/workspace/in"),
                base.join("outside"),
                PathBuf::from("../../../outside"),
                PathBuf::from("/workspace/../../outside"),
            ];
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let tmp = dir.join("sw.tmp");
                let _ = fs::remove_file(&tmp);
                if symlink(&targets[i % targets.len()], &tmp).is_ok() {
                    let _ = fs::rename(&tmp, dir.join("sw"));
                }
                // `d`: a real folder one moment, a link out the next.
                let _ = fs::rename(dir.join("d"), dir.join("d.real"));
                let _ = symlink(base.join("outside"), dir.join("d"));
                let _ = fs::remove_file(dir.join("d"));
                let _ = fs::rename(dir.join("d.real"), dir.join("d"));
                i += 1;
            }
        })
    };
    let mut inside_reads = 0;
    for i in 0..300 {
        for path in ["sw/sentinel", "d/sentinel"] {
            if let Ok(read) = f.ws.read(path, 0, None, 1 << 20) {
                assert_eq!(read.data, b"inside", "{path} read from outside");
                inside_reads += 1;
            }
            let _ = f.ws.write(&format!("{path}.{i}"), b"pwned");
            let _ = f.ws.mkdir(&format!("{path}.dir"));
            let _ =
                f.ws.remove("sw/sentinel", false)
                    .map(|_| f.file("in/sentinel", b"inside"));
            if let Ok(listed) =
                f.ws.list(path.trim_end_matches("/sentinel"), MAX_LIST_ENTRIES)
            {
                assert!(
                    listed
                        .entries
                        .iter()
                        .all(|e| e.name.starts_with("sentinel")),
                    "{listed:?}"
                );
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().expect("swapper");
    assert!(inside_reads > 0, "the race never let a read through");
    f.sentinels_intact();
}
