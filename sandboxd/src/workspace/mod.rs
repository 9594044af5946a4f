//! Files of a workspace, confined to it.
//!
//! A workspace is a host directory (`{root}/{session id}/workspace`) that is bind-mounted into
//! the session's container at `/workspace`. The agent in the container owns everything in it
//! and may plant hostile entries: symlinks to `/etc`, to `../..`, symlink loops, FIFOs.
//! sandboxd reads and writes those files directly on the host, so every operation here resolves
//! its path as the container sees it ([`crate::workspace::view`]): one component at a time from a handle
//! on the workspace directory, with `openat2(2)` refusing to follow links or leave, and links
//! interpreted with `/workspace` as the workspace root. A link that stays inside is followed
//! (`latest -> /workspace/build/v3` as well as `latest -> build/v3`); an escape (`..` past the
//! root, a link to `/etc`, a relative link leading out) is refused as
//! [`FileError::OutsideWorkspace`].
//!
//! Every operation runs with exactly the permissions the sandbox user has inside
//! ([`crate::workspace::identity`]): on a thread of its own whose filesystem uid and gid are the
//! sandbox's, so root's `CAP_DAC_OVERRIDE` never applies and a file the agent made unreadable
//! is [`FileError::PermissionDenied`] here too.
//!
//! Paths in this API are relative to `/workspace`; the agent's own spelling (`/workspace/x`,
//! `/workspace`) is accepted and stripped. Any other absolute path is refused. `.` and `..`
//! components are resolved lexically before anything touches the disk (`a/../b` is `b`),
//! so a `..` can never climb out through a symlinked directory.
//!
//! Everything sandboxd creates in a workspace (files and directories) is owned by the
//! session's uid:gid, set with `fchown` on the open handle, never by path, so swapping a
//! symlink in mid-operation cannot redirect it.
//!
//! All operations are blocking; callers on an async runtime should run them on a blocking
//! thread.

pub mod disk;
pub mod identity;
pub mod trash;
pub mod view;

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd as _;
use std::os::unix::fs::{PermissionsExt as _, fchown};
use std::path::{Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, Metadata, MetadataExt as _, OpenOptions, OpenOptionsExt as _};
use chrono::DateTime;
use rustix::fs::OFlags;
use serde::{Deserialize, Serialize};

use crate::workspace::trash::Trash;
use crate::workspace::view::Refusal;
use sandboxd_api::ErrorCode;
pub use sandboxd_api::files::{Entry, EntryKind, Listing, MAX_LIST_ENTRIES, Tree};

/// Names of files and directories left out of [`Workspace::list`] and [`Workspace::tree`]
/// (entries and counts) wherever they appear: dependency, cache and VCS folders that would
/// drown the listing.
pub const EXCLUDED_NAMES: &[&str] = &[
    ".venv",
    "venv",
    "node_modules",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".tox",
    ".git",
    ".next",
    ".cache",
];

/// Path prefixes, relative to the workspace root, left out of [`Workspace::list`] and
/// [`Workspace::tree`]: the skills folder, the tool-output spill folder and the platform's own
/// folder. The directory itself (`skills`) is left out as well as everything under it, unless
/// the listing was asked for that directory (or something under it) explicitly.
pub const EXCLUDED_PREFIXES: &[&str] = &["skills/", ".spill/", ".agenticos/"];

/// Where the workspace is mounted inside the container; the agent's absolute paths start here.
const MOUNT_POINT: &str = "/workspace";
/// Mode of the files sandboxd creates.
const FILE_MODE: u32 = 0o644;
/// Mode of the directories sandboxd creates (and of the workspace directory).
const DIR_MODE: u32 = 0o755;
/// What is shown as the path of the workspace directory itself in errors.
const ROOT_SHOWN: &str = "/workspace";

/// Why a file operation failed. Every variant maps to a stable [`code`](FileError::code) and
/// an HTTP [`status`](FileError::status).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The path is not usable: a NUL byte, an absolute path outside `/workspace`, the workspace
    /// root where a file is needed, a symlink loop.
    #[error("'{path}' is not a valid path: {reason}")]
    InvalidPath {
        /// The path as given.
        path: String,
        /// Why it is refused.
        reason: String,
    },
    /// The path, or a symlink on it, leads outside the workspace.
    #[error("'{path}' leads outside the workspace")]
    OutsideWorkspace {
        /// The path as given.
        path: String,
    },
    /// Nothing is at the path (or a directory on the way is missing).
    #[error("'{path}' does not exist")]
    NotFound {
        /// The path as given.
        path: String,
    },
    /// A file was needed and the path is a directory.
    #[error("'{path}' is a directory")]
    IsADirectory {
        /// The path as given.
        path: String,
    },
    /// A directory was needed and the path (or a component on the way) is not one.
    #[error("'{path}' is not a directory (or a component on the way is not one)")]
    NotADirectory {
        /// The path as given.
        path: String,
    },
    /// A non-recursive remove of a directory that still has entries.
    #[error("'{path}' is a directory that is not empty; remove it with recursive")]
    DirectoryNotEmpty {
        /// The path as given.
        path: String,
    },
    /// A read would return more bytes than the read limit allows.
    #[error(
        "reading {size} bytes is over the read limit of {limit} bytes (SANDBOXD_MAX_READ_BYTES); \
         read it in parts with offset and limit"
    )]
    TooLarge {
        /// How many bytes the read would return.
        size: u64,
        /// The read limit.
        limit: u64,
    },
    /// The workspace's disk is full (the session's workspace size, or the disk under it).
    #[error(
        "No space left on device: the workspace is full{}; '{path}' was not written. Remove files to make room",
        .limit.map(|l| format!(" (it holds at most {})", crate::workspace::disk::human(l))).unwrap_or_default()
    )]
    NoSpace {
        /// The path as given.
        path: String,
        /// The workspace size, when it has one.
        limit: Option<u64>,
    },
    /// The workspace directory itself is gone: the session is lost.
    #[error("the workspace directory is gone; the session is lost")]
    WorkspaceMissing,
    /// The sandbox user may not do this (the mode bits say no, as they would inside).
    #[error("'{path}': permission denied for the sandbox user")]
    PermissionDenied {
        /// The path as given.
        path: String,
    },
    /// A file was needed and the path is a FIFO, socket or device.
    #[error("'{path}' is not a regular file (a FIFO, socket or device)")]
    NotRegularFile {
        /// The path as given.
        path: String,
    },
    /// Any other I/O failure.
    #[error("'{path}': {source}")]
    Io {
        /// The path as given.
        path: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

impl FileError {
    /// The error with the workspace size named, when it is a full disk.
    fn within(self, size_limit: Option<u64>) -> Self {
        match self {
            Self::NoSpace { path, limit } => Self::NoSpace {
                path,
                limit: limit.or(size_limit),
            },
            other => other,
        }
    }

    /// A stable snake_case code for API clients.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::InvalidPath { .. } => ErrorCode::InvalidPath,
            Self::OutsideWorkspace { .. } => ErrorCode::OutsideWorkspace,
            Self::NotFound { .. } => ErrorCode::NotFound,
            Self::IsADirectory { .. } => ErrorCode::IsADirectory,
            Self::NotADirectory { .. } => ErrorCode::NotADirectory,
            Self::DirectoryNotEmpty { .. } => ErrorCode::DirectoryNotEmpty,
            Self::TooLarge { .. } => ErrorCode::TooLarge,
            Self::NoSpace { .. } => ErrorCode::WorkspaceFull,
            Self::WorkspaceMissing => ErrorCode::SessionLost,
            Self::PermissionDenied { .. } => ErrorCode::PermissionDenied,
            Self::NotRegularFile { .. } => ErrorCode::NotARegularFile,
            Self::Io { .. } => ErrorCode::IoError,
        }
    }

    /// The HTTP status that goes with the error.
    pub fn status(&self) -> u16 {
        match self {
            Self::InvalidPath { .. } => 400,
            Self::OutsideWorkspace { .. } => 403,
            Self::NotFound { .. } => 404,
            Self::IsADirectory { .. } | Self::NotADirectory { .. } => 409,
            Self::DirectoryNotEmpty { .. } => 409,
            Self::TooLarge { .. } => 413,
            Self::NoSpace { .. } => 507,
            Self::WorkspaceMissing => 410,
            Self::PermissionDenied { .. } => 403,
            Self::NotRegularFile { .. } => 409,
            Self::Io { .. } => 500,
        }
    }
}

