//! An MCP server per session: `POST /v1/sessions/{id}/mcp`, the Model Context Protocol's
//! Streamable HTTP transport, authenticated by the session's token (or the admin token) like
//! every `/v1` route. Its tools act on that session's sandbox and workspace ([`tools`]); its
//! resources are the workspace's files (`file:///workspace/<path>`).
//!
//! The server is stateless: it issues no `Mcp-Session-Id`, every POST carries one JSON-RPC
//! message (or a batch) and is answered with one JSON body (`application/json`; never an
//! event stream, since no tool sends progress), a notification or a response with `202`; a batch
//! holds at most [`MAX_BATCH`] messages. A
//! `GET` (a server-to-client stream) and a `DELETE` (ending a protocol session) are answered
//! `405`, as the transport allows a server without them. It speaks the handshake revisions
//! [`PROTOCOL_VERSIONS`]; a request whose `MCP-Protocol-Version` names another is refused
//! with JSON-RPC error -32022 listing them (a client that probes a newer revision falls back
//! to `initialize`).

pub mod text;
mod tools;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::http::AppState;
use crate::http::error::{ApiError, ErrorCode};
use crate::http::extract::ForSession;
use crate::service::Actor;

pub use tools::RESOURCE_PREFIX;

/// The protocol revisions this server answers `initialize` with, newest first.
pub const PROTOCOL_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The largest request this route takes (a `write_file` carries the whole file).
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// The most messages one batch may hold: a batch is answered in one response, its calls one
/// after the other.
pub const MAX_BATCH: usize = 32;

/// The header naming the revision a client negotiated.
const VERSION_HEADER: &str = "mcp-protocol-version";

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL_ERROR: i64 = -32603;
const RESOURCE_NOT_FOUND: i64 = -32002;
const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// A JSON-RPC error answer to request `id`.
fn error(id: Value, code: i64, message: impl Into<String>, data: Option<Value>) -> Value {
    let mut e = json!({"code": code, "message": message.into()});
    if let Some(data) = data {
        e["data"] = data;
    }
    json!({"jsonrpc": "2.0", "id": id, "error": e})
}

fn refused(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/mcp", tag = "mcp", params(crate::http::v1::openapi::SessionId),
    request_body(content = Object, content_type = "application/json",
        description = "One JSON-RPC 2.0 message of the Model Context Protocol (or a batch): `initialize`, `ping`, `tools/list`, `tools/call`, `resources/list`, `resources/templates/list`, `resources/read`, or a notification"),
    responses(
        (status = 200, description = "The JSON-RPC answer (a JSON-RPC error is answered 200 too, except a malformed message and an unsupported protocol version: 400)", body = Object, content_type = "application/json"),
        (status = 202, description = "A notification or a response: accepted, no body"),
    )
)]
pub(crate) async fn mcp(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: ForSession,
    actor: Actor,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
        return ApiError::new(
            413,
            ErrorCode::TooLarge,
            format!("an MCP message takes at most {MAX_BODY_BYTES} bytes"),
        )
        .into_response();
    };
    if let Some(asked) = headers.get(VERSION_HEADER) {
        let asked = asked.to_str().unwrap_or_default();
        if !PROTOCOL_VERSIONS.contains(&asked) {
            return refused(
                StatusCode::BAD_REQUEST,
                error(
                    Value::Null,
                    UNSUPPORTED_PROTOCOL_VERSION,
                    format!(
                        "unsupported MCP protocol version '{asked}': this server speaks {}",
                        PROTOCOL_VERSIONS.join(", ")
                    ),
                    Some(json!({"supported": PROTOCOL_VERSIONS, "requested": asked})),
                ),
            );
        }
    }
    let message: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return refused(
                StatusCode::BAD_REQUEST,
                error(Value::Null, PARSE_ERROR, format!("Parse error: {e}"), None),
            );
        }
    };
    let caller = tools::Caller {
        state: &state,
        id: &id,
        actor: &actor,
    };
    match message {
        Value::Array(batch) if batch.len() > MAX_BATCH => refused(
            StatusCode::BAD_REQUEST,
            error(
                Value::Null,
                INVALID_REQUEST,
                format!(
                    "Invalid Request: a batch holds at most {MAX_BATCH} messages, not {}",
                    batch.len()
                ),
                None,
            ),
        ),
        Value::Array(batch) if !batch.is_empty() => {
            let mut answers = Vec::new();
            for m in batch {
                if let Some(a) = answer(&caller, m).await {
                    answers.push(a);
                }
            }
            if answers.is_empty() {
                StatusCode::ACCEPTED.into_response()
            } else {
                Json(Value::Array(answers)).into_response()
            }
        }
        m @ Value::Object(_) => match answer(&caller, m).await {
            Some(a) if a.get("error").is_some() && a["id"].is_null() => {
                refused(StatusCode::BAD_REQUEST, a)
            }
            Some(a) => Json(a).into_response(),
            None => StatusCode::ACCEPTED.into_response(),
        },
        _ => refused(
            StatusCode::BAD_REQUEST,
            error(
                Value::Null,
                INVALID_REQUEST,
                "Invalid Request: a JSON-RPC message is an object (or a non-empty array of them)",
                None,
            ),
        ),
    }
}

