//! Why a file operation failed, as a [`FileError`]: what happened and to which path. The `/v1`
//! API gives each its status and code (`crate::http::error`), the wire surface the Python
//! exception its client raises.

use std::io;

/// Why a file operation failed.
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
    /// The operation was stopped before it was done: past its deadline, or its client went
    /// away (see [`deadline`](super::deadline)).
    #[error("'{path}': {stop}")]
    Stopped {
        /// The path as given.
        path: String,
        /// Why.
        stop: super::deadline::Stop,
    },
    /// The bytes the operation would hold do not fit sandboxd's budget of bytes in flight now.
    #[error("'{path}': {why}")]
    Busy {
        /// The path as given.
        path: String,
        /// Which budget is full, in words.
        why: String,
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
    pub(super) fn within(self, size_limit: Option<u64>) -> Self {
        match self {
            Self::NoSpace { path, limit } => Self::NoSpace {
                path,
                limit: limit.or(size_limit),
            },
            other => other,
        }
    }
}
