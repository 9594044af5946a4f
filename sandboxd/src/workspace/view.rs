//! Paths resolved as the sandbox sees them.
//!
//! Inside its container the agent sees the workspace at `/workspace`, so a symlink it makes
//! (`latest -> /workspace/build/v3`) means a path under the workspace, and `..` from
//! `/workspace` is the container's `/`. On the host the same link would lead to the host's
//! `/workspace`. This module walks a path below a workspace directory the way the container's
//! kernel would: a link with an absolute target starts again at the container's `/`, where only
//! `workspace` (the workspace root) leads back in; a relative target continues in the link's
//! directory; `..` climbs from where a link led, not from how it was spelled. What leads out
//! of the workspace (`/etc`, `..` above the root to anything but `workspace`) is
//! [`Refusal::Outside`]; more than [`MAX_SYMLINK_HOPS`] links is [`Refusal::Loop`].
//!
//! The walk never opens a path by name. Each step opens one component relative to the
//! directory handle of the step before with `openat2(2)` and `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS` (and `O_NOFOLLOW`): the kernel refuses to
//! follow any link or leave that directory, so a component swapped for a link mid-walk is seen
//! as the link it now is and its target read from the handle just opened. `..` is never handed
//! to the kernel: it pops the stack of directory handles this walk opened. So a link swapped
//! while it is followed cannot lead out, whatever the agent does meanwhile.
//!
//! `RESOLVE_IN_ROOT` alone is not enough here: it resolves an absolute target against the
//! directory given, so with the workspace as that directory `/workspace/x` would be
//! `{workspace}/workspace/x`, and with the session folder as that directory the folders beside
//! the workspace (the agent's socket) would become reachable.

use std::collections::VecDeque;
use std::io;

use cap_std::fs::Dir;
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};

/// How many symlinks one walk follows before giving up (as Linux's `MAXSYMLINKS`).
pub const MAX_SYMLINK_HOPS: usize = 40;

/// The name of the workspace in the container's `/`.
const MOUNT_NAME: &str = "workspace";

/// Why a walk stopped.
#[derive(Debug)]
pub enum Refusal {
    /// The path, or a link on it, leads outside the workspace.
    Outside,
    /// Too many levels of symbolic links.
    Loop,
    /// A step failed (missing, not a directory, permission denied, …).
    Io(io::Error),
}

impl From<io::Error> for Refusal {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

impl From<rustix::io::Errno> for Refusal {
    fn from(e: rustix::io::Errno) -> Self {
        Self::Io(e.into())
    }
}

/// Where a walk ended: the directory holding the last component, and that component.
#[derive(Debug)]
pub struct Place {
    /// The directory holding `name` (the workspace root when `name` is `None`).
    pub dir: Dir,
    /// The real path of `dir` below the workspace root, as components.
    pub dir_comps: Vec<String>,
    /// The last component, which may not exist; `None` when the place is the root itself.
    pub name: Option<String>,
}

impl Place {
    /// The real path of the place below the workspace root, as components.
    pub fn comps(&self) -> Vec<String> {
        let mut comps = self.dir_comps.clone();
        comps.extend(self.name.iter().cloned());
        comps
    }
}

/// Creates a missing directory `name` in `dir` on the way and opens it.
pub type Create<'a> = &'a dyn Fn(&Dir, &str) -> io::Result<Dir>;

/// Opens one component `name` of `dir`, following no link and never leaving `dir`.
pub fn open_one(dir: &Dir, name: &str, flags: OFlags) -> io::Result<std::fs::File> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("'{name}' is not a single path component"),
        ));
    }
    let fd = rustix::fs::openat2(
        dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?;
    Ok(std::fs::File::from(fd))
}

/// What `handle` (opened by [`open_one`]) is, not following it.
fn kind(handle: &std::fs::File) -> io::Result<FileType> {
    Ok(FileType::from_raw_mode(rustix::fs::fstat(handle)?.st_mode))
}

/// The target of the symlink `handle` (an `O_PATH` handle of the link itself).
fn target(handle: &std::fs::File) -> Result<String, Refusal> {
    let target = rustix::fs::readlinkat(handle, "", Vec::new())?;
    target.into_string().map_err(|_| {
        Refusal::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            "a symlink on it has a target that is not UTF-8",
        ))
    })
}

/// Puts the components of a link's target in front of what is left to walk; an absolute
/// target starts again at the container's `/`.
fn splice(rest: &mut VecDeque<String>, chain: &mut Vec<(String, Dir)>, above: &mut bool, t: &str) {
    if t.starts_with('/') {
        chain.clear();
        *above = true;
    }
    for part in t.split('/').rev() {
        if !part.is_empty() && part != "." {
            rest.push_front(part.to_owned());
        }
    }
}

