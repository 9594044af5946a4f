//! The egress proxy: every TCP connection a sandbox of an `allowlist` runtime opens arrives
//! here (the firewall redirects it; its first destination is read back with
//! `SO_ORIGINAL_DST`), and goes on only to what its policies allow.
//!
//! - A destination a CIDR entry allows (address and port) is joined at once, whatever the
//!   protocol.
//! - Otherwise the connection must name where it goes: the first bytes are read (at most
//!   [`MAX_HELLO`], within [`HELLO_TIMEOUT`]) as a TLS ClientHello, whose SNI is the name
//!   (parsed by rustls), or as an HTTP request head, whose Host is (parsed by httparse). The
//!   name and the original port must be allowed; the proxy then resolves the name itself
//!   and dials only what that answer holds, never the address the sandbox dialled, so an
//!   allowed SNI sent to a denied address reaches the allowed name's server or nothing.
//!   Resolved addresses in the denied ranges (private, link-local, shared) or on the node are
//!   refused unless a CIDR entry allows them.
//! - A connection with no name, a name or port not allowed, or a name that resolves to no
//!   allowed address is refused: plain HTTP gets `403` with a body naming the policy, TLS a
//!   fatal `access_denied` alert, anything else is closed. Nothing hangs.
//!
//! What a TLS connection carries after its ClientHello is not looked at (no interception),
//! but where the session holds a credential for the SNI's name on the original port: a
//! client that sends an allowed SNI and then another Host inside the encryption reaches the
//! allowed name's server, which answers for what it serves.
//!
//! Where the session holds a credential ([`super::Gate::credential_for`]) for the SNI's name
//! on the original port, the proxy terminates the sandbox's TLS with a leaf for that name
//! signed by the node's egress CA ([`super::ca`], which the sandbox trusts; ALPN `http/1.1`
//! only), dials the name as above, opens TLS to it verifying its certificate against the
//! system roots and `SANDBOXD_EGRESS_UPSTREAM_CA`, and carries HTTP/1.1 with hyper (kept
//! alive both sides). On every request it removes each header of the credential's name and
//! sets the credential's value, read from the gate at that request, so a rotated value
//! reaches a kept-alive connection. A credential without a value (its Secret is gone) is
//! answered `502` with `x-sandboxd-egress: credential-missing` and the sender's words; an
//! upstream whose certificate does not verify is answered `502` with
//! `x-sandboxd-egress: upstream-unverified`. Each credential added is counted
//! (`sandboxd_egress_credentials_added_total{runtime,source}`) and the connection's allowed
//! row of the egress log says `credential added: <source>`. The value is never logged.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::debug;

use super::log::Verdict;
use super::resolve::Upstream;
use super::{Gate, Kind, Policies, Principal};

/// The most bytes read for the name (a ClientHello or an HTTP request head).
pub const MAX_HELLO: usize = 16 * 1024;
/// How long the first bytes are waited for.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a dial of the upstream is waited for.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// The buffers of one direction of a spliced connection.
const SPLICE_BUFFER: usize = 256 * 1024;
/// A TLS fatal alert `access_denied` (record type 21, TLS 1.2 framing, level 2, code 49).
const TLS_ACCESS_DENIED: [u8; 7] = [21, 3, 3, 0, 2, 2, 49];

/// What the proxy needs besides the gate: the upstream resolver and what no name may
/// resolve to.
pub struct Proxy {
    /// Who is who, and what they may reach.
    pub gate: Arc<Gate>,
    /// The resolver of the names dialled.
    pub upstream: Arc<Upstream>,
    /// Ranges a resolved address may not be in (canonical `a.b.c.d/n`) unless a CIDR entry
    /// allows it: `SANDBOXD_NETWORK_DENY`'s.
    pub deny: Vec<String>,
}

/// What the first bytes named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    /// A TLS ClientHello with this SNI (`None`: it named no server).
    Tls(Option<String>),
    /// An HTTP request with this Host (`None`: it sent none), port stripped.
    Http(Option<String>),
    /// Neither (or too long to tell).
    Unknown,
}

