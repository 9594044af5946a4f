//! sandboxd's own HTTP API, versioned under `/v1`. JSON in and out; every error is
//! `{"code", "message"}`. The index at `/` (no token) names the service, version and routes.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::http::audited::Audited;
use crate::http::error::{ApiError, ErrorCode};
use crate::http::extract::{Admin, ForSession};
use crate::metrics::Metrics;
use crate::service::auth::{AdminToken, bearer};
use crate::service::{Actor, Core};

mod admin;
mod files;
mod runs;
mod sessions;

pub use admin::*;
pub use files::*;
pub use runs::*;
pub use sandboxd_api::headers::{AGENT_HEADER, RUN_HEADER};
pub use sandboxd_api::routes::{Index, PUBLIC_ROUTES, ROUTES};
pub use sessions::*;

/// The largest body a file write accepts.
pub const MAX_WRITE_BYTES: usize = 256 * 1024 * 1024;

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

/// Every path of the `/v1` API, the index, health and metrics, and what serves it: [`router`]
/// is built from this table, and a test sends every method of every path of it through that
/// router to check that it serves exactly [`ROUTES`] (the routes the index lists and the
/// operator's version check trusts).
pub(crate) fn paths() -> Vec<(&'static str, MethodRouter<AppState>)> {
    vec![
        ("/", get(index)),
        ("/healthz", get(healthz)),
        ("/metrics", get(metrics)),
        ("/openapi.json", get(crate::http::openapi::openapi_json)),
        ("/v1/sessions", get(list).post(open)),
        ("/v1/sessions/{id}", get(show).delete(destroy)),
        ("/v1/sessions/{id}/stop", post(stop)),
        ("/v1/sessions/{id}/start", post(start)),
        ("/v1/sessions/{id}/reclaim", post(reclaim)),
        ("/v1/sessions/{id}/token", post(rotate_token)),
        ("/v1/sessions/{id}/runs", post(run)),
        ("/v1/sessions/{id}/runs/{run_id}", get(run_status)),
        ("/v1/sessions/{id}/runs/{run_id}/stop", post(stop_run)),
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
        ("/v1/runtimes", get(runtimes).put(put_runtimes)),
        ("/v1/policy", get(policy).put(put_policy)),
        ("/v1/operations", get(operations)),
    ]
}

/// The router of the `/v1` API, the index, health and metrics ([`paths`]), and of the wire
/// protocol ([`crate::http::wire::paths`]).
pub fn router(state: AppState) -> Router {
    paths()
        .into_iter()
        .chain(crate::http::wire::paths())
        .fold(Router::new(), |router, (path, methods)| {
            router.route(path, methods)
        })
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ))
        .fallback(not_found)
        .with_state(state)
}

/// The largest body of a request other than a file write (JSON requests, catalogs).
pub const MAX_REQUEST_BYTES: usize = 2 * 1024 * 1024;

/// The file writes, which take their bodies as they stream, with caps of their own.
const WRITE_ROUTES: [(&str, &str); 2] = [
    ("PUT", "/v1/sessions/{id}/files/{*path}"),
    ("POST", "/sessions/{session_id}/files/write"),
];

/// Before any route but [`PUBLIC_ROUTES`]: the token is checked before a byte of the body is
/// read (401 in the surface's own shape), so an anonymous request costs sandboxd no more than
/// its headers; then a body announced larger than its route takes is refused with 413, before
/// it is read too. The handler still decides what the token may reach.
async fn authenticate(
    State(state): State<AppState>,
    matched: Option<axum::extract::MatchedPath>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = req.uri().path();
    if PUBLIC_ROUTES.contains(&path) || crate::http::wire::PUBLIC_ROUTES.contains(&path) {
        return next.run(req).await;
    }
    let v1 = path.starts_with("/v1/");
    if v1 {
        if let Err(e) = caller(&state, req.headers()).await {
            return e.into_response();
        }
    } else if let Err(e) = crate::http::wire::authenticate(&state, req.headers()).await {
        return e.into_response();
    }
    let route = (req.method().as_str(), matched.as_ref().map(|m| m.as_str()));
    if WRITE_ROUTES
        .iter()
        .any(|(method, path)| (*method, Some(*path)) == route)
    {
        return next.run(req).await;
    }
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_REQUEST_BYTES as u64) {
        return body_too_large(v1);
    }
    let response = next.run(req).await;
    // A body that grew past the limit as it streamed (no length announced), or broke off or
    // stalled, is refused by the extractor in plain text; it gets the surface's shape too.
    let plain = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"text/plain"));
    match response.status() {
        StatusCode::PAYLOAD_TOO_LARGE if plain => body_too_large(v1),
        StatusCode::BAD_REQUEST if plain => {
            let text = axum::body::to_bytes(response.into_body(), 64 * 1024)
                .await
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            let message = match text.strip_prefix("Failed to buffer the request body: ") {
                Some(why) => format!("the request body could not be read: {why}"),
                None => text,
            };
            if v1 {
                ApiError::bad_request(message).into_response()
            } else {
                (StatusCode::BAD_REQUEST, Json(json!({ "detail": message }))).into_response()
            }
        }
        _ => response,
    }
}

/// 413 for a request body over [`MAX_REQUEST_BYTES`], as `/v1` or the wire protocol answers.
fn body_too_large(v1: bool) -> Response {
    let message = format!("a request body takes at most {MAX_REQUEST_BYTES} bytes");
    if v1 {
        ApiError::new(413, ErrorCode::TooLarge, message).into_response()
    } else {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            Json(json!({ "detail": message })),
        )
            .into_response()
    }
}

async fn not_found() -> ApiError {
    ApiError::new(
        404,
        ErrorCode::RouteNotFound,
        "This server does not serve that route; see GET / for the routes it serves",
    )
}
