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
//!   private and shared ranges by default), so what is left is the internet through Docker's NAT.
//!   IPv6 from the bridge is dropped altogether (the network carries none).
//! - The chains are rewritten whole (one `iptables-restore --noflush`), and the jumps to them
//!   checked before they are inserted, so setting up again never duplicates a rule; the jump
//!   into the forward chain sits in Docker's `DOCKER-USER` chain when Docker keeps one (Docker
//!   puts it first in FORWARD, before its own ACCEPT rules), else first in FORWARD.
//!
//! It needs the `iptables` command and NET_ADMIN in the node's network namespace, where Docker's
//! bridges are: sandboxd checks that it sees the bridge before it trusts its own rules.
//!
//! Over 600 lines: the network and its two firewall chains are made, checked and removed together.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::Path;

use bollard::models::NetworkCreateRequest;
use sha2::{Digest, Sha256};
use tokio::process::Command;
use tracing::info;

use crate::container::docker::{Engine, LABEL_INSTANCE, LABEL_MANAGED};

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
    Docker(#[from] crate::container::docker::DockerError),
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
        })
    }

    /// The IPv4 chains whole, as `iptables-restore --noflush` reads them: declaring a chain
    /// creates it or empties it, in one transaction with the rules that follow.
    pub fn ipv4_rules(&self, ports: &[u16]) -> String {
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
}

/// The sandbox network of one sandboxd: set up once (at start when a runtime needs it, or at
/// the first open of such a runtime), then reused.
pub struct SandboxNetwork {
    engine: Engine,
    plan: Plan,
    ports: std::sync::Mutex<Vec<u16>>,
    ready: tokio::sync::Mutex<Option<Ready>>,
}

