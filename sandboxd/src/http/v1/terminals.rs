//! Terminals: open, list and kill in JSON; attach over a WebSocket that carries the terminal's
//! output (binary messages, its scrollback first) and its input and size (binary and text
//! messages, [`TerminalMessage`]). The terminal lives in the sandbox's agent: a WebSocket that
//! breaks leaves it running, and the next attach finds its scrollback.

use super::*;

use axum::Json;
use axum::body::Bytes;
use axum::extract::ws::{
    Message, WebSocket, WebSocketUpgrade, rejection::WebSocketUpgradeRejection,
};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::sync::atomic::{AtomicU64, Ordering};

use futures::{SinkExt as _, StreamExt as _};
use sandboxd_api::terminal::{
    Terminal, TerminalKilled, TerminalList, TerminalMessage, TerminalRequest, check_size,
};

use super::openapi::{SessionId, TerminalId};
use crate::http::error::ApiError;
use crate::run::terminal::{TermAttach, TermEvent};
use crate::service::{Core, terminal_view};

/// How often an attached WebSocket is pinged: a client gone without a close is found out when
/// a ping cannot be written.
const PING_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

#[utoipa::path(
    post, path = "/v1/sessions/{id}/terminals", tag = "terminals", params(SessionId),
    request_body = TerminalRequest,
    responses((status = 201, description = "The terminal runs; attach to it to see and type", body = Terminal))
)]
pub(crate) async fn open_terminal(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: ForSession,
    who: Actor,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: TerminalRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid terminal request: {e}")))?;
    let terminal = state.core.open_terminal(&id, &who, req).await?;
    Ok((StatusCode::CREATED, Json(terminal)).into_response())
}

#[utoipa::path(
    get, path = "/v1/sessions/{id}/terminals", tag = "terminals", params(SessionId),
    responses((status = 200, description = "The session's terminals, running ones first, then recently ended ones (none while it sleeps)", body = TerminalList))
)]
pub(crate) async fn terminals(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: ForSession,
) -> Result<Response, ApiError> {
    let terminals = state.core.terminals(&id).await?;
    Ok(Json(TerminalList { terminals }).into_response())
}

#[utoipa::path(
    delete, path = "/v1/sessions/{id}/terminals/{terminal_id}", tag = "terminals",
    params(SessionId, TerminalId),
    responses((status = 200, description = "The terminal's program and everything it started are being ended (SIGHUP, then SIGKILL)", body = TerminalKilled))
)]
pub(crate) async fn kill_terminal(
    State(state): State<AppState>,
    Path((id, terminal_id)): Path<(String, String)>,
    _: ForSession,
    who: Actor,
) -> Result<Response, ApiError> {
    state.core.kill_terminal(&id, &who, &terminal_id).await?;
    Ok(Json(TerminalKilled {
        id: terminal_id,
        killed: true,
    })
    .into_response())
}

#[utoipa::path(
    get, path = "/v1/sessions/{id}/terminals/{terminal_id}/attach", tag = "terminals",
    params(SessionId, TerminalId),
    responses((status = 101, description = "A WebSocket. From sandboxd: a text `attached` message (`TerminalMessage`), then binary messages of output (the scrollback, up to the last 1 MiB, then live), and last a text `exit` (or `error`) message. From the client: binary messages of input, text `resize` and `input` messages. Closing it detaches; the terminal runs on. A sleeping session is woken first", body = TerminalMessage))
)]
pub(crate) async fn attach_terminal(
    State(state): State<AppState>,
    Path((id, terminal_id)): Path<(String, String)>,
    _: ForSession,
    who: Actor,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let ws = ws.map_err(|e| {
        ApiError::bad_request(format!(
            "this route is a WebSocket (GET with `Connection: Upgrade` and `Upgrade: websocket`): {e}"
        ))
    })?;
    // Attached before the upgrade: an unknown terminal, a session that cannot wake, is an
    // answer in JSON, not a WebSocket that closes at once.
    let attach = state.core.attach_terminal(&id, &terminal_id).await?;
    let core = state.core.clone();
    Ok(ws.on_upgrade(move |socket| bridge(socket, core, id, who, attach)))
}

