//! The service's own routes, shared by both surfaces: the index (every route of both, and the
//! wire protocol's index fields), health (the chart's readiness probe) and metrics. Listed
//! among `/v1`'s paths and in its document.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use sandboxd_api::routes::{Index, ROUTES};

use crate::http::error::ApiError;
use crate::http::state::AppState;
use crate::metrics::StateLabel;

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

/// Health: `{"status": "ok"}` and the wire protocol's capacity summary (`ServiceHealth`);
/// 503 with `{"status": "unavailable", "problems": [...]}` while Docker does not answer or
/// the sandbox network's firewall is not whole (the chart's readiness probe).
#[utoipa::path(
    get, path = "/healthz", tag = "service", security(()),
    responses(
        (status = 200, description = "`{\"status\": \"ok\"}` and the capacity summary", body = Object),
        (status = 503, description = "`{\"status\": \"unavailable\", \"problems\": [...]}`: what keeps the host from serving, one sentence each, and the capacity summary", body = Object)
    )
)]
pub(crate) async fn healthz(State(state): State<AppState>) -> Result<Response, ApiError> {
    let health = crate::http::wire::health(&state.core).await?;
    let status = if health["status"] == "ok" {
        axum::http::StatusCode::OK
    } else {
        axum::http::StatusCode::SERVICE_UNAVAILABLE
    };
    Ok((status, Json(health)).into_response())
}

#[utoipa::path(
    get, path = "/metrics", tag = "service", security(()),
    responses((status = 200, description = "Prometheus metrics", body = String, content_type = "application/openmetrics-text"))
)]
pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    // Counted by state in the store, at most once a second: no walk over the sessions.
    if let Ok(counts) = state.core.session_counts().await {
        state.metrics.sessions.clear();
        // Every state has its series; those without sessions at 0.
        for session_state in crate::storage::store::State::ALL {
            let _ = state.metrics.sessions.get_or_create(&StateLabel {
                state: session_state.as_str().to_owned(),
            });
        }
        for (session_state, n) in counts.iter() {
            state
                .metrics
                .sessions
                .get_or_create(&StateLabel {
                    state: session_state.as_str().to_owned(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
    // The budget and what the workspaces hold of it, as `GET /v1/policy` reports them.
    let bytes = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
    state.metrics.workspace_budget.set(
        state
            .core
            .policy_view()
            .fixed
            .workspace_budget
            .map_or(0, bytes),
    );
    if let Ok(held) = state.core.workspace_bytes().await {
        state.metrics.workspace_held.set(bytes(held));
    }
    let (queued, size) = state.core.audit().queued();
    let rows = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    state.metrics.audit_queue.set(rows(queued));
    state.metrics.audit_queue_capacity.set(rows(size));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}
