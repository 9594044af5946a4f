//! The operator's configuration: clap flags with `SANDBOX_OPERATOR_*` variables.

use sandboxd_crds::v1alpha1::host::SecretKeyRef;
use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;

/// Everything the operator is configured with.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "sandbox-operator",
    version,
    about = "The sandboxd operator: SandboxHost, Runtime, SandboxSession and Tombstone controllers"
)]
pub struct Config {
    /// This replica's name in the Lease (the pod name in a cluster).
    #[arg(long, env = "POD_NAME", default_value = "")]
    pub identity: String,

    /// The operator's own namespace (the chart sets it from the pod's): the only namespace it
    /// reads Secrets in, so every SandboxHost's admin-token Secret must live there. Required.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,

    /// Namespace of the leader-election Lease.
    #[arg(
        long,
        env = "SANDBOX_OPERATOR_LEASE_NAMESPACE",
        default_value = "sandboxd-system"
    )]
    pub lease_namespace: String,

    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "SANDBOX_OPERATOR_LEASE_NAME",
        default_value = "sandbox-operator"
    )]
    pub lease_name: String,

    /// How long a leader's Lease lasts without renewal; another replica takes over after it.
    #[arg(long, env = "SANDBOX_OPERATOR_LEASE_SECONDS", default_value_t = 15)]
    pub lease_seconds: u64,

    /// Address of /healthz, /readyz and /metrics (port 0 picks one and prints it).
    #[arg(
        long,
        env = "SANDBOX_OPERATOR_HTTP_ADDR",
        default_value = "0.0.0.0:9090"
    )]
    pub http_addr: SocketAddr,

    /// Handle only objects with these labels (`k=v,k2=v2`), to run several operators side by side.
    #[arg(long, env = "SANDBOX_OPERATOR_SELECTOR", default_value = "")]
    pub selector: String,

    /// Seconds without activity before a session's container is stopped (files stay).
    #[arg(long, env = "SANDBOX_OPERATOR_IDLE_TIMEOUT", default_value_t = 1800)]
    pub idle_timeout_seconds: u64,

    /// CPU share of one core under which a session counts as idle, in percent.
    #[arg(long, env = "SANDBOX_OPERATOR_IDLE_CPU_PERCENT", default_value_t = 5.0)]
    pub idle_cpu_percent: f64,

    /// Seconds over which CPU use is sampled before a session is put to sleep.
    #[arg(long, env = "SANDBOX_OPERATOR_CPU_WINDOW", default_value_t = 10)]
    pub cpu_window_seconds: u64,

    /// Seconds a stopped container is kept before it is reclaimed (the workspace stays).
    #[arg(long, env = "SANDBOX_OPERATOR_CONTAINER_TTL", default_value_t = 86400)]
    pub container_ttl_seconds: u64,

    /// Seconds after the last activity at which a workspace is removed; unset keeps it forever.
    #[arg(long, env = "SANDBOX_OPERATOR_WORKSPACE_TTL")]
    pub workspace_ttl_seconds: Option<u64>,

    /// The session probe period: how often, at least, a session on a host is looked at there
    /// (running, sleeping or reclaimed), so a wake, a sandbox destroyed, a container removed or
    /// a workspace deleted on the host shows in its status within this many seconds.
    #[arg(long, env = "SANDBOX_OPERATOR_FOLLOW_SECONDS", default_value_t = 60)]
    pub follow_seconds: u64,

    /// Seconds a session's token Secret, once found, is taken as there before its next
    /// reconcile asks again (a dry-run create): a deleted one is issued again at the first
    /// reconcile after that. 0 asks at every reconcile.
    #[arg(
        long,
        env = "SANDBOX_OPERATOR_TOKEN_CHECK_SECONDS",
        default_value_t = 300
    )]
    pub token_check_seconds: u64,

    /// Reconciles of one kind in flight at once: bounds memory and connections to the hosts
    /// when thousands of sessions want a reconcile together (after a restart).
    #[arg(long, env = "SANDBOX_OPERATOR_CONCURRENCY", default_value_t = 64)]
    pub concurrency: u16,

    /// The longest a call to a host may take, answer included (connections: 5 s): a host that
    /// hangs — stopped, or dropping packets — is unreachable like one that is down, and holds
    /// no reconcile longer than this.
    #[arg(
        long,
        env = "SANDBOX_OPERATOR_HOST_REQUEST_SECONDS",
        default_value_t = 30
    )]
    pub host_request_seconds: u64,

    /// The longest an open may take on a host (it creates the workspace's disk and starts the
    /// container; a runtime still building answers at once).
    #[arg(
        long,
        env = "SANDBOX_OPERATOR_HOST_OPEN_SECONDS",
        default_value_t = 120
    )]
    pub host_open_seconds: u64,

    /// How often hosts are probed.
    #[arg(long, env = "SANDBOX_OPERATOR_PROBE_SECONDS", default_value_t = 30)]
    pub probe_seconds: u64,

    /// Longest wait for a runtime being built before the session fails.
    #[arg(long, env = "SANDBOX_OPERATOR_PREPARE_SECONDS", default_value_t = 600)]
    pub prepare_seconds: u64,

    /// First delay of a failed tombstone destroy; it doubles up to the cap.
    #[arg(
        long,
        env = "SANDBOX_OPERATOR_TOMBSTONE_BACKOFF",
        default_value_t = 120
    )]
    pub tombstone_backoff_seconds: u64,

    /// Longest delay between tombstone destroys.
    #[arg(
        long,
        env = "SANDBOX_OPERATOR_TOMBSTONE_BACKOFF_CAP",
        default_value_t = 21600
    )]
    pub tombstone_backoff_cap_seconds: u64,

    /// The sandboxd image named in version-mismatch messages.
    #[arg(
        long,
        env = "SANDBOX_OPERATOR_SANDBOXD_IMAGE",
        default_value = "sandboxd"
    )]
    pub sandboxd_image: String,

    /// Label selector of the sandboxd DaemonSet's pods; when set, the operator keeps one
    /// SandboxHost per node running such a pod (endpoint from the pod IP).
    #[arg(long, env = "SANDBOX_OPERATOR_HOST_POD_SELECTOR")]
    pub host_pod_selector: Option<String>,

    /// Namespace of the sandboxd DaemonSet's pods.
    #[arg(
        long,
        env = "SANDBOX_OPERATOR_HOST_POD_NAMESPACE",
        default_value = "sandboxd-system"
    )]
    pub host_pod_namespace: String,

    /// The sandboxd DaemonSet (in --host-pod-namespace): a labelled pod becomes a host only
    /// when this DaemonSet controls it (its controller owner reference, uid checked) and it runs
    /// in the node's network (`hostNetwork`). Unset: discovery makes no host.
    #[arg(long, env = "SANDBOX_OPERATOR_HOST_DAEMONSET")]
    pub host_daemonset: Option<String>,

    /// Port sandboxd listens on in its pods.
    #[arg(long, env = "SANDBOX_OPERATOR_HOST_PORT", default_value_t = 8080)]
    pub host_port: u16,

    /// The Secret (`namespace/name`, key `token`) with the admin token of discovered hosts.
    #[arg(
        long,
        env = "SANDBOX_OPERATOR_HOST_TOKEN_SECRET",
        default_value = "sandboxd-system/sandboxd-admin-token"
    )]
    pub host_token_secret: String,

    /// A CA certificate (PEM) trusted for the https:// endpoints of hosts without
    /// `spec.caSecret`. When set, discovery writes https:// endpoints (sandboxd serves TLS).
    /// Unset: discovered hosts are http://, and other https:// hosts are verified against
    /// the system's CA roots.
    #[arg(long, env = "SANDBOX_OPERATOR_HOST_CA_FILE")]
    pub host_ca_file: Option<std::path::PathBuf>,

    /// A ConfigMap in the operator's namespace into which it writes, for every host whose
    /// admin-token Secret is --host-token-secret and that names its node (`spec.node`), the hex
    /// SHA-256 of that node's token under the node's name. Mounted into the sandboxd pods
    /// (SANDBOXD_NODE_TOKEN_HASHES), it lets each node check its own token without holding
    /// the master or any token. Unset: nothing is written.
    #[arg(long, env = "SANDBOX_OPERATOR_NODE_TOKEN_HASHES")]
    pub node_token_hashes: Option<String>,

    /// A kubernetes.io/tls Secret in the operator's namespace holding a CA (tls.crt and a
    /// PKCS#8 tls.key). When set, the operator signs the CertificateSigningRequests of
    /// --csr-signer-name that sandboxd pods make (`sandboxd enrol`), each only for the node
    /// the pod runs on, and discovered hosts are https:// with spec.caSecret naming this CA.
    #[arg(long, env = "SANDBOX_OPERATOR_CSR_CA_SECRET")]
    pub csr_ca_secret: Option<String>,

    /// Make the --csr-ca-secret CA when that Secret does not exist: a new self-signed CA with
    /// a PKCS#8 key, created once (create-if-absent, so replicas never race) and never
    /// overwritten. Without it, the operator waits for the Secret to be made by someone else
    /// (cert-manager, the platform team).
    #[arg(
        long,
        env = "SANDBOX_OPERATOR_CSR_CA_GENERATE",
        default_value_t = false,
        requires = "csr_ca_secret"
    )]
    pub csr_ca_generate: bool,

    /// The signer name whose CertificateSigningRequests the operator signs; others are left
    /// alone.
    #[arg(
        long,
        env = "SANDBOX_OPERATOR_CSR_SIGNER_NAME",
        default_value = sandboxd_api::enrol::SIGNER_NAME
    )]
    pub csr_signer_name: String,

    /// The only requester whose CertificateSigningRequests are signed: the sandboxd pods'
    /// ServiceAccount, `system:serviceaccount:NAMESPACE:NAME` (the chart sets it). Unset: every
    /// request is denied, saying so.
    #[arg(long, env = "SANDBOX_OPERATOR_CSR_REQUESTER")]
    pub csr_requester: Option<String>,

    /// Days a signed serving certificate is valid.
    #[arg(
        long,
        env = "SANDBOX_OPERATOR_CSR_CERTIFICATE_DAYS",
        default_value_t = 30
    )]
    pub csr_certificate_days: u32,

    /// Egress credentials (`spec.egress.credentials` of Runtimes and sessions): watch the Secrets
    /// labelled sandboxd.dev/egress-credential=true cluster-wide (get, list and watch on
    /// Secrets; the chart grants them with operator.egressCredentials.enabled) and hand their
    /// values to the sessions' hosts. false: no Secret is watched, and a session naming
    /// credentials says the operator runs without them.
    #[arg(
        long,
        env = "SANDBOX_OPERATOR_EGRESS_CREDENTIALS",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub egress_credentials: bool,

    /// Log as JSON.
    #[arg(long, env = "SANDBOX_OPERATOR_JSON_LOGS", default_value_t = false)]
    pub json_logs: bool,
}