/// The bytes [`Workspace::read`] returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadResult {
    /// The bytes read: `[offset, offset + limit)` of the file, cut at its end.
    pub data: Vec<u8>,
    /// The size of the whole file.
    pub size: u64,
    /// Where `data` starts in the file (the requested offset, or the file size when the
    /// offset was beyond the end).
    pub offset: u64,
}

/// What [`Workspace::write`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteResult {
    /// The size of the file written.
    pub size: u64,
}

/// What [`Workspace::remove`] removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveResult {
    /// The path removed, relative to the workspace root.
    pub path: String,
    /// What it was (a symlink is removed itself, never its target).
    pub kind: EntryKind,
}

/// Bounds of a [`Workspace::tree`] walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeLimits {
    /// How many levels below the starting directory are listed (its own entries are level 1).
    pub max_depth: usize,
    /// How many entries are listed at most.
    pub max_entries: usize,
}

impl Default for TreeLimits {
    fn default() -> Self {
        Self {
            max_depth: 6,
            max_entries: 2000,
        }
    }
}

/// One session's workspace on the host, and every file operation on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    dir: PathBuf,
    uid: u32,
    gid: u32,
    trash: Option<Trash>,
    size_limit: Option<u64>,
}

impl Workspace {
    /// A workspace at host directory `dir`, whose files belong to `uid`:`gid` (the container
    /// user).
    pub fn new(dir: impl Into<PathBuf>, uid: u32, gid: u32) -> Self {
        Self {
            dir: dir.into(),
            uid,
            gid,
            trash: None,
            size_limit: None,
        }
    }

    /// The same workspace, whose recursive removes move the folder into `trash` (out of the
    /// sandbox's reach, answering at once) for its sweeper to delete. Without a trash, a
    /// recursive remove deletes in place (iteratively all the same).
    pub fn with_trash(mut self, trash: Trash) -> Self {
        self.trash = Some(trash);
        self
    }

    /// The workspace with its size, named when a write finds it full.
    pub fn with_size_limit(mut self, size_limit: Option<u64>) -> Self {
        self.size_limit = size_limit;
        self
    }

    /// The host directory of the workspace.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the workspace directory is there (a real directory, not a symlink). When it is
    /// not, the session is lost.
    pub fn exists(&self) -> bool {
        std::fs::symlink_metadata(&self.dir).is_ok_and(|meta| meta.is_dir())
    }

