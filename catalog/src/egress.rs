//! The egress policy of a runtime's sandboxes (`egress` in the catalog, `spec.egress` of a
//! `Runtime` and of a `SandboxSession`): which names and networks a sandbox may connect to.
//!
//! A policy has a mode: `none` (no network), `open` (any destination) or `allowlist` (only what
//! its `allow` entries name). An entry names either a `domain` (an exact name, or `*.x` for any
//! name under `x` but not `x` itself) or an IPv4 `cidr` (for what has no name), with the ports
//! it may be reached on (443 and 80 unless it lists its own).
//!
//! This module is the one place that decides what a policy allows: sandboxd asks it of every
//! name its DNS answers and every connection its proxy makes, and the operator asks it whether a
//! session's policy stays within its runtime's and its namespace's ([`Egress::within`]).

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};

use serde::{Deserialize, Serialize};

/// The ports an entry that lists none may be reached on: HTTPS and HTTP.
pub const DEFAULT_PORTS: [u16; 2] = [443, 80];
/// The most entries a policy's `allow` may hold.
pub const MAX_ALLOW: usize = 256;
/// The most ports one entry may list.
pub const MAX_PORTS: usize = 16;
/// The longest name a domain entry may hold (DNS's own limit), in characters.
pub const MAX_DOMAIN: usize = 253;
/// The longest label of a name (DNS's own limit), in characters.
pub const MAX_LABEL: usize = 63;

/// How much network a sandbox gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EgressMode {
    /// No network at all.
    None,
    /// Only the names and networks the policy's `allow` entries list.
    Allowlist,
    /// Any destination.
    Open,
}

impl EgressMode {
    /// The lowercase name used on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Allowlist => "allowlist",
            Self::Open => "open",
        }
    }
}

impl std::fmt::Display for EgressMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An egress policy: a mode, and with mode `allowlist` the destinations allowed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Egress {
    /// none (no network), allowlist (only what `allow` lists) or open (anything).
    pub mode: EgressMode,
    /// With mode allowlist: the destinations allowed, at most [`MAX_ALLOW`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<EgressRule>,
}

/// One destination of an allowlist: a name or an IPv4 network, and its ports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressRule {
    /// An exact name (`pypi.org`), or `*.x` for every name under `x` (`a.x`, `a.b.x`) but not
    /// `x` itself. Case does not matter. Exclusive with `cidr`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// An IPv4 network `a.b.c.d/n` (host bits zero), for a destination without a name.
    /// Exclusive with `domain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    /// The ports allowed, at most [`MAX_PORTS`]; none listed means 443 and 80.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
}

impl EgressRule {
    /// The ports this entry allows: its own, else [`DEFAULT_PORTS`].
    pub fn effective_ports(&self) -> &[u16] {
        if self.ports.is_empty() {
            &DEFAULT_PORTS
        } else {
            &self.ports
        }
    }

    /// Whether this entry allows `port`.
    fn has_port(&self, port: u16) -> bool {
        self.effective_ports().contains(&port)
    }

    /// Whether this is a domain entry matching `name` (already normalised).
    fn matches_name(&self, name: &str) -> bool {
        self.domain
            .as_deref()
            .is_some_and(|d| domain_matches(&normalise(d), name))
    }

    /// Whether this is a cidr entry holding `addr`.
    fn holds(&self, addr: IpAddr) -> bool {
        let IpAddr::V4(v4) = addr else {
            return false;
        };
        self.cidr
            .as_deref()
            .and_then(|c| Cidr::parse(c).ok())
            .is_some_and(|c| c.contains(v4))
    }
}

impl std::fmt::Display for EgressRule {
    /// `domain *.x, ports 443, 80` or `cidr 10.0.0.0/8, ports 22`: the ports as they apply.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.domain, &self.cidr) {
            (Some(d), _) => write!(f, "domain {d}")?,
            (None, Some(c)) => write!(f, "cidr {c}")?,
            (None, None) => f.write_str("no destination")?,
        }
        let ports: Vec<String> = self
            .effective_ports()
            .iter()
            .map(ToString::to_string)
            .collect();
        write!(f, ", ports {}", ports.join(", "))
    }
}

impl Egress {
    /// No network.
    pub fn none() -> Self {
        Self {
            mode: EgressMode::None,
            allow: Vec::new(),
        }
    }

    /// Any destination.
    pub fn open() -> Self {
        Self {
            mode: EgressMode::Open,
            allow: Vec::new(),
        }
    }

