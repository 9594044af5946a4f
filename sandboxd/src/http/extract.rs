//! What a handler of either surface asks of a request before it acts, as axum extractors, so
//! that its signature says what its route needs: who acts ([`Actor`], from `X-Sandbox-Agent`
//! and `X-Sandbox-Run`) and what the caller's token reaches.
//!
//! `/v1` reads `Authorization: Bearer` and answers `{"code", "message"}` ([`Caller`], [`Admin`],
//! [`ForSession`]); the wire protocol reads `X-Sandbox-Token` and answers `{"detail"}` with
//! extractors of its own (`wire::tokens`), which take [`path_param`] from here. The rules
//! themselves are each surface's (`state::caller`, `wire::for_session`, …). The router's middleware has refused a token this host does not
//! know before any handler runs; these decide what a known one reaches. A handler lists them
//! after its `Path` and `Query`, so a malformed path or query is answered first, as before.

use std::convert::Infallible;

use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use sandboxd_api::headers::{AGENT_HEADER, RUN_HEADER};

use crate::http::error::ApiError;
use crate::http::state::{self, AppState, Caller};
use crate::service::Actor;

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

impl<S: Send + Sync> FromRequestParts<S> for Actor {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(actor(&parts.headers))
    }
}

/// The path parameter `name` of the route, as it was matched.
pub(crate) async fn path_param(
    parts: &mut Parts,
    state: &AppState,
    name: &str,
) -> Result<String, String> {
    let params = RawPathParams::from_request_parts(parts, state)
        .await
        .map_err(|e| e.body_text())?;
    params
        .iter()
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_owned())
        .ok_or_else(|| format!("the route has no path parameter {name}"))
}

/// `/v1`: who calls, by any token this host knows (401 otherwise).
impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        state::caller(state, &parts.headers).await
    }
}

/// `/v1`: the admin token; a session token is 403.
pub(crate) struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        state::admin(state, &parts.headers).await?;
        Ok(Self)
    }
}

/// `/v1`: the admin token or the own token of the session `{id}` of the path; another
/// session's token is 403.
pub(crate) struct ForSession;

impl FromRequestParts<AppState> for ForSession {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let id = path_param(parts, state, "id")
            .await
            .map_err(ApiError::bad_request)?;
        state::for_session(state, &parts.headers, &id).await?;
        Ok(Self)
    }
}
