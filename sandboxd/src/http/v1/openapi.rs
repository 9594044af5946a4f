//! The OpenAPI 3.1 document of the `/v1` API, the index, health and metrics: generated from the
//! handlers' `#[utoipa::path]` attributes and the request and response types, with the error
//! responses of each route from [`ERRORS`]. Served at `GET /openapi.json` without a token (it
//! describes this version of sandboxd, the same on every host, and holds nothing of a session;
//! the index at `/` lists the routes without a token too), printed by `sandboxd openapi` and
//! committed as `docs/openapi.json`, which a test keeps equal to it.
//!
//! The wire protocol's routes (`crate::http::wire`) have a document of their own,
//! [`crate::http::wire::openapi`] (`GET /wire/openapi.json`, `docs/openapi-wire.json`); what
//! both share is [`crate::http::openapi`]'s.
//!
//! Over 600 lines with its tests: the error table of every route is the document's, kept beside it.

use serde::Serialize;
use utoipa::openapi::OpenApi as Document;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi, ToSchema};

use crate::http::error::ErrorBody;
use crate::http::openapi::{each_operation, pretty, serve};

/// `{id}`: a session.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SessionId {
    /// The session id (its name on this host).
    #[allow(dead_code)]
    id: String,
}

/// `{run_id}`: a run of the session.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct RunId {
    /// The run id (the caller's, or the one sandboxd made).
    #[allow(dead_code)]
    run_id: String,
}

/// `{terminal_id}`: a terminal of the session.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TerminalId {
    /// The terminal id (`term-…`, as its open answered).
    #[allow(dead_code)]
    terminal_id: String,
}

/// `{port}`: a port of the session's sandbox.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct Port {
    /// The port (1 to 65535) on the sandbox's loopback.
    #[allow(dead_code)]
    port: u16,
}

/// `{path}`: the path passed to a port.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct PortPath {
    /// The path of the request to the port, without its leading `/` (the rest of the URL; the
    /// query string is passed on too).
    #[allow(dead_code)]
    path: String,
}

/// `{path}`: a file of the workspace.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct FilePath {
    /// The path relative to the workspace root, `/`-separated (the rest of the URL). `..`,
    /// an absolute path or a symlink out of the workspace is refused.
    #[allow(dead_code)]
    path: String,
}

// `crate::policy` is the old path of `crate::service::policy`: the sentence is part of
// docs/openapi.json, which this move leaves unchanged.
/// The body of `PUT /v1/policy`: any of the live fields ([`crate::policy::LIVE_FIELDS`]).
#[derive(Serialize, ToSchema)]
pub struct PolicyChange {
    /// Sessions this host holds at most.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<u32>,
    /// Sessions one tenant holds at most.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sessions_per_tenant: Option<u32>,
    /// Longest run, seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execute_timeout: Option<u64>,
    /// Largest read, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_read_bytes: Option<u64>,
    /// Output kept per stream of a run, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
}

/// A status and the error codes a route answers it with.
pub type Errors = (u16, &'static [&'static str]);

