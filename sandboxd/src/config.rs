//! sandboxd's configuration: flags and `SANDBOXD_*` variables, with the seed's defaults.
//!
//! Over 600 lines with its tests: every flag and variable of the binary, in one clap struct.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::runtimes::Allowlist;

use crate::service::parse_bytes;

/// The longest header, body or idle timeout of a connection, seconds (a day).
pub const MAX_CONNECTION_TIMEOUT: u64 = 86_400;

/// What the binary does besides serving.
#[derive(Subcommand, Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Build every runtime of the allowlist and exit: 0 when all are built, non-zero naming the
    /// ones that failed after three attempts. What an upgrade runs before the old service is
    /// replaced.
    Prepare,
    /// Remove this instance's sandbox network and its firewall rules (the chains and the jumps
    /// to them) and exit; refused while a container is still on the network. What an uninstall
    /// runs on each node after the sessions are destroyed.
    RemoveNetwork,
    /// Print the admin token of node NAME, derived from the master admin token (SANDBOXD_TOKEN)
    /// and exit: the token a sandboxd with SANDBOXD_NODE_NAME=NAME accepts, and the one the
    /// operator sends to a SandboxHost whose spec.node is NAME.
    AdminToken {
        /// The node's name, as SANDBOXD_NODE_NAME on that node (its Kubernetes node name).
        #[arg(long, value_name = "NAME")]
        node: String,
    },
    /// Make a key on this node, ask the operator's signer for its serving certificate through a
    /// Kubernetes CertificateSigningRequest (DNS name: the node; IP: the node's), wait for it
    /// and write tls.key, tls.crt and ca.crt into DIR, then exit. What the chart's init
    /// container runs when `tls.issuer.caSecret` is set; non-zero with the signer's reason when
    /// the request is denied.
    Enrol {
        /// The node's name, the certificate's DNS name (the chart: the pod's spec.nodeName).
        #[arg(long, env = "SANDBOXD_NODE_NAME", value_name = "NAME")]
        node: String,
        /// The node's IP, the certificate's IP address (the chart: the pod's status.hostIP).
        #[arg(long, env = "SANDBOXD_NODE_IP", value_name = "IP")]
        node_ip: Option<IpAddr>,
        /// The folder that gets tls.key, tls.crt and ca.crt.
        #[arg(long, env = "SANDBOXD_ENROL_DIR", default_value = "/etc/sandboxd-tls")]
        dir: PathBuf,
        /// The signer asked (the operator's --csr-signer-name).
        #[arg(long, env = "SANDBOXD_SIGNER_NAME", default_value = crate::enrol::SIGNER_NAME)]
        signer_name: String,
        /// The longest wait for the certificate, seconds.
        #[arg(long, default_value_t = 300)]
        wait_seconds: u64,
    },
    /// Print the OpenAPI 3.1 document of the `/v1` API (what `GET /openapi.json` serves and
    /// `docs/openapi.json` holds) and exit; with `--wire`, that of the wire protocol's routes
    /// (`GET /wire/openapi.json`, `docs/openapi-wire.json`).
    Openapi {
        /// The wire protocol's document instead of the `/v1` one.
        #[arg(long)]
        wire: bool,
    },
}

/// How runs reach a sandbox.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunBackend {
    /// The resident agent (PID 1 of the sandbox) over a Unix socket.
    Agent,
    /// Docker exec.
    Exec,
}

/// How workspace sizes are held.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkspaceQuota {
    /// Each workspace is a loop-mounted ext4 image of its size.
    Loop,
    /// No limit.
    Off,
}

/// Everything sandboxd is configured with.
#[derive(Parser, Clone)]
#[command(
    name = "sandboxd",
    version,
    about = "The sandboxd node daemon: sandbox sessions in containers with persistent workspaces"
)]
pub struct Config {
    /// The master admin token. Required unless SANDBOXD_NODE_TOKEN or SANDBOXD_NODE_TOKEN_HASHES
    /// is given. With SANDBOXD_NODE_NAME unset it is itself the admin
    /// token (root-equivalent: whoever holds it starts containers on this host, and on every
    /// host that shares it); with SANDBOXD_NODE_NAME set, only the token derived from it for
    /// this node is.
    #[arg(long, env = "SANDBOXD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// The node this sandboxd runs on (the chart sets it from the pod's spec.nodeName). When
    /// set, the only admin token accepted is the one derived for this node from SANDBOXD_TOKEN
    /// (`sandboxd admin-token --node NAME` prints it; or given in SANDBOXD_NODE_TOKEN, or whose
    /// hash is in SANDBOXD_NODE_TOKEN_HASHES); the master itself and other nodes' tokens are
    /// refused. Unset: SANDBOXD_TOKEN itself is the admin token.
    #[arg(long, env = "SANDBOXD_NODE_NAME")]
    pub node_name: Option<String>,

    /// This node's own admin token, as `sandboxd admin-token --node NAME` prints it, instead of
    /// SANDBOXD_TOKEN: the master then never reaches this node. Needs SANDBOXD_NODE_NAME;
    /// exclusive with SANDBOXD_TOKEN.
    #[arg(long, env = "SANDBOXD_NODE_TOKEN", hide_env_values = true)]
    pub node_token: Option<String>,

    /// A directory of files named after nodes, each holding the hex SHA-256 of that node's
    /// admin token (the operator's node-token-hash ConfigMap, mounted: what the Helm chart
    /// does). The only admin token accepted is the one whose hash is in the file named
    /// SANDBOXD_NODE_NAME, so this node holds neither the master nor any token. The file is read
    /// again every 5 s and on a token that does not match: a node started before its hash is
    /// written takes its token once the file appears. Needs SANDBOXD_NODE_NAME; exclusive with
    /// SANDBOXD_TOKEN and SANDBOXD_NODE_TOKEN.
    #[arg(long, env = "SANDBOXD_NODE_TOKEN_HASHES")]
    pub node_token_hashes: Option<PathBuf>,

    /// The address to listen on: one address of the node (the one the operator and the
    /// platform reach it on; in the Helm chart the pod's status.hostIP), so sandboxd answers on
    /// no other interface. 0.0.0.0 listens on all of them.
    #[arg(long, env = "SANDBOXD_HOST", default_value = "127.0.0.1")]
    pub host: IpAddr,

    /// HTTP connections sandboxd holds open at once; one past it is closed at its accept
    /// (counted in `sandboxd_connections_refused_total{cap="total"}`).
    #[arg(long, env = "SANDBOXD_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,

