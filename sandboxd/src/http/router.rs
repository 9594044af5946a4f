//! The one router of both surfaces: every path of `/v1` ([`crate::http::v1::paths`]) and of
//! the wire protocol ([`crate::http::wire::paths`]), and what every request goes through
//! before its handler: the timer (and, with tracing on, its span) and the authentication that
//! reads no body before the token is checked.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use sandboxd_api::routes::PUBLIC_ROUTES;
use serde_json::json;

use crate::http::error::{ApiError, ErrorCode};
use crate::http::state::{AppState, caller};

/// The router of the `/v1` API, the index, health and metrics ([`crate::http::v1::paths`]),
/// and of the wire protocol ([`crate::http::wire::paths`]).
pub fn router(state: AppState) -> Router {
    crate::http::v1::paths()
        .into_iter()
        .chain(crate::http::wire::paths())
        .fold(Router::new(), |router, (path, methods)| {
            router.route(path, methods)
        })
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), timed))
        .fallback(not_found)
        .with_state(state)
}

/// Around every route, outside [`authenticate`]: the time until the answer's head, by method,
/// route (as the router names it, never the path asked for) and status
/// (`sandboxd_http_request_seconds`). A streamed answer (a run, the audit stream) counts until
/// its head; its body's time is the run's own. With tracing on, the request is a span, a child
/// of the caller's `traceparent` header when it sends one.
async fn timed(
    State(state): State<AppState>,
    matched: Option<axum::extract::MatchedPath>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let started = std::time::Instant::now();
    let method = req.method().as_str().to_owned();
    let route = matched.map_or_else(String::new, |m| m.as_str().to_owned());
    let response = if sandboxd_telemetry::enabled() {
        use tracing::Instrument as _;
        let span = tracing::info_span!("request", method = %method, route = %route);
        if let Some(tp) = req
            .headers()
            .get(sandboxd_api::headers::TRACEPARENT_HEADER)
            .and_then(|v| v.to_str().ok())
        {
            sandboxd_telemetry::parent(&span, tp);
        }
        next.run(req).instrument(span).await
    } else {
        next.run(req).await
    };
    state
        .metrics
        .observe_request(method, route, response.status().as_u16(), started);
    response
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
    if PUBLIC_ROUTES.contains(&path)
        || crate::http::wire::PUBLIC_ROUTES.contains(&path)
        || path.starts_with(sandboxd_api::routes::PREVIEW_PREFIX)
    {
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
