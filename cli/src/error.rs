//! What `kubectl sandbox` can fail with. Every message says what to do next.

use sandboxd_api::client::ClientError;

/// A failure of one command, printed as `kubectl sandbox: <message>` with exit status 1.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No Kubernetes configuration could be loaded.
    #[error(
        "no Kubernetes configuration: {0}. Point KUBECONFIG at your cluster (or run inside one)"
    )]
    Kubeconfig(String),
    /// The CRDs are not installed.
    #[error(
        "the sandboxd CRDs are not installed in this cluster: install the chart (`helm install sandboxd charts/sandboxd`) or `kubectl apply --server-side -f charts/sandboxd/crds/`"
    )]
    NoCrds,
    /// The API server refused or failed.
    #[error("the Kubernetes API server refused {what}: {message}")]
    Kube {
        /// What was asked.
        what: String,
        /// Its answer, in words.
        message: String,
    },
    /// The session does not exist.
    #[error(
        "no SandboxSession {name} in namespace {namespace}: open it with `kubectl sandbox open {name} --tenant <organization id> -n {namespace}`"
    )]
    NoSession {
        /// The session.
        name: String,
        /// Its namespace.
        namespace: String,
    },
    /// The session exists for another tenant.
    #[error(
        "SandboxSession {name} belongs to tenant {actual}, not {asked}: a session never moves to another tenant; open another name"
    )]
    OtherTenant {
        /// The session.
        name: String,
        /// Its tenant.
        actual: String,
        /// The tenant asked for.
        asked: String,
    },
    /// The workspace is gone.
    #[error(
        "session {name} is Lost: its workspace was removed on host {host}; delete it to start fresh: `kubectl delete sbx {name} -n {namespace}`"
    )]
    Lost {
        /// The session.
        name: String,
        /// Its namespace.
        namespace: String,
        /// Its host.
        host: String,
    },
    /// Opening failed for good.
    #[error(
        "session {name} Failed: {message}. Fix the cause, then delete it (`kubectl delete sbx {name} -n {namespace}`) and open it again"
    )]
    Failed {
        /// The session.
        name: String,
        /// Its namespace.
        namespace: String,
        /// The operator's words.
        message: String,
    },
    /// The session is being deleted.
    #[error(
        "session {name} is being deleted: wait until `kubectl get sbx {name} -n {namespace}` finds nothing, then open it again"
    )]
    Terminating {
        /// The session.
        name: String,
        /// Its namespace.
        namespace: String,
    },
    /// The session has no sandbox yet.
    #[error(
        "session {name} is not running yet ({phase}: {message}): wait for it with `kubectl sandbox open {name} --tenant {tenant} -n {namespace}`"
    )]
    NotReady {
        /// The session.
        name: String,
        /// Its namespace.
        namespace: String,
        /// Its tenant.
        tenant: String,
        /// Its phase.
        phase: String,
        /// The operator's words.
        message: String,
    },
    /// A wait ran out.
    #[error(
        "session {name} was not Running after {seconds} s (last: {last}); see `kubectl describe sbx {name} -n {namespace}` and `kubectl sandbox doctor`, or wait longer with --timeout"
    )]
    Timeout {
        /// The session.
        name: String,
        /// Its namespace.
        namespace: String,
        /// The wait.
        seconds: u64,
        /// What was last seen.
        last: String,
    },
    /// No running operator's selector matches the session.
    #[error(
        "no operator has picked up SandboxSession {name} in namespace {namespace} within {seconds} s: the running operators handle only sessions their selectors match, {selectors}, and it matches none. {next}"
    )]
    Unhandled {
        /// The session.
        name: String,
        /// Its namespace.
        namespace: String,
        /// How long it waited.
        seconds: u64,
        /// The running operators' selectors, in words.
        selectors: String,
        /// What to do, with the command.
        next: String,
    },
    /// The session's token Secret cannot be read.
    #[error(
        "cannot read the token of session {name} from Secret {namespace}/{secret}: {message}. You need `get` on Secrets in {namespace}; the operator writes it when the session opens"
    )]
    Token {
        /// The session.
        name: String,
        /// Its namespace.
        namespace: String,
        /// The Secret.
        secret: String,
        /// Why.
        message: String,
    },
    /// sandboxd refused or could not be reached.
    #[error("{}", sandbox_hint(.0))]
    Sandbox(#[from] ClientError),
    /// The connection to a terminal ended before the terminal did.
    #[error(
        "the connection to terminal {tid} of session {name} broke; it runs on: kubectl sandbox shell {name} --attach {tid}"
    )]
    TerminalBroke {
        /// The session.
        name: String,
        /// The terminal.
        tid: String,
    },
    /// sandboxd stopped following a terminal (the session stopped, sandboxd is leaving).
    #[error(
        "sandboxd stopped following terminal {tid} of session {name}: {message} ({code}); it may run on: kubectl sandbox shell {name} --attach {tid}"
    )]
    TerminalUnfollowed {
        /// The session.
        name: String,
        /// The terminal.
        tid: String,
        /// sandboxd's code.
        code: String,
        /// sandboxd's words.
        message: String,
    },
    /// `shell` was stopped by a signal while attached.
    #[error(
        "stopped by {signal}; terminal {tid} of session {name} runs on: kubectl sandbox shell {name} --attach {tid}"
    )]
    TerminalLeft {
        /// The session.
        name: String,
        /// The terminal.
        tid: String,
        /// The signal's name.
        signal: &'static str,
    },
    /// A terminal was opened, but attaching to it failed.
    #[error(
        "terminal {tid} of session {name} was opened but attaching to it failed: {}. It runs on: attach with `kubectl sandbox shell {name} --attach {tid}` or end it with `kubectl sandbox terminals {name} --kill {tid}`",
        sandbox_hint(.source)
    )]
    TerminalUnattached {
        /// The session.
        name: String,
        /// The terminal.
        tid: String,
        /// Why attaching failed.
        source: ClientError,
    },
    /// `port-forward` was asked for ports of the sandbox the session has not opened.
    #[error("{}", not_open(.name, .ports))]
    PortsNotOpen {
        /// The session.
        name: String,
        /// The ports not open, ascending.
        ports: Vec<u16>,
    },
    /// `port-forward` cannot listen on a local address.
    #[error(
        "cannot listen on {address}: {source}. Choose another local port (`:REMOTE` takes a free one) or another --address"
    )]
    Listen {
        /// The address.
        address: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// One forwarded connection could not reach its port; the forward goes on.
    #[error(
        "connection for {local} to port {remote} of session {name} refused: {}",
        port_refusal(.source, .name, *.remote)
    )]
    PortRefused {
        /// The session.
        name: String,
        /// The local port the connection came to.
        local: u16,
        /// The port in the sandbox.
        remote: u16,
        /// sandboxd's refusal.
        source: ClientError,
    },
    /// One forwarded connection broke; the forward goes on.
    #[error("connection for {local} to port {remote} of session {name} broke: {source}")]
    PortBroke {
        /// The session.
        name: String,
        /// The local port the connection came to.
        local: u16,
        /// The port in the sandbox.
        remote: u16,
        /// What failed.
        source: ClientError,
    },
    /// A local file could not be read or written.
    #[error("{path}: {source}")]
    Local {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The command line asks for something that cannot be done.
    #[error("{0}")]
    Usage(String),
    /// `doctor` found unhealthy hosts.
    #[error("{0} of {1} SandboxHosts are unhealthy (see above)")]
    Unhealthy(usize, usize),
}

