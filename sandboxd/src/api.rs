//! sandboxd's own HTTP API, versioned under `/v1`. JSON in and out; every error is
//! `{"code", "message"}`. The index at `/` (no token) names the service, version and routes.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::mpsc;

use crate::audit::{Op, OperationQuery};
use crate::auth::{AdminToken, bearer};
use crate::core::{Actor, Core, Destroyed, OpenRequest, Opened, Outcome, RunRequest, SessionView};
use crate::error::{ApiError, ErrorCode};
use crate::files::{MAX_LIST_ENTRIES, TreeLimits};
use crate::metrics::{Metrics, StateLabel};
use crate::openapi::{Binary, FilePath, PolicyChange, RunId, SessionId};
use crate::runner::{RunEvent, RunOutcome, RunStatus};
pub use sandboxd_api::headers::{AGENT_HEADER, RUN_HEADER};
pub use sandboxd_api::routes::{Index, PUBLIC_ROUTES, ROUTES};

fn actor(headers: &HeaderMap) -> Actor {
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

fn outcome<T>(result: &Result<T, ApiError>, bytes: impl Fn(&T) -> Option<i64>) -> Outcome {
    match result {
        Ok(v) => Outcome {
            ok: true,
            bytes: bytes(v),
            ..Outcome::default()
        },
        Err(e) => Outcome {
            ok: false,
            error: Some(e.code.to_string()),
            ..Outcome::default()
        },
    }
}

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
/// about the path (no way to probe which sessions exist).
async fn caller(state: &AppState, headers: &HeaderMap) -> Result<Caller, ApiError> {
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

async fn admin(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    match caller(state, headers).await? {
        Caller::Admin => Ok(()),
        Caller::Session(_) => Err(ApiError::forbidden("this route needs the admin token")),
    }
}

async fn for_session(state: &AppState, headers: &HeaderMap, id: &str) -> Result<(), ApiError> {
    match caller(state, headers).await? {
        Caller::Admin => Ok(()),
        Caller::Session(own) if own == id => Ok(()),
        Caller::Session(_) => Err(ApiError::forbidden(
            "a session token reaches only its own session",
        )),
    }
}

/// The router of the `/v1` API, the index, health and metrics.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(crate::openapi::openapi_json))
        .route("/v1/sessions", get(list).post(open))
        .route("/v1/sessions/{id}", get(show).delete(destroy))
        .route("/v1/sessions/{id}/stop", post(stop))
        .route("/v1/sessions/{id}/start", post(start))
        .route("/v1/sessions/{id}/reclaim", post(reclaim))
        .route("/v1/sessions/{id}/token", post(rotate_token))
        .route("/v1/sessions/{id}/runs", post(run))
        .route("/v1/sessions/{id}/runs/{run_id}", get(run_status))
        .route("/v1/sessions/{id}/runs/{run_id}/stop", post(stop_run))
        .route(
            "/v1/sessions/{id}/files/{*path}",
            get(read_file)
                .put(write_file)
                .delete(remove_file)
                .layer(DefaultBodyLimit::max(MAX_WRITE_BYTES)),
        )
        .route("/v1/sessions/{id}/mkdir", post(mkdir))
        .route("/v1/sessions/{id}/ls", get(ls))
        .route("/v1/sessions/{id}/tree", get(tree))
        .route("/v1/runtimes", get(runtimes).put(put_runtimes))
        .route("/v1/policy", get(policy).put(put_policy))
        .route("/v1/operations", get(operations))
        .merge(crate::wire::router())
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
    if PUBLIC_ROUTES.contains(&path) || crate::wire::PUBLIC_ROUTES.contains(&path) {
        return next.run(req).await;
    }
    let v1 = path.starts_with("/v1/");
    if v1 {
        if let Err(e) = caller(&state, req.headers()).await {
            return e.into_response();
        }
    } else if let Err(e) = crate::wire::authenticate(&state, req.headers()).await {
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

/// The index: [`Index`] (every route of both surfaces), and the fields of the wire protocol's
/// own index (`health`, `endpoints`, …, and `wire`: the pydantic-ai-backend release served).
#[utoipa::path(
    get, path = "/", tag = "service", security(()),
    responses((status = 200, description = "The service, its version and every route it serves, with the wire protocol's index fields", body = Index))
)]
pub(crate) async fn index(
    State(state): State<AppState>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let index = Index {
        service: crate::SERVICE.into(),
        version: crate::VERSION.into(),
        routes: ROUTES
            .iter()
            .chain(crate::wire::ROUTES.iter())
            .map(|r| (*r).to_owned())
            .collect(),
    };
    let mut body = serde_json::to_value(index).map_err(|e| ApiError::internal(e.to_string()))?;
    if let Some(map) = body.as_object_mut() {
        map.extend(crate::wire::index_fields(&state.core).await?);
    }
    Ok(Json(body))
}

/// Health: `{"status": "ok"}` and the wire protocol's capacity summary (`ServiceHealth`).
#[utoipa::path(
    get, path = "/healthz", tag = "service", security(()),
    responses((status = 200, description = "`{\"status\": \"ok\"}` and the capacity summary", body = Object))
)]
pub(crate) async fn healthz(
    State(state): State<AppState>,
) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(crate::wire::health(&state.core).await?))
}

