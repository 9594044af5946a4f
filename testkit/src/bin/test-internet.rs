//! `test-internet`: the servers of the test internet ([`sandboxd_testkit::internet`]), run by
//! [`Internet::start`](sandboxd_testkit::internet::Internet::start) inside its network
//! namespace. Every server only answers; nothing is ever dialled from here.
//!
//! ```text
//! test-internet --dns ADDR:PORT --queries-log FILE [--record NAME=IPV4]... [--txt NAME=TEXT]...
//!     [--http ADDR:PORT=LABEL]... [--https ADDR:PORT=LABEL]... [--cert PEM --key PEM]
//!     [--echo ADDR:PORT]... [--udp ADDR:PORT]... [--udp-log FILE] [--tcp-log FILE] [--http-log FILE]
//!     [--auth LABEL=HEADER=FILE]...
//! ```
//!
//! - DNS over UDP and TCP: the A records given (any case), a TXT answer for a name given with
//!   `--txt`, no data (NOERROR, empty) for another type of a known name, NXDOMAIN for any other
//!   name. Each query is a line `transport<TAB>from<TAB>name<TAB>type` of the queries log.
//! - HTTP and HTTPS: any request gets 200 and `hello from LABEL (ADDR)` and a newline; each is a
//!   line `scheme<TAB>to<TAB>method<TAB>host<TAB>path` of the HTTP log. But a request of the path
//!   `/bytes/N` (N a decimal count of bytes, no query) gets 200 and N zero bytes with
//!   `content-length: N`, streamed in 1 MiB chunks of one static buffer (nothing is
//!   allocated per chunk): a download as big as a benchmark needs (`/bytes/1073741824`, 1 GiB).
//! - `--auth LABEL=HEADER=FILE`: the HTTP and HTTPS servers of LABEL answer as above only a
//!   request carrying HEADER exactly once, equal to FILE's content (read at each request, a
//!   trailing newline trimmed); any other gets `401` and `credential missing or wrong`. What
//!   arrived is never echoed nor logged.
//! - TCP echo; UDP ports where each datagram is a line `to<TAB>from<TAB>length` of the UDP log.
//! - Each accepted connection is a line `service<TAB>to<TAB>from` of the TCP log.
//!
//! Every log line is written with one write, unbuffered. Once every socket is bound it prints
//! `test-internet ready` on stdout; it exits when its standard input closes (the test that
//! started it is gone) or on SIGTERM/SIGKILL.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, TXT};
use hickory_proto::rr::{RData, Record, RecordType};
use http_body_util::{Either, Full};
use hyper::body::{Bytes, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sandboxd_testkit::internet::READY;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

/// The TTL of every answer: short, the tests change nothing though.
const TTL: u32 = 5;

/// The path prefix of the zeros download: `/bytes/N` answers N zero bytes.
const BYTES_PATH: &str = "/bytes/";

/// The chunk the zeros download is sent in: one static buffer of zeros (1 MiB).
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// The body of `/bytes/N`: N zero bytes, [`ZEROS`] at a time, its length known up front.
struct Zeros {
    /// The bytes still to send.
    left: u64,
}

impl hyper::body::Body for Zeros {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = usize::try_from(self.left).map_or(ZEROS.len(), |left| left.min(ZEROS.len()));
        self.left -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&ZEROS[..n])))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

