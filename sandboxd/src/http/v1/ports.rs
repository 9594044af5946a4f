//! Ports: which ports of a session's sandbox may be reached (open, close, list), and the
//! reaching: HTTP under `/v1/sessions/{id}/ports/{port}/…` (a WebSocket upgrade included),
//! passed to the port as a request to `/…` on `localhost:{port}`, and a raw TCP stream as a
//! WebSocket at `/v1/sessions/{id}/ports/{port}`. The session token never reaches the port.

use super::*;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::ws::{
    Message, WebSocket, WebSocketUpgrade, rejection::WebSocketUpgradeRejection,
};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt as _, StreamExt as _};
use hyper_util::rt::TokioIo;
use sandboxd_api::ports::{PortList, PortRequest, Preview, PreviewRequest};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::openapi::{Port, SessionId};
use crate::http::error::ApiError;
use crate::run::ports::{PortError, PortStream};
use crate::service::{PortRefusal, ServiceError};

/// Headers of one hop, never passed on (RFC 9110 7.6.1), and the caller's token.
const HOP_HEADERS: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "authorization",
];

#[utoipa::path(
    get, path = "/v1/sessions/{id}/ports", tag = "ports", params(SessionId),
    responses((status = 200, description = "The session's open ports", body = PortList))
)]
pub(crate) async fn ports(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: ForSession,
) -> Result<Response, ApiError> {
    let ports = state.core.ports(&id).await?;
    Ok(Json(PortList { ports }).into_response())
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/ports", tag = "ports", params(SessionId),
    request_body = PortRequest,
    responses((status = 200, description = "The port is open (it was already: nothing changed); the session's open ports", body = PortList))
)]
pub(crate) async fn open_port(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: ForSession,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: PortRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid port request: {e}")))?;
    let ports = state.core.open_port(&id, req.port).await?;
    Ok(Json(PortList { ports }).into_response())
}

#[utoipa::path(
    delete, path = "/v1/sessions/{id}/ports/{port}", tag = "ports", params(SessionId, Port),
    responses((status = 200, description = "The port is closed to new connections (those made go on); the session's open ports", body = PortList))
)]
pub(crate) async fn close_port(
    State(state): State<AppState>,
    Path((id, port)): Path<(String, u16)>,
    _: ForSession,
) -> Result<Response, ApiError> {
    let ports = state.core.close_port(&id, port).await?;
    Ok(Json(PortList { ports }).into_response())
}

#[utoipa::path(
    get, path = "/v1/sessions/{id}/ports/{port}", tag = "ports", params(SessionId, Port),
    responses((status = 101, description = "A WebSocket carrying a raw TCP connection to the port, made in the sandbox: binary messages each way are its bytes; an empty binary message from the client is the end of its input (the port may still answer); the port closing closes the socket, a Close from the client ends the connection (`kubectl sandbox port-forward` uses it)"))
)]
pub(crate) async fn port_stream(
    State(state): State<AppState>,
    Path((id, port)): Path<(String, u16)>,
    _: ForSession,
    who: Actor,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let ws = ws.map_err(|e| {
        ApiError::bad_request(format!(
            "this route is a WebSocket carrying a TCP stream (GET with `Connection: Upgrade` and `Upgrade: websocket`); HTTP to the port goes to /v1/sessions/{id}/ports/{port}/PATH: {e}"
        ))
    })?;
    let stream = state.core.connect_port(&id, &who, port, "stream").await?;
    Ok(ws.on_upgrade(move |socket| carry(socket, stream)))
}

/// Carries a TCP connection's bytes over a WebSocket until either side ends.
async fn carry(socket: WebSocket, stream: PortStream) {
    let (mut sink, mut from_client) = socket.split();
    let (mut from_port, mut to_port) = tokio::io::split(stream);
    let outbound = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from_port.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let bytes = Bytes::copy_from_slice(&buf[..n]);
                    if sink.send(Message::Binary(bytes)).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = sink.close().await;
    };
    let inbound = async {
        while let Some(Ok(message)) = from_client.next().await {
            let sent = match message {
                // An empty message is the end of the client's input: the port sees it, and
                // may still answer (a half-close; a Close ends the connection both ways).
                Message::Binary(bytes) if bytes.is_empty() => to_port.shutdown().await,
                Message::Binary(bytes) => to_port.write_all(&bytes).await,
                Message::Text(text) => to_port.write_all(text.as_bytes()).await,
                Message::Close(_) => return,
                Message::Ping(_) | Message::Pong(_) => Ok(()),
            };
            if sent.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = outbound => {}
        () = inbound => {}
    }
}