#[utoipa::path(
    get, path = "/metrics", tag = "service", security(()),
    responses((status = 200, description = "Prometheus metrics", body = String, content_type = "application/openmetrics-text"))
)]
pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    if let Ok(rows) = state.core.store().list().await {
        state.metrics.sessions.clear();
        for row in rows {
            state
                .metrics
                .sessions
                .get_or_create(&StateLabel {
                    state: row.state.as_str().to_owned(),
                })
                .inc();
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}

#[utoipa::path(
    get, path = "/v1/sessions", tag = "sessions",
    responses((status = 200, description = "Every session of this host", body = SessionList))
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admin(&state, &headers).await?;
    Ok(Json(SessionList {
        sessions: state.core.list().await?,
    })
    .into_response())
}

#[utoipa::path(
    post, path = "/v1/sessions", tag = "sessions",
    request_body = OpenRequest,
    responses(
        (status = 201, description = "Created; the body carries the session token (only here)", body = Opened),
        (status = 200, description = "It existed already (opened again, woken if it slept)", body = Opened),
    )
)]
pub(crate) async fn open(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    admin(&state, &headers).await?;
    let req: OpenRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid open request: {e}")))?;
    let core = state.core.clone();
    let opened = crate::core::detached(async move { core.open(req).await }).await?;
    let status = if opened.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(opened)).into_response())
}

#[utoipa::path(
    get, path = "/v1/sessions/{id}", tag = "sessions", params(SessionId),
    responses((status = 200, description = "The session", body = SessionView))
)]
pub(crate) async fn show(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    for_session(&state, &headers, &id).await?;
    Ok(Json(state.core.get(&id).await?).into_response())
}

/// `?owner=`: the object a destroy or token rotation acts for.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct OwnerQuery {
    /// The object the session belongs to; another owner than the session's is refused
    /// (409 `owner_mismatch`).
    #[serde(default)]
    owner: Option<String>,
}

