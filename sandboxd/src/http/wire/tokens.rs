//! Tokens: `X-Sandbox-Token`, the service (admin) token or a session's own. Handlers ask for
//! them as the extractors [`crate::http::extract::Service`] and
//! [`crate::http::extract::WireSession`].

use super::*;

use axum::http::HeaderMap;

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