const AUTH: (u16, &[&str]) = (401, &["unauthorized"]);
const ADMIN: (u16, &[&str]) = (403, &["forbidden"]);
const INTERNAL: (u16, &[&str]) = (500, &["internal"]);
/// A route that starts or wakes a sandbox: its network, runtime or isolation could not be had.
const START_503: (u16, &[&str]) = (
    503,
    &[
        "network_unavailable",
        "runtime_failed",
        "isolation_unavailable",
    ],
);
/// What a wake (`start`, `resume`) may answer.
const WAKE: &[(u16, &[&str])] = &[
    AUTH,
    ADMIN,
    (404, &["session_not_found"]),
    (
        409,
        &[
            "session_opening",
            "session_destroying",
            "session_changed",
            "runtime_preparing",
        ],
    ),
    (410, &["session_lost"]),
    (429, &["host_cap", "tenant_cap"]),
    INTERNAL,
    (502, &["docker_error"]),
    START_503,
    (507, &["host_disk_full"]),
];
/// What a request passed to a port may answer (any method, its root or a path).
const TO_PORT: &[(u16, &[&str])] = &[
    (400, &["bad_request"]),
    AUTH,
    ADMIN,
    (404, &["session_not_found", "port_not_open"]),
    (
        409,
        &[
            "terminals_unavailable",
            "session_opening",
            "session_destroying",
            "session_changed",
            "session_rebuilding",
            "runtime_preparing",
        ],
    ),
    (410, &["session_lost", "session_gone"]),
    (429, &["host_cap", "tenant_cap"]),
    INTERNAL,
    (502, &["port_closed", "docker_error"]),
    START_503,
    (504, &["port_timeout"]),
    (507, &["host_disk_full"]),
];
/// What a request with a preview link may answer: the link's refusals, then what a request
/// passed to a port may (its token is the credential: no 401 of a bearer).
const TO_PREVIEW: &[(u16, &[&str])] = &[
    (400, &["bad_request"]),
    (403, &["preview_invalid", "preview_expired"]),
    (404, &["port_not_open"]),
    (
        409,
        &[
            "terminals_unavailable",
            "session_opening",
            "session_destroying",
            "session_changed",
            "session_rebuilding",
            "runtime_preparing",
        ],
    ),
    (410, &["session_lost", "session_gone"]),
    (429, &["host_cap", "tenant_cap"]),
    INTERNAL,
    (502, &["port_closed", "docker_error"]),
    START_503,
    (504, &["port_timeout"]),
    (507, &["host_disk_full"]),
];
/// A file operation refused a worker or memory, or stopped at its deadline.
const FILE_503: (u16, &[&str]) = (503, &["file_work_busy", "file_work_stopped", "memory_busy"]);
const BODY: [(u16, &[&str]); 2] = [(400, &["bad_request"]), (413, &["too_large"])];

