//! What every file operation of both HTTP surfaces does around the operation itself: the actor
//! the request's headers name, the operation run off the async runtime, and its row in the
//! audit log (outcome, bytes, duration). The surfaces keep what differs between them: which
//! token opens a session, and the shape of an error.

use std::time::Instant;

use axum::http::HeaderMap;
use sandboxd_api::headers::{AGENT_HEADER, RUN_HEADER};
use tokio::task::JoinError;

use crate::service::{Actor, Core, Outcome};
use crate::storage::audit::Op;
use crate::workspace::FileError;

/// The agent and run a request names in `X-Sandbox-Agent` and `X-Sandbox-Run`, for the audit
/// log (blank values are none).
pub(crate) fn actor(headers: &HeaderMap) -> Actor {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    Actor {
        agent: get(AGENT_HEADER),
        run: get(RUN_HEADER),
    }
}

/// The audit outcome of a file operation: ok with `bytes` of it, or the code it failed with.
pub(crate) fn file_outcome<T>(
    result: &Result<T, FileError>,
    bytes: impl Fn(&T) -> Option<i64>,
) -> Outcome {
    match result {
        Ok(v) => Outcome {
            ok: true,
            bytes: bytes(v),
            ..Outcome::default()
        },
        Err(e) => Outcome {
            ok: false,
            error: Some(e.code().to_string()),
            ..Outcome::default()
        },
    }
}

/// One audited file operation: `op` on `target` in session `id`, timed from `started`.
pub(crate) struct FileOp<'a> {
    /// The core that records it.
    pub(crate) core: &'a Core,
    /// The session.
    pub(crate) id: &'a str,
    /// The request's headers (the actor).
    pub(crate) headers: &'a HeaderMap,
    /// The operation.
    pub(crate) op: Op,
    /// Its target as the request named it.
    pub(crate) target: &'a str,
    /// When the surface started timing it.
    pub(crate) started: Instant,
}

impl FileOp<'_> {
    /// Runs `op` on a blocking thread and records its outcome, with `bytes` of a success. A task
    /// that did not finish (it panicked) is recorded nowhere: the surface answers 500.
    pub(crate) async fn run<T: Send + 'static>(
        self,
        op: impl FnOnce() -> Result<T, FileError> + Send + 'static,
        bytes: impl Fn(&T) -> Option<i64>,
    ) -> Result<Result<T, FileError>, JoinError> {
        let done = tokio::task::spawn_blocking(op).await?;
        self.core.record(
            self.id,
            &actor(self.headers),
            self.op,
            self.target,
            file_outcome(&done, bytes),
            self.started,
        );
        Ok(done)
    }
}
