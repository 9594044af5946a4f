//! Writes: a whole file at once, or streamed through a [`PendingWrite`]; atomic, owned by the
//! sandbox user, and every created folder owned too.

use super::*;
use std::ffi::OsStr;
use std::io::{self, Write};
use std::os::fd::AsFd as _;
use std::os::unix::fs::{PermissionsExt as _, fchown};

use cap_std::fs::{Dir, MetadataExt as _, OpenOptions, OpenOptionsExt as _};
use rustix::fs::OFlags;
use serde::{Deserialize, Serialize};

/// What [`Workspace::write`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteResult {
    /// The size of the file written.
    pub size: u64,
}

impl Workspace {
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

    pub(super) fn start_write(&self, path: &str) -> Result<PendingWrite, FileError> {
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
        let place =
            view::resolve(&root, &comps, true, Some(&create)).map_err(|r| refused(path, r))?;
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

    /// Creates directory `name` in `dir`, owned by uid:gid with mode 0755, and opens it. The
    /// sandbox may swap something else in between the mkdir and the open: a FIFO, a symlink
    /// or a file there is refused at once as not a directory (opened with
    /// `O_NOFOLLOW|O_DIRECTORY|O_NONBLOCK`, it can neither hang nor lead anywhere).
    pub(super) fn create_owned_dir(&self, dir: &Dir, name: &str) -> io::Result<Dir> {
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
pub(super) fn open_created_dir(dir: &Dir, name: &str) -> io::Result<std::fs::File> {
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
pub(super) const WRITE_PIECE: usize = 1024 * 1024;

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
