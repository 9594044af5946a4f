//! Egress by policy: the only way out of a sandbox of an `allowlist` runtime is this room.
//!
//! Such sandboxes sit on a network of their own (`sandboxd-<instance>-egress`, see
//! [`crate::container::network`]) whose firewall redirects every TCP connection to the
//! [`proxy`] and every DNS query to the [`dns`] resolver, both listening on the bridge's
//! address, and drops everything else (UDP, ICMP, IPv6). Both ask the [`Gate`] whose sandbox
//! a packet came from (by its address on that network) and what that sandbox may reach:
//! its runtime's policy, read live from the runtimes sandboxd was handed, and every further
//! policy its open named (the session's own narrowing, its namespace's ceiling). A name or an
//! address is allowed only when all of them allow it, so a narrowing is exact without
//! computing an intersection, and a runtime edited to `none` closes its running sandboxes at
//! their next connection.
//!
//! What was allowed and refused is counted by runtime and verdict (`sandboxd_egress_*`) and
//! kept per session, name and minute ([`log`]), so a loop of refused connections is one row.
//!
//! The gate also holds each session's credentials (`PUT /v1/sessions/{id}/credentials`, in
//! memory only: never in the state database, the audit log or a log line): a header the proxy
//! sets on every request to a host and port a credential names, terminating the sandbox's
//! TLS there with a leaf of the node's egress CA ([`ca`]), which every sandbox trusts. A host
//! without a credential is never intercepted.

pub mod ca;
pub mod dns;
pub mod log;
pub mod proxy;
pub mod resolve;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, RwLock};

use sandboxd_api::egress::{CredentialSet, CredentialValue};
use sandboxd_catalog::egress::{Egress, EgressMode};

use crate::container::Engine;
use crate::metrics::{EgressLabels, Metrics};
use crate::runtimes::Runtimes;

/// What a sandbox on the egress network is to the gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The session (its id).
    pub session: String,
    /// Its runtime.
    pub runtime: String,
    /// The further policies its open named.
    pub extra: Vec<Egress>,
}

impl Principal {
    /// A label for refusals: the session and its runtime.
    pub fn describe(&self) -> String {
        format!("session {} (runtime {})", self.session, self.runtime)
    }
}

/// The policies a sandbox must satisfy all of: its runtime's (live) and its open's.
#[derive(Debug, Clone)]
pub struct Policies(Vec<Egress>);

impl Policies {
    /// Every policy allows the name to be resolved.
    pub fn allows_name(&self, name: &str) -> bool {
        self.0.iter().all(|p| p.allows_name(name))
    }

    /// Every policy allows a connection to `name` on `port`.
    pub fn allows(&self, name: &str, port: u16) -> bool {
        self.0.iter().all(|p| p.allows(name, port))
    }

    /// Every policy allows a connection to the address itself (a CIDR entry).
    pub fn allows_addr(&self, addr: IpAddr, port: u16) -> bool {
        self.0.iter().all(|p| p.allows_addr(addr, port))
    }

    /// Every policy lets a name resolve to this private, link-local or node address.
    pub fn cidr_allows(&self, addr: IpAddr, port: u16) -> bool {
        self.0.iter().all(|p| p.cidr_allows(addr, port))
    }

    /// Whether any of them is `none`: nothing at all may leave.
    pub fn is_closed(&self) -> bool {
        self.0.iter().any(|p| p.mode == EgressMode::None)
    }
}

/// Who is behind an address of the egress network, and what they may reach.
pub struct Gate {
    engine: Engine,
    runtimes: Arc<Runtimes>,
    metrics: Arc<Metrics>,
    /// The egress network's name (where addresses are looked up).
    network: String,
    /// The container name prefix of this instance's sessions (`sandboxd-<instance>-`).
    prefix: String,
    /// Sessions' runtimes and further policies, by session id: written at open, forgotten at
    /// destroy.
    sessions: RwLock<HashMap<String, (String, Vec<Egress>)>>,
    /// Addresses on the egress network to container names, as Docker last said; looked up
    /// again for an address not in it, and emptied at every network event (a container
    /// attached or gone).
    addresses: RwLock<HashMap<Ipv4Addr, String>>,
    /// The refusal and allowance log.
    pub log: log::EgressLog,
    /// What each address holds now: proxied connections and DNS queries in flight.
    held: Arc<std::sync::Mutex<HashMap<(IpAddr, Kind), usize>>>,
    /// Proxied connections one sandbox may hold at once.
    max_connections: usize,
    /// The credentials of each session (`PUT /v1/sessions/{id}/credentials`), by session id:
    /// in memory only, replaced whole, forgotten with the session.
    credentials: RwLock<HashMap<String, Arc<CredentialSet>>>,
    /// The node's egress CA, which the proxy terminates a sandbox's TLS with where a
    /// credential is added; `None`: nothing is intercepted (unit tests).
    ca: Option<Arc<ca::EgressCa>>,
}