    /// Creates the workspace directory (and its parents), owned by uid:gid with mode 0755.
    /// Parents that had to be created stay owned by the daemon. Calling it again is harmless.
    pub fn prepare(&self) -> Result<(), FileError> {
        let io_err = |source| FileError::Io {
            path: self.dir.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(io_err)?;
        let meta = std::fs::symlink_metadata(&self.dir).map_err(io_err)?;
        if !meta.is_dir() {
            return Err(FileError::NotADirectory {
                path: self.dir.display().to_string(),
            });
        }
        let handle = std::fs::File::open(&self.dir).map_err(io_err)?;
        if !handle.metadata().map_err(io_err)?.is_dir() {
            return Err(FileError::NotADirectory {
                path: self.dir.display().to_string(),
            });
        }
        fchown(&handle, Some(self.uid), Some(self.gid)).map_err(io_err)?;
        handle
            .set_permissions(std::fs::Permissions::from_mode(DIR_MODE))
            .map_err(io_err)?;
        Ok(())
    }

    /// Reads `[offset, offset + limit)` of the file at `path` (`limit` defaults to the rest of
    /// the file). Refused with [`FileError::TooLarge`] when that is more than `max_read_bytes`.
    /// Symlinks that stay inside the workspace are followed; a directory is
    /// [`FileError::IsADirectory`]; a FIFO, socket or device is refused without blocking.
    pub fn read(
        &self,
        path: &str,
        offset: u64,
        limit: Option<u64>,
        max_read_bytes: u64,
    ) -> Result<ReadResult, FileError> {
        if let Some(hop) = self.hop(|| self.read(path, offset, limit, max_read_bytes)) {
            return hop;
        }
        let comps = normalize(path)?;
        if comps.is_empty() {
            return Err(FileError::IsADirectory { path: shown(path) });
        }
        let root = self.open_root()?;
        let file = open_regular(&root, &comps, path)?;
        let size = file.metadata().map_err(|e| map_io(path, e))?.len();
        let start = offset.min(size);
        let available = size - start;
        let wanted = limit.map_or(available, |limit| limit.min(available));
        if wanted > max_read_bytes {
            return Err(FileError::TooLarge {
                size: wanted,
                limit: max_read_bytes,
            });
        }
        let mut file = file;
        file.seek(SeekFrom::Start(start))
            .map_err(|e| map_io(path, e))?;
        let mut data = Vec::with_capacity(usize::try_from(wanted).unwrap_or(0));
        file.take(wanted)
            .read_to_end(&mut data)
            .map_err(|e| map_io(path, e))?;
        Ok(ReadResult {
            data,
            size,
            offset: start,
        })
    }

    /// Writes `data` to the file at `path`, atomically: a hidden temporary file in the same
    /// directory is written, fsynced and renamed over the target. Missing parent directories
    /// are created. The file and every directory created are owned by uid:gid; a new file gets
    /// mode 0644, a replaced file keeps its permission bits, new directories get 0755. A
    /// symlink at the path that stays inside the workspace is written through (its target is
    /// replaced, the link stays); one that leads out is refused. Writing over a directory is
    /// [`FileError::IsADirectory`].
    pub fn write(&self, path: &str, data: &[u8]) -> Result<WriteResult, FileError> {
        let mut pending = self.begin_write(path)?;
        pending.write_all(data)?;
        pending.commit()
    }

    /// Starts a write to `path` (resolved and confined as [`Workspace::write`] does): the bytes
    /// go to a temporary file beside the target, which [`PendingWrite::commit`] renames over
    /// it; a pending write dropped before its commit leaves nothing behind. For bodies that
    /// arrive in pieces, written as they come. A full disk is [`FileError::NoSpace`], naming
    /// the workspace size.
    pub fn begin_write(&self, path: &str) -> Result<PendingWrite, FileError> {
        if let Some(hop) = self.hop(|| self.begin_write(path)) {
            return hop;
        }
        self.start_write(path)
            .map_err(|e| e.within(self.size_limit))
    }

    fn start_write(&self, path: &str) -> Result<PendingWrite, FileError> {
        let comps = normalize(path)?;
        if comps.is_empty() {
            return Err(invalid(
                path,
                "a file path is needed, not the workspace root",
            ));
        }
        let root = self.open_root()?;
        // Through every link, a link at the end too (written through, as open(2) does), with
        // the directories on the way created.
        let create = |dir: &Dir, name: &str| self.create_owned_dir(dir, name);
        let place = view::walk(&root, &comps, true, Some(&create)).map_err(|r| refused(path, r))?;
        let Some(name) = place.name else {
            return Err(FileError::IsADirectory { path: shown(path) });
        };
        let parent = place.dir;
        let mode = match parent.symlink_metadata(&name) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => FILE_MODE,
            Err(e) => return Err(map_io(path, e)),
            Ok(meta) if meta.is_dir() => {
                return Err(FileError::IsADirectory { path: shown(path) });
            }
            Ok(meta) if meta.is_file() => {
                // Replaced by a rename, so the file's own write permission is asked here, as
                // open(2) would ask it (no truncation: nothing is written through this handle).
                view::open_one(&parent, &name, OFlags::WRONLY | OFlags::NONBLOCK)
                    .map_err(|e| map_io(path, e))?;
                meta.mode() & 0o777
            }
            Ok(meta) if meta.file_type().is_symlink() => {
                // Swapped in after the walk: refused rather than replaced.
                return Err(invalid(
                    path,
                    "it changed to a symbolic link while it was written",
                ));
            }
            Ok(_) => return Err(FileError::NotRegularFile { path: shown(path) }),
        };
        let temp = format!(".sandboxd-write-{:016x}.tmp", rand::random::<u64>());
        let mut options = OpenOptions::new();
        options.write(true).create_new(true).mode(mode);
        let file = parent
            .open_with(&temp, &options)
            .map_err(|e| map_io(path, e))?
            .into_std();
        Ok(PendingWrite {
            name,
            dir: parent,
            temp,
            file,
            mode,
            uid: self.uid,
            gid: self.gid,
            path: path.to_owned(),
            size: 0,
            size_limit: self.size_limit,
            done: false,
        })
    }

    /// Removes the file, symlink (the link itself, never its target) or empty directory at
    /// `path`; with `recursive`, a directory and everything in it (symlinks inside are removed,
    /// not followed), however deep: it is moved into the trash at once when the workspace has
    /// one ([`Workspace::with_trash`]), and deleted with a bounded number of descriptors,
    /// without recursion ([`crate::workspace::trash`]). The workspace root itself cannot be removed.
    pub fn remove(&self, path: &str, recursive: bool) -> Result<RemoveResult, FileError> {
        if let Some(hop) = self.hop(|| self.remove(path, recursive)) {
            return hop;
        }
        let comps = normalize(path)?;
        let Some((name, parents)) = comps.split_last() else {
            return Err(invalid(path, "the workspace root cannot be removed"));
        };
        let root = self.open_root()?;
        let parent = self.open_dir_followed(&root, parents, path)?;
        let meta = parent.symlink_metadata(name).map_err(|e| map_io(path, e))?;
        let kind = kind_of(&meta);
        let removed = match kind {
            EntryKind::Dir if recursive => match &self.trash {
                // The sandbox user must be allowed to remove it (write and search on its
                // folder); the move into the trash, a folder of sandboxd's own, is the daemon's.
                Some(trash) => rustix::fs::accessat(
                    parent.as_fd(),
                    ".",
                    rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
                    rustix::fs::AtFlags::EACCESS,
                )
                .map_err(io::Error::from)
                .and_then(|()| {
                    identity::as_daemon(|| {
                        trash.discard_at(parent.as_fd(), OsStr::new(name), "removed")
                    })
                })
                .and_then(|moved| {
                    if moved {
                        Ok(())
                    } else {
                        Err(io::ErrorKind::NotFound.into())
                    }
                }),
                None => crate::workspace::trash::remove_tree_at(parent.as_fd(), OsStr::new(name)),
            },
            EntryKind::Dir => parent.remove_dir(name),
            _ => parent.remove_file(name),
        };
        removed.map_err(|e| map_io(path, e))?;
        Ok(RemoveResult {
            path: comps.join("/"),
            kind,
        })
    }

