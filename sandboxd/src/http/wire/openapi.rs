//! The OpenAPI 3.1 document of the wire surface ([`crate::http::wire`], pydantic-ai-backend's
//! sandboxd protocol): generated from the handlers' `#[utoipa::path]` attributes and the
//! request and response types the handlers build, with the error responses of each route from
//! [`ERRORS`]. Served at `GET /wire/openapi.json` without a token (like `GET /openapi.json`, it
//! describes this version of sandboxd and holds nothing of a session), printed by
//! `sandboxd openapi --wire` and committed as `docs/openapi-wire.json`, which a test keeps
//! equal to it.
//!
//! It describes the routes as this daemon serves them; where they differ from the protocol's
//! own service, `docs/sandboxd.md` says how. `GET /` and `GET /healthz`, shared with `/v1`, are
//! in `docs/openapi.json`.

use serde::Deserialize;
use utoipa::openapi::OpenApi as Document;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi, ToSchema};

use crate::http::wire::WireErrorBody;

/// `{session_id}`: a session.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SessionIdParam {
    /// The session id.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
    #[allow(dead_code)]
    session_id: String,
}

/// `{run_id}`: a run of the session.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct RunIdParam {
    /// The caller's id of the run (a uuid4's hex).
    #[param(pattern = "^[0-9a-f]{32}$")]
    #[allow(dead_code)]
    run_id: String,
}

/// `PolicyUpdate`: the body of `PUT /policy`. Only `max_sessions`, `max_sessions_per_tenant`,
/// `execute_timeout` and `max_read_bytes` change live here (each an integer above 0, within
/// the host's bound, else 422); `default_runtime` only to the one it is; any other field set
/// (not `null`) is refused with 400 and nothing changes. A field the protocol does not have is
/// 422.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct PolicyUpdate {
    /// The runtime of a session opened without one (only its present value is taken).
    default_runtime: Option<String>,
    /// Sessions this host holds at most.
    #[schema(minimum = 1)]
    max_sessions: Option<u64>,
    /// Refused (not a setting here).
    max_open_sessions: Option<u64>,
    /// Sessions one tenant holds at most.
    #[schema(minimum = 1)]
    max_sessions_per_tenant: Option<u64>,
    /// Refused (not a setting here).
    evict_idle_after: Option<f64>,
    /// Refused (not a setting here).
    idle_timeout: Option<f64>,
    /// Longest run, seconds.
    #[schema(minimum = 1)]
    execute_timeout: Option<u64>,
    /// Largest read, bytes.
    #[schema(minimum = 1)]
    max_read_bytes: Option<u64>,
    /// Refused (not a setting here).
    workspace_ttl: Option<f64>,
    /// Refused (not a setting here).
    container_ttl: Option<f64>,
    /// Refused (configuration, `SANDBOXD_MEMORY`).
    mem_limit: Option<String>,
    /// Refused (not a setting here).
    memswap_limit: Option<String>,
    /// Refused (configuration, `SANDBOXD_CPUS`).
    cpus: Option<f64>,
    /// Refused (not a setting here).
    cpu_shares: Option<u64>,
    /// Refused (configuration, `SANDBOXD_PIDS_LIMIT`).
    pids_limit: Option<u64>,
    /// Refused (configuration).
    tmpfs_size: Option<String>,
    /// Refused (the allowlist changes through `PUT /v1/runtimes`).
    #[schema(value_type = Option<Object>)]
    runtimes: Option<serde_json::Value>,
}