fn sandbox_hint(e: &ClientError) -> String {
    match e {
        ClientError::Transport {
            untrusted: true, ..
        } => format!(
            "{e}. Pass the CA that signed sandboxd's certificate with --ca-file (SANDBOXD_CA_FILE); through `kubectl port-forward`, the certificate must also name 127.0.0.1"
        ),
        ClientError::Transport { .. } => format!(
            "{e}. Check the host with `kubectl sandbox doctor`; from outside the cluster, reach sandboxd through `kubectl port-forward` and pass --endpoint http://127.0.0.1:<port>"
        ),
        ClientError::VersionMismatch { expected, .. } => format!(
            "{e}. Run sandboxd {expected} on that host (`kubectl sandbox doctor` names the image)"
        ),
        ClientError::Api { status: 401, .. } => format!(
            "{e}. The session's token was refused: the operator rotates it when it reopens a session; run the command again, or `kubectl sandbox open` the session"
        ),
        _ => e.to_string(),
    }
}

/// Ports of session `name` not open, and the command that opens them.
fn not_open(name: &str, ports: &[u16]) -> String {
    let opens: String = ports.iter().map(|p| format!(" --open {p}")).collect();
    let list = match ports {
        [one] => {
            return format!(
                "port {one} of session {name} is not open: open it with `kubectl sandbox ports {name}{opens}`"
            );
        }
        [first @ .., last] => format!(
            "{} and {last}",
            first
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        [] => String::new(),
    };
    format!(
        "ports {list} of session {name} are not open: open them with `kubectl sandbox ports {name}{opens}`"
    )
}

/// A refused connection to a port in sandboxd's words, with how to open a port that is not.
fn port_refusal(e: &ClientError, name: &str, remote: u16) -> String {
    match crate::ports::refusal_hint(e, name, remote) {
        Some(hint) => format!("{e}. {hint}"),
        None => sandbox_hint(e),
    }
}

impl Error {
    /// The API server's error, with what was asked; a missing CRD becomes [`Error::NoCrds`].
    pub fn kube(what: impl Into<String>, source: kube::Error) -> Self {
        if let kube::Error::Api(status) = &source
            && status.code == 404
            && status
                .message
                .contains("the server could not find the requested resource")
        {
            return Error::NoCrds;
        }
        let message = match source {
            kube::Error::Api(status) => status.message,
            other => other.to_string(),
        };
        Error::Kube {
            what: what.into(),
            message,
        }
    }
}