/// The error responses of each route: status and the codes it answers with. Every route but
/// the public ones answers 401 `unauthorized` first; a route with a body answers 400
/// `bad_request` for a body that cannot be read and 413 `too_large` for one over its limit.
pub const ERRORS: &[(&str, &[Errors])] = &[
    ("GET /v1/sessions", &[AUTH, ADMIN, INTERNAL]),
    (
        "POST /v1/sessions",
        &[
            (400, &["bad_request", "unknown_runtime"]),
            AUTH,
            ADMIN,
            (404, &["snapshot_not_found"]),
            (
                409,
                &[
                    "owner_mismatch",
                    "name_taken",
                    "session_opening",
                    "session_destroying",
                    "session_changed",
                    "runtime_preparing",
                ],
            ),
            (410, &["session_lost"]),
            (413, &["too_large"]),
            (422, &["snapshot_corrupt"]),
            (
                429,
                &[
                    "tenant_cap",
                    "host_cap",
                    "tenant_workspaces",
                    "workspace_budget",
                ],
            ),
            INTERNAL,
            (502, &["docker_error", "open_failed"]),
            (
                503,
                &[
                    "network_unavailable",
                    "runtime_failed",
                    "isolation_unavailable",
                    "snapshots_unavailable",
                ],
            ),
            (507, &["host_disk_full"]),
        ],
    ),
    (
        "GET /v1/sessions/{id}",
        &[
            (400, &["bad_request"]),
            AUTH,
            ADMIN,
            (404, &["session_not_found"]),
            INTERNAL,
        ],
    ),
    (
        "DELETE /v1/sessions/{id}",
        &[
            AUTH,
            ADMIN,
            (409, &["owner_mismatch", "session_opening"]),
            INTERNAL,
            (502, &["docker_error"]),
        ],
    ),
    (
        "POST /v1/sessions/{id}/stop",
        &[
            AUTH,
            ADMIN,
            (404, &["session_not_found"]),
            (
                409,
                &["session_opening", "session_destroying", "session_changed"],
            ),
            (410, &["session_lost"]),
            INTERNAL,
            (502, &["docker_error"]),
        ],
    ),
    ("POST /v1/sessions/{id}/start", WAKE),
    (
        "POST /v1/sessions/{id}/pause",
        &[
            AUTH,
            ADMIN,
            (404, &["session_not_found"]),
            (
                409,
                &[
                    "session_opening",
                    "session_destroying",
                    "session_changed",
                    "pause_refused",
                ],
            ),
            (410, &["session_lost"]),
            INTERNAL,
            (502, &["docker_error"]),
        ],
    ),
    ("POST /v1/sessions/{id}/resume", WAKE),
    (
        "POST /v1/sessions/{id}/reclaim",
        &[
            AUTH,
            ADMIN,
            (404, &["session_not_found"]),
            (
                409,
                &[
                    "containers_persist",
                    "session_opening",
                    "session_destroying",
                    "session_changed",
                ],
            ),
            (410, &["session_lost"]),
            INTERNAL,
            (502, &["docker_error"]),
        ],
    ),
    (
        "POST /v1/sessions/{id}/rebuild",
        &[
            (400, &["bad_request", "unknown_runtime"]),
            AUTH,
            ADMIN,
            (404, &["session_not_found"]),
            (
                409,
                &[
                    "session_opening",
                    "session_destroying",
                    "session_changed",
                    "session_rebuilding",
                    "rebuild_refused",
                    "runtime_preparing",
                ],
            ),
            (410, &["session_lost"]),
            INTERNAL,
            (502, &["docker_error", "rebuild_failed"]),
            START_503,
            (507, &["host_disk_full"]),
        ],
    ),
    (
        "POST /v1/sessions/{id}/token",
        &[
            (400, &["bad_request"]),
            AUTH,
            ADMIN,
            (404, &["session_not_found"]),
            (
                409,
                &["owner_mismatch", "session_opening", "session_destroying"],
            ),
            INTERNAL,
        ],
    ),
    (
        "POST /v1/sessions/{id}/runs",
        &[
            (400, &["bad_request"]),
            AUTH,
            ADMIN,
            (404, &["session_not_found"]),
            (
                409,
                &[
                    "run_exists",
                    "session_opening",
                    "session_destroying",
                    "session_changed",
                    "session_rebuilding",
                    "runtime_preparing",
                ],
            ),
            (410, &["session_lost", "session_gone"]),
            (413, &["too_large"]),
            (429, &["run_cap", "process_limit", "host_cap", "tenant_cap"]),
            INTERNAL,
            (502, &["docker_error"]),
            (
                503,
                &[
                    "network_unavailable",
                    "runtime_failed",
                    "isolation_unavailable",
                    "memory_busy",
                ],
            ),
            (507, &["host_disk_full"]),
        ],
    ),
    (
        "GET /v1/sessions/{id}/runs/{run_id}",
        &[
            AUTH,
            ADMIN,
            (404, &["session_not_found", "run_not_found"]),
            (410, &["session_lost"]),
            INTERNAL,
            (502, &["docker_error"]),
        ],
    ),
    (
        "POST /v1/sessions/{id}/runs/{run_id}/stop",
        &[
            AUTH,
            ADMIN,
            (404, &["session_not_found", "run_not_found"]),
            INTERNAL,
        ],
    ),
    (
        "POST /v1/sessions/{id}/terminals",
        &[
            (400, &["bad_request"]),
            AUTH,
            ADMIN,
            (404, &["session_not_found"]),
            (
                409,
                &[
                    "terminals_unavailable",
                    "session_opening",
                    "session_destroying",
                    "session_changed",
                    "session_rebuilding",
                    "runtime_preparing",
                ],
            ),
            (410, &["session_lost", "session_gone"]),
            (413, &["too_large"]),
            (429, &["terminal_limit", "host_cap", "tenant_cap"]),
            INTERNAL,
            (502, &["docker_error"]),
            START_503,
            (507, &["host_disk_full"]),
        ],
    ),
    (
        "GET /v1/sessions/{id}/terminals",
        &[
            AUTH,
            ADMIN,
            (404, &["session_not_found"]),
            (409, &["terminals_unavailable"]),
            (410, &["session_lost"]),
            INTERNAL,
            (502, &["docker_error"]),
        ],
    ),
    (
        "DELETE /v1/sessions/{id}/terminals/{terminal_id}",
        &[
            AUTH,
            ADMIN,
            (404, &["session_not_found", "terminal_not_found"]),
            (409, &["terminals_unavailable"]),
            (410, &["session_lost"]),
            INTERNAL,
            (502, &["docker_error"]),
        ],
    ),
    (
        "GET /v1/sessions/{id}/terminals/{terminal_id}/attach",
        &[
            (400, &["bad_request"]),
            AUTH,
            ADMIN,
            (404, &["session_not_found", "terminal_not_found"]),
            (
                409,
                &[
                    "terminals_unavailable",
                    "session_opening",
                    "session_destroying",
                    "session_changed",
                    "session_rebuilding",
                    "runtime_preparing",
                ],
            ),
            (410, &["session_lost", "session_gone"]),
            (429, &["host_cap", "tenant_cap"]),
            INTERNAL,
            (502, &["docker_error"]),
            START_503,
            (507, &["host_disk_full"]),
        ],
    ),
    (
        "GET /v1/sessions/{id}/watch",
        &[
            (400, &["bad_request", "invalid_path"]),
            AUTH,
            (
                403,
                &["forbidden", "outside_workspace", "permission_denied"],
            ),
            (404, &["session_not_found", "not_found"]),
            (
                409,
                &[
                    "not_a_directory",
                    "terminals_unavailable",
                    "session_opening",
                    "session_destroying",
                    "session_changed",
                    "session_rebuilding",
                    "runtime_preparing",
                ],
            ),
            (410, &["session_lost", "session_gone"]),
            (429, &["watch_limit", "host_cap", "tenant_cap"]),
            INTERNAL,
            (502, &["docker_error"]),
            START_503,
            (507, &["host_disk_full"]),
        ],
    ),
    (
        "GET /v1/sessions/{id}/ports",
        &[AUTH, ADMIN, (404, &["session_not_found"]), INTERNAL],
    ),
    (
        "POST /v1/sessions/{id}/ports",
        &[
            (400, &["bad_request"]),
            AUTH,
            ADMIN,
            (404, &["session_not_found"]),
            (413, &["too_large"]),
            (429, &["port_limit"]),
            INTERNAL,
        ],
    ),
    (
        "DELETE /v1/sessions/{id}/ports/{port}",
        &[
            (400, &["bad_request"]),
            AUTH,
            ADMIN,
            (404, &["session_not_found", "port_not_open"]),
            INTERNAL,
        ],
    ),
    (
        "GET /v1/sessions/{id}/ports/{port}",
        &[
            (400, &["bad_request"]),
            AUTH,
            ADMIN,
            (404, &["session_not_found", "port_not_open"]),
            (
                409,
                &[
                    "terminals_unavailable",
                    "session_opening",
                    "session_destroying",
                    "session_changed",
                    "session_rebuilding",
                    "runtime_preparing",
                ],
            ),
            (410, &["session_lost", "session_gone"]),
            (429, &["host_cap", "tenant_cap"]),
            INTERNAL,
            (502, &["port_closed", "docker_error"]),
            START_503,
            (507, &["host_disk_full"]),
        ],
    ),
    ("GET /v1/sessions/{id}/ports/{port}/", TO_PORT),
    ("POST /v1/sessions/{id}/ports/{port}/", TO_PORT),
    ("PUT /v1/sessions/{id}/ports/{port}/", TO_PORT),
    ("DELETE /v1/sessions/{id}/ports/{port}/", TO_PORT),
    ("PATCH /v1/sessions/{id}/ports/{port}/", TO_PORT),
    ("GET /v1/sessions/{id}/ports/{port}/{path}", TO_PORT),
    ("POST /v1/sessions/{id}/ports/{port}/{path}", TO_PORT),
    ("PUT /v1/sessions/{id}/ports/{port}/{path}", TO_PORT),
    ("DELETE /v1/sessions/{id}/ports/{port}/{path}", TO_PORT),
    ("PATCH /v1/sessions/{id}/ports/{port}/{path}", TO_PORT),
    (
        "POST /v1/sessions/{id}/previews",
        &[
            (400, &["bad_request"]),
            AUTH,
            ADMIN,
            (404, &["session_not_found", "port_not_open"]),
            (413, &["too_large"]),
            INTERNAL,
        ],
    ),
    (
        "GET /preview/{token}",
        &[(403, &["preview_invalid", "preview_expired"]), INTERNAL],
    ),
    ("GET /preview/{token}/", TO_PREVIEW),
    ("POST /preview/{token}/", TO_PREVIEW),
    ("PUT /preview/{token}/", TO_PREVIEW),
    ("DELETE /preview/{token}/", TO_PREVIEW),
    ("PATCH /preview/{token}/", TO_PREVIEW),
    ("GET /preview/{token}/{path}", TO_PREVIEW),
    ("POST /preview/{token}/{path}", TO_PREVIEW),
    ("PUT /preview/{token}/{path}", TO_PREVIEW),
    ("DELETE /preview/{token}/{path}", TO_PREVIEW),
    ("PATCH /preview/{token}/{path}", TO_PREVIEW),
    (
        "GET /v1/sessions/{id}/files/{path}",
        &[
            (400, &["invalid_path"]),
            AUTH,
            (
                403,
                &["forbidden", "outside_workspace", "permission_denied"],
            ),
            (404, &["session_not_found", "not_found"]),
            (
                409,
                &[
                    "is_a_directory",
                    "not_a_regular_file",
                    "session_opening",
                    "session_destroying",
                ],
            ),
            (410, &["session_lost"]),
            (413, &["too_large"]),
            (500, &["internal", "io_error"]),
            FILE_503,
        ],
    ),
    (
        "PUT /v1/sessions/{id}/files/{path}",
        &[
            (400, &["invalid_path", "bad_request"]),
            AUTH,
            (
                403,
                &["forbidden", "outside_workspace", "permission_denied"],
            ),
            (404, &["session_not_found", "not_found"]),
            (
                409,
                &[
                    "is_a_directory",
                    "not_a_directory",
                    "not_a_regular_file",
                    "session_opening",
                    "session_destroying",
                ],
            ),
            (410, &["session_lost"]),
            (413, &["too_large"]),
            (500, &["internal", "io_error"]),
            FILE_503,
            (507, &["workspace_full"]),
        ],
    ),
    (
        "DELETE /v1/sessions/{id}/files/{path}",
        &[
            (400, &["invalid_path"]),
            AUTH,
            (
                403,
                &["forbidden", "outside_workspace", "permission_denied"],
            ),
            (404, &["session_not_found", "not_found"]),
            (
                409,
                &[
                    "directory_not_empty",
                    "not_a_directory",
                    "session_opening",
                    "session_destroying",
                ],
            ),
            (410, &["session_lost"]),
            (500, &["internal", "io_error"]),
            FILE_503,
        ],
    ),
    (
        "POST /v1/sessions/{id}/mkdir",
        &[
            (400, &["bad_request", "invalid_path"]),
            AUTH,
            (
                403,
                &["forbidden", "outside_workspace", "permission_denied"],
            ),
            (404, &["session_not_found", "not_found"]),
            (
                409,
                &["not_a_directory", "session_opening", "session_destroying"],
            ),
            (410, &["session_lost"]),
            (413, &["too_large"]),
            (500, &["internal", "io_error"]),
            FILE_503,
            (507, &["workspace_full"]),
        ],
    ),
    (
        "GET /v1/sessions/{id}/ls",
        &[
            (400, &["invalid_path"]),
            AUTH,
            (
                403,
                &["forbidden", "outside_workspace", "permission_denied"],
            ),
            (404, &["session_not_found", "not_found"]),
            (
                409,
                &["not_a_directory", "session_opening", "session_destroying"],
            ),
            (410, &["session_lost"]),
            (500, &["internal", "io_error"]),
            FILE_503,
        ],
    ),
    (
        "GET /v1/sessions/{id}/tree",
        &[
            (400, &["invalid_path"]),
            AUTH,
            (
                403,
                &["forbidden", "outside_workspace", "permission_denied"],
            ),
            (404, &["session_not_found", "not_found"]),
            (
                409,
                &["not_a_directory", "session_opening", "session_destroying"],
            ),
            (410, &["session_lost"]),
            (500, &["internal", "io_error"]),
            FILE_503,
        ],
    ),
    ("GET /v1/runtimes", &[AUTH, INTERNAL]),
    (
        "PUT /v1/runtimes",
        &[BODY[0], AUTH, ADMIN, BODY[1], (422, &["invalid_catalog"])],
    ),
    ("GET /v1/policy", &[AUTH, ADMIN]),
    (
        "PUT /v1/policy",
        &[BODY[0], AUTH, ADMIN, BODY[1], (422, &["policy_refused"])],
    ),
    (
        "GET /v1/operations",
        &[(400, &["bad_request"]), AUTH, ADMIN, INTERNAL],
    ),
    (
        "GET /v1/operations/stream",
        &[(400, &["bad_request"]), AUTH, ADMIN],
    ),
    (
        "POST /v1/sessions/{id}/mcp",
        &[
            AUTH,
            ADMIN,
            (404, &["session_not_found"]),
            (413, &["too_large"]),
        ],
    ),
    (
        "POST /v1/sessions/{id}/snapshots",
        &[
            BODY[0],
            AUTH,
            ADMIN,
            (404, &["session_not_found"]),
            (
                409,
                &["session_opening", "session_destroying", "session_changed"],
            ),
            (410, &["session_lost"]),
            BODY[1],
            INTERNAL,
            (502, &["docker_error"]),
            (503, &["snapshots_unavailable"]),
        ],
    ),
    (
        "GET /v1/snapshots/{scope}/{name}",
        &[
            (400, &["bad_request"]),
            AUTH,
            ADMIN,
            (404, &["snapshot_not_found"]),
            (422, &["snapshot_corrupt"]),
            (503, &["snapshots_unavailable"]),
        ],
    ),
    (
        "DELETE /v1/snapshots/{scope}/{name}",
        &[
            (400, &["bad_request"]),
            AUTH,
            ADMIN,
            (503, &["snapshots_unavailable"]),
        ],
    ),
    (
        "GET /v1/sessions/{id}/egress",
        &[
            (400, &["bad_request"]),
            AUTH,
            ADMIN,
            (404, &["session_not_found"]),
            INTERNAL,
        ],
    ),
    (
        "PUT /v1/sessions/{id}/credentials",
        &[
            BODY[0],
            AUTH,
            ADMIN,
            (404, &["session_not_found"]),
            BODY[1],
            INTERNAL,
        ],
    ),
    (
        "GET /v1/sessions/{id}/events",
        &[
            (400, &["bad_request"]),
            AUTH,
            ADMIN,
            (404, &["session_not_found"]),
            INTERNAL,
        ],
    ),
];

