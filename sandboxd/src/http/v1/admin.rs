//! The admin routes of `/v1`: the runtimes, the live policy and the audit log.

use super::*;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::openapi::PolicyChange;
use crate::http::error::ApiError;
use crate::storage::audit::{OperationQuery, StreamQuery};

#[utoipa::path(
    get, path = "/v1/runtimes", tag = "runtimes",
    responses((status = 200, description = "The allowlist and the state of each runtime's image", body = crate::runtimes::RuntimeList))
)]
pub(crate) async fn runtimes(
    State(state): State<AppState>,
    _: Caller,
) -> Result<Response, ApiError> {
    Ok(Json(crate::service::pool::runtime_list(&state.core)).into_response())
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
    _: Admin,
    body: Bytes,
) -> Result<Response, ApiError> {
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::bad_request("the catalog must be UTF-8 JSON"))?;
    let entries =
        sandboxd_catalog::parse(text).map_err(crate::runtimes::RuntimeError::InvalidCatalog)?;
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
    // A runtime whose egress mode changed takes its running sandboxes to its new network.
    state.core.follow_egress_modes().await;
    Ok(Json(crate::service::pool::runtime_list(&state.core)).into_response())
}

#[utoipa::path(
    get, path = "/v1/policy", tag = "policy",
    responses((status = 200, description = "The live policy and what needs a restart", body = crate::service::policy::PolicyView))
)]
pub(crate) async fn policy(State(state): State<AppState>, _: Admin) -> Result<Response, ApiError> {
    Ok(Json(state.core.policy_view_with_use().await).into_response())
}

#[utoipa::path(
    put, path = "/v1/policy", tag = "policy",
    request_body(content = PolicyChange, description = "The live fields to change; any other field is refused"),
    responses((status = 200, description = "The policy, changed", body = crate::service::policy::PolicyView))
)]
pub(crate) async fn put_policy(
    State(state): State<AppState>,
    _: Admin,
    body: Bytes,
) -> Result<Response, ApiError> {
    let fields = crate::service::policy::fields(&body)?;
    Ok(Json(state.core.set_policy(&fields)?).into_response())
}

/// Pages through the audit log, newest first. A session token sees only its own session's
/// rows of its own incarnation; the admin token sees every row.
#[utoipa::path(
    get, path = "/v1/operations", tag = "operations", params(OperationQuery),
    responses((status = 200, description = "One page of the audit log, newest first", body = crate::storage::audit::OperationPage))
)]
pub(crate) async fn operations(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
    caller: Caller,
) -> Result<Response, ApiError> {
    let mut q: OperationQuery = serde_urlencoded::from_str(raw.as_deref().unwrap_or_default())
        .map_err(|e| {
            ApiError::bad_request(format!(
                "invalid operations query: {e}; the filters are session, tenant, agent, run, incarnation, op, failed, q, cursor and limit"
            ))
        })?;
    match caller {
        Caller::Admin => {}
        Caller::Session(own) => {
            if q.session.as_deref().is_some_and(|other| other != own) {
                return Err(ApiError::forbidden(
                    "a session token sees only its own session's operations",
                ));
            }
            // Only this incarnation's rows: not those of an earlier session of the same id.
            let mine = state.core.incarnation(&own).await?;
            if q.incarnation.as_deref().is_some_and(|other| other != mine) {
                return Err(ApiError::forbidden(
                    "a session token sees only its own incarnation's operations",
                ));
            }
            q.session = Some(own);
            q.incarnation = Some(mine);
        }
    }
    let page = state.core.audit().query(&q).await.map_err(|e| match e {
        crate::storage::audit::AuditError::BadQuery(m) => ApiError::bad_request(m),
        other => ApiError::internal(other.to_string()),
    })?;
    Ok(Json(page).into_response())
}

/// Rows the stream reads from the store at a time.
const STREAM_BATCH: u32 = 500;
/// How long the stream waits before it looks for new rows, once it has sent every row.
const STREAM_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// The audit log as JSON lines, for the admin: every row after `after`, oldest first, then
/// each new row as it is written, for as long as the client reads. Each line is a row as
/// `GET /v1/operations` shows it; its `id` is the cursor to resume from (`?after=<id>`), also
/// after sandboxd restarts: no row is sent twice or left out.
#[utoipa::path(
    get, path = "/v1/operations/stream", tag = "operations", params(StreamQuery),
    responses((status = 200, description = "The audit log's rows after the cursor, one JSON object a line, then each new row as it is written", body = crate::storage::audit::Operation, content_type = "application/x-ndjson"))
)]
pub(crate) async fn operations_stream(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
    _: Admin,
) -> Result<Response, ApiError> {
    let q: StreamQuery = serde_urlencoded::from_str(raw.as_deref().unwrap_or_default())
        .map_err(|e| {
            ApiError::bad_request(format!(
                "invalid stream query: {e}; the one parameter is after (the id of the last row received)"
            ))
        })?;
    let after = match q.after.as_deref() {
        None => 0,
        Some(a) => a.parse::<i64>().map_err(|_| {
            ApiError::bad_request(format!(
                "after '{a}' is not a row id; pass the id of the last row received"
            ))
        })?,
    };
    let core = state.core.clone();
    // Ends when the client goes (the body is dropped) or the store fails (the connection is
    // closed; the client resumes from its last id).
    let stream = futures::stream::unfold(Some(after), move |cursor| {
        let core = core.clone();
        async move {
            let mut after = cursor?;
            loop {
                match core.audit().after(after, STREAM_BATCH).await {
                    Ok(rows) if rows.is_empty() => tokio::time::sleep(STREAM_POLL).await,
                    Ok(rows) => {
                        let mut chunk = Vec::new();
                        for row in &rows {
                            if serde_json::to_writer(&mut chunk, row).is_ok() {
                                chunk.push(b'\n');
                            }
                            after = row.id;
                        }
                        return Some((Ok(Bytes::from(chunk)), Some(after)));
                    }
                    Err(e) => {
                        return Some((Err(std::io::Error::other(e.to_string())), None));
                    }
                }
            }
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(stream),
    )
        .into_response())
}