/// `ANY /v1/sessions/{id}/ports/{port}/{*path}`: the request, passed to the port.
#[utoipa::path(
    method(get, post, put, delete, patch), path = "/v1/sessions/{id}/ports/{port}/{path}", tag = "ports", params(SessionId, Port, super::openapi::PortPath),
    responses((status = 200, description = "What the port answered, as it answered it (any method: GET, POST, PUT, DELETE, PATCH, HEAD, OPTIONS; a WebSocket upgrade is carried through). The request goes to `/{path}` on `localhost:{port}` without the caller's token, with `X-Forwarded-Prefix: /v1/sessions/{id}/ports/{port}`"))
)]
pub(crate) async fn to_port(
    State(state): State<AppState>,
    Path((id, port, path)): Path<(String, u16, String)>,
    _: ForSession,
    who: Actor,
    req: Request,
) -> Result<Response, ApiError> {
    let prefix = format!("/v1/sessions/{id}/ports/{port}");
    forward(&state, &id, port, &path, &prefix, &who, req).await
}

/// `ANY /v1/sessions/{id}/ports/{port}/`: the port's root.
#[utoipa::path(
    method(get, post, put, delete, patch), path = "/v1/sessions/{id}/ports/{port}/", tag = "ports", params(SessionId, Port),
    responses((status = 200, description = "What the port answered to a request for `/` (as `/v1/sessions/{id}/ports/{port}/{path}` does for a path)"))
)]
pub(crate) async fn to_port_root(
    State(state): State<AppState>,
    Path((id, port)): Path<(String, u16)>,
    _: ForSession,
    who: Actor,
    req: Request,
) -> Result<Response, ApiError> {
    let prefix = format!("/v1/sessions/{id}/ports/{port}");
    forward(&state, &id, port, "", &prefix, &who, req).await
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/previews", tag = "ports", params(SessionId),
    request_body = PreviewRequest,
    responses((status = 201, description = "A signed preview link to an open port: `path` reaches it without the session token (for a browser) until `expires_at`", body = Preview))
)]
pub(crate) async fn open_preview(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: ForSession,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: PreviewRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid preview request: {e}")))?;
    let preview = state
        .core
        .preview(&id, req.port, req.expires_in_seconds)
        .await?;
    Ok((axum::http::StatusCode::CREATED, Json(preview)).into_response())
}

/// `ANY /preview/{token}/{*path}`: a request with a signed preview link, passed to its port.
#[utoipa::path(
    method(get, post, put, delete, patch), path = "/preview/{token}/{path}", tag = "ports", params(PreviewToken, super::openapi::PortPath),
    security(()),
    responses((status = 200, description = "What the port the link names answered (as `/v1/sessions/{id}/ports/{port}/{path}` passes it on), with `X-Forwarded-Prefix: /preview/{token}`; no other credential is needed"))
)]
pub(crate) async fn to_preview(
    State(state): State<AppState>,
    Path((token, path)): Path<(String, String)>,
    who: Actor,
    req: Request,
) -> Result<Response, ApiError> {
    let (id, port) = state.core.preview_target(&token).await?;
    forward(
        &state,
        &id,
        port,
        &path,
        &format!("/preview/{token}"),
        &who,
        req,
    )
    .await
}

/// `ANY /preview/{token}/`: the root of the port a preview link names.
#[utoipa::path(
    method(get, post, put, delete, patch), path = "/preview/{token}/", tag = "ports", params(PreviewToken),
    security(()),
    responses((status = 200, description = "What the port the link names answered to a request for `/`"))
)]
pub(crate) async fn to_preview_root(
    State(state): State<AppState>,
    Path(token): Path<String>,
    who: Actor,
    req: Request,
) -> Result<Response, ApiError> {
    let (id, port) = state.core.preview_target(&token).await?;
    forward(
        &state,
        &id,
        port,
        "",
        &format!("/preview/{token}"),
        &who,
        req,
    )
    .await
}

/// `GET /preview/{token}`: to the link's root with a slash, so the page's relative links
/// stay under the link.
#[utoipa::path(
    get, path = "/preview/{token}", tag = "ports", params(PreviewToken),
    security(()),
    responses((status = 308, description = "To `/preview/{token}/`"))
)]
pub(crate) async fn preview_bare(
    State(state): State<AppState>,
    Path(token): Path<String>,
) -> Result<Response, ApiError> {
    state.core.preview_target(&token).await?;
    Ok((
        axum::http::StatusCode::PERMANENT_REDIRECT,
        [(header::LOCATION, format!("/preview/{token}/"))],
    )
        .into_response())
}

/// `{token}`: a preview link's token.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct PreviewToken {
    /// The token, as `POST /v1/sessions/{id}/previews` answered it.
    #[allow(dead_code)]
    token: String,
}