    /// Creates the directory at `path` and any missing parents, like `mkdir -p`; each one
    /// created is owned by uid:gid with mode 0755. An existing directory is fine; an existing
    /// file on the way is [`FileError::NotADirectory`].
    pub fn mkdir(&self, path: &str) -> Result<(), FileError> {
        if let Some(hop) = self.hop(|| self.mkdir(path)) {
            return hop;
        }
        let comps = normalize(path)?;
        let root = self.open_root()?;
        self.ensure_dirs(&root, &comps, path)
            .map_err(|e| e.within(self.size_limit))?;
        Ok(())
    }

    /// Describes the file, directory or link at `path`, not following a symlink at its end.
    pub fn stat(&self, path: &str) -> Result<Entry, FileError> {
        if let Some(hop) = self.hop(|| self.stat(path)) {
            return hop;
        }
        let comps = normalize(path)?;
        let root = self.open_root()?;
        let Some((name, parents)) = comps.split_last() else {
            let meta = root.dir_metadata().map_err(|e| map_io(path, e))?;
            return Ok(entry_of(String::new(), String::new(), &meta));
        };
        let parent = self.open_dir_followed(&root, parents, path)?;
        let meta = parent.symlink_metadata(name).map_err(|e| map_io(path, e))?;
        Ok(entry_of(name.clone(), comps.join("/"), &meta))
    }

    /// Lists the directory at `path` (one level), sorted by name, without the excluded names
    /// and prefixes ([`EXCLUDED_NAMES`], [`EXCLUDED_PREFIXES`]): at most `max_entries`
    /// entries, the listing marked truncated when there were more.
    pub fn list(&self, path: &str, max_entries: usize) -> Result<Listing, FileError> {
        if let Some(hop) = self.hop(|| self.list(path, max_entries)) {
            return hop;
        }
        let comps = normalize(path)?;
        let rel = comps.join("/");
        let root = self.open_root()?;
        let dir = self.open_dir_followed(&root, &comps, path)?;
        let (listed, truncated) =
            list_dir(&dir, &rel, &rel, max_entries).map_err(|e| map_io(path, e))?;
        Ok(Listing {
            entries: listed.into_iter().map(|item| item.entry).collect(),
            truncated,
        })
    }

    /// Describes what `path` leads to, following symlinks that stay inside the workspace (one
    /// that leads out is [`FileError::OutsideWorkspace`], a dangling one
    /// [`FileError::NotFound`]).
    pub fn stat_followed(&self, path: &str) -> Result<Entry, FileError> {
        if let Some(hop) = self.hop(|| self.stat_followed(path)) {
            return hop;
        }
        let comps = normalize(path)?;
        let root = self.open_root()?;
        let place = view::walk(&root, &comps, true, None).map_err(|r| refused(path, r))?;
        let meta = match &place.name {
            None => place.dir.dir_metadata(),
            Some(name) => place.dir.symlink_metadata(name),
        }
        .map_err(|e| map_io(path, e))?;
        let name = comps.last().cloned().unwrap_or_default();
        Ok(entry_of(name, comps.join("/"), &meta))
    }

    /// Lists the directory at `path` (one level), sorted by name, with nothing left out (as
    /// `ls -A`); a symlink is listed as itself. At most `max_entries` entries, the listing
    /// marked truncated when there were more.
    pub fn list_all(&self, path: &str, max_entries: usize) -> Result<Listing, FileError> {
        if let Some(hop) = self.hop(|| self.list_all(path, max_entries)) {
            return hop;
        }
        let comps = normalize(path)?;
        let rel = comps.join("/");
        let root = self.open_root()?;
        let dir = self.open_dir_followed(&root, &comps, path)?;
        let (listed, truncated) =
            read_dir_bounded(&dir, &rel, max_entries, |_, _| false).map_err(|e| map_io(path, e))?;
        Ok(Listing {
            entries: listed.into_iter().map(|item| item.entry).collect(),
            truncated,
        })
    }

    /// The real path of `path` below the workspace root (`/`-separated, empty for the root),
    /// resolved as `os.path.realpath(strict=False)` resolves it in the container: every link
    /// followed (an absolute target against the container's `/`, where `/workspace` is the
    /// root), `..` climbing from where a link led, and what does not exist (or lies below a
    /// file, or cannot be searched) kept as written. A path or link that leads out is
    /// [`FileError::OutsideWorkspace`]; a loop is [`FileError::InvalidPath`].
    pub fn realpath(&self, path: &str) -> Result<String, FileError> {
        if let Some(hop) = self.hop(|| self.realpath(path)) {
            return hop;
        }
        let comps = components(path)?;
        let root = self.open_root()?;
        let real = view::realpath(&root, &comps).map_err(|r| refused(path, r))?;
        Ok(real.join("/"))
    }

    /// Walks the directory at `path` breadth-first, at most `limits.max_depth` levels and
    /// `limits.max_entries` entries, leaving out the excluded names and prefixes and not
    /// descending into symlinked directories. A subdirectory that cannot be read is skipped and
    /// reported in [`Tree::skipped`]; only an unreadable starting directory is an error.
    pub fn tree(&self, path: &str, limits: TreeLimits) -> Result<Tree, FileError> {
        if let Some(hop) = self.hop(|| self.tree(path, limits)) {
            return hop;
        }
        self.tree_with(path, limits, &|root: &Dir, rel: &str| root.open_dir(rel))
    }

