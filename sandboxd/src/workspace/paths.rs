//! Paths as the API spells them and as the sandbox sees them: normalized lexically, then
//! opened one component at a time below the workspace root, as the sandbox user.

use super::*;
use std::io;

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use rustix::fs::OFlags;

use crate::workspace::view::Refusal;

/// Where the workspace is mounted inside the container; the agent's absolute paths start here.
pub(super) const MOUNT_POINT: &str = "/workspace";

/// What is shown as the path of the workspace directory itself in errors.
pub(super) const ROOT_SHOWN: &str = "/workspace";

impl Workspace {
    /// Opens the workspace directory; its absence means the session is lost.
    pub(super) fn open_root(&self) -> Result<Dir, FileError> {
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
    pub(super) fn ensure_dirs(
        &self,
        root: &Dir,
        comps: &[String],
        path: &str,
    ) -> Result<Dir, FileError> {
        let create = |dir: &Dir, name: &str| self.create_owned_dir(dir, name);
        let place =
            view::resolve(root, comps, true, Some(&create)).map_err(|r| refused(path, r))?;
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
    pub(super) fn open_dir_followed(
        &self,
        root: &Dir,
        comps: &[String],
        path: &str,
    ) -> Result<Dir, FileError> {
        let place = view::resolve(root, comps, true, None).map_err(|r| refused(path, r))?;
        let Some(name) = place.name else {
            return Ok(place.dir);
        };
        view::open_one(&place.dir, &name, OFlags::PATH | OFlags::DIRECTORY)
            .map(Dir::from_std_file)
            .map_err(|e| map_io(path, e))
    }

    /// Runs `op` as the sandbox user ([`identity`]) and returns what it did, unless this thread
    /// already acts as that user: then `None`, and the caller goes on itself.
    pub(super) fn hop<T: Send>(
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
}

/// Opens the regular file `comps` below `root` for reading, following links as the container
/// would. A directory is [`FileError::IsADirectory`]; a FIFO, socket or device is
/// [`FileError::NotRegularFile`], answered without opening it (so without blocking).
pub(super) fn open_regular(
    root: &Dir,
    comps: &[String],
    path: &str,
) -> Result<std::fs::File, FileError> {
    let place = view::resolve(root, comps, true, None).map_err(|r| refused(path, r))?;
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
pub(super) fn refused(path: &str, r: Refusal) -> FileError {
    match r {
        Refusal::Outside => FileError::OutsideWorkspace { path: shown(path) },
        Refusal::Loop => invalid(path, "too many levels of symbolic links (a symlink loop?)"),
        Refusal::Io(e) => map_io(path, e),
    }
}

/// The components of `path` below the workspace root, `..` kept (for a walk that resolves it
/// where links led). Accepts the agent's `/workspace/...` spelling; refuses NUL bytes and other
/// absolute paths.
pub(super) fn components(path: &str) -> Result<Vec<String>, FileError> {
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
pub(super) fn normalize(path: &str) -> Result<Vec<String>, FileError> {
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

/// `path` as a path below the workspace root (`a/b`, `` for the root), `.` and `..` resolved
/// lexically; refused as [`normalize`] refuses. For what names a place in the sandbox rather
/// than opens it here (a folder to watch).
pub fn workspace_relative(path: &str) -> Result<String, FileError> {
    Ok(normalize(path)?.join("/"))
}

/// `path` fit to be shown in a message (NUL bytes spelled out).
pub(super) fn shown(path: &str) -> String {
    path.replace('\0', "\\0")
}

/// [`FileError::InvalidPath`] for `path`.
pub(super) fn invalid(path: &str, reason: &str) -> FileError {
    FileError::InvalidPath {
        path: shown(path),
        reason: reason.to_owned(),
    }
}

/// Whether `e` is cap-std refusing a resolution that leaves the directory: cap-std reports
/// that as a `PermissionDenied` error that carries no OS error code.
pub(super) fn is_escape(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied && e.raw_os_error().is_none()
}

/// Whether `e` is ELOOP: too many levels of symbolic links.
pub(super) fn is_symlink_loop(e: &io::Error) -> bool {
    // `ErrorKind::FilesystemLoop` is unstable; ELOOP is 40 on the Linux targets sandboxd runs on.
    (cfg!(target_os = "linux") && e.raw_os_error() == Some(40))
        || format!("{:?}", e.kind()) == "FilesystemLoop"
}

/// The [`FileError`] for an I/O error on `path`.
pub(super) fn map_io(path: &str, e: io::Error) -> FileError {
    let path = shown(path);
    if let Some(stop) = super::deadline::stop_of(&e) {
        return FileError::Stopped { path, stop };
    }
    if let Some(why) = super::deadline::busy_of(&e) {
        return FileError::Busy { path, why };
    }
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
