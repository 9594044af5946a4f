//! Index and health: the fields the protocol's `ServiceIndex` and `ServiceHealth` carry, served
//! by `/v1`'s `GET /` and `GET /healthz`.

use super::*;

use serde_json::{Value, json};

use crate::http::error::ApiError;
use crate::service::Core;
use crate::storage::store::State as SessionState;

/// `ServiceHealth`: liveness and capacity, from the sessions counted by state (never a walk
/// over every session). `status` is `ok`, or `unavailable` with `problems`, one sentence each
/// (Docker does not answer, the sandbox network's firewall is not whole).
pub async fn health(core: &Core) -> Result<Value, ApiError> {
    let counts = core
        .session_counts()
        .await
        .map_err(|e| ApiError::internal(format!("state store: {e}")))?;
    let problems = core.problems().await;
    let mut runtimes = core.runtimes().aliases();
    runtimes.sort();
    let mut health = json!({
        "status": if problems.is_empty() { "ok" } else { "unavailable" },
        "sessions": counts.get(SessionState::Running),
        "limit": core.policy().max_sessions,
        "open_sessions": counts.total(),
        "open_limit": null,
        "runtimes": runtimes,
    });
    if !problems.is_empty() {
        health["problems"] = json!(problems);
    }
    Ok(health)
}

/// The protocol's index fields (`ServiceIndex`), added to the `/v1` index, plus which release
/// of the protocol this is.
pub async fn index_fields(core: &Core) -> Result<serde_json::Map<String, Value>, ApiError> {
    let mut endpoints: Vec<String> = ROUTES
        .iter()
        .chain(sandboxd_api::routes::ROUTES.iter())
        .filter_map(|r| r.split_once(' ').map(|(_, path)| path.to_owned()))
        .filter(|p| p != "/")
        .collect();
    endpoints.sort();
    endpoints.dedup();
    let mut m = serde_json::Map::new();
    m.insert("health".into(), health(core).await?);
    m.insert("docs_url".into(), json!("/"));
    m.insert("openapi_url".into(), json!("/wire/openapi.json"));
    m.insert("ui_url".into(), Value::Null);
    m.insert("endpoints".into(), json!(endpoints));
    m.insert(
        "wire".into(),
        json!({"package": PACKAGE, "release": release(), "token_header": "X-Sandbox-Token"}),
    );
    Ok(m)
}
