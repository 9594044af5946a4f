//! The routes of the `/v1` API and the index that lists them. sandboxd's router is checked
//! against [`ROUTES`] (a test in sandboxd sends every method of every path the router is built
//! from through it), so a client may trust the list. [`REQUIRED_ROUTES`] are the ones the
//! operator needs of a host, and [`version_mismatch_message`] what the operator's
//! `VersionMismatch` condition and `kubectl sandbox doctor` say when a host lacks some.

use serde::{Deserialize, Serialize};

/// Every route this server serves, as the index lists them.
pub const ROUTES: &[&str] = &[
    "GET /",
    "GET /healthz",
    "GET /metrics",
    "GET /openapi.json",
    "GET /v1/sessions",
    "POST /v1/sessions",
    "GET /v1/sessions/{id}",
    "DELETE /v1/sessions/{id}",
    "POST /v1/sessions/{id}/stop",
    "POST /v1/sessions/{id}/start",
    "POST /v1/sessions/{id}/pause",
    "POST /v1/sessions/{id}/resume",
    "POST /v1/sessions/{id}/reclaim",
    "POST /v1/sessions/{id}/rebuild",
    "POST /v1/sessions/{id}/token",
    "POST /v1/sessions/{id}/runs",
    "GET /v1/sessions/{id}/runs/{run_id}",
    "POST /v1/sessions/{id}/runs/{run_id}/stop",
    "GET /v1/sessions/{id}/terminals",
    "POST /v1/sessions/{id}/terminals",
    "DELETE /v1/sessions/{id}/terminals/{terminal_id}",
    "GET /v1/sessions/{id}/terminals/{terminal_id}/attach",
    "GET /v1/sessions/{id}/ports",
    "POST /v1/sessions/{id}/ports",
    "GET /v1/sessions/{id}/ports/{port}",
    "DELETE /v1/sessions/{id}/ports/{port}",
    "GET /v1/sessions/{id}/ports/{port}/",
    "POST /v1/sessions/{id}/ports/{port}/",
    "PUT /v1/sessions/{id}/ports/{port}/",
    "DELETE /v1/sessions/{id}/ports/{port}/",
    "PATCH /v1/sessions/{id}/ports/{port}/",
    "GET /v1/sessions/{id}/ports/{port}/{path}",
    "POST /v1/sessions/{id}/ports/{port}/{path}",
    "PUT /v1/sessions/{id}/ports/{port}/{path}",
    "DELETE /v1/sessions/{id}/ports/{port}/{path}",
    "PATCH /v1/sessions/{id}/ports/{port}/{path}",
    "POST /v1/sessions/{id}/previews",
    "GET /preview/{token}",
    "GET /preview/{token}/",
    "POST /preview/{token}/",
    "PUT /preview/{token}/",
    "DELETE /preview/{token}/",
    "PATCH /preview/{token}/",
    "GET /preview/{token}/{path}",
    "POST /preview/{token}/{path}",
    "PUT /preview/{token}/{path}",
    "DELETE /preview/{token}/{path}",
    "PATCH /preview/{token}/{path}",
    "GET /v1/sessions/{id}/files/{path}",
    "PUT /v1/sessions/{id}/files/{path}",
    "DELETE /v1/sessions/{id}/files/{path}",
    "POST /v1/sessions/{id}/mkdir",
    "GET /v1/sessions/{id}/ls",
    "GET /v1/sessions/{id}/tree",
    "GET /v1/sessions/{id}/watch",
    "POST /v1/sessions/{id}/mcp",
    "POST /v1/sessions/{id}/snapshots",
    "GET /v1/snapshots/{scope}/{name}",
    "DELETE /v1/snapshots/{scope}/{name}",
    "GET /v1/sessions/{id}/events",
    "GET /v1/sessions/{id}/egress",
    "PUT /v1/sessions/{id}/credentials",
    "GET /v1/runtimes",
    "PUT /v1/runtimes",
    "GET /v1/policy",
    "PUT /v1/policy",
    "GET /v1/operations",
    "GET /v1/operations/stream",
];

/// The prefix of preview links (`/preview/{token}/…`): their token is the credential, so they
/// take no other (the router lets them through to the handler, which checks the link).
pub const PREVIEW_PREFIX: &str = "/preview/";

/// The routes the operator needs from a host's sandboxd; a host that lacks one is a
/// `VersionMismatch`.
pub const REQUIRED_ROUTES: &[&str] = &[
    "POST /v1/sessions",
    "GET /v1/sessions",
    "GET /v1/sessions/{id}",
    "DELETE /v1/sessions/{id}",
    "POST /v1/sessions/{id}/stop",
    "POST /v1/sessions/{id}/start",
    "POST /v1/sessions/{id}/reclaim",
    "POST /v1/sessions/{id}/rebuild",
    "POST /v1/sessions/{id}/token",
    "GET /v1/runtimes",
    "PUT /v1/runtimes",
    "GET /v1/policy",
];

impl Index {
    /// The [`REQUIRED_ROUTES`] this index does not list, in their order: what a host lacks for
    /// the operator (its `VersionMismatch` condition) and for `kubectl sandbox doctor`.
    pub fn missing_required(&self) -> Vec<String> {
        REQUIRED_ROUTES
            .iter()
            .filter(|r| !self.routes.iter().any(|x| x == *r))
            .map(|r| (*r).to_owned())
            .collect()
    }
}

/// The message of a host whose sandboxd lacks `missing` routes: the version expected (this
/// crate's, the workspace's) and the image to run.
pub fn version_mismatch_message(missing: &[String], image: &str) -> String {
    format!(
        "The sandbox service does not serve {} - its version does not match this platform (expected {}). Run {image}:{} and redeploy it",
        missing.join(", "),
        crate::VERSION,
        crate::VERSION,
    )
}

/// The routes anyone may call: the index, health, metrics and the OpenAPI document (no body,
/// nothing of a session).
pub const PUBLIC_ROUTES: [&str; 4] = ["/", "/healthz", "/metrics", "/openapi.json"];

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, utoipa::ToSchema)]
/// The index: what a client reads to know which server and version it talks to.
pub struct Index {
    /// Always "sandboxd".
    pub service: String,
    /// The server's version.
    pub version: String,
    /// The routes it serves.
    pub routes: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_required_route_is_a_route_of_the_api() {
        for route in REQUIRED_ROUTES {
            assert!(
                ROUTES.contains(route),
                "{route} is not a route of sandboxd's API"
            );
        }
    }

    #[test]
    fn an_index_names_the_required_routes_it_lacks() {
        let index = |routes: &[&str]| Index {
            service: "sandboxd".to_owned(),
            version: crate::VERSION.to_owned(),
            routes: routes.iter().map(|r| (*r).to_owned()).collect(),
        };
        assert!(index(ROUTES).missing_required().is_empty());
        let without: Vec<&str> = ROUTES
            .iter()
            .copied()
            .filter(|r| *r != "GET /v1/policy" && *r != "POST /v1/sessions")
            .collect();
        assert_eq!(
            index(&without).missing_required(),
            ["POST /v1/sessions", "GET /v1/policy"]
        );
    }
}
