//! What the handlers of both surfaces share: the state they are given ([`AppState`]) and who
//! calls ([`Caller`], from the bearer token). Each surface's own rules on top (the wire
//! protocol's `X-Sandbox-Token`) are its own; the extractors of both are [`crate::http::extract`].

use std::sync::Arc;

use axum::http::{HeaderMap, header};

use crate::http::error::ApiError;
use crate::metrics::Metrics;
use crate::service::Core;
use crate::service::auth::{AdminToken, bearer};

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The core.
    pub core: Arc<Core>,
    /// The admin token (hashed).
    pub admin: AdminToken,
    /// Metrics.
    pub metrics: Arc<Metrics>,
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The admin token: everything.
    Admin,
    /// A session token: only that session.
    Session(String),
}

/// The caller of a request; 401 for a missing or wrong token, before anything is looked up
/// about the path (no way to probe which sessions exist). A handler asks for it as the
/// extractor [`Caller`] ([`crate::http::extract`]).
pub(crate) async fn caller(state: &AppState, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .ok_or_else(ApiError::unauthorized)?;
    if state.admin.matches(token) {
        return Ok(Caller::Admin);
    }
    match state.core.session_of_token(token).await? {
        Some(id) => Ok(Caller::Session(id)),
        None => Err(ApiError::unauthorized()),
    }
}

/// Only the admin token (the extractor [`crate::http::extract::Admin`]).
pub(crate) async fn admin(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    match caller(state, headers).await? {
        Caller::Admin => Ok(()),
        Caller::Session(_) => Err(ApiError::forbidden("this route needs the admin token")),
    }
}

/// The admin token or session `id`'s own (the extractor
/// [`crate::http::extract::ForSession`]).
pub(crate) async fn for_session(
    state: &AppState,
    headers: &HeaderMap,
    id: &str,
) -> Result<(), ApiError> {
    match caller(state, headers).await? {
        Caller::Admin => Ok(()),
        Caller::Session(own) if own == id => Ok(()),
        Caller::Session(_) => Err(ApiError::forbidden(
            "a session token reaches only its own session",
        )),
    }
}