#[utoipa::path(
    delete, path = "/v1/sessions/{id}", tag = "sessions", params(SessionId, OwnerQuery),
    responses((status = 200, description = "What the destroy did (`destroyed: false` when nothing was left)", body = Destroyed))
)]
pub(crate) async fn destroy(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<OwnerQuery>,
) -> Result<Response, ApiError> {
    for_session(&state, &headers, &id).await?;
    let core = state.core.clone();
    let destroyed =
        crate::core::detached(async move { core.destroy_as(&id, q.owner.as_deref()).await })
            .await?;
    Ok(Json(destroyed).into_response())
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/stop", tag = "sessions", params(SessionId),
    responses((status = 200, description = "The session, stopped", body = SessionView))
)]
pub(crate) async fn stop(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    for_session(&state, &headers, &id).await?;
    let core = state.core.clone();
    let stopped = crate::core::detached(async move { core.stop(&id).await }).await?;
    Ok(Json(stopped).into_response())
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/start", tag = "sessions", params(SessionId),
    responses((status = 200, description = "The session, running", body = SessionView))
)]
pub(crate) async fn start(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    for_session(&state, &headers, &id).await?;
    let core = state.core.clone();
    let woken = id.clone();
    crate::core::detached(async move { core.wake(&woken).await }).await?;
    Ok(Json(state.core.get(&id).await?).into_response())
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/reclaim", tag = "sessions", params(SessionId),
    responses((status = 200, description = "The session, its container removed (the workspace kept)", body = SessionView))
)]
pub(crate) async fn reclaim(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    for_session(&state, &headers, &id).await?;
    let core = state.core.clone();
    let reclaimed = crate::core::detached(async move { core.reclaim(&id).await }).await?;
    Ok(Json(reclaimed).into_response())
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/token", tag = "sessions", params(SessionId, OwnerQuery),
    responses((status = 200, description = "A new session token; the old one no longer works", body = TokenRotated))
)]
pub(crate) async fn rotate_token(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<OwnerQuery>,
) -> Result<Response, ApiError> {
    admin(&state, &headers).await?;
    let token = state.core.rotate_token_as(&id, q.owner.as_deref()).await?;
    Ok(Json(TokenRotated { id, token }).into_response())
}