/// DNS queries one sandbox may have in flight at once (each holds a socket to the upstream
/// for up to [`resolve::UPSTREAM_TIMEOUT`]); more are dropped, as a lost datagram.
pub const MAX_QUERIES_IN_FLIGHT: usize = 64;
/// Proxied connections one sandbox may hold at once by default
/// (`SANDBOXD_EGRESS_MAX_CONNECTIONS`): each holds two of sandboxd's descriptors.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// One connection or query of one address, counted while it lives.
pub struct Held {
    held: Arc<std::sync::Mutex<HashMap<(IpAddr, Kind), usize>>>,
    key: (IpAddr, Kind),
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut h = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = h.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                h.remove(&self.key);
            }
        }
    }
}

impl Gate {
    /// The gate of `network` for `instance`.
    pub fn new(
        engine: Engine,
        runtimes: Arc<Runtimes>,
        metrics: Arc<Metrics>,
        network: &str,
        instance: &str,
        log: log::EgressLog,
    ) -> Self {
        Self {
            engine,
            runtimes,
            metrics,
            network: network.to_owned(),
            prefix: format!("sandboxd-{instance}-"),
            sessions: RwLock::default(),
            addresses: RwLock::default(),
            log,
            held: Arc::default(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            credentials: RwLock::default(),
            ca: None,
        }
    }

    /// The gate with the node's egress CA: credentials can be added.
    pub fn with_ca(mut self, ca: Arc<ca::EgressCa>) -> Self {
        self.ca = Some(ca);
        self
    }

    /// The node's egress CA, if it has one.
    pub fn ca(&self) -> Option<&Arc<ca::EgressCa>> {
        self.ca.as_ref()
    }

    /// Replaces the credentials of `session` with `set`.
    pub fn set_credentials(&self, session: &str, set: CredentialSet) {
        self.credentials
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(session.to_owned(), Arc::new(set));
    }

    /// The credentials `session` holds now.
    pub fn credentials_of(&self, session: &str) -> Option<Arc<CredentialSet>> {
        self.credentials
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(session)
            .cloned()
    }

    /// The credential of `session` for `host` on `port` now (the first of its set that names
    /// them), read at each request so a rotation reaches connections already open.
    pub fn credential_for(&self, session: &str, host: &str, port: u16) -> Option<CredentialValue> {
        self.credentials_of(session)?
            .credentials
            .iter()
            .find(|c| c.host == host && c.effective_ports().contains(&port))
            .cloned()
    }

    /// Counts a credential added to a request.
    pub fn count_credential(&self, runtime: &str, source: &str) {
        self.metrics
            .egress_credentials_added
            .get_or_create(&crate::metrics::EgressCredentialLabels {
                runtime: runtime.to_owned(),
                source: source.to_owned(),
            })
            .inc();
    }

    /// The gate with another cap on proxied connections per sandbox.
    pub fn with_max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// Takes one of `addr`'s slots of `kind` (a proxied connection, a DNS query in flight);
    /// `None` when it holds its cap already, so one sandbox cannot take sandboxd's
    /// descriptors from the others.
    pub fn hold(&self, addr: IpAddr, kind: Kind) -> Option<Held> {
        let cap = match kind {
            Kind::Connection => self.max_connections,
            Kind::Query => MAX_QUERIES_IN_FLIGHT,
        };
        let mut h = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = h.entry((addr, kind)).or_default();
        if *n >= cap {
            return None;
        }
        *n += 1;
        Some(Held {
            held: self.held.clone(),
            key: (addr, kind),
        })
    }

    /// The cap on proxied connections per sandbox.
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// Records a session's runtime and the further policies its open named.
    pub fn register(&self, session: &str, runtime: &str, extra: Vec<Egress>) {
        self.sessions
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(session.to_owned(), (runtime.to_owned(), extra));
    }

    /// The further policies a session's open named, if it is registered.
    pub fn extra_of(&self, session: &str) -> Option<Vec<Egress>> {
        self.sessions
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(session)
            .map(|(_, extra)| extra.clone())
    }

    /// Forgets a destroyed session, and its credentials.
    pub fn forget(&self, session: &str) {
        self.sessions
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(session);
        self.credentials
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(session);
    }

    /// Forgets every address: a container joined or left the network.
    pub fn addresses_changed(&self) {
        self.addresses
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }

    /// The container on the egress network at `addr`, looked up in Docker when not known.
    async fn container_at(&self, addr: Ipv4Addr) -> Option<String> {
        if let Some(name) = self
            .addresses
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&addr)
        {
            return Some(name.clone());
        }
        let docker = self.engine.docker().ok()?.client();
        let network = docker.inspect_network(&self.network, None).await.ok()?;
        let mut found = HashMap::new();
        for endpoint in network.containers.unwrap_or_default().into_values() {
            let (Some(name), Some(ip)) = (endpoint.name, endpoint.ipv4_address) else {
                continue;
            };
            if let Some(Ok(ip)) = ip.split('/').next().map(str::parse::<Ipv4Addr>) {
                found.insert(ip, name);
            }
        }
        let name = found.get(&addr).cloned();
        *self
            .addresses
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = found;
        name
    }