impl Config {
    /// The identity, defaulting to the host name and process id.
    pub fn identity(&self) -> String {
        if self.identity.is_empty() {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            format!("{}-{}", host.trim(), std::process::id())
        } else {
            self.identity.clone()
        }
    }

    /// The operator's own namespace, or why there is none.
    pub fn own_namespace(&self) -> Result<&str, MissingNamespace> {
        self.namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or(MissingNamespace)
    }

    /// The idle timeout.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(self.idle_timeout_seconds)
    }
}

/// The operator was started without its namespace.
#[derive(Debug, thiserror::Error)]
#[error(
    "POD_NAMESPACE is not set: the operator reads Secrets (the SandboxHosts' admin tokens) only in its own namespace, and POD_NAMESPACE (or --namespace) names it; the chart sets it from the pod's namespace, set it yourself when you run the operator by hand"
)]
pub struct MissingNamespace;

impl Config {
    /// `--host-token-secret` as a reference (`namespace/name[/key]`, key `token` by default);
    /// `None` when it is not one.
    pub fn host_token_secret_ref(&self) -> Option<SecretKeyRef> {
        parse_secret(&self.host_token_secret)
    }
}

/// Parses a Secret reference, `namespace/name[/key]` (key `token` by default).
pub fn parse_secret(s: &str) -> Option<SecretKeyRef> {
    let mut parts = s.split('/');
    let (namespace, name) = (parts.next()?.to_owned(), parts.next()?.to_owned());
    let key = parts.next().unwrap_or("token").to_owned();
    (!namespace.is_empty() && !name.is_empty()).then_some(SecretKeyRef {
        namespace,
        name,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_is_well_formed_and_defaults_are_the_seeds() {
        Config::command().debug_assert();
        let c = Config::parse_from(["sandbox-operator"]);
        assert_eq!(
            (
                c.idle_timeout_seconds,
                c.container_ttl_seconds,
                c.workspace_ttl_seconds
            ),
            (1800, 86400, None)
        );
        assert_eq!(
            (c.tombstone_backoff_seconds, c.tombstone_backoff_cap_seconds),
            (120, 21600)
        );
        assert_eq!(c.prepare_seconds, 600);
        assert!(c.egress_credentials);
        let off = Config::parse_from(["sandbox-operator", "--egress-credentials", "false"]);
        assert!(!off.egress_credentials);
    }

    #[test]
    fn the_namespace_is_required_and_never_empty() {
        let c = Config::parse_from(["sandbox-operator", "--namespace", "sandboxd-system"]);
        assert_eq!(c.own_namespace().ok(), Some("sandboxd-system"));
        // Set to nothing by hand: the environment of the test may have its own POD_NAMESPACE.
        let mut none = c.clone();
        none.namespace = None;
        let e = none
            .own_namespace()
            .map(str::to_owned)
            .expect_err("no namespace is an error");
        assert!(e.to_string().starts_with("POD_NAMESPACE is not set"), "{e}");
        none.namespace = Some(String::new());
        assert!(none.own_namespace().is_err());
    }
}
