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
//! - **minimum rate** (`SANDBOXD_MIN_TRANSFER_RATE`): a request body that arrives, or an answer
//!   the client reads, slower than this many bytes a second over a body timeout's time is cut:
//!   a client that reads a byte now and then holds no buffer of sandboxd's for long.
//!
//! Two caps hold before any of that: connections open at once (`SANDBOXD_MAX_CONNECTIONS`)
//! and connections open at once from one source address
//! (`SANDBOXD_MAX_CONNECTIONS_PER_SOURCE`). A connection past either is closed at its accept,
//! with a reset and before a byte is read, and counted in
//! `sandboxd_connections_refused_total{cap}`; so one client that floods sandboxd with idle
//! connections holds at most its share, and every other source is still answered.
//!
//! A request in progress is never cut for being slow to answer: a run that waits for its
//! command, or streams its output for up to the execute timeout, keeps its connection, as long
//! as the client reads what is written.
//!
//! An answer given before its request's body was read to the end (a write refused mid-body:
//! workspace full, over a cap) is followed by a lingering close, as nginx does: what is left of
//! the body is read and dropped beside the answer, for at most [`LINGER`] and [`LINGER_BYTES`],
//! before the connection closes, so a client that sends its whole body before it reads
//! (Python's `urllib`, `requests`) reads the status instead of a broken pipe. A request refused
//! for its token (401, 403) is not drained: an anonymous body is never read.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
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

use crate::metrics::Metrics;
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
    /// Bytes a second a body must at least arrive at and an answer be read at (0: any).
    pub min_rate: u64,
}

/// Longest the rest of a refused request's body is read and dropped after its answer.
pub const LINGER: Duration = Duration::from_secs(30);

/// Most bytes of a refused request's body read and dropped after its answer; a client that
/// sends more is cut off.
pub const LINGER_BYTES: u64 = 512 << 20;

impl Timeouts {
    /// How often a connection's watchdog looks: a quarter of the shortest timeout, between
    /// 50 ms and 1 s.
    fn check_every(&self) -> Duration {
        (self.header.min(self.body).min(self.idle) / 4)
            .clamp(Duration::from_millis(50), Duration::from_secs(1))
    }
}

/// The caps on connections open at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// In all.
    pub total: usize,
    /// From one source address.
    pub per_source: usize,
}

/// Which cap refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    Total,
    PerSource,
}

impl Refused {
    fn label(self) -> &'static str {
        match self {
            Refused::Total => "total",
            Refused::PerSource => "per_source",
        }
    }
}

