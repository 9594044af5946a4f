//! File watch: a folder of the sandbox watched with inotify, its changes sent to sandboxd as
//! they come ([`Msg::Watch`], see [`crate::proto`]). One thread per watch, the connection's
//! own: it polls the inotify descriptor and the connection, gathers what the kernel reports
//! into a [`Batch`] for [`WINDOW`] after the first change, and sends it as [`Msg::FsEvents`]
//! frames; it ends when the peer closes the connection (a quiesce shuts it too), a write fails
//! or the watched folder itself goes. Closing the inotify descriptor removes every watch.
//!
//! What the kernel gives, and what is sent:
//!
//! - `IN_CREATE` → `created`. With `recursive`, a folder made later is watched at once and
//!   walked: what is already in it (made before its watch could see it) is reported `created`
//!   too. A path `created` twice in a batch (the walk and the kernel both saw it) is sent once.
//! - `IN_MODIFY` and `IN_CLOSE_WRITE` → `modified`, for files. A path already `created` or
//!   `modified` in the batch is not reported again, so a file written many times in a batch is
//!   one `modified`, and a file made and written in one is just `created`. A change to
//!   attributes alone (`touch` of an existing file, `chmod`) is not reported.
//! - `IN_DELETE` → `deleted`.
//! - `IN_MOVED_FROM` then `IN_MOVED_TO` of one cookie → one `renamed` (`path` where it was,
//!   `to` where it went), at the place of the first. A `MOVED_FROM` with no `MOVED_TO` in its
//!   batch left the tree: `deleted` (and the watches of a folder moved out are removed); a
//!   `MOVED_TO` with no `MOVED_FROM` came from outside: `created` (a folder moved in is watched
//!   and walked like a new one).
//! - `IN_DELETE_SELF` / `IN_MOVE_SELF` / `IN_UNMOUNT` of the watched folder itself → `deleted`
//!   with the path `""`, the last event: the watch ends and the connection closes.
//! - `IN_Q_OVERFLOW` (the kernel's queue was full and dropped events) → `overflow`: the agent
//!   starts afresh (a new inotify instance, the tree walked again, nothing reported for the
//!   walk) so that its watches match the tree again; sandboxd should rescan.
//! - A folder that cannot be watched because `max_watches` are (or the kernel's own limit,
//!   `ENOSPC`) → `limit` with that folder's path, once per watch; what is watched stays so (a
//!   folder made later beyond the bound is reported `created`, what happens in it is not).
//!
//! Refused with `bad_request`: a path that is not absolute, not a folder or not there, a
//! `max_watches` of 0, or a folder the kernel will not watch (its limits, permissions).
//! Symbolic links are never followed (`IN_DONT_FOLLOW`, and the walk takes them for files),
//! the watched folder included: a link to a folder is not a folder. Paths are relative
//! to the watched folder (`a/b.txt`), lossy UTF-8. Memory is bounded: at most [`MAX_PENDING`]
//! events wait for a batch (more, and the batch becomes one `overflow`), the walk's queue holds
//! only watched folders, and one read of the kernel's queue takes at most [`MAX_DRAIN`] events.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;

use crate::pause::Tracked;
use crate::proto::{self, FrameError, FsEvent, Msg};
use crate::server::error;

/// How long changes are gathered after the first one before they are sent.
const WINDOW: Duration = Duration::from_millis(10);
/// The most events in one [`Msg::FsEvents`] frame.
const MAX_PER_FRAME: usize = 1000;
/// The most JSON bytes of paths in one frame, well under [`proto::MAX_FRAME`]: a path may be
/// 4 KiB, and 1000 renames of two such paths, escaped, would not fit in one frame.
const FRAME_BUDGET: usize = 1 << 20;
/// The most events waiting to be sent; beyond, the batch is dropped for one `overflow`.
const MAX_PENDING: usize = 10_000;
/// The most kernel events taken in one drain, so that a tree changing without pause still
/// gets its batches sent.
const MAX_DRAIN: usize = 10_000;
/// The buffer for the kernel's events: many events a read (one takes 16 bytes and its name).
const READ_BUF: usize = 64 * 1024;