/// The count N of a path `/bytes/N` (decimal digits only), or `None` for any other path.
fn zeros_asked(path: &str) -> Option<u64> {
    let n = path.strip_prefix(BYTES_PATH)?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// An append-only log file, one write per line; none when not asked for.
#[derive(Clone, Default)]
struct Log(Option<Arc<Mutex<File>>>);

impl Log {
    fn open(path: &PathBuf) -> io::Result<Self> {
        let file = File::options().create(true).append(true).open(path)?;
        Ok(Self(Some(Arc::new(Mutex::new(file)))))
    }

    /// Writes `fields` tab-separated as one line (tabs and newlines in them become spaces).
    fn line(&self, fields: &[&str]) {
        let Some(file) = &self.0 else { return };
        let clean: Vec<String> = fields
            .iter()
            .map(|f| f.replace(['\t', '\n', '\r'], " "))
            .collect();
        let line = format!("{}\n", clean.join("\t"));
        if let Ok(mut f) = file.lock() {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// What the command line asks for.
#[derive(Default)]
struct Args {
    dns: Vec<SocketAddr>,
    records: HashMap<String, Vec<Ipv4Addr>>,
    txt: HashMap<String, Vec<String>>,
    http: Vec<(SocketAddr, String)>,
    https: Vec<(SocketAddr, String)>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    echo: Vec<SocketAddr>,
    udp: Vec<SocketAddr>,
    queries_log: Option<PathBuf>,
    udp_log: Option<PathBuf>,
    tcp_log: Option<PathBuf>,
    http_log: Option<PathBuf>,
    /// By label: the header demanded and the file of its value.
    auth: HashMap<String, (String, PathBuf)>,
}

/// The name as the server keys it: lowercase, no trailing dot.
fn key(name: &str) -> String {
    name.trim_end_matches('.').to_lowercase()
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let addr = |v: &str| {
            v.parse::<SocketAddr>()
                .map_err(|e| format!("{flag} {v}: {e}"))
        };
        let pair = |v: &str| {
            v.split_once('=')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| format!("{flag} {v}: expected X=Y"))
        };
        match flag.as_str() {
            "--dns" => args.dns.push(addr(&value)?),
            "--record" => {
                let (name, ip) = pair(&value)?;
                let ip = ip.parse().map_err(|e| format!("{flag} {value}: {e}"))?;
                args.records.entry(key(&name)).or_default().push(ip);
            }
            "--txt" => {
                let (name, text) = pair(&value)?;
                args.txt.entry(key(&name)).or_default().push(text);
            }
            "--http" | "--https" => {
                let (a, label) = pair(&value)?;
                let list = if flag == "--http" {
                    &mut args.http
                } else {
                    &mut args.https
                };
                list.push((addr(&a)?, label));
            }
            "--cert" => args.cert = Some(value.into()),
            "--key" => args.key = Some(value.into()),
            "--echo" => args.echo.push(addr(&value)?),
            "--udp" => args.udp.push(addr(&value)?),
            "--queries-log" => args.queries_log = Some(value.into()),
            "--udp-log" => args.udp_log = Some(value.into()),
            "--tcp-log" => args.tcp_log = Some(value.into()),
            "--http-log" => args.http_log = Some(value.into()),
            "--auth" => {
                let mut parts = value.splitn(3, '=');
                let (Some(label), Some(header), Some(file)) =
                    (parts.next(), parts.next(), parts.next())
                else {
                    return Err(format!("{flag} {value}: expected LABEL=HEADER=FILE"));
                };
                args.auth
                    .insert(label.to_owned(), (header.to_owned(), file.into()));
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(args)
}

/// The logs of a run.
#[derive(Clone, Default)]
struct Logs {
    queries: Log,
    udp: Log,
    tcp: Log,
    http: Log,
}

fn open_log(path: &Option<PathBuf>) -> io::Result<Log> {
    path.as_ref().map_or(Ok(Log::default()), Log::open)
}

/// The DNS zone: A and TXT records by name.
struct Zone {
    records: HashMap<String, Vec<Ipv4Addr>>,
    txt: HashMap<String, Vec<String>>,
}

impl Zone {
    /// The answer to `query` (a DNS message), or `None` when it is no query at all.
    fn answer(
        &self,
        query: &[u8],
        transport: &str,
        from: SocketAddr,
        log: &Log,
    ) -> Option<Vec<u8>> {
        let request = Message::from_vec(query).ok()?;
        if request.metadata.message_type != MessageType::Query {
            return None;
        }
        let mut response = Message::response(request.metadata.id, request.metadata.op_code);
        response.metadata.recursion_desired = request.metadata.recursion_desired;
        response.metadata.authoritative = true;
        if request.edns.is_some() {
            response.set_edns(Edns::new());
        }
        if request.metadata.op_code != OpCode::Query || request.queries.len() != 1 {
            response.metadata.response_code = ResponseCode::NotImp;
            response.add_queries(request.queries.clone());
            return response.to_vec().ok();
        }
        let query = &request.queries[0];
        let name = key(&query.name().to_ascii());
        log.line(&[
            transport,
            &from.to_string(),
            &name,
            &query.query_type().to_string(),
        ]);
        response.add_query(query.clone());
        let known = self.records.contains_key(&name) || self.txt.contains_key(&name);
        if !known {
            response.metadata.response_code = ResponseCode::NXDomain;
            return response.to_vec().ok();
        }
        match query.query_type() {
            RecordType::A => {
                for ip in self.records.get(&name).into_iter().flatten() {
                    response.add_answer(Record::from_rdata(
                        query.name().clone(),
                        TTL,
                        RData::A(A(*ip)),
                    ));
                }
            }
            RecordType::TXT => {
                for text in self.txt.get(&name).into_iter().flatten() {
                    response.add_answer(Record::from_rdata(
                        query.name().clone(),
                        TTL,
                        RData::TXT(TXT::new(vec![text.clone()])),
                    ));
                }
            }
            // A known name without data of that type: NOERROR, no answer.
            _ => {}
        }
        response.to_vec().ok()
    }
}

/// Answers DNS over UDP on `socket`.
async fn dns_udp(socket: UdpSocket, zone: Arc<Zone>, log: Log) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        if let Some(answer) = zone.answer(&buf[..n], "udp", from, &log) {
            let _ = socket.send_to(&answer, from).await;
        }
    }
}

/// Answers DNS over TCP (length-prefixed messages) on one connection.
async fn dns_tcp(mut stream: TcpStream, from: SocketAddr, zone: Arc<Zone>, log: Log) {
    loop {
        let Ok(len) = stream.read_u16().await else {
            return;
        };
        let mut query = vec![0u8; usize::from(len)];
        if stream.read_exact(&mut query).await.is_err() {
            return;
        }
        let Some(answer) = zone.answer(&query, "tcp", from, &log) else {
            return;
        };
        let Ok(len) = u16::try_from(answer.len()) else {
            return;
        };
        if stream.write_u16(len).await.is_err() || stream.write_all(&answer).await.is_err() {
            return;
        }
    }
}

/// Serves HTTP/1.1 on one connection (plain or TLS): 200 and the server's body to any request,
/// or N zeros to `/bytes/N`.
async fn http<S>(
    io: S,
    scheme: &'static str,
    to: SocketAddr,
    body: Arc<str>,
    log: Log,
    auth: Option<(String, PathBuf)>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req: hyper::Request<Incoming>| {
        let authorised = auth.as_ref().is_none_or(|(header, file)| {
            let want = std::fs::read_to_string(file).unwrap_or_default();
            let want = want.trim_end_matches(['\n', '\r']);
            let got: Vec<_> = req.headers().get_all(header.as_str()).iter().collect();
            !want.is_empty() && got.len() == 1 && got[0].as_bytes() == want.as_bytes()
        });
        let host = req
            .headers()
            .get(hyper::header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let path = req
            .uri()
            .path_and_query()
            .map(ToString::to_string)
            .unwrap_or_default();
        log.line(&[scheme, &to.to_string(), req.method().as_str(), &host, &path]);
        let response = match zeros_asked(&path) {
            _ if !authorised => hyper::Response::builder()
                .status(hyper::StatusCode::UNAUTHORIZED)
                .header(hyper::header::CONTENT_TYPE, "text/plain")
                .body(Either::Left(Full::new(Bytes::from_static(
                    b"credential missing or wrong\n",
                )))),
            Some(n) => hyper::Response::builder()
                .header(hyper::header::CONTENT_TYPE, "application/octet-stream")
                .header(hyper::header::CONTENT_LENGTH, n)
                .body(Either::Right(Zeros { left: n })),
            None => hyper::Response::builder()
                .header(hyper::header::CONTENT_TYPE, "text/plain")
                .body(Either::Left(Full::new(Bytes::from(body.to_string())))),
        };
        let response =
            response.unwrap_or_else(|_| hyper::Response::new(Either::Left(Full::default())));
        async move { Ok::<_, Infallible>(response) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), service)
        .await;
}

/// The TLS configuration of the HTTPS servers: the certificate and key files given.
fn tls(args: &Args) -> Result<tokio_rustls::TlsAcceptor, String> {
    let (Some(cert), Some(key)) = (&args.cert, &args.key) else {
        return Err("--https needs --cert and --key".into());
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(
        rustls::crypto::ring::default_provider().into(),
    )
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Accepts connections on `listener` forever, logging each as `service`, and runs `serve` on
/// each. Every connection is `TCP_NODELAY`, as a real server's is: a short write (a TLS 1.3
/// session ticket, then the response) is not held back by Nagle's algorithm until the client's
/// delayed ACK, 40 ms later, which a benchmark's time to first byte would measure.
fn accept<F, Fut>(listener: TcpListener, service: &'static str, log: Log, serve: F)
where
    F: Fn(TcpStream, SocketAddr, SocketAddr) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let Ok((stream, from)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let to = stream.local_addr().unwrap_or(from);
            log.line(&[service, &to.to_string(), &from.to_string()]);
            tokio::spawn(serve(stream, to, from));
        }
    });
}

async fn run(args: Args) -> Result<(), String> {
    let open = |p: &Option<PathBuf>| open_log(p).map_err(|e| format!("a log: {e}"));
    let logs = Logs {
        queries: open(&args.queries_log)?,
        udp: open(&args.udp_log)?,
        tcp: open(&args.tcp_log)?,
        http: open(&args.http_log)?,
    };
    let bind = |a: &SocketAddr, e: io::Error| format!("bind {a}: {e}");
    let zone = Arc::new(Zone {
        records: args.records.clone(),
        txt: args.txt.clone(),
    });
    for addr in &args.dns {
        let socket = UdpSocket::bind(addr).await.map_err(|e| bind(addr, e))?;
        tokio::spawn(dns_udp(socket, zone.clone(), logs.queries.clone()));
        let listener = TcpListener::bind(addr).await.map_err(|e| bind(addr, e))?;
        let (zone, log) = (zone.clone(), logs.queries.clone());
        accept(listener, "dns", logs.tcp.clone(), move |s, _, from| {
            dns_tcp(s, from, zone.clone(), log.clone())
        });
    }
    for (addr, label) in &args.http {
        let listener = TcpListener::bind(addr).await.map_err(|e| bind(addr, e))?;
        let body: Arc<str> = format!("hello from {label} ({})\n", addr.ip()).into();
        let log = logs.http.clone();
        let auth = args.auth.get(label).cloned();
        accept(listener, "http", logs.tcp.clone(), move |s, to, _| {
            http(s, "http", to, body.clone(), log.clone(), auth.clone())
        });
    }
    if !args.https.is_empty() {
        let acceptor = tls(&args)?;
        for (addr, label) in &args.https {
            let listener = TcpListener::bind(addr).await.map_err(|e| bind(addr, e))?;
            let body: Arc<str> = format!("hello from {label} ({})\n", addr.ip()).into();
            let (log, acceptor) = (logs.http.clone(), acceptor.clone());
            let auth = args.auth.get(label).cloned();
            accept(listener, "https", logs.tcp.clone(), move |s, to, _| {
                let (acceptor, body, log, auth) =
                    (acceptor.clone(), body.clone(), log.clone(), auth.clone());
                async move {
                    if let Ok(tls) = acceptor.accept(s).await {
                        http(tls, "https", to, body, log, auth).await;
                    }
                }
            });
        }
    }
    for addr in &args.echo {
        let listener = TcpListener::bind(addr).await.map_err(|e| bind(addr, e))?;
        accept(
            listener,
            "echo",
            logs.tcp.clone(),
            |mut s, _, _| async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            },
        );
    }
    for addr in &args.udp {
        let socket = UdpSocket::bind(addr).await.map_err(|e| bind(addr, e))?;
        let (to, log) = (*addr, logs.udp.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            loop {
                if let Ok((n, from)) = socket.recv_from(&mut buf).await {
                    log.line(&[&to.to_string(), &from.to_string(), &n.to_string()]);
                }
            }
        });
    }
    let mut out = io::stdout();
    writeln!(out, "{READY}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("stdout: {e}"))?;
    // Until the test closes standard input (or dies).
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = [0u8; 256];
        let mut stdin = io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        let _ = tx.send(());
    });
    let _ = rx.await;
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("test-internet: {e}");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("test-internet: a runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(run(args)) {
        eprintln!("test-internet: {e}");
        std::process::exit(1);
    }
}
