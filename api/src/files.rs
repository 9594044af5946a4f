//! Files and folders of a workspace as the API shows them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The most entries one listing returns ([`Workspace::list`], the wire surface's listings): a
/// folder with more is listed in part (the first entries the directory yields, sorted by name)
/// and the listing is marked truncated. Only as many entries as are returned are read and
/// described, so a folder of a million files costs what one of ten thousand does.
pub const MAX_LIST_ENTRIES: usize = 10_000;

/// What a file, directory or link is. Symlinks are never followed to decide it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (the link itself, whatever it points at).
    Symlink,
    /// Anything else: FIFO, socket, device.
    Other,
}

/// One file, directory or link of the workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Entry {
    /// The last component of the path (empty for the workspace root).
    pub name: String,
    /// The path relative to the workspace root, `/`-separated (empty for the root).
    pub path: String,
    /// What it is, not following symlinks.
    pub kind: EntryKind,
    /// Its size in bytes (for a symlink, the length of its target).
    pub size: u64,
    /// When it was last modified, serialized as RFC 3339.
    pub modified: Option<DateTime<Utc>>,
    /// Its permission bits (`0o7777` at most; the file type is in `kind`).
    pub mode: u32,
}

/// One folder's entries, as [`Workspace::list`] and [`Workspace::list_all`] return them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Listing {
    /// The entries, sorted by name.
    pub entries: Vec<Entry>,
    /// The folder holds more entries than were listed (the entry limit was reached).
    #[serde(default)]
    pub truncated: bool,
}

/// The result of a [`Workspace::tree`] walk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Tree {
    /// The starting directory, relative to the workspace root (empty for the root).
    pub root: String,
    /// The entries, breadth-first, each directory's entries sorted by name.
    pub entries: Vec<Entry>,
    /// A directory at the last level had entries that were not listed.
    pub depth_limit_reached: bool,
    /// More entries were there than `max_entries`.
    pub entry_limit_reached: bool,
    /// The depth limit applied.
    pub max_depth: usize,
    /// The entry limit applied.
    pub max_entries: usize,
    /// The entries are not the whole tree: a limit was reached or a directory was skipped.
    pub incomplete: bool,
    /// Directories that could not be read and were skipped, relative to the workspace root.
    pub skipped: Vec<String>,
}