/// The error responses of `route` ("METHOD /path"), empty for a public route.
pub fn errors_of(route: &str) -> &'static [Errors] {
    ERRORS
        .iter()
        .find(|(r, _)| *r == route)
        .map(|(_, e)| *e)
        .unwrap_or(&[])
}

/// The document: the paths of the handlers, the bearer scheme, and each route's errors.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "sandboxd",
        description = "sandboxd's own HTTP API: sandbox sessions in containers with persistent workspaces. JSON in and out; every error is `{\"code\", \"message\"}` (the `ErrorBody` schema) with the status and the codes each route lists. Every `/v1` route takes `Authorization: Bearer <token>`: the admin token reaches everything, a session token only its own session.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        crate::http::service::index,
        crate::http::service::healthz,
        crate::http::service::metrics,
        openapi_json,
        crate::http::v1::list,
        crate::http::v1::open,
        crate::http::v1::show,
        crate::http::v1::destroy,
        crate::http::v1::stop,
        crate::http::v1::start,
        crate::http::v1::pause,
        crate::http::v1::resume,
        crate::http::v1::reclaim,
        crate::http::v1::rebuild,
        crate::http::v1::rotate_token,
        crate::http::v1::run,
        crate::http::v1::run_status,
        crate::http::v1::stop_run,
        crate::http::v1::terminals,
        crate::http::v1::open_terminal,
        crate::http::v1::kill_terminal,
        crate::http::v1::attach_terminal,
        crate::http::v1::ports,
        crate::http::v1::open_port,
        crate::http::v1::close_port,
        crate::http::v1::port_stream,
        crate::http::v1::to_port,
        crate::http::v1::to_port_root,
        crate::http::v1::open_preview,
        crate::http::v1::to_preview,
        crate::http::v1::to_preview_root,
        crate::http::v1::preview_bare,
        crate::http::v1::read_file,
        crate::http::v1::write_file,
        crate::http::v1::remove_file,
        crate::http::v1::mkdir,
        crate::http::v1::ls,
        crate::http::v1::tree,
        crate::http::v1::watch,
        crate::http::mcp::mcp,
        crate::http::v1::take_snapshot,
        crate::http::v1::show_snapshot,
        crate::http::v1::delete_snapshot,
        crate::http::v1::events,
        crate::http::v1::egress,
        crate::http::v1::put_credentials,
        crate::http::v1::runtimes,
        crate::http::v1::put_runtimes,
        crate::http::v1::policy,
        crate::http::v1::put_policy,
        crate::http::v1::operations,
        crate::http::v1::operations_stream,
    ),
    components(schemas(ErrorBody)),
    modifiers(&WithErrors),
    security(("bearer" = [])),
)]
pub struct ApiDoc;