/// An error status of a route and when it is answered.
pub type Errors = (u16, &'static str);

const AUTH: Errors = (
    401,
    "The `X-Sandbox-Token` is missing or unknown, or does not reach this route (a session token reaches only its own session's routes)",
);
const INTERNAL: Errors = (
    500,
    "sandboxd failed (its state store, or the file system in an unexpected way)",
);
const TOO_LARGE: Errors = (413, "The request body is over 2 MiB");
const INVALID: Errors = (
    422,
    "The request failed validation (the body missing, not JSON or off its schema, a `session_id` off its pattern, a query value not of its type such as `usage=maybe`): `detail` lists the problems",
);
const NO_SESSION: Errors = (404, "No such session");
const GONE: Errors = (410, "The session's sandbox is gone, and its files with it");

/// The native file routes: what the file system answers, in the protocol's terms.
const FILE_ERRORS: &[Errors] = &[
    (
        400,
        "The path is refused (`ValueError`: it leads out of the workspace or is invalid; `IsADirectoryError`, `NotADirectoryError`, `FileExistsError`), or the request body could not be read",
    ),
    AUTH,
    (
        404,
        "No such session, or no such file (`FileNotFoundError`)",
    ),
    (
        409,
        "The session is opening or closing, or the path is one only the sandbox can resolve (a symlink out of the workspace or in a loop, not the sandbox user's to open, not a regular file, over the read limit): the client takes its shell path",
    ),
    GONE,
    TOO_LARGE,
    INVALID,
    INTERNAL,
    (507, "The workspace is full (`OSError`)"),
];

/// The stored-workspace routes (service token only).
const ARCHIVE_ERRORS: &[Errors] = &[
    (
        400,
        "The path leads out of the workspace, is not text (`read`), is over the read limit, or the request body could not be read",
    ),
    AUTH,
    (
        404,
        "No stored workspace of that session, or no such file or directory",
    ),
    TOO_LARGE,
    INVALID,
    INTERNAL,
];

/// The error responses of each route: status and when. Every route but the document itself
/// answers 401 without a token it takes; a route with a body answers 422 for one off its
/// schema and 413 for one over 2 MiB.
pub const ERRORS: &[(&str, &[Errors])] = &[
    ("GET /policy", &[AUTH, INTERNAL]),
    (
        "PUT /policy",
        &[
            (
                400,
                "A field this host cannot change live was set (nothing changed), or the request body could not be read",
            ),
            AUTH,
            TOO_LARGE,
            INVALID,
            INTERNAL,
        ],
    ),
    ("GET /sessions", &[AUTH, INVALID, INTERNAL]),
    (
        "POST /sessions",
        &[
            (
                400,
                "An unknown runtime, `attach` without a `session_id`, or the request body could not be read",
            ),
            AUTH,
            (404, "`attach` named a session that does not exist"),
            (
                409,
                "The session exists (without `reuse` or `attach`), is opening or closing, or is open on another runtime",
            ),
            GONE,
            TOO_LARGE,
            INVALID,
            (429, "The host's or the tenant's session cap is reached"),
            INTERNAL,
            (502, "The sandbox could not be started"),
            (
                503,
                "The runtime's image could not be built, or the network is missing",
            ),
            (507, "The host's disk is full"),
        ],
    ),
    (
        "GET /sessions/{session_id}",
        &[AUTH, NO_SESSION, GONE, INVALID, INTERNAL],
    ),
    (
        "GET /sessions/{session_id}/events",
        &[AUTH, NO_SESSION, INVALID, INTERNAL],
    ),
    (
        "DELETE /sessions/{session_id}",
        &[
            AUTH,
            NO_SESSION,
            (409, "The session is opening, or closing already"),
            INVALID,
            INTERNAL,
            (502, "Docker failed to remove or stop the sandbox"),
        ],
    ),
    (
        "POST /sessions/{session_id}/run",
        &[
            (
                400,
                "The run is refused (its environment), or the request body could not be read",
            ),
            AUTH,
            NO_SESSION,
            (
                409,
                "The run id is taken by a run still going, or the session is opening, closing or its runtime building",
            ),
            GONE,
            TOO_LARGE,
            INVALID,
            (
                429,
                "The session's run cap, the sandbox's process limit, or the host's or tenant's session cap (waking it), is reached",
            ),
            INTERNAL,
            (502, "Docker failed"),
            (
                503,
                "The runtime's image could not be built, or the network is missing",
            ),
            (507, "The host's disk is full"),
        ],
    ),
    (
        "POST /sessions/{session_id}/runs/{run_id}/stop",
        &[AUTH, NO_SESSION, INVALID, INTERNAL],
    ),
    ("POST /sessions/{session_id}/files/read", FILE_ERRORS),
    ("POST /sessions/{session_id}/files/write", FILE_ERRORS),
    ("POST /sessions/{session_id}/files/stat", FILE_ERRORS),
    ("POST /sessions/{session_id}/files/realpath", FILE_ERRORS),
    ("POST /sessions/{session_id}/files/list", FILE_ERRORS),
    ("POST /sessions/{session_id}/files/mkdir", FILE_ERRORS),
    ("POST /sessions/{session_id}/files/remove", FILE_ERRORS),
    (
        "POST /workspaces/trees",
        &[
            (400, "The request body could not be read"),
            AUTH,
            TOO_LARGE,
            INVALID,
            INTERNAL,
        ],
    ),
    ("POST /workspaces/{session_id}/ls", ARCHIVE_ERRORS),
    ("POST /workspaces/{session_id}/tree", ARCHIVE_ERRORS),
    ("POST /workspaces/{session_id}/read", ARCHIVE_ERRORS),
    ("POST /workspaces/{session_id}/read_bytes", ARCHIVE_ERRORS),
];

/// The error responses of `route` ("METHOD /path"), empty for a public route.
pub fn errors_of(route: &str) -> &'static [Errors] {
    ERRORS
        .iter()
        .find(|(r, _)| *r == route)
        .map(|(_, e)| *e)
        .unwrap_or(&[])
}

