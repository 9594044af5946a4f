//! Listings and the walk of a tree: one directory read at a time, bounded, with the excluded
//! names and prefixes left out.

use super::*;
use std::collections::VecDeque;
use std::io;

use cap_std::fs::{Dir, Metadata, MetadataExt as _};
use chrono::DateTime;
use serde::{Deserialize, Serialize};

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

/// What a listing shows of each directory it reads, and in which order: the rules of
/// [`Workspace::list_as`] and of every directory a [`Workspace::tree_as`] walk reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListRules {
    /// Leave out [`EXCLUDED_NAMES`] and [`EXCLUDED_PREFIXES`] (before they count against the
    /// listing's bound).
    pub exclude: bool,
    /// Show only files and directories: a symlink, FIFO, socket or device is read (it counts
    /// against the listing's bound) and then left out.
    pub files_and_dirs_only: bool,
    /// Directories first, then files, each by name; otherwise all by name.
    pub dirs_first: bool,
}

impl ListRules {
    /// `/v1`'s listing and tree: the excluded names and prefixes left out, the rest by name.
    pub const EXCLUDING: Self = Self {
        exclude: true,
        files_and_dirs_only: false,
        dirs_first: false,
    };
    /// Everything, each symlink as itself, by name (as `ls -A`).
    pub const ALL: Self = Self {
        exclude: false,
        files_and_dirs_only: false,
        dirs_first: false,
    };
    /// The reads of a stored workspace (the wire protocol's `/workspaces` routes): nothing
    /// excluded, only files and directories, directories first.
    pub const ARCHIVE: Self = Self {
        exclude: false,
        files_and_dirs_only: true,
        dirs_first: true,
    };
}

/// How a [`Workspace::tree_as`] walk reads and bounds the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeOptions {
    /// Its bounds.
    pub limits: TreeLimits,
    /// What it shows of each directory.
    pub rules: ListRules,
    /// A directory met at the depth limit makes the walk incomplete even when it is empty (the
    /// archive reads' rule); otherwise only one that holds something the walk would list.
    pub any_dir_at_depth_limit: bool,
}

impl TreeOptions {
    /// `/v1`'s tree ([`Workspace::tree`]): [`ListRules::EXCLUDING`], and only a directory that
    /// holds something counts as cut off at the depth limit.
    pub fn excluding(limits: TreeLimits) -> Self {
        Self {
            limits,
            rules: ListRules::EXCLUDING,
            any_dir_at_depth_limit: false,
        }
    }

    /// The walk of a stored workspace (the wire protocol's `tree`): [`ListRules::ARCHIVE`], and
    /// any directory at the depth limit counts as cut off.
    pub fn archive(limits: TreeLimits) -> Self {
        Self {
            limits,
            rules: ListRules::ARCHIVE,
            any_dir_at_depth_limit: true,
        }
    }
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

impl Workspace {
    /// Walks the directory at `path` breadth-first, at most `limits.max_depth` levels and
    /// `limits.max_entries` entries, leaving out the excluded names and prefixes and not
    /// descending into symlinked directories. A subdirectory that cannot be read is skipped and
    /// reported in [`Tree::skipped`]; only an unreadable starting directory is an error.
    pub fn tree(&self, path: &str, limits: TreeLimits) -> Result<Tree, FileError> {
        self.tree_as(path, TreeOptions::excluding(limits))
    }

    /// [`Workspace::tree`] with the rules of `options`: what each directory shows, in which
    /// order, and what counts as cut off at the depth limit. The one walk of a workspace's tree:
    /// its entries breadth-first, each directory's in the order of `options.rules`; it is
    /// [`Tree::incomplete`] when a bound was reached, a directory's listing was cut (its entries
    /// read up to what the walk could still list), or a subdirectory could not be read.
    pub fn tree_as(&self, path: &str, options: TreeOptions) -> Result<Tree, FileError> {
        if let Some(hop) = self.hop(|| self.tree_as(path, options)) {
            return hop;
        }
        self.tree_with(path, options, &|root: &Dir, rel: &str| root.open_dir(rel))
    }