    /// [`Workspace::tree`], with the opening of subdirectories (by their path relative to the
    /// workspace root) given, so that tests can make one fail.
    fn tree_with(
        &self,
        path: &str,
        limits: TreeLimits,
        open_subdir: &dyn Fn(&Dir, &str) -> io::Result<Dir>,
    ) -> Result<Tree, FileError> {
        let comps = normalize(path)?;
        let start_rel = comps.join("/");
        let root = self.open_root()?;
        let start = self.open_dir_followed(&root, &comps, path)?;
        // Each folder is read only as far as the entries still to list (and one more, to know
        // whether the limit was reached): a huge folder costs no more than the limit.
        let budget = limits.max_entries.saturating_add(1);
        let (first, _) =
            list_dir(&start, &start_rel, &start_rel, budget).map_err(|e| map_io(path, e))?;
        drop(start);

        let mut tree = Tree {
            root: start_rel.clone(),
            entries: Vec::new(),
            depth_limit_reached: false,
            entry_limit_reached: false,
            max_depth: limits.max_depth,
            max_entries: limits.max_entries,
            incomplete: false,
            skipped: Vec::new(),
        };
        // Directories still to read: their listing (read lazily) and the level of its entries.
        let mut pending: VecDeque<(Pending, usize)> = VecDeque::new();
        if limits.max_depth == 0 {
            tree.depth_limit_reached = !first.is_empty();
        } else {
            pending.push_back((Pending::Listed(first), 1));
        }
        'walk: while let Some((next, depth)) = pending.pop_front() {
            let listed = match next {
                Pending::Listed(listed) => listed,
                Pending::Dir { rel, id } => {
                    let budget = limits
                        .max_entries
                        .saturating_sub(tree.entries.len())
                        .saturating_add(1);
                    let read = open_subdir(&root, &rel)
                        .and_then(|dir| same_dir(dir, id))
                        .and_then(|dir| list_dir(&dir, &rel, &start_rel, budget));
                    match read {
                        Ok((listed, _)) => listed,
                        Err(_) => {
                            tree.skipped.push(rel);
                            continue;
                        }
                    }
                }
            };
            for item in listed {
                if tree.entries.len() >= limits.max_entries {
                    tree.entry_limit_reached = true;
                    break 'walk;
                }
                if item.entry.kind == EntryKind::Dir {
                    if depth < limits.max_depth {
                        pending.push_back((
                            Pending::Dir {
                                rel: item.entry.path.clone(),
                                id: item.id,
                            },
                            depth + 1,
                        ));
                    } else if !tree.depth_limit_reached
                        && has_entries(&root, &item.entry.path, &start_rel, open_subdir)
                    {
                        tree.depth_limit_reached = true;
                    }
                }
                tree.entries.push(item.entry);
            }
        }
        tree.incomplete =
            tree.depth_limit_reached || tree.entry_limit_reached || !tree.skipped.is_empty();
        Ok(tree)
    }

    /// Opens the workspace directory; its absence means the session is lost.
    fn open_root(&self) -> Result<Dir, FileError> {
        // With the daemon's identity: the folders above the workspace are the daemon's.
        match identity::as_daemon(|| Dir::open_ambient_dir(&self.dir, ambient_authority())) {
            Ok(dir) => Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(FileError::WorkspaceMissing),
            Err(source) => Err(FileError::Io {
                path: ROOT_SHOWN.to_owned(),
                source,
            }),
        }
    }

    /// Opens the directory `comps` below `root`, following links as the container would and
    /// creating (owned by uid:gid) what is missing.
    fn ensure_dirs(&self, root: &Dir, comps: &[String], path: &str) -> Result<Dir, FileError> {
        let create = |dir: &Dir, name: &str| self.create_owned_dir(dir, name);
        let place = view::walk(root, comps, true, Some(&create)).map_err(|r| refused(path, r))?;
        let Some(name) = place.name else {
            return Ok(place.dir);
        };
        match view::open_one(&place.dir, &name, OFlags::PATH | OFlags::DIRECTORY) {
            Ok(dir) => Ok(Dir::from_std_file(dir)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => self
                .create_owned_dir(&place.dir, &name)
                .map_err(|e| map_io(path, e)),
            Err(e) => Err(map_io(path, e)),
        }
    }

    /// Opens the directory `comps` below `root` (the root itself when empty), following links
    /// as the container would.
    fn open_dir_followed(
        &self,
        root: &Dir,
        comps: &[String],
        path: &str,
    ) -> Result<Dir, FileError> {
        let place = view::walk(root, comps, true, None).map_err(|r| refused(path, r))?;
        let Some(name) = place.name else {
            return Ok(place.dir);
        };
        view::open_one(&place.dir, &name, OFlags::PATH | OFlags::DIRECTORY)
            .map(Dir::from_std_file)
            .map_err(|e| map_io(path, e))
    }

    /// Runs `op` as the sandbox user ([`identity`]) and returns what it did, unless this thread
    /// already acts as that user: then `None`, and the caller goes on itself.
    fn hop<T: Send>(
        &self,
        op: impl FnOnce() -> Result<T, FileError> + Send,
    ) -> Option<Result<T, FileError>> {
        if identity::acting_as(self.uid, self.gid) {
            return None;
        }
        Some(
            identity::run_as(self.uid, self.gid, op).unwrap_or_else(|source| {
                Err(FileError::Io {
                    path: ROOT_SHOWN.to_owned(),
                    source,
                })
            }),
        )
    }

    /// Creates directory `name` in `dir`, owned by uid:gid with mode 0755, and opens it. The
    /// sandbox may swap something else in between the mkdir and the open: a FIFO, a symlink
    /// or a file there is refused at once as not a directory (opened with
    /// `O_NOFOLLOW|O_DIRECTORY|O_NONBLOCK`, it can neither hang nor lead anywhere).
    fn create_owned_dir(&self, dir: &Dir, name: &str) -> io::Result<Dir> {
        match dir.create_dir(name) {
            Ok(()) => {}
            // Created meanwhile, or a dangling symlink: opening it tells which.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return dir.open_dir(name),
            Err(e) => return Err(e),
        }
        let handle = open_created_dir(dir, name)?;
        if !handle.metadata()?.is_dir() {
            return Err(io::ErrorKind::NotADirectory.into());
        }
        fchown(&handle, Some(self.uid), Some(self.gid))?;
        handle.set_permissions(std::fs::Permissions::from_mode(DIR_MODE))?;
        Ok(Dir::from_std_file(handle))
    }
}

/// Opens the directory `name` of `dir` that sandboxd has just created, for fchown and fchmod
/// (a real handle, not O_PATH). Whatever the sandbox swapped in meanwhile (a FIFO, a symlink,
/// a file) is refused at once as not a directory: never opened, never followed, never waited
/// on.
fn open_created_dir(dir: &Dir, name: &str) -> io::Result<std::fs::File> {
    match crate::workspace::trash::open_dir_nofollow(dir.as_fd(), OsStr::new(name)) {
        Ok(fd) => Ok(std::fs::File::from(fd)),
        Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            "the directory created was replaced by something else",
        )),
        Err(e) => Err(e.into()),
    }
}

