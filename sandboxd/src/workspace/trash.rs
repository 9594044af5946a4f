//! Folders on their way out: a destroyed session's folder, a failed open's folder, a tree
//! removed through the files API.
//!
//! Each is first moved aside, renamed into `{workspace root}/.trash/` (one `rename(2)` on the
//! same filesystem), so the request that removes it answers at once and the sandbox can no
//! longer reach it. A background sweeper then deletes what is in the trash: at once, and again
//! after every restart of sandboxd (what a crash left in the trash is deleted at the next start,
//! in the background, without holding up the start).
//!
//! The agent in a sandbox owns everything in its workspace and may leave a tree 60,000 folders
//! deep, or millions wide. Deleting is therefore iterative with a bounded number of descriptors
//! (four at most), whatever the depth or width: the tree is flattened instead of descended.
//! For the top folder `T`, each subfolder `c` of `T` is opened, its files, links and other
//! entries are unlinked, its own subfolders are renamed up into `T` (under fresh names), and `c`,
//! now empty, is removed; then `T` is read again, until it is empty. No recursion, no folder
//! deeper than one level below `T` is ever open, and `..` is never used.
//!
//! Nothing is ever followed: every folder is opened with `O_NOFOLLOW|O_DIRECTORY` relative to a
//! handle sandboxd already holds, and a symlink (or a FIFO, a socket, a device) is unlinked as
//! itself.
//!
//! Over 600 lines with its tests: the bounded, iterative delete is one algorithm, kept whole.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustix::fs::{AtFlags, Dir as Listing, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;
use tokio::sync::Notify;
use tracing::{info, warn};

/// The trash folder's name in the workspace root. Session ids start with a letter or digit, so
/// no session can be named so.
pub const TRASH_FOLDER: &str = ".trash";

/// How many passes over a folder in a row may change nothing before emptying it fails.
const IDLE_PASSES: usize = 3;

/// How long the sweeper waits before it tries again after a failure.
const RETRY_AFTER: Duration = Duration::from_secs(60);

/// The trash of one workspace root. Clones share one sweeper.
#[derive(Debug, Clone)]
pub struct Trash {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    wake: Notify,
    stopping: AtomicBool,
}

impl PartialEq for Trash {
    fn eq(&self, other: &Self) -> bool {
        self.inner.dir == other.inner.dir
    }
}

impl Eq for Trash {}

/// What one sweep of the trash did.
#[derive(Debug, Default)]
pub struct Swept {
    /// Entries deleted.
    pub removed: usize,
    /// Entries that could not be deleted (they stay for the next sweep), with why.
    pub failed: Vec<(String, io::Error)>,
}

impl Trash {
    /// The trash of `workspace_root` (`{workspace_root}/.trash`, made when first needed).
    pub fn new(workspace_root: &Path) -> Self {
        Self {
            inner: Arc::new(Inner {
                dir: workspace_root.join(TRASH_FOLDER),
                wake: Notify::new(),
                stopping: AtomicBool::new(false),
            }),
        }
    }