/// `?stream=`: whether a run answers with NDJSON events as they come.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct RunQuery {
    /// Stream the output as NDJSON events, then the outcome.
    #[serde(default)]
    stream: bool,
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/runs", tag = "runs", params(SessionId, RunQuery),
    request_body = RunRequest,
    responses(
        (status = 200, description = "How the run ended; with `stream=true`, NDJSON: one `stdout`/`stderr` event a line, then an `exit` line (the outcome without its output) or an `error` line (`type`, `code`, `message`)",
            content(
                (RunOutcome = "application/json"),
                (RunEvent = "application/x-ndjson"),
            )),
    )
)]
pub(crate) async fn run(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<RunQuery>,
    body: Bytes,
) -> Result<Response, ApiError> {
    for_session(&state, &headers, &id).await?;
    let req: RunRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid run request: {e}")))?;
    let who = actor(&headers);
    let command = req.command.clone();
    let started = Instant::now();
    if !q.stream {
        let result = state.core.run(&id, req, None).await;
        record_run(&state.core, &id, &who, &command, &result, started);
        return Ok(Json(result?).into_response());
    }
    // NDJSON: one event per line as output comes, then the outcome (or the error). One task
    // forwards the events in order and only then the outcome (the run's events channel closes
    // when the run is over), and writes whatever events are ready as one chunk.
    //
    // The run never waits for this client (its output waits, capped, in the run; see
    // `runner::Output`), so stop, timeout and destroy end it however slowly the client reads.
    // Once the run is over, the client has `STREAM_DRAIN` to read the rest; a client that
    // does not is cut off (the response ends with an error, the connection is closed), so a
    // stalled reader holds nothing of sandboxd's past that.
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let (events_tx, mut events_rx) = mpsc::channel::<crate::runner::RunEvent>(64);
    let core = state.core.clone();
    let caller_gone = tokio_util::sync::CancellationToken::new();
    let gone = caller_gone.clone();
    let over = tokio_util::sync::CancellationToken::new();
    let cut = tokio_util::sync::CancellationToken::new();
    let (run_over, cut_off) = (over.clone(), cut.clone());
    tokio::spawn(async move {
        let run = tokio::spawn(async move {
            // A caller that went away stops the run: dropping it cancels it (see `Core::run`).
            let result = tokio::select! {
                result = core.run(&id, req, Some(events_tx)) => result,
                () = gone.cancelled() => Err(ApiError::new(
                    499,
                    ErrorCode::RunCancelled,
                    "the caller went away; the run was stopped",
                )),
            };
            record_run(&core, &id, &who, &command, &result, started);
            run_over.cancel();
            result
        });
        let drained = async {
            over.cancelled().await;
            tokio::time::sleep(STREAM_DRAIN).await;
        };
        tokio::pin!(drained);
        let mut client_gone = false;
        loop {
            // A client that went away (even from a run that prints nothing) stops the run; one
            // that did not read what the run left in time after it ended is let go.
            let event = tokio::select! {
                event = events_rx.recv() => event,
                () = tx.closed() => {
                    client_gone = true;
                    break;
                }
                () = &mut drained => { client_gone = true; break; }
            };
            let Some(event) = event else { break };
            let mut chunk = Vec::new();
            ndjson_line(&mut chunk, &event);
            while chunk.len() < STREAM_CHUNK {
                match events_rx.try_recv() {
                    Ok(event) => ndjson_line(&mut chunk, &event),
                    Err(_) => break,
                }
            }
            let sent = tokio::select! {
                sent = tx.send(Bytes::from(chunk)) => sent.is_ok(),
                () = &mut drained => false,
            };
            if !sent {
                // The client went away, or did not read what the run left in time: the run
                // goes on (or is over), its events are dropped.
                client_gone = true;
                break;
            }
        }
        drop(events_rx);
        if client_gone {
            caller_gone.cancel();
        }
        let last = match run.await {
            Ok(Ok(mut outcome)) => {
                // The output went out as events; the outcome line does not repeat it.
                outcome.stdout = String::new();
                outcome.stderr = String::new();
                let mut v = serde_json::to_value(&outcome).unwrap_or_default();
                if let Some(map) = v.as_object_mut() {
                    map.remove("stdout");
                    map.remove("stderr");
                }
                v["type"] = json!("exit");
                v
            }
            Ok(Err(e)) => json!({"type": "error", "code": e.code, "message": e.message}),
            Err(e) => json!({"type": "error", "code": "internal", "message": e.to_string()}),
        };
        if client_gone {
            cut_off.cancel();
            return;
        }
        tokio::select! {
            _ = tx.send(Bytes::from(format!("{last}\n"))) => {}
            () = &mut drained => cut_off.cancel(),
        }
    });
    // The body: the forwarded chunks, or an error once the client is cut off (hyper then
    // closes the connection, and with the body drops what it still held).
    let stream = futures::stream::unfold((rx, Some(cut)), |(mut rx, cut)| async move {
        let cut = cut?;
        let next = tokio::select! {
            biased;
            () = cut.cancelled() => None,
            chunk = rx.recv() => Some(chunk),
        };
        match next {
            None => Some((
                Err(std::io::Error::other(
                    "the client did not read the run's stream in time",
                )),
                (rx, None),
            )),
            Some(chunk) => chunk.map(|c| (Ok(c), (rx, Some(cut)))),
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// How long a streamed run's client has, once the run is over, to read what is left of it.
const STREAM_DRAIN: std::time::Duration = std::time::Duration::from_secs(30);

/// The most a streamed chunk gathers from events already waiting.
const STREAM_CHUNK: usize = 512 * 1024;

/// One NDJSON line of a run event.
fn ndjson_line(out: &mut Vec<u8>, event: &crate::runner::RunEvent) {
    let (crate::runner::RunEvent::Stdout { data } | crate::runner::RunEvent::Stderr { data }) =
        event;
    // Room for the text and its framing (escapes may need more; the Vec grows then).
    out.reserve(data.len() + 32);
    // Serializing a plain enum of strings into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, event);
    out.push(b'\n');
}

/// The audit row of a run (both surfaces): the command, never its output; a failed command
/// with its exit status.
pub(crate) fn record_run(
    core: &Core,
    id: &str,
    who: &Actor,
    command: &str,
    result: &Result<crate::runner::RunOutcome, ApiError>,
    started: Instant,
) {
    let outcome = match result {
        Ok(o) => Outcome {
            ok: o.exit_code == 0 && !o.timed_out && !o.stopped,
            exit_code: Some(o.exit_code),
            error: if o.timed_out {
                Some("timed_out".into())
            } else if o.stopped {
                Some("stopped".into())
            } else if o.exit_code != 0 {
                Some(format!("exit {}", o.exit_code))
            } else {
                None
            },
            bytes: None,
        },
        Err(e) => Outcome {
            ok: false,
            error: Some(e.code.to_string()),
            ..Outcome::default()
        },
    };
    core.record(id, who, Op::Execute, command, outcome, started);
}

#[utoipa::path(
    get, path = "/v1/sessions/{id}/runs/{run_id}", tag = "runs", params(SessionId, RunId),
    responses((status = 200, description = "The run, in flight or finished", body = RunStatus))
)]
pub(crate) async fn run_status(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, run_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    for_session(&state, &headers, &id).await?;
    Ok(Json(state.core.run_status(&id, &run_id).await?).into_response())
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/runs/{run_id}/stop", tag = "runs", params(SessionId, RunId),
    responses((status = 200, description = "The run is being stopped", body = RunStopping))
)]
pub(crate) async fn stop_run(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, run_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    for_session(&state, &headers, &id).await?;
    state.core.stop_run_or_detached(&id, &run_id).await?;
    Ok(Json(RunStopping {
        run_id,
        stopping: true,
    })
    .into_response())
}

/// What part of a file a read returns.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ReadQuery {
    /// The first byte (past the end: nothing, at the end).
    #[serde(default)]
    offset: u64,
    /// Bytes at most (and at most the policy's `max_read_bytes`).
    #[serde(default)]
    limit: Option<u64>,
}