/// [`FsEvent::kind`] of something that appeared.
const CREATED: &str = "created";
/// [`FsEvent::kind`] of a file written.
const MODIFIED: &str = "modified";
/// [`FsEvent::kind`] of something removed or moved out of the tree.
const DELETED: &str = "deleted";
/// [`FsEvent::kind`] of a move inside the tree.
const RENAMED: &str = "renamed";
/// [`FsEvent::kind`] of a folder left unwatched (the bound was reached).
const LIMIT: &str = "limit";
/// [`FsEvent::kind`] of changes lost (the kernel's queue, or the batch, was full).
const OVERFLOW: &str = "overflow";

/// What a watch asks of the kernel for each folder: changes to its entries, its own end, no
/// symbolic link followed, and nothing but a folder. `IN_EXCL_UNLINK`: a file deleted while
/// still open (a temporary file) is not reported after its `deleted`.
fn mask() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::MODIFY
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::ONLYDIR
        | WatchFlags::DONT_FOLLOW
        | WatchFlags::EXCL_UNLINK
}

/// Serves a [`Msg::Watch`] on `conn`: refuses it with `bad_request`, or answers
/// [`Msg::Watching`] and sends changes until the peer closes the connection.
pub(crate) fn watch(
    path: &str,
    recursive: bool,
    max_watches: u32,
    mut conn: UnixStream,
    tracked: &Arc<Tracked>,
) -> Result<(), FrameError> {
    // The connection is the gate's while the watch lives: a quiesce shuts it, which ends this.
    let _held = Arc::clone(tracked);
    let mut watcher = match Watcher::new(path, recursive, max_watches) {
        Ok(w) => w,
        Err(message) => {
            proto::write_msg(&mut conn, &error("bad_request", message))?;
            return Ok(());
        }
    };
    let watched = u32::try_from(watcher.wds.len()).unwrap_or(u32::MAX);
    proto::write_msg(&mut conn, &Msg::Watching { watched })?;
    let result = watcher.serve(&conn);
    let _ = conn.shutdown(std::net::Shutdown::Both);
    // The watches go with the descriptor, when `watcher` drops.
    result.map_err(Into::into)
}

/// A move whose second half (`IN_MOVED_TO`) may still come in the batch.
#[derive(Debug)]
struct Move {
    /// Where it was, relative to the root.
    from: PathBuf,
    /// Whether it is a folder.
    dir: bool,
    /// Its placeholder (`deleted`) in the batch's events, unless the batch overflowed.
    at: Option<usize>,
}

/// Changes gathered for the next frames, coalesced (see the module docs). Knows nothing of
/// inotify: the watcher feeds it.
#[derive(Debug, Default)]
struct Batch {
    events: Vec<FsEvent>,
    /// The index in `events` of the newest event of each path.
    last: HashMap<String, usize>,
    /// Moves out of a place whose move into one has not come yet, by cookie.
    moves: HashMap<u32, Move>,
    /// The batch was dropped for an `overflow`: nothing more is kept until it is sent.
    overflowed: bool,
    /// When its first change came.
    first_at: Option<Instant>,
}

impl Batch {
    /// Notes that a change came (the window starts at the first).
    fn touch(&mut self) {
        self.first_at.get_or_insert_with(Instant::now);
    }

    /// Whether the batch should be sent now: its window is over, or it fills a frame.
    fn due(&self, now: Instant) -> bool {
        self.events.len() >= MAX_PER_FRAME || self.first_at.is_some_and(|t| now >= t + WINDOW)
    }

    /// How long until the batch is due; `None` while it is empty.
    fn wait(&self, now: Instant) -> Option<Duration> {
        self.first_at
            .map(|t| (t + WINDOW).saturating_duration_since(now))
    }

    /// Adds an event, unless an earlier one of the batch already says it: a `modified` after a
    /// `created` or `modified` of the same path, a `created` after a `created`.
    fn push(&mut self, kind: &'static str, path: String, dir: bool) {
        self.touch();
        if let Some(prev) = self.last.get(&path).map(|&i| self.events[i].kind.as_str())
            && ((kind == MODIFIED && (prev == CREATED || prev == MODIFIED))
                || (kind == CREATED && prev == CREATED))
        {
            return;
        }
        self.append(kind, path, dir);
    }

