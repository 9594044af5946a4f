//! The network of sessions whose runtime needs one: a Docker bridge network of this sandboxd's
//! own, fenced in by the node's firewall.
//!
//! - The network (`sandboxd-<instance>-net` unless `SANDBOXD_RUNTIME_NETWORK` names it) is
//!   made by sandboxd when it is missing, labelled as this instance's, with inter-container
//!   traffic off (`com.docker.network.bridge.enable_icc=false`), so two sandboxes never reach
//!   each other, and a bridge interface of a fixed name (`sbx-<hash of the instance>`).
//! - iptables rules in two chains of this instance's own keep the sandboxes off the node and
//!   the addresses behind it: from the bridge, INPUT drops sandboxd's own port and everything
//!   else that is not the answer to a connection the node opened (the node is not a sandbox's
//!   business: DNS is Docker's resolver inside the sandbox's own namespace); FORWARD drops the
//!   denied ranges (`SANDBOXD_NETWORK_DENY`: link-local with the cloud metadata address,
//!   private and shared ranges by default) and every connection first addressed to one of the
//!   node's own addresses (each IPv4 address on the host's interfaces but loopback, read again
//!   at every check: a NodePort or a published port forwards such a connection elsewhere), so
//!   what is left is the internet through Docker's NAT. IPv6 from the bridge is dropped
//!   altogether (the network carries none).
//! - The chains are rewritten whole (one `iptables-restore --noflush`), and the jumps to them
//!   checked before they are inserted, so setting up again never duplicates a rule. Each jump
//!   is the first rule of its chain: INPUT's, FORWARD's (where only Docker's own jump to
//!   `DOCKER-USER` may stand above it), and `DOCKER-USER`'s when Docker keeps that chain.
//! - The firewall heals ([`SandboxNetwork::heal`], run by [`spawn_guard`] every
//!   `SANDBOXD_FIREWALL_CHECK` seconds and after each Docker network event): its chains are
//!   compared with what was installed and its jumps with their places; whatever was flushed,
//!   removed or pushed down (a firewalld reload, a CNI's rule inserted first) is installed
//!   again, counted in `sandboxd_firewall_repairs_total`, and `/healthz` answers 503 naming
//!   what is missing until it is back.
//!
//! It needs the `iptables` command and NET_ADMIN in the node's network namespace, where Docker's
//! bridges are: sandboxd checks that it sees the bridge before it trusts its own rules.
//!
//! Over 600 lines: the network and its two firewall chains are made, checked and removed together.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bollard::models::NetworkCreateRequest;
use futures::StreamExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use sha2::{Digest, Sha256};
use tokio::process::Command;
use tracing::{info, warn};

use crate::container::Engine;
use crate::container::docker::{DockerEngine, LABEL_INSTANCE, LABEL_MANAGED};

/// Docker's bridge option that turns inter-container traffic on a network off.
pub const ICC_OPTION: &str = "com.docker.network.bridge.enable_icc";
/// Docker's bridge option naming the bridge interface.
pub const BRIDGE_NAME_OPTION: &str = "com.docker.network.bridge.name";
/// What `SANDBOXD_NETWORK_DENY` drops by default: link-local (cloud metadata at
/// 169.254.169.254), the private ranges (cluster pods, services and nodes), carrier-grade NAT.
pub const DEFAULT_DENY: &str =
    "169.254.0.0/16,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,100.64.0.0/10";
/// Where the kernel says whether bridged traffic passes iptables (br_netfilter), which
/// `enable_icc=false` relies on.
const BRIDGE_NF: &str = "/proc/sys/net/bridge/bridge-nf-call-iptables";

/// Names Docker keeps for networks of its own; the runtime network is never one of them.
const DOCKER_NETWORKS: [&str; 4] = ["bridge", "host", "none", "default"];

/// What is wrong with the sandbox network or its firewall.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// The settings are malformed.
    #[error("{0}")]
    Invalid(String),
    /// Docker refused or failed.
    #[error(transparent)]
    Docker(#[from] crate::container::DockerError),
    /// A network of that name exists and is not this sandboxd's, or is set up differently.
    #[error(
        "Docker network '{name}' exists but {problem}; sandboxes with network get a network of sandboxd's own: remove it (docker network rm {name}) or name another with SANDBOXD_RUNTIME_NETWORK"
    )]
    Foreign {
        /// The network.
        name: String,
        /// What is different.
        problem: String,
    },
    /// The firewall cannot be installed or the node cannot isolate the network.
    #[error(
        "cannot fence in the sandbox network '{network}' (bridge {bridge}): {message}. A node running sandboxes with network needs the iptables command (SANDBOXD_IPTABLES) and NET_ADMIN in the node's network namespace (in Kubernetes: hostNetwork and the NET_ADMIN and NET_RAW capabilities)"
    )]
    Firewall {
        /// The network.
        network: String,
        /// Its bridge interface.
        bridge: String,
        /// What failed.
        message: String,
    },
}

/// The sandbox network's settings: names derived from the instance, the firewall's commands
/// and what it drops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The Docker network.
    pub network: String,
    /// Its bridge interface (at most 15 characters).
    pub bridge: String,
    /// The instance that owns it (its label).
    pub instance: String,
    /// The chain INPUT jumps to for traffic from the bridge.
    pub input_chain: String,
    /// The chain FORWARD (or DOCKER-USER) jumps to for traffic from the bridge.
    pub forward_chain: String,
    /// The iptables command.
    pub iptables: String,
    /// The ip6tables command (derived from the iptables one).
    pub ip6tables: String,
    /// IPv4 ranges a sandbox may not reach through the node.
    pub deny: Vec<String>,
    /// The nat chain PREROUTING jumps to for traffic from the bridge: only the egress network
    /// has one (it redirects every TCP connection and DNS query to sandboxd).
    pub nat_chain: Option<String>,
}

/// Where the egress network's firewall sends what its sandboxes send: sandboxd's ports on the
/// bridge's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redirect {
    /// The egress proxy's port: every TCP connection but DNS.
    pub proxy: u16,
    /// The resolver's port: UDP and TCP port 53.
    pub dns: u16,
}

/// The ip6tables command beside an iptables command: `iptables-legacy` → `ip6tables-legacy`.
fn ip6(iptables: &str) -> String {
    let (dir, file) = match iptables.rsplit_once('/') {
        Some((dir, file)) => (format!("{dir}/"), file),
        None => (String::new(), iptables),
    };
    format!("{dir}{}", file.replacen("iptables", "ip6tables", 1))
}

/// Parses `a.b.c.d/n` (or an address alone, a /32) into its canonical form.
fn parse_cidr(text: &str) -> Option<String> {
    let (addr, prefix) = match text.split_once('/') {
        Some((a, p)) => (a, p.parse::<u8>().ok().filter(|p| *p <= 32)?),
        None => (text, 32),
    };
    let addr: Ipv4Addr = addr.parse().ok()?;
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    Some(format!(
        "{}/{prefix}",
        Ipv4Addr::from(u32::from(addr) & mask)
    ))
}

