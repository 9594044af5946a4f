//! The typed client of sandboxd's `/v1` API, used by the operator, the CLI and the tests.
//!
//! It tells "no such session" (the server's own 404 with [`ErrorCode::SessionNotFound`]) apart from
//! "this server does not serve that route" (a 404 without that code): the second is a version
//! mismatch, reported with the version this client expected.
//!
//! Over 600 lines: one short method per route of the API.

use std::collections::HashMap;

use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::audit::{OperationPage, OperationQuery, SessionEvents};
use crate::error::{ErrorBody, ErrorCode};
use crate::files::{Entry, Listing, Tree};
use crate::headers::{AGENT_HEADER, RUN_HEADER, TRACEPARENT_HEADER};
use crate::policy::PolicyView;
use crate::port_socket::PortSocket;
use crate::ports::{PortList, PortRequest};
use crate::routes::Index;
use crate::run::{RunEvent, RunOutcome, RunRequest, RunStatus};
use crate::runtimes::RuntimeList;
use crate::session::{Destroyed, Limits, OpenRequest, Opened, RebuildRequest, SessionView};
use crate::terminal::{Terminal, TerminalKilled, TerminalList, TerminalRequest};
use crate::ws::TerminalSocket;
use sandboxd_catalog::CatalogEntry;
use tokio_tungstenite::WebSocketStream;

/// The most a read allocates up front from the size the server announces.
const MAX_PREALLOCATE: u64 = 256 * 1024 * 1024;

/// What a client call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The session does not exist (the server said so).
    #[error("No such session '{0}'")]
    NoSuchSession(String),
    /// The server does not serve a route this client needs.
    #[error(
        "The sandbox service does not serve {route} - its version does not match this client (expected {expected})"
    )]
    VersionMismatch {
        /// The route that is missing.
        route: String,
        /// The version this client speaks.
        expected: String,
    },
    /// The server refused with its own error.
    #[error("{code} ({status}): {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// The server's code.
        code: ErrorCode,
        /// The server's message.
        message: String,
    },
    /// The server could not be reached or the answer could not be read.
    #[error("sandboxd at {base} could not be reached: {message}")]
    Transport {
        /// The base URL.
        base: String,
        /// What failed.
        message: String,
        /// Whether it failed because the server's TLS certificate was not trusted.
        untrusted: bool,
    },
    /// The CA this client was given to trust is not usable.
    #[error("the CA to trust for sandboxd ({origin}) holds no usable PEM certificate{why}")]
    BadCa {
        /// Where the CA came from (a file, a Secret's key).
        origin: String,
        /// What the parser said.
        why: String,
    },
}

impl ClientError {
    /// Whether the server could not be trusted: its TLS certificate failed verification.
    pub fn is_untrusted(&self) -> bool {
        matches!(
            self,
            ClientError::Transport {
                untrusted: true,
                ..
            }
        )
    }

    /// The server's error code, when it sent one.
    pub fn code(&self) -> Option<&ErrorCode> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            ClientError::NoSuchSession(_) => Some(&ErrorCode::SessionNotFound),
            _ => None,
        }
    }
}

/// What an open returned: [`Opened`], whose `created` says whether this call created the
/// session (201) or found it (200).
pub type OpenResponse = Opened;

/// A client of one sandboxd with one token (admin or session).
#[derive(Clone)]
pub struct Client {
    base: String,
    token: String,
    agent: Option<String>,
    run: Option<String>,
    /// The W3C trace context sent with every request ([`Client::with_traceparent`]).
    traceparent: Option<String>,
    http: reqwest::Client,
    /// What https:// endpoints are verified against, for messages.
    trust: &'static str,
    /// The longest a request may take, answer included ([`Client::with_deadline`]); none
    /// waits as long as the server takes (a run streams for as long as it runs).
    deadline: Option<std::time::Duration>,
}

/// The longest a connection to sandboxd may take to be set up.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// What a client verifies sandboxd's certificate against: the CA it was given, or, with none,
/// the system's roots. Made once and shared by clients of one host (its connections too).
#[derive(Clone)]
pub struct Trust {
    http: reqwest::Client,
    trust: &'static str,
}

impl std::fmt::Debug for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trust").field("trust", &self.trust).finish()
    }
}