/// A state of a walk: the directories entered (below the root) and whether it stands at the
/// container's `/`, above the workspace.
struct Walk<'r> {
    root: &'r Dir,
    chain: Vec<(String, Dir)>,
    above: bool,
    hops: usize,
}

impl<'r> Walk<'r> {
    fn new(root: &'r Dir) -> Self {
        Self {
            root,
            chain: Vec::new(),
            above: false,
            hops: 0,
        }
    }

    fn here(&self) -> &Dir {
        self.chain.last().map_or(self.root, |(_, d)| d)
    }

    fn names(&self) -> Vec<String> {
        self.chain.iter().map(|(n, _)| n.clone()).collect()
    }

    /// `..`: one directory up; above the root is the container's `/`.
    fn up(&mut self) {
        if self.above || self.chain.pop().is_none() {
            self.above = true;
        }
    }

    /// At the container's `/`: `workspace` leads back in, anything else out.
    fn enter_from_above(&mut self, comp: &str) -> Result<(), Refusal> {
        if comp == MOUNT_NAME {
            self.above = false;
            Ok(())
        } else {
            Err(Refusal::Outside)
        }
    }

    fn follow(&mut self, link: &std::fs::File, rest: &mut VecDeque<String>) -> Result<(), Refusal> {
        self.hops += 1;
        if self.hops > MAX_SYMLINK_HOPS {
            return Err(Refusal::Loop);
        }
        let t = target(link)?;
        splice(rest, &mut self.chain, &mut self.above, &t);
        Ok(())
    }

    fn place(mut self, name: Option<String>) -> Result<Place, Refusal> {
        let dir_comps = self.names();
        let dir = match self.chain.pop() {
            Some((_, dir)) => dir,
            None => self.root.try_clone()?,
        };
        Ok(Place {
            dir,
            dir_comps,
            name,
        })
    }
}