    /// The trash folder.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Moves the file or folder at `path` into the trash, under a name that starts with
    /// `label`, and wakes the sweeper. Returns false when nothing was at `path`. `path`'s parent
    /// is sandboxd's own (the workspace root), so it may be given by path.
    pub fn discard(&self, path: &Path, label: &str) -> io::Result<bool> {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} has no parent folder to move it out of", path.display()),
            ));
        };
        let parent = rustix::fs::open(
            parent,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        self.discard_at(parent.as_fd(), name, label)
    }

    /// Moves the entry `name` of the folder `parent` (a handle, so the move cannot be
    /// redirected by a symlink on the way) into the trash, under a name that starts with
    /// `label`, and wakes the sweeper. Returns false when nothing was at `name`. When the trash
    /// is on another filesystem, the entry is deleted right here instead (bounded all the same).
    pub fn discard_at(
        &self,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        label: &str,
    ) -> io::Result<bool> {
        let trash = self.open_or_make()?;
        let aside = format!("{label}-{:016x}", rand::random::<u64>());
        let moved = match rustix::fs::renameat_with(
            parent,
            name,
            trash.as_fd(),
            aside.as_str(),
            RenameFlags::NOREPLACE,
        ) {
            // A filesystem without RENAME_NOREPLACE: the random name is as good.
            Err(Errno::INVAL) => rustix::fs::renameat(parent, name, trash.as_fd(), aside.as_str()),
            other => other,
        };
        match moved {
            Ok(()) => {
                self.inner.wake.notify_one();
                Ok(true)
            }
            Err(Errno::NOENT) => Ok(false),
            Err(Errno::XDEV) => {
                warn!(
                    trash = %self.dir().display(),
                    "the trash is on another filesystem than the folder removed; deleting it in place"
                );
                remove_tree(parent, name, &|| false)?;
                Ok(true)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Opens the trash folder, making it (mode 0700) when it is not there yet.
    fn open_or_make(&self) -> io::Result<OwnedFd> {
        match open_trash(self.dir()) {
            Err(Errno::NOENT) => match rustix::fs::mkdir(self.dir(), Mode::RWXU) {
                Ok(()) | Err(Errno::EXIST) => Ok(open_trash(self.dir())?),
                Err(e) => Err(e.into()),
            },
            opened => Ok(opened?),
        }
    }

    /// Deletes everything in the trash, entry by entry; an entry that cannot be deleted is
    /// reported and stays for the next sweep. Blocking.
    pub fn sweep(&self) -> Swept {
        let mut swept = Swept::default();
        let trash = match open_trash(self.dir()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return swept,
            Err(e) => {
                swept
                    .failed
                    .push((self.dir().display().to_string(), e.into()));
                return swept;
            }
        };
        let names = match list_names(trash.as_fd()) {
            Ok(names) => names,
            Err(e) => {
                swept.failed.push((self.dir().display().to_string(), e));
                return swept;
            }
        };
        let stopping = || self.inner.stopping.load(Ordering::Relaxed);
        for name in names {
            if stopping() {
                break;
            }
            let shown = name.to_string_lossy().into_owned();
            match remove_tree(trash.as_fd(), &name, &stopping) {
                Ok(()) => {
                    info!(entry = %shown, "trash entry deleted");
                    swept.removed += 1;
                }
                // Left as it is for the next start.
                Err(_) if stopping() => break,
                Err(e) => swept.failed.push((shown, e)),
            }
        }
        swept
    }

    /// Stops the sweeper (sandboxd is stopping): a deletion under way stops within one
    /// entry, and what is left stays in the trash for the next start.
    pub fn stop(&self) {
        self.inner.stopping.store(true, Ordering::Relaxed);
        self.inner.wake.notify_one();
    }

    /// Starts the sweeper on the current Tokio runtime: it empties the trash now (what an
    /// earlier run left there), then whenever something is discarded; after a failure it tries
    /// again a minute later. Deleting runs on a blocking thread.
    pub fn spawn_sweeper(&self) {
        let trash = self.clone();
        tokio::spawn(async move {
            while !trash.inner.stopping.load(Ordering::Relaxed) {
                let sweeping = trash.clone();
                let failed = match tokio::task::spawn_blocking(move || sweeping.sweep()).await {
                    Ok(swept) => {
                        for (entry, e) in &swept.failed {
                            warn!(
                                trash = %trash.dir().display(),
                                entry = %entry,
                                error = %e,
                                "could not delete a trash entry; trying again later"
                            );
                        }
                        !swept.failed.is_empty()
                    }
                    Err(e) => {
                        warn!(error = %e, "the trash sweep failed; trying again later");
                        true
                    }
                };
                if failed {
                    tokio::select! {
                        () = trash.inner.wake.notified() => {}
                        () = tokio::time::sleep(RETRY_AFTER) => {}
                    }
                } else {
                    trash.inner.wake.notified().await;
                }
            }
        });
    }
}

fn open_trash(dir: &Path) -> rustix::io::Result<OwnedFd> {
    rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Opens the folder `name` of `parent` without following a symlink and without blocking on
/// a FIFO (`O_NOFOLLOW|O_DIRECTORY|O_NONBLOCK`).
pub fn open_dir_nofollow(parent: BorrowedFd<'_>, name: &OsStr) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// The names in the folder `dir` (without `.` and `..`).
fn list_names(dir: BorrowedFd<'_>) -> io::Result<Vec<std::ffi::OsString>> {
    let mut names = Vec::new();
    let mut listing = Listing::read_from(dir)?;
    while let Some(entry) = listing.read() {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name != "." && name != ".." {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// Deletes the entry `name` of the folder `parent`: a folder with everything in it (iterative,
/// at most four descriptors, symlinks inside unlinked, never followed), or a file, symlink or
/// other entry itself. Nothing at `name` is fine.
pub fn remove_tree_at(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    remove_tree(parent, name, &|| false)
}

/// [`remove_tree_at`], giving up (`ErrorKind::Interrupted`) as soon as `stopping` says so.
fn remove_tree(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    stopping: &dyn Fn() -> bool,
) -> io::Result<()> {
    // A folder refilled between its last pass and its removal (a sandbox writing into the
    // folder its remove works on) is emptied again, until the operation's deadline.
    let mut refilled = 0;
    loop {
        let top = match open_dir_nofollow(parent, name) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(()),
            // Not a folder (a symlink gives ELOOP under O_NOFOLLOW): the entry itself goes.
            Err(Errno::NOTDIR | Errno::LOOP) => return unlink_leaf(parent, name, stopping),
            Err(e) => return Err(e.into()),
        };
        empty_folder(top.as_fd(), stopping)?;
        drop(top);
        match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => return Ok(()),
            Err(Errno::NOTEMPTY | Errno::EXIST) if refilled < MAX_REFILLS => {
                refilled += 1;
                super::deadline::check()?;
            }
            Err(Errno::NOTEMPTY | Errno::EXIST) => {
                return Err(io::Error::other(
                    "the folder kept being refilled while it was removed: stop what writes into it and remove it again",
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Times a folder found refilled at its removal is emptied again.
const MAX_REFILLS: usize = 10_000;

fn stopped() -> io::Error {
    io::Error::new(
        io::ErrorKind::Interrupted,
        "sandboxd is stopping; the rest is deleted at its next start",
    )
}

/// Unlinks a non-folder entry; one that turned into a folder meanwhile is deleted as one.
fn unlink_leaf(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    stopping: &dyn Fn() -> bool,
) -> io::Result<()> {
    match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(Errno::ISDIR) => remove_tree(parent, name, stopping),
        Err(e) => Err(e.into()),
    }
}

/// Empties the folder `top` by flattening: see the module documentation.
fn empty_folder(top: BorrowedFd<'_>, stopping: &dyn Fn() -> bool) -> io::Result<()> {
    let mut fresh: u64 = 0;
    let mut idle_passes = 0;
    loop {
        let mut progress = false;
        let mut seen = false;
        let mut listing = Listing::read_from(top)?;
        while let Some(entry) = listing.read() {
            let entry = entry?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            if stopping() {
                return Err(stopped());
            }
            // A remove in a request (in place, on a workspace disk) ends at its deadline even
            // when the sandbox keeps refilling the folder.
            super::deadline::check()?;
            seen = true;
            let done = if entry.file_type() == FileType::Directory {
                drain_subfolder(top, name, &mut fresh, stopping)?
            } else {
                match rustix::fs::unlinkat(top, name, AtFlags::empty()) {
                    Ok(()) => true,
                    Err(Errno::NOENT) => false,
                    Err(Errno::ISDIR) => drain_subfolder(top, name, &mut fresh, stopping)?,
                    Err(e) => return Err(e.into()),
                }
            };
            progress |= done;
        }
        if !seen {
            return Ok(());
        }
        // A pass in which every entry vanished before it could be removed changed nothing;
        // a few in a row mean something keeps refilling the folder.
        idle_passes = if progress { 0 } else { idle_passes + 1 };
        if idle_passes >= IDLE_PASSES {
            return Err(io::Error::other(
                "a folder in it could not be emptied (its entries kept coming back)",
            ));
        }
    }
}

/// Empties the subfolder `name` of `top` one level deep (its subfolders move up into `top`)
/// and removes it. Returns whether anything changed.
fn drain_subfolder(
    top: BorrowedFd<'_>,
    name: &OsStr,
    fresh: &mut u64,
    stopping: &dyn Fn() -> bool,
) -> io::Result<bool> {
    let folder = match open_dir_nofollow(top, name) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(false),
        Err(Errno::NOTDIR | Errno::LOOP) => {
            return match rustix::fs::unlinkat(top, name, AtFlags::empty()) {
                Ok(()) => Ok(true),
                Err(Errno::NOENT) => Ok(false),
                Err(e) => Err(e.into()),
            };
        }
        Err(e) => return Err(e.into()),
    };
    let mut progress = false;
    let mut listing = Listing::new(folder)?;
    while let Some(entry) = listing.read() {
        let entry = entry?;
        let inner = OsStr::from_bytes(entry.file_name().to_bytes());
        if inner == "." || inner == ".." {
            continue;
        }
        if stopping() {
            return Err(stopped());
        }
        super::deadline::check()?;
        let here = listing.fd()?;
        let moved = if entry.file_type() == FileType::Directory {
            move_up(here, inner, top, fresh)?
        } else {
            match rustix::fs::unlinkat(here, inner, AtFlags::empty()) {
                Ok(()) => true,
                Err(Errno::NOENT) => false,
                Err(Errno::ISDIR) => move_up(here, inner, top, fresh)?,
                Err(e) => return Err(e.into()),
            }
        };
        progress |= moved;
    }
    drop(listing);
    match rustix::fs::unlinkat(top, name, AtFlags::REMOVEDIR) {
        Ok(()) => Ok(true),
        Err(Errno::NOENT) => Ok(progress),
        // Something came into it meanwhile: the next pass over `top` drains it again.
        Err(Errno::NOTEMPTY | Errno::EXIST) => Ok(progress),
        Err(e) => Err(e.into()),
    }
}

/// Renames the folder `name` of `from` into `top` under a fresh name (`.rm-<n>`), never
/// replacing anything there.
fn move_up(
    from: BorrowedFd<'_>,
    name: &OsStr,
    top: BorrowedFd<'_>,
    fresh: &mut u64,
) -> io::Result<bool> {
    loop {
        *fresh += 1;
        let to = format!(".rm-{fresh}");
        match rustix::fs::renameat_with(from, name, top, to.as_str(), RenameFlags::NOREPLACE) {
            Ok(()) => return Ok(true),
            Err(Errno::EXIST) => continue,
            Err(Errno::NOENT) => return Ok(false),
            // A filesystem without RENAME_NOREPLACE: a plain rename, which fails rather than
            // replace a folder that has entries (an empty one it may replace: it is going).
            Err(Errno::INVAL) => match rustix::fs::renameat(from, name, top, to.as_str()) {
                Ok(()) => return Ok(true),
                Err(Errno::EXIST | Errno::NOTEMPTY | Errno::NOTDIR | Errno::ISDIR) => continue,
                Err(Errno::NOENT) => return Ok(false),
                Err(e) => return Err(e.into()),
            },
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    const OPEN_DIR: OFlags = OFlags::RDONLY
        .union(OFlags::DIRECTORY)
        .union(OFlags::NOFOLLOW)
        .union(OFlags::CLOEXEC);

    /// Makes `base/top/d/d/…` `depth` folders deep, one descriptor at a time (a path that deep
    /// is far beyond PATH_MAX), with a file every 500 levels and, at the bottom, `bottom(fd)`.
    fn deep_chain(base: &Path, top: &str, depth: usize, bottom: impl FnOnce(BorrowedFd<'_>)) {
        let base = rustix::fs::open(base, OPEN_DIR, Mode::empty()).expect("open base");
        rustix::fs::mkdirat(&base, top, Mode::RWXU).expect("mkdir top");
        let mut dir = rustix::fs::openat(&base, top, OPEN_DIR, Mode::empty()).expect("open top");
        for level in 0..depth {
            if level % 500 == 0 {
                rustix::fs::openat(
                    &dir,
                    "f",
                    OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC,
                    Mode::RUSR | Mode::WUSR,
                )
                .expect("a file");
            }
            rustix::fs::mkdirat(&dir, "d", Mode::RWXU).expect("mkdir");
            dir = rustix::fs::openat(&dir, "d", OPEN_DIR, Mode::empty()).expect("open");
        }
        bottom(dir.as_fd());
    }

    fn open(path: &Path) -> OwnedFd {
        rustix::fs::open(path, OPEN_DIR, Mode::empty()).expect("open")
    }

    /// An outside folder with a sentinel, for symlinks to point at.
    fn outside(base: &Path) -> PathBuf {
        let out = base.join("outside");
        std::fs::create_dir(&out).expect("outside");
        std::fs::create_dir(out.join("sub")).expect("outside/sub");
        std::fs::write(out.join("sub/keep"), b"keep").expect("sentinel");
        out
    }

    fn sentinel_intact(out: &Path) {
        assert_eq!(
            std::fs::read(out.join("sub/keep")).expect("the sentinel is still there"),
            b"keep"
        );
    }

    #[test]
    fn a_deep_tree_goes_on_a_small_stack() {
        let base = tempfile::tempdir().expect("tempdir");
        deep_chain(base.path(), "deep", 10_000, |_| {});
        let root = open(base.path());
        // 64 KiB of stack: a remover that recursed once per level would overflow it long
        // before 10,000 levels.
        let removed = std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || remove_tree_at(root.as_fd(), OsStr::new("deep")))
            .expect("a thread")
            .join()
            .expect("no overflow");
        removed.expect("removed");
        assert!(!base.path().join("deep").exists());
    }

    #[test]
    fn symlinks_inside_are_removed_never_followed() {
        let base = tempfile::tempdir().expect("tempdir");
        let out = outside(base.path());
        let tree = base.path().join("tree");
        std::fs::create_dir_all(tree.join("a/b/c")).expect("tree");
        symlink(&out, tree.join("abs")).expect("link");
        symlink(out.join("sub"), tree.join("a/abs-sub")).expect("link");
        symlink("../../../outside", tree.join("a/b/rel")).expect("link");
        symlink("../../../outside/sub", tree.join("a/b/c/rel-sub")).expect("link");
        symlink("loop", tree.join("a/loop")).expect("link");
        symlink("b", tree.join("a/inside")).expect("link");
        std::fs::write(tree.join("a/b/c/file"), b"x").expect("file");
        rustix::fs::mkfifoat(open(&tree.join("a/b")), "fifo", Mode::RUSR | Mode::WUSR)
            .expect("fifo");
        // The top itself a symlink: the link goes, not what it points at.
        symlink(&out, base.path().join("top-link")).expect("link");
        let root = open(base.path());
        remove_tree_at(root.as_fd(), OsStr::new("top-link")).expect("link removed");
        remove_tree_at(root.as_fd(), OsStr::new("tree")).expect("tree removed");
        assert!(!tree.exists());
        assert!(std::fs::symlink_metadata(base.path().join("top-link")).is_err());
        sentinel_intact(&out);
        // Nothing at the name is fine.
        remove_tree_at(root.as_fd(), OsStr::new("tree")).expect("nothing to remove");
    }

    #[test]
    fn a_wide_and_deep_tree_with_links_at_the_bottom() {
        let base = tempfile::tempdir().expect("tempdir");
        let out = outside(base.path());
        let out_for_links = out.clone();
        deep_chain(base.path(), "mixed", 1_000, |bottom| {
            for i in 0..200 {
                rustix::fs::mkdirat(bottom, format!("w{i}"), Mode::RWXU).expect("mkdir");
            }
            rustix::fs::symlinkat(&out_for_links, bottom, "escape").expect("link");
        });
        let root = open(base.path());
        remove_tree_at(root.as_fd(), OsStr::new("mixed")).expect("removed");
        assert!(!base.path().join("mixed").exists());
        sentinel_intact(&out);
    }

    #[test]
    fn discard_moves_aside_and_the_sweep_deletes() {
        let root = tempfile::tempdir().expect("tempdir");
        let trash = Trash::new(root.path());
        assert!(
            !trash
                .discard(&root.path().join("absent"), "absent")
                .expect("discard")
        );
        deep_chain(root.path(), "s-1", 1_000, |_| {});
        assert!(
            trash
                .discard(&root.path().join("s-1"), "s-1")
                .expect("discard")
        );
        assert!(!root.path().join("s-1").exists());
        let aside: Vec<_> = std::fs::read_dir(trash.dir())
            .expect("the trash")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert!(aside[0].starts_with("s-1-"), "{aside:?}");
        let swept = trash.sweep();
        assert_eq!(swept.removed, 1);
        assert!(swept.failed.is_empty(), "{:?}", swept.failed);
        assert_eq!(
            std::fs::read_dir(trash.dir()).expect("the trash").count(),
            0
        );
    }

    #[test]
    fn a_half_deleted_entry_is_finished_by_the_next_sweep() {
        // What a sandboxd killed mid-deletion leaves: a flattened top with `.rm-<n>` folders
        // and the rest of the chain below them.
        let root = tempfile::tempdir().expect("tempdir");
        let trash = Trash::new(root.path());
        std::fs::create_dir(root.path().join(TRASH_FOLDER)).expect("trash");
        let entry = trash.dir().join("s-2-0123456789abcdef");
        std::fs::create_dir(&entry).expect("entry");
        deep_chain(&entry, ".rm-1", 1_000, |_| {});
        deep_chain(&entry, ".rm-7", 1_000, |_| {});
        std::fs::write(entry.join(".rm-2"), b"a file where a fresh name would go").expect("file");
        let swept = trash.sweep();
        assert_eq!(
            (swept.removed, swept.failed.len()),
            (1, 0),
            "{:?}",
            swept.failed
        );
        assert!(!entry.exists());
    }
}