/// The largest single write() of a file write.
const WRITE_PIECE: usize = 1024 * 1024;

/// A write under way (see [`Workspace::begin_write`]): a hidden temporary file beside the
/// target, owned by uid:gid with the mode, renamed over the target on commit: readers and a
/// crashed sandboxd see the old file or the new one, never a part. It is not fsynced (an fsync
/// made 8 MiB writes five times slower); after a power loss the last writes may be missing, as
/// for any program in the sandbox.
pub struct PendingWrite {
    dir: Dir,
    temp: String,
    name: String,
    file: std::fs::File,
    mode: u32,
    uid: u32,
    gid: u32,
    path: String,
    size: u64,
    size_limit: Option<u64>,
    done: bool,
}

impl PendingWrite {
    /// Appends bytes to the file being written.
    pub fn write_all(&mut self, data: &[u8]) -> Result<(), FileError> {
        // In pieces of at most 1 MiB: the kernel makes one large write() wait for writeback in
        // proportion to the pages it dirtied (an 8 MiB write took 23 ms on the development
        // machine, eight 1 MiB writes 2 ms).
        for piece in data.chunks(WRITE_PIECE) {
            (&self.file)
                .write_all(piece)
                .map_err(|e| map_io(&self.path, e).within(self.size_limit))?;
        }
        self.size += data.len() as u64;
        Ok(())
    }

    /// Bytes written so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Gives the file the sandbox's uid and the mode, and puts it in place atomically.
    pub fn commit(mut self) -> Result<WriteResult, FileError> {
        if !identity::acting_as(self.uid, self.gid) {
            let (uid, gid) = (self.uid, self.gid);
            return identity::run_as(uid, gid, move || self.commit()).unwrap_or_else(|source| {
                Err(FileError::Io {
                    path: ROOT_SHOWN.to_owned(),
                    source,
                })
            });
        }
        let placed = (|| {
            fchown(&self.file, Some(self.uid), Some(self.gid))?;
            self.file
                .set_permissions(std::fs::Permissions::from_mode(self.mode))?;
            self.dir.rename(&self.temp, &self.dir, &self.name)
        })();
        placed.map_err(|e| map_io(&self.path, e).within(self.size_limit))?;
        self.done = true;
        Ok(WriteResult { size: self.size })
    }
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        if !self.done {
            // Best effort: the temporary file must not stay behind.
            let _ = self.dir.remove_file(&self.temp);
        }
    }
}

/// A directory waiting in the breadth-first walk of [`Workspace::tree`].
enum Pending {
    /// Already read (the starting directory).
    Listed(Vec<Listed>),
    /// To be opened by its path relative to the workspace root; `id` is the (device, inode)
    /// seen when it was listed, so a directory swapped for a symlink is not descended into.
    Dir { rel: String, id: (u64, u64) },
}

/// An entry of a directory listing, with its (device, inode).
struct Listed {
    entry: Entry,
    id: (u64, u64),
}

/// Checks that `dir` is the directory with (device, inode) `id`.
fn same_dir(dir: Dir, id: (u64, u64)) -> io::Result<Dir> {
    let meta = dir.dir_metadata()?;
    if (meta.dev(), meta.ino()) == id {
        Ok(dir)
    } else {
        Err(io::Error::other(
            "the directory changed while it was walked",
        ))
    }
}

/// Whether the directory at `rel` has any entry that would be listed.
fn has_entries(
    root: &Dir,
    rel: &str,
    start_rel: &str,
    open_subdir: &dyn Fn(&Dir, &str) -> io::Result<Dir>,
) -> bool {
    let Ok(dir) = open_subdir(root, rel) else {
        return false;
    };
    let Ok(entries) = dir.entries() else {
        return false;
    };
    entries.flatten().any(|item| {
        let name = item.file_name().to_string_lossy().into_owned();
        !is_excluded(start_rel, &child_path(rel, &name), &name)
    })
}

/// Lists `dir` (at `dir_rel` below the workspace root), sorted by name, leaving out what is
/// excluded for a listing asked for at `start_rel`: at most `max` entries, and whether there
/// were more.
fn list_dir(
    dir: &Dir,
    dir_rel: &str,
    start_rel: &str,
    max: usize,
) -> io::Result<(Vec<Listed>, bool)> {
    read_dir_bounded(dir, dir_rel, max, |path, name| {
        is_excluded(start_rel, path, name)
    })
}

/// Reads `dir` (at `dir_rel`) lazily, leaving out what `skip(path, name)` says: at most `max`
/// entries, each described (`fstatat`), sorted by name, and whether there were more. Reading
/// stops at the first entry past `max`, so neither the names nor the descriptions of a huge
/// folder are ever all gathered.
fn read_dir_bounded(
    dir: &Dir,
    dir_rel: &str,
    max: usize,
    skip: impl Fn(&str, &str) -> bool,
) -> io::Result<(Vec<Listed>, bool)> {
    let mut listed = Vec::new();
    let mut more = false;
    for item in dir.entries()? {
        let item = item?;
        let name = item.file_name().to_string_lossy().into_owned();
        let path = child_path(dir_rel, &name);
        if skip(&path, &name) {
            continue;
        }
        if listed.len() == max {
            more = true;
            break;
        }
        let meta = match item.metadata() {
            Ok(meta) => meta,
            // Removed between readdir and stat: it is gone, leave it out.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        listed.push(Listed {
            id: (meta.dev(), meta.ino()),
            entry: entry_of(name, path, &meta),
        });
    }
    listed.sort_by(|a, b| a.entry.name.cmp(&b.entry.name));
    Ok((listed, more))
}

/// Whether the entry `name` at `path` is left out of a listing asked for at `start_rel`.
fn is_excluded(start_rel: &str, path: &str, name: &str) -> bool {
    EXCLUDED_NAMES.contains(&name)
        || EXCLUDED_PREFIXES
            .iter()
            .any(|prefix| under_prefix(path, prefix) && !under_prefix(start_rel, prefix))
}