    /// Adds an event as it is; its index, unless the batch is (or now becomes) an overflow.
    fn append(&mut self, kind: &'static str, path: String, dir: bool) -> Option<usize> {
        if self.overflowed {
            return None;
        }
        if self.events.len() >= MAX_PENDING {
            self.overflow();
            return None;
        }
        let at = self.events.len();
        self.last.insert(path.clone(), at);
        self.events.push(FsEvent {
            kind: kind.to_owned(),
            path,
            to: None,
            dir,
        });
        Some(at)
    }

    /// Drops what the batch holds for one `overflow` (a `limit` is kept: it is said once).
    fn overflow(&mut self) {
        self.touch();
        self.events.retain(|e| e.kind == LIMIT);
        self.last.clear();
        for m in self.moves.values_mut() {
            m.at = None;
        }
        self.events.push(event(OVERFLOW, String::new(), false));
        self.overflowed = true;
    }

    /// The kernel lost events: one `overflow` in the batch, after what it already holds.
    fn lost(&mut self) {
        self.touch();
        if !self.overflowed && !self.events.iter().any(|e| e.kind == OVERFLOW) {
            self.events.push(event(OVERFLOW, String::new(), false));
        }
    }

    /// A folder left unwatched: said even in an overflowed batch (the watcher says it once).
    fn limit(&mut self, path: String) {
        self.touch();
        self.events.push(event(LIMIT, path, true));
    }

    /// Something moved away from `from` (`IN_MOVED_FROM`): `deleted` until its move into the
    /// tree comes. False when too many moves wait: it stays `deleted` for good, and the caller
    /// treats it as gone from the tree at once.
    fn moved_from(&mut self, cookie: u32, from: PathBuf, dir: bool) -> bool {
        self.touch();
        let at = self.append(DELETED, lossy(&from), dir);
        if self.moves.len() >= MAX_PENDING {
            return false;
        }
        self.moves.insert(cookie, Move { from, dir, at });
        true
    }

    /// Something moved to `to` (`IN_MOVED_TO`): the `renamed` of its move away, whose place it
    /// was (returned), or `created` when it came from outside the tree.
    fn moved_to(&mut self, cookie: u32, to: &Path, dir: bool) -> Option<PathBuf> {
        self.touch();
        let to = lossy(to);
        let Some(m) = self.moves.remove(&cookie) else {
            self.push(CREATED, to, dir);
            return None;
        };
        if let Some(i) = m.at
            && let Some(e) = self.events.get_mut(i)
        {
            e.kind = RENAMED.to_owned();
            e.to = Some(to.clone());
            self.last.insert(to, i);
        }
        Some(m.from)
    }

    /// Takes the batch: its events, oldest first, and the moves that never found their second
    /// half (they left the tree).
    fn take(&mut self) -> (Vec<FsEvent>, Vec<Move>) {
        let taken = std::mem::take(self);
        (taken.events, taken.moves.into_values().collect())
    }
}

/// An event with no `to`.
fn event(kind: &str, path: String, dir: bool) -> FsEvent {
    FsEvent {
        kind: kind.to_owned(),
        path,
        to: None,
        dir,
    }
}