/// Passes `req` to `/{path}` of the port and its answer back; the port is told the prefix it
/// is served under.
async fn forward(
    state: &AppState,
    id: &str,
    port: u16,
    path: &str,
    prefix: &str,
    who: &Actor,
    req: Request,
) -> Result<Response, ApiError> {
    let (mut parts, body) = req.into_parts();
    let upgrade = parts
        .headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let what = format!("{} /{path}", parts.method);
    let stream = state.core.connect_port(id, who, port, &what).await?;
    let closed = |e: String| {
        ApiError::from(ServiceError::Port(PortRefusal::Connect(PortError::Closed(
            format!("port {port} of session '{id}' closed the connection: {e}"),
        ))))
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| closed(e.to_string()))?;
    tokio::spawn(conn.with_upgrades());

    let query = parts
        .uri
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let mut out = axum::http::Request::builder()
        .method(parts.method.clone())
        .uri(format!("/{path}{query}"))
        .body(body)
        .map_err(|e| ApiError::bad_request(format!("the request cannot be passed on: {e}")))?;
    *out.headers_mut() = passed_on(&parts.headers, port, upgrade.as_deref(), prefix);
    let client_upgrade = upgrade
        .is_some()
        .then(|| parts.extensions.remove::<hyper::upgrade::OnUpgrade>())
        .flatten();

    let within = state.core.port_answer_timeout();
    let mut answer = match tokio::time::timeout(within, sender.send_request(out)).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => return Err(closed(e.to_string())),
        Err(_) => {
            return Err(ServiceError::Port(PortRefusal::Timeout {
                id: id.to_owned(),
                port,
                seconds: within.as_secs(),
            })
            .into());
        }
    };
    if answer.status() == axum::http::StatusCode::SWITCHING_PROTOCOLS
        && let Some(client) = client_upgrade
    {
        let app = hyper::upgrade::on(&mut answer);
        tokio::spawn(async move {
            if let (Ok(client), Ok(app)) = (client.await, app.await) {
                let _ = tokio::io::copy_bidirectional(
                    &mut TokioIo::new(client),
                    &mut TokioIo::new(app),
                )
                .await;
            }
        });
        let (parts, _) = answer.into_parts();
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, body) = answer.into_parts();
    for h in HOP_HEADERS {
        parts.headers.remove(h);
    }
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// The headers the port gets: the caller's, without those of one hop and without the token;
/// `Host` the port's; the prefix it is served under; an upgrade kept as asked.
fn passed_on(headers: &HeaderMap, port: u16, upgrade: Option<&str>, prefix: &str) -> HeaderMap {
    let mut out = headers.clone();
    for h in HOP_HEADERS {
        out.remove(h);
    }
    if let Some(connection) = headers.get(header::CONNECTION) {
        // Headers the caller named as of this hop go too.
        for named in connection.to_str().unwrap_or_default().split(',') {
            out.remove(named.trim());
        }
    }
    if let Ok(host) = HeaderValue::from_str(&format!("localhost:{port}")) {
        out.insert(header::HOST, host);
    }
    if let Ok(prefix) = HeaderValue::from_str(prefix) {
        out.insert("x-forwarded-prefix", prefix);
    }
    if let Some(upgrade) = upgrade.and_then(|u| HeaderValue::from_str(u).ok()) {
        out.insert(header::UPGRADE, upgrade);
        out.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_and_one_hops_headers_never_reach_the_port() {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer sbx_secret"),
        );
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-hop"),
        );
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("x-kept", HeaderValue::from_static("2"));
        h.insert(header::HOST, HeaderValue::from_static("sandboxd:8080"));
        let out = passed_on(&h, 3000, None, "/v1/sessions/s1/ports/3000");
        assert!(out.get(header::AUTHORIZATION).is_none());
        assert!(out.get("x-hop").is_none() && out.get(header::CONNECTION).is_none());
        assert_eq!(out.get("x-kept").map(|v| v.as_bytes()), Some(&b"2"[..]));
        assert_eq!(
            out.get(header::HOST).map(|v| v.as_bytes()),
            Some(&b"localhost:3000"[..])
        );
        assert_eq!(
            out.get("x-forwarded-prefix").map(|v| v.as_bytes()),
            Some(&b"/v1/sessions/s1/ports/3000"[..])
        );
        let up = passed_on(&h, 3000, Some("websocket"), "/v1/sessions/s1/ports/3000");
        assert_eq!(
            up.get(header::UPGRADE).map(|v| v.as_bytes()),
            Some(&b"websocket"[..])
        );
        assert_eq!(
            up.get(header::CONNECTION).map(|v| v.as_bytes()),
            Some(&b"upgrade"[..])
        );
    }
}