/// Whether a remove takes a folder with what it holds.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct RemoveQuery {
    /// Remove a non-empty folder with its contents.
    #[serde(default)]
    recursive: bool,
}

#[utoipa::path(
    get, path = "/v1/sessions/{id}/files/{path}", tag = "files", params(SessionId, FilePath, ReadQuery),
    responses((status = 200, description = "The bytes `[offset, offset + limit)` of the file; `x-file-size` is the whole file's size, `x-file-offset` where the bytes start",
        body = Binary, content_type = "application/octet-stream",
        headers(("x-file-size" = u64, description = "The size of the whole file"), ("x-file-offset" = u64, description = "Where the bytes start"))))
)]
pub(crate) async fn read_file(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, path)): Path<(String, String)>,
    Query(q): Query<ReadQuery>,
) -> Result<Response, ApiError> {
    for_session(&state, &headers, &id).await?;
    let started = Instant::now();
    let ws = state.core.files(&id).await?;
    let max = state.core.policy().max_read_bytes;
    let p = path.clone();
    let read = tokio::task::spawn_blocking(move || ws.read(&p, q.offset, q.limit, max))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(ApiError::from);
    let o = outcome(&read, |r| i64::try_from(r.data.len()).ok());
    state
        .core
        .record(&id, &actor(&headers), Op::Read, &path, o, started);
    let read = read?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (
                header::HeaderName::from_static("x-file-size"),
                read.size.to_string(),
            ),
            (
                header::HeaderName::from_static("x-file-offset"),
                read.offset.to_string(),
            ),
        ],
        read.data,
    )
        .into_response())
}

/// How much of a write's body is gathered before it goes to the disk.
const WRITE_BATCH: usize = 1024 * 1024;