impl SandboxNetwork {
    /// The network of `plan` on `engine`; nothing is made until [`SandboxNetwork::ensure`].
    pub fn new(engine: Engine, plan: Plan) -> Self {
        Self {
            engine,
            plan,
            ports: std::sync::Mutex::default(),
            ready: tokio::sync::Mutex::default(),
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

    /// Whether the network is there already (sandboxes of an earlier run may be on it).
    pub async fn exists(&self) -> Result<bool, NetworkError> {
        if self.engine.is_noop() {
            return Ok(false);
        }
        match self
            .engine
            .client()?
            .inspect_network(&self.plan.network, None)
            .await
        {
            Ok(_) => Ok(true),
            Err(source) => {
                let e = crate::container::docker::DockerError {
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
    /// the firewall; once done, answers from memory. Returns the network's name.
    pub async fn ensure(&self) -> Result<String, NetworkError> {
        let mut ready = self.ready.lock().await;
        if let Some(r) = ready.as_ref() {
            return Ok(r.network.clone());
        }
        if self.engine.is_noop() {
            // The operator bench's engine runs nothing; there is nothing to fence in.
            return Ok(self.plan.network.clone());
        }
        let made = self.network().await?;
        let ports = self
            .ports
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        self.firewall(&made, &ports).await?;
        info!(network = %made.network, bridge = %made.bridge, ?ports, deny = ?self.plan.deny, "sandbox network ready");
        let name = made.network.clone();
        *ready = Some(made);
        Ok(name)
    }

    /// The Docker network: made when missing, checked when present.
    async fn network(&self) -> Result<Ready, NetworkError> {
        let docker = self.engine.client()?;
        let name = &self.plan.network;
        let found = match docker.inspect_network(name, None).await {
            Ok(n) => Some(n),
            Err(e) => {
                let e = crate::container::docker::DockerError {
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
                    crate::container::docker::DockerError {
                        action: format!("create network {name}"),
                        source,
                    }
                })?;
                info!(network = %name, bridge = %self.plan.bridge, "sandbox network created");
                docker.inspect_network(name, None).await.map_err(|source| {
                    crate::container::docker::DockerError {
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
        Ok(Ready {
            network: name.clone(),
            id,
            bridge,
        })
    }

    /// Checks that this process sees the bridge and that bridged traffic passes iptables,
    /// then installs the chains and the jumps to them.
    async fn firewall(&self, made: &Ready, ports: &[u16]) -> Result<(), NetworkError> {
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
        restore(&plan.iptables, &plan.ipv4_rules(ports))
            .await
            .map_err(&fail)?;
        // Docker keeps DOCKER-USER first in FORWARD, ahead of its own ACCEPT rules.
        let forward_from = if run(&plan.iptables, &["-w", "-n", "-L", "DOCKER-USER"])
            .await
            .is_ok()
        {
            "DOCKER-USER"
        } else {
            "FORWARD"
        };
        jump(&plan.iptables, "INPUT", &made.bridge, &plan.input_chain)
            .await
            .map_err(&fail)?;
        jump(
            &plan.iptables,
            forward_from,
            &made.bridge,
            &plan.forward_chain,
        )
        .await
        .map_err(&fail)?;
        // A jump left in the other place (Docker's iptables switched on or off since) goes.
        let other = if forward_from == "FORWARD" {
            "DOCKER-USER"
        } else {
            "FORWARD"
        };
        for rule in jumps_to(&plan.iptables, other, &plan.forward_chain).await {
            delete(&plan.iptables, &rule).await.map_err(&fail)?;
        }
        if Path::new("/proc/net/if_inet6").exists() {
            restore(&plan.ip6tables, &plan.ipv6_rules())
                .await
                .map_err(&fail)?;
            jump(&plan.ip6tables, "INPUT", &made.bridge, &plan.input_chain)
                .await
                .map_err(&fail)?;
            jump(
                &plan.ip6tables,
                "FORWARD",
                &made.bridge,
                &plan.forward_chain,
            )
            .await
            .map_err(&fail)?;
        }
        Ok(())
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
        let docker = self.engine.client()?;
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
                    .map_err(|source| crate::container::docker::DockerError {
                        action: format!("remove network {}", plan.network),
                        source,
                    })?;
            }
            Err(source) => {
                let e = crate::container::docker::DockerError {
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
            for chain in [&plan.input_chain, &plan.forward_chain] {
                for from in ["INPUT", "FORWARD", "DOCKER-USER"] {
                    for rule in jumps_to(cmd, from, chain).await {
                        delete(cmd, &rule).await.map_err(&fail)?;
                    }
                }
                if run(cmd, &["-w", "-n", "-L", chain]).await.is_ok() {
                    run(cmd, &["-w", "-F", chain]).await.map_err(&fail)?;
                    run(cmd, &["-w", "-X", chain]).await.map_err(&fail)?;
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
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(rules.as_bytes())
            .await
            .map_err(|e| format!("cannot write to `{restore}`: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| format!("`{restore}` did not finish: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{restore} --noflush` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The rules of `from` that jump to `chain`, as `iptables -S` prints them.
async fn jumps_to(cmd: &str, from: &str, chain: &str) -> Vec<String> {
    let target = format!("-j {chain}");
    run(cmd, &["-w", "-S", from])
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
async fn delete(cmd: &str, rule: &str) -> Result<(), String> {
    let deleted = rule.replacen("-A ", "-D ", 1);
    let mut args = vec!["-w"];
    args.extend(deleted.split_whitespace());
    run(cmd, &args).await.map(|_| ())
}

/// Makes `from` jump to `chain` for traffic in from `bridge`, first in `from`; a jump already
/// there stays, and a jump of this chain for another interface (an earlier bridge) is removed.
async fn jump(cmd: &str, from: &str, bridge: &str, chain: &str) -> Result<(), String> {
    let wanted = format!("-A {from} -i {bridge} -j {chain}");
    let mut present = false;
    for rule in jumps_to(cmd, from, chain).await {
        if rule == wanted {
            present = true;
            continue;
        }
        delete(cmd, &rule).await?;
    }
    if !present {
        run(cmd, &["-w", "-I", from, "1", "-i", bridge, "-j", chain]).await?;
    }
    Ok(())
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
            p.ipv4_rules(&[8080]),
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
}