/// Whether `path` is the directory `prefix` names (`skills/`) or is under it.
fn under_prefix(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix.trim_end_matches('/'))
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// `name` in the directory at `dir_rel`.
fn child_path(dir_rel: &str, name: &str) -> String {
    if dir_rel.is_empty() {
        name.to_owned()
    } else {
        format!("{dir_rel}/{name}")
    }
}

/// What `meta` describes, not following symlinks.
fn kind_of(meta: &Metadata) -> EntryKind {
    let file_type = meta.file_type();
    if file_type.is_symlink() {
        EntryKind::Symlink
    } else if file_type.is_dir() {
        EntryKind::Dir
    } else if file_type.is_file() {
        EntryKind::File
    } else {
        EntryKind::Other
    }
}

/// The [`Entry`] for `name` at `path` described by `meta`.
fn entry_of(name: String, path: String, meta: &Metadata) -> Entry {
    Entry {
        name,
        path,
        kind: kind_of(meta),
        size: meta.len(),
        modified: DateTime::from_timestamp(
            meta.mtime(),
            u32::try_from(meta.mtime_nsec()).unwrap_or(0),
        ),
        mode: meta.mode() & 0o7777,
    }
}

/// Opens the regular file `comps` below `root` for reading, following links as the container
/// would. A directory is [`FileError::IsADirectory`]; a FIFO, socket or device is
/// [`FileError::NotRegularFile`], answered without opening it (so without blocking).
fn open_regular(root: &Dir, comps: &[String], path: &str) -> Result<std::fs::File, FileError> {
    let place = view::walk(root, comps, true, None).map_err(|r| refused(path, r))?;
    let Some(name) = place.name else {
        return Err(FileError::IsADirectory { path: shown(path) });
    };
    let check = |file: &std::fs::File| -> Result<(), FileError> {
        let meta = file.metadata().map_err(|e| map_io(path, e))?;
        if meta.is_dir() {
            Err(FileError::IsADirectory { path: shown(path) })
        } else if !meta.is_file() {
            Err(FileError::NotRegularFile { path: shown(path) })
        } else {
            Ok(())
        }
    };
    check(&view::open_one(&place.dir, &name, OFlags::PATH).map_err(|e| map_io(path, e))?)?;
    // Opened for reading only once it is known to be a regular file; non-blocking, so that a
    // FIFO swapped in meanwhile cannot hang the open, and checked again.
    let file = view::open_one(&place.dir, &name, OFlags::RDONLY | OFlags::NONBLOCK)
        .map_err(|e| map_io(path, e))?;
    check(&file)?;
    Ok(file)
}

/// The [`FileError`] for a walk of `path` that stopped.
fn refused(path: &str, r: Refusal) -> FileError {
    match r {
        Refusal::Outside => FileError::OutsideWorkspace { path: shown(path) },
        Refusal::Loop => invalid(path, "too many levels of symbolic links (a symlink loop?)"),
        Refusal::Io(e) => map_io(path, e),
    }
}

/// The components of `path` below the workspace root, `..` kept (for a walk that resolves it
/// where links led). Accepts the agent's `/workspace/...` spelling; refuses NUL bytes and other
/// absolute paths.
fn components(path: &str) -> Result<Vec<String>, FileError> {
    if path.contains('\0') {
        return Err(invalid(path, "it contains a NUL byte"));
    }
    let relative = if let Some(rest) = path.strip_prefix(MOUNT_POINT) {
        if !rest.is_empty() && !rest.starts_with('/') {
            return Err(invalid(path, "an absolute path must be under /workspace"));
        }
        rest
    } else if path.starts_with('/') {
        return Err(invalid(path, "an absolute path must be under /workspace"));
    } else {
        path
    };
    Ok(relative
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(str::to_owned)
        .collect())
}

/// The components of `path` below the workspace root, with `.` and `..` resolved lexically.
/// Accepts the agent's `/workspace/...` spelling; refuses NUL bytes, other absolute paths and
/// `..` that climbs out.
fn normalize(path: &str) -> Result<Vec<String>, FileError> {
    let mut comps: Vec<String> = Vec::new();
    for comp in components(path)? {
        if comp == ".." {
            if comps.pop().is_none() {
                return Err(FileError::OutsideWorkspace { path: shown(path) });
            }
        } else {
            comps.push(comp);
        }
    }
    Ok(comps)
}

/// `path` fit to be shown in a message (NUL bytes spelled out).
fn shown(path: &str) -> String {
    path.replace('\0', "\\0")
}

/// [`FileError::InvalidPath`] for `path`.
fn invalid(path: &str, reason: &str) -> FileError {
    FileError::InvalidPath {
        path: shown(path),
        reason: reason.to_owned(),
    }
}

/// Whether `e` is cap-std refusing a resolution that leaves the directory: cap-std reports
/// that as a `PermissionDenied` error that carries no OS error code.
fn is_escape(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied && e.raw_os_error().is_none()
}

/// Whether `e` is ELOOP: too many levels of symbolic links.
fn is_symlink_loop(e: &io::Error) -> bool {
    // `ErrorKind::FilesystemLoop` is unstable; ELOOP is 40 on the Linux targets sandboxd runs on.
    (cfg!(target_os = "linux") && e.raw_os_error() == Some(40))
        || format!("{:?}", e.kind()) == "FilesystemLoop"
}