/// Reads what `bytes` name, or `None` when more bytes are needed.
pub fn named(bytes: &[u8]) -> Option<Named> {
    let first = bytes.first()?;
    if *first == 0x16 {
        let mut acceptor = rustls::server::Acceptor::default();
        let mut rest = bytes;
        while !rest.is_empty() {
            if acceptor.read_tls(&mut rest).is_err() {
                return Some(Named::Unknown);
            }
        }
        return match acceptor.accept() {
            Ok(Some(accepted)) => Some(Named::Tls(
                accepted
                    .client_hello()
                    .server_name()
                    .map(|n| n.to_ascii_lowercase()),
            )),
            Ok(None) => (bytes.len() >= MAX_HELLO).then_some(Named::Unknown),
            Err(_) => Some(Named::Unknown),
        };
    }
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(bytes) {
        Ok(httparse::Status::Complete(_)) => {
            let host = request
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("host"))
                .and_then(|h| std::str::from_utf8(h.value).ok())
                .map(host_name);
            Some(Named::Http(host))
        }
        Ok(httparse::Status::Partial) if bytes.len() < MAX_HELLO => None,
        _ => Some(Named::Unknown),
    }
}

/// A Host header's name: lowercased, its port and a trailing dot gone (`[v6]` kept whole).
fn host_name(value: &str) -> String {
    let value = value.trim();
    let name = if value.starts_with('[') {
        value
            .split(']')
            .next()
            .map(|v| format!("{v}]"))
            .unwrap_or_default()
    } else {
        value.rsplit_once(':').map_or(value, |(h, _)| h).to_owned()
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// The addresses of a name the proxy may dial: none in a denied range (`deny`: private,
/// link-local, shared), on the node (`node`), loopback, unspecified, multicast or broadcast,
/// unless `cidr_allows` it (a cidr entry of every policy holds it).
fn dialable(
    addrs: &[Ipv4Addr],
    deny: &[String],
    node: &[Ipv4Addr],
    cidr_allows: impl Fn(Ipv4Addr) -> bool,
) -> Vec<Ipv4Addr> {
    addrs
        .iter()
        .copied()
        .filter(|a| {
            let special = a.is_loopback()
                || a.is_unspecified()
                || a.is_multicast()
                || a.is_broadcast()
                || node.contains(a)
                || deny
                    .iter()
                    .any(|r| crate::container::network::range_holds(r, *a));
            !special || cidr_allows(*a)
        })
        .collect()
}

/// The destination a redirected connection was first addressed to.
fn original_destination(stream: &TcpStream) -> Option<SocketAddr> {
    let raw = nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::OriginalDst).ok()?;
    let ip = Ipv4Addr::from(u32::from_be(raw.sin_addr.s_addr));
    Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(raw.sin_port)))
}

/// Why a connection was refused, in the words the sandbox gets.
struct Refusal {
    name: String,
    reason: String,
}