    /// [`Workspace::tree_as`], with the opening of subdirectories (by their path relative to
    /// the workspace root) given, so that tests can make one fail.
    pub(super) fn tree_with(
        &self,
        path: &str,
        options: TreeOptions,
        open_subdir: &dyn Fn(&Dir, &str) -> io::Result<Dir>,
    ) -> Result<Tree, FileError> {
        let TreeOptions {
            limits,
            rules,
            any_dir_at_depth_limit,
        } = options;
        let comps = normalize(path)?;
        let start_rel = comps.join("/");
        let root = self.open_root()?;
        let start = self.open_dir_followed(&root, &comps, path)?;
        // Each folder is read only as far as the entries still to list (and one more, to know
        // whether the limit was reached): a huge folder costs no more than the limit.
        let budget = limits.max_entries.saturating_add(1);
        let (first, mut cut) =
            list_dir(&start, &start_rel, &start_rel, budget, rules).map_err(|e| map_io(path, e))?;
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
            if let Some(stop) = super::deadline::stopped() {
                return Err(FileError::Stopped {
                    path: path.to_owned(),
                    stop,
                });
            }
            let listed = match next {
                Pending::Listed(listed) => listed,
                Pending::Dir { rel, id } => {
                    let budget = limits
                        .max_entries
                        .saturating_sub(tree.entries.len())
                        .saturating_add(1);
                    let read = open_subdir(&root, &rel)
                        .and_then(|dir| same_dir(dir, id))
                        .and_then(|dir| list_dir(&dir, &rel, &start_rel, budget, rules));
                    match read {
                        Ok((listed, more)) => {
                            cut |= more;
                            listed
                        }
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
                    } else if any_dir_at_depth_limit
                        || !tree.depth_limit_reached
                            && has_entries(&root, &item.entry.path, &start_rel, rules, open_subdir)
                    {
                        tree.depth_limit_reached = true;
                    }
                }
                tree.entries.push(item.entry);
            }
        }
        // A listing cut at its budget with nothing left out of it fills the budget, so the
        // entry limit is reached too; only a listing that left entries out (links, with
        // [`ListRules::files_and_dirs_only`]) is cut without it.
        tree.incomplete =
            tree.depth_limit_reached || tree.entry_limit_reached || !tree.skipped.is_empty() || cut;
        Ok(tree)
    }
}

/// A directory waiting in the breadth-first walk of [`Workspace::tree`].
pub(super) enum Pending {
    /// Already read (the starting directory).
    Listed(Vec<Listed>),
    /// To be opened by its path relative to the workspace root; `id` is the (device, inode)
    /// seen when it was listed, so a directory swapped for a symlink is not descended into.
    Dir { rel: String, id: (u64, u64) },
}

/// An entry of a directory listing, with its (device, inode).
pub(super) struct Listed {
    pub(super) entry: Entry,
    pub(super) id: (u64, u64),
}

/// Checks that `dir` is the directory with (device, inode) `id`.
pub(super) fn same_dir(dir: Dir, id: (u64, u64)) -> io::Result<Dir> {
    let meta = dir.dir_metadata()?;
    if (meta.dev(), meta.ino()) == id {
        Ok(dir)
    } else {
        Err(io::Error::other(
            "the directory changed while it was walked",
        ))
    }
}

/// Whether the directory at `rel` has any entry that `rules` would not exclude.
pub(super) fn has_entries(
    root: &Dir,
    rel: &str,
    start_rel: &str,
    rules: ListRules,
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
        !(rules.exclude && is_excluded(start_rel, &child_path(rel, &name), &name))
    })
}

/// Lists `dir` (at `dir_rel` below the workspace root) as `rules` say, for a listing asked for
/// at `start_rel`: at most `max` entries read, and whether there were more.
pub(super) fn list_dir(
    dir: &Dir,
    dir_rel: &str,
    start_rel: &str,
    max: usize,
    rules: ListRules,
) -> io::Result<(Vec<Listed>, bool)> {
    let (mut listed, more) = read_dir_bounded(dir, dir_rel, max, |path, name| {
        rules.exclude && is_excluded(start_rel, path, name)
    })?;
    if rules.files_and_dirs_only {
        listed.retain(|item| matches!(item.entry.kind, EntryKind::Dir | EntryKind::File));
    }
    if rules.dirs_first {
        // Stable: each kind stays in the order of its names.
        listed.sort_by_key(|item| item.entry.kind != EntryKind::Dir);
    }
    Ok((listed, more))
}

/// Reads `dir` (at `dir_rel`) lazily, leaving out what `skip(path, name)` says: at most `max`
/// entries, each described (`fstatat`), sorted by name, and whether there were more. Reading
/// stops at the first entry past `max`, so neither the names nor the descriptions of a huge
/// folder are ever all gathered.
pub(super) fn read_dir_bounded(
    dir: &Dir,
    dir_rel: &str,
    max: usize,
    skip: impl Fn(&str, &str) -> bool,
) -> io::Result<(Vec<Listed>, bool)> {
    let mut listed = Vec::new();
    let mut more = false;
    for item in dir.entries()? {
        let item = item?;
        super::deadline::check()?;
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
pub(super) fn is_excluded(start_rel: &str, path: &str, name: &str) -> bool {
    EXCLUDED_NAMES.contains(&name)
        || EXCLUDED_PREFIXES
            .iter()
            .any(|prefix| under_prefix(path, prefix) && !under_prefix(start_rel, prefix))
}

/// Whether `path` is the directory `prefix` names (`skills/`) or is under it.
pub(super) fn under_prefix(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix.trim_end_matches('/'))
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// `name` in the directory at `dir_rel`.
pub(super) fn child_path(dir_rel: &str, name: &str) -> String {
    if dir_rel.is_empty() {
        name.to_owned()
    } else {
        format!("{dir_rel}/{name}")
    }
}

/// What `meta` describes, not following symlinks.
pub(super) fn kind_of(meta: &Metadata) -> EntryKind {
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
pub(super) fn entry_of(name: String, path: String, meta: &Metadata) -> Entry {
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
