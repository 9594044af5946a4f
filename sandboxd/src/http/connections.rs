//! The HTTP connections: accepted, served (HTTP/1.1, as `axum::serve` did), and cut when the
//! client holds one without using it. Four timeouts, each configurable:
//!
//! - **header** (`SANDBOXD_HEADER_TIMEOUT`): once the first byte of a request has arrived (and no
//!   other request is in progress on the connection), its headers must be complete within this
//!   time. A client that sends half a header and stalls (slowloris) is disconnected.
//! - **body** (`SANDBOXD_BODY_TIMEOUT`): while a handler waits for the next bytes of a request
//!   body, they must come within this time, or the read fails ("no byte of the request body
//!   arrived …") and the connection is closed after the answer. Likewise a response the client
//!   does not read for this long (its writes blocked) is cut.
//! - **idle** (`SANDBOXD_IDLE_TIMEOUT`): a connection with no request in progress and no byte of
//!   a new one is closed after this time (keep-alive idle).
//! - **handshake** (`SANDBOXD_TLS_HANDSHAKE_TIMEOUT`, with TLS only): from the accept to the end
//!   of the TLS handshake. A client that opens a connection and never says hello (or stalls in
//!   the handshake) is disconnected; the three timeouts above start once the handshake is done.
//!
//! A request in progress is never cut for being slow to answer: a run that waits for its
//! command, or streams its output for up to the execute timeout, keeps its connection, as long
//! as the client reads what is written.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Request, Response};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;
use tracing::{debug, warn};

use crate::tls::Reloading;

/// The three timeouts of every connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// From the first byte of a request to the end of its headers.
    pub header: Duration,
    /// Longest wait for the next bytes of a request body, or for the client to read a response.
    pub body: Duration,
    /// Longest a connection stays open with no request in progress.
    pub idle: Duration,
    /// From the accept to the end of the TLS handshake (with TLS only).
    pub handshake: Duration,
}

impl Timeouts {
    /// How often a connection's watchdog looks: a quarter of the shortest timeout, between
    /// 50 ms and 1 s.
    fn check_every(&self) -> Duration {
        (self.header.min(self.body).min(self.idle) / 4)
            .clamp(Duration::from_millis(50), Duration::from_secs(1))
    }
}

/// Why a connection was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// A request's headers did not complete within the header timeout.
    Header,
    /// No request for the idle timeout.
    Idle,
    /// The client read none of a response for the body timeout.
    ResponseStalled,
}

impl Cut {
    fn as_str(self) -> &'static str {
        match self {
            Cut::Header => "headers not complete within SANDBOXD_HEADER_TIMEOUT",
            Cut::Idle => "idle for SANDBOXD_IDLE_TIMEOUT",
            Cut::ResponseStalled => "response not read for SANDBOXD_BODY_TIMEOUT",
        }
    }
}

/// What a connection's watchdog looks at, kept by its I/O and its requests.
#[derive(Debug)]
struct Activity {
    /// Requests in progress (their responses not yet all written).
    in_flight: usize,
    /// When the last request ended (or the connection was accepted).
    idle_since: Instant,
    /// When the first byte arrived while no request was in progress: a request begun.
    request_started: Option<Instant>,
    /// Since when writing to the client has been blocked.
    write_blocked: Option<Instant>,
}

#[derive(Debug, Clone)]
struct Watch(Arc<Mutex<Activity>>);