/// Whether the canonical range `cidr` (`a.b.c.d/n`) holds `addr`.
pub(crate) fn range_holds(cidr: &str, addr: Ipv4Addr) -> bool {
    let Some((net, prefix)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(net), Ok(prefix)) = (net.parse::<Ipv4Addr>(), prefix.parse::<u32>()) else {
        return false;
    };
    let mask = u32::MAX.checked_shl(32 - prefix.min(32)).unwrap_or(0);
    u32::from(addr) & mask == u32::from(net) & mask
}

/// The node's own IPv4 addresses: every address on the host's interfaces, but loopback (never
/// reached from a bridge) and those a denied range of `deny` holds already; sorted.
pub fn node_addresses(deny: &[String]) -> Vec<Ipv4Addr> {
    let mut found: Vec<Ipv4Addr> = match nix::ifaddrs::getifaddrs() {
        Ok(addrs) => addrs
            .filter_map(|a| a.address?.as_sockaddr_in().map(|s| s.ip()))
            .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
            .filter(|ip| !deny.iter().any(|r| range_holds(r, *ip)))
            .collect(),
        Err(e) => {
            warn!(error = %e, "cannot list the node's addresses; only the configured ranges are denied");
            Vec::new()
        }
    };
    found.sort();
    found.dedup();
    found
}

impl Plan {
    /// The plan of `instance`: `network` ("" for `sandboxd-<instance>-net`), the iptables
    /// command, the denied ranges (comma-separated CIDRs).
    pub fn new(
        instance: &str,
        network: &str,
        iptables: &str,
        deny: &str,
    ) -> Result<Self, NetworkError> {
        let network = if network.trim().is_empty() {
            format!("sandboxd-{instance}-net")
        } else {
            network.trim().to_owned()
        };
        if DOCKER_NETWORKS.contains(&network.as_str()) || network.starts_with("container:") {
            return Err(NetworkError::Invalid(format!(
                "SANDBOXD_RUNTIME_NETWORK '{network}' is one of Docker's own network modes; sandboxes with network get a network of sandboxd's own (leave it unset for sandboxd-{instance}-net)"
            )));
        }
        if iptables.trim().is_empty() {
            return Err(NetworkError::Invalid(
                "SANDBOXD_IPTABLES must name the iptables command (iptables, iptables-nft or iptables-legacy)".into(),
            ));
        }
        let mut ranges = Vec::new();
        for item in deny.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            ranges.push(parse_cidr(item).ok_or_else(|| {
                NetworkError::Invalid(format!(
                    "SANDBOXD_NETWORK_DENY: '{item}' is not an IPv4 range (a.b.c.d/n)"
                ))
            })?);
        }
        let hash = hex::encode(Sha256::digest(instance.as_bytes()));
        let short = &hash[..10];
        Ok(Self {
            network,
            bridge: format!("sbx-{short}"),
            instance: instance.to_owned(),
            input_chain: format!("SANDBOXD-IN-{short}"),
            forward_chain: format!("SANDBOXD-FWD-{short}"),
            iptables: iptables.trim().to_owned(),
            ip6tables: ip6(iptables.trim()),
            deny: ranges,
            nat_chain: None,
        })
    }

    /// The plan of `instance`'s egress network (`sandboxd-<instance>-egress`, bridge
    /// `sbe-<hash>`), where sandboxes of `allowlist` runtimes reach only sandboxd's egress
    /// proxy and resolver.
    pub fn egress(instance: &str, iptables: &str, deny: &str) -> Result<Self, NetworkError> {
        let open = Self::new(
            instance,
            &format!("sandboxd-{instance}-egress"),
            iptables,
            deny,
        )?;
        let short = open.bridge.trim_start_matches("sbx-").to_owned();
        Ok(Self {
            bridge: format!("sbe-{short}"),
            input_chain: format!("SANDBOXD-EIN-{short}"),
            forward_chain: format!("SANDBOXD-EFWD-{short}"),
            nat_chain: Some(format!("SANDBOXD-ENAT-{short}")),
            ..open
        })
    }

    /// The egress network's IPv4 rules: from the bridge, INPUT takes only the proxy's and the
    /// resolver's ports (and answers to the node's own connections); FORWARD drops everything
    /// (no packet of a sandbox is routed anywhere); the nat chain redirects DNS to the
    /// resolver and every other TCP connection to the proxy.
    pub fn egress_rules(&self, nat: &str, to: Redirect) -> String {
        let (input, forward) = (&self.input_chain, &self.forward_chain);
        let Redirect { proxy, dns } = to;
        format!(
            "*filter\n:{input} - [0:0]\n:{forward} - [0:0]\n\
             -A {input} -p tcp --dport {proxy} -j ACCEPT\n\
             -A {input} -p udp --dport {dns} -j ACCEPT\n\
             -A {input} -p tcp --dport {dns} -j ACCEPT\n\
             -A {input} -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN\n\
             -A {input} -j DROP\n\
             -A {forward} -j DROP\n\
             COMMIT\n\
             *nat\n:{nat} - [0:0]\n\
             -A {nat} -p udp --dport 53 -j REDIRECT --to-ports {dns}\n\
             -A {nat} -p tcp --dport 53 -j REDIRECT --to-ports {dns}\n\
             -A {nat} -p tcp -j REDIRECT --to-ports {proxy}\n\
             COMMIT\n"
        )
    }

    /// The IPv4 chains whole, as `iptables-restore --noflush` reads them: declaring a chain
    /// creates it or empties it, in one transaction with the rules that follow. `node` are
    /// the node's own addresses: a connection first addressed to one of them is dropped
    /// wherever NAT sends it.
    pub fn ipv4_rules(&self, ports: &[u16], node: &[Ipv4Addr]) -> String {
        let (input, forward) = (&self.input_chain, &self.forward_chain);
        let mut out = format!("*filter\n:{input} - [0:0]\n:{forward} - [0:0]\n");
        for port in ports {
            out.push_str(&format!("-A {input} -p tcp --dport {port} -j DROP\n"));
        }
        out.push_str(&format!(
            "-A {input} -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN\n-A {input} -j DROP\n"
        ));
        for range in &self.deny {
            out.push_str(&format!("-A {forward} -d {range} -j DROP\n"));
        }
        for addr in node {
            out.push_str(&format!(
                "-A {forward} -m conntrack --ctorigdst {addr}/32 -j DROP\n"
            ));
        }
        out.push_str("COMMIT\n");
        out
    }

    /// The IPv6 chains: everything from the bridge is dropped (the network carries no IPv6;
    /// this closes the link-local addresses of the node's side of the bridge).
    pub fn ipv6_rules(&self) -> String {
        let (input, forward) = (&self.input_chain, &self.forward_chain);
        format!(
            "*filter\n:{input} - [0:0]\n:{forward} - [0:0]\n-A {input} -j DROP\n-A {forward} -j DROP\nCOMMIT\n"
        )
    }
}