/// The document: the paths of the handlers, the token header, and each route's errors.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "sandboxd: the pydantic-ai-backend wire protocol",
        description = "The routes of pydantic-ai-backend's sandboxd protocol as this sandboxd serves them (the release in the index's `wire.release`), beside its own `/v1` API (`/openapi.json`). The token travels in `X-Sandbox-Token`: the service (admin) token reaches every route, a session's token only its own session's routes. Every error is `{\"detail\": …}` (the `WireErrorBody` schema): a sentence; for a native file operation the Python exception the client raises (`{\"error\", \"message\"}`); for a request that failed validation (422) the list of problems. A native file route answers 409 for a path only the sandbox can resolve, and the client then takes its shell path. `GET /` and `GET /healthz` are shared with `/v1` and described in `/openapi.json`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        openapi_json,
        crate::http::wire::get_policy,
        crate::http::wire::put_policy,
        crate::http::wire::list_sessions,
        crate::http::wire::create_session,
        crate::http::wire::get_session,
        crate::http::wire::session_events,
        crate::http::wire::delete_session,
        crate::http::wire::run,
        crate::http::wire::stop_run,
        crate::http::wire::file_read,
        crate::http::wire::file_write,
        crate::http::wire::file_stat,
        crate::http::wire::file_realpath,
        crate::http::wire::file_list,
        crate::http::wire::file_mkdir,
        crate::http::wire::file_remove,
        crate::http::wire::archive_trees,
        crate::http::wire::archive_ls,
        crate::http::wire::archive_tree,
        crate::http::wire::archive_read,
        crate::http::wire::archive_read_bytes,
    ),
    components(schemas(WireErrorBody)),
    modifiers(&WithErrors),
    security(("sandbox_token" = [])),
)]
pub struct WireDoc;

struct WithErrors;

impl Modify for WithErrors {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "sandbox_token",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-Sandbox-Token",
                "The service (admin) token, or a session's token (only its own session)",
            ))),
        );
        crate::http::openapi::each_operation(doc, |route, operation| {
            for (status, when) in errors_of(route) {
                operation.responses.responses.insert(
                    status.to_string(),
                    crate::http::openapi::error_response(*when, "WireErrorBody"),
                );
            }
        });
    }
}

/// The document, as `GET /wire/openapi.json` serves it and `docs/openapi-wire.json` holds it.
pub fn document() -> Document {
    let mut doc = WireDoc::openapi();
    doc.info.version = crate::VERSION.to_owned();
    doc
}