/// Writes the body as it arrives (no buffering of the whole of it): every MiB received goes to
/// the temporary file on a blocking thread while the next is received (no thread waits on a
/// slow client), and the file is put in place once the body is complete. A body that breaks
/// off or passes [`MAX_WRITE_BYTES`] leaves the file as it was.
#[utoipa::path(
    put, path = "/v1/sessions/{id}/files/{path}", tag = "files", params(SessionId, FilePath),
    request_body(content = Binary, content_type = "application/octet-stream", description = "The file's new content (at most 256 MiB)"),
    responses((status = 200, description = "Written: the file was replaced whole", body = Written))
)]
pub(crate) async fn write_file(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, path)): Path<(String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    for_session(&state, &headers, &id).await?;
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_WRITE_BYTES as u64) {
        return Err(write_too_large());
    }
    let started = Instant::now();
    let ws = state.core.files(&id).await?;
    let p = path.clone();
    let written = match tokio::task::spawn_blocking(move || ws.begin_write(&p)).await {
        Ok(Ok(pending)) => stream_to(pending, body).await,
        Ok(Err(e)) => Err(e.into()),
        Err(e) => Err(ApiError::internal(e.to_string())),
    };
    let o = outcome(&written, |w| i64::try_from(w.size).ok());
    state
        .core
        .record(&id, &actor(&headers), Op::Write, &path, o, started);
    let written = written?;
    Ok(Json(Written {
        path,
        size: written.size,
    })
    .into_response())
}

fn write_too_large() -> ApiError {
    ApiError::new(
        413,
        ErrorCode::TooLarge,
        format!("a file write takes at most {MAX_WRITE_BYTES} bytes"),
    )
}

/// Appends `body` to a pending write, one batch on the disk while the next arrives, and puts
/// the file in place. On any failure the pending write is dropped, and its temporary file
/// with it.
async fn stream_to(
    pending: crate::files::PendingWrite,
    body: Body,
) -> Result<crate::files::WriteResult, ApiError> {
    type Writing = tokio::task::JoinHandle<Result<crate::files::PendingWrite, ApiError>>;
    fn write(mut pending: crate::files::PendingWrite, batch: Vec<Bytes>) -> Writing {
        tokio::task::spawn_blocking(move || {
            for b in &batch {
                pending.write_all(b)?;
            }
            Ok(pending)
        })
    }
    async fn finished(writing: Writing) -> Result<crate::files::PendingWrite, ApiError> {
        writing
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
    }
    let mut writing = write(pending, Vec::new());
    let mut batch = Vec::new();
    let (mut batched, mut received) = (0usize, 0usize);
    let mut body = body.into_data_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::bad_request(format!("the body broke off after {received} bytes: {e}"))
        })?;
        received += chunk.len();
        if received > MAX_WRITE_BYTES {
            return Err(write_too_large());
        }
        batched += chunk.len();
        batch.push(chunk);
        if batched >= WRITE_BATCH {
            let pending = finished(writing).await?;
            writing = write(pending, std::mem::take(&mut batch));
            batched = 0;
        }
    }
    let pending = finished(writing).await?;
    tokio::task::spawn_blocking(move || {
        let mut pending = pending;
        for b in &batch {
            pending.write_all(b)?;
        }
        pending.commit()
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(ApiError::from)
}

#[utoipa::path(
    delete, path = "/v1/sessions/{id}/files/{path}", tag = "files", params(SessionId, FilePath, RemoveQuery),
    responses((status = 200, description = "Removed", body = Removed))
)]
pub(crate) async fn remove_file(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, path)): Path<(String, String)>,
    Query(q): Query<RemoveQuery>,
) -> Result<Response, ApiError> {
    for_session(&state, &headers, &id).await?;
    let started = Instant::now();
    let ws = state.core.files(&id).await?;
    let p = path.clone();
    let removed = tokio::task::spawn_blocking(move || ws.remove(&p, q.recursive))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(ApiError::from);
    let o = outcome(&removed, |_| None);
    state
        .core
        .record(&id, &actor(&headers), Op::Remove, &path, o, started);
    removed?;
    Ok(Json(Removed {
        path,
        removed: true,
    })
    .into_response())
}