struct WithErrors;

impl Modify for WithErrors {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The admin token, or a session token (only its own session)",
                    ))
                    .build(),
            ),
        );
        each_operation(doc, |route, operation| {
            for (status, codes) in errors_of(route) {
                let listed = codes
                    .iter()
                    .map(|c| format!("`{c}`"))
                    .collect::<Vec<_>>()
                    .join(", ");
                operation.responses.responses.insert(
                    status.to_string(),
                    crate::http::openapi::error_response(
                        format!("An error; `code` is one of {listed}"),
                        "ErrorBody",
                    ),
                );
            }
        });
    }
}

/// The document, as `GET /openapi.json` serves it and `docs/openapi.json` holds it.
pub fn document() -> Document {
    let mut doc = ApiDoc::openapi();
    doc.info.version = crate::VERSION.to_owned();
    doc
}

/// The document as pretty JSON with a final newline: the text of `docs/openapi.json`.
pub fn json() -> String {
    pretty(&document())
}

/// The OpenAPI document, without a token: it describes this version of sandboxd and holds
/// nothing of a session.
#[utoipa::path(
    get, path = "/openapi.json", tag = "service", security(()),
    responses((status = 200, description = "This document", body = Object))
)]
pub(crate) async fn openapi_json() -> axum::response::Response {
    serve(json())
}