    /// HTTP connections one source address holds open at once; one past it is closed at its
    /// accept (counted in `sandboxd_connections_refused_total{cap="per_source"}`), so a client
    /// that floods sandboxd with connections leaves room for every other.
    #[arg(
        long,
        env = "SANDBOXD_MAX_CONNECTIONS_PER_SOURCE",
        default_value_t = 512
    )]
    pub max_connections_per_source: usize,

    /// Port to listen on (0 picks a free one and prints it).
    #[arg(long, env = "SANDBOXD_PORT", default_value_t = 8080)]
    pub port: u16,

    /// Seconds a client has, from the first byte of a request, to send all its headers; a
    /// connection that stalls in them (slowloris) is closed.
    #[arg(long, env = "SANDBOXD_HEADER_TIMEOUT", default_value_t = 30)]
    pub header_timeout: u64,

    /// Seconds a request body may go without a byte while sandboxd waits for it (and a
    /// response may go unread by its client); the request then fails and the connection is
    /// closed.
    #[arg(long, env = "SANDBOXD_BODY_TIMEOUT", default_value_t = 60)]
    pub body_timeout: u64,

    /// Seconds a connection stays open with no request in progress (keep-alive idle). A
    /// request in progress (a run waiting for its command, or streaming its output) is never
    /// cut by it.
    #[arg(long, env = "SANDBOXD_IDLE_TIMEOUT", default_value_t = 90)]
    pub idle_timeout: u64,

    /// The certificate chain (PEM, leaf first) to serve HTTPS with; with SANDBOXD_TLS_KEY_FILE
    /// sandboxd serves HTTPS only. Both files are read again when they change and on SIGHUP.
    /// Unset: plain HTTP, and the tokens cross the network unencrypted.
    #[arg(long, env = "SANDBOXD_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,

    /// The private key (PEM) of SANDBOXD_TLS_CERT_FILE's certificate.
    #[arg(long, env = "SANDBOXD_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,

    /// Seconds a client has, from the accept, to complete the TLS handshake; a connection that
    /// never says hello is closed. With TLS only.
    #[arg(long, env = "SANDBOXD_TLS_HANDSHAKE_TIMEOUT", default_value_t = 10)]
    pub tls_handshake_timeout: u64,

    /// What to do instead of serving (`prepare`).
    #[command(subcommand)]
    pub command: Option<Command>,

    /// The runtimes sessions may use: the catalog format (a JSON array as catalog/runtimes.json)
    /// or the compact `alias=image,alias2=image2`; the first is the default.
    #[arg(long, env = "SANDBOXD_RUNTIMES", default_value = "")]
    pub runtimes: String,

    /// A file holding the runtimes in the catalog format (instead of SANDBOXD_RUNTIMES).
    #[arg(long, env = "SANDBOXD_RUNTIMES_FILE")]
    pub runtimes_file: Option<PathBuf>,

    /// A PEM bundle of CA certificates that runtime builds (and the built images) trust, for a
    /// network whose TLS to the package registries is intercepted by a proxy.
    #[arg(long, env = "SANDBOXD_BUILD_CA_FILE")]
    pub build_ca_file: Option<PathBuf>,

    /// Seconds before the second build attempt of a failed runtime; doubles per attempt.
    #[arg(long, env = "SANDBOXD_BUILD_BACKOFF", default_value_t = 10)]
    pub build_backoff: u64,

    /// Where the audit log goes: a `postgres://` URL, or unset for SQLite in the state folder.
    #[arg(long, env = "SANDBOXD_AUDIT_DATABASE_URL", hide_env_values = true)]
    pub audit_database_url: Option<String>,

    /// Whether every workspace operation is written to the audit log.
    #[arg(long, env = "SANDBOXD_AUDIT", default_value_t = true, action = clap::ArgAction::Set)]
    pub audit: bool,

    /// Audit rows waiting to be written at most; while the audit store is slow or down, rows
    /// past this are dropped (counted in `sandboxd_audit_rows_dropped_total`, and logged).
    #[arg(long, env = "SANDBOXD_AUDIT_QUEUE", default_value_t = crate::storage::audit::DEFAULT_QUEUE)]
    pub audit_queue: usize,

    /// Days an audit row is kept; older rows are swept daily (files are never touched).
    #[arg(long, env = "OPERATION_RETENTION_DAYS", default_value_t = 30)]
    pub operation_retention_days: u32,

    /// Sessions this host holds at most (opening ones included).
    #[arg(long, env = "SANDBOXD_MAX_SESSIONS", default_value_t = 20)]
    pub max_sessions: u32,

    /// Sessions one tenant holds at most on this host.
    #[arg(long, env = "SANDBOXD_MAX_SESSIONS_PER_TENANT", default_value_t = 10)]
    pub max_sessions_per_tenant: u32,

    /// Workspaces one tenant holds at most on this host, in any state until they are destroyed
    /// (sleeping and reclaimed ones keep their disks, so they count).
    #[arg(long, env = "SANDBOXD_MAX_WORKSPACES_PER_TENANT", default_value_t = 20)]
    pub max_workspaces_per_tenant: u32,

    /// The bytes of workspace disks this host holds at most, in Docker's syntax: the nominal
    /// sizes of every workspace until it is destroyed (sleeping and reclaimed ones included),
    /// checked at open. Unset: the size of the filesystem under SANDBOXD_WORKSPACE_ROOT less a
    /// reserve for sandboxd's own state (5%, at least 1 GiB). Only with SANDBOXD_WORKSPACE_QUOTA=loop.
    #[arg(long, env = "SANDBOXD_WORKSPACE_BUDGET")]
    pub workspace_budget: Option<String>,

    /// File operations (reads, writes, listings, removes) running at once on this host.
    #[arg(long, env = "SANDBOXD_FILE_WORKERS", default_value_t = 16)]
    pub file_workers: usize,

    /// File operations of one session running at once: its share of SANDBOXD_FILE_WORKERS.
    #[arg(long, env = "SANDBOXD_FILE_WORKERS_PER_SESSION", default_value_t = 4)]
    pub file_workers_per_session: usize,

    /// File operations of one session waiting for a worker at once; the next is refused (503).
    #[arg(long, env = "SANDBOXD_FILE_QUEUE_PER_SESSION", default_value_t = 64)]
    pub file_queue_per_session: usize,

    /// Seconds one file operation may take, its wait for a worker included; past it the
    /// operation is stopped and answered 503 (what it had done stays done).
    #[arg(long, env = "SANDBOXD_FILE_DEADLINE", default_value_t = 30)]
    pub file_deadline: u64,

    /// Bytes of reads and writes sandboxd holds in flight at once on this host, in Docker's
    /// syntax; a request past it waits briefly, then is refused (503).
    #[arg(long, env = "SANDBOXD_MEMORY_BUDGET", default_value = "256m")]
    pub memory_budget: String,

    /// Bytes of reads and writes one session holds in flight at once, in Docker's syntax (at
    /// least the largest read, SANDBOXD_MAX_READ_BYTES).
    #[arg(long, env = "SANDBOXD_SESSION_MEMORY_BUDGET", default_value = "64m")]
    pub session_memory_budget: String,

    /// Bytes per second a client must at least send a request body at, or read an answer at,
    /// measured over SANDBOXD_BODY_TIMEOUT; a slower one is cut off (0: no minimum).
    #[arg(long, env = "SANDBOXD_MIN_TRANSFER_RATE", default_value_t = 16 * 1024)]
    pub min_transfer_rate: u64,

    /// Longest a command may run, in seconds; a run asking for more gets this.
    #[arg(long, env = "SANDBOXD_EXECUTE_TIMEOUT", default_value_t = 300)]
    pub execute_timeout: u64,

    /// Largest read of a file, in bytes.
    #[arg(long, env = "SANDBOXD_MAX_READ_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_read_bytes: u64,

    /// Largest output a run returns per stream, in bytes; the rest is dropped and the run marked truncated.
    #[arg(long, env = "SANDBOXD_MAX_OUTPUT_BYTES", default_value_t = 1024 * 1024)]
    pub max_output_bytes: usize,

    /// Runs one session may have in flight at once (each holds up to two output buffers of
    /// SANDBOXD_MAX_OUTPUT_BYTES); the next is refused with 429 until one ends.
    #[arg(long, env = "SANDBOXD_MAX_RUNS_PER_SESSION", default_value_t = 16)]
    pub max_runs_per_session: u32,

    /// Terminals one session may have running at once (each a program on a pseudo-terminal
    /// and up to 1 MiB of its output kept in the sandbox's agent); the next open is refused
    /// with 429 until one ends.
    #[arg(long, env = "SANDBOXD_MAX_TERMINALS_PER_SESSION", default_value_t = 8)]
    pub max_terminals_per_session: u32,

    /// Seconds a terminal may go with no input, no output and nobody attached before it is
    /// closed; 0: never.
    #[arg(long, env = "SANDBOXD_TERMINAL_IDLE_TIMEOUT", default_value_t = 3600)]
    pub terminal_idle_timeout: u64,

    /// Seconds a sandbox's port has to answer an HTTP request passed to it (the head of its
    /// answer) before sandboxd answers 504 `port_timeout`.
    #[arg(long, env = "SANDBOXD_PORT_ANSWER_TIMEOUT", default_value_t = 60)]
    pub port_answer_timeout: u64,

    /// Folders one file watch watches at most (each an inotify watch in the sandbox); past it a
    /// watch says which folder it left out.
    #[arg(long, env = "SANDBOXD_WATCH_MAX_FOLDERS", default_value_t = 4096)]
    pub watch_max_folders: u32,

    /// The uid (and gid) sandboxes run as and workspaces are owned by. Never 0.
    #[arg(long, env = "SANDBOXD_SANDBOX_UID", default_value_t = 10001)]
    pub sandbox_uid: u32,

    /// Docker network of a session whose runtime does not ask for one.
    #[arg(long, env = "SANDBOXD_NETWORK_MODE", default_value = "none")]
    pub network_mode: String,

    /// Docker network of a session whose runtime asks for one: a network of sandboxd's own,
    /// made at start when missing (inter-container traffic off) and fenced in by iptables.
    /// Empty: `sandboxd-<instance>-net`. Docker's own networks (`bridge`, `host`) are refused.
    #[arg(long, env = "SANDBOXD_RUNTIME_NETWORK", default_value = "")]
    pub runtime_network: String,

    /// The iptables command that fences in the sandbox network (`iptables-legacy` or
    /// `iptables-nft` to pick a backend); ip6tables is the one beside it.
    #[arg(long, env = "SANDBOXD_IPTABLES", default_value = "iptables")]
    pub iptables: String,

    /// IPv4 ranges a sandbox with network may not reach through the node (comma-separated
    /// CIDRs); the node itself is never reachable. Empty leaves only the node closed.
    #[arg(long, env = "SANDBOXD_NETWORK_DENY", default_value = crate::container::network::DEFAULT_DENY)]
    pub network_deny: String,

    /// The resolver the egress resolver and proxy ask for the names a sandbox of an
    /// `allowlist` runtime may reach (`address` or `address:port`). Empty: the first
    /// nameserver of /etc/resolv.conf.
    #[arg(long, env = "SANDBOXD_EGRESS_RESOLVER", default_value = "")]
    pub egress_resolver: String,

    /// The port of the egress proxy on the egress network's bridge address (0: any free one);
    /// the firewall redirects every TCP connection of those sandboxes to it.
    #[arg(long, env = "SANDBOXD_EGRESS_PROXY_PORT", default_value_t = 0)]
    pub egress_proxy_port: u16,

    /// The port of the egress resolver on the egress network's bridge address (0: any free
    /// one); the firewall redirects UDP and TCP port 53 of those sandboxes to it.
    #[arg(long, env = "SANDBOXD_EGRESS_DNS_PORT", default_value_t = 0)]
    pub egress_dns_port: u16,

    /// The node's egress CA certificate (PEM), with `SANDBOXD_EGRESS_CA_KEY`: what the egress
    /// proxy signs its leaves with where it adds a credential. Empty: sandboxd makes one in
    /// `<state>/egress-ca/` at its first start and keeps it.
    #[arg(long, env = "SANDBOXD_EGRESS_CA_CERT", default_value = "")]
    pub egress_ca_cert: String,

    /// The key (PEM) of `SANDBOXD_EGRESS_CA_CERT`; never given to a sandbox.
    #[arg(long, env = "SANDBOXD_EGRESS_CA_KEY", default_value = "")]
    pub egress_ca_key: String,

    /// The node's system roots (PEM bundle): put with the egress CA into the trust bundle
    /// every sandbox gets, and trusted on the upstream side of an intercepted connection. The
    /// default is used when the file exists; empty: none.
    #[arg(long, env = "SANDBOXD_EGRESS_SYSTEM_ROOTS", default_value = crate::egress::ca::DEFAULT_SYSTEM_ROOTS)]
    pub egress_system_roots: String,

    /// More roots (a PEM bundle) the upstream side of an intercepted connection trusts,
    /// beside the system roots. Empty: none.
    #[arg(long, env = "SANDBOXD_EGRESS_UPSTREAM_CA", default_value = "")]
    pub egress_upstream_ca: String,

    /// Connections one sandbox of an `allowlist` runtime may hold through the egress proxy at
    /// once (each holds two of sandboxd's descriptors); more are closed at once and logged.
    #[arg(long, env = "SANDBOXD_EGRESS_MAX_CONNECTIONS", default_value_t = crate::egress::DEFAULT_MAX_CONNECTIONS)]
    pub egress_max_connections: usize,

    /// Seconds between two checks of the sandbox network's firewall (its chains as installed,
    /// each jump first in its chain, the node's addresses denied); it is also checked after
    /// each Docker network event. Whatever is missing is installed again and counted in
    /// `sandboxd_firewall_repairs_total`; `/healthz` answers 503 while it cannot be.
    #[arg(long, env = "SANDBOXD_FIREWALL_CHECK", default_value_t = 10)]
    pub firewall_check: u64,

    /// CPUs a sandbox may use.
    #[arg(long, env = "SANDBOXD_CPUS", default_value_t = 2.0)]
    pub cpus: f64,

    /// Processes a sandbox may hold at once.
    #[arg(long, env = "SANDBOXD_PIDS_LIMIT", default_value_t = 512)]
    pub pids_limit: i64,

    /// Size of the tmpfs at /tmp, in Docker's syntax.
    #[arg(long, env = "SANDBOXD_TMPFS_SIZE", default_value = "64m")]
    pub tmpfs_size: String,

    /// Size of the tmpfs at a sandbox's home when its image puts HOME in a folder of the image
    /// (the image's root is read-only), in Docker's syntax. Counts against its memory limit.
    #[arg(long, env = "SANDBOXD_HOME_SIZE", default_value = "256m")]
    pub home_size: String,

    /// Memory limit of a sandbox whose runtime names none, in Docker's syntax.
    #[arg(long, env = "SANDBOXD_MEM_LIMIT", default_value = "1g")]
    pub mem_limit: String,

    /// Host folder of the workspaces: `{root}/{session id}/workspace`. Must be the same path
    /// inside a sandboxd container as on the host.
    #[arg(
        long,
        env = "SANDBOXD_WORKSPACE_ROOT",
        default_value = "/var/lib/sandboxd/workspaces"
    )]
    pub workspace_root: PathBuf,

    /// Size of a session's workspace, in Docker's syntax: the default and the ceiling (a runtime
    /// or a session may ask for less). Each workspace is a filesystem of its own of this size, a
    /// sparse image on the node's disk that takes what is written; its full size counts
    /// against SANDBOXD_WORKSPACE_BUDGET.
    #[arg(long, env = "SANDBOXD_WORKSPACE_SIZE", default_value = "4g")]
    pub workspace_size: String,

    /// How workspace sizes are held: `loop` (each workspace is an ext4 image of its size,
    /// loop-mounted; needs root and loop devices, and sandboxd refuses to start without them)
    /// or `off` (no limit: a sandbox can fill the node's disk; sandboxd warns at start).
    #[arg(long, env = "SANDBOXD_WORKSPACE_QUOTA", value_enum, default_value_t = WorkspaceQuota::Loop)]
    pub workspace_quota: WorkspaceQuota,

    /// Folder of sandboxd's own state (the SQLite database).
    #[arg(
        long,
        env = "SANDBOXD_STATE_DIR",
        default_value = "/var/lib/sandboxd/state"
    )]
    pub state_dir: PathBuf,

    /// Keep a closed session's container (stopped) instead of removing it.
    #[arg(long, env = "SANDBOXD_PERSIST_CONTAINERS", default_value_t = false)]
    pub persist_containers: bool,

    /// OCI runtime of sandbox containers (for example runsc or crun); unset uses Docker's default.
    #[arg(long, env = "SANDBOXD_OCI_RUNTIME")]
    pub oci_runtime: Option<String>,

    /// The name of gVisor's OCI runtime in dockerd's configuration (its `runtimes` setting):
    /// sandboxes of runtimes with `isolation: gvisor` run on it. The host offers gvisor when
    /// dockerd has it.
    #[arg(long, env = "SANDBOXD_GVISOR_RUNTIME", default_value = "runsc")]
    pub gvisor_runtime: String,

    /// How runs reach a sandbox: `agent` (the resident agent as every new sandbox's PID 1,
    /// over a Unix socket; Docker exec for a container that has none) or `exec` (Docker exec
    /// only, Docker's init as PID 1).
    #[arg(long, env = "SANDBOXD_RUN_BACKEND", value_enum, default_value_t = RunBackend::Agent)]
    pub run_backend: RunBackend,

    /// Name of this sandboxd, written on the containers it owns.
    #[arg(long, env = "SANDBOXD_INSTANCE", default_value = "sandboxd")]
    pub instance: String,

    /// The S3 endpoint snapshots are kept at (for example http://s3.example:7070); unset:
    /// this host keeps no snapshots (their routes answer 503 `snapshots_unavailable`).
    #[arg(long, env = "SANDBOXD_S3_ENDPOINT", default_value = "")]
    pub s3_endpoint: String,

    /// The bucket of the snapshots (it must exist).
    #[arg(long, env = "SANDBOXD_S3_BUCKET", default_value = "")]
    pub s3_bucket: String,

    /// The bucket's region.
    #[arg(long, env = "SANDBOXD_S3_REGION", default_value = "us-east-1")]
    pub s3_region: String,

    /// The access key id of the store.
    #[arg(
        long,
        env = "SANDBOXD_S3_ACCESS_KEY_ID",
        default_value = "",
        hide_env_values = true
    )]
    pub s3_access_key_id: String,

    /// The secret access key of the store.
    #[arg(
        long,
        env = "SANDBOXD_S3_SECRET_ACCESS_KEY",
        default_value = "",
        hide_env_values = true
    )]
    pub s3_secret_access_key: String,

    /// The path in the bucket this cluster's snapshots are under (chunks and manifests).
    #[arg(long, env = "SANDBOXD_S3_PREFIX", default_value = "sandboxd")]
    pub s3_prefix: String,

    /// Seconds a chunk no snapshot names is kept before a collection may delete it: longer
    /// than any snapshot takes (a snapshot under way has sent chunks its manifest does not
    /// name yet).
    #[arg(long, env = "SANDBOXD_SNAPSHOT_GRACE", default_value_t = 3600)]
    pub snapshot_grace: u64,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("Config")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("runtimes", &self.runtimes)
            .field("runtimes_file", &self.runtimes_file)
            .field("audit", &self.audit)
            .field("max_sessions", &self.max_sessions)
            .field("max_sessions_per_tenant", &self.max_sessions_per_tenant)
            .field("workspace_root", &self.workspace_root)
            .field("workspace_size", &self.workspace_size)
            .field("workspace_quota", &self.workspace_quota)
            .field("state_dir", &self.state_dir)
            .field("instance", &self.instance)
            .field("node_name", &self.node_name)
            .field("node_token_hashes", &self.node_token_hashes)
            .finish_non_exhaustive()
    }
}

