//! `/healthz`, `/readyz` and `/metrics`: three fixed answers served with hyper directly (no
//! web framework is needed for them, and none comes into the operator's or the CLI's build).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use crate::metrics::Metrics;

/// What the endpoints report.
#[derive(Clone)]
pub struct Health {
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Set once start-up checks passed (CRDs installed).
    pub ready: Arc<AtomicBool>,
}

const TEXT: &str = "text/plain; charset=utf-8";
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves the endpoints on `addr`; returns the bound address.
pub async fn serve(addr: SocketAddr, health: Health) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, for one: wait a little rather than spin.
                    tracing::warn!(error = %e, "the health endpoint could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let health = health.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let answer = answer(&health, req.method(), req.uri().path());
                    async move { Ok::<_, Infallible>(answer) }
                });
                // A client that goes away mid-request is no error of ours.
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(bound)
}

/// The answer to `method path`.
fn answer(h: &Health, method: &Method, path: &str) -> Response<Full<Bytes>> {
    let get = method == Method::GET || method == Method::HEAD;
    let (status, content_type, body) = match path {
        _ if !get && matches!(path, "/healthz" | "/readyz" | "/metrics") => {
            (StatusCode::METHOD_NOT_ALLOWED, TEXT, Bytes::new())
        }
        "/healthz" => (StatusCode::OK, TEXT, Bytes::from_static(b"ok")),
        "/readyz" if h.ready.load(Ordering::Relaxed) => {
            (StatusCode::OK, TEXT, Bytes::from_static(b"ready"))
        }
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            Bytes::from_static(b"starting"),
        ),
        "/metrics" => (StatusCode::OK, OPENMETRICS, Bytes::from(h.metrics.encode())),
        _ => (StatusCode::NOT_FOUND, TEXT, Bytes::new()),
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(ready: bool) -> Health {
        Health {
            metrics: Arc::new(Metrics::default()),
            ready: Arc::new(AtomicBool::new(ready)),
        }
    }

    #[test]
    fn answers_health_readiness_and_metrics() {
        let starting = health(false);
        assert_eq!(
            answer(&starting, &Method::GET, "/healthz").status(),
            StatusCode::OK
        );
        assert_eq!(
            answer(&starting, &Method::GET, "/readyz").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            answer(&health(true), &Method::GET, "/readyz").status(),
            StatusCode::OK
        );
        let metrics = answer(&starting, &Method::GET, "/metrics");
        assert_eq!(
            metrics
                .headers()
                .get(CONTENT_TYPE)
                .map(HeaderValue::as_bytes),
            Some(OPENMETRICS.as_bytes())
        );
        assert_eq!(
            answer(&starting, &Method::POST, "/metrics").status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            answer(&starting, &Method::GET, "/other").status(),
            StatusCode::NOT_FOUND
        );
    }
}
