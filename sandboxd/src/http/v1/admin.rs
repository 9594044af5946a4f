//! The service's own routes: the index, health and metrics, the runtimes, the live policy and
//! the audit log.

use super::*;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::http::error::ApiError;
use crate::http::openapi::PolicyChange;
use crate::metrics::StateLabel;
use crate::storage::audit::OperationQuery;

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
            .chain(crate::http::wire::ROUTES.iter())
            .map(|r| (*r).to_owned())
            .collect(),
    };
    let mut body = serde_json::to_value(index).map_err(|e| ApiError::internal(e.to_string()))?;
    if let Some(map) = body.as_object_mut() {
        map.extend(crate::http::wire::index_fields(&state.core).await?);
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
    Ok(Json(crate::http::wire::health(&state.core).await?))
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
    Ok(Json(crate::service::pool::runtime_list(&state.core)).into_response())
}

#[utoipa::path(
    get, path = "/v1/policy", tag = "policy",
    responses((status = 200, description = "The live policy and what needs a restart", body = crate::service::policy::PolicyView))
)]
pub(crate) async fn policy(State(state): State<AppState>, _: Admin) -> Result<Response, ApiError> {
    Ok(Json(state.core.policy_view()).into_response())
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

/// Pages through the audit log, newest first. A session token sees only its own session.
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
                "invalid operations query: {e}; the filters are session, tenant, agent, run, op, failed, q, cursor and limit"
            ))
        })?;
    match caller {
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
        crate::storage::audit::AuditError::BadQuery(m) => ApiError::bad_request(m),
        other => ApiError::internal(other.to_string()),
    })?;
    Ok(Json(page).into_response())
}
