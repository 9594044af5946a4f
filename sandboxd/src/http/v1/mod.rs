//! sandboxd's own HTTP API, versioned under `/v1`. JSON in and out; every error is
//! `{"code", "message"}`. The index at `/` (no token) names the service, version and routes
//! (its handlers are the service's, [`crate::http::service`], listed here and in this
//! surface's document, [`openapi`]). The wire protocol is [`crate::http::wire`]: neither
//! surface imports the other; both are served by [`crate::http::router`].

use axum::extract::DefaultBodyLimit;
use axum::routing::{MethodRouter, any, delete, get, post};

use crate::http::audited::Audited;
use crate::http::extract::{Admin, ForSession};
use crate::http::service::{healthz, index, metrics};
use crate::service::Actor;

mod admin;
mod files;
pub mod openapi;
mod ports;
mod runs;
mod sessions;
mod snapshots;
mod terminals;
mod watch;

pub use crate::http::state::{AppState, Caller};
pub use admin::*;
pub use files::*;
pub use ports::*;
pub use runs::*;
pub use sandboxd_api::headers::{AGENT_HEADER, RUN_HEADER};
pub use sandboxd_api::routes::{Index, PUBLIC_ROUTES, ROUTES};
pub use sessions::*;
pub use snapshots::*;
pub use terminals::*;
pub use watch::*;

/// The largest body a file write accepts.
pub const MAX_WRITE_BYTES: usize = 256 * 1024 * 1024;

/// Every path of the `/v1` API, the index, health and metrics, and what serves it:
/// [`crate::http::router`] is built from this table, and a test sends every method of every path of it through that
/// router to check that it serves exactly [`ROUTES`] (the routes the index lists and the
/// operator's version check trusts).
pub(crate) fn paths() -> Vec<(&'static str, MethodRouter<AppState>)> {
    vec![
        ("/", get(index)),
        ("/healthz", get(healthz)),
        ("/metrics", get(metrics)),
        ("/openapi.json", get(openapi::openapi_json)),
        ("/v1/sessions", get(list).post(open)),
        ("/v1/sessions/{id}", get(show).delete(destroy)),
        ("/v1/sessions/{id}/stop", post(stop)),
        ("/v1/sessions/{id}/start", post(start)),
        ("/v1/sessions/{id}/pause", post(pause)),
        ("/v1/sessions/{id}/resume", post(resume)),
        ("/v1/sessions/{id}/reclaim", post(reclaim)),
        ("/v1/sessions/{id}/rebuild", post(rebuild)),
        ("/v1/sessions/{id}/token", post(rotate_token)),
        ("/v1/sessions/{id}/runs", post(run)),
        ("/v1/sessions/{id}/runs/{run_id}", get(run_status)),
        ("/v1/sessions/{id}/runs/{run_id}/stop", post(stop_run)),
        (
            "/v1/sessions/{id}/terminals",
            get(terminals).post(open_terminal),
        ),
        (
            "/v1/sessions/{id}/terminals/{terminal_id}",
            delete(kill_terminal),
        ),
        (
            "/v1/sessions/{id}/terminals/{terminal_id}/attach",
            get(attach_terminal),
        ),
        ("/v1/sessions/{id}/ports", get(ports).post(open_port)),
        (
            "/v1/sessions/{id}/ports/{port}",
            get(port_stream).delete(close_port),
        ),
        ("/v1/sessions/{id}/ports/{port}/", any(to_port_root)),
        ("/v1/sessions/{id}/ports/{port}/{*path}", any(to_port)),
        ("/v1/sessions/{id}/previews", post(open_preview)),
        ("/preview/{token}", get(preview_bare)),
        ("/preview/{token}/", any(to_preview_root)),
        ("/preview/{token}/{*path}", any(to_preview)),
        (
            "/v1/sessions/{id}/files/{*path}",
            get(read_file)
                .put(write_file)
                .delete(remove_file)
                .layer(DefaultBodyLimit::max(MAX_WRITE_BYTES)),
        ),
        ("/v1/sessions/{id}/mkdir", post(mkdir)),
        ("/v1/sessions/{id}/ls", get(ls)),
        ("/v1/sessions/{id}/tree", get(tree)),
        ("/v1/sessions/{id}/watch", get(watch)),
        ("/v1/sessions/{id}/mcp", post(crate::http::mcp::mcp)),
        ("/v1/sessions/{id}/snapshots", post(take_snapshot)),
        (
            "/v1/snapshots/{scope}/{name}",
            get(show_snapshot).delete(delete_snapshot),
        ),
        ("/v1/sessions/{id}/events", get(events)),
        ("/v1/sessions/{id}/egress", get(egress)),
        (
            "/v1/sessions/{id}/credentials",
            axum::routing::put(put_credentials),
        ),
        ("/v1/runtimes", get(runtimes).put(put_runtimes)),
        ("/v1/policy", get(policy).put(put_policy)),
        ("/v1/operations", get(operations)),
        ("/v1/operations/stream", get(operations_stream)),
    ]
}