    /// The policy a runtime's sessions get: `egress` when given, else needs_network's open/none.
    pub fn effective(needs_network: bool, egress: Option<&Egress>) -> Egress {
        match egress {
            Some(e) => e.clone(),
            None if needs_network => Self::open(),
            None => Self::none(),
        }
    }

    /// Every problem, as (field path relative to the policy e.g. "allow[2].domain", message).
    /// Empty: valid.
    pub fn validate(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if self.mode != EgressMode::Allowlist && !self.allow.is_empty() {
            problems.push((
                "allow".to_owned(),
                format!(
                    "is allowed only with mode allowlist: mode {} {}",
                    self.mode,
                    match self.mode {
                        EgressMode::None => "allows nothing",
                        _ => "allows everything",
                    }
                ),
            ));
        }
        if self.allow.len() > MAX_ALLOW {
            problems.push((
                "allow".to_owned(),
                format!(
                    "holds {} entries; at most {MAX_ALLOW} are allowed",
                    self.allow.len()
                ),
            ));
        }
        for (i, rule) in self.allow.iter().enumerate() {
            let at = |field: &str| format!("allow[{i}]{field}");
            match (&rule.domain, &rule.cidr) {
                (None, None) => problems.push((
                    at(""),
                    "needs one of domain (a name) and cidr (an IPv4 network a.b.c.d/n)".to_owned(),
                )),
                (Some(d), Some(c)) => problems.push((
                    at(""),
                    format!("has both domain '{d}' and cidr '{c}': give one per entry"),
                )),
                (Some(d), None) => {
                    if let Err(m) = check_domain(d) {
                        problems.push((at(".domain"), m));
                    }
                }
                (None, Some(c)) => {
                    if let Err(m) = Cidr::parse(c) {
                        problems.push((at(".cidr"), m));
                    }
                }
            }
            for m in check_ports(&rule.ports) {
                problems.push((at(".ports"), m));
            }
        }
        problems
    }

    /// DNS: whether a name may be resolved at all (some domain rule matches it, any port).
    /// Open: true. None: false.
    pub fn allows_name(&self, name: &str) -> bool {
        match self.mode {
            EgressMode::Open => true,
            EgressMode::None => false,
            EgressMode::Allowlist => {
                let Some(name) = query_name(name) else {
                    return false;
                };
                self.allow.iter().any(|r| r.matches_name(&name))
            }
        }
    }

    /// Whether a connection to `name` on `port` is allowed (domain rules). Open: true.
    /// None: false.
    pub fn allows(&self, name: &str, port: u16) -> bool {
        match self.mode {
            EgressMode::Open => true,
            EgressMode::None => false,
            EgressMode::Allowlist => {
                let Some(name) = query_name(name) else {
                    return false;
                };
                self.allow
                    .iter()
                    .any(|r| r.matches_name(&name) && r.has_port(port))
            }
        }
    }

    /// Whether a connection to the address itself is allowed (a cidr rule holds it, port
    /// listed). Open: true. None: false. IPv6 addresses are held by no cidr rule.
    pub fn allows_addr(&self, addr: IpAddr, port: u16) -> bool {
        match self.mode {
            EgressMode::Open => true,
            EgressMode::None => false,
            EgressMode::Allowlist => self.cidr_allows(addr, port),
        }
    }

    /// Whether an address a name resolved to may be dialled although it is
    /// private/link-local/the node's own: some cidr rule holds it and lists `port`. Only an
    /// allowlist's explicit cidr entries say so: false for modes open and none.
    pub fn cidr_allows(&self, addr: IpAddr, port: u16) -> bool {
        self.mode == EgressMode::Allowlist
            && self.allow.iter().any(|r| r.holds(addr) && r.has_port(port))
    }

    /// Ok when every connection `self` allows is also allowed by `wider` (narrowing);
    /// Err(message) naming the first entry of self that widens it, e.g. "allow[1] (domain
    /// *.evil.test, ports 443) is not within the wider policy", or "mode open is wider than
    /// allowlist".
    pub fn within(&self, wider: &Egress) -> Result<(), String> {
        match (self.mode, wider.mode) {
            (EgressMode::None, _) | (_, EgressMode::Open) => return Ok(()),
            (EgressMode::Open, theirs) => {
                return Err(format!("mode open is wider than {theirs}"));
            }
            _ => {}
        }
        // Self an allowlist, wider an allowlist or none (which covers no entry, so only an
        // empty allowlist is within it).
        for (i, rule) in self.allow.iter().enumerate() {
            let covered = rule.effective_ports().iter().all(|&port| {
                wider
                    .allow
                    .iter()
                    .any(|w| w.has_port(port) && covers(w, rule))
            });
            if !covered {
                let mut m = format!("allow[{i}] ({rule}) is not within the wider policy");
                if wider.mode == EgressMode::None {
                    m.push_str(" (mode none allows nothing)");
                }
                return Err(m);
            }
        }
        Ok(())
    }