    /// The session at `addr`. `None`: a warm container not yet taken, or nobody sandboxd
    /// knows; either may reach nothing.
    pub async fn principal(&self, addr: IpAddr) -> Option<Principal> {
        let IpAddr::V4(v4) = addr else {
            return None;
        };
        let name = self.container_at(v4).await?;
        let id = name.strip_prefix(&self.prefix)?;
        if let Some((runtime, extra)) = self
            .sessions
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(id)
        {
            return Some(Principal {
                session: id.to_owned(),
                runtime: runtime.clone(),
                extra: extra.clone(),
            });
        }
        // A warm pool's container (`warm-…`) runs only the agent until a session takes it:
        // it may reach nothing, like an address sandboxd does not know.
        None
    }

    /// The policies `who` must satisfy, its runtime's read now: an edited runtime counts at
    /// the next connection. A runtime no longer listed allows nothing.
    pub fn policies(&self, who: &Principal) -> Policies {
        let runtime = self
            .runtimes
            .egress_of(&who.runtime)
            .unwrap_or_else(Egress::none);
        let mut all = vec![runtime];
        all.extend(who.extra.iter().cloned());
        Policies(all)
    }

    /// Counts a connection's or query's verdict.
    pub fn count(&self, kind: Kind, runtime: &str, allowed: bool) {
        let labels = EgressLabels {
            runtime: runtime.to_owned(),
            verdict: if allowed { "allowed" } else { "denied" }.to_owned(),
        };
        match kind {
            Kind::Connection => self.metrics.egress_connections.get_or_create(&labels).inc(),
            Kind::Query => self.metrics.egress_queries.get_or_create(&labels).inc(),
        };
    }

    /// Counts bytes carried for a runtime's sandboxes.
    pub fn count_bytes(&self, runtime: &str, sent: u64, received: u64) {
        let out = crate::metrics::EgressBytesLabels {
            runtime: runtime.to_owned(),
            direction: "out".to_owned(),
        };
        let inn = crate::metrics::EgressBytesLabels {
            runtime: runtime.to_owned(),
            direction: "in".to_owned(),
        };
        self.metrics.egress_bytes.get_or_create(&out).inc_by(sent);
        self.metrics
            .egress_bytes
            .get_or_create(&inn)
            .inc_by(received);
    }
}

/// What a verdict was about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A TCP connection through the proxy.
    Connection,
    /// A DNS query.
    Query,
}

/// The egress network with its proxy and resolver: made at the first open of an `allowlist`
/// runtime (or at start when one is listed), the listeners bound on its bridge address before
/// its firewall redirects to them.
pub struct EgressNetwork {
    /// The Docker network and its firewall.
    pub network: Arc<crate::container::network::SandboxNetwork>,
    /// Who is who on it.
    pub gate: Arc<Gate>,
    upstream: Arc<resolve::Upstream>,
    ports: crate::container::network::Redirect,
    listening: tokio::sync::Mutex<Option<Listening>>,
}