/// A relative path as sent (not UTF-8: lossy).
fn lossy(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Splits events into frames of at most [`MAX_PER_FRAME`] events and about [`FRAME_BUDGET`]
/// bytes.
fn frames(events: Vec<FsEvent>) -> Vec<Vec<FsEvent>> {
    let mut out = Vec::new();
    let mut frame = Vec::new();
    let mut bytes = 0;
    for e in events {
        // The worst JSON escaping takes 6 bytes a byte (`\u0001`), and the rest of an event
        // is under 64.
        let size = 6 * (e.path.len() + e.to.as_ref().map_or(0, String::len)) + 64;
        if !frame.is_empty() && (frame.len() >= MAX_PER_FRAME || bytes + size > FRAME_BUDGET) {
            out.push(std::mem::take(&mut frame));
            bytes = 0;
        }
        bytes += size;
        frame.push(e);
    }
    if !frame.is_empty() {
        out.push(frame);
    }
    out
}

/// What an attempt to watch a folder gave.
#[derive(Debug, PartialEq, Eq)]
enum Added {
    /// Watched now: its entries are to be walked.
    New,
    /// Not watched: the bound (or the kernel's limit) is reached.
    Full,
    /// Not watched, or already watched (the same folder by another path): nothing to walk.
    Skipped,
}

/// One event read from the kernel, owned (the reader's borrow ends before it is handled).
struct Raw {
    wd: i32,
    mask: ReadFlags,
    cookie: u32,
    name: Option<PathBuf>,
}

/// A watch: its inotify instance, the folders it watches and the batch it gathers.
struct Watcher {
    fd: OwnedFd,
    root: PathBuf,
    recursive: bool,
    max: usize,
    /// Watched folders, relative to the root, by watch descriptor.
    wds: HashMap<i32, PathBuf>,
    /// The root's watch descriptor.
    root_wd: i32,
    /// A `limit` was said (it is said once).
    limited: bool,
    /// The watched folder itself is gone: the watch ends once the batch is sent.
    ended: bool,
    batch: Batch,
    buf: Vec<MaybeUninit<u8>>,
}

impl Watcher {
    /// Watches `path` (and, `recursive`, the folders below it, breadth first): Err in words
    /// when it cannot.
    fn new(path: &str, recursive: bool, max_watches: u32) -> Result<Self, String> {
        if max_watches == 0 {
            return Err("max_watches must be at least 1".into());
        }
        let root = PathBuf::from(path);
        if !root.is_absolute() {
            return Err(format!("{path} is not an absolute path"));
        }
        match std::fs::symlink_metadata(&root) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(format!("{path} is not a folder")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(format!("no folder {path}"));
            }
            Err(e) => return Err(format!("no folder {path} ({e})")),
        }
        let fd = fresh().map_err(|e| match e.raw_os_error() {
            Some(n) if n == Errno::MFILE.raw_os_error() => format!(
                "cannot watch {path}: the sandbox has as many watches as the kernel allows \
                 (fs.inotify.max_user_instances)"
            ),
            _ => format!("cannot watch {path}: {e}"),
        })?;
        let root_wd = inotify::add_watch(&fd, &root, mask()).map_err(|e| match e {
            Errno::NOTDIR => format!("{path} is not a folder"),
            Errno::NOSPC => format!(
                "cannot watch {path}: the sandbox watches as many folders as the kernel allows \
                 (fs.inotify.max_user_watches)"
            ),
            e => format!("cannot watch {path}: {}", io::Error::from(e)),
        })?;
        let mut w = Self {
            fd,
            root,
            recursive,
            max: usize::try_from(max_watches).unwrap_or(usize::MAX),
            wds: HashMap::from([(root_wd, PathBuf::new())]),
            root_wd,
            limited: false,
            ended: false,
            batch: Batch::default(),
            buf: vec![MaybeUninit::uninit(); READ_BUF],
        };
        if recursive {
            w.walk(PathBuf::new(), false);
        }
        Ok(w)
    }

    /// Sends changes until the peer closes `conn`, a write fails or the root goes.
    fn serve(&mut self, conn: &UnixStream) -> io::Result<()> {
        // What the initial walk found (a `limit`) goes at once.
        if !self.batch.events.is_empty() {
            self.flush(conn)?;
        }
        let mut scratch = [0u8; 256];
        loop {
            let timeout = self
                .batch
                .wait(Instant::now())
                .and_then(|d| Timespec::try_from(d).ok());
            let (changed, peer) = {
                let mut fds = [
                    PollFd::new(&self.fd, PollFlags::IN),
                    PollFd::new(conn, PollFlags::IN | PollFlags::RDHUP),
                ];
                match rustix::event::poll(&mut fds, timeout.as_ref()) {
                    Ok(_) | Err(Errno::INTR) => {}
                    Err(e) => return Err(e.into()),
                }
                (!fds[0].revents().is_empty(), !fds[1].revents().is_empty())
            };
            if peer {
                // sandboxd sends nothing on a watch: anything is ignored, the end ends it.
                match (&*conn).read(&mut scratch) {
                    Ok(0) => return Ok(()),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if changed {
                self.drain()?;
            }
            if self.ended || self.batch.due(Instant::now()) {
                self.flush(conn)?;
            }
            if self.ended {
                return Ok(());
            }
        }
    }

    /// Sends the batch: what the kernel has queued is taken first, so that a move's two
    /// halves are not split over two batches; the moves still unpaired left the tree.
    fn flush(&mut self, conn: &UnixStream) -> io::Result<()> {
        if !self.ended {
            self.drain()?;
        }
        let (events, gone) = self.batch.take();
        for m in gone.iter().filter(|m| m.dir) {
            self.unwatch_below(&m.from);
        }
        let mut w = conn;
        for events in frames(events) {
            w.write_all(&proto::encode_msg(&Msg::FsEvents { events }))?;
        }
        Ok(())
    }

    /// Takes what the kernel has queued (at most [`MAX_DRAIN`] events) into the batch.
    fn drain(&mut self) -> io::Result<()> {
        let mut raws = Vec::new();
        let mut buf = std::mem::take(&mut self.buf);
        let result = (|| {
            let mut reader = inotify::Reader::new(&self.fd, &mut buf);
            loop {
                // Never stop with events left in the reader's buffer: it goes with this drain.
                if raws.len() >= MAX_DRAIN && reader.is_buffer_empty() {
                    break;
                }
                match reader.next() {
                    Ok(e) => raws.push(Raw {
                        wd: e.wd(),
                        mask: e.events(),
                        cookie: e.cookie(),
                        name: e
                            .file_name()
                            .map(|n| PathBuf::from(OsStr::from_bytes(n.to_bytes()))),
                    }),
                    Err(Errno::AGAIN) => break,
                    Err(Errno::INTR) => {}
                    Err(e) => return Err(io::Error::from(e)),
                }
            }
            Ok(())
        })();
        self.buf = buf;
        for raw in raws {
            if raw.mask.contains(ReadFlags::QUEUE_OVERFLOW) {
                // The rest read with it is covered by the overflow, and its watch
                // descriptors are the old instance's.
                return self.resync();
            }
            self.handle(raw);
        }
        result
    }

    /// One event of the kernel into the batch, and the watches kept in step with the tree.
    fn handle(&mut self, raw: Raw) {
        let Some(folder) = self.wds.get(&raw.wd).cloned() else {
            // A watch already let go of (its folder moved out of the tree).
            return;
        };
        let m = raw.mask;
        if m.contains(ReadFlags::IGNORED) {
            self.wds.remove(&raw.wd);
        }
        if raw.wd == self.root_wd
            && m.intersects(
                ReadFlags::DELETE_SELF
                    | ReadFlags::MOVE_SELF
                    | ReadFlags::UNMOUNT
                    | ReadFlags::IGNORED,
            )
        {
            if !self.ended {
                self.batch.push(DELETED, String::new(), true);
            }
            self.ended = true;
            return;
        }
        // A folder's own end is told by its parent's event, its watch's by `IN_IGNORED`.
        let Some(name) = raw.name else { return };
        let path = folder.join(name);
        let dir = m.contains(ReadFlags::ISDIR);
        if m.contains(ReadFlags::CREATE) {
            self.batch.push(CREATED, lossy(&path), dir);
            if dir {
                self.arrived(path);
            }
        } else if m.intersects(ReadFlags::MODIFY | ReadFlags::CLOSE_WRITE) {
            if !dir {
                self.batch.push(MODIFIED, lossy(&path), false);
            }
        } else if m.contains(ReadFlags::DELETE) {
            self.batch.push(DELETED, lossy(&path), dir);
        } else if m.contains(ReadFlags::MOVED_FROM) {
            if !self.batch.moved_from(raw.cookie, path.clone(), dir) && dir {
                self.unwatch_below(&path);
            }
        } else if m.contains(ReadFlags::MOVED_TO) {
            match self.batch.moved_to(raw.cookie, &path, dir) {
                Some(from) if dir => self.rewatch_below(&from, &path),
                None if dir => self.arrived(path),
                _ => {}
            }
        }
    }

    /// A folder appeared in the tree (made, or moved in): with `recursive`, it is watched and
    /// walked, what is in it reported.
    fn arrived(&mut self, rel: PathBuf) {
        if self.recursive && self.add(&rel) == Added::New {
            self.walk(rel, true);
        }
    }

    /// Watches the folder at `rel`, if the bound allows.
    fn add(&mut self, rel: &Path) -> Added {
        if self.wds.len() >= self.max {
            self.limit(rel);
            return Added::Full;
        }
        match inotify::add_watch(&self.fd, self.root.join(rel), mask()) {
            // The same folder by another path (a bind mount): walking it again could loop.
            Ok(wd) if self.wds.contains_key(&wd) => Added::Skipped,
            Ok(wd) => {
                self.wds.insert(wd, rel.to_path_buf());
                Added::New
            }
            Err(Errno::NOSPC) => {
                self.limit(rel);
                Added::Full
            }
            // Gone already, not a folder any more, or not ours to read.
            Err(_) => Added::Skipped,
        }
    }

    /// Says, once, that a folder was left unwatched.
    fn limit(&mut self, rel: &Path) {
        if !self.limited {
            self.limited = true;
            self.batch.limit(lossy(rel));
        }
    }

    /// Walks the folder at `rel` (watched already) breadth first, watching the folders below
    /// it; `report`: what is found is `created` (it came before its folder's watch could see
    /// it). Only watched folders wait in the queue, so it never holds more than the bound.
    fn walk(&mut self, rel: PathBuf, report: bool) {
        let mut queue = VecDeque::from([rel]);
        let mut full = false;
        while let Some(folder) = queue.pop_front() {
            let Ok(entries) = std::fs::read_dir(self.root.join(&folder)) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = folder.join(entry.file_name());
                // The entry's own type: a symbolic link is not followed.
                let dir = entry.file_type().is_ok_and(|t| t.is_dir());
                if report {
                    self.batch.push(CREATED, lossy(&path), dir);
                }
                if dir && !full {
                    match self.add(&path) {
                        Added::New => queue.push_back(path),
                        Added::Full => full = true,
                        Added::Skipped => {}
                    }
                }
            }
            // Nothing more to watch, nor to report.
            if full && !report {
                return;
            }
        }
    }

    /// A folder moved inside the tree: its watches and those below it take its new path.
    fn rewatch_below(&mut self, from: &Path, to: &Path) {
        for p in self.wds.values_mut() {
            if let Ok(rest) = p.strip_prefix(from) {
                *p = to.join(rest);
            }
        }
    }

    /// A folder left the tree: its watches and those below it go (they would report its
    /// changes elsewhere under their old paths).
    fn unwatch_below(&mut self, rel: &Path) {
        let gone: Vec<i32> = self
            .wds
            .iter()
            .filter(|(wd, p)| **wd != self.root_wd && p.starts_with(rel))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            let _ = inotify::remove_watch(&self.fd, wd);
            self.wds.remove(&wd);
        }
    }

    /// The kernel lost events: says so, and starts again from a fresh instance and a walk of
    /// the tree, so the watches match the tree again (what moved or appeared unseen included).
    fn resync(&mut self) -> io::Result<()> {
        self.batch.lost();
        // Moves waiting for their second half belong to the lost stream.
        self.batch.moves.clear();
        let fd = fresh()?;
        let root_wd = inotify::add_watch(&fd, &self.root, mask())?;
        // The old instance, and every watch of it, closes here.
        self.fd = fd;
        self.root_wd = root_wd;
        self.wds = HashMap::from([(root_wd, PathBuf::new())]);
        if self.recursive {
            self.walk(PathBuf::new(), false);
        }
        Ok(())
    }
}