/// The answer to one JSON-RPC message: `None` for a notification or a response.
async fn answer(c: &tools::Caller<'_>, message: Value) -> Option<Value> {
    let id = message.get("id").cloned();
    let method = message.get("method").and_then(Value::as_str);
    if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Some(error(
            id.unwrap_or(Value::Null),
            INVALID_REQUEST,
            "Invalid Request: `jsonrpc` must be \"2.0\"",
            None,
        ));
    }
    let (Some(id), Some(method)) = (id, method) else {
        // A notification (a method without an id) or a response to nothing we asked: taken.
        if message.get("method").is_some() || message.get("id").is_some() {
            return None;
        }
        return Some(error(
            Value::Null,
            INVALID_REQUEST,
            "Invalid Request: a message names a `method`",
            None,
        ));
    };
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    Some(match request(c, method, params).await {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, why)) => error(id, code, why, None),
    })
}

/// The result of request `method`, or its JSON-RPC error.
async fn request(
    c: &tools::Caller<'_>,
    method: &str,
    params: Value,
) -> Result<Value, (i64, String)> {
    match method {
        "initialize" => {
            let asked = params
                .get("protocolVersion")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let version = PROTOCOL_VERSIONS
                .iter()
                .find(|v| **v == asked)
                .unwrap_or(&PROTOCOL_VERSIONS[0]);
            Ok(json!({
                "protocolVersion": version,
                "capabilities": {
                    "tools": {"listChanged": false},
                    "resources": {"subscribe": false, "listChanged": false},
                },
                "serverInfo": {"name": "sandboxd", "title": "sandboxd session", "version": env!("CARGO_PKG_VERSION")},
                "instructions": format!(
                    "The tools act in sandbox session '{}': commands run in /workspace as the sandbox user, and file paths are relative to /workspace (or absolute under it). Its files are resources at {RESOURCE_PREFIX}<path>.",
                    c.id
                ),
            }))
        }
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": tools::list()})),
        "tools/call" => {
            let name = params
                .get("name")
                .and_then(Value::as_str)
                .ok_or((INVALID_PARAMS, "tools/call names a tool: `name`".to_owned()))?;
            let arguments = params.get("arguments").cloned().unwrap_or(Value::Null);
            let answer = tools::call(c, name, arguments)
                .await
                .ok_or((INVALID_PARAMS, format!("Unknown tool: {name}")))?;
            c.state
                .core
                .metrics()
                .mcp_tool_calls
                .get_or_create(&crate::metrics::McpToolLabels {
                    tool: name.to_owned(),
                    outcome: if answer.is_error { "error" } else { "ok" }.to_owned(),
                })
                .inc();
            Ok(json!({
                "content": [{"type": "text", "text": answer.text}],
                "isError": answer.is_error,
            }))
        }
        "resources/list" => tools::resources(c)
            .await
            .map_err(|e| (INTERNAL_ERROR, e.message)),
        "resources/templates/list" => Ok(tools::templates()),
        "resources/read" => {
            let uri = params
                .get("uri")
                .and_then(Value::as_str)
                .ok_or((INVALID_PARAMS, "resources/read names a `uri`".to_owned()))?;
            tools::read_resource(c, uri).await.map_err(|e| match e {
                tools::ResourceError::NotOurs => (
                    INVALID_PARAMS,
                    format!("Unknown resource: {uri} (this server's resources are {RESOURCE_PREFIX}<path>)"),
                ),
                tools::ResourceError::NotFound => {
                    (RESOURCE_NOT_FOUND, format!("Resource not found: {uri}"))
                }
                tools::ResourceError::Failed(e) => (INTERNAL_ERROR, e.message),
            })
        }
        _ => Err((METHOD_NOT_FOUND, format!("Method not found: {method}"))),
    }
}
