//! File watch: `GET /v1/sessions/{id}/watch?path=&recursive=` answers Server-Sent Events, one
//! a change (`created`, `modified`, `deleted`, `renamed`), each named by its kind with JSON
//! data (`{"path","to"?,"dir"}`, paths from the workspace root); `watching` first, `limit` when
//! a folder was left out, `overflow` when changes were lost; `sleeping` when the session's
//! sandbox stops and `resumed` when it runs again (changes made meanwhile are not reported);
//! `ended` when the session is gone. Closing the stream ends the watch.

use super::*;

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::openapi::SessionId;
use crate::http::error::ApiError;
use crate::run::watch::Watch;
use crate::service::watches::{WatchSlot, Watched};
use crate::service::{Core, ServiceError};

/// How often a watch of a sleeping session looks whether it runs again.
const RESUME_EVERY: Duration = Duration::from_secs(1);

/// `?path=&recursive=`: what a watch watches.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct WatchQuery {
    /// The folder, relative to the workspace root (absent: the root).
    #[serde(default)]
    path: String,
    /// Every folder below it too (those made later included).
    #[serde(default)]
    recursive: bool,
}

#[utoipa::path(
    get, path = "/v1/sessions/{id}/watch", tag = "files", params(SessionId, WatchQuery),
    responses((status = 200, description = "Server-Sent Events until the client closes the stream: `watching` (`{\"path\",\"recursive\",\"watched\"}`: folders watched), then one event a change named by its kind, `created`, `modified`, `deleted` or `renamed`, with `{\"path\",\"to\"?,\"dir\"}` (paths from the workspace root; `to` for a rename); `limit` (`{\"path\"}`, a folder left out: SANDBOXD_WATCH_MAX_FOLDERS), `overflow` (changes lost), `sleeping` and `resumed` around a sleep of the session (changes made while it slept are not reported), `ended` when the session is gone. A sleeping session is woken to start the watch", content_type = "text/event-stream"))
)]
pub(crate) async fn watch(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<WatchQuery>,
    _: ForSession,
) -> Result<Response, ApiError> {
    let (watched, first, slot) = state.core.watch(&id, &q.path, q.recursive).await?;
    let (tx, rx) = mpsc::channel::<Event>(64);
    tokio::spawn(follow(state.core.clone(), id, watched, first, slot, tx));
    let events = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Sends one event; false once the client is gone.
async fn send(tx: &mpsc::Sender<Event>, kind: &str, data: Value) -> bool {
    tx.send(Event::default().event(kind).data(data.to_string()))
        .await
        .is_ok()
}

/// Follows the watch until the client goes: its changes, then across each sleep of the
/// session a `sleeping` and, once it runs again and is watched anew, a `resumed`.
async fn follow(
    core: std::sync::Arc<Core>,
    id: String,
    watched: Watched,
    first: Watch,
    _slot: WatchSlot,
    tx: mpsc::Sender<Event>,
) {
    let mut watch = Some(first);
    let mut kind = "watching";
    loop {
        if let Some(mut w) = watch.take() {
            let header =
                json!({"path": watched.path, "recursive": watched.recursive, "watched": w.watched});
            if !send(&tx, kind, header).await {
                return;
            }
            loop {
                let next = tokio::select! {
                    next = w.next() => next,
                    () = tx.closed() => return,
                };
                let Ok(Some(events)) = next else { break };
                for e in events {
                    let data = json!({
                        "path": watched.shown(&e.path),
                        "to": e.to.as_deref().map(|t| watched.shown(t)),
                        "dir": e.dir,
                    });
                    if !send(&tx, &e.kind, data).await {
                        return;
                    }
                }
            }
        }
        let asleep = json!({"message": "the session's sandbox stopped; the watch resumes when it runs again (changes made meanwhile are not reported)"});
        if !send(&tx, "sleeping", asleep).await {
            return;
        }
        loop {
            tokio::select! {
                () = tokio::time::sleep(RESUME_EVERY) => {}
                () = tx.closed() => return,
            }
            match core.runs_now(&id).await {
                Ok(true) => match core.rewatch(&id, &watched).await {
                    Ok(w) => {
                        watch = Some(w);
                        kind = "resumed";
                        break;
                    }
                    Err(ServiceError::InvalidRequest(why)) => {
                        let _ = send(&tx, "ended", json!({ "message": why })).await;
                        return;
                    }
                    // Its agent is not listening yet: asked again.
                    Err(_) => {}
                },
                Ok(false) => {}
                Err(e) => {
                    let _ = send(&tx, "ended", json!({ "message": e.to_string() })).await;
                    return;
                }
            }
        }
    }
}