/// What is wrong with a configuration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The admin token is missing.
    #[error(
        "SANDBOXD_TOKEN (--token) is required: the admin token that opens sessions on this host (or, with SANDBOXD_NODE_NAME, this node's own token in SANDBOXD_NODE_TOKEN, or the directory of node token hashes in SANDBOXD_NODE_TOKEN_HASHES)"
    )]
    MissingToken,
    /// The runtime list is empty or malformed.
    #[error("SANDBOXD_RUNTIMES (--runtimes): {0}")]
    Runtimes(String),
    /// The runtime file cannot be read or is malformed.
    #[error("SANDBOXD_RUNTIMES_FILE {path}: {message}")]
    RuntimesFile {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// Another setting is out of range.
    #[error("{0}")]
    Invalid(String),
}

/// `node` when it can name a node: not empty, no whitespace or control characters.
pub fn check_node_name<'a>(what: &str, node: &'a str) -> Result<&'a str, ConfigError> {
    if node.is_empty() || node.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ConfigError::Invalid(format!(
            "{what} '{}' is not a node name: it must be non-empty, without blanks",
            node.escape_debug()
        )));
    }
    Ok(node)
}

impl Config {
    /// The object store of snapshots, when SANDBOXD_S3_ENDPOINT names one; an endpoint
    /// without a bucket, or one that is not a URL, is refused here.
    pub fn snapshot_store(&self) -> Result<Option<crate::snapshot::StoreConfig>, ConfigError> {
        let endpoint = self.s3_endpoint.trim();
        if endpoint.is_empty() {
            return Ok(None);
        }
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(ConfigError::Invalid(format!(
                "SANDBOXD_S3_ENDPOINT '{endpoint}' is not an http:// or https:// URL"
            )));
        }
        if self.s3_bucket.trim().is_empty() {
            return Err(ConfigError::Invalid(
                "SANDBOXD_S3_ENDPOINT is set without SANDBOXD_S3_BUCKET: name the bucket snapshots are kept in".to_owned(),
            ));
        }
        Ok(Some(crate::snapshot::StoreConfig {
            endpoint: endpoint.to_owned(),
            bucket: self.s3_bucket.trim().to_owned(),
            region: self.s3_region.clone(),
            access_key_id: self.s3_access_key_id.clone(),
            secret_access_key: self.s3_secret_access_key.clone(),
            prefix: self.s3_prefix.clone(),
        }))
    }

    /// The allowlist: SANDBOXD_RUNTIMES_FILE when set, else SANDBOXD_RUNTIMES (catalog format
    /// or compact form). A malformed list is refused here, with every error listed.
    pub fn allowlist(&self) -> Result<Allowlist, ConfigError> {
        if let Some(path) = &self.runtimes_file {
            let file = |message: String| ConfigError::RuntimesFile {
                path: path.display().to_string(),
                message,
            };
            let text = std::fs::read_to_string(path).map_err(|e| file(e.to_string()))?;
            return Allowlist::parse(&text).map_err(|e| file(e.to_string()));
        }
        Allowlist::parse(&self.runtimes).map_err(|e| ConfigError::Runtimes(e.to_string()))
    }

    /// What every runtime build shares: the sandbox uid and the extra CA bundle, read now.
    pub fn build_settings(&self) -> Result<crate::runtimes::BuildSettings, ConfigError> {
        let ca = match &self.build_ca_file {
            None => None,
            Some(path) => Some(std::fs::read(path).map_err(|e| {
                ConfigError::Invalid(format!(
                    "SANDBOXD_BUILD_CA_FILE {} cannot be read: {e}",
                    path.display()
                ))
            })?),
        };
        Ok(crate::runtimes::BuildSettings {
            uid: self.sandbox_uid,
            ca,
        })
    }

    /// The sandbox network's plan: its names and what its firewall drops.
    pub fn network_plan(&self) -> Result<crate::container::network::Plan, ConfigError> {
        crate::container::network::Plan::new(
            &self.instance,
            &self.runtime_network,
            &self.iptables,
            &self.network_deny,
        )
        .map_err(|e| ConfigError::Invalid(e.to_string()))
    }

    /// The egress network's plan (`sandboxd-<instance>-egress`).
    pub fn egress_plan(&self) -> Result<crate::container::network::Plan, ConfigError> {
        crate::container::network::Plan::egress(&self.instance, &self.iptables, &self.network_deny)
            .map_err(|e| ConfigError::Invalid(e.to_string()))
    }

    /// Where the node's egress CA comes from and what the trust bundle and the upstream side
    /// hold (`SANDBOXD_EGRESS_CA_CERT`, `_CA_KEY`, `_SYSTEM_ROOTS`, `_UPSTREAM_CA`).
    pub fn egress_ca(&self) -> Result<crate::egress::ca::CaSettings, ConfigError> {
        let set = |v: &str| (!v.trim().is_empty()).then(|| PathBuf::from(v.trim()));
        let given = match (set(&self.egress_ca_cert), set(&self.egress_ca_key)) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::Invalid(
                    "SANDBOXD_EGRESS_CA_CERT is set but SANDBOXD_EGRESS_CA_KEY is not: the egress CA needs both (or neither: sandboxd makes one)".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(ConfigError::Invalid(
                    "SANDBOXD_EGRESS_CA_KEY is set but SANDBOXD_EGRESS_CA_CERT is not: the egress CA needs both (or neither: sandboxd makes one)".into(),
                ));
            }
        };
        let system_roots = match set(&self.egress_system_roots) {
            Some(p) if p.is_file() => Some(p),
            Some(p) if p.as_os_str() != crate::egress::ca::DEFAULT_SYSTEM_ROOTS => {
                return Err(ConfigError::Invalid(format!(
                    "SANDBOXD_EGRESS_SYSTEM_ROOTS {} is not a file",
                    p.display()
                )));
            }
            _ => None,
        };
        let upstream_ca = set(&self.egress_upstream_ca);
        if let Some(p) = &upstream_ca
            && !p.is_file()
        {
            return Err(ConfigError::Invalid(format!(
                "SANDBOXD_EGRESS_UPSTREAM_CA {} is not a file",
                p.display()
            )));
        }
        Ok(crate::egress::ca::CaSettings {
            state_dir: self.state_dir.clone(),
            given,
            system_roots,
            upstream_ca,
        })
    }

    /// The upstream resolver of the egress network: SANDBOXD_EGRESS_RESOLVER, or the first
    /// nameserver of /etc/resolv.conf.
    pub fn egress_upstream(&self) -> Result<std::net::SocketAddr, ConfigError> {
        let text = self.egress_resolver.trim();
        if text.is_empty() {
            let conf = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
            return crate::egress::resolve::from_resolv_conf(&conf).ok_or_else(|| {
                ConfigError::Invalid(
                    "SANDBOXD_EGRESS_RESOLVER is empty and /etc/resolv.conf names no nameserver: name the resolver sandboxes of allowlist runtimes resolve through (address or address:port)".into(),
                )
            });
        }
        text.parse::<std::net::SocketAddr>()
            .or_else(|_| {
                text.parse::<std::net::IpAddr>()
                    .map(|ip| std::net::SocketAddr::new(ip, 53))
            })
            .map_err(|_| {
                ConfigError::Invalid(format!(
                    "SANDBOXD_EGRESS_RESOLVER: '{text}' is not an address or address:port"
                ))
            })
    }

    /// The timeouts of every HTTP connection.
    pub fn timeouts(&self) -> crate::http::connections::Timeouts {
        crate::http::connections::Timeouts {
            header: std::time::Duration::from_secs(self.header_timeout),
            body: std::time::Duration::from_secs(self.body_timeout),
            idle: std::time::Duration::from_secs(self.idle_timeout),
            handshake: std::time::Duration::from_secs(self.tls_handshake_timeout),
            min_rate: self.min_transfer_rate,
        }
    }

    /// The caps on connections open at once.
    pub fn connection_caps(&self) -> crate::http::connections::Caps {
        crate::http::connections::Caps {
            total: self.max_connections,
            per_source: self.max_connections_per_source,
        }
    }

    /// The certificate and key to serve HTTPS with, None for plain HTTP, or the error naming
    /// the one of the two that is missing.
    pub fn tls_files(&self) -> Result<Option<crate::tls::TlsFiles>, ConfigError> {
        crate::tls::TlsFiles::from_options(
            self.tls_cert_file.as_deref(),
            self.tls_key_file.as_deref(),
        )
        .map_err(|e| ConfigError::Invalid(e.to_string()))
    }

    /// The live policy this configuration starts with.
    pub fn policy(&self) -> crate::service::policy::Policy {
        crate::service::policy::Policy {
            max_sessions: self.max_sessions,
            max_sessions_per_tenant: self.max_sessions_per_tenant,
            execute_timeout: self.execute_timeout,
            max_read_bytes: self.max_read_bytes,
            max_output_bytes: u64::try_from(self.max_output_bytes).unwrap_or(u64::MAX),
        }
    }

    /// The master admin token (SANDBOXD_TOKEN), refused when missing or empty.
    pub fn master_token(&self) -> Result<String, ConfigError> {
        self.token
            .clone()
            .filter(|t| !t.is_empty())
            .ok_or(ConfigError::MissingToken)
    }

    /// The node this sandboxd runs on, if it is told; a name that is empty or holds blanks
    /// is refused rather than taken as "no node" (that would accept the master).
    pub fn node(&self) -> Result<Option<&str>, ConfigError> {
        match self.node_name.as_deref() {
            None => Ok(None),
            Some(node) => check_node_name("SANDBOXD_NODE_NAME", node).map(Some),
        }
    }

    /// The admin token this sandboxd accepts: its node's own (SANDBOXD_NODE_TOKEN, or derived
    /// from the master for SANDBOXD_NODE_NAME), or the master when it is not told its node.
    pub fn admin_token(&self) -> Result<crate::service::auth::AdminToken, ConfigError> {
        let node = self.node()?;
        if let Some(dir) = &self.node_token_hashes {
            let Some(node) = node else {
                return Err(ConfigError::Invalid(
                    "SANDBOXD_NODE_TOKEN_HASHES needs SANDBOXD_NODE_NAME: the node whose token's hash is read there".into(),
                ));
            };
            if self.master_token().is_ok()
                || self.node_token.as_deref().is_some_and(|t| !t.is_empty())
            {
                return Err(ConfigError::Invalid(
                    "SANDBOXD_NODE_TOKEN_HASHES is set with SANDBOXD_TOKEN or SANDBOXD_NODE_TOKEN: give this node only one of the master, its own token, or its token's hash".into(),
                ));
            }
            if !dir.is_dir() {
                return Err(ConfigError::Invalid(format!(
                    "SANDBOXD_NODE_TOKEN_HASHES {} is not a directory: it must be where the node token hashes are mounted (a file per node, named after it)",
                    dir.display()
                )));
            }
            return Ok(crate::service::auth::AdminToken::hash_file(dir, node));
        }
        let own = self.node_token.as_deref().filter(|t| !t.is_empty());
        match (self.master_token(), own, node) {
            (Ok(_), Some(_), _) => Err(ConfigError::Invalid(
                "SANDBOXD_TOKEN and SANDBOXD_NODE_TOKEN are both set: give either the master (with SANDBOXD_NODE_NAME) or this node's own token, not both".into(),
            )),
            (Err(_), Some(_), None) => Err(ConfigError::Invalid(
                "SANDBOXD_NODE_TOKEN needs SANDBOXD_NODE_NAME: the node whose own token it is".into(),
            )),
            (Err(_), Some(own), Some(_)) => Ok(crate::service::auth::AdminToken::new(own)),
            (master, None, node) => Ok(crate::service::auth::AdminToken::accepted(&master?, node)),
        }
    }

    /// The workspace budget in bytes: SANDBOXD_WORKSPACE_BUDGET, or the size of the filesystem
    /// under the workspace root (its nearest folder that exists) less the reserve.
    pub fn workspace_budget_bytes(&self) -> u64 {
        if let Some(b) = self
            .workspace_budget
            .as_deref()
            .and_then(parse_bytes)
            .and_then(|b| u64::try_from(b).ok())
        {
            return b;
        }
        let size = self
            .workspace_root
            .ancestors()
            .find_map(|p| rustix::fs::statvfs(p).ok())
            .map_or(0, |s| s.f_blocks.saturating_mul(s.f_frsize));
        size.saturating_sub(budget_reserve(size))
    }

    /// Checks everything that can be checked before start-up and returns the admin token this
    /// sandboxd accepts and the allowlist.
    pub fn validate(&self) -> Result<(crate::service::auth::AdminToken, Allowlist), ConfigError> {
        let token = self.admin_token()?;
        let runtimes = self.allowlist()?;
        if self.sandbox_uid == 0 {
            return Err(ConfigError::Invalid(
                "SANDBOXD_SANDBOX_UID must not be 0: sandboxes never run as root".into(),
            ));
        }
        for (name, value) in [
            ("SANDBOXD_TMPFS_SIZE", self.tmpfs_size.as_str()),
            ("SANDBOXD_HOME_SIZE", self.home_size.as_str()),
            ("SANDBOXD_MEM_LIMIT", self.mem_limit.as_str()),
            ("SANDBOXD_WORKSPACE_SIZE", self.workspace_size.as_str()),
            (
                "SANDBOXD_WORKSPACE_BUDGET",
                self.workspace_budget.as_deref().unwrap_or("1"),
            ),
            ("SANDBOXD_MEMORY_BUDGET", self.memory_budget.as_str()),
            (
                "SANDBOXD_SESSION_MEMORY_BUDGET",
                self.session_memory_budget.as_str(),
            ),
        ] {
            if parse_bytes(value).is_none() {
                return Err(ConfigError::Invalid(format!(
                    "{name} '{value}' is not a size in Docker's syntax (for example 64m or 2g)"
                )));
            }
        }
        if parse_bytes(&self.workspace_size)
            .is_some_and(|b| b < crate::workspace::disk::MIN_SIZE as i64)
        {
            return Err(ConfigError::Invalid(format!(
                "SANDBOXD_WORKSPACE_SIZE '{}' is below the smallest workspace of {}",
                self.workspace_size,
                crate::workspace::disk::human(crate::workspace::disk::MIN_SIZE)
            )));
        }
        for (name, value) in [
            ("SANDBOXD_FILE_WORKERS", self.file_workers),
            (
                "SANDBOXD_FILE_WORKERS_PER_SESSION",
                self.file_workers_per_session,
            ),
            (
                "SANDBOXD_FILE_QUEUE_PER_SESSION",
                self.file_queue_per_session,
            ),
            (
                "SANDBOXD_FILE_DEADLINE",
                usize::try_from(self.file_deadline).unwrap_or(usize::MAX),
            ),
        ] {
            if !(1..=4096).contains(&value) {
                return Err(ConfigError::Invalid(format!(
                    "{name} must be between 1 and 4096, not {value}"
                )));
            }
        }
        if bytes_of(&self.session_memory_budget, 0) < self.max_read_bytes
            || bytes_of(&self.memory_budget, 0) < bytes_of(&self.session_memory_budget, 0)
        {
            return Err(ConfigError::Invalid(format!(
                "SANDBOXD_SESSION_MEMORY_BUDGET '{}' must hold at least one read of SANDBOXD_MAX_READ_BYTES ({} bytes), and SANDBOXD_MEMORY_BUDGET '{}' at least a session's",
                self.session_memory_budget, self.max_read_bytes, self.memory_budget
            )));
        }
        if self.max_runs_per_session == 0 {
            return Err(ConfigError::Invalid(
                "SANDBOXD_MAX_RUNS_PER_SESSION must be at least 1".into(),
            ));
        }
        if self.max_terminals_per_session == 0 {
            return Err(ConfigError::Invalid(
                "SANDBOXD_MAX_TERMINALS_PER_SESSION must be at least 1".into(),
            ));
        }
        if self.cpus.is_nan() || self.cpus <= 0.0 {
            return Err(ConfigError::Invalid("SANDBOXD_CPUS must be above 0".into()));
        }
        if let Some(url) = &self.audit_database_url
            && !url.is_empty()
            && !url.starts_with("postgres://")
            && !url.starts_with("postgresql://")
        {
            return Err(ConfigError::Invalid(
                "SANDBOXD_AUDIT_DATABASE_URL must be a postgres:// URL (unset keeps the audit log in SQLite in SANDBOXD_STATE_DIR)".into(),
            ));
        }
        self.network_plan()?;
        if self.egress_max_connections == 0 {
            return Err(ConfigError::Invalid(
                "SANDBOXD_EGRESS_MAX_CONNECTIONS must be at least 1".into(),
            ));
        }
        if !self.egress_resolver.trim().is_empty() {
            self.egress_upstream()?;
        }
        self.egress_ca()?;
        if self.max_connections == 0 || self.max_connections_per_source == 0 {
            return Err(ConfigError::Invalid(
                "SANDBOXD_MAX_CONNECTIONS and SANDBOXD_MAX_CONNECTIONS_PER_SOURCE must be at least 1".into(),
            ));
        }
        if !(1..=3600).contains(&self.firewall_check) {
            return Err(ConfigError::Invalid(format!(
                "SANDBOXD_FIREWALL_CHECK must be between 1 and 3600 seconds, not {}",
                self.firewall_check
            )));
        }
        for (name, value) in [
            ("SANDBOXD_HEADER_TIMEOUT", self.header_timeout),
            ("SANDBOXD_BODY_TIMEOUT", self.body_timeout),
            ("SANDBOXD_IDLE_TIMEOUT", self.idle_timeout),
            ("SANDBOXD_TLS_HANDSHAKE_TIMEOUT", self.tls_handshake_timeout),
        ] {
            if !(1..=MAX_CONNECTION_TIMEOUT).contains(&value) {
                return Err(ConfigError::Invalid(format!(
                    "{name} must be between 1 and {MAX_CONNECTION_TIMEOUT} seconds, not {value}"
                )));
            }
        }
        self.tls_files()?;
        if self.audit_queue == 0 {
            return Err(ConfigError::Invalid(
                "SANDBOXD_AUDIT_QUEUE must be at least 1".into(),
            ));
        }
        if let Err(e) = crate::service::policy::PolicyRules::check(&self.policy()) {
            return Err(ConfigError::Invalid(e));
        }
        if self.operation_retention_days == 0 {
            return Err(ConfigError::Invalid(
                "OPERATION_RETENTION_DAYS must be at least 1".into(),
            ));
        }
        Ok((token, runtimes))
    }
}