struct Listening {
    gateway: Ipv4Addr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl EgressNetwork {
    /// The egress network of `network`'s plan, answering through `gate` and `upstream`, its
    /// listeners on `ports` (0: any free port).
    pub fn new(
        network: Arc<crate::container::network::SandboxNetwork>,
        gate: Arc<Gate>,
        upstream: Arc<resolve::Upstream>,
        ports: crate::container::network::Redirect,
    ) -> Self {
        Self {
            network,
            gate,
            upstream,
            ports,
            listening: tokio::sync::Mutex::default(),
        }
    }

    /// The bridge address its resolver listens on, once [`EgressNetwork::ensure`] bound it.
    pub async fn gateway(&self) -> Option<Ipv4Addr> {
        self.listening.lock().await.as_ref().map(|l| l.gateway)
    }

    /// The resolver its own asks (SANDBOXD_EGRESS_RESOLVER, or the node's).
    pub fn upstream(&self) -> std::net::SocketAddr {
        self.upstream.addr()
    }

    /// Makes the network, binds the proxy and the resolver on its bridge address and installs
    /// its firewall, once; returns the network's name.
    pub async fn ensure(&self) -> Result<String, crate::container::network::NetworkError> {
        use crate::container::network::{NetworkError, Redirect};
        let mut listening = self.listening.lock().await;
        if listening.is_some() && self.network.is_installed().await {
            return self.network.ensure().await;
        }
        if self.gate.engine.is_noop() {
            return self.network.ensure().await;
        }
        let ready = self.network.prepare().await?;
        let gateway = ready.gateway.ok_or_else(|| {
            NetworkError::Invalid(format!(
                "Docker network '{}' has no IPv4 gateway for the egress proxy to listen on",
                ready.network
            ))
        })?;
        if listening.as_ref().map(|l| l.gateway) != Some(gateway) {
            *listening = None;
            let bound = |what: &str, e: std::io::Error| {
                NetworkError::Invalid(format!(
                    "cannot listen for the egress {what} on {gateway}: {e}"
                ))
            };
            let proxy = tokio::net::TcpListener::bind((gateway, self.ports.proxy))
                .await
                .map_err(|e| bound("proxy", e))?;
            let udp = tokio::net::UdpSocket::bind((gateway, self.ports.dns))
                .await
                .map_err(|e| bound("resolver (UDP)", e))?;
            let dns_port = udp.local_addr().map_err(|e| bound("resolver", e))?.port();
            let tcp = tokio::net::TcpListener::bind((gateway, dns_port))
                .await
                .map_err(|e| bound("resolver (TCP)", e))?;
            let to = Redirect {
                proxy: proxy.local_addr().map_err(|e| bound("proxy", e))?.port(),
                dns: dns_port,
            };
            let serving = Arc::new(proxy::Proxy {
                gate: self.gate.clone(),
                upstream: self.upstream.clone(),
                deny: self.network.plan().deny.clone(),
            });
            let tasks = vec![
                tokio::spawn(serving.serve(proxy)),
                tokio::spawn(dns::serve_udp(
                    udp,
                    self.gate.clone(),
                    self.upstream.clone(),
                )),
                tokio::spawn(dns::serve_tcp(
                    tcp,
                    self.gate.clone(),
                    self.upstream.clone(),
                )),
                tokio::spawn(watch_addresses(self.gate.clone())),
            ];
            tracing::info!(network = %ready.network, %gateway, proxy = to.proxy, dns = to.dns, upstream = %self.upstream.addr(), "egress proxy and resolver listening");
            self.network.set_redirect(to);
            *listening = Some(Listening { gateway, tasks });
        }
        self.network.ensure().await
    }
}

/// Forgets the gate's addresses at every event of the egress network (a container attached
/// or detached), so an address given to another container is looked up again.
async fn watch_addresses(gate: Arc<Gate>) {
    use futures::StreamExt;
    loop {
        if let Ok(docker) = gate
            .engine
            .docker()
            .map(crate::container::docker::DockerEngine::client)
        {
            let filters = HashMap::from([
                ("type", vec!["network"]),
                ("network", vec![gate.network.as_str()]),
            ]);
            let options = bollard::query_parameters::EventsOptionsBuilder::default()
                .filters(&filters)
                .build();
            let mut events = std::pin::pin!(docker.events(Some(options)));
            while let Some(Ok(_)) = events.next().await {
                gate.addresses_changed();
            }
        }
        gate.addresses_changed();
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}