/// A new inotify instance (non-blocking: a drain stops when the queue is empty).
fn fresh() -> io::Result<OwnedFd> {
    inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(b: &Batch) -> Vec<(String, String, Option<String>)> {
        b.events
            .iter()
            .map(|e| (e.kind.clone(), e.path.clone(), e.to.clone()))
            .collect()
    }

    fn ev(kind: &str, path: &str, to: Option<&str>) -> (String, String, Option<String>) {
        (kind.into(), path.into(), to.map(Into::into))
    }

    #[test]
    fn writes_after_a_create_or_a_write_are_coalesced() {
        let mut b = Batch::default();
        b.push(CREATED, "a".into(), false);
        b.push(MODIFIED, "a".into(), false);
        b.push(MODIFIED, "b".into(), false);
        b.push(MODIFIED, "b".into(), false);
        b.push(CREATED, "a".into(), false);
        b.push(DELETED, "a".into(), false);
        b.push(MODIFIED, "a".into(), false);
        assert_eq!(
            kinds(&b),
            vec![
                ev(CREATED, "a", None),
                ev(MODIFIED, "b", None),
                ev(DELETED, "a", None),
                ev(MODIFIED, "a", None),
            ]
        );
    }

    #[test]
    fn a_move_pairs_by_cookie_and_an_unpaired_half_is_a_delete_or_a_create() {
        let mut b = Batch::default();
        // A move alone starts the window: its second half may never come.
        assert!(b.moved_from(6, "z".into(), false));
        assert!(b.wait(Instant::now()).is_some());
        assert_eq!(
            b.moved_to(6, Path::new("x"), false),
            Some(PathBuf::from("z"))
        );
        b.take();
        b.push(CREATED, "x".into(), false);
        assert!(b.moved_from(7, "a".into(), false));
        b.push(MODIFIED, "y".into(), false);
        assert_eq!(
            b.moved_to(7, Path::new("b"), false),
            Some(PathBuf::from("a"))
        );
        assert!(b.moved_from(8, "d".into(), true));
        assert_eq!(b.moved_to(9, Path::new("e"), false), None);
        b.push(MODIFIED, "b".into(), false);
        let (events, gone) = b.take();
        let got: Vec<_> = events
            .iter()
            .map(|e| (e.kind.as_str(), e.path.as_str(), e.to.as_deref()))
            .collect();
        assert_eq!(
            got,
            vec![
                (CREATED, "x", None),
                (RENAMED, "a", Some("b")),
                (MODIFIED, "y", None),
                (DELETED, "d", None),
                (CREATED, "e", None),
                (MODIFIED, "b", None),
            ]
        );
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].from, PathBuf::from("d"));
        assert!(gone[0].dir);
        assert!(b.events.is_empty() && b.moves.is_empty() && b.first_at.is_none());
    }

    #[test]
    fn too_many_pending_events_become_one_overflow_and_a_limit_stays() {
        let mut b = Batch::default();
        b.limit("big".into());
        for i in 0..MAX_PENDING + 50 {
            b.push(CREATED, format!("f{i}"), false);
        }
        assert!(b.moved_from(1, "m".into(), false));
        assert_eq!(
            b.moved_to(1, Path::new("n"), false),
            Some(PathBuf::from("m"))
        );
        assert_eq!(
            kinds(&b),
            vec![ev(LIMIT, "big", None), ev(OVERFLOW, "", None)]
        );
        b.lost();
        assert_eq!(b.events.len(), 2);
    }

    #[test]
    fn frames_are_bounded_in_count_and_size() {
        let many: Vec<FsEvent> = (0..2500)
            .map(|i| event(CREATED, format!("f{i}"), false))
            .collect();
        let sizes: Vec<usize> = frames(many).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![1000, 1000, 500]);
        let long = "\u{1}".repeat(4096);
        let renames: Vec<FsEvent> = (0..200)
            .map(|_| FsEvent {
                to: Some(long.clone()),
                ..event(RENAMED, long.clone(), false)
            })
            .collect();
        for frame in frames(renames) {
            let bytes = proto::encode_msg(&Msg::FsEvents { events: frame });
            assert!(bytes.len() < proto::MAX_FRAME, "{}", bytes.len());
        }
    }
}