/// The connections open now, in all and by source address.
#[derive(Debug, Default)]
struct Counted {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

/// The connections open now, against the [`Caps`]; each counts from its accept until its
/// task ends (its [`Admitted`] is dropped).
#[derive(Clone)]
struct Gate {
    caps: Caps,
    open: Arc<Mutex<Counted>>,
    metrics: Arc<Metrics>,
}

/// One connection counted against the caps until it is dropped.
struct Admitted {
    gate: Gate,
    source: IpAddr,
}

impl Gate {
    fn new(caps: Caps, metrics: Arc<Metrics>) -> Self {
        Self {
            caps,
            open: Arc::default(),
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Counted> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a connection from `source` in, or says which cap it is over.
    fn admit(&self, source: IpAddr) -> Result<Admitted, Refused> {
        // An IPv4 client of a dual-stack listener is the same source as over IPv4.
        let source = source.to_canonical();
        let mut open = self.lock();
        if open.total >= self.caps.total {
            return Err(Refused::Total);
        }
        let from = open.by_source.entry(source).or_insert(0);
        if *from >= self.caps.per_source {
            return Err(Refused::PerSource);
        }
        *from += 1;
        open.total += 1;
        self.metrics
            .connections_open
            .set(i64::try_from(open.total).unwrap_or(i64::MAX));
        Ok(Admitted {
            gate: self.clone(),
            source,
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.gate.lock();
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_source.get_mut(&self.source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.by_source.remove(&self.source);
            }
        }
        self.gate
            .metrics
            .connections_open
            .set(i64::try_from(open.total).unwrap_or(i64::MAX));
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
    /// The client read a response slower than the minimum rate.
    ResponseSlow,
}

impl Cut {
    fn as_str(self) -> &'static str {
        match self {
            Cut::Header => "headers not complete within SANDBOXD_HEADER_TIMEOUT",
            Cut::Idle => "idle for SANDBOXD_IDLE_TIMEOUT",
            Cut::ResponseStalled => "response not read for SANDBOXD_BODY_TIMEOUT",
            Cut::ResponseSlow => "response read slower than SANDBOXD_MIN_TRANSFER_RATE",
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
    /// Since when writes have been slow (one blocked), and the bytes written since.
    slow: Option<(Instant, u64)>,
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
            slow: None,
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
        self.wrote(blocked, 0);
    }

    /// A write was tried: it blocked, or `bytes` went out.
    fn wrote(&self, blocked: bool, bytes: u64) {
        let mut a = self.lock();
        match (blocked, a.write_blocked) {
            (true, None) => a.write_blocked = Some(Instant::now()),
            (false, Some(_)) => a.write_blocked = None,
            _ => {}
        }
        match &mut a.slow {
            Some((_, written)) => *written += bytes,
            None if blocked => a.slow = Some((Instant::now(), 0)),
            None => {}
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
        let mut a = self.lock();
        let mut next = now + t.check_every();
        if let Some(since) = a.write_blocked {
            if now >= since + t.body {
                return Err(Cut::ResponseStalled);
            }
            next = next.min(since + t.body);
        }
        // Writes slow since `since`: over a body timeout's time, the client must have read at
        // the minimum rate, or the connection is cut; then the next window starts, if writes
        // are still blocked.
        if let Some((since, written)) = a.slow {
            let window = now.saturating_duration_since(since);
            if window >= t.body {
                let rate = written as f64 / window.as_secs_f64();
                if t.min_rate > 0 && rate < t.min_rate as f64 && a.write_blocked.is_some() {
                    return Err(Cut::ResponseSlow);
                }
                a.slow = a.write_blocked.map(|_| (now, 0));
            } else {
                next = next.min(since + t.body);
            }
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

/// The bytes a write put out.
fn written(polled: &Poll<std::io::Result<usize>>) -> u64 {
    match polled {
        Poll::Ready(Ok(n)) => *n as u64,
        _ => 0,
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
        self.watch.wrote(polled.is_pending(), written(&polled));
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch.wrote(polled.is_pending(), written(&polled));
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

/// A request body that arrives slower than the minimum rate.
#[derive(Debug, thiserror::Error)]
#[error(
    "the request body arrived at {rate} bytes a second, below the {min} of SANDBOXD_MIN_TRANSFER_RATE; the connection is closed"
)]
pub struct BodySlow {
    rate: u64,
    min: u64,
}

/// What is left of a request body its handler did not read to the end, kept for the
/// lingering close.
type Leftover = Arc<Mutex<Option<Body>>>;

/// A request body whose reads fail after the body timeout without a byte, or when it arrives
/// slower than the minimum rate. The clocks run only while the handler waits for bytes, not
/// while it works on the ones it has. Dropped before its end, it leaves what is left of the
/// body for the lingering close.
struct TimedBody {
    inner: Option<Body>,
    limit: Duration,
    min_rate: u64,
    sleep: Option<Pin<Box<Sleep>>>,
    waiting: bool,
    /// When the current wait for bytes began.
    wait_began: Option<Instant>,
    /// Time spent waiting, and bytes received, since the rate was last checked.
    window: (Duration, u64),
    stalled: bool,
    /// Set once the body has been read to its end.
    read_whole: Arc<AtomicBool>,
    leftover: Leftover,
}

impl TimedBody {
    #[cfg(test)]
    fn new(inner: Body, limit: Duration) -> Self {
        Self::with_rate(inner, limit, 0)
    }

    fn with_rate(inner: Body, limit: Duration, min_rate: u64) -> Self {
        Self {
            read_whole: Arc::new(AtomicBool::new(http_body::Body::is_end_stream(&inner))),
            inner: Some(inner),
            limit,
            min_rate,
            sleep: None,
            waiting: false,
            wait_began: None,
            window: (Duration::ZERO, 0),
            stalled: false,
            leftover: Leftover::default(),
        }
    }

    /// Counts `bytes` received after a wait, and fails the body when, over a body timeout's
    /// time of waiting, they came slower than the minimum rate.
    fn arrived(&mut self, bytes: u64) -> Result<(), BodySlow> {
        if let Some(began) = self.wait_began.take() {
            self.window.0 += began.elapsed();
        }
        self.window.1 += bytes;
        let (waited, received) = self.window;
        if waited >= self.limit {
            let rate = (received as f64 / waited.as_secs_f64()) as u64;
            if self.min_rate > 0 && rate < self.min_rate {
                return Err(BodySlow {
                    rate,
                    min: self.min_rate,
                });
            }
            self.window = (Duration::ZERO, 0);
        }
        Ok(())
    }
}

impl Drop for TimedBody {
    fn drop(&mut self) {
        if !self.stalled
            && !self.read_whole.load(Ordering::Relaxed)
            && let Some(inner) = self.inner.take()
        {
            *self
                .leftover
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(inner);
        }
    }
}

/// Reads and drops what is left of a refused request's body, for at most [`LINGER`] and
/// [`LINGER_BYTES`], and while it arrives at all (each wait for bytes at most `limit`).
async fn linger(body: Body, limit: Duration) {
    use futures::StreamExt;
    let mut data = body.into_data_stream();
    let _ = tokio::time::timeout(LINGER, async {
        let mut dropped = 0u64;
        while let Ok(Some(Ok(chunk))) = tokio::time::timeout(limit, data.next()).await {
            dropped += chunk.len() as u64;
            if dropped > LINGER_BYTES {
                break;
            }
        }
    })
    .await;
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
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(&mut *inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.waiting = false;
                if frame.is_none() || inner.is_end_stream() {
                    this.read_whole.store(true, Ordering::Relaxed);
                }
                let bytes = match &frame {
                    Some(Ok(f)) => f.data_ref().map_or(0, |d| d.len() as u64),
                    _ => 0,
                };
                if let Err(slow) = this.arrived(bytes) {
                    this.stalled = true;
                    return Poll::Ready(Some(Err(slow.into())));
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                if this.wait_began.is_none() {
                    this.wait_began = Some(Instant::now());
                }
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
        self.stalled || self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
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
/// finish (as `axum::serve(..).with_graceful_shutdown`), with [`Timeouts`] on every connection
/// and at most the [`Caps`] open at once (refusals counted in `metrics`).
/// With `tls`, every connection is TLS (a plain-HTTP request fails its handshake and is
/// closed), with the certificate in use at its accept.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    timeouts: Timeouts,
    caps: Caps,
    metrics: Arc<Metrics>,
    tls: Option<Reloading>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let gate = Gate::new(caps, metrics.clone());
    // A refusal is logged at most every 10 s (a flood would fill the log); all are counted.
    let mut last_warned: Option<Instant> = None;
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
        let admitted = match gate.admit(peer.ip()) {
            Ok(admitted) => admitted,
            Err(cap) => {
                metrics
                    .connections_refused
                    .get_or_create(&crate::metrics::CapLabel {
                        cap: cap.label().to_owned(),
                    })
                    .inc();
                if last_warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
                    last_warned = Some(Instant::now());
                    match cap {
                        Refused::Total => warn!(
                            %peer,
                            max = caps.total,
                            "connection refused: sandboxd holds SANDBOXD_MAX_CONNECTIONS connections (logged once every 10 s; sandboxd_connections_refused_total counts them all)"
                        ),
                        Refused::PerSource => warn!(
                            %peer,
                            max = caps.per_source,
                            "connection refused: its source holds SANDBOXD_MAX_CONNECTIONS_PER_SOURCE connections (logged once every 10 s; sandboxd_connections_refused_total counts them all)"
                        ),
                    }
                }
                // Closed at once with a reset: nothing read, nothing left in TIME_WAIT.
                let _ = tcp.set_zero_linger();
                drop(tcp);
                continue;
            }
        };
        // Small responses must not wait for delayed ACKs (Nagle's algorithm).
        let _ = tcp.set_nodelay(true);
        match &tls {
            None => serve_connection(tcp, peer, &router, timeouts, &graceful, admitted),
            Some(tls) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
                let (router, graceful) = (router.clone(), graceful.clone());
                handshakes.spawn(async move {
                    match tokio::time::timeout(timeouts.handshake, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => serve_connection(
                            stream, peer, &router, timeouts, &graceful, admitted,
                        ),
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

/// Serves one accepted connection (plain TCP or a finished TLS handshake) in a task of its
/// own, which holds its place under the caps (`admitted`) until it ends.
fn serve_connection<T>(
    io: T,
    peer: std::net::SocketAddr,
    router: &Router,
    timeouts: Timeouts,
    graceful: &hyper_util::server::graceful::GracefulShutdown,
    admitted: Admitted,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let watch = Watch::new();
    // HTTP/1.1 only, with upgrades (a terminal's WebSocket): once a connection is upgraded it
    // is the handler's, and the timeouts below no longer hold it (a terminal may be quiet for
    // hours); the handler bounds what it holds.
    let builder =
        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
            .http1_only();
    let conn = builder.serve_connection_with_upgrades(
        TokioIo::new(Watched {
            io,
            watch: watch.clone(),
        }),
        service(router.clone(), watch.clone(), timeouts),
    );
    let served = graceful.watch(conn.into_owned());
    tokio::spawn(async move {
        let _admitted = admitted;
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
    timeouts: Timeouts,
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
        let body = TimedBody::with_rate(Body::new(body), timeouts.body, timeouts.min_rate);
        let read_whole = body.read_whole.clone();
        let leftover = body.leftover.clone();
        let answered = router
            .clone()
            .oneshot(Request::from_parts(parts, Body::new(body)));
        async move {
            let mut response = answered.await.unwrap_or_else(|e: Infallible| match e {});
            // Answered without reading the whole body (refused before it, or over its cap):
            // the connection ends with this answer, and says so, so no client sends another
            // request on it. The rest of an authenticated request's body is read and dropped
            // beside the answer (the lingering close); an anonymous one's is never read.
            if !read_whole.load(Ordering::Relaxed) {
                let rest = leftover
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take();
                let anonymous = matches!(
                    response.status(),
                    axum::http::StatusCode::UNAUTHORIZED | axum::http::StatusCode::FORBIDDEN
                );
                if let Some(rest) = rest.filter(|_| !anonymous) {
                    tokio::spawn(linger(rest, timeouts.body));
                }
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
        min_rate: 1000,
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
        // ...or reads it slower than the minimum rate: 10 KiB in 21 s is 488 bytes a second,
        // with writes blocked again now.
        let slow = Instant::now();
        {
            let mut a = w.lock();
            a.slow = Some((slow, 10 * 1024));
            a.write_blocked = Some(slow + Duration::from_secs(15));
        }
        assert!(w.verdict(slow + Duration::from_secs(19), &T).is_ok());
        assert_eq!(
            w.verdict(slow + Duration::from_secs(21), &T),
            Err(Cut::ResponseSlow)
        );
        // A client that reads at the rate starts a new window.
        w.lock().slow = Some((slow, 40 * 1024));
        assert!(w.verdict(slow + Duration::from_secs(21), &T).is_ok());
        assert_eq!(w.lock().slow, Some((slow + Duration::from_secs(21), 0)));
        w.write_blocked(false);
        w.lock().slow = None;
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

    #[test]
    fn the_caps_count_each_source_and_the_total_and_free_a_place_when_a_connection_ends() {
        let metrics = Arc::new(Metrics::default());
        let gate = Gate::new(
            Caps {
                total: 3,
                per_source: 2,
            },
            metrics.clone(),
        );
        let a: IpAddr = "127.0.0.1".parse().expect("an address");
        let b: IpAddr = "127.0.0.2".parse().expect("an address");
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().expect("an address");
        let a1 = gate.admit(a).expect("room");
        let _a2 = gate.admit(a).expect("room");
        // The same source over a dual-stack listener is the same source.
        assert_eq!(gate.admit(mapped).err(), Some(Refused::PerSource));
        let _b1 = gate.admit(b).expect("room");
        assert_eq!(gate.admit(b).err(), Some(Refused::Total));
        assert_eq!(metrics.connections_open.get(), 3);
        drop(a1);
        assert_eq!(metrics.connections_open.get(), 2);
        let _b2 = gate.admit(b).expect("a place freed");
        assert_eq!(gate.admit(a).err(), Some(Refused::Total));
    }
}