/// The node's side of the sandbox network, as Docker made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    /// The network's name.
    pub network: String,
    /// Its id.
    pub id: String,
    /// Its bridge interface.
    pub bridge: String,
    /// The bridge's own address (the sandboxes' gateway), as Docker's IPAM gave it.
    pub gateway: Option<Ipv4Addr>,
}

/// The rules of sandboxd's two chains as the table printed them right after they were
/// installed (`iptables-save` words a rule its own way; what it printed is what a check
/// compares with).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Chains {
    input: Vec<String>,
    forward: Vec<String>,
    /// Whether Docker keeps a `DOCKER-USER` chain in this family's table (it then jumps to
    /// the forward chain first).
    docker_user: bool,
}

/// The firewall as sandboxd installed it last.
#[derive(Debug, Clone)]
struct Installed {
    ready: Ready,
    /// The node addresses its forward chain drops.
    node: Vec<Ipv4Addr>,
    v4: Chains,
    /// None when the node has no IPv6.
    v6: Option<Chains>,
    /// The egress network's nat chain as installed (empty for the open network).
    nat: Vec<String>,
}

/// What a look at the firewall found and did ([`SandboxNetwork::heal`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Healed {
    /// No network was set up: nothing to look at.
    NotSetUp,
    /// Every rule in its place.
    Intact,
    /// The network's bridge is gone (the network was removed): nothing is on it to fence in.
    /// The next open of a runtime with network makes it again, with its firewall.
    Gone,
    /// Rules were missing, changed or pushed down (each problem named) and were installed again.
    Repaired(Vec<String>),
    /// The node's addresses changed; the forward chain now drops these.
    Updated(Vec<Ipv4Addr>),
}

/// The sandbox network of one sandboxd: set up once (at start when a runtime needs it, or at
/// the first open of such a runtime), then reused, and its firewall checked and healed by
/// [`spawn_guard`].
pub struct SandboxNetwork {
    engine: Engine,
    plan: Plan,
    ports: std::sync::Mutex<Vec<u16>>,
    /// The egress network's redirect ports, once its listeners are bound.
    redirect: std::sync::Mutex<Option<Redirect>>,
    installed: tokio::sync::Mutex<Option<Installed>>,
    /// What is missing from the firewall while it is (see [`SandboxNetwork::problem`]).
    problem: std::sync::Mutex<Option<String>>,
}

impl SandboxNetwork {
    /// The network of `plan` on `engine`; nothing is made until [`SandboxNetwork::ensure`].
    pub fn new(engine: Engine, plan: Plan) -> Self {
        Self {
            engine,
            plan,
            ports: std::sync::Mutex::default(),
            redirect: std::sync::Mutex::default(),
            installed: tokio::sync::Mutex::default(),
            problem: std::sync::Mutex::default(),
        }
    }

    /// Its plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// sandboxd's own ports, which the firewall drops from the sandbox network.
    pub fn set_ports(&self, ports: Vec<u16>) {
        *self
            .ports
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = ports;
    }

    /// The ports the egress network's firewall redirects to (sandboxd's proxy and resolver).
    pub fn set_redirect(&self, to: Redirect) {
        *self
            .redirect
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(to);
    }

