//! Why a file operation failed: every [`FileError`] has a stable code and an HTTP status.

use std::io;

use sandboxd_api::ErrorCode;

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
    pub(super) fn within(self, size_limit: Option<u64>) -> Self {
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