/// The document as pretty JSON with a final newline: the text of `docs/openapi-wire.json`.
pub fn json() -> String {
    crate::http::openapi::pretty(&document())
}

/// The wire surface's OpenAPI document, without a token: it describes this version of
/// sandboxd and holds nothing of a session.
#[utoipa::path(
    get, path = "/wire/openapi.json", tag = "service", security(()),
    responses((status = 200, description = "This document", body = Object))
)]
pub(crate) async fn openapi_json() -> axum::response::Response {
    crate::http::openapi::serve(json())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// "METHOD /path" of every operation of the document.
    fn documented() -> BTreeSet<String> {
        crate::http::openapi::routes(&document())
    }

    #[test]
    fn committed_document_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi-wire.json");
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == json(),
            "docs/openapi-wire.json is not the document the code describes; regenerate it with \
             `make generate` (or `cargo run -q -p sandboxd --bin sandboxd -- openapi --wire > docs/openapi-wire.json`) \
             and commit it"
        );
    }

    #[test]
    fn the_document_lists_exactly_the_routes() {
        crate::http::tests::same(
            &crate::http::tests::listed(crate::http::wire::ROUTES),
            "wire::ROUTES",
            &documented(),
            "the document",
        );
    }

    #[test]
    fn every_route_but_the_public_ones_answers_401() {
        let documented = documented();
        for (route, _) in ERRORS {
            assert!(documented.contains(*route), "ERRORS names {route}");
        }
        for route in &documented {
            let path = route.split_once(' ').map_or("", |(_, p)| p);
            let public = crate::http::wire::PUBLIC_ROUTES.contains(&path);
            assert_eq!(
                public,
                errors_of(route).is_empty(),
                "{route}: a public route has no error responses, every other route has"
            );
            if !public {
                assert!(
                    errors_of(route).iter().any(|(s, _)| *s == 401),
                    "{route} answers 401 without a token"
                );
            }
            // A route with a body answers 422 for one off its schema and 413 for one too large.
            let op = &serde_json::to_value(document()).expect("JSON")["paths"][path]
                [route.split(' ').next().unwrap_or_default().to_lowercase()];
            if !op["requestBody"].is_null() {
                for status in [413, 422] {
                    assert!(
                        errors_of(route).iter().any(|(s, _)| *s == status),
                        "{route} lists {status}"
                    );
                }
            }
        }
    }

    /// `PolicyUpdate` documents exactly the fields `PUT /policy` takes.
    #[test]
    fn policy_update_names_the_fields_put_policy_takes() {
        let value = serde_json::to_value(document()).expect("JSON");
        let fields: BTreeSet<&str> = value["components"]["schemas"]["PolicyUpdate"]["properties"]
            .as_object()
            .expect("PolicyUpdate's properties")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            fields,
            crate::http::wire::POLICY_UPDATE_FIELDS
                .iter()
                .copied()
                .collect::<BTreeSet<_>>()
        );
        assert_eq!(
            value["components"]["schemas"]["PolicyUpdate"]["additionalProperties"],
            false
        );
    }

    #[test]
    fn the_document_is_openapi_3_1_with_the_token_header() {
        let value: serde_json::Value = serde_json::from_str(&json()).expect("JSON");
        assert_eq!(value["openapi"], "3.1.0");
        assert_eq!(value["info"]["version"], crate::VERSION);
        let scheme = &value["components"]["securitySchemes"]["sandbox_token"];
        assert_eq!(scheme["type"], "apiKey");
        assert_eq!(scheme["in"], "header");
        assert_eq!(scheme["name"], "X-Sandbox-Token");
        assert_eq!(
            value["paths"]["/wire/openapi.json"]["get"]["security"],
            serde_json::json!([{}])
        );
        assert_eq!(
            value["paths"]["/sessions"]["post"]["responses"]["429"]["content"]["application/json"]
                ["schema"]["$ref"],
            "#/components/schemas/WireErrorBody"
        );
    }
}