/// Resolves `comps` (below the workspace `root`; `..` allowed) to a place as the container
/// would, one component at a time (one path: the walk of a tree is
/// [`crate::workspace::Workspace::tree_as`]), following every link on the way and, with
/// `follow_last`, a link at the end too. A missing last component is fine (the place names
/// it); a missing directory on the way is created with `create` when given, else a `NotFound`
/// error. A directory missing behind a link met on the way (`dangling/sub`) is never created
/// (as `mkdir -p` refuses it); one on the way to where a link at the end leads is (a write
/// through a dangling link makes its target).
pub fn resolve(
    root: &Dir,
    comps: &[String],
    follow_last: bool,
    create: Option<Create<'_>>,
) -> Result<Place, Refusal> {
    let mut rest: VecDeque<String> = comps.iter().cloned().collect();
    let mut w = Walk::new(root);
    // How many components at the front of `rest` came from a link met on the way.
    let mut from_link = 0usize;
    while let Some(comp) = rest.pop_front() {
        let behind_link = from_link > 0;
        from_link = from_link.saturating_sub(1);
        if comp == ".." {
            w.up();
            continue;
        }
        if w.above {
            w.enter_from_above(&comp)?;
            continue;
        }
        let last = rest.is_empty();
        if last && !follow_last {
            return w.place(Some(comp));
        }
        let handle = match open_one(w.here(), &comp, OFlags::PATH) {
            Ok(handle) => handle,
            Err(e) if e.kind() == io::ErrorKind::NotFound && last => {
                return w.place(Some(comp));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => match create {
                Some(create) if !behind_link => {
                    let made = create(w.here(), &comp)?;
                    w.chain.push((comp, made));
                    continue;
                }
                _ => return Err(e.into()),
            },
            Err(e) => return Err(e.into()),
        };
        match kind(&handle)? {
            FileType::Symlink => {
                let before = rest.len();
                w.follow(&handle, &mut rest)?;
                from_link = if last {
                    0
                } else {
                    from_link + rest.len() - before
                };
            }
            FileType::Directory if !last => w.chain.push((comp, Dir::from_std_file(handle))),
            _ if last => return w.place(Some(comp)),
            _ => return Err(io::Error::from(io::ErrorKind::NotADirectory).into()),
        }
    }
    if w.above {
        return Err(Refusal::Outside);
    }
    // The walk ended on a directory it entered (a trailing `..`, or a link to a directory).
    match w.chain.pop() {
        Some((name, _)) => w.place(Some(name)),
        None => w.place(None),
    }
}

/// The real path of `comps` below the workspace `root`, as `os.path.realpath(strict=False)`
/// resolves it in the container: every link followed, `..` climbing from where a link led,
/// and what does not exist (or cannot be looked at, or lies below a file) kept as written.
pub fn realpath(root: &Dir, comps: &[String]) -> Result<Vec<String>, Refusal> {
    let mut rest: VecDeque<String> = comps.iter().cloned().collect();
    let mut w = Walk::new(root);
    // Components kept as written once the walk left what exists.
    let mut kept: Vec<String> = Vec::new();
    while let Some(comp) = rest.pop_front() {
        if comp == ".." {
            if kept.pop().is_none() {
                w.up();
            }
            continue;
        }
        if !kept.is_empty() {
            kept.push(comp);
            continue;
        }
        if w.above {
            w.enter_from_above(&comp)?;
            continue;
        }
        let handle = match open_one(w.here(), &comp, OFlags::PATH) {
            Ok(handle) => handle,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
                ) =>
            {
                kept.push(comp);
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        match kind(&handle)? {
            FileType::Symlink => w.follow(&handle, &mut rest)?,
            FileType::Directory => w.chain.push((comp, Dir::from_std_file(handle))),
            _ => kept.push(comp),
        }
    }
    if w.above {
        return Err(Refusal::Outside);
    }
    let mut real = w.names();
    real.extend(kept);
    Ok(real)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cap_std::ambient_authority;
    use std::fs;
    use std::os::unix::fs::symlink;

    fn comps(path: &str) -> Vec<String> {
        path.split('/')
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn links_resolve_in_the_containers_view() {
        let temp = tempfile::tempdir().expect("tempdir");
        let ws = temp.path().join("workspace");
        fs::create_dir_all(ws.join("notes")).expect("mkdir");
        fs::create_dir_all(ws.join("workspace/notes")).expect("decoy");
        fs::write(ws.join("notes/a.txt"), b"a").expect("write");
        symlink("/workspace/notes/a.txt", ws.join("abs")).expect("link");
        symlink("/workspace/notes", ws.join("absdir")).expect("link");
        symlink("/workspace/../workspace/notes", ws.join("roundtrip")).expect("link");
        symlink("notes/..", ws.join("dotdot")).expect("link");
        symlink("/etc/passwd", ws.join("out")).expect("link");
        symlink("../secret", ws.join("up")).expect("link");
        symlink("/workspace", ws.join("home")).expect("link");
        symlink("l2", ws.join("l1")).expect("link");
        symlink("l1", ws.join("l2")).expect("link");
        let root = Dir::open_ambient_dir(&ws, ambient_authority()).expect("root");

        let place = resolve(&root, &comps("abs"), true, None).expect("abs");
        assert_eq!(place.comps(), ["notes", "a.txt"]);
        let place = resolve(&root, &comps("absdir/a.txt"), true, None).expect("absdir");
        assert_eq!(place.comps(), ["notes", "a.txt"]);
        let place = resolve(&root, &comps("roundtrip"), true, None).expect("roundtrip");
        assert_eq!(place.comps(), ["notes"]);
        let place = resolve(&root, &comps("home"), true, None).expect("home");
        assert!(place.name.is_none() && place.dir_comps.is_empty());
        // Not followed at the end: the link itself.
        let place = resolve(&root, &comps("abs"), false, None).expect("abs itself");
        assert_eq!(place.comps(), ["abs"]);
        for out in ["out", "up", "home/../etc"] {
            assert!(
                matches!(
                    resolve(&root, &comps(out), true, None),
                    Err(Refusal::Outside)
                ),
                "{out}"
            );
            assert!(
                matches!(realpath(&root, &comps(out)), Err(Refusal::Outside)),
                "{out}"
            );
        }
        assert!(matches!(
            resolve(&root, &comps("l1"), true, None),
            Err(Refusal::Loop)
        ));

        assert_eq!(
            realpath(&root, &comps("abs")).expect("rp"),
            ["notes", "a.txt"]
        );
        assert_eq!(
            realpath(&root, &comps("dotdot")).expect("rp"),
            Vec::<String>::new()
        );
        // `..` after a link climbs from its target.
        assert_eq!(
            realpath(&root, &comps("absdir/..")).expect("rp"),
            Vec::<String>::new()
        );
        assert_eq!(
            realpath(&root, &comps("absdir/../notes/x/../y")).expect("rp"),
            ["notes", "y"]
        );
        assert_eq!(
            realpath(&root, &comps("notes/a.txt/below")).expect("rp"),
            ["notes", "a.txt", "below"]
        );
        assert_eq!(
            realpath(&root, &comps("../workspace/abs")).expect("rp"),
            ["notes", "a.txt"]
        );
        assert!(matches!(realpath(&root, &comps("l1")), Err(Refusal::Loop)));
    }
}
