//! Runs: a command, its output streamed as NDJSON or answered at its end; its status; stopping it.

use super::*;
use std::time::Instant;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::Instrument as _;

use super::openapi::{RunId, SessionId};
use crate::http::audited::record_run;
use crate::http::error::ApiError;
use crate::run::{RunEvent, RunOutcome, RunStatus};
use crate::service::{RunRequest, ServiceError};

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
    Path(id): Path<String>,
    Query(q): Query<RunQuery>,
    _: ForSession,
    who: Actor,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: RunRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid run request: {e}")))?;
    let command = req.command.clone();
    let started = Instant::now();
    if !q.stream {
        let result = state.core.run(&id, req, None, None).await;
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
    let (events_tx, mut events_rx) = mpsc::channel::<crate::run::RunEvent>(64);
    let core = state.core.clone();
    let caller_gone = tokio_util::sync::CancellationToken::new();
    let gone = caller_gone.clone();
    let over = tokio_util::sync::CancellationToken::new();
    let cut = tokio_util::sync::CancellationToken::new();
    let (run_over, cut_off) = (over.clone(), cut.clone());
    let (under_way_tx, under_way) = tokio::sync::oneshot::channel();
    // Both tasks keep the request's span (the run's trace, and its TRACEPARENT).
    let forwarding = async move {
        let run = tokio::spawn(
            async move {
                // A caller that went away stops the run: dropping it cancels it (see
                // `Core::run`).
                let result = tokio::select! {
                    result = core.run(&id, req, Some(events_tx), Some(under_way_tx)) => result,
                    () = gone.cancelled() => Err(ServiceError::RunCancelled),
                };
                record_run(&core, &id, &who, &command, &result, started);
                run_over.cancel();
                result
            }
            .in_current_span(),
        );
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
            Ok(Err(e)) => {
                let e = ApiError::from(e);
                json!({"type": "error", "code": e.code, "message": e.message})
            }
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
    };
    tokio::spawn(forwarding.in_current_span());
    // The answer starts once the run is under way (a stop of its id reaches it from then on) or
    // over (its error is the stream's one line): a client that starts a run in the background
    // and stops it at once is never told that no such run is running.
    let _ = under_way.await;
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
pub(super) const STREAM_DRAIN: std::time::Duration = std::time::Duration::from_secs(30);

/// The most a streamed chunk gathers from events already waiting.
pub(super) const STREAM_CHUNK: usize = 512 * 1024;

/// One NDJSON line of a run event.
pub(super) fn ndjson_line(out: &mut Vec<u8>, event: &crate::run::RunEvent) {
    let (crate::run::RunEvent::Stdout { data } | crate::run::RunEvent::Stderr { data }) = event;
    // Room for the text and its framing (escapes may need more; the Vec grows then).
    out.reserve(data.len() + 32);
    // Serializing a plain enum of strings into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, event);
    out.push(b'\n');
}

#[utoipa::path(
    get, path = "/v1/sessions/{id}/runs/{run_id}", tag = "runs", params(SessionId, RunId),
    responses((status = 200, description = "The run, in flight or finished", body = RunStatus))
)]
pub(crate) async fn run_status(
    State(state): State<AppState>,
    Path((id, run_id)): Path<(String, String)>,
    _: ForSession,
) -> Result<Response, ApiError> {
    Ok(Json(state.core.run_status(&id, &run_id).await?).into_response())
}

#[utoipa::path(
    post, path = "/v1/sessions/{id}/runs/{run_id}/stop", tag = "runs", params(SessionId, RunId),
    responses((status = 200, description = "The run is being stopped", body = RunStopping))
)]
pub(crate) async fn stop_run(
    State(state): State<AppState>,
    Path((id, run_id)): Path<(String, String)>,
    _: ForSession,
) -> Result<Response, ApiError> {
    state.core.stop_run_or_detached(&id, &run_id).await?;
    Ok(Json(RunStopping {
        run_id,
        stopping: true,
    })
    .into_response())
}

/// The body of `POST /v1/sessions/{id}/runs/{run_id}/stop`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct RunStopping {
    /// The run.
    run_id: String,
    /// Always true: the run is being stopped.
    stopping: bool,
}
