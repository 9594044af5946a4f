//! Tokens: `X-Sandbox-Token`, the service (admin) token or a session's own. Handlers ask for
//! them as the extractors [`Service`] and [`WireSession`].

use super::*;

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;

use crate::http::extract::path_param;

use crate::http::AppState;
use crate::storage::store::SessionRow;

pub(super) fn token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|t| !t.is_empty())
}

/// Whether the request carries a token this host knows (the service token or a session's),
/// checked before its body is read; what the token reaches is the route's to decide.
pub(crate) async fn authenticate(state: &AppState, headers: &HeaderMap) -> WireResult<()> {
    let t = token(headers).ok_or_else(WireError::unauthorized)?;
    if state.admin.matches(t) {
        return Ok(());
    }
    match state.core.session_of_token(t).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(WireError::unauthorized()),
        Err(e) => Err(WireError::new(e.status_and_code().0, e.to_string())),
    }
}

/// Only the service (admin) token.
pub(crate) fn service(state: &AppState, headers: &HeaderMap) -> WireResult<()> {
    match token(headers) {
        Some(t) if state.admin.matches(t) => Ok(()),
        _ => Err(WireError::unauthorized()),
    }
}

/// The service token or session `id`'s own; the token is checked before existence is told.
pub(crate) async fn for_session(
    state: &AppState,
    headers: &HeaderMap,
    id: &str,
) -> WireResult<SessionRow> {
    check_id(id, &["path", "session_id"])?;
    let t = token(headers).ok_or_else(WireError::unauthorized)?;
    let admin = state.admin.matches(t);
    if !admin {
        let own = state
            .core
            .session_of_token(t)
            .await
            .map_err(|e| WireError::from_core(id, e))?;
        if own.as_deref() != Some(id) {
            return Err(WireError::unauthorized());
        }
    }
    state
        .core
        .store()
        .get(id)
        .await
        .map_err(|e| WireError::new(500, format!("sandboxd's state store failed: {e}")))?
        .ok_or_else(|| WireError::no_such_session(id))
}

/// The wire protocol: the service (admin) token in `X-Sandbox-Token` (401 otherwise).
pub(crate) struct Service;

impl FromRequestParts<AppState> for Service {
    type Rejection = WireError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        service(state, &parts.headers)?;
        Ok(Self)
    }
}

/// The wire protocol: the service token or the own token of the session `{session_id}` of the
/// path, and that session's row (422 for an id off the protocol's pattern, 401 for another
/// token, 404 for no such session).
pub(crate) struct WireSession(pub(crate) SessionRow);

impl FromRequestParts<AppState> for WireSession {
    type Rejection = WireError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let id = path_param(parts, state, "session_id")
            .await
            .map_err(|e| WireError::new(400, e))?;
        Ok(Self(for_session(state, &parts.headers, &id).await?))
    }
}
