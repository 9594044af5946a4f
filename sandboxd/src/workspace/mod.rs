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

pub mod deadline;
pub mod disk;
mod error;
pub mod identity;
mod operations;
mod paths;
#[cfg(test)]
mod tests;
pub mod trash;
mod tree;
pub mod view;
mod writes;

pub use error::FileError;
pub use operations::{ReadResult, RemoveResult};
pub use paths::workspace_relative;
use paths::*;
use tree::*;
pub use tree::{EXCLUDED_NAMES, EXCLUDED_PREFIXES, ListRules, TreeLimits, TreeOptions};
pub use writes::{PendingWrite, WriteResult};

use std::os::unix::fs::{PermissionsExt as _, fchown};
use std::path::{Path, PathBuf};

use crate::workspace::trash::Trash;
pub use sandboxd_api::files::{Entry, EntryKind, Listing, MAX_LIST_ENTRIES, Tree};

/// Mode of the files sandboxd creates.
const FILE_MODE: u32 = 0o644;
/// Mode of the directories sandboxd creates (and of the workspace directory).
const DIR_MODE: u32 = 0o755;

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
}