impl Trust {
    /// Trusts the system's CA roots for https:// endpoints. A system without any (a minimal
    /// image without ca-certificates: the chart's operator image) trusts no CA: plain http://
    /// endpoints work, https:// ones fail verification, naming why.
    pub fn system() -> Self {
        crate::tls::install_provider();
        // With the provider installed, reqwest verifies against the system's roots; it refuses
        // to build a client when the system has none.
        let builder = || reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT);
        match builder().build() {
            Ok(http) => Self {
                http,
                trust: "the system's CA roots",
            },
            Err(_) => Self {
                http: builder()
                    .tls_certs_only(Vec::new())
                    .build()
                    .unwrap_or_default(),
                trust: "no CA (the system has no CA roots)",
            },
        }
    }

    /// Trusts only the CA certificates of the PEM bundle `ca` (from `origin`, named in the
    /// error) for https:// endpoints; `None` is [`Trust::system`]. The certificate must name
    /// the endpoint's host (DNS or IP SAN).
    pub fn ca(ca: Option<&[u8]>, origin: &str) -> Result<Self, ClientError> {
        let Some(ca) = ca else {
            return Ok(Self::system());
        };
        crate::tls::install_provider();
        let bad = |why: String| ClientError::BadCa {
            origin: origin.to_owned(),
            why,
        };
        let certs = crate::tls::certificates(ca).map_err(bad)?;
        let mut roots = Vec::with_capacity(certs.len());
        for c in certs {
            roots.push(reqwest::Certificate::from_der(&c).map_err(|e| bad(format!(": {e}")))?);
        }
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .tls_certs_only(roots)
            .build()
            .map_err(|e| bad(format!(": {e}")))?;
        Ok(Self {
            http,
            trust: "only the CA it was given",
        })
    }
}

/// The rustls verdict on a certificate, when `e` failed on one.
fn certificate_error(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        // The connector wraps rustls' error in an io::Error, itself in another: io::Error's
        // source() skips the error it wraps, so it is unwrapped by hand.
        let mut inner: &(dyn std::error::Error + 'static) = err;
        while let Some(wrapped) = inner
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            inner = wrapped;
        }
        let tls = inner.downcast_ref::<rustls::Error>();
        if let Some(
            t @ (rustls::Error::InvalidCertificate(_)
            | rustls::Error::NoCertificatesPresented
            | rustls::Error::UnsupportedNameType),
        ) = tls
        {
            return Some(t.to_string());
        }
        cur = err.source();
    }
    None
}

/// `e` and its sources, joined (reqwest's own message is only "error sending request").
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// `?owner=…` for a request acting for `owner`, or nothing.
fn owner_query(owner: Option<&str>) -> String {
    owner
        .map(|o| format!("?owner={}", urlencoding::encode(o)))
        .unwrap_or_default()
}