    /// The policy in a line for a person: `none`, `open`, or `allowlist: pypi.org,
    /// *.pythonhosted.org (ports 443), 203.0.113.0/24`.
    pub fn summary(&self) -> String {
        if self.mode != EgressMode::Allowlist {
            return self.mode.as_str().to_owned();
        }
        let mut out = String::from("allowlist:");
        if self.allow.is_empty() {
            out.push_str(" nothing");
        }
        for (i, r) in self.allow.iter().enumerate() {
            out.push_str(if i == 0 { " " } else { ", " });
            out.push_str(r.domain.as_deref().or(r.cidr.as_deref()).unwrap_or("?"));
            if !r.ports.is_empty() {
                let ports: Vec<String> = r.ports.iter().map(ToString::to_string).collect();
                let _ = write!(out, " (ports {})", ports.join(", "));
            }
        }
        out
    }
}

/// Whether wider entry `w` covers every destination of `rule` (ports aside).
fn covers(w: &EgressRule, rule: &EgressRule) -> bool {
    match (&rule.domain, &rule.cidr, &w.domain, &w.cidr) {
        (Some(d), _, Some(wd), _) => {
            let (d, wd) = (normalise(d), normalise(wd));
            match (d.strip_prefix("*."), wd.strip_prefix("*.")) {
                // A wildcard is covered only by a wildcard over the same or a shorter suffix.
                (Some(y), Some(x)) => y == x || y.ends_with(&format!(".{x}")),
                (Some(_), None) => false,
                (None, _) => domain_matches(&wd, &d),
            }
        }
        (None, Some(c), None, Some(wc)) => match (Cidr::parse(c), Cidr::parse(wc)) {
            (Ok(c), Ok(wc)) => wc.len <= c.len && wc.contains(c.net),
            _ => false,
        },
        _ => false,
    }
}

/// A name as compared: lowercase, one trailing dot stripped.
fn normalise(name: &str) -> String {
    let name = name.strip_suffix('.').unwrap_or(name);
    name.to_ascii_lowercase()
}

/// A name a sandbox asked for, normalised; `None` for one no entry can match (empty, or with
/// an empty label).
fn query_name(name: &str) -> Option<String> {
    let name = normalise(name);
    (!name.is_empty() && name.split('.').all(|l| !l.is_empty())).then_some(name)
}

/// Whether the (normalised) pattern matches the (normalised) name: equal, or `*.x` and the
/// name is under `x` by at least one label.
fn domain_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => name
            .strip_suffix(suffix)
            .and_then(|rest| rest.strip_suffix('.'))
            .is_some_and(|label| !label.is_empty()),
        None => pattern == name,
    }
}

/// Why a domain entry is not a name or `*.` and a name, if it is not.
fn check_domain(domain: &str) -> Result<(), String> {
    let bare = domain.strip_suffix('.').unwrap_or(domain);
    if bare.is_empty() {
        return Err("must not be empty: give a name such as pypi.org or *.pythonhosted.org".into());
    }
    let chars = bare.chars().count();
    if chars > MAX_DOMAIN {
        return Err(format!(
            "'{domain}' is {chars} characters long; a name has at most {MAX_DOMAIN}"
        ));
    }
    let name = bare.strip_prefix("*.").unwrap_or(bare);
    if name.contains('*') {
        return Err(format!(
            "'{domain}': '*' is allowed only as the whole first label (*.example.com)"
        ));
    }
    if name.parse::<Ipv4Addr>().is_ok() {
        return Err(format!(
            "'{domain}' is an address, not a name: use cidr {name}/32"
        ));
    }
    let labels: Vec<&str> = name.split('.').collect();
    for label in &labels {
        if label.is_empty() {
            return Err(format!("'{domain}' has an empty label"));
        }
        let len = label.chars().count();
        if len > MAX_LABEL {
            return Err(format!(
                "'{domain}': label '{label}' is {len} characters long; a label has at most {MAX_LABEL}"
            ));
        }
        if !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(format!(
                "'{domain}': label '{label}' may hold only letters, digits and '-'"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!(
                "'{domain}': label '{label}' must not begin or end with '-'"
            ));
        }
    }
    if labels.len() < 2 {
        return Err(if bare.starts_with("*.") {
            format!(
                "'{domain}' would match every name under '{name}': a wildcard needs at least two labels after '*.'"
            )
        } else {
            format!("'{domain}' is a single label: give a full name such as {name}.example.com")
        });
    }
    Ok(())
}