/// Carries a terminal between its WebSocket and its agent connection until either ends: the
/// client going away detaches (the terminal runs on), the terminal ending closes the socket.
async fn bridge(
    socket: WebSocket,
    core: std::sync::Arc<Core>,
    id: String,
    who: Actor,
    attach: TermAttach,
) {
    let TermAttach {
        term,
        scrollback,
        mut output,
        mut input,
    } = attach;
    let (mut sink, mut stream) = socket.split();
    // What this attach carried, past what the terminal had done when it began (its scrollback
    // was counted then): the byte counts of its end.
    let typed = AtomicU64::new(0);
    let printed = AtomicU64::new(0);
    let attached = TerminalMessage::Attached {
        terminal: terminal_view(term.clone()),
        scrollback,
    };
    if sink.send(text(&attached)).await.is_err() {
        return;
    }
    let outbound = async {
        let mut active = 0;
        let mut ping = tokio::time::interval(PING_EVERY);
        ping.tick().await;
        let mut next = Box::pin(output.next());
        let last = loop {
            tokio::select! {
                event = &mut next => {
                    match event {
                        Ok(Some(TermEvent::Output(bytes))) => {
                            printed.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                            core.terminal_activity(&id, &mut active).await;
                            if sink.send(Message::Binary(bytes.into())).await.is_err() {
                                return;
                            }
                        }
                        Ok(Some(TermEvent::Exit(exit))) => {
                            let mut ended = term.clone();
                            ended.input_bytes += typed.load(Ordering::Relaxed);
                            ended.output_bytes += printed.load(Ordering::Relaxed).saturating_sub(scrollback);
                            core.terminal_ended(&id, &who, &ended, &exit);
                            break TerminalMessage::Exit {
                                exit_code: exit.exit_code,
                                reason: exit.reason,
                            };
                        }
                        Ok(None) | Err(_) => break TerminalMessage::Error {
                            code: "terminal_lost".to_owned(),
                            message: "the connection to the sandbox ended (its container stopped or sandboxd is leaving); the terminal may run on: attach again to see".to_owned(),
                        },
                    }
                    drop(next);
                    next = Box::pin(output.next());
                }
                _ = ping.tick() => {
                    if sink.send(Message::Ping(Bytes::new())).await.is_err() {
                        return;
                    }
                }
            }
        };
        let _ = sink.send(text(&last)).await;
        let _ = sink.close().await;
    };
    let inbound = async {
        let mut active = 0;
        while let Some(Ok(message)) = stream.next().await {
            let sent = match message {
                Message::Binary(bytes) => {
                    typed.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    input.send(&bytes).await
                }
                Message::Text(t) => match serde_json::from_str::<TerminalMessage>(t.as_str()) {
                    Ok(TerminalMessage::Input { data }) => {
                        typed.fetch_add(data.len() as u64, Ordering::Relaxed);
                        input.send(data.as_bytes()).await
                    }
                    Ok(TerminalMessage::Resize { rows, cols })
                        if check_size(rows, cols).is_ok() =>
                    {
                        input.resize(rows, cols).await
                    }
                    // A size out of bounds or a message that is not the client's: ignored, the
                    // terminal goes on.
                    _ => Ok(()),
                },
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => Ok(()),
            };
            if sent.is_err() {
                break;
            }
            core.terminal_activity(&id, &mut active).await;
        }
    };
    tokio::select! {
        () = outbound => {}
        () = inbound => {}
    }
}

/// A text message of the terminal's WebSocket.
fn text(m: &TerminalMessage) -> Message {
    // Serializing a plain enum cannot fail.
    Message::Text(serde_json::to_string(m).unwrap_or_default().into())
}