/// The body of a mkdir.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct MkdirRequest {
    /// The folder, relative to the workspace; its parents are made too.
    path: String,
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/mkdir", tag = "files", params(SessionId),
    request_body = MkdirRequest,
    responses((status = 201, description = "The folder exists (made with its parents)", body = Made))
)]
pub(crate) async fn mkdir(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    for_session(&state, &headers, &id).await?;
    let req: MkdirRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid mkdir request: {e}")))?;
    let started = Instant::now();
    let ws = state.core.files(&id).await?;
    let p = req.path.clone();
    let made = tokio::task::spawn_blocking(move || ws.mkdir(&p))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(ApiError::from);
    let o = outcome(&made, |_| None);
    state
        .core
        .record(&id, &actor(&headers), Op::Mkdir, &req.path, o, started);
    made?;
    Ok((StatusCode::CREATED, Json(Made { path: req.path })).into_response())
}

/// `?path=`: a folder of the workspace.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct PathQuery {
    /// The folder, relative to the workspace root (empty: the root).
    #[serde(default)]
    path: String,
}

#[utoipa::path(
    get, path = "/v1/sessions/{id}/ls", tag = "files", params(SessionId, PathQuery),
    responses((status = 200, description = "One folder's entries", body = LsResponse))
)]
pub(crate) async fn ls(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<Response, ApiError> {
    for_session(&state, &headers, &id).await?;
    let started = Instant::now();
    let ws = state.core.files(&id).await?;
    let p = q.path.clone();
    let listed = tokio::task::spawn_blocking(move || ws.list(&p, MAX_LIST_ENTRIES))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(ApiError::from);
    let o = outcome(&listed, |_| None);
    state
        .core
        .record(&id, &actor(&headers), Op::Ls, &q.path, o, started);
    let listed = listed?;
    Ok(Json(LsResponse {
        path: q.path,
        entries: listed.entries,
        truncated: listed.truncated,
        max_entries: MAX_LIST_ENTRIES,
    })
    .into_response())
}

#[utoipa::path(
    get, path = "/v1/sessions/{id}/tree", tag = "files", params(SessionId, PathQuery),
    responses((status = 200, description = "The tree below a folder, breadth-first, bounded", body = crate::files::Tree))
)]
pub(crate) async fn tree(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<Response, ApiError> {
    for_session(&state, &headers, &id).await?;
    let started = Instant::now();
    let ws = state.core.files(&id).await?;
    let p = q.path.clone();
    let tree = tokio::task::spawn_blocking(move || ws.tree(&p, TreeLimits::default()))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(ApiError::from);
    let o = outcome(&tree, |_| None);
    state
        .core
        .record(&id, &actor(&headers), Op::Ls, &q.path, o, started);
    Ok(Json(tree?).into_response())
}

#[utoipa::path(
    get, path = "/v1/runtimes", tag = "runtimes",
    responses((status = 200, description = "The allowlist and the state of each runtime's image", body = crate::runtimes::RuntimeList))
)]
pub(crate) async fn runtimes(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    caller(&state, &headers).await?;
    Ok(Json(crate::pool::runtime_list(&state.core)).into_response())
}