impl Watch {
    fn new() -> Self {
        Self(Arc::new(Mutex::new(Activity {
            in_flight: 0,
            idle_since: Instant::now(),
            request_started: None,
            write_blocked: None,
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Activity> {
        // The state is a few counters and instants; a panic elsewhere leaves them usable.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) {
        let mut a = self.lock();
        if a.in_flight == 0 && a.request_started.is_none() {
            a.request_started = Some(Instant::now());
        }
    }

    fn write_blocked(&self, blocked: bool) {
        let mut a = self.lock();
        match (blocked, a.write_blocked) {
            (true, None) => a.write_blocked = Some(Instant::now()),
            (false, Some(_)) => a.write_blocked = None,
            _ => {}
        }
    }

    /// A request's headers are in: it is in progress until its response is written.
    fn begin(&self) -> InFlight {
        let mut a = self.lock();
        a.in_flight += 1;
        a.request_started = None;
        InFlight(self.clone())
    }

    /// Whether to cut the connection now, and if not, when to look again at the latest.
    fn verdict(&self, now: Instant, t: &Timeouts) -> Result<Instant, Cut> {
        let a = self.lock();
        let mut next = now + t.check_every();
        if let Some(since) = a.write_blocked {
            if now >= since + t.body {
                return Err(Cut::ResponseStalled);
            }
            next = next.min(since + t.body);
        }
        if a.in_flight == 0 {
            let (deadline, cut) = match a.request_started {
                Some(started) => (started + t.header, Cut::Header),
                None => (a.idle_since + t.idle, Cut::Idle),
            };
            if now >= deadline {
                return Err(cut);
            }
            next = next.min(deadline);
        }
        Ok(next)
    }
}

/// A request in progress; dropped with its response body (or with the request, if cut).
struct InFlight(Watch);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut a = self.0.lock();
        a.in_flight = a.in_flight.saturating_sub(1);
        if a.in_flight == 0 {
            a.idle_since = Instant::now();
        }
    }
}

/// The client's socket, telling the watchdog when bytes arrive and when writes block.
struct Watched<T> {
    io: T,
    watch: Watch,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.watch.read();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch.write_blocked(polled.is_pending());
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch.write_blocked(polled.is_pending());
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.watch.write_blocked(polled.is_pending());
        polled
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A request body stalled past the body timeout.
#[derive(Debug, thiserror::Error)]
#[error(
    "no byte of the request body arrived for {0} s (SANDBOXD_BODY_TIMEOUT); the connection is closed"
)]
pub struct BodyStalled(u64);

/// A request body whose reads fail after the body timeout without a byte. The clock runs
/// only while the handler waits for bytes, not while it works on the ones it has.
struct TimedBody {
    inner: Body,
    limit: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    waiting: bool,
    stalled: bool,
    /// Set once the body has been read to its end.
    read_whole: Arc<AtomicBool>,
}

impl TimedBody {
    fn new(inner: Body, limit: Duration) -> Self {
        Self {
            read_whole: Arc::new(AtomicBool::new(http_body::Body::is_end_stream(&inner))),
            inner,
            limit,
            sleep: None,
            waiting: false,
            stalled: false,
        }
    }
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.stalled {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.waiting = false;
                if frame.is_none() || this.inner.is_end_stream() {
                    this.read_whole.store(true, Ordering::Relaxed);
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let deadline = Instant::now() + this.limit;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if !this.waiting {
                    sleep.as_mut().reset(deadline);
                    this.waiting = true;
                }
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.stalled = true;
                        Poll::Ready(Some(Err(BodyStalled(this.limit.as_secs()).into())))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.stalled || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that keeps its request in progress until it is written (or dropped).
struct TrackedBody {
    inner: Body,
    _in_flight: InFlight,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `router` on `listener` until `stop` completes, then lets the requests in progress
/// finish (as `axum::serve(..).with_graceful_shutdown`), with [`Timeouts`] on every connection.
/// With `tls`, every connection is TLS (a plain-HTTP request fails its handshake and is
/// closed), with the certificate in use at its accept.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    timeouts: Timeouts,
    tls: Option<Reloading>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let graceful = Arc::new(hyper_util::server::graceful::GracefulShutdown::new());
    let mut stop = std::pin::pin!(stop);
    // Connections still in their TLS handshake; stopping waits for none of them.
    let mut handshakes = tokio::task::JoinSet::new();
    loop {
        let (tcp, peer) = tokio::select! {
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment rather than spin.
                    warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // Small responses must not wait for delayed ACKs (Nagle's algorithm).
        let _ = tcp.set_nodelay(true);
        match &tls {
            None => serve_connection(tcp, peer, &router, timeouts, &graceful),
            Some(tls) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
                let (router, graceful) = (router.clone(), graceful.clone());
                handshakes.spawn(async move {
                    match tokio::time::timeout(timeouts.handshake, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            serve_connection(stream, peer, &router, timeouts, &graceful)
                        }
                        Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => debug!(
                            %peer,
                            "connection cut: TLS handshake not complete within SANDBOXD_TLS_HANDSHAKE_TIMEOUT"
                        ),
                    }
                });
            }
        }
    }
    drop(listener);
    // A handshake under way when the stop came is not waited for.
    handshakes.shutdown().await;
    // The handshake tasks held the only other references.
    if let Some(graceful) = Arc::into_inner(graceful) {
        graceful.shutdown().await;
    }
    Ok(())
}

/// Serves one accepted connection (plain TCP or a finished TLS handshake) in a task of its own.
fn serve_connection<T>(
    io: T,
    peer: std::net::SocketAddr,
    router: &Router,
    timeouts: Timeouts,
    graceful: &hyper_util::server::graceful::GracefulShutdown,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let watch = Watch::new();
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(
        TokioIo::new(Watched {
            io,
            watch: watch.clone(),
        }),
        service(router.clone(), watch.clone(), timeouts.body),
    );
    let served = graceful.watch(conn);
    tokio::spawn(async move {
        tokio::select! {
            served = served => if let Err(e) = served {
                debug!(%peer, error = %e, "connection ended with an error");
            },
            cut = watchdog(watch, timeouts) => {
                debug!(%peer, reason = cut.as_str(), "connection cut");
            }
        }
    });
}

/// The service of one connection: each request marked in progress until its response is
/// written, its body read under the body timeout.
fn service(
    router: Router,
    watch: Watch,
    body_timeout: Duration,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send + 'static,
> + Clone
+ Send
+ 'static {
    hyper::service::service_fn(move |req: Request<Incoming>| {
        let in_flight = watch.begin();
        let (parts, body) = req.into_parts();
        let body = TimedBody::new(Body::new(body), body_timeout);
        let read_whole = body.read_whole.clone();
        let answered = router
            .clone()
            .oneshot(Request::from_parts(parts, Body::new(body)));
        async move {
            let mut response = answered.await.unwrap_or_else(|e: Infallible| match e {});
            // Answered without reading the whole body (refused before it, or over its cap):
            // the rest is not read, so the connection ends with this answer, and says so, so
            // no client sends another request on it.
            if !read_whole.load(Ordering::Relaxed) {
                response.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
            }
            Ok::<_, Infallible>(response.map(|inner| {
                Body::new(TrackedBody {
                    inner,
                    _in_flight: in_flight,
                })
            }))
        }
    })
}

/// Completes when the connection is to be cut, saying why.
async fn watchdog(watch: Watch, timeouts: Timeouts) -> Cut {
    loop {
        match watch.verdict(Instant::now(), &timeouts) {
            Ok(next) => tokio::time::sleep_until(next).await,
            Err(cut) => return cut,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        header: Duration::from_secs(10),
        body: Duration::from_secs(20),
        idle: Duration::from_secs(60),
        handshake: Duration::from_secs(10),
    };

    #[tokio::test]
    async fn idle_header_and_stalled_writes_cut_a_connection_but_a_request_in_progress_does_not() {
        let w = Watch::new();
        let t0 = Instant::now();
        assert!(w.verdict(t0 + Duration::from_secs(59), &T).is_ok());
        assert_eq!(w.verdict(t0 + Duration::from_secs(60), &T), Err(Cut::Idle));

        // A request begun: its headers have the header timeout.
        w.read();
        let begun = Instant::now();
        assert!(w.verdict(t0 + Duration::from_secs(9), &T).is_ok());
        assert_eq!(
            w.verdict(begun + Duration::from_secs(10), &T),
            Err(Cut::Header)
        );

        // In progress: neither the header nor the idle timeout applies, however long it takes.
        let req = w.begin();
        assert!(w.verdict(t0 + Duration::from_secs(3600), &T).is_ok());
        w.read();
        assert!(w.verdict(t0 + Duration::from_secs(3600), &T).is_ok());
        // ...unless the client stops reading the answer.
        w.write_blocked(true);
        assert_eq!(
            w.verdict(Instant::now() + Duration::from_secs(20), &T),
            Err(Cut::ResponseStalled)
        );
        w.write_blocked(false);
        drop(req);
        let idle = Instant::now();
        assert!(w.verdict(idle + Duration::from_secs(59), &T).is_ok());
        assert_eq!(
            w.verdict(idle + Duration::from_secs(60), &T),
            Err(Cut::Idle)
        );
    }

    #[tokio::test]
    async fn a_stalled_body_fails_after_the_body_timeout_not_while_the_handler_works() {
        use http_body_util::BodyExt;
        let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, Infallible>>(1);
        let limit = Duration::from_millis(300);
        let mut body = TimedBody::new(Body::from_stream(rx), limit);
        tx.try_send(Ok(Bytes::from_static(b"a"))).expect("room");
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.into_data().ok(), Some(Bytes::from_static(b"a")));
        // The handler works for longer than the limit before it reads on: no timeout for that.
        tokio::time::sleep(limit * 3).await;
        tx.try_send(Ok(Bytes::from_static(b"b"))).expect("room");
        assert!(body.frame().await.expect("a frame").is_ok());
        let started = Instant::now();
        let err = body.frame().await.expect("an error").expect_err("stalled");
        let waited = started.elapsed();
        assert!(
            waited >= limit && waited < limit * 3,
            "failed after {waited:?}"
        );
        assert_eq!(
            err.to_string(),
            "no byte of the request body arrived for 0 s (SANDBOXD_BODY_TIMEOUT); the connection is closed"
        );
        assert!(body.frame().await.is_none());
        assert!(!body.read_whole.load(Ordering::Relaxed));

        let mut whole = TimedBody::new(Body::from("abc"), limit);
        assert!(!whole.read_whole.load(Ordering::Relaxed));
        while whole.frame().await.is_some() {}
        assert!(whole.read_whole.load(Ordering::Relaxed));
        let empty = TimedBody::new(Body::empty(), limit);
        assert!(empty.read_whole.load(Ordering::Relaxed));
    }
}