/// The [`FileError`] for an I/O error on `path`.
fn map_io(path: &str, e: io::Error) -> FileError {
    let path = shown(path);
    if is_escape(&e) {
        return FileError::OutsideWorkspace { path };
    }
    if is_symlink_loop(&e) {
        return FileError::InvalidPath {
            path,
            reason: "too many levels of symbolic links (a symlink loop?)".to_owned(),
        };
    }
    // ENOSPC, and EDQUOT for a disk under a quota.
    if matches!(e.raw_os_error(), Some(28 | 122)) {
        return FileError::NoSpace { path, limit: None };
    }
    match e.kind() {
        io::ErrorKind::NotFound => FileError::NotFound { path },
        io::ErrorKind::NotADirectory => FileError::NotADirectory { path },
        io::ErrorKind::IsADirectory => FileError::IsADirectory { path },
        io::ErrorKind::DirectoryNotEmpty => FileError::DirectoryNotEmpty { path },
        io::ErrorKind::PermissionDenied => FileError::PermissionDenied { path },
        _ => FileError::Io { path, source: e },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
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
        assert_eq!((e.code().as_str(), e.status()), ("outside_workspace", 403));
        let e = f.ws.read("a\0b", 0, None, 10).expect_err("refused");
        assert!(e.to_string().contains("a\\0b"), "{e}");
    }

    #[test]
    fn a_full_disk_is_named_with_the_workspace_size() {
        let e = map_io("big.bin", io::Error::from_raw_os_error(28)).within(Some(64 << 20));
        assert_eq!((e.code().as_str(), e.status()), ("workspace_full", 507));
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
    fn codes_and_statuses() {
        let p = || "p".to_owned();
        let cases = [
            (invalid("p", "r"), "invalid_path", 400),
            (
                FileError::OutsideWorkspace { path: p() },
                "outside_workspace",
                403,
            ),
            (FileError::NotFound { path: p() }, "not_found", 404),
            (
                FileError::NoSpace {
                    path: p(),
                    limit: None,
                },
                "workspace_full",
                507,
            ),
            (FileError::IsADirectory { path: p() }, "is_a_directory", 409),
            (
                FileError::NotADirectory { path: p() },
                "not_a_directory",
                409,
            ),
            (
                FileError::DirectoryNotEmpty { path: p() },
                "directory_not_empty",
                409,
            ),
            (FileError::TooLarge { size: 2, limit: 1 }, "too_large", 413),
            (FileError::WorkspaceMissing, "session_lost", 410),
            (
                FileError::PermissionDenied { path: p() },
                "permission_denied",
                403,
            ),
            (
                FileError::NotRegularFile { path: p() },
                "not_a_regular_file",
                409,
            ),
            (
                FileError::Io {
                    path: p(),
                    source: io::Error::other("x"),
                },
                "io_error",
                500,
            ),
        ];
        for (e, code, status) in cases {
            assert_eq!((e.code().as_str(), e.status()), (code, status), "{e}");
        }
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
        fs::set_permissions(f.dir.join("run.sh"), fs::Permissions::from_mode(0o750))
            .expect("chmod");
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
        assert_eq!((e.code().as_str(), e.status()), ("not_a_regular_file", 409));
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
        assert_eq!((e.code().as_str(), e.status()), ("too_large", 413));
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

    #[test]
    fn tree_skips_an_unreadable_subdirectory() {
        let f = fixture();
        f.file("a/1.txt", b"");
        f.file("b/2.txt", b"");
        f.file("b/deep/3.txt", b"");
        f.file("c/4.txt", b"");
        let failing = |root: &Dir, rel: &str| {
            if rel == "b" {
                Err(io::Error::from(io::ErrorKind::PermissionDenied))
            } else {
                root.open_dir(rel)
            }
        };
        let tree =
            f.ws.tree_with("", TreeLimits::default(), &failing)
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
            f.ws.tree_with("", TreeLimits::default(), &removing)
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

    #[test]
    fn missing_workspace_is_session_lost() {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().join("s2").join("workspace");
        let ws = Workspace::new(&dir, UID, GID);
        assert!(!ws.exists());
        let e = ws.read("x", 0, None, 10).expect_err("lost");
        assert!(matches!(e, FileError::WorkspaceMissing));
        assert_eq!((e.code().as_str(), e.status()), ("session_lost", 410));
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
        assert_eq!((e.code().as_str(), e.status()), ("permission_denied", 403));
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
}

/// Properties of the lexical path normalization every file route goes through, on arbitrary
/// input: it never panics, and what it accepts stays in the workspace.
#[cfg(test)]
mod normalize_props {
    use proptest::prelude::*;

    use super::{FileError, normalize};

    /// Paths made of the parts that matter (`..`, `.`, empty, the mount point, NUL, a
    /// backslash, unicode), joined by `/`, sometimes absolute.
    fn tricky_path() -> impl Strategy<Value = String> {
        let part = prop_oneof![
            Just("..".to_owned()),
            Just(".".to_owned()),
            Just(String::new()),
            Just("workspace".to_owned()),
            Just("a\0b".to_owned()),
            Just("..\\..".to_owned()),
            "[a-z.é]{1,4}",
        ];
        (any::<bool>(), prop::collection::vec(part, 0..8)).prop_map(|(absolute, parts)| {
            format!("{}{}", if absolute { "/" } else { "" }, parts.join("/"))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn never_panics_on_any_string(path in any::<String>()) {
            let _ = normalize(&path);
        }

        #[test]
        fn accepted_paths_stay_below_the_root(path in tricky_path()) {
            if let Ok(comps) = normalize(&path) {
                let joined = comps.join("/");
                prop_assert!(!joined.starts_with('/'), "{path:?} -> {joined:?}");
                for c in &comps {
                    prop_assert!(c != ".." && c != "." && !c.is_empty(), "{path:?} -> {comps:?}");
                    prop_assert!(!c.contains('/') && !c.contains('\0'), "{path:?} -> {comps:?}");
                }
                // Normalizing again changes nothing.
                prop_assert_eq!(normalize(&joined).ok(), Some(comps));
            }
        }

        #[test]
        fn refuses_exactly_what_climbs_out_or_is_elsewhere(path in tricky_path()) {
            let relative = match path.strip_prefix("/workspace") {
                Some(rest) if rest.is_empty() || rest.starts_with('/') => Some(rest),
                _ if path.starts_with('/') => None,
                _ => Some(path.as_str()),
            };
            let mut depth = 0i64;
            let mut climbs = false;
            for c in relative.unwrap_or_default().split('/') {
                match c {
                    "" | "." => {}
                    ".." => {
                        depth -= 1;
                        climbs |= depth < 0;
                    }
                    _ => depth += 1,
                }
            }
            match normalize(&path) {
                Ok(_) => prop_assert!(relative.is_some() && !climbs && !path.contains('\0'), "{path:?} accepted"),
                Err(FileError::InvalidPath { .. }) => {
                    prop_assert!(relative.is_none() || path.contains('\0'), "{path:?} invalid")
                }
                Err(FileError::OutsideWorkspace { .. }) => prop_assert!(climbs, "{path:?} outside"),
                Err(other) => prop_assert!(false, "{path:?}: unexpected {other}"),
            }
        }
    }
}