/// Replaces the allowlist with a catalog (the JSON array of `catalog/runtimes.json`), validated
/// whole first: a malformed one changes nothing and answers 422 `invalid_catalog` listing every
/// error. Runtimes whose definition is unchanged keep their image; the others are built in the
/// background.
#[utoipa::path(
    put, path = "/v1/runtimes", tag = "runtimes",
    request_body(content = Vec<sandboxd_catalog::CatalogEntry>, description = "The whole catalog (the format of catalog/runtimes.json)"),
    responses((status = 200, description = "The new allowlist; changed runtimes build in the background", body = crate::runtimes::RuntimeList))
)]
pub(crate) async fn put_runtimes(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    admin(&state, &headers).await?;
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::bad_request("the catalog must be UTF-8 JSON"))?;
    let entries = sandboxd_catalog::parse(text)
        .map_err(|e| ApiError::new(422, ErrorCode::InvalidCatalog, e.to_string()))?;
    state
        .core
        .runtimes()
        .replace(crate::runtimes::Allowlist {
            entries,
            catalog: true,
        })
        .await;
    // A changed or removed runtime's warm pool is drained, a new one filled.
    state.core.pool().changed();
    Ok(Json(crate::pool::runtime_list(&state.core)).into_response())
}

#[utoipa::path(
    get, path = "/v1/policy", tag = "policy",
    responses((status = 200, description = "The live policy and what needs a restart", body = crate::policy::PolicyView))
)]
pub(crate) async fn policy(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admin(&state, &headers).await?;
    Ok(Json(state.core.policy_view()).into_response())
}

#[utoipa::path(
    put, path = "/v1/policy", tag = "policy",
    request_body(content = PolicyChange, description = "The live fields to change; any other field is refused"),
    responses((status = 200, description = "The policy, changed", body = crate::policy::PolicyView))
)]
pub(crate) async fn put_policy(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    admin(&state, &headers).await?;
    let fields = crate::policy::fields(&body)?;
    Ok(Json(state.core.set_policy(&fields)?).into_response())
}

/// Pages through the audit log, newest first. A session token sees only its own session.
#[utoipa::path(
    get, path = "/v1/operations", tag = "operations", params(OperationQuery),
    responses((status = 200, description = "One page of the audit log, newest first", body = crate::audit::OperationPage))
)]
pub(crate) async fn operations(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let mut q: OperationQuery = serde_urlencoded::from_str(raw.as_deref().unwrap_or_default())
        .map_err(|e| {
            ApiError::bad_request(format!(
                "invalid operations query: {e}; the filters are session, tenant, agent, run, op, failed, q, cursor and limit"
            ))
        })?;
    match caller(&state, &headers).await? {
        Caller::Admin => {}
        Caller::Session(own) => match q.session.as_deref() {
            Some(other) if other != own => {
                return Err(ApiError::forbidden(
                    "a session token sees only its own session's operations",
                ));
            }
            _ => q.session = Some(own),
        },
    }
    let page = state.core.audit().query(&q).await.map_err(|e| match e {
        crate::audit::AuditError::BadQuery(m) => ApiError::bad_request(m),
        other => ApiError::internal(other.to_string()),
    })?;
    Ok(Json(page).into_response())
}

/// The body of `GET /v1/sessions`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct SessionList {
    /// Every session of this host.
    sessions: Vec<crate::core::SessionView>,
}

/// The body of `POST /v1/sessions/{id}/token`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct TokenRotated {
    /// The session.
    id: String,
    /// Its new token.
    token: String,
}

/// The body of `POST /v1/sessions/{id}/runs/{run_id}/stop`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct RunStopping {
    /// The run.
    run_id: String,
    /// Always true: the run is being stopped.
    stopping: bool,
}

/// The body of a file write.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Written {
    /// The path, as requested.
    path: String,
    /// The size of the file written.
    size: u64,
}

/// The body of a file remove.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Removed {
    /// The path, as requested.
    path: String,
    /// Always true.
    removed: bool,
}

/// The body of a mkdir.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Made {
    /// The folder, as requested.
    path: String,
}

/// The body of `GET /v1/sessions/{id}/ls`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct LsResponse {
    /// The folder, as requested.
    path: String,
    /// Its entries, sorted by name.
    entries: Vec<crate::files::Entry>,
    /// It holds more entries than `max_entries`.
    truncated: bool,
    /// The most entries listed.
    max_entries: usize,
}