impl Proxy {
    /// Serves the connections `listener` accepts until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                continue;
            };
            let proxy = self.clone();
            tokio::spawn(async move { proxy.handle(stream, peer).await });
        }
    }

    async fn handle(&self, mut client: TcpStream, peer: SocketAddr) {
        let _ = client.set_nodelay(true);
        let Some(dst) = original_destination(&client) else {
            return;
        };
        let Some(who) = self.gate.principal(peer.ip()).await else {
            debug!(%peer, %dst, "a connection from an address of no session: closed");
            return;
        };
        let Some(_held) = self.gate.hold(peer.ip(), Kind::Connection) else {
            let reason = format!(
                "the sandbox holds {} connections through the egress proxy already (SANDBOXD_EGRESS_MAX_CONNECTIONS)",
                self.gate.max_connections()
            );
            self.refuse_address(&who, &mut client, dst, &reason).await;
            return;
        };
        let policies = self.gate.policies(&who);
        if policies.is_closed() {
            self.refuse_address(&who, &mut client, dst, "the policy is none: no network")
                .await;
            return;
        }
        if policies.allows_addr(dst.ip(), dst.port()) {
            if let Ok(Ok(upstream)) =
                tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(dst)).await
            {
                self.splice(
                    &who,
                    &dst.ip().to_string(),
                    dst.port(),
                    client,
                    upstream,
                    &[],
                )
                .await;
            } else {
                self.gate.count(Kind::Connection, &who.runtime, false);
                self.gate.log.record_with(
                    &who,
                    &dst.ip().to_string(),
                    dst.port(),
                    Verdict::Denied,
                    (0, 0),
                    "the address did not answer",
                );
            }
            return;
        }
        let mut hello = Vec::with_capacity(2048);
        let what = loop {
            let mut chunk = [0u8; 4096];
            let read = tokio::time::timeout(HELLO_TIMEOUT, client.read(&mut chunk)).await;
            match read {
                Ok(Ok(n)) if n > 0 => hello.extend_from_slice(&chunk[..n]),
                _ => break Named::Unknown,
            }
            if let Some(n) = named(&hello) {
                break n;
            }
        };
        let tls = matches!(what, Named::Tls(_));
        let name = match what {
            Named::Tls(Some(n)) | Named::Http(Some(n)) => n,
            Named::Tls(None) | Named::Http(None) | Named::Unknown => {
                let shown = dst.ip().to_string();
                self.refuse(&who, &mut client, &shown, dst.port(), Some(tls), "the connection names no server (a TLS SNI or an HTTP Host); an address is reached only when a cidr entry allows it").await;
                return;
            }
        };
        let intercept = tls
            && self.gate.ca().is_some()
            && self
                .gate
                .credential_for(&who.session, &name, dst.port())
                .is_some();
        match self.dial(&policies, &name, dst.port()).await {
            Ok(upstream) if intercept => {
                self.intercept(&who, &name, dst.port(), client, upstream, hello)
                    .await
            }
            Ok(upstream) => {
                self.splice(&who, &name, dst.port(), client, upstream, &hello)
                    .await
            }
            Err(r) => {
                self.refuse(&who, &mut client, &r.name, dst.port(), Some(tls), &r.reason)
                    .await;
            }
        }
    }

    /// Checks `name` and `port` against the policies, resolves the name and dials the first
    /// allowed address that answers.
    async fn dial(&self, policies: &Policies, name: &str, port: u16) -> Result<TcpStream, Refusal> {
        let refusal = |reason: String| Refusal {
            name: name.to_owned(),
            reason,
        };
        if let Ok(ip) = name
            .trim_matches(|c| c == '[' || c == ']')
            .parse::<IpAddr>()
        {
            // A Host that is an address is an address without a name.
            if !policies.allows_addr(ip, port) {
                return Err(refusal(format!(
                    "{ip} is an address, not a name, and no cidr entry allows it on port {port}"
                )));
            }
            return tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect((ip, port)))
                .await
                .map_err(|_| refusal(format!("{ip}:{port} did not answer")))?
                .map_err(|e| refusal(format!("{ip}:{port}: {e}")));
        }
        if !policies.allows(name, port) {
            let why = if policies.allows_name(name) {
                format!("port {port} is not allowed for {name}")
            } else {
                format!("{name} is not in the allow list")
            };
            return Err(refusal(why));
        }
        let addrs = self
            .upstream
            .lookup(name)
            .await
            .map_err(|e| refusal(format!("{name} does not resolve: {e}")))?;
        let node = crate::container::network::node_addresses(&[]);
        let usable = dialable(&addrs, &self.deny, &node, |a| {
            policies.cidr_allows(IpAddr::V4(a), port)
        });
        if usable.is_empty() {
            return Err(refusal(format!(
                "{name} resolves only to addresses a sandbox may not reach ({}); a cidr entry would allow them",
                addrs
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let mut last = String::new();
        for addr in usable {
            match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect((addr, port))).await {
                Ok(Ok(s)) => return Ok(s),
                Ok(Err(e)) => last = format!("{addr}:{port}: {e}"),
                Err(_) => last = format!("{addr}:{port} did not answer"),
            }
        }
        Err(refusal(format!("{name} did not answer ({last})")))
    }

    /// Refuses a connection before anything was read from it, by the address it dialled.
    async fn refuse_address(
        &self,
        who: &Principal,
        client: &mut TcpStream,
        dst: SocketAddr,
        reason: &str,
    ) {
        self.refuse(who, client, &dst.ip().to_string(), dst.port(), None, reason)
            .await;
    }

    /// Refuses a connection in the words its protocol has: `tls` Some(false) is plain HTTP
    /// (a 403 naming the policy), Some(true) TLS (an `access_denied` alert), None anything.
    async fn refuse(
        &self,
        who: &Principal,
        client: &mut TcpStream,
        name: &str,
        port: u16,
        tls: Option<bool>,
        reason: &str,
    ) {
        self.gate.count(Kind::Connection, &who.runtime, false);
        self.gate
            .log
            .record_with(who, name, port, Verdict::Denied, (0, 0), reason);
        debug!(session = %who.session, %name, port, reason, "egress refused");
        match tls {
            Some(true) => {
                let _ = client.write_all(&TLS_ACCESS_DENIED).await;
            }
            Some(false) => {
                let body = format!(
                    "blocked by egress policy: {name}:{port} is not allowed for {}: {reason}\n",
                    who.describe()
                );
                let head = format!(
                    "HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nx-sandboxd-egress: denied\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = client.write_all(head.as_bytes()).await;
                let _ = client.write_all(body.as_bytes()).await;
            }
            None => {}
        }
        let _ = client.shutdown().await;
    }

    /// Carries a connection both ways until either side closes, after sending `first` (the
    /// bytes read for its name) on.
    async fn splice(
        &self,
        who: &Principal,
        name: &str,
        port: u16,
        mut client: TcpStream,
        mut upstream: TcpStream,
        first: &[u8],
    ) {
        self.gate.count(Kind::Connection, &who.runtime, true);
        let _ = upstream.set_nodelay(true);
        if !first.is_empty() && upstream.write_all(first).await.is_err() {
            self.gate
                .log
                .record_with(who, name, port, Verdict::Allowed, (0, 0), "");
            return;
        }
        let carried = tokio::io::copy_bidirectional_with_sizes(
            &mut client,
            &mut upstream,
            SPLICE_BUFFER,
            SPLICE_BUFFER,
        )
        .await;
        let (out, inn) = carried.unwrap_or((0, 0));
        let out = out + first.len() as u64;
        self.gate.count_bytes(&who.runtime, out, inn);
        self.gate
            .log
            .record(who, name, port, Verdict::Allowed, out, inn);
    }
}

/// A stream whose first bytes are those already read from it (the ClientHello), then the
/// rest of it: what the TLS acceptor reads. It counts the bytes the sandbox sent (the
/// ClientHello included) and received, as a spliced connection's are counted.
struct Replayed {
    first: Vec<u8>,
    at: usize,
    inner: TcpStream,
    /// Bytes sent by the sandbox and received by it.
    carried: Arc<(std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64)>,
}

impl tokio::io::AsyncRead for Replayed {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.at < self.first.len() {
            let n = buf.remaining().min(self.first.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.first[at..at + n]);
            self.at += n;
            self.carried
                .0
                .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            if self.at == self.first.len() {
                self.first = Vec::new();
                self.at = 0;
            }
            return std::task::Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let read = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before);
        self.carried
            .0
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        read
    }
}

impl tokio::io::AsyncWrite for Replayed {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let written = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &written {
            self.carried
                .1
                .fetch_add(*n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        written
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The proxy's own answer to a request it could not carry: `502` with `words` and a newline,
/// and `x-sandboxd-egress: <tag>`.
fn bad_gateway(tag: &'static str, words: &str) -> hyper::Response<axum::body::Body> {
    let mut response = hyper::Response::new(axum::body::Body::from(format!("{words}\n")));
    *response.status_mut() = hyper::StatusCode::BAD_GATEWAY;
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        "x-sandboxd-egress",
        hyper::header::HeaderValue::from_static(tag),
    );
    response
}

/// How long the TLS handshakes of an intercepted connection are waited for.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl Proxy {
    /// Carries a TLS connection to `name` on `port` whose session holds a credential for it:
    /// terminated with a leaf of the node's egress CA, HTTP/1.1 carried to `upstream` over
    /// TLS verified against the upstream roots, the credential set on every request (see the
    /// module's documentation). `hello` is what was read of the client already.
    async fn intercept(
        &self,
        who: &Principal,
        name: &str,
        port: u16,
        client: TcpStream,
        upstream: TcpStream,
        hello: Vec<u8>,
    ) {
        let Some(ca) = self.gate.ca().cloned() else {
            return;
        };
        self.gate.count(Kind::Connection, &who.runtime, true);
        let _ = upstream.set_nodelay(true);
        let acceptor = tokio_rustls::TlsAcceptor::from(ca.server_config());
        let carried = Arc::new((
            std::sync::atomic::AtomicU64::new(0),
            std::sync::atomic::AtomicU64::new(0),
        ));
        let replayed = Replayed {
            first: hello,
            at: 0,
            inner: client,
            carried: carried.clone(),
        };
        let sandbox_side =
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(replayed)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    self.gate.log.record_with(
                        who,
                        name,
                        port,
                        Verdict::Allowed,
                        (0, 0),
                        &format!("the sandbox's TLS handshake with the egress proxy failed: {e}"),
                    );
                    return;
                }
                Err(_) => return,
            };
        // The upstream side: its real certificate verified, or every request answered 502.
        let server_name = rustls::pki_types::ServerName::try_from(name.to_owned());
        let connector = tokio_rustls::TlsConnector::from(ca.client_config());
        let upstream_side = match server_name {
            Ok(sn) => {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(sn, upstream)).await
                {
                    Ok(Ok(s)) => Ok(s),
                    Ok(Err(e)) => Err(format!(
                        "sandboxd egress: {name}:{port} did not prove its identity to the egress proxy: {e}"
                    )),
                    Err(_) => Err(format!(
                        "sandboxd egress: {name}:{port} did not finish its TLS handshake within {HANDSHAKE_TIMEOUT:?}"
                    )),
                }
            }
            Err(e) => Err(format!("sandboxd egress: {name} is not a server name: {e}")),
        };
        let sender = match upstream_side {
            Ok(tls) => {
                match hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await
                {
                    Ok((sender, conn)) => {
                        tokio::spawn(conn);
                        Ok(Arc::new(tokio::sync::Mutex::new(sender)))
                    }
                    Err(e) => Err(format!(
                        "sandboxd egress: HTTP/1.1 to {name}:{port} failed: {e}"
                    )),
                }
            }
            Err(words) => Err(words),
        };
        if let Err(words) = &sender {
            self.gate
                .log
                .record_with(who, name, port, Verdict::Allowed, (0, 0), words);
        }
        let gate = self.gate.clone();
        let (session, runtime, host) = (who.session.clone(), who.runtime.clone(), name.to_owned());
        let added = Arc::new(std::sync::Mutex::new(None::<String>));
        let noted = added.clone();
        let service = hyper::service::service_fn(
            move |mut req: hyper::Request<hyper::body::Incoming>| {
                let (gate, session, runtime, host, sender, noted) = (
                    gate.clone(),
                    session.clone(),
                    runtime.clone(),
                    host.clone(),
                    sender.clone(),
                    noted.clone(),
                );
                async move {
                    let sender = match sender {
                        Ok(s) => s,
                        Err(words) => {
                            return Ok::<_, std::convert::Infallible>(bad_gateway(
                                "upstream-unverified",
                                &words,
                            ));
                        }
                    };
                    // Read now: a rotation reaches a connection kept alive.
                    let credential = gate.credential_for(&session, &host, port);
                    let (header, value, source) = match credential {
                        Some(sandboxd_api::egress::CredentialValue {
                            header,
                            value: Some(value),
                            source,
                            ..
                        }) => (header, value, source),
                        Some(c) => {
                            let why = c
                                .missing
                                .unwrap_or_else(|| "the credential has no value".to_owned());
                            return Ok(bad_gateway(
                                "credential-missing",
                                &format!("sandboxd egress: no credential for {host}:{port}: {why}"),
                            ));
                        }
                        None => {
                            return Ok(bad_gateway(
                                "credential-missing",
                                &format!(
                                    "sandboxd egress: no credential for {host}:{port}: the session holds none for it any more"
                                ),
                            ));
                        }
                    };
                    let (Ok(header_name), Ok(header_value)) = (
                        hyper::header::HeaderName::from_bytes(header.as_bytes()),
                        hyper::header::HeaderValue::from_str(&value),
                    ) else {
                        return Ok(bad_gateway(
                            "credential-missing",
                            &format!(
                                "sandboxd egress: the credential for {host}:{port} ({source}) is not a valid header"
                            ),
                        ));
                    };
                    let headers = req.headers_mut();
                    while headers.remove(&header_name).is_some() {}
                    let mut header_value = header_value;
                    header_value.set_sensitive(true);
                    headers.insert(header_name, header_value);
                    gate.count_credential(&runtime, &source);
                    if let Ok(mut n) = noted.lock() {
                        *n = Some(source);
                    }
                    let mut sender = sender.lock().await;
                    if sender.ready().await.is_err() {
                        return Ok(bad_gateway(
                            "upstream-closed",
                            &format!("sandboxd egress: {host}:{port} closed the connection"),
                        ));
                    }
                    match sender.send_request(req).await {
                        Ok(response) => Ok(response.map(axum::body::Body::new)),
                        Err(e) => Ok(bad_gateway(
                            "upstream-failed",
                            &format!("sandboxd egress: {host}:{port} did not answer: {e}"),
                        )),
                    }
                }
            },
        );
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(sandbox_side), service)
            .await;
        let source = added.lock().ok().and_then(|mut a| a.take());
        let reason = source.map_or_else(String::new, |s| format!("credential added: {s}"));
        let (out, inn) = (
            carried.0.load(std::sync::atomic::Ordering::Relaxed),
            carried.1.load(std::sync::atomic::Ordering::Relaxed),
        );
        self.gate.count_bytes(&who.runtime, out, inn);
        self.gate
            .log
            .record_with(who, name, port, Verdict::Allowed, (out, inn), &reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_never_leads_to_the_node_the_metadata_address_or_a_private_range() {
        let deny: Vec<String> = crate::container::network::DEFAULT_DENY
            .split(',')
            .map(str::to_owned)
            .collect();
        let node = [Ipv4Addr::new(198, 18, 0, 7)];
        let ip = |s: &str| s.parse::<Ipv4Addr>().expect("an address");
        let resolved = [
            ip("169.254.169.254"),
            ip("10.0.0.5"),
            ip("172.20.1.1"),
            ip("192.168.1.1"),
            ip("100.64.0.1"),
            ip("127.0.0.1"),
            ip("0.0.0.0"),
            ip("224.0.0.1"),
            ip("255.255.255.255"),
            ip("198.18.0.7"),
            ip("203.0.113.10"),
        ];
        assert_eq!(
            dialable(&resolved, &deny, &node, |_| false),
            [ip("203.0.113.10")],
            "only the public address"
        );
        // A cidr entry lets a private address through, that one only.
        assert_eq!(
            dialable(&resolved, &deny, &node, |a| a == ip("10.0.0.5")),
            [ip("10.0.0.5"), ip("203.0.113.10")]
        );
    }

    #[test]
    fn an_http_head_names_its_host_without_the_port() {
        assert_eq!(
            named(b"GET / HTTP/1.1\r\nHost: Allowed.Test:8080\r\n\r\n"),
            Some(Named::Http(Some("allowed.test".into())))
        );
        assert_eq!(
            named(b"GET / HTTP/1.1\r\nHost: allowed.test.\r\n\r\n"),
            Some(Named::Http(Some("allowed.test".into())))
        );
        assert_eq!(
            named(b"GET / HTTP/1.1\r\nAccept: */*\r\n\r\n"),
            Some(Named::Http(None))
        );
        assert_eq!(
            named(b"GET / HTTP/1.1\r\nHost: allowed"),
            None,
            "more is needed"
        );
        assert_eq!(named(b"SSH-2.0-OpenSSH\r\n"), Some(Named::Unknown));
        assert_eq!(named(b""), None);
    }

    #[test]
    fn a_client_hello_names_its_sni() {
        // A ClientHello as rustls's own client writes it.
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let mut conn = rustls::ClientConnection::new(
            Arc::new(config),
            "Allowed.Test".try_into().expect("a name"),
        )
        .expect("a client");
        let mut hello = Vec::new();
        conn.write_tls(&mut hello).expect("a hello");
        assert_eq!(named(&hello), Some(Named::Tls(Some("allowed.test".into()))));
        assert_eq!(named(&hello[..20]), None, "more is needed");
    }
}