/// A size in Docker's syntax as bytes, `default` when it is not one (validated before).
fn bytes_of(text: &str, default: u64) -> u64 {
    parse_bytes(text)
        .and_then(|b| u64::try_from(b).ok())
        .unwrap_or(default)
}

/// What the default workspace budget leaves of a filesystem of `size` bytes for sandboxd's own
/// state, its trash and the node: 5%, at least 1 GiB.
pub fn budget_reserve(size: u64) -> u64 {
    (size / 20).max(1 << 30)
}

impl crate::service::Settings {
    /// The settings of a validated config.
    pub fn from_config(c: &Config) -> Self {
        Self {
            workspace_root: c.workspace_root.clone(),
            caps: crate::storage::store::Caps {
                max_sessions: c.max_sessions,
                max_per_tenant: c.max_sessions_per_tenant,
                max_workspaces_per_tenant: c.max_workspaces_per_tenant,
                workspace_budget: match c.workspace_quota {
                    crate::config::WorkspaceQuota::Loop => Some(c.workspace_budget_bytes()),
                    crate::config::WorkspaceQuota::Off => None,
                },
            },
            execute_timeout: std::time::Duration::from_secs(c.execute_timeout),
            max_read_bytes: c.max_read_bytes,
            max_output_bytes: c.max_output_bytes,
            max_runs_per_session: usize::try_from(c.max_runs_per_session).unwrap_or(usize::MAX),
            terminals: crate::service::TerminalLimits {
                max_per_session: c.max_terminals_per_session,
                idle_timeout: std::time::Duration::from_secs(c.terminal_idle_timeout),
            },
            port_answer_timeout: std::time::Duration::from_secs(c.port_answer_timeout.max(1)),
            watch_max_folders: c.watch_max_folders.max(1),
            uid: c.sandbox_uid,
            network_mode: c.network_mode.clone(),
            runtime_network: c
                .network_plan()
                .map_or_else(|_| c.runtime_network.clone(), |p| p.network),
            cpus: c.cpus,
            memory: parse_bytes(&c.mem_limit).unwrap_or(1 << 30),
            pids_limit: c.pids_limit,
            tmpfs_size: c.tmpfs_size.clone(),
            home_size: c.home_size.clone(),
            oci_runtime: c.oci_runtime.clone(),
            gvisor_runtime: c.gvisor_runtime.clone(),
            persist_containers: c.persist_containers,
            egress_trust: None,
            resolv_dir: c.state_dir.join("resolv"),
            file_work: crate::service::work::FileWorkLimits {
                workers: c.file_workers,
                per_session: c.file_workers_per_session,
                queue_per_session: c.file_queue_per_session,
                deadline: std::time::Duration::from_secs(c.file_deadline),
                memory: bytes_of(&c.memory_budget, 256 << 20),
                memory_per_session: bytes_of(&c.session_memory_budget, 64 << 20),
            },
            workspace_size: match c.workspace_quota {
                crate::config::WorkspaceQuota::Loop => Some(
                    parse_bytes(&c.workspace_size)
                        .and_then(|b| u64::try_from(b).ok())
                        .unwrap_or(10 << 30),
                ),
                crate::config::WorkspaceQuota::Off => None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_default_budget_is_the_filesystem_less_its_reserve() {
        assert_eq!(budget_reserve(100 << 30), 5 << 30);
        assert_eq!(budget_reserve(4 << 30), 1 << 30);
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("not/yet/made");
        let c = Config::parse_from([
            "sandboxd",
            "--token",
            "t",
            "--runtimes",
            "base=img",
            "--workspace-root",
            root.to_str().expect("utf-8"),
        ]);
        let fs = rustix::fs::statvfs(dir.path()).expect("statvfs");
        let size = fs.f_blocks * fs.f_frsize;
        assert_eq!(c.workspace_budget_bytes(), size - budget_reserve(size));
        let set = Config::parse_from([
            "sandboxd",
            "--token",
            "t",
            "--runtimes",
            "base=img",
            "--workspace-budget",
            "95g",
        ]);
        assert_eq!(set.workspace_budget_bytes(), 95 << 30);
        let bad = Config::parse_from([
            "sandboxd",
            "--token",
            "t",
            "--runtimes",
            "base=img",
            "--workspace-budget",
            "lots",
        ]);
        assert!(bad.validate().is_err_and(|e| {
            e.to_string()
                .contains("SANDBOXD_WORKSPACE_BUDGET 'lots' is not a size")
        }));
    }

    #[test]
    fn command_is_well_formed() {
        Config::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_seeds() {
        let c = Config::parse_from(["sandboxd", "--token", "t", "--runtimes", "base=img"]);
        assert_eq!((c.max_sessions, c.max_sessions_per_tenant), (20, 10));
        assert_eq!(c.execute_timeout, 300);
        assert_eq!(c.max_read_bytes, 8 * 1024 * 1024);
        assert_eq!(c.sandbox_uid, 10001);
        assert_eq!(c.max_runs_per_session, 16);
        assert_eq!(
            (c.max_terminals_per_session, c.terminal_idle_timeout),
            (8, 3600)
        );
        assert_eq!(c.network_mode, "none");
        assert_eq!(
            (c.cpus, c.pids_limit, c.tmpfs_size.as_str()),
            (2.0, 512, "64m")
        );
        assert_eq!((c.host.to_string(), c.port), ("127.0.0.1".to_owned(), 8080));
        assert_eq!(
            (c.workspace_size.as_str(), c.workspace_quota),
            ("4g", WorkspaceQuota::Loop)
        );
        assert_eq!(c.max_workspaces_per_tenant, 20);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn missing_token_is_named() {
        let c = Config::parse_from(["sandboxd", "--runtimes", "base=img"]);
        assert_eq!(
            c.validate().map(|_| ()).map_err(|e| e.to_string()),
            Err("SANDBOXD_TOKEN (--token) is required: the admin token that opens sessions on this host (or, with SANDBOXD_NODE_NAME, this node's own token in SANDBOXD_NODE_TOKEN, or the directory of node token hashes in SANDBOXD_NODE_TOKEN_HASHES)".to_owned())
        );
    }

    #[test]
    fn runtimes_in_the_catalog_format_inline_and_from_a_file() {
        let c = Config::parse_from([
            "sandboxd",
            "--token",
            "t",
            "--runtimes",
            sandboxd_catalog::SHIPPED,
        ]);
        let (_, list) = c.validate().expect("valid");
        assert!(list.catalog);
        assert_eq!(list.entries[0].alias, "workbench");
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("runtimes.json");
        std::fs::write(
            &path,
            r#"[{"alias": "a", "image": "x", "colour": 1}, {"alias": "B"}]"#,
        )
        .expect("write");
        let c = Config::parse_from([
            "sandboxd",
            "--token",
            "t",
            "--runtimes-file",
            path.to_str().expect("utf8"),
        ]);
        let err = c.validate().expect_err("invalid").to_string();
        assert_eq!(
            err,
            format!(
                "SANDBOXD_RUNTIMES_FILE {}: the runtime catalog is invalid (3 errors):\n  - entry 1 (a): colour: unknown field; allowed are alias, description, image, base_image, setup_commands, packages, env_vars, briefing, mem_limit, workspace_size, needs_network, warm_pool, egress, isolation\n  - entry 2 (B): alias: 'B' must match [a-z][a-z0-9-]* (a lowercase letter, then lowercase letters, digits or '-')\n  - entry 2 (B): image: one of image (a ready image) and base_image (built on the host) is required",
                path.display()
            )
        );
    }

    #[test]
    fn prepare_is_a_subcommand() {
        let c = Config::parse_from(["sandboxd", "prepare"]);
        assert_eq!(c.command, Some(Command::Prepare));
        assert_eq!(c.operation_retention_days, 30);
        assert!(c.audit);
    }

    #[test]
    fn admin_token_is_a_subcommand_and_node_names_are_checked() {
        let c = Config::parse_from(["sandboxd", "admin-token", "--node", "worker-1"]);
        assert_eq!(
            c.command,
            Some(Command::AdminToken {
                node: "worker-1".into()
            })
        );
        let c = Config::parse_from([
            "sandboxd",
            "--token",
            "t",
            "--runtimes",
            "base=img",
            "--node-name",
            "worker 1",
        ]);
        assert_eq!(
            c.validate().map(|_| ()).map_err(|e| e.to_string()),
            Err("SANDBOXD_NODE_NAME 'worker 1' is not a node name: it must be non-empty, without blanks".to_owned())
        );
        let c = Config::parse_from(["sandboxd", "--token", "t", "--node-name", "w"]);
        let admin = c.admin_token().expect("an admin token");
        assert!(admin.matches(&crate::service::auth::node_token("t", "w")) && !admin.matches("t"));
        // A node given only its own token takes that one.
        let own = crate::service::auth::node_token("t", "w");
        let c = Config::parse_from(["sandboxd", "--node-token", &own, "--node-name", "w"]);
        let admin = c.admin_token().expect("an admin token");
        assert!(admin.matches(&own) && !admin.matches("t"));
        let refused = |args: &[&str]| {
            Config::parse_from(args)
                .admin_token()
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            refused(&["sandboxd", "--node-token", &own]),
            Err(
                "SANDBOXD_NODE_TOKEN needs SANDBOXD_NODE_NAME: the node whose own token it is"
                    .to_owned()
            )
        );
        assert_eq!(
            refused(&["sandboxd", "--token", "t", "--node-token", &own, "--node-name", "w"]),
            Err("SANDBOXD_TOKEN and SANDBOXD_NODE_TOKEN are both set: give either the master (with SANDBOXD_NODE_NAME) or this node's own token, not both".to_owned())
        );
        // Given the directory of hashes, it needs its node and nothing else.
        let dir = tempfile::tempdir().expect("tempdir");
        let dir_s = dir.path().to_str().expect("utf-8 path");
        std::fs::write(dir.path().join("w"), crate::service::auth::hash(&own)).expect("write");
        let c = Config::parse_from(["sandboxd", "--node-token-hashes", dir_s, "--node-name", "w"]);
        let admin = c.admin_token().expect("an admin token");
        assert!(admin.matches(&own) && !admin.matches("t"));
        assert_eq!(
            refused(&["sandboxd", "--node-token-hashes", dir_s]),
            Err("SANDBOXD_NODE_TOKEN_HASHES needs SANDBOXD_NODE_NAME: the node whose token's hash is read there".to_owned())
        );
        assert_eq!(
            refused(&["sandboxd", "--token", "t", "--node-token-hashes", dir_s, "--node-name", "w"]),
            Err("SANDBOXD_NODE_TOKEN_HASHES is set with SANDBOXD_TOKEN or SANDBOXD_NODE_TOKEN: give this node only one of the master, its own token, or its token's hash".to_owned())
        );
        let missing = dir.path().join("nope");
        let missing_s = missing.to_str().expect("utf-8 path");
        assert_eq!(
            refused(&[
                "sandboxd",
                "--node-token-hashes",
                missing_s,
                "--node-name",
                "w"
            ]),
            Err(format!(
                "SANDBOXD_NODE_TOKEN_HASHES {missing_s} is not a directory: it must be where the node token hashes are mounted (a file per node, named after it)"
            ))
        );
    }

    #[test]
    fn debug_never_shows_the_token() {
        let c = Config::parse_from([
            "sandboxd",
            "--token",
            "s3cr3t-admin",
            "--runtimes",
            "base=img",
        ]);
        assert!(!format!("{c:?}").contains("s3cr3t"));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("64m"), Some(64 << 20));
        assert_eq!(parse_bytes("2g"), Some(2 << 30));
        assert_eq!(parse_bytes("1024"), Some(1024));
        assert_eq!(parse_bytes("lots"), None);
    }
}