    fn redirect(&self) -> Option<Redirect> {
        *self
            .redirect
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the network and its firewall are set up (and not found gone since).
    pub async fn is_installed(&self) -> bool {
        self.installed.lock().await.is_some()
    }

    /// Makes the Docker network when it is missing (no firewall yet) and returns it: the
    /// egress network's listeners bind its gateway address before its firewall points at them.
    pub async fn prepare(&self) -> Result<Ready, NetworkError> {
        self.network().await
    }

    fn ports(&self) -> Vec<u16> {
        self.ports
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// What is missing from the firewall of a network that was set up, while it is missing
    /// (found by a check and not yet installed again); `None` when it is whole or no network
    /// was set up.
    pub fn problem(&self) -> Option<String> {
        self.problem
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_problem(&self, problem: Option<String>) {
        *self
            .problem
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = problem;
    }

    /// Whether the network is there already (sandboxes of an earlier run may be on it).
    pub async fn exists(&self) -> Result<bool, NetworkError> {
        if self.engine.is_noop() {
            return Ok(false);
        }
        match self
            .engine
            .docker()?
            .client()
            .inspect_network(&self.plan.network, None)
            .await
        {
            Ok(_) => Ok(true),
            Err(source) => {
                let e = crate::container::DockerError {
                    action: format!("inspect network {}", self.plan.network),
                    source,
                };
                if e.is_not_found() {
                    Ok(false)
                } else {
                    Err(e.into())
                }
            }
        }
    }

    /// Makes the network when it is missing, checks that the node isolates it, and installs
    /// the firewall; once done, answers from memory (the guard keeps the firewall whole).
    /// Returns the network's name.
    pub async fn ensure(&self) -> Result<String, NetworkError> {
        let mut installed = self.installed.lock().await;
        if let Some(i) = installed.as_ref() {
            return Ok(i.ready.network.clone());
        }
        if self.engine.is_noop() {
            // The operator bench's engine runs nothing; there is nothing to fence in.
            return Ok(self.plan.network.clone());
        }
        let made = self.network().await?;
        let ports = self.ports();
        let node = node_addresses(&self.plan.deny);
        let done = self.firewall(made, &ports, node).await?;
        info!(network = %done.ready.network, bridge = %done.ready.bridge, ?ports, deny = ?self.plan.deny, node = ?done.node, "sandbox network ready");
        let name = done.ready.network.clone();
        *installed = Some(done);
        self.set_problem(None);
        Ok(name)
    }

    /// Looks at the firewall of the network set up by [`SandboxNetwork::ensure`]: its chains
    /// as installed, its jumps first in their chains, the node's addresses the same. Whatever
    /// is off is installed again; while that fails, [`SandboxNetwork::problem`] names what is
    /// missing. A network whose bridge is gone is forgotten ([`Healed::Gone`]).
    pub async fn heal(&self) -> Result<Healed, NetworkError> {
        let mut installed = self.installed.lock().await;
        let Some(current) = installed.clone() else {
            return Ok(Healed::NotSetUp);
        };
        if !Path::new("/sys/class/net")
            .join(&current.ready.bridge)
            .exists()
        {
            *installed = None;
            self.set_problem(None);
            return Ok(Healed::Gone);
        }
        let node = node_addresses(&self.plan.deny);
        let problems = self.problems(&current).await;
        if problems.is_empty() && node == current.node {
            self.set_problem(None);
            return Ok(Healed::Intact);
        }
        if !problems.is_empty() {
            self.set_problem(Some(problems.join("; ")));
        }
        let ports = self.ports();
        let redone = match self.network().await {
            Ok(made) => self.firewall(made, &ports, node.clone()).await,
            Err(e) => Err(e),
        };
        match redone {
            Ok(done) => {
                *installed = Some(done);
                self.set_problem(None);
                Ok(if problems.is_empty() {
                    Healed::Updated(node)
                } else {
                    Healed::Repaired(problems)
                })
            }
            Err(e) => {
                let what = if problems.is_empty() {
                    "the node's addresses changed".to_owned()
                } else {
                    problems.join("; ")
                };
                self.set_problem(Some(format!("{what}; installing it again failed: {e}")));
                Err(e)
            }
        }
    }

    /// What is wrong with the firewall against `installed`; empty when nothing is.
    async fn problems(&self, installed: &Installed) -> Vec<String> {
        let plan = &self.plan;
        let bridge = &installed.ready.bridge;
        let mut problems = match Table::read(&plan.iptables, "filter").await {
            Ok(t) => t.problems(plan, bridge, &installed.v4),
            Err(e) => vec![e],
        };
        if let Some(chain) = &plan.nat_chain {
            match Table::read(&plan.iptables, "nat").await {
                Ok(t) => problems.extend(t.nat_problems(chain, bridge, &installed.nat)),
                Err(e) => problems.push(e),
            }
        }
        if let Some(v6) = &installed.v6 {
            match Table::read(&plan.ip6tables, "filter").await {
                Ok(t) => problems.extend(
                    t.problems(plan, bridge, v6)
                        .into_iter()
                        .map(|p| format!("IPv6: {p}")),
                ),
                Err(e) => problems.push(e),
            }
        }
        problems
    }

    /// The Docker network: made when missing, checked when present.
    async fn network(&self) -> Result<Ready, NetworkError> {
        let docker = self.engine.docker()?.client();
        let name = &self.plan.network;
        let found = match docker.inspect_network(name, None).await {
            Ok(n) => Some(n),
            Err(e) => {
                let e = crate::container::DockerError {
                    action: format!("inspect network {name}"),
                    source: e,
                };
                if !e.is_not_found() {
                    return Err(e.into());
                }
                None
            }
        };
        let network = match found {
            Some(n) => n,
            None => {
                let request = NetworkCreateRequest {
                    name: name.clone(),
                    driver: Some("bridge".to_owned()),
                    internal: Some(false),
                    attachable: Some(false),
                    enable_ipv6: Some(false),
                    options: Some(HashMap::from([
                        (ICC_OPTION.to_owned(), "false".to_owned()),
                        (BRIDGE_NAME_OPTION.to_owned(), self.plan.bridge.clone()),
                    ])),
                    labels: Some(HashMap::from([
                        (LABEL_MANAGED.to_owned(), "sandboxd".to_owned()),
                        (LABEL_INSTANCE.to_owned(), self.plan.instance.clone()),
                    ])),
                    ..Default::default()
                };
                docker.create_network(request).await.map_err(|source| {
                    crate::container::DockerError {
                        action: format!("create network {name}"),
                        source,
                    }
                })?;
                info!(network = %name, bridge = %self.plan.bridge, "sandbox network created");
                docker.inspect_network(name, None).await.map_err(|source| {
                    crate::container::DockerError {
                        action: format!("inspect network {name}"),
                        source,
                    }
                })?
            }
        };
        let foreign = |problem: String| NetworkError::Foreign {
            name: name.clone(),
            problem,
        };
        let labels = network.labels.clone().unwrap_or_default();
        if labels.get(LABEL_INSTANCE) != Some(&self.plan.instance) {
            return Err(foreign(format!(
                "is not labelled as this sandboxd's ({LABEL_INSTANCE}={})",
                self.plan.instance
            )));
        }
        if network.driver.as_deref() != Some("bridge") {
            return Err(foreign(format!(
                "uses the driver {:?}, not bridge",
                network.driver.unwrap_or_default()
            )));
        }
        let options = network.options.clone().unwrap_or_default();
        if options.get(ICC_OPTION).map(String::as_str) != Some("false") {
            return Err(foreign(format!(
                "lets its containers reach each other ({ICC_OPTION} is not false)"
            )));
        }
        let id = network.id.clone().unwrap_or_default();
        // Docker names an unnamed bridge br-<first 12 characters of the id>.
        let bridge = options
            .get(BRIDGE_NAME_OPTION)
            .cloned()
            .unwrap_or_else(|| format!("br-{}", id.get(..12).unwrap_or(&id)));
        let gateway = network
            .ipam
            .as_ref()
            .and_then(|i| i.config.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|c| c.gateway.as_deref())
            .find_map(|g| g.parse::<Ipv4Addr>().ok());
        Ok(Ready {
            network: name.clone(),
            id,
            bridge,
            gateway,
        })
    }

    /// Checks that this process sees the bridge and that bridged traffic passes iptables,
    /// then installs the chains and the jumps to them, each first in its chain. Returns what
    /// it installed, as the tables print it.
    async fn firewall(
        &self,
        made: Ready,
        ports: &[u16],
        node: Vec<Ipv4Addr>,
    ) -> Result<Installed, NetworkError> {
        let fail = |message: String| NetworkError::Firewall {
            network: made.network.clone(),
            bridge: made.bridge.clone(),
            message,
        };
        if !Path::new("/sys/class/net").join(&made.bridge).exists() {
            return Err(fail(format!(
                "sandboxd does not see the bridge {} (/sys/class/net/{} is missing): it runs outside the node's network namespace, where its rules would fence in nothing",
                made.bridge, made.bridge
            )));
        }
        match std::fs::read_to_string(BRIDGE_NF) {
            Ok(v) if v.trim() == "1" => {}
            Ok(v) => {
                return Err(fail(format!(
                    "{BRIDGE_NF} is {}, so traffic between two sandboxes on the bridge bypasses iptables and {ICC_OPTION}=false does not hold (load br_netfilter and set it to 1)",
                    v.trim()
                )));
            }
            Err(e) => {
                return Err(fail(format!(
                    "cannot read {BRIDGE_NF} ({e}), so traffic between two sandboxes on the bridge would bypass iptables (load the br_netfilter module)"
                )));
            }
        }
        let plan = &self.plan;
        let rules = match &plan.nat_chain {
            None => plan.ipv4_rules(ports, &node),
            Some(nat) => {
                let to = self.redirect().ok_or_else(|| {
                    fail("the egress proxy and resolver are not listening yet".to_owned())
                })?;
                plan.egress_rules(nat, to)
            }
        };
        restore(&plan.iptables, &rules).await.map_err(&fail)?;
        install_jumps(&plan.iptables, plan, &made.bridge)
            .await
            .map_err(&fail)?;
        let v4 = Table::read(&plan.iptables, "filter")
            .await
            .map_err(&fail)?
            .chains(plan);
        let nat = match &plan.nat_chain {
            Some(chain) => Table::read(&plan.iptables, "nat")
                .await
                .map_err(&fail)?
                .rules(chain)
                .unwrap_or_default()
                .to_vec(),
            None => Vec::new(),
        };
        let v6 = if Path::new("/proc/net/if_inet6").exists() {
            restore(&plan.ip6tables, &plan.ipv6_rules())
                .await
                .map_err(&fail)?;
            install_jumps(&plan.ip6tables, plan, &made.bridge)
                .await
                .map_err(&fail)?;
            Some(
                Table::read(&plan.ip6tables, "filter")
                    .await
                    .map_err(&fail)?
                    .chains(plan),
            )
        } else {
            None
        };
        Ok(Installed {
            ready: made,
            node,
            v4,
            v6,
            nat,
        })
    }

    /// Removes the firewall (jumps and chains) and the network; what an uninstall does, once
    /// no container of this instance is left on it. Whatever is already gone is fine.
    pub async fn remove(&self) -> Result<(), NetworkError> {
        let plan = &self.plan;
        let fail = |message: String| NetworkError::Firewall {
            network: plan.network.clone(),
            bridge: plan.bridge.clone(),
            message,
        };
        let docker = self.engine.docker()?.client();
        match docker.inspect_network(&plan.network, None).await {
            Ok(n) => {
                if n.labels.unwrap_or_default().get(LABEL_INSTANCE) != Some(&plan.instance) {
                    return Err(NetworkError::Foreign {
                        name: plan.network.clone(),
                        problem: format!(
                            "is not labelled as this sandboxd's ({LABEL_INSTANCE}={}), so it is left alone",
                            plan.instance
                        ),
                    });
                }
                let attached = n.containers.unwrap_or_default();
                if !attached.is_empty() {
                    return Err(NetworkError::Invalid(format!(
                        "Docker network '{}' still has {} container(s) on it; destroy the sessions first",
                        plan.network,
                        attached.len()
                    )));
                }
                docker
                    .remove_network(&plan.network)
                    .await
                    .map_err(|source| crate::container::DockerError {
                        action: format!("remove network {}", plan.network),
                        source,
                    })?;
            }
            Err(source) => {
                let e = crate::container::DockerError {
                    action: format!("inspect network {}", plan.network),
                    source,
                };
                if !e.is_not_found() {
                    return Err(e.into());
                }
            }
        }
        let mut commands = vec![plan.iptables.as_str()];
        if Path::new("/proc/net/if_inet6").exists() {
            commands.push(plan.ip6tables.as_str());
        }
        for cmd in commands {
            let mut chains = vec![
                (
                    "filter",
                    &plan.input_chain,
                    &["INPUT", "FORWARD", "DOCKER-USER"][..],
                ),
                (
                    "filter",
                    &plan.forward_chain,
                    &["INPUT", "FORWARD", "DOCKER-USER"][..],
                ),
            ];
            if let Some(nat) = &plan.nat_chain
                && !cmd.contains("ip6tables")
            {
                chains.push(("nat", nat, &["PREROUTING"][..]));
            }
            for (table, chain, froms) in chains {
                for from in froms {
                    for rule in jumps_to(cmd, table, from, chain).await {
                        delete(cmd, table, &rule).await.map_err(&fail)?;
                    }
                }
                if run(cmd, &["-w", "-t", table, "-n", "-L", chain])
                    .await
                    .is_ok()
                {
                    run(cmd, &["-w", "-t", table, "-F", chain])
                        .await
                        .map_err(&fail)?;
                    run(cmd, &["-w", "-t", table, "-X", chain])
                        .await
                        .map_err(&fail)?;
                }
            }
        }
        info!(network = %plan.network, "sandbox network and its firewall removed");
        Ok(())
    }
}

/// Runs an iptables command; its stderr (or that it is missing) when it fails.
async fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .await
        .map_err(|e| describe_spawn(cmd, &e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{cmd} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn describe_spawn(cmd: &str, e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::NotFound {
        format!("the command `{cmd}` is not installed")
    } else {
        format!("cannot run `{cmd}`: {e}")
    }
}

/// Feeds `rules` to `<cmd>-restore --noflush`: the chains it declares are made or emptied and
/// refilled in one transaction; nothing else is touched.
async fn restore(cmd: &str, rules: &str) -> Result<(), String> {
    use tokio::io::AsyncWriteExt;
    let restore = format!("{cmd}-restore");
    let mut child = Command::new(&restore)
        .args(["-w", "--noflush"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| describe_spawn(&restore, &e))?;
    // A command that ends before reading all its input (it refused the rules, or is not the
    // real iptables) breaks the pipe; what it printed says why better than the broken pipe, so
    // the write's error is kept only for a command that then exits 0.
    let written = match child.stdin.take() {
        Some(mut stdin) => stdin.write_all(rules.as_bytes()).await,
        None => Ok(()),
    };
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| format!("`{restore}` did not finish: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`{restore} --noflush` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    written.map_err(|e| format!("cannot write to `{restore}`: {e}"))
}

/// The rules of `from` that jump to `chain`, as `iptables -S` prints them.
async fn jumps_to(cmd: &str, table: &str, from: &str, chain: &str) -> Vec<String> {
    let target = format!("-j {chain}");
    run(cmd, &["-w", "-t", table, "-S", from])
        .await
        .map(|out| {
            out.lines()
                .filter(|l| l.ends_with(&target) || l.contains(&format!("{target} ")))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Deletes a rule as `iptables -S` printed it (`-A CHAIN …`).
async fn delete(cmd: &str, table: &str, rule: &str) -> Result<(), String> {
    let deleted = rule.replacen("-A ", "-D ", 1);
    let mut args = vec!["-w", "-t", table];
    args.extend(deleted.split_whitespace());
    run(cmd, &args).await.map(|_| ())
}

/// The rules of chain `from` as `iptables -S` prints them (`-A CHAIN …`).
async fn rules_of(cmd: &str, table: &str, from: &str) -> Result<Vec<String>, String> {
    Ok(run(cmd, &["-w", "-t", table, "-S", from])
        .await?
        .lines()
        .filter(|l| l.starts_with("-A "))
        .map(str::to_owned)
        .collect())
}

/// Whether `wanted` is in effect first in `rules`: only jumps of other sandboxd instances
/// stand above it (each for traffic from its own bridge into its own chain, which only drops
/// or returns: they never accept this bridge's traffic, and two instances never fight over
/// the first place), or, with `after_docker`, Docker's own jump to `DOCKER-USER` comes first
/// (Docker puts it first in FORWARD again whenever it makes a network, and its own rules for
/// a new network above the others; `DOCKER-USER` jumps to sandboxd's chain first).
fn in_place(rules: &[String], from: &str, wanted: &str, after_docker: bool) -> bool {
    let docker = format!("-A {from} -j DOCKER-USER");
    let another_instance = |rule: &str| {
        let words: Vec<&str> = rule.split_whitespace().collect();
        matches!(
            words.as_slice(),
            ["-A", chain, "-i", bridge, "-j", target]
                if *chain == from && (bridge.starts_with("sbx-") || bridge.starts_with("sbe-")) && target.starts_with("SANDBOXD-")
        )
    };
    for rule in rules {
        if rule == wanted || (after_docker && *rule == docker) {
            return true;
        }
        if !another_instance(rule) {
            return false;
        }
    }
    false
}

/// Makes `from` jump to `chain` for traffic in from `bridge`, as its first rule (see
/// [`in_place`] for what may stand above it): a jump in its place stays; otherwise the jumps
/// to `chain` there (one lower down, a second one, one for another interface: an earlier
/// bridge) are removed and the jump inserted first in one `iptables-restore` transaction, so
/// no packet ever passes while the jump is away.
async fn jump(
    cmd: &str,
    (table, from): (&str, &str),
    bridge: &str,
    chain: &str,
    after_docker: bool,
) -> Result<(), String> {
    let wanted = format!("-A {from} -i {bridge} -j {chain}");
    let rules = rules_of(cmd, table, from).await?;
    let mine = jumps_to(cmd, table, from, chain).await;
    if mine.len() == 1 && in_place(&rules, from, &wanted, after_docker) {
        return Ok(());
    }
    let mut moved = format!("*{table}\n");
    for rule in mine {
        moved.push_str(&rule.replacen("-A ", "-D ", 1));
        moved.push('\n');
    }
    moved.push_str(&format!("-I {from} 1 -i {bridge} -j {chain}\nCOMMIT\n"));
    restore(cmd, &moved).await
}

/// The jumps of one family (`cmd`: iptables or ip6tables): INPUT to the input chain, and to
/// the forward chain from `DOCKER-USER` (when Docker keeps it) and from FORWARD.
async fn install_jumps(cmd: &str, plan: &Plan, bridge: &str) -> Result<(), String> {
    jump(cmd, ("filter", "INPUT"), bridge, &plan.input_chain, false).await?;
    let docker_user = run(cmd, &["-w", "-n", "-L", "DOCKER-USER"]).await.is_ok();
    if docker_user {
        jump(
            cmd,
            ("filter", "DOCKER-USER"),
            bridge,
            &plan.forward_chain,
            false,
        )
        .await?;
    }
    jump(
        cmd,
        ("filter", "FORWARD"),
        bridge,
        &plan.forward_chain,
        docker_user,
    )
    .await?;
    // The egress network's redirects (IPv4 only: its IPv6 is dropped whole).
    if let Some(nat) = &plan.nat_chain
        && !cmd.contains("ip6tables")
    {
        jump(cmd, ("nat", "PREROUTING"), bridge, nat, false).await?;
    }
    Ok(())
}

/// The filter table of one family as `<cmd>-save -t filter` prints it: each chain's rules,
/// in order.
#[derive(Debug, Default)]
struct Table(HashMap<String, Vec<String>>);

impl Table {
    async fn read(cmd: &str, table: &str) -> Result<Self, String> {
        let save = format!("{cmd}-save");
        let out = Command::new(&save)
            .args(["-t", table])
            .output()
            .await
            .map_err(|e| describe_spawn(&save, &e))?;
        if !out.status.success() {
            return Err(format!(
                "`{save} -t {table}` failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Self::parse(&String::from_utf8_lossy(&out.stdout)))
    }

    fn parse(text: &str) -> Self {
        let mut chains: HashMap<String, Vec<String>> = HashMap::new();
        for line in text.lines().map(str::trim_end) {
            if let Some(rest) = line.strip_prefix(':') {
                if let Some(name) = rest.split_whitespace().next() {
                    chains.entry(name.to_owned()).or_default();
                }
            } else if let Some(rest) = line.strip_prefix("-A ")
                && let Some(name) = rest.split_whitespace().next()
            {
                chains
                    .entry(name.to_owned())
                    .or_default()
                    .push(line.to_owned());
            }
        }
        Self(chains)
    }

    fn rules(&self, chain: &str) -> Option<&[String]> {
        self.0.get(chain).map(Vec::as_slice)
    }

    /// What differs in the nat table from the egress network's chain as installed.
    fn nat_problems(&self, chain: &str, bridge: &str, expected: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        match self.rules(chain) {
            None => out.push(format!("the chain {chain} is missing")),
            Some(have) if have != expected => out.push(format!(
                "the chain {chain} was changed ({} rules, {} installed)",
                have.len(),
                expected.len()
            )),
            Some(_) => {}
        }
        let wanted = format!("-A PREROUTING -i {bridge} -j {chain}");
        let rules = self.rules("PREROUTING").unwrap_or_default();
        if !rules.contains(&wanted) {
            out.push(format!(
                "PREROUTING does not jump to {chain} for traffic from {bridge}"
            ));
        } else if !in_place(rules, "PREROUTING", &wanted, false) {
            out.push(format!(
                "PREROUTING's jump to {chain} is not its first rule"
            ));
        }
        out
    }

    /// sandboxd's two chains as this table holds them.
    fn chains(&self, plan: &Plan) -> Chains {
        Chains {
            input: self.rules(&plan.input_chain).unwrap_or_default().to_vec(),
            forward: self.rules(&plan.forward_chain).unwrap_or_default().to_vec(),
            docker_user: self.rules("DOCKER-USER").is_some(),
        }
    }

    /// What differs from the firewall as installed (`expected`), one sentence per problem;
    /// empty when nothing does.
    fn problems(&self, plan: &Plan, bridge: &str, expected: &Chains) -> Vec<String> {
        let mut out = Vec::new();
        for (chain, want) in [
            (&plan.input_chain, &expected.input),
            (&plan.forward_chain, &expected.forward),
        ] {
            match self.rules(chain) {
                None => out.push(format!("the chain {chain} is missing")),
                Some(have) if have != want.as_slice() => out.push(format!(
                    "the chain {chain} was changed ({} rules, {} installed)",
                    have.len(),
                    want.len()
                )),
                Some(_) => {}
            }
        }
        let docker_user = expected.docker_user;
        let mut jumps = vec![("INPUT", &plan.input_chain, false)];
        if docker_user {
            jumps.push(("DOCKER-USER", &plan.forward_chain, false));
        }
        jumps.push(("FORWARD", &plan.forward_chain, docker_user));
        for (from, chain, after_docker) in jumps {
            let wanted = format!("-A {from} -i {bridge} -j {chain}");
            let rules = self.rules(from).unwrap_or_default();
            if !rules.contains(&wanted) {
                out.push(format!(
                    "{from} does not jump to {chain} for traffic from {bridge}"
                ));
            } else if !in_place(rules, from, &wanted, after_docker) {
                // The first rule above it that may not stand there.
                let above = rules
                    .iter()
                    .take_while(|r| **r != wanted)
                    .find(|r| {
                        !in_place(&[(*r).clone(), wanted.clone()], from, &wanted, after_docker)
                    })
                    .map(String::as_str)
                    .unwrap_or_default();
                out.push(format!(
                    "{from}'s jump to {chain} is not its first rule (above it: `{above}`)"
                ));
            }
        }
        out
    }
}

/// Heals the firewall of `network` every `period`, and soon after each Docker network event
/// (Docker rewrites its own rules when it makes a network) and after the event stream breaks
/// (a Docker restart rewrites them all): what was repaired is counted in `repairs` and
/// logged; `intact` is 1 while nothing is missing.
pub fn spawn_guard(
    network: Arc<SandboxNetwork>,
    period: Duration,
    repairs: Counter,
    intact: Gauge,
) -> tokio::task::JoinHandle<()> {
    let nudge = Arc::new(tokio::sync::Notify::new());
    if !network.engine.is_noop() {
        tokio::spawn(watch_events(network.clone(), nudge.clone()));
    }
    tokio::spawn(async move {
        intact.set(1);
        loop {
            tokio::select! {
                () = tokio::time::sleep(period) => {}
                () = nudge.notified() => {
                    // A burst of events (a network made, containers attached) is one look.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            match network.heal().await {
                Ok(Healed::NotSetUp | Healed::Intact) => {
                    intact.set(1);
                }
                Ok(Healed::Gone) => {
                    intact.set(1);
                    info!(network = %network.plan.network, "the sandbox network is gone; the next open of a runtime with network makes it again");
                }
                Ok(Healed::Repaired(problems)) => {
                    repairs.inc();
                    intact.set(1);
                    warn!(network = %network.plan.network, ?problems, "the sandbox network's firewall was changed behind sandboxd's back; installed again");
                }
                Ok(Healed::Updated(node)) => {
                    intact.set(1);
                    info!(network = %network.plan.network, ?node, "the node's addresses changed; the sandbox network's firewall drops the new ones");
                }
                Err(e) => {
                    intact.set(0);
                    warn!(network = %network.plan.network, error = %e, "the sandbox network's firewall is not whole and cannot be installed again");
                }
            }
        }
    })
}

/// Nudges `nudge` at each network event Docker reports and whenever the stream ends or fails
/// (Docker restarted); subscribes again after a pause that doubles up to 30 s while Docker
/// does not answer.
async fn watch_events(network: Arc<SandboxNetwork>, nudge: Arc<tokio::sync::Notify>) {
    let mut pause = Duration::from_secs(1);
    loop {
        if let Ok(docker) = network.engine.docker().map(DockerEngine::client) {
            let filters = HashMap::from([("type", vec!["network"])]);
            let options = bollard::query_parameters::EventsOptionsBuilder::default()
                .filters(&filters)
                .build();
            let mut events = std::pin::pin!(docker.events(Some(options)));
            while let Some(event) = events.next().await {
                match event {
                    Ok(_) => {
                        pause = Duration::from_secs(1);
                        nudge.notify_one();
                    }
                    Err(_) => break,
                }
            }
        }
        nudge.notify_one();
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(30));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan::new("node-a", "", "iptables", DEFAULT_DENY).expect("valid")
    }

    #[test]
    fn names_come_from_the_instance_and_fit_the_kernel_limits() {
        let p = plan();
        assert_eq!(p.network, "sandboxd-node-a-net");
        assert!(
            p.bridge.starts_with("sbx-") && p.bridge.len() <= 15,
            "{}",
            p.bridge
        );
        assert!(p.input_chain.len() <= 28 && p.forward_chain.len() <= 28);
        assert_ne!(
            p.bridge,
            Plan::new("node-b", "", "iptables", "")
                .expect("valid")
                .bridge
        );
        assert_eq!(p.ip6tables, "ip6tables");
        assert_eq!(
            Plan::new("x", "mine", "/usr/sbin/iptables-legacy", "")
                .expect("valid")
                .ip6tables,
            "/usr/sbin/ip6tables-legacy"
        );
        assert_eq!(
            Plan::new("x", "mine", "iptables", "")
                .expect("valid")
                .network,
            "mine"
        );
    }

    #[test]
    fn docker_networks_and_bad_ranges_are_refused() {
        for bad in ["bridge", "host", "none", "container:abc"] {
            let e = Plan::new("x", bad, "iptables", "")
                .expect_err(bad)
                .to_string();
            assert!(e.contains("one of Docker's own network modes"), "{e}");
        }
        let e = Plan::new("x", "", "iptables", "10.0.0.0/8, 300.1.1.1/8")
            .expect_err("bad range")
            .to_string();
        assert_eq!(
            e,
            "SANDBOXD_NETWORK_DENY: '300.1.1.1/8' is not an IPv4 range (a.b.c.d/n)"
        );
        assert!(Plan::new("x", "", " ", "").is_err());
        assert_eq!(
            Plan::new("x", "", "iptables", "10.1.2.3/8,1.2.3.4")
                .expect("valid")
                .deny,
            ["10.0.0.0/8", "1.2.3.4/32"]
        );
    }

    #[test]
    fn the_chains_drop_the_port_the_node_and_the_denied_ranges() {
        let p = plan();
        let (i, f) = (&p.input_chain, &p.forward_chain);
        assert_eq!(
            p.ipv4_rules(&[8080], &[Ipv4Addr::new(198, 18, 0, 7)]),
            format!(
                "*filter\n:{i} - [0:0]\n:{f} - [0:0]\n\
                 -A {i} -p tcp --dport 8080 -j DROP\n\
                 -A {i} -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN\n\
                 -A {i} -j DROP\n\
                 -A {f} -d 169.254.0.0/16 -j DROP\n\
                 -A {f} -d 10.0.0.0/8 -j DROP\n\
                 -A {f} -d 172.16.0.0/12 -j DROP\n\
                 -A {f} -d 192.168.0.0/16 -j DROP\n\
                 -A {f} -d 100.64.0.0/10 -j DROP\n\
                 -A {f} -m conntrack --ctorigdst 198.18.0.7/32 -j DROP\n\
                 COMMIT\n"
            )
        );
        assert_eq!(
            p.ipv6_rules(),
            format!(
                "*filter\n:{i} - [0:0]\n:{f} - [0:0]\n-A {i} -j DROP\n-A {f} -j DROP\nCOMMIT\n"
            )
        );
    }

    #[test]
    fn the_egress_network_redirects_every_tcp_connection_and_dns_and_forwards_nothing() {
        let p = Plan::egress("node-a", "iptables", DEFAULT_DENY).expect("valid");
        let open = plan();
        assert_eq!(p.network, "sandboxd-node-a-egress");
        assert_eq!(p.bridge, open.bridge.replace("sbx-", "sbe-"));
        assert!(p.bridge.len() <= 15 && p.input_chain.len() <= 28 && p.forward_chain.len() <= 28);
        let nat = p.nat_chain.clone().expect("a nat chain");
        assert!(nat.len() <= 28, "{nat}");
        assert_eq!(open.nat_chain, None, "the open network redirects nothing");
        let (i, f) = (&p.input_chain, &p.forward_chain);
        assert_eq!(
            p.egress_rules(
                &nat,
                Redirect {
                    proxy: 4001,
                    dns: 4002
                }
            ),
            format!(
                "*filter\n:{i} - [0:0]\n:{f} - [0:0]\n\
                 -A {i} -p tcp --dport 4001 -j ACCEPT\n\
                 -A {i} -p udp --dport 4002 -j ACCEPT\n\
                 -A {i} -p tcp --dport 4002 -j ACCEPT\n\
                 -A {i} -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN\n\
                 -A {i} -j DROP\n\
                 -A {f} -j DROP\n\
                 COMMIT\n\
                 *nat\n:{nat} - [0:0]\n\
                 -A {nat} -p udp --dport 53 -j REDIRECT --to-ports 4002\n\
                 -A {nat} -p tcp --dport 53 -j REDIRECT --to-ports 4002\n\
                 -A {nat} -p tcp -j REDIRECT --to-ports 4001\n\
                 COMMIT\n"
            )
        );
        // A check names a flushed nat chain and a missing jump.
        let bridge = &p.bridge;
        let whole = Table::parse(&format!(
            "*nat\n:PREROUTING ACCEPT [0:0]\n:{nat} - [0:0]\n-A PREROUTING -i {bridge} -j {nat}\n\
             -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n-A {nat} -p tcp -j REDIRECT --to-ports 4001\nCOMMIT\n"
        ));
        let installed = whole.rules(&nat).expect("the chain").to_vec();
        assert!(whole.nat_problems(&nat, bridge, &installed).is_empty());
        let flushed = Table::parse(&format!(
            "*nat\n:PREROUTING ACCEPT [0:0]\n:{nat} - [0:0]\n-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\nCOMMIT\n"
        ));
        assert_eq!(
            flushed.nat_problems(&nat, bridge, &installed),
            [
                format!("the chain {nat} was changed (0 rules, 1 installed)"),
                format!("PREROUTING does not jump to {nat} for traffic from {bridge}"),
            ]
        );
    }

    #[test]
    fn the_node_addresses_leave_out_loopback_and_what_a_range_denies() {
        let deny = plan().deny;
        assert!(range_holds("10.0.0.0/8", Ipv4Addr::new(10, 9, 8, 7)));
        assert!(!range_holds("10.0.0.0/8", Ipv4Addr::new(11, 0, 0, 1)));
        assert!(range_holds("0.0.0.0/0", Ipv4Addr::new(8, 8, 8, 8)));
        assert!(range_holds("1.2.3.4/32", Ipv4Addr::new(1, 2, 3, 4)));
        let node = node_addresses(&deny);
        assert!(node.iter().all(|a| !a.is_loopback()), "{node:?}");
        assert!(
            node.iter()
                .all(|a| !deny.iter().any(|r| range_holds(r, *a))),
            "{node:?}"
        );
        assert!(node.windows(2).all(|w| w[0] < w[1]), "sorted, once each");
    }

    /// A table as `iptables-save -t filter` prints it, with sandboxd's rules installed.
    fn saved(p: &Plan, input_first: &str, forward_first: &[&str], fwd_rules: &str) -> Table {
        let (i, f) = (&p.input_chain, &p.forward_chain);
        let bridge = &p.bridge;
        let forward: String = forward_first.iter().map(|r| format!("{r}\n")).collect();
        Table::parse(&format!(
            "# Generated by iptables-save\n*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n\
             :DOCKER-USER - [0:0]\n:{i} - [0:0]\n:{f} - [0:0]\n\
             {input_first}\n-A INPUT -i {bridge} -j {i}\n\
             {forward}-A FORWARD -i {bridge} -j {f}\n-A FORWARD -j DOCKER-ISOLATION\n\
             -A DOCKER-USER -i {bridge} -j {f}\n-A DOCKER-USER -j RETURN\n\
             -A {i} -j DROP\n{fwd_rules}COMMIT\n"
        ))
    }

    #[test]
    fn a_check_names_a_flushed_chain_and_a_jump_pushed_down() {
        let p = plan();
        let (i, f) = (p.input_chain.clone(), p.forward_chain.clone());
        let rules = format!("-A {f} -d 10.0.0.0/8 -j DROP\n");
        // As installed, with Docker's jump to DOCKER-USER above sandboxd's in FORWARD.
        let whole = saved(&p, "", &["-A FORWARD -j DOCKER-USER"], &rules);
        let installed = whole.chains(&p);
        assert!(installed.docker_user);
        assert_eq!(installed.input, [format!("-A {i} -j DROP")]);
        assert_eq!(
            whole.problems(&p, &p.bridge, &installed),
            Vec::<String>::new()
        );

        // `iptables -I FORWARD 1 -j ACCEPT`, `-I INPUT 1 -j ACCEPT` and a flush of the forward
        // chain: each named.
        let attacked = saved(
            &p,
            "-A INPUT -j ACCEPT",
            &["-A FORWARD -j ACCEPT", "-A FORWARD -j DOCKER-USER"],
            "",
        );
        assert_eq!(
            attacked.problems(&p, &p.bridge, &installed),
            [
                format!("the chain {f} was changed (0 rules, 1 installed)"),
                format!(
                    "INPUT's jump to {i} is not its first rule (above it: `-A INPUT -j ACCEPT`)"
                ),
                format!(
                    "FORWARD's jump to {f} is not its first rule (above it: `-A FORWARD -j ACCEPT`)"
                ),
            ]
        );
        // A chain gone, and its jump with it.
        let gone = Table::parse(&format!(
            "*filter\n:INPUT ACCEPT [0:0]\n:{f} - [0:0]\n-A {f} -d 10.0.0.0/8 -j DROP\nCOMMIT\n"
        ));
        let found = gone.problems(&p, &p.bridge, &installed);
        assert_eq!(found[0], format!("the chain {i} is missing"));
        assert!(found.contains(&format!(
            "INPUT does not jump to {i} for traffic from {}",
            p.bridge
        )));
    }

    #[test]
    fn only_dockers_and_other_instances_jumps_may_stand_above_a_jump() {
        let w = "-A FORWARD -i sbx -j F".to_owned();
        let docker = "-A FORWARD -j DOCKER-USER".to_owned();
        let accept = "-A FORWARD -j ACCEPT".to_owned();
        assert!(in_place(std::slice::from_ref(&w), "FORWARD", &w, false));
        assert!(in_place(&[docker.clone(), w.clone()], "FORWARD", &w, true));
        assert!(!in_place(
            &[docker.clone(), w.clone()],
            "FORWARD",
            &w,
            false
        ));
        // Docker's rules for a network it made go above the others, below its jump.
        let dockers = "-A FORWARD -o sbx-new -j DOCKER".to_owned();
        assert!(in_place(
            &[docker.clone(), dockers.clone(), w.clone()],
            "FORWARD",
            &w,
            true
        ));
        assert!(!in_place(&[dockers, w.clone()], "FORWARD", &w, true));
        assert!(!in_place(&[accept, docker, w.clone()], "FORWARD", &w, true));
        assert!(!in_place(&[], "FORWARD", &w, true));
        // Another sandboxd's jump for its own bridge may stand above; a rule for this bridge
        // that is not sandboxd's may not.
        let other = "-A FORWARD -i sbx-other -j SANDBOXD-FWD-other".to_owned();
        assert!(in_place(&[other.clone(), w.clone()], "FORWARD", &w, false));
        let sneaky = "-A FORWARD -i sbx -j ACCEPT".to_owned();
        assert!(!in_place(&[sneaky, w.clone()], "FORWARD", &w, true));
    }
}
