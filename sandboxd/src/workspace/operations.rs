//! The operations on a workspace that are neither a write nor a walk: read, remove, mkdir,
//! stat, list and realpath.

use super::*;
use std::ffi::OsStr;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::AsFd as _;

use serde::{Deserialize, Serialize};

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

/// What [`Workspace::remove`] removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveResult {
    /// The path removed, relative to the workspace root.
    pub path: String,
    /// What it was (a symlink is removed itself, never its target).
    pub kind: EntryKind,
}

impl Workspace {
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
        // The bytes come out of the budget of bytes in flight before they are read.
        super::deadline::reserve(wanted).map_err(|e| map_io(path, e))?;
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
        self.list_as(path, max_entries, ListRules::EXCLUDING)
    }

    /// Lists the directory at `path` (one level) as `rules` say: at most `max_entries` entries
    /// read, the listing marked truncated when there were more.
    pub fn list_as(
        &self,
        path: &str,
        max_entries: usize,
        rules: ListRules,
    ) -> Result<Listing, FileError> {
        if let Some(hop) = self.hop(|| self.list_as(path, max_entries, rules)) {
            return hop;
        }
        let comps = normalize(path)?;
        let rel = comps.join("/");
        let root = self.open_root()?;
        let dir = self.open_dir_followed(&root, &comps, path)?;
        let (listed, truncated) =
            list_dir(&dir, &rel, &rel, max_entries, rules).map_err(|e| map_io(path, e))?;
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
        let place = view::resolve(&root, &comps, true, None).map_err(|r| refused(path, r))?;
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
        self.list_as(path, max_entries, ListRules::ALL)
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
}