fn enc(path: &str) -> String {
    path.split('/')
        .map(|p| urlencoding::encode(p).into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

impl Client {
    /// A client of the sandboxd at `base` (for example `http://127.0.0.1:8080`); an https://
    /// base is verified against the system's CA roots.
    pub fn new(base: &str, token: &str) -> Self {
        Self::with_trust(base, token, &Trust::system())
    }

    /// A client of the sandboxd at `base` that verifies an https:// base with `trust`.
    pub fn with_trust(base: &str, token: &str, trust: &Trust) -> Self {
        Self {
            base: base.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            agent: None,
            run: None,
            traceparent: None,
            http: trust.http.clone(),
            trust: trust.trust,
            deadline: None,
        }
    }

    /// The same client, giving up on a request that has not been answered in full within
    /// `deadline`: a host that hangs (stopped, packets dropped) fails like one that is down.
    pub fn with_deadline(&self, deadline: std::time::Duration) -> Self {
        Self {
            deadline: Some(deadline),
            ..self.clone()
        }
    }

    /// The same server with another token.
    pub fn with_token(&self, token: &str) -> Self {
        Self {
            token: token.to_owned(),
            ..self.clone()
        }
    }

    /// The same client, naming the agent and run behind its requests (`X-Sandbox-Agent`,
    /// `X-Sandbox-Run`), as the audit log records them.
    pub fn with_actor(&self, agent: Option<&str>, run: Option<&str>) -> Self {
        Self {
            agent: agent.map(str::to_owned),
            run: run.map(str::to_owned),
            ..self.clone()
        }
    }

    /// The same client, sending `traceparent` (the W3C trace context of the caller's span) with
    /// every request, so sandboxd's spans join the caller's trace; `None` sends none.
    pub fn with_traceparent(&self, traceparent: Option<String>) -> Self {
        Self {
            traceparent,
            ..self.clone()
        }
    }

    fn transport(&self, e: impl std::fmt::Display) -> ClientError {
        ClientError::Transport {
            base: self.base.clone(),
            message: e.to_string(),
            untrusted: false,
        }
    }

    /// A request that failed: an untrusted certificate says so and what this client trusts.
    fn send_failed(&self, e: reqwest::Error) -> ClientError {
        if e.is_timeout() {
            let within = match self.deadline {
                Some(d) if !e.is_connect() => format!("answer within {} s", d.as_secs_f64()),
                _ => format!("connection within {} s", CONNECT_TIMEOUT.as_secs()),
            };
            return self.transport(format!(
                "no {within}: the host hangs, is overloaded or drops packets"
            ));
        }
        if let Some(why) = certificate_error(&e) {
            return ClientError::Transport {
                base: self.base.clone(),
                message: format!(
                    "its TLS certificate is not trusted ({why}); this client trusts {}",
                    self.trust
                ),
                untrusted: true,
            };
        }
        self.transport(error_chain(&e))
    }

    /// A request of `method` to `path` with this client's token, deadline, actor and trace
    /// context.
    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(d) = self.deadline {
            req = req.timeout(d);
        }
        if let Some(a) = &self.agent {
            req = req.header(AGENT_HEADER, a);
        }
        if let Some(r) = &self.run {
            req = req.header(RUN_HEADER, r);
        }
        if let Some(t) = &self.traceparent {
            req = req.header(TRACEPARENT_HEADER, t);
        }
        req
    }

    async fn send(
        &self,
        method: Method,
        route: &str,
        path: &str,
        body: Option<reqwest::Body>,
        json_body: Option<serde_json::Value>,
    ) -> Result<reqwest::Response, ClientError> {
        let mut req = self.request(method, path);
        if let Some(v) = json_body {
            req = req.json(&v);
        } else if let Some(b) = body {
            req = req.body(b);
        }
        let resp = req.send().await.map_err(|e| self.send_failed(e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(self.refusal(route, path, resp).await)
    }

    /// The error an answer of `route` (asked at `path`) that is not a success stands for: the
    /// server's own error body, or, without one, a version mismatch (404, 405) or the status.
    async fn refusal(&self, route: &str, path: &str, resp: reqwest::Response) -> ClientError {
        let status = resp.status();
        let bytes = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => return self.transport(e),
        };
        let parsed: Option<ErrorBody> = serde_json::from_slice(&bytes).ok();
        match parsed.map(|b| (b.code, b.message)) {
            Some((ErrorCode::SessionNotFound, _)) => {
                let route_path = path.split('?').next().unwrap_or_default();
                let id = route_path.split('/').nth(3).unwrap_or_default();
                ClientError::NoSuchSession(
                    urlencoding::decode(id)
                        .map(|s| s.into_owned())
                        .unwrap_or_default(),
                )
            }
            Some((code, message)) if code != ErrorCode::RouteNotFound => ClientError::Api {
                status: status.as_u16(),
                code,
                message,
            },
            _ if status == StatusCode::NOT_FOUND || status == StatusCode::METHOD_NOT_ALLOWED => {
                ClientError::VersionMismatch {
                    route: route.to_owned(),
                    expected: crate::VERSION.to_owned(),
                }
            }
            _ => ClientError::Api {
                status: status.as_u16(),
                code: ErrorCode::HttpError,
                message: String::from_utf8_lossy(&bytes).into_owned(),
            },
        }
    }

    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        route: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<T, ClientError> {
        let resp = self.send(method, route, path, None, body).await?;
        resp.json().await.map_err(|e| self.transport(e))
    }

    /// The index (no token needed).
    pub async fn index(&self) -> Result<Index, ClientError> {
        self.json(Method::GET, "GET /", "/", None).await
    }

    /// Opens a session by name (admin token).
    pub async fn open(
        &self,
        name: &str,
        tenant: &str,
        runtime: Option<&str>,
        limits: Option<&Limits>,
    ) -> Result<OpenResponse, ClientError> {
        self.open_as(name, tenant, None, runtime, limits).await
    }

    /// Opens a session by name for `owner` (the object it belongs to, e.g. a SandboxSession's
    /// uid): a session another owner holds is refused with 409 `owner_mismatch`; one without
    /// an owner is adopted.
    pub async fn open_as(
        &self,
        name: &str,
        tenant: &str,
        owner: Option<&str>,
        runtime: Option<&str>,
        limits: Option<&Limits>,
    ) -> Result<OpenResponse, ClientError> {
        self.open_request(&OpenRequest {
            name: name.to_owned(),
            tenant: tenant.to_owned(),
            runtime: runtime.map(str::to_owned),
            limits: limits.cloned(),
            owner: owner.map(str::to_owned),
            egress: Vec::new(),
            from_snapshot: None,
        })
        .await
    }

    /// Opens a session as `body` asks in full (its owner, limits and egress policies).
    pub async fn open_request(&self, body: &OpenRequest) -> Result<OpenResponse, ClientError> {
        let body = serde_json::to_value(body).map_err(|e| self.transport(e))?;
        let resp = self
            .send(
                Method::POST,
                "POST /v1/sessions",
                "/v1/sessions",
                None,
                Some(body),
            )
            .await?;
        let created = resp.status() == StatusCode::CREATED;
        let mut out: OpenResponse = resp.json().await.map_err(|e| self.transport(e))?;
        out.created = created;
        Ok(out)
    }

    /// One session.
    pub async fn get(&self, id: &str) -> Result<SessionView, ClientError> {
        self.json(
            Method::GET,
            "GET /v1/sessions/{id}",
            &format!("/v1/sessions/{}", enc(id)),
            None,
        )
        .await
    }

    /// One session without its `usage` (`?usage=false`: sandboxd asks Docker nothing for it).
    pub async fn get_without_usage(&self, id: &str) -> Result<SessionView, ClientError> {
        self.json(
            Method::GET,
            "GET /v1/sessions/{id}",
            &format!("/v1/sessions/{}?usage=false", enc(id)),
            None,
        )
        .await
    }

    /// Every session (admin token).
    pub async fn list(&self) -> Result<Vec<SessionView>, ClientError> {
        #[derive(serde::Deserialize)]
        struct List {
            sessions: Vec<SessionView>,
        }
        Ok(self
            .json::<List>(Method::GET, "GET /v1/sessions", "/v1/sessions", None)
            .await?
            .sessions)
    }

    async fn action(&self, id: &str, verb: &str) -> Result<SessionView, ClientError> {
        self.json(
            Method::POST,
            &format!("POST /v1/sessions/{{id}}/{verb}"),
            &format!("/v1/sessions/{}/{verb}", enc(id)),
            None,
        )
        .await
    }

    /// Puts a session to sleep.
    pub async fn stop(&self, id: &str) -> Result<SessionView, ClientError> {
        self.action(id, "stop").await
    }

    /// Pauses a session of a gvisor runtime: asleep with its processes and memory.
    pub async fn pause(&self, id: &str) -> Result<SessionView, ClientError> {
        self.action(id, "pause").await
    }

    /// Resumes a paused (or sleeping) session.
    pub async fn resume(&self, id: &str) -> Result<SessionView, ClientError> {
        self.action(id, "resume").await
    }

    /// Wakes a session.
    pub async fn start(&self, id: &str) -> Result<SessionView, ClientError> {
        self.action(id, "start").await
    }

    /// Removes a session's container, keeping its workspace.
    pub async fn reclaim(&self, id: &str) -> Result<SessionView, ClientError> {
        self.action(id, "reclaim").await
    }

    /// Rebuilds a session (admin token): its container recreated from its runtime's current
    /// image with the limits asked, the workspace kept. A running session runs again on the
    /// new container; a stopped one loses its container (it wakes on the new image); a
    /// reclaimed one keeps the limits for its next container.
    pub async fn rebuild(
        &self,
        id: &str,
        req: &RebuildRequest,
    ) -> Result<SessionView, ClientError> {
        let body = serde_json::to_value(req).map_err(|e| self.transport(e))?;
        self.json(
            Method::POST,
            "POST /v1/sessions/{id}/rebuild",
            &format!("/v1/sessions/{}/rebuild", enc(id)),
            Some(body),
        )
        .await
    }

    /// Gives a session a new token (admin token).
    pub async fn rotate_token(&self, id: &str) -> Result<String, ClientError> {
        self.rotate_token_as(id, None).await
    }

    /// Gives a session of `owner` a new token (admin token); a session another owner holds
    /// keeps its token (409 `owner_mismatch`).
    pub async fn rotate_token_as(
        &self,
        id: &str,
        owner: Option<&str>,
    ) -> Result<String, ClientError> {
        #[derive(serde::Deserialize)]
        struct T {
            token: String,
        }
        Ok(self
            .json::<T>(
                Method::POST,
                "POST /v1/sessions/{id}/token",
                &format!("/v1/sessions/{}/token{}", enc(id), owner_query(owner)),
                None,
            )
            .await?
            .token)
    }

    /// Destroys a session (container and workspace).
    pub async fn destroy(&self, id: &str) -> Result<Destroyed, ClientError> {
        self.destroy_as(id, None).await
    }

    /// Destroys a session of `owner`: one another owner holds is left alone (409
    /// `owner_mismatch`); one already gone is confirmed (`destroyed: false`).
    pub async fn destroy_as(
        &self,
        id: &str,
        owner: Option<&str>,
    ) -> Result<Destroyed, ClientError> {
        self.json(
            Method::DELETE,
            "DELETE /v1/sessions/{id}",
            &format!("/v1/sessions/{}{}", enc(id), owner_query(owner)),
            None,
        )
        .await
    }

    /// Takes snapshot `scope/name` of session `id`'s workspace (admin token): a running
    /// sandbox is paused while its files are read.
    pub async fn take_snapshot(
        &self,
        id: &str,
        scope: &str,
        name: &str,
    ) -> Result<crate::session::SnapshotView, ClientError> {
        let body = crate::session::SnapshotRequest {
            name: name.to_owned(),
            scope: scope.to_owned(),
        };
        let body = serde_json::to_value(&body).map_err(|e| self.transport(e))?;
        self.json(
            Method::POST,
            "POST /v1/sessions/{id}/snapshots",
            &format!("/v1/sessions/{}/snapshots", enc(id)),
            Some(body),
        )
        .await
    }

    /// Snapshot `scope/name` as the object store holds it (admin token).
    pub async fn snapshot(
        &self,
        scope: &str,
        name: &str,
    ) -> Result<crate::session::SnapshotView, ClientError> {
        self.json(
            Method::GET,
            "GET /v1/snapshots/{scope}/{name}",
            &format!("/v1/snapshots/{}/{}", enc(scope), enc(name)),
            None,
        )
        .await
    }

    /// Deletes snapshot `scope/name` (admin token); one already gone is fine.
    pub async fn delete_snapshot(&self, scope: &str, name: &str) -> Result<(), ClientError> {
        self.send(
            Method::DELETE,
            "DELETE /v1/snapshots/{scope}/{name}",
            &format!("/v1/snapshots/{}/{}", enc(scope), enc(name)),
            None,
            None,
        )
        .await
        .map(|_| ())
    }

    /// Runs a command and waits for it.
    pub async fn run(
        &self,
        id: &str,
        command: &str,
        timeout_seconds: Option<u64>,
        env: Option<&HashMap<String, String>>,
        run_id: Option<&str>,
    ) -> Result<RunOutcome, ClientError> {
        let body = RunRequest {
            command: command.to_owned(),
            timeout_seconds,
            env: env.cloned(),
            run_id: run_id.map(str::to_owned),
        };
        let body = serde_json::to_value(body).map_err(|e| self.transport(e))?;
        self.json(
            Method::POST,
            "POST /v1/sessions/{id}/runs",
            &format!("/v1/sessions/{}/runs", enc(id)),
            Some(body),
        )
        .await
    }

    /// Runs a command, handing each output event to `on_event` as it comes; the outcome holds
    /// the whole (capped) output as well.
    pub async fn run_streaming(
        &self,
        id: &str,
        command: &str,
        timeout_seconds: Option<u64>,
        mut on_event: impl FnMut(RunEvent),
    ) -> Result<RunOutcome, ClientError> {
        let body = RunRequest {
            command: command.to_owned(),
            timeout_seconds,
            env: None,
            run_id: None,
        };
        let body = serde_json::to_value(body).map_err(|e| self.transport(e))?;
        let resp = self
            .send(
                Method::POST,
                "POST /v1/sessions/{id}/runs",
                &format!("/v1/sessions/{}/runs?stream=true", enc(id)),
                None,
                Some(body),
            )
            .await?;
        /// One NDJSON line of the stream.
        #[derive(serde::Deserialize)]
        #[serde(tag = "type", rename_all = "snake_case")]
        enum Line {
            Stdout { data: String },
            Stderr { data: String },
            Exit(RunOutcome),
            Error { code: ErrorCode, message: String },
        }
        let mut stream = resp.bytes_stream();
        let (mut stdout, mut stderr) = (String::new(), String::new());
        let mut buf: Vec<u8> = Vec::new();
        // Lines start at `start`; bytes before `scanned` hold no newline.
        let (mut start, mut scanned) = (0usize, 0usize);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.transport(e))?;
            if start == buf.len() {
                buf.clear();
                (start, scanned) = (0, 0);
            } else if start > 0 && start >= buf.len() / 2 {
                buf.drain(..start);
                scanned -= start;
                start = 0;
            }
            buf.extend_from_slice(&chunk);
            while let Some(i) = buf[scanned..].iter().position(|b| *b == b'\n') {
                let end = scanned + i;
                let line: Line =
                    serde_json::from_slice(&buf[start..end]).map_err(|e| self.transport(e))?;
                start = end + 1;
                scanned = start;
                match line {
                    Line::Stdout { data } => {
                        stdout.push_str(&data);
                        on_event(RunEvent::Stdout { data });
                    }
                    Line::Stderr { data } => {
                        stderr.push_str(&data);
                        on_event(RunEvent::Stderr { data });
                    }
                    Line::Exit(mut outcome) => {
                        // The outcome line leaves out the output its events carried.
                        if outcome.stdout.is_empty() {
                            outcome.stdout = stdout;
                        }
                        if outcome.stderr.is_empty() {
                            outcome.stderr = stderr;
                        }
                        return Ok(outcome);
                    }
                    Line::Error { code, message } => {
                        return Err(ClientError::Api {
                            status: 500,
                            code,
                            message,
                        });
                    }
                }
            }
            scanned = buf.len();
        }
        Err(self.transport("the run stream ended without an outcome"))
    }

    /// The state of a run, in flight or finished (also one whose request a restart of
    /// sandboxd lost, on the agent path).
    pub async fn run_status(&self, id: &str, run_id: &str) -> Result<RunStatus, ClientError> {
        self.json(
            Method::GET,
            "GET /v1/sessions/{id}/runs/{run_id}",
            &format!("/v1/sessions/{}/runs/{}", enc(id), enc(run_id)),
            None,
        )
        .await
    }

    /// Stops a running run.
    pub async fn stop_run(&self, id: &str, run_id: &str) -> Result<(), ClientError> {
        self.send(
            Method::POST,
            "POST /v1/sessions/{id}/runs/{run_id}/stop",
            &format!("/v1/sessions/{}/runs/{}/stop", enc(id), enc(run_id)),
            None,
            Some(json!({})),
        )
        .await
        .map(|_| ())
    }

    /// Opens a terminal in the session's sandbox (`POST /v1/sessions/{id}/terminals`): a login
    /// shell, or `req.command` under `/bin/sh -c`, of `req.rows` by `req.cols`. It runs until its
    /// program ends or it is killed, attached or not ([`Client::attach_terminal`]).
    pub async fn open_terminal(
        &self,
        id: &str,
        req: &TerminalRequest,
    ) -> Result<Terminal, ClientError> {
        let body = serde_json::to_value(req).map_err(|e| self.transport(e))?;
        self.json(
            Method::POST,
            "POST /v1/sessions/{id}/terminals",
            &format!("/v1/sessions/{}/terminals", enc(id)),
            Some(body),
        )
        .await
    }

    /// The session's terminals, running ones first, then recently ended ones
    /// (`GET /v1/sessions/{id}/terminals`).
    pub async fn terminals(&self, id: &str) -> Result<Vec<Terminal>, ClientError> {
        Ok(self
            .json::<TerminalList>(
                Method::GET,
                "GET /v1/sessions/{id}/terminals",
                &format!("/v1/sessions/{}/terminals", enc(id)),
                None,
            )
            .await?
            .terminals)
    }

    /// Ends a terminal: its program and everything it started
    /// (`DELETE /v1/sessions/{id}/terminals/{terminal_id}`); an unknown one is 404
    /// `terminal_not_found`.
    pub async fn kill_terminal(
        &self,
        id: &str,
        terminal_id: &str,
    ) -> Result<TerminalKilled, ClientError> {
        self.json(
            Method::DELETE,
            "DELETE /v1/sessions/{id}/terminals/{terminal_id}",
            &format!("/v1/sessions/{}/terminals/{}", enc(id), enc(terminal_id)),
            None,
        )
        .await
    }

    /// Attaches to a terminal (`GET /v1/sessions/{id}/terminals/{terminal_id}/attach`): a
    /// WebSocket over this client's own connection (its TLS trust), that first says which
    /// terminal it is, then carries its scrollback and live output, and last how it ended. A
    /// refusal before the upgrade is the server's error, as for any other call (404
    /// `terminal_not_found`, …). Dropping the socket leaves the terminal running.
    pub async fn attach_terminal(
        &self,
        id: &str,
        terminal_id: &str,
    ) -> Result<TerminalSocket, ClientError> {
        let ws = self
            .websocket(
                "GET /v1/sessions/{id}/terminals/{terminal_id}/attach",
                &format!(
                    "/v1/sessions/{}/terminals/{}/attach",
                    enc(id),
                    enc(terminal_id)
                ),
                &format!("terminal {terminal_id}"),
            )
            .await?;
        Ok(TerminalSocket::new(ws, &self.base, terminal_id))
    }

    /// The session's open ports, ascending (`GET /v1/sessions/{id}/ports`).
    pub async fn ports(&self, id: &str) -> Result<Vec<u16>, ClientError> {
        Ok(self
            .json::<PortList>(
                Method::GET,
                "GET /v1/sessions/{id}/ports",
                &format!("/v1/sessions/{}/ports", enc(id)),
                None,
            )
            .await?
            .ports)
    }

    /// Opens `port` of the session's sandbox to connections through sandboxd
    /// (`POST /v1/sessions/{id}/ports`; one already open is left as it is); returns the
    /// session's open ports. A session has at most [`crate::ports::MAX_PORTS`] (429
    /// `port_limit`).
    pub async fn open_port(&self, id: &str, port: u16) -> Result<Vec<u16>, ClientError> {
        let body = serde_json::to_value(PortRequest { port }).map_err(|e| self.transport(e))?;
        Ok(self
            .json::<PortList>(
                Method::POST,
                "POST /v1/sessions/{id}/ports",
                &format!("/v1/sessions/{}/ports", enc(id)),
                Some(body),
            )
            .await?
            .ports)
    }

    /// Closes `port` to new connections (`DELETE /v1/sessions/{id}/ports/{port}`; those made
    /// go on); returns the session's open ports. One not open is 404 `port_not_open`.
    pub async fn close_port(&self, id: &str, port: u16) -> Result<Vec<u16>, ClientError> {
        Ok(self
            .json::<PortList>(
                Method::DELETE,
                "DELETE /v1/sessions/{id}/ports/{port}",
                &format!("/v1/sessions/{}/ports/{port}", enc(id)),
                None,
            )
            .await?
            .ports)
    }

    /// A signed preview link to open `port` (`POST /v1/sessions/{id}/previews`), lasting
    /// `seconds` (default one hour, at most 7 days): its `path`, under this client's base URL,
    /// reaches the port with no other credential. A port not open is 404 `port_not_open`.
    pub async fn preview(
        &self,
        id: &str,
        port: u16,
        seconds: Option<u64>,
    ) -> Result<crate::ports::Preview, ClientError> {
        let body = serde_json::to_value(crate::ports::PreviewRequest {
            port,
            expires_in_seconds: seconds,
        })
        .map_err(|e| self.transport(e))?;
        self.json(
            Method::POST,
            "POST /v1/sessions/{id}/previews",
            &format!("/v1/sessions/{}/previews", enc(id)),
            Some(body),
        )
        .await
    }

    /// A TCP connection to `port` inside the session's sandbox, made by sandboxd
    /// (`GET /v1/sessions/{id}/ports/{port}`): a WebSocket over this client's own connection
    /// whose binary messages are the connection's bytes. A refusal before the upgrade is the
    /// server's error (404 `port_not_open`, 502 `port_closed` when nothing answers there, …).
    pub async fn connect_port(&self, id: &str, port: u16) -> Result<PortSocket, ClientError> {
        let ws = self
            .websocket(
                "GET /v1/sessions/{id}/ports/{port}",
                &format!("/v1/sessions/{}/ports/{port}", enc(id)),
                &format!("port {port}"),
            )
            .await?;
        Ok(PortSocket::new(ws, &self.base, port))
    }

    /// Upgrades a GET of `path` (the route `route`) to a WebSocket over this client's own
    /// connection, checking the server's Sec-WebSocket-Accept; `what` names what the socket
    /// reaches, for messages. A refusal before the upgrade is the server's error.
    async fn websocket(
        &self,
        route: &str,
        path: &str,
        what: &str,
    ) -> Result<WebSocketStream<reqwest::Upgraded>, ClientError> {
        use reqwest::header::{
            CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_VERSION, UPGRADE,
        };
        use tokio_tungstenite::tungstenite::handshake::client::generate_key;
        use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
        use tokio_tungstenite::tungstenite::protocol::Role;

        let key = generate_key();
        let resp = self
            .request(Method::GET, path)
            .header(CONNECTION, "Upgrade")
            .header(UPGRADE, "websocket")
            .header(SEC_WEBSOCKET_VERSION, "13")
            .header(SEC_WEBSOCKET_KEY, &key)
            .send()
            .await
            .map_err(|e| self.send_failed(e))?;
        let status = resp.status();
        if status != StatusCode::SWITCHING_PROTOCOLS {
            if status.is_success() {
                return Err(self.transport(format!(
                    "{route} answered {status} instead of switching to a WebSocket (101): something between this client and sandboxd does not pass WebSocket upgrades"
                )));
            }
            return Err(self.refusal(route, path, resp).await);
        }
        let accept = resp
            .headers()
            .get(SEC_WEBSOCKET_ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if accept != derive_accept_key(key.as_bytes()) {
            return Err(self.transport(format!(
                "{route} switched protocols without the Sec-WebSocket-Accept of this client's key (got '{accept}'): not a WebSocket sandboxd answered"
            )));
        }
        let upgraded = resp.upgrade().await.map_err(|e| {
            self.transport(format!(
                "the WebSocket of {what} could not take over the connection: {}",
                error_chain(&e)
            ))
        })?;
        Ok(WebSocketStream::from_raw_socket(upgraded, Role::Client, None).await)
    }

    /// Reads a file (bytes `offset..offset+limit`).
    pub async fn read(
        &self,
        id: &str,
        path: &str,
        offset: u64,
        limit: Option<u64>,
    ) -> Result<Vec<u8>, ClientError> {
        let mut url = format!(
            "/v1/sessions/{}/files/{}?offset={offset}",
            enc(id),
            enc(path)
        );
        if let Some(l) = limit {
            url.push_str(&format!("&limit={l}"));
        }
        let resp = self
            .send(
                Method::GET,
                "GET /v1/sessions/{id}/files/{path}",
                &url,
                None,
                None,
            )
            .await?;
        // Straight into one buffer of the announced size: no list of chunks, no second copy.
        let announced = resp.content_length().unwrap_or(0).min(MAX_PREALLOCATE);
        let mut out = Vec::with_capacity(usize::try_from(announced).unwrap_or(0));
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            out.extend_from_slice(&chunk.map_err(|e| self.transport(e))?);
        }
        Ok(out)
    }

    /// Writes a file atomically, creating parents.
    pub async fn write(
        &self,
        id: &str,
        path: &str,
        data: impl Into<reqwest::Body>,
    ) -> Result<u64, ClientError> {
        #[derive(serde::Deserialize)]
        struct W {
            size: u64,
        }
        let resp = self
            .send(
                Method::PUT,
                "PUT /v1/sessions/{id}/files/{path}",
                &format!("/v1/sessions/{}/files/{}", enc(id), enc(path)),
                Some(data.into()),
                None,
            )
            .await?;
        Ok(resp.json::<W>().await.map_err(|e| self.transport(e))?.size)
    }

    /// Removes a file, or a folder with `recursive`.
    pub async fn remove(&self, id: &str, path: &str, recursive: bool) -> Result<(), ClientError> {
        self.send(
            Method::DELETE,
            "DELETE /v1/sessions/{id}/files/{path}",
            &format!(
                "/v1/sessions/{}/files/{}?recursive={recursive}",
                enc(id),
                enc(path)
            ),
            None,
            None,
        )
        .await
        .map(|_| ())
    }

    /// Creates a folder and its parents.
    pub async fn mkdir(&self, id: &str, path: &str) -> Result<(), ClientError> {
        self.send(
            Method::POST,
            "POST /v1/sessions/{id}/mkdir",
            &format!("/v1/sessions/{}/mkdir", enc(id)),
            None,
            Some(json!({"path": path})),
        )
        .await
        .map(|_| ())
    }

    /// Lists one folder (at most [`crate::files::MAX_LIST_ENTRIES`] entries; see
    /// [`Client::listing`] for whether that was all of them).
    pub async fn ls(&self, id: &str, path: &str) -> Result<Vec<Entry>, ClientError> {
        Ok(self.listing(id, path).await?.entries)
    }

    /// Lists one folder, with whether the listing was cut at its limit.
    pub async fn listing(&self, id: &str, path: &str) -> Result<Listing, ClientError> {
        self.json::<Listing>(
            Method::GET,
            "GET /v1/sessions/{id}/ls",
            &format!(
                "/v1/sessions/{}/ls?path={}",
                enc(id),
                urlencoding::encode(path)
            ),
            None,
        )
        .await
    }

    /// Hands the host the egress credentials of a session, replacing those it held (admin
    /// token; `PUT /v1/sessions/{id}/credentials`): kept in sandboxd's memory only. A host
    /// that holds them shows `set.version` as the session's `credentials_version`.
    pub async fn put_credentials(
        &self,
        id: &str,
        set: &crate::egress::CredentialSet,
    ) -> Result<SessionView, ClientError> {
        let body = serde_json::to_value(set).map_err(|e| self.transport(e))?;
        self.json(
            Method::PUT,
            "PUT /v1/sessions/{id}/credentials",
            &format!("/v1/sessions/{}/credentials", enc(id)),
            Some(body),
        )
        .await
    }

    /// The allowlist and each runtime's build state (`GET /v1/runtimes`).
    pub async fn runtimes(&self) -> Result<RuntimeList, ClientError> {
        self.json(Method::GET, "GET /v1/runtimes", "/v1/runtimes", None)
            .await
    }

    /// Replaces the allowlist with `entries` (admin token; `PUT /v1/runtimes`). A malformed
    /// catalog is refused whole: 422 `invalid_catalog` listing every error.
    pub async fn put_runtimes(&self, entries: &[CatalogEntry]) -> Result<RuntimeList, ClientError> {
        let body = serde_json::to_value(entries).map_err(|e| self.transport(e))?;
        self.json(Method::PUT, "PUT /v1/runtimes", "/v1/runtimes", Some(body))
            .await
    }

    /// The live policy and what needs a restart (admin token; `GET /v1/policy`).
    pub async fn policy(&self) -> Result<PolicyView, ClientError> {
        self.json(Method::GET, "GET /v1/policy", "/v1/policy", None)
            .await
    }

    /// Changes caps and lifetimes (admin token; `PUT /v1/policy`), for example
    /// `{"max_sessions": 5}`; anything else is refused with 422 `policy_refused`.
    pub async fn put_policy(&self, changes: &serde_json::Value) -> Result<PolicyView, ClientError> {
        self.json(
            Method::PUT,
            "PUT /v1/policy",
            "/v1/policy",
            Some(changes.clone()),
        )
        .await
    }

    /// One page of the audit log, newest first (`GET /v1/operations`).
    pub async fn operations(&self, query: &OperationQuery) -> Result<OperationPage, ClientError> {
        let qs = serde_urlencoded::to_string(query).map_err(|e| self.transport(e))?;
        let path = if qs.is_empty() {
            "/v1/operations".to_owned()
        } else {
            format!("/v1/operations?{qs}")
        };
        self.json(Method::GET, "GET /v1/operations", &path, None)
            .await
    }

    /// The session's activity feed after sequence number `after`, newest last
    /// (`GET /v1/sessions/{id}/events`).
    pub async fn events(&self, id: &str, after: i64) -> Result<SessionEvents, ClientError> {
        self.json(
            Method::GET,
            "GET /v1/sessions/{id}/events",
            &format!("/v1/sessions/{}/events?after={after}", enc(id)),
            None,
        )
        .await
    }

    /// What the session's sandbox reached and was refused through the egress network in the
    /// last `minutes` minutes (`GET /v1/sessions/{id}/egress`).
    pub async fn egress(
        &self,
        id: &str,
        minutes: u32,
    ) -> Result<crate::egress::EgressLog, ClientError> {
        self.json(
            Method::GET,
            "GET /v1/sessions/{id}/egress",
            &format!("/v1/sessions/{}/egress?minutes={minutes}", enc(id)),
            None,
        )
        .await
    }

    /// The breadth-first tree of a folder.
    pub async fn tree(&self, id: &str, path: &str) -> Result<Tree, ClientError> {
        self.json(
            Method::GET,
            "GET /v1/sessions/{id}/tree",
            &format!(
                "/v1/sessions/{}/tree?path={}",
                enc(id),
                urlencoding::encode(path)
            ),
            None,
        )
        .await
    }
}