#[cfg(test)]
mod tests {
    use crate::http::openapi::routes;
    use std::collections::BTreeSet;

    use super::*;

    /// "METHOD /path" of every operation of the document.
    fn documented() -> BTreeSet<String> {
        routes(&document())
    }

    #[test]
    fn committed_document_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == json(),
            "docs/openapi.json is not the document the code describes; regenerate it with \
             `make generate` (or `cargo run -q -p sandboxd --bin sandboxd -- openapi > docs/openapi.json`) \
             and commit it"
        );
    }

    #[test]
    fn the_document_lists_exactly_the_routes() {
        crate::http::tests::same(
            &crate::http::tests::listed(crate::http::v1::ROUTES),
            "sandboxd_api::routes::ROUTES",
            &documented(),
            "the document",
        );
    }

    #[test]
    fn every_route_with_errors_is_a_route() {
        let documented = documented();
        for (route, errors) in ERRORS {
            assert!(documented.contains(*route), "ERRORS names {route}");
            let path = route.split_once(' ').map_or("", |(_, p)| p);
            // A preview link is its own credential: refused 403 `preview_invalid`, never 401.
            if !crate::http::v1::PUBLIC_ROUTES.contains(&path)
                && !path.starts_with(sandboxd_api::routes::PREVIEW_PREFIX)
            {
                assert!(
                    errors
                        .iter()
                        .any(|(s, c)| *s == 401 && c.contains(&"unauthorized")),
                    "{route} answers 401 without a token"
                );
            }
        }
        for route in &documented {
            let path = route.split_once(' ').map_or("", |(_, p)| p);
            assert_eq!(
                crate::http::v1::PUBLIC_ROUTES.contains(&path),
                errors_of(route).is_empty(),
                "{route}: a public route has no error responses, every other route has"
            );
        }
    }

    /// Every code the document names is one of [`sandboxd_api::ErrorCode`], which clients
    /// match on.
    #[test]
    fn every_documented_code_is_a_typed_code() {
        for (route, errors) in ERRORS {
            for (_, codes) in *errors {
                for code in *codes {
                    assert!(
                        !matches!(
                            sandboxd_api::ErrorCode::from(*code),
                            sandboxd_api::ErrorCode::Other(_)
                        ),
                        "{route} answers {code}, which ErrorCode does not name"
                    );
                }
            }
        }
    }

    /// Every code a file operation fails with is documented on the file routes.
    #[test]
    fn file_routes_list_every_file_error_code() {
        let codes = [
            "invalid_path",
            "outside_workspace",
            "not_found",
            "session_lost",
            "permission_denied",
            "io_error",
        ];
        for route in [
            "GET /v1/sessions/{id}/files/{path}",
            "PUT /v1/sessions/{id}/files/{path}",
            "DELETE /v1/sessions/{id}/files/{path}",
        ] {
            let listed: Vec<&str> = errors_of(route)
                .iter()
                .flat_map(|(_, c)| c.iter().copied())
                .collect();
            for code in codes {
                assert!(listed.contains(&code), "{route} lists {code}");
            }
        }
        assert!(
            errors_of("PUT /v1/sessions/{id}/files/{path}")
                .iter()
                .any(|(s, c)| *s == 507 && c.contains(&"workspace_full"))
        );
    }

    #[test]
    fn policy_change_names_the_live_fields() {
        let all = PolicyChange {
            max_sessions: Some(1),
            max_sessions_per_tenant: Some(1),
            execute_timeout: Some(1),
            max_read_bytes: Some(1),
            max_output_bytes: Some(1),
        };
        let value = serde_json::to_value(all).expect("serializes");
        let fields: BTreeSet<&str> = value
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            fields,
            crate::service::policy::LIVE_FIELDS
                .into_iter()
                .collect::<BTreeSet<_>>()
        );
    }

    #[test]
    fn the_document_is_openapi_3_1_with_bearer_auth() {
        let value: serde_json::Value = serde_json::from_str(&json()).expect("JSON");
        assert_eq!(value["openapi"], "3.1.0");
        assert_eq!(value["info"]["version"], crate::VERSION);
        assert_eq!(
            value["components"]["securitySchemes"]["bearer"]["scheme"],
            "bearer"
        );
        assert_eq!(
            value["paths"]["/openapi.json"]["get"]["security"],
            serde_json::json!([{}])
        );
        assert_eq!(
            value["paths"]["/v1/sessions"]["post"]["responses"]["429"]["content"]["application/json"]
                ["schema"]["$ref"],
            "#/components/schemas/ErrorBody"
        );
    }
}