/// Every problem of a port list.
fn check_ports(ports: &[u16]) -> Vec<String> {
    let mut problems = Vec::new();
    if ports.len() > MAX_PORTS {
        problems.push(format!(
            "lists {} ports; at most {MAX_PORTS} are allowed",
            ports.len()
        ));
    }
    if ports.contains(&0) {
        problems.push("0 is not a port: ports are 1 to 65535".to_owned());
    }
    let mut seen = Vec::new();
    for &p in ports {
        if seen.contains(&p) && p != 0 {
            problems.push(format!("lists port {p} more than once"));
        }
        seen.push(p);
    }
    problems.dedup();
    problems
}

/// An IPv4 network: its address (host bits zero) and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cidr {
    net: Ipv4Addr,
    len: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n` with host bits zero; the error says what is wrong.
    fn parse(text: &str) -> Result<Self, String> {
        let shape = || {
            format!(
                "'{text}' is not an IPv4 network a.b.c.d/n (n from 0 to 32), for example 203.0.113.0/24"
            )
        };
        let Some((addr, len)) = text.split_once('/') else {
            return Err(if text.parse::<Ipv4Addr>().is_ok() {
                format!("'{text}' has no prefix length: write {text}/32 for the one address")
            } else {
                shape()
            });
        };
        if addr.parse::<std::net::Ipv6Addr>().is_ok() {
            return Err(format!("'{text}' is IPv6: cidr entries are IPv4 only"));
        }
        let net: Ipv4Addr = addr.parse().map_err(|_| shape())?;
        if len.is_empty() || !len.chars().all(|c| c.is_ascii_digit()) || len.len() > 2 {
            return Err(shape());
        }
        let len: u8 = len.parse().map_err(|_| shape())?;
        if len > 32 {
            return Err(shape());
        }
        let cidr = Self { net, len };
        let masked = Ipv4Addr::from(u32::from(net) & cidr.mask());
        if masked != net {
            return Err(format!(
                "'{text}' has host bits set: the network is {masked}/{len}"
            ));
        }
        Ok(cidr)
    }

    fn mask(self) -> u32 {
        match self.len {
            0 => 0,
            n => u32::MAX << (32 - u32::from(n)),
        }
    }

    fn contains(self, addr: Ipv4Addr) -> bool {
        u32::from(addr) & self.mask() == u32::from(self.net)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domain(d: &str) -> EgressRule {
        EgressRule {
            domain: Some(d.into()),
            cidr: None,
            ports: vec![],
        }
    }

    fn cidr(c: &str) -> EgressRule {
        EgressRule {
            domain: None,
            cidr: Some(c.into()),
            ports: vec![],
        }
    }

    fn ports(mut r: EgressRule, ports: &[u16]) -> EgressRule {
        r.ports = ports.to_vec();
        r
    }

    fn allowlist(rules: Vec<EgressRule>) -> Egress {
        Egress {
            mode: EgressMode::Allowlist,
            allow: rules,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    #[test]
    fn wildcards_match_one_or_more_labels_under_the_suffix_only() {
        let p = allowlist(vec![domain("*.pythonhosted.org"), domain("pypi.org")]);
        for (name, allowed) in [
            ("a.pythonhosted.org", true),
            ("files.pythonhosted.org", true),
            ("a.b.pythonhosted.org", true),
            ("x.y.z.pythonhosted.org", true),
            ("A.PythonHosted.ORG", true),
            ("a.pythonhosted.org.", true),
            ("pythonhosted.org", false),
            ("pythonhosted.org.", false),
            ("pythonhosted.org.evil.com", false),
            ("a.pythonhosted.org.evil.com", false),
            ("evilpythonhosted.org", false),
            ("a.evilpythonhosted.org", false),
            (".pythonhosted.org", false),
            ("a..pythonhosted.org", false),
            ("pythonhosted.org.a", false),
            ("", false),
            (".", false),
            ("pypi.org", true),
            ("PyPI.org.", true),
            ("www.pypi.org", false),
            ("pypi.org.evil.com", false),
            ("pypi.or", false),
            ("ypi.org", false),
        ] {
            assert_eq!(p.allows_name(name), allowed, "allows_name({name:?})");
            assert_eq!(p.allows(name, 443), allowed, "allows({name:?}, 443)");
        }
    }

    #[test]
    fn an_uppercase_or_dotted_rule_matches_like_a_lowercase_one() {
        let p = allowlist(vec![domain("PyPI.Org."), domain("*.Example.COM")]);
        assert!(p.allows("pypi.org", 443));
        assert!(p.allows("a.example.com", 80));
        assert!(!p.allows("example.com", 80));
    }

    #[test]
    fn ports_default_to_443_and_80_and_a_list_replaces_them() {
        let p = allowlist(vec![
            domain("pypi.org"),
            ports(domain("git.example.com"), &[22]),
            ports(domain("*.example.com"), &[8443]),
        ]);
        for (name, port, allowed) in [
            ("pypi.org", 443, true),
            ("pypi.org", 80, true),
            ("pypi.org", 22, false),
            ("pypi.org", 8080, false),
            ("git.example.com", 22, true),
            // *.example.com matches too, on its own ports.
            ("git.example.com", 8443, true),
            ("git.example.com", 443, false),
            ("x.example.com", 8443, true),
            ("x.example.com", 22, false),
        ] {
            assert_eq!(p.allows(name, port), allowed, "allows({name}, {port})");
        }
        // A name may be resolved whatever its ports.
        assert!(p.allows_name("git.example.com"));
        assert!(!p.allows_name("example.com"));
    }

    #[test]
    fn cidr_entries_hold_their_network_on_their_ports() {
        let p = allowlist(vec![
            cidr("203.0.113.0/24"),
            ports(cidr("10.1.2.3/32"), &[5432]),
            domain("pypi.org"),
        ]);
        for (addr, port, allowed) in [
            ("203.0.113.0", 443, true),
            ("203.0.113.255", 80, true),
            ("203.0.113.7", 22, false),
            ("203.0.114.1", 443, false),
            ("203.0.112.255", 443, false),
            ("10.1.2.3", 5432, true),
            ("10.1.2.3", 443, false),
            ("10.1.2.4", 5432, false),
            ("::1", 443, false),
            ("2001:db8::1", 443, false),
        ] {
            assert_eq!(
                p.allows_addr(ip(addr), port),
                allowed,
                "allows_addr({addr}, {port})"
            );
            assert_eq!(
                p.cidr_allows(ip(addr), port),
                allowed,
                "cidr_allows({addr}, {port})"
            );
        }
        // Names are not addresses, and addresses not names.
        assert!(!p.allows_name("203.0.113.7"));
        assert!(!p.allows_addr(ip("151.101.0.223"), 443));
        let everything = allowlist(vec![cidr("0.0.0.0/0")]);
        assert!(everything.allows_addr(ip("192.168.1.1"), 80));
    }

    #[test]
    fn none_allows_nothing_and_open_everything_but_private_addresses() {
        let none = Egress::none();
        let open = Egress::open();
        assert!(!none.allows_name("pypi.org"));
        assert!(!none.allows("pypi.org", 443));
        assert!(!none.allows_addr(ip("1.1.1.1"), 443));
        assert!(!none.cidr_allows(ip("10.0.0.1"), 443));
        assert!(open.allows_name("anything.example"));
        assert!(open.allows("anything.example", 22));
        assert!(open.allows_addr(ip("1.1.1.1"), 22));
        // Only an explicit cidr entry opens a private address a name resolved to.
        assert!(!open.cidr_allows(ip("10.0.0.1"), 443));
        let empty = allowlist(vec![]);
        assert!(!empty.allows_name("pypi.org"));
        assert!(!empty.allows_addr(ip("1.1.1.1"), 443));
    }

    #[test]
    fn effective_takes_egress_over_needs_network() {
        assert_eq!(Egress::effective(true, None), Egress::open());
        assert_eq!(Egress::effective(false, None), Egress::none());
        let p = allowlist(vec![domain("pypi.org")]);
        assert_eq!(Egress::effective(false, Some(&p)), p);
        assert_eq!(
            Egress::effective(true, Some(&Egress::none())),
            Egress::none()
        );
    }

    #[test]
    fn within_orders_modes_and_covers_entry_by_entry() {
        let runtime = allowlist(vec![
            domain("pypi.org"),
            domain("*.pythonhosted.org"),
            ports(domain("*.example.com"), &[443]),
            ports(domain("*.example.com"), &[8443]),
            cidr("10.0.0.0/8"),
        ]);
        let ok = |p: &Egress, w: &Egress| p.within(w);
        for (what, narrower, wider, expected) in [
            ("none within none", Egress::none(), Egress::none(), Ok(())),
            ("none within allowlist", Egress::none(), runtime.clone(), Ok(())),
            ("allowlist within open", runtime.clone(), Egress::open(), Ok(())),
            ("open within open", Egress::open(), Egress::open(), Ok(())),
            ("itself", runtime.clone(), runtime.clone(), Ok(())),
            (
                "open over allowlist",
                Egress::open(),
                runtime.clone(),
                Err("mode open is wider than allowlist".to_owned()),
            ),
            (
                "open over none",
                Egress::open(),
                Egress::none(),
                Err("mode open is wider than none".to_owned()),
            ),
            (
                "an empty allowlist within none",
                allowlist(vec![]),
                Egress::none(),
                Ok(()),
            ),
            (
                "an allowlist over none",
                allowlist(vec![domain("pypi.org")]),
                Egress::none(),
                Err("allow[0] (domain pypi.org, ports 443, 80) is not within the wider policy (mode none allows nothing)".to_owned()),
            ),
            (
                "equal names, any case, fewer ports",
                allowlist(vec![ports(domain("PYPI.org."), &[443])]),
                runtime.clone(),
                Ok(()),
            ),
            (
                "a name under a wildcard",
                allowlist(vec![domain("files.pythonhosted.org"), domain("a.b.pythonhosted.org")]),
                runtime.clone(),
                Ok(()),
            ),
            (
                "a narrower wildcard",
                allowlist(vec![domain("*.files.pythonhosted.org"), domain("*.pythonhosted.org")]),
                runtime.clone(),
                Ok(()),
            ),
            (
                "ports covered by two entries",
                allowlist(vec![ports(domain("*.a.example.com"), &[443, 8443])]),
                runtime.clone(),
                Ok(()),
            ),
            (
                "a narrower network",
                allowlist(vec![cidr("10.20.0.0/16"), ports(cidr("10.0.0.1/32"), &[80])]),
                runtime.clone(),
                Ok(()),
            ),
            (
                "the wildcard's own suffix",
                allowlist(vec![domain("pypi.org"), domain("pythonhosted.org")]),
                runtime.clone(),
                Err("allow[1] (domain pythonhosted.org, ports 443, 80) is not within the wider policy".to_owned()),
            ),
            (
                "a wildcard over an exact name",
                allowlist(vec![domain("*.pypi.org")]),
                runtime.clone(),
                Err("allow[0] (domain *.pypi.org, ports 443, 80) is not within the wider policy".to_owned()),
            ),
            (
                "a wider wildcard",
                allowlist(vec![domain("*.org")]),
                runtime.clone(),
                Err("allow[0] (domain *.org, ports 443, 80) is not within the wider policy".to_owned()),
            ),
            (
                "a look-alike suffix",
                allowlist(vec![domain("*.evilpythonhosted.org")]),
                runtime.clone(),
                Err("allow[0] (domain *.evilpythonhosted.org, ports 443, 80) is not within the wider policy".to_owned()),
            ),
            (
                "another name",
                allowlist(vec![domain("pypi.org"), ports(domain("*.evil.test"), &[443])]),
                runtime.clone(),
                Err("allow[1] (domain *.evil.test, ports 443) is not within the wider policy".to_owned()),
            ),
            (
                "default ports over a 443-only entry",
                allowlist(vec![domain("a.example.com")]),
                runtime.clone(),
                Err("allow[0] (domain a.example.com, ports 443, 80) is not within the wider policy".to_owned()),
            ),
            (
                "another port",
                allowlist(vec![ports(domain("pypi.org"), &[22])]),
                runtime.clone(),
                Err("allow[0] (domain pypi.org, ports 22) is not within the wider policy".to_owned()),
            ),
            (
                "a wider network",
                allowlist(vec![cidr("10.0.0.0/7")]),
                runtime.clone(),
                Err("allow[0] (cidr 10.0.0.0/7, ports 443, 80) is not within the wider policy".to_owned()),
            ),
            (
                "a network beside",
                allowlist(vec![cidr("11.0.0.0/8")]),
                runtime.clone(),
                Err("allow[0] (cidr 11.0.0.0/8, ports 443, 80) is not within the wider policy".to_owned()),
            ),
            (
                "a network for a name",
                allowlist(vec![cidr("151.101.0.0/16")]),
                allowlist(vec![domain("pypi.org")]),
                Err("allow[0] (cidr 151.101.0.0/16, ports 443, 80) is not within the wider policy".to_owned()),
            ),
        ] {
            assert_eq!(ok(&narrower, &wider), expected, "{what}");
        }
    }

    fn problems(p: &Egress) -> Vec<String> {
        p.validate()
            .into_iter()
            .map(|(field, m)| format!("{field}: {m}"))
            .collect()
    }

    #[test]
    fn valid_policies_have_no_problems() {
        for p in [
            Egress::none(),
            Egress::open(),
            allowlist(vec![]),
            allowlist(vec![
                domain("pypi.org"),
                domain("*.pythonhosted.org"),
                domain("PyPI.Org."),
                domain("xn--bcher-kva.example"),
                domain("a-b.c0.example"),
                domain(&format!("{}.com", "a".repeat(63))),
                ports(cidr("203.0.113.0/24"), &[443, 8443, 65535, 1]),
                cidr("0.0.0.0/0"),
                cidr("10.0.0.1/32"),
            ]),
        ] {
            assert_eq!(problems(&p), Vec::<String>::new(), "{p:?}");
        }
    }

    #[test]
    fn every_problem_is_named_with_its_field_and_value() {
        let long_label = "a".repeat(64);
        let long_name = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(62)
        );
        let p = Egress {
            mode: EgressMode::Allowlist,
            allow: vec![
                EgressRule {
                    domain: None,
                    cidr: None,
                    ports: vec![],
                },
                EgressRule {
                    domain: Some("a.org".into()),
                    cidr: Some("10.0.0.0/8".into()),
                    ports: vec![],
                },
                domain(""),
                domain(&long_name),
                domain("a*.example.com"),
                domain("*.*.example.com"),
                domain("www.*.example.com"),
                domain("*"),
                domain("*.com"),
                domain("localhost"),
                domain("a..example.com"),
                domain(&format!("{long_label}.com")),
                domain("pypi_org.example"),
                domain("-a.example.com"),
                domain("a-.example.com"),
                domain("10.0.0.1"),
                cidr("10.0.0.1"),
                cidr("10.0.0.1/8"),
                cidr("10.0.0.0/33"),
                cidr("10.0.0/8"),
                cidr("10.0.0.0/"),
                cidr("10.0.0.0/+8"),
                cidr("2001:db8::/32"),
                cidr("pypi.org/32"),
                ports(domain("pypi.org"), &[0, 443, 443]),
                ports(domain("pypi.org"), &(1..=17).collect::<Vec<u16>>()),
            ],
        };
        assert_eq!(
            problems(&p),
            vec![
                "allow[0]: needs one of domain (a name) and cidr (an IPv4 network a.b.c.d/n)".to_owned(),
                "allow[1]: has both domain 'a.org' and cidr '10.0.0.0/8': give one per entry".to_owned(),
                "allow[2].domain: must not be empty: give a name such as pypi.org or *.pythonhosted.org".to_owned(),
                format!("allow[3].domain: '{long_name}' is 254 characters long; a name has at most 253"),
                "allow[4].domain: 'a*.example.com': '*' is allowed only as the whole first label (*.example.com)".to_owned(),
                "allow[5].domain: '*.*.example.com': '*' is allowed only as the whole first label (*.example.com)".to_owned(),
                "allow[6].domain: 'www.*.example.com': '*' is allowed only as the whole first label (*.example.com)".to_owned(),
                "allow[7].domain: '*': '*' is allowed only as the whole first label (*.example.com)".to_owned(),
                "allow[8].domain: '*.com' would match every name under 'com': a wildcard needs at least two labels after '*.'".to_owned(),
                "allow[9].domain: 'localhost' is a single label: give a full name such as localhost.example.com".to_owned(),
                "allow[10].domain: 'a..example.com' has an empty label".to_owned(),
                format!("allow[11].domain: '{long_label}.com': label '{long_label}' is 64 characters long; a label has at most 63"),
                "allow[12].domain: 'pypi_org.example': label 'pypi_org' may hold only letters, digits and '-'".to_owned(),
                "allow[13].domain: '-a.example.com': label '-a' must not begin or end with '-'".to_owned(),
                "allow[14].domain: 'a-.example.com': label 'a-' must not begin or end with '-'".to_owned(),
                "allow[15].domain: '10.0.0.1' is an address, not a name: use cidr 10.0.0.1/32".to_owned(),
                "allow[16].cidr: '10.0.0.1' has no prefix length: write 10.0.0.1/32 for the one address".to_owned(),
                "allow[17].cidr: '10.0.0.1/8' has host bits set: the network is 10.0.0.0/8".to_owned(),
                "allow[18].cidr: '10.0.0.0/33' is not an IPv4 network a.b.c.d/n (n from 0 to 32), for example 203.0.113.0/24".to_owned(),
                "allow[19].cidr: '10.0.0/8' is not an IPv4 network a.b.c.d/n (n from 0 to 32), for example 203.0.113.0/24".to_owned(),
                "allow[20].cidr: '10.0.0.0/' is not an IPv4 network a.b.c.d/n (n from 0 to 32), for example 203.0.113.0/24".to_owned(),
                "allow[21].cidr: '10.0.0.0/+8' is not an IPv4 network a.b.c.d/n (n from 0 to 32), for example 203.0.113.0/24".to_owned(),
                "allow[22].cidr: '2001:db8::/32' is IPv6: cidr entries are IPv4 only".to_owned(),
                "allow[23].cidr: 'pypi.org/32' is not an IPv4 network a.b.c.d/n (n from 0 to 32), for example 203.0.113.0/24".to_owned(),
                "allow[24].ports: 0 is not a port: ports are 1 to 65535".to_owned(),
                "allow[24].ports: lists port 443 more than once".to_owned(),
                "allow[25].ports: lists 17 ports; at most 16 are allowed".to_owned(),
            ]
        );
    }

    #[test]
    fn allow_only_with_allowlist_and_at_most_max_allow() {
        let rules = vec![domain("pypi.org")];
        assert_eq!(
            problems(&Egress {
                mode: EgressMode::Open,
                allow: rules.clone()
            }),
            vec!["allow: is allowed only with mode allowlist: mode open allows everything"]
        );
        assert_eq!(
            problems(&Egress {
                mode: EgressMode::None,
                allow: rules
            }),
            vec!["allow: is allowed only with mode allowlist: mode none allows nothing"]
        );
        let many = allowlist(vec![domain("pypi.org"); MAX_ALLOW + 1]);
        assert_eq!(
            problems(&many),
            vec!["allow: holds 257 entries; at most 256 are allowed"]
        );
        assert!(problems(&allowlist(vec![domain("pypi.org"); MAX_ALLOW])).is_empty());
    }

    #[test]
    fn wire_shape_is_lowercase_and_refuses_unknown_fields() {
        let p: Egress = serde_json::from_str(
            r#"{"mode": "allowlist", "allow": [{"domain": "pypi.org"}, {"cidr": "203.0.113.0/24", "ports": [443]}]}"#,
        )
        .expect("valid");
        assert_eq!(
            p,
            allowlist(vec![
                domain("pypi.org"),
                ports(cidr("203.0.113.0/24"), &[443])
            ])
        );
        assert_eq!(
            serde_json::to_string(&Egress::none()).expect("serialises"),
            r#"{"mode":"none"}"#
        );
        assert!(serde_json::from_str::<Egress>(r#"{"mode": "Open"}"#).is_err());
        assert!(serde_json::from_str::<Egress>(r#"{"mode": "open", "colour": 1}"#).is_err());
        assert!(
            serde_json::from_str::<Egress>(
                r#"{"mode": "allowlist", "allow": [{"domain": "a.b", "port": 1}]}"#
            )
            .is_err()
        );
        assert!(
            serde_json::from_str::<Egress>(
                r#"{"mode": "allowlist", "allow": [{"domain": "a.b", "ports": [70000]}]}"#
            )
            .is_err()
        );
    }

    #[test]
    fn summary_is_one_line() {
        assert_eq!(Egress::none().summary(), "none");
        assert_eq!(Egress::open().summary(), "open");
        assert_eq!(allowlist(vec![]).summary(), "allowlist: nothing");
        assert_eq!(
            allowlist(vec![
                domain("pypi.org"),
                ports(cidr("203.0.113.0/24"), &[443])
            ])
            .summary(),
            "allowlist: pypi.org, 203.0.113.0/24 (ports 443)"
        );
    }
}
